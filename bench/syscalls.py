#!/usr/bin/env python3
"""System calls per HTTP request of the proxy, counted by `strace -c -f`.

callgrind (bench/callgrind.py) counts instructions in user space; the
kernel's work is not in its figures, and for `log radius` the system calls
(each a kernel entry, a UDP send or receive) are the larger cost.  This
runs the same setup as callgrind.py (its `http` cfg, its origin, its
clients; with --radius its FreeRADIUS and `radius SECRET ...` + `log
radius`), natively, and attaches `strace -c -f` to the proxy for each
phase alone:

  warm-up   100 kept-alive requests and 50 new connections (not counted)
  ka        N kept-alive requests on one connection
  close     M requests, a new connection each

Each phase is counted from before its first request until 1.5 s after its
last (with --radius: until FreeRADIUS has had every record), so the
accounting sender's work for it is in; an idle proxy makes no calls.
Prints calls per request, per phase, in total and for the calls that
differ most.  strace slows the proxy down, which changes how many
requests the sender gathers per batch: the figures are for that pace.

  python3 bench/syscalls.py [--binary target/release/3proxy] [--radius]

Needs strace (Debian `strace`) and ptrace rights over the proxy (run as
root or with kernel.yama.ptrace_scope=0).
"""

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.callgrind import (  # noqa: E402
    Origin, Radiusd, free_port, kept_alive, new_connections, proxy_cfg)


def parse_strace_c(text):
    """{syscall: calls} of an `strace -c` summary."""
    calls = {}
    for line in text.splitlines():
        f = line.split()
        # % time, seconds, usecs/call, calls, [errors,] syscall
        if len(f) >= 5 and re.match(r"^[\d.]+$", f[0]) and f[-1] != "total":
            try:
                calls[f[-1]] = int(f[3])
            except ValueError:
                pass
    return calls


def count(pid, outdir, name, run):
    """Run `run()` with strace attached to every thread of pid; {syscall:
    calls} of that phase."""
    out = os.path.join(outdir, name + ".strace")
    st = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(pid)],
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(1.5)  # attached to every thread
    run()
    st.send_signal(signal.SIGINT)
    st.wait(30)
    with open(out) as f:
        return parse_strace_c(f.read())


def measure(binary, ka, close, radius, outdir):
    origin = Origin()
    port = free_port()
    target = "http://127.0.0.1:%d/1k.bin" % origin.port
    rad = Radiusd(os.path.join(outdir, "raddb")) if radius else None
    cfg = os.path.join(outdir, "3proxy.cfg")
    with open(cfg, "w") as f:
        f.write(proxy_cfg(port, rad.server() if rad else None))
    proc = subprocess.Popen([binary, cfg], stdout=subprocess.DEVNULL,
                            stderr=open(os.path.join(outdir, "proxy.log"), "w"))
    try:
        kept_alive(port, target, 100)
        new_connections(port, target, 50)
        if rad:
            rad.settle()
        figures = {}
        for name, fn, n in (("ka", kept_alive, ka), ("close", new_connections, close)):
            def run():
                fn(port, target, n)
                if rad:
                    rad.settle()
                else:
                    time.sleep(1.5)
            figures[name] = (count(proc.pid, outdir, name, run), n)
        if rad:
            figures["records"] = rad.records()
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", default="target/release/3proxy")
    ap.add_argument("--ka", type=int, default=4000)
    ap.add_argument("--close", type=int, default=1000)
    ap.add_argument("--radius", action="store_true",
                    help="also with `log radius` to a FreeRADIUS this starts")
    ap.add_argument("--keep", help="keep the strace summaries here")
    a = ap.parse_args()
    if not shutil.which("strace"):
        sys.exit("syscalls.py: strace is not installed (apt-get install strace)")
    rows = []
    for radius in ([False, True] if a.radius else [False]):
        outdir = (os.path.join(a.keep, "radius" if radius else "plain") if a.keep
                  else tempfile.mkdtemp(prefix="tp-syscalls-"))
        os.makedirs(outdir, exist_ok=True)
        f = measure(os.path.abspath(a.binary), a.ka, a.close, radius, outdir)
        rows.append(("+log radius" if radius else "no log", f))
        if not a.keep:
            shutil.rmtree(outdir, ignore_errors=True)
    print("%-14s %12s %12s" % ("cfg", "ka calls/req", "close calls/req"))
    for what, f in rows:
        print("%-14s %12.2f %12.2f" % (
            what, sum(f["ka"][0].values()) / f["ka"][1],
            sum(f["close"][0].values()) / f["close"][1]))
    if len(rows) == 2:
        for phase in ("ka", "close"):
            base, with_ = rows[0][1][phase], rows[1][1][phase]
            n = base[1]
            names = set(base[0]) | set(with_[0])
            diff = sorted(((with_[0].get(k, 0) - base[0].get(k, 0)) / n, k) for k in names)
            print("%s, calls/req more with log radius: %s" % (phase, ", ".join(
                "%s %+.2f" % (k, d) for d, k in reversed(diff) if abs(d) >= 0.01)))
        print("records FreeRADIUS got: %s" % rows[1][1].get("records"))


if __name__ == "__main__":
    main()
