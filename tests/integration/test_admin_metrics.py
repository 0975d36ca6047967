"""Observability (issue 7), SPEC §7: /metrics (Prometheus text 0.0.4, checked by promtool),
every metric name with HELP and TYPE, each metric moving as its definition says, /stats with
the same figures, /config with secrets redacted, the /retries kill switch, and scrape latency
under load."""

import copy
import re
import shutil
import socket
import subprocess
import threading
import time

import pytest

from harness import (RawConn, http_request, make_config, parse_metrics, reset, respond,
                     retry_after, stall, upstream_block, wait_for)

pytestmark = pytest.mark.timeout(90)

# SPEC §7: name -> (type, label besides "upstream", allowed values of that label)
SPEC_METRICS = {
    "retrygate_downstream_connections_active": ("gauge", None, None),
    "retrygate_downstream_requests_total": ("counter", "code", {"2xx", "3xx", "4xx", "5xx"}),
    "retrygate_upstream_requests_total": ("counter", None, None),
    "retrygate_upstream_attempts_total": ("counter", None, None),
    "retrygate_upstream_retries_total": ("counter", None, None),
    "retrygate_upstream_retries_refused_total": ("counter", "reason", {
        "max-attempts", "non-idempotent", "body-too-large", "deadline", "retry-after", "budget",
        "retries-in-flight", "nested", "disabled"}),
    "retrygate_upstream_rejected_total": ("counter", "reason", {"overloaded",
                                                                 "deadline-exceeded"}),
    "retrygate_upstream_responses_total": ("counter", "code", {"2xx", "3xx", "4xx", "5xx"}),
    "retrygate_upstream_outcomes_total": ("counter", "outcome", {"connect-failure", "reset",
                                                                 "timeout"}),
    "retrygate_upstream_in_flight": ("gauge", None, None),
    "retrygate_upstream_retry_budget_tokens": ("gauge", None, None),
    "retrygate_upstream_request_duration_seconds": ("histogram", None, None),
    "retrygate_idempotency_total": ("counter", "result", {"stored", "replayed", "conflict",
                                                          "mismatch"}),
    # SPEC §10: every grpc-status by name, at 0 until a gRPC attempt ends with it
    "retrygate_upstream_grpc_responses_total": ("counter", "status", {
        "ok", "cancelled", "unknown", "invalid-argument", "deadline-exceeded", "not-found",
        "already-exists", "permission-denied", "resource-exhausted", "failed-precondition",
        "aborted", "out-of-range", "unimplemented", "internal", "unavailable", "data-loss",
        "unauthenticated"}),
}
NO_UPSTREAM_LABEL = {"retrygate_downstream_connections_active",
                     "retrygate_downstream_requests_total"}


def m(rg, name, **labels):
    return rg.metric(name, **labels)


def families(text):
    """{name: {"help": str, "type": str}} from # HELP / # TYPE lines."""
    out = {}
    for ln in text.splitlines():
        mm = re.match(r"^# (HELP|TYPE) (\S+) ?(.*)$", ln)
        if mm:
            out.setdefault(mm.group(2), {})[mm.group(1).lower()] = mm.group(3)
    return out


# ------------------------------------------------------------------------------- promtool

def _all_kinds_of_traffic(rg, up, refusing):
    """Drive every kind of outcome through rg (upstreams "api" -> up, "down" -> refusing)."""
    up.on_path("/retry", 503, default=200)
    up.on_path("/fail", default=503)
    up.on_path("/404", default=404)
    up.on_path("/301", default=respond(301, {"Location": "/x"}))
    up.on_path("/reset", default=reset())
    up.on_path("/stall", default=stall())
    up.on_path("/early", default=respond(200, body=b"x", interim=[103]))
    up.on_path("/ra", default=retry_after(1))
    assert rg.get("/ok", {"Host": "api"}).status == 200
    assert rg.get("/retry", {"Host": "api"}).status == 200
    assert rg.get("/fail", {"Host": "api"}).status == 503
    assert rg.post("/fail", b"body", {"Host": "api"}).status == 503       # non-idempotent
    assert rg.get("/404", {"Host": "api"}).status == 404
    assert rg.get("/301", {"Host": "api"}).status == 301
    assert rg.get("/reset", {"Host": "api"}).status == 502
    assert rg.get("/stall", {"Host": "api", "X-Timeout-Ms": "400"}).status == 504
    assert rg.get("/x", {"Host": "api", "X-Timeout-Ms": "0"}).status == 504
    assert rg.get("/x", {"Host": "api", "X-Timeout-Ms": "zz"}).status == 400
    assert rg.get("/ra", {"Host": "api"}).status == 503
    assert rg.get("/x", {"Host": "nowhere"}).status == 404
    assert rg.get("/x", {"Host": "down"}).status == 502
    with RawConn(rg.port) as c:
        c.send(b"GET /early HTTP/1.1\r\nHost: api\r\n\r\n")
        assert c.read_response().status == 200
    data, _ = rg.raw(b"GET / HTTP/1.1\r\n\r\n")                         # no Host: 400
    assert data.startswith(b"HTTP/1.1 400")


def test_promtool_check_metrics_after_all_traffic(rg_factory, upstream, refusing):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "150ms"}),
                               "down": upstream_block(refusing)})
    text0 = rg.metrics_text()
    cp = subprocess.run([promtool, "check", "metrics"], input=text0, capture_output=True,
                        text=True, timeout=30)
    assert cp.returncode == 0 and not cp.stdout.strip() and not cp.stderr.strip(), \
        (cp.stdout, cp.stderr)
    _all_kinds_of_traffic(rg, upstream, refusing)
    text = rg.metrics_text()
    cp = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                        text=True, timeout=30)
    assert cp.returncode == 0, (cp.stdout, cp.stderr)
    assert not cp.stdout.strip() and not cp.stderr.strip(), (cp.stdout, cp.stderr)


def test_metrics_content_type_and_format(rg):
    r = rg.admin("GET", "/metrics")
    assert r.status == 200
    ct = r.headers.get("Content-Type", "")
    assert ct.startswith("text/plain") and "version=0.0.4" in ct, ct
    assert r.body.endswith(b"\n")
    parse_metrics(r.text)          # every line parses


# ------------------------------------------------------------------------------- names

def test_every_spec_metric_has_help_type_and_labels(rg_factory, upstream, refusing):
    rg = rg_factory(upstreams={"api": upstream_block(upstream), "down": upstream_block(refusing)})
    rg.get("/", {"Host": "api"})
    text = rg.metrics_text()
    fam = families(text)
    mx = parse_metrics(text)
    for name, (typ, label, values) in SPEC_METRICS.items():
        assert name in fam, "no # HELP/# TYPE for %s" % name
        assert fam[name].get("type") == typ, (name, fam[name])
        assert fam[name].get("help", "").strip(), "empty HELP for %s" % name
        series_name = name + "_count" if typ == "histogram" else name
        series = mx.series(series_name)
        assert series, "no samples for %s" % series_name
        for labels, _ in series:
            if name in NO_UPSTREAM_LABEL:
                assert "upstream" not in labels, (name, labels)
            else:
                assert labels.get("upstream") in ("api", "down"), (name, labels)
            if label:
                assert labels.get(label) in values or (label == "code" and labels.get(label)
                                                       == "1xx"), (name, labels)
        if name not in NO_UPSTREAM_LABEL:
            assert {ls["upstream"] for ls, _ in series} == {"api", "down"}, name
        if label:
            # every documented label value is exported (at 0 before it happens), so rate()
            # and absent() work from the first scrape
            for up in (["api", "down"] if name not in NO_UPSTREAM_LABEL else [None]):
                got = {ls.get(label) for ls, _ in series
                       if up is None or ls.get("upstream") == up}
                assert values <= got, (name, up, values - got)


def test_histogram_is_well_formed(rg_factory, upstream):
    upstream.on_path("/d300", default=respond(200, delay=0.3))
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    rg.get("/fast")
    rg.get("/d300")
    mx = rg.metrics()
    buckets = sorted(((float(ls["le"]) if ls["le"] != "+Inf" else float("inf")), v)
                     for ls, v in mx.series("retrygate_upstream_request_duration_seconds_bucket")
                     if ls["upstream"] == "api")
    assert buckets[-1][0] == float("inf")
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "buckets not cumulative"
    count = mx.value("retrygate_upstream_request_duration_seconds_count", upstream="api")
    s = mx.value("retrygate_upstream_request_duration_seconds_sum", upstream="api")
    assert buckets[-1][1] == count == 2
    assert 0.3 <= s < 2.0, s
    # the 0.3 s request is above 0.25 and below 1 (bucket bounds around it, if exported)
    le = dict(buckets)
    below = [v for b, v in buckets if b < 0.3]
    above = [v for b, v in buckets if b >= 0.5]
    assert below and max(below) <= 1, buckets
    assert above and min(above) == 2, buckets
    assert le[float("inf")] == 2


# ------------------------------------------------------------------------------- scenarios

def test_duration_histogram_includes_waits_between_attempts(rg_factory, upstream):
    # client-visible duration: the Retry-After wait before the retry is part of it
    upstream.push(retry_after(1), 200)
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    t0 = time.monotonic()
    r = rg.get("/ra")
    took = time.monotonic() - t0
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "2"
    mx = rg.metrics()
    assert mx.value("retrygate_upstream_request_duration_seconds_count", upstream="api") == 1
    s = mx.value("retrygate_upstream_request_duration_seconds_sum", upstream="api")
    assert 1.0 <= s <= took + 0.05, (s, took)
    le1 = mx.value("retrygate_upstream_request_duration_seconds_bucket", upstream="api",
                   le="0.5")
    assert le1 == 0


def test_requests_attempts_retries_responses(rg_factory, upstream):
    upstream.push(503, 200, 502, 503, 200, 200)
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    assert rg.get("/a").status == 200        # 503, 200   -> 2 attempts
    assert rg.get("/b").status == 200        # 502,503,200 -> 3 attempts
    assert rg.get("/c").status == 200        # 200        -> 1 attempt
    assert m(rg, "retrygate_upstream_requests_total", upstream="api") == 3
    assert m(rg, "retrygate_upstream_attempts_total", upstream="api") == 6
    assert m(rg, "retrygate_upstream_retries_total", upstream="api") == 3
    assert m(rg, "retrygate_upstream_responses_total", upstream="api", code="5xx") == 3
    assert m(rg, "retrygate_upstream_responses_total", upstream="api", code="2xx") == 3
    assert m(rg, "retrygate_upstream_responses_total", upstream="api", code="4xx") == 0
    assert m(rg, "retrygate_downstream_requests_total", code="2xx") == 3
    assert m(rg, "retrygate_downstream_requests_total", code="5xx") == 0
    assert m(rg, "retrygate_upstream_request_duration_seconds_count", upstream="api") == 3
    assert m(rg, "retrygate_upstream_in_flight", upstream="api") == 0


def test_outcomes_by_kind(rg_factory, upstream, refusing):
    upstream.on_path("/reset", default=reset())
    upstream.on_path("/stall", default=stall())
    rg = rg_factory(upstreams={
        "api": upstream_block(upstream, retry={"max_attempts": 2, "per_try_timeout": "200ms"}),
        "down": upstream_block(refusing, retry={"max_attempts": 2})})
    assert rg.get("/reset", {"Host": "api"}).status == 502
    assert rg.get("/stall", {"Host": "api"}).status == 504
    assert rg.get("/x", {"Host": "down"}).status == 502
    mx = rg.metrics()
    assert mx.value("retrygate_upstream_outcomes_total", upstream="api", outcome="reset") == 2
    assert mx.value("retrygate_upstream_outcomes_total", upstream="api", outcome="timeout") == 2
    assert mx.value("retrygate_upstream_outcomes_total", upstream="api",
                    outcome="connect-failure") == 0
    assert mx.value("retrygate_upstream_outcomes_total", upstream="down",
                    outcome="connect-failure") == 2
    assert mx.value("retrygate_upstream_attempts_total", upstream="api") == 4
    assert mx.value("retrygate_upstream_requests_total", upstream="down") == 1
    assert mx.value("retrygate_upstream_attempts_total", upstream="down") == 2
    # an attempt without a response is not a response
    assert mx.value("retrygate_upstream_responses_total", upstream="api") == 0
    assert mx.value("retrygate_downstream_requests_total", code="5xx") == 3


def test_rejected_overloaded_and_deadline_exceeded(rg_factory, upstream):
    gate = threading.Event()
    upstream.on_path("/hold", default=respond(200, body=b"held", hold=gate, hold_timeout=20))
    rg = rg_factory(upstreams={"api": upstream_block(upstream, concurrency={"max_in_flight": 1},
                                                   retry={"per_try_timeout": "10s"})})
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("r", rg.get("/hold", timeout=20)))
    t.start()
    try:
        upstream.wait_requests(1)
        assert rg.wait_metric("retrygate_upstream_in_flight", 1, upstream="api") == 1
        r = rg.get("/second")
        assert r.status == 503 and r.headers["X-Retrygate-Reason"] == "overloaded"
        assert r.headers.get("Retry-After") == "1"
        assert m(rg, "retrygate_upstream_rejected_total", upstream="api",
                 reason="overloaded") == 1
    finally:
        gate.set()
        t.join(20)
    assert box["r"].status == 200
    r = rg.get("/late", {"X-Timeout-Ms": "0"})
    assert r.status == 504 and r.headers["X-Retrygate-Reason"] == "deadline-exceeded"
    assert r.headers["X-Retrygate-Attempts"] == "0"
    mx = rg.metrics()
    assert mx.value("retrygate_upstream_rejected_total", upstream="api",
                    reason="deadline-exceeded") == 1
    assert mx.value("retrygate_upstream_rejected_total", upstream="api", reason="overloaded") == 1
    # rejected requests made no first attempt
    assert mx.value("retrygate_upstream_requests_total", upstream="api") == 1
    assert mx.value("retrygate_upstream_attempts_total", upstream="api") == 1
    assert mx.value("retrygate_upstream_in_flight", upstream="api") == 0
    assert mx.value("retrygate_downstream_requests_total", code="5xx") == 2
    assert mx.value("retrygate_downstream_requests_total", code="2xx") == 1
    # the histogram counts the requests that made an attempt, like requests_total
    assert mx.value("retrygate_upstream_request_duration_seconds_count", upstream="api") == 1


def test_downstream_requests_by_code_include_own_responses(rg_factory, upstream):
    upstream.on_path("/302", default=respond(302, {"Location": "/"}))
    upstream.on_path("/418", default=418)
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, routes=[{"path_prefix": "/",
                                                                        "host": "api",
                                                                        "upstream": "api"}])
    rg.get("/ok", {"Host": "api"})
    rg.get("/302", {"Host": "api"})
    rg.get("/418", {"Host": "api"})
    rg.get("/none", {"Host": "other"})                           # 404 no-route, ours
    rg.raw(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")      # 400, ours
    for _ in range(3):                                           # admin: not counted
        rg.admin("GET", "/healthz")
    mx = rg.metrics()
    assert mx.value("retrygate_downstream_requests_total", code="2xx") == 1
    assert mx.value("retrygate_downstream_requests_total", code="3xx") == 1
    assert mx.value("retrygate_downstream_requests_total", code="4xx") == 3
    assert mx.value("retrygate_downstream_requests_total", code="5xx") == 0


def test_downstream_connections_active(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    assert m(rg, "retrygate_downstream_connections_active") == 0
    conns = [RawConn(rg.port) for _ in range(3)]
    try:
        conns[0].send(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n")
        conns[0].read_response()
        assert rg.wait_metric("retrygate_downstream_connections_active", 3, op="==") == 3
    finally:
        for c in conns:
            c.close()
    assert rg.wait_metric("retrygate_downstream_connections_active", 0, op="==") == 0
    # admin connections do not count: a held-open admin connection leaves it at 0
    with socket.create_connection(("127.0.0.1", rg.admin_port)):
        time.sleep(0.1)
        assert m(rg, "retrygate_downstream_connections_active") == 0


def test_in_flight_gauge_rises_and_returns_to_zero(rg_factory, upstream):
    gate = threading.Event()
    upstream.on_path("/hold", default=respond(200, hold=gate, hold_timeout=20))
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "10s"})})
    ts = [threading.Thread(target=rg.get, args=("/hold",), kwargs={"timeout": 20})
          for _ in range(3)]
    for t in ts:
        t.start()
    try:
        upstream.wait_requests(3)
        assert rg.wait_metric("retrygate_upstream_in_flight", 3, op="==", upstream="api") == 3
        assert rg.stats()["upstreams"]["api"]["in_flight"] == 3
    finally:
        gate.set()
        for t in ts:
            t.join(20)
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0
    # also after failures of every kind
    upstream.on_path("/r", default=reset())
    rg.get("/r")
    rg.get("/s", {"X-Timeout-Ms": "0"})
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0


def test_in_flight_returns_to_zero_after_client_abort(rg_factory, upstream):
    upstream.on_path("/stall", default=stall())
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "10s"})})
    c = RawConn(rg.port)
    c.send(b"GET /stall HTTP/1.1\r\nHost: h\r\n\r\n")
    upstream.wait_requests(1)
    assert rg.wait_metric("retrygate_upstream_in_flight", 1, op="==", upstream="api") == 1
    c.close()
    assert rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api") == 0


def test_retry_budget_tokens_decrease_by_one_per_retry(rg_factory, upstream):
    budget = {"ratio": 0.0, "min_per_second": 0, "max_tokens": 10}
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"budget": budget})})
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") == 10
    upstream.push(503, 200)                                        # 1 retry
    rg.get("/1")
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(9, abs=1e-3)
    upstream.push(503, 503, 200)                                   # 2 retries
    rg.get("/2")
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(7, abs=1e-3)
    rg.get("/3")                                                   # no retry: no change
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(7, abs=1e-3)
    assert m(rg, "retrygate_upstream_retries_total", upstream="api") == 3


def test_retry_budget_tokens_ratio_deposit_and_refusal(rg_factory, upstream):
    budget = {"ratio": 0.5, "min_per_second": 0, "max_tokens": 2}
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"budget": budget})})
    upstream.push(503, 503, 200)                       # 2 retries: first attempt +0.5 (capped)
    assert rg.get("/a").status == 200
    tok = m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api")
    assert tok == pytest.approx(0.0, abs=1e-3)
    rg.get("/b")                                       # a first attempt adds ratio tokens
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(0.5, abs=1e-3)
    upstream.push(503, 503)                            # +0.5 -> 1.0: one retry, not two
    r = rg.get("/c")
    assert r.status == 503 and r.headers["X-Retrygate-Attempts"] == "2"
    assert r.headers.get("X-Retrygate-Retry-Refused") == "budget"
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(0.0, abs=1e-3)
    assert m(rg, "retrygate_upstream_retries_refused_total", upstream="api",
             reason="budget") == 1
    upstream.push(503)                                 # 0.5 tokens: no whole token
    r = rg.get("/d")
    assert r.status == 503 and r.headers.get("X-Retrygate-Retry-Refused") == "budget"
    assert r.headers["X-Retrygate-Attempts"] == "1"
    assert m(rg, "retrygate_upstream_retries_refused_total", upstream="api",
             reason="budget") == 2
    assert m(rg, "retrygate_upstream_retries_total", upstream="api") == 3


def test_retry_budget_refills_with_time(rg_factory, upstream):
    budget = {"ratio": 0.0, "min_per_second": 10, "max_tokens": 3}
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"budget": budget,
                                                                     "max_attempts": 4})})
    upstream.push(503, 503, 503, 200)
    rg.get("/spend")
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") < 1
    time.sleep(0.5)
    tok = m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api")
    assert tok >= 2.5, tok
    assert tok <= 3.0                                  # never above max_tokens
    time.sleep(0.2)
    assert m(rg, "retrygate_upstream_retry_budget_tokens", upstream="api") == \
        pytest.approx(3, abs=1e-3)


def test_retries_refused_reasons_counted(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"max_attempts": 2})})
    upstream.push(503, 503)
    r = rg.get("/max")
    assert r.headers.get("X-Retrygate-Retry-Refused") == "max-attempts"
    upstream.push(503)
    r = rg.post("/post", b"x")
    assert r.headers.get("X-Retrygate-Retry-Refused") == "non-idempotent"
    upstream.push(respond(503, {"X-Retrygate-Attempts": "2"}))
    r = rg.get("/nested")
    assert r.headers.get("X-Retrygate-Retry-Refused") == "nested"
    assert rg.set_retries(False, "api").status == 200
    upstream.push(503)
    r = rg.get("/off")
    assert r.headers.get("X-Retrygate-Retry-Refused") == "disabled"
    mx = rg.metrics()
    for reason in ("max-attempts", "non-idempotent", "nested", "disabled"):
        assert mx.value("retrygate_upstream_retries_refused_total", upstream="api",
                        reason=reason) == 1, reason
    assert mx.value("retrygate_upstream_retries_refused_total", upstream="api") == 4
    # a response not in retry.on is not a refusal
    upstream.push(404)
    assert rg.get("/404").status == 404
    assert m(rg, "retrygate_upstream_retries_refused_total", upstream="api") == 4


def test_idempotency_counters(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream, idempotency={"enabled": True})})
    h = {"Idempotency-Key": "k-1", "Content-Type": "text/plain"}
    assert rg.post("/pay", b"one", h).status == 200
    r = rg.post("/pay", b"one", h)
    assert r.status == 200 and r.headers.get("Idempotency-Replayed") == "true"
    assert rg.post("/pay", b"two", h).status == 422
    mx = rg.metrics()
    assert mx.value("retrygate_idempotency_total", upstream="api", result="stored") == 1
    assert mx.value("retrygate_idempotency_total", upstream="api", result="replayed") == 1
    assert mx.value("retrygate_idempotency_total", upstream="api", result="mismatch") == 1
    assert len(upstream.requests) == 1


def test_idempotency_conflict_counter(rg_factory, upstream):
    gate = threading.Event()
    upstream.on_path("/slow", default=respond(200, hold=gate, hold_timeout=20))
    rg = rg_factory(upstreams={"api": upstream_block(upstream, idempotency={"enabled": True},
                                                   retry={"per_try_timeout": "10s"})})
    h = {"Idempotency-Key": "k-2"}
    t = threading.Thread(target=rg.post, args=("/slow", b"b", h), kwargs={"timeout": 20})
    t.start()
    try:
        upstream.wait_requests(1)
        assert rg.post("/slow", b"b", h).status == 409
    finally:
        gate.set()
        t.join(20)
    assert m(rg, "retrygate_idempotency_total", upstream="api", result="conflict") == 1


# ------------------------------------------------------------------------------- /stats

def test_stats_has_the_same_figures_as_metrics(rg_factory, upstream, refusing):
    upstream.push(503, 200, respond(200, delay=0.05), reset(), 200, 404)
    still = {"budget": {"min_per_second": 0}}          # tokens do not move between scrapes
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry=still),
                               "down": upstream_block(refusing, retry=still)})
    rg.get("/a", {"Host": "api"})
    rg.get("/b", {"Host": "api"})
    rg.get("/c", {"Host": "api"})
    rg.get("/d", {"Host": "api"})
    rg.get("/e", {"Host": "down"})
    rg.get("/f", {"Host": "nowhere"})
    rg.get("/g", {"Host": "api", "X-Timeout-Ms": "0"})
    # the clients' connections close asynchronously: compare once the gauge has settled
    wait_for(lambda: rg.metric("retrygate_downstream_connections_active") == 0, 10,
             what="client connections closed")
    mx = rg.metrics()
    st = rg.stats()
    ds = st["downstream"]
    assert ds["connections_active"] == mx.value("retrygate_downstream_connections_active")
    for code in ("2xx", "3xx", "4xx", "5xx"):
        assert ds["requests"][code] == mx.value("retrygate_downstream_requests_total", code=code)
    for name in ("api", "down"):
        u = st["upstreams"][name]
        assert u["requests"] == mx.value("retrygate_upstream_requests_total", upstream=name)
        assert u["attempts"] == mx.value("retrygate_upstream_attempts_total", upstream=name)
        assert u["retries"] == mx.value("retrygate_upstream_retries_total", upstream=name)
        for fam, metric, label in (
                ("refused", "retrygate_upstream_retries_refused_total", "reason"),
                ("rejected", "retrygate_upstream_rejected_total", "reason"),
                ("responses", "retrygate_upstream_responses_total", "code"),
                ("outcomes", "retrygate_upstream_outcomes_total", "outcome"),
                ("idem", "retrygate_idempotency_total", "result")):
            for k, v in u[fam].items():
                assert v == mx.value(metric, upstream=name, **{label: k}), (name, fam, k)
        assert u["in_flight"] == mx.value("retrygate_upstream_in_flight", upstream=name)
        assert u["retry_budget_tokens"] == pytest.approx(
            mx.value("retrygate_upstream_retry_budget_tokens", upstream=name), abs=1e-3)
        assert u["duration_count"] == mx.value(
            "retrygate_upstream_request_duration_seconds_count", upstream=name)
    assert st["upstreams"]["api"]["requests"] == 4          # /g made no attempt
    assert st["upstreams"]["down"]["outcomes"]["connect-failure"] == 3


def test_stats_amplification_last_minute(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)})
    upstream.push(503, 200, 503, 503, 200, 200, 200)
    for p in ("/1", "/2", "/3", "/4"):
        assert rg.get(p).status == 200
    u = rg.stats()["upstreams"]["api"]
    # 4 requests, 7 attempts
    assert u["amplification_1m"] == pytest.approx(7 / 4, abs=1e-3)
    assert u["requests_1m"] == 4 and u["attempts_1m"] == 7


def test_stats_held_endpoints_with_hold_time(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    rg = rg_factory(upstreams={"api": upstream_block([a, b])})
    st = rg.stats()["upstreams"]["api"]
    assert st["held_endpoints"] == {}
    a.push(retry_after(5))
    b.push(retry_after(5))
    # round robin: the first request goes to a; its retry to b; the hold ends past the max
    r = rg.get("/")
    assert r.status in (200, 503)
    held = rg.stats()["upstreams"]["api"]["held_endpoints"]
    assert a.endpoint in held or b.endpoint in held, held
    for ep, h in held.items():
        ms = h["hold_ms_left"] if isinstance(h, dict) else h
        assert 3000 < ms <= 5000, held


def test_stats_per_upstream_budget_and_in_flight(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={
        "budget": {"max_tokens": 7, "ratio": 0, "min_per_second": 0}})})
    u = rg.stats()["upstreams"]["api"]
    assert u["retry_budget_tokens"] == 7 and u["in_flight"] == 0
    upstream.push(503)
    rg.get("/")
    assert rg.stats()["upstreams"]["api"]["retry_budget_tokens"] == pytest.approx(6, abs=1e-3)


# ------------------------------------------------------------------------------- /config

def test_config_redacts_admin_token_and_store_password(rg_factory, upstream):
    token = "tok-9f8e7d6c5b4a"
    password = "hunter2-pw-xyz"
    rg = rg_factory(upstreams={
        "api": upstream_block(upstream),
        "pay": upstream_block(upstream, idempotency={"enabled": True,
                                                   "store": "redis://app:%s@127.0.0.1:6390/2"
                                                   % password})},
        admin_token=token)
    r = rg.admin("GET", "/config")
    assert r.status == 200 and "json" in r.headers.get("Content-Type", "")
    assert token.encode() not in r.body
    assert password.encode() not in r.body
    c = r.json()
    assert c["admin"]["token"] != token and c["admin"]["token"]
    store = c["upstreams"]["pay"]["idempotency"]["store"]
    assert store.startswith("redis://") and "127.0.0.1:6390" in store
    assert c["upstreams"]["api"]["idempotency"]["store"] == "memory"
    # the rest is the effective configuration
    assert c["upstreams"]["api"]["endpoints"] == [upstream.endpoint]
    assert c["listeners"][0]["listen"] == "127.0.0.1:%d" % rg.port
    assert c["admin"]["listen"] == "127.0.0.1:%d" % rg.admin_port


def test_config_without_token_shows_it_empty(rg):
    c = rg.config_json()
    assert c["admin"]["token"] in ("", None)


def test_config_password_only_url_redacted(rg_factory, upstream):
    rg = rg_factory(upstreams={"pay": upstream_block(upstream, idempotency={
        "enabled": True, "store": "redis://:sekr1t-only@127.0.0.1:6391/0"})})
    body = rg.admin("GET", "/config").body
    assert b"sekr1t-only" not in body


# ------------------------------------------------------------------------------- /retries

def test_retries_get_and_post_per_upstream(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    rg = rg_factory(upstreams={"a": upstream_block(a), "b": upstream_block(b)})
    r = rg.admin("GET", "/retries")
    assert r.status == 200 and "json" in r.headers.get("Content-Type", "")
    assert r.json() == {"a": True, "b": True}
    r = rg.set_retries(False, "a")
    assert r.status == 200 and r.json() == {"a": False, "b": True}
    assert rg.retries() == {"a": False, "b": True}
    a.push(503)
    b.push(503)
    ra = rg.get("/", {"Host": "a"})
    rb = rg.get("/", {"Host": "b"})
    assert ra.status == 503 and ra.headers["X-Retrygate-Attempts"] == "1"
    assert ra.headers["X-Retrygate-Retry-Refused"] == "disabled"
    assert rb.status == 200 and rb.headers["X-Retrygate-Attempts"] == "2"
    r = rg.set_retries(True, "a")
    assert r.status == 200 and r.json() == {"a": True, "b": True}
    a.push(503)
    assert rg.get("/", {"Host": "a"}).headers["X-Retrygate-Attempts"] == "2"


def test_retries_post_without_upstream_switches_all(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    rg = rg_factory(upstreams={"a": upstream_block(a), "b": upstream_block(b)})
    r = rg.set_retries(False)
    assert r.status == 200 and r.json() == {"a": False, "b": False}
    assert rg.stats()["upstreams"]["a"]["retries_enabled"] is False
    r = rg.set_retries(True)
    assert r.status == 200 and r.json() == {"a": True, "b": True}


def test_retries_unknown_upstream_404(rg):
    r = rg.set_retries(False, "nope")
    assert r.status == 404
    assert rg.retries() == {"up": True}


def test_retries_bad_enabled_value_not_applied(rg):
    r = rg.admin("POST", "/retries?upstream=up&enabled=maybe", body=b"")
    assert r.status == 400
    assert rg.retries() == {"up": True}


def test_retries_token_required_when_set(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, admin_token="t0ken")
    assert rg.set_retries(False, "api").status == 403                 # no bearer
    assert rg.set_retries(False, "api", token="wrong").status == 403
    assert rg.set_retries(False, "api", token="t0ken-and-more").status == 403
    r = rg.admin("POST", "/retries?upstream=api&enabled=false", {"Authorization": "t0ken"},
                 b"")
    assert r.status == 403                                             # not a bearer
    assert rg.retries() == {"api": True}                               # nothing switched
    r = rg.set_retries(False, "api", token="t0ken")
    assert r.status == 200 and r.json() == {"api": False}
    # GET needs no token
    assert rg.admin("GET", "/retries").status == 200
    assert rg.set_retries(True, token="t0ken").json() == {"api": True}


def test_admin_token_follows_reload(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, admin_token="old-token")
    rg = rg_factory(cfg)
    new = copy.deepcopy(cfg)
    new["admin"]["token"] = "new-token"
    rg.reload(new)
    assert rg.set_retries(False, "api", token="old-token").status == 403
    assert rg.set_retries(False, "api", token="new-token").status == 200
    assert "new-token" not in rg.admin("GET", "/config").text


def test_retries_loopback_without_token(rg):
    assert rg.set_retries(False, "up").status == 200


def test_retries_switch_survives_sighup(rg_factory, upstream_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    cfg = make_config(upstreams={"a": upstream_block(a), "b": upstream_block(b)})
    rg = rg_factory(cfg)
    rg.set_retries(False, "a")
    new = copy.deepcopy(cfg)
    new["upstreams"]["a"]["retry"]["max_attempts"] = 4
    new["upstreams"]["c"] = upstream_block(b.endpoint)
    rg.reload(new)
    assert rg.config_json()["upstreams"]["a"]["retry"]["max_attempts"] == 4
    assert rg.retries() == {"a": False, "b": True, "c": True}
    a.push(503)
    r = rg.get("/", {"Host": "a"})
    assert r.headers["X-Retrygate-Retry-Refused"] == "disabled"


def test_retry_enabled_false_in_config_shows_runtime_switch(rg_factory, upstream):
    # the runtime switch is independent of retry.enabled; retries need both
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"enabled": False})})
    assert rg.retries() == {"api": True}
    upstream.push(503)
    r = rg.get("/")
    assert r.headers["X-Retrygate-Attempts"] == "1"
    assert r.headers["X-Retrygate-Retry-Refused"] == "disabled"


# ------------------------------------------------------------------------------- under load

@pytest.mark.timeout(120)
def test_metrics_scrape_under_load_within_50ms(rg_factory, fast_upstream):
    wrk = shutil.which("wrk")
    if not wrk:
        pytest.skip("wrk not installed")
    rg = rg_factory(upstreams={"api": {"endpoints": [fast_upstream]}})
    assert rg.get("/").status == 200
    p = subprocess.Popen([wrk, "-t2", "-c32", "-d8s", rg.url("/load")],
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    times = []
    try:
        time.sleep(1.5)                            # load at full speed
        for _ in range(30):
            t0 = time.monotonic()
            r = http_request(rg.admin_port, "GET", "/metrics", timeout=5)
            times.append(time.monotonic() - t0)
            assert r.status == 200
            parse_metrics(r.text)
            time.sleep(0.1)
    finally:
        out, _ = p.communicate(timeout=30)
    reqs = re.search(r"(\d+) requests in", out)
    assert reqs and int(reqs.group(1)) > 1000, out      # the load was real
    times.sort()
    median = times[len(times) // 2]
    p90 = times[int(len(times) * 0.9)]
    print("scrape under load: median %.1f ms, p90 %.1f ms, max %.1f ms; %s"
          % (median * 1e3, p90 * 1e3, times[-1] * 1e3, reqs.group(0)))
    assert median < 0.050, times
    assert p90 < 0.050, times
    assert times[-1] < 0.250, times
    assert rg.metric("retrygate_upstream_requests_total", upstream="api") > 1000
