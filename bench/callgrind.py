#!/usr/bin/env python3
"""Instructions per request of the proxy, counted by callgrind.

Wall-clock benchmarks on a shared 2-CPU machine are noisy; an instruction
count is not.  This starts the proxy (the bench's `http` cfg: one `proxy`
service, no log) under `valgrind --tool=callgrind` on loopback, with a
small Python origin answering 1 KB, and drives it with a Python client:

  warm-up   100 kept-alive requests and 50 new connections (not counted)
  ka        N kept-alive requests on one connection (http-ka-1k's path)
  close     M requests, a new connection each, `Connection: close`
            (http-close-1k's path)

Counters are zeroed after the warm-up and dumped after each phase
(`callgrind_control`), so each figure is what the proxy executed for that
phase alone: every thread, the kernel not counted.  Prints Ir per request
per phase and for the two together; with several binaries, each one's
figures and the change against the first.

  python3 bench/callgrind.py --binary OLD/3proxy --binary NEW/3proxy
  python3 bench/callgrind.py --binary target/release/3proxy --keep DIR
      (keep the callgrind files: callgrind_annotate DIR/close.*)
  python3 bench/callgrind.py --radius
      (each binary also with `radius SECRET 127.0.0.1:PORT` and `log
      radius` added, against a FreeRADIUS this starts on loopback: one
      Accounting-Request Start and one Stop per HTTP request, sent by the
      proxy's sender threads, which callgrind counts too; prints the
      change against the same binary without)

  python3 bench/callgrind.py --service tcppm   (or socks)
      (tcp-1k's or socks-1k's path instead: the bench's tcppm or socks
      cfg, one phase "new" of --close requests, each on a new connection,
      through the mapping or a SOCKS5 session sent as loadgen sends it)

Needs valgrind (Debian `valgrind`), and for --radius FreeRADIUS (Debian
`freeradius`, run in the foreground as whoever runs this).  Takes about a
minute per binary with the defaults.
"""

import argparse
import glob
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BODY = b"x" * 1024


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Origin:
    """HTTP/1.1 origin on loopback: every request gets 200 and 1 KB, on a
    kept-alive connection unless the request asks to close."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        with c:
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    try:
                        chunk = c.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                    continue
                head, buf = buf[:end].lower(), buf[end + 4:]
                close = b"connection: close" in head
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n"
                          % (len(BODY), b"Connection: close\r\n" if close else b"")
                          + BODY)
                if close:
                    return


def read_response(s, buf):
    """Read one response (head with Content-Length, then the body) from s;
    returns what was read past it."""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("the proxy closed before a response head")
        buf += chunk
    head = buf[:end].decode("latin-1").split("\r\n")
    if head[0].split()[1] != "200":
        raise RuntimeError("the proxy answered %r" % head[0])
    length = None
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length is None:
        raise RuntimeError("no Content-Length in %r" % head)
    need = end + 4 + length
    while len(buf) < need:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("the proxy closed inside a body")
        buf += chunk
    if buf[end + 4:need] != BODY:
        raise RuntimeError("the body differs from the origin's")
    return buf[need:]


def connect(port):
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=60)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def kept_alive(port, target, n):
    req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" % target).encode()
    s = connect(port)
    buf = b""
    for _ in range(n):
        s.sendall(req)
        buf = read_response(s, buf)
    s.close()


def new_connections(port, target, n):
    through(lambda: connect(port), n, target)


def socks5_open(port, origin_port):
    """A SOCKS5 session to 127.0.0.1:origin_port through the proxy on
    port, as loadgen does it: the greeting (no authentication), its answer,
    the CONNECT request, its reply; the connected socket."""
    s = connect(port)
    try:
        s.sendall(b"\x05\x01\x00")
        if recv_exactly(s, 2) != b"\x05\x00":
            raise RuntimeError("SOCKS5 method refused")
        s.sendall(b"\x05\x01\x00\x01\x7f\x00\x00\x01" + origin_port.to_bytes(2, "big"))
        reply = recv_exactly(s, 10)
        if reply[:4] != b"\x05\x00\x00\x01":
            raise RuntimeError("SOCKS5 CONNECT failed: %r" % reply)
    except BaseException:
        s.close()
        raise
    return s


def recv_exactly(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the proxy closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def through(opener, n, target="/1k.bin"):
    """n requests, each on a connection opener() returns (the proxy, a
    tcppm mapping or a SOCKS5 session to the origin): GET TARGET with
    `Connection: close`, the response, then the close (http-close-1k's,
    tcp-1k's and socks-1k's path)."""
    req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
           % target).encode()
    for _ in range(n):
        s = opener()
        s.sendall(req)
        rest = read_response(s, b"")
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        if rest:
            raise RuntimeError("bytes after the response: %r" % rest[:80])
        s.close()


# What each --service measures: the cfg's service line (port, origin
# port) and the phases, each (name, driver(port, origin_port, n), which
# count: "ka" or "close").
def phases(service):
    if service == "http":
        def ka(port, oport, n):
            kept_alive(port, "http://127.0.0.1:%d/1k.bin" % oport, n)

        def close(port, oport, n):
            new_connections(port, "http://127.0.0.1:%d/1k.bin" % oport, n)
        return (("ka", ka, "ka"), ("close", close, "close"))
    if service == "tcppm":
        def new(port, oport, n):
            through(lambda: connect(port), n)
    elif service == "socks":
        def new(port, oport, n):
            through(lambda: socks5_open(port, oport), n)
    else:
        raise ValueError("unknown service %r" % service)
    return (("new", new, "close"),)


def service_line(service, port, origin_port):
    """The bench's service line (bench/configs.py) on 127.0.0.1:port."""
    if service == "http":
        return "proxy -i127.0.0.1 -p%d\n" % port
    if service == "tcppm":
        return "tcppm -i127.0.0.1 %d 127.0.0.1 %d\n" % (port, origin_port)
    if service == "socks":
        return "socks -i127.0.0.1 -p%d\n" % port
    raise ValueError("unknown service %r" % service)


def totals(path):
    """Ir of a callgrind output file (its `totals:` or `summary:` line)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError("no totals in %s" % path)


def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def dump(pid, outdir, name):
    """Dump the counts since the last dump or zeroing; the file's path."""
    before = set(glob.glob(os.path.join(outdir, "cg.out.*")))
    control(pid, "--dump=" + name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(glob.glob(os.path.join(outdir, "cg.out.*"))) - before
        if new:
            path = new.pop()
            time.sleep(0.5)  # let it finish writing
            dest = os.path.join(outdir, name + ".cg")
            os.rename(path, dest)
            return dest
        time.sleep(0.1)
    raise RuntimeError("callgrind wrote no dump")


SECRET = "testing123"


def proxy_cfg(port, radius=None, service="http", origin_port=0):
    """The bench's cfg for service (no log) on 127.0.0.1:port; with radius
    (the `radius` line's server, "127.0.0.1:AUTHPORT"), accounting to it by
    `log radius` (to AUTHPORT + 1, 3proxy's rule)."""
    cfg = "timeouts 1 5 30 60 180 1800 15 60\nmaxconn 25000\n"
    if radius:
        cfg += "radius %s %s\nlog radius\n" % (SECRET, radius)
    return cfg + service_line(service, port, origin_port)


def raddb_conf(d, acct_port, listen="127.0.0.1", clients="127.0.0.0/8", detail=True):
    """A radiusd.conf for FreeRADIUS 3 in the foreground with its files in
    d: accounting only, on listen:acct_port, from any client in `clients`
    with SECRET, each request written to d/detail (and answered); without
    detail, each request only answered (bench.py's 3proxy-radius, whose
    millions of records would fill the tmpfs)."""
    return """prefix = /usr
exec_prefix = /usr
sysconfdir = /etc
localstatedir = /var
sbindir = /usr/sbin
logdir = {d}/log
raddbdir = {d}
radacctdir = {d}/log
name = freeradius
confdir = {d}
modconfdir = /etc/freeradius/3.0/mods-config
run_dir = {d}/run
db_dir = {d}
libdir = /usr/lib/freeradius
pidfile = {d}/run/radiusd.pid
max_request_time = 30
cleanup_delay = 5
max_requests = 16384
hostname_lookups = no
log {{
	destination = stdout
	colourise = no
}}
security {{
	allow_core_dumps = no
	max_attributes = 200
	reject_delay = 0
	status_server = no
}}
thread pool {{
	start_servers = 2
	max_servers = 4
	min_spare_servers = 1
	max_spare_servers = 4
	max_requests_per_server = 0
}}
client loopback {{
	ipaddr = {clients}
	secret = {secret}
}}
modules {{
	detail {{
		filename = {d}/detail
		permissions = 0600
	}}
	always ok {{
		rcode = ok
	}}
}}
server default {{
	listen {{
		type = acct
		ipaddr = {listen}
		port = {acct}
	}}
	preacct {{
	}}
	accounting {{
		{record}
	}}
}}
""".format(d=d, secret=SECRET, acct=acct_port, listen=listen, clients=clients,
           record="detail" if detail else "ok")


def count_records(detail):
    """Accounting records in a detail file's text, by Acct-Status-Type:
    {"Start": n, "Stop": m, ...}."""
    counts = {}
    for status in re.findall(r"^\s*Acct-Status-Type = (\S+)\s*$", detail, re.M):
        counts[status] = counts.get(status, 0) + 1
    return counts


def free_udp_pair():
    """A UDP port on 127.0.0.1 whose next port is free too: the `radius`
    line's (authentication) port; accounting goes to the next one."""
    for _ in range(100):
        a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        a.bind(("127.0.0.1", 0))
        port = a.getsockname()[1]
        b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        finally:
            a.close()
            b.close()
        if port + 1 < 65536:
            return port
    raise RuntimeError("no two free UDP ports in a row")


class Radiusd:
    """FreeRADIUS in the foreground (`-f -l stdout`) with raddb_conf in
    its own directory: answers accounting on `port + 1`.  stop() ends it."""

    def __init__(self, d):
        self.dir = d
        for sub in ("log", "run"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        self.port = free_udp_pair()
        with open(os.path.join(d, "dictionary"), "w") as f:
            f.write("$INCLUDE /usr/share/freeradius/dictionary\n")
        with open(os.path.join(d, "radiusd.conf"), "w") as f:
            f.write(raddb_conf(d, self.port + 1))
        self.log = os.path.join(d, "radiusd.log")
        self.proc = subprocess.Popen(
            ["freeradius", "-f", "-l", "stdout", "-d", d],
            stdin=subprocess.DEVNULL, stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "Ready to process requests" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("freeradius did not start:\n" + self.output())
            time.sleep(0.1)

    def server(self):
        return "127.0.0.1:%d" % self.port

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def records(self):
        try:
            with open(os.path.join(self.dir, "detail"), errors="replace") as f:
                return count_records(f.read())
        except FileNotFoundError:
            return {}

    def settle(self, quiet=1.5, bound=60):
        """Wait until no record has come for `quiet` seconds (the proxy's
        senders have sent what they had); the counts."""
        last, since = self.records(), time.monotonic()
        deadline = since + bound
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = self.records()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
        return last

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(binary, ka, close, keep=None, radius=False, service="http"):
    """Ir of each phase of service: {"ka": (Ir, requests), "close": (Ir,
    requests)} for http, {"new": (Ir, requests)} for tcppm and socks; with
    radius, also "records": the accounting records FreeRADIUS got per
    phase ({"ka": {"Start": n, "Stop": m}, ...})."""
    origin = Origin()
    port = free_port()
    steps = phases(service)
    outdir = keep or tempfile.mkdtemp(prefix="tp-callgrind-")
    os.makedirs(outdir, exist_ok=True)
    rad = Radiusd(os.path.join(outdir, "raddb")) if radius else None
    cfg = os.path.join(outdir, "3proxy.cfg")
    with open(cfg, "w") as f:
        f.write(proxy_cfg(port, rad.server() if rad else None, service, origin.port))
    try:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--vgdb=yes",
             # Each dump names its functions itself (callgrind_annotate reads
             # one dump alone).
             "--compress-strings=no", "--compress-pos=no",
             "--callgrind-out-file=" + os.path.join(outdir, "cg.out.%p"),
             binary, cfg],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(outdir, "valgrind.log"), "w"))
    except OSError:
        if rad:
            rad.stop()
        raise
    try:
        for _, run, count in steps:
            run(port, origin.port, 100 if count == "ka" else 50)
        time.sleep(1)
        seen = rad.settle() if rad else {}
        control(proc.pid, "--zero")
        figures = {}
        records = {}
        for name, run, count in steps:
            n = ka if count == "ka" else close
            run(port, origin.port, n)
            time.sleep(1)  # the last session's thread finishes
            if rad:
                # and the senders have sent its Stop
                now = rad.settle()
                records[name] = {k: now.get(k, 0) - seen.get(k, 0) for k in now}
                seen = now
            figures[name] = (totals(dump(proc.pid, outdir, name)), n)
        if rad:
            figures["records"] = records
        return figures
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        origin.sock.close()
        if rad:
            rad.stop()
        if not keep:
            shutil.rmtree(outdir, ignore_errors=True)


def per_request(f):
    """Ir per request of measure()'s figures: (ka, close, both) for http,
    (new,) for tcppm and socks."""
    if "new" in f:
        return (f["new"][0] / f["new"][1],)
    ka = f["ka"][0] / f["ka"][1]
    cl = f["close"][0] / f["close"][1]
    both = (f["ka"][0] + f["close"][0]) / (f["ka"][1] + f["close"][1])
    return ka, cl, both


def change(row, base):
    """The row's change against base, in %, as printed."""
    return "(" + " ".join("%+.1f%%" % (100.0 * (x / y - 1))
                          for x, y in zip(row, base)) + ")"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", action="append",
                    help="a 3proxy binary (repeatable; default target/release/3proxy)")
    ap.add_argument("--ka", type=int, default=4000, help="kept-alive requests (4000)")
    ap.add_argument("--close", type=int, default=1000,
                    help="requests on new connections (1000)")
    ap.add_argument("--keep", help="keep the callgrind files in this directory "
                    "(one subdirectory per binary, N-radius with --radius)")
    ap.add_argument("--radius", action="store_true",
                    help="also measure each binary with `log radius` to a "
                    "FreeRADIUS started on loopback; its change is against the "
                    "same binary without")
    ap.add_argument("--service", choices=("http", "tcppm", "socks"), default="http",
                    help="http (default): the proxy service, kept-alive and new "
                    "connections; tcppm: a TCP mapping to the origin, socks: a "
                    "SOCKS5 CONNECT (greeting, then the request) to it, each a new "
                    "connection per 1 KB request (tcp-1k's and socks-1k's path; "
                    "--close of them)")
    a = ap.parse_args()
    binaries = a.binary or ["target/release/3proxy"]
    if not shutil.which("valgrind"):
        sys.exit("callgrind.py: valgrind is not installed (apt-get install valgrind)")
    if a.radius and not shutil.which("freeradius"):
        sys.exit("callgrind.py: freeradius is not installed (apt-get install freeradius)")
    rows = []  # (label, (ka, close, both), the row it is compared with)
    notes = []
    for i, b in enumerate(binaries):
        keep = os.path.join(a.keep, str(i)) if a.keep else None
        f = measure(os.path.abspath(b), a.ka, a.close, keep, service=a.service)
        rows.append((b, per_request(f), 0 if i > 0 else None))
        if a.radius:
            keep = os.path.join(a.keep, "%d-radius" % i) if a.keep else None
            f = measure(os.path.abspath(b), a.ka, a.close, keep, radius=True,
                        service=a.service)
            rows.append((b + " +log radius", per_request(f), len(rows) - 1))
            for phase in f["records"]:
                r = f["records"][phase]
                notes.append("%s, %s: FreeRADIUS got %d Start and %d Stop for %d requests"
                             % (b, phase, r.get("Start", 0), r.get("Stop", 0),
                                f[phase][1]))
    if a.service == "http":
        names = ("ka Ir/req", "close Ir/req", "both Ir/req")
    else:
        names = ("%s Ir/req" % a.service,)
    print("%-50s" % "binary" + "".join(" %12s" % n for n in names))
    for label, row, base in rows:
        line = "%-50s" % label + "".join(" %12.0f" % x for x in row)
        if base is not None:
            line += "   " + change(row, rows[base][1])
        print(line)
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
