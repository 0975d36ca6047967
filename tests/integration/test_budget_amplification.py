"""SPEC §4 "Retry budget" and the concurrency cap, under load: what a dead dependency sees.

Budget: over any interval of length t, retries <= max_tokens + ratio * (first attempts)
+ min_per_second * t. With min_per_second 0 and N requests, the dependency sees at most
N * (1 + ratio) + max_tokens attempts, not N * max_attempts; with `workers: 2` and concurrent
clients the bucket is shared, so the bound holds across workers.

Concurrency cap: past max_in_flight, a request is refused at once: 503 overloaded,
Retry-After: 1, X-Retrygate-Attempts: 0.

Recovery: the bucket refills at min_per_second and retries resume; retries held by a
Retry-After are not all released at once when the hold ends: the budget (or the
retries-in-flight cap) bounds the burst. The tests print the attempt timeline they measured
at the upstream when they fail."""

import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from harness import echo, http_request, reset, respond, retry_after, stall, upstream_block

pytestmark = pytest.mark.timeout(60)

FAST = {"backoff": {"base": "1ms", "max": "5ms"}}
REFUSED = "retrygate_upstream_retries_refused_total"


def api(up, retry=None, **more):
    return {"api": upstream_block(up, retry, base_retry=FAST, **more)}


def dead_budget(max_tokens=5, ratio=0.1, min_per_second=0):
    return {"max_attempts": 3,
            "budget": {"ratio": ratio, "min_per_second": min_per_second,
                       "max_tokens": max_tokens}}


def timeline(reqs, t0):
    """"+0.012s #1 /x" lines: arrival time at the upstream, attempt number, path."""
    return "\n".join("%+.3fs #%s %s" % (q.time - t0, q.header("X-Retrygate-Attempt"), q.path)
                     for q in sorted(reqs, key=lambda q: q.time))


def max_in_window(times, window):
    """The largest number of times that fall in any interval [t, t + window)."""
    times = sorted(times)
    best, j = 0, 0
    for i, t in enumerate(times):
        while times[j] < t - window + 1e-9:
            j += 1
        best = max(best, i - j + 1)
    return best


def test_max_in_window_helper():
    assert max_in_window([], 0.1) == 0
    assert max_in_window([0, 0.05, 0.2, 0.25, 0.26], 0.1) == 3
    assert max_in_window([0, 1, 2], 0.5) == 1


# ------------------------------------------------------------------------------- amplification

def test_dead_dependency_sees_at_most_n_times_1_plus_ratio_plus_max_tokens(upstream, rg_factory):
    n = 200
    upstream.set_default(respond(503, body=b"down"))
    rg = rg_factory(upstreams=api(upstream, dead_budget()))
    c = rg.client()
    attempts_per_request = []
    for i in range(n):
        r = c.request("GET", "/dep/%d" % i)
        assert r.status == 503 and r.body == b"down", r
        assert r.headers["X-Retrygate-Retry-Refused"] in ("budget", "max-attempts"), r
        attempts_per_request.append(int(r.headers["X-Retrygate-Attempts"]))
    seen = upstream.request_count
    retries = seen - n
    assert seen == sum(attempts_per_request)
    assert seen <= n * 1.1 + 5, "dependency saw %d attempts for %d requests" % (seen, n)
    # the budget is spent, not hoarded: every whole token became a retry
    assert retries >= 5 + 0.1 * n - 1, "only %d retries for %g tokens" % (retries, 5 + 0.1 * n)
    assert max(attempts_per_request) == 3 and attempts_per_request[0] == 3
    m = rg.metrics()
    assert m.value("retrygate_upstream_requests_total", upstream="api") == n
    assert m.value("retrygate_upstream_attempts_total", upstream="api") == seen
    assert m.value("retrygate_upstream_retries_total", upstream="api") == retries
    # every request ended with exactly one refusal
    assert m.value(REFUSED, upstream="api", reason="budget") + \
        m.value(REFUSED, upstream="api", reason="max-attempts") == n
    assert m.value(REFUSED, upstream="api") == n
    assert m.value("retrygate_upstream_retry_budget_tokens", upstream="api") < 1


def test_without_the_budget_the_dependency_sees_max_attempts_times(upstream, rg_factory):
    """The control for the test above: a budget that never runs dry gives 3N."""
    n = 50
    upstream.set_default(503)
    rg = rg_factory(upstreams=api(upstream, dead_budget(max_tokens=1000, ratio=1)))
    c = rg.client()
    for i in range(n):
        r = c.request("GET", "/dep/%d" % i)
        assert (r.status, r.headers["X-Retrygate-Retry-Refused"]) == (503, "max-attempts")
    assert upstream.request_count == 3 * n


def listening_sockets(port):
    """How many sockets listen on 127.0.0.1:port (one per worker with SO_REUSEPORT)."""
    n = 0
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            local, st = line.split()[1], line.split()[3]
            if st == "0A" and local == "0100007F:%04X" % port:
                n += 1
    return n


def test_budget_bound_holds_across_workers_and_concurrent_clients(upstream, rg_factory):
    """max_tokens 20: a bucket per worker instead of one per process would let up to 40 +
    ratio * N retries through, past the bound."""
    threads, per_thread, max_tokens = 8, 40, 20
    n = threads * per_thread
    upstream.set_default(503)
    rg = rg_factory(upstreams=api(upstream, dead_budget(max_tokens=max_tokens)), workers=2)
    assert listening_sockets(rg.port) == 2, "workers: 2 should give two listening sockets"

    def client(k):
        out = []
        for i in range(per_thread):
            r = http_request(rg.port, "GET", "/w/%d/%d" % (k, i), timeout=10)
            out.append((r.status, int(r.headers["X-Retrygate-Attempts"])))
        return out

    with ThreadPoolExecutor(threads) as pool:
        results = [x for f in [pool.submit(client, k) for k in range(threads)]
                   for x in f.result(timeout=50)]
    assert len(results) == n and all(s == 503 for s, _ in results)
    seen = upstream.request_count
    assert seen == sum(a for _, a in results)
    bound = n * 1.1 + max_tokens
    assert seen <= bound, "dependency saw %d attempts for %d requests (bound %g)" % (
        seen, n, bound)
    assert seen - n >= max_tokens + 0.1 * n - threads, \
        "the shared budget was barely used: %d retries" % (seen - n)
    m = rg.metrics()
    assert m.value("retrygate_upstream_requests_total", upstream="api") == n
    assert m.value("retrygate_upstream_attempts_total", upstream="api") == seen
    assert m.value(REFUSED, upstream="api") == n
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")


# ------------------------------------------------------------------------------- concurrency cap

def test_max_in_flight_refuses_the_excess_at_once(upstream, rg_factory):
    gate = threading.Event()
    upstream.set_default(respond(200, body=b"slow", hold=gate, hold_timeout=20))
    rg = rg_factory(upstreams=api(upstream, {"per_try_timeout": "10s"},
                                  concurrency={"max_in_flight": 2}))
    with ThreadPoolExecutor(2) as pool:
        futs = [pool.submit(http_request, rg.port, "GET", "/slow/%d" % i) for i in range(2)]
        upstream.wait_requests(2)
        assert rg.metric("retrygate_upstream_in_flight", upstream="api") == 2
        for _ in range(2):
            t = time.monotonic()
            r = rg.request("GET", "/excess")
            took = time.monotonic() - t
            assert r.status == 503, r
            assert r.headers["X-Retrygate-Reason"] == "overloaded"
            assert r.headers["Retry-After"] == "1"
            assert r.headers["X-Retrygate-Attempts"] == "0"
            assert "X-Retrygate-Retry-Refused" not in r.headers
            assert json.loads(r.body) == {"error": "overloaded", "upstream": "api", "attempts": 0}
            assert took < 0.5, "the excess waited %.2fs instead of being refused" % took
        gate.set()
        for f in futs:
            r = f.result(timeout=10)
            assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"slow", "1")
    assert upstream.request_count == 2
    rg.wait_metric("retrygate_upstream_rejected_total", 2, op="==", upstream="api",
                   reason="overloaded")
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    # the slots came back: the next request goes through
    assert rg.request("GET", "/after").status == 200


def test_in_flight_gauge_returns_to_zero_after_a_mixed_load(upstream, rg_factory):
    """Successes, retries, resets, stalls cut by the deadline and refusals: every slot is
    given back."""
    upstream.on_path("/stall", stall(3))
    upstream.on_path("/reset", reset())
    upstream.on_path("/503", 503)
    rg = rg_factory(upstreams=api(upstream, {"per_try_timeout": "150ms"},
                                  concurrency={"max_in_flight": 4, "max_retries_in_flight": 2}),
                    workers=2)
    paths = ["/ok", "/stall", "/reset", "/503"] * 6

    def one(p):
        return http_request(rg.port, "GET", p, headers={"X-Timeout-Ms": "400"}, timeout=10).status

    with ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(one, paths))
    assert set(statuses) <= {200, 502, 503, 504}, statuses
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    rg.wait_metric("retrygate_upstream_retries_in_flight", 0, op="==", upstream="api")


# ------------------------------------------------------------------------------- recovery

def test_budget_refills_and_retries_resume_after_the_dependency_heals(upstream, rg_factory):
    upstream.set_default(503)
    rg = rg_factory(upstreams=api(upstream, {
        "max_attempts": 2, "budget": {"ratio": 0, "min_per_second": 5, "max_tokens": 2}}))
    t0 = time.monotonic()
    # outage: the two tokens go to the first retries; then retries are refused for budget
    reasons = []
    for i in range(6):
        reasons.append(rg.request("GET", "/down/%d" % i).headers["X-Retrygate-Retry-Refused"])
    assert reasons[:2] == ["max-attempts", "max-attempts"], reasons
    assert "budget" in reasons, reasons
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") < 1

    # heal: first attempts still fail once, retries succeed
    upstream.set_default(lambda q: 503 if q.header("X-Retrygate-Attempt") == "1" else echo())
    time.sleep(0.6)                       # 5 tokens/s: the bucket is full again (2)
    tokens = rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api")
    assert tokens == 2, "the bucket holds %r tokens after 0.6 s at 5/s (max 2)" % tokens
    t_heal = time.monotonic()
    results = []
    for i in range(8):
        r = rg.request("GET", "/up/%d" % i)
        results.append((r.status, r.headers["X-Retrygate-Attempts"],
                        r.headers.get("X-Retrygate-Retry-Refused")))
        time.sleep(0.1)
    took = time.monotonic() - t_heal
    ok = [x for x in results if x[0] == 200]
    assert ok and all(x[1] == "2" for x in ok)
    assert results[:2] == [(200, "2", None)] * 2, results
    # never more retries than the bucket allows over the interval
    retries_after_heal = len([q for q in upstream.requests if q.path.startswith("/up/")
                              and q.header("X-Retrygate-Attempt") == "2"])
    assert len(ok) == retries_after_heal
    assert retries_after_heal <= 2 + 5 * took + 1, (results, timeline(upstream.requests, t0))
    # the refill keeps up with 10 requests/s at 5 tokens/s for a while: more than the 2
    # tokens that were there at the start
    assert retries_after_heal >= 3, (results, timeline(upstream.requests, t0))


@pytest.mark.parametrize("gate,conf,cap", [
    ("budget", {"retry": {"budget": {"ratio": 0, "min_per_second": 1, "max_tokens": 4}}}, 5),
    ("retries-in-flight", {"concurrency": {"max_retries_in_flight": 2}}, 2),
])
def test_held_retries_are_not_released_in_a_burst(upstream, rg_factory, gate, conf, cap):
    """20 requests hit an endpoint that answers 503 + Retry-After: 1. Without a gate, 20
    retries would arrive together when the hold ends. The budget (4 tokens + 1/s) or the
    retries-in-flight cap (2) bounds how many are held at all; the rest are answered at
    once with the 503 (Retry-After included)."""
    k = 20
    upstream.set_default(lambda q: retry_after(1, body=b"held")
                         if q.header("X-Retrygate-Attempt") == "1" else echo())
    retry = {"max_attempts": 2, "per_try_timeout": "5s"}
    retry.update(conf.get("retry", {}))
    rg = rg_factory(upstreams=api(upstream, retry,
                                  **{k_: v for k_, v in conf.items() if k_ != "retry"}))
    t0 = time.monotonic()
    barrier = threading.Barrier(k)

    def one(i):
        barrier.wait(10)
        t = time.monotonic()
        r = http_request(rg.port, "GET", "/burst/%d" % i, timeout=15)
        return r, time.monotonic() - t

    with ThreadPoolExecutor(k) as pool:
        results = list(pool.map(one, range(k)))
    reqs = upstream.requests
    firsts = [q for q in reqs if q.header("X-Retrygate-Attempt") == "1"]
    retries = [q for q in reqs if q.header("X-Retrygate-Attempt") == "2"]
    tl = timeline(reqs, t0)
    assert len(firsts) == k, tl
    hold_start = min(q.time for q in firsts)
    # every retry waited for the hold; how many arrive together is bounded by the gate
    assert all(q.time - hold_start >= 0.999 for q in retries), tl
    assert 1 <= len(retries) <= cap, "%d retries released after the hold:\n%s" % (len(retries), tl)
    assert max_in_window([q.time for q in retries], 0.1) <= cap, tl
    done = [r for r, _ in results if r.status == 200]
    refused = [(r, took) for r, took in results if r.status == 503]
    assert len(done) == len(retries) and len(done) + len(refused) == k
    for r, took in refused:
        assert r.headers["X-Retrygate-Retry-Refused"] == gate, r
        assert r.headers["Retry-After"] == "1" and r.body == b"held"
        assert took < 0.9, "a refused retry still waited %.2fs" % took
    assert rg.metric(REFUSED, upstream="api", reason=gate) == len(refused)
    rg.wait_metric("retrygate_upstream_retries_in_flight", 0, op="==", upstream="api")
