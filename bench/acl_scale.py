#!/usr/bin/env python3
"""ACL scale benchmark: proxy CPU per request and start-up time as the
`users` table and the ACL grow (issue 4).  See bench/ACL.md.

For each (users, cidr rules) cell it writes a cfg with

    auth strong
    users u0:p0 ... (N users, 1000 a line)
    allow * 11.x.y.z/30        (M - 1 rules that never match the client)
    allow u0,...,uN-1 127.0.0.1  (the matching rule, last)
    socks -p PORT -i127.0.0.1

starts our release binary on it, and runs SESSIONS sequential SOCKS5
sessions (user/password, CONNECT to a local origin that accepts and
closes), cycling through the users.  The proxy's CPU time (utime + stime
from /proc/PID/stat) over the measured sessions, divided by their number,
is the cost per request; start-up is spawn until the port accepts.

Usage: python3 bench/acl_scale.py [--bin target/release/3proxy]
       [--sessions 20000] [--users 10,1000,100000] [--cidrs 10,10000]
       [--repeat 1] [--json out.json]
No root, no network namespaces, loopback only.
"""

import argparse
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time

CLK_TCK = os.sysconf("SC_CLK_TCK")
LINGER_RST = struct.pack("ii", 1, 0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_cfg(path, port, n_users, n_cidrs, field="src"):
    lines = ["auth strong"]
    names = [f"u{i}" for i in range(n_users)]
    for i in range(0, n_users, 1000):
        lines.append("users " + " ".join(f"{u}:p{u[1:]}" for u in names[i:i + 1000]))
    for i in range(n_cidrs - 1):
        a = 0x0B000000 + i * 4
        cidr = "%d.%d.%d.%d/30" % (a >> 24, (a >> 16) & 255, (a >> 8) & 255, a & 255)
        # `dst`: rules on the destination field, which the ACL index does
        # not file (they are walked): the cost of a walk, for comparison.
        lines.append(f"allow * {cidr}" if field == "src" else f"allow * * {cidr}")
    lines.append("allow " + ",".join(names) + " 127.0.0.1")
    lines.append(f"socks -p{port} -i127.0.0.1")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        rest = f.read().rsplit(")", 1)[1].split()
    # Fields 14 and 15 of stat(5) are the 12th and 13th after the name.
    return int(rest[11]) + int(rest[12])


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


class Origin:
    """Accepts connections and closes them at once.  (Not with a reset: a
    reset origin made the following CONNECTs fail with code 13, see
    ACL.md.)  The TIME_WAIT this leaves on the origin side is reused on
    loopback (net.ipv4.tcp_tw_reuse=2, the default)."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.port = self.sock.getsockname()[1]
        self.stop = False
        threading.Thread(target=self.run, daemon=True).start()

    def run(self):
        while not self.stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            c.close()

    def close(self):
        self.stop = True
        self.sock.close()


def session(port, user, password, origin_port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, LINGER_RST)
    try:
        s.sendall(b"\x05\x01\x02")
        if s.recv(2) != b"\x05\x02":
            raise RuntimeError("no user/password method")
        u, p = user.encode(), password.encode()
        s.sendall(b"\x01" + bytes([len(u)]) + u + bytes([len(p)]) + p)
        if s.recv(2) != b"\x01\x00":
            raise RuntimeError("authentication refused")
        s.sendall(b"\x05\x01\x00\x01" + socket.inet_aton("127.0.0.1") + struct.pack(">H", origin_port))
        reply = b""
        while len(reply) < 10:
            chunk = s.recv(10 - len(reply))
            if not chunk:
                break
            reply += chunk
        if len(reply) < 2 or reply[1] != 0:
            raise RuntimeError(f"CONNECT refused: {reply!r}")
    finally:
        s.close()


def run_cell(binary, n_users, n_cidrs, sessions, origin, field="src"):
    d = tempfile.mkdtemp(prefix="acl_scale_")
    port = free_port()
    cfg = os.path.join(d, "3proxy.cfg")
    write_cfg(cfg, port, n_users, n_cidrs, field)
    cfg_bytes = os.path.getsize(cfg)
    t0 = time.perf_counter()
    proc = subprocess.Popen([binary, cfg], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError("3proxy exited: " + proc.stderr.read().decode(errors="replace"))
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.002)
        startup = time.perf_counter() - t0
        startup_cpu = cpu_ticks(proc.pid) / CLK_TCK
        # Warm up (threads, allocator), then measure.
        for i in range(min(1000, sessions // 10)):
            k = (i * 7919) % n_users
            session(port, f"u{k}", f"p{k}", origin.port)
        c0, w0 = cpu_ticks(proc.pid), time.perf_counter()
        for i in range(sessions):
            k = (i * 7919 + 13) % n_users
            session(port, f"u{k}", f"p{k}", origin.port)
        c1, w1 = cpu_ticks(proc.pid), time.perf_counter()
        return {
            "users": n_users,
            "cidr_rules": n_cidrs,
            "rule_field": field,
            "cfg_bytes": cfg_bytes,
            "sessions": sessions,
            "startup_s": round(startup, 4),
            "startup_cpu_s": round(startup_cpu, 3),
            "rss_kb": rss_kb(proc.pid),
            "cpu_us_per_req": round((c1 - c0) / CLK_TCK / sessions * 1e6, 2),
            "wall_us_per_req": round((w1 - w0) / sessions * 1e6, 1),
        }
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(d, ignore_errors=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="target/release/3proxy")
    ap.add_argument("--sessions", type=int, default=20000)
    ap.add_argument("--users", default="10,1000,100000")
    ap.add_argument("--cidrs", default="10,10000")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--walk", action="store_true",
                    help="also cells whose rules are on the destination field (walked, not indexed)")
    ap.add_argument("--json")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit(f"{a.bin} is missing: cargo build --release")
    # A private copy, so that a rebuild during the run changes nothing.
    binary = os.path.join(tempfile.mkdtemp(prefix="acl_scale_bin_"), "3proxy")
    shutil.copy2(a.bin, binary)
    origin = Origin()
    rows = []
    cells = [(nu, nc, "src") for nc in [int(x) for x in a.cidrs.split(",")]
             for nu in [int(x) for x in a.users.split(",")]]
    if a.walk:
        cells += [(10, nc, "dst") for nc in [int(x) for x in a.cidrs.split(",")]]
    print("users   cidr_rules  field  startup_ms  startup_cpu_ms  rss_kb  cpu_us/req  wall_us/req")
    for rep in range(a.repeat):
        for nu, nc, field in cells:
            r = run_cell(binary, nu, nc, a.sessions, origin, field)
            r["repeat"] = rep
            rows.append(r)
            print("%-7d %-11d %-6s %-11.1f %-15.0f %-7d %-11.2f %.1f" % (
                nu, nc, field, r["startup_s"] * 1000, r["startup_cpu_s"] * 1000,
                r["rss_kb"], r["cpu_us_per_req"], r["wall_us_per_req"]), flush=True)
    if a.repeat > 1:
        print("\nper cell over %d runs: cpu_us/req min / median, startup_ms median" % a.repeat)
        for nu, nc, field in cells:
            rs = [r for r in rows if (r["users"], r["cidr_rules"], r["rule_field"]) == (nu, nc, field)]
            cpu = sorted(r["cpu_us_per_req"] for r in rs)
            st = sorted(r["startup_s"] * 1000 for r in rs)
            print("%-7d %-11d %-6s %7.1f / %7.1f   %7.1f" % (
                nu, nc, field, cpu[0], cpu[len(cpu) // 2], st[len(st) // 2]))
    origin.close()
    shutil.rmtree(os.path.dirname(binary), ignore_errors=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"nproc": os.cpu_count(), "clk_tck": CLK_TCK, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
