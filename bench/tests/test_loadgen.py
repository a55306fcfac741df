import socket
import threading
import unittest

from bench import loadgen


class Socks5(unittest.TestCase):
    def test_requests(self):
        self.assertEqual(loadgen.socks5_greeting(), b"\x05\x01\x00")
        self.assertEqual(loadgen.socks5_connect_request("10.0.2.2", 80),
                         b"\x05\x01\x00\x01\x0a\x00\x02\x02\x00\x50")

    def test_reply_length(self):
        self.assertEqual(loadgen.socks5_reply_len(b"\x05\x00\x00\x01\x0a"), 10)
        self.assertEqual(loadgen.socks5_reply_len(b"\x05\x00\x00\x04\x00"), 22)
        self.assertEqual(loadgen.socks5_reply_len(b"\x05\x00\x00\x03\x05"), 12)
        with self.assertRaises(ValueError):
            loadgen.socks5_reply_len(b"\x05\x00\x00\x09\x00")

    def test_handshake_over_a_socketpair(self):
        a, b = socket.socketpair()

        def server():
            assert b.recv(3) == b"\x05\x01\x00"
            b.sendall(b"\x05\x00")
            assert len(b.recv(10)) == 10
            b.sendall(b"\x05\x00\x00\x01\x01\x02\x03\x04\x00\x50")

        t = threading.Thread(target=server)
        t.start()
        loadgen.socks5_handshake(a, "10.0.2.2", 80)
        t.join()
        a.close()
        b.close()


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
