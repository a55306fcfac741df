"""Turns a run's JSON into tables, bench/RESULTS.md, and a comparison of
two runs.  Pure: dicts in, text out."""

import json
import re

from . import stats

LATENCY_KEYS = ("p50", "p90", "p99", "p99.9", "p99.99", "max")
# The latency figures two full runs are compared on (beyond p99 a 6 s run
# holds a few hundred connections or fewer).
COMPARED_LATENCY = ("p50", "p99")
AGREE = 0.10     # two runs "agree" on a figure when their medians differ by <= 10%...
# ...or by no more than the larger spread of the two.


def dump_json(doc):
    """DOC as JSON text, indented except for the cells, one to a line, so
    that the files stay small and diff well."""
    head = {k: v for k, v in doc.items() if k != "cells"}
    text = json.dumps(head, indent=1, ensure_ascii=False)
    cells = ",\n".join("  " + json.dumps(c, separators=(",", ":"), ensure_ascii=False)
                        for c in doc.get("cells", []))
    return text[:-2] + ',\n "cells": [\n' + cells + "\n ]\n}\n"


def tput(cell):
    """A cell's throughput: Gbit/s for bulk scenarios, requests/s for small ones."""
    if cell.get("unit") == "GB":
        return cell["bytes_per_s"] * 8 / 1e9 if cell.get("bytes_per_s") else None
    return cell.get("rps")


def cost(cell):
    """The proxy CPU's busy time per unit of work: s/GB or us/request."""
    return cell.get("cpu_s_per_gb") if cell.get("unit") == "GB" else cell.get("cpu_us_per_req")


def _median_of(cells, key):
    """The median of KEY over CELLS, None unless every cell has it."""
    vals = [c.get(key) for c in cells]
    return None if any(v is None for v in vals) else stats.median(vals)


def cell_line(cell):
    """One line for the progress log."""
    st = cell.get("status")
    if st != "ok":
        return "%s: %s" % (st, (cell.get("reason") or "")[:150])
    if "rest_kb" in cell:
        line = "rest %.1f MB, %d idle clients %.1f MB (%.1f KB each), %d threads" % (
            cell["rest_kb"] / 1024, cell["open"], cell["loaded_kb"] / 1024,
            cell["kb_per_conn"] or 0, cell["threads"])
        if cell.get("settled_kb_per_conn") is not None:
            line += "; settled %.1f KB each, %d threads (%d at rest)" % (
                cell["settled_kb_per_conn"], cell["settled_threads"], cell["rest_threads"])
        return line + ("; " + cell["note"] if cell.get("note") else "")
    unit = "Gbit/s" if cell.get("unit") == "GB" else "req/s"
    cu = "s/GB" if cell.get("unit") == "GB" else "us/req"
    return "%.2f %s, proxy CPU %.3f %s, util proxy %.0f%% other %.0f%%, pace %s, %.1f MB%s" % (
        tput(cell) or 0, unit, cost(cell) or 0, cu, 100 * cell["proxy_util"],
        100 * cell["other_side_util"], cell["pace"], cell.get("peak_rss_kb", 0) / 1024,
        ", DISTURBED" if cell.get("disturbed") else "")


def aggregate(doc):
    """{(scenario, proxy): summary over runs} for every pair in DOC."""
    groups = {}
    for c in doc["cells"]:
        groups.setdefault((c["scenario"], c["proxy"]), []).append(c)
    out = {}
    for key, cells in groups.items():
        ok = [c for c in cells if c.get("status") == "ok"]
        # Disturbed runs are left out of the figures when there are
        # undisturbed ones to use.
        clean = [c for c in ok if not c.get("disturbed")]
        a = {"runs": len(cells), "measured": len(ok),
             "disturbed": len(ok) - len(clean),
             "all_disturbed": bool(ok) and not clean,
             "errors": [c.get("reason") for c in cells if c.get("status") == "error"]}
        ok = clean or ok
        a["n"] = len(ok)
        if not ok:
            bad = [c for c in cells if c.get("status") == "error"] or cells
            a["status"] = bad[0].get("status", "error")
            a["reason"] = bad[0].get("reason", "")
            out[key] = a
            continue
        a["status"] = "ok"
        if "rest_kb" in ok[0]:
            a["rest_mb"] = stats.summarize([c["rest_kb"] / 1024 for c in ok])
            a["loaded_mb"] = stats.summarize([c["loaded_kb"] / 1024 for c in ok])
            a["kb_per_conn"] = stats.summarize([c["kb_per_conn"] for c in ok])
            a["threads"] = stats.median([c["threads"] for c in ok])
            # Runs before the settled reading and the thread count at rest
            # (task H5) have neither: None then.
            a["rest_threads"] = _median_of(ok, "rest_threads")
            a["settled_threads"] = _median_of(ok, "settled_threads")
            a["settled_kb_per_conn"] = stats.summarize(
                [c["settled_kb_per_conn"] for c in ok]) \
                if all(c.get("settled_kb_per_conn") is not None for c in ok) else None
            a["note"] = next((c["note"] for c in ok if c.get("note")), None)
            a["open"] = min(c["open"] for c in ok)
            a["dropped"] = max(c.get("dropped_while_idle") or 0 for c in ok)
        else:
            a["unit"] = ok[0]["unit"]
            a["tput"] = stats.summarize([tput(c) for c in ok])
            a["cost"] = stats.summarize([cost(c) for c in ok])
            a["peak_mb"] = stats.summarize([c.get("peak_rss_kb", 0) / 1024 for c in ok]) \
                if any("peak_rss_kb" in c for c in ok) else None
            a["pace"] = stats.mode_of([c["pace"] for c in ok])
            a["proxy_util"] = stats.median([c["proxy_util"] for c in ok])
            a["other_util"] = stats.median([c["other_side_util"] for c in ok])
            a["foreign"] = stats.median([c["foreign_frac"] for c in ok])
            if "lat_p50_us" in ok[0] and "lat_p99.99_us" in ok[0]:
                # The open-loop cells' latency percentiles, in ms.
                a["latency_ms"] = {k: stats.summarize([c["lat_%s_us" % k] / 1000 for c in ok])
                                   for k in LATENCY_KEYS}
                if all(c.get("lat_buckets_us") is not None for c in ok):
                    # The figure of a percentile is taken from every run's
                    # connections at once; the spread stays that of the
                    # runs' own figures. max is the largest of all.
                    pooled = stats.pool_buckets(c["lat_buckets_us"] for c in ok)
                    for k in LATENCY_KEYS:
                        if k != "max" and a["latency_ms"][k]:
                            q = stats.bucket_quantile(pooled, float(k[1:]) / 100)
                            if q is not None:
                                a["latency_ms"][k]["pooled"] = q / 1000
                    if a["latency_ms"]["max"]:
                        a["latency_ms"]["max"]["pooled"] = a["latency_ms"]["max"]["max"]
            if ok[0].get("h2load_mode"):
                a["h2load_mode"] = ok[0]["h2load_mode"]
            if ok[0].get("tls"):
                a["tls"] = ok[0]["tls"]
            if all(c.get("cpu_us_per_handshake") for c in ok):
                # The https-mitm cells: CPU per TLS handshake with the client.
                a["per_handshake"] = stats.summarize([c["cpu_us_per_handshake"] for c in ok])
        out[key] = a
    return out


def _fmt(x, digits=None):
    if x is None:
        return "-"
    if digits is None:
        digits = 0 if abs(x) >= 100 else 1 if abs(x) >= 10 else 2 if abs(x) >= 1 else 3
    return "%.*f" % (digits, x)


def figure(summary):
    """A summary's figure: pooled over the runs where it was (latency
    percentiles), else the median of the runs."""
    return summary.get("pooled", summary["median"])


def _cell(summary, best=False, digits=None):
    if not summary:
        return "-"
    s = _fmt(figure(summary), digits)
    if best:
        s = "**%s**" % s
    if summary["n"] > 1:
        s += " (%d%%)" % round(100 * summary["spread"])
    return s


def _best(agg, scenario, proxies, field, higher):
    """The proxies (not the baseline) with the best median FIELD."""
    vals = {}
    for p in proxies:
        a = agg.get((scenario, p))
        if p == "noproxy" or not a or a["status"] != "ok" or not a.get(field):
            continue
        vals[p] = a[field]["median"]
    if len(vals) < 2:
        return set()
    b = max(vals.values()) if higher else min(vals.values())
    return {p for p, v in vals.items() if v == b}


def render_tables(doc):
    agg = aggregate(doc)
    scen = [s for s in doc["scenarios"]]
    prox = [p for p in doc["proxies"]]
    out = []
    for s in scen:
        sd = doc["scenarios"][s]
        out.append("### %s\n\n%s.\n" % (s, sd["what"][0].upper() + sd["what"][1:]))
        if sd["kind"] == "mem":
            out.append("| proxy | at rest MB | with clients MB | KB per client | KB per client,"
                       " settled | threads at rest / with clients / settled | clients |")
            out.append("|---|---:|---:|---:|---:|---:|---:|")
            b_rest = _best(agg, s, prox, "rest_mb", higher=False)
            b_kb = _best(agg, s, prox, "kb_per_conn", higher=False)
            for p in prox:
                a = agg.get((s, p))
                if not a:
                    continue
                if a["status"] != "ok":
                    out.append("| %s | %s: %s | | | | | |" % (p, a["status"],
                                                              _short(a["reason"])))
                    continue
                thr = " / ".join("-" if t is None else _fmt(t, 0) for t in (
                    a.get("rest_threads"), a["threads"], a.get("settled_threads")))
                settled = a.get("settled_kb_per_conn")
                out.append("| %s | %s | %s | %s | %s | %s | %d |" % (
                    p, _cell(a["rest_mb"], p in b_rest), _cell(a["loaded_mb"]),
                    _cell(a["kb_per_conn"], p in b_kb), _cell(settled) if settled else "-",
                    thr, a["open"]))
            notes = [(p, agg[(s, p)]["note"]) for p in prox
                     if agg.get((s, p)) and agg[(s, p)].get("note")]
            if notes:
                out.append("")
                out.extend("%s: %s." % n for n in notes)
            out.append("")
            continue
        bulk = sd["unit"] == "GB"
        out.append("| proxy | %s | proxy CPU %s | peak MB | CPU busy proxy / cli+org | pace |" % (
            "Gbit/s" if bulk else "req/s", "s/GB" if bulk else "µs/req"))
        out.append("|---|---:|---:|---:|---:|---|")
        bt = _best(agg, s, prox, "tput", higher=True)
        bc = _best(agg, s, prox, "cost", higher=False)
        bm = _best(agg, s, prox, "peak_mb", higher=False)
        for p in prox:
            a = agg.get((s, p))
            if not a:
                continue
            if a["status"] != "ok":
                out.append("| %s | %s: %s | | | | |" % (p, a["status"], _short(a["reason"])))
                continue
            flags = ""
            if a["all_disturbed"]:
                flags += " ⚠all"
            elif a["disturbed"]:
                flags += " ⚠%d" % a["disturbed"]
            if a["errors"]:
                flags += " (%d failed)" % len(a["errors"])
            out.append("| %s%s | %s | %s | %s | %d%% / %d%% | %s |" % (
                p, flags, _cell(a["tput"], p in bt), _cell(a["cost"], p in bc),
                _cell(a["peak_mb"], p in bm, 1) if a["peak_mb"] else "-",
                round(100 * a["proxy_util"]), round(100 * a["other_util"]), a["pace"]))
        out.append("")
        if sd["kind"] == "h2load":
            modes = ["%s: %s" % (p, agg[(s, p)]["h2load_mode"]) for p in prox
                     if agg.get((s, p), {}).get("h2load_mode")]
            if modes:
                out.append("How h2load reached the origin: %s.\n" % "; ".join(modes))
        if sd.get("service") == "https":
            out.append(render_tls(agg, s, prox, doc.get("settings", {}).get("tls_key")))
        if sd["kind"] == "mitm":
            out.append(render_mitm(agg, s, prox, doc.get("settings", {}).get("tls_key")))
        if sd["kind"] == "rate":
            out.append(render_latency(agg, s, prox))
            out.append("")
    return "\n".join(out)


TLS_KEY_NAMES = {"p256": "ECDSA P-256", "rsa2048": "RSA 2048"}


def render_tls(agg, scenario, prox, key):
    """One line: the certificate's key and what each proxy negotiated with
    openssl s_client (the probe after its run)."""
    seen = []
    for p in prox:
        t = agg.get((scenario, p), {}).get("tls")
        if not t:
            continue
        if "error" in t:
            seen.append("%s: probe failed" % p)
        else:
            seen.append("%s: %s%s" % (
                p, " ".join(t.get(k, "?") for k in ("protocol", "cipher", "kx")),
                {True: ", resumes", False: ", does not resume"}.get(t.get("resumed"), "")))
    head = "TLS: one self-signed %s certificate for every proxy" % TLS_KEY_NAMES.get(key, key or "?")
    # wrk keeps each connection's session and offers it when it reconnects.
    return head + ("; negotiated with openssl s_client: %s.\n" % "; ".join(seen) if seen else ".\n")


def render_mitm(agg, scenario, prox, key):
    """The https-mitm cells: the certificates, and the proxy CPU per TLS
    handshake with the client where the measured part had any."""
    head = ("TLS: %s keys for the origin's certificate and both CAs; each proxy signs the "
            "certificates it serves with the MITM CA, the only one the client trusts, "
            "and checks the origin against the origin's CA"
            % TLS_KEY_NAMES.get(key, key or "?"))
    per = [(p, agg[(scenario, p)]["per_handshake"]) for p in prox
           if agg.get((scenario, p), {}).get("status") == "ok"
           and agg[(scenario, p)].get("per_handshake")]
    if not per:
        return head + ".\n"
    return head + ("; proxy CPU µs per handshake with the client (its CONNECT and its own "
                   "handshake with the origin included; no proxy: the kernel's forwarding "
                   "of the client's handshake with the origin): %s.\n"
                   % "; ".join("%s %s" % (p, _cell(a)) for p, a in per))


def render_latency(agg, scenario, prox):
    """The open-loop latency table, one row per proxy, as the http-tunnel
    benchmark's summary: ms from each connection's scheduled start."""
    out = ["Latency in ms from the moment each connection was due (coordinated "
           "omission corrected), each percentile taken over the connections of all "
           "runs together (in parentheses, how far the runs' own figures spread); "
           "lower is better.\n",
           "| proxy | " + " | ".join(LATENCY_KEYS) + " |",
           "|---|" + "---:|" * len(LATENCY_KEYS)]
    for p in prox:
        a = agg.get((scenario, p))
        if not a:
            continue
        if a["status"] != "ok" or "latency_ms" not in a:
            out.append("| %s | %s: %s |%s" % (p, a["status"], _short(a.get("reason")),
                                             " |" * (len(LATENCY_KEYS) - 1)))
            continue
        out.append("| %s | %s |" % (p, " | ".join(_cell(a["latency_ms"][k])
                                                  for k in LATENCY_KEYS)))
    return "\n".join(out)


def _is_ours(doc, p):
    return doc["proxies"].get(p, {}).get("family") == "ours"


def how_we_compare(doc, ours="3proxy"):
    """Rows (scenario, figure, our median, best peer, its median, ratio):
    per cell, our figure over the best peer's (not ours, not no proxy).
    The figure is proxy CPU per unit of work, KB per idle client for the
    memory cells, and p99 latency for the open-loop cells; for all of
    them lower is better, so a ratio below 1 means we are ahead."""
    agg = aggregate(doc)
    rows = []
    for s, sd in doc["scenarios"].items():
        if sd["kind"] == "mem":
            summ, name = (lambda a: a["kb_per_conn"]), "KB per idle client"
        elif sd["kind"] == "rate":
            summ, name = (lambda a: a["latency_ms"]["p99"]), "p99 latency ms"
        else:
            summ, name = (lambda a: a["cost"]), (
                "proxy CPU s/GB" if sd["unit"] == "GB" else "proxy CPU µs/req")
        a = agg.get((s, ours))
        mine = summ(a) if a and a["status"] == "ok" and _has(a, sd) else None
        peers = {}
        for p in doc["proxies"]:
            if p == "noproxy" or _is_ours(doc, p):
                continue
            b = agg.get((s, p))
            if b and b["status"] == "ok" and _has(b, sd) and summ(b):
                peers[p] = summ(b)
        best = min(peers, key=lambda p: figure(peers[p])) if peers else None
        mv = figure(mine) if mine else None
        bv = figure(peers[best]) if best else None
        rows.append({"scenario": s, "figure": name, "ours": mv, "best": best,
                     "best_value": bv,
                     "ratio": mv / bv if mv is not None and bv else None,
                     # The ratio's own spread: ours and the peer's added
                     # (each is (max - min) / median over the runs).
                     "ratio_spread": mine["spread"] + peers[best]["spread"]
                     if mv is not None and bv else None,
                     "noisy": sd["kind"] == "rate"})
    return rows


def compare_ratios(a, b, ours="3proxy"):
    """The "how we compare" ratios of two runs side by side, per cell:
    (scenario, figure, ratio and best peer in A and in B, diff, allowed,
    agree, same side). Two runs agree on a ratio when it moved by at most
    AGREE or by the larger of the two runs' ratio spreads; "same side"
    says whether both runs put us ahead of (or both behind) the best
    peer. Rows the open-loop cells give (p99) are marked noisy."""
    rb = {r["scenario"]: r for r in how_we_compare(b, ours)}
    rows = []
    for x in how_we_compare(a, ours):
        y = rb.get(x["scenario"])
        if not y or x["ratio"] is None or y["ratio"] is None:
            continue
        diff = (y["ratio"] - x["ratio"]) / x["ratio"]
        allowed = max(AGREE, x["ratio_spread"], y["ratio_spread"])
        rows.append({"scenario": x["scenario"], "figure": x["figure"],
                     "a": x["ratio"], "a_best": x["best"],
                     "b": y["ratio"], "b_best": y["best"],
                     "diff": diff, "allowed": allowed, "agree": abs(diff) <= allowed,
                     "same_side": (x["ratio"] < 1) == (y["ratio"] < 1),
                     "noisy": x["noisy"]})
    return rows


def render_compare_ratios(a, b, names=("A", "B")):
    rows = compare_ratios(a, b)
    if not rows:
        return "No cell has a ratio in both runs.\n"
    firm = [r for r in rows if not r["noisy"]]
    out = ["Of %d ratios, %d agree (moved by at most %d%% or the larger ratio spread, ours "
           "and the peer's added); of the %d not taken from tail latency, %d agree. "
           "%d of %d put us on the same side of the best peer in both runs."
           % (len(rows), sum(r["agree"] for r in rows), round(100 * AGREE), len(firm),
              sum(r["agree"] for r in firm), sum(r["same_side"] for r in rows), len(rows)), "",
           "| cell | figure | %s: 3proxy / best | %s: 3proxy / best | B vs A | allowed | agree |"
           % names,
           "|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append("| %s | %s%s | %.2f %s | %.2f %s | %+d%% | %d%% | %s |" % (
            r["scenario"], r["figure"], " (noisy)" if r["noisy"] else "",
            r["a"], r["a_best"], r["b"], r["b_best"], round(100 * r["diff"]),
            round(100 * r["allowed"]), "yes" if r["agree"] else "**no**"))
    return "\n".join(out) + "\n"


def _has(a, sd):
    if sd["kind"] == "mem":
        return a.get("kb_per_conn") is not None
    if sd["kind"] == "rate":
        return "latency_ms" in a
    return a.get("cost") is not None


def render_how_we_compare(doc):
    out = ["| cell | figure (lower is better) | 3proxy | best peer | its figure | 3proxy / best |",
           "|---|---|---:|---|---:|---:|"]
    for r in how_we_compare(doc):
        out.append("| %s | %s | %s | %s | %s | %s |" % (
            r["scenario"], r["figure"], _fmt(r["ours"]), r["best"] or "none measured",
            _fmt(r["best_value"]), "%.2f" % r["ratio"] if r["ratio"] is not None else "-"))
    return "\n".join(out)


def render_summary(doc):
    """One table: proxy CPU per unit of work, every scenario by every proxy."""
    agg = aggregate(doc)
    scen = [s for s in doc["scenarios"] if doc["scenarios"][s]["kind"] != "mem"]
    prox = list(doc["proxies"])
    out = ["| scenario | unit | " + " | ".join(prox) + " |",
           "|---|---|" + "---:|" * len(prox)]
    for s in scen:
        unit = "s/GB" if doc["scenarios"][s]["unit"] == "GB" else "µs/req"
        best = _best(agg, s, prox, "cost", higher=False)
        row = []
        for p in prox:
            a = agg.get((s, p))
            if not a:
                row.append("")
            elif a["status"] != "ok":
                row.append(a["status"])
            else:
                v = _fmt(a["cost"]["median"])
                row.append("**%s**" % v if p in best else v)
        out.append("| %s | %s | %s |" % (s, unit, " | ".join(row)))
    return "\n".join(out)


def _short(reason, n=90):
    """A reason fit for a table cell: our config errors lose their
    "3proxy: 3proxy.cfg:4:" prefix, everything loses newlines and pipes."""
    reason = (reason or "").replace("|", "/").replace("\n", " ")
    m = re.match(r"^(\S+) did not serve (\S+) \(exit (\S+)\): (?:\S+: )?\S+\.cfg:\d+: (.*)$",
                 reason)
    if m:
        reason = "%s (exit %s)" % (m.group(4), m.group(3))
    return reason if len(reason) <= n else reason[:n - 1] + "…"


def compare(a, b):
    """Rows (scenario, proxy, metric, median a, median b, diff, spread, agree)."""
    aa, ab = aggregate(a), aggregate(b)
    rows = []
    for key in aa:
        x, y = aa[key], ab.get(key)
        if not y or x["status"] != "ok" or y["status"] != "ok":
            continue
        fields = ("rest_mb", "loaded_mb") if "rest_mb" in x else ("tput", "cost")
        pairs = [(f, x[f], y[f]) for f in fields]
        if "latency_ms" in x and "latency_ms" in y:
            pairs += [(k, x["latency_ms"][k], y["latency_ms"][k]) for k in COMPARED_LATENCY
                      if x["latency_ms"][k] and y["latency_ms"][k]]
        for f, sx, sy in pairs:
            mx, my = figure(sx), figure(sy)
            if not mx:
                continue
            diff = (my - mx) / mx
            sp = max(sx["spread"], sy["spread"])
            rows.append({"scenario": key[0], "proxy": key[1], "metric": f, "a": mx, "b": my,
                         "diff": diff, "spread": sp,
                         "agree": abs(diff) <= max(AGREE, sp)})
    return rows


def _describe(doc):
    st = doc["settings"]
    ours = doc.get("tools", {}).get("threeproxy")
    return "%s, %d run(s) of %g s, started %s, threeproxy %s" % (
        doc["mode"], st["runs"], st["seconds"], doc["started"],
        ours["sha256"][:12] if ours else "not measured")


def render_compare(a, b, names=("A", "B")):
    rows = compare(a, b)
    if not rows:
        return "No cells measured in both runs.\n"
    n_ok = sum(r["agree"] for r in rows)
    within10 = sum(abs(r["diff"]) <= AGREE for r in rows)
    out = ["A: %s (%s). B: %s (%s)." % (names[0], _describe(a), names[1], _describe(b)), "",
           "Of %d figures, %d differ by at most %d%%, and %d by at most %d%% or the "
           "larger spread of the two runs (the agreement the README promises)."
           % (len(rows), within10, round(100 * AGREE), n_ok, round(100 * AGREE)), "",
           "By figure: " + "; ".join(
               "%s %d of %d agree" % (label, sum(r["agree"] for r in rows if r["metric"] in ms),
                                      sum(1 for r in rows if r["metric"] in ms))
               for label, ms in (("proxy CPU per unit", ("cost",)),
                                 ("throughput", ("tput",)),
                                 ("latency", COMPARED_LATENCY),
                                 ("memory", ("rest_mb", "loaded_mb")))
               if any(r["metric"] in ms for r in rows)) + ".", "",
           "| scenario | proxy | figure | A | B | B vs A | spread | agree |",
           "|---|---|---|---:|---:|---:|---:|---|"]
    for r in rows:
        out.append("| %s | %s | %s | %s | %s | %+d%% | %d%% | %s |" % (
            r["scenario"], r["proxy"], r["metric"], _fmt(r["a"]), _fmt(r["b"]),
            round(100 * r["diff"]), round(100 * r["spread"]), "yes" if r["agree"] else "**no**"))
    return "\n".join(out) + "\n"


def render_machine(doc):
    m, t, st = doc["machine"], doc["tools"], doc["settings"]
    ours = t.get("threeproxy")
    lines = [
        "| | |", "|---|---|",
        "| CPU | %s, %d CPUs (%s) |" % (m["cpu_model"], m["cpus"], m.get("virt") or "?"),
        "| memory | %s GiB |" % m["mem_gib"],
        "| OS, kernel | %s, Linux %s |" % (m["os"], m["kernel"]),
        "| CPU accounting | %s (%s); busy = %s |" % (
            "IRQ time accounting" if m.get("irq_time_accounting") else
            "tick-based, no IRQ time accounting", m.get("irq_time_accounting_source") or "?",
            st["cpu_busy"]),
        "| tools | %s; %s; %s; %s; Python %s |" % (t.get("wrk"), t.get("iperf3"), t.get("nginx"),
                                                  t.get("haproxy"), t.get("python")),
        "| peers | %s |" % "; ".join(str(t[k]) for k in (
            "dante", "microsocks", "squid", "tinyproxy", "trafficserver", "h2load", "siege",
            "openssl") if t.get(k)),
        "| threeproxy | %s |" % ("binary sha256 %s, built %s, git %s" % (
            ours["sha256"], ours["built"], ours["git_head"]) if ours else "not measured"),
    ] + [
        "| %s | %s |" % (name, p["what"])
        for name, p in doc.get("proxies", {}).items() if p.get("binary")
    ] + [
        "| run | %s mode, %d run(s) per cell, %g s measured after %g s warm-up, started %s |" % (
            doc["mode"], st["runs"], st["seconds"], st["warmup"], doc["started"]),
        "| pinning | proxy alone on CPU %d; client and origin on CPU %d; RPS check %s |" % (
            st["proxy_cpu"], st["other_cpu"], "ok" if doc.get("rps", {}).get("ok") else "FAILED"),
        "| descriptors | RLIMIT_NOFILE %d (was %d) |" % (st["nofile"], st["nofile_before"]),
    ]
    return "\n".join(lines)


def render_results_md(docs, names):
    doc = docs[0]
    cells = doc["cells"]
    dist = sum(1 for c in cells if c.get("disturbed"))
    smoke = doc["mode"] == "quick"
    parts = [RESULTS_HEAD % {"json": names[0],
                             "all": " ".join("bench/" + n for n in names)},
             "## How we compare\n",
             ("**Smoke run (quick mode): these figures prove that every cell and peer "
              "runs; they are not for comparison.**\n\n" if smoke else "")
             + "Per cell, our figure over the best peer's in the same run (no proxy and "
             "other builds of ours excluded); below 1 we are ahead.\n",
             render_how_we_compare(doc), "",
             "## The machine\n", render_machine(doc), "",
             "## Headline: proxy CPU per unit of work (median)\n",
             "Lower is better; **bold** is the best proxy in the row (no proxy excluded). "
             "s/GB is CPU-seconds of the proxy's CPU per gigabyte delivered; µs/req is "
             "CPU-microseconds per request.\n",
             render_summary(doc), "",
             "## Scenarios\n",
             "Figures are medians over the runs; (n%%) after a figure is its spread, "
             "(max − min) / median. **Bold** marks the best proxy in each column "
             "(no proxy excluded). ⚠n: n runs stayed disturbed by other processes "
             "after the repeat and are left out of the figures (⚠all: every run was "
             "disturbed, so none is left out). %d of %d measured cells were disturbed.\n" % (
                 dist, sum(1 for c in cells if c.get("status") == "ok")),
             render_tables(doc)]
    same = pooled(docs)
    if same is not None:
        parts += ["## All runs pooled\n",
                  "The runs of all %d files measured the same binary: here is the headline "
                  "again with each figure the median over all their runs (%d per cell), "
                  "the figure to hold a target against when single runs spread widely.\n"
                  % (len(docs), sum(d["settings"]["runs"] for d in docs)),
                  render_summary(same), ""]
    if len(docs) > 1:
        parts.append("## Reproducibility\n")
        parts.append("Each later run compared with the one the tables come from (A).  "
                     "Only figures measured in both are compared.\n")
        for d, n in zip(docs[1:], names[1:]):
            parts += ["### %s\n" % n,
                      "The ratios of \"How we compare\" in both runs:\n",
                      render_compare_ratios(docs[0], d, ("A", "B")),
                      "Every figure of both runs:\n",
                      render_compare(docs[0], d, (names[0], n))]
    parts.append(RESULTS_TAIL)
    return "\n".join(parts) + "\n"


def pooled(docs):
    """DOCS as one document whose cells are all of theirs (medians then go
    over every run), or None unless there are several and all measured
    the same threeproxy binary."""
    shas = {(d.get("tools", {}).get("threeproxy") or {}).get("sha256") for d in docs}
    if len(docs) < 2 or len(shas) != 1 or None in shas:
        return None
    one = dict(docs[0])
    one["cells"] = [c for d in docs for c in d["cells"]]
    return one


# The line after which RESULTS.md is written by hand: studies, A/B runs,
# what each change bought. A rewrite of the tables keeps it and what follows.
HAND_MARK = ("<!-- Everything below this line is written by hand (studies, A/B runs, what "
             "each change bought) and kept as it is when bench.py rewrites the tables above. -->")


def keep_hand_part(new, old):
    """NEW (the generated tables) followed by OLD's hand-written part: the
    HAND_MARK line and everything after it (just the mark if OLD has none)."""
    i = old.find(HAND_MARK) if old else -1
    tail = old[i:] if i >= 0 else HAND_MARK + "\n"
    return new.rstrip("\n") + "\n\n" + tail


RESULTS_HEAD = """# Benchmark results

Generated by `bench/bench.py` from `bench/%(json)s`; regenerate with
`python3 bench/bench.py --report %(all)s`.
How the benchmark works is in [README.md](README.md). Do not edit the tables by hand.
"""

RESULTS_TAIL = """## How to read the tables

- **Throughput** is what the client got: Gbit/s of payload received by
  iperf3 or of response bytes read by wrk / the SOCKS client, or requests per
  second.  With one CPU shared by client and origin, throughput is mostly set by
  them, not by the proxy: see the pace column.
- **Proxy CPU** is the busy time of the proxy's CPU (everything on it: the
  proxy's user and kernel time and the softirq work of its two veths) divided
  by the work done.  This is the headline figure.  For "noproxy" it is the cost
  of the kernel forwarding the packets, the floor any proxy starts from.
- **peak MB** is the highest summed RSS of the proxy's processes, sampled every
  0.25 s during the measured run.
- **CPU busy** is how busy the proxy's CPU and the client+origin CPU were; the
  **pace** column names the side at 90 % or more ("-": neither, the run was
  latency-bound).
- nginx and haproxy are reverse proxies in front of the origin in the http
  scenarios; ours is a forward proxy (wrk sends absolute-form requests).  In
  the stream scenarios all are plain TCP port mappers.

## Caveats

- A 2-CPU virtual machine shared with other work: every run records the CPU
  used by other processes; a run where they used more than 5 % of a CPU was
  repeated (up to the retry count) and is flagged ⚠ if it stayed disturbed.
- veth pairs with the kernel's default offloads (TSO/GSO/GRO): the MTU is 1500
  but segments cross the veth as large as 64 KB, as with a real NIC doing TSO.
- CPU busy = wall time − idle − iowait − steal from /proc/stat, because this
  kernel samples user/system/softirq at the tick and under-counts a CPU that is
  partly idle; the tick-based sum is kept in the JSON (proxy_cpu_ticks_s).
- Steal time on the hypervisor is excluded from busy but can still slow a run.
- Throughput set by the client+origin CPU (pace "cli+org") moves more between
  runs than the proxy CPU per unit of work, which is why the latter is the
  headline; see Reproducibility.
- threeproxy changes from day to day: each JSON names the binary it measured
  (sha256, build time, git HEAD), and a comparison between two binaries
  measures the code as well as the noise.
- The tcp-* and socks-* cells use a compiled client (bench/loadgen.rs, one
  thread, poll()); wrk cannot speak SOCKS.
"""
