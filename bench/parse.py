"""Parsers for what the tools and the kernel print.  Pure: text in, dicts out."""

import json
import re


class ParseError(Exception):
    pass


# --- wrk -------------------------------------------------------------------

_WRK_RPS = re.compile(r"^Requests/sec:\s+([0-9.]+)", re.M)
_WRK_NON2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")


def parse_wrk(text):
    """wrk's output with our done() hook (configs.render_wrk_lua).

    Returns requests, bytes, seconds, rps, bytes_per_s, errors (the sum of
    socket errors and bad statuses, with each kind), latency p50/p99 in us.
    """
    m = re.search(r"^WRKJSON (\{.*\})\s*$", text, re.M)
    if not m:
        raise ParseError("no WRKJSON line in wrk output: %r" % text[-300:])
    d = json.loads(m.group(1))
    secs = d["duration_us"] / 1e6
    if secs <= 0:
        raise ParseError("wrk ran for no time")
    kinds = {k: d[k] for k in ("connect", "read", "write", "status", "timeout")}
    return {
        "requests": d["requests"],
        "bytes": d["bytes"],
        "seconds": secs,
        "rps": d["requests"] / secs,
        "bytes_per_s": d["bytes"] / secs,
        "errors": sum(kinds.values()),
        "error_kinds": kinds,
        "lat_p50_us": d["lat_p50_us"],
        "lat_p99_us": d["lat_p99_us"],
    }


# --- iperf3 ----------------------------------------------------------------

def parse_iperf3(text):
    """`iperf3 -J` output: bytes received, seconds, bits/s, retransmits."""
    try:
        d = json.loads(text)
    except ValueError as e:
        raise ParseError("iperf3 output is not JSON: %s" % e)
    if d.get("error"):
        raise ParseError("iperf3: %s" % d["error"])
    end = d.get("end") or {}
    recv = end.get("sum_received")
    sent = end.get("sum_sent") or {}
    if not recv:
        raise ParseError("iperf3 JSON has no end.sum_received")
    secs = recv.get("seconds") or 0
    if secs <= 0:
        raise ParseError("iperf3 ran for no time")
    streams = len(d.get("start", {}).get("connected", [])) or None
    return {
        "bytes": recv["bytes"],
        "seconds": secs,
        "bits_per_s": recv["bytes"] * 8 / secs,
        "bytes_per_s": recv["bytes"] / secs,
        "retransmits": sent.get("retransmits"),
        "streams": streams,
    }


# --- loadgen.py ------------------------------------------------------------

# The percentiles of an open-loop run, in the http-tunnel benchmark's columns.
LATENCY_KEYS = ("p50", "p90", "p99", "p99.9", "p99.99", "max")


def parse_loadgen(text):
    """The last LOADGEN {json} line of bench/loadgen.py."""
    found = re.findall(r"^LOADGEN (\{.*\})\s*$", text, re.M)
    if not found:
        raise ParseError("no LOADGEN line: %r" % text[-300:])
    d = json.loads(found[-1])
    lat = d.pop("latency_us", None)
    if lat:
        # The open-loop mode's histogram (bench/loadgen.rs rate).
        for k in LATENCY_KEYS:
            if k not in lat:
                raise ParseError("loadgen latency without %s" % k)
            d["lat_%s_us" % k] = lat[k]
    buckets = d.pop("latency_buckets_us", None)
    if buckets is not None:
        # [[upper_us, count], ...]: the runs of a cell are pooled from these.
        if not all(isinstance(b, list) and len(b) == 2 for b in buckets):
            raise ParseError("loadgen latency buckets are not [upper, count] pairs")
        d["lat_buckets_us"] = buckets
    if d.get("seconds"):
        d["rps"] = d["requests"] / d["seconds"]
        d["bytes_per_s"] = d["bytes"] / d["seconds"]
    return d


# --- h2load ----------------------------------------------------------------

_H2_FINISHED = re.compile(r"^finished in ([0-9.]+)(ms|s|us),", re.M)
_H2_REQS = re.compile(r"^requests: (\d+) total, (\d+) started, (\d+) done, (\d+) succeeded, "
                      r"(\d+) failed, (\d+) errored, (\d+) timeout", re.M)
_H2_CODES = re.compile(r"^status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", re.M)
_H2_TRAFFIC = re.compile(r"^traffic: \S+ \((\d+)\) total", re.M)


def parse_h2load(text):
    """h2load's summary: requests that succeeded, bytes on the wire (heads
    included), seconds, rps, bytes_per_s; errors = failed + errored +
    timeout + non-2xx."""
    f = _H2_FINISHED.search(text)
    r = _H2_REQS.search(text)
    c = _H2_CODES.search(text)
    b = _H2_TRAFFIC.search(text)
    if not (f and r and c and b):
        raise ParseError("no h2load summary: %r" % text[-300:])
    secs = float(f.group(1)) / {"s": 1, "ms": 1e3, "us": 1e6}[f.group(2)]
    if secs <= 0:
        raise ParseError("h2load ran for no time")
    total, started, done, ok, failed, errored, timeout = (int(x) for x in r.groups())
    codes = dict(zip(("2xx", "3xx", "4xx", "5xx"), (int(x) for x in c.groups())))
    return {
        "requests": ok,
        "bytes": int(b.group(1)),
        "seconds": secs,
        "rps": ok / secs,
        "bytes_per_s": int(b.group(1)) / secs,
        "errors": failed + errored + timeout + codes["3xx"] + codes["4xx"] + codes["5xx"],
        "status_codes": codes,
    }


# --- siege -----------------------------------------------------------------

def parse_siege(text):
    """`siege -j`: its JSON summary (data_transferred in MiB, bodies only)."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end < start:
        raise ParseError("no siege JSON summary: %r" % text[-300:])
    try:
        d = json.loads(text[start:end + 1])
    except ValueError as e:
        raise ParseError("siege summary is not JSON: %s" % e)
    secs = d.get("elapsed_time") or 0
    if secs <= 0:
        raise ParseError("siege ran for no time")
    ok = int(d.get("successful_transactions", d["transactions"]))
    nbytes = int(round(d["data_transferred"] * 1024 * 1024))
    return {
        "requests": ok,
        "bytes": nbytes,
        "seconds": secs,
        "rps": ok / secs,
        "bytes_per_s": nbytes / secs,
        "errors": int(d.get("failed_transactions", 0)),
        "availability": d.get("availability"),
        "lat_mean_us": d.get("response_time", 0) * 1e6,
        "lat_max_us": d.get("longest_transaction", 0) * 1e6,
    }


# --- openssl s_client -brief ---------------------------------------------------

_TLS_FIELDS = {"Protocol version": "protocol", "Ciphersuite": "cipher",
               "Server Temp Key": "kx", "Peer Temp Key": "kx", "Signature type": "sig"}


def parse_tls_probe(text):
    """What `openssl s_client -brief` says was negotiated: protocol,
    cipher, key exchange (kx), signature type (sig)."""
    out = {}
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() in _TLS_FIELDS:
            out[_TLS_FIELDS[name.strip()]] = value.strip()
    if "protocol" not in out or "cipher" not in out:
        raise ParseError("no TLS handshake in s_client output: %r" % text[-300:])
    return out


# (the rate is "inf" when the user time rounds to 0.00 s)
_STIME = re.compile(r"^(\d+) connections in [0-9.]+s; \S+ connections/user sec, "
                    r"bytes read (\d+)", re.M)


def parse_stime(text):
    """`openssl s_time`'s first summary line: connections made (each one
    request) and the bytes read in all of them."""
    m = _STIME.search(text)
    if not m:
        raise ParseError("no s_time summary: %r" % text[-300:])
    return {"requests": int(m.group(1)), "bytes": int(m.group(2))}


def parse_tls_resume(text):
    """loadgen.py resume's TLSPROBE line: protocol, cipher, resumed."""
    m = re.search(r"^TLSPROBE (\{.*\})\s*$", text, re.M)
    if not m:
        raise ParseError("no TLSPROBE line: %r" % text[-300:])
    return json.loads(m.group(1))


# --- /proc -----------------------------------------------------------------

# Field order of a cpuN line in /proc/stat (proc(5)).
STAT_FIELDS = ("user", "nice", "system", "idle", "iowait", "irq", "softirq",
               "steal", "guest", "guest_nice")


def parse_proc_stat(text):
    """/proc/stat -> {cpu index: {field: ticks}} (the aggregate line is 'all')."""
    out = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        parts = line.split()
        name = parts[0][3:]
        key = "all" if name == "" else int(name)
        vals = [int(x) for x in parts[1:]]
        out[key] = dict(zip(STAT_FIELDS, vals + [0] * (len(STAT_FIELDS) - len(vals))))
    if not out:
        raise ParseError("no cpu lines in /proc/stat")
    return out


def listening_ports(text):
    """/proc/net/tcp or tcp6 -> set of ports in state LISTEN (0A)."""
    ports = set()
    for line in text.splitlines()[1:]:
        parts = line.split()
        if len(parts) < 4:
            continue
        if parts[3] == "0A":
            ports.add(int(parts[1].rsplit(":", 1)[1], 16))
    return ports


def parse_pid_stat(text):
    """/proc/PID/stat -> pid, comm, ppid, flags, utime, stime, cutime, cstime
    (ticks).  comm may hold spaces and parentheses, so split at the last ')'."""
    lpar = text.index("(")
    rpar = text.rindex(")")
    pid = int(text[:lpar])
    comm = text[lpar + 1:rpar]
    rest = text[rpar + 2:].split()
    # rest[0] is field 3 (state); field n is rest[n - 3].
    return {
        "pid": pid,
        "comm": comm,
        "ppid": int(rest[1]),
        "flags": int(rest[6]),
        "utime": int(rest[11]),
        "stime": int(rest[12]),
        "cutime": int(rest[13]),
        "cstime": int(rest[14]),
        "starttime": int(rest[19]),
    }


PF_KTHREAD = 0x00200000


def parse_status_kb(text, key):
    """A 'Key:   N kB' field of /proc/PID/status, in kB (None if absent)."""
    m = re.search(r"^%s:\s+(\d+)\s+kB" % re.escape(key), text, re.M)
    return int(m.group(1)) if m else None


def parse_softnet(text):
    """/proc/net/softnet_stat -> per-CPU {processed, received_rps}.

    Rows are CPUs (in order, for online CPUs); column 0 is packets
    processed, column 9 is received_rps (RPS IPIs received)."""
    out = []
    for line in text.splitlines():
        cols = [int(x, 16) for x in line.split()]
        if not cols:
            continue
        out.append({"processed": cols[0],
                    "received_rps": cols[9] if len(cols) > 9 else 0})
    return out
