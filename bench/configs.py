"""Configuration rendering: every file a proxy, the origin or wrk reads.

Pure functions of their arguments, so the unit tests can check them
without root, network or the tools installed.

Addresses are fixed by the topology (see netns.py): the client is
10.0.1.1, the proxy listens on 10.0.1.2 and reaches the origin, 10.0.2.2,
from 10.0.2.1.
"""

CLIENT_IP = "10.0.1.1"
PROXY_IP = "10.0.1.2"
PROXY_OUT_IP = "10.0.2.1"
ORIGIN_IP = "10.0.2.2"

IPERF_PORT = 5201     # iperf3 on the origin, and the TCP mapping on the proxy
HTTP_PORT = 80        # nginx on the origin
PROXY_HTTP_PORT = 3128
PROXY_SOCKS_PORT = 1080
PROXY_TCPHTTP_PORT = 8081   # TCP mapping to the origin's HTTP (memory scenario)

# Sizes of the files the origin serves from tmpfs.
FILES = {"1k.bin": 1024, "50k.bin": 50 * 1024, "1m.bin": 1024 * 1024,
         "64k.bin": 64 * 1024, "20m.bin": 20 * 1024 * 1024, "5b.bin": 5}

# A proxy "service" is what the scenario asks of it:
#   tcp      a TCP mapping PROXY_IP:5201 -> origin iperf3
#   tcphttp  a TCP mapping PROXY_IP:8081 -> origin HTTP
#   http     an HTTP proxy on PROXY_IP:3128 (forward for ours, reverse for
#            nginx and haproxy, which have no forward-proxy mode worth the name)
#   socks    a SOCKS5 server on PROXY_IP:1080 (ours only)
SERVICE_PORTS = {
    "tcp": (IPERF_PORT, IPERF_PORT),
    "tcphttp": (PROXY_TCPHTTP_PORT, HTTP_PORT),
    "http": (PROXY_HTTP_PORT, HTTP_PORT),
    "socks": (PROXY_SOCKS_PORT, None),
}


def listen_port(service):
    """The port the proxy listens on for SERVICE."""
    return SERVICE_PORTS[service][0]


# --- ours ------------------------------------------------------------------

def render_threeproxy(service, splice=False):
    """A 3proxy cfg with one service, no log, generous limits.  As in 3proxy,
    tcppm takes its listening port as the first positional argument."""
    s = " -s" if splice else ""
    lines = [
        "# threeproxy bench: %s%s" % (service, " (splice)" if splice else ""),
        "timeouts 1 5 30 60 180 1800 15 60",
        "maxconn 25000",
    ]
    if service == "tcp":
        lines.append("tcppm%s -i%s %d %s %d"
                     % (s, PROXY_IP, IPERF_PORT, ORIGIN_IP, IPERF_PORT))
    elif service == "tcphttp":
        lines.append("tcppm%s -i%s %d %s %d"
                     % (s, PROXY_IP, PROXY_TCPHTTP_PORT, ORIGIN_IP, HTTP_PORT))
    elif service == "http":
        lines.append("proxy%s -i%s -p%d" % (s, PROXY_IP, PROXY_HTTP_PORT))
    elif service == "socks":
        lines.append("socks%s -i%s -p%d" % (s, PROXY_IP, PROXY_SOCKS_PORT))
    else:
        raise ValueError("unknown service %r" % service)
    return "\n".join(lines) + "\n"


# --- nginx -----------------------------------------------------------------

NGINX_STREAM_MODULE = "/usr/lib/nginx/modules/ngx_stream_module.so"


def _nginx_head(rundir, name, workers=1):
    return (
        "worker_processes %d;\n"
        "daemon off;\n"
        "master_process on;\n"
        "pid %s/%s.pid;\n"
        "error_log %s/%s.err crit;\n"
        "worker_rlimit_nofile 20000;\n"
        % (workers, rundir, name, rundir, name)
    )


_NGINX_HTTP_COMMON = (
    "    access_log off;\n"
    "    sendfile on;\n"
    "    tcp_nopush on;\n"
    "    tcp_nodelay on;\n"
    "    keepalive_requests 1000000;\n"
    "    keepalive_timeout 300s;\n"
    "    client_body_temp_path %(rundir)s/tmp/body;\n"
    "    proxy_temp_path %(rundir)s/tmp/proxy;\n"
    "    fastcgi_temp_path %(rundir)s/tmp/fastcgi;\n"
    "    uwsgi_temp_path %(rundir)s/tmp/uwsgi;\n"
    "    scgi_temp_path %(rundir)s/tmp/scgi;\n"
)


def render_nginx_origin(rundir, wwwdir):
    """The origin: one nginx worker serving WWWDIR (on tmpfs) with sendfile."""
    return (
        _nginx_head(rundir, "origin")
        + "events { worker_connections 16000; }\n"
        "http {\n"
        + _NGINX_HTTP_COMMON % {"rundir": rundir}
        + "    open_file_cache max=64;\n"
        "    default_type application/octet-stream;\n"
        "    server {\n"
        "        listen %s:%d backlog=4096;\n"
        "        root %s;\n"
        "        location / { }\n"
        "    }\n"
        "}\n" % (ORIGIN_IP, HTTP_PORT, wwwdir)
    )


def render_nginx_proxy(rundir, service):
    """nginx as the proxy: a reverse proxy with upstream keepalive for http,
    the stream module for the TCP mappings.  One worker."""
    head = _nginx_head(rundir, "proxy")
    if service in ("tcp", "tcphttp"):
        lport, dport = SERVICE_PORTS[service]
        return (
            "load_module %s;\n" % NGINX_STREAM_MODULE
            + head
            + "events { worker_connections 16000; }\n"
            "stream {\n"
            "    server {\n"
            "        listen %s:%d backlog=4096;\n"
            "        proxy_pass %s:%d;\n"
            "    }\n"
            "}\n" % (PROXY_IP, lport, ORIGIN_IP, dport)
        )
    if service == "http":
        return (
            head
            + "events { worker_connections 16000; }\n"
            "http {\n"
            + _NGINX_HTTP_COMMON % {"rundir": rundir}
            + "    upstream origin {\n"
            "        server %s:%d;\n"
            "        keepalive 2048;\n"
            "        keepalive_requests 1000000;\n"
            "        keepalive_timeout 300s;\n"
            "    }\n"
            "    server {\n"
            "        listen %s:%d backlog=4096;\n"
            "        location / {\n"
            "            proxy_pass http://origin;\n"
            "            proxy_http_version 1.1;\n"
            "            proxy_set_header Connection \"\";\n"
            "            proxy_max_temp_file_size 0;\n"
            "        }\n"
            "    }\n"
            "}\n" % (ORIGIN_IP, HTTP_PORT, PROXY_IP, PROXY_HTTP_PORT)
        )
    raise ValueError("nginx has no %r service" % service)


# --- haproxy ---------------------------------------------------------------

def haproxy_maxconn(nofile):
    """haproxy refuses to start unless the descriptor limit covers maxconn
    (2 per connection, and as many again for splice pipes): size maxconn to
    the limit."""
    return max(100, min(20000, (nofile - 200) // 4))


def render_haproxy(service, splice=False, maxconn=20000):
    """haproxy, one thread, no log: mode http with http-reuse always, or
    mode tcp for the TCP mappings; SPLICE adds kernel splicing both ways."""
    if service in ("tcp", "tcphttp"):
        mode = "tcp"
    elif service == "http":
        mode = "http"
    else:
        raise ValueError("haproxy has no %r service" % service)
    lport, dport = SERVICE_PORTS[service]
    lines = [
        "global",
        "    nbthread 1",
        "    maxconn %d" % maxconn,
        "",
        "defaults",
        "    mode %s" % mode,
        "    timeout connect 5s",
        "    timeout client 300s",
        "    timeout server 300s",
    ]
    if mode == "http":
        lines += ["    timeout http-keep-alive 300s",
                  "    http-reuse always"]
    if splice:
        lines += ["    option splice-request",
                  "    option splice-response"]
    else:
        lines += ["    no option splice-request",
                  "    no option splice-response"]
    lines += [
        "",
        "frontend in",
        "    bind %s:%d" % (PROXY_IP, lport),
        "    maxconn %d" % maxconn,
        "    default_backend out",
        "",
        "backend out",
        "    server origin %s:%d maxconn %d" % (ORIGIN_IP, dport, maxconn),
    ]
    return "\n".join(lines) + "\n"


# --- the forward-proxy and SOCKS peers ---------------------------------------

def render_dante(rundir):
    """dante's sockd: SOCKS5 without authentication on PROXY_IP:1080, out
    through PROXY_OUT_IP, CONNECT only, no log lines (no `log:` in the
    rules, errors to a file).  One mother process is `-N 1` (argv)."""
    return (
        "logoutput: %s/sockd.err\n"
        "internal: %s port = %d\n"
        "external: %s\n"
        "socksmethod: none\n"
        "clientmethod: none\n"
        "user.privileged: root\n"
        "user.unprivileged: nobody\n"
        "timeout.negotiate: 30\n"
        "timeout.io: 300\n"
        "client pass {\n    from: 0.0.0.0/0 to: 0.0.0.0/0\n}\n"
        "socks pass {\n    from: 0.0.0.0/0 to: 0.0.0.0/0\n    command: connect\n}\n"
        % (rundir, PROXY_IP, PROXY_SOCKS_PORT, PROXY_OUT_IP)
    )


def microsocks_argv():
    """microsocks has no config file: its listening address is its argv.
    It logs nothing but errors, and has no worker setting (a thread per
    client, like ours)."""
    return ["microsocks", "-i", PROXY_IP, "-p", str(PROXY_SOCKS_PORT), "-b", PROXY_OUT_IP]


def render_squid(rundir, nofile=20000):
    """squid as a forward proxy: no cache at all (`cache deny all`, no
    memory cache, no cache_dir), one worker, no access or store log,
    CONNECT to any port, persistent connections both ways."""
    return (
        "http_port %s:%d\n"
        "workers 1\n"
        "cache deny all\n"
        "cache_mem 0 MB\n"
        "access_log none\n"
        "cache_store_log none\n"
        "cache_log %s/cache.log\n"
        "debug_options ALL,0\n"
        "logfile_rotate 0\n"
        "pid_filename %s/squid.pid\n"
        "coredump_dir %s\n"
        "netdb_filename none\n"
        "max_filedescriptors %d\n"
        "http_access allow all\n"
        "client_persistent_connections on\n"
        "server_persistent_connections on\n"
        "forwarded_for delete\n"
        "via off\n"
        "shutdown_lifetime 0 seconds\n"
        "dns_nameservers 127.0.0.1\n"
        % (PROXY_IP, PROXY_HTTP_PORT, rundir, rundir, rundir, nofile)
    )


def render_tinyproxy(rundir, maxclients=10000):
    """tinyproxy, in the foreground (-d): no log but critical errors, to a
    file; no Via header; CONNECT to any port (no ConnectPort line)."""
    return (
        "User nobody\n"
        "Group nogroup\n"
        "Port %d\n"
        "Listen %s\n"
        "Timeout 600\n"
        "MaxClients %d\n"
        "LogFile \"%s/tinyproxy.log\"\n"
        "LogLevel Critical\n"
        "PidFile \"%s/tinyproxy.pid\"\n"
        "DisableViaHeader Yes\n"
        % (PROXY_HTTP_PORT, PROXY_IP, maxclients, rundir, rundir)
    )


def render_trafficserver(rundir):
    """Apache Traffic Server's records.config: a forward proxy (no remap
    required, reverse proxy off), the HTTP cache off and no RAM cache, one
    event thread, logging off, CONNECT to any port."""
    recs = [
        ("proxy.config.admin.user_id", "STRING", "trafficserver"),
        ("proxy.config.http.server_ports", "STRING", "%d:ip-in=%s" % (PROXY_HTTP_PORT, PROXY_IP)),
        ("proxy.config.url_remap.remap_required", "INT", "0"),
        ("proxy.config.reverse_proxy.enabled", "INT", "0"),
        ("proxy.config.http.cache.http", "INT", "0"),
        ("proxy.config.cache.ram_cache.size", "INT", "0"),
        ("proxy.config.exec_thread.autoconfig.enabled", "INT", "0"),
        ("proxy.config.exec_thread.autoconfig", "INT", "0"),
        ("proxy.config.exec_thread.limit", "INT", "1"),
        ("proxy.config.accept_threads", "INT", "0"),
        ("proxy.config.log.logging_enabled", "INT", "0"),
        ("proxy.config.log.logfile_dir", "STRING", rundir),
        ("proxy.config.diags.debug.enabled", "INT", "0"),
        ("proxy.config.http.connect_ports", "STRING", "1-65535"),
        ("proxy.config.http.insert_request_via_str", "INT", "0"),
        ("proxy.config.http.insert_response_via_str", "INT", "0"),
        ("proxy.config.http.keep_alive_no_activity_timeout_in", "INT", "300"),
        ("proxy.config.http.keep_alive_no_activity_timeout_out", "INT", "300"),
        ("proxy.config.net.connections_throttle", "INT", "30000"),
        ("proxy.config.http.server_session_sharing.match", "STRING", "ip"),
    ]
    return "".join("CONFIG %s %s %s\n" % r for r in recs)


def render_ats_runroot(etc, var, run, log, cache):
    """traffic_server --run-root: the packaged binaries, our directories."""
    return (
        "prefix: /usr\nexec_prefix: /usr\nbindir: /usr/bin\nsbindir: /usr/sbin\n"
        "datadir: /usr/share/trafficserver\nincludedir: /usr/include\n"
        "libdir: /usr/lib/trafficserver\nlibexecdir: /usr/lib/trafficserver/modules\n"
        "sysconfdir: %s\nlocalstatedir: %s\nruntimedir: %s\nlogdir: %s\ncachedir: %s\n"
        % (etc, var, run, log, cache)
    )


def render_siegerc(proxy=None):
    """siege's resource file: kept-alive connections, no delay, no log,
    the forward proxy (host, port) if any."""
    lines = ["connection = keep-alive", "protocol = HTTP/1.1", "logging = false",
             "show-logfile = false", "delay = 0", "failures = 1000000",
             "timeout = 30", "parser = false", "verbose = false", "quiet = true",
             "accept-encoding = identity", "limit = 1000"]
    if proxy:
        lines += ["proxy-host = %s" % proxy[0], "proxy-port = %d" % proxy[1]]
    return "\n".join(lines) + "\n"


# --- wrk -------------------------------------------------------------------

def render_wrk_lua(absolute_url=None, host=None, close=False):
    """A wrk script: optionally an absolute-form request target (to go
    through a forward proxy), optionally `Connection: close`, and a done()
    hook that prints one JSON line the harness parses (parse.parse_wrk)."""
    out = []
    if absolute_url:
        out.append('wrk.path = "%s"' % absolute_url)
    if host:
        out.append('wrk.headers["Host"] = "%s"' % host)
    if close:
        out.append('wrk.headers["Connection"] = "close"')
    out.append(
        "done = function(summary, latency, requests)\n"
        "  local e = summary.errors\n"
        "  io.write(string.format('WRKJSON {\"requests\":%d,\"bytes\":%d,"
        "\"duration_us\":%d,\"connect\":%d,\"read\":%d,\"write\":%d,"
        "\"status\":%d,\"timeout\":%d,\"lat_p50_us\":%d,\"lat_p99_us\":%d}\\n',\n"
        "    summary.requests, summary.bytes, summary.duration,\n"
        "    e.connect, e.read, e.write, e.status, e.timeout,\n"
        "    latency:percentile(50), latency:percentile(99)))\n"
        "end"
    )
    return "\n".join(out) + "\n"
