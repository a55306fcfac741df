"""Processes: starting them in a namespace on a CPU, stopping them, and
reading their CPU time and memory from /proc."""

import os
import signal
import subprocess
import time

from . import parse
from .netns import ns_exec

_live = []   # every Popen we started and have not reaped: cleanup() ends them


def spawn(ns, cpu, argv, log_path=None, stdin=None, stdout=None, stderr=None):
    """Start ARGV in namespace NS pinned to CPU, in a session of its own."""
    full = ns_exec(ns, ["taskset", "-c", str(cpu)] + list(argv))
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    p = subprocess.Popen(full, stdin=stdin if stdin is not None else subprocess.DEVNULL,
                         stdout=stdout if stdout is not None else out,
                         stderr=stderr if stderr is not None else out,
                         start_new_session=True)
    if log_path:
        out.close()
    _live.append(p)
    return p


def run(ns, cpu, argv, timeout):
    """Run ARGV to completion in NS on CPU; returns (rc, stdout, stderr)."""
    return finish(spawn(ns, cpu, argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE), timeout)


def finish(p, timeout):
    """Wait up to TIMEOUT for P (spawned with piped stdout and stderr),
    stopping it then; returns (rc, stdout, stderr), rc None if stopped."""
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        stop(p, grace=1)
        out, err = p.communicate()
        return None, out.decode(errors="replace"), "timed out; " + err.decode(errors="replace")
    finally:
        if p in _live:
            _live.remove(p)
    return p.returncode, out.decode(errors="replace"), err.decode(errors="replace")


def stop(p, grace=5.0):
    """SIGTERM the process group of P, SIGKILL it after GRACE seconds.
    Returns P's exit status (negative for a signal)."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    else:
        # The leader is gone; its group may not be (nginx workers).
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    if p in _live:
        _live.remove(p)
    return p.returncode


def cleanup():
    for p in list(_live):
        stop(p, grace=2)


def read(path):
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None


def all_stats():
    """{pid: parse_pid_stat} for every process now."""
    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        text = read("/proc/%s/stat" % name)
        if text:
            try:
                out[int(name)] = parse.parse_pid_stat(text)
            except (ValueError, IndexError):
                pass
    return out


def descendants(root, stats):
    """ROOT and every process below it in STATS."""
    children = {}
    for st in stats.values():
        children.setdefault(st["ppid"], []).append(st["pid"])
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _cpu(st, children=True):
    t = st["utime"] + st["stime"]
    return t + st["cutime"] + st["cstime"] if children else t


def _delta(before, after, pids, children):
    total = 0
    for pid in pids:
        a = after.get(pid)
        if a is None:
            continue
        t = _cpu(a, children)
        b = before.get(pid)
        if b is not None and b["starttime"] == a["starttime"]:
            t -= _cpu(b, children)
        total += max(t, 0)
    return total


def proc_cpu(before, after, pids):
    """Ticks of user+system time PIDS used between two snapshots (not their
    reaped children's)."""
    return _delta(before, after, pids, children=False)


def foreign_cpu(before, after, stat_before, stat_after, ours_root, hz):
    """CPU seconds that processes other than ours (the harness and everything
    below it) used between two snapshots, and the three biggest by name.

    Two lower bounds, and the larger wins: the sum of the other processes'
    own utime+stime (misses a process that starts and ends inside the
    window), and all user+system time in /proc/stat minus ours and the kernel
    threads' (misses what the tick did not sample).  Children's time
    (cutime) is not used for others: a shell that reaps a long-lived child
    adds all of that child's past time at once."""
    ours = set(descendants(ours_root, after)) | set(descendants(ours_root, before))
    kthreads = [p for p, st in after.items() if st["flags"] & parse.PF_KTHREAD]
    d = {k: stat_after[k] - stat_before[k] for k in ("user", "nice", "system")}
    all_ticks = d["user"] + d["nice"] + d["system"]
    ours_ticks = _delta(before, after, ours, children=True)
    kthread_ticks = _delta(before, after, kthreads, children=False)
    residual = max(all_ticks - ours_ticks - kthread_ticks, 0)
    by = {}
    live = 0
    for pid, st in after.items():
        if pid in ours or st["flags"] & parse.PF_KTHREAD:
            continue
        t = _delta(before, after, [pid], children=False)
        if t > 0:
            live += t
            by[st["comm"]] = by.get(st["comm"], 0) + t
    top = sorted(by.items(), key=lambda kv: -kv[1])[:3]
    return max(live, residual) / hz, [(c, t / hz) for c, t in top]


def rss_kb(pids):
    """Sum of VmRSS and of VmHWM over PIDS (kB); processes gone count 0."""
    rss = hwm = 0
    for pid in pids:
        text = read("/proc/%d/status" % pid)
        if not text:
            continue
        rss += parse.parse_status_kb(text, "VmRSS") or 0
        hwm += parse.parse_status_kb(text, "VmHWM") or 0
    return rss, hwm


def listening(pid):
    """Ports listening in the network namespace of PID."""
    ports = set()
    for f in ("tcp", "tcp6"):
        text = read("/proc/%d/net/%s" % (pid, f))
        if text:
            ports |= parse.listening_ports(text)
    return ports


def wait_listening(p, port, timeout=5.0):
    """Wait until PORT listens in P's namespace; False if P died or time ran out."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if p.poll() is not None:
            return False
        if port in listening(p.pid):
            return True
        time.sleep(0.05)
    return False
