"""HTTP/2 clients (SPEC §9 client side): prior knowledge and ALPN, each stream one exchange with
§3–§7 applying per stream (retries, deadline, Retry-After, budget, non-idempotent refusal,
idempotency replay, client cancel, §5 answers on the stream), flow control, drain. Clients
nobody here wrote (curl, h2load) plus the raw client of tests/tools/h2raw.py; upstream is the
HTTP/1.1 scriptable one."""

import shutil
import signal
import subprocess
import time

import pytest

from harness import make_config, rss_bytes
from h2raw import CANCEL, NO_ERROR, H2Raw
from upstream import respond, retry_after, stall
from test_tls import certs  # noqa: F401  (the fixture: a self-signed localhost certificate)

CURL = shutil.which("curl")
H2LOAD = shutil.which("h2load")
FAST = {"backoff": {"base": "1ms", "max": "2ms"}}


def api(up, retry=None, **keys):
    r = dict(FAST)
    r.update(retry or {})
    spec = {"endpoints": [up], "retry": r}
    spec.update(keys)
    return {"api": spec}


def curl(args, timeout=20):
    p = subprocess.run([CURL, "-s", "-S", "-i"] + args, capture_output=True, timeout=timeout)
    return p.returncode, p.stdout


def parse_curl(out):
    head, _, body = out.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for ln in lines[1:]:
        k, _, v = ln.partition(":")
        headers[k.strip()] = v.strip()
    return lines[0], status, headers, body


@pytest.mark.skipif(not CURL, reason="curl not installed")
def test_curl_prior_knowledge_get(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    rc, out = curl(["--http2-prior-knowledge", rg.url("/hello?q=1"), "-H", "Cookie: a=1",
                    "-H", "Cookie: b=2"])
    assert rc == 0, out
    line, status, headers, body = parse_curl(out)
    assert line.startswith("HTTP/2 200")
    assert headers["x-retrygate-attempts"] == "1"
    assert all(k == k.lower() for k in headers)
    assert "connection" not in headers and "keep-alive" not in headers
    req = upstream.wait_requests(1)[0]
    assert req.target == "/hello?q=1" and req.method == "GET"
    assert req.header("Host") == "127.0.0.1:%d" % rg.port     # from :authority
    assert req.header("Cookie") == "a=1; b=2"                  # RFC 9113 §8.2.3
    assert req.header("X-Retrygate-Attempt") == "1"


@pytest.mark.skipif(not CURL, reason="curl not installed")
def test_curl_post_body_both_framings(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    big = b"x" * 300000                  # larger than retry.max_body: streamed
    rc, out = curl(["--http2-prior-knowledge", rg.url("/small"), "--data-binary", "hello"])
    assert rc == 0 and parse_curl(out)[1] == 200
    p = subprocess.run([CURL, "-s", "--http2-prior-knowledge", rg.url("/big"),
                        "--data-binary", "@-", "-o", "/dev/null", "-w", "%{http_code}"],
                       input=big, capture_output=True, timeout=30)
    assert p.stdout == b"200"
    reqs = upstream.wait_requests(2)
    assert reqs[0].body == b"hello" and reqs[1].body == big


def test_retry_503_then_ok_lowercase_headers(upstream, rg_factory):
    upstream.push(503, 503)
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    r = c.response(c.get("/r"))
    assert r.status == 200 and r.header("x-retrygate-attempts") == "3"
    reqs = upstream.wait_requests(3)
    assert [q.header("X-Retrygate-Attempt") for q in reqs] == ["1", "2", "3"]
    assert rg.wait_metric("retrygate_upstream_retries_total", 2, upstream="api")
    assert rg.wait_metric("retrygate_downstream_requests_total", 1, code="2xx")


def test_deadline_504(upstream, rg_factory):
    upstream.set_default(respond(200, delay=2))
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    t0 = time.monotonic()
    r = c.response(c.get("/slow", extra=[("x-timeout-ms", "200")]))
    assert r.status == 504 and r.header("x-retrygate-reason") == "deadline-exceeded"
    assert time.monotonic() - t0 < 1.5


def test_retry_after_obeyed_and_too_long_refused(upstream, rg_factory):
    upstream.push(retry_after(1), retry_after(30, body=b"later"))
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    t0 = time.monotonic()
    r = c.response(c.get("/ra", extra=[("x-timeout-ms", "5000")]), timeout=15)
    assert r.status == 503 and r.body == b"later"
    assert time.monotonic() - t0 >= 0.9                       # waited the 1 s it was told
    assert r.header("x-retrygate-retry-refused") == "retry-after"
    assert r.header("retry-after") == "30"


def test_budget_refusal(upstream, rg_factory):
    upstream.push(503, 200, respond(503, body=b"no token"))
    rg = rg_factory(upstreams=api(upstream, {"budget": {"ratio": 0, "min_per_second": 0,
                                                        "max_tokens": 1}}))
    c = H2Raw(rg.port)
    assert c.response(c.get("/b1")).status == 200
    r = c.response(c.get("/b2"))
    assert r.status == 503 and r.header("x-retrygate-retry-refused") == "budget"
    assert r.body == b"no token"


def test_non_idempotent_post_not_retried(upstream, rg_factory):
    upstream.push(503)
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    r = c.response(c.get("/pay", method="POST", body=b"{}"))
    assert r.status == 503 and r.header("x-retrygate-retry-refused") == "non-idempotent"
    assert len(upstream.wait_requests(1)) == 1


def test_idempotency_replay(upstream, rg_factory):
    upstream.push(respond(201, body=b"created"))
    rg = rg_factory(upstreams=api(upstream, idempotency={"enabled": True}))
    c = H2Raw(rg.port)
    key = [("idempotency-key", "k-1")]
    r1 = c.response(c.get("/orders", method="POST", body=b"{\"a\":1}", extra=key))
    r2 = c.response(c.get("/orders", method="POST", body=b"{\"a\":1}", extra=key))
    assert r1.status == 201 and r2.status == 201 and r2.body == b"created"
    assert r2.header("idempotency-replayed") == "true"
    time.sleep(0.2)
    assert len(upstream.requests) == 1


def test_client_rst_stream_cancels_attempt(upstream, rg_factory):
    upstream.set_default(stall())
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    sid = c.get("/stall")
    req = upstream.wait_requests(1)[0]
    assert rg.metric("retrygate_upstream_in_flight", upstream="api") == 1
    c.rst(sid, CANCEL)
    upstream.wait_conn_closed(req.conn_id)
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    # the connection carries on
    upstream.set_default(respond(200, body=b"ok"))
    r = c.response(c.get("/after"))
    assert r.status == 200 and r.body == b"ok"


def test_connection_close_cancels_every_stream(upstream, rg_factory):
    upstream.set_default(stall())
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    c.get("/a")
    c.get("/b")
    upstream.wait_requests(2)
    c.close()
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")


def test_spec5_answers_on_the_stream(upstream, rg_factory):
    cfg = make_config(upstreams=api(upstream), routes=[{"host": "known", "upstream": "api"}],
                      listener_limits={"max_body": "1KiB"})
    rg = rg_factory(config=cfg)
    c = H2Raw(rg.port)
    r = c.response(c.get("/x", authority="other"))
    assert r.status == 404 and r.header("x-retrygate-reason") == "no-route"
    assert r.header("x-retrygate-attempts") == "0"
    # over max_body while the client is still sending: 413, then RST_STREAM NO_ERROR
    sid = c.get("/big", authority="known", method="PUT", body=b"y" * 2000, end=False)
    r = c.response(sid)
    assert r.status == 413 and r.header("x-retrygate-reason") == "body-too-large"
    c.pump(lambda: r.reset is not None, timeout=3)
    assert r.reset == NO_ERROR
    # the connection carries on
    r = c.response(c.get("/ok", authority="known"))
    assert r.status == 200
    assert not c.closed


def test_bad_deadline_400_on_stream(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    r = c.response(c.get("/x", extra=[("x-timeout-ms", "abc")]))
    assert r.status == 400 and r.header("x-retrygate-reason") == "bad-deadline"
    r = c.response(c.get("/y"))
    assert r.status == 200


def test_head_and_large_response_flow_control(upstream, rg_factory):
    body = bytes(range(256)) * 4096       # 1 MiB: many windows' worth
    upstream.on_path("/big", default=respond(200, body=body))
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    r = c.response(c.get("/big"), timeout=20)
    assert r.status == 200 and r.body == body and r.header("content-length") == str(len(body))
    r = c.response(c.get("/big", method="HEAD"))
    assert r.status == 200 and r.body == b"" and r.ended


def test_slow_reader_backpressures_upstream(upstream, rg_factory):
    """The client reads nothing (window 0 for the stream): retrygate must not buffer the whole
    upstream body; it stops reading the upstream (the upstream's send blocks)."""
    body = b"z" * (8 * 1024 * 1024)
    upstream.on_path("/huge", default=respond(200, body=body))
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port, settings={4: 0}, auto_window=False)    # INITIAL_WINDOW_SIZE 0
    sid = c.get("/huge")
    r = c.streams[sid]
    c.pump(lambda: r.status is not None, timeout=5)
    assert r.status == 200
    time.sleep(1.0)
    assert rss_bytes(rg.proc.pid) < 60 * 1024 * 1024
    # open the window: everything arrives
    from hyperframe.frame import WindowUpdateFrame
    c.frame(WindowUpdateFrame(sid, window_increment=len(body)))
    c.frame(WindowUpdateFrame(0, window_increment=len(body)))
    c.auto_window = True
    c.response(sid, timeout=30)
    assert r.body == body


def test_drain_goaway_in_flight_stream_finishes(upstream, rg_factory):
    upstream.set_default(respond(200, delay=0.6, body=b"done"))
    rg = rg_factory(upstreams=api(upstream), drain_timeout="5s")
    c = H2Raw(rg.port)
    sid = c.get("/inflight")
    upstream.wait_requests(1)
    rg.send_signal(signal.SIGTERM)
    r = c.response(sid, timeout=10)
    assert r.status == 200 and r.body == b"done"
    g = c.goaway(timeout=5)
    assert g is not None and g[0] == NO_ERROR and g[1] >= sid
    assert rg.wait_exit() == 0


@pytest.mark.skipif(not H2LOAD, reason="h2load not installed")
def test_h2load_multiplexed(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    p = subprocess.run([H2LOAD, "-c2", "-m8", "-n400", rg.url("/load")], capture_output=True,
                       text=True, timeout=60)
    assert "400 succeeded" in p.stdout, p.stdout
    assert "400 2xx" in p.stdout
    assert rg.wait_metric("retrygate_downstream_requests_total", 400, code="2xx")


def test_http2_false_refuses_preface(upstream, rg_factory):
    cfg = make_config(upstreams=api(upstream))
    cfg["listeners"][0]["http2"] = False
    rg = rg_factory(config=cfg)
    data, closed = rg.raw(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400") and closed


def test_h2c_upgrade_ignored(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    status, headers, body = rg.request("GET", "/u", {"Upgrade": "h2c", "Connection": "Upgrade, HTTP2-Settings",
                                                     "HTTP2-Settings": "AAMAAABkAAQCAAAAAAIAAAAA"})
    assert status == 200
    req = upstream.wait_requests(1)[0]
    assert req.header("Upgrade") is None and req.header("HTTP2-Settings") is None


@pytest.mark.skipif(not CURL or not shutil.which("openssl"), reason="curl/openssl missing")
def test_tls_alpn_h2_and_http11(upstream, rg_factory, certs):
    rg = rg_factory(upstreams=api(upstream), listener_tls={"cert": certs["crt"], "key": certs["key"]})
    base = ["--cacert", certs["crt"], "--resolve", "localhost:%d:127.0.0.1" % rg.port,
            "-o", "/dev/null", "-w", "%{http_version} %{http_code}"]
    url = "https://localhost:%d/tls" % rg.port
    p = subprocess.run([CURL, "-s", "--http2"] + base + [url], capture_output=True, timeout=20)
    assert p.stdout == b"2 200"
    p = subprocess.run([CURL, "-s", "--http1.1"] + base + [url], capture_output=True, timeout=20)
    assert p.stdout == b"1.1 200"
    reqs = upstream.wait_requests(2)
    assert all(r.header("X-Forwarded-Proto") == "https" for r in reqs)


@pytest.mark.skipif(not CURL or not shutil.which("openssl"), reason="curl/openssl missing")
def test_tls_http2_false_selects_http11(upstream, rg_factory, certs):
    cfg = make_config(upstreams=api(upstream), listener_tls={"cert": certs["crt"], "key": certs["key"]})
    cfg["listeners"][0]["http2"] = False
    rg = rg_factory(config=cfg)
    p = subprocess.run([CURL, "-s", "--http2", "--cacert", certs["crt"], "--resolve",
                        "localhost:%d:127.0.0.1" % rg.port, "-o", "/dev/null", "-w",
                        "%{http_version} %{http_code}", "https://localhost:%d/x" % rg.port],
                       capture_output=True, timeout=20)
    assert p.stdout == b"1.1 200"


def test_priority_field_orders_the_responses(upstream, rg_factory):
    # RFC 9218: both responses wait on their streams' flow-control windows; once both windows
    # open together, the more urgent one (u=0) is sent first though it was asked for second
    from hyperframe.frame import DataFrame, SettingsFrame, WindowUpdateFrame
    upstream.set_default(respond(200, body=b"x" * 20000))
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port, settings={SettingsFrame.INITIAL_WINDOW_SIZE: 0}, auto_window=False)
    low = c.get("/low", extra=[("priority", "u=7")])
    high = c.get("/high", extra=[("priority", "u=0")])
    assert c.pump(lambda: c.streams[low].status and c.streams[high].status), c.streams
    c.send(WindowUpdateFrame(low, window_increment=20000).serialize() +
           WindowUpdateFrame(high, window_increment=20000).serialize())
    assert c.pump(lambda: any(isinstance(f, DataFrame) for f in c.frames))
    first = next(f for f in c.frames if isinstance(f, DataFrame))
    assert first.stream_id == high, [(type(f).__name__, f.stream_id) for f in c.frames]
