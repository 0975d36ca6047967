#!/usr/bin/env python3
"""The tail bench of SPEC §14 (issue 29): what hedging does to the latency tail.

An upstream (tests/bench/upstream.c with late=, one process per port, HTTP/1.1 keep-alive)
answers at once, except that each response is late with probability --late (default 1.5%,
drawn per request) by 100-200 ms, uniform; a late response holds back the later ones of its
connection, as a keep-alive server's would. It listens on --endpoints ports ("two endpoints"),
or on one ("one address", as behind a Kubernetes ClusterIP: a hedge goes over another
connection to the same address). A steady open-loop load (tests/bench/openloop.c: --rate
requests a second for --seconds, each sent at its scheduled time on an idle keep-alive
connection or a new one, its latency counted from that time, so a stall is not hidden) goes
through retrygate with retry.hedge.after off, 20ms and p95, after a "direct" row (the same load
straight at the upstream: the floor under the other rows). Printed per run: p50, p99, p99.9 and
max latency, the requests, the extra attempts (attempts / requests - 1, from /metrics) with the
hedges sent and won, and how late the generator itself sent (p99 of send - schedule: the
machine's noise). Then the failing rows: every answer a 503 (a fifth of them 100-200 ms late,
so that hedges go as well as retries), hedging and retries on; retries and hedges together
must stay within the budget's bound (PASS/FAIL; exit status 1 on a FAIL).

    tests/bench/tail.py                      # both variants, direct + three settings, failing rows
    tests/bench/tail.py --rate 200 --seconds 10 --endpoints 1
    tests/bench/tail.py --late 0 --no-failing   # the floor: no late responses at all
    RETRYGATE_BIN=build/san/retrygate tests/bench/tail.py --seconds 5

Needs python3, gcc and build/retrygate. With --runs N each row runs N times and the run whose
generator sent most punctually is kept (a busy machine delays the generator too).
"""

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# the budget of the failing rows (SPEC §4): retries and hedges <= max_tokens + ratio * requests
# + min_per_second * t
BUDGET = {"ratio": 0.2, "min_per_second": 10, "max_tokens": 100}
# the share of the failing rows' 503s that come 100-200 ms late: hedges go too, not only retries
FAIL_LATE = 0.2


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def wait_port(port):
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("nothing listens on port %d" % port)


RT = {}     # --rt: the preexec_fn of every process of the bench


def realtime():
    """Run as SCHED_FIFO 1 (--rt): other work on a shared machine no longer delays the
    bench's processes (none of them spins: a few % of a core at 300 requests a second)."""
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))


class Tools:
    """openloop and upstream compiled into a temporary directory."""

    def __init__(self, d):
        self.openloop = Path(d) / "openloop"
        self.upstream = Path(d) / "upstream"
        for src, out in (("openloop.c", self.openloop), ("upstream.c", self.upstream)):
            subprocess.run(["gcc", "-O2", "-Wall", "-Wextra", "-o", str(out), str(HERE / src)],
                           check=True)

    def upstreams(self, ports, late, seed, status=200):
        """One upstream process per port, each with its own seed: lateness independent per
        request."""
        procs = [subprocess.Popen([str(self.upstream), str(p), "2", "h1", "late=%g" % late,
                                   "seed=%d" % (seed + i), "status=%d" % status], **RT)
                 for i, p in enumerate(ports)]
        for p in ports:
            wait_port(p)
        return procs

    def load(self, port, rate, seconds):
        out = subprocess.run([str(self.openloop), str(port), "%g" % rate, "%g" % seconds],
                             check=True, stdout=subprocess.PIPE, **RT).stdout
        return json.loads(out)


def stop(procs):
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(10)


def figures(o):
    """openloop's JSON as a row's latency figures (ms)."""
    return {"requests": o["requests"], "answered": o["answered"], "errors": o["errors"],
            "p50_ms": o["p50_us"] / 1e3, "p90_ms": o["p90_us"] / 1e3, "p99_ms": o["p99_us"] / 1e3,
            "p999_ms": o["p999_us"] / 1e3, "max_ms": o["max_us"] / 1e3,
            "send_lag_p99_ms": o["send_lag_p99_us"] / 1e3, "connections": o["connections"]}


def metric(admin, name):
    text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % admin, timeout=5).read()
    total = 0.0
    for line in text.decode().splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_one(tools, binary, ports, after, rate, seconds, warm, failing=False):
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
                                stderr=subprocess.DEVNULL, **RT)
        try:
            wait_port(port)
            if warm:
                # p95 needs 100 first attempts in its window: a warm-up, not measured
                tools.load(port, rate, warm)
            names = ("attempts", "requests", "hedges", "hedges_won")
            m0 = [metric(admin, "retrygate_upstream_%s_total" % n) for n in names]
            t0 = time.monotonic()
            o = tools.load(port, rate, seconds)
            elapsed = time.monotonic() - t0
            a, r, h, w = [metric(admin, "retrygate_upstream_%s_total" % n) - m0[i]
                          for i, n in enumerate(names)]
        finally:
            proc.terminate()
            proc.wait(10)
    row = {"after": after, "extra_attempts_pct": (a / r - 1) * 100 if r else float("nan"),
           "hedges": int(h), "hedges_won": int(w), "attempts": int(a), "upstream_requests": int(r),
           "seconds": elapsed}
    row.update(figures(o))
    return row


def best_of(runs, fn):
    """FN() RUNS times: the run whose generator sent most punctually (the quietest machine)."""
    rows = [fn() for _ in range(runs)]
    return min(rows, key=lambda r: r["send_lag_p99_ms"])


HEAD = "%-9s %-6s %7s %7s %7s %7s %7s %7s %6s %9s %6s" % (
    "endpoints", "after", "reqs", "p50ms", "p90ms", "p99ms", "p99.9ms", "maxms", "extra%",
    "hedges", "lagms")


def print_row(n, r):
    print("%-9s %-6s %7d %7.2f %7.2f %7.2f %7.2f %7.1f %6.2f %4d/%-4d %6.2f%s" % (
        n, r["after"], r["requests"], r["p50_ms"], r["p90_ms"], r["p99_ms"], r["p999_ms"],
        r["max_ms"], r["extra_attempts_pct"], r["hedges"], r["hedges_won"], r["send_lag_p99_ms"],
        " ERRORS %d" % r["errors"] if r["errors"] else ""))
    sys.stdout.flush()


def failing_rows(tools, binary, args, results):
    """Every answer a 503 (a fifth of them late, so that hedges fire), hedging on, retries on:
    hedges and retries together stay within the budget's bound."""
    ports = [free_port() for _ in range(2)]
    ups = tools.upstreams(ports, FAIL_LATE, 1, status=503)
    ok = True
    try:
        for after in ("20ms", "p95"):
            r = run_one(tools, binary, ports, after, args.rate, args.seconds,
                        2.0 if after == "p95" else 0, failing=True)
            extra = r["attempts"] - r["upstream_requests"]
            bound = (BUDGET["max_tokens"] + BUDGET["ratio"] * r["upstream_requests"] +
                     BUDGET["min_per_second"] * r["seconds"])
            r.update(endpoints="2 (503)", extra=extra, bound=bound, ok=extra <= bound)
            ok = ok and r["ok"]
            results.append(r)
            print("%-9s %-6s %7d attempts/requests %.3f; retries+hedges %d <= bound %.0f "
                  "(%d + %.1f*%d + %d*%.1fs): %s; hedges %d" % (
                      "2 (503)", after, r["requests"],
                      r["attempts"] / max(1, r["upstream_requests"]), extra, bound,
                      BUDGET["max_tokens"], BUDGET["ratio"], r["upstream_requests"],
                      BUDGET["min_per_second"], r["seconds"], "PASS" if r["ok"] else "FAIL",
                      r["hedges"]))
            sys.stdout.flush()
    finally:
        stop(ups)
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=float, default=300)
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--late", type=float, default=0.015)
    ap.add_argument("--endpoints", type=int, default=0, help="0: both variants (2 and 1)")
    ap.add_argument("--runs", type=int, default=1, help="runs per row; the quietest is kept")
    ap.add_argument("--rt", action="store_true",
                    help="run generator, upstream and retrygate as SCHED_FIFO (root or "
                         "CAP_SYS_NICE): the software's tail without the machine's other work")
    ap.add_argument("--json", help="also write the results here")
    ap.add_argument("--no-failing", action="store_true", help="skip the failing-upstream rows")
    args = ap.parse_args()
    binary = os.environ.get("RETRYGATE_BIN", str(ROOT / "build" / "retrygate"))
    if args.rt:
        RT["preexec_fn"] = realtime
    results = []
    variants = [args.endpoints] if args.endpoints else [2, 1]
    print("rate %g/s for %gs per row, %.1f%% of responses 100-200 ms late; load avg %.1f%s; "
          "lagms: p99 of how late the generator sent" % (
              args.rate, args.seconds, args.late * 100, os.getloadavg()[0],
              "; SCHED_FIFO" if args.rt else ""))
    print(HEAD)
    with tempfile.TemporaryDirectory() as d:
        tools = Tools(d)
        for n in variants:
            ports = [free_port() for _ in range(n)]
            ups = tools.upstreams(ports, args.late, 1)
            try:
                r = best_of(args.runs, lambda: dict(
                    figures(tools.load(ports[0], args.rate, args.seconds)), after="direct",
                    extra_attempts_pct=0.0, hedges=0, hedges_won=0))
                r["endpoints"] = n
                results.append(r)
                print_row(n, r)
                for after in ("0ms", "20ms", "p95"):
                    r = best_of(args.runs, lambda: run_one(
                        tools, binary, ports, after, args.rate, args.seconds,
                        2.0 if after == "p95" else 0))
                    r["endpoints"] = n
                    results.append(r)
                    print_row(n, r)
            finally:
                stop(ups)
        ok = args.no_failing or failing_rows(tools, binary, args, results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
