#!/usr/bin/env python3
"""threeproxy benchmark: our proxy, nginx, haproxy and no proxy, side by side.

Needs root (network namespaces).  See bench/README.md.  Examples:

  python3 bench/bench.py                       full run (3 runs of every cell)
  python3 bench/bench.py --quick               one short run of every cell
  python3 bench/bench.py --scenario stream1,http-ka-1k --proxy 3proxy,nginx
  python3 bench/bench.py --report bench/results/A.json [bench/results/B.json]
  python3 bench/bench.py --compare bench/results/A.json bench/results/B.json
"""

import argparse
import datetime
import fcntl
import hashlib
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path[0] = REPO          # so that `bench` is this package, not this file

from bench import netns, procs, report, runner, stats  # noqa: E402
from bench import configs as C  # noqa: E402
from bench import scenarios as S  # noqa: E402

# squid-openssl: Debian's squid built with OpenSSL, the one with ssl_bump
# (the https-mitm cells); it replaces the package squid (GnuTLS, no
# ssl_bump), and the same binary serves the plain squid cells.
APT_PACKAGES = ["wrk", "iperf3", "nginx-light", "libnginx-mod-stream", "haproxy",
                "dante-server", "microsocks", "squid-openssl", "tinyproxy", "trafficserver",
                "nghttp2-client", "siege", "openssl", "freeradius"]
TOOLS = {"openssl": "openssl", "wrk": "wrk", "iperf3": "iperf3", "nginx": "nginx-light", "haproxy": "haproxy",
         "danted": "dante-server", "microsocks": "microsocks", "squid": "squid-openssl",
         "tinyproxy": "tinyproxy", "traffic_server": "trafficserver",
         "h2load": "nghttp2-client", "siege": "siege",
         "freeradius": "freeradius"}
# The packaged services the install starts: we run our own copies in netns.
SERVICES = ("nginx", "haproxy", "danted", "squid", "tinyproxy", "trafficserver", "freeradius")
WORKDIR = "/dev/shm/threeproxy-bench"     # tmpfs: the origin's files and the cells' scratch
LOCK = "/run/threeproxy-bench.lock"
NOFILE = 65536

QUICK = {"seconds": 2, "warmup": 1, "runs": 1, "retries": 1, "quiet_wait": 5}
FULL = {"seconds": 6, "warmup": 1, "runs": 3, "retries": 1, "quiet_wait": 10}


def log(*a):
    print(time.strftime("%H:%M:%S"), *a, flush=True)


def sh(argv):
    try:
        r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, timeout=30)
        return r.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return "unavailable (%s)" % e


def ensure_tools():
    missing = [t for t in TOOLS if not shutil.which(t) and
               not os.path.exists(os.path.join("/usr/sbin", t))]
    if not os.path.exists("/usr/lib/nginx/modules/ngx_stream_module.so"):
        missing.append("ngx_stream_module")
    if not os.path.exists(C.SQUID_CERTGEN):
        # squid without OpenSSL (Debian's package squid) has no ssl_bump.
        missing.append("squid-openssl")
    if not missing:
        return
    log("installing", " ".join(APT_PACKAGES), "(missing: %s)" % ", ".join(missing))
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq"] + APT_PACKAGES, check=True, env=env)
    # Debian starts the packaged services; we run our own copies in netns.
    for svc in SERVICES:
        subprocess.run(["service", svc, "stop"], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)


def build_ours(force):
    """Path of our binary and None, or None and why it is unavailable."""
    binary = os.path.join(REPO, "target", "release", "3proxy")
    if os.path.exists(binary) and not force:
        return binary, None
    if not shutil.which("cargo"):
        return None, "no target/release/3proxy and no cargo to build it"
    log("cargo build --release")
    r = subprocess.run(["cargo", "build", "--release"], cwd=REPO)
    if r.returncode != 0 or not os.path.exists(binary):
        return None, "cargo build --release failed"
    return binary, None


def fetcher_stale(fetcher, source):
    """Whether the compiled load client is older than its source (a client
    built before bench/loadgen.rs changed lacks its newer modes)."""
    try:
        return os.path.getmtime(fetcher) < os.path.getmtime(source)
    except OSError:
        return False


def build_fetcher(force, no_build):
    """Path of the compiled load client of the fetch scenarios
    (bench/loadgen.rs) and None, or None and why it is unavailable."""
    fetcher = os.path.join(REPO, "target", "release", "examples", "loadgen")
    stale = fetcher_stale(fetcher, os.path.join(HERE, "loadgen.rs"))
    if os.path.exists(fetcher) and not force and (not stale or no_build):
        if stale:
            log("target/release/examples/loadgen is older than bench/loadgen.rs (--no-build)")
        return fetcher, None
    if no_build:
        return None, "no target/release/examples/loadgen (--no-build)"
    if not shutil.which("cargo"):
        return None, "no cargo to build bench/loadgen.rs"
    log("cargo build --release --example loadgen")
    r = subprocess.run(["cargo", "build", "--release", "--example", "loadgen"], cwd=REPO)
    if r.returncode != 0 and stale and not force:
        # The tree may not build (work in progress in src/): the client
        # built before serves the modes it has.
        log("cargo build --release --example loadgen failed: using the older client")
        return fetcher, None
    if r.returncode != 0 or not os.path.exists(fetcher):
        return None, "cargo build --release --example loadgen failed"
    return fetcher, None


def machine_info():
    cpuinfo = open("/proc/cpuinfo").read()
    model = next((l.split(":", 1)[1].strip() for l in cpuinfo.splitlines()
                  if l.startswith("model name")), platform.processor())
    mem = next(l.split()[1] for l in open("/proc/meminfo") if l.startswith("MemTotal"))
    osrel = dict(l.rstrip().split("=", 1) for l in open("/etc/os-release") if "=" in l)
    irq_cfg, irq_how = None, None
    cfgpath = "/boot/config-" + platform.release()
    if os.path.exists(cfgpath):
        irq_cfg = "CONFIG_IRQ_TIME_ACCOUNTING=y" in open(cfgpath).read()
        irq_how = cfgpath
    else:
        # With IRQ time accounting the irq column grows with every interrupt;
        # without it, hard-irq time stays 0 on an idle-ish VM.
        cpu = next(l.split() for l in open("/proc/stat") if l.startswith("cpu "))
        irq_cfg = int(cpu[6]) > 0
        irq_how = "inferred: /proc/stat irq column is %s" % cpu[6]
    return {
        "cpu_model": model,
        "cpus": os.cpu_count(),
        "mem_gib": round(int(mem) / 1024 / 1024, 1),
        "kernel": platform.release(),
        "os": osrel.get("PRETTY_NAME", "").strip('"'),
        "virt": "virtual machine" if " hypervisor" in cpuinfo else "bare metal",
        "irq_time_accounting": irq_cfg,
        "irq_time_accounting_source": irq_how,
        "hz": os.sysconf("SC_CLK_TCK"),
    }


def _dpkg_version(pkg):
    out = sh(["dpkg-query", "-W", "-f", "${Version}", pkg])
    return "%s %s" % (pkg, out) if out and "unavailable" not in out else None


def tool_versions(binary):
    v = {
        "wrk": sh(["wrk", "-v"]).splitlines()[0] if shutil.which("wrk") else None,
        "iperf3": sh(["iperf3", "--version"]).splitlines()[0] if shutil.which("iperf3") else None,
        "nginx": sh(["nginx", "-v"]),
        "haproxy": sh(["haproxy", "-v"]).splitlines()[0] if shutil.which("haproxy") else None,
        "dante": sh(["/usr/sbin/danted", "-v"]).splitlines()[0]
        if os.path.exists("/usr/sbin/danted") else None,
        "microsocks": _dpkg_version("microsocks"),
        "squid": " ".join(x for x in (
            sh(["/usr/sbin/squid", "-v"]).splitlines()[0],
            # Which build: squid-openssl has ssl_bump (and its helper).
            _dpkg_version("squid-openssl" if os.path.exists(C.SQUID_CERTGEN) else "squid"))
            if x) if os.path.exists("/usr/sbin/squid") else None,
        "tinyproxy": sh(["tinyproxy", "-v"]) if shutil.which("tinyproxy") else None,
        "trafficserver": _dpkg_version("trafficserver"),
        "h2load": _dpkg_version("nghttp2-client"),
        "siege": _dpkg_version("siege"),
        "openssl": sh(["openssl", "version"]) if shutil.which("openssl") else None,
        "python": platform.python_version(),
    }
    if binary and os.path.exists(binary):
        h = hashlib.sha256(open(binary, "rb").read()).hexdigest()[:16]
        mtime = datetime.datetime.fromtimestamp(os.path.getmtime(binary)).isoformat(timespec="seconds")
        head = sh(["git", "-C", REPO, "rev-parse", "--short", "HEAD"])
        v["threeproxy"] = {"sha256": h, "built": mtime, "git_head": head}
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(description="threeproxy benchmark (needs root)",
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--quick", action="store_true",
                   help="one short run per cell (about 5 minutes)")
    p.add_argument("--scenario", help="comma-separated scenarios: " + ", ".join(S.SCENARIOS))
    p.add_argument("--proxy", help="comma-separated proxies: " + ", ".join(S.PROXIES))
    p.add_argument("--runs", type=int, help="runs per cell (quick 1, full 3)")
    p.add_argument("--seconds", type=float, help="measured seconds per cell (quick 2, full 6)")
    p.add_argument("--retries", type=int, help="repeats of a disturbed cell (default 1)")
    p.add_argument("--out", default=os.path.join(HERE, "results"),
                   help="directory for the JSON (default bench/results)")
    p.add_argument("--build", action="store_true",
                   help="run cargo build --release even if target/release/3proxy exists")
    p.add_argument("--binary", metavar="PATH",
                   help="measure this 3proxy binary instead of target/release/3proxy")
    p.add_argument("--alt-binary", metavar="PATH",
                   help="also measure this 3proxy binary, as proxy 3proxy-alt (copy relay), "
                        "for an A/B comparison within one run")
    p.add_argument("--alt-what", metavar="TEXT",
                   help="what the --alt-binary build is, for the report (e.g. '3proxy 1.0.0, C')")
    p.add_argument("--radius", action="store_true",
                   help="also measure proxy 3proxy-radius: our binary with `log radius` to a "
                        "FreeRADIUS (Debian freeradius) in the origin namespace")
    p.add_argument("--tls-key", choices=C.TLS_KEYS, default=C.TLS_KEY,
                   help="key of the https cells' certificate, the same for every peer: "
                        "ECDSA P-256 (default) or RSA 2048")
    p.add_argument("--no-build", action="store_true",
                   help="never build: without target/release/3proxy our cells are n/a")
    p.add_argument("--results-md", choices=("auto", "yes", "no"), default="auto",
                   help="write bench/RESULTS.md (auto: only for an unfiltered run)")
    p.add_argument("--report", nargs="+", metavar="JSON",
                   help="only write bench/RESULTS.md from JSON (a second JSON is compared)")
    p.add_argument("--compare", nargs=2, metavar="JSON", help="only compare two runs")
    p.add_argument("--cleanup", action="store_true",
                   help="only remove the netns and processes of an interrupted run")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    if args.alt_binary:
        S.add_alt(os.path.abspath(args.alt_binary), args.alt_what)
    if args.radius:
        S.add_radius()
    if args.compare:
        a, b = (json.load(open(f)) for f in args.compare)
        print(report.render_compare_ratios(a, b))
        print(report.render_compare(a, b, names=args.compare))
        return 0
    if args.report:
        docs = [json.load(open(f)) for f in args.report]
        names = [os.path.relpath(f, HERE) for f in args.report]
        write_results_md(docs, names)
        return 0
    if os.geteuid() != 0:
        print("bench: needs root (network namespaces, RPS, pinning)", file=sys.stderr)
        return 2
    try:
        scen = S.select(args.scenario, S.SCENARIOS, "scenario")
        prox = S.select(args.proxy, S.PROXIES, "proxy")
    except ValueError as e:
        print("bench: %s" % e, file=sys.stderr)
        return 2
    mode = dict(QUICK if args.quick else FULL)
    for k in ("runs", "seconds", "retries"):
        if getattr(args, k) is not None:
            mode[k] = getattr(args, k)

    lockf = open(LOCK, "w")
    try:
        fcntl.flock(lockf, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print("bench: another run holds %s" % LOCK, file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(143))

    if args.cleanup:
        netns.teardown(log=log)
        return 0
    ensure_tools()

    # Descriptors: 2000 clients need 2000 in wrk and 4000+ in a proxy.
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (NOFILE, max(hard, NOFILE)))
    except (ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    maxc = max(S.SCENARIOS[s].get("conns", 0) for s in scen)
    if nofile < 2 * maxc + 100:
        log("descriptor limit %d: scenarios capped to %d clients" % (nofile, (nofile - 100) // 2))
        for s in S.SCENARIOS.values():
            if s.get("conns"):
                s["conns"] = min(s["conns"], (nofile - 100) // 2)

    binary, ours_error = None, None
    if any(S.PROXIES[p]["family"] == "ours" for p in prox):
        if args.binary:
            binary = os.path.abspath(args.binary)
            if not os.path.exists(binary):
                binary, ours_error = None, "no such binary: %s" % args.binary
        elif args.no_build:
            binary = os.path.join(REPO, "target", "release", "3proxy")
            if not os.path.exists(binary):
                binary, ours_error = None, "no target/release/3proxy (--no-build)"
        else:
            binary, ours_error = build_ours(args.build)
        if ours_error:
            log("our proxy is unavailable:", ours_error)

    if binary:
        # Measure a copy: the tree's binary may be rebuilt while we run.
        os.makedirs(WORKDIR, exist_ok=True)
        snap = os.path.join(WORKDIR, "3proxy")
        shutil.copy2(binary, snap)
        binary = snap
    alt = S.PROXIES.get("3proxy-alt")
    if alt and "3proxy-alt" in prox:
        if not os.path.exists(alt["binary"]):
            log("no such binary:", alt["binary"])
            return 2
        os.makedirs(WORKDIR, exist_ok=True)
        snap = os.path.join(WORKDIR, "3proxy-alt")
        shutil.copy2(alt["binary"], snap)
        h = hashlib.sha256(open(snap, "rb").read()).hexdigest()[:16]
        alt["what"] += " (binary sha256 %s)" % h
        alt["binary"] = snap

    proxy_cpu, other_cpu = 1, 0
    os.sched_setaffinity(0, {other_cpu})     # the harness stays off the proxy CPU
    doc = {
        "schema": 1,
        "mode": "quick" if args.quick else "full",
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv[1:],
        "machine": machine_info(),
        "tools": tool_versions(binary),
        "settings": dict(mode, proxy_cpu=proxy_cpu, other_cpu=other_cpu, nofile=nofile,
                         nofile_before=soft, disturbed_threshold=runner.DISTURBED,
                         pace_threshold=0.9, mtu=netns.MTU, tls_key=args.tls_key,
                         cpu_busy="wall time minus idle, iowait and steal (/proc/stat)"),
        "scenarios": {k: dict(v) for k, v in S.SCENARIOS.items() if k in scen},
        "proxies": {k: dict(v) for k, v in S.PROXIES.items() if k in prox},
        "cells": [],
    }
    os.makedirs(args.out, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out_path = os.path.join(args.out, "%s-%s.json" % (stamp, doc["mode"]))

    session = runner.Session(REPO, WORKDIR, binary, proxy_cpu=proxy_cpu, other_cpu=other_cpu,
                             seconds=mode["seconds"], warmup=mode["warmup"],
                             retries=mode["retries"], quiet_wait=mode["quiet_wait"], log=log,
                             tls_key=args.tls_key)
    session.ours_error = ours_error
    if any(S.SCENARIOS[s]["kind"] in ("fetch", "rate", "mitm") for s in scen):
        fetcher, session.fetcher_error = build_fetcher(args.build, args.no_build)
        if fetcher:
            # A copy, as for the proxy binary.
            os.makedirs(WORKDIR, exist_ok=True)
            session.fetcher = os.path.join(WORKDIR, "loadgen")
            shutil.copy2(fetcher, session.fetcher)
        else:
            log("the fetch scenarios' load client is unavailable:", session.fetcher_error)
    shutil.rmtree(os.path.join(WORKDIR, "cells"), ignore_errors=True)
    known_na = {}
    try:
        log("setting up namespaces")
        session.start()
        doc["rps"] = session.check_rps()
        log("RPS check:", "ok" if doc["rps"]["ok"] else "FAILED", doc["rps"]["rps_ipis_1s"])
        doc["quiet_before"], top = session.quiet_check()
        log("other processes used %.0f%% of a CPU before the start %s"
            % (100 * doc["quiet_before"], top))
        total = mode["runs"] * len(scen) * len(prox)
        n = 0
        for run in range(mode["runs"]):
            for si, sc in enumerate(scen):
                for px in stats.rotate(prox, run + si):
                    n += 1
                    key = (px, S.SCENARIOS[sc]["service"])
                    if key in known_na:
                        cell = {"scenario": sc, "proxy": px, "run": run,
                                "status": "n/a", "reason": known_na[key]}
                    else:
                        cell = session.run_cell(sc, px, run)
                        if cell["status"] == "n/a" and not S.applicable(sc, px):
                            known_na[key] = cell["reason"]
                    doc["cells"].append(cell)
                    log("[%d/%d] run %d %-17s %-15s %s" % (n, total, run, sc, px,
                                                          report.cell_line(cell)))
                    write_json(out_path, dict(doc, configs=session.configs))
    finally:
        session.close()
    doc["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    doc["configs"] = session.configs
    write_json(out_path, doc)
    log("wrote", out_path)
    print(report.render_tables(doc))
    unfiltered = not args.scenario and not args.proxy
    if args.results_md == "yes" or (args.results_md == "auto" and unfiltered):
        write_results_md([doc], [os.path.relpath(out_path, HERE)])
    return 0


def write_json(path, doc):
    with open(path, "w") as f:
        f.write(report.dump_json(doc))


def write_results_md(docs, names):
    path = os.path.join(HERE, "RESULTS.md")
    try:
        with open(path) as f:
            old = f.read()
    except FileNotFoundError:
        old = ""
    # The tables are rewritten; the hand-written part after the mark stays.
    new = report.keep_hand_part(report.render_results_md(docs, names), old)
    with open(path, "w") as f:
        f.write(new)
    log("wrote", path)


if __name__ == "__main__":
    sys.exit(main())
