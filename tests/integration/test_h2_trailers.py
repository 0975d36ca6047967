"""Trailers across retrygate (SPEC §9: "Trailers, in either direction, are relayed only when the
client and the upstream both speak HTTP/2 (gRPC needs them); otherwise they are dropped as in
§8").

The client is tests/tools/h2raw.py (raw frames: a request whose body ends with a trailer
HEADERS frame), the upstream tests/tools/h2upstream.py (it records the request's trailers) or,
for the HTTP/1.1 side, tests/tools/upstream.py.
"""
from harness import FAST_RETRY
from h2raw import H2Raw
from h2upstream import respond
import upstream as h1u


def post_with_trailers(c, path, body=b"payload", trailers=(("x-checksum", "abc123"),),
                       extra=()):
    sid = c.new_id()
    c.headers(sid, [(":method", "POST"), (":scheme", "http"), (":authority", "svc"),
                    (":path", path)] + list(extra), end=False)
    c.data(sid, body, end=False)
    c.headers(sid, list(trailers), end=True)
    return c.response(sid)


def h2_api(up, retry=None):
    r = dict(FAST_RETRY)
    r.update(retry or {})
    return {"api": {"endpoints": [up.endpoint], "protocol": "h2", "retry": r}}


def test_request_and_response_trailers_cross_between_http2_peers(h2up, rg_factory):
    up = h2up()
    up.push(respond(200, body=b"done", trailers=[("x-digest", "ok")]))
    rg = rg_factory(upstreams=h2_api(up))
    c = H2Raw(rg.port)
    r = post_with_trailers(c, "/t")
    assert r.status == 200 and r.body == b"done", r
    assert ("x-digest", "ok") in r.trailers, r.trailers
    q = up.wait_requests(1)[0]
    assert q.body == b"payload"
    assert q.trailers == [("x-checksum", "abc123")], q.trailers


def test_request_trailers_are_sent_again_with_a_retry(h2up, rg_factory):
    up = h2up()
    up.push(respond(503, body=b"busy"), respond(200, body=b"ok"))
    rg = rg_factory(upstreams=h2_api(up))
    c = H2Raw(rg.port)
    r = post_with_trailers(c, "/again", extra=[("idempotency-key", "k-trailers")])
    assert r.status == 200 and r.header("x-retrygate-attempts") == "2", r
    reqs = up.wait_requests(2)
    for q in reqs:
        assert q.body == b"payload", q.body
        assert q.trailers == [("x-checksum", "abc123")], q.trailers


def test_grpc_stream_trailers_follow_the_streamed_messages(h2up, rg_factory):
    up = h2up()
    """A gRPC call's messages stream upstream as they come (kept for replay); its trailers
    still arrive after them."""
    up.push(respond(200, headers=[("content-type", "application/grpc")], body=b"",
                      trailers=[("grpc-status", "0")]))
    rg = rg_factory(upstreams=h2_api(up))
    c = H2Raw(rg.port)
    msg = b"\x00\x00\x00\x00\x03abc"
    r = post_with_trailers(c, "/pkg.Svc/Call", body=msg,
                           extra=[("content-type", "application/grpc"), ("te", "trailers")])
    assert r.status == 200 and ("grpc-status", "0") in r.trailers, r
    q = up.wait_requests(1)[0]
    assert q.body == msg and q.trailers == [("x-checksum", "abc123")], (q.body, q.trailers)


def test_request_trailers_are_dropped_towards_http1(upstream, rg_factory):
    upstream.set_default(h1u.respond(200, body=b"fine"))
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream.endpoint],
                                       "retry": dict(FAST_RETRY)}})
    c = H2Raw(rg.port)
    r = post_with_trailers(c, "/h1")
    assert r.status == 200 and r.body == b"fine", r
    q = upstream.wait_requests(1)[0]
    assert q.body == b"payload", q.body
    assert q.header("x-checksum") is None


def test_response_trailers_are_dropped_towards_http1_clients(h2up, rg_factory):
    up = h2up()
    up.push(respond(200, body=b"data", trailers=[("x-digest", "ok")]))
    rg = rg_factory(upstreams=h2_api(up))
    r = rg.request("GET", "/to-h1")
    assert r.status == 200 and r.body == b"data", r
    assert r.headers.get("x-digest") is None, r.headers
