import copy
import json
import unittest

from bench import report
from bench import scenarios as S


def cell(scenario, proxy, run, gbps=None, rps=None, cost=None, unit="GB", **kw):
    c = {"scenario": scenario, "proxy": proxy, "run": run, "status": "ok", "unit": unit,
         "proxy_util": 0.95, "other_side_util": 0.5, "pace": "proxy", "foreign_frac": 0.0,
         "peak_rss_kb": 10240}
    if unit == "GB":
        c["bytes_per_s"] = gbps * 1e9 / 8
        c["cpu_s_per_gb"] = cost
    else:
        c["rps"] = rps
        c["cpu_us_per_req"] = cost
    c.update(kw)
    return c


def doc(cells):
    return {
        "mode": "full", "started": "2026-11-29T22:00:00",
        "machine": {"cpu_model": "AMD EPYC", "cpus": 2, "mem_gib": 24, "os": "Debian 12",
                    "kernel": "6.1", "virt": "kvm", "irq_time_accounting": False, "hz": 100},
        "tools": {"wrk": "wrk 4.1.0", "iperf3": "iperf 3.12", "nginx": "nginx/1.22.1",
                  "haproxy": "HAProxy 2.6.12", "python": "3.11.7"},
        "settings": {"runs": 3, "seconds": 6, "warmup": 1, "proxy_cpu": 1, "other_cpu": 0,
                     "nofile": 20000, "nofile_before": 20000,
                     "cpu_busy": "wall time minus idle"},
        "rps": {"ok": True},
        "scenarios": {k: S.SCENARIOS[k] for k in ("stream1", "http-ka-1k", "socks-1m",
                                                  "mem-idle-2000")},
        "proxies": {k: S.PROXIES[k] for k in ("noproxy", "3proxy", "nginx")},
        "cells": cells,
    }


CELLS = [
    cell("stream1", "noproxy", 0, gbps=10, cost=0.2),
    cell("stream1", "3proxy", 0, gbps=6, cost=1.0),
    cell("stream1", "3proxy", 1, gbps=7, cost=0.9),
    cell("stream1", "3proxy", 2, gbps=8, cost=1.1, disturbed=True),
    cell("stream1", "nginx", 0, gbps=5, cost=1.2),
    cell("http-ka-1k", "nginx", 0, rps=20000, cost=40.0, unit="req"),
    {"scenario": "http-ka-1k", "proxy": "3proxy", "run": 0, "status": "n/a",
     "reason": "3proxy did not serve http: not supported yet"},
    {"scenario": "socks-1m", "proxy": "nginx", "run": 0, "status": "n/a",
     "reason": "nginx has no SOCKS server"},
    {"scenario": "mem-idle-2000", "proxy": "nginx", "run": 0, "status": "ok",
     "rest_kb": 10240, "loaded_kb": 20480, "kb_per_conn": 5.12, "threads": 2, "open": 2000,
     "dropped_while_idle": 0},
]


class Aggregate(unittest.TestCase):
    def test_medians_and_spread(self):
        a = report.aggregate(doc(CELLS))
        s = a[("stream1", "3proxy")]
        # The disturbed third run is left out.
        self.assertEqual((s["n"], s["measured"]), (2, 3))
        self.assertAlmostEqual(s["tput"]["median"], 6.5)
        self.assertAlmostEqual(s["tput"]["spread"], 1 / 6.5)
        self.assertAlmostEqual(s["cost"]["median"], 0.95)
        self.assertEqual(s["disturbed"], 1)
        self.assertFalse(s["all_disturbed"])
        self.assertEqual(s["pace"], "proxy")
        self.assertAlmostEqual(s["peak_mb"]["median"], 10.0)

    def test_not_applicable(self):
        a = report.aggregate(doc(CELLS))
        self.assertEqual(a[("http-ka-1k", "3proxy")]["status"], "n/a")
        self.assertIn("not supported", a[("http-ka-1k", "3proxy")]["reason"])

    def test_all_disturbed_are_kept(self):
        cells = [cell("stream1", "nginx", r, gbps=5 + r, cost=1.0, disturbed=True)
                 for r in range(3)]
        a = report.aggregate(doc(cells))[("stream1", "nginx")]
        self.assertEqual((a["n"], a["disturbed"], a["all_disturbed"]), (3, 3, True))
        self.assertIn("| nginx ⚠all |", report.render_tables(doc(cells)))

    def test_errors_do_not_hide_good_runs(self):
        cells = CELLS + [{"scenario": "stream1", "proxy": "nginx", "run": 1,
                          "status": "error", "reason": "boom"}]
        a = report.aggregate(doc(cells))[("stream1", "nginx")]
        self.assertEqual(a["status"], "ok")
        self.assertEqual(a["errors"], ["boom"])


class Tables(unittest.TestCase):
    def test_best_is_bold_and_baseline_excluded(self):
        text = report.render_tables(doc(CELLS))
        row = next(l for l in text.splitlines() if l.startswith("| 3proxy"))
        self.assertIn("**6.50**", row)        # best throughput of the proxies
        self.assertIn("**0.950**", row)       # lowest CPU per GB
        self.assertIn("⚠1", row)
        base = next(l for l in text.splitlines() if l.startswith("| noproxy"))
        self.assertNotIn("**", base)          # 10 Gbit/s but not a proxy

    def test_na_and_mem(self):
        text = report.render_tables(doc(CELLS))
        self.assertIn("n/a: 3proxy did not serve http", text)
        self.assertIn("n/a: proxy: this service is not supported yet (exit 1) |",
                      report.render_tables(doc([
                          {"scenario": "stream1", "proxy": "3proxy", "run": 0, "status": "n/a",
                           "reason": "3proxy did not serve http (exit 1): 3proxy: 3proxy.cfg:4: "
                                     "proxy: this service is not supported yet"}])))
        self.assertIn("n/a: nginx has no SOCKS server", text)
        # A run from before the settled reading: its columns are "-".
        self.assertIn("| nginx | 10.0 | 20.0 | 5.12 | - | - / 2 / - | 2000 |", text)

    def test_mem_settled_reading_threads_and_note(self):
        c = {"scenario": "mem-idle-2000", "proxy": "3proxy", "run": 0, "status": "ok",
             "rest_kb": 4096, "loaded_kb": 8192, "kb_per_conn": 2.05, "threads": 300,
             "rest_threads": 4, "settled_kb": 6144, "settled_threads": 290,
             "settled_kb_per_conn": 1.02, "open": 1990, "dropped_while_idle": 0,
             "note": "held only 1990 of 2000 clients (timeout)"}
        text = report.render_tables(doc([c]))
        self.assertIn("| 3proxy | 4.00 | 8.00 | 2.05 | 1.02 | 4 / 300 / 290 | 1990 |",
                      text)
        self.assertIn("3proxy: held only 1990 of 2000 clients (timeout).", text)
        self.assertIn("settled 1.0 KB each, 290 threads (4 at rest)", report.cell_line(c))

    def test_https_names_the_key_and_what_was_negotiated(self):
        tls = {"protocol": "TLSv1.3", "cipher": "TLS_AES_256_GCM_SHA384", "kx": "X25519, 253 bits",
               "resumed": True}
        d = doc([cell("https-ka-1k", "3proxy", 0, rps=9000, cost=100.0, unit="req", tls=tls),
                 cell("https-ka-1k", "nginx", 0, rps=9000, cost=90.0, unit="req",
                      tls={"error": "no TLS handshake"}),
                 {"scenario": "https-ka-1k", "proxy": "noproxy", "run": 0, "status": "n/a",
                  "reason": "the origin speaks plain HTTP only"}])
        d["scenarios"] = {"https-ka-1k": S.SCENARIOS["https-ka-1k"]}
        d["settings"]["tls_key"] = "p256"
        text = report.render_tables(d)
        self.assertIn("TLS: one self-signed ECDSA P-256 certificate for every proxy; "
                      "negotiated with openssl s_client: 3proxy: TLSv1.3 "
                      "TLS_AES_256_GCM_SHA384 X25519, 253 bits, resumes; nginx: probe failed.", text)
        self.assertNotIn("TLS:", report.render_tables(doc(CELLS)))

    def test_cell_line(self):
        self.assertIn("7.00 Gbit/s", report.cell_line(cell("s", "p", 0, gbps=7, cost=1.0)))
        self.assertIn("n/a", report.cell_line({"status": "n/a", "reason": "x"}))

    def test_summary(self):
        text = report.render_summary(doc(CELLS))
        self.assertIn("| stream1 | s/GB | 0.200 | **0.950** | 1.20 |", text)
        self.assertIn("| http-ka-1k | µs/req |  | n/a | 40.0 |", text)

    def test_results_md(self):
        md = report.render_results_md([doc(CELLS)], ["results/x.json"])
        for part in ("# Benchmark results", "results/x.json", "## The machine",
                     "## Headline", "## How to read", "## Caveats", "AMD EPYC"):
            self.assertIn(part, md)
        self.assertNotIn("## Reproducibility", md)

    def test_machine_names_an_alt_build(self):
        d = doc(CELLS)
        self.assertNotIn("3proxy-alt", report.render_machine(d))
        d["proxies"]["3proxy-alt"] = {"family": "ours", "splice": False, "binary": "/x",
                                      "what": "3proxy 1.0.0, C (binary sha256 abcd)"}
        self.assertIn("| 3proxy-alt | 3proxy 1.0.0, C (binary sha256 abcd) |",
                      report.render_machine(d))


class Json(unittest.TestCase):
    def test_round_trip_one_cell_a_line(self):
        d = doc(CELLS)
        text = report.dump_json(d)
        self.assertEqual(json.loads(text), json.loads(json.dumps(d)))
        self.assertEqual(sum(1 for l in text.splitlines() if l.startswith('  {"scenario"')),
                         len(CELLS))


class Compare(unittest.TestCase):
    def test_agreement(self):
        a = doc(CELLS)
        b = copy.deepcopy(a)
        for c in b["cells"]:
            if c["scenario"] == "stream1" and c["proxy"] == "nginx":
                c["bytes_per_s"] *= 1.5
        rows = {(r["scenario"], r["proxy"], r["metric"]): r for r in report.compare(a, b)}
        self.assertTrue(rows[("stream1", "3proxy", "tput")]["agree"])
        bad = rows[("stream1", "nginx", "tput")]
        self.assertFalse(bad["agree"])
        self.assertAlmostEqual(bad["diff"], 0.5)
        self.assertIn(("mem-idle-2000", "nginx", "rest_mb"), rows)
        text = report.render_compare(a, b)
        self.assertIn("**no**", text)
        self.assertIn("proxy CPU per unit 4 of 4 agree; throughput 3 of 4 agree; "
                      "memory 2 of 2 agree.", text)
        md = report.render_results_md([a, b], ["results/a.json", "results/b.json"])
        self.assertIn("## Reproducibility", md)

    def test_pooled_medians_over_runs_of_one_binary(self):
        a = doc(CELLS)
        b = copy.deepcopy(a)
        for c in b["cells"]:
            if c["scenario"] == "stream1" and c["proxy"] == "3proxy":
                c["cpu_s_per_gb"] = 2.0
        # Without the threeproxy tool record there is nothing to pool.
        self.assertIsNone(report.pooled([a, b]))
        for d in (a, b):
            d["tools"]["threeproxy"] = {"sha256": "ab" * 32, "built": "x", "git_head": "y"}
        one = report.pooled([a, b])
        got = report.aggregate(one)[("stream1", "3proxy")]
        # 1.0, 0.9 and 2.0, 2.0 (the disturbed runs are left out).
        self.assertEqual(got["n"], 4)
        self.assertEqual(len(one["cells"]), 2 * len(CELLS))
        md = report.render_results_md([a, b], ["results/a.json", "results/b.json"])
        self.assertIn("## All runs pooled", md)
        b["tools"]["threeproxy"] = {"sha256": "cd" * 32, "built": "x", "git_head": "y"}
        self.assertIsNone(report.pooled([a, b]))
        self.assertNotIn("## All runs pooled",
                         report.render_results_md([a, b], ["results/a.json", "results/b.json"]))

    def test_latency_is_pooled_over_runs_and_compared(self):
        def rate(run, p99_us, buckets):
            lat = {"lat_%s_us" % k: p99_us for k in report.LATENCY_KEYS}
            return cell("tunnel-rate-low", "3proxy", run, rps=1000, cost=10.0, unit="req",
                        lat_buckets_us=buckets, **lat)
        # Run 0 had a bad moment (p99 5 ms on its own); pooled with run 1,
        # 2 slow connections of 200 are under 1%.
        cells = [rate(0, 5000, [[100, 98], [5000, 2]]), rate(1, 100, [[100, 100]])]
        a = doc(cells)
        a["scenarios"]["tunnel-rate-low"] = S.SCENARIOS["tunnel-rate-low"]
        lat = report.aggregate(a)[("tunnel-rate-low", "3proxy")]["latency_ms"]
        self.assertAlmostEqual(lat["p99"]["pooled"], 0.1)
        self.assertAlmostEqual(lat["p99"]["median"], 2.55)   # what one run each says
        self.assertAlmostEqual(lat["p99.9"]["pooled"], 5.0)
        self.assertAlmostEqual(lat["max"]["pooled"], 5.0)
        t = report.render_latency(report.aggregate(a), "tunnel-rate-low", ["3proxy"])
        self.assertIn("| 3proxy | 0.100 (", t)
        # B: the same, and once more with a slow p50.
        b = copy.deepcopy(a)
        rows = {(r["scenario"], r["metric"]): r for r in report.compare(a, b)}
        self.assertTrue(rows[("tunnel-rate-low", "p99")]["agree"])
        for c in b["cells"]:
            c["lat_buckets_us"] = [[300, 100]]
        rows = {(r["scenario"], r["metric"]): r for r in report.compare(a, b)}
        self.assertAlmostEqual(rows[("tunnel-rate-low", "p50")]["diff"], 2.0)
        self.assertIn("latency 0 of 2 agree", report.render_compare(a, b))
        # Cells from before the buckets: the median of the runs, as before.
        for c in cells:
            del c["lat_buckets_us"]
        lat = report.aggregate(doc(cells))[("tunnel-rate-low", "3proxy")]["latency_ms"]
        self.assertNotIn("pooled", lat["p99"])

    def test_spread_widens_agreement(self):
        a = doc(CELLS)
        b = copy.deepcopy(a)
        for c in b["cells"]:
            if c["scenario"] == "stream1" and c["proxy"] == "3proxy":
                c["bytes_per_s"] *= 1.14  # 14% off, but the runs spread 15%
        rows = {(r["scenario"], r["proxy"], r["metric"]): r for r in report.compare(a, b)}
        self.assertTrue(rows[("stream1", "3proxy", "tput")]["agree"])



class KeepHandPart(unittest.TestCase):
    def test_the_hand_written_part_survives_a_rewrite(self):
        old = "# old tables\n\n" + report.HAND_MARK + "\n\n## A study\n\ntext\n"
        new = report.keep_hand_part("# new tables\n", old)
        self.assertTrue(new.startswith("# new tables\n\n" + report.HAND_MARK))
        self.assertTrue(new.endswith("## A study\n\ntext\n"))
        self.assertNotIn("old tables", new)

    def test_a_file_without_the_mark_gets_one(self):
        self.assertEqual(report.keep_hand_part("# t\n", ""), "# t\n\n" + report.HAND_MARK + "\n")
        self.assertEqual(report.keep_hand_part("# t\n", "# old, no mark\n"),
                         "# t\n\n" + report.HAND_MARK + "\n")

if __name__ == "__main__":
    unittest.main()
