"""The Foundation (issue 2), black-box against the real binary: routing (SPEC §2), endpoints,
upstream connection pooling, HTTP/1.1 message handling (SPEC §8), forwarding headers, and the
responses retrygate makes when an upstream fails (SPEC §5).

Streaming with bounded memory (1 GiB up/down) lives in test_memory.py; reload, drain and
workers in test_operations.py."""

import json
import os
import re
import subprocess
import threading
import time

import pytest

from harness import (RawConn, callback, close, parse_response, parse_responses, reset, respond,
                     slow_body, stall, upstream_block, wait_for)

pytestmark = pytest.mark.timeout(60)

def get(path="/", host="svc", extra=b""):
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: " + host.encode() + b"\r\n" + extra + \
        b"\r\n"


def check_own_response(r, status, reason, upstream, attempts):
    """A response made by retrygate (SPEC §5): status, JSON body, the two headers."""
    assert r.status == status, r
    assert r.headers.get("X-Retrygate-Reason") == reason, r
    assert r.headers.get("X-Retrygate-Attempts") == str(attempts), r
    assert "json" in (r.headers.get("Content-Type") or ""), r
    doc = json.loads(r.body)
    assert doc == {"error": reason, "upstream": upstream, "attempts": attempts}, doc


# ------------------------------------------------------------------------------- routes

@pytest.fixture
def three(upstream_factory):
    return [upstream_factory(name=n) for n in ("A", "B", "C")]


def _routed_to(rg, host, path="/"):
    r = rg.get(path, {"Host": host})
    if r.status == 404 and r.headers.get("X-Retrygate-Reason") == "no-route":
        return None
    assert r.status == 200, r
    return r.headers.get("X-Upstream")


def test_route_host_exact_case_insensitive_port_ignored(rg_factory, three):
    a, b, c = three
    rg = rg_factory(upstreams={"a": a, "b": b},
                    routes=[{"host": "alpha", "upstream": "a"},
                            {"host": "Beta.Internal", "upstream": "b"}])
    assert _routed_to(rg, "alpha") == "A"
    assert _routed_to(rg, "ALPHA") == "A"
    assert _routed_to(rg, "AlPhA:8080") == "A"
    assert _routed_to(rg, "alpha:1") == "A"
    assert _routed_to(rg, "beta.internal") == "B"
    assert _routed_to(rg, "BETA.INTERNAL:443") == "B"
    # exact means exact: no prefix / suffix / sub-domain match
    for h in ("alpha2", "xalpha", "www.alpha", "alpha.beta.internal", "beta", "internal"):
        assert _routed_to(rg, h) is None, h


def test_route_wildcard_any_depth_not_bare_suffix(rg_factory, three):
    a, b, c = three
    rg = rg_factory(upstreams={"a": a, "b": b},
                    routes=[{"host": "*.example.com", "upstream": "a"},
                            {"host": "example.com", "upstream": "b"}])
    for h in ("x.example.com", "a.b.example.com", "deep.er.still.example.com",
              "X.EXAMPLE.COM", "Y.Example.Com:8443"):
        assert _routed_to(rg, h) == "A", h
    # the bare suffix is not matched by the wildcard (here it has its own route)
    assert _routed_to(rg, "example.com") == "B"
    assert _routed_to(rg, "EXAMPLE.COM:80") == "B"
    # the suffix must be a whole label
    assert _routed_to(rg, "xexample.com") is None
    assert _routed_to(rg, "example.com.evil") is None


def test_route_wildcard_bare_suffix_is_no_route(rg_factory, upstream):
    rg = rg_factory(upstreams={"a": upstream}, routes=[{"host": "*.example.com", "upstream": "a"}])
    assert _routed_to(rg, "example.com") is None
    assert _routed_to(rg, "www.example.com") == upstream.name


def test_route_path_prefix_plain_string_prefix(rg_factory, three):
    a, b, c = three
    rg = rg_factory(upstreams={"a": a, "b": b},
                    routes=[{"path_prefix": "/api", "upstream": "a"},
                            {"path_prefix": "/static/", "upstream": "b"}])
    assert _routed_to(rg, "h", "/api") == "A"
    assert _routed_to(rg, "h", "/api/v1/x?q=1") == "A"
    assert _routed_to(rg, "h", "/apix") == "A"          # a plain string prefix, not a segment
    assert _routed_to(rg, "h", "/static/x.css") == "B"
    assert _routed_to(rg, "h", "/static") is None
    assert _routed_to(rg, "h", "/ap") is None
    assert _routed_to(rg, "h", "/API") is None          # the path is case-sensitive
    assert _routed_to(rg, "h", "/") is None


def test_route_first_match_wins(rg_factory, three):
    a, b, c = three
    rg = rg_factory(upstreams={"a": a, "b": b, "c": c},
                    routes=[{"host": "svc", "path_prefix": "/v2", "upstream": "a"},
                            {"host": "*.svc", "upstream": "b"},
                            {"host": "svc", "upstream": "b"},
                            {"path_prefix": "/", "upstream": "c"},
                            {"host": "svc", "path_prefix": "/v2/x", "upstream": "a"}])
    assert _routed_to(rg, "svc", "/v2/x") == "A"
    assert _routed_to(rg, "svc", "/v1") == "B"
    assert _routed_to(rg, "a.svc", "/v2") == "B"
    assert _routed_to(rg, "other", "/v2/x") == "C"
    assert _routed_to(rg, "other", "/") == "C"


def test_route_omitted_host_matches_any_host(rg_factory, upstream):
    rg = rg_factory(upstreams={"a": upstream}, routes=[{"path_prefix": "/", "upstream": "a"}])
    for h in ("a", "b.c.d", "127.0.0.1:9", "[::1]:80"):
        assert _routed_to(rg, h) == upstream.name, h
    # HTTP/1.0 without Host: still routed by a route without host
    data, _ = rg.raw(b"GET /x HTTP/1.0\r\n\r\n")
    assert parse_response(data).status == 200


def test_no_route_404_body_and_headers(rg_factory, upstream):
    rg = rg_factory(upstreams={"a": upstream}, routes=[{"host": "only", "upstream": "a"}])
    with RawConn(rg.port) as c:
        c.send(get("/x", host="other"))
        r = c.read_response()
        check_own_response(r, 404, "no-route", r.json().get("upstream", ""), 0)
        assert isinstance(r.json()["upstream"], str)
        assert list(r.json()) == ["error", "upstream", "attempts"]
        # a 404 is not a refusal of a malformed request: the connection stays usable
        c.send(get("/y", host="only"))
        assert c.read_response().status == 200
    assert [q.path for q in upstream.requests] == ["/y"]


def test_no_route_never_contacts_an_upstream(rg_factory, upstream):
    rg = rg_factory(upstreams={"a": upstream}, routes=[{"path_prefix": "/a", "upstream": "a"}])
    for p in ("/", "/b", "/x/a"):
        r = rg.get(p)
        check_own_response(r, 404, "no-route", r.json()["upstream"], 0)
    time.sleep(0.1)
    assert upstream.connections == 0


# ------------------------------------------------------------------------------- endpoints

def test_round_robin_across_endpoints(rg_factory, three):
    rg = rg_factory(upstreams={"api": {"endpoints": three}})
    seen = [rg.get("/rr").headers.get("X-Upstream") for _ in range(9)]
    assert sorted(seen) == ["A"] * 3 + ["B"] * 3 + ["C"] * 3, seen
    # a rotation, not a random pick: each window of 3 consecutive requests covers all three
    for i in range(0, 9, 3):
        assert sorted(seen[i:i + 3]) == ["A", "B", "C"], seen


def test_round_robin_with_keepalive_client(rg_factory, three):
    rg = rg_factory(upstreams={"api": {"endpoints": three}})
    c = rg.client()
    seen = [c.get("/rr").headers.get("X-Upstream") for _ in range(6)]
    assert sorted(seen) == ["A", "A", "B", "B", "C", "C"], seen


def test_endpoint_by_name_localhost(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": {"endpoints": ["localhost:%d" % upstream.port],
                                       "retry": {"max_attempts": 1}}})
    for _ in range(3):
        r = rg.get("/named")
        assert r.status == 200, r
        assert r.headers.get("X-Upstream") == upstream.name
    assert len(upstream.wait_requests(3)) == 3


def test_endpoint_by_name_mixed_with_address(rg_factory, upstream_factory):
    u1, u2 = upstream_factory(name="N"), upstream_factory(name="I")
    rg = rg_factory(upstreams={"api": {"endpoints": ["localhost:%d" % u1.port, u2.endpoint],
                                       "retry": {"max_attempts": 1}}})
    seen = {rg.get("/").headers.get("X-Upstream") for _ in range(6)}
    assert seen == {"N", "I"}


def test_startup_does_not_wait_for_name_resolution(rg_factory, upstream):
    # a name that is resolved when first used, not at startup: the process comes up at once and
    # a name known to the system resolver is used; the admin answers immediately
    t0 = time.monotonic()
    rg = rg_factory(upstreams={"api": {"endpoints": ["localhost:%d" % upstream.port]}})
    assert time.monotonic() - t0 < 5
    assert rg.ready() == 200
    assert rg.get("/").status == 200


# ------------------------------------------------------------------------------- pooling

def test_upstream_connections_are_pooled_and_reused(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    for i in range(5):
        assert rg.get("/p%d" % i).status == 200       # a new client connection each time
    reqs = upstream.wait_requests(5)
    assert len({r.conn_id for r in reqs}) == 1, [r.conn_id for r in reqs]
    assert [r.seq for r in reqs] == [0, 1, 2, 3, 4]
    assert upstream.connections == 1


def test_no_reuse_after_connection_close_response(rg_factory, upstream):
    upstream.push(respond(200, body=b"one", keep_alive=False), 200, 200)
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    assert rg.get("/1").body == b"one"
    assert rg.get("/2").status == 200
    assert rg.get("/3").status == 200
    r1, r2, r3 = upstream.wait_requests(3)
    assert r2.conn_id != r1.conn_id          # never reused after "Connection: close"
    assert r3.conn_id == r2.conn_id          # a keep-alive one is
    assert upstream.errors == []


def test_no_reuse_after_http10_response_without_keepalive(rg_factory, upstream):
    upstream.push(respond(200, body=b"ten", version="HTTP/1.0", headers={"Connection": "x"}),
                  200)
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    r = rg.get("/1")
    assert r.status == 200 and r.body == b"ten"
    assert rg.get("/2").status == 200
    r1, r2 = upstream.wait_requests(2)
    assert r1.conn_id != r2.conn_id


def test_no_reuse_after_close_delimited_body(rg_factory, upstream):
    upstream.push(respond(200, body=b"until-close", content_length=False), 200)
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    r = rg.get("/1")
    assert r.status == 200 and r.body == b"until-close"
    assert rg.get("/2").status == 200
    r1, r2 = upstream.wait_requests(2)
    assert r1.conn_id != r2.conn_id


def test_pooled_connection_closed_by_upstream_is_replaced(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"max_attempts": 1})})
    assert rg.get("/1").status == 200
    upstream.wait_requests(1)
    wait_for(lambda: upstream.idle_connections(), 5, what="the pooled connection to be idle")
    assert upstream.close_idle() == 1         # the upstream closes the idle pooled connection
    upstream.wait_conn_closed(1)
    time.sleep(0.2)
    r = rg.get("/2")
    assert r.status == 200 and r.headers.get("X-Retrygate-Attempts") == "1"
    r1, r2 = upstream.wait_requests(2)
    assert r1.conn_id != r2.conn_id


def test_curl_keepalive_sequence_reuses_the_client_connection(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    cp = subprocess.run(["curl", "-sv", "--max-time", "10", rg.url("/one"), rg.url("/two"),
                         rg.url("/three")], capture_output=True, text=True, timeout=20)
    assert cp.returncode == 0, cp.stderr
    assert cp.stderr.count("Connected to") == 1, cp.stderr
    assert cp.stderr.count("Re-using existing connection") == 2, cp.stderr
    docs = [json.loads(x) for x in re.findall(r"\{.*?\n\}\n", cp.stdout, re.S)]
    assert [d["target"] for d in docs] == ["/one", "/two", "/three"]


# ------------------------------------------------------------------------------- bodies

def test_content_length_request_body(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    body = os.urandom(10000)
    r = rg.request("PUT", "/cl", body=body)
    assert r.status == 200
    (q,) = upstream.wait_requests(1)
    assert q.body == body and q.complete
    assert q.framing in ("length", "chunked")
    if q.framing == "length":
        assert q.header("Content-Length") == str(len(body))


def test_chunked_request_body_small_and_large(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    small = [b"abc", b"defgh", b"i" * 100]
    r = rg.request("POST", "/chunked-small", body=small, chunked=True)
    assert r.status == 200
    big = [os.urandom(30000) for _ in range(10)]          # 300 kB > retry.max_body: streamed
    r = rg.request("POST", "/chunked-big", body=big, chunked=True)
    assert r.status == 200
    q1, q2 = upstream.wait_requests(2)
    assert q1.body == b"".join(small) and q1.complete
    assert q2.body == b"".join(big) and q2.complete
    for q in (q1, q2):
        # exactly one framing, computed by retrygate
        assert not (q.header("Content-Length") and q.header("Transfer-Encoding")), q.raw_head


def test_chunked_request_extensions_and_trailers_dropped(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    data, _ = rg.raw(b"POST /t HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"
                     b"3;name=val\r\nabc\r\n2\r\nde\r\n0\r\nX-Trailer: t\r\n\r\n")
    assert parse_response(data).status == 200
    (q,) = upstream.wait_requests(1)
    assert q.body == b"abcde"
    assert q.chunk_extensions == [] and q.trailers == []
    assert b"X-Trailer" not in q.raw_head and b"name=val" not in q.raw_body


def test_content_length_response(rg_factory, upstream):
    body = os.urandom(50000)
    upstream.push(respond(200, {"Content-Type": "application/octet-stream"}, body))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(get("/"))
        r = c.read_response()
    assert r.body == body and r.framing == "length"
    assert r.headers["Content-Length"] == str(len(body))


def test_chunked_response_relayed_chunked(rg_factory, upstream):
    pieces = [b"first-", os.urandom(20000), b"-last"]
    upstream.push(respond(200, body=pieces, chunked=True, trailers={"X-T": "1"}))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(get("/"))
        r = c.read_response()
        assert r.body == b"".join(pieces) and r.framing == "chunked"
        assert "content-length" not in r.headers
        c.send(get("/again"))
        assert c.read_response().status == 200           # framing was exact


def test_chunked_response_to_http10_client(rg_factory, upstream):
    pieces = [b"abc", b"def"]
    upstream.push(respond(200, body=pieces, chunked=True))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    data, closed = rg.raw(b"GET / HTTP/1.0\r\nHost: h\r\n\r\n", read_timeout=5)
    r = parse_response(data)
    # an HTTP/1.0 client cannot read chunked: the body ends with the connection
    assert r.status == 200 and r.body == b"abcdef", data
    assert "chunked" not in (r.headers.get("Transfer-Encoding") or "")
    assert closed or r.framing == "length"


def test_close_delimited_response_to_http11_client(rg_factory, upstream):
    upstream.push(respond(200, body=[b"no-", b"length"], content_length=False))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(get("/"))
        r = c.read_response()
        assert r.body == b"no-length"
        assert r.framing in ("chunked", "close")


def test_http10_client_keepalive(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(b"GET /a HTTP/1.0\r\nHost: h\r\nConnection: keep-alive\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.headers.get("Connection", "").lower() == "keep-alive"
        c.send(b"GET /b HTTP/1.0\r\nHost: h\r\n\r\n")
        r = c.read_response()
        assert r.status == 200
        assert c.wait_closed(3)                         # 1.0 without keep-alive: closed after


def test_head_response_has_no_body(rg_factory, upstream):
    upstream.push(respond(200, {"Content-Length": "1234"}))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(b"HEAD /h HTTP/1.1\r\nHost: h\r\n\r\n" + get("/after"))
        r = c.read_response("HEAD")
        assert r.status == 200 and r.body == b""
        assert r.headers.get("Content-Length") == "1234"
        r2 = c.read_response()
        assert r2.status == 200 and json.loads(r2.body)["target"] == "/after"
        assert c.recv_some(0.3) == b""
    assert upstream.wait_requests(2)[0].method == "HEAD"


@pytest.mark.parametrize("status", [204, 304])
def test_204_304_have_no_body(rg_factory, upstream, status):
    upstream.push(respond(status, {"ETag": '"x"'}))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(get("/n") + get("/after"))
        r = c.read_response()
        assert r.status == status and r.body == b""
        assert "transfer-encoding" not in r.headers
        if status == 204:
            assert "content-length" not in r.headers
        r2 = c.read_response()
        assert r2.status == 200 and json.loads(r2.body)["target"] == "/after"


def test_pipelined_requests_answered_in_order(rg_factory, upstream):
    # the first is the slowest: answers must still come in request order
    upstream.on_path("/1", respond(200, body=b"one", delay=0.4))
    upstream.on_path("/2", respond(201, body=b"two", delay=0.1))
    upstream.on_path("/3", respond(202, body=b"three"))
    upstream.on_path("/4", respond(200, body=b"four", chunked=True))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(get("/1") + get("/2") + b"HEAD /3 HTTP/1.1\r\nHost: h\r\n\r\n" + get("/4"))
        rs = [c.read_response(m) for m in ("GET", "GET", "HEAD", "GET")]
    assert [(r.status, r.body) for r in rs] == [(200, b"one"), (201, b"two"), (202, b""),
                                                (200, b"four")]


def test_pipelined_raw_single_write_with_bodies(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    reqs = b"".join(b"POST /p%d HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\n\r\nab%d" % (i, i)
                    for i in range(5))
    data, _ = rg.raw(reqs, read_timeout=3)
    rs = parse_responses(data)
    assert len(rs) == 5
    assert [json.loads(r.body)["target"] for r in rs] == ["/p%d" % i for i in range(5)]
    assert [json.loads(r.body)["body"] for r in rs] == ["ab%d" % i for i in range(5)]


# ------------------------------------------------------------------------------- Expect

def test_expect_100_continue_small_body(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(b"POST /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n")
        i = c.read_interim(timeout=3)
        assert i.status == 100
        c.send(b"hello")
        r = c.read_response()
        assert r.status == 200 and r.interim == []
    (q,) = upstream.wait_requests(1)
    assert q.body == b"hello"


def test_expect_100_continue_large_streamed_body(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    body = os.urandom(200000)                             # > retry.max_body: streamed
    with RawConn(rg.port) as c:
        c.send(b"PUT /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body))
        i = c.read_interim(timeout=3)
        assert i.status == 100
        c.send(body)
        r = c.read_response()
        assert r.status == 200
        assert r.interim == []                            # exactly one 100 reached the client
    (q,) = upstream.wait_requests(1)
    assert q.body == body


def test_expect_100_continue_refused_without_reading_body(rg_factory, upstream):
    # the upstream answers a final status at once: the client gets it without a 100
    upstream.push(respond(417, body=b"no", expect_continue=False, read_body=False))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    body = os.urandom(200000)
    with RawConn(rg.port) as c:
        c.send(b"PUT /e HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body))
        r = c.read_response(timeout=5)
        assert r.status == 417


# ------------------------------------------------------------------------------- Upgrade

def _ws_upstream(banner=b"server-first:"):
    def fn(conn, req):
        hdrs = ("HTTP/1.1 101 Switching Protocols\r\nUpgrade: %s\r\nConnection: Upgrade\r\n"
                "Sec-WebSocket-Accept: xyz\r\n\r\n" % req.header("Upgrade")).encode()
        if not conn.send(hdrs + banner):
            return False
        end = time.monotonic() + 10
        while time.monotonic() < end:
            if conn.buf:
                d = bytes(conn.buf)
                conn.buf.clear()
                if not conn.send(b"echo:" + d):
                    return False
            if conn.fill(0.05) is False:
                if conn.buf:
                    continue
                return False
        return False
    return callback(fn)


def test_upgrade_tunnel_bytes_both_ways(rg_factory, upstream):
    upstream.push(_ws_upstream())
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"
               b"Sec-WebSocket-Key: abc\r\nSec-WebSocket-Version: 13\r\n\r\n")
        r = c.read_response()
        assert r.status == 101
        assert r.headers.get("Upgrade", "").lower() == "websocket"
        assert "upgrade" in r.headers.get("Connection", "").lower()
        assert r.headers.get("Sec-WebSocket-Accept") == "xyz"
        got = bytes(c.buf)
        c.buf.clear()
        end = time.monotonic() + 5
        while not got.startswith(b"server-first:") and time.monotonic() < end:
            got += c.recv_some(0.5)
        assert got.startswith(b"server-first:")
        for msg in (b"hello", b"\x00\x01binary\xff", b"x" * 100000):
            c.send(msg)
            want = b"echo:" + msg
            buf = b""
            end = time.monotonic() + 5
            while len(buf) < len(want) and time.monotonic() < end:
                buf += c.recv_some(0.5)
            # the upstream may echo a large message in pieces, each prefixed
            assert buf.replace(b"echo:", b"") == msg, buf[:100]
    (q,) = upstream.wait_requests(1)
    assert q.header("Upgrade") == "websocket"
    assert "upgrade" in (q.header("Connection") or "").lower()
    assert q.header("Sec-WebSocket-Key") == "abc"
    # client closed: the tunnel's upstream side closes too
    wait_for(lambda: all(cn.closed for cn in upstream.conns), 5, what="upstream side closed")


def _open_tunnel(rg):
    c = RawConn(rg.port)
    c.send(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
    assert c.read_response().status == 101
    got = bytes(c.buf)
    c.buf.clear()
    end = time.monotonic() + 5
    while not got.startswith(b"server-first:") and time.monotonic() < end:
        got += c.recv_some(0.5)
    assert got.startswith(b"server-first:")
    return c


def test_upgrade_idle_tunnel_closes_after_idle_timeout(rg_factory, upstream):
    # like proxy_read_timeout / timeout tunnel: no byte either way for idle_timeout ends it
    upstream.push(_ws_upstream())
    rg = rg_factory(upstreams={"api": upstream_block(upstream)},
                    listener_limits={"idle_timeout": "600ms"})
    with _open_tunnel(rg) as c:
        t0 = time.monotonic()
        assert c.wait_closed(4), "an idle tunnel stays open"
        assert 0.4 < time.monotonic() - t0 < 2.5
    wait_for(lambda: all(cn.closed for cn in upstream.conns), 3, what="upstream side closed")
    rg.wait_metric("retrygate_downstream_connections_active", 0, op="==")


def test_upgrade_busy_tunnel_outlives_idle_timeout(rg_factory, upstream):
    upstream.push(_ws_upstream())
    rg = rg_factory(upstreams={"api": upstream_block(upstream)},
                    listener_limits={"idle_timeout": "600ms"})
    with _open_tunnel(rg) as c:
        end = time.monotonic() + 1.8
        while time.monotonic() < end:
            c.send(b"ping")
            buf = b""
            until = time.monotonic() + 2
            while len(buf) < len(b"echo:ping") and time.monotonic() < until:
                buf += c.recv_some(0.5)
            assert buf == b"echo:ping"
            time.sleep(0.25)


def test_upgrade_upstream_closes_tunnel(rg_factory, upstream):
    def fn(conn, req):
        conn.send(b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                  b"Connection: Upgrade\r\n\r\nbye")
        return False
    upstream.push(callback(fn))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        r = c.read_response()
        assert r.status == 101
        rest, closed = c.read_until_close(5)
        assert bytes(rest).endswith(b"bye") or b"bye" in bytes(c.buf) + rest
        assert closed


def test_upgrade_refused_by_upstream_is_a_plain_response(rg_factory, upstream):
    upstream.push(respond(200, body=b"no upgrade here"))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(b"GET /ws HTTP/1.1\r\nHost: h\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
        r = c.read_response()
        assert r.status == 200 and r.body == b"no upgrade here"


# ------------------------------------------------------------------------------- headers

def test_hop_by_hop_request_headers_not_forwarded(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    data, _ = rg.raw(b"GET /hop HTTP/1.1\r\nHost: h\r\n"
                     b"Connection: keep-alive, X-Listed, x-other-listed\r\n"
                     b"X-Listed: secret\r\nX-Other-Listed: 2\r\n"
                     b"Keep-Alive: timeout=5\r\nProxy-Connection: keep-alive\r\n"
                     b"TE: trailers\r\nTrailer: X-Whatever\r\nUpgrade: h2c\r\n"
                     b"X-Kept: yes\r\n\r\n")
    assert parse_response(data).status == 200
    (q,) = upstream.wait_requests(1)
    names = q.headers.names_lower()
    for h in ("x-listed", "x-other-listed", "keep-alive", "proxy-connection", "te",
              "trailer", "upgrade"):
        assert h not in names, (h, q.raw_head)
    assert q.header("X-Kept") == "yes"
    # no Connection header carrying the client's tokens
    for v in q.header_all("Connection"):
        assert "x-listed" not in v.lower()
    assert q.header_all("Host") == ["h"]


def test_hop_by_hop_response_headers_not_forwarded(rg_factory, upstream):
    upstream.push(respond(200, [("Connection", "X-Resp-Listed"), ("X-Resp-Listed", "1"),
                                ("Keep-Alive", "timeout=9"), ("Proxy-Connection", "x"),
                                ("Trailer", "X-T"), ("Upgrade", "h2c"), ("TE", "trailers"),
                                ("X-Resp-Kept", "ok")], b"body"))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    with RawConn(rg.port) as c:
        c.send(get("/"))
        r = c.read_response()
    names = r.headers.names_lower()
    for h in ("x-resp-listed", "keep-alive", "proxy-connection", "trailer", "upgrade", "te"):
        assert h not in names, (h, r.raw_head)
    assert r.headers.get("X-Resp-Kept") == "ok" and r.body == b"body"


def test_request_reserialized_with_one_host(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    rg.raw(b"GET /r HTTP/1.1\r\nhost: MixedCase.Example:81\r\nX-A: 1\r\nx-a: 2\r\n\r\n")
    (q,) = upstream.wait_requests(1)
    assert q.header_all("Host") == ["MixedCase.Example:81"]
    assert q.header_all("X-A") == ["1", "2"]          # repeated end-to-end headers kept, in order
    assert q.version == "HTTP/1.1"


def test_x_forwarded_for_and_proto_appended(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    rg.get("/none")
    rg.get("/some", {"X-Forwarded-For": "203.0.113.7", "X-Forwarded-Proto": "https"})
    rg.get("/chain", {"X-Forwarded-For": "198.51.100.1, 203.0.113.7"})
    a, b, c = upstream.wait_requests(3)
    assert a.header_all("X-Forwarded-For") == ["127.0.0.1"]
    assert a.header_all("X-Forwarded-Proto") == ["http"]
    assert ", ".join(b.header_all("X-Forwarded-For")) == "203.0.113.7, 127.0.0.1"
    assert ", ".join(b.header_all("X-Forwarded-Proto")) == "https, http"
    assert ", ".join(c.header_all("X-Forwarded-For")) == "198.51.100.1, 203.0.113.7, 127.0.0.1"


def test_x_forwarded_for_several_lines(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    rg.raw(b"GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 10.0.0.1\r\n"
           b"X-Forwarded-For: 10.0.0.2\r\n\r\n")
    (q,) = upstream.wait_requests(1)
    joined = ", ".join(q.header_all("X-Forwarded-For"))
    assert joined == "10.0.0.1, 10.0.0.2, 127.0.0.1", q.raw_head


def test_x_request_id_added_when_absent_kept_when_present(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    for _ in range(3):
        rg.get("/gen")
    rg.get("/keep", {"X-Request-Id": "my-id-123"})
    rg.get("/keep2", {"x-request-id": "Other-ID"})
    qs = upstream.wait_requests(5)
    gen = [q.header_all("X-Request-Id") for q in qs[:3]]
    assert all(len(g) == 1 and g[0].strip() for g in gen), gen
    assert len({g[0] for g in gen}) == 3, gen               # unique per request
    assert qs[3].header_all("X-Request-Id") == ["my-id-123"]
    assert [v for n, v in qs[4].headers.items() if n.lower() == "x-request-id"] == ["Other-ID"]


def test_x_request_id_same_on_every_attempt(rg_factory, upstream):
    upstream.push(503, 503)
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    r = rg.get("/retry")
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "3"
    ids = [q.header("X-Request-Id") for q in upstream.wait_requests(3)]
    assert ids[0] and len(set(ids)) == 1, ids


def test_host_rewrite(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream,
                                                     host_rewrite="backend.internal:8080")})
    rg.get("/", {"Host": "public.example"})
    (q,) = upstream.wait_requests(1)
    assert q.header_all("Host") == ["backend.internal:8080"]


def test_empty_host_rewrite_keeps_client_host(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream, host_rewrite="")})
    rg.get("/", {"Host": "Public.Example:1234"})
    (q,) = upstream.wait_requests(1)
    assert q.header_all("Host") == ["Public.Example:1234"]


def test_absolute_form_target_sent_as_origin_form(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    data, _ = rg.raw(b"GET http://svc/abs?q=1 HTTP/1.1\r\nHost: svc\r\n\r\n")
    assert parse_response(data).status == 200
    (q,) = upstream.wait_requests(1)
    assert q.target == "/abs?q=1" and q.header("Host") == "svc"


def test_x_retrygate_attempts_on_proxied_response(rg_factory, upstream):
    upstream.push(respond(200, {"X-Retrygate-Attempts": "7"}, b"x"))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    r = rg.get("/")
    assert r.headers.get_all("X-Retrygate-Attempts") == ["1"]
    (q,) = upstream.wait_requests(1)
    assert q.header("X-Retrygate-Attempt") == "1"


# ------------------------------------------------------------------------------- failures

def test_unreachable_upstream_502_connect_failure(rg_factory, refusing):
    rg = rg_factory(upstreams={"api": upstream_block(refusing)})
    r = rg.get("/down")
    check_own_response(r, 502, "connect-failure", "api", 3)


def test_unreachable_upstream_without_retry(rg_factory, refusing):
    rg = rg_factory(upstreams={"api": upstream_block(refusing, retry={"max_attempts": 1})})
    r = rg.post("/down", body=b"x")
    check_own_response(r, 502, "connect-failure", "api", 1)


def test_drop_before_head_502_reset(rg_factory, upstream):
    upstream.set_default(reset())
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    r = rg.get("/drop")
    check_own_response(r, 502, "reset", "api", 3)
    assert len(upstream.wait_requests(3)) == 3


def test_close_before_head_502_reset(rg_factory, upstream):
    upstream.set_default(close())
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"max_attempts": 2})})
    r = rg.get("/fin")
    check_own_response(r, 502, "reset", "api", 2)


def test_partial_head_then_close_502(rg_factory, upstream):
    from harness import raw
    upstream.set_default(raw(b"HTTP/1.1 200 OK\r\nContent-Le"))
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"max_attempts": 1})})
    r = rg.get("/half")
    assert r.status == 502
    assert r.headers["X-Retrygate-Reason"] in ("reset", "bad-response")


def test_no_head_within_per_try_timeout_504_timeout(rg_factory, upstream):
    upstream.set_default(stall())
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "200ms",
                                                                    "max_attempts": 2})})
    t0 = time.monotonic()
    r = rg.get("/stall")
    took = time.monotonic() - t0
    check_own_response(r, 504, "timeout", "api", 2)
    assert 0.35 <= took < 3.0, took
    assert len(upstream.wait_requests(2)) == 2


def test_timeout_applies_to_head_not_body(rg_factory, upstream):
    # the head arrives in time, the body is slow: not cut off by per_try_timeout
    upstream.push(slow_body([b"a", b"b", b"c", b"d"], 0.2))
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "200ms"})})
    r = rg.get("/slowbody")
    assert r.status == 200 and r.body == b"abcd"
    assert r.headers["X-Retrygate-Attempts"] == "1"


def test_retrygate_errors_keep_the_connection(rg_factory, refusing):
    rg = rg_factory(upstreams={"api": upstream_block(refusing, retry={"max_attempts": 1})})
    with RawConn(rg.port) as c:
        for _ in range(2):
            c.send(get("/"))
            r = c.read_response()
            assert r.status == 502
            assert "close" not in r.headers.get("Connection", "").lower()


# ------------------------------------------------------------------------------- workers

def test_two_workers_serve_concurrent_clients(rg_factory, upstream):
    upstream.set_default(respond(200, body=b"ok", delay=0.05))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, workers=2)
    # two worker threads at least (plus the main thread)
    tasks = os.listdir("/proc/%d/task" % rg.pid)
    assert len(tasks) >= 3, tasks
    results = []
    lock = threading.Lock()

    def client(n):
        c = rg.client()
        for i in range(10):
            r = c.get("/w%d/%d" % (n, i))
            with lock:
                results.append((r.status, r.body))

    ts = [threading.Thread(target=client, args=(n,)) for n in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(results) == 80 and all(x == (200, b"ok") for x in results)
    assert rg.wait_metric("retrygate_upstream_requests_total", 80, upstream="api") == 80
    assert rg.metric("retrygate_downstream_requests_total", code="2xx") == 80


def test_two_workers_connections_spread(rg_factory, upstream):
    """With SO_REUSEPORT both workers accept: over many fresh connections, the pooled upstream
    connections come from both (each worker has its own pool)."""
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, workers=2)
    for i in range(40):
        assert rg.get("/s%d" % i).status == 200
    reqs = upstream.wait_requests(40)
    assert len({q.conn_id for q in reqs}) >= 2
