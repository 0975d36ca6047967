"""The gRPC round of `make demo` (run by tests/tools/demo.py after the HTTP rounds).

The same idea as the HTTP round, with gRPC on both sides (SPEC §10): a grpcio dependency
(tests/tools/grpcserver.py, its own process) follows healthy -> outage (UNAVAILABLE for most
calls; some of them fail *after* executing, so the caller cannot tell "failed" from "done") ->
overloaded (UNAVAILABLE with grpc-retry-pushback-ms: 1500 above its capacity) -> recovered. A
grpcio client (its own retries off) sends a fixed-rate mix of reads (/test.Catalog/Get, an
idempotent service), writes with an idempotency-key and writes without one (/test.Svc/Unary),
each with a 1 s deadline, through retrygate twice:

  naive      every UNAVAILABLE retried, up to 3 attempts, no budget, pushback ignored
             (what `non_idempotent: always` and a huge budget amount to)
  retrygate  the default policy: reads are idempotent by `retry.idempotent_paths`, keyed writes
             by their key, unkeyed writes are not re-sent once they may have executed; the
             budget bounds the retries; pushback is obeyed (a 1500 ms pushback does not fit a
             1 s deadline, so the UNAVAILABLE goes back at once)

The dependency deduplicates keyed writes (as a service that honours keys does), so duplicate
side effects can only come from unkeyed writes re-sent blindly.

    gn, gg = grpc_round(procs, binary, workdir, quick, stop, log)
    grpc_table(gn, gg)  grpc_explain(gn, gg)  grpc_acceptance(gn, gg)

PROCS is demo.py's Processes (spawn(name, args, **popen) and stop(p)); the work directory gets
grpc-TAG.yaml, the logs of retrygate and of the dependency, grpc-TAG-requests.json (what the
client saw) and grpc-TAG-calls.json (what the dependency saw) per run.
"""

import json
import re
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc

from demo_common import LOOPBACK, PYTHON, http_call, metric, pct, plan, read_metrics
from demo_common import start_retrygate as start_retrygate_on
from flaky import Timeline

HERE = Path(__file__).resolve().parent

FULL = {"phases": [("healthy", 1.5), ("outage", 4.5), ("overloaded", 2.5), ("recovered", 1.5)],
        "rate": 80.0}
QUICK = {"phases": [("healthy", 0.6), ("outage", 1.6), ("overloaded", 1.0), ("recovered", 0.8)],
         "rate": 60.0}
FAIL_RATE = 0.8             # outage: share of calls failing UNAVAILABLE
EXECUTED_RATE = 0.4         # of those, share that executed before failing
CAPACITY_FRACTION = 0.5     # overloaded: the dependency serves this fraction of the rate
# overloaded: the pushback it asks for. More than the deadline, with a margin: grpcio rounds
# the grpc-timeout it sends up (1 s goes out as about 1010 ms), so a 1000 ms pushback would fit
# what retrygate is told and be waited for, while the client gives up at its own 1 s.
PUSHBACK_MS = 1500
DEADLINE_S = 1.0
READ, WRITE = "/test.Catalog/Get", "/test.Svc/Unary"
MIX = (("read", 0.4), ("write-key", 0.3), ("write-nokey", 0.3))
SEED = 20261201

NAIVE_RETRY = {
    "max_attempts": 3,
    "on": ["connect-failure", "reset", "timeout", 502, 503, 504, "unavailable"],
    "retry_after": {"honor": False},
    "budget": {"ratio": 100, "min_per_second": 100000, "max_tokens": 1000000},
    "non_idempotent": "always",
}
NAIVE_CONCURRENCY = {"max_in_flight": 10000, "max_retries_in_flight": 10000}
# retrygate's defaults (SPEC §2), with the demo's budget ratio of the HTTP round and the read
# service declared idempotent
DEFAULT_RETRY = {
    "max_attempts": 3,
    "on": ["connect-failure", "reset", "timeout", 502, 503, 504, "unavailable"],
    "retry_after": {"honor": True, "max": "10s"},
    "budget": {"ratio": 0.1, "min_per_second": 10, "max_tokens": 100},
    "non_idempotent": "require-key",
    "idempotent_paths": ["/test.Catalog/"],
}
DEFAULT_CONCURRENCY = {"max_in_flight": 256, "max_retries_in_flight": 32}


# ----------------------------------------------------------------------------- processes

def start_dependency(procs, workdir, phases, capacity, tag):
    spec = ",".join("%s:%g" % p for p in phases)
    log = workdir / ("grpcserver-%s.log" % tag)
    p = procs.spawn("grpcserver-" + tag,
                    [PYTHON, str(HERE / "grpcserver.py"), "--phases", spec,
                     "--fail-rate", str(FAIL_RATE), "--executed-rate", str(EXECUTED_RATE),
                     "--capacity", "%g" % capacity, "--pushback-ms", str(PUSHBACK_MS),
                     "--seed", str(SEED), "--dedupe"],
                    stdout=subprocess.PIPE, stderr=open(log, "w"), text=True)
    ready, _, _ = select.select([p.stdout], [], [], 15)
    m = re.match(r"grpc \S+:(\d+) stats \S+:(\d+)", p.stdout.readline() if ready else "")
    if not m:
        raise RuntimeError("grpcserver.py did not start (see %s)" % log)
    return p, int(m.group(1)), int(m.group(2))


def start_retrygate(procs, binary, workdir, tag, title, dep_port, retry, concurrency):
    cfg = workdir / ("grpc-%s.yaml" % tag)
    p, port, admin = start_retrygate_on(
        procs, binary, cfg, workdir / ("retrygate-grpc-%s.log" % tag), title,
        "tests/tools/demo_grpc.py", ["%s:%d" % (LOOPBACK, dep_port)],
        {"protocol": "h2", "retry": retry, "concurrency": concurrency}, "retrygate-grpc-" + tag)
    return p, port, admin, cfg


# ----------------------------------------------------------------------------- load

def drive(port, load, timeline, tag, stop):
    """Open loop: each call is started at its time as a grpcio future; the callbacks record
    what the client saw. Returns the records once every call has ended."""
    stop.defer = True               # a signal now sets stop only (see demo.py's on_signal)
    ch = grpc.insecure_channel("%s:%d" % (LOOPBACK, port), options=[("grpc.enable_retries", 0)])
    try:
        ready = grpc.channel_ready_future(ch)
        end = time.monotonic() + 5
        while not stop.is_set():
            try:
                ready.result(timeout=min(0.1, max(0.0, end - time.monotonic())))
                break
            except grpc.FutureTimeoutError:
                if time.monotonic() >= end:
                    raise RuntimeError("retrygate at port %d did not accept gRPC" % port)
        if stop.is_set():
            return []
        stubs = {READ: ch.unary_unary(READ), WRITE: ch.unary_unary(WRITE)}
        records, lock, futs = [], threading.Lock(), []

        def done(f, rec, t0):
            rec["latency"] = time.monotonic() - t0
            md = dict(tuple(f.initial_metadata() or ()) + tuple(f.trailing_metadata() or ()))
            rec["code"] = f.code().name.lower().replace("_", "-")
            rec["attempts"] = md.get("x-retrygate-attempts")
            rec["refused"] = md.get("x-retrygate-retry-refused")
            with lock:
                records.append(rec)

        for i, kind, offset in load:
            at = timeline.start + offset
            while not stop.is_set() and time.monotonic() < at:
                time.sleep(min(at - time.monotonic(), 0.05))
            if stop.is_set():
                break
            intent = "g%s-%05d" % (tag, i)
            md = [("x-key", intent)]
            if kind == "write-key":
                md.append(("idempotency-key", "key-" + intent))
            t0 = time.monotonic()
            rec = {"i": i, "intent": intent, "kind": kind, "phase": timeline.phase_at(t0)}
            f = stubs[READ if kind == "read" else WRITE].future(
                intent.encode(), metadata=md, timeout=DEADLINE_S)
            f.add_done_callback(lambda f, rec=rec, t0=t0: done(f, rec, t0))
            futs.append(f)
        end = time.monotonic() + DEADLINE_S + 10
        for f in futs:
            while not stop.is_set() and time.monotonic() < end:
                try:
                    f.result(timeout=min(0.1, max(0.0, end - time.monotonic())))
                    break
                except grpc.FutureCancelledError:
                    break
                except grpc.FutureTimeoutError:
                    pass
                except grpc.RpcError:
                    break
            if stop.is_set():
                for g in futs:
                    g.cancel()
                return []
        time.sleep(0.05)            # the last callbacks
        with lock:
            return sorted(records, key=lambda r: r["i"])
    finally:
        ch.close()
        stop.defer = False


# ----------------------------------------------------------------------------- one run

def run_policy(procs, binary, workdir, scenario, tag, title, retry, concurrency, stop, log):
    phases, rate = scenario["phases"], scenario["rate"]
    dep, dep_port, stats_port = start_dependency(procs, workdir, phases,
                                                 CAPACITY_FRACTION * rate, tag)
    rg, port, admin, cfg = start_retrygate(procs, binary, workdir, tag, title, dep_port, retry,
                                           concurrency)
    log("grpc-%s: %s  (config %s)" % (tag, title, cfg))
    log("    running %gs of gRPC load at %g calls/s: %s" % (
        sum(s for _, s in phases), rate, " -> ".join("%s %gs" % p for p in phases)))
    load = plan(rate, sum(s for _, s in phases), MIX, SEED)
    tl = Timeline(phases, time.monotonic() + 0.3)
    http_call(stats_port, "POST", "/start?at=%.6f" % tl.start)
    records = drive(port, load, tl, tag, stop)
    if stop.is_set():
        raise KeyboardInterrupt
    # a call whose client gave up may still have an attempt out: let it end before the counts
    end = time.monotonic() + 3
    while time.monotonic() < end and metric(read_metrics(admin), "retrygate_upstream_in_flight"):
        time.sleep(0.05)
    metrics = read_metrics(admin)
    calls = json.loads(http_call(stats_port, "GET", "/calls", timeout=10)[2])
    stats = json.loads(http_call(stats_port, "GET", "/stats", timeout=10)[2])
    (workdir / ("grpc-%s-calls.json" % tag)).write_text(json.dumps(calls, indent=0))
    (workdir / ("grpc-%s-requests.json" % tag)).write_text(json.dumps(records, indent=0))
    rc = procs.stop(rg)
    procs.stop(dep)
    return summarize(tag, title, scenario, retry, records, calls, stats, metrics, rc, tl, load)


def summarize(tag, title, scenario, retry, records, calls, stats, metrics, rc, tl, load):
    kinds = {r["intent"]: r["kind"] for r in records}
    sent_in = lambda p: [r for r in records if r["phase"] == p]      # noqa: E731
    seen_in = lambda p: [c for c in calls if c["phase"] == p]        # noqa: E731
    att_outage = seen_in("outage")
    first_outage = [c for c in att_outage if c["metadata"].get("x-retrygate-attempt") == "1"]
    req_outage = len(sent_in("outage"))
    # SPEC §4's bound over the outage as the dependency saw it (no call failed before it, so
    # every retry it received then was decided then): F first attempts plus at most
    # max_tokens + ratio x (first attempts that earned tokens) + min_per_second x t retries
    earners = {r["intent"] for r in sent_in("outage")} | {c["key"] for c in first_outage}
    b = retry["budget"]
    t_outage = tl.duration("outage")
    retries_max = b["max_tokens"] + b["ratio"] * len(earners) + b["min_per_second"] * t_outage
    attempts_max = min(len(first_outage) + retries_max, retry["max_attempts"] * len(earners))
    effects = stats["effects"]
    dup = {"write-key": 0, "write-nokey": 0}
    for intent, n in effects.items():
        if n > 1 and kinds.get(intent) in dup:
            dup[kinds[intent]] += n - 1
    sends = {}
    for c in calls:
        sends[c["key"]] = sends.get(c["key"], 0) + 1
    nokey = [r for r in records if r["kind"] == "write-nokey"]
    success = {}
    for p, _ in tl.phases:
        rs = sent_in(p)
        success[p] = sum(1 for r in rs if r["code"] == "ok") / len(rs) if rs else float("nan")
    refused = {}
    for (n, ls), v in metrics.items():
        ls = dict(ls)
        if n == "retrygate_upstream_retries_refused_total" and v:
            refused[ls.get("reason", "?")] = refused.get(ls.get("reason", "?"), 0) + v
    by_status = {}
    for (n, ls), v in metrics.items():
        ls = dict(ls)
        if n == "retrygate_upstream_grpc_responses_total" and v:
            by_status[ls.get("status", "?")] = by_status.get(ls.get("status", "?"), 0) + v
    lat = [r["latency"] for r in records]
    m_req = metric(metrics, "retrygate_upstream_requests_total")
    m_att = metric(metrics, "retrygate_upstream_attempts_total")
    return {
        "tag": tag, "title": title, "exit_code": rc,
        "planned": len(load), "calls": len(records),
        "unanswered": len(load) - len(records),
        "dep_attempts": len(calls),
        "outage_requests": req_outage, "outage_attempts": len(att_outage),
        "outage_first_attempts": len(first_outage), "outage_token_earners": len(earners),
        "outage_seconds": t_outage, "outage_attempts_max": attempts_max,
        "amp_outage": len(att_outage) / req_outage if req_outage else 0.0,
        "bound_outage": attempts_max / req_outage if req_outage else 0.0,
        "amp_overload": len(seen_in("overloaded")) / max(1, len(sent_in("overloaded"))),
        "budget": b, "max_attempts": retry["max_attempts"],
        "duplicates": dup["write-key"] + dup["write-nokey"], "duplicates_by_kind": dup,
        "nokey_resent": sum(1 for r in nokey if sends.get(r["intent"], 0) > 1),
        "nokey_failed_but_executed": sum(1 for r in nokey if r["code"] != "ok"
                                         and effects.get(r["intent"], 0) > 0),
        "success": success,
        "p50_ms": pct(lat, 0.5) * 1000, "p99_ms": pct(lat, 0.99) * 1000,
        "deadline_exceeded": sum(1 for r in records if r["code"] == "deadline-exceeded"),
        "dep_by_code": stats["by_code"],
        "metrics": {"requests_total": m_req, "attempts_total": m_att,
                    "amplification": m_att / m_req if m_req else 0.0,
                    "refused": dict(sorted(refused.items(), key=lambda kv: -kv[1])),
                    "grpc_responses": by_status},
    }


def grpc_round(procs, binary, workdir, quick, stop, log):
    scenario = QUICK if quick else FULL
    log("")
    log("gRPC round: the same idea with a grpcio dependency and a grpcio client.")
    out = []
    for tag, title, retry, conc in (
            ("naive", "naive: every UNAVAILABLE retried (3 attempts, no budget, "
             "non_idempotent: always, pushback ignored)", NAIVE_RETRY, NAIVE_CONCURRENCY),
            ("retrygate", "retrygate default policy (reads by idempotent_paths, budget "
             "ratio 0.1)", DEFAULT_RETRY, DEFAULT_CONCURRENCY)):
        out.append(run_policy(procs, binary, workdir, scenario, tag, title, retry, conc, stop,
                              log))
    return tuple(out)


# ----------------------------------------------------------------------------- report

def _pc(x):
    return "-" if x is None or x != x else "%.1f%%" % (x * 100)


def grpc_table(n, g):
    def su(r, p):
        return _pc(r["success"].get(p))

    def st(r):
        s = r["metrics"]["grpc_responses"]
        return "%d / %d" % (s.get("ok", 0), s.get("unavailable", 0))
    rows = [
        ("gRPC calls sent (same load both runs)", "%d" % n["calls"], "%d" % g["calls"]),
        ("attempts the dependency saw", "%d" % n["dep_attempts"], "%d" % g["dep_attempts"]),
        ("  amplification during the outage", "%.2fx" % n["amp_outage"],
         "%.2fx" % g["amp_outage"]),
        ("  its bound (budget, max_attempts)", "<= %.2fx" % n["bound_outage"],
         "<= %.2fx" % g["bound_outage"]),
        ("  amplification during the overload (pushback)", "%.2fx" % n["amp_overload"],
         "%.2fx" % g["amp_overload"]),
        ("duplicate side effects (unkeyed writes run twice)", "%d" % n["duplicates"],
         "%d" % g["duplicates"]),
        ("unkeyed writes re-sent", "%d" % n["nokey_resent"], "%d" % g["nokey_resent"]),
        ("unkeyed writes failed but executed (reconcile)",
         "%d" % n["nokey_failed_but_executed"], "%d" % g["nokey_failed_but_executed"]),
        ("success rate, healthy", su(n, "healthy"), su(g, "healthy")),
        ("success rate, outage", su(n, "outage"), su(g, "outage")),
        ("success rate, overloaded", su(n, "overloaded"), su(g, "overloaded")),
        ("success rate after recovery", su(n, "recovered"), su(g, "recovered")),
        ("latency p50 / p99 (ms)", "%.0f / %.0f" % (n["p50_ms"], n["p99_ms"]),
         "%.0f / %.0f" % (g["p50_ms"], g["p99_ms"])),
        ("grpc_responses_total ok / unavailable", st(n), st(g)),
    ]
    w0 = max(len(r[0]) for r in rows) + 2
    out = ["%-*s %18s %18s" % (w0, "", "naive retries", "retrygate default"),
           "%-*s %18s %18s" % (w0, "", "-" * 13, "-" * 17)]
    out += ["%-*s %18s %18s" % (w0, a, b, c) for a, b, c in rows]
    for r in (n, g):
        refused = r["metrics"]["refused"]
        out.append("    %s retries_refused_total{reason}: %s" % (
            r["tag"], ", ".join("%s=%d" % kv for kv in refused.items()) or "none"))
    return "\n".join(out)


def grpc_explain(n, g):
    return (
        "During the gRPC outage the naive policy sent the dependency %.2fx its traffic and ran "
        "%d unkeyed writes twice: an UNAVAILABLE does not say whether the call executed. "
        "retrygate retried reads (idempotent_paths) and keyed writes within its budget (%.2fx, "
        "bound %.2fx), re-sent no unkeyed write, and left %d unknown outcomes for the caller to "
        "reconcile instead of guessing. In the overload the dependency asked for %d ms of "
        "pushback: the naive policy came straight back (%.2fx), retrygate relayed the "
        "UNAVAILABLE at once (%.2fx), as the wait did not fit the 1 s deadline."
        % (n["amp_outage"], n["duplicates_by_kind"]["write-nokey"], g["amp_outage"],
           g["bound_outage"], g["nokey_failed_but_executed"], PUSHBACK_MS, n["amp_overload"],
           g["amp_overload"]))


def grpc_acceptance(n, g):
    expected = 1 + FAIL_RATE + FAIL_RATE ** 2          # 3 attempts at an 80% failure rate
    dep_unavail = g["dep_by_code"].get("unavailable", 0)
    checks = [
        ("gRPC retrygate: amplification during the outage %d/%d = %.3fx <= bound %.1f/%d = "
         "%.3fx" % (g["outage_attempts"], g["outage_requests"], g["amp_outage"],
                    g["outage_attempts_max"], g["outage_requests"], g["bound_outage"]),
         g["outage_requests"] > 0 and g["outage_attempts"] <= g["outage_attempts_max"] + 1e-9),
        ("gRPC retrygate: zero duplicate side effects (%d), no unkeyed write re-sent (%d)"
         % (g["duplicates"], g["nokey_resent"]),
         g["duplicates"] == 0 and g["nokey_resent"] == 0),
        ("gRPC retrygate: it retried (%d attempts for %d calls)"
         % (g["dep_attempts"], g["calls"]), g["dep_attempts"] > g["calls"]),
        ("gRPC retrygate: normal success rate %s >= 99%%" % _pc(g["success"].get("healthy")),
         (g["success"].get("healthy") or 0) >= 0.99),
        ("gRPC retrygate: success rate after recovery %s >= 95%%"
         % _pc(g["success"].get("recovered")), (g["success"].get("recovered") or 0) >= 0.95),
        ("gRPC retrygate: /metrics grpc_responses_total{status=\"unavailable\"} (%d) = the "
         "UNAVAILABLEs the dependency answered (%d)"
         % (g["metrics"]["grpc_responses"].get("unavailable", 0), dep_unavail),
         g["metrics"]["grpc_responses"].get("unavailable", 0) == dep_unavail > 0),
        ("gRPC retrygate: /metrics attempts_total (%d) = attempts the dependency saw (%d)"
         % (g["metrics"]["attempts_total"], g["dep_attempts"]),
         g["metrics"]["attempts_total"] == g["dep_attempts"]),
        ("gRPC naive: amplification during the outage %.2fx ~ 1 + f + f^2 = %.2fx (>= %.2fx)"
         % (n["amp_outage"], expected, 0.85 * expected), n["amp_outage"] >= 0.85 * expected),
        ("gRPC naive: duplicate side effects > 0 (%d)" % n["duplicates"], n["duplicates"] > 0),
        ("gRPC both runs: all %d planned calls sent and answered (%d, %d)"
         % (g["planned"], n["calls"], g["calls"]),
         n["unanswered"] == 0 and g["unanswered"] == 0 and n["calls"] == g["calls"]),
        ("gRPC both runs: retrygate exited 0 on SIGTERM (%s, %s)"
         % (n["exit_code"], g["exit_code"]), n["exit_code"] == 0 and g["exit_code"] == 0),
    ]
    return [("PASS" if ok else "FAIL", text) for text, ok in checks]


if __name__ == "__main__":
    sys.exit("run tests/tools/demo.py (make demo): this is its gRPC round")

