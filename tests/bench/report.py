#!/usr/bin/env python3
"""Aggregate the wrk records of tests/bench/run.sh into a table and build/bench/results.json.

usage: report.py RECORDS.jsonl MEM.json META.json SYSCALLS.jsonl OUT.json [INSTRUCTIONS.jsonl]

Per proxy and concurrency: the median over rounds of req/s, p50, p99 and CPU time per request,
plus min/max req/s (the spread), then ratios of retrygate to each peer and to the better peer.
req/s ratio > 1 is better for retrygate; latency and CPU/request ratios < 1 are better.
A peer whose name ends in "-fields" (haproxy-fields: HAProxy doing retrygate's per-request field
work) gets its ratio line but is not a candidate for "best": the goal names the plain peers.
"""
import json
import os
import statistics
import sys


def med(xs):
    return statistics.median(xs) if xs else None


def ratio(a, b):
    return round(a / b, 3) if a is not None and b else None


def aggregate(records, proxies):
    """One table block: per proxy the medians over rounds, then the ratios."""
    row = {}
    for p in ["direct"] + proxies:
        rs = [r for r in records if r["proxy"] == p]
        if not rs:
            continue
        w = [r["wrk"] for r in rs]
        errs = sum(x["err_connect"] + x["err_read"] + x["err_write"] + x["err_timeout"] for x in w)
        non2xx = sum(x["err_status"] for x in w)
        cpu = [r["cpu_us"] / x["requests"] for r, x in zip(rs, w) if x["requests"]]
        row[p] = {
            "rounds": len(rs),
            "rps": round(med([x["rps"] for x in w]), 1),
            "rps_min": round(min(x["rps"] for x in w), 1),
            "rps_max": round(max(x["rps"] for x in w), 1),
            "p50_us": med([x["p50_us"] for x in w]),
            "p99_us": med([x["p99_us"] for x in w]),
            "cpu_us_per_req": round(med(cpu), 2) if p != "direct" and cpu else None,
            "requests": sum(x["requests"] for x in w),
            "socket_errors": errs,
            "non_2xx": non2xx,
            "per_round": [{"round": r["round"], "rps": x["rps"], "p50_us": x["p50_us"],
                           "p99_us": x["p99_us"], "cpu_us": r["cpu_us"]} for r, x in zip(rs, w)],
        }
    ratios = {}
    rg = row.get("retrygate")
    peers = [p for p in proxies if p != "retrygate" and p in row]
    if rg and peers:
        def paired(p, key):
            # ratio within each round (the runs of one round are seconds apart), then median
            mine = {x["round"]: x[key] for x in rg["per_round"]}
            xs = [mine[x["round"]] / x[key] for x in row[p]["per_round"]
                  if x["round"] in mine and x[key]]
            return round(med(xs), 3) if xs else None

        for p in peers:
            o = row[p]
            ratios["retrygate/" + p] = {
                "rps": ratio(rg["rps"], o["rps"]),
                "rps_paired": paired(p, "rps"),
                "p50": ratio(rg["p50_us"], o["p50_us"]),
                "p99": ratio(rg["p99_us"], o["p99_us"]),
                "cpu_per_req": ratio(rg["cpu_us_per_req"], o["cpu_us_per_req"]),
            }
        plain = [p for p in peers if not p.endswith("-fields")]
        if plain:
            best = max(plain, key=lambda p: row[p]["rps"])
            ratios["retrygate/best"] = dict(ratios["retrygate/" + best], peer=best)
    return {"proxies": row, "ratios": ratios}


def main():
    rec_path, mem_path, meta_path, sys_path, out_path = sys.argv[1:6]
    instr_path = sys.argv[6] if len(sys.argv) > 6 else None
    records = [json.loads(line) for line in open(rec_path) if line.strip()]
    mem = json.load(open(mem_path))
    meta = json.load(open(meta_path))
    proxies = meta["proxies"]
    conns = [int(c) for c in meta["conns"]]

    results = {}
    for c in conns:
        results[str(c)] = aggregate([r for r in records if "row" not in r and r["conns"] == c],
                                    proxies)
    h2_rows = meta.get("h2_rows", [])
    for name in h2_rows:
        results[name] = aggregate([r for r in records if r.get("row") == name], proxies)

    syscalls = {}
    for line in open(sys_path):
        if not line.strip():
            continue
        s = json.loads(line)
        n = s["requests"]
        per = {k: round(v[0] / n, 2) for k, v in s["calls"].items()}
        syscalls[s["proxy"]] = {
            "tool": s.get("tool", "strace"), "conns": s["conns"], "requests": n,
            "per_request": round(sum(v[0] for v in s["calls"].values()) / n, 2),
            "by_call": dict(sorted(per.items(), key=lambda kv: -kv[1])),
            "failed_per_request": round(sum(v[1] for v in s["calls"].values()) / n, 2),
        }

    # instructions per request (instructions.sh): {row: {proxy: n}}; the h1 row is wrk -c64's
    instructions = {}
    if instr_path and os.path.exists(instr_path):
        for line in open(instr_path):
            if line.strip():
                x = json.loads(line)
                instructions.setdefault(x["row"], {})[x["proxy"]] = x["instructions"]

    out = {"meta": meta, "memory_after_run": mem, "syscalls": syscalls,
           "instructions_per_request": instructions, "results": results}
    with open(out_path, "w") as f:
        json.dump(out, f, indent=2)
        f.write("\n")

    # ---------------------------------------------------------------- table
    print()
    print("retrygate vs HAProxy vs nginx: %d rounds x %ss, wrk -t1, proxies on CPU %s, "
          "wrk+upstream on CPU %s" % (meta["rounds"], meta["seconds"], meta["proxy_cpu"], meta["load_cpu"]))
    print("(%s, %s; haproxy %s, nginx %s, wrk %s; loadavg %s -> %s)" % (
        meta["retrygate"], meta["retrygate_git"], meta["haproxy"], meta["nginx"], meta["wrk"],
        meta["loadavg_before"], meta["loadavg_after"]))
    warn = []
    titles = {
        "h2": "HTTP/2 client -> HTTP/1.1 upstream",
        "h2h2": "HTTP/2 client -> HTTP/2 upstream",
        "grpc": "unary gRPC (HTTP/2 -> HTTP/2, grpc-status trailers)",
    }
    blocks = [("c=%d" % c, str(c)) for c in conns]
    for name in h2_rows:
        base = name[:-len("-1cpu")] if name.endswith("-1cpu") else name
        if base != name and base in titles:
            titles[name] = titles[base] + ", the proxy on the load core (one core for everything)"
    blocks += [("%s: %s" % (name, titles.get(name, name)), name) for name in h2_rows]
    def instr_row(key):
        """The instructions.sh row measuring block KEY: h1 for the wrk block of its -c
        (64), a HTTP/2 row for itself and its -1cpu twin."""
        if key.isdigit():
            return instructions.get("h1", {}) if int(key) == 64 else {}
        return instructions.get(key[:-len("-1cpu")] if key.endswith("-1cpu") else key, {})

    for label, key in blocks:
        row, ratios = results[key]["proxies"], results[key]["ratios"]
        ins = instr_row(key)
        if h2_rows and key == h2_rows[0]:
            print()
            print("HTTP/2 rows: %d rounds x %ss, h2load -t1 -c%d -m%d (%d streams), h2load %s" % (
                meta["h2_rounds"], meta["h2_seconds"], meta["h2_conns"], meta["h2_streams"],
                meta["h2_conns"] * meta["h2_streams"], meta.get("h2load", "?")))
        print()
        print(label)
        print("  %-14s %10s %21s %9s %9s %10s %10s  %s" % (
            "proxy", "req/s", "(min..max)", "p50 us", "p99 us", "cpu us/req", "instr/req", "errors"))
        for p in ["direct"] + proxies:
            if p not in row:
                continue
            x = row[p]
            cpu = "%.1f" % x["cpu_us_per_req"] if x["cpu_us_per_req"] is not None else "-"
            e = x["socket_errors"] + x["non_2xx"]
            print("  %-14s %10.0f %21s %9d %9d %10s %10s  %s" % (
                p if p != "direct" else "(direct)", x["rps"],
                "(%.0f..%.0f)" % (x["rps_min"], x["rps_max"]), x["p50_us"], x["p99_us"], cpu,
                ins.get(p, "-"),
                "%d sock, %d non-2xx" % (x["socket_errors"], x["non_2xx"]) if e else "0"))
            if p != "direct" and "direct" in row and x["rps"] > 0.8 * row["direct"]["rps"]:
                warn.append("%s: %s reaches %.0f%% of the direct rate: the load core may be the "
                            "limit, not the proxy" % (label, p, 100 * x["rps"] / row["direct"]["rps"]))
            if e:
                warn.append("%s: %s had %d errors" % (label, p, e))
        for k, v in ratios.items():
            name = k + (" (" + v["peer"] + ")" if "peer" in v else "")
            peer = v.get("peer", k.split("/", 1)[1])
            instr = ratio(ins["retrygate"], ins[peer]) if "retrygate" in ins and peer in ins else "-"
            print("  %-32s req/s %6s (paired %5s)   p50 %6s   p99 %6s   cpu/req %6s   instr %6s" % (
                name, v["rps"], v["rps_paired"], v["p50"], v["p99"], v["cpu_per_req"], instr))
    print()
    print("memory after the run (all processes of each proxy):")
    for p in proxies:
        if p not in mem:
            continue    # haproxy-fields: the haproxy process, reported once
        m = mem[p]
        print("  %-14s RSS %8d KiB   peak %8d KiB   (%d process%s)" % (
            p, m.get("rss_kb", 0), m.get("hwm_kb", 0), m.get("processes", 0),
            "" if m.get("processes", 0) == 1 else "es"))
    if syscalls:
        print()
        first = next(iter(syscalls.values()))
        print("system calls per request (%s, c=%d; epoll_wait is amortised over a batch):"
              % (first["tool"], first["conns"]))
        for p in proxies:
            if p in syscalls:
                x = syscalls[p]
                print("  %-14s %5.2f   %s" % (p, x["per_request"], "  ".join(
                    "%s %.2f" % kv for kv in x["by_call"].items() if kv[1] >= 0.01)))
    print()
    print("req/s ratio > 1: retrygate faster; latency and cpu/req ratios < 1: retrygate better.")
    busy = float(meta["loadavg_before"].split()[0])
    if busy > 0.5 * meta["ncpu"]:
        warn.append("load average was %.2f on %d CPUs before the run: other work shared the cores, "
                    "so compare ratios (and cpu/req), and rerun when quieter" % (busy, meta["ncpu"]))
    for w in warn:
        print("warning: " + w)


if __name__ == "__main__":
    main()
