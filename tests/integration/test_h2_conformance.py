"""HTTP/2 stream-state conformance (RFC 9113 §5.1, §5.1.1, §6.1, §6.3) on the client side: what
retrygate answers to frames on streams that are closed, never opened, or stream 0 where a stream
is required. nghttp2 leaves these checks to the application (it ignores what it cannot tell
apart); retrygate's frame guard makes them.

Where the RFC leaves room, the choices are:
- a HEADERS frame on a stream id below the highest one the client opened, that the client never
  opened (§5.1.1, "unexpected stream identifier"): connection error PROTOCOL_ERROR;
- DATA on a stream closed at both ends (§6.1: "MUST respond with a stream error of type
  STREAM_CLOSED"): RST_STREAM STREAM_CLOSED, the connection carries on;
- HEADERS on a stream closed at both ends (§5.1: "MAY treat ... as a connection error of type
  STREAM_CLOSED"): GOAWAY STREAM_CLOSED, as a client sending a second head on a finished stream
  has lost track of the connection;
- any frame on a stream retrygate reset itself is ignored (§5.1: "MUST ignore frames that it
  receives on closed streams after it has sent a RST_STREAM frame"), since the client may have
  sent it before the reset arrived.
"""

import pytest
from hyperframe.frame import PriorityFrame

from h2raw import PROTOCOL_ERROR, H2Raw

STREAM_CLOSED = 5


def base(path="/", method="GET"):
    return [(":method", method), (":scheme", "http"), (":authority", "example"), (":path", path)]


@pytest.fixture
def rg2(upstream, rg_factory):
    return rg_factory(upstreams={"api": {"endpoints": [upstream]}})


def test_headers_on_a_lower_unused_stream_id_is_a_connection_error(rg2):
    c = H2Raw(rg2.port)
    assert c.response(c.request(base("/five"), sid=5)).status == 200
    c.request(base("/three"), sid=3)
    g = c.goaway(timeout=5)
    assert g is not None and g[0] == PROTOCOL_ERROR, g
    assert c.streams[3].status is None
    assert c.wait_closed(5)


def test_priority_on_stream_zero_is_a_connection_error(rg2):
    c = H2Raw(rg2.port)
    assert c.response(c.get("/first")).status == 200
    # hyperframe refuses to build it: the 9-byte header and the 5-byte payload by hand
    c.send(bytes([0, 0, 5, 2, 0, 0, 0, 0, 0]) + bytes([0, 0, 0, 1, 15]))
    g = c.goaway(timeout=5)
    assert g is not None and g[0] == PROTOCOL_ERROR, g
    assert c.wait_closed(5)


def test_priority_on_a_stream_is_still_accepted(rg2):
    c = H2Raw(rg2.port)
    sid = c.new_id()
    c.frame(PriorityFrame(sid, depends_on=0, stream_weight=16))
    assert c.response(c.request(base("/p"), sid=sid)).status == 200
    assert c.goaway(timeout=0.3) is None


def test_data_on_a_closed_stream_is_reset_stream_closed(upstream, rg2):
    c = H2Raw(rg2.port)
    sid = c.get("/done")
    r = c.response(sid)
    assert r.status == 200 and r.ended and r.reset is None
    c.data(sid, b"late", end=True)
    assert c.pump(lambda: c.streams[sid].reset is not None, 5), c.frames[-5:]
    assert c.streams[sid].reset == STREAM_CLOSED
    # a stream error: the connection carries on, and nothing more reached the upstream
    assert c.response(c.get("/after")).status == 200
    assert c.goaway(timeout=0.3) is None
    assert [q.path for q in upstream.requests] == ["/done", "/after"]


def test_headers_on_a_closed_stream_is_a_connection_error(rg2):
    c = H2Raw(rg2.port)
    sid = c.get("/done")
    assert c.response(sid).status == 200
    c.headers(sid, [("x-late", "1")], end=True)
    g = c.goaway(timeout=5)
    assert g is not None and g[0] == STREAM_CLOSED, g
    assert c.wait_closed(5)


def test_frames_on_a_stream_retrygate_reset_are_ignored(upstream, rg2):
    c = H2Raw(rg2.port)
    # a malformed request: retrygate resets the stream with PROTOCOL_ERROR
    sid = c.request(base("/bad") + [("connection", "close")], body=b"x" * 10, end=False)
    assert c.response(sid).reset == PROTOCOL_ERROR
    c.data(sid, b"more", end=False)
    c.headers(sid, [("x-trailer", "1")], end=True)
    assert c.response(c.get("/after")).status == 200
    assert c.goaway(timeout=0.3) is None
    assert [q.path for q in upstream.requests] == ["/after"]


def test_a_client_acknowledging_every_data_frame_is_not_a_flood(upstream, rg2):
    """A conforming client may answer each DATA frame with a stream and a connection
    WINDOW_UPDATE. With a 1 KiB stream window every response comes in 1 KiB frames: 12
    responses of 512 KiB make some 12,000 updates in a few seconds, more than the absolute
    limit of 10,000 control frames in 10 s, and the connection must carry on."""
    from upstream import respond
    upstream.set_default(respond(body=b"z" * (512 << 10)))
    # SETTINGS_INITIAL_WINDOW_SIZE; nodelay: each update leaves at once (no Nagle wait)
    c = H2Raw(rg2.port, settings={4: 1024}, nodelay=True)
    for i in range(12):
        r = c.response(c.get("/big%d" % i), timeout=60)
        assert r.status == 200 and r.ended and len(r.body) == 512 << 10, (i, r)
    data_frames = sum(1 for f in c.frames if type(f).__name__ == "DataFrame")
    assert data_frames >= 6000          # each answered by one or two WINDOW_UPDATEs
    assert c.goaway(timeout=0.3) is None
    assert rg2.metric("retrygate_downstream_h2_protocol_errors_total", error="flood") == 0
