"""SPEC §3 (deadlines), end to end: the deadline headers read in order of precedence, the
X-Timeout-Ms (and every other deadline header, in its own format) sent on each attempt, the
504s made by retrygate, clamping and defaults, deadline.min, client disconnects, a slow
request body, and a slow response body that must not be cut off.

Every timing assertion has a generous margin (a shared 2-core machine): lower bounds are
exact ("never before the deadline"), upper bounds are loose ("well before the upstream's
own 3 s")."""

import json
import time

import pytest

from harness import RawConn, echo, respond, slow_body, stall, upstream_block

pytestmark = pytest.mark.timeout(30)

FAST = {"backoff": {"base": "1ms", "max": "5ms"}}
DEADLINE_HEADERS = ["X-Timeout-Ms", "grpc-timeout", "connect-timeout-ms",
                    "x-envoy-upstream-rq-timeout-ms", "x-envoy-expected-rq-timeout-ms"]
GRPC_UNITS_MS = {"H": 3600000.0, "M": 60000.0, "S": 1000.0, "m": 1.0, "u": 0.001, "n": 1e-6}


def api(up, retry=None, deadline=None, **more):
    """Upstream "api" config: the given endpoint(s), fast backoff unless retry says otherwise."""
    extra = {"deadline": deadline} if deadline else {}
    extra.update(more)
    return {"api": upstream_block(up, retry, base_retry=FAST, **extra)}


def grpc_ms(v):
    """A grpc-timeout value in milliseconds (float); AssertionError if not gRPC format."""
    assert 2 <= len(v) <= 9 and v[:-1].isdigit() and v[-1] in GRPC_UNITS_MS, \
        "not a grpc-timeout value: %r" % v
    return int(v[:-1]) * GRPC_UNITS_MS[v[-1]]


def header_ms(name, v):
    if name.lower() == "grpc-timeout":
        return grpc_ms(v)
    assert v.isdigit(), "%s: %r is not integer milliseconds" % (name, v)
    return float(v)


def assert_made_by_retrygate(r, status, reason, attempts, upstream="api"):
    """A response made by retrygate (SPEC §5): status, X-Retrygate-Reason, -Attempts, JSON."""
    assert r.status == status, r
    assert r.headers.get("X-Retrygate-Reason") == reason, r
    assert r.headers.get("X-Retrygate-Attempts") == str(attempts), r
    assert json.loads(r.body) == {"error": reason, "upstream": upstream, "attempts": attempts}, r


def timed(fn, *a, **kw):
    t = time.monotonic()
    r = fn(*a, **kw)
    return r, time.monotonic() - t


# ------------------------------------------------------------------------------- the basics

def test_300ms_deadline_against_a_3s_upstream_is_a_504_on_time(upstream, rg_factory):
    upstream.set_default(respond(200, body=b"late", delay=3))
    rg = rg_factory(upstreams=api(upstream))
    r, took = timed(rg.request, "GET", "/slow", headers={"X-Timeout-Ms": "300"})
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 1)
    assert 0.29 <= took < 1.2, "504 after %.3fs for a 300 ms deadline" % took
    (req,) = upstream.wait_requests(1)
    sent = int(req.header("X-Timeout-Ms"))
    assert 150 <= sent <= 300, "upstream was told %d ms" % sent
    assert req.header_all("X-Timeout-Ms") == [str(sent)]
    # the attempt was cancelled: its upstream connection closed, its slot released
    assert upstream.wait_conn_closed(req.conn_id, timeout=3) == "peer"
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    assert upstream.request_count == 1


def test_x_timeout_ms_zero_never_reaches_the_upstream(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    c = rg.client()
    r, took = timed(c.request, "GET", "/x", {"X-Timeout-Ms": "0"})
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 0)
    assert took < 0.5
    assert "X-Retrygate-Retry-Refused" not in r.headers
    rg.wait_metric("retrygate_upstream_rejected_total", 1, op="==", upstream="api",
                   reason="deadline-exceeded")
    assert rg.metric("retrygate_upstream_attempts_total", upstream="api") == 0
    assert rg.metric("retrygate_upstream_requests_total", upstream="api") == 0
    # a 504 made at the head is not a refusal of a malformed request: the connection stays
    r2 = c.request("GET", "/y")
    assert r2.status == 200 and r2.headers["X-Retrygate-Attempts"] == "1"
    reqs = upstream.wait_requests(1)
    time.sleep(0.1)
    assert [q.path for q in upstream.requests] == ["/y"] and reqs[0].path == "/y"


@pytest.mark.parametrize("name,value", [
    ("X-Timeout-Ms", "0"), ("X-Timeout-Ms", "000"), ("grpc-timeout", "0m"),
    ("grpc-timeout", "0S"), ("grpc-timeout", "00000000H"), ("connect-timeout-ms", "0"),
])
def test_zero_means_already_expired(upstream, rg_factory, name, value):
    rg = rg_factory(upstreams=api(upstream))
    # a later header with plenty of time does not matter: only the first present is read
    r = rg.request("GET", "/x", headers=[(name, value), ("x-envoy-expected-rq-timeout-ms", "5000")])
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 0)
    time.sleep(0.1)
    assert upstream.request_count == 0


def test_grpc_timeout_is_rewritten_and_x_timeout_ms_added(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    r = rg.request("GET", "/g", headers={"grpc-timeout": "300m"})
    assert r.status == 200
    (req,) = upstream.wait_requests(1)
    assert len(req.header_all("grpc-timeout")) == 1
    g = grpc_ms(req.header("grpc-timeout"))
    x = int(req.header("X-Timeout-Ms"))
    assert 150 <= g < 300, "grpc-timeout forwarded as %r" % req.header("grpc-timeout")
    assert 150 <= x < 300 and x <= g < x + 1
    assert req.header_all("X-Timeout-Ms") == [str(x)]
    # no other deadline header is invented
    for n in DEADLINE_HEADERS[2:]:
        assert n not in req.headers


def test_grpc_timeout_deadline_is_enforced(upstream, rg_factory):
    upstream.set_default(stall(5))
    rg = rg_factory(upstreams=api(upstream))
    r, took = timed(rg.request, "GET", "/g", headers={"grpc-timeout": "300000u"})
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 1)
    assert 0.29 <= took < 1.2


# ------------------------------------------------------------------------------- precedence

PRECEDENCE_VALUES = [("X-Timeout-Ms", "1000", 1000), ("grpc-timeout", "2S", 2000),
                     ("connect-timeout-ms", "3000", 3000),
                     ("x-envoy-upstream-rq-timeout-ms", "4000", 4000),
                     ("x-envoy-expected-rq-timeout-ms", "5000", 5000)]
PRECEDENCE_CFG = {"deadline": {"default": "1500ms", "max": "30s"},
                  "retry": {"per_try_timeout": "10s"}}


def _precedence_rg(rg_factory, upstream):
    return rg_factory(upstreams=api(upstream, retry=PRECEDENCE_CFG["retry"],
                                    deadline=PRECEDENCE_CFG["deadline"]))


def _assert_all_rewritten(req, sent_names, expect_ms):
    """X-Timeout-Ms and every deadline header the client sent carry the same time, in their
    own format, at most expect_ms and not much less."""
    x = int(req.header("X-Timeout-Ms"))
    assert expect_ms - 500 <= x <= expect_ms, "X-Timeout-Ms %d, expected about %d" % (x, expect_ms)
    for n in DEADLINE_HEADERS:
        vals = req.header_all(n)
        if n.lower() != "x-timeout-ms" and n not in sent_names:
            assert vals == [], "%s invented: %r" % (n, vals)
            continue
        assert len(vals) == 1, "%s: %r" % (n, vals)
        ms = header_ms(n, vals[0])
        assert x <= ms < x + 1, "%s forwarded as %r, X-Timeout-Ms %d" % (n, vals[0], x)


@pytest.mark.parametrize("first", range(5), ids=[n for n, _, _ in PRECEDENCE_VALUES])
def test_first_present_header_wins_and_all_are_rewritten(upstream, rg_factory, first):
    rg = _precedence_rg(rg_factory, upstream)
    # sent in reverse order: precedence is the list's, not the order on the wire
    hdrs = [(n, v) for n, v, _ in reversed(PRECEDENCE_VALUES[first:])]
    r = rg.request("GET", "/p", headers=hdrs)
    assert r.status == 200, r
    (req,) = upstream.wait_requests(1)
    _assert_all_rewritten(req, [n for n, _ in hdrs], PRECEDENCE_VALUES[first][2])


@pytest.mark.parametrize("hdrs,expect_ms", [
    ([("x-envoy-upstream-rq-timeout-ms", "0"), ("x-envoy-expected-rq-timeout-ms", "700")], 700),
    ([("x-envoy-upstream-rq-timeout-ms", "0")], 1500),
    ([("x-envoy-expected-rq-timeout-ms", "0")], 1500),
    ([("x-envoy-upstream-rq-timeout-ms", "0"), ("x-envoy-expected-rq-timeout-ms", "0")], 1500),
    ([], 1500),
], ids=["envoy-upstream-0-falls-to-expected", "envoy-upstream-0-default",
        "envoy-expected-0-default", "both-envoy-0-default", "no-header-default"])
def test_envoy_zero_means_no_timeout_and_falls_through(upstream, rg_factory, hdrs, expect_ms):
    rg = _precedence_rg(rg_factory, upstream)
    r = rg.request("GET", "/e", headers=hdrs)
    assert r.status == 200, r
    (req,) = upstream.wait_requests(1)
    _assert_all_rewritten(req, [n for n, _ in hdrs], expect_ms)


def test_envoy_zero_then_connect_timeout_zero_is_expired(upstream, rg_factory):
    rg = _precedence_rg(rg_factory, upstream)
    r = rg.request("GET", "/e", headers=[("x-envoy-upstream-rq-timeout-ms", "0"),
                                         ("connect-timeout-ms", "0")])
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 0)


# ------------------------------------------------------------------------------- malformed

def _raw_get(rg, header_lines):
    """GET on a raw connection -> (RawResponse, closed after it)."""
    with RawConn(rg.port) as c:
        c.send(b"GET /m HTTP/1.1\r\nHost: t\r\n" + b"".join(
            ("%s: %s\r\n" % (n, v)).encode("latin-1") for n, v in header_lines) + b"\r\n")
        resp = c.read_response(timeout=5)
        return resp, c.wait_closed(3)


@pytest.mark.parametrize("hdrs", [
    [("X-Timeout-Ms", "abc")], [("X-Timeout-Ms", "-1")], [("X-Timeout-Ms", "1.5")],
    [("X-Timeout-Ms", "+5")], [("X-Timeout-Ms", "10ms")], [("X-Timeout-Ms", "")],
    [("X-Timeout-Ms", "0x10")],
    [("grpc-timeout", "300")], [("grpc-timeout", "300x")], [("grpc-timeout", "123456789m")],
    [("grpc-timeout", "m")], [("grpc-timeout", "1.5S")], [("grpc-timeout", "-1S")],
    [("connect-timeout-ms", "x")], [("connect-timeout-ms", "-0")],
    [("x-envoy-upstream-rq-timeout-ms", "-1")], [("x-envoy-expected-rq-timeout-ms", "1s")],
    # an Envoy 0 counts as absent: the next header is the first present one
    [("x-envoy-upstream-rq-timeout-ms", "0"), ("x-envoy-expected-rq-timeout-ms", "soon")],
    # a malformed first header is not rescued by a good later one
    [("X-Timeout-Ms", "abc"), ("grpc-timeout", "1S")],
])
def test_malformed_deadline_is_400_bad_deadline_and_closes(upstream, rg_factory, hdrs):
    rg = rg_factory(upstreams=api(upstream))
    resp, closed = _raw_get(rg, hdrs)
    assert resp.status == 400, resp
    assert resp.headers.get("X-Retrygate-Reason") == "bad-deadline"
    assert resp.headers.get("X-Retrygate-Attempts") == "0"
    assert json.loads(resp.body) == {"error": "bad-deadline", "upstream": "api", "attempts": 0}
    assert closed, "a 400 bad-deadline must close the connection"
    time.sleep(0.1)
    assert upstream.request_count == 0


def test_only_the_first_present_header_is_parsed(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    r = rg.request("GET", "/m", headers=[("X-Timeout-Ms", "800"), ("grpc-timeout", "garbage"),
                                         ("connect-timeout-ms", "-3")])
    assert r.status == 200, r
    (req,) = upstream.wait_requests(1)
    assert 500 <= int(req.header("X-Timeout-Ms")) <= 800


@pytest.mark.parametrize("name,v1,v2", [("X-Timeout-Ms", "500", "600"),
                                        ("grpc-timeout", "500m", "600m"),
                                        ("connect-timeout-ms", "500", "1000")])
def test_repeated_with_different_values_is_400(upstream, rg_factory, name, v1, v2):
    rg = rg_factory(upstreams=api(upstream))
    resp, closed = _raw_get(rg, [(name, v1), (name, v2)])
    assert resp.status == 400 and resp.headers.get("X-Retrygate-Reason") == "bad-deadline", resp
    assert closed
    time.sleep(0.1)
    assert upstream.request_count == 0


def test_repeated_with_the_same_value_is_fine(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    r = rg.request("GET", "/m", headers=[("X-Timeout-Ms", "700"), ("X-Timeout-Ms", "700")])
    assert r.status == 200, r
    (req,) = upstream.wait_requests(1)
    vals = req.header_all("X-Timeout-Ms")
    assert len(vals) == 1 and 400 <= int(vals[0]) <= 700


# ------------------------------------------------------------------------------- max, default, min

def test_larger_than_max_is_clamped(upstream, rg_factory):
    upstream.push(echo())
    upstream.set_default(stall(5))
    rg = rg_factory(upstreams=api(upstream, retry={"per_try_timeout": "10s"},
                                  deadline={"default": "500ms", "max": "800ms"}))
    r = rg.request("GET", "/c", headers=[("X-Timeout-Ms", "60000"), ("grpc-timeout", "1H")])
    assert r.status == 200
    (req,) = upstream.wait_requests(1)
    x = int(req.header("X-Timeout-Ms"))
    assert 500 <= x <= 800, "clamped deadline forwarded as %d ms" % x
    assert x <= grpc_ms(req.header("grpc-timeout")) < x + 1
    # and it is enforced: a stalled upstream gets its 504 after ~800 ms, not 60 s
    r, took = timed(rg.request, "GET", "/c", headers={"X-Timeout-Ms": "60000"})
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 1)
    assert 0.78 <= took < 2.0, took


def test_default_applies_without_a_header(upstream, rg_factory):
    upstream.push(echo())
    upstream.set_default(stall(5))
    rg = rg_factory(upstreams=api(upstream, retry={"per_try_timeout": "10s"},
                                  deadline={"default": "700ms"}))
    r = rg.request("GET", "/d")
    assert r.status == 200
    (req,) = upstream.wait_requests(1)
    assert 450 <= int(req.header("X-Timeout-Ms")) <= 700
    for n in DEADLINE_HEADERS[1:]:
        assert n not in req.headers
    r, took = timed(rg.request, "GET", "/d")
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 1)
    assert 0.69 <= took < 1.8, took


def test_x_timeout_ms_is_min_of_per_try_and_remaining(upstream, rg_factory):
    upstream.set_default(stall(5))
    rg = rg_factory(upstreams=api(upstream, retry={"per_try_timeout": "400ms"}))
    r, took = timed(rg.request, "GET", "/t", headers={"X-Timeout-Ms": "650"})
    # attempt 1 timed out at 400 ms; attempt 2 had ~250 ms; then the deadline
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 2)
    assert 0.64 <= took < 1.6
    reqs = upstream.wait_requests(2)
    x1, x2 = int(reqs[0].header("X-Timeout-Ms")), int(reqs[1].header("X-Timeout-Ms"))
    assert 300 <= x1 <= 400, x1
    assert 50 <= x2 <= 250, x2
    assert reqs[1].time - reqs[0].time >= 0.39
    rg.wait_metric("retrygate_upstream_outcomes_total", 1, upstream="api", outcome="timeout")


def test_less_than_deadline_min_left_is_504_without_attempt(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream, deadline={"default": "2s", "min": "100ms"}))
    r, took = timed(rg.request, "GET", "/n", headers={"X-Timeout-Ms": "60"})
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 0)
    assert took < 0.06 + 0.5
    r = rg.request("GET", "/n", headers={"grpc-timeout": "99m"})
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 0)
    rg.wait_metric("retrygate_upstream_rejected_total", 2, op="==", upstream="api",
                   reason="deadline-exceeded")
    time.sleep(0.1)
    assert upstream.request_count == 0
    # with more than deadline.min left, the attempt is made
    r = rg.request("GET", "/n", headers={"X-Timeout-Ms": "400"})
    assert r.status == 200
    (req,) = upstream.wait_requests(1)
    assert 200 <= int(req.header("X-Timeout-Ms")) <= 400


# --------------------------------------------------------------------------- during the exchange

def test_deadline_after_a_response_relays_it_with_refusal_deadline(upstream, rg_factory):
    upstream.push(respond(503, body=b"first"))
    upstream.set_default(stall(5))
    rg = rg_factory(upstreams=api(upstream, retry={"per_try_timeout": "10s"}))
    r, took = timed(rg.request, "GET", "/r", headers={"X-Timeout-Ms": "500"})
    assert r.status == 503 and r.body == b"first", r
    assert r.headers["X-Retrygate-Retry-Refused"] == "deadline"
    assert r.headers["X-Retrygate-Attempts"] == "2"
    assert "X-Retrygate-Reason" not in r.headers
    assert 0.49 <= took < 1.5
    reqs = upstream.wait_requests(2)
    assert upstream.wait_conn_closed(reqs[1].conn_id, timeout=3) == "peer"
    rg.wait_metric("retrygate_upstream_retries_refused_total", 1, op="==", upstream="api",
                   reason="deadline")


def test_client_disconnect_cancels_the_attempt(upstream, rg_factory):
    upstream.set_default(stall())
    rg = rg_factory(upstreams=api(upstream))
    for n, how in enumerate(["close", "reset", "eof"], 1):
        c = RawConn(rg.port)
        c.send(b"GET /abort HTTP/1.1\r\nHost: t\r\nX-Timeout-Ms: 10000\r\n\r\n")
        reqs = upstream.wait_requests(n)
        rg.wait_metric("retrygate_upstream_in_flight", 1, op="==", upstream="api")
        t = time.monotonic()
        {"reset": c.reset, "close": c.close, "eof": c.shutdown_write}[how]()
        assert upstream.wait_conn_closed(reqs[-1].conn_id, timeout=3) == "peer", how
        assert time.monotonic() - t < 2.0
        rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
        rg.wait_metric("retrygate_upstream_client_aborts_total", n, op="==", upstream="api")
        c.close()
    assert upstream.request_count == 3
    # the slot really is free: a new request goes through
    upstream.set_default(echo())
    assert rg.request("GET", "/after").status == 200


def test_client_disconnect_while_the_response_body_streams(upstream, rg_factory):
    upstream.set_default(slow_body([b"z" * 100] * 50, 0.1))
    rg = rg_factory(upstreams=api(upstream))
    c = RawConn(rg.port)
    c.send(b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n")
    assert c.recv_some(5).startswith(b"HTTP/1.1 200")
    (req,) = upstream.wait_requests(1)
    c.close()
    assert upstream.wait_conn_closed(req.conn_id, timeout=3) == "peer"
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    rg.wait_metric("retrygate_upstream_client_aborts_total", 1, op="==", upstream="api")


def test_client_disconnect_during_a_retry_wait_sends_no_retry(upstream, rg_factory):
    upstream.push(respond(503, headers={"Retry-After": "1"}))
    rg = rg_factory(upstreams=api(upstream))
    c = RawConn(rg.port)
    c.send(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n")
    upstream.wait_requests(1)
    rg.wait_metric("retrygate_upstream_retries_in_flight", 1, op="==", upstream="api")
    c.close()
    rg.wait_metric("retrygate_upstream_retries_in_flight", 0, op="==", upstream="api")
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    time.sleep(1.3)
    assert upstream.request_count == 1, "a retry was sent for a client that left"
    assert rg.metric("retrygate_upstream_retries_total", upstream="api") == 0


def test_deadline_passes_while_the_request_body_is_received(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    with RawConn(rg.port) as c:
        c.send(b"POST /body HTTP/1.1\r\nHost: t\r\nX-Timeout-Ms: 300\r\n"
               b"Content-Length: 100\r\n\r\n" + b"x" * 10)
        t = time.monotonic()
        resp = c.read_response(timeout=5)
        took = time.monotonic() - t
        assert resp.status == 504 and resp.headers["X-Retrygate-Reason"] == "deadline-exceeded"
        assert resp.headers["X-Retrygate-Attempts"] == "0"
        assert 0.28 <= took < 1.3, took
        assert c.wait_closed(3), "the client connection must close"
    time.sleep(0.1)
    assert upstream.request_count == 0


def test_deadline_passes_while_a_streamed_body_is_received(upstream_factory, rg_factory):
    upstream = upstream_factory()
    rg = rg_factory(upstreams=api(upstream, retry={"max_body": "1KiB"}))
    with RawConn(rg.port) as c:
        c.send(b"PUT /stream HTTP/1.1\r\nHost: t\r\nX-Timeout-Ms: 400\r\n"
               b"Content-Length: 10000\r\n\r\n" + b"y" * 3000)
        t = time.monotonic()
        upstream.wait_connections(1)
        resp = c.read_response(timeout=5)
        took = time.monotonic() - t
        assert resp.status == 504 and resp.headers["X-Retrygate-Reason"] == "deadline-exceeded"
        assert resp.headers["X-Retrygate-Attempts"] == "1"
        assert 0.3 <= took < 1.5, took
        assert c.wait_closed(3)
    conn = upstream.conns[0]
    assert upstream.wait_conn_closed(conn.id, timeout=3) == "peer"
    reqs = upstream.wait_requests(1)
    assert not reqs[0].complete and len(reqs[0].body) <= 3000
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_response_body_streaming_past_the_deadline_is_not_cut(upstream, rg_factory, chunked):
    pieces = [bytes([65 + i]) * 100 for i in range(8)]
    upstream.push(slow_body(pieces, 0.12, chunked=chunked))
    rg = rg_factory(upstreams=api(upstream))
    r, took = timed(rg.request, "GET", "/slowbody", headers={"X-Timeout-Ms": "300"})
    assert r.status == 200 and r.body == b"".join(pieces), r
    assert took >= 0.8, "the body took %.2fs: it was meant to outlast the deadline" % took
    assert r.headers["X-Retrygate-Attempts"] == "1"
    assert "X-Retrygate-Retry-Refused" not in r.headers


def test_per_try_timeout_is_capped_by_the_deadline(upstream, rg_factory):
    """per_try_timeout 2s, deadline 400 ms: the attempt is waited for 400 ms, not 2 s, and the
    answer is the deadline's, not a per-try timeout's."""
    upstream.set_default(stall(5))
    rg = rg_factory(upstreams=api(upstream, retry={"per_try_timeout": "2s"}))
    r, took = timed(rg.request, "GET", "/cap", headers={"X-Timeout-Ms": "400"})
    assert_made_by_retrygate(r, 504, "deadline-exceeded", 1)
    assert 0.39 <= took < 1.4
    (req,) = upstream.wait_requests(1)
    assert 250 <= int(req.header("X-Timeout-Ms")) <= 400


def test_deadline_clock_starts_when_the_head_was_read(upstream, rg_factory):
    """A head that dribbles in slowly does not eat the deadline: the clock starts at its end."""
    rg = rg_factory(upstreams=api(upstream))
    with RawConn(rg.port) as c:
        c.send(b"GET /head HTTP/1.1\r\nHost: t\r\nX-Timeout-Ms: 500\r\n")
        time.sleep(0.7)
        c.send(b"X-Other: 1\r\n\r\n")
        resp = c.read_response(timeout=5)
    assert resp.status == 200, resp
    (req,) = upstream.wait_requests(1)
    assert 300 <= int(req.header("X-Timeout-Ms")) <= 500
