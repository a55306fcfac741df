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


class ProxyCfg(unittest.TestCase):
    def test_without_radius_the_bench_http_cfg(self):
        cfg = callgrind.proxy_cfg(3128)
        self.assertNotIn("radius", cfg)
        self.assertNotIn("log", cfg)
        self.assertTrue(cfg.endswith("proxy -i127.0.0.1 -p3128\n"))

    def test_radius_and_log_radius_before_the_service(self):
        lines = callgrind.proxy_cfg(3128, "127.0.0.1:40000").splitlines()
        self.assertEqual(lines[0].split()[0], "timeouts")
        self.assertIn("radius %s 127.0.0.1:40000" % callgrind.SECRET, lines)
        r = lines.index("radius %s 127.0.0.1:40000" % callgrind.SECRET)
        self.assertLess(r, lines.index("log radius"))
        self.assertEqual(lines[-1], "proxy -i127.0.0.1 -p3128")
        self.assertLess(lines.index("log radius"), len(lines) - 1)


class RaddbConf(unittest.TestCase):
    def test_accounting_on_the_port_with_the_secret_in_the_dir(self):
        conf = callgrind.raddb_conf("/tmp/rd", 40001)
        self.assertIn("port = 40001", conf)
        self.assertIn("type = acct", conf)
        self.assertNotIn("type = auth", conf)
        self.assertIn("secret = %s" % callgrind.SECRET, conf)
        self.assertIn("filename = /tmp/rd/detail", conf)
        self.assertIn("confdir = /tmp/rd\n", conf)
        # FreeRADIUS's braces balance (format's doubled ones came out single).
        self.assertEqual(conf.count("{"), conf.count("}"))
        self.assertNotIn("{{", conf)


class CountRecords(unittest.TestCase):
    def test_by_status(self):
        detail = ("Wed Dec  2 04:19:57 2026\n\tAcct-Status-Type = Start\n"
                  "\tUser-Name = \"x\"\n\n"
                  "Wed Dec  2 04:19:58 2026\n\tAcct-Status-Type = Stop\n"
                  "\tAcct-Input-Octets = 12\n\n"
                  "Wed Dec  2 04:19:58 2026\n\tAcct-Status-Type = Start\n\n")
        self.assertEqual(callgrind.count_records(detail), {"Start": 2, "Stop": 1})

    def test_empty(self):
        self.assertEqual(callgrind.count_records(""), {})

    def test_a_value_mentioning_a_status_is_not_a_record(self):
        self.assertEqual(callgrind.count_records(
            '\tReply-Message = "Acct-Status-Type = Stop"\n'), {})


class Change(unittest.TestCase):
    def test_per_request_and_change(self):
        f = {"ka": (4000, 4), "close": (6000, 2)}
        self.assertEqual(callgrind.per_request(f), (1000, 3000, 10000 / 6))
        self.assertEqual(callgrind.change((105, 200, 99), (100, 200, 100)),
                         "(+5.0% +0.0% -1.0%)")


if __name__ == "__main__":
    unittest.main()


class RaddbConf(unittest.TestCase):
    def test_loopback_with_detail_by_default(self):
        conf = callgrind.raddb_conf("/d", 1813)
        self.assertIn("ipaddr = 127.0.0.1\n\t\tport = 1813", conf)
        self.assertIn("ipaddr = 127.0.0.0/8", conf)
        self.assertIn("accounting {\n\t\tdetail\n", conf)

    def test_bench_server_answers_without_recording(self):
        conf = callgrind.raddb_conf("/d", 1813, listen="10.0.2.2", clients="10.0.0.0/8",
                                    detail=False)
        self.assertIn("ipaddr = 10.0.2.2\n\t\tport = 1813", conf)
        self.assertIn("ipaddr = 10.0.0.0/8", conf)
        self.assertIn("accounting {\n\t\tok\n", conf)

class Services(unittest.TestCase):
    """tcppm's and SOCKS5's drivers against the origin and a minimal
    SOCKS5 server in a thread (no proxy, no valgrind)."""

    def setUp(self):
        self.origin = callgrind.Origin()

    def tearDown(self):
        self.origin.sock.close()

    def test_through_a_mapping_reads_the_whole_response(self):
        port = self.origin.port
        callgrind.through(lambda: callgrind.connect(port), 3)

    def socks_server(self, reply):
        import socket
        import threading
        l = socket.socket()
        l.bind(("127.0.0.1", 0))
        l.listen(4)
        seen = []

        def serve():
            c, _ = l.accept()
            with c:
                seen.append(callgrind.recv_exactly(c, 3))
                c.sendall(b"\x05\x00")
                req = callgrind.recv_exactly(c, 10)
                seen.append(req)
                c.sendall(reply)
                if reply[1] != 0:
                    return
                o = socket.create_connection(("127.0.0.1", int.from_bytes(req[8:], "big")))
                o.sendall(c.recv(65536))
                while True:
                    b = o.recv(65536)
                    if not b:
                        break
                    c.sendall(b)
                o.close()
        threading.Thread(target=serve, daemon=True).start()
        self.addCleanup(l.close)
        return l.getsockname()[1], seen

    def test_socks5_session_as_loadgen_sends_it(self):
        port, seen = self.socks_server(b"\x05\x00\x00\x01\x7f\x00\x00\x01\x00\x50")
        callgrind.phases("socks")[0][1](port, self.origin.port, 1)
        self.assertEqual(seen[0], b"\x05\x01\x00")
        self.assertEqual(seen[1], b"\x05\x01\x00\x01\x7f\x00\x00\x01"
                         + self.origin.port.to_bytes(2, "big"))

    def test_a_socks5_refusal_is_an_error(self):
        port, _ = self.socks_server(b"\x05\x05\x00\x01\x00\x00\x00\x00\x00\x00")
        with self.assertRaises(RuntimeError):
            callgrind.socks5_open(port, self.origin.port)

    def test_service_lines(self):
        self.assertEqual(callgrind.service_line("tcppm", 1, 2),
                         "tcppm -i127.0.0.1 1 127.0.0.1 2\n")
        self.assertEqual(callgrind.service_line("socks", 1, 2), "socks -i127.0.0.1 -p1\n")
        self.assertTrue(callgrind.proxy_cfg(5).endswith("proxy -i127.0.0.1 -p5\n"))
        self.assertEqual([p[0] for p in callgrind.phases("http")], ["ka", "close"])
        self.assertEqual([p[0] for p in callgrind.phases("tcppm")], ["new"])
        with self.assertRaises(ValueError):
            callgrind.service_line("ftp", 1, 2)

    def test_per_request(self):
        self.assertEqual(callgrind.per_request({"new": (1000, 10)}), (100.0,))
        self.assertEqual(callgrind.per_request({"ka": (100, 10), "close": (300, 10)}),
                         (10.0, 30.0, 20.0))


class Auth(unittest.TestCase):
    """--auth's cfg lines, directory, logins, slapd log counts and the
    ratio line."""

    def test_users_warm_then_misses(self):
        u = callgrind.users(2)
        self.assertEqual([n for n, _ in u], ["warm1", "warm2", "warm3", "u001", "u002"])
        self.assertEqual(len({p for _, p in u}), 5)

    def test_login_header_is_basic(self):
        self.assertEqual(callgrind.login_header("alice", "alicepw"),
                         "Proxy-Authorization: Basic YWxpY2U6YWxpY2Vwdw==\r\n")

    def test_header_goes_into_the_requests(self):
        import socket
        for send in (lambda p: callgrind.kept_alive(p, "/x", 1, "X-A: 1\r\n"),
                     lambda p: callgrind.new_connections(p, "/x", 1, "X-A: 1\r\n")):
            l = socket.socket()
            l.bind(("127.0.0.1", 0))
            l.listen(1)
            got = []

            def serve():
                c, _ = l.accept()
                buf = b""
                while b"\r\n\r\n" not in buf:
                    buf += c.recv(4096)
                got.append(buf)
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1024\r\n"
                          b"Connection: close\r\n\r\n" + callgrind.BODY)
                c.close()
            import threading
            t = threading.Thread(target=serve)
            t.start()
            send(l.getsockname()[1])
            t.join()
            l.close()
            head = got[0].decode().split("\r\n")
            self.assertEqual(head[0], "GET /x HTTP/1.1")
            self.assertIn("X-A: 1", head)

    def test_strong_lines(self):
        cfg = callgrind.auth_lines("strong", [("a", "pa"), ("b", "pb")]).splitlines()
        self.assertEqual(cfg[0], "authcache user,password %d" % callgrind.CACHE_TIME)
        self.assertEqual(cfg[1:3], ["users a:CL:pa", "users b:CL:pb"])
        self.assertEqual(cfg[-2:], ["auth cache strong", "allow *"])

    def test_ldap_lines_plugin_first(self):
        cfg = callgrind.auth_lines("ldap", [("a", "pa")], "127.0.0.1:389").splitlines()
        self.assertEqual(cfg[0].split()[:2], ["authcache", "user,password"])
        self.assertEqual(cfg[1], "plugin LdapPlugin.ld.so start")
        self.assertIn("ldapconnect 127.0.0.1:389 %s %s"
                      % (callgrind.ADMIN, callgrind.ADMIN_PW), cfg)
        self.assertIn("ldapaccess " + callgrind.GROUP, cfg)
        self.assertNotIn("users", " ".join(cfg))
        self.assertLess(cfg.index("plugin LdapPlugin.ld.so start"),
                        cfg.index("auth cache ldap"))
        self.assertEqual(cfg[-1], "allow *")
        with self.assertRaises(ValueError):
            callgrind.auth_lines("ldap", [])
        with self.assertRaises(ValueError):
            callgrind.auth_lines("radius", [])

    def test_auth_before_the_service(self):
        cfg = callgrind.proxy_cfg(3128, auth="auth cache strong\n").splitlines()
        self.assertEqual(cfg[-2:], ["auth cache strong", "proxy -i127.0.0.1 -p3128"])

    def test_ldif_puts_every_login_in_the_group(self):
        text = callgrind.ldif([("a", "pa"), ("b", "pb")])
        entries = text.split("\n\n")
        self.assertEqual(len(entries), 4)
        self.assertTrue(entries[0].startswith("dn: dc=test\n"))
        self.assertIn("dn: uid=b,ou=people,dc=test\n", entries[3])
        self.assertIn("userPassword: pb\n", entries[3])
        self.assertIn("ou: internet\n", entries[3])

    def test_count_binds(self):
        log = ('conn=1000 op=0 BIND dn="cn=admin,dc=test" method=128\n'
               'conn=1000 op=0 BIND dn="cn=admin,dc=test" mech=SIMPLE ssf=0\n'
               'conn=1001 op=0 BIND dn="uid=u001,ou=people,dc=test" method=128\n'
               'conn=1002 op=0 BIND dn="uid=u002,ou=people,dc=test" method=128\n'
               'conn=1003 op=0 BIND dn="" method=128\n')
        self.assertEqual(callgrind.count_binds(log), {"user": 2, "admin": 1})
        self.assertEqual(callgrind.count_binds(""), {"user": 0, "admin": 0})

    def test_per_request_with_misses(self):
        f = {"miss": (5000, 10), "ka": (100, 10), "close": (300, 10)}
        self.assertEqual(callgrind.per_request(f), (10.0, 30.0, 20.0, 500.0, 470.0))

    def test_ratio_line(self):
        line = callgrind.ratio_line("b", (12, 40, 20, 900, 860), (10, 30, 20, 100, 70))
        self.assertIn("ka 1.20x, close 1.33x, both 1.00x (target <= 1.5x: met)", line)
        self.assertIn("860 Ir more than a cached request with ldap, 70 with strong", line)
        self.assertIn("missed", callgrind.ratio_line("b", (40, 40, 40, 0, 0),
                                                     (10, 10, 10, 0, 0)))


class Percon(unittest.TestCase):
    def test_perf_csv(self):
        from bench import percon
        text = ("# started on x\n\n"
                "5000,,context-switches,1000,100.00,,\n"
                "<not counted>,,cpu-migrations,0,100.00,,\n"
                "12,,syscalls:sys_enter_accept4,1000,100.00,,\n")
        self.assertEqual(percon.parse_perf_csv(text),
                         {"context-switches": 5000, "syscalls:sys_enter_accept4": 12})
