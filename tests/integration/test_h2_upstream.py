"""HTTP/1.1 clients through retrygate to an HTTP/2 upstream (SPEC §9 upstream side, mapping).

The upstream is tests/tools/h2upstream.py (python3-h2): it records each request's headers
(pseudo-headers included), the RST_STREAM frames it received and the connections it accepted.
Each SPEC §9 upstream rule has a test here; the retry, deadline and budget rules that matter
for this pairing have an HTTP/2 twin of their HTTP/1.1 test.
"""
import shutil
import signal
import socket
import subprocess
import time

import pytest

from harness import FAST_RETRY, InThread, parse_response, wait_for
from h2upstream import (CANCEL, INTERNAL_ERROR, NO_ERROR, REFUSED_STREAM, echo,
                        goaway, kill, respond, rst, stall)


def api(up, retry=None, **more):
    r = dict(FAST_RETRY)
    r.update(retry or {})
    d = {"endpoints": [up.endpoint], "protocol": "h2", "retry": r}
    d.update(more)
    return {"api": d}


def attempts(r):
    return r.headers.get("X-Retrygate-Attempts")


# ------------------------------------------------------------------------------- mapping

def test_authority_from_host_no_host_field_and_hop_by_hop_dropped(h2up, rg_factory):
    up = h2up()
    rg = rg_factory(upstreams=api(up))
    r = rg.request("GET", "/a?b=1", headers={
        "Host": "svc.local:8080", "Connection": "X-Hop", "X-Hop": "1", "Keep-Alive": "5",
        "TE": "gzip", "X-End": "ok"})
    assert r.status == 200 and attempts(r) == "1", r
    q = up.wait_requests(1)[0]
    assert q.names()[:4] == [":method", ":scheme", ":authority", ":path"]
    assert q.header(":authority") == "svc.local:8080"
    assert q.header(":scheme") == "http" and q.header(":path") == "/a?b=1"
    for absent in ("host", "connection", "keep-alive", "x-hop", "te", "transfer-encoding"):
        assert q.header(absent) is None, (absent, q.headers)
    assert q.header("x-end") == "ok"
    assert q.header("x-retrygate-attempt") == "1"
    assert q.header("x-forwarded-for") == "127.0.0.1"
    assert q.header("x-forwarded-proto") == "http"
    assert q.header("x-request-id") and q.header("x-timeout-ms")


def test_host_rewrite_names_the_authority(h2up, rg_factory):
    up = h2up()
    rg = rg_factory(upstreams=api(up, host_rewrite="inside.svc"))
    assert rg.request("GET", "/", headers={"Host": "outside"}).status == 200
    assert up.wait_requests(1)[0].header(":authority") == "inside.svc"


def test_te_trailers_goes_along(h2up, rg_factory):
    up = h2up()
    rg = rg_factory(upstreams=api(up))
    assert rg.request("GET", "/", headers={"TE": "trailers", "Connection": "TE"}).status == 200
    assert up.wait_requests(1)[0].header("te") == "trailers"


def test_status_headers_and_body_relayed(h2up, rg_factory):
    up = h2up()
    up.push(respond(201, headers=[("x-app", "yes")], body=b"created"))
    rg = rg_factory(upstreams=api(up))
    r = rg.request("GET", "/c")
    assert r.status == 201 and r.body == b"created" and r.headers["X-App"] == "yes", r
    assert r.headers.get_all("Content-Length") == ["7"]


def test_bodies_both_ways_larger_than_the_windows(h2up, rg_factory):
    up = h2up()
    big = bytes(range(256)) * 4096          # 1 MiB: several stream windows
    up.push(respond(200, body=big))
    rg = rg_factory(upstreams=api(up))
    sent = b"x" * 50000
    r = rg.request("POST", "/up", body=sent)
    assert r.status == 200 and r.body == big
    assert up.wait_requests(1)[0].body == sent


def test_streamed_request_body(h2up, rg_factory):
    up = h2up()
    rg = rg_factory(upstreams=api(up, {"max_body": "1KiB"}))
    sent = b"s" * 300000
    r = rg.request("PUT", "/stream", body=[sent[:100000], sent[100000:]], chunked=True)
    assert r.status == 200, r
    q = up.wait_requests(1)[0]
    assert q.body == sent
    assert q.header("content-length") is None and q.header("transfer-encoding") is None


def test_trailers_from_h2_upstream_dropped_for_an_http1_client(h2up, rg_factory):
    up = h2up()
    # the transport reports them (on_trailers: the debug line); the HTTP/1 responder drops them
    up.push(respond(200, body=b"abc", trailers=[("grpc-status", "0")]))
    rg = rg_factory(upstreams=api(up), env={"RETRYGATE_LOG": "debug"})
    data, closed = rg.raw(b"GET /t HTTP/1.1\r\nHost: x\r\nTE: trailers\r\n\r\n", read_timeout=1)
    resp = parse_response(data)
    assert resp.status == 200 and resp.body == b"abc" and resp.complete, data
    assert b"grpc-status" not in data
    rg.wait_stderr(r"h2 upstream \S+: 1 trailer field\(s\), first grpc-status")


def test_trailers_wait_for_the_body_a_slow_client_has_not_taken(h2up, rg_factory):
    up = h2up()
    big = b"z" * (12 << 20)     # more than the kernel buffers hold: the attempt gets paused
    up.push(respond(200, body=big, trailers=[("x-sum", "done")]))
    rg = rg_factory(upstreams=api(up), env={"RETRYGATE_LOG": "debug"})
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    s.connect(("127.0.0.1", rg.port))
    s.settimeout(10)
    try:
        s.sendall(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(1.0)         # the client reads nothing: the windows stay shut
        assert "trailer field" not in rg.stderr_text()
        got, n = [], 0
        while True:
            d = s.recv(1 << 20)
            assert d, "closed early"
            got.append(d)
            n += len(d)
            if n > len(big) and (got[-1][-5:] == b"0\r\n\r\n" or
                                 b"".join(got[-2:])[-5:] == b"0\r\n\r\n"):
                break
    finally:
        s.close()
    resp = parse_response(b"".join(got))
    assert resp.status == 200 and resp.complete and resp.body == big
    rg.wait_stderr(r"1 trailer field\(s\), first x-sum")


# ------------------------------------------------------------------------------- outcomes

def test_refused_stream_is_a_connect_failure_retried_for_post(h2up, rg_factory):
    up = h2up()
    up.push(rst(REFUSED_STREAM, early=True))
    rg = rg_factory(upstreams=api(up))
    r = rg.request("POST", "/p", body=b"once")
    assert r.status == 200 and attempts(r) == "2", r
    assert "X-Retrygate-Retry-Refused" not in r.headers
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api",
                     outcome="connect-failure") == 1


def test_goaway_below_the_stream_is_a_connect_failure(h2up, rg_factory):
    up = h2up()
    up.push(goaway(last_stream_id=0))
    rg = rg_factory(upstreams=api(up))
    r = rg.request("POST", "/g", body=b"once")
    assert r.status == 200 and attempts(r) == "2", r
    reqs = up.wait_requests(2)
    assert reqs[0].conn_id != reqs[1].conn_id      # no new stream on a GOAWAY'd connection
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api",
                     outcome="connect-failure") == 1


def test_streams_at_or_below_goaway_finish(h2up, rg_factory):
    up = h2up()
    # the first stream is answered after a GOAWAY that covers it
    up.push(respond(200, body=b"slow", delay=0.5))
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "5s"}))
    t = InThread(rg.request, "GET", "/slow")
    q = up.wait_requests(1)[0]
    conn = up.conns[q.conn_id]
    conn.goaway_raw(q.stream_id)
    r = t(timeout=10)
    assert r.status == 200 and r.body == b"slow" and attempts(r) == "1", r
    # the next request opens a new connection
    assert rg.request("GET", "/next").status == 200
    assert up.requests[-1].conn_id != q.conn_id


@pytest.mark.parametrize("method,status,n,refused", [
    ("GET", 200, 2, None), ("POST", 502, 1, "non-idempotent")])
def test_rst_stream_internal_error_is_a_reset(h2up, rg_factory, method, status, n, refused):
    up = h2up()
    up.push(rst(INTERNAL_ERROR))
    rg = rg_factory(upstreams=api(up))
    r = rg.request(method, "/r", body=b"b" if method == "POST" else None)
    assert r.status == status and attempts(r) == str(n), r
    assert r.headers.get("X-Retrygate-Retry-Refused") == refused
    if status == 502:
        assert r.headers["X-Retrygate-Reason"] == "reset"
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api", outcome="reset") == 1


def test_rst_no_error_after_a_complete_response_keeps_the_response(h2up, rg_factory):
    # the server answers before the streamed request body ended, then says "no more of the
    # body" (RST_STREAM NO_ERROR, RFC 9113 §8.1): the response stands
    up = h2up()
    up.push(respond(200, body=b"early answer", early=True, rst_after=NO_ERROR))
    rg = rg_factory(upstreams=api(up, {"max_body": "1KiB"}))
    with rg.raw_conn() as c:
        c.send(b"POST /early HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n" + b"a" * 5000)
        r = c.read_response()
    assert r.status == 200 and r.body == b"early answer" and r.complete, r
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api", outcome="reset") == 0


def test_reset_after_the_head_truncates_the_client_response(h2up, rg_factory):
    up = h2up()
    up.push(rst(INTERNAL_ERROR, after_head=True, body=b"x" * 100))
    rg = rg_factory(upstreams=api(up))
    data, closed = rg.raw(b"GET /cut HTTP/1.1\r\nHost: x\r\n\r\n", read_timeout=2)
    resp = parse_response(data)
    assert resp.status == 200 and not resp.complete and closed, data[:200]
    assert len(up.requests) == 1


def test_oversized_response_head_is_a_bad_response(h2up, rg_factory):
    up = h2up()
    up.set_default(respond(200, headers=[("x-h%d" % i, "v") for i in range(150)], body=b"no"))
    rg = rg_factory(upstreams=api(up, {"max_attempts": 1}))
    r = rg.request("GET", "/fat")
    assert r.status == 502 and r.headers["X-Retrygate-Reason"] == "bad-response", r


def test_connection_lost_before_the_head_is_a_reset(h2up, rg_factory):
    up = h2up()
    up.push(kill())
    # the scripted upstream kills the connection once the request is in: a per-try timeout
    # that a busy machine cannot outlast, so the loss is what ends the attempt
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "10s"}))
    r = rg.request("POST", "/k", body=b"b")
    assert r.status == 502 and r.headers["X-Retrygate-Reason"] == "reset", r
    assert r.headers["X-Retrygate-Retry-Refused"] == "non-idempotent"


def test_never_sent_streams_behind_the_limit_are_connect_failures(h2up, rg_factory):
    # the server's SETTINGS (max 1 stream) come late: retrygate sends one stream and keeps the
    # others queued; the connection dies: the sent POST is a reset (refused: non-idempotent),
    # the queued ones were never sent and are retried, POST or not
    up = h2up(max_streams=1, settings_delay=0.5)
    up.push(kill())
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "5s"}))
    first = InThread(rg.request, "POST", "/q1", body=b"1")
    up.wait_connections(1)
    time.sleep(0.05)
    others = [InThread(rg.request, "POST", "/q%d" % i, body=b"n") for i in (2, 3)]
    r1 = first(timeout=15)
    rs = [t(timeout=15) for t in others]
    assert r1.status == 502 and r1.headers["X-Retrygate-Retry-Refused"] == "non-idempotent", r1
    for r in rs:
        assert r.status == 200 and attempts(r) == "2", r
    paths = [q.header(":path") for q in up.requests]
    assert sorted(paths) == ["/q1", "/q2", "/q3"], paths     # the queued ones reached it once
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api",
                     outcome="connect-failure") == 2


def test_a_queued_stream_cancelled_before_it_left_is_never_sent(h2up, rg_factory):
    # retrygate hands nghttp2 the request's field bytes without a copy, to be read when the
    # HEADERS is serialized: a stream cancelled while it waits in the queue (its client went
    # away) must never be serialized, and the streams queued behind it go out whole
    up = h2up(max_streams=1, settings_delay=0.5)
    up.set_default(respond(200, body=b"ok", delay=0.3))
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "5s"}))
    first = InThread(rg.request, "GET", "/q1")
    up.wait_connections(1)
    time.sleep(0.05)
    with rg.raw_conn() as c:
        c.send(b"GET /gone HTTP/1.1\r\nHost: x\r\nX-Gone: yes\r\n\r\n")
        time.sleep(0.1)             # queued behind /q1; then its client closes
    third = InThread(rg.request, "GET", "/q3", headers={"X-Third": "3" * 300})
    assert first(timeout=15).status == 200
    r3 = third(timeout=15)
    assert r3.status == 200 and r3.body == b"ok", r3
    paths = [q.header(":path") for q in up.requests]
    assert "/gone" not in paths and sorted(paths) == ["/q1", "/q3"], paths
    q3 = [q for q in up.requests if q.header(":path") == "/q3"][0]
    assert q3.header("x-third") == "3" * 300
    assert q3.header("x-retrygate-attempt") == "1" and len(q3.header("x-request-id")) == 32
    assert q3.header(":authority") and q3.header("x-timeout-ms").isdigit()
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")


def test_per_request_values_go_never_indexed_unless_they_repeat(h2up, rg_factory):
    # x-request-id differs in every request: a never-indexed HPACK literal, so it does not
    # flush the connection's table; but for the first of the connection, which enters the
    # table once so that the later ones name it by index. The time left goes the same way while it changes (a
    # client's own deadline shrinking), and indexable once it repeats (the per-try timeout
    # with no deadline from the client), when the table can send it as one byte.
    up = h2up()
    up.set_default(echo())
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "3s"}))
    for i in range(6):
        assert rg.request("GET", "/same%d" % i).status == 200
    for i, ms in enumerate((900, 800, 700)):       # below the per-try timeout: they count
        assert rg.request("GET", "/own%d" % i, headers={"X-Timeout-Ms": str(ms)}).status == 200
    reqs = up.requests
    assert up.connections == 1 and len(reqs) == 9
    assert "x-request-id" not in reqs[0].never_indexed
    assert all("x-request-id" in q.never_indexed for q in reqs[1:])
    assert all("x-forwarded-for" not in q.never_indexed for q in reqs)
    prev, repeats = None, 0
    for q in reqs:
        v = q.header("x-timeout-ms")
        assert ("x-timeout-ms" in q.never_indexed) == (v != prev), (v, prev, q.never_indexed)
        repeats += v == prev
        prev = v
    assert repeats >= 3, [q.header("x-timeout-ms") for q in reqs]
    own = [q.header("x-timeout-ms") for q in reqs[6:]]
    assert len(set(own)) == 3 and all(int(v) < 1000 for v in own), own
    assert all("x-timeout-ms" in q.never_indexed for q in reqs[6:])


# ------------------------------------------------------------------------------- connections

def test_concurrent_requests_share_one_connection(h2up, rg_factory):
    up = h2up()
    up.set_default(respond(200, body=b"m", delay=0.3))
    rg = rg_factory(upstreams=api(up))
    rg.request("GET", "/warm")
    ts = [InThread(rg.request, "GET", "/m%d" % i) for i in range(10)]
    rs = [t(timeout=15) for t in ts]
    assert all(r.status == 200 and r.body == b"m" for r in rs)
    assert up.connections == 1
    assert len({q.stream_id for q in up.requests}) == 11


def test_another_connection_when_the_server_limit_is_full(h2up, rg_factory):
    up = h2up(max_streams=1)
    up.push(respond(200, body=b"slow", delay=1.0))
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "5s"}))
    t = InThread(rg.request, "GET", "/slow")
    up.wait_requests(1)
    time.sleep(0.1)
    start = time.monotonic()
    r = rg.request("GET", "/fast")
    assert r.status == 200 and time.monotonic() - start < 0.8
    assert t(timeout=10).status == 200
    assert up.connections == 2


def test_client_disconnect_cancels_the_stream(h2up, rg_factory):
    up = h2up()
    up.set_default(stall())
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "10s"}))
    with rg.raw_conn() as c:
        c.send(b"GET /gone HTTP/1.1\r\nHost: x\r\n\r\n")
        q = up.wait_requests(1)[0]
        assert rg.metric("retrygate_upstream_in_flight", upstream="api") == 1
    wait_for(lambda: (q.conn_id, q.stream_id, CANCEL) in up.resets, 5, what="RST_STREAM CANCEL")
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    # the connection carries on
    up.set_default(echo())
    assert rg.request("GET", "/after").status == 200
    assert up.connections == 1


def test_sigterm_lets_in_flight_streams_finish_and_exits_0(h2up, rg_factory):
    up = h2up()
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "5s"}), drain_timeout="10s")
    rg.request("GET", "/warm")          # the connection exists before the slow stream
    up.push(respond(200, body=b"finished", delay=1.0))
    t = InThread(rg.request, "GET", "/slow", timeout=15)
    up.wait_requests(2)
    rg.send_signal(signal.SIGTERM)
    r = t()
    assert r.status == 200 and r.body == b"finished" and attempts(r) == "1", r
    assert rg.wait_exit(10) == 0


# ------------------------------------------------------------------------------- twins

def test_per_try_timeout_with_a_stalling_upstream(h2up, rg_factory):
    up = h2up()
    up.set_default(stall())
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "200ms", "max_attempts": 2}))
    r = rg.request("GET", "/stall")
    assert r.status == 504 and r.headers["X-Retrygate-Reason"] == "timeout" and attempts(r) == "2"
    reqs = up.wait_requests(2)
    wait_for(lambda: all((q.conn_id, q.stream_id, CANCEL) in up.resets for q in reqs), 5,
             what="both streams cancelled")
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api", outcome="timeout") == 2


def test_deadline_with_a_stalling_upstream(h2up, rg_factory):
    up = h2up()
    up.set_default(stall())
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "5s"}))
    start = time.monotonic()
    r = rg.request("GET", "/dl", headers={"X-Timeout-Ms": "300"})
    assert r.status == 504 and r.headers["X-Retrygate-Reason"] == "deadline-exceeded", r
    assert time.monotonic() - start < 2
    q = up.wait_requests(1)[0]
    assert int(q.header("x-timeout-ms")) <= 300
    wait_for(lambda: (q.conn_id, q.stream_id, CANCEL) in up.resets, 5, what="RST_STREAM CANCEL")


def test_retry_503_then_ok_and_attempt_markers(h2up, rg_factory):
    up = h2up()
    up.push(respond(503), respond(503))
    rg = rg_factory(upstreams=api(up))
    r = rg.request("GET", "/s")
    assert r.status == 200 and attempts(r) == "3"
    assert [q.header("x-retrygate-attempt") for q in up.wait_requests(3)] == ["1", "2", "3"]


def test_max_attempts_refusal(h2up, rg_factory):
    up = h2up()
    up.set_default(respond(503, body=b"busy"))
    rg = rg_factory(upstreams=api(up, {"max_attempts": 2}))
    r = rg.request("GET", "/m")
    assert r.status == 503 and r.body == b"busy" and attempts(r) == "2"
    assert r.headers["X-Retrygate-Retry-Refused"] == "max-attempts"


def test_budget_refuses_the_second_retry(h2up, rg_factory):
    up = h2up()
    up.push(respond(503), respond(200), respond(503, body=b"no token"))
    rg = rg_factory(upstreams=api(up, {
        "budget": {"ratio": 0, "min_per_second": 0, "max_tokens": 1}}))
    assert attempts(rg.request("GET", "/b1")) == "2"
    r = rg.request("GET", "/b2")
    assert r.status == 503 and r.body == b"no token"
    assert r.headers["X-Retrygate-Retry-Refused"] == "budget"


def test_post_with_key_is_retried_after_a_reset(h2up, rg_factory):
    up = h2up()
    up.push(rst(INTERNAL_ERROR))
    rg = rg_factory(upstreams=api(up))
    r = rg.request("POST", "/k", headers={"Idempotency-Key": "k1"}, body=b"same")
    assert r.status == 200 and attempts(r) == "2"
    reqs = up.wait_requests(2)
    assert [q.body for q in reqs] == [b"same", b"same"]
    assert [q.header("idempotency-key") for q in reqs] == ["k1", "k1"]


def test_connect_failure_is_retried_elsewhere(h2up, rg_factory, refusing):
    up = h2up()
    rg = rg_factory(upstreams={"api": {"endpoints": [refusing.endpoint, up.endpoint],
                                       "protocol": "h2", "retry": dict(FAST_RETRY)}})
    for _ in range(2):
        r = rg.request("POST", "/cf", body=b"x")
        assert r.status == 200, r


# ------------------------------------------------------------------------------- TLS

@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    if not shutil.which("openssl"):
        pytest.skip("openssl CLI not installed")
    d = tmp_path_factory.mktemp("h2tls")
    key, crt = d / "server.key", d / "server.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True, timeout=60)
    return {"key": str(key), "crt": str(crt)}


def test_tls_with_alpn_h2(h2up, rg_factory, certs):
    up = h2up(tls=(certs["crt"], certs["key"]))
    rg = rg_factory(upstreams=api(up, tls={"sni": "localhost", "ca": certs["crt"],
                                           "verify": True}))
    r = rg.request("GET", "/secure", headers={"Host": "svc"})
    assert r.status == 200, r
    q = up.wait_requests(1)[0]
    assert q.header(":scheme") == "https" and q.header(":authority") == "svc"


def test_tls_endpoint_without_h2_is_a_connect_failure(h2up, rg_factory, certs):
    up = h2up(tls=(certs["crt"], certs["key"]), alpn=["http/1.1"])
    rg = rg_factory(upstreams=api(up, {"max_attempts": 2},
                                  tls={"sni": "localhost", "ca": certs["crt"], "verify": True}))
    r = rg.request("POST", "/nope", body=b"x")
    assert r.status == 502 and r.headers["X-Retrygate-Reason"] == "connect-failure", r
    assert attempts(r) == "2"      # a connect-failure is retried whatever the method
    assert up.requests == []


# ------------------------------------------------------------------------------- active health

def test_active_probes_speak_http2_to_an_h2_upstream(h2up, rg_factory):
    """SPEC §13 probes to a `protocol: h2` upstream are HTTP/2 requests (an h2c server does not
    read HTTP/1.1): a 503 marks the endpoint down, a 200 up again."""
    a, b = h2up(), h2up()
    a.set_default(respond(200, body=b"ok"))
    b.set_default(respond(503, body=b"sick"))
    rg = rg_factory(upstreams={"api": {
        "endpoints": [a.endpoint, b.endpoint], "protocol": "h2", "host_rewrite": "svc.example",
        "health": {"active": {"path": "/healthz", "interval": "100ms", "timeout": "500ms",
                              "unhealthy_after": 2, "healthy_after": 2}}}})
    wait_for(lambda: rg.metric("retrygate_endpoint_up", upstream="api", endpoint=b.endpoint) == 0,
             timeout=5, what="b probed down")
    assert rg.metric("retrygate_endpoint_up", upstream="api", endpoint=a.endpoint) == 1
    q = [r for r in b.requests if r.header(":path") == "/healthz"]
    assert len(q) >= 2, b.requests
    assert q[0].header(":method") == "GET" and q[0].header(":authority") == "svc.example"
    assert rg.metric("retrygate_upstream_attempts_total", upstream="api") == 0
    b.set_default(respond(200, body=b"ok"))
    wait_for(lambda: rg.metric("retrygate_endpoint_up", upstream="api", endpoint=b.endpoint) == 1,
             timeout=5, what="b probed up")
