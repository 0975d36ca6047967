"""Self-tests of the test tooling (upstream.py, rawclient.py, harness.py). No retrygate needed:
the harness's process handling is exercised against a small fake binary written here."""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from harness import (REPO_ROOT, Blackhole, HeaderMap, RawConn, Refusing, Retrygate,
                     Upstream, close, close_before_read, free_port, http_request, interim,
                     make_action, make_config, parse_metrics, parse_response, parse_responses,
                     partial, ports_from_yaml, raw, raw_request, render_yaml, reset,
                     reset_before_read, respond, respond_100_then, retry_after,
                     sanitizer_reports, slow_body, stall, wait_for, ConnectionClosed)

pytestmark = pytest.mark.timeout(30)

GET = b"GET %s HTTP/1.1\r\nHost: t\r\n\r\n"


def get(path=b"/"):
    return GET % path


# ------------------------------------------------------------------------------- upstream

def test_echo_default_and_recording(upstream):
    r = http_request(upstream.port, "POST", "/a/b?x=1",
                     headers=[("Host", "svc"), ("X-One", "1"), ("x-one", "2")], body=b"hello")
    assert r.status == 200 and r.headers["x-upstream"] == upstream.name
    doc = r.json()
    assert doc["method"] == "POST" and doc["target"] == "/a/b?x=1" and doc["body"] == "hello"
    (req,) = upstream.wait_requests(1)
    assert (req.method, req.target, req.path, req.query, req.version) == \
        ("POST", "/a/b?x=1", "/a/b", "x=1", "HTTP/1.1")
    assert req.headers.items()[:3] == [("Host", "svc"), ("X-One", "1"), ("x-one", "2")]
    assert req.header_all("X-ONE") == ["1", "2"] and req.header("content-length") == "5"
    assert req.body == b"hello" and req.complete and req.framing == "length"
    assert req.raw_head.startswith(b"POST /a/b?x=1 HTTP/1.1\r\nHost: svc\r\n")
    assert req.t_first_byte <= req.time <= req.t_done <= time.monotonic()
    assert req.conn_id == 1 and req.seq == 0 and req.action == "echo"
    assert upstream.connections == 1


def test_queue_fifo_then_default_and_spec_forms(upstream):
    upstream.push(503, "close", {"action": "respond", "status": 201, "body": "made"},
                  lambda req: 299 if req.header("X-Pick") else 298)
    assert upstream.pending == 4
    assert http_request(upstream.port, "GET", "/").status == 503
    data, closed = raw_request(upstream.port, get(), read_timeout=2)
    assert (data, closed) == (b"", True)
    r = http_request(upstream.port, "GET", "/")
    assert (r.status, r.body) == (201, b"made")
    assert http_request(upstream.port, "GET", "/", {"X-Pick": "1"}).status == 299
    assert http_request(upstream.port, "GET", "/").status == 200        # default
    upstream.set_default(404)
    assert http_request(upstream.port, "GET", "/").status == 404
    assert [r.action for r in upstream.requests] == \
        ["respond", "close", "respond", "respond", "echo", "respond"]
    with pytest.raises(ValueError):
        make_action("no-such-action")


def test_path_rules(upstream):
    upstream.on_path("/a", 500, default=201)
    upstream.on_path(lambda req: req.method == "DELETE", 204)
    upstream.push(202)
    s = [http_request(upstream.port, m, p).status
         for m, p in [("GET", "/a/x"), ("GET", "/a"), ("GET", "/b"), ("DELETE", "/b"),
                      ("DELETE", "/b"), ("GET", "/b")]]
    assert s == [500, 201, 202, 204, 200, 200]
    upstream.clear_script()
    assert http_request(upstream.port, "GET", "/a").status == 200


def test_keepalive_pipelining_and_connection_ids(upstream):
    upstream.push(respond(200, body=b"one"), respond(201, body=b"two"), 202)
    with RawConn(upstream.port) as c:
        c.send(get(b"/1") + get(b"/2") + get(b"/3"))
        rs = [c.read_response() for _ in range(3)]
    assert [(r.status, r.body) for r in rs] == [(200, b"one"), (201, b"two"), (202, b"")]
    reqs = upstream.wait_requests(3)
    assert [(r.target, r.conn_id, r.seq) for r in reqs] == [("/1", 1, 0), ("/2", 1, 1),
                                                             ("/3", 1, 2)]
    http_request(upstream.port, "GET", "/4")
    assert upstream.wait_requests(4)[3].conn_id == 2 and upstream.connections == 2


def test_chunked_request_decoding(upstream):
    body = (b"4;ext=1\r\nabcd\r\n" b"A\r\n0123456789\r\n" b"0\r\nX-Trailer: t\r\n\r\n")
    with RawConn(upstream.port) as c:
        c.send(b"PUT /c HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n")
        c.send(body[:10])
        time.sleep(0.05)          # split delivery: the reader must resume mid-chunk
        c.send(body[10:])
        assert c.read_response().status == 200
    (req,) = upstream.wait_requests(1)
    assert req.chunked and req.framing == "chunked"
    assert req.body == b"abcd0123456789" and req.raw_body == body
    assert req.chunk_extensions == ["ext=1"] and req.trailers == [("X-Trailer", "t")]


def test_malformed_request_is_an_error_not_a_request(upstream):
    data, closed = raw_request(upstream.port, b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1"
                               b"\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert closed and parse_response(data).status == 400
    assert upstream.requests == []
    (err,) = upstream.errors
    assert "both Transfer-Encoding and Content-Length" in err[1]


def test_expect_100_continue(upstream):
    upstream.push(201, respond(202, expect_continue=False))
    with RawConn(upstream.port) as c:
        c.send(b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n")
        assert c.read_interim().status == 100
        c.send(b"abc")
        assert c.read_response().status == 201
        # expect_continue=False: no 100; the body is still read once it comes
        c.send(b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 3\r\n\r\n"
               b"xyz")
        r = c.read_response()
        assert r.status == 202 and r.interim == []
    a, b = upstream.wait_requests(2)
    assert a.sent_continue and a.body == b"abc" and not b.sent_continue and b.body == b"xyz"


def test_respond_options(upstream):
    upstream.push(respond(200, {"X-A": ["1", "2"]}, body=[b"ab", b"cd"], chunked=True,
                          trailers={"T": "v"}, chunk_ext="e"),
                  respond(204),
                  respond(200, body=b"gone", keep_alive=False))
    with RawConn(upstream.port) as c:
        c.send(get(b"/1"))
        r = c.read_response()
        assert r.body == b"abcd" and r.headers.get_all("x-a") == ["1", "2"]
        assert r.framing == "chunked" and r.trailers == [("T", "v")]
        assert r.chunk_extensions == ["e", "e"]
        c.send(get(b"/2"))
        r = c.read_response()
        assert r.status == 204 and "content-length" not in r.headers
        c.send(get(b"/3"))
        r = c.read_response()
        assert r.body == b"gone" and r.headers["connection"] == "close"
        assert c.wait_closed(5)
    # HEAD: Content-Length of the body, no body bytes
    upstream.push(respond(200, body=b"12345"))
    with RawConn(upstream.port) as c:
        c.send(b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n" + get(b"/after"))
        r = c.read_response("HEAD")
        assert r.headers["content-length"] == "5" and r.body == b""
        assert c.read_response().status == 200     # the stream stayed in sync
    # HTTP/1.0 without keep-alive: close after the response
    data, closed = raw_request(upstream.port, b"GET / HTTP/1.0\r\n\r\n")
    assert closed and parse_response(data).status == 200


def test_retry_after_helper(upstream):
    upstream.push(retry_after(2), retry_after("Wed, 21 Oct 2015 07:28:00 GMT", status=429))
    a = http_request(upstream.port, "GET", "/")
    b = http_request(upstream.port, "GET", "/")
    assert (a.status, a.headers["retry-after"]) == (503, "2")
    assert (b.status, b.headers["retry-after"]) == (429, "Wed, 21 Oct 2015 07:28:00 GMT")


def test_delays_and_slow_body(upstream):
    upstream.push(respond(200, body=b"x", delay=0.2),
                  slow_body([b"a", b"b", b"c"], 0.1),
                  slow_body([b"a", b"b"], 0.1, chunked=True, delay_body=0.1))
    t = time.monotonic()
    http_request(upstream.port, "GET", "/")
    assert time.monotonic() - t >= 0.19
    with RawConn(upstream.port) as c:
        t = time.monotonic()
        c.send(get())
        r = c.read_response()
        assert r.body == b"abc" and r.headers["content-length"] == "3"
        assert time.monotonic() - t >= 0.19
        t = time.monotonic()
        c.send(get())
        r = c.read_response()
        assert r.body == b"ab" and r.framing == "chunked" and time.monotonic() - t >= 0.19


def test_interim_responses(upstream):
    upstream.push(interim(103, {"Link": "</s.css>; rel=preload"}, body=b"final"),
                  respond_100_then(200, body=b"x"))
    with RawConn(upstream.port) as c:
        c.send(get())
        r = c.read_response()
        assert [i.status for i in r.interim] == [103] and r.interim[0].headers["link"]
        assert (r.status, r.body) == (200, b"final")
        # respond_100_then: exactly one 100 even though the request asks for one
        c.send(b"POST / HTTP/1.1\r\nHost: t\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n"
               b"z")
        r = c.read_response()
        assert [i.status for i in r.interim] == [100] and r.body == b"x"


def test_close_reset_and_close_before_read(upstream):
    upstream.push(close(), reset())
    data, closed = raw_request(upstream.port, get())
    assert (data, closed) == (b"", True)
    with RawConn(upstream.port) as c:
        c.send(get())
        assert c.wait_closed(5) and c.was_reset
    assert len(upstream.wait_requests(2)) == 2
    assert [upstream.wait_conn_closed(i) for i in (1, 2)] == ["upstream", "reset"]

    upstream.reset_log()
    upstream.push(close_before_read(), reset_before_read())
    with RawConn(upstream.port) as c:
        assert c.wait_closed(5)
    try:      # the RST may beat connect()'s own completion check: then connect() fails
        with RawConn(upstream.port) as c:
            assert c.wait_closed(5) and c.was_reset
    except ConnectionResetError:
        pass
    upstream.wait_connections(2)
    assert upstream.requests == [] and upstream.pending == 0
    # the outage switch: every new connection is dropped until healed
    upstream.set_default(close_before_read())
    with RawConn(upstream.port) as c:
        assert c.wait_closed(5)
    upstream.set_default(200)
    assert http_request(upstream.port, "GET", "/").status == 200


def test_stall(upstream):
    upstream.push(stall(), stall(0.2))
    c = RawConn(upstream.port)
    c.send(get())
    (req,) = upstream.wait_requests(1)
    assert c.recv_some(0.2) == b""
    c.close()                                  # the peer gives up: the stall ends at once
    assert upstream.wait_conn_closed(req.conn_id, 5) == "peer"
    with RawConn(upstream.port) as c:
        t = time.monotonic()
        c.send(get())
        assert c.wait_closed(5) and c.buf == b""
        assert time.monotonic() - t >= 0.19


def test_raw_and_partial(upstream):
    upstream.push(raw(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", close=False),
                  raw(b"NONSENSE\r\n\r\n"),
                  partial(200, {"X": "y"}, b"abc", content_length=10))
    with RawConn(upstream.port) as c:
        c.send(get())
        assert c.read_response().body == b"ok"
        c.send(get())
        data, closed = c.read_until_close(5)
        assert (data, closed) == (b"NONSENSE\r\n\r\n", True)
    data, closed = raw_request(upstream.port, get())
    r = parse_response(data)
    assert closed and not r.complete and r.body == b"abc" and r.headers["content-length"] == "10"


def test_hold_gate_and_max_active(upstream):
    gate = threading.Event()
    upstream.set_default(respond(200, hold=gate))
    results = []
    threads = [threading.Thread(target=lambda: results.append(
        http_request(upstream.port, "GET", "/").status)) for _ in range(3)]
    for t in threads:
        t.start()
    upstream.wait_for(lambda: upstream.active == 3, 10, "3 held requests")
    assert results == []
    gate.set()
    for t in threads:
        t.join(10)
    assert results == [200, 200, 200] and upstream.max_active == 3
    upstream.wait_idle()


def test_close_idle_and_kill(upstream):
    with RawConn(upstream.port) as c:
        c.send(get())
        c.read_response()
        upstream.wait_for(lambda: upstream.idle_connections(), 5, "an idle connection")
        assert upstream.close_idle() == 1
        assert c.wait_closed(5) and not c.was_reset
        upstream.wait_conn_closed(1)
    with RawConn(upstream.port) as c:
        c.send(get())
        c.read_response()
        upstream.wait_for(lambda: upstream.idle_connections(), 5, "an idle connection")
        assert upstream.kill_connections(reset=True) == 1
        assert c.wait_closed(5) and c.was_reset
    assert [upstream.wait_conn_closed(i) for i in (1, 2)] == ["killed", "killed"]


def test_after_bytes_reach_an_idle_connection(upstream):
    upstream.push(respond(200, body=b"ok", after=b"JUNK"))
    with RawConn(upstream.port) as c:
        c.send(get())
        assert c.read_response().body == b"ok"
        assert c.recv_some(5) == b"JUNK"


def test_close_stops_everything_quickly():
    before = threading.active_count()
    up = Upstream(default=stall())
    idle = RawConn(up.port)
    busy = RawConn(up.port)
    busy.send(get())
    up.wait_requests(1)
    up.wait_connections(2)
    t = time.monotonic()
    assert up.close() is True
    assert time.monotonic() - t < 2
    assert threading.active_count() == before
    assert idle.wait_closed(5) and busy.wait_closed(5)
    idle.close()
    busy.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", up.port), timeout=2).close()
    assert up.close() is True                 # idempotent


def test_wait_timeout_message(upstream):
    with pytest.raises(AssertionError, match="1 request"):
        upstream.wait_requests(1, timeout=0.1)


def test_refusing_and_blackhole():
    with Refusing() as r:
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", r.port), timeout=2)
    with Blackhole() as b:
        if not b.blocks:
            pytest.skip("connect() to a full accept queue does not block on this kernel")
        t = time.monotonic()
        with pytest.raises((socket.timeout, TimeoutError)):
            socket.create_connection(("127.0.0.1", b.port), timeout=0.3)
        assert time.monotonic() - t >= 0.29


def test_cli_serves_echo():
    port = free_port()
    p = subprocess.Popen([sys.executable, str(REPO_ROOT / "tests/tools/upstream.py"),
                          "--listen", "127.0.0.1:%d" % port, "--quiet"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def up():
            try:
                return http_request(port, "GET", "/hello", timeout=1)
            except OSError:
                return None
        r = wait_for(up, 10, 0.05, "the CLI upstream")
        assert r.status == 200 and r.json()["target"] == "/hello"
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
        assert p.stderr.read() == b""
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        p.stdout.close()
        p.stderr.close()


# ------------------------------------------------------------------------------- rawclient

def test_parse_responses_pipelined_and_close_delimited():
    data = (b"HTTP/1.1 100 Continue\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"
            b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n"
            b"HTTP/1.0 200 OK\r\n\r\nuntil close")
    rs = parse_responses(data, methods=["GET", "GET", "HEAD", "GET"])
    assert [(r.status, r.body, r.framing) for r in rs] == [
        (200, b"ok", "length"), (200, b"hi", "chunked"), (200, b"", "none"),
        (200, b"until close", "close")]
    assert rs[0].interim[0].status == 100
    status, headers, body = rs[0]
    assert headers["CONTENT-LENGTH"] == "2" and isinstance(headers, HeaderMap)


def test_raw_conn_errors(upstream):
    upstream.push(close())
    with RawConn(upstream.port) as c:
        c.send(get())
        with pytest.raises(ConnectionClosed):
            c.read_response(timeout=5)
    upstream.push(stall())
    with RawConn(upstream.port) as c:
        c.send(get())
        with pytest.raises(TimeoutError):
            c.read_response(timeout=0.2)


# ------------------------------------------------------------------------------- harness

def test_make_config_renders_spec_yaml(upstream):
    blk = Refusing()
    cfg = make_config(upstreams={"pay": {"endpoints": [upstream, blk, "db.internal:5432"],
                                         "retry": {"max_attempts": 2,
                                                   "on": ["connect-failure", 503],
                                                   "backoff": {"base": "25ms", "max": "250ms"},
                                                   "non_idempotent": "always"},
                                         "idempotency": {"enabled": True,
                                                         "store": "redis://127.0.0.1:6379/0"}},
                                 "b": upstream},
                      routes=[{"host": "*.example.com", "path_prefix": "/", "upstream": "pay"},
                              {"upstream": "b"}],
                      listener_limits={"max_body": "1MiB", "header_timeout": 500},
                      admin_token="s3cret", access_log="off", port=1234, admin_port=1235)
    blk.close()
    text = render_yaml(cfg)
    assert text == textwrap.dedent("""\
        admin:
          listen: "127.0.0.1:1235"
          token: s3cret
        workers: 1
        drain_timeout: 2s
        access_log: "off"
        listeners:
          - name: main
            listen: "127.0.0.1:1234"
            limits:
              max_body: 1MiB
              header_timeout: 500
            routes:
              - host: "*.example.com"
                path_prefix: /
                upstream: pay
              - upstream: b
        upstreams:
          pay:
            endpoints: ["%s", "%s", "db.internal:5432"]
            retry:
              max_attempts: 2
              on: [connect-failure, 503]
              backoff:
                base: 25ms
                max: 250ms
              non_idempotent: always
            idempotency:
              enabled: true
              store: "redis://127.0.0.1:6379/0"
          b:
            endpoints: ["%s"]
        """) % (upstream.endpoint, blk.endpoint, upstream.endpoint)
    assert ports_from_yaml(text) == (1234, 1235)
    two = make_config(upstreams={"a": upstream, "b": [upstream]})
    assert two["listeners"][0]["routes"] == [{"host": "a", "upstream": "a"},
                                              {"host": "b", "upstream": "b"}]


def test_parse_metrics_and_sanitizer_scan():
    m = parse_metrics(textwrap.dedent("""\
        # HELP retrygate_upstream_attempts_total attempts
        # TYPE retrygate_upstream_attempts_total counter
        retrygate_downstream_connections_active 2
        retrygate_upstream_attempts_total{upstream="a"} 7
        retrygate_upstream_retries_refused_total{upstream="a",reason="budget"} 3
        retrygate_upstream_retries_refused_total{upstream="a",reason="max-attempts"} 4
        retrygate_upstream_request_duration_seconds_bucket{upstream="a",le="+Inf"} 9 1700000000
        weird{l="a \\"q\\" \\\\ b"} +Inf
        """))
    assert m[("retrygate_upstream_attempts_total", frozenset({("upstream", "a")}))] == 7
    assert m.value("retrygate_downstream_connections_active") == 2
    assert m.value("retrygate_upstream_retries_refused_total", upstream="a") == 7
    assert m.value("retrygate_upstream_retries_refused_total", upstream="a", reason="budget") == 3
    assert m.value("retrygate_upstream_retries_refused_total", upstream="b") == 0
    assert m.value("retrygate_upstream_request_duration_seconds_bucket", le="+Inf") == 9
    assert m.value("weird", l='a "q" \\ b') == float("inf")
    assert sanitizer_reports("all fine\n") == []
    assert len(sanitizer_reports("x\n==12==ERROR: AddressSanitizer: heap-use-after-free\n"
                                 "#0 0x1 in f\n")) == 1
    assert sanitizer_reports("src/a.c:3:5: runtime error: signed integer overflow")


FAKE = r'''#!/usr/bin/python3
# A stand-in for build/retrygate: serves /ready, /metrics, /stats on the admin port and 200 on
# the listener, logs "reloaded" on SIGHUP, exits 0 on SIGTERM. FAKE_MODE=asan prints a
# sanitizer report at exit; FAKE_MODE=die exits 3 at once.
import os, signal, sys, threading
sys.path.insert(0, os.environ["FAKE_HARNESS_DIR"])
from harness import ports_from_yaml
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
mode = os.environ.get("FAKE_MODE", "")
if mode == "die":
    sys.stderr.write("fatal: cannot start\n"); sys.exit(3)
port, admin = ports_from_yaml(open(sys.argv[sys.argv.index("-c") + 1]).read())
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        body = {"/ready": b"ready", "/stats": b'{"ok": true}',
                "/metrics": b'retrygate_upstream_attempts_total{upstream="up"} 5\n'}.get(
                    self.path, b"proxied") if self.server is adm else b"proxied"
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
done = threading.Event()
signal.signal(signal.SIGHUP, lambda *a: (sys.stderr.write("reloaded\n"), sys.stderr.flush()))
signal.signal(signal.SIGTERM, lambda *a: done.set())
adm = ThreadingHTTPServer(("127.0.0.1", admin), H)
lst = ThreadingHTTPServer(("127.0.0.1", port), H)
for s in (adm, lst):
    threading.Thread(target=s.serve_forever, daemon=True).start()
while not done.wait(0.1):
    pass
if mode == "asan":
    sys.stderr.write("==1==ERROR: LeakSanitizer: detected memory leaks\n")
sys.exit(0)
'''


@pytest.fixture
def fake_bin(tmp_path):
    p = tmp_path / "fake-retrygate"
    p.write_text(FAKE)
    p.chmod(0o755)
    return p


def test_harness_lifecycle_with_fake_binary(fake_bin, tmp_path, upstream):
    env = {"FAKE_HARNESS_DIR": os.path.dirname(os.path.abspath(__file__))}
    cfg = make_config(upstreams={"up": upstream})
    rg = Retrygate(cfg, binary=fake_bin, workdir=tmp_path / "a", env=env)
    try:
        assert rg.ready() == 200
        status, headers, body = rg.request("GET", "/x")
        assert (status, body) == (200, b"proxied")
        assert rg.metric("retrygate_upstream_attempts_total", upstream="up") == 5
        assert rg.wait_metric("retrygate_upstream_attempts_total", 5, upstream="up") == 5
        assert rg.stats() == {"ok": True}
        out = rg.reload(dict(cfg, workers=2))
        assert "reloaded" in out and "workers: 2" in rg.config_path.read_text()
        assert str(rg.port) in rg.config_path.read_text()
    finally:
        assert rg.stop() == 0
    assert rg.finish() == []

    bad = Retrygate(cfg, binary=fake_bin, workdir=tmp_path / "b", env=dict(env, FAKE_MODE="asan"))
    problems = bad.finish()
    assert any("LeakSanitizer" in p for p in problems)

    with pytest.raises(AssertionError, match="exited with 3 before it was ready"):
        Retrygate(cfg, binary=fake_bin, workdir=tmp_path / "c", env=dict(env, FAKE_MODE="die"))

    killed = Retrygate(cfg, binary=fake_bin, workdir=tmp_path / "d", env=env)
    assert killed.kill() == -signal.SIGKILL and killed.finish() == []


def test_missing_binary_is_a_clear_error(tmp_path, upstream):
    with pytest.raises(AssertionError, match="binary not found"):
        Retrygate(make_config(upstreams={"up": upstream}), binary=tmp_path / "nope",
                  workdir=tmp_path)


def test_yaml_text_config_with_placeholders(fake_bin, tmp_path, upstream):
    text = textwrap.dedent("""\
        admin:
          listen: "127.0.0.1:@ADMIN_PORT@"
        listeners:
          - name: main
            listen: "127.0.0.1:@PORT@"
            routes:
              - upstream: up
        upstreams:
          up:
            endpoints: ["%s"]
        """) % upstream.endpoint
    env = {"FAKE_HARNESS_DIR": os.path.dirname(os.path.abspath(__file__))}
    with Retrygate(text, binary=fake_bin, workdir=tmp_path, env=env) as rg:
        assert rg.port and rg.admin_port and rg.get("/").status == 200
        assert json.loads(rg.admin("GET", "/stats").body) == {"ok": True}


def test_rg_factory_fixture(rg_factory, upstream, fake_bin):
    rg = rg_factory(upstreams={"up": upstream}, binary=fake_bin,
                    env={"FAKE_HARNESS_DIR": os.path.dirname(os.path.abspath(__file__))})
    assert rg.get("/").status == 200 and rg.workdir.name == "rg0"
    with pytest.raises(TypeError):
        rg_factory({"workers": 1}, upstreams={})


# ------------------------------------------------------------------------ include check

CHECK_INCLUDES = os.path.join(REPO_ROOT, "tests", "tools", "check-includes.py")


def check_includes(src):
    return subprocess.run([sys.executable, CHECK_INCLUDES, str(src)], capture_output=True,
                          text=True, timeout=30)


def write_tree(root, files):
    for path, text in files.items():
        p = root / path
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)


def test_include_check_passes_the_tree_and_states_its_order():
    r = check_includes(os.path.join(REPO_ROOT, "src"))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "app > client > proxy > upstream" in r.stdout and r.stdout.rstrip().endswith("base")


def test_include_check_refuses_an_upward_include_with_its_line(tmp_path):
    write_tree(tmp_path, {
        "base/util.h": "#pragma once\n",
        "policy/retry.h": '#include "base/util.h"\n',
        "policy/balance.c": '#include "policy/retry.h"\n\n#include "state/upstream.h"\n',
        "state/upstream.h": '#include "policy/retry.h"\n',
    })
    r = check_includes(tmp_path)
    assert r.returncode == 1
    assert "policy/balance.c:3: policy/ includes state/, which is above it" in r.stdout
    # downward only: without the upward line the same tree passes
    (tmp_path / "policy/balance.c").write_text('#include "policy/retry.h"\n')
    assert check_includes(tmp_path).returncode == 0


def test_include_check_refuses_a_file_loop_and_an_unknown_folder(tmp_path):
    write_tree(tmp_path, {"base/a.h": '#include "base/b.h"\n', "base/b.h": '#include "base/a.h"\n'})
    r = check_includes(tmp_path)
    assert r.returncode == 1 and "include loop: base/a -> base/b -> base/a" in r.stdout
    write_tree(tmp_path, {"base/b.h": "\n", "misc/x.c": '#include "base/a.h"\n'})
    r = check_includes(tmp_path)
    assert r.returncode == 1 and "misc/: a folder the layer order does not name" in r.stdout
