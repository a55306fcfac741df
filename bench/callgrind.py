#!/usr/bin/env python3
"""Instructions per HTTP request of the proxy, counted by callgrind.

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

Needs valgrind (Debian `valgrind`).  Takes about a minute per binary with
the defaults.
"""

import argparse
import glob
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
    req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
           % target).encode()
    for _ in range(n):
        s = connect(port)
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


def measure(binary, ka, close, keep=None):
    origin = Origin()
    port = free_port()
    target = "http://127.0.0.1:%d/1k.bin" % origin.port
    outdir = keep or tempfile.mkdtemp(prefix="tp-callgrind-")
    os.makedirs(outdir, exist_ok=True)
    cfg = os.path.join(outdir, "3proxy.cfg")
    with open(cfg, "w") as f:
        f.write("timeouts 1 5 30 60 180 1800 15 60\nmaxconn 25000\n"
                "proxy -i127.0.0.1 -p%d\n" % port)
    proc = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--vgdb=yes",
         # Each dump names its functions itself (callgrind_annotate reads
         # one dump alone).
         "--compress-strings=no", "--compress-pos=no",
         "--callgrind-out-file=" + os.path.join(outdir, "cg.out.%p"),
         binary, cfg],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(outdir, "valgrind.log"), "w"))
    try:
        kept_alive(port, target, 100)
        new_connections(port, target, 50)
        time.sleep(1)
        control(proc.pid, "--zero")
        figures = {}
        for name, run, n in (("ka", kept_alive, ka), ("close", new_connections, close)):
            run(port, target, n)
            time.sleep(1)  # the last session's thread finishes
            figures[name] = (totals(dump(proc.pid, outdir, name)), n)
        return figures
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        origin.sock.close()
        if not keep:
            shutil.rmtree(outdir, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", action="append",
                    help="a 3proxy binary (repeatable; default target/release/3proxy)")
    ap.add_argument("--ka", type=int, default=4000, help="kept-alive requests (4000)")
    ap.add_argument("--close", type=int, default=1000,
                    help="requests on new connections (1000)")
    ap.add_argument("--keep", help="keep the callgrind files in this directory "
                    "(one subdirectory per binary)")
    a = ap.parse_args()
    binaries = a.binary or ["target/release/3proxy"]
    if not shutil.which("valgrind"):
        sys.exit("callgrind.py: valgrind is not installed (apt-get install valgrind)")
    rows = []
    for i, b in enumerate(binaries):
        keep = os.path.join(a.keep, str(i)) if a.keep else None
        f = measure(os.path.abspath(b), a.ka, a.close, keep)
        ka = f["ka"][0] / f["ka"][1]
        cl = f["close"][0] / f["close"][1]
        both = (f["ka"][0] + f["close"][0]) / (f["ka"][1] + f["close"][1])
        rows.append((b, ka, cl, both))
    print("%-50s %12s %12s %12s" % ("binary", "ka Ir/req", "close Ir/req", "both Ir/req"))
    for i, (b, ka, cl, both) in enumerate(rows):
        line = "%-50s %12.0f %12.0f %12.0f" % (b, ka, cl, both)
        if i > 0:
            line += "   (%+.1f%% %+.1f%% %+.1f%%)" % tuple(
                100.0 * (x / y - 1) for x, y in zip((ka, cl, both), rows[0][1:]))
        print(line)


if __name__ == "__main__":
    main()
