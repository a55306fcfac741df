"""Issue 31's https-mitm cells: TLS interception by ours, 3proxy 1.0.0
(--alt-binary) and squid's ssl_bump.  Configs, command lines, the
verdict, the report.  No root, no network, no tools needed."""

import os
import subprocess
import sys
import tempfile
import unittest
from unittest import mock

from bench import configs as C
from bench import parse, report, runner
from bench import scenarios as S

CELLS = ("https-mitm-ka-1k", "https-mitm-close-1k")
M = C.mitm_files("/w/mitm")


class Certificates(unittest.TestCase):
    def test_two_cas_and_the_origin_signed_by_its_own(self):
        self.assertEqual(M["ca"], "/w/mitm/mitm-ca.pem")
        self.assertEqual(M["origin_ca"], "/w/mitm/origin-ca.pem")
        self.assertEqual(len({v for k, v in M.items() if k != "dir"}), 6)
        origin_ca, mitm_ca, origin = C.mitm_gen_argvs(M)
        for argv in (origin_ca, mitm_ca):
            self.assertEqual(argv[:3], ["openssl", "req", "-x509"])
            self.assertIn("basicConstraints=critical,CA:TRUE", argv)
            self.assertIn("-nodes", argv)          # unencrypted keys
        self.assertEqual(origin_ca[origin_ca.index("-out") + 1], M["origin_ca"])
        self.assertEqual(mitm_ca[mitm_ca.index("-keyout") + 1], M["ca_key"])
        # The origin's: signed by the origin CA (not self-signed), for its
        # address as subjectAltName and as common name.
        self.assertNotIn("-x509", origin)
        self.assertEqual(origin[origin.index("-CA") + 1], M["origin_ca"])
        self.assertEqual(origin[origin.index("-CAkey") + 1], M["origin_ca_key"])
        self.assertIn("subjectAltName=IP:10.0.2.2", origin)
        self.assertEqual(origin[origin.index("-subj") + 1], "/CN=10.0.2.2")
        self.assertIn("basicConstraints=critical,CA:FALSE", origin)

    def test_key_types(self):
        for argv in C.mitm_gen_argvs(M, "p256"):
            self.assertIn("ec_paramgen_curve:P-256", argv)
        for argv in C.mitm_gen_argvs(M, "rsa2048"):
            self.assertIn("rsa:2048", argv)
        with self.assertRaises(ValueError):
            C.mitm_gen_argvs(M, "dsa")
        # The https cells' certificate is made as before.
        self.assertIn("ec_paramgen_curve:P-256", C.tls_gen_argv(C.tls_files("/t")))


class Configs(unittest.TestCase):
    def test_ours_and_3proxy_intercept_with_the_mitm_ca(self):
        cfg = C.render_threeproxy("mitm", mitm=M, certcache="/c/certcache")
        lines = cfg.splitlines()
        i = lines.index("ssl_mitm")
        self.assertEqual(lines[i + 1], "proxy -i10.0.1.2 -p3129")
        before = lines[:i]
        for want in ("ssl_server_ca_file /w/mitm/mitm-ca.pem",
                     "ssl_server_ca_key /w/mitm/mitm-ca.key",
                     "ssl_client_ca_file /w/mitm/origin-ca.pem",
                     "ssl_client_verify",
                     # 3proxy wants the directory with its slash.
                     "ssl_certcache /c/certcache/"):
            self.assertIn(want, before)
        self.assertNotIn("\nssl_serv\n", cfg)
        self.assertNotIn("plugin", cfg)      # TLS is built into both
        self.assertNotIn("\nlog", cfg)
        with self.assertRaises(ValueError):
            C.render_threeproxy("mitm")
        with self.assertRaises(ValueError):
            C.render_threeproxy("mitm", mitm=M)

    def test_proxy_config_gives_ours_a_cache_in_its_cell(self):
        name, text = S.proxy_config("3proxy", "mitm", "/cell", mitm=M)
        self.assertEqual(name, "3proxy.cfg")
        self.assertIn("ssl_certcache /cell/certcache/\n", text)
        self.assertEqual(S.certcache_dir("/cell"), "/cell/certcache")
        # 3proxy 1.0.0 (--alt-binary) reads the very same cfg.
        saved = (dict(S.PROXIES), list(S.PROXY_ORDER))
        try:
            S.add_alt("/opt/3proxy-1.0.0/bin/3proxy", "3proxy 1.0.0")
            self.assertIsNone(S.applicable("https-mitm-ka-1k", "3proxy-alt"))
            self.assertEqual(S.proxy_config("3proxy-alt", "mitm", "/cell", mitm=M)[1], text)
            self.assertEqual(S.proxy_argv("3proxy-alt", "/cell/3proxy.cfg", "/cell", "ours")[0],
                             "/opt/3proxy-1.0.0/bin/3proxy")
        finally:
            S.PROXIES.clear()
            S.PROXIES.update(saved[0])
            S.PROXY_ORDER[:] = saved[1]

    def test_squid_bumps_on_its_own_port(self):
        conf = C.render_squid("/r", nofile=20000, mitm=M)
        first = conf.splitlines()[0]
        self.assertTrue(first.startswith("http_port 10.0.1.2:3129 ssl-bump "), first)
        self.assertIn(" generate-host-certificates=on", first)
        self.assertIn(" tls-cert=/w/mitm/mitm-ca.pem tls-key=/w/mitm/mitm-ca.key", first)
        self.assertIn("\nsslcrtd_program /usr/lib/squid/security_file_certgen -s /r/ssl_db -M 4MB\n",
                      conf)
        self.assertIn("\nacl step1 at_step SslBump1\nssl_bump peek step1\nssl_bump bump all\n",
                      conf)
        self.assertIn("\ntls_outgoing_options cafile=/w/mitm/origin-ca.pem\n", conf)
        # The rest as in the plain squid cells: one worker, no cache, no log.
        for want in ("workers 1\n", "cache deny all\n", "access_log none\n",
                     "max_filedescriptors 20000\n"):
            self.assertIn(want, conf)
        plain = C.render_squid("/r", nofile=20000)
        self.assertTrue(plain.startswith("http_port 10.0.1.2:3128\n"))
        self.assertNotIn("ssl", plain)
        self.assertEqual(conf.split("workers 1\n", 1)[1], plain.split("workers 1\n", 1)[1])
        name, text = S.proxy_config("squid", "mitm", "/r", nofile=20000, mitm=M)
        self.assertEqual((name, text), ("squid.conf", conf))
        self.assertEqual(S.proxy_config("squid", "http", "/r", nofile=20000, mitm=M)[1], plain)

    def test_squid_certificate_database(self):
        self.assertEqual(C.squid_ssl_db_argv("/r"),
                         ["/usr/lib/squid/security_file_certgen", "-c", "-s", "/r/ssl_db",
                          "-M", "4MB"])

    def test_origin_serves_https_with_its_certificate(self):
        conf = C.render_nginx_origin("/r", "/w", mitm=M)
        self.assertIn("listen 10.0.2.2:80 backlog=4096;", conf)
        self.assertIn("listen 10.0.2.2:443 ssl backlog=4096;", conf)
        self.assertIn("ssl_certificate /w/mitm/origin.pem;", conf)
        self.assertIn("ssl_certificate_key /w/mitm/origin.key;", conf)
        self.assertEqual(conf.count("root /w;"), 2)
        self.assertEqual(conf.count("{"), conf.count("}"))
        self.assertNotIn("ssl", C.render_nginx_origin("/r", "/w"))


class Cells(unittest.TestCase):
    def test_who_intercepts(self):
        for s in CELLS:
            self.assertEqual(S.SCENARIOS[s]["service"], "mitm")
            self.assertEqual(S.SCENARIOS[s]["unit"], "req")
            self.assertEqual(S.SCENARIOS[s]["file"], "1k.bin")
            for p in ("3proxy", "squid", "noproxy"):
                self.assertIsNone(S.applicable(s, p), (s, p))
            for p in ("3proxy-splice", "haproxy-splice"):
                self.assertIn("splicing", S.applicable(s, p))
            for p in ("nginx", "haproxy"):
                self.assertIn("no HTTP CONNECT", S.applicable(s, p))
            for p in ("tinyproxy", "trafficserver"):
                self.assertIn("not set up to intercept", S.applicable(s, p))
            for p in ("dante", "microsocks"):
                self.assertIn("SOCKS server only", S.applicable(s, p))
        self.assertTrue(S.keeps_alive("https-mitm-ka-1k"))
        self.assertFalse(S.keeps_alive("https-mitm-close-1k"))
        self.assertEqual(C.listen_port("mitm"), 3129)

    def test_client_through_the_proxy_trusts_the_mitm_ca(self):
        a = S.mitm_argv("/lg", "https-mitm-ka-1k", "3proxy", 6, M)
        self.assertEqual(a[:2], ["/lg", "fetch"])

        def opt(argv, k):
            return argv[argv.index(k) + 1]
        self.assertEqual(opt(a, "--server"), "10.0.1.2:3129")
        self.assertEqual(opt(a, "--target"), "10.0.2.2:443")
        self.assertEqual(opt(a, "--tls"), "/w/mitm/mitm-ca.pem")
        self.assertEqual(opt(a, "--path"), "/1k.bin")
        self.assertEqual(opt(a, "--conns"), "8")
        self.assertEqual(opt(a, "--seconds"), "6")
        self.assertIn("--connect", a)
        self.assertIn("--keepalive", a)
        c = S.mitm_argv("/lg", "https-mitm-close-1k", "squid", 2.5, M)
        self.assertEqual(opt(c, "--seconds"), "2.5")
        self.assertIn("--connect", c)
        self.assertNotIn("--keepalive", c)
        # No proxy: TLS with the origin itself, trusting the origin's CA.
        d = S.mitm_argv("/lg", "https-mitm-close-1k", "noproxy", 2, M)
        self.assertEqual(opt(d, "--server"), "10.0.2.2:443")
        self.assertEqual(opt(d, "--tls"), "/w/mitm/origin-ca.pem")
        self.assertNotIn("--connect", d)


LOADGEN = ('WARM 8\nLOADGEN {"requests": 4000, "bytes": 4900000, "errors": 0, '
           '"first_error": null, "seconds": 2.0, "handshakes": 4000, "warm_error": null}\n')


class Verdict(unittest.TestCase):
    def res(self, **kw):
        r = dict(parse.parse_loadgen(LOADGEN), proxy_cpu_s=2.0, status="ok")
        r.update(kw)
        return r

    def test_parse_keeps_handshakes(self):
        r = parse.parse_loadgen(LOADGEN)
        self.assertEqual((r["handshakes"], r["rps"]), (4000, 2000.0))
        self.assertIsNone(r["warm_error"])

    def test_cpu_per_handshake(self):
        r = runner.mitm_verdict(self.res(), 8, "WARM 8")
        self.assertEqual(r["status"], "ok")
        self.assertEqual(r["cpu_us_per_handshake"], 500.0)
        self.assertEqual(r["warm_conns"], 8)
        # Kept alive: the handshakes were all in the warm-up.
        r = runner.mitm_verdict(self.res(handshakes=0), 8, "WARM 8")
        self.assertEqual(r["status"], "ok")
        self.assertNotIn("cpu_us_per_handshake", r)

    def test_a_connection_short_of_the_warm_up_is_an_error(self):
        r = runner.mitm_verdict(self.res(warm_error="CONNECT status 502"), 8, "WARM 7")
        self.assertEqual(r["status"], "error")
        self.assertIn("7 of 8 connections", r["reason"])
        self.assertIn("CONNECT status 502", r["reason"])
        self.assertEqual(runner.mitm_verdict(self.res(), 8, "LOADGEN {}")["status"], "error")

    def test_errors_beyond_one_percent(self):
        r = runner.mitm_verdict(self.res(errors=41, first_error="status 503"), 8, "WARM 8")
        self.assertEqual(r["status"], "error")
        self.assertIn("status 503", r["reason"])
        self.assertEqual(runner.mitm_verdict(self.res(errors=40), 8, "WARM 8")["status"], "ok")
        r = runner.mitm_verdict(self.res(requests=0, errors=0), 8, "WARM 8")
        self.assertEqual(r["status"], "error")

    def test_a_dead_proxy_stays_the_error(self):
        r = runner.mitm_verdict(self.res(status="error", reason="proxy exited (1)"), 8, "WARM 8")
        self.assertEqual(r["reason"], "proxy exited (1)")


class Session(runner.Session):
    def __init__(self, workdir):
        super().__init__("/repo", workdir, None, log=lambda *a: None)


class RunnerSteps(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.addCleanup(self.tmp.cleanup)
        self.dir = self.tmp.name

    def test_make_mitm_runs_openssl_and_opens_the_files(self):
        s = Session(self.dir)
        ran = []

        def fake_run(argv, **kw):
            ran.append(argv)
            for k in ("-keyout", "-out"):
                open(argv[argv.index(k) + 1], "w").close()
            return subprocess.CompletedProcess(argv, 0, "")
        with mock.patch.object(runner.subprocess, "run", fake_run):
            s.make_mitm()
        self.assertEqual(ran, C.mitm_gen_argvs(s.mitm, s.tls_key))
        for k, path in s.mitm.items():
            if k != "dir":
                self.assertEqual(os.stat(path).st_mode & 0o777, 0o644, k)

    def test_make_mitm_says_what_failed(self):
        s = Session(self.dir)
        with mock.patch.object(runner.subprocess, "run",
                               lambda argv, **kw: subprocess.CompletedProcess(argv, 1, "bad")):
            with self.assertRaises(RuntimeError) as e:
                s.make_mitm()
        self.assertIn("bad", str(e.exception))

    def test_prepare_ours_and_squid(self):
        s = Session(self.dir)
        s.prepare_mitm("ours", self.dir)
        self.assertTrue(os.path.isdir(os.path.join(self.dir, "certcache")))

        def certgen(argv, **kw):
            db = argv[argv.index("-s") + 1]
            os.makedirs(os.path.join(db, "certs"))
            open(os.path.join(db, "index.txt"), "w").close()
            return subprocess.CompletedProcess(argv, 0, "Done")
        with mock.patch.object(runner.subprocess, "run", certgen):
            s.prepare_mitm("squid", self.dir)
        db = C.squid_ssl_db(self.dir)
        # squid drops root and writes its certificates there.
        for p in (db, db + "/certs", db + "/index.txt"):
            self.assertEqual(os.stat(p).st_mode & 0o777, 0o777, p)

    def test_squid_without_openssl_is_not_applicable(self):
        s = Session(self.dir)
        with mock.patch.object(runner.subprocess, "run",
                               mock.Mock(side_effect=lambda argv, **kw:
                                         subprocess.CompletedProcess(argv, 127, "not found"))):
            with self.assertRaises(runner.NotApplicable) as e:
                s.prepare_mitm("squid", self.dir)
        self.assertIn("squid-openssl", str(e.exception))

    def test_cell_measures_after_the_warm_up(self):
        s = Session(self.dir)
        s.fetcher = "/lg"
        m = {"proxy_cpu_s": 1.0, "wall_s": 2.0}
        seen = {}

        def kept(p, argv, seconds):
            seen["argv"], seen["seconds"] = argv, seconds
            return (0, LOADGEN, ""), dict(m)
        s._rate_kept = kept
        r = s._mitm("https-mitm-close-1k", "3proxy", None, self.dir)
        self.assertEqual(seen["argv"], S.mitm_argv("/lg", "https-mitm-close-1k", "3proxy",
                                                   s.seconds, s.mitm))
        self.assertEqual(r["status"], "ok", r.get("reason"))
        self.assertEqual((r["cpu_us_per_req"], r["cpu_us_per_handshake"]), (250.0, 250.0))
        s._rate_kept = lambda p, argv, seconds: ((1, "", "loadgen: --tls: no such file"), None)
        r = s._mitm("https-mitm-close-1k", "3proxy", None, self.dir)
        self.assertEqual(r["status"], "error")
        self.assertIn("warm-up", r["reason"])
        s.fetcher, s.fetcher_error = None, "cargo failed"
        self.assertIn("cargo failed", s._mitm("https-mitm-ka-1k", "squid", None,
                                              self.dir)["reason"])


class Report(unittest.TestCase):
    def test_per_handshake_line(self):
        from bench.tests.test_report import cell, doc
        d = doc([cell("https-mitm-close-1k", "3proxy", 0, rps=1000, cost=800.0, unit="req",
                      cpu_us_per_handshake=800.0),
                 cell("https-mitm-close-1k", "squid", 0, rps=500, cost=1500.0, unit="req",
                      cpu_us_per_handshake=1500.0),
                 cell("https-mitm-ka-1k", "3proxy", 0, rps=9000, cost=90.0, unit="req")])
        d["scenarios"] = {k: S.SCENARIOS[k] for k in CELLS}
        d["proxies"] = {k: S.PROXIES[k] for k in ("3proxy", "squid")}
        d["settings"]["tls_key"] = "p256"
        text = report.render_tables(d)
        self.assertIn("TLS: ECDSA P-256 keys for the origin's certificate and both CAs", text)
        self.assertIn("3proxy 800; squid 1500.", text)
        ka = text.split("### https-mitm-ka-1k")[1].split("### ")[0]
        self.assertIn("both CAs", ka)
        self.assertNotIn("per handshake", ka)
        rows = {r["scenario"]: r for r in report.how_we_compare(d)}
        self.assertEqual(rows["https-mitm-close-1k"]["best"], "squid")
        self.assertAlmostEqual(rows["https-mitm-close-1k"]["ratio"], 800 / 1500)


class Fetcher(unittest.TestCase):
    def test_a_client_older_than_its_source_is_stale(self):
        saved = sys.path[0]
        try:
            from bench import bench
        finally:
            sys.path[0] = saved
        with tempfile.TemporaryDirectory() as d:
            src, exe = os.path.join(d, "loadgen.rs"), os.path.join(d, "loadgen")
            for p in (src, exe):
                open(p, "w").close()
            os.utime(src, (1000, 1000))
            os.utime(exe, (2000, 2000))
            self.assertFalse(bench.fetcher_stale(exe, src))
            os.utime(src, (3000, 3000))
            self.assertTrue(bench.fetcher_stale(exe, src))
            self.assertFalse(bench.fetcher_stale(os.path.join(d, "none"), src))


if __name__ == "__main__":
    unittest.main()
