#!/usr/bin/env python3
"""The tail bench of SPEC §14 (issue 29): what hedging does to the latency tail.

An upstream (asyncio, HTTP/1.1 keep-alive, its own process) answers at once, except that each
response is late with probability --late (default 1.5%, drawn per request) by 100-200 ms,
uniform. It listens on --endpoints ports ("two endpoints"), or on one ("one address", as behind
a Kubernetes ClusterIP: a hedge goes over another connection to the same address). A steady
open-loop load (--rate requests a second for --seconds, each sent at its scheduled time whatever
the others do; latency counted from that time, so a stall is not hidden) goes through
retrygate with retry.hedge.after off, 20ms and p95, after a "direct" row (the same load straight
at the upstream: the generator's own floor). Printed per run: p50, p99, p99.9 and max latency,
the requests, and the extra attempts (attempts / requests - 1, from /metrics) with the hedges
sent and won. Then the failing rows: every answer a 503, hedging and retries on; retries and
hedges must stay within the budget's bound (PASS/FAIL; exit status 1 on a FAIL).

    tests/bench/tail.py                      # both variants, direct + three settings, failing rows
    tests/bench/tail.py --rate 200 --seconds 10 --endpoints 1
    RETRYGATE_BIN=build/san/retrygate tests/bench/tail.py --seconds 5

Needs only python3 and build/retrygate. Figures from a loaded machine: the ratios between the
rows are the result, the absolute numbers are the machine's.
"""

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESP = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
FAIL = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 2\r\n\r\nno"
# the budget of the failing rows (SPEC §4): retries and hedges <= max_tokens + ratio * requests
# + min_per_second * t
BUDGET = {"ratio": 0.2, "min_per_second": 10, "max_tokens": 100}


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


# ------------------------------------------------------------------------------- upstream

async def serve_conn(reader, writer, late, rng, resp):
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head:
                return
            if rng.random() < late:
                await asyncio.sleep(rng.uniform(0.100, 0.200))
            writer.write(resp)
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.LimitOverrunError):
        pass
    finally:
        writer.close()


def upstream_main(ports, late, seed, resp=RESP):
    rng = random.Random(seed)

    async def main():
        for p in ports:
            await asyncio.start_server(lambda r, w: serve_conn(r, w, late, rng, resp), "127.0.0.1", p,
                                       backlog=1024)
        await asyncio.Event().wait()
    asyncio.run(main())


# ------------------------------------------------------------------------------- load

async def one(port, pool, t_sched, lat, attempts):
    await asyncio.sleep(max(0.0, t_sched - time.monotonic()))
    if pool:
        reader, writer = pool.pop()
    else:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET /x HTTP/1.1\r\nHost: bench\r\n\r\n")
    head = await reader.readuntil(b"\r\n\r\n")
    n = 0
    att = 1
    for line in head.split(b"\r\n"):
        k, _, v = line.partition(b":")
        if k.lower() == b"content-length":
            n = int(v)
        elif k.lower() == b"x-retrygate-attempts":
            att = int(v)
    if n:
        await reader.readexactly(n)
    lat.append(time.monotonic() - t_sched)
    attempts.append(att)
    pool.append((reader, writer))


async def load(port, rate, seconds):
    pool, lat, attempts = [], [], []
    t0 = time.monotonic() + 0.2
    total = int(rate * seconds)
    tasks = [asyncio.ensure_future(one(port, pool, t0 + i / rate, lat, attempts))
             for i in range(total)]
    await asyncio.gather(*tasks, return_exceptions=True)
    for _, w in pool:
        w.close()
    return lat, attempts


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(len(xs) * p))] if xs else float("nan")


def metric(admin, name):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=5).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_one(binary, ports, after, rate, seconds, warm, failing=False):
    port, admin = free_port(), free_port()
    eps = ", ".join('"127.0.0.1:%d"' % p for p in ports)
    cfg = """workers: 1
access_log: "off"
admin: {{ listen: "127.0.0.1:{admin}" }}
listeners:
  - listen: 127.0.0.1:{port}
    routes: [{{ upstream: api }}]
upstreams:
  api:
    endpoints: [{eps}]
    concurrency: {{ max_in_flight: 4096, max_retries_in_flight: 1024 }}
    retry:
      per_try_timeout: 2s
      hedge: {{ after: {after} }}
""".format(admin=admin, port=port, eps=eps, after=after)
    if failing:
        # every answer a 503: retries (default max_attempts 3, `on` has 503) and hedges draw on
        # one budget; ejection off so that every request goes on reaching the upstream
        cfg += """      backoff: {{ base: 1ms, max: 5ms }}
      budget: {{ ratio: {ratio}, min_per_second: {min_per_second}, max_tokens: {max_tokens} }}
    health: {{ passive: {{ consecutive_failures: 0 }} }}
""".format(**BUDGET)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "tail.yaml"
        path.write_text(cfg)
        proc = subprocess.Popen([binary, "-c", str(path)], stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        try:
            for _ in range(200):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.1).close()
                    break
                except OSError:
                    time.sleep(0.05)
            if warm:
                # p95 needs 100 first attempts in its window: a warm-up, not measured
                asyncio.run(load(port, rate, warm))
            a0 = metric(admin, "retrygate_upstream_attempts_total")
            r0 = metric(admin, "retrygate_upstream_requests_total")
            h0 = metric(admin, "retrygate_upstream_hedges_total")
            w0 = metric(admin, "retrygate_upstream_hedges_won_total")
            t0 = time.monotonic()
            lat, _ = asyncio.run(load(port, rate, seconds))
            elapsed = time.monotonic() - t0
            a = metric(admin, "retrygate_upstream_attempts_total") - a0
            r = metric(admin, "retrygate_upstream_requests_total") - r0
            h = metric(admin, "retrygate_upstream_hedges_total") - h0
            w = metric(admin, "retrygate_upstream_hedges_won_total") - w0
        finally:
            proc.terminate()
            proc.wait(10)
    return {"after": after, "requests": len(lat), "p50_ms": pct(lat, 0.50) * 1e3,
            "p99_ms": pct(lat, 0.99) * 1e3, "p999_ms": pct(lat, 0.999) * 1e3,
            "max_ms": max(lat) * 1e3 if lat else float("nan"),
            "extra_attempts_pct": (a / r - 1) * 100 if r else float("nan"),
            "hedges": int(h), "hedges_won": int(w), "attempts": int(a), "upstream_requests": int(r),
            "seconds": elapsed}


def direct(ports, rate, seconds):
    """The generator and upstream alone, no retrygate: the floor under every other row."""
    lat, _ = asyncio.run(load(ports[0], rate, seconds))
    return {"after": "direct", "requests": len(lat), "p50_ms": pct(lat, 0.50) * 1e3,
            "p99_ms": pct(lat, 0.99) * 1e3, "p999_ms": pct(lat, 0.999) * 1e3,
            "max_ms": max(lat) * 1e3 if lat else float("nan"), "extra_attempts_pct": 0.0,
            "hedges": 0, "hedges_won": 0}


def print_row(n, r):
    print("%-10s %-6s %8d %8.1f %8.1f %8.1f %8.1f %7.2f %4d/%-4d" % (
        n, r["after"], r["requests"], r["p50_ms"], r["p99_ms"], r["p999_ms"], r["max_ms"],
        r["extra_attempts_pct"], r["hedges"], r["hedges_won"]))
    sys.stdout.flush()


def failing_rows(binary, args, results):
    """Every answer a 503, hedging on, retries on: extra attempts stay within the budget."""
    ports = [free_port() for _ in range(2)]
    up = multiprocessing.Process(target=upstream_main, args=(ports, 0.0, 1, FAIL), daemon=True)
    up.start()
    time.sleep(0.5)
    ok = True
    try:
        for after in ("20ms", "p95"):
            r = run_one(binary, ports, after, args.rate, args.seconds,
                        2.0 if after == "p95" else 0, failing=True)
            extra = r["attempts"] - r["upstream_requests"]
            bound = (BUDGET["max_tokens"] + BUDGET["ratio"] * r["upstream_requests"] +
                     BUDGET["min_per_second"] * r["seconds"])
            r.update(endpoints="2 (503)", extra=extra, bound=bound, ok=extra <= bound)
            ok = ok and r["ok"]
            results.append(r)
            print("%-10s %-6s %8d attempts/requests %.3f; retries+hedges %d <= bound %.0f "
                  "(%d + %.1f*%d + %d*%.1fs): %s; hedges %d" % (
                      "2 (503)", after, r["requests"],
                      r["attempts"] / max(1, r["upstream_requests"]), extra, bound,
                      BUDGET["max_tokens"], BUDGET["ratio"], r["upstream_requests"],
                      BUDGET["min_per_second"], r["seconds"], "PASS" if r["ok"] else "FAIL",
                      r["hedges"]))
            sys.stdout.flush()
    finally:
        up.terminate()
        up.join(5)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=300)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--late", type=float, default=0.015)
    ap.add_argument("--endpoints", type=int, default=0, help="0: both variants (2 and 1)")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--no-failing", action="store_true", help="skip the failing-upstream rows")
    args = ap.parse_args()
    binary = os.environ.get("RETRYGATE_BIN", str(ROOT / "build" / "retrygate"))
    results = []
    variants = [args.endpoints] if args.endpoints else [2, 1]
    print("rate %g/s for %gs per row, %.1f%% of responses 100-200 ms late; load avg %s"
          % (args.rate, args.seconds, args.late * 100, os.getloadavg()[0]))
    print("%-10s %-6s %8s %8s %8s %8s %8s %7s %7s" % ("endpoints", "after", "requests", "p50ms",
                                                       "p99ms", "p99.9ms", "maxms", "extra%",
                                                       "hedges"))
    for n in variants:
        ports = [free_port() for _ in range(n)]
        up = multiprocessing.Process(target=upstream_main, args=(ports, args.late, 1),
                                     daemon=True)
        up.start()
        time.sleep(0.5)
        try:
            r = direct(ports, args.rate, args.seconds)
            r["endpoints"] = n
            results.append(r)
            print_row(n, r)
            for after in ("0ms", "20ms", "p95"):
                r = run_one(binary, ports, after, args.rate, args.seconds,
                            2.0 if after == "p95" else 0)
                r["endpoints"] = n
                results.append(r)
                print_row(n, r)
        finally:
            up.terminate()
            up.join(5)
    ok = args.no_failing or failing_rows(binary, args, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
