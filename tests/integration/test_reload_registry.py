"""SIGHUP and the upstream registry (SPEC §1): state of endpoint and upstream names that are no
longer configured is forgotten once no request uses it, so many reloads with changing endpoints
neither crash (the registry once held at most 64 endpoint names per upstream, then handed out
NULL) nor grow memory; per-upstream state is still kept by name while the upstream stays."""

import copy
import re
import signal
import threading
import time

import pytest

from harness import free_port, http_request, make_config, respond, rss_bytes, wait_for

pytestmark = pytest.mark.timeout(180)

MIB = 1024 * 1024
# ASan keeps freed memory in a quarantine (256 MiB by default): keep it small, so that RSS
# shows what is still allocated; its allocator and shadow still cost more than the real one
SAN_ENV = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0:quarantine_size_mb=1:"
                           "malloc_context_size=5"}


def rss_growth_limit(pid):
    """8 MiB; 32 MiB when the process runs with ASan's runtime (see SAN_ENV)."""
    with open("/proc/%d/maps" % pid) as f:
        asan = "libasan" in f.read()
    return (32 if asan else 8) * MIB


def report(name, **figures):
    print("\n[figures] %s: %s" % (name, ", ".join("%s=%s" % kv for kv in figures.items())))


def with_endpoints(cfg, *endpoints):
    new = copy.deepcopy(cfg)
    new["upstreams"]["api"]["endpoints"] = list(endpoints)
    return new


def test_70_reloads_with_new_endpoint_ports_then_a_request(rg_factory, upstream_factory):
    first, last = upstream_factory(name="first"), upstream_factory(name="last")
    cfg = make_config(upstreams={"api": {"endpoints": [first]}})
    rg = rg_factory(cfg)
    assert rg.get("/first").status == 200
    for _ in range(70):
        log = rg.reload(with_endpoints(cfg, "127.0.0.1:%d" % free_port()))
        assert "fail" not in log.lower(), log
    rg.reload(with_endpoints(cfg, last.endpoint))      # a 72nd endpoint name
    r = rg.get("/after")
    assert r.status == 200, r
    assert r.headers["X-Upstream"] == "last"
    assert [q.path for q in last.wait_requests(1)] == ["/after"]
    assert rg.running
    # only the configured endpoint is left in the registry
    assert list(rg.stats()["upstreams"]) == ["api"]


def test_200_reloads_under_load_no_failure_rss_flat(rg_factory, upstream_factory):
    # one upstream on every loopback address: 127.0.0.N:PORT is a new endpoint name each time,
    # and every one of them is live
    up = upstream_factory(host="0.0.0.0")
    name = lambda i: "127.0.0.%d:%d" % (2 + i % 250, up.port)
    cfg = make_config(upstreams={"api": {"endpoints": [name(0)]}})
    rg = rg_factory(cfg, env=SAN_ENV)
    stop = threading.Event()
    results = {"ok": 0, "failed": []}

    def client():
        while not stop.is_set():
            try:
                r = http_request(rg.port, "GET", "/load", timeout=10)
                if r.status == 200:
                    results["ok"] += 1
                else:
                    results["failed"].append((r.status, r.headers.get("X-Retrygate-Reason")))
            except Exception as e:          # noqa: BLE001 - any failure is one
                results["failed"].append(repr(e))

    t = threading.Thread(target=client, daemon=True)
    t.start()
    try:
        rss = {}
        for i in range(1, 201):
            log = rg.reload(with_endpoints(cfg, name(i)))
            assert "fail" not in log.lower(), log
            if i == 20:
                rss["warm"] = rss_bytes(rg.pid)
        time.sleep(0.3)
        rss["end"] = rss_bytes(rg.pid)
    finally:
        stop.set()
        t.join(15)
    report("200-reloads", requests_ok=results["ok"], failed=len(results["failed"]),
           rss_after_20_reloads_mib="%.1f" % (rss["warm"] / MIB),
           rss_after_200_reloads_mib="%.1f" % (rss["end"] / MIB),
           growth_mib="%.2f" % ((rss["end"] - rss["warm"]) / MIB))
    assert rg.running
    assert results["ok"] > 50, results["ok"]
    assert not results["failed"], results["failed"][:10]
    assert rss["end"] - rss["warm"] < rss_growth_limit(rg.pid), rss
    st = rg.stats()["upstreams"]["api"]
    assert st["requests"] >= results["ok"]
    r = rg.get("/last")
    assert r.status == 200


def test_endpoint_of_an_in_flight_request_outlives_the_reload(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    a.on_path("/slow", default=respond(200, {"X-Upstream": "A"}, b"old", delay=1.0))
    cfg = make_config(upstreams={"api": {"endpoints": [a],
                                         "retry": {"per_try_timeout": "5s"}}})
    rg = rg_factory(cfg)
    got = {}
    t = threading.Thread(target=lambda: got.update(r=rg.get("/slow", timeout=15)))
    t.start()
    a.wait_requests(1)
    for _ in range(5):               # the old endpoint leaves the config while still in use
        rg.reload(with_endpoints(cfg, "127.0.0.1:%d" % free_port()))
    rg.reload(with_endpoints(cfg, b.endpoint))
    assert rg.get("/new").headers["X-Upstream"] == "B"
    t.join(15)
    assert got["r"].status == 200 and got["r"].body == b"old"
    assert rg.running


def test_runtime_switch_and_budget_kept_by_name_fresh_after_removal(rg_factory, upstream):
    retry = {"backoff": {"base": "1ms", "max": "2ms"}, "max_attempts": 2,
             "budget": {"ratio": 0.0, "min_per_second": 0, "max_tokens": 5}}
    cfg = make_config(upstreams={"api": {"endpoints": [upstream], "retry": retry},
                                 "other": {"endpoints": [upstream]}},
                      routes=[{"upstream": "api"}])
    rg = rg_factory(cfg)
    upstream.on_path("/spend", default=503)
    rg.get("/spend")
    assert rg.set_retries(False, "api").status == 200
    rg.reload(with_endpoints(cfg, "127.0.0.1:%d" % free_port(), upstream.endpoint))
    assert rg.retries()["api"] is False
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(4, abs=0.01)
    # removed, then configured again: a new upstream, fresh state
    gone = copy.deepcopy(cfg)
    del gone["upstreams"]["api"]
    gone["listeners"][0]["routes"] = [{"upstream": "other"}]
    rg.reload(gone)
    # forgotten once no runtime binds it: the worker drops its old one at its next request
    wait_for(lambda: rg.get("/other").status and "api" not in rg.stats()["upstreams"], 5,
             what="upstream api forgotten")
    rg.reload(cfg)
    assert rg.retries()["api"] is True
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(5, abs=0.01)


def test_80_quick_reloads_each_with_a_new_endpoint_all_succeed(rg_factory, upstream_factory):
    # SPEC §1 refuses only a bad config: addresses retired by the previous reloads, with
    # nothing in flight, must not use up the room a valid config needs (there were 64 slots,
    # each kept 2 s after its address left)
    last = upstream_factory(name="last")
    cfg = make_config(upstreams={"api": {"endpoints": ["127.0.0.1:%d" % free_port()]}})
    rg = rg_factory(cfg, env=SAN_ENV)
    t0 = time.monotonic()
    for i in range(80):
        endpoint = last.endpoint if i == 79 else "127.0.0.1:%d" % free_port()
        rg.write_config(with_endpoints(cfg, endpoint), keep_ports=True)
        start = len(rg.stderr_text())
        rg.send_signal(signal.SIGHUP)
        log = wait_for(lambda: re.search(r"reloaded|failed", rg.stderr_text()[start:]) and
                       rg.stderr_text()[start:], 5, 0.002, "reload %d logged" % (i + 1))
        assert "failed" not in log, "reload %d: %s" % (i + 1, log)
    elapsed = time.monotonic() - t0
    report("80-quick-reloads", seconds="%.2f" % elapsed)
    assert elapsed < 2, "too slow to prove anything: the retired addresses were freed"
    r = rg.get("/after")
    assert r.status == 200 and r.headers["X-Upstream"] == "last", r
    assert rg.running
