import unittest

from bench import configs as C


class ThreeproxyCfg(unittest.TestCase):
    def test_tcppm_copy_and_splice(self):
        self.assertIn("\ntcppm -i10.0.1.2 5201 10.0.2.2 5201\n",
                      C.render_threeproxy("tcp"))
        self.assertIn("\ntcppm -s -i10.0.1.2 5201 10.0.2.2 5201\n",
                      C.render_threeproxy("tcp", splice=True))

    def test_services(self):
        self.assertIn("\nproxy -i10.0.1.2 -p3128\n", C.render_threeproxy("http"))
        self.assertIn("\nsocks -s -i10.0.1.2 -p1080\n", C.render_threeproxy("socks", True))
        self.assertIn("\ntcppm -i10.0.1.2 8081 10.0.2.2 80\n", C.render_threeproxy("tcphttp"))

    def test_https_is_proxy_under_ssl_serv(self):
        cfg = C.render_threeproxy("https", tls=C.tls_files("/run/tls"))
        lines = cfg.splitlines()
        # The certificate and key come before ssl_serv, ssl_serv before
        # the service it applies to (3proxy.cfg(5)).
        i = lines.index("ssl_serv")
        self.assertEqual(lines[i - 2], "ssl_server_cert /run/tls/cert.pem")
        self.assertEqual(lines[i - 1], "ssl_server_key /run/tls/key.pem")
        self.assertEqual(lines[i + 1], "proxy -i10.0.1.2 -p8443")
        self.assertNotIn("ssl_serv", C.render_threeproxy("http"))
        with self.assertRaises(ValueError):
            C.render_threeproxy("https")      # no certificate: refuse, not plain

    def test_no_log_and_limits(self):
        cfg = C.render_threeproxy("tcp")
        self.assertNotIn("\nlog", cfg)
        self.assertIn("maxconn 25000\n", cfg)   # 10,000 idle clients fit
        self.assertTrue(cfg.endswith("\n"))
        with self.assertRaises(ValueError):
            C.render_threeproxy("ftp")


class NginxConf(unittest.TestCase):
    def test_origin_serves_the_dir_with_sendfile(self):
        conf = C.render_nginx_origin("/r", "/w")
        self.assertIn("worker_processes 1;", conf)
        self.assertIn("listen 10.0.2.2:80 ", conf)
        self.assertIn("root /w;", conf)
        self.assertIn("sendfile on;", conf)
        self.assertIn("access_log off;", conf)
        self.assertEqual(conf.count("{"), conf.count("}"))

    def test_http_proxy_keeps_upstream_connections(self):
        conf = C.render_nginx_proxy("/r", "http")
        self.assertIn("keepalive 2048;", conf)
        self.assertIn("proxy_http_version 1.1;", conf)
        self.assertIn('proxy_set_header Connection "";', conf)
        self.assertIn("listen 10.0.1.2:3128 ", conf)
        self.assertNotIn("load_module", conf)
        self.assertEqual(conf.count("{"), conf.count("}"))

    def test_stream_loads_the_module_first(self):
        conf = C.render_nginx_proxy("/r", "tcp")
        self.assertTrue(conf.startswith("load_module "))
        self.assertIn("proxy_pass 10.0.2.2:5201;", conf)
        self.assertIn("proxy_pass 10.0.2.2:80;", C.render_nginx_proxy("/r", "tcphttp"))

    def test_no_socks(self):
        with self.assertRaises(ValueError):
            C.render_nginx_proxy("/r", "socks")

    def test_https_is_the_http_proxy_behind_listen_ssl(self):
        conf = C.render_nginx_proxy("/r", "https", tls=C.tls_files("/t"))
        self.assertIn("listen 10.0.1.2:8443 ssl backlog=4096;", conf)
        self.assertIn("ssl_certificate /t/cert.pem;", conf)
        self.assertIn("ssl_certificate_key /t/key.pem;", conf)
        self.assertIn("ssl_protocols TLSv1.2 TLSv1.3;", conf)   # 1.22 lacks 1.3 by default
        self.assertIn("keepalive 2048;", conf)        # same upstream as http
        self.assertIn("proxy_pass http://origin;", conf)
        self.assertEqual(conf.count("{"), conf.count("}"))
        self.assertNotIn(" ssl", C.render_nginx_proxy("/r", "http"))
        with self.assertRaises(ValueError):
            C.render_nginx_proxy("/r", "https")


class HaproxyCfg(unittest.TestCase):
    def test_http_reuse(self):
        cfg = C.render_haproxy("http")
        self.assertIn("mode http", cfg)
        self.assertIn("http-reuse always", cfg)
        self.assertIn("nbthread 1", cfg)
        self.assertIn("no option splice-response", cfg)
        self.assertNotIn("\n    log", cfg)

    def test_tcp_splice(self):
        cfg = C.render_haproxy("tcp", splice=True, maxconn=1234)
        self.assertIn("mode tcp", cfg)
        self.assertNotIn("http-reuse", cfg)
        self.assertIn("    option splice-request\n", cfg)
        self.assertIn("    option splice-response\n", cfg)
        self.assertIn("bind 10.0.1.2:5201", cfg)
        self.assertIn("server origin 10.0.2.2:5201 maxconn 1234", cfg)

    def test_https_binds_ssl_crt(self):
        cfg = C.render_haproxy("https", tls=C.tls_files("/t"), maxconn=99)
        self.assertIn("    bind 10.0.1.2:8443 ssl crt /t/cert+key.pem\n", cfg)
        self.assertIn("mode http", cfg)
        self.assertIn("http-reuse always", cfg)
        self.assertIn("server origin 10.0.2.2:80 maxconn 99", cfg)
        self.assertNotIn("ssl", C.render_haproxy("http"))
        with self.assertRaises(ValueError):
            C.render_haproxy("https")

    def test_nginx_connections_fit_the_descriptor_limit(self):
        # A tunnel is two nginx connections: 9,950 tunnels need 19,900
        # (16,000 held 7,999); the worker's rlimit follows the limit too.
        conf = C.render_nginx_proxy("/r", "tcphttp", nofile=20000)
        self.assertIn("events { worker_connections 19960; }", conf)
        self.assertIn("worker_rlimit_nofile 20000;", conf)
        self.assertIn("worker_connections 19960;", C.render_nginx_proxy("/r", "http", nofile=20000))
        self.assertGreaterEqual(C.nginx_worker_connections(20000), 2 * 9950 + 1)
        self.assertEqual(C.nginx_worker_connections(100), 1024)

    def test_maxconn_fits_the_descriptor_limit(self):
        # Without splice 2 descriptors a connection: the 9,950 idle clients
        # the harness opens under a hard limit of 20,000 fit; with splice
        # its pipes take as many again.
        self.assertEqual(C.haproxy_maxconn(20000), 9950)
        self.assertEqual(C.haproxy_maxconn(20000, splice=True), 4950)
        self.assertEqual(C.haproxy_maxconn(1 << 20), 20000)
        self.assertGreaterEqual(C.haproxy_maxconn(20000), 2000)


class WrkLua(unittest.TestCase):
    def test_forward_proxy_form(self):
        lua = C.render_wrk_lua(absolute_url="http://10.0.2.2:80/1k.bin", host="10.0.2.2")
        self.assertIn('wrk.path = "http://10.0.2.2:80/1k.bin"', lua)
        self.assertIn('wrk.headers["Host"] = "10.0.2.2"', lua)
        self.assertNotIn("Connection", lua)

    def test_close_and_done_hook(self):
        lua = C.render_wrk_lua(close=True)
        self.assertIn('wrk.headers["Connection"] = "close"', lua)
        self.assertIn("done = function(summary, latency, requests)", lua)
        self.assertIn("WRKJSON", lua)
        self.assertNotIn("wrk.path", lua)


if __name__ == "__main__":
    unittest.main()


class Tls(unittest.TestCase):
    def test_files(self):
        t = C.tls_files("/w/tls")
        self.assertEqual((t["cert"], t["key"], t["pem"]),
                         ("/w/tls/cert.pem", "/w/tls/key.pem", "/w/tls/cert+key.pem"))

    def test_gen_argv(self):
        t = C.tls_files("/w/tls")
        a = C.tls_gen_argv(t, "p256")
        self.assertEqual(a[:3], ["openssl", "req", "-x509"])
        self.assertIn("ec_paramgen_curve:P-256", a)
        self.assertIn("-nodes", a)            # no passphrase: proxies start unattended
        self.assertEqual(a[a.index("-keyout") + 1], "/w/tls/key.pem")
        self.assertEqual(a[a.index("-out") + 1], "/w/tls/cert.pem")
        self.assertIn("subjectAltName=IP:10.0.1.2", a)
        self.assertIn("rsa:2048", C.tls_gen_argv(t, "rsa2048"))
        self.assertEqual(C.tls_gen_argv(t), a)      # P-256 is the default
        with self.assertRaises(ValueError):
            C.tls_gen_argv(t, "dsa")
