"""System calls and context switches per request, ours against haproxy.

On loopback, with the bench's cfgs (callgrind.py's `proxy` cfg, configs.py's
haproxy): an nginx origin serving 1k.bin (pinned to CPU 0), the proxy pinned
to CPU 1, and wrk with 64 connections (http-ka-1k's and http-close-1k's
clients; CPU 0) for SECS seconds (default 4), after a 1 s warm-up.  While wrk
runs, `perf stat` counts the proxy's system calls (raw_syscalls:sys_enter),
context switches and migrations; with STRACE=1, `strace -c -f` counts them by
name instead (strace slows the proxy: counts only).  Each is divided by the
requests wrk made.  Also prints the voluntary and involuntary switches of the
proxy's threads (/proc/PID/task/*/status; threads that ended meanwhile are not
counted).  Counts, not timings: a loaded machine changes them little (the
involuntary switches excepted).  Needs root for perf's tracepoints.

    python3 bench/counts.py ours:ka haproxy:ka ours:close haproxy:close
    BIN=/dev/shm/other-3proxy STRACE=1 python3 bench/counts.py ours:close
    PRE="chrt -b 0" python3 bench/counts.py ours:ka     # SCHED_BATCH
"""
import sys, os, subprocess, time, signal, tempfile, re, json, shutil
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import callgrind as cg
import configs as C
OPORT = cg.free_port()
d = tempfile.mkdtemp(prefix="tp-counts-")
os.chmod(d, 0o755)  # nginx's worker reads www/ as its own user
WWW = os.path.join(d, "www")
os.makedirs(WWW)
with open(os.path.join(WWW, "1k.bin"), "wb") as f:
    f.write(b"x" * 1024)
open(d + "/nginx.conf", "w").write("""worker_processes 1; daemon off; pid %s/n.pid; error_log %s/n.err crit;
events { worker_connections 4096; }
http { access_log off; keepalive_requests 1000000; keepalive_timeout 300s;
 server { listen 127.0.0.1:%d backlog=4096; root %s; } }
""" % (d, d, OPORT, WWW))
ng = subprocess.Popen(["taskset", "-c", "0", "nginx", "-c", d + "/nginx.conf", "-p", d], stderr=subprocess.DEVNULL)
EVS = os.environ.get("EV", "raw_syscalls:sys_enter,context-switches,cpu-migrations,task-clock")

def run(kind, binary, secs, mode):
    port = cg.free_port()
    cfg = os.path.join(d, kind + ".cfg")
    if kind == "ours":
        open(cfg, "w").write(cg.proxy_cfg(port))
        argv = [binary, cfg]
        url = "http://127.0.0.1:%d/" % port
        lua = C.render_wrk_lua(absolute_url="http://127.0.0.1:%d/1k.bin" % OPORT, host="127.0.0.1", close=(mode == "close"))
    else:
        txt = C.render_haproxy("http", maxconn=2000)
        txt = re.sub(r"bind \S+", "bind 127.0.0.1:%d" % port, txt)
        txt = re.sub(r"server origin \S+", "server origin 127.0.0.1:%d" % OPORT, txt)
        open(cfg, "w").write(txt)
        argv = ["haproxy", "-f", cfg]
        url = "http://127.0.0.1:%d/1k.bin" % port
        lua = C.render_wrk_lua(close=(mode == "close"))
    open(d + "/w.lua", "w").write(lua)
    p = subprocess.Popen(["taskset", "-c", "1"] + os.environ.get("PRE","").split() + argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        cg.connect(port).close()
        w = ["taskset", "-c", "0", "wrk", "-t1", "-c64", "-d%ds" % secs, "-s", d + "/w.lua", url]
        subprocess.run(w[:5] + ["-d1s"] + w[6:], capture_output=True)
        out = d + "/perf.out"
        if mode.endswith("strace") or os.environ.get("STRACE"):
            t = subprocess.Popen(["strace", "-c", "-f", "-o", out, "-p", str(p.pid)], stderr=subprocess.DEVNULL)
        else:
            t = subprocess.Popen(["perf", "stat", "-e", EVS, "-o", out, "-p", str(p.pid)], stderr=subprocess.DEVNULL)
        time.sleep(0.5)
        def sw():
            v=n=0
            for t in os.listdir("/proc/%d/task"%p.pid):
                try:
                    for l in open("/proc/%d/task/%s/status"%(p.pid,t)):
                        if l.startswith("voluntary_ctxt"): v+=int(l.split()[1])
                        if l.startswith("nonvoluntary_ctxt"): n+=int(l.split()[1])
                except OSError: pass
            return v,n
        v0,n0=sw()
        r = subprocess.run(w, capture_output=True, text=True)
        v1,n1=sw()
        t.send_signal(signal.SIGINT); t.wait()
        js = json.loads(r.stdout.split("WRKJSON ", 1)[1].splitlines()[0])
        n = js["requests"]
        if js["status"] or js["connect"] or js["read"] or js["timeout"]:
            sys.exit("counts.py: wrk saw errors: %r" % js)
        print("== %s %s requests=%d errors=%s" % (kind, mode, n, {k: js[k] for k in ("connect", "read", "write", "status", "timeout")}))
        print("  voluntary %.3f nonvoluntary %.3f per req (live threads only)" % ((v1-v0)/n,(n1-n0)/n))
        for line in open(out).read().splitlines():
            if os.environ.get("STRACE"):
                m = re.match(r"\s*[\d.]+\s+[\d.]+\s+\d+\s+(\d+)\s+(\d+)?\s*(\w+)$", line)
                if m: print("  %-22s %7.3f" % (m.group(3), int(m.group(1)) / n))
            else:
                m = re.match(r"\s*([\d,.]+)\s+(?:msec\s+)?([\w:-]+)", line)
                if m and m.group(2) != "seconds":
                    print("  %-22s %9.3f per req" % (m.group(2), float(m.group(1).replace(",", "")) / n))
    finally:
        p.send_signal(signal.SIGTERM); p.wait()

try:
    for spec in sys.argv[1:]:
        kind, mode = spec.split(":")
        run(kind, os.environ.get("BIN", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "target", "release", "3proxy")), int(os.environ.get("SECS", "4")), mode)
finally:
    ng.send_signal(signal.SIGQUIT); ng.wait()
    shutil.rmtree(d, ignore_errors=True)
