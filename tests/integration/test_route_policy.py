"""SPEC §2, per-route policy: a route's `retry` (any key but budget) and `deadline` override its
upstream's key by key for the requests on that route, while the budget, the in-flight caps and
the health of the upstream stay one, shared by all its routes. Also --check's worst case per
route, /config, a reload, and the errors of a route's policy with their line and column."""

import re
import threading

import grpc
import pytest

from grpcserver import GrpcServer
from harness import check_config, respond, wait_for

pytestmark = pytest.mark.timeout(60)

FAST = {"backoff": {"base": "1ms", "max": "2ms"}}


def routes(**extra):
    """/read/ retries up to 3 attempts, /write/ not at all, /stream/ gets a longer deadline,
    everything else the upstream's policy (2 attempts, deadline.default 5s)."""
    r = [{"path_prefix": "/read/", "upstream": "api", "retry": {"max_attempts": 3}},
         {"path_prefix": "/write/", "upstream": "api", "retry": {"enabled": False}},
         {"path_prefix": "/stream/", "upstream": "api",
          "deadline": {"default": "20s", "max": "60s"}},
         {"upstream": "api"}]
    for i, more in extra.items():
        r[int(i[1:])].update(more)
    return r


def api(endpoints, retry=None, **more):
    rt = dict(FAST, max_attempts=2, per_try_timeout="2m")
    rt.update(retry or {})
    d = {"endpoints": endpoints if isinstance(endpoints, list) else [endpoints], "retry": rt}
    d.update(more)
    return d


def attempts(r):
    return int(r.headers["X-Retrygate-Attempts"])


def test_attempts_differ_per_route(upstream, rg_factory):
    upstream.set_default(503)
    rg = rg_factory(upstreams={"api": api(upstream)}, routes=routes())
    r = rg.request("GET", "/read/a")
    assert (r.status, attempts(r), r.headers.get("X-Retrygate-Retry-Refused")) == \
        (503, 3, "max-attempts")
    r = rg.request("GET", "/write/a")
    assert (r.status, attempts(r), r.headers.get("X-Retrygate-Retry-Refused")) == \
        (503, 1, "disabled")
    r = rg.request("GET", "/other")
    assert (r.status, attempts(r), r.headers.get("X-Retrygate-Retry-Refused")) == \
        (503, 2, "max-attempts")
    assert len(upstream.wait_requests(6)) == 6
    assert rg.metric("retrygate_upstream_attempts_total", upstream="api") == 6


def test_routes_share_one_budget(upstream, rg_factory):
    """Two tokens: one request on /read/ spends both; the next retry, on another route, is
    refused `budget` — the bucket is the upstream's, not the route's."""
    upstream.set_default(503)
    rg = rg_factory(upstreams={"api": api(upstream, {
        "budget": {"ratio": 0, "min_per_second": 0, "max_tokens": 2}})}, routes=routes())
    assert attempts(rg.request("GET", "/read/a")) == 3
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == 0
    r = rg.request("GET", "/stream/a")
    assert (r.status, attempts(r), r.headers.get("X-Retrygate-Retry-Refused")) == \
        (503, 1, "budget")
    assert rg.metric("retrygate_upstream_retries_refused_total", upstream="api",
                     reason="budget") == 1


def test_routes_share_one_in_flight_cap(upstream, rg_factory):
    """max_in_flight 1: a request held on /read/ leaves no slot for /stream/."""
    release = threading.Event()
    upstream.on_path("/read/", default=respond(200, body=b"slow", hold=release, hold_timeout=30))
    rg = rg_factory(upstreams={"api": api(upstream, concurrency={"max_in_flight": 1})},
                    routes=routes())
    result = {}
    t = threading.Thread(target=lambda: result.update(r=rg.request("GET", "/read/slow")))
    t.start()
    try:
        upstream.wait_requests(1)
        r = rg.request("GET", "/stream/a")
        assert (r.status, r.headers.get("X-Retrygate-Reason")) == (503, "overloaded")
    finally:
        release.set()
        t.join(20)
    assert result["r"].status == 200


def test_routes_share_one_health_state(upstream_factory, rg_factory):
    """An endpoint ejected by failures on /read/ is out for /write/ too."""
    bad, good = upstream_factory(), upstream_factory()
    bad.set_default(503)
    rg = rg_factory(upstreams={"api": api([bad, good], {"max_attempts": 1}, health={
        "passive": {"consecutive_failures": 2, "base_ejection": "30s",
                    "max_ejected_percent": 50}})}, routes=routes())
    wait_for(lambda: rg.request("GET", "/read/x") and
             rg.metric("retrygate_endpoint_up", upstream="api", endpoint=bad.endpoint) == 0,
             timeout=20, what="the failing endpoint ejected by /read/ traffic")
    seen = len(bad.requests)
    for _ in range(4):
        assert rg.request("GET", "/write/x").status == 200
    assert len(bad.requests) == seen


def test_deadline_override_reaches_the_upstream(upstream, rg_factory):
    """X-Timeout-Ms upstream is the route's deadline: /stream/ 20s by default and up to 60s
    asked for; the other routes the upstream's 5s default and 30s max."""
    rg = rg_factory(upstreams={"api": api(upstream)}, routes=routes())

    def sent(path, headers=None):
        assert rg.request("GET", path, headers).status == 200
        return int(upstream.wait_requests(len(upstream.requests))[-1].header("X-Timeout-Ms"))

    assert 15000 < sent("/stream/a") <= 20000
    assert 2000 < sent("/other") <= 5000
    assert 45000 < sent("/stream/a", {"X-Timeout-Ms": "50000"}) <= 50000
    assert 25000 < sent("/other", {"X-Timeout-Ms": "50000"}) <= 30000


def test_reload_applies_a_route_policy(upstream, rg_factory):
    upstream.set_default(503)
    rg = rg_factory(upstreams={"api": api(upstream)}, routes=routes())
    assert attempts(rg.request("GET", "/read/a")) == 3
    cfg = rg.config
    cfg["listeners"][0]["routes"] = routes(r0={"retry": {"max_attempts": 1}})
    rg.reload(cfg)
    wait_for(lambda: attempts(rg.request("GET", "/read/a")) == 1, timeout=10,
             what="the reloaded route policy")
    routes_json = rg.config_json()["listeners"][0]["routes"]
    assert routes_json[0]["retry"]["max_attempts"] == 1
    assert routes_json[3]["retry"] is None


def test_config_json_shows_route_overrides(upstream, rg_factory):
    rg = rg_factory(upstreams={"api": api(upstream)}, routes=routes())
    rs = rg.config_json()["listeners"][0]["routes"]
    assert rs[0]["retry"]["max_attempts"] == 3
    assert rs[0]["retry"]["per_try_timeout"] == "2m"     # the upstream's, merged
    assert rs[0]["deadline"] is None
    assert rs[1]["retry"]["enabled"] is False
    assert rs[2]["retry"] is None
    assert rs[2]["deadline"] == {"default": "20s", "max": "1m", "min": "5ms"}
    assert rs[3]["retry"] is None and rs[3]["deadline"] is None


def test_grpc_routes_by_path_with_their_own_policy(rg_factory):
    """A channel to the sidecar sends :authority 127.0.0.1:PORT, so gRPC services are routed by
    path: the read-only service's route makes its calls idempotent (retried without a key), the
    streaming method's route gives it a longer deadline, seen by the server in grpc-timeout
    and x-timeout-ms; the rest of the upstream's calls keep its policy."""
    srv = GrpcServer()
    ch = None
    try:
        up = {"endpoints": [srv.endpoint], "protocol": "h2",
              "retry": dict(FAST, per_try_timeout="2m")}
        rg = rg_factory(upstreams={"api": up}, routes=[
            {"path_prefix": "/test.Catalog/", "upstream": "api",
             "retry": {"idempotent_paths": ["/test.Catalog/"]}},
            {"path_prefix": "/test.Svc/Stream", "upstream": "api",
             "deadline": {"default": "20s"}},
            {"upstream": "api"}])
        ch = grpc.insecure_channel("127.0.0.1:%d" % rg.port, options=[("grpc.enable_retries", 0)])

        def unary(path, script, key):
            try:
                _, c = ch.unary_unary(path).with_call(
                    b"req", metadata=[("x-script", script), ("x-key", key)], timeout=10)
                return c.code(), dict(c.initial_metadata())
            except grpc.RpcError as e:
                md = dict(e.initial_metadata() or ())
                md.update(e.trailing_metadata() or ())
                return e.code(), md

        code, md = unary("/test.Catalog/Get", "fail:1:unavailable", "cat")
        assert (code, md.get("x-retrygate-attempts")) == (grpc.StatusCode.OK, "2"), md
        code, md = unary("/test.Svc/Unary", "fail:1:unavailable", "svc")
        assert (code, md.get("x-retrygate-retry-refused")) == \
            (grpc.StatusCode.UNAVAILABLE, "non-idempotent"), md

        assert list(ch.unary_stream("/test.Svc/Stream")(
            b"req", metadata=[("x-script", "messages:2"), ("x-key", "st")])) == \
            [b"msg-1", b"msg-2"]
        c = srv.wait_calls(1, key="st")[0]
        assert 15000 < int(c.header("x-timeout-ms")) <= 20000, c.metadata
        assert 15 < c.time_remaining <= 20, c.time_remaining
        ch.unary_unary("/test.Svc/Unary")(b"req", metadata=[("x-key", "short")])   # no deadline
        c = srv.wait_calls(1, key="short")[0]
        assert 2000 < int(c.header("x-timeout-ms")) <= 5000, c.metadata
    finally:
        if ch:
            ch.close()
        srv.stop(0)


# ------------------------------------------------------------------------------- --check

def _config_text():
    return """\
listeners:
  - listen: "127.0.0.1:@PORT@"
    routes:
      - path_prefix: "/read/"
        upstream: api
        retry: { max_attempts: 4 }
      - path_prefix: "/write/"
        upstream: api
        retry:
          enabled: false
      - path_prefix: "/stream/"
        upstream: api
        deadline: { default: 2m, max: 5m }
      - upstream: api
upstreams:
  api:
    endpoints: ["127.0.0.1:9"]
    retry: { max_attempts: 2 }
"""


def _blocks(out):
    blocks, cur = {}, None
    for ln in out.splitlines():
        if ln and not ln[0].isspace():
            cur = ln
            blocks[cur] = []
        elif cur is not None:
            blocks[cur].append(ln.strip())
    return blocks


def test_check_prints_the_worst_case_of_each_route():
    cp = check_config(_config_text())
    assert cp.returncode == 0, cp.stderr
    b = _blocks(cp.stdout)
    up = [v for k, v in b.items() if k.startswith("upstream api:")][0]
    assert any(ln.startswith("attempts       up to 2 per request") for ln in up)
    read = b["route listeners[0].routes[0] (host any, path /read/) -> api: retry of its own"]
    assert any(ln.startswith("attempts       up to 4 per request") for ln in read)
    assert any("the budget is the upstream's, shared with its other routes" in ln for ln in read)
    assert any(ln.startswith("latency        worst case 4 x 1s") for ln in read)
    write = b["route listeners[0].routes[1] (host any, path /write/) -> api: retry of its own"]
    assert "attempts       1 per request (retries disabled)" in write
    stream = b["route listeners[0].routes[2] (host any, path /stream/) -> api: deadline of its "
               "own"]
    assert any("fits deadline.default 2m and deadline.max 5m" in ln for ln in stream)
    # the catch-all route has the upstream's policy: no block of its own
    assert not any("path /)" in k for k in b)


ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<msg>\S.*)$")


@pytest.mark.parametrize("old,new,line,col,msg", [
    ("retry: { max_attempts: 4 }", "retry: { max_attempts: 4, budget: { max_tokens: 5 } }",
     6, 35, "listeners[0].routes[0].retry.budget: budget is per upstream"),
    ("retry: { max_attempts: 4 }", "retry: { max_atempts: 4 }",
     6, 18, "listeners[0].routes[0].retry.max_atempts: unknown key (did you mean max_attempts?)"),
    ("retry: { max_attempts: 4 }", "retry: { max_attempts: 0 }",
     6, 32, "listeners[0].routes[0].retry.max_attempts: "),
    ("deadline: { default: 2m, max: 5m }", "deadline: { default: 2m }",
     13, 30, "listeners[0].routes[2].deadline.default: deadline.default 2m is above "
             "deadline.max 30s"),
    ("deadline: { default: 2m, max: 5m }", "deadline: { min: 10s }",
     13, 26, "listeners[0].routes[2].deadline.min: deadline.min 10s is not below "
             "deadline.default 5s"),
    ("deadline: { default: 2m, max: 5m }", "deadline: 2m",
     13, 19, "listeners[0].routes[2].deadline: expected a mapping"),
])
def test_route_policy_errors_point_at_their_key(old, new, line, col, msg):
    text = _config_text()
    assert old in text
    cp = check_config(text.replace(old, new))
    assert cp.returncode == 1 and cp.stdout == ""
    errs = [ERROR_LINE.match(ln) for ln in cp.stderr.splitlines()]
    assert errs and all(errs), cp.stderr
    assert [(int(m["line"]), int(m["col"])) for m in errs] == [(line, col)], cp.stderr
    assert errs[0]["file"] == cp.path
    assert errs[0]["msg"].startswith(msg), cp.stderr
