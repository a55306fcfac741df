"""What is measured: the scenarios, the proxies, and which pairs make sense.

Tables first, then the pure functions that turn a (scenario, proxy) pair
into a client command line; runner.py executes them.
"""

from . import configs as C

# kind: iperf | wrk | fetch | mem | rate | h2load | siege | stime | mitm.
# unit: what CPU is divided by ("GB" or "req").
SCENARIOS = {
    "stream1":          {"kind": "iperf", "service": "tcp", "streams": 1, "reverse": False, "unit": "GB",
                         "what": "one iperf3 stream, client to origin"},
    "stream1-down":     {"kind": "iperf", "service": "tcp", "streams": 1, "reverse": True, "unit": "GB",
                         "what": "one iperf3 stream, origin to client (-R)"},
    "stream16":         {"kind": "iperf", "service": "tcp", "streams": 16, "reverse": False, "unit": "GB",
                         "what": "16 parallel iperf3 streams, client to origin"},
    "http-ka-1k":       {"kind": "wrk", "service": "http", "conns": 64, "file": "1k.bin", "close": False, "unit": "req",
                         "what": "64 kept-alive clients, 1 KB responses"},
    "http-ka-1m":       {"kind": "wrk", "service": "http", "conns": 16, "file": "1m.bin", "close": False, "unit": "GB",
                         "what": "16 kept-alive clients, 1 MB responses"},
    "http-ka-50k-2000": {"kind": "wrk", "service": "http", "conns": 2000, "file": "50k.bin", "close": False, "unit": "req",
                         "what": "2000 kept-alive clients, 50 KB responses"},
    "http-close-1k":    {"kind": "wrk", "service": "http", "conns": 64, "file": "1k.bin", "close": True, "unit": "req",
                         "what": "64 clients, a new connection per request, 1 KB"},
    "https-ka-1k":      {"kind": "wrk", "service": "https", "conns": 64, "file": "1k.bin", "close": False,
                         "unit": "req",
                         "what": "64 kept-alive TLS clients, 1 KB responses (TLS to the proxy, plain to the origin)"},
    "https-ka-1m":      {"kind": "wrk", "service": "https", "conns": 16, "file": "1m.bin", "close": False,
                         "unit": "GB",
                         "what": "16 kept-alive TLS clients, 1 MB responses"},
    "https-close-1k":   {"kind": "wrk", "service": "https", "conns": 64, "file": "1k.bin", "close": True,
                         "unit": "req",
                         "what": "64 clients, a new TLS connection (full handshake) per 1 KB request"},
    "https-new-1k":     {"kind": "stime", "service": "https", "conns": 8, "file": "1k.bin",
                         "unit": "req",
                         "what": "8 openssl s_time -new clients, a full TLS handshake (no resumption) "
                                 "per 1 KB request"},
    "tcp-1m":           {"kind": "fetch", "service": "tcphttp", "conns": 8, "file": "1m.bin", "unit": "GB",
                         "what": "8 clients, GET 1 MB through a TCP mapping, a connection per request"},
    "socks-1m":         {"kind": "fetch", "service": "socks", "conns": 8, "file": "1m.bin", "unit": "GB",
                         "what": "8 clients, SOCKS5 CONNECT then GET 1 MB, a connection per request"},
    "tcp-1k":           {"kind": "fetch", "service": "tcphttp", "conns": 8, "file": "1k.bin", "unit": "req",
                         "what": "8 clients, a new connection through a TCP mapping per 1 KB request"},
    "socks-1k":         {"kind": "fetch", "service": "socks", "conns": 8, "file": "1k.bin", "unit": "req",
                         "what": "8 clients, a new SOCKS5 session per 1 KB request"},
    "socks-ka":         {"kind": "fetch", "service": "socks", "conns": 8, "file": "1k.bin", "unit": "req",
                         "keepalive": True,
                         "what": "8 SOCKS5 tunnels, each carrying kept-alive 1 KB GETs"},
    "tunnel-rate-low":  {"kind": "rate", "service": "tcphttp", "rate": 1000, "file": "5b.bin", "unit": "req",
                         "what": "1000 new TCP-mapped connections/s, open loop, latency percentiles"},
    "tunnel-rate-high": {"kind": "rate", "service": "tcphttp", "rate": 3500, "file": "5b.bin", "unit": "req",
                         "what": "3500 new TCP-mapped connections/s (the http-tunnel benchmark's rate)"},
    "connect-rate-low": {"kind": "rate", "service": "http", "rate": 1000, "file": "5b.bin", "unit": "req",
                         "connect": True,
                         "what": "1000 new HTTP CONNECT tunnels/s, open loop, latency percentiles"},
    "connect-rate-high": {"kind": "rate", "service": "http", "rate": 3500, "file": "5b.bin", "unit": "req",
                          "connect": True,
                          "what": "3500 new HTTP CONNECT tunnels/s"},
    "http-ka-50k-2000-rate": {"kind": "rate", "service": "http", "rate": 1500, "file": "50k.bin",
                              "unit": "req", "keepalive": True, "conns": 2000,
                              # A p99 of 6 s (9,000 requests) moved 2-5x from
                              # run to run; 20 s runs agreed far better.
                              "min_seconds": 20,
                              "what": "http-ka-50k-2000 in an open loop: 2000 kept-alive clients, 1500"
                                      " requests/s in all (each to the client idle longest), latency"
                                      " from when each was due; the same offered load for every proxy"},
    "h2load-64k":       {"kind": "h2load", "service": "http", "conns": 40, "file": "64k.bin", "unit": "req",
                         "what": "h2load --h1, 40 kept-alive clients, 64 KB responses"},
    "siege-20m":        {"kind": "siege", "service": "http", "conns": 10, "file": "20m.bin", "unit": "GB",
                         "min_seconds": 10,
                         "what": "siege -b, 10 kept-alive clients, 20 MB responses"},
    "siege-5b":         {"kind": "siege", "service": "http", "conns": 10, "file": "5b.bin", "unit": "req",
                         "what": "siege -b, 10 kept-alive clients, 5-byte responses"},
    "https-mitm-ka-1k": {"kind": "mitm", "service": "mitm", "conns": 8, "file": "1k.bin", "unit": "req",
                         "keepalive": True,
                         "what": "8 clients, each one CONNECT tunnel whose TLS the proxy intercepts (TLS"
                                 " with the client under a certificate it made, TLS with the origin),"
                                 " carrying kept-alive 1 KB GETs: CPU per request"},
    "https-mitm-close-1k": {"kind": "mitm", "service": "mitm", "conns": 8, "file": "1k.bin",
                            "unit": "req", "keepalive": False,
                            "what": "8 clients, a new intercepted CONNECT tunnel per 1 KB GET, each a"
                                    " full TLS handshake (no resumption) with the client: CPU per"
                                    " request, that is per handshake (the proxy's own with the"
                                    " origin included)"},
    "mem-idle-2000":    {"kind": "mem", "service": "http", "conns": 2000, "file": "1k.bin", "unit": None,
                         "what": "RSS at rest, then with 2000 idle kept-alive HTTP clients"},
    "mem-idle-2000-tcp": {"kind": "mem", "service": "tcphttp", "conns": 2000, "file": "1k.bin", "unit": None,
                          "what": "the same through a TCP mapping (tcppm / stream / mode tcp)"},
    "mem-idle-2000-https": {"kind": "mem", "service": "https", "conns": 2000, "file": "1k.bin",
                            "unit": None,
                            "what": "the same as mem-idle-2000 with each client behind TLS"},
    "mem-idle-10k":     {"kind": "mem", "service": "http", "conns": 10000, "file": "1k.bin", "unit": None,
                         "what": "RSS at rest, then with 10,000 idle kept-alive HTTP clients"},
    "mem-idle-10k-tcp": {"kind": "mem", "service": "tcphttp", "conns": 10000, "file": "1k.bin", "unit": None,
                         "what": "the same through a TCP mapping, 10,000 idle sessions (the issue asks"
                                 " for 100,000: each tunnel takes 2 of the proxy's descriptors, and this"
                                 " machine's hard limit is 20,000 and cannot be raised, nor its"
                                 " pid_max of 32,768 a thread per tunnel; so 9,950 is the most one"
                                 " process holds here)"},
}

# family: how the proxy is started and configured.
PROXIES = {
    "noproxy":        {"family": "none", "splice": False,
                       "what": "no proxy: the kernel forwards IP on the proxy CPU"},
    "3proxy":         {"family": "ours", "splice": False, "what": "threeproxy, copy relay"},
    "3proxy-splice":  {"family": "ours", "splice": True, "what": "threeproxy, -s splice relay"},
    "nginx":          {"family": "nginx", "splice": False,
                       "what": "nginx, 1 worker: proxy_pass + upstream keepalive; stream for TCP"},
    "haproxy":        {"family": "haproxy", "splice": False,
                       "what": "haproxy, 1 thread: mode http + http-reuse always; mode tcp"},
    "haproxy-splice": {"family": "haproxy", "splice": True,
                       "what": "haproxy as above with option splice-request/-response"},
    "dante":          {"family": "dante", "splice": False,
                       "what": "dante sockd -N 1: SOCKS5, no authentication, CONNECT only, no log"},
    "microsocks":     {"family": "microsocks", "splice": False,
                       "what": "microsocks: SOCKS5, a thread per client (as ours), in C"},
    "squid":          {"family": "squid", "splice": False,
                       "what": "squid forward proxy, 1 worker, cache deny all, no logs"},
    "tinyproxy":      {"family": "tinyproxy", "splice": False, "closes_after_response": True,
                       "what": "tinyproxy forward proxy, log level Critical"},
    "trafficserver":  {"family": "trafficserver", "splice": False,
                       "what": "Apache Traffic Server forward proxy, 1 event thread, cache and logs off"},
}

# What each family can serve: the services of SCENARIOS it has.
SOCKS_ONLY = ("dante", "microsocks")
FORWARD = ("squid", "tinyproxy", "trafficserver")     # HTTP forward proxies (absolute-form)
SERVES = {
    "none": ("tcp", "tcphttp", "http", "socks", "mitm"),
    "ours": ("tcp", "tcphttp", "http", "socks", "https", "mitm"),
    "nginx": ("tcp", "tcphttp", "http", "https"),
    "haproxy": ("tcp", "tcphttp", "http", "https"),
    "dante": ("socks",),
    "microsocks": ("socks",),
    "squid": ("http", "mitm"),
    "tinyproxy": ("http",),
    "trafficserver": ("http",),
}
# Seconds a proxy may take to listen (squid and ATS read a lot at start).
START_TIMEOUT = {"squid": 20, "trafficserver": 20}

SCENARIO_ORDER = list(SCENARIOS)
PROXY_ORDER = list(PROXIES)
BASELINE = "noproxy"


# tinyproxy (1.11) keeps no client connection alive: it asks the origin
# for `Connection: close`, drops the response's Connection field (so an
# HTTP/1.1 client is not told) and closes after the response.  wrk counts a
# read error at each of those closes, and the idle clients are all closed.
CLOSES_AFTER_RESPONSE = ("%s closes the client connection after every response, without "
                         "Connection: close in it: no keep-alive to measure")


def keeps_alive(scenario):
    """Whether SCENARIO's HTTP clients reuse their connection."""
    s = SCENARIOS[scenario]
    if s["kind"] == "mitm":
        return bool(s.get("keepalive"))
    if s["service"] not in ("http", "https") or s.get("connect"):
        return False
    if s["kind"] == "wrk":
        return not s["close"]
    if s["kind"] == "rate":
        return bool(s.get("keepalive"))
    return s["kind"] in ("h2load", "siege", "mem")


def unannounced_closes_ok(scenario, proxy):
    """Whether wrk's read errors are PROXY's unannounced closes after a
    complete response in a connection-per-request cell (tinyproxy): wrk,
    told nothing, sends its next request on the closing connection, counts
    a read error and reconnects, which is the cell's load anyway."""
    s = SCENARIOS[scenario]
    return bool(PROXIES[proxy].get("closes_after_response")) and s["kind"] == "wrk" \
        and s["close"]


def applicable(scenario, proxy):
    """None if PROXY can run SCENARIO, else the reason it cannot."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    if p["family"] == "none" and s["kind"] == "mem":
        return "no proxy process to measure"
    fam = p["family"]
    if s["service"] == "https":
        # Issue 13 sets TLS beside haproxy's and nginx's (OpenSSL).
        if fam == "none":
            return "the origin speaks plain HTTP only: TLS needs a proxy to end it"
        if p["splice"]:
            return "splicing cannot relay TLS (the proxy decrypts in user space)"
        if fam not in ("ours", "nginx", "haproxy"):
            return "%s is not set up for TLS here (issue 13 compares with haproxy and nginx)" % fam
    if s["service"] == "mitm":
        # Issue 31 sets TLS interception beside squid's ssl_bump and
        # 3proxy 1.0.0's ssl_mitm (--alt-binary); no proxy: the client
        # speaks TLS with the origin itself.
        if p["splice"]:
            return "splicing cannot relay TLS (the proxy decrypts in user space)"
        if fam in ("nginx", "haproxy"):
            return "%s has no HTTP CONNECT, so nothing to intercept" % fam
        if fam in SOCKS_ONLY:
            return "%s is a SOCKS server only" % fam
        if fam not in SERVES or "mitm" not in SERVES[fam]:
            return ("%s is not set up to intercept TLS here (issue 31 compares with squid's "
                    "ssl_bump and 3proxy 1.0.0's ssl_mitm)" % fam)
    if fam in ("nginx", "haproxy") and s["service"] == "socks":
        return "%s has no SOCKS server" % fam
    if s["service"] not in SERVES[fam]:
        if fam in SOCKS_ONLY:
            return "%s is a SOCKS server only" % fam
        return "%s is an HTTP forward proxy only (no TCP mapping, no SOCKS)" % fam
    if s.get("connect") and fam in ("nginx", "haproxy"):
        return "%s has no HTTP CONNECT" % fam
    if p.get("closes_after_response") and keeps_alive(scenario):
        return CLOSES_AFTER_RESPONSE % proxy
    if s["kind"] == "h2load" and fam in FORWARD:
        # ATS answered them 4xx in the smoke run, Host field or not.
        return ("h2load sends origin-form requests only, and %s serves only "
                "absolute-form ones on a forward port" % fam)
    return None


def wrk_target(scenario, proxy):
    """(url wrk connects to, lua kwargs) for a wrk scenario.  For https wrk
    speaks TLS to the proxy's port and, to ours, sends the same absolute-form
    request inside it: what `curl --proxy https://` does for an http:// URL."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    path = "/" + s["file"]
    origin = "http://%s:%d" % (C.ORIGIN_IP, C.HTTP_PORT)
    if p["family"] == "none":
        return origin + path, {"close": s["close"]}
    scheme = "https" if s["service"] == "https" else "http"
    front = "%s://%s:%d" % (scheme, C.PROXY_IP, C.listen_port(s["service"]))
    if p["family"] == "ours" or p["family"] in FORWARD:
        # A forward proxy: absolute-form target, Host of the origin.
        return front + "/", {"absolute_url": origin + path, "host": C.ORIGIN_IP,
                             "close": s["close"]}
    # nginx and haproxy are reverse proxies in front of the origin.
    return front + path, {"close": s["close"]}


def wrk_argv(url, lua_path, conns, seconds, threads=1):
    return ["wrk", "-t%d" % threads, "-c%d" % conns, "-d%ds" % max(1, round(seconds)),
            "--timeout", "10s", "-s", lua_path, url]


def iperf_client_argv(scenario, proxy, seconds):
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    host = C.ORIGIN_IP if p["family"] == "none" else C.PROXY_IP
    argv = ["iperf3", "-c", host, "-p", str(C.IPERF_PORT), "-t", str(max(1, round(seconds))),
            "-J"]
    if s["streams"] > 1:
        argv += ["-P", str(s["streams"])]
    if s["reverse"]:
        argv.append("-R")
    return argv


def iperf_server_argv():
    return ["iperf3", "-s", "-1", "-B", C.ORIGIN_IP, "-p", str(C.IPERF_PORT)]


def fetch_argv(fetcher, scenario, proxy, seconds):
    """FETCHER: the compiled load client (bench/loadgen.rs)."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    target = "%s:%d" % (C.ORIGIN_IP, C.HTTP_PORT)
    argv = [fetcher, "fetch", "--target", target, "--path", "/" + s["file"],
            "--conns", str(s["conns"]), "--seconds", "%g" % seconds]
    if p["family"] == "none":
        return argv + ["--server", target]
    argv += ["--server", "%s:%d" % (C.PROXY_IP, C.listen_port(s["service"]))]
    if s.get("keepalive"):
        argv.append("--keepalive")
    # Through a TCP mapping the request goes as is; through SOCKS after
    # the handshake.
    return argv + ["--socks"] if s["service"] == "socks" else argv


def mitm_argv(fetcher, scenario, proxy, seconds, mitm):
    """The client of the https-mitm cells (bench/loadgen.rs fetch --tls):
    CONNS connections through PROXY's CONNECT to the origin's HTTPS, TLS
    inside each trusting only the MITM CA (mitm_files), one warm-up request
    on each, then SECONDS of GETs of FILE, kept-alive or a new tunnel and
    full handshake per request.  With no proxy the client speaks TLS with
    the origin itself, trusting the origin's CA."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    target = "%s:%d" % (C.ORIGIN_IP, C.ORIGIN_HTTPS_PORT)
    argv = [fetcher, "fetch", "--target", target, "--path", "/" + s["file"],
            "--conns", str(s["conns"]), "--seconds", "%g" % seconds]
    if p["family"] == "none":
        argv += ["--server", target, "--tls", mitm["origin_ca"]]
    else:
        argv += ["--server", "%s:%d" % (C.PROXY_IP, C.listen_port(s["service"])),
                 "--tls", mitm["ca"], "--connect"]
    return argv + ["--keepalive"] if s.get("keepalive") else argv


def certcache_dir(rundir):
    """Where ours and 3proxy keep the certificates they make (mitm)."""
    return rundir + "/certcache"


def cell_seconds(scenario, seconds):
    """How long SCENARIO's client runs when the harness asks for SECONDS."""
    return max(seconds, SCENARIOS[scenario].get("min_seconds", 0))


def rate_argv(fetcher, scenario, proxy, seconds):
    """The open-loop client of the tunnel-rate cells: RATE new connections
    a second whatever the proxy does, each one GET of a 5-byte file, and
    the latency histogram measured from each connection's scheduled start."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    target = "%s:%d" % (C.ORIGIN_IP, C.HTTP_PORT)
    argv = [fetcher, "rate", "--target", target, "--path", "/" + s["file"],
            "--rate", str(s["rate"]), "--seconds", "%g" % cell_seconds(scenario, seconds)]
    if s.get("keepalive"):
        # The kept-alive open loop (http-ka-50k-2000-rate): a pool of
        # CONNS connections, each warmed up by one request first.
        argv += ["--keepalive", "--conns", str(s["conns"])]
    if p["family"] == "none":
        return argv + ["--server", target]
    argv += ["--server", "%s:%d" % (C.PROXY_IP, C.listen_port(s["service"]))]
    if s.get("keepalive") and (p["family"] == "ours" or p["family"] in FORWARD):
        # A forward proxy is sent the absolute-form target, as wrk is.
        argv.append("--absolute")
    return argv + ["--connect"] if s.get("connect") else argv


def h2load_argv(scenario, proxy, seconds):
    """h2load --h1 cannot send an absolute-form target (it ignores a :path
    header), so every proxy is the target: nginx and haproxy as reverse
    proxies, ours by the Host field of an origin-form request (the forward
    peers are n/a: see applicable)."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    path = "/" + s["file"]
    # -N: a connection that stalls 10 s ends instead of the whole run
    # waiting for it.
    argv = ["h2load", "--h1", "-t1", "-c%d" % s["conns"], "-D%d" % max(1, round(seconds)),
            "-N10"]
    if p["family"] == "none":
        return argv + ["http://%s:%d%s" % (C.ORIGIN_IP, C.HTTP_PORT, path)]
    if p["family"] == "ours":
        # The origin as :authority, which h2load --h1 sends as the one Host
        # field.  (`-H host: ...` adds a second Host after the URL's: ours,
        # like nginx, answers that 400 and closes, as RFC 9112 3.2 says, and
        # h2load -D then ends without a summary: issue 18's "never finishes".)
        argv += ["-H", ":authority: %s:%d" % (C.ORIGIN_IP, C.HTTP_PORT)]
    return argv + ["http://%s:%d%s" % (C.PROXY_IP, C.listen_port(s["service"]), path)]


def h2load_mode(proxy):
    """How h2load reaches the origin through PROXY, for the report."""
    fam = PROXIES[proxy]["family"]
    if fam == "none":
        return "direct"
    if fam == "ours":
        return "proxy as target, origin-form + Host of the origin"
    return "reverse proxy (proxy as target)"


def siege_argv(scenario, proxy, seconds, rcfile):
    """siege -b (no delay), C kept-alive clients for SECONDS; a forward
    proxy is siege's own proxy setting (RCFILE, configs.render_siegerc),
    so its requests are absolute-form."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    path = "/" + s["file"]
    if p["family"] in ("none", "ours") or p["family"] in FORWARD:
        url = "http://%s:%d%s" % (C.ORIGIN_IP, C.HTTP_PORT, path)
    else:
        url = "http://%s:%d%s" % (C.PROXY_IP, C.listen_port(s["service"]), path)
    # siege counts a transaction when it completes: 10 clients of a 20 MB
    # file need longer than quick mode's 2 s (squid made none in them).
    secs = max(1, cell_seconds(scenario, seconds))
    return ["siege", "-R", rcfile, "-b", "-j", "-c%d" % s["conns"],
            "-t%dS" % max(1, round(secs)), url]


def siege_proxy(proxy):
    """(host, port) siege sends absolute-form requests to, or None."""
    fam = PROXIES[proxy]["family"]
    if fam == "ours" or fam in FORWARD:
        return C.PROXY_IP, C.PROXY_HTTP_PORT
    return None


def idle_argv(loadgen, scenario, proxy, conns):
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    server = "%s:%d" % (C.PROXY_IP, C.listen_port(s["service"]))
    path = "/" + s["file"]
    if (p["family"] == "ours" or p["family"] in FORWARD) and s["service"] in ("http", "https"):
        target = "http://%s:%d%s" % (C.ORIGIN_IP, C.HTTP_PORT, path)
    else:
        target = path
    argv = ["python3", loadgen, "idle", "--server", server, "--request-target", target,
            "--host", C.ORIGIN_IP, "--conns", str(conns)]
    return argv + ["--tls"] if s["service"] == "https" else argv


def stime_argv(scenario, proxy, seconds):
    """One `openssl s_time -new` client of https-new-1k: for SECONDS, a new
    connection with a full handshake (it offers no session), an HTTP/1.0
    GET (absolute-form to ours, as wrk's), read to the close."""
    s, p = SCENARIOS[scenario], PROXIES[proxy]
    path = "/" + s["file"]
    if p["family"] == "ours":
        path = "http://%s:%d%s" % (C.ORIGIN_IP, C.HTTP_PORT, path)
    return ["openssl", "s_time", "-connect", "%s:%d" % (C.PROXY_IP, C.listen_port(s["service"])),
            "-new", "-time", str(max(1, round(seconds))), "-www", path]


def tls_probe_argv(service):
    """One TLS handshake with the proxy's SERVICE port, to record what was
    negotiated (parse.parse_tls_probe); stdin is empty, so it ends."""
    return ["openssl", "s_client", "-brief", "-connect",
            "%s:%d" % (C.PROXY_IP, C.listen_port(service))]


def tls_resume_argv(loadgen, scenario, proxy):
    """Two TLS connections to the proxy, the second offering the first's
    session (as wrk does): whether the proxy resumed it."""
    a = idle_argv(loadgen, scenario, proxy, 1)
    a[2] = "resume"
    return a[:a.index("--conns")]


def proxy_config(proxy, service, rundir, nofile=65536, tls=None, mitm=None):
    """(file name, text) of PROXY's config for SERVICE, or None (no proxy).
    TLS: the certificate and key files (configs.tls_files) for https;
    MITM: the CAs and the origin's files (configs.mitm_files) for mitm."""
    p = PROXIES[proxy]
    fam = p["family"]
    if fam == "none":
        return None
    if fam == "ours":
        mitm_args = {}
        if service == "mitm":
            mitm_args = {"mitm": mitm, "certcache": certcache_dir(rundir)}
        return "3proxy.cfg", C.render_threeproxy(service, splice=p["splice"], tls=tls,
                                                 radius=p.get("radius", False), **mitm_args)
    if fam == "nginx":
        return "nginx.conf", C.render_nginx_proxy(rundir, service, tls=tls, nofile=nofile)
    if fam == "haproxy":
        return "haproxy.cfg", C.render_haproxy(service, splice=p["splice"],
                                               maxconn=C.haproxy_maxconn(nofile, p["splice"]),
                                               tls=tls)
    if fam == "dante":
        return "sockd.conf", C.render_dante(rundir)
    if fam == "microsocks":
        return "microsocks.argv", " ".join(C.microsocks_argv()) + "\n"
    if fam == "squid":
        return "squid.conf", C.render_squid(rundir, nofile,
                                            mitm=mitm if service == "mitm" else None)
    if fam == "tinyproxy":
        return "tinyproxy.conf", C.render_tinyproxy(rundir)
    if fam == "trafficserver":
        return "records.config", C.render_trafficserver(rundir)
    raise ValueError(fam)


def add_alt(binary, what=None):
    """Register proxy 3proxy-alt: our copy relay run from another binary
    (bench.py --alt-binary), to compare two builds within one run."""
    PROXIES["3proxy-alt"] = {"family": "ours", "splice": False, "binary": binary,
                             "what": what or "another build of threeproxy, copy relay"}
    if "3proxy-alt" not in PROXY_ORDER:
        PROXY_ORDER.insert(PROXY_ORDER.index("3proxy") + 1, "3proxy-alt")


def add_radius():
    """Register proxy 3proxy-radius: our binary with `log radius` to a
    FreeRADIUS the runner starts in the origin namespace (bench.py
    --radius), for the A/B of issue 15's speed target against 3proxy."""
    PROXIES["3proxy-radius"] = {
        "family": "ours", "splice": False, "radius": True,
        "what": "threeproxy, copy relay, with `radius %s %s` (port %d) and `log radius` "
                "(FreeRADIUS in the origin namespace on the other CPU, answering only)"
                % (C.RADIUS_SECRET, C.ORIGIN_IP, C.RADIUS_PORT)}
    if "3proxy-radius" not in PROXY_ORDER:
        PROXY_ORDER.insert(PROXY_ORDER.index("3proxy") + 1, "3proxy-radius")


def proxy_argv(proxy, cfg_path, rundir, binary):
    fam = PROXIES[proxy]["family"]
    if fam == "ours":
        return [PROXIES[proxy].get("binary", binary), cfg_path]
    if fam == "nginx":
        return ["nginx", "-e", rundir + "/proxy.err", "-p", rundir, "-c", cfg_path]
    if fam == "haproxy":
        return ["haproxy", "-db", "-f", cfg_path]
    if fam == "dante":
        return ["danted", "-N", "1", "-f", cfg_path]
    if fam == "microsocks":
        return C.microsocks_argv()
    if fam == "squid":
        return ["squid", "-N", "-f", cfg_path]
    if fam == "tinyproxy":
        return ["tinyproxy", "-d", "-c", cfg_path]
    if fam == "trafficserver":
        # records.config goes into a runroot of its own (runner.py lays it).
        return ["traffic_server", "--run-root=" + rundir + "/ats/runroot.yaml"]
    raise ValueError(fam)


def select(names, table, what):
    """Validate a comma-separated filter against TABLE; None means all."""
    if not names:
        return list(table)
    out = []
    for n in names.split(","):
        n = n.strip()
        if n not in table:
            raise ValueError("unknown %s %r (known: %s)" % (what, n, ", ".join(table)))
        out.append(n)
    return out
