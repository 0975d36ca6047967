"""A gRPC response head that names no outcome yet (SPEC §10: only Trailers-Only, trailers after
no DATA, or the first DATA decide): retrygate holds it. These tests drive the wire directly
(tests/tools/h2raw.py client, tests/tools/h2upstream.py server) to shape what grpcio cannot:
headers sent long before anything else, and several endpoints of which one keeps failing.
"""
import time

from harness import FAST_RETRY
from h2raw import H2Raw
from h2upstream import respond

CT = [("content-type", "application/grpc")]
MSG = b"\x00\x00\x00\x00\x02ok"


def api(endpoints, retry=None, **more):
    r = dict(FAST_RETRY)
    r.update(retry or {})
    d = {"endpoints": [u.endpoint for u in endpoints], "protocol": "h2", "retry": r}
    d.update(more)
    return {"api": d}


def call(c, key=None, path="/pkg.Svc/Get", extra=()):
    extra = ([("idempotency-key", key)] if key else []) + list(extra)
    sid = c.new_id()
    c.headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "svc"),
                    (":path", path), ("te", "trailers")] + CT + extra, end=False)
    c.data(sid, b"\x00\x00\x00\x00\x01q", end=True)
    return c.response(sid)


def meta(r, name):
    for k, v in list(r.headers) + list(r.trailers):
        if k == name:
            return v
    return None


def test_per_try_timeout_stops_at_the_head(h2up, rg_factory):
    """Headers at once, the message 1 s later: per_try_timeout (300 ms) bounds the wait for
    the head only (SPEC §10), so the held call runs on and commits on its one attempt."""
    up = h2up()
    up.push(respond(200, headers=CT, body=MSG, trailers=[("grpc-status", "0")], delay_body=1),
            respond(200, headers=CT, body=MSG, trailers=[("grpc-status", "0")]))
    rg = rg_factory(upstreams=api([up], {"per_try_timeout": "300ms"}))
    c = H2Raw(rg.port)
    t0 = time.monotonic()
    r = call(c, key="held-1")
    took = time.monotonic() - t0
    assert r.status == 200 and r.body == MSG, r
    assert meta(r, "grpc-status") == "0" and meta(r, "x-retrygate-attempts") == "1", r
    assert took > 0.9, took
    assert len(up.requests) == 1


def test_a_held_head_waits_until_the_calls_deadline(h2up, rg_factory):
    """Headers, then nothing for 3 s: past per_try_timeout the call waits on; its deadline
    (1 s) ends it with DEADLINE_EXCEEDED, on one attempt."""
    up = h2up()
    up.push(respond(200, headers=CT, trailers=[("grpc-status", "0")], delay_body=3))
    rg = rg_factory(upstreams=api([up], {"per_try_timeout": "300ms"}))
    c = H2Raw(rg.port)
    t0 = time.monotonic()
    r = call(c, extra=[("x-timeout-ms", "1000")])
    took = time.monotonic() - t0
    assert 0.9 < took < 2.5, took
    assert r.status == 200 and meta(r, "grpc-status") == "4", r
    assert meta(r, "grpc-message") == "deadline-exceeded", r
    assert len(up.requests) == 1


def test_unavailable_answers_eject_an_endpoint_like_5xx(h2up, rg_factory):
    """SPEC §13 passive health: UNAVAILABLE counts as a server failure, so the endpoint that
    keeps answering it is ejected and first attempts go to the other."""
    bad, good = h2up(), h2up()
    bad.set_default(respond(200, headers=CT, trailers=[("grpc-status", "14"),
                                                       ("grpc-message", "sick")]))
    good.set_default(respond(200, headers=CT, body=MSG, trailers=[("grpc-status", "0")]))
    rg = rg_factory(upstreams=api([bad, good], {"max_attempts": 1},
                                  health={"passive": {"consecutive_failures": 2,
                                                      "base_ejection": "30s"}}))
    c = H2Raw(rg.port)
    for i in range(6):
        call(c)
    before = len(bad.requests)
    assert before >= 2, before
    for i in range(10):
        r = call(c)
        assert meta(r, "grpc-status") == "0", r
    assert len(bad.requests) == before, (before, len(bad.requests))
