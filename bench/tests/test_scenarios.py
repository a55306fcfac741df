import unittest

from bench import netns
from bench import scenarios as S


class Applicable(unittest.TestCase):
    def test_matrix(self):
        self.assertIsNone(S.applicable("stream1", "noproxy"))
        self.assertIsNone(S.applicable("socks-1m", "3proxy"))
        self.assertIsNone(S.applicable("socks-1m", "noproxy"))
        self.assertIn("SOCKS", S.applicable("socks-1m", "nginx"))
        self.assertIn("SOCKS", S.applicable("socks-1m", "haproxy-splice"))
        self.assertIsNotNone(S.applicable("mem-idle-2000", "noproxy"))
        for s in S.SCENARIOS:
            if S.SCENARIOS[s]["service"] not in ("https", "mitm"):
                self.assertIsNone(S.applicable(s, "3proxy-splice"))

    def test_https_is_ours_nginx_and_haproxy(self):
        for s in ("https-ka-1k", "https-ka-1m", "https-close-1k", "https-new-1k",
                  "mem-idle-2000-https"):
            for p in ("3proxy", "nginx", "haproxy"):
                self.assertIsNone(S.applicable(s, p), (s, p))
            self.assertIsNotNone(S.applicable(s, "noproxy"))
            if S.SCENARIOS[s]["kind"] != "mem":
                self.assertIn("plain HTTP only", S.applicable(s, "noproxy"))
            self.assertIn("splicing", S.applicable(s, "3proxy-splice"))
            self.assertIn("splicing", S.applicable(s, "haproxy-splice"))
            for p in ("squid", "tinyproxy", "trafficserver"):
                self.assertIn("not set up for TLS", S.applicable(s, p))
            for p in ("dante", "microsocks"):
                self.assertIsNotNone(S.applicable(s, p))

    def test_every_scenario_is_complete(self):
        for name, s in S.SCENARIOS.items():
            self.assertIn(s["kind"], ("iperf", "wrk", "fetch", "mem", "rate", "h2load", "siege",
                                        "stime", "mitm"), name)
            self.assertIn(s["service"], ("tcp", "tcphttp", "http", "socks", "https", "mitm"),
                          name)
            self.assertTrue(s["what"])


class ClientCommands(unittest.TestCase):
    def test_wrk_ours_is_forward_proxy(self):
        url, lua = S.wrk_target("http-ka-1k", "3proxy")
        self.assertEqual(url, "http://10.0.1.2:3128/")
        self.assertEqual(lua["absolute_url"], "http://10.0.2.2:80/1k.bin")
        self.assertEqual(lua["host"], "10.0.2.2")

    def test_wrk_reverse_and_direct(self):
        self.assertEqual(S.wrk_target("http-ka-1m", "nginx")[0], "http://10.0.1.2:3128/1m.bin")
        url, lua = S.wrk_target("http-close-1k", "noproxy")
        self.assertEqual(url, "http://10.0.2.2:80/1k.bin")
        self.assertTrue(lua["close"])

    def test_wrk_https(self):
        # Ours: TLS to the proxy, the same absolute-form request inside it
        # as in http-ka-1k (what curl --proxy https:// sends).
        url, lua = S.wrk_target("https-ka-1k", "3proxy")
        self.assertEqual(url, "https://10.0.1.2:8443/")
        self.assertEqual(lua["absolute_url"], "http://10.0.2.2:80/1k.bin")
        self.assertEqual(lua["host"], "10.0.2.2")
        self.assertFalse(lua["close"])
        for p in ("nginx", "haproxy"):
            url, lua = S.wrk_target("https-close-1k", p)
            self.assertEqual(url, "https://10.0.1.2:8443/1k.bin")
            self.assertEqual(lua, {"close": True})
        self.assertEqual(S.wrk_target("https-ka-1m", "haproxy")[0], "https://10.0.1.2:8443/1m.bin")

    def test_stime_full_handshakes(self):
        a = S.stime_argv("https-new-1k", "3proxy", 6)
        self.assertEqual(a[:4], ["openssl", "s_time", "-connect", "10.0.1.2:8443"])
        self.assertIn("-new", a)                # a new session each time: no resumption
        self.assertEqual(a[a.index("-time") + 1], "6")
        self.assertEqual(a[a.index("-www") + 1], "http://10.0.2.2:80/1k.bin")
        self.assertEqual(S.stime_argv("https-new-1k", "nginx", 2)[-1], "/1k.bin")
        self.assertFalse(S.keeps_alive("https-new-1k"))

    def test_tls_probe(self):
        a = S.tls_resume_argv("lg.py", "https-close-1k", "3proxy")
        self.assertEqual(a[:3], ["python3", "lg.py", "resume"])
        self.assertEqual(a[a.index("--server") + 1], "10.0.1.2:8443")
        self.assertEqual(a[a.index("--request-target") + 1], "http://10.0.2.2:80/1k.bin")
        self.assertNotIn("--conns", a)
        self.assertNotIn("--tls", a)
        a = S.tls_resume_argv("lg.py", "https-ka-1k", "haproxy")
        self.assertEqual(a[a.index("--request-target") + 1], "/1k.bin")
        a = S.tls_probe_argv("https")
        self.assertEqual(a[:3], ["openssl", "s_client", "-brief"])
        self.assertEqual(a[a.index("-connect") + 1], "10.0.1.2:8443")

    def test_wrk_argv(self):
        argv = S.wrk_argv("http://x/", "/s.lua", 2000, 6)
        self.assertEqual(argv[:4], ["wrk", "-t1", "-c2000", "-d6s"])
        self.assertEqual(argv[-1], "http://x/")

    def test_iperf(self):
        a = S.iperf_client_argv("stream16", "haproxy", 6)
        self.assertEqual(a[:3], ["iperf3", "-c", "10.0.1.2"])
        self.assertIn("-P", a)
        self.assertNotIn("-R", a)
        a = S.iperf_client_argv("stream1-down", "noproxy", 2)
        self.assertEqual(a[2], "10.0.2.2")
        self.assertIn("-R", a)
        self.assertNotIn("-P", a)
        self.assertIn("-1", S.iperf_server_argv())

    def test_fetch(self):
        a = S.fetch_argv("/x/loadgen", "socks-1m", "3proxy", 6)
        self.assertEqual(a[:2], ["/x/loadgen", "fetch"])   # compiled, no python3
        self.assertIn("--socks", a)
        self.assertEqual(a[a.index("--server") + 1], "10.0.1.2:1080")
        a = S.fetch_argv("/x/loadgen", "socks-1m", "noproxy", 6)
        self.assertNotIn("--socks", a)
        self.assertEqual(a[a.index("--server") + 1], "10.0.2.2:80")
        # The TCP-mapping twin: same client, no handshake, the mapping's
        # port; nginx and haproxy have one too.
        for proxy in ("3proxy", "nginx", "haproxy"):
            a = S.fetch_argv("/x/loadgen", "tcp-1k", proxy, 6)
            self.assertNotIn("--socks", a)
            self.assertEqual(a[a.index("--server") + 1], "10.0.1.2:8081")
            self.assertIsNone(S.applicable("tcp-1k", proxy))

    def test_idle(self):
        a = S.idle_argv("lg.py", "mem-idle-2000", "3proxy", 2000)
        self.assertEqual(a[a.index("--request-target") + 1], "http://10.0.2.2:80/1k.bin")
        a = S.idle_argv("lg.py", "mem-idle-2000-tcp", "3proxy", 2000)
        self.assertEqual(a[a.index("--request-target") + 1], "/1k.bin")
        self.assertEqual(a[a.index("--server") + 1], "10.0.1.2:8081")
        self.assertNotIn("--tls", a)

    def test_idle_https(self):
        a = S.idle_argv("lg.py", "mem-idle-2000-https", "3proxy", 2000)
        self.assertEqual(a[a.index("--server") + 1], "10.0.1.2:8443")
        self.assertEqual(a[a.index("--request-target") + 1], "http://10.0.2.2:80/1k.bin")
        self.assertEqual(a[-1], "--tls")
        a = S.idle_argv("lg.py", "mem-idle-2000-https", "nginx", 2000)
        self.assertEqual(a[a.index("--request-target") + 1], "/1k.bin")
        self.assertIn("--tls", a)


class ProxyCommands(unittest.TestCase):
    def test_configs(self):
        self.assertIsNone(S.proxy_config("noproxy", "tcp", "/r"))
        name, text = S.proxy_config("3proxy-splice", "tcp", "/r")
        self.assertEqual(name, "3proxy.cfg")
        self.assertIn("tcppm -s ", text)
        name, text = S.proxy_config("haproxy-splice", "http", "/r", nofile=20000)
        self.assertIn("option splice-response", text)
        self.assertIn("maxconn 4950", text)

    def test_https_configs_name_the_tls_files(self):
        from bench import configs as C
        tls = C.tls_files("/t")
        _, text = S.proxy_config("3proxy", "https", "/r", tls=tls)
        self.assertIn("ssl_server_cert /t/cert.pem\nssl_server_key /t/key.pem\nssl_serv\n"
                      "proxy -i10.0.1.2 -p8443\n", text)
        _, text = S.proxy_config("nginx", "https", "/r", tls=tls)
        self.assertIn("listen 10.0.1.2:8443 ssl backlog=4096;", text)
        _, text = S.proxy_config("haproxy", "https", "/r", tls=tls)
        self.assertIn("bind 10.0.1.2:8443 ssl crt /t/cert+key.pem\n", text)

    def test_argv(self):
        self.assertEqual(S.proxy_argv("3proxy", "/r/c", "/r", "/b/3proxy"), ["/b/3proxy", "/r/c"])
        self.assertEqual(S.proxy_argv("haproxy", "/r/h", "/r", None)[:2], ["haproxy", "-db"])
        self.assertIn("-c", S.proxy_argv("nginx", "/r/n", "/r", None))

    def test_alt_binary(self):
        saved = (dict(S.PROXIES), list(S.PROXY_ORDER))
        try:
            S.add_alt("/other/3proxy")
            self.assertEqual(S.proxy_argv("3proxy-alt", "/r/c", "/r", "/b/3proxy"),
                             ["/other/3proxy", "/r/c"])
            self.assertEqual(S.proxy_argv("3proxy", "/r/c", "/r", "/b/3proxy"),
                             ["/b/3proxy", "/r/c"])
            self.assertEqual(S.PROXY_ORDER.index("3proxy-alt"), S.PROXY_ORDER.index("3proxy") + 1)
            name, text = S.proxy_config("3proxy-alt", "socks", "/r")
            self.assertEqual(name, "3proxy.cfg")
            self.assertNotIn(" -s ", text)
        finally:
            S.PROXIES.clear()
            S.PROXIES.update(saved[0])
            S.PROXY_ORDER[:] = saved[1]

    def test_select(self):
        self.assertEqual(S.select(None, S.PROXIES, "proxy"), list(S.PROXIES))
        self.assertEqual(S.select("nginx, noproxy", S.PROXIES, "proxy"), ["nginx", "noproxy"])
        with self.assertRaisesRegex(ValueError, "unknown proxy 'varnish'"):
            S.select("varnish", S.PROXIES, "proxy")


class Topology(unittest.TestCase):
    def test_commands_name_only_our_namespaces(self):
        cmds = netns.setup_commands(1, 0)
        added = [c[3] for c in cmds if c[:3] == ["ip", "netns", "add"]]
        self.assertEqual(added, ["tpb-cli", "tpb-prx", "tpb-org"])
        self.assertTrue(all(c[0] == "ip" for c in cmds))
        mtus = [c[c.index("mtu") + 1] for c in cmds if "mtu" in c]
        self.assertEqual(set(mtus), {"1500"})
        routes = [c for c in cmds if "route" in c]
        self.assertEqual(len(routes), 2)
        for r in routes:
            self.assertTrue(r[r.index("add") + 1].startswith("10.0."))

    def test_rps_goes_to_the_receiving_side(self):
        plan = {dev: cpu for ns, dev, cpu in netns.rps_plan(1, 0)}
        self.assertEqual(plan, {"c0": 0, "p0": 1, "p1": 1, "o0": 0})
        self.assertEqual(netns.cpu_mask(1), "2")
        self.assertEqual(netns.cpu_mask(0), "1")


if __name__ == "__main__":
    unittest.main()


class RadiusProxy(unittest.TestCase):
    """bench.py --radius: 3proxy-radius is our http cfg with `log radius`
    to the origin namespace's FreeRADIUS, and nothing else differs."""

    def tearDown(self):
        S.PROXIES.pop("3proxy-radius", None)
        if "3proxy-radius" in S.PROXY_ORDER:
            S.PROXY_ORDER.remove("3proxy-radius")

    def test_not_there_unless_asked(self):
        self.assertNotIn("3proxy-radius", S.PROXIES)

    def test_its_cfg_is_ours_with_log_radius(self):
        S.add_radius()
        S.add_radius()  # twice: still one entry
        self.assertEqual(S.PROXY_ORDER.count("3proxy-radius"), 1)
        self.assertEqual(S.PROXY_ORDER.index("3proxy-radius"), S.PROXY_ORDER.index("3proxy") + 1)
        name, cfg = S.proxy_config("3proxy-radius", "http", "/tmp/x")
        plain = S.proxy_config("3proxy", "http", "/tmp/x")[1]
        self.assertEqual(name, "3proxy.cfg")
        # A bare address: 3proxy 1.0.0 refuses IP:PORT, and 1812 is the default.
        self.assertIn("\nradius testing123 10.0.2.2\nlog radius\nproxy -i10.0.1.2 -p3128\n", cfg)
        self.assertEqual(cfg.replace("radius testing123 10.0.2.2\nlog radius\n", ""), plain)
        self.assertIsNone(S.applicable("http-ka-1k", "3proxy-radius"))
        self.assertEqual(S.proxy_argv("3proxy-radius", "/c", "/r", "/bin/3proxy"),
                         ["/bin/3proxy", "/c"])
