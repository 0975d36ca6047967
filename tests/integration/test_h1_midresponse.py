"""HTTP/1: once a response has started on the wire, retrygate's own refusal can no longer be
sent (its bytes would land inside the first response's body, a truncated response that looks
complete to the client). The only honest end is to close the connection."""

import time

import pytest

from harness import RawConn, build_head, callback

pytestmark = pytest.mark.timeout(60)

KIB = 1024
PROMISED = 100
SENT = b"U" * 10


def _answer_early(conn, req):
    """The head and part of the body, before the request body is read; then wait for the
    proxy to give up on this connection."""
    conn.send(build_head(200, [("Content-Length", str(PROMISED))]) + SENT)
    conn.wait(10)
    return False


def _head_and_some_body(c, timeout=5.0):
    deadline = time.monotonic() + timeout
    while True:
        end = bytes(c.buf).find(b"\r\n\r\n")
        if end >= 0 and len(c.buf) >= end + 4 + len(SENT):
            return bytes(c.buf)
        left = deadline - time.monotonic()
        assert left > 0 and not c.closed, "no response head relayed: %r" % bytes(c.buf)
        c._recv(left)


@pytest.mark.parametrize("bad", [
    b"zz\r\nxx\r\n",                            # not a chunk size
    b"1;" + b"x" * (5 * KIB) + b"\r\nx\r\n",    # a chunk extension over the limit
    b"5\r\nabcdefgh\r\n",                       # chunk data longer than its size
], ids=["size", "extension", "overrun"])
def test_bad_chunk_after_response_head_closes_without_a_second_response(rg_factory, upstream,
                                                                         bad):
    rg = rg_factory(upstreams={"up": {"endpoints": [upstream], "retry": {"max_body": "1KiB"}}})
    upstream.set_default(callback(_answer_early, read_body=False, expect_continue=False))
    good = b"".join(b"400\r\n" + b"d" * 1024 + b"\r\n" for _ in range(2))   # > max_body
    with RawConn(rg.port) as c:
        c.send(b"POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n" + good)
        _head_and_some_body(c)          # the 200's head and 10 of its 100 bytes are relayed
        try:
            c.send(bad)
        except OSError:
            pass
        rest, closed = c.read_until_close(timeout=10)
    data = rest                         # (the buffer still held the head)
    assert closed, "the connection stayed open after a malformed body: %r" % data[:300]
    assert data.startswith(b"HTTP/1.1 200"), data[:300]
    assert b"HTTP/1.1 400" not in data, data[:500]
    body = data[data.find(b"\r\n\r\n") + 4:]
    assert body.startswith(SENT) and len(body) < PROMISED, body[:200]
