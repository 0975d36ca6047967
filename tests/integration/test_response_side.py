"""Hostile input, response side (issue 3): a scripted bad upstream, black-box (SPEC §4, §8).

SPEC §8: an invalid upstream response (bad status line, conflicting lengths, a body on
204/304/HEAD, an unsolicited 101, bad header bytes) becomes 502 and that upstream connection is
destroyed, never pooled; §4: it counts as `reset` and, when not retried, the client gets 502
`bad-response`. A body cut mid-stream reaches the client as an aborted stream, never padded or
completed. 1xx: 103 relayed to HTTP/1.1 clients, dropped for HTTP/1.0; 100 relayed only when the
client sent Expect and retrygate did not answer it itself; none is final. Any byte arriving on an
idle pooled upstream connection closes it.

"Not reused" is shown the strong way: the bad upstream keeps its connection open and would
serve the next request on it (raw(..., close=False)); retrygate must close it (closed_by
"peer") and the next request must arrive on a new upstream connection.
"""

import json
import time

import pytest

from harness import (RawConn, callback, interim, parse_response, partial, raw, raw_request,
                     respond, respond_100_then, build_head)

pytestmark = pytest.mark.timeout(60)

ONE_ATTEMPT = {"max_attempts": 1}


def gate(rg_factory, up, **retry):
    r = {"backoff": {"base": "1ms", "max": "2ms"}}
    r.update(retry)
    return rg_factory(upstreams={"up": {"endpoints": [up], "retry": r}})


def req(method="GET", path="/bad", extra=b"", version=b"HTTP/1.1"):
    return method.encode() + b" " + path.encode() + b" " + version + b"\r\nHost: a\r\n" + \
        extra + b"\r\n"


def check_502(r, reasons=("bad-response",), attempts=1, head=False):
    assert r.status == 502, (r, r.body[:300])
    assert r.headers.get("X-Retrygate-Reason") in reasons, r.headers
    assert r.headers.get("X-Retrygate-Attempts") == str(attempts), r.headers
    if head:                    # the answer to HEAD has no body (RFC 9110 §9.3.2)
        assert r.body == b""
        return
    doc = json.loads(r.body)
    assert doc["error"] in reasons and doc["upstream"] == "up" and doc["attempts"] == attempts


def check_not_reused(rg, up, bad_conn_id):
    """The connection that carried the bad response was closed by retrygate, and the next
    request goes out on a new connection and is answered normally."""
    assert up.wait_conn_closed(bad_conn_id, timeout=5) == "peer"
    with RawConn(rg.port) as c:
        c.send(req("GET", "/next"))
        r = c.read_response()
    assert r.status == 200 and json.loads(r.body)["target"] == "/next", r
    q = up.requests[-1]
    assert q.target == "/next" and q.conn_id != bad_conn_id


def bad_exchange(rg, up, payload, method="GET", version=b"HTTP/1.1"):
    """Script payload as the upstream's answer (connection kept open by the upstream), send
    one request, return (client response, the upstream Request)."""
    up.push(raw(payload, close=False))
    with RawConn(rg.port) as c:
        c.send(req(method, "/bad", version=version))
        r = c.read_response(method)
    (q,) = up.wait_requests(1)
    return r, q


# ------------------------------------------------------------------------------- 502 table

OK_TAIL = b"Content-Length: 0\r\n\r\n"

BAD = [
    # --- status line (RFC 9112 §4)
    ("status-4-digits", b"HTTP/1.1 2000 OK\r\n" + OK_TAIL),
    ("status-2-digits", b"HTTP/1.1 20 OK\r\n" + OK_TAIL),
    ("status-letters", b"HTTP/1.1 abc OK\r\n" + OK_TAIL),
    ("status-below-100", b"HTTP/1.1 099 Low\r\n" + OK_TAIL),
    ("status-above-599", b"HTTP/1.1 600 High\r\n" + OK_TAIL),
    ("status-missing", b"HTTP/1.1\r\n" + OK_TAIL),
    ("status-two-spaces", b"HTTP/1.1  200 OK\r\n" + OK_TAIL),
    ("status-line-bare-LF", b"HTTP/1.1 200 OK\n" + OK_TAIL),
    ("status-line-bare-CR", b"HTTP/1.1 200 OK\r" + OK_TAIL),
    ("reason-control-byte", b"HTTP/1.1 200 O\x01K\r\n" + OK_TAIL),
    ("reason-NUL", b"HTTP/1.1 200 O\x00K\r\n" + OK_TAIL),
    ("version-HTTP/2.0", b"HTTP/2.0 200 OK\r\n" + OK_TAIL),
    ("version-lower-case", b"http/1.1 200 OK\r\n" + OK_TAIL),
    ("version-missing-minor", b"HTTP/1 200 OK\r\n" + OK_TAIL),
    ("not-HTTP-ICY", b"ICY 200 OK\r\n" + OK_TAIL),
    ("garbage", b"garbage garbage\r\n\r\n"),
    # --- conflicting / malformed lengths (RFC 9112 §6.3)
    ("CL-differing", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!"),
    ("CL-list-differing", b"HTTP/1.1 200 OK\r\nContent-Length: 5, 6\r\n\r\nhello!"),
    ("CL-and-TE", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n"),
    ("TE-and-CL", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n"),
    ("CL-negative", b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n"),
    ("CL-letters", b"HTTP/1.1 200 OK\r\nContent-Length: abc\r\n\r\n"),
    ("CL-plus", b"HTTP/1.1 200 OK\r\nContent-Length: +5\r\n\r\nhello"),
    ("TE-chunked-twice", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked, chunked\r\n\r\n"
     b"0\r\n\r\n"),
    ("TE-underscore-with-CL", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nTransfer_Encoding: "
     b"chunked\r\n\r\nhello"),
    # --- bad header bytes (RFC 9110 §5, RFC 9112 §5)
    ("obs-fold", b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\n" + OK_TAIL),
    ("obs-fold-in-CL", b"HTTP/1.1 200 OK\r\nContent-Length:\r\n 0\r\n\r\n"),
    ("NUL-in-value", b"HTTP/1.1 200 OK\r\nX: a\x00b\r\n" + OK_TAIL),
    ("control-in-value", b"HTTP/1.1 200 OK\r\nX: a\x01b\r\n" + OK_TAIL),
    ("bare-LF-ends-header", b"HTTP/1.1 200 OK\r\nX: a\n" + OK_TAIL),
    ("bare-LF-ends-head", b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\n"),
    ("bare-CR-in-value", b"HTTP/1.1 200 OK\r\nX: a\rb\r\n" + OK_TAIL),
    ("empty-header-name", b"HTTP/1.1 200 OK\r\n: x\r\n" + OK_TAIL),
    ("space-before-colon", b"HTTP/1.1 200 OK\r\nContent-Length : 0\r\n\r\n"),
    ("space-before-first-header", b"HTTP/1.1 200 OK\r\n Content-Length: 0\r\n\r\n"),
    ("separator-in-name", b"HTTP/1.1 200 OK\r\nX(y): z\r\n" + OK_TAIL),
    ("line-without-colon", b"HTTP/1.1 200 OK\r\nFoo\r\n" + OK_TAIL),
    # --- a body where there can be none (RFC 9110 §6.4.1, §15.3.5, §15.4.5)
    ("204-with-CL", b"HTTP/1.1 204 No Content\r\nContent-Length: 5\r\n\r\nhello"),
    ("204-with-TE", b"HTTP/1.1 204 No Content\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n"),
    ("204-then-bytes", b"HTTP/1.1 204 No Content\r\n\r\nhello"),
    ("304-with-TE", b"HTTP/1.1 304 Not Modified\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n"),
    ("304-with-CL-and-body", b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\n\r\nhello"),
    ("304-then-bytes", b"HTTP/1.1 304 Not Modified\r\n\r\nhello"),
    # --- an unsolicited 101 (RFC 9110 §15.2.2)
    ("unsolicited-101", b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
     b"Upgrade: websocket\r\n\r\n"),
    ("unsolicited-101-then-bytes", b"HTTP/1.1 101 Switching Protocols\r\nConnection: upgrade\r\n"
     b"Upgrade: h2c\r\n\r\n\x00\x00\x12\x04\x00\x00\x00\x00\x00"),
    # --- a 1xx with a "body": the bytes after it are no status line
    ("103-with-CL-body", b"HTTP/1.1 103 Early Hints\r\nContent-Length: 5\r\n\r\nhello"
     b"HTTP/1.1 200 OK\r\n" + OK_TAIL),
]


@pytest.mark.parametrize("payload", [pytest.param(p, id=i) for i, p in BAD])
def test_invalid_response_is_502_and_connection_destroyed(rg_factory, upstream, payload):
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    r, q = bad_exchange(rg, upstream, payload)
    check_502(r)
    check_not_reused(rg, upstream, q.conn_id)


def test_huge_response_head_is_502_not_buffered_without_bound(rg_factory, upstream):
    """An upstream head that never ends (1 MiB of header lines): retrygate bounds what it
    buffers and answers 502 bad-response, destroying the connection."""
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    head = b"HTTP/1.1 200 OK\r\n" + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"p" * 1000)
                                              for i in range(1024)) + OK_TAIL
    r, q = bad_exchange(rg, upstream, head)
    check_502(r)
    check_not_reused(rg, upstream, q.conn_id)


HEAD_BAD = [
    ("CL-then-body", b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello"),
    ("chunked-then-body", b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
     b"5\r\nhello\r\n0\r\n\r\n"),
    ("no-length-then-bytes", b"HTTP/1.1 200 OK\r\nX: y\r\n\r\nhello"),
]


@pytest.mark.parametrize("payload", [pytest.param(p, id=i) for i, p in HEAD_BAD])
def test_body_on_HEAD_response_is_502(rg_factory, upstream, payload):
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    r, q = bad_exchange(rg, upstream, payload, method="HEAD")
    assert q.method == "HEAD"
    check_502(r, head=True)
    check_not_reused(rg, upstream, q.conn_id)


def test_valid_bodiless_responses_are_relayed_and_pooled(rg_factory, upstream):
    """The controls: 204, 304 with the Content-Length of the representation, and a HEAD answer
    with Content-Length, each alone on the wire, are valid and their connection is reused."""
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(raw(b"HTTP/1.1 204 No Content\r\n\r\n", close=False),
                  raw(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 5\r\nETag: \"e\"\r\n\r\n",
                      close=False),
                  raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", close=False))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/204"))
        r = c.read_response()
        assert r.status == 204 and r.body == b""
        c.send(req("GET", "/304"))
        r = c.read_response()
        assert r.status == 304 and r.body == b""
        c.send(req("HEAD", "/head"))
        r = c.read_response("HEAD")
        assert r.status == 200 and r.body == b"" and r.headers.get("Content-Length") == "5"
        assert c.recv_some(0.2) == b""
    qs = upstream.wait_requests(3)
    assert len({q.conn_id for q in qs}) == 1, qs


def test_invalid_response_is_retried_on_a_new_connection(rg_factory, upstream):
    """With retries on (reset is in retry.on, GET is repeatable) an invalid response is retried
    on a fresh connection, never on the one that carried it."""
    rg = gate(rg_factory, upstream)
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab",
                      close=False))
    r = rg.request("GET", "/r", {"Host": "a"})
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "2"
    q1, q2 = upstream.wait_requests(2)
    assert q1.conn_id != q2.conn_id
    assert upstream.wait_conn_closed(q1.conn_id) == "peer"
    assert rg.wait_metric("retrygate_upstream_outcomes_total", 1, upstream="up", outcome="reset")


def test_invalid_response_to_POST_is_502_not_retried(rg_factory, upstream):
    """An invalid response after a POST was written: outcome reset, no key -> not retried
    (non-idempotent), 502 bad-response."""
    rg = gate(rg_factory, upstream)
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nX: a\r\n b\r\nContent-Length: 0\r\n\r\n", close=False))
    with RawConn(rg.port) as c:
        c.send(b"POST /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
        r = c.read_response()
    check_502(r)
    assert r.headers.get("X-Retrygate-Retry-Refused") == "non-idempotent"
    (q,) = upstream.wait_requests(1)
    check_not_reused(rg, upstream, q.conn_id)
    assert len(upstream.requests) == 2


# ------------------------------------------------------------------------------- truncation

def _read_all(port, payload, timeout=3.0):
    data, closed = raw_request(port, payload, read_timeout=timeout)
    return data, closed


def test_content_length_body_cut_mid_stream_is_aborted_not_padded(rg_factory, upstream):
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(partial(200, body_prefix=b"x" * 3000, content_length=10000))
    data, closed = _read_all(rg.port, req("GET", "/cut"))
    assert closed
    r = parse_response(data)
    assert r.status == 200 and r.headers.get("Content-Length") in ("10000", None)
    assert not r.complete, "a truncated body reached the client as complete: %r" % r
    assert r.body == b"x" * 3000 if r.framing == "length" else r.body.startswith(b"")
    if r.framing == "chunked":
        assert not data.endswith(b"0\r\n\r\n")
    (q,) = upstream.wait_requests(1)


def test_content_length_body_cut_to_http10_client_keeps_the_length(rg_factory, upstream):
    """An HTTP/1.0 client can only see the truncation if the Content-Length is relayed: a
    close-delimited relay would make a cut body look complete."""
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(partial(200, body_prefix=b"y" * 500, content_length=2000))
    data, closed = _read_all(rg.port, req("GET", "/cut10", version=b"HTTP/1.0"))
    assert closed
    r = parse_response(data)
    assert r.status == 200
    assert r.headers.get("Content-Length") == "2000", r.headers
    assert not r.complete and r.body == b"y" * 500


@pytest.mark.parametrize("tail", [
    pytest.param(b"5\r\nhello\r\n", id="after-a-chunk"),
    pytest.param(b"a\r\nhel", id="inside-a-chunk"),
    pytest.param(b"5\r\nhello\r\n0\r\n", id="inside-the-trailers"),
])
def test_chunked_body_cut_mid_stream_is_aborted_not_completed(rg_factory, upstream, tail):
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + tail,
                      close=True))
    data, closed = _read_all(rg.port, req("GET", "/cutc"))
    assert closed
    r = parse_response(data)
    assert r.status == 200
    assert not r.complete, "truncated chunked body relayed as complete: %r" % data
    assert not data.endswith(b"0\r\n\r\n")


@pytest.mark.parametrize("tail", [
    pytest.param(b"zz\r\nhello\r\n0\r\n\r\n", id="bad-chunk-size"),
    pytest.param(b"5\r\nhelloXX0\r\n\r\n", id="no-CRLF-after-data"),
    pytest.param(b"5\nhello\r\n0\r\n\r\n", id="bare-LF-chunk-line"),
    pytest.param(b"1;" + b"e" * 5000 + b"\r\nx\r\n0\r\n\r\n", id="chunk-line-over-4KiB"),
    pytest.param(b"0\r\nX: a\r\n b\r\n\r\n", id="obs-fold-in-trailer"),
])
def test_bad_chunked_framing_in_response_never_completes(rg_factory, upstream, tail):
    """Invalid chunk framing: either a 502 bad-response (if nothing was relayed yet) or an
    aborted stream; never a complete response. The connection is not reused."""
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + tail,
                      close=False))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/bc"))
        data, closed = c.read_until_close(timeout=5, idle=2)
    r = parse_response(data)
    if r.status == 502:
        check_502(r)
    else:
        assert r.status == 200 and closed and not r.complete, (r, data[-200:])
    (q,) = upstream.wait_requests(1)
    check_not_reused(rg, upstream, q.conn_id)


# ------------------------------------------------------------------------------- bytes after

def test_bytes_after_the_response_never_reach_the_client(rg_factory, upstream):
    """Content-Length 5, then extra bytes in the same write: the client gets exactly the
    5 bytes, and that upstream connection is never pooled."""
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhelloEXTRA-BYTES", close=False))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/x"))
        r = c.read_response()
        if r.status == 200:
            assert r.body == b"hello"
        else:
            check_502(r)
        c.send(req("GET", "/next"))
        r2 = c.read_response()
        assert r2.status == 200 and json.loads(r2.body)["target"] == "/next"
        assert b"EXTRA" not in r2.raw
    q1, q2 = upstream.wait_requests(2)
    assert q2.conn_id != q1.conn_id
    assert upstream.wait_conn_closed(q1.conn_id) == "peer"


def test_response_splitting_second_response_is_never_delivered(rg_factory, upstream):
    """An upstream that appends a whole second response in the same write (desync): the next
    client request must never be answered with it."""
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    evil = b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\nX-Evil: 1\r\n\r\nsmuggled"
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello" + evil, close=False))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/1"))
        r = c.read_response()
        assert r.status in (200, 502)
        if r.status == 200:
            assert r.body == b"hello"
        c.send(req("GET", "/2"))
        r2 = c.read_response()
        assert r2.status == 200 and b"smuggled" not in r2.body and "X-Evil" not in r2.headers
        assert json.loads(r2.body)["target"] == "/2"
    q1, q2 = upstream.wait_requests(2)
    assert q1.conn_id != q2.conn_id


def test_chunked_response_then_extra_bytes(rg_factory, upstream):
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n"
                      b"0\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nbad", close=False))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/c"))
        r = c.read_response()
        assert (r.status, r.body) == (200, b"hello") or r.status == 502
        c.send(req("GET", "/next"))
        r2 = c.read_response()
        assert r2.status == 200 and json.loads(r2.body)["target"] == "/next"
    q1, q2 = upstream.wait_requests(2)
    assert q1.conn_id != q2.conn_id


@pytest.mark.parametrize("junk", [
    pytest.param(b"x", id="one-byte"),
    pytest.param(b"HTTP/1.1 408 Request Timeout\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                 id="unsolicited-408"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: 8\r\n\r\nsmuggled", id="unsolicited-200"),
])
def test_bytes_on_an_idle_pooled_connection_close_it(rg_factory, upstream, junk):
    """The response is complete and the connection pooled; later bytes arrive on it: retrygate
    closes it, and the next request goes out on a new connection and gets its own answer."""
    rg = rg_factory(upstreams={"up": {"endpoints": [upstream], "retry": ONE_ATTEMPT}},
                    env={"RETRYGATE_LOG": "debug"})
    sent = []

    def answer_then_junk(conn, rq):
        conn.send(build_head(200, [("Content-Length", "2")]) + b"ok")
        t = time.monotonic()
        idle = conn.wait(0.3)
        sent.append((idle, round(time.monotonic() - t, 3), conn.send(junk) if idle else None))
        return True     # keep serving on this connection if retrygate sends another request
    upstream.push(callback(answer_then_junk))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/1"))
        r = c.read_response()
        assert (r.status, r.body) == (200, b"ok")
        q1 = upstream.wait_requests(1)[0]
        assert upstream.wait_conn_closed(q1.conn_id, timeout=5) == "peer"
        assert len(sent) == 1 and sent[0][0] and sent[0][2], (sent, rg.stderr_text()[-3000:])
        c.send(req("GET", "/2"))
        r2 = c.read_response()
        assert r2.status == 200 and json.loads(r2.body)["target"] == "/2", r2
        assert b"smuggled" not in r2.raw
    q1, q2 = upstream.wait_requests(2)
    assert q2.conn_id != q1.conn_id


# ------------------------------------------------------------------------------- 1xx

def test_103_relayed_to_http11_client(rg_factory, upstream):
    rg = gate(rg_factory, upstream)
    upstream.push(interim(103, {"Link": "</s.css>; rel=preload"}, body=b"final"))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/eh"))
        r = c.read_response()
    assert r.status == 200 and r.body == b"final"
    assert [i.status for i in r.interim] == [103]
    assert r.interim[0].headers.get("Link") == "</s.css>; rel=preload"


def test_several_103_relayed_none_final(rg_factory, upstream):
    rg = gate(rg_factory, upstream)
    upstream.push(respond(201, body=b"done", interim=[(103, {"Link": "</a>"}),
                                                       (103, {"Link": "</b>"})]))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/eh2"))
        r = c.read_response()
    assert r.status == 201 and r.body == b"done"
    assert [i.headers.get("Link") for i in r.interim] == ["</a>", "</b>"]


def test_103_dropped_for_http10_client(rg_factory, upstream):
    rg = gate(rg_factory, upstream)
    upstream.push(interim(103, {"Link": "</s.css>; rel=preload"}, body=b"final"))
    data, _ = raw_request(rg.port, req("GET", "/eh10", version=b"HTTP/1.0"), read_timeout=2)
    r = parse_response(data)
    assert r.status == 200 and r.body == b"final"
    assert r.interim == [] and b" 103 " not in data


def test_102_is_never_final(rg_factory, upstream):
    rg = gate(rg_factory, upstream)
    upstream.push(respond(200, body=b"after-102", interim=[102]))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/p"))
        r = c.read_response()
    assert r.status == 200 and r.body == b"after-102"


def test_103_then_close_is_not_a_final_response(rg_factory, upstream):
    """A 1xx is never final: an upstream that sends 103 and closes produced no response, so
    the client's final answer is retrygate's 502 (the 103 may precede it)."""
    rg = gate(rg_factory, upstream, **ONE_ATTEMPT)
    upstream.push(raw(b"HTTP/1.1 103 Early Hints\r\nLink: </x>\r\n\r\n", close=True))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/eh"))
        r = c.read_response()
    check_502(r, reasons=("reset", "bad-response"))


def test_103_then_503_is_retried_and_the_final_answer_is_the_retry(rg_factory, upstream):
    rg = gate(rg_factory, upstream)
    upstream.push(respond(503, interim=[(103, {"Link": "</x>"})]), respond(200, body=b"second"))
    with RawConn(rg.port) as c:
        c.send(req("GET", "/eh"))
        r = c.read_response()
    assert r.status == 200 and r.body == b"second" and r.headers["X-Retrygate-Attempts"] == "2"
    assert all(i.status == 103 for i in r.interim)


def test_103_does_not_stop_the_per_try_timeout(rg_factory, upstream):
    """The per-try timeout is time to the response head; a 1xx is no response head."""
    rg = rg_factory(upstreams={"up": {"endpoints": [upstream],
                                      "retry": {"max_attempts": 1, "per_try_timeout": "300ms"}}})

    def hints_then_nothing(conn, rq):
        conn.send(build_head(103, [("Link", "</x>")]))
        conn.wait(3)
        return False
    upstream.push(callback(hints_then_nothing))
    t0 = time.monotonic()
    with RawConn(rg.port) as c:
        c.send(req("GET", "/slow"))
        r = c.read_response(timeout=5)
    assert time.monotonic() - t0 < 2.0
    assert r.status == 504 and r.headers["X-Retrygate-Reason"] == "timeout"


def test_100_without_expect_is_not_relayed(rg_factory, upstream):
    rg = gate(rg_factory, upstream)
    upstream.push(respond_100_then(200, body=b"ok"))
    with RawConn(rg.port) as c:
        c.send(b"POST /nx HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\n\r\nabc")
        r = c.read_response()
    assert r.status == 200 and r.body == b"ok"
    assert r.interim == []


def test_100_not_relayed_when_retrygate_answered_expect_itself(rg_factory, upstream):
    """A small body is buffered: retrygate says 100 Continue itself; an upstream 100 on top of
    it is not relayed (exactly one 100 reaches the client)."""
    rg = gate(rg_factory, upstream)
    upstream.push(respond_100_then(200, body=b"ok"))
    with RawConn(rg.port) as c:
        c.send(b"POST /e HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
        i = c.read_interim(timeout=3)
        assert i.status == 100
        c.send(b"abc")
        r = c.read_response()
        assert r.status == 200 and r.body == b"ok"
        assert r.interim == []
        assert c.recv_some(0.2) == b""


def test_100_relayed_when_the_upstream_answers_expect(rg_factory, upstream):
    """A body over retry.max_body is streamed: Expect goes upstream, and the upstream's 100 is
    the one the client gets (the upstream delays it and marks it: retrygate did not invent
    it)."""
    rg = rg_factory(upstreams={"up": {"endpoints": [upstream],
                                      "retry": {"max_body": "1KiB"}}})
    body = b"z" * 4096
    got = []

    def continue_later(conn, rq):
        if not conn.wait(0.4):
            return False
        conn.send(b"HTTP/1.1 100 Continue\r\nX-From: up\r\n\r\n")
        while len(conn.buf) < len(body):
            if not conn.fill(5):
                return False
        got.append(bytes(conn.buf[:len(body)]))
        del conn.buf[:len(body)]
        conn.send(build_head(200, [("Content-Length", "3"), ("Connection", "close")]) + b"got")
        return False
    upstream.push(callback(continue_later, read_body=False, expect_continue=False))
    with RawConn(rg.port) as c:
        c.send(b"PUT /big HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n"
               % len(body))
        t0 = time.monotonic()
        i = c.read_interim(timeout=5)
        assert i.status == 100
        assert time.monotonic() - t0 > 0.3, "a 100 came before the upstream's"
        c.send(body)
        r = c.read_response()
        assert r.status == 200 and r.body == b"got"
        assert r.interim == []
    (q,) = upstream.wait_requests(1)
    assert q.expects_continue and got == [body]


def test_100_and_103_dropped_for_http10_client(rg_factory, upstream):
    rg = gate(rg_factory, upstream)
    upstream.push(respond(200, body=b"ten", interim=[100, (103, {"Link": "</x>"})]))
    data, _ = raw_request(rg.port, b"POST /t HTTP/1.0\r\nHost: a\r\nExpect: 100-continue\r\n"
                          b"Content-Length: 3\r\n\r\nabc", read_timeout=2)
    r = parse_response(data)
    assert r.status == 200 and r.body == b"ten" and r.interim == []
    assert data.startswith(b"HTTP/1.") and b" 100 " not in data and b" 103 " not in data


# ------------------------------------------------------------------------------- HEAD framing

def test_own_error_response_to_HEAD_has_no_body_keepalive_stays_in_sync(rg_factory, upstream,
                                                                        refusing):
    """RFC 9110 §9.3.2: no content in a response to HEAD, retrygate's own answers included.
    A body there desyncs the keep-alive client: it would read the JSON as the next response."""
    rg = rg_factory(upstreams={"up": {"endpoints": [upstream]},
                               "down": {"endpoints": [refusing],
                                        "retry": {"max_attempts": 1}}},
                    routes=[{"host": "down", "upstream": "down"},
                            {"host": "a", "upstream": "up"}])
    with RawConn(rg.port) as c:
        # 404 no-route, 502 connect-failure: both keep the connection alive
        c.send(b"HEAD /x HTTP/1.1\r\nHost: nowhere\r\n\r\n"
               b"HEAD /y HTTP/1.1\r\nHost: down\r\n\r\n"
               b"GET /z HTTP/1.1\r\nHost: a\r\n\r\n")
        r1 = c.read_response("HEAD")
        assert r1.status == 404 and r1.headers["X-Retrygate-Reason"] == "no-route"
        assert r1.body == b""
        r2 = c.read_response("HEAD")
        assert r2.status == 502 and r2.headers["X-Retrygate-Reason"] == "connect-failure", r2
        r3 = c.read_response()
        assert r3.status == 200 and json.loads(r3.body)["target"] == "/z", r3
        assert c.recv_some(0.2) == b""
