"""Two retrygate processes in a row, as in a mesh: caller -> egress sidecar -> ingress sidecar
-> app. The deadline shrinks at every hop (SPEC §3), the caller gets its 504 on time, a
cancelled attempt is cancelled all the way down, and one layer retries, not every layer
(SPEC §4 rule 2)."""

import time

import pytest

from harness import reset, respond, stall

pytestmark = pytest.mark.timeout(30)

FAST = {"backoff": {"base": "1ms", "max": "5ms"}}


def hop(endpoint, retry=None):
    r = dict(FAST)
    r.update(retry or {})
    return {"endpoints": [endpoint], "retry": r}


def chain(rg_factory, app, ingress_retry=None, egress_retry=None):
    ingress = rg_factory(upstreams={"app": hop(app, ingress_retry)})
    egress = rg_factory(upstreams={"ingress": hop("127.0.0.1:%d" % ingress.port, egress_retry)})
    return egress, ingress


def test_deadline_shrinks_along_the_chain_and_the_caller_gets_504_on_time(upstream_factory,
                                                                           rg_factory):
    app = upstream_factory(name="app")
    app.set_default(stall())
    egress, ingress = chain(rg_factory, app)
    t = time.monotonic()
    r = egress.request("GET", "/slow", headers={"X-Timeout-Ms": "800"})
    took = time.monotonic() - t
    assert r.status == 504, r
    assert r.headers["X-Retrygate-Reason"] == "deadline-exceeded"
    assert r.headers.get_all("X-Retrygate-Attempts") == ["1"]
    assert 0.79 <= took < 1.5, "caller waited %.3fs on an 800 ms deadline" % took
    (q,) = app.wait_requests(1)
    seen = int(q.header("X-Timeout-Ms"))
    # the app was told less than the caller gave the first hop, never more
    assert 500 <= seen < 800, "app saw X-Timeout-Ms %d for a caller deadline of 800" % seen
    assert q.header_all("X-Timeout-Ms") == [str(seen)]
    # the attempt was cancelled at every hop
    assert app.wait_conn_closed(q.conn_id, timeout=3) == "peer"
    for rg, name in ((egress, "ingress"), (ingress, "app")):
        rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream=name)
    assert app.request_count == 1


def test_grpc_timeout_shrinks_along_the_chain(upstream_factory, rg_factory):
    app = upstream_factory(name="app")
    long_try = {"per_try_timeout": "5s"}
    egress, _ = chain(rg_factory, app, long_try, long_try)
    r = egress.request("GET", "/g", headers={"grpc-timeout": "2S"})
    assert r.status == 200, r
    (q,) = app.wait_requests(1)
    x = int(q.header("X-Timeout-Ms"))
    g = q.header("grpc-timeout")
    assert 1500 <= x < 2000
    assert g[-1] in "umn" and g[:-1].isdigit()
    assert x <= int(g[:-1]) * {"u": 0.001, "m": 1, "n": 1e-6}[g[-1]] < x + 1


def test_per_try_timeouts_along_the_chain(upstream_factory, rg_factory):
    """The egress retries on its own per-try timeout (300 ms); each cancelled attempt is
    cancelled at the ingress and the app; the ingress does not retry the egress's retries
    (they arrive marked X-Retrygate-Attempt: 2, 3) and forwards the marker unchanged."""
    app = upstream_factory(name="app")
    app.set_default(stall())
    egress, ingress = chain(rg_factory, app, egress_retry={"per_try_timeout": "300ms"})
    t = time.monotonic()
    r = egress.request("GET", "/p", headers={"X-Timeout-Ms": "1500"})
    took = time.monotonic() - t
    assert r.status == 504, r
    assert r.headers.get_all("X-Retrygate-Attempts") == ["3"]
    assert r.headers["X-Retrygate-Retry-Refused"] == "max-attempts"
    assert 0.85 <= took < 2.0, took
    reqs = app.wait_requests(3)
    time.sleep(0.2)
    assert app.request_count == 3, app.summary()
    assert [q.header_all("X-Retrygate-Attempt") for q in reqs] == [["1"], ["2"], ["3"]]
    for q in reqs:
        assert 150 <= int(q.header("X-Timeout-Ms")) < 300, q.headers.items()
        assert app.wait_conn_closed(q.conn_id, timeout=3) == "peer"
    assert ingress.metric("retrygate_upstream_retries_total", upstream="app") == 0
    for rg, name in ((egress, "ingress"), (ingress, "app")):
        rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream=name)


def test_one_layer_retries_not_every_layer(upstream_factory, rg_factory):
    app = upstream_factory(name="app")
    app.set_default(respond(503, body=b"app down"))
    # the egress waits for the ingress's three tries however slow a busy machine makes them:
    # a per-try timeout of its own would be a retry of a timeout, not of the 503
    egress, ingress = chain(rg_factory, app, {"max_attempts": 3},
                            {"max_attempts": 3, "per_try_timeout": "20s"})
    r = egress.request("GET", "/x")
    assert r.status == 503 and r.body == b"app down", r
    # the egress's own headers: one attempt, refused because the ingress already retried
    assert r.headers.get_all("X-Retrygate-Attempts") == ["1"]
    assert r.headers.get_all("X-Retrygate-Retry-Refused") == ["nested"]
    app.wait_requests(3)
    time.sleep(0.2)
    assert app.request_count == 3, "the app saw %d attempts (3, not 9)" % app.request_count
    assert ingress.metric("retrygate_upstream_retries_total", upstream="app") == 2
    assert egress.metric("retrygate_upstream_retries_total", upstream="ingress") == 0
    assert egress.metric("retrygate_upstream_retries_refused_total", upstream="ingress",
                         reason="nested") == 1


def test_a_retry_from_the_first_layer_gets_one_attempt_at_the_second(upstream_factory,
                                                                      rg_factory):
    """The ingress does not retry 503s, so the egress does: its retry arrives marked
    X-Retrygate-Attempt: 2. The app resets it: the ingress, which would retry a reset of a
    first attempt, gives this one a single attempt (refused: nested), and so does the
    egress with the answer. The app sees 2 attempts, not 2 + 2 retries."""
    app = upstream_factory(name="app")
    app.push(respond(503, body=b"first"))
    app.set_default(reset())
    egress, ingress = chain(rg_factory, app, ingress_retry={"on": ["reset", "connect-failure"]})
    r = egress.request("GET", "/x")
    assert r.status == 502, r
    assert r.headers["X-Retrygate-Reason"] == "reset"
    assert r.headers.get_all("X-Retrygate-Attempts") == ["2"]
    assert r.headers.get_all("X-Retrygate-Retry-Refused") == ["nested"]
    reqs = app.wait_requests(2)
    time.sleep(0.2)
    assert app.request_count == 2, app.summary()
    assert [q.header_all("X-Retrygate-Attempt") for q in reqs] == [["1"], ["2"]]
    assert ingress.metric("retrygate_upstream_retries_refused_total", upstream="app",
                          reason="nested") == 1
    assert ingress.metric("retrygate_upstream_retries_total", upstream="app") == 0
