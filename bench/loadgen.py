#!/usr/bin/env python3
"""Idle clients for the memory scenarios.  Runs inside the client netns.
(The fetch scenarios' load client is compiled: bench/loadgen.rs.)

  loadgen.py idle --server H:P --request-target T --host H --conns N [--tls]
      open N connections, make one kept-alive request on each, print READY,
      then hold them open until stdin closes.  --tls: each connection is
      TLS (the server's certificate is not checked: the bench made it).

  loadgen.py resume --server H:P --request-target T --host H
      two TLS connections, one request each, the second offering the first's
      session: prints `TLSPROBE {json}` with the version, the cipher and
      whether the server resumed the session (as wrk does on reconnecting).

Prints one `LOADGEN {json}` line at the end (parse.parse_loadgen).
"""

import argparse
import json
import resource
import selectors
import socket
import ssl
import sys

BUF = 256 * 1024


def hostport(s):
    host, port = s.rsplit(":", 1)
    return host, int(port)


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


def tls_context():
    """A TLS client context that takes the bench's self-signed certificate."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def idle(args):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    server = hostport(args.server)
    req = http_request(args.request_target, args.host, close=False)
    scratch = bytearray(BUF)
    ctx = tls_context() if args.tls else None
    socks_ = []
    errors = 0
    in_a_row = 0
    first_error = None
    for _ in range(args.conns):
        try:
            s = socket.create_connection(server, timeout=10)
            if ctx:
                s = ctx.wrap_socket(s)
            s.sendall(req)
            status, _ = read_response(s, scratch)
            if status != 200:
                raise ConnectionError("status %d" % status)
            socks_.append(s)
            in_a_row = 0
        except OSError as ex:
            errors += 1
            in_a_row += 1
            first_error = first_error or repr(ex)
            # A proxy at its limit leaves the next clients in its backlog
            # unanswered: 3 timeouts in a row say it holds no more (51 of
            # 10 s each outlasted the harness's wait for READY).
            if errors > 50 or in_a_row >= 3:
                break
    print("READY %d" % len(socks_), flush=True)
    sys.stdin.read()          # the harness closes our stdin when done
    # Count the connections the proxy closed while we held them (or sent
    # anything on: a TLS close_notify is bytes too).
    sel = selectors.DefaultSelector()
    for s in socks_:
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ)
    ready = {key.fileobj for key, _ in sel.select(timeout=0)}
    dropped = sum(1 for s in socks_
                  if s in ready or (isinstance(s, ssl.SSLSocket) and s.pending()))
    for s in socks_:
        s.close()
    print("LOADGEN " + json.dumps({"open": len(socks_), "errors": errors,
                                   "dropped_while_idle": dropped,
                                   "first_error": first_error,
                                   "nofile": soft}), flush=True)
    return 0


def resume(args):
    """What the server does with a client that reconnects offering its last
    session, as wrk does (it keeps the session across SSL_clear)."""
    server = hostport(args.server)
    req = http_request(args.request_target, args.host, close=True)
    ctx = tls_context()
    session, out = None, {}
    for i in range(2):
        with socket.create_connection(server, timeout=10) as raw:
            with ctx.wrap_socket(raw, session=session) as s:
                out = {"protocol": s.version(), "cipher": s.cipher()[0],
                       "resumed": s.session_reused}
                s.sendall(req)
                # Read to the end: a TLS 1.3 ticket comes after the handshake.
                try:
                    while s.recv(65536):
                        pass
                except ssl.SSLEOFError:
                    pass        # a close without close_notify
                session = s.session
    print("TLSPROBE " + json.dumps(out), flush=True)
    return 0


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    i = sub.add_parser("idle")
    i.add_argument("--server", required=True)
    i.add_argument("--request-target", required=True)
    i.add_argument("--host", required=True)
    i.add_argument("--conns", type=int, default=2000)
    i.add_argument("--tls", action="store_true", help="speak TLS to the server")
    r = sub.add_parser("resume")
    r.add_argument("--server", required=True)
    r.add_argument("--request-target", required=True)
    r.add_argument("--host", required=True)
    args = p.parse_args(argv)
    return idle(args) if args.cmd == "idle" else resume(args)


if __name__ == "__main__":
    sys.exit(main())
