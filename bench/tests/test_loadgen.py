import socket
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


if __name__ == "__main__":
    unittest.main()
