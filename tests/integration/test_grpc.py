"""gRPC through retrygate (SPEC §10) with a real grpcio client and a real grpcio server.

The client is grpcio (grpc.insecure_channel to retrygate's listener, its own retries off: one
layer retries); the server is tests/tools/grpcserver.py, scripted per call by metadata
(`x-script: fail:2:unavailable`, `x-key`), recording per call the metadata it received and
counting side effects per key. Where a rule is about wire shapes grpcio does not produce, or
headers grpcio consumes (grpc-timeout, te), the upstream is tests/tools/h2upstream.py speaking
gRPC framing by hand. Each rule of SPEC §10 has a test here; retrygate's own answers to a gRPC
call are gRPC errors (Trailers-Only, which grpcio exposes as trailing metadata).
"""

import http.client
import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from harness import FAST_RETRY, REPO_ROOT, InThread, Refusing, wait_for
from h2raw import H2Raw
from h2upstream import INTERNAL_ERROR, REFUSED_STREAM, respond, rst, stall

pytestmark = pytest.mark.timeout(60)

UNARY = "/test.Svc/Unary"
STREAM = "/test.Svc/Stream"
COLLECT = "/test.Svc/Collect"
CHAT = "/test.Svc/Chat"
CATALOG = "/test.Catalog/Get"
GRPC_CT = ("content-type", "application/grpc")


# ------------------------------------------------------------------------------- helpers

@pytest.fixture
def channel():
    """channel(rg) -> a grpcio channel to retrygate's listener, grpcio's own retries off."""
    made = []

    def make(rg):
        ch = grpc.insecure_channel("127.0.0.1:%d" % rg.port,
                                   options=[("grpc.enable_retries", 0)])
        made.append(ch)
        return ch
    yield make
    for ch in made:
        ch.close()


def api(server, retry=None, **more):
    """One upstream "api" speaking HTTP/2 to SERVER, fast backoff, RETRY keys on top."""
    r = dict(FAST_RETRY)
    r.update(retry or {})
    d = {"endpoints": [server.endpoint], "protocol": "h2", "retry": r}
    d.update(more)
    return {"api": d}


class Res:
    """What a grpcio client saw of one call: code, details, messages, the metadata of both
    header blocks (a Trailers-Only answer has everything in trailing_metadata) and the time."""

    def __init__(self, code, details, messages, initial, trailing, elapsed):
        self.code, self.details, self.messages = code, details, messages
        self.initial = dict(initial or ())
        self.trailing = dict(trailing or ())
        self.md = dict(self.initial)
        self.md.update(self.trailing)
        self.elapsed = elapsed

    def __repr__(self):
        return "Res(%s %r, messages=%r, initial=%r, trailing=%r, %.3fs)" % (
            self.code, self.details, self.messages, self.initial, self.trailing, self.elapsed)


def metadata(script=None, key=None, xkey=None, extra=()):
    md = []
    if script:
        md.append(("x-script", script))
    if key:
        md.append(("idempotency-key", key))
    if xkey:
        md.append(("x-key", xkey))
    return md + list(extra)


def call(ch, path=UNARY, req=b"req", timeout=5.0, kind="unary", **md):
    """One call; never raises for a gRPC error: returns a Res."""
    t0 = time.monotonic()
    m = metadata(**md)
    try:
        if kind == "unary":
            resp, c = ch.unary_unary(path).with_call(req, metadata=m, timeout=timeout)
            msgs = [resp]
        elif kind == "collect":
            resp, c = ch.stream_unary(path).with_call(iter(req), metadata=m, timeout=timeout)
            msgs = [resp]
        else:
            if kind == "chat":
                c = ch.stream_stream(path)(iter(req), metadata=m, timeout=timeout)
            else:
                c = ch.unary_stream(path)(req, metadata=m, timeout=timeout)
            msgs = []
            try:
                for x in c:
                    msgs.append(x)
            except grpc.RpcError as e:
                return Res(e.code(), e.details(), msgs, e.initial_metadata(),
                           e.trailing_metadata(), time.monotonic() - t0)
        return Res(c.code(), c.details(), msgs, c.initial_metadata(), c.trailing_metadata(),
                   time.monotonic() - t0)
    except grpc.RpcError as e:
        return Res(e.code(), e.details(), [], e.initial_metadata(), e.trailing_metadata(),
                   time.monotonic() - t0)


def frame(payload):
    """One gRPC length-prefixed message."""
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


def grpc_ok(payload=b"ok", trailers=()):
    return respond(200, headers=[GRPC_CT], body=frame(payload),
                   trailers=[("grpc-status", "0")] + list(trailers))


def trailers_only(code, extra=()):
    return respond(200, headers=[GRPC_CT, ("grpc-status", str(code)),
                                 ("grpc-message", "scripted")] + list(extra))


def attempts_of(calls):
    return [c.header("x-retrygate-attempt") for c in calls]


# ------------------------------------------------------------------------------- proxying

def test_unary_ok_relays_message_and_both_metadata_blocks(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), req=b"hello", script="initial:x-app=yes,trailer:x-order=42")
    assert r.code == grpc.StatusCode.OK and r.messages == [b"echo:hello"], r
    assert r.initial.get("x-app") == "yes" and r.trailing.get("x-order") == "42", r
    assert r.md.get("x-retrygate-attempts") == "1", r
    c = srv.wait_calls(1)[0]
    assert c.header("x-retrygate-attempt") == "1" and c.header("x-timeout-ms"), c.metadata
    assert c.header("grpc-previous-rpc-attempts") is None


def test_server_streaming_and_client_streaming_relayed(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    ch = channel(rg)
    r = call(ch, STREAM, kind="stream", script="messages:5")
    assert r.code == grpc.StatusCode.OK and r.messages == [b"msg-%d" % i for i in range(1, 6)], r
    r = call(ch, COLLECT, req=[b"a" * 1000, b"b" * 70000, b"c"], kind="collect")
    assert r.code == grpc.StatusCode.OK, r
    assert r.messages == [b"a" * 1000 + b"|" + b"b" * 70000 + b"|c"]


@pytest.mark.parametrize("ctype,grpc_answer", [
    ("application/grpc", True), ("application/grpc+proto", True),
    ("application/grpc;charset=utf-8", True), ("application/grpcx", False),
    ("application/json", False)])
def test_grpc_is_recognised_by_content_type(rg_factory, ctype, grpc_answer):
    """A dead upstream: a gRPC call gets a gRPC error, anything else the HTTP 502."""
    dead = Refusing()
    try:
        rg = rg_factory(upstreams=api(dead, {"max_attempts": 1}))
        c = H2Raw(rg.port)
        sid = c.request([(":method", "POST"), (":scheme", "http"), (":authority", "svc"),
                         (":path", UNARY), ("content-type", ctype), ("te", "trailers")],
                        body=frame(b"x"))
        resp = c.response(sid)
        c.close()
    finally:
        dead.close()
    h = dict(resp.headers)
    if grpc_answer:
        assert resp.status == 200 and h.get("grpc-status") == "14", resp
        assert h.get("content-type") == "application/grpc" and resp.body == b"", resp
        assert h.get("grpc-message") == "connect-failure", resp
        assert h.get("x-retrygate-reason") == "connect-failure", resp
    else:
        assert resp.status == 502 and "grpc-status" not in h, resp
        assert h.get("x-retrygate-reason") == "connect-failure", resp


def test_grpc_to_an_http1_upstream_is_unimplemented(upstream, rg_factory, channel):
    """SPEC §10: a gRPC call's upstream needs protocol: h2 (trailers cannot cross HTTP/1.1);
    one routed to an http1 upstream is refused, nothing forwarded."""
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream]}})
    r = call(channel(rg))
    assert r.code == grpc.StatusCode.UNIMPLEMENTED and r.details == "not-implemented", r
    assert r.md.get("x-retrygate-attempts") == "0", r
    assert not upstream.requests


def test_grpc_over_http1_is_plain_http(rg_factory, channel):
    """gRPC is HTTP/2 only: the same content-type over HTTP/1.1 is an ordinary request."""
    dead = Refusing()
    try:
        rg = rg_factory(upstreams=api(dead, {"max_attempts": 1}))
        r = rg.request("POST", UNARY, headers={"Content-Type": "application/grpc"},
                       body=frame(b"x"))
    finally:
        dead.close()
    assert r.status == 502 and r.headers.get("X-Retrygate-Reason") == "connect-failure", r


# ------------------------------------------------------------------------------- rule 4

def test_unavailable_retried_with_an_idempotency_key(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), script="fail:2:unavailable", key="order-1")
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "3", r
    calls = srv.wait_calls(3, key="order-1")
    assert attempts_of(calls) == ["1", "2", "3"]
    assert [c.header("grpc-previous-rpc-attempts") for c in calls] == [None, "1", "2"]
    assert all(c.header("idempotency-key") == "order-1" for c in calls)
    assert srv.effects == {"order-1": 1}


def test_retries_exhausted_relay_the_last_answer(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), script="code:unavailable,trailer:x-last=yes", key="tired")
    assert r.code == grpc.StatusCode.UNAVAILABLE and "call 3 of key tired" in r.details, r
    assert r.md.get("x-retrygate-retry-refused") == "max-attempts", r
    assert r.md.get("x-retrygate-attempts") == "3", r
    assert "x-retrygate-reason" not in r.md, r        # the server's answer, not retrygate's


def test_server_stream_failing_before_its_first_message_is_retried(grpcsrv, rg_factory,
                                                                   channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), STREAM, kind="stream", script="fail:1:unavailable,messages:3",
             key="st")
    assert r.code == grpc.StatusCode.OK and r.messages == [b"msg-1", b"msg-2", b"msg-3"], r
    assert len(srv.calls_for("st")) == 2


def test_unavailable_retried_on_an_idempotent_path(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"idempotent_paths": ["/test.Catalog/"]}))
    ch = channel(rg)
    r = call(ch, CATALOG, script="fail:1:unavailable", xkey="cat")
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "2", r
    assert len(srv.wait_calls(2, key="cat")) == 2
    # the other service is not on the list
    r = call(ch, UNARY, script="fail:1:unavailable", xkey="svc")
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.md.get("x-retrygate-retry-refused") == "non-idempotent", r


def test_unavailable_without_key_is_relayed_not_retried(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), script="fail:1:unavailable", xkey="nokey")
    assert r.code == grpc.StatusCode.UNAVAILABLE and "grpcserver" in r.details, r
    assert r.md.get("x-retrygate-retry-refused") == "non-idempotent", r
    assert r.md.get("x-retrygate-attempts") == "1", r
    time.sleep(0.2)
    assert len(srv.calls) == 1
    assert rg.metric("retrygate_upstream_retries_refused_total", upstream="api",
                     reason="non-idempotent") == 1


def test_idempotent_paths_apply_to_http_requests_too(upstream, rg_factory):
    upstream.push(503)
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream], "retry": dict(
        FAST_RETRY, idempotent_paths=["/catalog/"])}})
    r = rg.post("/catalog/search", body=b"q=1")
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "2", r
    upstream.push(503)
    r = rg.post("/orders", body=b"q=1")
    assert r.status == 503 and r.headers["X-Retrygate-Retry-Refused"] == "non-idempotent", r


def test_non_idempotent_always_retries_any_call(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"non_idempotent": "always"}))
    r = call(channel(rg), script="fail:1:unavailable", xkey="k")
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "2", r
    assert attempts_of(srv.wait_calls(2)) == ["1", "2"]


def test_non_200_status_is_an_http_outcome(h2up, rg_factory, channel):
    up = h2up()
    up.push(respond(503, headers=[("content-type", "text/plain")], body=b"busy"), grpc_ok())
    rg = rg_factory(upstreams=api(up))
    r = call(channel(rg), key="k503")
    assert r.code == grpc.StatusCode.OK and r.messages == [b"ok"], r
    assert len(up.wait_requests(2)) == 2


# ------------------------------------------------------------------------------- retry.on

def test_retry_on_a_code_name(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"on": ["resource-exhausted"]}))
    ch = channel(rg)
    r = call(ch, script="fail:1:resource-exhausted", key="re")
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "2", r
    # unavailable is not on this list: relayed after one attempt, no refusal to name
    r = call(ch, script="fail:1:unavailable", key="un")
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.md.get("x-retrygate-attempts") == "1", r
    assert "x-retrygate-retry-refused" not in r.md, r
    assert len(srv.calls_for("un")) == 1


def test_a_code_not_listed_is_not_retried(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    for code in ("internal", "not-found", "resource-exhausted"):
        r = call(channel(rg), script="fail:1:%s" % code, key="k-" + code)
        assert r.code.name.lower().replace("_", "-") == code, r
        assert r.md.get("x-retrygate-attempts") == "1", r
        assert "x-retrygate-retry-refused" not in r.md, r
    time.sleep(0.1)
    assert len(srv.calls) == 3


# ------------------------------------------------------------------------------- committed

def test_server_stream_committed_at_its_first_message(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), STREAM, kind="stream", script="after-message:unavailable", key="s1")
    assert r.messages == [b"msg-1"] and r.code == grpc.StatusCode.UNAVAILABLE, r
    time.sleep(0.3)
    assert len(srv.calls_for("s1")) == 1, "a committed call was retried"


def test_unary_message_then_unavailable_is_relayed_never_retried(h2up, rg_factory, channel):
    up = h2up()
    up.push(respond(200, headers=[GRPC_CT], body=frame(b"partial"),
                    trailers=[("grpc-status", "14"), ("grpc-message", "late failure")]))
    rg = rg_factory(upstreams=api(up))
    r = call(channel(rg), key="committed")
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.details == "late failure", r
    time.sleep(0.3)
    assert len(up.requests) == 1, "a committed call was retried"
    assert "x-retrygate-retry-refused" not in r.md, r
    # the metric counts the final grpc-status, from the trailers after the message too
    rg.wait_metric("retrygate_upstream_grpc_responses_total", 1, upstream="api",
                   status="unavailable")


def test_headers_then_trailers_without_data_is_a_grpc_outcome(h2up, rg_factory, channel):
    up = h2up()
    # HEADERS (no grpc-status), then trailers with grpc-status 14 and END_STREAM, no DATA
    up.push(respond(200, headers=[GRPC_CT], body=b"", trailers=[("grpc-status", "14")]),
            grpc_ok(b"second"))
    rg = rg_factory(upstreams=api(up))
    r = call(channel(rg), key="ht")
    assert r.code == grpc.StatusCode.OK and r.messages == [b"second"], r
    assert r.md.get("x-retrygate-attempts") == "2", r
    assert len(up.wait_requests(2)) == 2


def test_grpcio_headers_first_failure_is_retried(grpcsrv, rg_factory, channel):
    """The same shape from grpcio: initial metadata sent, then the error."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), script="fail:1:unavailable,headers-first", key="hf")
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "2", r


# ------------------------------------------------------------------------------- pushback

def test_pushback_is_waited_for(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), script="fail:1:unavailable,pushback:300", key="pb")
    assert r.code == grpc.StatusCode.OK, r
    c1, c2 = srv.wait_calls(2, key="pb")
    assert 0.28 <= c2.t - c1.t <= 2.0, "retry %.3fs after the pushback of 300 ms" % (c2.t - c1.t)


def test_pushback_holds_the_endpoint_for_other_retries(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    ch = channel(rg)
    a = InThread(call, ch, script="fail:1:unavailable,pushback:1500", key="A", timeout=8)
    a1 = srv.wait_calls(1, key="A")[0]
    time.sleep(0.3)
    b = call(ch, script="fail:1:unavailable", key="B", timeout=8)
    assert b.code == grpc.StatusCode.OK, b
    assert a(timeout=10).code == grpc.StatusCode.OK
    b1, b2 = srv.calls_for("B")
    assert b1.t - a1.t < 1.0, "B's first attempt waited for the hold"
    assert b2.t - a1.t >= 1.4, "B's retry went %.3fs after A's pushback of 1.5 s" % (b2.t - a1.t)


def test_negative_pushback_means_do_not_retry_and_sets_no_hold(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    ch = channel(rg)
    r = call(ch, script="fail:1:unavailable,pushback:-1", key="neg")
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.md.get("x-retrygate-retry-refused") == "retry-after", r
    assert r.md.get("grpc-retry-pushback-ms") == "-1", r
    time.sleep(0.2)
    assert len(srv.calls_for("neg")) == 1
    r = call(ch, script="fail:1:unavailable", key="after")
    assert r.code == grpc.StatusCode.OK, r
    c1, c2 = srv.calls_for("after")
    assert c2.t - c1.t < 0.5, "a hold was set by a negative pushback"


def test_pushback_beyond_retry_after_max_or_the_deadline_is_refused(grpcsrv, rg_factory,
                                                                     channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"retry_after": {"honor": True, "max": "1s"}}))
    ch = channel(rg)
    # within retry_after.max, but past the call's deadline of 500 ms (first: the 3 s pushback
    # below holds the endpoint past retry_after.max, which would refuse any retry after it)
    r = call(ch, script="fail:1:unavailable,pushback:900", key="late", timeout=5,
             extra=[("x-timeout-ms", "500")])
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.elapsed < 0.5, r
    assert r.md.get("x-retrygate-retry-refused") == "deadline", r
    r = call(ch, script="fail:1:unavailable,pushback:3000", key="far")
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.elapsed < 1.0, r
    assert r.md.get("x-retrygate-retry-refused") == "retry-after", r


def test_pushback_ignored_without_honor(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"retry_after": {"honor": False}}))
    r = call(channel(rg), script="fail:1:unavailable,pushback:-1", key="ign")
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "2", r
    r = call(channel(rg), script="fail:1:unavailable,pushback:2000", key="ign2")
    assert r.code == grpc.StatusCode.OK and r.elapsed < 1.0, r


# ------------------------------------------------------------------------------- deadline

def test_deadline_travels_and_shrinks_per_attempt(grpcsrv, rg_factory, channel):
    """Each attempt is told the call's remaining time (SPEC §10), above the default 1 s
    per_try_timeout. grpcio rounds the grpc-timeout it sends up (to 10 ms steps between 1 s
    and 10 s, and its clock conversion adds a little): a 2.5 s timeout goes out as 2500m or
    2510m, so retrygate may rightly say 2509."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), script="fail:2:unavailable,sleep:300", key="dl", timeout=2.5)
    assert r.code == grpc.StatusCode.OK, r
    calls = srv.wait_calls(3, key="dl")
    ms = [int(c.header("x-timeout-ms")) for c in calls]
    assert ms[0] <= 2510 and ms[0] >= 2000, ms
    assert ms[0] - ms[1] >= 250 and ms[1] - ms[2] >= 250, ms
    for c, m in zip(calls, ms):
        # grpc-timeout is what grpcio turns into time_remaining: the same time as x-timeout-ms
        assert c.time_remaining is not None and abs(c.time_remaining * 1000 - m) < 150, \
            (c.time_remaining, m)


def test_grpc_timeout_sent_even_when_the_client_set_none(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "800ms"}))
    r = call(channel(rg), timeout=None)
    assert r.code == grpc.StatusCode.OK, r
    c = srv.wait_calls(1)[0]
    # the call's remaining time (deadline.default, 5 s here), not per_try_timeout (SPEC §10)
    assert 4000 <= int(c.header("x-timeout-ms")) <= 5000, c.metadata
    assert c.time_remaining is not None and 3.9 < c.time_remaining <= 5.0, c.time_remaining


def test_wire_markers_te_grpc_timeout_previous_attempts(h2up, rg_factory, channel):
    up = h2up()
    up.push(trailers_only(14), trailers_only(14), grpc_ok())
    rg = rg_factory(upstreams=api(up))
    r = call(channel(rg), key="wire", timeout=3)
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "3", r
    reqs = up.wait_requests(3)
    assert [q.header("te") for q in reqs] == ["trailers"] * 3
    assert [q.header("grpc-previous-rpc-attempts") for q in reqs] == [None, "1", "2"]
    assert [q.header("x-retrygate-attempt") for q in reqs] == ["1", "2", "3"]
    for q in reqs:
        gt, ms = q.header("grpc-timeout"), int(q.header("x-timeout-ms"))
        assert gt and len(gt) <= 9 and gt[:-1].isdigit() and gt[-1] in "HMSmun", gt
        scale = {"H": 3600e3, "M": 60e3, "S": 1e3, "m": 1, "u": 1e-3, "n": 1e-6}[gt[-1]]
        assert abs(int(gt[:-1]) * scale - ms) <= 1000 if gt[-1] in "HMS" else \
            abs(int(gt[:-1]) * scale - ms) <= 2, (gt, ms)
        assert 1000 < ms <= 3010    # the call's 3 s (grpcio may round up), not per_try's 1 s


def test_a_server_past_the_deadline_gives_deadline_exceeded(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "10s"}))
    # the client waits 5 s but gives retrygate 1 s (x-timeout-ms is read first, SPEC §3)
    r = call(channel(rg), script="sleep:3000", key="slow", timeout=5,
             extra=[("x-timeout-ms", "1000")])
    assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED, r
    assert 0.8 <= r.elapsed <= 2.0, r


def test_grpcio_retry_policy_and_retrygate_do_not_multiply(grpcsrv, rg_factory):
    """grpcio's own retries (a service config retryPolicy) mark each retry with
    grpc-previous-rpc-attempts: retrygate gives those one attempt each."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    policy = {"methodConfig": [{"name": [{"service": "test.Svc"}], "retryPolicy": {
        "maxAttempts": 3, "initialBackoff": "0.01s", "maxBackoff": "0.05s",
        "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]}
    ch = grpc.insecure_channel("127.0.0.1:%d" % rg.port, options=[
        ("grpc.enable_retries", 1), ("grpc.service_config", json.dumps(policy))])
    try:
        r = call(ch, script="code:unavailable", key="layers", timeout=5)
    finally:
        ch.close()
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    # grpcio's last attempt went through once, refused as nested
    assert r.md.get("x-retrygate-retry-refused") == "nested", r
    assert r.md.get("x-retrygate-attempts") == "1", r
    calls = srv.calls_for("layers")
    seen = [(c.header("grpc-previous-rpc-attempts"), c.header("x-retrygate-attempt"))
            for c in calls]
    # grpcio's first attempt (unmarked) is retried by retrygate: 3 attempts; each of grpcio's
    # 2 retries (marked by grpcio) gets one attempt, forwarded with its markers: 5, not 9
    assert seen[:3] == [(None, "1"), ("1", "2"), ("2", "3")], seen
    assert len(seen) == 5 and [p for p, _ in seen[3:]] == ["1", "2"], seen
    assert all(a in (None, "1") for _, a in seen[3:]), seen


def test_a_deadline_gone_on_arrival_is_deadline_exceeded_without_attempt(grpcsrv,
                                                                        rg_factory):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, deadline={"default": "5s", "max": "30s",
                                                 "min": "50ms"}))
    c = H2Raw(rg.port)
    sid = c.request([(":method", "POST"), (":scheme", "http"), (":authority", "svc"),
                     (":path", UNARY), GRPC_CT, ("te", "trailers"), ("grpc-timeout", "20m")],
                    body=frame(b"x"))
    resp = c.response(sid)
    c.close()
    h = dict(resp.headers)
    assert resp.status == 200 and h.get("grpc-status") == "4", resp
    assert h.get("grpc-message") == "deadline-exceeded", resp
    assert h.get("x-retrygate-attempts") == "0", resp
    assert not srv.calls


def test_a_call_marked_by_its_clients_retries_gets_one_attempt(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), script="fail:1:unavailable", key="nested",
             extra=[("grpc-previous-rpc-attempts", "1")])
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.md.get("x-retrygate-retry-refused") == "nested", r
    time.sleep(0.2)
    calls = srv.calls_for("nested")
    assert len(calls) == 1 and calls[0].header("grpc-previous-rpc-attempts") == "1"


# ------------------------------------------------------------------------------- retrygate's answers

def test_dead_upstream_is_unavailable_connect_failure(rg_factory, channel):
    dead = Refusing()
    try:
        rg = rg_factory(upstreams=api(dead))
        r = call(channel(rg), timeout=5)
    finally:
        dead.close()
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.details == "connect-failure", r
    assert r.md.get("x-retrygate-reason") == "connect-failure", r
    assert r.md.get("x-retrygate-attempts") == "3", r     # connect-failure: any call retried
    assert r.elapsed < 3.0, r


def test_refused_stream_is_retried_for_any_call(h2up, rg_factory, channel):
    up = h2up()
    up.push(rst(REFUSED_STREAM, early=True), grpc_ok(b"after refusal"))
    rg = rg_factory(upstreams=api(up))
    r = call(channel(rg))                          # no key: the server never saw it
    assert r.code == grpc.StatusCode.OK and r.messages == [b"after refusal"], r
    assert r.md.get("x-retrygate-attempts") == "2", r


def test_reset_and_timeout_are_unavailable_with_their_reason(h2up, rg_factory, channel):
    up = h2up()
    up.push(rst(INTERNAL_ERROR), stall(5))
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "300ms"}))
    ch = channel(rg)
    r = call(ch)                                   # reset, no key: not re-sent
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.details == "reset", r
    assert r.md.get("x-retrygate-reason") == "reset", r
    assert r.md.get("x-retrygate-retry-refused") == "non-idempotent", r
    r = call(ch)                                   # no answer within per_try_timeout
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.details == "timeout", r
    assert r.md.get("x-retrygate-reason") == "timeout", r
    assert 0.25 <= r.elapsed < 2.0, r


def test_limits_are_resource_exhausted(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv), listener_limits={
        "max_body": "1KiB", "max_header_bytes": "4KiB", "max_uri_bytes": "1KiB"})
    ch = channel(rg)
    r = call(ch, req=b"x" * 5000)
    assert r.code == grpc.StatusCode.RESOURCE_EXHAUSTED and r.details == "body-too-large", r
    r = call(ch, extra=[("x-big", "v" * 6000)])
    assert r.code == grpc.StatusCode.RESOURCE_EXHAUSTED, r
    assert r.details == "headers-too-large", r
    r = call(ch, "/test.Svc/" + "M" * 2000)
    assert r.code == grpc.StatusCode.RESOURCE_EXHAUSTED and r.details == "uri-too-long", r
    assert not srv.calls


def test_overloaded_is_unavailable_with_pushback_1000(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "5s"},
                                  concurrency={"max_in_flight": 1, "max_retries_in_flight": 1}))
    ch = channel(rg)
    slow = InThread(call, ch, script="sleep:1500", xkey="slow", timeout=5)
    srv.wait_calls(1)
    r = call(ch, xkey="second")
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.details == "overloaded", r
    assert r.md.get("grpc-retry-pushback-ms") == "1000", r
    assert r.md.get("x-retrygate-reason") == "overloaded", r
    assert r.md.get("x-retrygate-attempts") == "0", r
    assert slow(timeout=10).code == grpc.StatusCode.OK


def test_no_route_is_unimplemented(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv), routes=[{"path_prefix": "/other.", "upstream": "api"}])
    r = call(channel(rg))
    assert r.code == grpc.StatusCode.UNIMPLEMENTED and r.details == "no-route", r
    assert r.md.get("x-retrygate-reason") == "no-route", r
    assert not srv.calls


def test_bad_deadline_is_invalid_argument(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), extra=[("x-timeout-ms", "soon")])
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT and r.details == "bad-deadline", r
    assert r.md.get("x-retrygate-reason") == "bad-deadline", r
    # grpcio cannot send a malformed grpc-timeout: a raw HTTP/2 client does
    c = H2Raw(rg.port)
    sid = c.request([(":method", "POST"), (":scheme", "http"), (":authority", "svc"),
                     (":path", UNARY), GRPC_CT, ("te", "trailers"), ("grpc-timeout", "12")],
                    body=frame(b"x"))
    resp = c.response(sid)
    c.close()
    h = dict(resp.headers)
    assert resp.status == 200 and h.get("grpc-status") == "3", resp
    assert h.get("grpc-message") == "bad-deadline", resp
    assert not srv.calls


# ------------------------------------------------------------------------------- idempotency (§6)

def idem_api(srv, retry=None, **idem):
    i = {"enabled": True}
    i.update(idem)
    return api(srv, retry, idempotency=i)


def test_idempotent_replay_of_messages_and_trailers(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=idem_api(srv))
    ch = channel(rg)
    first = call(ch, req=b"pay", script="initial:x-app=yes,trailer:x-order=42", key="pay-1")
    assert first.code == grpc.StatusCode.OK and first.messages == [b"echo:pay"], first
    again = call(ch, req=b"pay", script="initial:x-app=yes,trailer:x-order=42", key="pay-1")
    assert again.code == grpc.StatusCode.OK and again.messages == [b"echo:pay"], again
    assert again.initial.get("idempotency-replayed") == "true", again
    assert again.initial.get("x-app") == "yes" and again.trailing.get("x-order") == "42", again
    assert "idempotency-replayed" not in first.md
    assert srv.effects == {"pay-1": 1} and len(srv.calls) == 1
    assert rg.metric("retrygate_idempotency_total", upstream="api", result="replayed") == 1


def test_definite_error_is_stored_and_replayed(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=idem_api(srv))
    ch = channel(rg)
    first = call(ch, script="fail:1:not-found", key="nf")
    again = call(ch, script="fail:1:not-found", key="nf")
    assert first.code == again.code == grpc.StatusCode.NOT_FOUND, (first, again)
    assert again.md.get("idempotency-replayed") == "true", again
    assert len(srv.calls) == 1


def test_repeat_while_the_first_runs_is_aborted(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=idem_api(srv, {"per_try_timeout": "5s"}))
    ch = channel(rg)
    first = InThread(call, ch, script="sleep:1500", key="busy", timeout=5)
    srv.wait_calls(1)
    r = call(ch, script="sleep:1500", key="busy")
    assert r.code == grpc.StatusCode.ABORTED and r.details == "idempotency-in-progress", r
    assert r.md.get("x-retrygate-reason") == "idempotency-in-progress", r
    assert first(timeout=10).code == grpc.StatusCode.OK
    assert len(srv.calls) == 1


def test_key_mismatch_and_key_required(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=idem_api(srv, require_key=True))
    ch = channel(rg)
    assert call(ch, req=b"first", key="mm").code == grpc.StatusCode.OK
    r = call(ch, req=b"other body", key="mm")
    assert r.code == grpc.StatusCode.FAILED_PRECONDITION, r
    assert r.details == "idempotency-key-mismatch", r
    r = call(ch, req=b"no key")
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r
    assert r.details == "idempotency-key-required", r
    assert len(srv.calls) == 1


def test_unavailable_outcome_is_not_stored(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=idem_api(srv, {"max_attempts": 1}, lock_timeout="1s"))
    ch = channel(rg)
    r = call(ch, script="fail:1:unavailable", key="unk")
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    # the outcome is unknown: the key stays claimed until lock_timeout, then runs again
    r = call(ch, script="fail:1:unavailable", key="unk")
    assert r.code == grpc.StatusCode.ABORTED and r.details == "idempotency-in-progress", r
    time.sleep(1.3)
    r = call(ch, script="fail:1:unavailable", key="unk")
    assert r.code == grpc.StatusCode.OK and "idempotency-replayed" not in r.md, r
    assert len(srv.calls_for("unk")) == 2


# ------------------------------------------------------------------------------- streaming replay

def test_client_stream_replayed_while_small(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), COLLECT, req=[b"one", b"two"], kind="collect",
             script="fail:1:unavailable", key="cs")
    assert r.code == grpc.StatusCode.OK and r.messages == [b"one|two"], r
    c1, c2 = srv.wait_calls(2, key="cs")
    assert c1.messages == c2.messages == [b"one", b"two"]


def test_bidirectional_stream_replayed_while_small(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv))
    r = call(channel(rg), CHAT, req=[b"a", b"b", b"c"], kind="chat",
             script="fail:1:unavailable", key="bidi")
    assert r.code == grpc.StatusCode.OK and r.messages == [b"re:a", b"re:b", b"re:c"], r
    c1, c2 = srv.wait_calls(2, key="bidi")
    assert c2.messages == [b"a", b"b", b"c"]


def test_client_stream_over_max_body_not_replayed(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"max_body": "64"}))
    r = call(channel(rg), COLLECT, req=[b"a" * 100, b"b" * 100], kind="collect",
             script="fail:1:unavailable", key="big")
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.md.get("x-retrygate-retry-refused") == "body-too-large", r
    time.sleep(0.2)
    assert len(srv.calls_for("big")) == 1


def test_client_stream_outgrowing_max_body_reaches_the_server_whole(grpcsrv, rg_factory,
                                                                    channel):
    # the attempt reads the kept messages in place, then streams what comes after the body
    # outgrew max_body: every byte once, in order, whether the messages come together or
    # one by one
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"max_body": "64"}))
    ch = channel(rg)
    msgs = [b"a" * 30, b"b" * 20, b"c" * 100, b"d" * 10, b"e" * 3000]

    def slowly():
        for m in msgs:
            time.sleep(0.05)
            yield m

    for key, req in (("together", msgs), ("apart", slowly())):
        r = call(ch, COLLECT, req=req, kind="collect", key=key)
        assert r.code == grpc.StatusCode.OK and r.messages == [b"|".join(msgs)], (key, r)
        (c,) = srv.wait_calls(1, key=key)
        assert c.messages == msgs, key


# ------------------------------------------------------------------------------- metrics, log, budget

def test_grpc_responses_metric_and_access_log(grpcsrv, rg_factory, channel, tmp_path):
    srv = grpcsrv()
    log = tmp_path / "access.log"
    rg = rg_factory(upstreams=api(srv), access_log=str(log))
    r = call(channel(rg), script="fail:2:unavailable", key="m")
    assert r.code == grpc.StatusCode.OK, r
    rg.wait_metric("retrygate_upstream_grpc_responses_total", 2, upstream="api",
                   status="unavailable")
    rg.wait_metric("retrygate_upstream_grpc_responses_total", 1, upstream="api", status="ok")
    assert rg.metric("retrygate_upstream_grpc_responses_total", upstream="api",
                     status="unavailable") == 2
    recs = wait_for(lambda: [json.loads(x) for x in log.read_text().splitlines()
                             if x.strip()] if log.exists() else None, 5, what="access log")
    rec = [x for x in recs if x.get("path") == UNARY][-1]
    assert rec["attempts"] == 3 and len(rec["tries"]) == 3, rec

    # each try names its grpc-status, as a number and by name (README, "gRPC")
    assert [(t.get("grpc_status"), t.get("grpc_status_name")) for t in rec["tries"]] == \
        [(14, "unavailable"), (14, "unavailable"), (0, "ok")], rec


def test_budget_bounds_grpc_amplification(grpcsrv, rg_factory, channel):
    srv = grpcsrv()
    n, tokens, ratio = 40, 5, 0.1
    rg = rg_factory(upstreams=api(srv, {"max_attempts": 3, "budget": {
        "ratio": ratio, "min_per_second": 0, "max_tokens": tokens}}))
    ch = channel(rg)
    with ThreadPoolExecutor(8) as ex:
        res = list(ex.map(lambda i: call(ch, script="code:unavailable", key="b%d" % i),
                          range(n)))
    assert all(r.code == grpc.StatusCode.UNAVAILABLE for r in res)
    bound = n + tokens + ratio * n
    seen = len(srv.calls)
    assert n < seen <= bound, "%d attempts for %d calls, bound %g" % (seen, n, bound)
    assert any(r.md.get("x-retrygate-retry-refused") == "budget" for r in res)
    rg.wait_metric("retrygate_upstream_attempts_total", seen, upstream="api", op="==")


# ------------------------------------------------------------------------------- the server itself

def test_grpcserver_as_a_process_with_phases_and_dedupe(tmp_path):
    """tests/tools/grpcserver.py as the demo runs it: the address line, the stats port, the
    phases started by POST /start, an outage failing every call (fail rate 1), and a keyed
    call that already executed answering OK without a second side effect."""
    p = subprocess.Popen([sys.executable, str(REPO_ROOT / "tests" / "tools" / "grpcserver.py"),
                          "--phases", "healthy:0.3,outage:30", "--fail-rate", "1",
                          "--executed-rate", "1", "--dedupe"],
                         stdout=subprocess.PIPE, stderr=open(tmp_path / "err", "w"), text=True)
    try:
        line = p.stdout.readline().split()
        assert line[0] == "grpc" and line[2] == "stats", line
        gport, sport = int(line[1].rsplit(":", 1)[1]), int(line[3].rsplit(":", 1)[1])

        def admin(method, path):
            c = http.client.HTTPConnection("127.0.0.1", sport, timeout=5)
            c.request(method, path, body=b"" if method == "POST" else None)
            r = c.getresponse()
            out = json.loads(r.read())
            c.close()
            return r.status, out
        ch = grpc.insecure_channel("127.0.0.1:%d" % gport, options=[("grpc.enable_retries", 0)])
        try:
            assert call(ch, xkey="k1", key="k1").code == grpc.StatusCode.OK   # before /start
            assert admin("POST", "/start")[0] == 200
            time.sleep(0.4)                                                   # in the outage
            r = call(ch, xkey="k1", key="k1")
            assert r.code == grpc.StatusCode.UNAVAILABLE, r
            r = call(ch, xkey="k2")
            assert r.code == grpc.StatusCode.UNAVAILABLE, r
            assert call(ch, script="messages:1", xkey="k3").code == grpc.StatusCode.OK  # scripted
        finally:
            ch.close()
        st, stats = admin("GET", "/stats")
        # k1 executed once (its repeat was deduplicated), k2 executed then failed
        assert st == 200 and stats["effects"] == {"k1": 1, "k2": 1, "k3": 1}, stats
        assert stats["by_code"] == {"ok": 2, "unavailable": 2}, stats
        st, calls = admin("GET", "/calls")
        assert [c["phase"] for c in calls] == ["healthy", "outage", "outage", "outage"], calls
        assert admin("POST", "/reset")[1] == {"reset": True}
        assert admin("GET", "/stats")[1]["calls"] == 0
    finally:
        p.terminate()
        assert p.wait(10) == 0
        p.stdout.close()
