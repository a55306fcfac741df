"""Arithmetic on measurements: CPU busy time, medians, spread, pace."""
import math

PACE_THRESHOLD = 0.90   # a role whose CPU is at least this busy set the pace


def cpu_busy(before, after, wall_s, hz):
    """Busy seconds of one CPU between two parse_proc_stat() entries.

    Two figures:
      wall   wall time minus idle, iowait and steal.  The one we use: on a
             kernel with tick-based accounting (no CONFIG_IRQ_TIME_ACCOUNTING)
             idle is measured exactly by the nohz code but user/system/irq/
             softirq are sampled at each tick, and a CPU that sleeps between
             short bursts of network work is mostly not caught busy by a tick.
      ticks  user+nice+system+irq+softirq, for comparison.
    """
    d = {k: after[k] - before[k] for k in after}
    idle_s = (d["idle"] + d["iowait"] + d["steal"]) / hz
    ticks_s = (d["user"] + d["nice"] + d["system"] + d["irq"]
               + d["softirq"]) / hz
    wall_busy = min(max(wall_s - idle_s, 0.0), wall_s)
    return {"wall": wall_busy, "ticks": ticks_s,
            "util": wall_busy / wall_s if wall_s > 0 else 0.0}


def pace_setter(proxy_util, other_util, threshold=PACE_THRESHOLD):
    """Which side ran out of CPU: 'proxy', 'cli+org', 'both' or '-'."""
    p = proxy_util >= threshold
    o = other_util >= threshold
    if p and o:
        return "both"
    if p:
        return "proxy"
    if o:
        return "cli+org"
    return "-"


def median(xs):
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return None
    n = len(xs)
    mid = n // 2
    return xs[mid] if n % 2 else (xs[mid - 1] + xs[mid]) / 2


def spread(xs):
    """(max - min) / median, as a fraction; 0 for fewer than two values."""
    xs = [x for x in xs if x is not None]
    if len(xs) < 2:
        return 0.0
    m = median(xs)
    if not m:
        return 0.0
    return (max(xs) - min(xs)) / abs(m)


def summarize(values):
    """median, min, max, spread and n of a list (None values dropped)."""
    xs = [x for x in values if x is not None]
    if not xs:
        return None
    return {"median": median(xs), "min": min(xs), "max": max(xs),
            "spread": spread(xs), "n": len(xs)}


def mode_of(xs):
    """The most common value (first seen wins a tie); None if empty."""
    counts = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    best = None
    for x in xs:
        if best is None or counts[x] > counts[best]:
            best = x
    return best


def rotate(items, k):
    """ITEMS rotated left by K (the run number), so that no proxy always
    runs first or last in a scenario."""
    if not items:
        return []
    k %= len(items)
    return list(items[k:]) + list(items[:k])


def pool_buckets(runs):
    """The [[upper, count], ...] histograms of several runs added together,
    as {upper: count} (bench/loadgen.rs writes the same bucket edges every
    run)."""
    total = {}
    for buckets in runs:
        for upper, count in buckets:
            total[upper] = total.get(upper, 0) + count
    return total


def bucket_quantile(pooled, q):
    """The upper edge of the bucket holding quantile Q (0..1) of POOLED
    ({upper: count}); None if it holds nothing."""
    n = sum(pooled.values())
    if not n:
        return None
    # The rank of the quantile, as hdrhistogram counts it: at least one.
    rank = max(1, math.ceil(q * n))
    seen = 0
    for upper in sorted(pooled):
        seen += pooled[upper]
        if seen >= rank:
            return upper
    return max(pooled)
