"""HTTP/2 client-side hardening (SPEC §9, §1 drain, §12): a response cut by the upstream reaches
an HTTP/2 client as one (head, the body that came, then RST_STREAM); refusals retrygate makes
itself are logged a bounded number of times per connection and counted every time; requests
answered by retrygate itself keep a connection from being closed as idle; a reload that lowers
max_concurrent_streams tells open connections before it enforces the new value; the expiry of
drain_timeout resets the streams it cuts and records a request that may have executed as an
unknown outcome."""

import json
import signal
import threading
import time

import pytest
from hyperframe.frame import (GoAwayFrame, HeadersFrame, RstStreamFrame, SettingsFrame)

from harness import FAST_RETRY, InThread, RawConn, make_config, wait_for
from h2raw import CANCEL, INTERNAL_ERROR, REFUSED_STREAM, H2Raw
import h2upstream as h2u
from upstream import respond, stall

pytestmark = pytest.mark.timeout(60)


def h2api(up, retry=None, **more):
    r = dict(FAST_RETRY)
    r.update(retry or {})
    d = {"endpoints": [up.endpoint], "protocol": "h2", "retry": r}
    d.update(more)
    return {"api": d}


# ------------------------------------------------------------------------------- cut response

def test_cut_response_reaches_an_h2_client_as_head_body_then_reset(h2up, rg_factory):
    # head, some body and RST_STREAM arrive from the upstream in one read: the client must see
    # the head and the bytes that came, then the reset (never END_STREAM, never only the reset)
    up = h2up()
    up.set_default(h2u.rst(h2u.INTERNAL_ERROR, after_head=True, body=b"x" * 100, together=True))
    rg = rg_factory(upstreams=h2api(up))
    c = H2Raw(rg.port)
    for i in range(3):
        r = c.response(c.get("/cut%d" % i))
        assert r.status == 200, r
        assert r.body == b"x" * 100, r
        assert r.reset == INTERNAL_ERROR and not r.ended, r
    # the connection carries on
    up.set_default(h2u.respond(200, body=b"fine"))
    r = c.response(c.get("/after"))
    assert r.status == 200 and r.body == b"fine" and r.ended


# ------------------------------------------------------------------------------- refusal logs

def test_refusals_are_logged_a_bounded_number_of_times_and_all_counted(upstream, rg_factory):
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       listener_limits={"max_uri_bytes": "1KiB"}))
    c = H2Raw(rg.port)
    n = 100
    for i in range(n):
        r = c.response(c.get("/x", method="BREW"))
        assert r.status == 501, r
        r = c.response(c.get("/" + "p" * 2000))
        assert r.status == 414, r
    r = c.response(c.get("/fine"))
    assert r.status == 200
    assert rg.wait_metric("retrygate_downstream_requests_total", n, code="5xx")
    assert rg.wait_metric("retrygate_downstream_requests_total", n, code="4xx")
    lines = [ln for ln in rg.stderr_text().splitlines() if "refused" in ln]
    assert 1 <= len(lines) <= 4, lines[:10]
    # a second connection logs its own first refusal of each kind
    c2 = H2Raw(rg.port)
    assert c2.response(c2.get("/x", method="BREW")).status == 501
    wait_for(lambda: len([ln for ln in rg.stderr_text().splitlines() if "refused" in ln])
             > len(lines), 3, what="the second connection's refusal logged")


# ------------------------------------------------------------------------------- idle timer

def test_self_answered_requests_keep_the_connection_from_idling(upstream, rg_factory):
    # only host "api" has a route: every other host is answered 404 by retrygate itself
    rg = rg_factory(config=make_config(upstreams={"api": {"endpoints": [upstream]}},
                                       routes=[{"host": "api", "upstream": "api"}],
                                       listener_limits={"idle_timeout": "1s"}))
    c = H2Raw(rg.port)
    t_end = time.monotonic() + 3.2
    n = 0
    while time.monotonic() < t_end:
        r = c.response(c.get("/nothing", authority="nobody.example"), timeout=2)
        assert r.status == 404, (n, r, c.goaway_frame)
        n += 1
        time.sleep(0.2)
    assert not c.closed and c.goaway_frame is None
    assert n >= 12
    # and idle, it is closed after idle_timeout
    assert c.goaway(3) is not None


# ------------------------------------------------------------------------------- reload

def _settings_with(c, key, value):
    return [f for f in c.frames if isinstance(f, SettingsFrame) and "ACK" not in f.flags
            and f.settings.get(key) == value]


def test_reload_lowering_max_concurrent_streams_is_told_before_it_is_enforced(upstream,
                                                                              rg_factory):
    gate = threading.Event()
    upstream.set_default(respond(200, body=b"held", hold=gate, hold_timeout=20))
    cfg = make_config(upstreams={"api": {"endpoints": [upstream]}},
                      listener_limits={"max_concurrent_streams": 100})
    rg = rg_factory(config=cfg)
    c = H2Raw(rg.port)
    assert c.settle()
    assert _settings_with(c, 3, 100)
    try:
        cfg["listeners"][0]["limits"]["max_concurrent_streams"] = 2
        rg.reload(cfg)
        # the open connection is told (H2Raw acknowledges every SETTINGS at once)
        assert c.pump(lambda: _settings_with(c, 3, 2), 3), [type(f).__name__ for f in c.frames]
        # within what it was told: served; beyond it: REFUSED_STREAM
        a, b = c.get("/a"), c.get("/b")
        upstream.wait_requests(2)
        r = c.response(c.get("/x"), 3)
        assert r.reset == REFUSED_STREAM and r.status is None, r
    finally:
        gate.set()
    for sid in (a, b):
        r = c.response(sid)
        assert r.status == 200 and r.body == b"held", r
    # a new connection is told 2 from the start
    c2 = H2Raw(rg.port)
    assert c2.settle() and _settings_with(c2, 3, 2)



def test_a_lower_limit_not_yet_acknowledged_is_not_enforced(upstream, rg_factory):
    gate = threading.Event()
    upstream.set_default(respond(200, body=b"held", hold=gate, hold_timeout=20))
    cfg = make_config(upstreams={"api": {"endpoints": [upstream]}},
                      listener_limits={"max_concurrent_streams": 100})
    rg = rg_factory(config=cfg)
    c = H2Raw(rg.port)
    assert c.settle()
    reply = c._reply
    c._reply = lambda f: None if isinstance(f, SettingsFrame) else reply(f)    # no more ACKs
    try:
        cfg["listeners"][0]["limits"]["max_concurrent_streams"] = 2
        rg.reload(cfg)
        assert c.pump(lambda: _settings_with(c, 3, 2), 3)
        # not acknowledged: the client may still rely on the 100 it was told
        sids = [c.get("/s%d" % i) for i in range(4)]
        upstream.wait_requests(4)
    finally:
        gate.set()
    for sid in sids:
        assert c.response(sid).status == 200


# ------------------------------------------------------------------------------- drain_timeout

def _stalled(upstream, tmp_path):
    upstream.set_default(stall(20))
    return make_config(upstreams={"api": {"endpoints": [upstream],
                                          "deadline": {"default": "30s"},
                                          "retry": dict(FAST_RETRY, per_try_timeout="30s")}},
                       drain_timeout="1s", access_log=str(tmp_path / "access.log"))


def _access_lines(tmp_path):
    p = tmp_path / "access.log"
    return [json.loads(ln) for ln in p.read_text().splitlines() if ln.strip()] if p.exists() else []


def test_drain_timeout_resets_h2_streams_and_leaves_an_unknown_outcome(upstream, rg_factory,
                                                                         tmp_path):
    rg = rg_factory(config=_stalled(upstream, tmp_path))
    c = H2Raw(rg.port)
    sid = c.get("/pay", method="POST", body=b"amount=1")
    upstream.wait_requests(1)
    rg.send_signal(signal.SIGTERM)
    assert rg.wait_exit(10) == 0
    assert c.wait_closed(5)
    kinds = [type(f).__name__ for f in c.frames]
    resets = [f for f in c.frames if isinstance(f, RstStreamFrame) and f.stream_id == sid]
    assert resets, kinds
    assert resets[0].error_code == CANCEL, resets[0]
    # a last GOAWAY, after the reset, with an error code; all before the close
    goaways = [i for i, f in enumerate(c.frames) if isinstance(f, GoAwayFrame)]
    assert goaways and goaways[-1] > c.frames.index(resets[0]), kinds
    assert c.frames[goaways[-1]].error_code == CANCEL
    assert c.streams[sid].status is None
    # the POST reached the upstream and got no answer: its outcome is unknown (SPEC §12)
    wait_for(lambda: any(r.get("path") == "/pay" for r in _access_lines(tmp_path)), 3,
             what="the access log line")
    rec = [r for r in _access_lines(tmp_path) if r.get("path") == "/pay"][0]
    assert rec["outcome"] == "unknown", rec


def test_drain_timeout_leaves_an_unknown_outcome_for_an_http1_client(upstream, rg_factory,
                                                                       tmp_path):
    rg = rg_factory(config=_stalled(upstream, tmp_path))
    c = RawConn(rg.port)
    try:
        c.send(b"POST /pay1 HTTP/1.1\r\nHost: h\r\nContent-Length: 8\r\n\r\namount=1")
        upstream.wait_requests(1)
        rg.send_signal(signal.SIGTERM)
        assert rg.wait_exit(10) == 0
        assert c.wait_closed(3)
    finally:
        c.close()
    wait_for(lambda: any(r.get("path") == "/pay1" for r in _access_lines(tmp_path)), 3,
             what="the access log line")
    rec = [r for r in _access_lines(tmp_path) if r.get("path") == "/pay1"][0]
    assert rec["outcome"] == "unknown", rec
