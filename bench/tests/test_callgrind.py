import os
import tempfile
import unittest

from bench import callgrind


class Origin(unittest.TestCase):
    """The driver's origin and clients, against each other (no proxy, no
    valgrind): the origin takes an absolute-form target as any other."""

    def setUp(self):
        self.origin = callgrind.Origin()
        self.target = "http://127.0.0.1:%d/1k.bin" % self.origin.port

    def tearDown(self):
        self.origin.sock.close()

    def test_kept_alive_requests(self):
        callgrind.kept_alive(self.origin.port, self.target, 5)

    def test_new_connections_end_with_the_response(self):
        callgrind.new_connections(self.origin.port, self.target, 3)


class ReadResponse(unittest.TestCase):
    def test_a_refusal_is_an_error(self):
        import socket
        a, b = socket.socketpair()
        b.sendall(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
        with self.assertRaises(RuntimeError):
            callgrind.read_response(a, b"")
        a.close()
        b.close()

    def test_a_short_body_is_an_error(self):
        import socket
        a, b = socket.socketpair()
        b.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n\r\nxx")
        b.close()
        with self.assertRaises(ConnectionError):
            callgrind.read_response(a, b"")
        a.close()


class Totals(unittest.TestCase):
    def test_summary_and_totals_lines(self):
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "x.cg")
            with open(p, "w") as f:
                f.write("# callgrind format\nevents: Ir\nsummary: 12345\nfn=x\n1 2\n")
            self.assertEqual(callgrind.totals(p), 12345)
            with open(p, "w") as f:
                f.write("events: Ir\nfn=x\n1 2\ntotals: 77\n")
            self.assertEqual(callgrind.totals(p), 77)
            with open(p, "w") as f:
                f.write("events: Ir\n")
            with self.assertRaises(RuntimeError):
                callgrind.totals(p)


if __name__ == "__main__":
    unittest.main()
