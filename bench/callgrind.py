#!/usr/bin/env python3
"""Instructions per request of the proxy, counted by callgrind.

Wall-clock benchmarks on a shared 2-CPU machine are noisy; an instruction
count is not.  This starts the proxy (the bench's `http` cfg: one `proxy`
service, no log) under `valgrind --tool=callgrind` on loopback, with a
small Python origin answering 1 KB, and drives it with a Python client:

  warm-up   100 kept-alive requests and 50 new connections (not counted)
  ka        N kept-alive requests on one connection (http-ka-1k's path)
  close     M requests, a new connection each, `Connection: close`
            (http-close-1k's path)

Counters are zeroed after the warm-up and dumped after each phase
(`callgrind_control`), so each figure is what the proxy executed for that
phase alone: every thread, the kernel not counted.  Prints Ir per request
per phase and for the two together; with several binaries, each one's
figures and the change against the first.

  python3 bench/callgrind.py --binary OLD/3proxy --binary NEW/3proxy
  python3 bench/callgrind.py --binary target/release/3proxy --keep DIR
      (keep the callgrind files: callgrind_annotate DIR/close.*)
  python3 bench/callgrind.py --radius
      (each binary also with `radius SECRET 127.0.0.1:PORT` and `log
      radius` added, against a FreeRADIUS this starts on loopback: one
      Accounting-Request Start and one Stop per HTTP request, sent by the
      proxy's sender threads, which callgrind counts too; prints the
      change against the same binary without)

  python3 bench/callgrind.py --service tcppm   (or socks)
      (tcp-1k's or socks-1k's path instead: the bench's tcppm or socks
      cfg, one phase "new" of --close requests, each on a new connection,
      through the mapping or a SOCKS5 session sent as loadgen sends it)

  python3 bench/callgrind.py --auth strong --auth ldap
      (the http service behind a login, each request with a
      Proxy-Authorization header: `authcache user,password 3600` and
      `auth cache strong` with a `users` line, or `auth cache ldap` with
      LdapPlugin's lines pointing at a slapd this starts on loopback, as
      tests/ldap.rs does; warmed up with other users, then a phase "miss"
      of --misses logins of users not yet cached (each an LDAP bind and
      search, or a `users` lookup), then ka and close as one user the
      cache holds; prints Ir per request per phase, a miss's cost over a
      cached request, and each binary's ldap / strong ratio)

Needs valgrind (Debian `valgrind`), for --radius FreeRADIUS (Debian
`freeradius`, run in the foreground as whoever runs this), and for
--auth ldap slapd and ldapadd (Debian `slapd`, `ldap-utils`).  Takes about a
minute per binary with the defaults.
"""

import argparse
import base64
import glob
import re
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

BODY = b"x" * 1024


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


class Origin:
    """HTTP/1.1 origin on loopback: every request gets 200 and 1 KB, on a
    kept-alive connection unless the request asks to close."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(256)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    def _serve(self, c):
        buf = b""
        with c:
            while True:
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    try:
                        chunk = c.recv(65536)
                    except OSError:
                        return
                    if not chunk:
                        return
                    buf += chunk
                    continue
                head, buf = buf[:end].lower(), buf[end + 4:]
                close = b"connection: close" in head
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n"
                          % (len(BODY), b"Connection: close\r\n" if close else b"")
                          + BODY)
                if close:
                    return


def read_response(s, buf):
    """Read one response (head with Content-Length, then the body) from s;
    returns what was read past it."""
    while True:
        end = buf.find(b"\r\n\r\n")
        if end >= 0:
            break
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("the proxy closed before a response head")
        buf += chunk
    head = buf[:end].decode("latin-1").split("\r\n")
    if head[0].split()[1] != "200":
        raise RuntimeError("the proxy answered %r" % head[0])
    length = None
    for line in head[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    if length is None:
        raise RuntimeError("no Content-Length in %r" % head)
    need = end + 4 + length
    while len(buf) < need:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError("the proxy closed inside a body")
        buf += chunk
    if buf[end + 4:need] != BODY:
        raise RuntimeError("the body differs from the origin's")
    return buf[need:]


def connect(port):
    deadline = time.monotonic() + 60
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=60)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def kept_alive(port, target, n, header=""):
    req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s\r\n" % (target, header)).encode()
    s = connect(port)
    buf = b""
    for _ in range(n):
        s.sendall(req)
        buf = read_response(s, buf)
    s.close()


def new_connections(port, target, n, header=""):
    through(lambda: connect(port), n, target, header)


def socks5_open(port, origin_port):
    """A SOCKS5 session to 127.0.0.1:origin_port through the proxy on
    port, as loadgen does it: the greeting (no authentication), its answer,
    the CONNECT request, its reply; the connected socket."""
    s = connect(port)
    try:
        s.sendall(b"\x05\x01\x00")
        if recv_exactly(s, 2) != b"\x05\x00":
            raise RuntimeError("SOCKS5 method refused")
        s.sendall(b"\x05\x01\x00\x01\x7f\x00\x00\x01" + origin_port.to_bytes(2, "big"))
        reply = recv_exactly(s, 10)
        if reply[:4] != b"\x05\x00\x00\x01":
            raise RuntimeError("SOCKS5 CONNECT failed: %r" % reply)
    except BaseException:
        s.close()
        raise
    return s


def recv_exactly(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("the proxy closed after %d of %d bytes" % (len(buf), n))
        buf += chunk
    return buf


def through(opener, n, target="/1k.bin", header=""):
    """n requests, each on a connection opener() returns (the proxy, a
    tcppm mapping or a SOCKS5 session to the origin): GET TARGET with
    `Connection: close`, the response, then the close (http-close-1k's,
    tcp-1k's and socks-1k's path); header (whole lines, each ending in
    CRLF) goes into each request."""
    req = ("GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%sConnection: close\r\n\r\n"
           % (target, header)).encode()
    for _ in range(n):
        s = opener()
        s.sendall(req)
        rest = read_response(s, b"")
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            rest += chunk
        if rest:
            raise RuntimeError("bytes after the response: %r" % rest[:80])
        s.close()


# What each --service measures: the cfg's service line (port, origin
# port) and the phases, each (name, driver(port, origin_port, n), which
# count: "ka" or "close").
def phases(service):
    if service == "http":
        def ka(port, oport, n):
            kept_alive(port, "http://127.0.0.1:%d/1k.bin" % oport, n)

        def close(port, oport, n):
            new_connections(port, "http://127.0.0.1:%d/1k.bin" % oport, n)
        return (("ka", ka, "ka"), ("close", close, "close"))
    if service == "tcppm":
        def new(port, oport, n):
            through(lambda: connect(port), n)
    elif service == "socks":
        def new(port, oport, n):
            through(lambda: socks5_open(port, oport), n)
    else:
        raise ValueError("unknown service %r" % service)
    return (("new", new, "close"),)


def service_line(service, port, origin_port):
    """The bench's service line (bench/configs.py) on 127.0.0.1:port."""
    if service == "http":
        return "proxy -i127.0.0.1 -p%d\n" % port
    if service == "tcppm":
        return "tcppm -i127.0.0.1 %d 127.0.0.1 %d\n" % (port, origin_port)
    if service == "socks":
        return "socks -i127.0.0.1 -p%d\n" % port
    raise ValueError("unknown service %r" % service)


def totals(path):
    """Ir of a callgrind output file (its `totals:` or `summary:` line)."""
    with open(path) as f:
        for line in f:
            if line.startswith(("totals:", "summary:")):
                return int(line.split()[1])
    raise RuntimeError("no totals in %s" % path)


def control(pid, *args):
    subprocess.run(["callgrind_control", *args, str(pid)], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def dump(pid, outdir, name):
    """Dump the counts since the last dump or zeroing; the file's path."""
    before = set(glob.glob(os.path.join(outdir, "cg.out.*")))
    control(pid, "--dump=" + name)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        new = set(glob.glob(os.path.join(outdir, "cg.out.*"))) - before
        if new:
            path = new.pop()
            time.sleep(0.5)  # let it finish writing
            dest = os.path.join(outdir, name + ".cg")
            os.rename(path, dest)
            return dest
        time.sleep(0.1)
    raise RuntimeError("callgrind wrote no dump")


SECRET = "testing123"


def proxy_cfg(port, radius=None, service="http", origin_port=0, auth=""):
    """The bench's cfg for service (no log) on 127.0.0.1:port; with radius
    (the `radius` line's server, "127.0.0.1:AUTHPORT"), accounting to it by
    `log radius` (to AUTHPORT + 1, 3proxy's rule); auth (auth_lines())
    goes before the service line."""
    cfg = "timeouts 1 5 30 60 180 1800 15 60\nmaxconn 25000\n"
    if radius:
        cfg += "radius %s %s\nlog radius\n" % (SECRET, radius)
    return cfg + auth + service_line(service, port, origin_port)


# --auth: the directory's names, and the users each run logs in as.
SUFFIX = "dc=test"
PEOPLE = "ou=people," + SUFFIX
ADMIN = "cn=admin," + SUFFIX
ADMIN_PW = "adminpw"
GROUP = "internet"
CACHE_TIME = 3600  # longer than any run: a cached login stays cached


def users(misses):
    """(name, password) of the users a run logs in as: three warm-up users
    (warm1 does the warm-up's requests), then `misses` users, each logged
    in once, not yet cached; the first of them (u001) then does the
    measured ka and close requests from the cache."""
    warm = [("warm%d" % i, "warmpw%d" % i) for i in (1, 2, 3)]
    return warm + [("u%03d" % i, "pw%03d" % i) for i in range(1, misses + 1)]


def login_header(name, password):
    """The Proxy-Authorization line (with its CRLF) for a Basic login."""
    token = base64.b64encode(("%s:%s" % (name, password)).encode()).decode()
    return "Proxy-Authorization: Basic %s\r\n" % token


def auth_lines(auth, logins, ldap_server=None):
    """The cfg's lines for --auth: `authcache user,password`, then `auth
    cache strong` with a `users` line per login (CL: cleartext), or
    LdapPlugin's plugin line, its settings pointing at ldap_server
    ("127.0.0.1:PORT", the directory of ldif()) and `auth cache ldap`;
    then `allow *` (the same ACL for both)."""
    lines = ["authcache user,password %d" % CACHE_TIME]
    if auth == "strong":
        lines += ["users %s:CL:%s" % u for u in logins]
        lines.append("auth cache strong")
    elif auth == "ldap":
        if not ldap_server:
            raise ValueError("auth ldap needs a server")
        lines += ["plugin LdapPlugin.ld.so start",
                  "ldapconnect %s %s %s" % (ldap_server, ADMIN, ADMIN_PW),
                  "ldapattr uid ou 0",
                  "ldapuserenv " + PEOPLE,
                  "ldapsbase " + SUFFIX,
                  "ldapaccess " + GROUP,
                  "auth cache ldap"]
    else:
        raise ValueError("unknown auth %r" % auth)
    lines.append("allow *")
    return "".join(l + "\n" for l in lines)


def ldif(logins):
    """The directory's entries: the suffix, ou=people, and each login as
    an inetOrgPerson in the ldapaccess group (`ou: internet`)."""
    out = ["dn: %s\nobjectClass: dcObject\nobjectClass: organization\n"
           "o: test\ndc: test\n" % SUFFIX,
           "dn: %s\nobjectClass: organizationalUnit\nou: people\n" % PEOPLE]
    for name, password in logins:
        out.append("dn: uid=%s,%s\nobjectClass: inetOrgPerson\nuid: %s\ncn: %s\n"
                   "sn: %s\nou: %s\nuserPassword: %s\n"
                   % (name, PEOPLE, name, name, name, GROUP, password))
    return "\n".join(out)


def slapd_conf(d):
    """A slapd.conf with its pid file and mdb database in d (tests/ldap.rs's)."""
    return """include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile {d}/slapd.pid
database mdb
suffix "{suffix}"
rootdn "{admin}"
rootpw {pw}
directory {d}/db
maxsize 10485760
""".format(d=d, suffix=SUFFIX, admin=ADMIN, pw=ADMIN_PW)


def count_binds(log):
    """Simple binds in slapd's stats log (`-d 256`), by who: {"user": n
    (DNs under ou=people), "admin": m (the ldapconnect DN)}."""
    counts = {"user": 0, "admin": 0}
    for dn in re.findall(r' BIND dn="([^"]*)" method=128', log):
        if dn == ADMIN:
            counts["admin"] += 1
        elif dn.endswith("," + PEOPLE):
            counts["user"] += 1
    return counts


def sbin(name):
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin") or name


class _LoopbackServer:
    """A server process of the measurement on 127.0.0.1 (`port`), writing
    its log to `log`."""

    def server(self):
        return "127.0.0.1:%d" % self.port

    def output(self):
        with open(self.log, errors="replace") as f:
            return f.read()


class Slapd(_LoopbackServer):
    """OpenLDAP's slapd in the foreground (`-d 256`, its stats log into
    slapd.log) on a loopback port, with slapd_conf in d and ldif(logins)
    loaded by ldapadd.  stop() ends it."""

    def __init__(self, d, logins):
        os.makedirs(os.path.join(d, "db"), exist_ok=True)
        with open(os.path.join(d, "slapd.conf"), "w") as f:
            f.write(slapd_conf(d))
        with open(os.path.join(d, "users.ldif"), "w") as f:
            f.write(ldif(logins))
        self.port = free_port()
        self.log = os.path.join(d, "slapd.log")
        self.proc = subprocess.Popen(
            [sbin("slapd"), "-f", os.path.join(d, "slapd.conf"),
             "-h", "ldap://127.0.0.1:%d/" % self.port, "-d", "256"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=open(self.log, "w"))
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=5).close()
                    break
                except OSError:
                    if self.proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("slapd did not listen:\n" + self.output())
                    time.sleep(0.1)
            out = subprocess.run(
                ["ldapadd", "-x", "-H", "ldap://127.0.0.1:%d" % self.port,
                 "-D", ADMIN, "-w", ADMIN_PW, "-f", os.path.join(d, "users.ldif")],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if out.returncode != 0:
                raise RuntimeError("ldapadd: " + out.stdout.decode(errors="replace"))
        except BaseException:
            self.stop()
            raise

    def binds(self):
        return count_binds(self.output())

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def raddb_conf(d, acct_port, listen="127.0.0.1", clients="127.0.0.0/8", detail=True):
    """A radiusd.conf for FreeRADIUS 3 in the foreground with its files in
    d: accounting only, on listen:acct_port, from any client in `clients`
    with SECRET, each request written to d/detail (and answered); without
    detail, each request only answered (bench.py's 3proxy-radius, whose
    millions of records would fill the tmpfs)."""
    return """prefix = /usr
exec_prefix = /usr
sysconfdir = /etc
localstatedir = /var
sbindir = /usr/sbin
logdir = {d}/log
raddbdir = {d}
radacctdir = {d}/log
name = freeradius
confdir = {d}
modconfdir = /etc/freeradius/3.0/mods-config
run_dir = {d}/run
db_dir = {d}
libdir = /usr/lib/freeradius
pidfile = {d}/run/radiusd.pid
max_request_time = 30
cleanup_delay = 5
max_requests = 16384
hostname_lookups = no
log {{
	destination = stdout
	colourise = no
}}
security {{
	allow_core_dumps = no
	max_attributes = 200
	reject_delay = 0
	status_server = no
}}
thread pool {{
	start_servers = 2
	max_servers = 4
	min_spare_servers = 1
	max_spare_servers = 4
	max_requests_per_server = 0
}}
client loopback {{
	ipaddr = {clients}
	secret = {secret}
}}
modules {{
	detail {{
		filename = {d}/detail
		permissions = 0600
	}}
	always ok {{
		rcode = ok
	}}
}}
server default {{
	listen {{
		type = acct
		ipaddr = {listen}
		port = {acct}
	}}
	preacct {{
	}}
	accounting {{
		{record}
	}}
}}
""".format(d=d, secret=SECRET, acct=acct_port, listen=listen, clients=clients,
           record="detail" if detail else "ok")


def count_records(detail):
    """Accounting records in a detail file's text, by Acct-Status-Type:
    {"Start": n, "Stop": m, ...}."""
    counts = {}
    for status in re.findall(r"^\s*Acct-Status-Type = (\S+)\s*$", detail, re.M):
        counts[status] = counts.get(status, 0) + 1
    return counts


def free_udp_pair():
    """A UDP port on 127.0.0.1 whose next port is free too: the `radius`
    line's (authentication) port; accounting goes to the next one."""
    for _ in range(100):
        a = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        a.bind(("127.0.0.1", 0))
        port = a.getsockname()[1]
        b = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            b.bind(("127.0.0.1", port + 1))
        except OSError:
            continue
        finally:
            a.close()
            b.close()
        if port + 1 < 65536:
            return port
    raise RuntimeError("no two free UDP ports in a row")


class Radiusd(_LoopbackServer):
    """FreeRADIUS in the foreground (`-f -l stdout`) with raddb_conf in
    its own directory: answers accounting on `port + 1`.  stop() ends it."""

    def __init__(self, d):
        self.dir = d
        for sub in ("log", "run"):
            os.makedirs(os.path.join(d, sub), exist_ok=True)
        self.port = free_udp_pair()
        with open(os.path.join(d, "dictionary"), "w") as f:
            f.write("$INCLUDE /usr/share/freeradius/dictionary\n")
        with open(os.path.join(d, "radiusd.conf"), "w") as f:
            f.write(raddb_conf(d, self.port + 1))
        self.log = os.path.join(d, "radiusd.log")
        self.proc = subprocess.Popen(
            ["freeradius", "-f", "-l", "stdout", "-d", d],
            stdin=subprocess.DEVNULL, stdout=open(self.log, "w"),
            stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while "Ready to process requests" not in self.output():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("freeradius did not start:\n" + self.output())
            time.sleep(0.1)

    def records(self):
        try:
            with open(os.path.join(self.dir, "detail"), errors="replace") as f:
                return count_records(f.read())
        except FileNotFoundError:
            return {}

    def settle(self, quiet=1.5, bound=60):
        """Wait until no record has come for `quiet` seconds (the proxy's
        senders have sent what they had); the counts."""
        last, since = self.records(), time.monotonic()
        deadline = since + bound
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = self.records()
            if now != last:
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
        return last

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def measure(binary, ka, close, keep=None, radius=False, service="http",
            auth=None, misses=20):
    """Ir of each phase of service: {"ka": (Ir, requests), "close": (Ir,
    requests)} for http, {"new": (Ir, requests)} for tcppm and socks; with
    radius, also "records": the accounting records FreeRADIUS got per
    phase ({"ka": {"Start": n, "Stop": m}, ...}).  With auth ("strong" or
    "ldap", http only), every request logs in (users()): first a phase
    "miss" of `misses` new connections, each a user the cache does not
    hold yet, then ka and close as u001, whom the cache holds; also
    "binds": the binds slapd got per phase ({"miss": {"user": n, "admin":
    m}, ...}, empty for strong)."""
    if auth and service != "http":
        raise ValueError("--auth measures the http service only")
    origin = Origin()
    port = free_port()
    steps = phases(service)
    outdir = keep or tempfile.mkdtemp(prefix="tp-callgrind-")
    os.makedirs(outdir, exist_ok=True)
    logins = users(misses) if auth else []
    rad = Radiusd(os.path.join(outdir, "raddb")) if radius else None
    try:
        ldap = Slapd(os.path.join(outdir, "slapd"), logins) if auth == "ldap" else None
    except BaseException:
        if rad:
            rad.stop()
        raise
    cfg = os.path.join(outdir, "3proxy.cfg")
    with open(cfg, "w") as f:
        f.write(proxy_cfg(port, rad.server() if rad else None, service, origin.port,
                          auth_lines(auth, logins, ldap and ldap.server())
                          if auth else ""))
    target = "http://127.0.0.1:%d/1k.bin" % origin.port

    def stop_servers():
        if rad:
            rad.stop()
        if ldap:
            ldap.stop()
    try:
        proc = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--vgdb=yes",
             # Each dump names its functions itself (callgrind_annotate reads
             # one dump alone).
             "--compress-strings=no", "--compress-pos=no",
             "--callgrind-out-file=" + os.path.join(outdir, "cg.out.%p"),
             binary, cfg],
            stdout=subprocess.DEVNULL, stderr=open(os.path.join(outdir, "valgrind.log"), "w"))
    except OSError:
        stop_servers()
        raise
    try:
        if auth:
            # Three users' first logins (the miss path), then warm1's
            # requests from the cache.
            for u in logins[:3]:
                new_connections(port, target, 1, login_header(*u))
            kept_alive(port, target, 100, login_header(*logins[0]))
            new_connections(port, target, 50, login_header(*logins[0]))
        else:
            for _, run, count in steps:
                run(port, origin.port, 100 if count == "ka" else 50)
        time.sleep(1)
        seen = rad.settle() if rad else {}
        binds_seen = ldap.binds() if ldap else {}
        control(proc.pid, "--zero")
        figures = {}
        records = {}
        binds = {}
        if auth:
            cached = login_header(*logins[3])
            steps = (
                ("miss", misses, lambda n: [new_connections(port, target, 1, login_header(*u))
                                            for u in logins[3:3 + n]]),
                ("ka", ka, lambda n: kept_alive(port, target, n, cached)),
                ("close", close, lambda n: new_connections(port, target, n, cached)))
        else:
            steps = tuple((name, ka if count == "ka" else close,
                           (lambda run: lambda n: run(port, origin.port, n))(run))
                          for name, run, count in steps)
        for name, n, run in steps:
            run(n)
            time.sleep(1)  # the last session's thread finishes
            if rad:
                # and the senders have sent its Stop
                now = rad.settle()
                records[name] = {k: now.get(k, 0) - seen.get(k, 0) for k in now}
                seen = now
            if ldap:
                now = ldap.binds()
                binds[name] = {k: now[k] - binds_seen.get(k, 0) for k in now}
                binds_seen = now
            figures[name] = (totals(dump(proc.pid, outdir, name)), n)
        if rad:
            figures["records"] = records
        if auth:
            figures["binds"] = binds
        return figures
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        origin.sock.close()
        stop_servers()
        if not keep:
            shutil.rmtree(outdir, ignore_errors=True)


def per_request(f):
    """Ir per request of measure()'s figures: (ka, close, both) for http,
    (new,) for tcppm and socks; with --auth's "miss" phase, also the Ir of
    one uncached login's request (miss) and what it costs over a cached
    one on a new connection (miss - close)."""
    if "new" in f:
        return (f["new"][0] / f["new"][1],)
    ka = f["ka"][0] / f["ka"][1]
    cl = f["close"][0] / f["close"][1]
    both = (f["ka"][0] + f["close"][0]) / (f["ka"][1] + f["close"][1])
    if "miss" in f:
        miss = f["miss"][0] / f["miss"][1]
        return ka, cl, both, miss, miss - cl
    return ka, cl, both


AUTH_TARGET = 1.5  # issue 33: ldap+cache <= 1.5x strong+cache, per request


def ratio_line(label, ldap, strong, target=AUTH_TARGET):
    """The ldap / strong line of a binary's two per_request() rows (ka,
    close, both, miss, miss - close): the ratio per cached phase and both,
    against the target on both, and the two uncached logins' costs."""
    r = [x / y for x, y in zip(ldap[:3], strong[:3])]
    return ("%s: ldap+cache / strong+cache per request: ka %.2fx, close %.2fx, "
            "both %.2fx (target <= %.1fx: %s); an uncached login costs "
            "%.0f Ir more than a cached request with ldap, %.0f with strong"
            % (label, r[0], r[1], r[2], target, "met" if r[2] <= target else "missed",
               ldap[4], strong[4]))


def change(row, base):
    """The row's change against base, in %, as printed."""
    return "(" + " ".join("%+.1f%%" % (100.0 * (x / y - 1))
                          for x, y in zip(row, base)) + ")"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", action="append",
                    help="a 3proxy binary (repeatable; default target/release/3proxy)")
    ap.add_argument("--ka", type=int, default=4000, help="kept-alive requests (4000)")
    ap.add_argument("--close", type=int, default=1000,
                    help="requests on new connections (1000)")
    ap.add_argument("--keep", help="keep the callgrind files in this directory "
                    "(one subdirectory per binary, N-radius with --radius)")
    ap.add_argument("--radius", action="store_true",
                    help="also measure each binary with `log radius` to a "
                    "FreeRADIUS started on loopback; its change is against the "
                    "same binary without")
    ap.add_argument("--service", choices=("http", "tcppm", "socks"), default="http",
                    help="http (default): the proxy service, kept-alive and new "
                    "connections; tcppm: a TCP mapping to the origin, socks: a "
                    "SOCKS5 CONNECT (greeting, then the request) to it, each a new "
                    "connection per 1 KB request (tcp-1k's and socks-1k's path; "
                    "--close of them)")
    ap.add_argument("--auth", action="append", choices=("strong", "ldap"),
                    help="measure the http service behind a login instead: "
                    "`authcache user,password` with `auth cache strong` (a users "
                    "line) or `auth cache ldap` (LdapPlugin against a slapd started "
                    "on loopback); repeatable, --auth strong --auth ldap prints "
                    "their ratio (issue 33's target)")
    ap.add_argument("--misses", type=int, default=20,
                    help="with --auth, logins of users not yet cached, each on a "
                    "new connection, before the ka and close phases (20)")
    a = ap.parse_args()
    binaries = a.binary or ["target/release/3proxy"]
    if not shutil.which("valgrind"):
        sys.exit("callgrind.py: valgrind is not installed (apt-get install valgrind)")
    if a.radius and not shutil.which("freeradius"):
        sys.exit("callgrind.py: freeradius is not installed (apt-get install freeradius)")
    if a.auth:
        if a.radius or a.service != "http":
            sys.exit("callgrind.py: --auth measures the http service alone "
                     "(no --radius, no --service)")
        if "ldap" in a.auth and not (shutil.which(sbin("slapd")) and shutil.which("ldapadd")):
            sys.exit("callgrind.py: slapd or ldapadd is not installed "
                     "(apt-get install slapd ldap-utils)")
        if a.misses < 1:
            sys.exit("callgrind.py: --misses must be at least 1")
    rows = []  # (label, (ka, close, both), the row it is compared with)
    notes = []
    if a.auth:
        ratios = []
        modes = list(dict.fromkeys(a.auth))
        first = {}  # auth -> its row of the first binary
        for i, b in enumerate(binaries):
            mine = {}
            for auth in modes:
                keep = os.path.join(a.keep, "%d-%s" % (i, auth)) if a.keep else None
                f = measure(os.path.abspath(b), a.ka, a.close, keep, auth=auth,
                            misses=a.misses)
                mine[auth] = per_request(f)
                rows.append((b + " +auth cache " + auth, mine[auth], first.get(auth)))
                first.setdefault(auth, len(rows) - 1)
                for phase, got in f["binds"].items():
                    notes.append("%s, %s, %s: slapd got %d user binds and %d %s binds "
                                 "for %d requests"
                                 % (b, auth, phase, got["user"], got["admin"], ADMIN,
                                    f[phase][1]))
            if "strong" in mine and "ldap" in mine:
                ratios.append(ratio_line(b, mine["ldap"], mine["strong"]))
        names = ("ka Ir/req", "close Ir/req", "both Ir/req", "miss Ir/req",
                 "miss-close")
        print("%-50s" % "binary" + "".join(" %12s" % n for n in names))
        for label, row, base in rows:
            line = "%-50s" % label + "".join(" %12.0f" % x for x in row)
            if base is not None:
                line += "   " + change(row, rows[base][1])
            print(line)
        for n in ratios + notes:
            print(n)
        return
    for i, b in enumerate(binaries):
        keep = os.path.join(a.keep, str(i)) if a.keep else None
        f = measure(os.path.abspath(b), a.ka, a.close, keep, service=a.service)
        rows.append((b, per_request(f), 0 if i > 0 else None))
        if a.radius:
            keep = os.path.join(a.keep, "%d-radius" % i) if a.keep else None
            f = measure(os.path.abspath(b), a.ka, a.close, keep, radius=True,
                        service=a.service)
            rows.append((b + " +log radius", per_request(f), len(rows) - 1))
            for phase in f["records"]:
                r = f["records"][phase]
                notes.append("%s, %s: FreeRADIUS got %d Start and %d Stop for %d requests"
                             % (b, phase, r.get("Start", 0), r.get("Stop", 0),
                                f[phase][1]))
    if a.service == "http":
        names = ("ka Ir/req", "close Ir/req", "both Ir/req")
    else:
        names = ("%s Ir/req" % a.service,)
    print("%-50s" % "binary" + "".join(" %12s" % n for n in names))
    for label, row, base in rows:
        line = "%-50s" % label + "".join(" %12.0f" % x for x in row)
        if base is not None:
            line += "   " + change(row, rows[base][1])
        print(line)
    for n in notes:
        print(n)


if __name__ == "__main__":
    main()
