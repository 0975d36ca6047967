"""HTTP/2 hostile input (SPEC §9): every malformed request is reset with PROTOCOL_ERROR and
nothing reaches the upstream; the per-stream limits answer 414/431/413/501; the connection
defences (refused streams, rapid reset, header blocks, floods, zero-window readers, idle
connections) end or limit the connection, each logged once per connection and kind and counted
in retrygate_downstream_h2_protocol_errors_total{error}."""

import socket
import threading
import time

import pytest
from hpack import NeverIndexedHeaderTuple
from hyperframe.frame import (ContinuationFrame, DataFrame, HeadersFrame, PingFrame,
                              PriorityFrame, SettingsFrame, WindowUpdateFrame)

from harness import make_config
from h2raw import ENHANCE_YOUR_CALM, NO_ERROR, PROTOCOL_ERROR, REFUSED_STREAM, H2Raw
from upstream import respond, stall

FAST = {"backoff": {"base": "1ms", "max": "2ms"}}
METRIC = "retrygate_downstream_h2_protocol_errors_total"


def base(path="/", method="GET", authority="example"):
    return [(":method", method), (":scheme", "http"), (":authority", authority), (":path", path)]


@pytest.fixture
def rg2(upstream, rg_factory):
    return rg_factory(upstreams={"api": {"endpoints": [upstream], "retry": FAST}})


MALFORMED = {
    "uppercase name": base() + [("X-Upper", "1")],
    "connection field": base() + [("connection", "keep-alive")],
    "keep-alive field": base() + [("keep-alive", "5")],
    "transfer-encoding": base() + [("transfer-encoding", "chunked")],
    "upgrade field": base() + [("upgrade", "websocket")],
    "te not trailers": base() + [("te", "gzip")],
    "missing :path": [(":method", "GET"), (":scheme", "http"), (":authority", "example")],
    "missing :method": [(":scheme", "http"), (":authority", "example"), (":path", "/")],
    "repeated :method": base() + [(":method", "GET")],
    "unknown pseudo": base() + [(":foo", "bar")],
    "pseudo after regular": [(":method", "GET"), ("x-a", "1"), (":scheme", "http"),
                             (":path", "/")],
    "response pseudo": base() + [(":status", "200")],
    "empty :path": base(path=""),
    "path without slash": base(path="x/y"),
    "asterisk for GET": base(path="*"),
    "NUL in value": base() + [("x-a", "a\x00b")],
    "CR in value": base() + [("x-a", "a\rb")],
    "LF in value": base() + [("x-a", "a\nb")],
    "leading space": base() + [("x-a", " a")],
    "trailing tab": base() + [("x-a", "a\t")],
    "authority and host differ": base(authority="a.example") + [("host", "b.example")],
    "repeated host": base() + [("host", "example"), ("host", "example")],
    ":protocol": base(method="CONNECT") + [(":protocol", "websocket")],
    "invalid name byte": base() + [("x a", "1")],
    # RFC 9113 §8.2-8.3 read rule by rule against what nghttp2 checked before the checks
    # became retrygate's own (h2_request.c): every row was reset on either
    "empty name": base() + [("", "1")],
    "colon in name": base() + [("x:a", "1")],
    "lone colon name": base() + [(":", "1")],
    "uppercase pseudo name": base() + [(":Path", "/")],
    "proxy-connection field": base() + [("proxy-connection", "close")],
    "te with more than trailers": base() + [("te", "trailers, gzip")],
    "missing :scheme": [(":method", "GET"), (":authority", "example"), (":path", "/")],
    "no :authority nor host": [(":method", "GET"), (":scheme", "http"), (":path", "/")],
    "repeated :path": base() + [(":path", "/x")],
    "repeated :scheme": base() + [(":scheme", "http")],
    "repeated :authority": base() + [(":authority", "example")],
    "empty :authority": base(authority=""),
    "empty :method": base(method=""),
    "empty host": [(":method", "GET"), (":scheme", "http"), (":path", "/"), ("host", "")],
    "space in :method": base(method="G T"),
    "space in :path": base(path="/a b"),
    "DEL in :path": base(path="/a\x7f"),
    "bad :scheme": [(":method", "GET"), (":scheme", "1http"), (":authority", "example"),
                    (":path", "/")],
    "space in :authority": base(authority="exa mple"),
    "slash in host": base() + [("host", "a/b")],
    "CONNECT with :path": [(":method", "CONNECT"), (":authority", "example:443"),
                           (":path", "/")],
    "CONNECT with :scheme": [(":method", "CONNECT"), (":authority", "example:443"),
                             (":scheme", "http")],
    "CONNECT without :authority": [(":method", "CONNECT")],
    "control byte in value": base() + [("x-a", "a\x01b")],
    "DEL in value": base() + [("x-a", "a\x7fb")],
    "leading tab": base() + [("x-a", "\ta")],
    "trailing space": base() + [("x-a", "a ")],
    "content-length not digits": base() + [("content-length", "1x")],
    "negative content-length": base() + [("content-length", "-1")],
    "repeated content-length": base() + [("content-length", "0"), ("content-length", "0")],
    "END_STREAM on a head with content-length": base(method="POST") + [("content-length", "3")],
}

# What the checks must let through (each was forwarded before they were ours).
ACCEPTED = {
    "sub-delims in :authority": base(authority="a*b!c.example:80"),
    "host without :authority": [(":method", "GET"), (":scheme", "http"), (":path", "/"),
                                ("host", "example")],
    "host equal to :authority but for case": base(authority="Example") + [("host", "example")],
    "te trailers in capitals": base() + [("te", "Trailers")],
    "inner whitespace and high bytes in a value": base() + [("x-a", "a b\tc caf\u00e9")],
    "priority field": base() + [("priority", "u=0, i")],
    "unreadable priority field": base() + [("priority", "u=9;x, ??")],
    "content-length 0 on a head that ends the stream": base() + [("content-length", "0")],
}

# A head that passes, then trailers or DATA that break it: the stream is reset.
def _trailers(fields, end=True, body=b"abc", cl=None):
    def send(c):
        head = base(method="POST") + ([("content-length", cl)] if cl else [])
        sid = c.request(head, end=False)
        c.data(sid, body, end=False)
        c.headers(sid, fields, end=end)
        return sid
    return send


MALFORMED_LATER = {
    "trailers without END_STREAM": _trailers([("x-t", "1")], end=False),
    "pseudo-header in trailers": _trailers([(":path", "/")]),
    "connection field in trailers": _trailers([("connection", "close")]),
    "uppercase name in trailers": _trailers([("X-T", "1")]),
    "CR in a trailer value": _trailers([("x-t", "a\rb")]),
    "content-length in trailers, not what came": _trailers([("content-length", "5")]),
    "content-length in trailers after the head's": _trailers([("content-length", "3")],
                                                             cl="3"),
    "trailers short of content-length": _trailers([("x-t", "1")], cl="5"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_is_reset(upstream, rg2, case):
    c = H2Raw(rg2.port)
    r = c.response(c.request(MALFORMED[case]))
    assert r.status is None and r.reset == PROTOCOL_ERROR, (case, r)
    # the connection carries on, and nothing was forwarded
    ok = c.response(c.get("/after"))
    assert ok.status == 200
    assert [q.path for q in upstream.wait_requests(1)] == ["/after"]
    time.sleep(0.05)
    assert len(upstream.requests) == 1
    assert rg2.wait_metric(METRIC, 1, error="malformed")


@pytest.mark.parametrize("case", sorted(MALFORMED_LATER))
def test_malformed_after_the_head_is_reset(upstream, rg2, case):
    upstream.set_default(stall())
    c = H2Raw(rg2.port)
    r = c.response(MALFORMED_LATER[case](c))
    assert r.status is None and r.reset == PROTOCOL_ERROR, (case, r)
    ok = c.response(c.get("/after"))       # the connection carries on
    assert ok.reset is None and not c.closed


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_well_formed_request_is_forwarded(upstream, rg2, case):
    c = H2Raw(rg2.port)
    r = c.response(c.request(ACCEPTED[case]))
    assert r.reset is None and r.status == 200, (case, r)
    assert len(upstream.wait_requests(1)) == 1


def test_content_length_in_trailers_that_says_what_came_is_accepted(upstream, rg2):
    c = H2Raw(rg2.port)
    r = c.response(_trailers([("content-length", "3")])(c))
    assert r.reset is None and r.status == 200, r
    assert upstream.wait_requests(1)[0].body == b"abc"


@pytest.mark.parametrize("sent,declared", [(b"abcdef", 3), (b"ab", 5)])
def test_data_length_differs_from_content_length(upstream, rg2, sent, declared):
    upstream.set_default(stall())
    c = H2Raw(rg2.port)
    sid = c.request(base(method="PUT") + [("content-length", str(declared))], body=sent)
    r = c.response(sid)
    assert r.reset == PROTOCOL_ERROR and r.status is None


def test_connect_is_501(upstream, rg2):
    c = H2Raw(rg2.port)
    r = c.response(c.request([(":method", "CONNECT"), (":authority", "example:443")]))
    assert r.status == 501 and r.header("x-retrygate-reason") == "not-implemented"
    time.sleep(0.05)
    assert upstream.requests == []


def test_unknown_method_is_501(upstream, rg2):
    c = H2Raw(rg2.port)
    r = c.response(c.request(base(method="BREW")))
    assert r.status == 501


def test_header_list_size_431_and_uri_414(upstream, rg_factory):
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"max_header_bytes": "4KiB",
                                                        "max_uri_bytes": "1KiB"}))
    c = H2Raw(rg.port)
    # SETTINGS_MAX_HEADER_LIST_SIZE (6) advertised as max_header_bytes
    c.pump(lambda: any(isinstance(f, SettingsFrame) and 6 in f.settings for f in c.frames), 3)
    s = [f for f in c.frames if isinstance(f, SettingsFrame) and 6 in f.settings][0]
    assert s.settings[6] == 4096
    # many small fields: the decoded size (name + value + 32 each) is what counts
    r = c.response(c.request(base() + [("x-f%d" % i, "v" * 20) for i in range(90)]))
    assert r.status == 431 and r.header("x-retrygate-reason") == "headers-too-large"
    r = c.response(c.request(base(path="/" + "p" * 2000)))
    assert r.status == 414 and r.header("x-retrygate-reason") == "uri-too-long"
    # 414 is checked before the head size
    r = c.response(c.request(base(path="/" + "p" * 2000) + [("x-big", "v" * 3000)]))
    assert r.status == 414
    r = c.response(c.get("/fine"))
    assert r.status == 200
    time.sleep(0.05)
    assert [q.path for q in upstream.requests] == ["/fine"]


def send_block(c, sid, fields, frame_max=16384):
    """One request whose every field is a never-indexed literal (RFC 7541 §6.2.3): HPACK's
    table keeps no copy of a value, so the request's own buffers are the only ones. The block
    goes out as HEADERS (END_STREAM) and as many CONTINUATION frames as it needs."""
    block = c.enc.encode([NeverIndexedHeaderTuple(k.encode(), v.encode()) for k, v in fields],
                         huffman=False)
    chunks = [block[i:i + frame_max] for i in range(0, len(block), frame_max)]
    for i, chunk in enumerate(chunks):
        f = HeadersFrame(sid, flags=["END_STREAM"]) if i == 0 else ContinuationFrame(sid)
        f.data = chunk
        if i == len(chunks) - 1:
            f.flags.add("END_HEADERS")
        c.frame(f)


@pytest.mark.parametrize("host", ["same", "different"])
def test_431_after_authority_and_host(upstream, rg_factory, host):
    """:authority and host (2 KB each) come before the head passes max_header_bytes (~40 KB
    of other fields): what the stream held of the head is let go then, so the two must have
    been compared while it was still held. The same: 431; different: malformed, reset. Either
    way the connection carries on and nothing is forwarded."""
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"max_header_bytes": "32KiB"}))
    c = H2Raw(rg.port)
    c.settle()
    name = "h" * 2000 + ".example"
    fields = base(authority=name) + [("host", name if host == "same" else "x" + name[1:])]
    fields += [("x-f%d" % i, "v" * 1000) for i in range(40)]
    sid = c.new_id()
    send_block(c, sid, fields)
    r = c.response(sid)
    if host == "same":
        assert r.status == 431 and r.header("x-retrygate-reason") == "headers-too-large", r
    else:
        assert r.status is None and r.reset == PROTOCOL_ERROR, r
    ok = c.response(c.get("/after"))
    assert ok.status == 200, ok
    time.sleep(0.05)
    assert [q.path for q in upstream.requests] == ["/after"]


def test_streams_beyond_limit_refused(upstream, rg_factory):
    upstream.set_default(stall())
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"max_concurrent_streams": 2}))
    c = H2Raw(rg.port)
    c.pump(lambda: any(isinstance(f, SettingsFrame) and 3 in f.settings for f in c.frames), 3)
    s = [f for f in c.frames if isinstance(f, SettingsFrame) and 3 in f.settings][0]
    assert s.settings[3] == 2
    ids = [c.get("/s%d" % i) for i in range(3)]
    r = c.response(ids[2], timeout=3)
    assert r.reset == REFUSED_STREAM
    assert c.streams[ids[0]].reset is None and c.streams[ids[1]].reset is None
    assert rg.wait_metric(METRIC, 1, error="refused-stream")


def test_rapid_reset_goaway(upstream, rg_factory):
    upstream.set_default(stall())
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream]}})
    c = H2Raw(rg.port)
    try:
        for i in range(150):
            sid = c.get("/rr%d" % i)
            c.rst(sid)
    except OSError:
        pass    # the GOAWAY and close may come before the last of them is written
    g = c.goaway(timeout=5)
    assert g is not None and g[0] == ENHANCE_YOUR_CALM
    assert c.wait_closed(5)
    assert rg.wait_metric(METRIC, 1, error="rapid-reset")
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    assert rg.metric("retrygate_upstream_in_flight", upstream="api") == 0
    assert rg.stderr_text().count("http2 rapid-reset") == 1


def test_normal_cancels_are_not_rapid_reset(upstream, rg_factory):
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream]}})
    c = H2Raw(rg.port)
    for i in range(120):
        r = c.response(c.get("/n%d" % i))
        assert r.status == 200
    assert c.goaway(timeout=0.3) is None


def test_continuation_flood_ends_connection(upstream, rg_factory):
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"max_header_bytes": "4KiB"}))
    c = H2Raw(rg.port)
    c.settle()
    h = HeadersFrame(1)
    h.data = c.block(base())
    c.frame(h)                           # no END_HEADERS
    try:
        for i in range(20):
            f = ContinuationFrame(1)
            f.data = c.block([("x-c%d" % i, "v" * 500)])
            c.frame(f)
    except OSError:
        pass                             # closed on us: that is the point
    g = c.goaway(timeout=5)
    assert c.wait_closed(5)
    assert g is None or g[0] != NO_ERROR
    assert rg.wait_metric(METRIC, 1, error="header-block")
    assert upstream.requests == []


def test_header_block_timeout(upstream, rg_factory):
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"header_timeout": "300ms"}))
    c = H2Raw(rg.port)
    c.settle()
    h = HeadersFrame(1)
    h.data = c.block(base())
    c.frame(h)                           # the block never ends
    t0 = time.monotonic()
    assert c.wait_closed(5)
    assert 0.25 <= time.monotonic() - t0 < 3
    assert rg.wait_metric(METRIC, 1, error="header-block")


def flood(c, make, n, batch=500):
    sent = 0
    try:
        while sent < n:
            c.send(b"".join(make(sent + i).serialize() for i in range(batch)))
            sent += batch
            c.pump(lambda: False, timeout=0.01)   # read what comes back, like a real client
    except OSError:
        pass


@pytest.mark.parametrize("kind", ["ping", "settings", "priority", "window_update"])
def test_control_frame_flood(upstream, rg2, kind):
    c = H2Raw(rg2.port)
    make = {
        "ping": lambda i: __import__("hyperframe.frame").frame.PingFrame(0, opaque_data=b"%08d" % (i % 10**8)),
        "settings": lambda i: SettingsFrame(0),
        "priority": lambda i: PriorityFrame(1 + 2 * (i % 1000), depends_on=0, stream_weight=16),
        "window_update": lambda i: WindowUpdateFrame(0, window_increment=1),
    }[kind]
    flood(c, make, 10500)
    g = c.goaway(timeout=5)
    assert g is not None and g[0] == ENHANCE_YOUR_CALM, g
    assert c.wait_closed(5)
    assert rg2.wait_metric(METRIC, 1, error="flood")
    assert rg2.stderr_text().count("http2 flood") == 1


def test_empty_data_flood(upstream, rg2):
    upstream.set_default(stall())
    c = H2Raw(rg2.port)
    sid = c.get("/upload", method="PUT", end=False)
    flood(c, lambda i: DataFrame(sid, data=b""), 1500)
    g = c.goaway(timeout=5)
    assert g is not None and g[0] == ENHANCE_YOUR_CALM
    assert rg2.wait_metric(METRIC, 1, error="flood")


def test_flood_detected_when_client_does_not_read(upstream, rg2):
    c = H2Raw(rg2.port)
    c.sock.setsockopt(__import__("socket").SOL_SOCKET, __import__("socket").SO_RCVBUF, 4096)
    try:
        for _ in range(30):
            c.send(b"".join(SettingsFrame(0).serialize() for _ in range(500)))
    except OSError:
        pass
    assert c.wait_closed(10)
    assert rg2.wait_metric(METRIC, 1, error="flood")


def test_zero_window_reader_closed_after_idle_timeout(upstream, rg_factory):
    upstream.set_default(respond(200, body=b"q" * 100000))
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"idle_timeout": "700ms"}))
    c = H2Raw(rg.port, settings={4: 0}, auto_window=False)
    sid = c.get("/zero")
    r = c.streams[sid]
    c.pump(lambda: r.status is not None, timeout=5)
    assert r.status == 200
    t0 = time.monotonic()
    assert c.wait_closed(5)
    assert 0.5 <= time.monotonic() - t0 < 3
    assert rg.wait_metric(METRIC, 1, error="stalled")


def test_idle_connection_goaway(upstream, rg_factory):
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"idle_timeout": "400ms"}))
    c = H2Raw(rg.port)                   # never opens a stream
    g = c.goaway(timeout=3)
    assert g == (NO_ERROR, 0)
    assert c.wait_closed(3)
    assert rg.wait_metric(METRIC, 1, error="idle")
    c2 = H2Raw(rg.port)
    assert c2.response(c2.get("/one")).status == 200
    g = c2.goaway(timeout=3)
    assert g == (NO_ERROR, 1)


def test_garbage_after_preface_closes(upstream, rg2):
    c = H2Raw(rg2.port)
    c.send(b"\x00\x00\x04\x08\x00\x00\x00\x00\x00" + b"\x00\x00\x00\x00")  # zero increment
    assert c.wait_closed(5)


def test_replies_the_client_does_not_read_pause_its_input(upstream, rg2):
    """Bounded output (SPEC §9): a client that sends control frames without reading the replies
    is not read any further while 128 KiB of replies wait; once it reads, every reply comes
    and the connection goes on. Before, the replies piled up inside nghttp2 and the
    connection was cut as a flood, though 9,000 PINGs and 9,000 SETTINGS are under the flood
    limits."""
    c = H2Raw(rg2.port)
    c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    assert c.settle()
    n = 9000                         # of each: under the flood limits (SPEC §9)
    pings = (PingFrame(0, opaque_data=b"p" * 8).serialize() + SettingsFrame(0).serialize()) * n
    sent = threading.Event()

    def sender():
        try:
            c.sock.sendall(pings)
        except OSError:
            pass
        sent.set()
    threading.Thread(target=sender, daemon=True).start()
    sent.wait(3)                     # retrygate stops reading; the kernel holds the rest
    seen = [0, 0]                    # frames looked at, PING ACKs among them

    def acks():
        for f in c.frames[seen[0]:]:
            seen[1] += isinstance(f, PingFrame) and "ACK" in f.flags
        seen[0] = len(c.frames)
        return seen[1]
    assert c.pump(lambda: acks() >= n, timeout=30), (acks(), c.closed, c.goaway_frame)
    assert sent.wait(10)
    assert not c.closed and c.goaway_frame is None
    assert c.response(c.get("/after")).status == 200
    assert rg2.metric(METRIC, error="flood") == 0
