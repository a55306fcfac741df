import os
import socket
import tempfile
import threading
import unittest

from bench import pressure


class Percentile(unittest.TestCase):
    def test_nearest_rank(self):
        xs = list(range(1, 101))
        self.assertEqual(pressure.percentile(xs, 50), 50)
        self.assertEqual(pressure.percentile(xs, 99), 99)
        self.assertEqual(pressure.percentile(xs, 100), 100)
        self.assertEqual(pressure.percentile([7], 99), 7)
        self.assertIsNone(pressure.percentile([], 99))


class Codes(unittest.TestCase):
    def test_counts_the_second_word_of_each_record(self):
        with tempfile.NamedTemporaryFile("w", delete=False) as f:
            f.write("PROXY 00000 Accepting connections [1/2]\nPROXY 00081 127.0.0.1\n"
                    "PROXY 00081 127.0.0.1\nSOCKS 00082 \nnot a record\n")
        try:
            self.assertEqual(pressure.code_counts(f.name), {0: 1, 81: 2, 82: 1})
        finally:
            os.unlink(f.name)
        self.assertEqual(pressure.code_counts("/nonexistent/log"), {})


class Answer(unittest.TestCase):
    def test_reads_a_whole_answer_in_pieces_and_fails_on_a_short_one(self):
        a, b = socket.socketpair()
        def send():
            for piece in (b"HTTP/1.1 200 OK\r\nContent-", b"Length: 5\r\n\r\nab", b"cde"):
                b.sendall(piece)
        t = threading.Thread(target=send)
        t.start()
        status, body, rest = pressure.read_answer(a)
        t.join()
        self.assertEqual((status, body, rest), (200, b"abcde", b""))
        b.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab")
        b.close()
        with self.assertRaises(OSError):
            pressure.read_answer(a)
        a.close()


if __name__ == "__main__":
    unittest.main()
