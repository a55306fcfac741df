import json
import unittest

from bench import parse

WRK_OUT = """Running 1s test @ http://127.0.0.1:8799/1k.bin
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     3.55ms    2.97ms  18.78ms   85.24%
    Req/Sec     1.27k   279.07     1.59k    50.00%
  1266 requests in 1.00s, 1.48MB read
Requests/sec:   1262.88
Transfer/sec:      1.48MB
WRKJSON {"requests":1266,"bytes":1552318,"duration_us":1002469,"connect":0,"read":0,"write":0,"status":3,"timeout":1,"lat_p50_us":2326,"lat_p99_us":13811}
"""

# Trimmed `iperf3 -c ... -P 2 -J` (3.12): the parts parse_iperf3 reads.
IPERF = {
    "start": {"connected": [{"socket": 5}, {"socket": 7}], "version": "iperf 3.12"},
    "intervals": [],
    "end": {
        "streams": [],
        "sum_sent": {"start": 0, "end": 1.000587, "seconds": 1.000587, "bytes": 1690042262,
                     "bits_per_second": 13512406297.0, "retransmits": 7, "sender": True},
        "sum_received": {"start": 0, "end": 1.000587, "seconds": 1.000587,
                         "bytes": 1689911190, "bits_per_second": 13511358352.647,
                         "sender": True},
        "cpu_utilization_percent": {},
    },
}


class Wrk(unittest.TestCase):
    def test_done_hook_line(self):
        r = parse.parse_wrk(WRK_OUT)
        self.assertEqual(r["requests"], 1266)
        self.assertEqual(r["bytes"], 1552318)
        self.assertAlmostEqual(r["seconds"], 1.002469)
        self.assertAlmostEqual(r["rps"], 1266 / 1.002469)
        self.assertEqual(r["errors"], 4)
        self.assertEqual(r["error_kinds"]["status"], 3)
        self.assertEqual(r["lat_p99_us"], 13811)

    def test_without_hook(self):
        with self.assertRaises(parse.ParseError):
            parse.parse_wrk(WRK_OUT.split("WRKJSON")[0])


class Iperf(unittest.TestCase):
    def test_received(self):
        r = parse.parse_iperf3(json.dumps(IPERF))
        self.assertEqual(r["bytes"], 1689911190)
        self.assertAlmostEqual(r["bits_per_s"], 1689911190 * 8 / 1.000587)
        self.assertEqual(r["retransmits"], 7)
        self.assertEqual(r["streams"], 2)

    def test_error(self):
        with self.assertRaisesRegex(parse.ParseError, "unable to connect"):
            parse.parse_iperf3(json.dumps({"start": {}, "intervals": [], "end": {},
                                           "error": "unable to connect to server"}))
        with self.assertRaises(parse.ParseError):
            parse.parse_iperf3("iperf3: error - the server is busy")


class Loadgen(unittest.TestCase):
    def test_last_line_wins(self):
        r = parse.parse_loadgen('x\nLOADGEN {"requests": 1, "bytes": 5, "seconds": 1}\n'
                                'LOADGEN {"requests": 4, "bytes": 8, "seconds": 2}\n')
        self.assertEqual(r["rps"], 2)
        self.assertEqual(r["bytes_per_s"], 4)

    def test_missing(self):
        with self.assertRaises(parse.ParseError):
            parse.parse_loadgen("Traceback ...")


class TlsProbe(unittest.TestCase):
    # openssl 3.0 s_client -brief, to stderr.
    OUT = ("Can't use SSL_get_servername\n"
           "depth=0 CN = 10.0.1.2\n"
           "verify error:num=18:self-signed certificate\n"
           "CONNECTION ESTABLISHED\n"
           "Protocol version: TLSv1.3\n"
           "Ciphersuite: TLS_AES_256_GCM_SHA384\n"
           "Peer certificate: CN = 10.0.1.2\n"
           "Hash used: SHA256\n"
           "Signature type: ECDSA\n"
           "Verification error: self-signed certificate\n"
           "Server Temp Key: X25519, 253 bits\n"
           "DONE\n")

    def test_negotiated(self):
        self.assertEqual(parse.parse_tls_probe(self.OUT),
                         {"protocol": "TLSv1.3", "cipher": "TLS_AES_256_GCM_SHA384",
                          "kx": "X25519, 253 bits", "sig": "ECDSA"})

    def test_stime(self):
        out = ("Collecting connection statistics for 2 seconds\n****\n\n"
               "242 connections in 0.45s; 537.78 connections/user sec, bytes read 304678\n"
               "242 connections in 3 real seconds, 1259 bytes read per connection\n")
        self.assertEqual(parse.parse_stime(out), {"requests": 242, "bytes": 304678})
        slow = "12 connections in 0.00s; inf connections/user sec, bytes read 15108\n"
        self.assertEqual(parse.parse_stime(slow), {"requests": 12, "bytes": 15108})
        with self.assertRaises(parse.ParseError):
            parse.parse_stime("ERROR\n40F7:error:connect:Connection refused\n")

    def test_resume_line(self):
        r = parse.parse_tls_resume('x\nTLSPROBE {"protocol": "TLSv1.3", "cipher": "C", '
                                   '"resumed": true}\n')
        self.assertEqual(r, {"protocol": "TLSv1.3", "cipher": "C", "resumed": True})
        with self.assertRaises(parse.ParseError):
            parse.parse_tls_resume("Traceback ...")

    def test_no_handshake(self):
        with self.assertRaises(parse.ParseError):
            parse.parse_tls_probe("connect:errno=111\n")


class Proc(unittest.TestCase):
    STAT = ("cpu  1802 0 1407 24845 280 0 17 10 0 0\n"
            "cpu0 678 0 558 12906 26 0 5 3 0 0\n"
            "cpu1 1124 0 849 11939 254 0 12 7 0 0\n"
            "intr 102611 0 0\n")

    def test_proc_stat(self):
        s = parse.parse_proc_stat(self.STAT)
        self.assertEqual(sorted(k for k in s if k != "all"), [0, 1])
        self.assertEqual(s[1]["idle"], 11939)
        self.assertEqual(s[0]["steal"], 3)
        self.assertEqual(s["all"]["user"], 1802)

    def test_listening(self):
        text = (
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
            "   0: 0200000A:0C38 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0\n"
            "   1: 0200000A:1451 0100000A:9C40 01 00000000:00000000 00:00000000 00000000     0\n")
        self.assertEqual(parse.listening_ports(text), {3128})

    def test_pid_stat_with_odd_comm(self):
        text = ("1234 (we (i) rd) S 77 1234 1234 0 -1 4194560 100 0 0 0 "
                "15 7 3 2 20 0 4 0 5555 1000 200 18446744073709551615")
        st = parse.parse_pid_stat(text)
        self.assertEqual(st["comm"], "we (i) rd")
        self.assertEqual(st["ppid"], 77)
        self.assertEqual((st["utime"], st["stime"], st["cutime"], st["cstime"]), (15, 7, 3, 2))
        self.assertEqual(st["starttime"], 5555)
        self.assertFalse(st["flags"] & parse.PF_KTHREAD)

    def test_status(self):
        text = "Name:\tnginx\nVmHWM:\t   20480 kB\nVmRSS:\t   10240 kB\nThreads:\t1\n"
        self.assertEqual(parse.parse_status_kb(text, "VmRSS"), 10240)
        self.assertEqual(parse.parse_status_kb(text, "VmHWM"), 20480)
        self.assertIsNone(parse.parse_status_kb(text, "VmSwap"))

    def test_softnet(self):
        text = ("0000a1b2 00000000 00000003 00000000 00000000 00000000 00000000 00000000 "
                "00000000 00000010 00000000 00000000 00000000\n"
                "00000100 00000000 00000000 00000000 00000000 00000000 00000000 00000000 "
                "00000000 00000abc 00000000 00000000 00000001\n")
        s = parse.parse_softnet(text)
        self.assertEqual(s[0], {"processed": 0xa1b2, "received_rps": 0x10})
        self.assertEqual(s[1]["received_rps"], 0xabc)


if __name__ == "__main__":
    unittest.main()
