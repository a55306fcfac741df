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
FILES = {"1k.bin": 1024, "50k.bin": 50 * 1024, "1m.bin": 1024 * 1024}

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
        "maxconn 5000",
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
