"""SPEC §14, budgeted hedging (issue 29): an attempt still without a response head `after` its
start is joined by a hedge to another endpoint (or, with one address, over another
connection), without cancelling the first; the first response that is not retryable wins and
every other attempt is cancelled at once. A hedge is an attempt like a retry: a budget token and
a retries-in-flight slot or no hedge (counted, no header), only for requests that may repeat,
within the deadline, counted by max_attempts. Each test fails on a retrygate without hedging."""

import json
import threading
import time

import grpc
import pytest

from grpcserver import GrpcServer
from h2upstream import CANCEL
from h2upstream import respond as h2respond
from harness import wait_for
from test_reconcile import Redis, redis  # noqa: F401 (fixture)
from upstream import dynamic, respond

pytestmark = pytest.mark.timeout(60)

SLOW = 2.0      # the slow attempt's delay: far beyond the hedge delay, below the test's limits


def api(endpoints, hedge, **retry):
    rt = {"per_try_timeout": "10s", "backoff": {"base": "1ms", "max": "2ms"}, "hedge": hedge}
    rt.update(retry)
    return {"endpoints": endpoints if isinstance(endpoints, list) else [endpoints], "retry": rt}


def first_then(first, rest):
    """An action for every endpoint: the test's first request gets FIRST, every other REST."""
    n = [0]
    lock = threading.Lock()

    def pick(req):
        with lock:
            n[0] += 1
            is_first = n[0] == 1
        return first if is_first else rest
    return dynamic(pick)


def first_slow(body_slow=b"slow", body_fast=b"fast"):
    """An action for every endpoint: the first request of the test is slow, the rest fast."""
    return first_then(respond(200, body=body_slow, delay=SLOW), respond(200, body=body_fast))


def two_endpoints(upstream_factory, action):
    """Two upstreams that both answer with ACTION (each request to either one)."""
    a, b = upstream_factory(), upstream_factory()
    a.set_default(action)
    b.set_default(action)
    return a, b


def hedge_metrics(rg):
    return (rg.metric("retrygate_upstream_hedges_total", upstream="api"),
            rg.metric("retrygate_upstream_hedges_won_total", upstream="api"))


def test_hedge_to_the_other_endpoint_wins_and_the_slow_attempt_is_cancelled(
        upstream_factory, rg_factory, tmp_path):
    a, b = two_endpoints(upstream_factory, first_slow())
    log = tmp_path / "access.log"
    rg = rg_factory(upstreams={"api": api([a, b], {"after": "50ms"})}, access_log=log)
    t0 = time.monotonic()
    r = rg.get("/x")
    took = time.monotonic() - t0
    assert (r.status, r.body) == (200, b"fast")
    assert r.headers["X-Retrygate-Attempts"] == "2"
    assert took < SLOW - 0.5, took
    reqs = a.requests + b.requests
    assert len(reqs) == 2
    # one to each endpoint: the hedge prefers the endpoint not tried yet
    assert len(a.requests) == 1 and len(b.requests) == 1
    first = min(reqs, key=lambda q: q.header("X-Retrygate-Attempt"))
    hedge = max(reqs, key=lambda q: q.header("X-Retrygate-Attempt"))
    assert first.header("X-Retrygate-Attempt") == "1" and first.header("X-Retrygate-Hedge") is None
    assert hedge.header("X-Retrygate-Attempt") == "2" and hedge.header("X-Retrygate-Hedge") == "1"
    # the slow attempt's connection was closed by retrygate, long before it would have answered
    slow_up = a if first in a.requests else b
    conn = slow_up.conns[0]
    wait_for(lambda: conn.closed, 5, what="the slow attempt's connection closed")
    assert conn.closed_by == "peer" and conn.bytes_out == 0
    assert rg.wait_metric("retrygate_upstream_hedges_won_total", 1, upstream="api") == 1
    assert hedge_metrics(rg) == (1, 1)
    assert rg.metric("retrygate_upstream_attempts_total", upstream="api") == 2
    assert rg.metric("retrygate_upstream_in_flight", upstream="api") == 0
    # the access log marks the hedge and the winner
    rec = wait_for(lambda: (lambda t: json.loads(t.splitlines()[0]) if t else None)(
        log.read_text() if log.exists() else ""), 5, what="an access log line")
    assert rec["attempts"] == 2
    tries = rec["tries"]
    assert [t.get("hedge", False) for t in tries] == [False, True]
    assert [t.get("won", False) for t in tries] == [False, True]
    assert tries[1]["status"] == 200


def test_single_address_hedges_over_another_connection(upstream, rg_factory):
    upstream.set_default(first_slow())
    rg = rg_factory(upstreams={"api": api(upstream, {"after": "50ms"})})
    r = rg.get("/x")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"fast", "2")
    reqs = upstream.wait_requests(2)
    assert reqs[0].conn_id != reqs[1].conn_id
    assert hedge_metrics(rg) == (1, 1)


def test_a_fast_answer_sends_no_hedge(upstream, rg_factory):
    upstream.set_default(respond(200, body=b"ok"))
    rg = rg_factory(upstreams={"api": api(upstream, {"after": "500ms"})})
    for _ in range(5):
        r = rg.get("/x")
        assert r.headers["X-Retrygate-Attempts"] == "1"
    assert hedge_metrics(rg) == (0, 0)


def test_post_without_key_is_never_hedged(upstream, rg_factory):
    upstream.set_default(respond(200, body=b"done", delay=0.5))
    rg = rg_factory(upstreams={"api": api(upstream, {"after": "50ms"})})
    r = rg.post("/pay", b"{}")
    assert (r.status, r.headers["X-Retrygate-Attempts"]) == (200, "1")
    assert upstream.request_count == 1
    # with a key it may repeat: hedged
    r = rg.post("/pay", b"{}", {"Idempotency-Key": "k1"})
    assert r.headers["X-Retrygate-Attempts"] == "2"
    assert rg.metric("retrygate_upstream_hedges_total", upstream="api") == 1


def test_a_request_marked_as_a_retry_is_not_hedged(upstream, rg_factory):
    upstream.set_default(respond(200, body=b"ok", delay=0.4))
    rg = rg_factory(upstreams={"api": api(upstream, {"after": "50ms"})})
    r = rg.get("/x", {"X-Retrygate-Attempt": "2"})
    assert r.status == 200
    assert upstream.request_count == 1
    assert hedge_metrics(rg) == (0, 0)


def test_hedging_stops_when_the_budget_is_empty(upstream, rg_factory):
    """Two tokens, nothing earned: two hedges, then every hedge is refused `budget`, and the
    responses carry no refusal header (the request was not refused anything)."""
    upstream.set_default(respond(200, body=b"ok", delay=0.3))
    rg = rg_factory(upstreams={"api": api(upstream, {"after": "30ms"}, budget={
        "ratio": 0, "min_per_second": 0, "max_tokens": 2})})
    got = []
    for _ in range(4):
        r = rg.get("/x")
        assert r.status == 200
        assert "X-Retrygate-Retry-Refused" not in r.headers
        got.append(r.headers["X-Retrygate-Attempts"])
    assert got == ["2", "2", "1", "1"]
    assert rg.metric("retrygate_upstream_hedges_total", upstream="api") == 2
    assert rg.metric("retrygate_upstream_retries_refused_total", upstream="api",
                     reason="budget") == 2
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == 0


def test_hedges_take_their_tokens_from_the_shared_budget(upstream, rg_factory, redis):
    """budget.shared: two sidecars, one fleet bucket of 2 tokens: 2 hedges in all, not 2 each;
    the tokens come from Redis (no fallback to the local buckets)."""
    upstream.set_default(respond(200, body=b"ok", delay=0.3))
    spec = api(upstream, {"after": "30ms"}, budget={
        "ratio": 0, "min_per_second": 0, "max_tokens": 2,
        "shared": "redis://127.0.0.1:%d/0" % redis.port})
    rgs = [rg_factory(upstreams={"api": spec}) for _ in range(2)]
    got = []
    for rg in rgs:
        for _ in range(2):
            r = rg.get("/x")
            assert r.status == 200 and "X-Retrygate-Retry-Refused" not in r.headers
            got.append(r.headers["X-Retrygate-Attempts"])
    assert got == ["2", "2", "1", "1"]
    for rg in rgs:
        assert rg.metric("retrygate_upstream_budget_shared_errors_total", upstream="api") == 0
        assert rg.stats()["upstreams"]["api"]["budget_shared_in_use"] is True
    assert sum(rg.metric("retrygate_upstream_hedges_total", upstream="api") for rg in rgs) == 2
    assert sum(rg.metric("retrygate_upstream_retries_refused_total", upstream="api",
                         reason="budget") for rg in rgs) == 2


def test_hedges_are_counted_by_max_attempts_and_max_extra(upstream_factory, rg_factory):
    ups = [upstream_factory() for _ in range(3)]
    for u in ups:
        u.set_default(respond(200, body=b"ok", delay=0.6))
    rg = rg_factory(upstreams={"api": api(ups, {"after": "50ms", "max_extra": 4},
                                          max_attempts=3)})
    r = rg.get("/x")
    assert r.status == 200
    assert r.headers["X-Retrygate-Attempts"] == "3"
    assert sum(u.request_count for u in ups) == 3
    assert sorted(u.request_count for u in ups) == [1, 1, 1]
    assert rg.metric("retrygate_upstream_hedges_total", upstream="api") == 2


def test_no_hedge_goes_to_a_held_endpoint(upstream_factory, rg_factory):
    """A 503 with Retry-After puts a hold on its endpoint; the next request goes to the other
    one (round-robin) and is slow: its hedge goes over another connection to that endpoint,
    not to the held one, although the held one was not tried."""
    a, b = upstream_factory(), upstream_factory()
    state = {"n": 0}
    lock = threading.Lock()

    def pick(req):
        with lock:
            state["n"] += 1
            n = state["n"]
        if n == 1:
            return respond(503, headers={"Retry-After": "30"}, body=b"busy")
        if n == 2:
            return respond(200, body=b"slow", delay=SLOW)
        return respond(200, body=b"fast")
    a.set_default(dynamic(pick))
    b.set_default(dynamic(pick))
    rg = rg_factory(upstreams={"api": api([a, b], {"after": "50ms"},
                                          retry_after={"max": "1s"})})
    r = rg.get("/x")
    assert (r.status, r.headers.get("X-Retrygate-Retry-Refused")) == (503, "retry-after")
    held, other = (a, b) if a.request_count == 1 else (b, a)
    r = rg.get("/y")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"fast", "2")
    assert held.request_count == 1
    reqs = other.wait_requests(2)
    assert reqs[0].conn_id != reqs[1].conn_id
    assert reqs[1].header("X-Retrygate-Hedge") == "1"


def test_the_deadline_is_never_exceeded(upstream, rg_factory):
    """Every attempt is slower than the deadline: the hedges go out within it and the client
    gets 504 at the deadline, not later."""
    upstream.set_default(respond(200, body=b"late", delay=3.0))
    rg = rg_factory(upstreams={"api": api(upstream, {"after": "100ms", "max_extra": 2})})
    t0 = time.monotonic()
    r = rg.get("/x", {"X-Timeout-Ms": "400"})
    took = time.monotonic() - t0
    assert r.status == 504
    assert took < 1.5, took
    reqs = upstream.wait_requests(3)
    for q in reqs:
        assert q.time - reqs[0].time < 0.4
    wait_for(lambda: all(c.closed for c in upstream.conns), 5, what="every attempt cancelled")
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0


def test_a_retryable_answer_does_not_end_the_other_attempt(upstream_factory, rg_factory):
    """The hedge gets a 503 at once; the first attempt's 200 comes later and is relayed."""
    a, b = two_endpoints(upstream_factory, first_then(respond(200, body=b"first", delay=0.5),
                                                      respond(503, body=b"no")))
    rg = rg_factory(upstreams={"api": api([a, b], {"after": "50ms"}, max_attempts=2)})
    r = rg.get("/x")
    assert (r.status, r.body) == (200, b"first")
    assert r.headers["X-Retrygate-Attempts"] == "2"
    assert hedge_metrics(rg) == (1, 0)


def test_when_every_attempt_ends_retryable_the_last_decides(upstream_factory, rg_factory):
    """The hedge's 503 comes first, the first attempt's 502 later: no attempts left, so the
    client gets the last response any attempt produced, refused max-attempts."""
    a, b = two_endpoints(upstream_factory, first_then(respond(502, body=b"first", delay=0.4),
                                                      respond(503, body=b"hedge")))
    rg = rg_factory(upstreams={"api": api([a, b], {"after": "50ms"}, max_attempts=2)})
    r = rg.get("/x")
    assert (r.status, r.body) == (502, b"first")
    assert r.headers["X-Retrygate-Attempts"] == "2"
    assert r.headers["X-Retrygate-Retry-Refused"] == "max-attempts"
    # the other way round: the hedge's 503 is the last, and is the one relayed
    late = dynamic(lambda req: respond(502, body=b"first", delay=0.1)
                   if req.header("X-Retrygate-Hedge") is None
                   else respond(503, body=b"hedge", delay=0.5))
    a.set_default(late)
    b.set_default(late)
    r = rg.get("/x")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (503, b"hedge", "2")


def test_p95_sends_no_hedge_before_100_samples(upstream, rg_factory):
    """p95 of the first attempts' head latency: nothing until 100 samples; then a request far
    slower than the rest is hedged."""
    slow = threading.Event()

    def pick(req):
        return respond(200, body=b"slow", delay=SLOW) if slow.is_set() and \
            req.header("X-Retrygate-Hedge") is None else respond(200, body=b"fast")
    upstream.set_default(dynamic(pick))
    rg = rg_factory(upstreams={"api": api(upstream, {"after": "p95"},
                                          budget={"max_tokens": 1000})})
    c = rg.client()
    for _ in range(99):
        assert c.request("GET", "/x").status == 200
    slow.set()
    t0 = time.monotonic()
    r = rg.get("/x")
    assert (r.body, r.headers["X-Retrygate-Attempts"]) == (b"slow", "1")
    assert time.monotonic() - t0 >= SLOW - 0.2
    assert rg.metric("retrygate_upstream_hedges_total", upstream="api") == 0
    # now 100 samples: p95 is a few ms, the slow one is hedged
    r = rg.get("/x")
    assert (r.body, r.headers["X-Retrygate-Attempts"]) == (b"fast", "2")
    assert hedge_metrics(rg) == (1, 1)


def test_h2_upstream_loser_gets_rst_stream_cancel(h2up, rg_factory):
    up = h2up()
    up.set_default(h2respond(200, body=b"fast"))
    up.push(h2respond(200, body=b"slow", delay=SLOW))
    spec = api(up.endpoint, {"after": "50ms"})
    spec["protocol"] = "h2"
    rg = rg_factory(upstreams={"api": spec})
    r = rg.get("/x")
    assert (r.status, r.body, r.headers["X-Retrygate-Attempts"]) == (200, b"fast", "2")
    reqs = up.wait_requests(2)
    # one address: the hedge went over another connection
    assert reqs[0].conn_id != reqs[1].conn_id
    wait_for(lambda: any(code == CANCEL for _, _, code in up.resets), 5,
             what="RST_STREAM CANCEL for the slow stream")
    cid, sid, _ = [x for x in up.resets if x[2] == CANCEL][0]
    assert (cid, sid) == (reqs[0].conn_id, reqs[0].stream_id)
    assert hedge_metrics(rg) == (1, 1)


def test_grpc_unary_hedge_wins_and_the_loser_is_cancelled(rg_factory):
    """A unary call on an idempotent path: the first call sleeps, its hedge answers at once and
    commits the call; the server sees the first call cancelled by the client."""
    srv = GrpcServer()
    ch = None
    try:
        spec = api(srv.endpoint, {"after": "50ms"}, idempotent_paths=["/test.Catalog/"])
        spec["protocol"] = "h2"
        rg = rg_factory(upstreams={"api": spec})
        ch = grpc.insecure_channel("127.0.0.1:%d" % rg.port, options=[("grpc.enable_retries", 0)])
        call = ch.unary_unary("/test.Catalog/Get")
        t0 = time.monotonic()
        out, info = call.with_call(b"hi", timeout=10, metadata=[
            ("x-script", "sleep-first:%d" % int(SLOW * 1000)), ("x-key", "k")])
        assert out == b"echo:hi"
        assert time.monotonic() - t0 < SLOW - 0.5
        assert dict(info.initial_metadata()).get("x-retrygate-attempts") == "2" or \
            dict(info.trailing_metadata()).get("x-retrygate-attempts") == "2"
        calls = srv.wait_calls(2)
        assert calls[1].metadata.get("x-retrygate-hedge") == "1"
        wait_for(lambda: calls[0].cut_left is not None, 5, what="the first call cancelled")
        assert calls[0].cut_left > 1.0      # cancelled by the client, not by its deadline
        assert hedge_metrics(rg) == (1, 1)
    finally:
        if ch:
            ch.close()
        srv.stop(0)


CONFIG = """\
listeners:
  - listen: 127.0.0.1:{port}
    routes:
      - path_prefix: /r/
        upstream: api
        retry: {{ hedge: {{ max_extra: 2 }} }}
      - upstream: api
upstreams:
  api:
    endpoints: ["127.0.0.1:9"]
    retry:
      hedge: {{ after: {after} }}
"""


def test_config_check_and_errors(tmp_path, rg_factory):
    from harness import check_config, free_port
    cp = check_config(CONFIG.format(port=free_port(), after="p95"), workdir=tmp_path)
    assert cp.returncode == 0, cp.stderr
    lines = [ln for ln in cp.stdout.splitlines() if ln.strip().startswith("hedging")]
    assert len(lines) == 2, cp.stdout
    assert "up to 1 hedge per request after p95" in lines[0]
    assert "up to 2 hedges per request after p95" in lines[1]
    assert "budget token" in lines[0] and "max_attempts" in lines[0]
    cp = check_config(CONFIG.format(port=free_port(), after="p90"), workdir=tmp_path)
    assert cp.returncode != 0
    assert "retrygate.yaml:12:23: upstreams.api.retry.hedge.after" in cp.stderr, cp.stderr
    cp = check_config(CONFIG.format(port=free_port(), after="20ms").replace(
        "max_extra: 2", "max_extra: 0"), workdir=tmp_path)
    assert cp.returncode != 0
    assert "retrygate.yaml:6:38: listeners[0].routes[0].retry.hedge.max_extra" in cp.stderr, \
        cp.stderr
    # /config shows the merged policy: the route's max_extra over the upstream's after
    rg = rg_factory(upstreams={"api": api("127.0.0.1:9", {"after": "20ms"})}, routes=[
        {"path_prefix": "/r/", "upstream": "api", "retry": {"hedge": {"max_extra": 3}}},
        {"upstream": "api"}])
    cfg = json.loads(rg.admin("GET", "/config").body)
    assert cfg["upstreams"]["api"]["retry"]["hedge"] == {"after": "20ms", "max_extra": 1}
    assert cfg["listeners"][0]["routes"][0]["retry"]["hedge"] == {"after": "20ms", "max_extra": 3}
