"""Malformed responses from an HTTP/2 upstream (RFC 9113 §8.1-8.3), checked by retrygate's
upstream session itself (nghttp2's HTTP messaging checks are off there, as on the client side).

A response whose head breaks a rule is refused as nghttp2 refused it: the upstream stream is
reset with PROTOCOL_ERROR and the attempt ends as a `reset` (502 `reset` once no retry is
left), a name with bytes outside a token or a value with control bytes or surrounding
whitespace too. One that breaks a rule after its head was relayed (DATA against
content-length, trailers) truncates the client's response, as a reset after the head does.
A :status below 100 is the `bad-response` it was.
The upstream (tests/tools/h2upstream.py, raw()) writes these frames past h2's own checks.
"""
import pytest

from harness import FAST_RETRY, parse_response, wait_for
from h2upstream import raw

PROTOCOL_ERROR = 1


def api(up, **retry):
    r = dict(FAST_RETRY)
    r.update(retry)
    return {"api": {"endpoints": [up.endpoint], "protocol": "h2", "retry": r}}


def head(*fields, end=True):
    return ("headers", list(fields), end)


def data(b, end=True):
    return ("data", b, end)


OK = (":status", "200")

REFUSED = {
    "no :status": [head(("content-type", "text/plain"))],
    ":status of two digits": [head((":status", "20"))],
    ":status not digits": [head((":status", "2x0"))],
    ":status 101": [head((":status", "101"))],
    ":status below 100": [head((":status", "099"))],
    "repeated :status": [head(OK, OK)],
    "request pseudo-header": [head(OK, (":path", "/"))],
    "unknown pseudo-header": [head(OK, (":foo", "x"))],
    "pseudo-header after a regular field": [head(("x-a", "1"), OK)],
    "uppercase name": [head(OK, ("X-A", "1"))],
    "connection field": [head(OK, ("connection", "close"))],
    "keep-alive field": [head(OK, ("keep-alive", "5"))],
    "proxy-connection field": [head(OK, ("proxy-connection", "close"))],
    "transfer-encoding": [head(OK, ("transfer-encoding", "chunked"))],
    "upgrade field": [head(OK, ("upgrade", "h2c"))],
    "te other than trailers": [head(OK, ("te", "gzip"))],
    "content-length not digits": [head(OK, ("content-length", "1x"))],
    "repeated content-length": [head(OK, ("content-length", "0"), ("content-length", "0"))],
    "END_STREAM on an informational head": [head((":status", "100"))],
    "content-length in an informational head": [
        head((":status", "103"), ("content-length", "0"), end=False), head(OK)],
    "DATA after an informational head": [head((":status", "100"), end=False), data(b"x")],
    "204 with a content-length other than 0": [head((":status", "204"),
                                                    ("content-length", "5"))],
    "END_STREAM on a head with content-length": [head(OK, ("content-length", "3"))],
    "CR in a value": [head(OK, ("x-a", "a\rb"))],
    "NUL in a value": [head(OK, ("x-a", "a\x00b"))],
    "leading space": [head(OK, ("x-a", " a"))],
    "trailing tab": [head(OK, ("x-a", "a\t"))],
    "space in a name": [head(OK, ("x a", "1"))],
    "empty name": [head(OK, ("", "1"))],
}
REASON = {":status below 100": "bad-response"}

TRUNCATED = {
    "DATA longer than content-length": [head(OK, ("content-length", "2"), end=False),
                                        data(b"abc")],
    "DATA shorter than content-length": [head(OK, ("content-length", "5"), end=False),
                                         data(b"ab")],
    "trailers without END_STREAM": [head(OK, end=False), data(b"ab", end=False),
                                    head(("x-t", "1"), end=False)],
    "pseudo-header in trailers": [head(OK, end=False), data(b"ab", end=False),
                                  head((":status", "200"))],
    "connection field in trailers": [head(OK, end=False), data(b"ab", end=False),
                                     head(("connection", "close"))],
    "DATA in a 204": [head((":status", "204"), end=False), data(b"x")],
}

@pytest.mark.parametrize("case", sorted(REFUSED))
def test_malformed_head_resets_the_stream(h2up, rg_factory, case):
    up = h2up()
    up.push(raw(*REFUSED[case]))
    rg = rg_factory(upstreams=api(up, max_attempts=1))
    r = rg.request("GET", "/m")
    reason = REASON.get(case, "reset")
    assert r.status == 502 and r.headers["X-Retrygate-Reason"] == reason, (case, r)
    q = up.requests[0]
    if reason == "reset":
        wait_for(lambda: (q.conn_id, q.stream_id, PROTOCOL_ERROR) in up.resets, 5,
                 what="RST_STREAM PROTOCOL_ERROR")
    # the connection carries on
    up.set_default(raw(head(OK, ("content-length", "2"), end=False), data(b"ok")))
    r = rg.request("GET", "/after")
    assert r.status == 200 and r.body == b"ok", r
    assert up.requests[-1].conn_id == q.conn_id


@pytest.mark.parametrize("case", sorted(TRUNCATED))
def test_malformed_after_the_head_truncates_the_response(h2up, rg_factory, case):
    up = h2up()
    up.push(raw(*TRUNCATED[case]))
    rg = rg_factory(upstreams=api(up, max_attempts=1))
    got, closed = rg.raw(b"GET /t HTTP/1.1\r\nHost: x\r\n\r\n", read_timeout=5)
    resp = parse_response(got)
    # a 204 has no body to cut: its head is all the HTTP/1.1 client gets
    assert resp.status == 204 or (resp.status == 200 and not resp.complete and closed), (
        case, got[:300])
    q = up.requests[0]
    wait_for(lambda: (q.conn_id, q.stream_id, PROTOCOL_ERROR) in up.resets, 5,
             what="RST_STREAM PROTOCOL_ERROR")


def test_informational_heads_then_the_final_one(h2up, rg_factory):
    up = h2up()
    up.push(raw(head((":status", "103"), ("link", "</a>"), end=False),
                head((":status", "100"), end=False),
                head(OK, ("content-length", "2"), end=False), data(b"ok")))
    rg = rg_factory(upstreams=api(up, max_attempts=1))
    got, _ = rg.raw(b"GET /i HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                    read_timeout=5)
    assert b"HTTP/1.1 200" in got and got.endswith(b"\r\n\r\nok"), got[:400]


def test_204_with_content_length_0_stands(h2up, rg_factory):
    up = h2up()
    up.push(raw(head((":status", "204"), ("content-length", "0"))))
    rg = rg_factory(upstreams=api(up, max_attempts=1))
    r = rg.request("GET", "/n")
    assert r.status == 204, r


def test_head_response_with_content_length_and_no_data_stands(h2up, rg_factory):
    up = h2up()
    up.push(raw(head(OK, ("content-length", "10"))))
    rg = rg_factory(upstreams=api(up, max_attempts=1))
    r = rg.request("HEAD", "/h")
    assert r.status == 200 and r.headers.get("Content-Length") == "10", r
