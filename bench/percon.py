#!/usr/bin/env python3
"""System calls and context switches per connection of a proxy, by name.

For the connection-per-request cells (tcp-1k, socks-1k): where does a
proxy's time per connection go that an instruction count does not show?
This starts one server on loopback (ours with the bench's cfg, or a peer:
haproxy `mode tcp`, dante, microsocks), with the small Python origin of
callgrind.py answering 1 KB, warms it up, then drives N connections
through it (a new connection per request: a TCP mapping, or a SOCKS5
session sent as loadgen sends it: greeting, answer, CONNECT, reply, GET)
twice:

  perf stat   system calls (the syscalls tracepoints: per connection, in
              all and by name, and how many failed), context switches and
              CPU migrations (software events: no PMU needed), of every
              thread and process of the server

and prints them, with the server's CPU time per connection (user+system
from /proc, untraced run; loopback on a shared machine: a rough figure,
the bench's cells are the measure).

  python3 bench/percon.py --service tcppm --server ours --binary target/release/3proxy
  python3 bench/percon.py --service tcppm --server haproxy
  python3 bench/percon.py --service socks --server dante
  python3 bench/percon.py --service socks --server microsocks

Needs perf (Debian `linux-perf`) and tracefs, root (the tracepoints,
and dante).  Not strace -c: it slows each call of the server so much
that the client's bytes are always there by the next read, and hides the
reads that would have said EAGAIN.
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench import callgrind  # noqa: E402


def ours(binary, service, port, origin_port, d, opts=""):
    cfg = os.path.join(d, "3proxy.cfg")
    text = callgrind.proxy_cfg(port, None, service, origin_port)
    if opts:
        # The service's own options, after its name (the last line).
        head, _, line = text.rstrip("\n").rpartition("\n")
        name, _, rest = line.partition(" ")
        text = "%s\n%s %s %s\n" % (head, name, opts, rest)
    with open(cfg, "w") as f:
        f.write(text)
    return [binary, cfg]


def haproxy(service, port, origin_port, d):
    if service != "tcppm":
        raise SystemExit("haproxy: tcppm only (mode tcp)")
    cfg = os.path.join(d, "haproxy.cfg")
    with open(cfg, "w") as f:
        f.write("global\n    nbthread 1\n    maxconn 4000\n\n"
                "defaults\n    mode tcp\n    timeout connect 5s\n"
                "    timeout client 300s\n    timeout server 300s\n"
                "    no option splice-request\n    no option splice-response\n\n"
                "frontend in\n    bind 127.0.0.1:%d\n    maxconn 4000\n"
                "    default_backend out\n\n"
                "backend out\n    server origin 127.0.0.1:%d maxconn 4000\n"
                % (port, origin_port))
    return ["haproxy", "-db", "-f", cfg]


def dante(service, port, origin_port, d):
    if service != "socks":
        raise SystemExit("dante: socks only")
    cfg = os.path.join(d, "sockd.conf")
    with open(cfg, "w") as f:
        f.write("logoutput: %s/sockd.err\ninternal: 127.0.0.1 port = %d\n"
                "external: 127.0.0.1\nsocksmethod: none\nclientmethod: none\n"
                "user.privileged: root\nuser.unprivileged: nobody\n"
                "timeout.negotiate: 30\ntimeout.io: 300\n"
                "client pass {\n    from: 0.0.0.0/0 to: 0.0.0.0/0\n}\n"
                "socks pass {\n    from: 0.0.0.0/0 to: 0.0.0.0/0\n    command: connect\n}\n"
                % (d, port))
    return ["danted", "-f", cfg, "-N", "1", "-p", os.path.join(d, "sockd.pid")]


def microsocks(service, port, origin_port, d):
    if service != "socks":
        raise SystemExit("microsocks: socks only")
    return ["microsocks", "-i", "127.0.0.1", "-p", str(port)]


def tree(pid):
    """pid and every process descended from it."""
    out = [pid]
    for p in out:
        try:
            with open("/proc/%d/task/%d/children" % (p, p)) as f:
                out += [int(x) for x in f.read().split()]
        except OSError:
            pass
    return out


def cpu_ticks(pids):
    total = 0
    for p in pids:
        try:
            with open("/proc/%d/stat" % p) as f:
                fields = f.read().rsplit(")", 1)[1].split()
            # utime, stime, cutime, cstime: fields 14-17 (1-based)
            total += sum(int(x) for x in fields[11:15])
        except OSError:
            pass
    return total


# The system calls counted by name (the total counts all).
SYSCALLS = (
    "accept", "accept4", "read", "write", "recvfrom", "sendto", "recvmsg", "sendmsg",
    "poll", "ppoll", "select", "pselect6", "epoll_wait", "epoll_ctl", "futex",
    "socket", "connect", "bind", "close", "shutdown", "setsockopt", "getsockopt",
    "getsockname", "getpeername", "ioctl", "fcntl", "clone", "clone3", "mmap",
    "munmap", "madvise", "mprotect", "rt_sigprocmask", "clock_gettime", "splice",
    "pipe2", "sched_yield", "newfstatat", "lseek",
)


def parse_perf_csv(text):
    """{event: count} from perf stat -x, output (an event perf could not
    count is left out)."""
    out = {}
    for line in text.splitlines():
        parts = line.split(",")
        if len(parts) >= 3 and parts[0].strip().isdigit():
            out[parts[2]] = int(parts[0])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--service", choices=("tcppm", "socks"), required=True)
    ap.add_argument("--server", choices=("ours", "haproxy", "dante", "microsocks"),
                    default="ours")
    ap.add_argument("--binary", default="target/release/3proxy", help="ours: the 3proxy binary")
    ap.add_argument("--opts", default="",
                    help="ours: options added to the service line (e.g. -olTCP_DEFER_ACCEPT)")
    ap.add_argument("-n", type=int, default=2000, help="connections per measure (2000)")
    a = ap.parse_args()
    origin = callgrind.Origin()
    port = callgrind.free_port()
    d = tempfile.mkdtemp(prefix="tp-percon-")
    if a.server == "ours":
        argv = ours(os.path.abspath(a.binary), a.service, port, origin.port, d, a.opts)
    else:
        argv = globals()[a.server](a.service, port, origin.port, d)
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(d, "server.log"), "w"))
    run = dict((name, fn) for name, fn, _ in callgrind.phases(a.service))["new"]
    try:
        time.sleep(0.5)
        if proc.poll() is not None:
            with open(os.path.join(d, "server.log")) as f:
                raise SystemExit("%s did not start:\n%s" % (a.server, f.read()))
        run(port, origin.port, 200)
        time.sleep(0.5)
        pids = tree(proc.pid)
        t0 = cpu_ticks(pids)
        start = time.monotonic()
        run(port, origin.port, a.n)
        time.sleep(0.3)
        wall = time.monotonic() - start
        ticks = cpu_ticks(tree(proc.pid)) - t0
        hz = os.sysconf("SC_CLK_TCK")
        # Counted in the kernel (tracepoints), not by ptrace: strace -c
        # slows every call of the server so much that a client's bytes
        # are always there by its next read, which hides the reads that
        # would have said EAGAIN.
        events = ["context-switches", "cpu-migrations", "raw_syscalls:sys_enter"]
        events += ["syscalls:sys_enter_" + n for n in SYSCALLS]
        pf = subprocess.Popen(["perf", "stat", "-x,", "-o", os.path.join(d, "perf.txt")]
                              + sum([["-e", e] for e in events], [])
                              + ["-e", "raw_syscalls:sys_exit", "--filter", "ret < 0"]
                              + ["-p", ",".join(str(p) for p in tree(proc.pid))],
                              stderr=subprocess.DEVNULL)
        time.sleep(1)
        run(port, origin.port, a.n)
        time.sleep(0.3)
        pf.send_signal(signal.SIGINT)
        pf.wait(30)
        with open(os.path.join(d, "perf.txt")) as f:
            counts = parse_perf_csv(f.read())
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        origin.sock.close()
    n = a.n
    print("%s %s: %d connections, CPU %.0f us/conn (%.1f s wall)"
          % (a.server, a.service, n, ticks * 1e6 / hz / n, wall))
    print("system calls per connection: %.2f (%.2f failed)"
          % (counts.get("raw_syscalls:sys_enter", 0) / n,
             counts.get("raw_syscalls:sys_exit", 0) / n))
    named = sorted(((k[len("syscalls:sys_enter_"):], v) for k, v in counts.items()
                    if k.startswith("syscalls:sys_enter_")), key=lambda kv: -kv[1])
    for name, c in named:
        if c / n >= 0.01:
            print("  %-20s %6.2f" % (name, c / n))
    for ev in ("context-switches", "cpu-migrations"):
        if ev in counts:
            print("%s per connection: %.2f" % (ev, counts[ev] / n))


if __name__ == "__main__":
    main()
