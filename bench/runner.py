"""Runs the cells: one (scenario, proxy, run) measurement each.

A cell starts the proxy pinned alone to the proxy CPU, warms up, then
measures one client run between two snapshots of /proc/stat and of every
process's CPU time, sampling the proxy's memory meanwhile.
"""

import os
import resource
import subprocess
import threading
import time

from . import configs as C
from . import netns, parse, procs, stats
from . import scenarios as S

HZ = os.sysconf("SC_CLK_TCK")
DISTURBED = 0.05        # other processes using > 5% of a CPU disturb a run
QUIET_WAIT = 20.0       # seconds to wait for quiet before each attempt


class Cpu:
    """Snapshot of /proc/stat, every process's CPU time, softnet and the clock."""

    def __init__(self):
        self.t = time.monotonic()
        with open("/proc/stat") as f:
            self.stat = parse.parse_proc_stat(f.read())
        with open("/proc/net/softnet_stat") as f:
            self.softnet = parse.parse_softnet(f.read())
        self.procs = procs.all_stats()


def measure(before, after, proxy_cpu, other_cpu):
    wall = after.t - before.t
    p = stats.cpu_busy(before.stat[proxy_cpu], after.stat[proxy_cpu], wall, HZ)
    o = stats.cpu_busy(before.stat[other_cpu], after.stat[other_cpu], wall, HZ)
    other, top = procs.foreign_cpu(before.procs, after.procs, before.stat["all"],
                                   after.stat["all"], os.getpid(), HZ)
    rps = [a["received_rps"] - b["received_rps"]
           for a, b in zip(after.softnet, before.softnet)]
    return {
        "wall_s": wall,
        "proxy_cpu_s": p["wall"], "proxy_cpu_ticks_s": p["ticks"], "proxy_util": p["util"],
        "other_side_cpu_s": o["wall"], "other_side_util": o["util"],
        "pace": stats.pace_setter(p["util"], o["util"]),
        "foreign_cpu_s": other,
        "foreign_frac": other / wall if wall > 0 else 0.0,
        "foreign_top": top,
        "rps_ipis": rps,
    }


class MemSampler(threading.Thread):
    """Samples the summed RSS of PIDS every INTERVAL seconds."""

    def __init__(self, pids, interval=0.25):
        super().__init__(daemon=True)
        self.pids, self.interval = pids, interval
        self.peak_kb = 0
        self._halt = threading.Event()

    def run(self):
        while not self._halt.is_set():
            rss, _ = procs.rss_kb(self.pids)
            self.peak_kb = max(self.peak_kb, rss)
            self._halt.wait(self.interval)

    def finish(self):
        self._halt.set()
        self.join()
        rss, hwm = procs.rss_kb(self.pids)
        self.peak_kb = max(self.peak_kb, rss)
        return self.peak_kb, hwm


class NotApplicable(Exception):
    pass


class StartTimeout(Exception):
    pass


class Session:
    def __init__(self, repo, workdir, binary, proxy_cpu=1, other_cpu=0,
                 seconds=8, warmup=1, retries=2, quiet_wait=QUIET_WAIT, log=print,
                 tls_key=None):
        self.repo, self.workdir, self.binary = repo, workdir, binary
        self.proxy_cpu, self.other_cpu = proxy_cpu, other_cpu
        self.seconds, self.warmup, self.retries = seconds, warmup, retries
        self.quiet_wait = quiet_wait
        self.log = log
        self.www = os.path.join(workdir, "www")
        self.loadgen = os.path.join(repo, "bench", "loadgen.py")
        self.fetcher = None          # compiled client of the fetch cells
        self.fetcher_error = None    # why there is none
        self.origin = None
        self.ours_error = None       # why our binary cannot run at all
        self.configs = {}            # "proxy/service" -> config text, for the JSON
        self.tls_key = tls_key or C.TLS_KEY
        self.tls = C.tls_files(os.path.join(workdir, "tls"))
        self.mitm = C.mitm_files(os.path.join(workdir, "mitm"))

    # --- the fixed parts --------------------------------------------------

    def start(self):
        os.makedirs(self.www, exist_ok=True)
        for name, size in C.FILES.items():
            path = os.path.join(self.www, name)
            if not os.path.exists(path) or os.path.getsize(path) != size:
                with open(path, "wb") as f:
                    f.write(os.urandom(size))
        self.make_tls()
        self.make_mitm()
        self.rps = netns.setup(self.proxy_cpu, self.other_cpu)
        self.start_origin()

    def make_tls(self):
        """The https service's certificate and key, new for each run, the
        same files for every peer; readable by peers that drop root."""
        os.makedirs(self.tls["dir"], exist_ok=True)
        r = subprocess.run(C.tls_gen_argv(self.tls, self.tls_key), stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
        if r.returncode != 0:
            raise RuntimeError("openssl req failed: %s" % r.stdout[-300:])
        with open(self.tls["pem"], "w") as f:
            f.write(open(self.tls["cert"]).read() + open(self.tls["key"]).read())
        for n in ("cert", "key", "pem"):
            os.chmod(self.tls[n], 0o644)

    def make_mitm(self):
        """The mitm cells' CAs and the origin's certificate (configs.mitm_gen_argvs),
        new for each run, of the same key type as the https cells'; readable by
        squid, which drops root."""
        os.makedirs(self.mitm["dir"], exist_ok=True)
        for argv in C.mitm_gen_argvs(self.mitm, self.tls_key):
            r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                raise RuntimeError("%s failed: %s" % (" ".join(argv[:3]), r.stdout[-300:]))
        for n, path in self.mitm.items():
            if n != "dir":
                os.chmod(path, 0o644)

    def start_origin(self):
        d = os.path.join(self.workdir, "origin")
        os.makedirs(os.path.join(d, "tmp"), exist_ok=True)
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(C.render_nginx_origin(d, self.www, mitm=self.mitm))
        self.origin = procs.spawn(netns.NS_ORG, self.other_cpu,
                                  ["nginx", "-e", d + "/origin.err", "-p", d, "-c", conf],
                                  log_path=os.path.join(d, "origin.log"))
        if not procs.wait_listening(self.origin, C.HTTP_PORT):
            raise RuntimeError("origin nginx did not start; see %s" % d)

    def ensure_radiusd(self):
        """FreeRADIUS for 3proxy-radius, in the origin namespace on the other
        CPU (as the origin), started at the first such cell and kept: it
        answers every Accounting-Request and records none."""
        if getattr(self, "radiusd", None) is not None and self.radiusd.poll() is None:
            return
        from .callgrind import raddb_conf
        d = os.path.join(self.workdir, "radiusd")
        for sub in ("log", "run"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        with open(os.path.join(d, "dictionary"), "w") as f:
            f.write("$INCLUDE /usr/share/freeradius/dictionary\n")
        with open(os.path.join(d, "radiusd.conf"), "w") as f:
            f.write(raddb_conf(d, C.RADIUS_PORT + 1, listen=C.ORIGIN_IP, clients="10.0.0.0/8",
                               detail=False))
        log = os.path.join(d, "radiusd.log")
        self.radiusd = procs.spawn(netns.NS_ORG, self.other_cpu,
                                   ["freeradius", "-f", "-l", "stdout", "-d", d], log_path=log)
        deadline = time.monotonic() + 30
        while "Ready to process requests" not in (_tail(log) or ""):
            if self.radiusd.poll() is not None or time.monotonic() > deadline:
                raise NotApplicable("freeradius did not start: %s" % (_tail(log) or "no output"))
            time.sleep(0.2)

    def ensure_origin(self):
        if self.origin is None or self.origin.poll() is not None:
            self.log("origin nginx was gone; restarting it")
            if self.origin is not None:
                procs.stop(self.origin)
            self.start_origin()

    def close(self):
        procs.cleanup()
        netns.teardown(log=self.log)

    def check_rps(self):
        """A short run through the kernel router; RPS took effect if both
        CPUs received RPS IPIs (the other CPU's packets were steered to them)."""
        self.ensure_origin()
        srv = procs.spawn(netns.NS_ORG, self.other_cpu, S.iperf_server_argv())
        procs.wait_listening(srv, C.IPERF_PORT)
        b = Cpu()
        procs.run(netns.NS_CLI, self.other_cpu,
                  ["iperf3", "-c", C.ORIGIN_IP, "-t", "1", "-J"], timeout=20)
        a = Cpu()
        procs.stop(srv, grace=2)
        ipis = [x["received_rps"] - y["received_rps"] for x, y in zip(a.softnet, b.softnet)]
        ok = all(r["ok"] for r in self.rps.values()) and \
            ipis[self.proxy_cpu] > 0 and ipis[self.other_cpu] > 0
        return {"devices": self.rps, "rps_ipis_1s": ipis, "ok": ok}

    def wait_quiet(self, max_wait=None):
        """Wait (up to MAX_WAIT s) for half a second in which other processes
        use no more than DISTURBED of a CPU; returns the seconds waited."""
        if max_wait is None:
            max_wait = self.quiet_wait
        t0 = time.monotonic()
        while time.monotonic() - t0 < max_wait:
            frac, _ = self.quiet_check(0.5)
            if frac <= DISTURBED:
                break
        return time.monotonic() - t0

    def quiet_check(self, seconds=1.0):
        b = Cpu()
        time.sleep(seconds)
        a = Cpu()
        sec, top = procs.foreign_cpu(b.procs, a.procs, b.stat["all"], a.stat["all"],
                                     os.getpid(), HZ)
        return sec / (a.t - b.t), top

    # --- proxies ----------------------------------------------------------

    def start_proxy(self, proxy, service, celldir):
        """Start PROXY for SERVICE; returns its Popen, or raises NotApplicable."""
        fam = S.PROXIES[proxy]["family"]
        if fam == "ours" and self.ours_error:
            raise NotApplicable(self.ours_error)
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        cfg = S.proxy_config(proxy, service, celldir, nofile, tls=self.tls, mitm=self.mitm)
        os.makedirs(os.path.join(celldir, "tmp"), exist_ok=True)
        # squid, tinyproxy, dante and ATS drop root and write their files here.
        os.chmod(celldir, 0o777)
        if service == "mitm":
            self.prepare_mitm(fam, celldir)
        cfg_path = os.path.join(celldir, cfg[0])
        if fam == "trafficserver":
            cfg_path = _ats_runroot(celldir)
        with open(cfg_path, "w") as f:
            f.write(cfg[1])
        self.configs["%s/%s" % (proxy, service)] = cfg[1]
        if S.PROXIES[proxy].get("radius"):
            self.ensure_radiusd()
        log = os.path.join(celldir, "proxy.log")
        p = procs.spawn(netns.NS_PRX, self.proxy_cpu,
                        S.proxy_argv(proxy, cfg_path, celldir, self.binary), log_path=log)
        timeout = S.START_TIMEOUT.get(fam, 5)
        if procs.wait_listening(p, C.listen_port(service), timeout=timeout):
            time.sleep(0.2)
            if p.poll() is None:
                return p
        still_running = p.poll() is None
        rc = procs.stop(p, grace=1)
        if still_running:
            # Slow, not unable (a machine loaded by others): this cell is an
            # error, and the proxy's later cells of SERVICE are still tried.
            raise StartTimeout("%s did not listen within %d s (still running; stopped): %s"
                               % (proxy, timeout, _tail(log) or "no output"))
        tail = _tail(log) or _tail(os.path.join(celldir, "proxy.err"))
        tail = tail.replace(celldir + "/", "")
        raise NotApplicable("%s did not serve %s (exit %s): %s"
                            % (proxy, service, rc, tail or "no output"))

    def prepare_mitm(self, fam, celldir):
        """What an intercepting proxy needs before it starts: ours and 3proxy
        an empty certificate cache, squid its helper's new database (owned by
        the user squid runs as, which writes to it)."""
        if fam == "ours":
            os.makedirs(S.certcache_dir(celldir), exist_ok=True)
        elif fam == "squid":
            r = subprocess.run(C.squid_ssl_db_argv(celldir), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                raise NotApplicable("squid's %s -c failed (squid-openssl installed?): %s"
                                    % (C.SQUID_CERTGEN, r.stdout[-200:].strip()))
            for top, dirs, files in os.walk(C.squid_ssl_db(celldir)):
                for n in dirs + files:
                    os.chmod(os.path.join(top, n), 0o777)
            os.chmod(C.squid_ssl_db(celldir), 0o777)

    # --- cells ------------------------------------------------------------

    def run_cell(self, scenario, proxy, run):
        """Measure one cell, repeating it while other processes disturb it."""
        cell = {"scenario": scenario, "proxy": proxy, "run": run}
        reason = S.applicable(scenario, proxy)
        if reason:
            return dict(cell, status="n/a", reason=reason)
        attempts = []
        waited = 0.0
        best = None
        for attempt in range(self.retries + 1):
            waited += self.wait_quiet()
            res = self._attempt(scenario, proxy, run, attempt)
            res["attempt"] = attempt
            attempts.append(res.get("foreign_frac"))
            if res["status"] != "ok":
                best = best or res
                break
            frac = res.get("foreign_frac", 0.0)     # memory cells do not measure it
            if best is None or best["status"] != "ok" or \
                    frac < best.get("foreign_frac", 0.0):
                best = res
            if frac <= DISTURBED:
                break
            if attempt < self.retries:
                self.log("  disturbed: other processes used %.0f%% of a CPU (%s); again"
                         % (100 * res["foreign_frac"],
                            ", ".join("%s %.1fs" % t for t in res.get("foreign_top", []))))
                time.sleep(1)
        res = best
        res.update(cell)
        res["attempts"] = len(attempts)
        res["waited_for_quiet_s"] = round(waited, 1)
        res["attempt_foreign_frac"] = attempts
        res["disturbed"] = res.get("foreign_frac", 0) > DISTURBED
        return res

    def _attempt(self, scenario, proxy, run, attempt):
        s = S.SCENARIOS[scenario]
        celldir = os.path.join(self.workdir, "cells", "%s.%s.%d.%d" % (scenario, proxy, run, attempt))
        os.makedirs(celldir, exist_ok=True)
        self.ensure_origin()
        p = res = None
        try:
            if S.PROXIES[proxy]["family"] != "none":
                p = self.start_proxy(proxy, s["service"], celldir)
            if s["kind"] == "mem":
                res = self._mem(scenario, proxy, p)
            else:
                res = getattr(self, "_" + s["kind"])(scenario, proxy, p, celldir)
        except NotApplicable as e:
            res = {"status": "n/a", "reason": str(e)}
        except StartTimeout as e:
            res = {"status": "error", "reason": str(e)}
        finally:
            if p is not None:
                rc = procs.stop(p)
                if res is not None and res["status"] != "n/a":
                    res["proxy_exit"] = rc
                    if rc != 0 and S.PROXIES[proxy]["family"] == "ours":
                        res["note"] = "exit status %s on SIGTERM" % rc
        return res

    def _measured(self, p, fn):
        """Run FN between two CPU snapshots while sampling P's memory."""
        sampler = None
        if p is not None:
            pids = procs.descendants(p.pid, procs.all_stats())
            sampler = MemSampler(pids)
            sampler.start()
        b = Cpu()
        out = fn()
        a = Cpu()
        m = measure(b, a, self.proxy_cpu, self.other_cpu)
        if p is not None:
            # The proxy's own user+system time (tick-sampled, so only good
            # when it is busy): unlike the CPU's busy time it leaves out
            # other processes on its CPU and the softirq work of its veths;
            # for A/B runs of two builds on a shared machine.
            m["proxy_proc_cpu_s"] = procs.proc_cpu(b.procs, a.procs, pids) / HZ
        if sampler:
            peak, hwm = sampler.finish()
            m["peak_rss_kb"], m["hwm_kb"] = peak, hwm
        if p is not None and p.poll() is not None:
            m["proxy_died"] = p.returncode
        return out, m

    def _iperf(self, scenario, proxy, p, celldir):
        srv = procs.spawn(netns.NS_ORG, self.other_cpu, S.iperf_server_argv(),
                          log_path=os.path.join(celldir, "iperf3-server.log"))
        try:
            if not procs.wait_listening(srv, C.IPERF_PORT):
                return {"status": "error", "reason": "iperf3 -s did not start"}
            argv = S.iperf_client_argv(scenario, proxy, self.seconds)
            (rc, out, err), m = self._measured(p, lambda: procs.run(
                netns.NS_CLI, self.other_cpu, argv, timeout=self.seconds + 30))
        finally:
            procs.stop(srv, grace=2)
        try:
            r = parse.parse_iperf3(out)
        except parse.ParseError as e:
            return dict(m, status="error", reason=str(e)[:300])
        return _finish(dict(m, **r), S.SCENARIOS[scenario]["unit"])

    def _wrk(self, scenario, proxy, p, celldir):
        s = S.SCENARIOS[scenario]
        url, lua = S.wrk_target(scenario, proxy)
        lua_path = os.path.join(celldir, "wrk.lua")
        with open(lua_path, "w") as f:
            f.write(C.render_wrk_lua(**lua))
        if self.warmup:
            procs.run(netns.NS_CLI, self.other_cpu,
                      S.wrk_argv(url, lua_path, s["conns"], self.warmup), timeout=60)
        argv = S.wrk_argv(url, lua_path, s["conns"], self.seconds)
        (rc, out, err), m = self._measured(p, lambda: procs.run(
            netns.NS_CLI, self.other_cpu, argv, timeout=self.seconds + 60))
        try:
            r = parse.parse_wrk(out)
        except parse.ParseError as e:
            return dict(m, status="error", reason=(str(e) + " " + err)[:300])
        res = _finish(dict(m, **r), s["unit"])
        if s["service"] == "https":
            res["tls"] = self.tls_probe(scenario, proxy)
        wrk_errors_ok(res, scenario, proxy)
        if r["requests"] == 0 or res["errors"] > 0.01 * max(r["requests"], 1):
            res["status"] = "error"
            res["reason"] = "%d requests, errors %s" % (r["requests"], r["error_kinds"])
        return res

    def tls_probe(self, scenario, proxy):
        """What one openssl s_client handshake with the proxy negotiated,
        and whether the proxy resumes a session offered again, as wrk offers
        it on each reconnection (after the measured run: three handshakes)."""
        rc, out, err = procs.run(netns.NS_CLI, self.other_cpu,
                                 S.tls_probe_argv(S.SCENARIOS[scenario]["service"]), timeout=20)
        try:
            res = parse.parse_tls_probe(out + "\n" + err)
        except parse.ParseError as e:
            return {"error": str(e)[:200]}
        rc, out, err = procs.run(netns.NS_CLI, self.other_cpu,
                                 S.tls_resume_argv(self.loadgen, scenario, proxy), timeout=30)
        try:
            res["resumed"] = parse.parse_tls_resume(out)["resumed"]
        except (parse.ParseError, KeyError) as e:
            res["resume_error"] = (str(e) + " " + err)[:200]
        return res

    def _fetch(self, scenario, proxy, p, celldir):
        s = S.SCENARIOS[scenario]
        if not self.fetcher:
            return {"status": "error", "reason": "no load client: %s" % self.fetcher_error}
        argv = S.fetch_argv(self.fetcher, scenario, proxy, self.seconds)
        (rc, out, err), m = self._measured(p, lambda: procs.run(
            netns.NS_CLI, self.other_cpu, argv, timeout=self.seconds + 60))
        try:
            r = parse.parse_loadgen(out)
        except parse.ParseError as e:
            return dict(m, status="error", reason=(str(e) + " " + err)[:300])
        res = _finish(dict(m, **r), s["unit"])
        if r["requests"] == 0 or r["errors"] > 0.01 * max(r["requests"], 1):
            res["status"] = "error"
            res["reason"] = "%d requests, %d errors, first: %s" % (
                r["requests"], r["errors"], r.get("first_error"))
        return res

    def _rate(self, scenario, proxy, p, celldir):
        """The open-loop cells: loadgen rate, latency from the schedule."""
        if not self.fetcher:
            return {"status": "error", "reason": "no load client: %s" % self.fetcher_error}
        argv = S.rate_argv(self.fetcher, scenario, proxy, self.seconds)
        if S.SCENARIOS[scenario].get("keepalive"):
            (rc, out, err), m = self._rate_kept(
                p, argv, S.cell_seconds(scenario, self.seconds))
            if m is None:
                return {"status": "error",
                        "reason": ("the load client ended before its warm-up was over: "
                                   + out + " " + err)[:300]}
        else:
            (rc, out, err), m = self._measured(p, lambda: procs.run(
                netns.NS_CLI, self.other_cpu, argv, timeout=self.seconds + 60))
        try:
            r = parse.parse_loadgen(out)
        except parse.ParseError as e:
            return dict(m, status="error", reason=(str(e) + " " + err)[:300])
        res = _finish(dict(m, **r), "req")
        if r["requests"] == 0 or r["errors"] > 0.01 * max(r["requests"], 1):
            res["status"] = "error"
            res["reason"] = "%d requests, %d errors, first: %s" % (
                r["requests"], r["errors"], r.get("first_error"))
        return res

    def _rate_kept(self, p, argv, seconds):
        """The kept-alive open loop: its pool connects and makes one
        request each before it prints WARM; only what follows is measured
        (the warm-up's 2,000 connections and requests are not the cell's)."""
        kid = procs.spawn(netns.NS_CLI, self.other_cpu, argv,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = kid.stdout.readline().decode(errors="replace")
        if not first.startswith("WARM"):
            # Not warmed up: the loadgen ended; its LOADGEN line (or
            # nothing) follows.
            rc, out, err = procs.finish(kid, 60)
            return (rc, first + out, err), None
        (rc, out, err), m = self._measured(p, lambda: procs.finish(kid, seconds + 60))
        # The WARM line too, for what it says (the mitm cells' count).
        return (rc, first + out, err), m

    def _mitm(self, scenario, proxy, p, celldir):
        """The https-mitm cells: loadgen fetch --tls through the proxy's
        CONNECT (scenarios.mitm_argv); its warm-up (a request on each
        connection, which also has each proxy make its certificate for the
        origin) is not measured."""
        s = S.SCENARIOS[scenario]
        if not self.fetcher:
            return {"status": "error", "reason": "no load client: %s" % self.fetcher_error}
        argv = S.mitm_argv(self.fetcher, scenario, proxy, self.seconds, self.mitm)
        (rc, out, err), m = self._rate_kept(p, argv, self.seconds)
        if m is None:
            return {"status": "error",
                    "reason": ("the load client ended before its warm-up was over: "
                               + out + " " + err)[:300]}
        try:
            r = parse.parse_loadgen(out)
        except parse.ParseError as e:
            return dict(m, status="error", reason=(str(e) + " " + err)[:300])
        res = _finish(dict(m, **r), s["unit"])
        return mitm_verdict(res, s["conns"], out.split("\n", 1)[0])

    def _h2load(self, scenario, proxy, p, celldir):
        argv = S.h2load_argv(scenario, proxy, self.seconds)
        if self.warmup:
            procs.run(netns.NS_CLI, self.other_cpu,
                      S.h2load_argv(scenario, proxy, self.warmup), timeout=60)
        (rc, out, err), m = self._measured(p, lambda: procs.run(
            netns.NS_CLI, self.other_cpu, argv, timeout=self.seconds + 60))
        try:
            r = parse.parse_h2load(out)
        except parse.ParseError as e:
            return dict(m, status="error", reason=(str(e) + " " + err)[:300])
        res = _finish(dict(m, **r), "req")
        res["h2load_mode"] = S.h2load_mode(proxy)
        if r["requests"] == 0 or r["errors"] > 0.01 * max(r["requests"], 1):
            res["status"] = "error"
            res["reason"] = "%d requests, %d failed (%s)" % (
                r["requests"], r["errors"], r["status_codes"])
        return res

    def _stime(self, scenario, proxy, p, celldir):
        """https-new-1k: CONNS openssl s_time -new clients at once."""
        s = S.SCENARIOS[scenario]
        argv = S.stime_argv(scenario, proxy, self.seconds)

        def run_all():
            kids = [procs.spawn(netns.NS_CLI, self.other_cpu, argv,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                    for _ in range(s["conns"])]
            outs = []
            for k in kids:
                try:
                    outs.append(k.communicate(timeout=self.seconds + 60)[0].decode(errors="replace"))
                except subprocess.TimeoutExpired:
                    procs.stop(k, grace=1)
                    outs.append("timed out")
                if k in procs._live:
                    procs._live.remove(k)
            return outs
        outs, m = self._measured(p, run_all)
        r = {"requests": 0, "bytes": 0}
        for out in outs:
            try:
                one = parse.parse_stime(out)
            except parse.ParseError as e:
                return dict(m, status="error", reason=str(e)[:300])
            r["requests"] += one["requests"]
            r["bytes"] += one["bytes"]
        r["seconds"] = m["wall_s"]
        r["rps"] = r["requests"] / r["seconds"]
        r["bytes_per_s"] = r["bytes"] / r["seconds"]
        res = _finish(dict(m, **r), s["unit"])
        res["tls"] = self.tls_probe(scenario, proxy)
        # s_time reads to the close and checks no status: a short answer
        # (an error page) shows as fewer bytes than the file per connection.
        if r["requests"] == 0 or r["bytes"] < r["requests"] * C.FILES[s["file"]]:
            res["status"] = "error"
            res["reason"] = "%d connections, %d bytes read: less than the file each" % (
                r["requests"], r["bytes"])
        return res

    def _siege(self, scenario, proxy, p, celldir):
        s = S.SCENARIOS[scenario]
        rc_path = os.path.join(celldir, "siegerc")
        with open(rc_path, "w") as f:
            f.write(C.render_siegerc(S.siege_proxy(proxy)))
        argv = S.siege_argv(scenario, proxy, self.seconds, rc_path)
        (rc, out, err), m = self._measured(p, lambda: procs.run(
            netns.NS_CLI, self.other_cpu, argv, timeout=self.seconds + 90))
        try:
            r = parse.parse_siege(out + "\n" + err)   # siege -j writes to stderr
        except parse.ParseError as e:
            return dict(m, status="error", reason=(str(e) + " " + err[-200:])[:300])
        res = _finish(dict(m, **r), s["unit"])
        if r["requests"] == 0 or r["errors"] > 0.01 * max(r["requests"], 1):
            res["status"] = "error"
            res["reason"] = "%d transactions, %d failed" % (r["requests"], r["errors"])
        return res

    def _mem(self, scenario, proxy, p):
        s = S.SCENARIOS[scenario]
        time.sleep(1.0)
        pids = procs.descendants(p.pid, procs.all_stats())
        rest_kb, _ = procs.rss_kb(pids)
        rest_threads = sum(_threads(pid) for pid in pids)
        argv = S.idle_argv(self.loadgen, scenario, proxy, s["conns"])
        cli = procs.spawn(netns.NS_CLI, self.other_cpu, argv,
                          stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            ready = _readline(cli.stdout, timeout=120)
            if not ready.startswith("READY"):
                return {"status": "error", "reason": "idle clients: %r" % ready}
            n_open = int(ready.split()[1])
            time.sleep(1.0)
            pids = procs.descendants(p.pid, procs.all_stats())
            loaded_kb, hwm_kb = procs.rss_kb(pids)
            threads = sum(_threads(pid) for pid in pids)
            # Again once the proxy has settled: threads that served the
            # clients' requests idle or gone, pools trimmed.
            time.sleep(MEM_SETTLE - 1.0)
            pids = procs.descendants(p.pid, procs.all_stats())
            settled_kb, _ = procs.rss_kb(pids)
            settled_threads = sum(_threads(pid) for pid in pids)
            cli.stdin.close()
            rest = _readline(cli.stdout, timeout=30)
            r = parse.parse_loadgen(rest) if rest.startswith("LOADGEN") else {}
        finally:
            procs.stop(cli, grace=2)
        res = {"status": "ok", "rest_kb": rest_kb, "loaded_kb": loaded_kb, "hwm_kb": hwm_kb,
               "peak_rss_kb": max(loaded_kb, hwm_kb if len(pids) == 1 else 0),
               "open": n_open, "threads": threads, "rest_threads": rest_threads,
               "kb_per_conn": (loaded_kb - rest_kb) / n_open if n_open else None,
               "settled_kb": settled_kb, "settled_threads": settled_threads,
               "settled_kb_per_conn": (settled_kb - rest_kb) / n_open if n_open else None,
               "dropped_while_idle": r.get("dropped_while_idle"),
               "idle_errors": r.get("errors"), "first_error": r.get("first_error")}
        return mem_verdict(res, s["conns"], r.get("first_error"))


# Seconds after the idle clients are ready for the memory cells' second
# reading (the first is at 1 s): long enough for a proxy's after-burst
# housekeeping (ours: idle client threads give back their stack pages
# after 0.25 s, the buffer pool is freed after a second unused, and a
# thread idle for 15 s exits, which this does not wait for).
MEM_SETTLE = 4.0


def wrk_errors_ok(res, scenario, proxy):
    """Take out of RES's errors the read errors that are PROXY's unannounced
    closes after complete responses (scenarios.unannounced_closes_ok): at
    most one per completed request; they are kept as unannounced_closes."""
    if not S.unannounced_closes_ok(scenario, proxy):
        return res
    n = min(res["error_kinds"].get("read", 0), res["requests"])
    res["unannounced_closes"] = n
    res["errors"] -= n
    res["note"] = "%d unannounced closes after a complete response (wrk read errors)" % n
    return res


def mitm_verdict(res, conns, warm_line):
    """An https-mitm cell: CPU per TLS handshake with the client where
    there were any (the -close cell: one per request), and an error when
    no request was made, more than 1% failed, or fewer than all CONNS
    connections got through their warm-up (WARM_LINE, `WARM n`: a proxy
    that refuses some would be measured on fewer clients)."""
    if res.get("handshakes"):
        res["cpu_us_per_handshake"] = res["proxy_cpu_s"] * 1e6 / res["handshakes"]
    try:
        warm = int(warm_line.split()[1])
    except (IndexError, ValueError):
        warm = 0
    res["warm_conns"] = warm
    if res["status"] != "ok":
        return res
    if warm < conns:
        res["status"] = "error"
        res["reason"] = "%d of %d connections through the warm-up, first error: %s" % (
            warm, conns, res.get("warm_error"))
    elif res["requests"] == 0 or res["errors"] > 0.01 * max(res["requests"], 1):
        res["status"] = "error"
        res["reason"] = "%d requests, %d errors, first: %s" % (
            res["requests"], res["errors"], res.get("first_error"))
    return res


def mem_verdict(res, conns, first_error=None):
    """A memory cell is an error when no client connected, or when the
    proxy closed more than 1% of them while they were idle (then their
    memory was never held: tinyproxy closed all 9950 after their one
    request in the first smoke run). Fewer than 99% of CONNS is a note:
    the figures stand for the clients the proxy held."""
    n_open = res["open"]
    if n_open == 0:
        res["status"] = "error"
        res["reason"] = "no client connected (%s)" % first_error
    elif n_open < conns * 0.99:
        # Where the peer stops is a figure, not an error: its KB per
        # client is over the clients it held, and the note says why.
        res["note"] = "held only %d of %d clients (%s)" % (n_open, conns, first_error)
    elif (res.get("dropped_while_idle") or 0) > 0.01 * n_open:
        res["status"] = "error"
        res["reason"] = "the proxy closed %d of %d idle clients (no keep-alive)" % (
            res["dropped_while_idle"], n_open)
    return res


def _ats_runroot(celldir):
    """A runroot for traffic_server in CELLDIR: the packaged config files
    with our records.config; returns where records.config goes."""
    import shutil
    root = os.path.join(celldir, "ats")
    etc = os.path.join(root, "etc")
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree("/etc/trafficserver", etc)
    dirs = {}
    for d in ("var", "run", "log", "cache"):
        dirs[d] = os.path.join(root, d)
        os.makedirs(dirs[d], exist_ok=True)
    with open(os.path.join(root, "runroot.yaml"), "w") as f:
        f.write(C.render_ats_runroot(etc, dirs["var"], dirs["run"], dirs["log"], dirs["cache"]))
    for top, subdirs, files in os.walk(root):
        for n in subdirs + files:
            os.chmod(os.path.join(top, n), 0o777)
    os.chmod(root, 0o777)
    return os.path.join(etc, "records.config")


def _finish(res, unit):
    """Add throughput and the CPU cost per unit of work."""
    res.setdefault("status", "ok")
    cpu = res["proxy_cpu_s"]
    own = res.get("proxy_proc_cpu_s")
    if res.get("bytes"):
        res["cpu_s_per_gb"] = cpu / (res["bytes"] / 1e9)
        if own is not None:
            res["proc_cpu_s_per_gb"] = own / (res["bytes"] / 1e9)
    if res.get("requests"):
        res["cpu_us_per_req"] = cpu * 1e6 / res["requests"]
        if own is not None:
            res["proc_cpu_us_per_req"] = own * 1e6 / res["requests"]
    res["unit"] = unit
    if res.get("proxy_died") is not None:
        res["status"] = "error"
        res["reason"] = "proxy exited (%s) during the run" % res["proxy_died"]
    return res


def _tail(path, n=300):
    try:
        with open(path, errors="replace") as f:
            return f.read()[-n:].strip()
    except FileNotFoundError:
        return ""


def _threads(pid):
    text = procs.read("/proc/%d/status" % pid) or ""
    for line in text.splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


def _readline(stream, timeout):
    """One line from STREAM, or '' after TIMEOUT seconds."""
    out = []
    t = threading.Thread(target=lambda: out.append(stream.readline()), daemon=True)
    t.start()
    t.join(timeout)
    return out[0].decode(errors="replace").strip() if out else ""
