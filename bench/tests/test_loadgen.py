import contextlib
import io
import json
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import unittest

from bench import loadgen


class Http(unittest.TestCase):
    def test_request(self):
        self.assertEqual(loadgen.http_request("/x", "h", close=True),
                         b"GET /x HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n")
        self.assertNotIn(b"Connection", loadgen.http_request("http://h/x", "h", close=False))

    def test_split_head(self):
        self.assertIsNone(loadgen.split_head(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n"))
        head = b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n"
        self.assertEqual(loadgen.split_head(head + b"abc"), (200, 3, len(head)))

    def test_read_response_over_a_socketpair(self):
        a, b = socket.socketpair()
        body = b"x" * 100000
        head = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)
        t = threading.Thread(target=lambda: b.sendall(head + body))
        t.start()
        status, n = loadgen.read_response(a, bytearray(4096))
        t.join()
        self.assertEqual((status, n), (200, len(head) + len(body)))
        a.close()
        b.close()


class IdleTls(unittest.TestCase):
    """idle --tls against a real TLS server on loopback: a handshake, one
    kept-alive request per client, and then held open."""

    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        from bench import configs
        self.tls = configs.tls_files(self.dir.name)
        subprocess.run(configs.tls_gen_argv(self.tls), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def tearDown(self):
        self.dir.cleanup()

    def serve(self, n, close_after):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(self.tls["cert"], self.tls["key"])
        lsock = socket.create_server(("127.0.0.1", 0))
        port = lsock.getsockname()[1]
        held, requests = [], []

        def run():
            for _ in range(n):
                c, _ = lsock.accept()
                t = ctx.wrap_socket(c, server_side=True)
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += t.recv(4096)
                requests.append(buf)
                t.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
                if close_after:
                    t.close()
                else:
                    held.append(t)
            lsock.close()
        th = threading.Thread(target=run, daemon=True)
        th.start()
        return port, th, held, requests

    def idle(self, port, n):
        out = io.StringIO()
        saved = sys.stdin
        sys.stdin = io.StringIO("")          # the harness closing our stdin
        try:
            with contextlib.redirect_stdout(out):
                rc = loadgen.main(["idle", "--server", "127.0.0.1:%d" % port,
                                   "--request-target", "http://o/x", "--host", "o",
                                   "--conns", str(n), "--tls"])
        finally:
            sys.stdin = saved
        self.assertEqual(rc, 0)
        lines = out.getvalue().splitlines()
        return lines[0], json.loads(lines[-1].split(" ", 1)[1])

    def test_held_over_tls(self):
        port, th, held, requests = self.serve(3, close_after=False)
        ready, res = self.idle(port, 3)
        th.join(5)
        self.assertEqual(ready, "READY 3")
        self.assertEqual((res["open"], res["errors"], res["dropped_while_idle"]), (3, 0, 0))
        # The request went inside TLS, as a proxy's client sends it.
        self.assertTrue(requests[0].startswith(b"GET http://o/x HTTP/1.1\r\nHost: o\r\n"))
        for t in held:
            t.close()

    def test_closed_by_the_server_counts_as_dropped(self):
        port, th, held, requests = self.serve(2, close_after=True)
        ready, res = self.idle(port, 2)
        th.join(5)
        self.assertEqual(ready, "READY 2")
        self.assertEqual(res["dropped_while_idle"], 2)

    def test_resume_reports_a_resumed_session(self):
        port, th, held, requests = self.serve(2, close_after=True)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = loadgen.main(["resume", "--server", "127.0.0.1:%d" % port,
                               "--request-target", "/x", "--host", "o"])
        th.join(5)
        self.assertEqual(rc, 0)
        from bench import parse
        r = parse.parse_tls_resume(out.getvalue())
        self.assertEqual(r["protocol"], "TLSv1.3")
        self.assertTrue(r["resumed"])       # Python's server resumes by default
        self.assertEqual(len(requests), 2)


if __name__ == "__main__":
    unittest.main()
