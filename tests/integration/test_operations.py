"""Operations (SPEC §1 signals, §7 health): /healthz and /ready, SIGHUP reload, SIGTERM/SIGINT
drain, several workers, and the stderr log."""

import copy
import re
import signal
import threading
import time

import pytest

from harness import InThread, RawConn, make_config, port_open, respond, stall, wait_for

pytestmark = pytest.mark.timeout(60)

FAST = {"backoff": {"base": "1ms", "max": "2ms"}}
LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z? +[A-Z]+ ")


def SLOW_OK(up):
    """An upstream block whose attempts may take a few seconds (per_try_timeout 5s)."""
    return {"endpoints": [up], "retry": {"per_try_timeout": "5s"}}


# ------------------------------------------------------------------------------- health

def test_healthz_and_ready(rg):
    r = rg.admin("GET", "/healthz")
    assert r.status == 200 and r.body.strip() == b"ok"
    r = rg.admin("GET", "/ready")
    assert r.status == 200 and r.body.strip() == b"ready"


def test_admin_unknown_path_404(rg):
    assert rg.admin("GET", "/nope").status == 404


def test_admin_not_served_on_proxy_listener(rg, upstream):
    # /healthz on the proxy port is proxied like any path, never answered by the admin
    r = rg.get("/healthz")
    assert r.status == 200 and r.headers.get("X-Upstream") == upstream.name
    assert upstream.wait_requests(1)[0].path == "/healthz"


def test_admin_keepalive(rg):
    from harness import Client
    c = Client(rg.admin_port)
    try:
        for p in ("/healthz", "/ready", "/metrics", "/stats", "/config", "/retries"):
            assert c.get(p).status == 200, p
    finally:
        c.close()


def test_log_lines_go_to_stderr_one_per_event(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream})
    rg.get("/")
    bad = rg.config_text.replace("endpoints:", "endpoits:")
    rg.reload(bad)
    rg.stop()
    err = rg.stderr_text()
    assert err.strip()
    assert rg.stdout_text() == ""          # access_log off: nothing on stdout
    for ln in err.rstrip("\n").split("\n"):
        assert LOG_LINE.match(ln), "not one log line per event: %r" % ln


# ------------------------------------------------------------------------------- reload

def test_sighup_applies_new_route_to_new_requests(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    cfg = make_config(upstreams={"a": a, "b": b}, routes=[{"upstream": "a"}])
    rg = rg_factory(cfg)
    keep = rg.client()
    assert keep.get("/new/x").headers["X-Upstream"] == "A"
    assert rg.get("/new/x").headers["X-Upstream"] == "A"
    new = copy.deepcopy(cfg)
    new["listeners"][0]["routes"] = [{"path_prefix": "/new", "upstream": "b"},
                                     {"upstream": "a"}]
    log = rg.reload(new)
    assert "error" not in log.lower(), log
    assert rg.get("/new/x").headers["X-Upstream"] == "B"
    assert rg.get("/old").headers["X-Upstream"] == "A"
    # an already open keep-alive connection uses the new config for its next request
    assert keep.get("/new/y").headers["X-Upstream"] == "B"
    assert rg.config_json()["listeners"][0]["routes"][0]["path_prefix"] == "/new"


def test_sighup_changes_endpoints(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    cfg = make_config(upstreams={"api": {"endpoints": [a]}})
    rg = rg_factory(cfg)
    assert rg.get("/").headers["X-Upstream"] == "A"
    new = copy.deepcopy(cfg)
    new["upstreams"]["api"]["endpoints"] = [b.endpoint]
    rg.reload(new)
    assert {rg.get("/").headers["X-Upstream"] for _ in range(3)} == {"B"}


def test_sighup_in_flight_request_finishes_on_old_config(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    a.on_path("/slow", default=respond(200, {"X-Upstream": "A"}, b"old-config", delay=1.0))
    cfg = make_config(upstreams={"a": SLOW_OK(a), "b": b}, routes=[{"upstream": "a"}])
    rg = rg_factory(cfg)
    t = InThread(rg.get, "/slow", timeout=15)
    a.wait_requests(1)
    new = copy.deepcopy(cfg)
    new["listeners"][0]["routes"] = [{"upstream": "b"}]
    del new["upstreams"]["a"]
    rg.reload(new)
    assert rg.get("/slow").headers["X-Upstream"] == "B"      # new requests: new config
    r = t()
    assert r.status == 200 and r.body == b"old-config"
    assert r.headers["X-Upstream"] == "A"
    assert rg.running


def test_sighup_in_flight_retries_keep_old_upstream_settings(rg_factory, upstream):
    # the in-flight request keeps its config: its retries follow the old max_attempts
    upstream.push(respond(503, delay=0.6), respond(503, delay=0.3), 200)
    cfg = make_config(upstreams={"api": {"endpoints": [upstream],
                                         "retry": dict(FAST, max_attempts=3)}})
    rg = rg_factory(cfg)
    t = InThread(rg.get, "/r", timeout=15)
    upstream.wait_requests(1)
    new = copy.deepcopy(cfg)
    new["upstreams"]["api"]["retry"]["max_attempts"] = 1
    rg.reload(new)
    r = t()
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "3"
    upstream.push(503)
    r = rg.get("/after")
    assert r.status == 503 and r.headers["X-Retrygate-Attempts"] == "1"


def test_sighup_bad_config_logged_old_keeps_serving(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream})
    rg = rg_factory(cfg)
    before = rg.config_json()
    lines = rg.config_text.split("\n")
    bad_text = rg.config_text.replace("endpoints:", "endpoits:")
    bad_line = next(i for i, ln in enumerate(bad_text.split("\n"), 1) if "endpoits" in ln)
    log = rg.reload(bad_text)
    assert rg.running
    assert str(rg.config_path) in log
    assert re.search(r"%s:%d:\d+: " % (re.escape(str(rg.config_path)), bad_line), log), log
    assert rg.ready() == 200
    assert rg.get("/still").status == 200
    assert rg.config_json() == before
    # and a later good config is taken
    rg.reload("\n".join(lines).replace("workers: 1", "workers: 1\naccess_log: \"off\""))
    assert rg.get("/again").status == 200
    assert len(lines) > 3


def test_sighup_unparseable_yaml_keeps_serving(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream})
    log = rg.reload("listeners: [\n  - {oops\n")
    assert rg.running and rg.get("/").status == 200
    assert "error" in log.lower() or "fail" in log.lower(), log


def test_sighup_keeps_budget_by_upstream_name(rg_factory, upstream):
    retry = dict(FAST, max_attempts=2, budget={"ratio": 0.0, "min_per_second": 0,
                                               "max_tokens": 5})
    cfg = make_config(upstreams={"api": {"endpoints": [upstream], "retry": retry}})
    rg = rg_factory(cfg)
    upstream.set_default(503)
    for _ in range(3):
        rg.get("/spend")
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(2, abs=0.01)
    new = copy.deepcopy(cfg)
    new["upstreams"]["api"]["retry"]["per_try_timeout"] = "900ms"     # a real change
    rg.reload(new)
    assert rg.config_json()["upstreams"]["api"]["retry"]["per_try_timeout"] in ("900ms", 900)
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(2, abs=0.01)
    # counters keep counting across the reload too
    assert rg.metric("retrygate_upstream_requests_total", upstream="api") == 3


def test_sighup_keeps_hold_by_upstream_name(rg_factory, upstream):
    from harness import retry_after
    cfg = make_config(upstreams={"api": {"endpoints": [upstream],
                                         "retry": dict(FAST, max_attempts=1)}})
    rg = rg_factory(cfg)
    upstream.push(retry_after(30))
    assert rg.get("/hold").status == 503
    held = rg.stats()["upstreams"]["api"]["held_endpoints"]
    assert upstream.endpoint in held
    new = copy.deepcopy(cfg)
    new["upstreams"]["api"]["connect_timeout"] = "300ms"
    rg.reload(new)
    held = rg.stats()["upstreams"]["api"]["held_endpoints"]
    assert upstream.endpoint in held, held


# ------------------------------------------------------------------------------- drain

def test_sigterm_drain_in_flight_finishes_ready_503_exit_0(rg_factory, upstream):
    upstream.on_path("/slow", default=respond(200, body=b"finished", delay=1.5))
    rg = rg_factory(upstreams={"api": SLOW_OK(upstream)}, drain_timeout="10s")
    t = InThread(rg.get, "/slow", timeout=15)
    upstream.wait_requests(1)
    rg.send_signal(signal.SIGTERM)
    wait_for(lambda: rg.ready() == 503, 3, what="/ready 503 while draining")
    r = rg.admin("GET", "/ready")
    assert r.status == 503 and r.body.strip() == b"draining"
    assert rg.admin("GET", "/healthz").status == 200
    # the listener is closed: a new connection is refused
    wait_for(lambda: not port_open(rg.port), 2, what="the listener to close")
    r = t()
    assert r.status == 200 and r.body == b"finished"
    assert rg.wait_exit(10) == 0


def test_sigint_drains_like_sigterm(rg_factory, upstream):
    upstream.on_path("/slow", default=respond(200, body=b"done", delay=1.0))
    rg = rg_factory(upstreams={"api": SLOW_OK(upstream)}, drain_timeout="10s")
    t = InThread(rg.get, "/slow", timeout=15)
    upstream.wait_requests(1)
    rg.send_signal(signal.SIGINT)
    wait_for(lambda: rg.ready() == 503, 3, what="/ready 503 while draining")
    assert t().body == b"done"
    assert rg.wait_exit(10) == 0


def test_drain_request_on_open_keepalive_connection_gets_connection_close(rg_factory, upstream):
    upstream.on_path("/slow", default=respond(200, body=b"slow", delay=2.0))
    rg = rg_factory(upstreams={"api": SLOW_OK(upstream)}, drain_timeout="10s")
    with RawConn(rg.port) as ka:
        ka.send(b"GET /first HTTP/1.1\r\nHost: h\r\n\r\n")
        r = ka.read_response()
        assert r.status == 200 and "close" not in r.headers.get("Connection", "").lower()
        t = InThread(rg.get, "/slow", timeout=15)        # keeps the drain going
        upstream.wait_requests(2)
        rg.send_signal(signal.SIGTERM)
        wait_for(lambda: rg.ready() == 503, 3, what="draining")
        ka.send(b"GET /during HTTP/1.1\r\nHost: h\r\n\r\n")
        r = ka.read_response(timeout=5)
        assert r.status == 200
        assert r.headers.get("Connection", "").lower() == "close"
        assert ka.wait_closed(5)
        assert t().body == b"slow"
    assert rg.wait_exit(10) == 0
    assert [q.path for q in upstream.requests] == ["/first", "/slow", "/during"]


def test_drain_busy_keepalive_connection_response_has_connection_close(rg_factory, upstream):
    # the in-flight request itself is on a keep-alive connection: its response says close
    upstream.on_path("/slow", default=respond(200, body=b"slow", delay=1.0))
    rg = rg_factory(upstreams={"api": SLOW_OK(upstream)}, drain_timeout="10s")
    with RawConn(rg.port) as c:
        c.send(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
        upstream.wait_requests(1)
        rg.send_signal(signal.SIGTERM)
        r = c.read_response(timeout=10)
        assert r.status == 200 and r.body == b"slow"
        assert r.headers.get("Connection", "").lower() == "close"
        assert c.wait_closed(5)
    assert rg.wait_exit(10) == 0


def test_drain_timeout_cuts_long_requests_and_exits_0(rg_factory, upstream):
    upstream.on_path("/forever", stall())
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream],
                                       "deadline": {"default": "30s"},
                                       "retry": {"per_try_timeout": "30s"}}},
                    drain_timeout="1s")
    c = RawConn(rg.port)
    try:
        c.send(b"GET /forever HTTP/1.1\r\nHost: h\r\n\r\n")
        upstream.wait_requests(1)
        t0 = time.monotonic()
        rg.send_signal(signal.SIGTERM)
        rc = rg.wait_exit(10)
        took = time.monotonic() - t0
        assert rc == 0
        assert 0.8 <= took < 5, took
        assert c.wait_closed(3)
    finally:
        c.close()


def test_idle_process_exits_promptly_on_sigterm(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": SLOW_OK(upstream)}, drain_timeout="10s")
    assert rg.get("/").status == 200
    t0 = time.monotonic()
    assert rg.stop() == 0
    assert time.monotonic() - t0 < 3


def test_drain_timeout_zero_does_not_wait(rg_factory, upstream):
    upstream.on_path("/slow", default=respond(200, delay=5))
    # drain_timeout 0 is "do not wait" in the reference config; a zero duration may also be
    # refused as an impossible value: accept either, but if it starts it must exit at once
    from harness import check_config
    cfg = make_config(upstreams={"api": upstream}, drain_timeout="0s")
    cp = check_config(cfg)
    if cp.returncode != 0:
        pytest.skip("drain_timeout 0 refused by --check: %s" % cp.stderr.strip())
    rg = rg_factory(cfg)
    t = InThread(lambda: rg.get("/slow", timeout=10))
    upstream.wait_requests(1)
    t0 = time.monotonic()
    rg.send_signal(signal.SIGTERM)
    assert rg.wait_exit(5) == 0
    assert time.monotonic() - t0 < 2
    t.thread.join(10)


def test_drain_with_two_workers(rg_factory, upstream):
    upstream.on_path("/slow", default=respond(200, body=b"x", delay=1.0))
    rg = rg_factory(upstreams={"api": SLOW_OK(upstream)}, workers=2, drain_timeout="10s")
    ts = [InThread(rg.get, "/slow", timeout=15) for _ in range(6)]
    upstream.wait_requests(6)
    rg.send_signal(signal.SIGTERM)
    for t in ts:
        assert t().status == 200
    assert rg.wait_exit(10) == 0


def test_sighup_keeps_in_flight_counts(rg_factory, upstream):
    gate = threading.Event()
    upstream.on_path("/hold", default=respond(200, body=b"held", hold=gate, hold_timeout=20))
    cfg = make_config(upstreams={"api": {"endpoints": [upstream],
                                         "retry": {"per_try_timeout": "10s"},
                                         "concurrency": {"max_in_flight": 1}}})
    rg = rg_factory(cfg)
    t = InThread(rg.get, "/hold", timeout=20)
    try:
        upstream.wait_requests(1)
        new = copy.deepcopy(cfg)
        new["upstreams"]["api"]["connect_timeout"] = "300ms"
        rg.reload(new)
        assert rg.metric("retrygate_upstream_in_flight", upstream="api") == 1
        r = rg.get("/second")            # the slot taken before the reload still counts
        assert r.status == 503 and r.headers["X-Retrygate-Reason"] == "overloaded"
    finally:
        gate.set()
    assert t().body == b"held"
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0


# ------------------------------------------------------------------------------- workers

def test_workers_share_the_retry_budget(rg_factory, upstream):
    """SPEC §1: one budget per upstream for the whole process, whatever the worker count."""
    upstream.set_default(503)
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream], "retry": dict(
        FAST, max_attempts=2, budget={"ratio": 0.0, "min_per_second": 0, "max_tokens": 5})}},
        workers=2)
    results = []

    def one(i):
        results.append(rg.get("/b%d" % i).headers["X-Retrygate-Attempts"])
    ts = [threading.Thread(target=one, args=(i,)) for i in range(20)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(20)
    assert len(results) == 20
    assert results.count("2") == 5, results          # exactly max_tokens retries in all
    assert rg.metric("retrygate_upstream_retries_total", upstream="api") == 5
    assert rg.metric("retrygate_upstream_retries_refused_total", upstream="api",
                     reason="budget") == 15


def test_workers_share_the_in_flight_cap(rg_factory, upstream):
    gate = threading.Event()
    upstream.on_path("/hold", default=respond(200, hold=gate, hold_timeout=20))
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream],
                                       "retry": {"per_try_timeout": "10s"},
                                       "concurrency": {"max_in_flight": 2}}}, workers=2)
    held = [InThread(rg.get, "/hold", timeout=20) for _ in range(2)]
    try:
        upstream.wait_requests(2)
        statuses = [rg.get("/hold").status for _ in range(8)]    # 8 more connections
        assert statuses == [503] * 8, statuses
    finally:
        gate.set()
    for t in held:
        assert t().status == 200
    assert rg.metric("retrygate_upstream_rejected_total", upstream="api",
                     reason="overloaded") == 8


def test_workers_share_the_runtime_switch(rg_factory, upstream):
    upstream.set_default(503)
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream], "retry": dict(FAST)}},
                    workers=2)
    assert rg.set_retries(False, "api").status == 200
    for i in range(10):                              # fresh connections, either worker
        r = rg.get("/s%d" % i)
        assert r.headers["X-Retrygate-Attempts"] == "1"
        assert r.headers["X-Retrygate-Retry-Refused"] == "disabled"
