#!/usr/bin/env python3
"""`make demo`: the same load against the same flaky dependency, twice — once through
retrygate configured as a naive retry policy, once through retrygate's default policy — and a
side-by-side table of what the dependency went through.

    /usr/bin/python3 tests/tools/demo.py [--quick] [--json FILE] [--workdir DIR]
                                         [--round all|http|grpc|fleet]

The dependency (tests/tools/flaky.py, its own process) follows one timeline per run:
healthy -> outage (503s; some POSTs execute and then lose their response) -> overloaded (429/503
with Retry-After: 1 above its capacity) -> recovered. The driver sends a fixed-rate mix of GETs,
POSTs with an Idempotency-Key and POSTs without one, each with X-Timeout-Ms as its deadline.
After the load, it reconciles every POST whose outcome it did not learn: keyed ones are re-sent
with the same key (the dependency returns the stored result instead of paying again), unkeyed
ones are looked up by intent id.

Then a replica phase (SPEC §13): one upstream with two replicas (tests/tools/upstream.py), the
same budget, once without endpoint health and once with retrygate's default passive health; one
replica is stopped partway through, and a second table shows the success rate after its death,
the attempts it still got, and retrygate's ejection log line.

Then a fleet phase (SPEC §4 budget.shared, tests/tools/demo_fleet.py): several sidecars in
front of one dependency answering 503, once with a budget each, once with one budget shared
through a redis-server; a table shows the retries the dependency saw and each setup's bound
(not in --quick unless asked for with --round fleet).

Then a gRPC round (SPEC §10, tests/tools/demo_grpc.py): a grpcio dependency
(tests/tools/grpcserver.py) that goes UNAVAILABLE (some calls executed before failing) and then
overloaded (pushback), a grpcio client sending reads, keyed and unkeyed writes, once through a
naive policy that retries every UNAVAILABLE and once through retrygate's defaults; a third table
shows the amplification, the duplicate side effects and the success rates.

Acceptance (PASS/FAIL lines; exit 1 on any FAIL): retrygate's amplification during the outage
stays within the budget bound computed from the run's own numbers, retrygate causes no
duplicate side effect, normal success rate, deadlines kept, every unknown outcome reconciled;
and the naive policy shows its ~3x and its duplicates (so the comparison means something).

Amplification during a phase = attempts the dependency received in that phase / requests the
driver sent in it. Success rates are by the phase in which the dependency got a request's first
attempt. "Deadline kept" = answered within X-Timeout-Ms (+25 ms of client-side slack).

--quick (or DEMO_QUICK=1): shorter phases, ~15 s in all (tests/integration/test_demo.py).
The binary is $RETRYGATE_BIN, else build/retrygate. The work directory (default build/demo/)
gets both configs, the logs of retrygate and of the dependency, the pids started, and per run
NAME-requests.json (what the client saw) and NAME-attempts.json (what the dependency saw).
DEMO_TIMING=1 prints where the time goes. Everything started here is stopped on exit, on an
error and on Ctrl-C / SIGTERM (and killed by the kernel if the demo itself is killed).
"""

import argparse
import atexit
import ctypes
import http.client
import json
import os
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from demo_fleet import fleet_acceptance, fleet_phase, fleet_table     # N sidecars, one budget
from demo_grpc import grpc_acceptance, grpc_explain, grpc_round, grpc_table   # the gRPC round
from demo_common import LOOPBACK, PYTHON, free_port, http_call, metric, pct, plan, read_metrics
from demo_common import start_retrygate as start_retrygate_on
from flaky import Timeline      # the dependency's own clock of phases (tests/tools/flaky.py)

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# ----------------------------------------------------------------------------- scenario

FULL = {"phases": [("healthy", 3.0), ("outage", 7.0), ("overloaded", 4.0), ("recovered", 4.0)],
        "rate": 100.0}
QUICK = {"phases": [("healthy", 1.0), ("outage", 2.5), ("overloaded", 1.5), ("recovered", 1.5)],
         "rate": 80.0}
# the replica phase: two replicas, one dies after DIE_AT of the phase (SPEC §13)
REPLICA = {"seconds": 6.0, "die_at": 1.5, "rate": 100.0}
REPLICA_QUICK = {"seconds": 3.0, "die_at": 0.8, "rate": 80.0}
DEADLINE_MS = 1000          # X-Timeout-Ms on every request
DEADLINE_SLACK_MS = 25      # client-side measuring slack (Python, loopback) for "deadline kept"
MIX = (("GET", 0.4), ("POST-key", 0.3), ("POST-nokey", 0.3))
DROP = 0.3                  # outage: fraction of POSTs executed then dropped
CAPACITY_FRACTION = 0.5     # overloaded: the dependency serves this fraction of the offered rate
SEED = 20240601
WORKERS = 48

NAIVE_RETRY = {
    "max_attempts": 3,
    "on": ["connect-failure", "reset", "timeout", 502, 503, 504, 429],
    "retry_after": {"honor": False},
    "budget": {"ratio": 100, "min_per_second": 100000, "max_tokens": 1000000},
    "non_idempotent": "always",
}
NAIVE_CONCURRENCY = {"max_in_flight": 10000, "max_retries_in_flight": 10000}
# retrygate's defaults (SPEC §2), written out so the bound below uses the very same numbers;
# only ratio differs from the default 0.2.
DEFAULT_RETRY = {
    "max_attempts": 3,
    "on": ["connect-failure", "reset", "timeout", 502, 503, 504],
    "retry_after": {"honor": True, "max": "10s"},
    "budget": {"ratio": 0.1, "min_per_second": 10, "max_tokens": 100},
    "non_idempotent": "require-key",
}
DEFAULT_CONCURRENCY = {"max_in_flight": 256, "max_retries_in_flight": 32}

# ----------------------------------------------------------------------------- processes


class Processes:
    """Every child process of the demo; stop_all() is idempotent and runs from finally,
    atexit and the signal handlers. Children run in their own session (a terminal Ctrl-C
    reaches only the demo, which stops them in order) and get SIGKILL from the kernel if the
    demo dies without cleaning up (PR_SET_PDEATHSIG)."""

    def __init__(self, pidfile=None):
        self.procs = []
        self.pidfile = pidfile
        self.lock = threading.Lock()

    @staticmethod
    def _pdeathsig():
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)     # PR_SET_PDEATHSIG
        except Exception:
            pass

    def spawn(self, name, args, **kw):
        p = subprocess.Popen(args, start_new_session=True, preexec_fn=self._pdeathsig, **kw)
        with self.lock:
            self.procs.append((name, p))
            if self.pidfile:
                with open(self.pidfile, "a") as f:
                    f.write("%s %d\n" % (name, p.pid))
        return p

    def stop(self, p, timeout=3.0):
        """SIGTERM, then SIGKILL after timeout; returns the exit code."""
        if p.poll() is None:
            try:
                p.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)
        for s in (p.stdout, p.stderr, p.stdin):
            if s:
                try:
                    s.close()
                except OSError:
                    pass
        return p.returncode

    def stop_all(self):
        with self.lock:
            procs, self.procs = self.procs, []
        for _, p in reversed(procs):
            try:
                self.stop(p)
            except Exception:
                try:
                    p.kill()
                except Exception:
                    pass


def start_flaky(procs, workdir, phases, capacity, tag):
    spec = ",".join("%s:%g" % p for p in phases)
    p = procs.spawn("flaky-" + tag,
                    [PYTHON, str(HERE / "flaky.py"), "--listen", "%s:0" % LOOPBACK,
                     "--phases", spec, "--drop", str(DROP), "--capacity", "%g" % capacity,
                     "--seed", str(SEED)],
                    stdout=subprocess.PIPE, stderr=open(workdir / ("flaky-%s.log" % tag), "w"),
                    text=True)
    ready, _, _ = select.select([p.stdout], [], [], 10)
    line = p.stdout.readline() if ready else ""
    m = re.search(r":(\d+)\s*$", line)
    if not m:
        raise RuntimeError("flaky.py did not start (see %s)" % (workdir / ("flaky-%s.log" % tag)))
    return p, int(m.group(1))


# ----------------------------------------------------------------------------- configs

def check_config(binary, path):
    """`retrygate --check`: the lines a newcomer should see (amplification, warnings)."""
    r = subprocess.run([str(binary), "-c", str(path), "--check"], capture_output=True,
                       text=True, timeout=10)
    if r.returncode != 0:
        raise RuntimeError("retrygate --check failed on %s:\n%s" % (path, r.stderr))
    keep = [ln.strip() for ln in r.stdout.splitlines()
            if ln.strip().startswith(("amplification", "warning"))]
    return keep


def start_retrygate(procs, binary, workdir, tag, title, dep_port, retry, concurrency):
    cfg = workdir / ("%s.yaml" % tag)
    check = []
    p, port, admin = start_retrygate_on(
        procs, binary, cfg, workdir / ("retrygate-%s.log" % tag), title, "tests/tools/demo.py",
        ["%s:%d" % (LOOPBACK, dep_port)], {"retry": retry, "concurrency": concurrency},
        "retrygate-" + tag, checked=lambda c: check.__setitem__(slice(None),
                                                              check_config(binary, c)))
    return p, port, admin, cfg, check


# ----------------------------------------------------------------------------- load

def make_request(i, kind, tag):
    intent = "%s-%05d" % (tag, i)
    headers = {"Host": "dependency", "X-Timeout-Ms": str(DEADLINE_MS), "X-Intent-Id": intent}
    if kind == "GET":
        return intent, "GET", "/items/%d" % i, headers, None
    body = json.dumps({"intent": intent, "amount_cents": 1000 + i % 97}).encode()
    headers["Content-Type"] = "application/json"
    if kind == "POST-key":
        headers["Idempotency-Key"] = "key-" + intent
    return intent, "POST", "/payments", headers, body


class Driver:
    """Open-loop, fixed-rate load from a pool of keep-alive http.client connections."""

    def __init__(self, port, timeline, rate, tag, stop):
        self.port, self.timeline, self.rate, self.tag, self.stop = port, timeline, rate, tag, stop
        self.q = queue.Queue()
        self.records = []
        self.lock = threading.Lock()

    def _one(self, conn, i, kind, send_at):
        intent, method, path, headers, body = make_request(i, kind, self.tag)
        t0 = time.monotonic()
        rec = {"i": i, "intent": intent, "kind": kind, "phase": self.timeline.phase_at(t0),
               "t": round(t0 - self.timeline.start, 6),
               "lag": t0 - send_at, "status": 0, "attempts": None, "refused": None,
               "reason": None}
        try:
            conn.request(method, path, body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            rec["status"] = r.status
            rec["attempts"] = r.getheader("X-Retrygate-Attempts")
            rec["refused"] = r.getheader("X-Retrygate-Retry-Refused")
            rec["reason"] = r.getheader("X-Retrygate-Reason")
            if r.will_close:
                conn.close()
        except (OSError, http.client.HTTPException) as e:
            rec["error"] = type(e).__name__
            conn.close()
        rec["latency"] = time.monotonic() - t0
        with self.lock:
            self.records.append(rec)

    def _worker(self):
        conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=DEADLINE_MS / 1000 + 5)
        try:
            while not self.stop.is_set():
                try:
                    item = self.q.get(timeout=0.1)
                except queue.Empty:
                    continue
                if item is None:
                    return
                self._one(conn, *item)
        finally:
            conn.close()

    def start(self):
        """Start the workers (before the timeline is set: thread start-up is not load)."""
        self.threads = [threading.Thread(target=self._worker, daemon=True)
                        for _ in range(WORKERS)]
        for t in self.threads:
            t.start()

    def run(self, load):
        start = self.timeline.start
        for i, kind, offset in load:
            at = start + offset
            while not self.stop.is_set():
                d = at - time.monotonic()
                if d <= 0:
                    break
                time.sleep(min(d, 0.05))
            if self.stop.is_set():
                break
            self.q.put((i, kind, at))
        for _ in self.threads:
            self.q.put(None)
        end = time.monotonic() + DEADLINE_MS / 1000 + 10
        for t in self.threads:
            t.join(max(0.0, end - time.monotonic()))
        return sorted(self.records, key=lambda r: r["i"])


class KeepAlive:
    """One keep-alive connection, reopened after an error or a Connection: close."""

    def __init__(self, port):
        self.port, self.conn = port, None

    def __call__(self, method, path, headers, body=None):
        for again in (True, False):
            if self.conn is None:
                self.conn = http.client.HTTPConnection(LOOPBACK, self.port, timeout=5)
            try:
                self.conn.request(method, path, body=body, headers=headers)
                r = self.conn.getresponse()
                data = r.read()
                if r.will_close:
                    self.close()
                return r.status, dict(r.getheaders()), data
            except (OSError, http.client.HTTPException):
                self.close()
                if not again:
                    raise

    def close(self):
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def reconcile(port, records, tag):
    """After recovery: learn the outcome of every POST the client did not get a 2xx for.
    Keyed: re-send the same key and body (the dependency replays or completes it, once).
    Unkeyed: query the payment by intent id. Returns counts."""
    unknown = [r for r in records if r["kind"] != "GET" and not 200 <= r["status"] < 300]
    out = {"unknown": len(unknown), "resolved": 0, "lost_but_paid": 0, "not_paid": 0,
           "completed_now": 0, "unresolved": []}
    lock = threading.Lock()

    def work(part):
        call, mine = KeepAlive(port), {k: 0 for k in out if k != "unresolved"}
        mine["unresolved"] = []
        try:
            _reconcile(call, part, tag, mine)
        finally:
            call.close()
        with lock:
            for k, v in mine.items():
                out[k] += v
    n = 4
    threads = [threading.Thread(target=work, args=(unknown[k::n],), daemon=True)
               for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    out["unknown"] = len(unknown)
    return out


def _reconcile(call, unknown, tag, out):
    for r in unknown:
        i = r["i"]
        intent, method, path, headers, body = make_request(i, r["kind"], tag)
        try:
            if r["kind"] == "POST-key":
                status, h, data = call(method, path, headers, body)
                if 200 <= status < 300:
                    out["resolved"] += 1
                    if h.get("Idempotent-Replayed") == "true":
                        out["lost_but_paid"] += 1
                    else:
                        out["completed_now"] += 1
                    continue
            else:
                h2 = {"Host": "dependency", "X-Timeout-Ms": str(DEADLINE_MS),
                      "X-Intent-Id": "reconcile-" + intent}
                status, _, data = call("GET", "/payments/" + intent, h2)
                if status == 200:
                    out["resolved"] += 1
                    out["lost_but_paid"] += 1
                    continue
                if status == 404:
                    out["resolved"] += 1
                    out["not_paid"] += 1
                    continue
        except (OSError, http.client.HTTPException) as e:
            status = type(e).__name__
        out["unresolved"].append((intent, status))


# ----------------------------------------------------------------------------- one run

def run_policy(procs, binary, workdir, scenario, tag, title, retry, concurrency, stop, log):
    phases, rate = scenario["phases"], scenario["rate"]
    total = sum(s for _, s in phases)
    flaky, dep_port = start_flaky(procs, workdir, phases, CAPACITY_FRACTION * rate, tag)
    rg, port, admin, cfg, check = start_retrygate(procs, binary, workdir, tag, title, dep_port,
                                                  retry, concurrency)
    log("%s: %s  (config %s)" % (tag, title, os.path.relpath(cfg, REPO)
                                 if str(cfg).startswith(str(REPO)) else cfg))
    for ln in check:
        log("    --check: " + ln)
    log("    running %gs of load at %g req/s: %s" % (total, rate, " -> ".join(
        "%s %gs" % p for p in phases)))
    driver = Driver(port, None, rate, tag, stop)
    driver.start()
    load = plan(rate, total, MIX, SEED)
    t0 = time.monotonic() + 0.2
    http_call(dep_port, "POST", "/_flaky/start?at=%.6f" % t0)
    driver.timeline = tl = Timeline(phases, t0)
    records = driver.run(load)
    if stop.is_set():
        raise KeyboardInterrupt
    T = [time.monotonic()]
    metrics = read_metrics(admin)
    stats_load = json.loads(http_call(dep_port, "GET", "/_flaky/stats", timeout=10)[2])
    # The phase a request met: where the dependency saw its first attempt (the driver's send
    # time can fall a few ms before a boundary the request then crosses).
    met = {}
    for a in stats_load["attempts"]:
        if a[4] == 1 and a[3] not in met:
            met[a[3]] = a[1]
    for r in records:
        r["met"] = met.get(r["intent"], r["phase"])
    (workdir / ("%s-requests.json" % tag)).write_text(json.dumps(records, indent=0))
    (workdir / ("%s-attempts.json" % tag)).write_text(json.dumps(stats_load["attempts"], indent=0))
    T.append(time.monotonic())
    recon = reconcile(port, records, tag)
    T.append(time.monotonic())
    stats_final = json.loads(http_call(dep_port, "GET", "/_flaky/stats", timeout=10)[2])
    rc = procs.stop(rg)
    T.append(time.monotonic())
    procs.stop(flaky)
    T.append(time.monotonic())
    if os.environ.get("DEMO_TIMING"):
        log("    timing: load ended %.2fs after t0; stats %.2fs, reconcile %.2fs, stop rg %.2fs, "
            "stop flaky %.2fs" % (T[0] - t0, T[1] - T[0], T[2] - T[1], T[3] - T[2], T[4] - T[3]))
    return summarize(tag, title, scenario, retry, records, metrics, stats_load, stats_final,
                     recon, rc, tl)


def summarize(tag, title, scenario, retry, records, metrics, stats_load, stats_final, recon, rc,
              tl):
    attempts = stats_load["attempts"]
    req_by_phase, ok_by_phase = {}, {}
    for r in records:
        req_by_phase[r["met"]] = req_by_phase.get(r["met"], 0) + 1
        if 200 <= r["status"] < 300:
            ok_by_phase[r["met"]] = ok_by_phase.get(r["met"], 0) + 1
    att_outage = [a for a in attempts if a[1] == "outage"]
    first_outage = sum(1 for a in att_outage if a[4] == 1)
    req_outage = sum(1 for r in records if r["phase"] == "outage")    # by send time
    t_outage = tl.duration("outage")
    b = retry["budget"]
    # SPEC §4: over any interval of length t, retries <= max_tokens + ratio * (first attempts)
    # + min_per_second * t. The window is the outage as the dependency saw it: no request failed
    # before it, so every retry it received in the window was decided in the window. The
    # attempts it saw there are F first attempts plus those retries. The first attempts that
    # earned tokens in the window were sent by the driver in it or reached the dependency in it:
    # E = |requests sent in the outage  U  first attempts received in it| (by intent).
    earners = ({r["intent"] for r in records if r["phase"] == "outage"}
               | {a[3] for a in att_outage if a[4] == 1})
    retries_max = b["max_tokens"] + b["ratio"] * len(earners) + b["min_per_second"] * t_outage
    attempts_max = min(first_outage + retries_max, retry["max_attempts"] * len(earners))
    bound = attempts_max / req_outage if req_outage else 0.0
    execs = stats_final["executions"]
    kinds = {r["intent"]: r["kind"] for r in records}
    dup = {"POST-key": 0, "POST-nokey": 0}
    for intent, n in execs.items():
        if n > 1 and intent in kinds:
            dup[kinds[intent]] += n - 1
    execs_load = stats_load["executions"]
    lost = sum(1 for r in records if r["kind"] != "GET" and not 200 <= r["status"] < 300
               and execs_load.get(r["intent"], 0) > 0)
    keyed = [r["intent"] for r in records if r["kind"] == "POST-key"]
    keyed_once = sum(1 for k in keyed if execs.get(k, 0) == 1)
    lat = [r["latency"] for r in records]
    kept = sum(1 for r in records if r["latency"] * 1000 <= DEADLINE_MS + DEADLINE_SLACK_MS)
    refused = {}
    for (n, ls), v in metrics.items():
        if n == "retrygate_upstream_retries_refused_total" and v:
            reason = dict(ls).get("reason", "?")
            refused[reason] = refused.get(reason, 0) + v
    m_req = metric(metrics, "retrygate_upstream_requests_total")
    m_att = metric(metrics, "retrygate_upstream_attempts_total")
    return {
        "tag": tag, "title": title, "exit_code": rc,
        "requests": len(records),
        "planned": int(scenario["rate"] * tl.total),
        "client_errors": sum(1 for r in records if r["status"] == 0),
        "dep_attempts": len(attempts),
        "amp_total": len(attempts) / len(records) if records else 0.0,
        "outage_requests": req_outage, "outage_attempts": len(att_outage),
        "outage_first_attempts": first_outage, "outage_seconds": t_outage,
        "outage_token_earners": len(earners), "outage_retries_max": retries_max,
        "outage_attempts_max": attempts_max,
        "amp_outage": len(att_outage) / req_outage if req_outage else 0.0,
        "amp_overload": (sum(1 for a in attempts if a[1] == "overloaded")
                         / max(1, sum(1 for r in records if r["phase"] == "overloaded"))),
        "bound_outage": bound, "budget": b,
        "max_attempts": retry["max_attempts"],
        "duplicates": dup["POST-key"] + dup["POST-nokey"], "duplicates_by_kind": dup,
        "lost_responses": lost,
        "recon": {k: v for k, v in recon.items()},
        "keyed_intents": len(keyed), "keyed_exactly_once": keyed_once,
        "success": {p: (ok_by_phase.get(p, 0) / n if n else float("nan"))
                    for p, n in req_by_phase.items()},
        "p50_ms": pct(lat, 0.50) * 1000, "p99_ms": pct(lat, 0.99) * 1000,
        "max_ms": max(lat) * 1000 if lat else float("nan"),
        "deadlines_kept": kept / len(records) if records else 0.0,
        "metrics": {"requests_total": m_req, "attempts_total": m_att,
                    "retries_total": metric(metrics, "retrygate_upstream_retries_total"),
                    "amplification": m_att / m_req if m_req else 0.0,
                    "refused": dict(sorted(refused.items(), key=lambda kv: -kv[1])),
                    "budget_tokens": metric(metrics, "retrygate_upstream_retry_budget_tokens")},
        "dep_counters": stats_final["counters"],
    }


# ----------------------------------------------------------------------------- a replica dies

def start_replica(procs, workdir, name):
    for _ in range(3):
        port = free_port()
        p = procs.spawn(name, [PYTHON, str(HERE / "upstream.py"), "--listen",
                               "%s:%d" % (LOOPBACK, port), "--quiet"],
                        stdout=subprocess.DEVNULL,
                        stderr=open(workdir / ("%s.log" % name), "w"))
        end = time.monotonic() + 5
        while time.monotonic() < end and p.poll() is None:
            try:
                socket.create_connection((LOOPBACK, port), timeout=0.2).close()
                return p, port
            except OSError:
                time.sleep(0.05)
        procs.stop(p)
    raise RuntimeError("replica %s did not start" % name)


def replica_run(procs, binary, workdir, spec, tag, title, retry, health, stop, log):
    """Two replicas behind one upstream; one is stopped (connections refused) partway through.
    Returns the success rate and attempt counts after its death."""
    (pa, a), (pb, b) = (start_replica(procs, workdir, "replica-a-" + tag),
                        start_replica(procs, workdir, "replica-b-" + tag))
    cfg = workdir / ("replica-%s.yaml" % tag)
    rlog = workdir / ("retrygate-replica-%s.log" % tag)
    p, port, admin = start_retrygate_on(
        procs, binary, cfg, rlog, title, "tests/tools/demo.py (replica phase)",
        ["%s:%d" % (LOOPBACK, a), "%s:%d" % (LOOPBACK, b)], {"retry": retry, "health": health},
        "retrygate-replica-" + tag)
    log("  %s: %d req/s for %.0fs, replica b dies at %.1fs" % (tag, spec["rate"], spec["seconds"],
                                                              spec["die_at"]))
    results, lock = [], threading.Lock()
    t0 = time.monotonic()
    died = {}

    def worker(k, nworkers):
        conn = None
        i = k
        while not stop.is_set():
            at = t0 + i / spec["rate"]
            if at - t0 >= spec["seconds"]:
                break
            time.sleep(max(0.0, at - time.monotonic()))
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
                conn.request("GET", "/item/%d" % i, headers={"X-Timeout-Ms": str(DEADLINE_MS)})
                r = conn.getresponse()
                r.read()
                st = r.status
                if r.getheader("Connection", "").lower() == "close":
                    conn.close()
                    conn = None
            except (OSError, http.client.HTTPException):
                st = 0
                conn = None
            with lock:
                results.append((at - t0, st))
            i += nworkers
        if conn:
            conn.close()

    nworkers = 8
    threads = [threading.Thread(target=worker, args=(k, nworkers), daemon=True)
               for k in range(nworkers)]
    for t in threads:
        t.start()
    time.sleep(max(0.0, t0 + spec["die_at"] - time.monotonic()))
    before = read_metrics(admin)
    procs.stop(pb, timeout=1.0)
    died["t"] = time.monotonic() - t0
    for t in threads:
        t.join(spec["seconds"] + 10)
    after = read_metrics(admin)
    rc = procs.stop(p)
    procs.stop(pa)
    dead_ep = "%s:%d" % (LOOPBACK, b)
    after_death = [st for t, st in results if t >= died["t"]]
    att = (metric(after, "retrygate_upstream_attempts_total")
           - metric(before, "retrygate_upstream_attempts_total"))
    req = (metric(after, "retrygate_upstream_requests_total")
           - metric(before, "retrygate_upstream_requests_total"))
    ejected = [ln.split("upstream ", 1)[1].strip() for ln in rlog.read_text().splitlines()
               if " ejected for " in ln]
    return {
        "tag": tag, "title": title, "exit_code": rc,
        "requests": len(after_death),
        "success": (sum(1 for st in after_death if st == 200) / len(after_death)
                    if after_death else float("nan")),
        "amplification": att / req if req else 0.0,
        "dead_attempts": (metric(after, "retrygate_endpoint_attempts_total", endpoint=dead_ep)
                          - metric(before, "retrygate_endpoint_attempts_total",
                                   endpoint=dead_ep)),
        "ejections": metric(after, "retrygate_endpoint_ejections_total", endpoint=dead_ep),
        "refused": metric(after, "retrygate_upstream_retries_refused_total"),
        "ejected_lines": ejected,
    }


REPLICA_NAIVE_HEALTH = {"passive": {"consecutive_failures": 0}}
REPLICA_DEFAULT_HEALTH = {"passive": {"consecutive_failures": 5, "base_ejection": "10s"}}


def replica_phase(procs, binary, workdir, quick, stop, log):
    spec = REPLICA_QUICK if quick else REPLICA
    log("")
    log("Replica phase: one upstream, two replicas; replica b dies (connections refused).")
    # the naive side: the same budget as retrygate's default, but no endpoint health
    naive = replica_run(procs, binary, workdir, spec, "naive",
                        "budget only, no endpoint health", DEFAULT_RETRY,
                        REPLICA_NAIVE_HEALTH, stop, log)
    good = replica_run(procs, binary, workdir, spec, "retrygate",
                       "retrygate default (budget + passive health)", DEFAULT_RETRY,
                       REPLICA_DEFAULT_HEALTH, stop, log)
    return naive, good


def replica_table(n, g):
    rows = [
        ("requests after replica b died", "%d" % n["requests"], "%d" % g["requests"]),
        ("success rate after it died", pc_s(n["success"]), pc_s(g["success"])),
        ("attempts per request after it died", "%.2fx" % n["amplification"],
         "%.2fx" % g["amplification"]),
        ("attempts sent to the dead replica", "%d" % n["dead_attempts"],
         "%d" % g["dead_attempts"]),
        ("ejections of the dead replica", "%d" % n["ejections"], "%d" % g["ejections"]),
        ("retries refused (budget)", "%d" % n["refused"], "%d" % g["refused"]),
    ]
    w0 = max(len(r[0]) for r in rows) + 2
    out = ["%-*s %18s %18s" % (w0, "", "no health", "retrygate default"),
           "%-*s %18s %18s" % (w0, "", "-" * 9, "-" * 17)]
    out += ["%-*s %18s %18s" % (w0, a, b, c) for a, b, c in rows]
    if g["ejected_lines"]:
        out.append("retrygate's log: " + g["ejected_lines"][0])
    return "\n".join(out)


def replica_acceptance(n, g):
    return [
        ("PASS" if g["ejections"] >= 1 else "FAIL",
         "replica phase: retrygate ejected the dead replica (%d ejections)" % g["ejections"]),
        ("PASS" if g["success"] >= 0.98 else "FAIL",
         "replica phase: retrygate's success after the death %s >= 98%%" % pc_s(g["success"])),
        ("PASS" if g["dead_attempts"] < n["dead_attempts"] else "FAIL",
         "replica phase: fewer attempts to the dead replica with health (%d) than without (%d)"
         % (g["dead_attempts"], n["dead_attempts"])),
    ]


# ----------------------------------------------------------------------------- report

def table(n, g):
    def f(x, spec):
        return spec % x if isinstance(x, (int, float)) and x == x else "-"

    def pc(x):
        return f(x * 100, "%.1f%%")

    rows = [
        ("requests sent (same load both runs)", n["requests"], g["requests"], "%d"),
        ("attempts the dependency saw", n["dep_attempts"], g["dep_attempts"], "%d"),
        ("  amplification, whole run", n["amp_total"], g["amp_total"], "%.2fx"),
        ("  amplification during the outage", n["amp_outage"], g["amp_outage"], "%.2fx"),
        ("  its bound (budget, max_attempts)", "<= %.2fx" % n["bound_outage"],
         "<= %.2fx" % g["bound_outage"], "%s"),
        ("  (outage: attempts / requests)",
         "%d / %d" % (n["outage_attempts"], n["outage_requests"]),
         "%d / %d" % (g["outage_attempts"], g["outage_requests"]), "%s"),
        ("  amplification during the overload", n["amp_overload"], g["amp_overload"], "%.2fx"),
        ("duplicate POST side effects", n["duplicates"], g["duplicates"], "%d"),
        ("  of which unkeyed / keyed",
         "%d / %d" % (n["duplicates_by_kind"]["POST-nokey"], n["duplicates_by_kind"]["POST-key"]),
         "%d / %d" % (g["duplicates_by_kind"]["POST-nokey"], g["duplicates_by_kind"]["POST-key"]),
         "%s"),
        ("POSTs paid but answered as failed", n["lost_responses"], g["lost_responses"], "%d"),
        ("unknown POST outcomes reconciled after recovery",
         "%d / %d" % (n["recon"]["resolved"], n["recon"]["unknown"]),
         "%d / %d" % (g["recon"]["resolved"], g["recon"]["unknown"]), "%s"),
        ("success rate, healthy (normal) *", pc(n["success"].get("healthy", float("nan"))),
         pc(g["success"].get("healthy", float("nan"))), "%s"),
        ("success rate, outage", pc(n["success"].get("outage", float("nan"))),
         pc(g["success"].get("outage", float("nan"))), "%s"),
        ("success rate, overloaded", pc(n["success"].get("overloaded", float("nan"))),
         pc(g["success"].get("overloaded", float("nan"))), "%s"),
        ("success rate after recovery", pc(n["success"].get("recovered", float("nan"))),
         pc(g["success"].get("recovered", float("nan"))), "%s"),
        ("latency p50 / p99 (ms)", "%.0f / %.0f" % (n["p50_ms"], n["p99_ms"]),
         "%.0f / %.0f" % (g["p50_ms"], g["p99_ms"]), "%s"),
        ("deadlines kept (<= X-Timeout-Ms %d)" % DEADLINE_MS, pc(n["deadlines_kept"]),
         pc(g["deadlines_kept"]), "%s"),
        ("/metrics attempts_total/requests_total",
         "%d/%d = %.2fx" % (n["metrics"]["attempts_total"], n["metrics"]["requests_total"],
                            n["metrics"]["amplification"]),
         "%d/%d = %.2fx" % (g["metrics"]["attempts_total"], g["metrics"]["requests_total"],
                            g["metrics"]["amplification"]), "%s"),
    ]
    w0 = max(len(r[0]) for r in rows) + 2
    out = ["%-*s %18s %18s" % (w0, "", "naive retries", "retrygate default"),
           "%-*s %18s %18s" % (w0, "", "-" * 13, "-" * 17)]
    for label, a, b, spec in rows:
        out.append("%-*s %18s %18s" % (w0, label, f(a, spec) if not isinstance(a, str) else a,
                                        f(b, spec) if not isinstance(b, str) else b))
    out.append("* by the phase in which the dependency got the request's first attempt")
    return "\n".join(out)


def explain(n, g):
    b = g["budget"]
    su = lambda r, p: r["success"].get(p)      # noqa: E731
    same = lambda x, y: x is not None and y is not None and abs(x - y) < 0.02   # noqa: E731
    within = g["outage_attempts"] <= g["outage_attempts_max"] + 1e-9
    refused = ", ".join("%s %d" % kv for kv in g["metrics"]["refused"].items()) or "none"
    parts = [
        "What the numbers show. Both runs carried the same %d requests. During the outage the "
        "naive policy sent the dependency %.2fx its normal traffic (%d attempts for %d requests): "
        "every failure was re-sent up to %d times, just when the dependency could least absorb "
        "it, and the extra attempts bought %s: %s of outage requests succeeded, against %s "
        "through retrygate."
        % (g["requests"], n["amp_outage"], n["outage_attempts"], n["outage_requests"],
           n["max_attempts"],
           "almost nothing" if (su(n, "outage") or 0) - (su(g, "outage") or 0) < 0.05
           else "some successes", pc_s(su(n, "outage")), pc_s(su(g, "outage"))),
        "retrygate's budget (each first attempt earns %g of a retry token, plus %g tokens/s, in "
        "a bucket of %g) kept it to %.2fx, %s the bound of %.2fx computed from this run's own "
        "counts; /metrics names the retries it refused: %s."
        % (b["ratio"], b["min_per_second"], b["max_tokens"], g["amp_outage"],
           "within" if within else "ABOVE", g["bound_outage"], refused),
        "In the overload the dependency served only part of the traffic: the naive policy re-sent "
        "every 429/503 at once, Retry-After ignored (%.2fx the traffic), and completed %s of the "
        "requests, %s retrygate's %s at %.2fx: retrygate honours Retry-After, and as a 1 s wait "
        "does not fit a 1000 ms deadline, it answered at once with the 429/503 and its "
        "Retry-After."
        % (n["amp_overload"], pc_s(su(n, "overloaded")),
           "the same share as" if same(su(n, "overloaded"), su(g, "overloaded")) else "vs",
           pc_s(su(g, "overloaded")), g["amp_overload"]),
        "The costliest difference is correctness: when the dependency took a payment and then "
        "lost the response, the naive policy replayed POSTs without an Idempotency-Key and "
        "charged %d extra payments; retrygate caused %d, because it does not replay a POST "
        "without a key once its outcome is unknown (reason non-idempotent), and keyed POSTs were "
        "deduplicated by the dependency in both runs."
        % (n["duplicates"], g["duplicates"]),
        "After recovery the client settled retrygate's %d unknown outcomes (same key re-sent, or "
        "the intent looked up): %d of them had in fact been paid — a failed call is not an "
        "undone one."
        % (g["recon"]["unknown"], g["recon"]["lost_but_paid"]),
    ]
    if (same(su(n, "healthy"), su(g, "healthy")) and same(su(n, "recovered"), su(g, "recovered"))
            and same(n["deadlines_kept"], g["deadlines_kept"])):
        parts.append("Normal success, success after recovery and deadlines kept are the same "
                     "in both runs: retries do not help a healthy dependency, and the deadline "
                     "is enforced by retrygate whatever the retry policy.")
    else:
        parts.append("Normal success (%s vs %s), success after recovery (%s vs %s) and "
                     "deadlines kept (%s vs %s) differ between the runs: look at the requests "
                     "in the work directory."
                     % (pc_s(su(n, "healthy")), pc_s(su(g, "healthy")),
                        pc_s(su(n, "recovered")), pc_s(su(g, "recovered")),
                        pc_s(n["deadlines_kept"]), pc_s(g["deadlines_kept"])))
    return " ".join(parts)


def pc_s(x):
    return "-" if x is None or x != x else "%.1f%%" % (x * 100)


def wrap(text, width=96):
    out, line = [], ""
    for w in text.split():
        if len(line) + len(w) + 1 > width:
            out.append(line)
            line = w
        else:
            line = (line + " " + w).strip()
    out.append(line)
    return "\n".join(out)


def acceptance(n, g):
    b = g["budget"]
    checks = [
        ("retrygate: amplification during the outage %d/%d = %.3fx <= bound %.1f/%d = %.3fx; "
         "bound = first attempts + max_tokens + ratio*requests + min_per_second*t = "
         "%d + %g + %g*%d + %g*%gs"
         % (g["outage_attempts"], g["outage_requests"], g["amp_outage"],
            g["outage_attempts_max"], g["outage_requests"], g["bound_outage"],
            g["outage_first_attempts"], b["max_tokens"], b["ratio"], g["outage_token_earners"],
            b["min_per_second"], g["outage_seconds"]),
         g["outage_requests"] > 0 and g["outage_attempts"] <= g["outage_attempts_max"] + 1e-9),
        ("retrygate: zero duplicate side effects (%d)" % g["duplicates"], g["duplicates"] == 0),
        ("retrygate: every unknown POST outcome reconciled after recovery (%d/%d), every keyed "
         "intent paid exactly once (%d/%d)"
         % (g["recon"]["resolved"], g["recon"]["unknown"], g["keyed_exactly_once"],
            g["keyed_intents"]),
         g["recon"]["resolved"] == g["recon"]["unknown"]
         and g["keyed_exactly_once"] == g["keyed_intents"]),
        ("retrygate: normal success rate %s >= 99%%" % pc_s(g["success"].get("healthy")),
         (g["success"].get("healthy") or 0) >= 0.99),
        ("retrygate: success rate after recovery %s >= 95%%" % pc_s(g["success"].get("recovered")),
         (g["success"].get("recovered") or 0) >= 0.95),
        ("retrygate: deadlines kept %s >= 99%%" % pc_s(g["deadlines_kept"]),
         g["deadlines_kept"] >= 0.99),
        ("retrygate: /metrics attempts_total (%d) = attempts the dependency saw (%d)"
         % (g["metrics"]["attempts_total"], g["dep_attempts"]),
         g["metrics"]["attempts_total"] == g["dep_attempts"]),
        ("naive: amplification during the outage %.2fx ~ max_attempts %d (>= %.1fx)"
         % (n["amp_outage"], n["max_attempts"], 0.85 * n["max_attempts"]),
         n["amp_outage"] >= 0.85 * n["max_attempts"]),
        ("naive: duplicate side effects > 0 (%d)" % n["duplicates"], n["duplicates"] > 0),
        ("both runs: all %d planned requests sent and answered (%d, %d; %d/%d without a response)"
         % (g["planned"], n["requests"], g["requests"], n["client_errors"], g["client_errors"]),
         n["requests"] == n["planned"] and g["requests"] == g["planned"]
         and n["client_errors"] == 0 and g["client_errors"] == 0),
        ("both runs: retrygate exited 0 on SIGTERM (%s, %s)" % (n["exit_code"], g["exit_code"]),
         n["exit_code"] == 0 and g["exit_code"] == 0),
    ]
    return [("PASS" if ok else "FAIL", text) for text, ok in checks]


def metrics_block(r):
    m = r["metrics"]
    lines = ["  %s: attempts_total/requests_total = %d/%d = %.2fx, retries_total %d, "
             "budget tokens left %.1f"
             % (r["title"], m["attempts_total"], m["requests_total"], m["amplification"],
                m["retries_total"], m["budget_tokens"])]
    if m["refused"]:
        lines.append("    retries_refused_total{reason}: " + ", ".join(
            "%s=%d" % kv for kv in m["refused"].items()))
    else:
        lines.append("    retries_refused_total{reason}: none — every retry it wanted, it sent")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main

class Interrupted(BaseException):
    pass


def main(argv=None):
    ap = argparse.ArgumentParser(description="naive retries vs retrygate on a flaky dependency")
    ap.add_argument("--quick", action="store_true", default=os.environ.get("DEMO_QUICK") == "1",
                    help="short phases, ~15 s (also DEMO_QUICK=1)")
    ap.add_argument("--workdir", default=str(REPO / "build" / "demo"),
                    help="configs, logs, pid file (default build/demo)")
    ap.add_argument("--json", help="also write the results as JSON to this file")
    ap.add_argument("--round", choices=("all", "http", "grpc", "fleet"), default="all",
                    help="run only the HTTP rounds (both runs, the replica and fleet phases), "
                    "only the gRPC round or only the fleet phase (default: all)")
    ap.add_argument("--binary", default=os.environ.get("RETRYGATE_BIN")
                    or str(REPO / "build" / "retrygate"))
    a = ap.parse_args(argv)
    scenario = QUICK if a.quick else FULL
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    binary = Path(a.binary)
    if not os.access(binary, os.X_OK):
        print("demo: %s is not built (make all)" % binary, file=sys.stderr)
        return 2
    pidfile = workdir / "pids"
    pidfile.write_text("")
    procs = Processes(pidfile)
    stop = threading.Event()
    atexit.register(procs.stop_all)

    def on_signal(signum, frame):
        stop.set()
        # grpcio must not be left by an exception raised in the middle of its own code: a
        # channel interrupted so can hang in close(). While stop.defer is set, the code that
        # drives grpcio watches stop itself and unwinds when it is safe.
        if not getattr(stop, "defer", False):
            raise Interrupted()
    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, on_signal)

    def log(msg):
        print(msg, flush=True)

    started = time.monotonic()
    try:
        log("retrygate demo%s: a flaky dependency, a naive retry policy vs retrygate's "
            "(binary %s)" % (" (quick)" if a.quick else "", binary))
        n = g = rn = rg_ = gn = gg = fl = None
        verdicts = []
        if a.round in ("all", "http"):
            results = []
            for tag, title, retry, conc in (
                    ("naive", "naive retries (3 attempts, no budget, POSTs always, Retry-After "
                     "ignored)", NAIVE_RETRY, NAIVE_CONCURRENCY),
                    ("retrygate", "retrygate default policy (budget ratio 0.1)",
                     DEFAULT_RETRY, DEFAULT_CONCURRENCY)):
                results.append(run_policy(procs, binary, workdir, scenario, tag, title, retry,
                                          conc, stop, log))
            n, g = results
            rn, rg_ = replica_phase(procs, binary, workdir, a.quick, stop, log)
        # the fleet phase is left out of --quick (the test suite's run; --round fleet has it)
        if a.round == "fleet" or (a.round in ("all", "http") and not a.quick):
            fl = fleet_phase(procs, binary, workdir, a.quick, stop, log)
        if a.round in ("all", "grpc"):
            gn, gg = grpc_round(procs, binary, workdir, a.quick, stop, log)
        if n is not None:
            log("")
            log(table(n, g))
            log("")
            log(wrap(explain(n, g)))
            log("")
            log("Why retries were refused (retrygate /metrics at the end of the load):")
            log(metrics_block(n))
            log(metrics_block(g))
            log("")
            log("When a replica dies (one upstream, two replicas, the same load and budget; "
                "success by the time a request was sent):")
            log(replica_table(rn, rg_))
            verdicts += acceptance(n, g) + replica_acceptance(rn, rg_)
        if fl is not None:
            log("")
            log("A fleet: the same outage seen through several sidecars (the dependency's "
                "retries, all sidecars together):")
            log(fleet_table(*fl))
            verdicts += fleet_acceptance(*fl)
        if gn is not None:
            log("")
            log("gRPC: reads, keyed and unkeyed writes, 1 s deadlines, the dependency "
                "UNAVAILABLE then overloaded (success by the phase a call was sent in):")
            log(grpc_table(gn, gg))
            log("")
            log(wrap(grpc_explain(gn, gg)))
            verdicts += grpc_acceptance(gn, gg)
        log("")
        log("Acceptance:")
        for v, text in verdicts:
            log("%s %s" % (v, text))
        ok = all(v == "PASS" for v, _ in verdicts)
        log("")
        log("demo: %s in %.1fs (configs and logs in %s)"
            % ("PASS" if ok else "FAIL", time.monotonic() - started, workdir))
        if a.json:
            Path(a.json).write_text(json.dumps(
                {"naive": n, "retrygate": g, "replica": {"naive": rn, "retrygate": rg_},
                 "fleet": fl,
                 "grpc": {"naive": gn, "retrygate": gg},
                 "acceptance": verdicts, "ok": ok,
                 "quick": a.quick, "seconds": time.monotonic() - started}, indent=1,
                default=str))
        return 0 if ok else 1
    except (Interrupted, KeyboardInterrupt):
        stop.set()
        print("\ndemo: interrupted; stopping everything", file=sys.stderr, flush=True)
        return 130
    except RuntimeError as e:
        stop.set()
        print("demo: error: %s" % e, file=sys.stderr, flush=True)
        return 2
    finally:
        stop.set()
        for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(s, signal.SIG_IGN)
        procs.stop_all()


if __name__ == "__main__":
    sys.exit(main())
