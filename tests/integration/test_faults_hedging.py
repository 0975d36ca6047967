"""SPEC §11 faults on SPEC §14 hedges (issue 29): a hedge is an attempt, so it draws its own
fault as any attempt does. A delay delays the hedge's send (and an attempt still in its delay
is hedged as a slow one is); connect-failure fails the hedge as a refused connection, nothing
reaching the upstream; abort answers the hedge with the rule's status, which then competes as
any response does (not retryable: it wins and the other attempt is cancelled; retryable: it
ends that try alone). The injected counter counts hedges. Each test fails on a retrygate whose
hedges bypass fault injection."""

import json
import threading
import time

import pytest

from h2upstream import respond as h2respond
from harness import wait_for
from test_hedging import two_endpoints
from upstream import dynamic, respond

pytestmark = pytest.mark.timeout(60)

SLOW = 2.0      # the first attempt's answer: far beyond the hedge delay
OFF = {"after": 0, "min_success_rate": 0, "max_amplification": 0}


def api(endpoints, after, rules, enabled=True, **retry):
    rt = {"per_try_timeout": "10s", "backoff": {"base": "1ms", "max": "2ms"},
          "hedge": {"after": after}}
    rt.update(retry)
    return {"endpoints": endpoints if isinstance(endpoints, list) else [endpoints], "retry": rt,
            "faults": {"enabled": enabled, "rules": rules, "stop": dict(OFF)}}


def hedges_fast():
    """The first attempt is slow, a hedge answers at once."""
    return dynamic(lambda req: respond(200, body=b"fast") if req.header("X-Retrygate-Hedge")
                   else respond(200, body=b"slow", delay=SLOW))


def slow_first_pair(upstream_factory):
    """Two endpoints where the first attempt is slow and a hedge answers at once."""
    return two_endpoints(upstream_factory, hedges_fast())


def metric(rg, name, **labels):
    return rg.metric(name, upstream="api", **labels)


def first_log_line(log):
    return wait_for(lambda: (lambda t: json.loads(t.splitlines()[0]) if t else None)(
        log.read_text() if log.exists() else ""), 5, what="an access log line")


def hedged_after_switch(rg, path, ready, on_first=False):
    """GET PATH with the faults on when ON_FIRST, else off; once READY() (its first attempt has
    drawn, or reached an upstream), switch them the other way, so that the first attempt and
    its hedge (due later) draw differently. -> (response, seconds it took)."""
    q = "/faults?upstream=api&enabled=%s"
    assert rg.admin("POST", q % ("true" if on_first else "false"), body=b"").status == 200
    got = {}

    def run():
        t0 = time.monotonic()
        got["r"] = rg.get(path)
        got["took"] = time.monotonic() - t0
    th = threading.Thread(target=run)
    th.start()
    wait_for(ready, 5, what="the first attempt")
    assert rg.admin("POST", q % ("false" if on_first else "true"), body=b"").status == 200
    th.join(15)
    assert "r" in got
    return got["r"], got["took"]


def hedged_after_switch_on(rg, ups, path):
    """GET PATH, only its hedge (due 1 s after the first attempt) drawing a fault."""
    before = sum(u.request_count for u in ups)
    return hedged_after_switch(rg, path, lambda: sum(u.request_count for u in ups) > before)


def test_a_hedge_draws_its_own_delay(upstream_factory, rg_factory, tmp_path):
    """Every attempt is delayed 300 ms: the first attempt, still in its delay, is hedged 50 ms
    after its start, and the hedge waits its own 300 ms before it is sent."""
    a, b = slow_first_pair(upstream_factory)
    log = tmp_path / "access.log"
    rg = rg_factory(upstreams={"api": api([a, b], "50ms", [
        {"kind": "delay", "percent": 100, "delay": "300ms"}])}, access_log=log)
    t0 = time.monotonic()
    r = rg.get("/x")
    took = time.monotonic() - t0
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"fast", "2")
    assert 0.34 <= took < SLOW - 0.5, took
    reqs = a.requests + b.requests
    assert len(reqs) == 2
    first = [q for q in reqs if q.header("X-Retrygate-Hedge") is None][0]
    hedge = [q for q in reqs if q.header("X-Retrygate-Hedge") == "1"][0]
    assert first.time - t0 >= 0.29, first.time - t0
    # each numbered when it started, not when its delay let it go
    assert (first.header("X-Retrygate-Attempt"), hedge.header("X-Retrygate-Attempt")) == ("1", "2")
    # the hedge left 50 ms after the first attempt's start, then waited its own delay
    assert hedge.time - t0 >= 0.34, hedge.time - t0
    assert metric(rg, "retrygate_upstream_faults_injected_total", kind="delay") == 2
    assert metric(rg, "retrygate_upstream_hedges_total") == 1
    assert metric(rg, "retrygate_upstream_hedges_won_total") == 1
    rec = first_log_line(log)
    assert [t.get("fault") for t in rec["tries"]] == ["delay", "delay"]
    assert [t.get("hedge", False) for t in rec["tries"]] == [False, True]
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0


def test_a_hedge_drawing_connect_failure_reaches_nothing(upstream_factory, rg_factory):
    """The hedge fails as a refused connection: nothing reaches either upstream, the first
    attempt runs on and its answer is relayed; the hedge counts as an attempt and a fault."""
    a, b = slow_first_pair(upstream_factory)
    rg = rg_factory(upstreams={"api": api([a, b], "1s", [
        {"kind": "connect-failure", "percent": 100}], enabled=False)})
    r, took = hedged_after_switch_on(rg, [a, b], "/x")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"slow", "2")
    assert "X-Retrygate-Retry-Refused" not in r.headers
    assert took >= SLOW - 0.1, took
    time.sleep(0.2)
    assert a.request_count + b.request_count == 1
    assert metric(rg, "retrygate_upstream_faults_injected_total", kind="connect-failure") == 1
    assert metric(rg, "retrygate_upstream_outcomes_total", outcome="connect-failure") == 1
    assert metric(rg, "retrygate_upstream_attempts_total") == 2
    assert metric(rg, "retrygate_upstream_hedges_total") == 1
    assert metric(rg, "retrygate_upstream_hedges_won_total") == 0
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0
    assert metric(rg, "retrygate_upstream_retries_in_flight") == 0


def test_a_hedge_drawing_abort_answers_for_it(upstream_factory, rg_factory):
    """abort answers the hedge itself: a status not retried wins at once and the first
    attempt is cancelled; a retried one ends that try alone and the first attempt's answer is
    relayed. Nothing of either hedge reaches an upstream."""
    a, b = slow_first_pair(upstream_factory)
    rg = rg_factory(upstreams={"api": api([a, b], "1s", [
        {"kind": "abort", "percent": 100, "status": 429, "path_prefix": "/wins"},
        {"kind": "abort", "percent": 100, "status": 503, "path_prefix": "/ends"}],
        enabled=False)})
    r, took = hedged_after_switch_on(rg, [a, b], "/wins")
    assert (r.status, r.headers.get("X-Retrygate-Fault")) == (429, "abort")
    assert r.headers["X-Retrygate-Attempts"] == "2"
    assert took < SLOW - 0.5, took
    ups = [u for u in (a, b) if u.request_count]
    assert len(ups) == 1 and ups[0].request_count == 1
    conn = ups[0].conns[0]
    wait_for(lambda: conn.closed, 5, what="the first attempt's connection closed")
    assert conn.closed_by == "peer" and conn.bytes_out == 0
    assert metric(rg, "retrygate_upstream_hedges_won_total") == 1

    r, took = hedged_after_switch_on(rg, [a, b], "/ends")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"slow", "2")
    assert "X-Retrygate-Fault" not in r.headers
    assert took >= SLOW - 0.1, took
    time.sleep(0.2)
    assert a.request_count + b.request_count == 2
    assert metric(rg, "retrygate_upstream_faults_injected_total", kind="abort") == 2
    assert metric(rg, "retrygate_upstream_hedges_total") == 2
    assert metric(rg, "retrygate_upstream_hedges_won_total") == 1
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0


def test_an_attempt_in_its_delay_is_hedged_and_its_wait_goes_on(upstream_factory, rg_factory):
    """The first attempt draws a 2 s delay, its hedge (after 300 ms) nothing. The hedge's 503
    ends it alone: the first attempt's wait goes on, it is sent when its delay is over and its
    answer relayed. Then the hedge's 200 wins while the first attempt still waits: that one
    never reaches the upstream."""
    answers = {"/x": respond(503, body=b"no"), "/y": respond(200, body=b"hedge")}
    act = dynamic(lambda req: answers[req.path] if req.header("X-Retrygate-Hedge")
                  else respond(200, body=b"first"))
    a, b = two_endpoints(upstream_factory, act)
    rg = rg_factory(upstreams={"api": api([a, b], "300ms", [
        {"kind": "delay", "percent": 100, "delay": "2s"}], enabled=False)})

    def drawn(n):
        return lambda: metric(rg, "retrygate_upstream_faults_injected_total", kind="delay") >= n
    r, took = hedged_after_switch(rg, "/x", drawn(1), on_first=True)
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"first", "2")
    assert took >= 2.0, took
    reqs = a.requests + b.requests
    assert [q.header("X-Retrygate-Hedge") for q in sorted(reqs, key=lambda q: q.time)] == \
        ["1", None]
    assert metric(rg, "retrygate_upstream_hedges_won_total") == 0

    r, took = hedged_after_switch(rg, "/y", drawn(2), on_first=True)
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"hedge", "2")
    assert took < 1.5, took
    time.sleep(2.2)             # past the first attempt's delay: it was cancelled, never sent
    assert a.request_count + b.request_count == 3
    assert metric(rg, "retrygate_upstream_faults_injected_total", kind="delay") == 2
    assert metric(rg, "retrygate_upstream_hedges_won_total") == 1
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0
    assert metric(rg, "retrygate_upstream_retries_in_flight") == 0


def test_a_hedge_drawing_lost_response_is_a_reset(upstream_factory, rg_factory):
    """The hedge reaches the upstream, its answer is thrown away: a reset, which for a GET
    ends that try alone; the first attempt's answer is relayed."""
    a, b = slow_first_pair(upstream_factory)
    rg = rg_factory(upstreams={"api": api([a, b], "1s", [
        {"kind": "lost-response", "percent": 100}], enabled=False)})
    r, took = hedged_after_switch_on(rg, [a, b], "/x")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"slow", "2")
    assert a.request_count + b.request_count == 2
    assert metric(rg, "retrygate_upstream_faults_injected_total", kind="lost-response") == 1
    assert metric(rg, "retrygate_upstream_outcomes_total", outcome="reset") == 1
    assert metric(rg, "retrygate_upstream_hedges_won_total") == 0


def test_h2_upstream_hedge_draws_its_own_delay(h2up, rg_factory):
    up = h2up()
    up.set_default(h2respond(200, body=b"fast"))
    up.push(h2respond(200, body=b"slow", delay=SLOW))
    spec = api(up.endpoint, "50ms", [{"kind": "delay", "percent": 100, "delay": "300ms"}])
    spec["protocol"] = "h2"
    rg = rg_factory(upstreams={"api": spec})
    t0 = time.monotonic()
    r = rg.get("/x")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"fast", "2")
    assert time.monotonic() - t0 < SLOW - 0.5
    reqs = up.wait_requests(2)
    hedge = [q for q in reqs if q.header("x-retrygate-hedge") == "1"][0]
    assert hedge.time - t0 >= 0.34, hedge.time - t0
    assert metric(rg, "retrygate_upstream_faults_injected_total", kind="delay") == 2
    assert metric(rg, "retrygate_upstream_hedges_total") == 1
