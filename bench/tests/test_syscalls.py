import unittest

from bench import syscalls

SUMMARY = """\
% time     seconds  usecs/call     calls    errors syscall
------ ----------- ----------- --------- --------- ----------------
 50.13    0.624159         490      1272           clock_nanosleep
  9.36    0.116526          14      8000           sendmsg
  2.12    0.026388          20      1284       835 recvmmsg
  0.00    0.000005           5         1           setsockopt
------ ----------- ----------- --------- --------- ----------------
100.00    1.244970          65     10557       835 total
"""


class ParseStraceC(unittest.TestCase):
    def test_calls_per_syscall_with_and_without_errors(self):
        self.assertEqual(syscalls.parse_strace_c(SUMMARY), {
            "clock_nanosleep": 1272, "sendmsg": 8000, "recvmmsg": 1284,
            "setsockopt": 1})

    def test_nothing_traced(self):
        self.assertEqual(syscalls.parse_strace_c(""), {})


if __name__ == "__main__":
    unittest.main()
