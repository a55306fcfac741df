#!/usr/bin/env python3
"""Under pressure: is an ordinary client still served while a crowd holds
the proxy's connection slots?

The proxy (ours, or 3proxy 1.0.0 with --binary) runs one HTTP proxy and
one SOCKS service on loopback with default limits (maxconn 500 each,
default timeouts, default minrate and reclaim for ours), pinned to CPU 0;
an nginx origin and this probe run on CPU 1.  For DURATION seconds:

  slowloris   connections that send an endless head, one byte every
              5 s (HTTP: a request line; SOCKS: a greeting announcing 255
              methods, then one method at a time); each one closed by the
              proxy is counted and opened again at once (an attacker
              keeps its crowd up)
  silent      connections that connect and send nothing (opened again
              when closed, as the slowloris ones)
  parked      (--parked N) kept-alive HTTP clients that made a request
              and now send one every 10 to 25 s, within the proxy's
              idle wait (STRING_SHORT, 30 s); one closed between requests
              connects again when its next request is due, one closed
              while waiting for an answer at once; both are counted
  ordinary    an HTTP client (a new connection, GET of 1 KB through the
              HTTP proxy) and a SOCKS5 client (a new connection,
              CONNECT, the same GET) each every 0.5 s, 10 s timeout; a
              failure is anything but the whole 200 answer

The attack is split over both services (--attack http|socks|both).
The proxy's threads, descriptors and RSS are read from /proc before, at
the peak and after the crowd leaves (waiting up to 60 s for them to come
back).  Result codes are counted from the proxy's log.

  sudo python3 bench/pressure.py --binary target/release/3proxy
  sudo python3 bench/pressure.py --binary target/release/3proxy --parked 5000 \\
      --slowloris 1000 --silent 0 --maxconn 10000
  sudo python3 bench/pressure.py --binary /tmp/3proxy-src/bin/3proxy --duration 60

Root is needed only for descriptor limits above the hard limit.
"""

import argparse
import json
import math
import os
import random
import resource
import selectors
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import callgrind, procs  # noqa: E402

BODY = 1024
SLOW_EVERY = 5.0        # seconds between a slowloris client's bytes
TICK = 0.5              # the ordinary clients' pace
TIMEOUT = 10.0          # the ordinary clients' timeout
PARKED_EVERY = (10.0, 25.0)
PROXY_CPU, OTHER_CPU = "0", "1"


def percentile(xs, p):
    """The P-th percentile (0-100) of XS by nearest rank; None if empty."""
    if not xs:
        return None
    s = sorted(xs)
    k = max(0, min(len(s) - 1, math.ceil(p / 100.0 * len(s)) - 1))
    return s[k]


def code_counts(log_path):
    """Result codes of the proxy's records (logformat "L%N %E %C"), by code."""
    counts = {}
    try:
        with open(log_path, errors="replace") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[1].isdigit():
                    counts[int(parts[1])] = counts.get(int(parts[1]), 0) + 1
    except FileNotFoundError:
        pass
    return counts


def proc_figures(pid):
    """(threads, descriptors, RSS in KB) of process PID."""
    threads = rss = 0
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("Threads:"):
                threads = int(line.split()[1])
            elif line.startswith("VmRSS:"):
                rss = int(line.split()[1])
    return threads, len(os.listdir("/proc/%d/fd" % pid)), rss


def cpu_seconds(pid):
    """User + system CPU seconds of process PID so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def raise_nofile(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = max(n, soft)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, max(want, hard)))
    except (ValueError, PermissionError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))


def start_nginx(d, port):
    www = os.path.join(d, "www")
    os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
    os.makedirs(www, exist_ok=True)
    with open(os.path.join(www, "1k"), "wb") as f:
        f.write(b"x" * BODY)
    conf = os.path.join(d, "nginx.conf")
    with open(conf, "w") as f:
        f.write("worker_processes 1;\ndaemon off;\nmaster_process off;\n"
                "pid %(d)s/nginx.pid;\nerror_log %(d)s/nginx.err crit;\n"
                "worker_rlimit_nofile 40000;\n"
                "events { worker_connections 20000; }\n"
                "http {\n    access_log off;\n    keepalive_requests 1000000;\n"
                "    keepalive_timeout 300s;\n"
                "    client_body_temp_path %(d)s/tmp; proxy_temp_path %(d)s/tmp;\n"
                "    fastcgi_temp_path %(d)s/tmp; uwsgi_temp_path %(d)s/tmp;\n"
                "    scgi_temp_path %(d)s/tmp;\n"
                "    server { listen 127.0.0.1:%(port)d backlog=4096; root %(www)s;"
                " location / { } }\n}\n" % {"d": d, "port": port, "www": www})
    p = subprocess.Popen(["taskset", "-c", OTHER_CPU, "nginx", "-c", conf, "-p", d],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    wait_port(port)
    return p


def wait_port(port, bound=10.0):
    end = time.time() + bound
    while time.time() < end:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit("nothing listens on port %d" % port)


def start_proxy(binary, d, http_port, socks_port, maxconn, extra):
    log = os.path.join(d, "access.log")
    cfg = os.path.join(d, "3proxy.cfg")
    lines = ["log %s" % log, 'logformat "L%N %E %C"', "auth none"]
    if maxconn:
        lines.append("maxconn %d" % maxconn)
    lines += extra
    lines += ["proxy -i127.0.0.1 -p%d" % http_port, "socks -i127.0.0.1 -p%d" % socks_port]
    with open(cfg, "w") as f:
        f.write("\n".join(lines) + "\n")
    p = subprocess.Popen(["taskset", "-c", PROXY_CPU, binary, cfg],
                         stdout=subprocess.DEVNULL, stderr=open(os.path.join(d, "proxy.err"), "wb"),
                         start_new_session=True)
    wait_port(http_port)
    wait_port(socks_port)
    return p, log


# --- the ordinary clients ---------------------------------------------------

def content_length(head):
    """The Content-Length of an answer's HEAD (bytes, without the empty
    line), 0 without one."""
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            return int(v)
    return 0


def read_answer(s):
    """Read one HTTP answer with a Content-Length; returns (status, body)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise OSError("closed before the head: %r" % buf[:80])
        buf += chunk
    head, _, body = buf.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = content_length(head)
    while len(body) < length:
        chunk = s.recv(65536)
        if not chunk:
            raise OSError("closed in the body")
        body += chunk
    return status, body[:length], body[length:]


def http_once(proxy_port, origin_port):
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=TIMEOUT) as s:
        s.sendall(b"GET http://127.0.0.1:%d/1k HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                  b"Connection: close\r\n\r\n" % (origin_port, origin_port))
        status, body, _ = read_answer(s)
        if status != 200 or len(body) != BODY:
            raise OSError("answer %d with %d bytes" % (status, len(body)))


def socks_once(proxy_port, origin_port):
    with socket.create_connection(("127.0.0.1", proxy_port), timeout=TIMEOUT) as s:
        s.sendall(b"\x05\x01\x00")
        if callgrind.recv_exactly(s, 2) != b"\x05\x00":
            raise OSError("greeting refused")
        s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1")
                  + struct.pack(">H", origin_port))
        reply = callgrind.recv_exactly(s, 10)
        if reply[1] != 0:
            raise OSError("CONNECT answered %d" % reply[1])
        s.sendall(b"GET /1k HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, body, _ = read_answer(s)
        if status != 200 or len(body) != BODY:
            raise OSError("answer %d with %d bytes" % (status, len(body)))


class Ordinary(threading.Thread):
    """One client making a request every TICK; latencies and failures."""

    def __init__(self, name, once, proxy_port, origin_port, stop):
        super().__init__(daemon=True)
        self.name_, self.once, self.args, self.stop = name, once, (proxy_port, origin_port), stop
        self.latencies, self.failures = [], []

    def run(self):
        nxt = time.monotonic()
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.once(*self.args)
                self.latencies.append(time.monotonic() - t0)
            except (OSError, ValueError, IndexError) as e:
                self.failures.append((round(time.monotonic() - t0, 3), str(e)[:80]))
            nxt += TICK
            self.stop.wait(max(0.0, nxt - time.monotonic()))

    def summary(self):
        n = len(self.latencies) + len(self.failures)
        ms = [x * 1000 for x in self.latencies]
        return {"requests": n, "failures": len(self.failures),
                "failure_sample": self.failures[:5],
                "p50_ms": round(percentile(ms, 50) or 0, 2),
                "p99_ms": round(percentile(ms, 99) or 0, 2),
                "max_ms": round(max(ms) if ms else 0, 2)}


# --- the crowd --------------------------------------------------------------

class Crowd(threading.Thread):
    """Slowloris, silent and parked connections on one epoll loop."""

    def __init__(self, targets, origin_port, slowloris, silent, parked, stop, socks_port=0):
        super().__init__(daemon=True)
        self.targets, self.origin_port, self.stop = targets, origin_port, stop
        self.socks_port = socks_port
        self.want = {"slow": slowloris, "silent": silent, "parked": parked}
        self.sel = selectors.DefaultSelector()
        self.conns = {}          # fd -> state dict
        self.opened = {k: 0 for k in self.want}
        self.closed = {k: 0 for k in self.want}
        self.lifetimes = {k: [] for k in self.want}
        self.connect_errors = 0
        self.parked_answers = 0
        self.parked_closed_idle = 0      # closed while idle, found at its next request
        self.parked_closed_waiting = 0   # closed after it sent a request
        self.parked_late = 0             # answered after more than 1 s
        self.open_now = {k: 0 for k in self.want}
        self.open_at_end = {k: 0 for k in self.want}
        self.later = []           # (when, i): parked clients to connect again
        self.oldest_at_end = {k: 0.0 for k in self.want}
        self.ready = threading.Event()
        self.rng = random.Random(1)

    def _open(self, kind, i):
        s = socket.socket()
        s.setblocking(False)
        port = self.targets[i % len(self.targets)]
        try:
            s.connect_ex(("127.0.0.1", port))
        except OSError:
            self.connect_errors += 1
            s.close()
            return
        now = time.monotonic()
        st = {"kind": kind, "s": s, "i": i, "born": now, "buf": b"", "sent": 0,
              "due": now + (self.rng.uniform(0, SLOW_EVERY) if kind == "slow" else 0),
              "waiting": kind == "parked", "asked": now, "out": b"",
              "events": selectors.EVENT_READ, "socks": port == self.socks_port}
        self.conns[s.fileno()] = st
        self.sel.register(s, selectors.EVENT_READ, st)
        if kind == "parked":
            self._send(st, self._request())
        elif kind == "slow":
            # HTTP: an endless request line. SOCKS: a greeting that says
            # 255 methods follow, then one method at a time.
            self._send(st, b"\x05\xff" if st["socks"] else b"G")
            st["sent"] = 1
        self.opened[kind] += 1
        self.open_now[kind] += 1

    def _request(self):
        return (b"GET http://127.0.0.1:%d/1k HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n\r\n"
                % (self.origin_port, self.origin_port))

    def _send(self, st, data):
        """Queue DATA and send what the socket takes now; the rest goes
        when it is writable (a connect still under way, a full buffer)."""
        st["out"] += data
        self._flush(st)

    def _flush(self, st):
        try:
            while st["out"]:
                n = st["s"].send(st["out"])
                st["out"] = st["out"][n:]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            st["out"] = b""   # the read side reports the close
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if st["out"] else 0)
        if st.get("events") != events and st["s"].fileno() in self.conns:
            self.sel.modify(st["s"], events, st)
            st["events"] = events

    def _close(self, st, reopen=True):
        s = st["s"]
        try:
            self.sel.unregister(s)
        except (KeyError, ValueError):
            pass
        self.conns.pop(s.fileno(), None)
        s.close()
        kind = st["kind"]
        self.open_now[kind] -= 1
        if not reopen:
            return      # the probe's own close at the end
        self.closed[kind] += 1
        self.lifetimes[kind].append(time.monotonic() - st["born"])
        if kind == "parked":
            if st["waiting"]:
                self.parked_closed_waiting += 1
            else:
                # Closed between requests: it connects again when it has
                # its next request to make, as a browser does.
                self.parked_closed_idle += 1
                self.later.append((st["due"], st["i"]))
                return
        if not self.stop.is_set():
            self._open(kind, st["i"])

    def _readable(self, st):
        try:
            data = st["s"].recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self._close(st)
            return
        if st["kind"] != "parked":
            return   # an answer to a slow head (a 408): the close follows
        st["buf"] += data
        head, sep, rest = st["buf"].partition(b"\r\n\r\n")
        if not sep:
            return
        length = content_length(head)
        if len(rest) < length:
            return
        st["buf"] = rest[length:]
        if st["waiting"]:
            st["waiting"] = False
            self.parked_answers += 1
            if time.monotonic() - st["asked"] > 1.0:
                self.parked_late += 1
            st["due"] = time.monotonic() + self.rng.uniform(*PARKED_EVERY)

    def _tick(self, now):
        if self.later:
            due = [x for x in self.later if x[0] <= now]
            self.later = [x for x in self.later if x[0] > now]
            for _, i in due:
                self._open("parked", i)
        for st in list(self.conns.values()):
            if st["due"] > now:
                continue
            if st["kind"] == "slow":
                if st["socks"]:
                    self._send(st, b"\x00")
                else:
                    self._send(st, b"a" if st["sent"] > 4 else b"ET /a"[st["sent"] - 1:st["sent"]])
                st["sent"] += 1
                st["due"] = now + SLOW_EVERY
            elif st["kind"] == "parked" and not st["waiting"]:
                st["waiting"], st["asked"] = True, now
                st["due"] = float("inf")
                self._send(st, self._request())
            else:
                st["due"] = float("inf")

    def run(self):
        # Open the crowd in a burst, parked clients first (they come in
        # before the attack), a thousand at a time.
        n = 0
        for kind in ("parked", "slow", "silent"):
            for i in range(self.want[kind]):
                self._open(kind, i)
                n += 1
                if n % 1000 == 0:
                    self._poll(0.05)
        self.ready.set()
        next_tick = time.monotonic()
        while not self.stop.is_set():
            self._poll(0.1)
            now = time.monotonic()
            if now >= next_tick:
                self._tick(now)
                next_tick = now + 0.1
        now = time.monotonic()
        for st in list(self.conns.values()):
            k = st["kind"]
            self.oldest_at_end[k] = max(self.oldest_at_end[k], round(now - st["born"], 1))
            self.open_at_end[k] += 1
            self._close(st, reopen=False)

    def _poll(self, timeout):
        for key, ev in self.sel.select(timeout):
            if self.conns.get(key.fd) is not key.data:
                continue    # closed earlier in this round
            if ev & selectors.EVENT_WRITE:
                self._flush(key.data)
            if ev & selectors.EVENT_READ:
                self._readable(key.data)

    def summary(self):
        def med(xs):
            return round(percentile(xs, 50), 2) if xs else None
        return {
            "opened": self.opened, "closed_by_proxy": self.closed,
            "median_lifetime_s": {k: med(v) for k, v in self.lifetimes.items()},
            "open_at_end": self.open_at_end,
            "oldest_at_end_s": self.oldest_at_end,
            "connect_errors": self.connect_errors,
            "parked_answers": self.parked_answers,
            "parked_closed_idle": self.parked_closed_idle,
            "parked_closed_waiting": self.parked_closed_waiting,
            "parked_late_over_1s": self.parked_late,
        }


class Sampler(threading.Thread):
    def __init__(self, pid, stop):
        super().__init__(daemon=True)
        self.pid, self.stop, self.peak = pid, stop, (0, 0, 0)

    def run(self):
        while not self.stop.is_set():
            try:
                f = proc_figures(self.pid)
            except OSError:
                return
            self.peak = tuple(max(a, b) for a, b in zip(self.peak, f))
            self.stop.wait(0.5)


def settle(pid, base, bound=60.0):
    """Wait until the proxy's threads and descriptors are back to BASE,
    then 2.5 s more for its heap trim; returns (figures, seconds
    waited)."""
    t0 = time.monotonic()
    f = proc_figures(pid)
    while time.monotonic() - t0 < bound:
        f = proc_figures(pid)
        if f[0] <= base[0] and f[1] <= base[1]:
            # The proxy gives free heap back once a second after threads
            # exit: read RSS after that.
            time.sleep(2.5)
            f = proc_figures(pid)
            break
        time.sleep(0.5)
    return f, round(time.monotonic() - t0, 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default="target/release/3proxy")
    ap.add_argument("--duration", type=float, default=120)
    ap.add_argument("--slowloris", type=int, default=1000)
    ap.add_argument("--silent", type=int, default=500)
    ap.add_argument("--parked", type=int, default=0)
    ap.add_argument("--attack", choices=("http", "socks", "both"), default="both")
    ap.add_argument("--maxconn", type=int, default=0, help="0: the default (500)")
    ap.add_argument("--cfg", action="append", default=[],
                    help="a cfg line before the services (e.g. 'minrate 0')")
    ap.add_argument("--json", help="write the figures here too")
    a = ap.parse_args()
    if not shutil.which("nginx"):
        raise SystemExit("needs nginx (apt-get install -y nginx-light)")
    need = 4 * (a.slowloris + a.silent + a.parked) + 4096
    raise_nofile(need)
    d = tempfile.mkdtemp(prefix="pressure-")
    origin_port, http_port, socks_port = callgrind.free_port(), callgrind.free_port(), callgrind.free_port()
    nginx = start_nginx(d, origin_port)
    proxy = None
    try:
        proxy, log = start_proxy(os.path.abspath(a.binary), d, http_port, socks_port,
                                 a.maxconn, a.cfg)
        for _ in range(20):   # warm up: each path once, threads' stacks made
            http_once(http_port, origin_port)
            socks_once(socks_port, origin_port)
        time.sleep(1)
        base = proc_figures(proxy.pid)
        cpu0, t0 = cpu_seconds(proxy.pid), time.monotonic()
        stop_crowd, stop_clients = threading.Event(), threading.Event()
        targets = {"http": [http_port], "socks": [socks_port],
                   "both": [http_port, socks_port]}[a.attack]
        # Parked clients are HTTP clients whatever the attack's targets.
        crowd = Crowd(targets, origin_port, a.slowloris, a.silent, 0, stop_crowd, socks_port)
        parked = Crowd([http_port], origin_port, 0, 0, a.parked, stop_crowd)
        sampler = Sampler(proxy.pid, stop_clients)
        sampler.start()
        if a.parked:
            parked.start()
            parked.ready.wait()
        crowd.start()
        crowd.ready.wait()
        clients = [Ordinary("http", http_once, http_port, origin_port, stop_clients),
                   Ordinary("socks", socks_once, socks_port, origin_port, stop_clients)]
        for c in clients:
            c.start()
        time.sleep(a.duration)
        stop_clients.set()
        for c in clients:
            c.join(TIMEOUT + 1)
        during = proc_figures(proxy.pid)
        cpu = (cpu_seconds(proxy.pid) - cpu0) / (time.monotonic() - t0)
        stop_crowd.set()
        crowd.join(30)
        if a.parked:
            parked.join(30)
        after, waited = settle(proxy.pid, base)
        out = {
            "binary": a.binary, "duration_s": a.duration, "attack": a.attack,
            "slowloris": a.slowloris, "silent": a.silent, "parked": a.parked,
            "maxconn": a.maxconn or 500, "cfg": a.cfg,
            "http": clients[0].summary(), "socks": clients[1].summary(),
            "crowd": crowd.summary(), "parked_clients": parked.summary() if a.parked else None,
            "threads_fds_rss_kb": {"base": base, "peak": sampler.peak, "at_end": during,
                                   "after": after, "settled_in_s": waited},
            "proxy_cpu_share": round(cpu, 3),
            "codes": code_counts(log),
        }
        print(json.dumps(out, indent=1))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(out, f, indent=1)
    finally:
        for p in (proxy, nginx):
            if p:
                procs.stop(p)
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
