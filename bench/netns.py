"""The topology: three network namespaces linked by two veth pairs.

    tpb-cli  [c0 10.0.1.1] ---- [p0 10.0.1.2]  tpb-prx  [p1 10.0.2.1] ---- [o0 10.0.2.2]  tpb-org

The proxy namespace forwards IP between its two links, so "no proxy" is the
client talking to the origin through the kernel's router on the proxy CPU.
Each veth end steers its receive work (RPS) to the CPU of the namespace it
sits in.  Nothing here routes anywhere but these two /24s.
"""

import os
import subprocess
import time

NS_CLI = "tpb-cli"
NS_PRX = "tpb-prx"
NS_ORG = "tpb-org"
NAMESPACES = (NS_CLI, NS_PRX, NS_ORG)
MTU = 1500

# (namespace, device, address, peer namespace, peer device, peer address)
LINKS = (
    (NS_CLI, "c0", "10.0.1.1/24", NS_PRX, "p0", "10.0.1.2/24"),
    (NS_PRX, "p1", "10.0.2.1/24", NS_ORG, "o0", "10.0.2.2/24"),
)

# Per-namespace sysctls: short-lived connections at thousands per second
# need the whole port range and TIME_WAIT reuse.
SYSCTLS = {
    "net.ipv4.ip_local_port_range": "1024 65000",
    "net.ipv4.tcp_tw_reuse": "1",
    "net.core.somaxconn": "8192",
    "net.ipv4.tcp_max_syn_backlog": "8192",
}


def cpu_mask(cpu):
    return "%x" % (1 << cpu)


def setup_commands(proxy_cpu, other_cpu):
    """The `ip` commands (as argv lists) that build the topology."""
    cmds = []
    for ns in NAMESPACES:
        cmds.append(["ip", "netns", "add", ns])
        cmds.append(["ip", "-n", ns, "link", "set", "lo", "up"])
    for ns, dev, addr, pns, pdev, paddr in LINKS:
        cmds.append(["ip", "link", "add", "tpbtmp0", "mtu", str(MTU), "type", "veth",
                     "peer", "name", "tpbtmp1", "mtu", str(MTU)])
        cmds.append(["ip", "link", "set", "tpbtmp0", "netns", ns, "name", dev])
        cmds.append(["ip", "link", "set", "tpbtmp1", "netns", pns, "name", pdev])
        cmds.append(["ip", "-n", ns, "addr", "add", addr, "dev", dev])
        cmds.append(["ip", "-n", pns, "addr", "add", paddr, "dev", pdev])
        cmds.append(["ip", "-n", ns, "link", "set", dev, "up"])
        cmds.append(["ip", "-n", pns, "link", "set", pdev, "up"])
    cmds.append(["ip", "-n", NS_CLI, "route", "add", "10.0.2.0/24", "via", "10.0.1.2"])
    cmds.append(["ip", "-n", NS_ORG, "route", "add", "10.0.1.0/24", "via", "10.0.2.1"])
    return cmds


def rps_plan(proxy_cpu, other_cpu):
    """(namespace, device, cpu) for every veth end: receive work goes to the
    CPU of the side that receives."""
    return [
        (NS_CLI, "c0", other_cpu),
        (NS_PRX, "p0", proxy_cpu),
        (NS_PRX, "p1", proxy_cpu),
        (NS_ORG, "o0", other_cpu),
    ]


def _run(argv, check=True):
    return subprocess.run(argv, check=check, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def ns_exec(ns, argv):
    return ["ip", "netns", "exec", ns] + list(argv)


def existing():
    out = _run(["ip", "netns", "list"], check=False).stdout
    names = {line.split()[0] for line in out.splitlines() if line.strip()}
    return [ns for ns in NAMESPACES if ns in names]


def teardown(log=print):
    """Remove our namespaces (and so their veths), killing whatever still
    runs inside them first: the leftovers of an interrupted run."""
    for ns in existing():
        pids = _run(["ip", "netns", "pids", ns], check=False).stdout.split()
        for p in pids:
            try:
                os.kill(int(p), 9)
            except (ProcessLookupError, ValueError):
                pass
        if pids:
            log("netns %s: killed %d leftover processes" % (ns, len(pids)))
            time.sleep(0.2)
        _run(["ip", "netns", "del", ns], check=False)
    # A half-built earlier run may have left the temporary veth in the root ns.
    for dev in ("tpbtmp0", "tpbtmp1"):
        if os.path.exists("/sys/class/net/" + dev):
            _run(["ip", "link", "del", dev], check=False)


def setup(proxy_cpu, other_cpu):
    """Build the topology; returns the RPS settings read back."""
    teardown(log=lambda *a: None)
    for argv in setup_commands(proxy_cpu, other_cpu):
        _run(argv)
    for ns in NAMESPACES:
        for key, val in SYSCTLS.items():
            _run(ns_exec(ns, ["sysctl", "-q", "-w", "%s=%s" % (key, val)]), check=False)
    _run(ns_exec(NS_PRX, ["sysctl", "-q", "-w", "net.ipv4.ip_forward=1"]))
    readback = {}
    for ns, dev, cpu in rps_plan(proxy_cpu, other_cpu):
        path = "/sys/class/net/%s/queues/rx-0/rps_cpus" % dev
        _run(ns_exec(ns, ["sh", "-c", "echo %s > %s" % (cpu_mask(cpu), path)]))
        got = _run(ns_exec(ns, ["cat", path])).stdout.strip()
        readback["%s/%s" % (ns, dev)] = {"want_cpu": cpu, "rps_cpus": got,
                                         "ok": int(got.replace(",", ""), 16) == 1 << cpu}
    return readback
