#!/usr/bin/env python3
"""Load the harness needs and wrk cannot make.  Runs inside the client netns.

  loadgen.py fetch --server H:P --target H:P --path /1m.bin --conns N --seconds S [--socks]
      N threads, each in a loop: connect (through a SOCKS5 CONNECT when
      --socks), GET PATH with `Connection: close`, read the whole body, close.
  loadgen.py idle --server H:P --request-target T --host H --conns N
      open N connections, make one kept-alive request on each, print READY,
      then hold them open until stdin closes.

Prints one `LOADGEN {json}` line at the end (parse.parse_loadgen).
"""

import argparse
import json
import resource
import selectors
import socket
import struct
import sys
import threading
import time

BUF = 256 * 1024


def hostport(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


def socks5_greeting():
    """Version 5, one method: no authentication."""
    return b"\x05\x01\x00"


def socks5_connect_request(ip, port):
    """CONNECT to an IPv4 address."""
    return b"\x05\x01\x00\x01" + socket.inet_aton(ip) + struct.pack("!H", port)


def socks5_reply_len(head):
    """Length of a whole CONNECT reply given at least its first 5 bytes."""
    atyp = head[3]
    if atyp == 1:
        return 10
    if atyp == 4:
        return 22
    if atyp == 3:
        return 7 + head[4]
    raise ValueError("bad SOCKS5 address type %d" % atyp)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def socks5_handshake(sock, ip, port):
    sock.sendall(socks5_greeting())
    if recv_exact(sock, 2) != b"\x05\x00":
        raise ConnectionError("SOCKS5 method refused")
    sock.sendall(socks5_connect_request(ip, port))
    head = recv_exact(sock, 5)
    if head[1] != 0:
        raise ConnectionError("SOCKS5 CONNECT failed, reply %d" % head[1])
    recv_exact(sock, socks5_reply_len(head) - 5)


def http_request(target, host, close):
    return ("GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n"
            % (target, host, "Connection: close\r\n" if close else "")).encode()


def split_head(buf):
    """(status, content_length, header_len) once BUF holds a whole response
    head, else None."""
    end = buf.find(b"\r\n\r\n")
    if end < 0:
        return None
    lines = buf[:end].decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    length = None
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    return status, length, end + 4


def read_response(sock, scratch):
    """Read one response; returns (status, bytes read)."""
    buf = b""
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed before response head")
        buf += chunk
        got = split_head(buf)
        if got:
            break
    status, length, hlen = got
    if length is None:
        raise ConnectionError("response without Content-Length")
    have = len(buf) - hlen
    view = memoryview(scratch)
    while have < length:
        n = sock.recv_into(view, min(len(scratch), length - have))
        if n == 0:
            raise ConnectionError("closed %d bytes into the body" % have)
        have += n
    return status, hlen + length


def fetch(args):
    server = hostport(args.server)
    tip, tport = hostport(args.target)
    deadline = time.monotonic() + args.seconds
    totals = {"requests": 0, "bytes": 0, "errors": 0, "first_error": None}
    lock = threading.Lock()
    req = http_request(args.path, args.target, close=True)

    def worker():
        scratch = bytearray(BUF)
        n = b = e = 0
        err = None
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(server, timeout=10) as s:
                    if args.socks:
                        socks5_handshake(s, tip, tport)
                    s.sendall(req)
                    status, got = read_response(s, scratch)
                    if status != 200:
                        raise ConnectionError("status %d" % status)
                n += 1
                b += got
            except OSError as ex:
                e += 1
                err = err or repr(ex)
                time.sleep(0.05)
        with lock:
            totals["requests"] += n
            totals["bytes"] += b
            totals["errors"] += e
            totals["first_error"] = totals["first_error"] or err

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker) for _ in range(args.conns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    totals["seconds"] = time.monotonic() - t0
    print("LOADGEN " + json.dumps(totals), flush=True)
    return 0


def idle(args):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    server = hostport(args.server)
    req = http_request(args.request_target, args.host, close=False)
    scratch = bytearray(BUF)
    socks_ = []
    errors = 0
    first_error = None
    for _ in range(args.conns):
        try:
            s = socket.create_connection(server, timeout=10)
            s.sendall(req)
            status, _ = read_response(s, scratch)
            if status != 200:
                raise ConnectionError("status %d" % status)
            socks_.append(s)
        except OSError as ex:
            errors += 1
            first_error = first_error or repr(ex)
            if errors > 50:
                break
    print("READY %d" % len(socks_), flush=True)
    sys.stdin.read()          # the harness closes our stdin when done
    # Count the connections the proxy closed while we held them.
    sel = selectors.DefaultSelector()
    for s in socks_:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    dropped = len(sel.select(timeout=0))
    for s in socks_:
        s.close()
    print("LOADGEN " + json.dumps({"open": len(socks_), "errors": errors,
                                   "dropped_while_idle": dropped,
                                   "first_error": first_error,
                                   "nofile": soft}), flush=True)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch")
    f.add_argument("--server", required=True)
    f.add_argument("--target", required=True)
    f.add_argument("--path", required=True)
    f.add_argument("--conns", type=int, default=8)
    f.add_argument("--seconds", type=float, default=5)
    f.add_argument("--socks", action="store_true")
    i = sub.add_parser("idle")
    i.add_argument("--server", required=True)
    i.add_argument("--request-target", required=True)
    i.add_argument("--host", required=True)
    i.add_argument("--conns", type=int, default=2000)
    args = p.parse_args(argv)
    return fetch(args) if args.cmd == "fetch" else idle(args)


if __name__ == "__main__":
    sys.exit(main())
