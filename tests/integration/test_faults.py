"""Fault injection for gray tests (SPEC §11, issue 14): one test per fault kind (what the
upstream saw, what the client got, the retry decision), one per stop condition firing at the
right moment, the runtime switch across SIGHUP, the admin endpoint's rules, the metric and
the access log, and lost responses on keyed POSTs causing no duplicate side effect behind an
idempotent upstream."""

import collections
import json
import threading
import time

import pytest

from harness import Upstream, make_config, respond, upstream_block, wait_for

pytestmark = pytest.mark.timeout(90)

OFF = {"after": 0, "min_success_rate": 0, "max_amplification": 0}


def faults(*rules, enabled=True, stop=None):
    return {"enabled": enabled, "rules": list(rules), "stop": dict(stop or OFF)}


def faulty(rg_factory, upstream, rules, retry=None, stop=None, enabled=True, **kw):
    block = upstream_block(upstream, retry=retry, faults=faults(*rules, enabled=enabled,
                                                                stop=stop))
    return rg_factory(upstreams={"pay": block}, **kw)


def get_faults(rg):
    r = rg.admin("GET", "/faults")
    assert r.status == 200, r
    return json.loads(r.body)


def injected(rg, kind):
    return rg.metric("retrygate_upstream_faults_injected_total", upstream="pay", kind=kind)


# ------------------------------------------------------------------------------- the kinds

def test_connect_failure_reaches_nothing_and_is_retried_for_any_method(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "connect-failure", "percent": 100}],
                retry={"max_attempts": 3})
    r = rg.post("/pay", b"{}")           # an unkeyed POST: connect-failure is safe to retry
    assert r.status == 502 and r.headers.get("X-Retrygate-Reason") == "connect-failure"
    assert r.headers.get("X-Retrygate-Attempts") == "3"
    assert r.headers.get("X-Retrygate-Retry-Refused") == "max-attempts"
    time.sleep(0.2)
    assert upstream.request_count == 0
    assert injected(rg, "connect-failure") == 3
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="pay",
                     outcome="connect-failure") == 3


def test_abort_answers_itself_with_status_and_retry_after(rg_factory, upstream):
    rg = faulty(rg_factory, upstream,
                [{"kind": "abort", "percent": 100, "status": 503, "retry_after": "1"}],
                retry={"max_attempts": 2, "retry_after": {"max": "3s"}})
    t0 = time.monotonic()
    r = rg.get("/pay")
    took = time.monotonic() - t0
    # 503 + Retry-After is in retry.on: the retry waited the hint, then got the same answer
    assert r.status == 503 and r.headers.get("Retry-After") == "1"
    assert r.headers.get("X-Retrygate-Fault") == "abort"
    assert r.headers.get("X-Retrygate-Attempts") == "2"
    assert r.headers.get("X-Retrygate-Retry-Refused") == "max-attempts"
    assert 0.9 <= took < 3, took
    assert upstream.request_count == 0
    assert injected(rg, "abort") == 2
    assert rg.metric("retrygate_upstream_responses_total", upstream="pay", code="5xx") == 2


def test_abort_with_a_status_not_retried_is_relayed_at_once(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "abort", "percent": 100, "status": 429}])
    r = rg.get("/pay")
    assert r.status == 429 and r.headers.get("X-Retrygate-Attempts") == "1"
    assert r.headers.get("X-Retrygate-Retry-Refused") is None
    assert upstream.request_count == 0


def test_delay_is_added_before_sending_and_the_per_try_timeout_keeps_running(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "delay", "percent": 100, "delay": "300ms",
                                        "path_prefix": "/slow"},
                                       {"kind": "delay", "percent": 100, "delay": "2s",
                                        "path_prefix": "/stuck"}],
                retry={"max_attempts": 2, "per_try_timeout": "500ms"})
    t0 = time.monotonic()
    r = rg.get("/slow")
    took = time.monotonic() - t0
    assert r.status == 200 and r.headers.get("X-Retrygate-Attempts") == "1"
    assert took >= 0.3, took
    seen = upstream.wait_requests(1, timeout=5)[0]
    # the attempt had 500 ms; the delay spent 300 of them
    assert int(seen.header("X-Timeout-Ms")) <= 210, seen.header("X-Timeout-Ms")

    t0 = time.monotonic()
    r = rg.get("/stuck")
    took = time.monotonic() - t0
    # cut by the per-try timeout: a timeout (retried for a GET), not a connect-failure
    assert r.status == 504 and r.headers.get("X-Retrygate-Reason") == "timeout", r
    assert r.headers.get("X-Retrygate-Attempts") == "2"
    assert 0.9 <= took < 2, took
    assert upstream.request_count == 1
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="pay", outcome="timeout") == 2
    assert injected(rg, "delay") == 3


def test_lost_response_reaches_the_upstream_and_is_a_reset(rg_factory, upstream, tmp_path):
    log = tmp_path / "access.log"
    rg = faulty(rg_factory, upstream, [{"kind": "lost-response", "percent": 100,
                                        "methods": ["POST"]}],
                retry={"max_attempts": 3}, access_log=log)
    # unkeyed POST: the upstream processed it, the reset makes it unknown: never re-sent
    r = rg.post("/pay", b"{}")
    assert r.status == 502 and r.headers.get("X-Retrygate-Reason") == "reset"
    assert r.headers.get("X-Retrygate-Retry-Refused") == "non-idempotent"
    assert upstream.request_count == 1
    # keyed POST: retried, each attempt processed and lost
    r = rg.post("/pay", b"{}", headers={"Idempotency-Key": "k1"})
    assert r.status == 502 and r.headers.get("X-Retrygate-Attempts") == "3"
    assert upstream.request_count == 4
    # GET does not match methods: untouched
    assert rg.get("/pay").status == 200
    assert injected(rg, "lost-response") == 4
    lines = wait_for(lambda: (lambda t: t if len(t) >= 3 else None)(
        [json.loads(x) for x in open(log).read().splitlines()] if log.exists() else []),
        5, what="3 access log lines")
    assert [t.get("fault") for t in lines[1]["tries"]] == ["lost-response"] * 3
    assert lines[1]["tries"][0]["outcome"] == "reset"
    assert "fault" not in lines[2]["tries"][0]
    assert lines[0]["outcome"] == "unknown"


def test_percent_and_match_are_honoured(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "abort", "percent": 25, "status": 500,
                                        "path_prefix": "/pay"}], retry={"max_attempts": 1})
    codes = collections.Counter(rg.get("/pay/x").status for _ in range(400))
    assert 50 <= codes[500] <= 150, codes
    assert all(rg.get("/other").status == 200 for _ in range(50))
    assert injected(rg, "abort") == codes[500]


# ------------------------------------------------------------------------------- stop conditions

def test_stop_after(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "abort", "percent": 100, "status": 500}],
                retry={"max_attempts": 1}, stop={"after": "2s", "min_success_rate": 0,
                                                 "max_amplification": 0})
    t0 = time.monotonic()
    f = get_faults(rg)["pay"]
    assert f["enabled"] is True and f["stopped"] is None and f["since"].endswith("Z")
    while time.monotonic() - t0 < 1.5:
        assert rg.get("/").status == 500
        time.sleep(0.05)
    wait_for(lambda: get_faults(rg)["pay"]["stopped"] == "after", 2.5, what="stop after")
    assert time.monotonic() - t0 >= 1.9
    f = get_faults(rg)["pay"]
    assert f["enabled"] is False and f["since"] is None
    assert rg.get("/").status == 200
    assert "stop condition after met" in rg.stderr_text()


def test_stop_min_success_rate_after_20_requests(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "abort", "percent": 100, "status": 500}],
                retry={"max_attempts": 1}, stop={"after": 0, "min_success_rate": 0.9,
                                                 "max_amplification": 0})
    for _ in range(15):
        assert rg.get("/").status == 500
    time.sleep(0.4)
    assert get_faults(rg)["pay"]["enabled"] is True     # 15 < 20 requests: not judged yet
    for _ in range(6):
        rg.get("/")
    wait_for(lambda: get_faults(rg)["pay"]["stopped"] == "min_success_rate", 2,
             what="min_success_rate stop")
    assert rg.get("/").status == 200
    assert injected(rg, "abort") <= 30


def test_stop_min_success_rate_not_met_by_a_healthy_share(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "abort", "percent": 5, "status": 500}],
                retry={"max_attempts": 1}, stop={"after": 0, "min_success_rate": 0.5,
                                                 "max_amplification": 0})
    for _ in range(60):
        rg.get("/")
    time.sleep(0.3)
    assert get_faults(rg)["pay"]["enabled"] is True


def test_stop_max_amplification(rg_factory, upstream):
    rg = faulty(rg_factory, upstream, [{"kind": "connect-failure", "percent": 100}],
                retry={"max_attempts": 3}, stop={"after": 0, "min_success_rate": 0,
                                                 "max_amplification": 2.0})
    for _ in range(15):
        assert rg.get("/").status == 502
    time.sleep(0.4)
    assert get_faults(rg)["pay"]["enabled"] is True     # 3x, but only 15 requests
    for _ in range(6):
        rg.get("/")
    wait_for(lambda: get_faults(rg)["pay"]["stopped"] == "max_amplification", 2,
             what="max_amplification stop")
    r = rg.get("/")
    assert r.status == 200 and r.headers.get("X-Retrygate-Attempts") == "1"


# ------------------------------------------------------------------------------- the switch

def test_runtime_switch_survives_sighup_and_rules_come_from_the_new_config(rg_factory, upstream):
    cfg = make_config({"pay": upstream_block(upstream, retry={"max_attempts": 1}, faults=faults(
        {"kind": "abort", "percent": 100, "status": 500}, enabled=False))})
    rg = rg_factory(config=cfg)
    assert get_faults(rg) == {"pay": {"enabled": False, "since": None, "stopped": None,
                                      "injected": {"connect-failure": 0, "abort": 0, "delay": 0,
                                                   "lost-response": 0}}}
    assert rg.get("/").status == 200
    r = rg.admin("POST", "/faults?upstream=pay&enabled=true", body=b"")
    assert r.status == 200 and json.loads(r.body)["pay"]["enabled"] is True
    assert rg.get("/").status == 500
    # a reload with a new rule: the switch stays on, the new rule applies
    cfg["upstreams"]["pay"]["faults"]["rules"][0]["status"] = 503
    rg.reload(cfg)
    assert get_faults(rg)["pay"]["enabled"] is True
    assert rg.get("/").status == 503
    # switched off, a reload whose file says enabled: true keeps it off
    assert rg.admin("POST", "/faults?upstream=pay&enabled=false", body=b"").status == 200
    cfg["upstreams"]["pay"]["faults"]["enabled"] = True
    rg.reload(cfg)
    assert get_faults(rg)["pay"]["enabled"] is False
    assert rg.get("/").status == 200


def test_post_faults_rules(rg_factory, upstream):
    cfg = make_config({"pay": upstream_block(upstream, faults=faults(
        {"kind": "abort", "percent": 100})), "plain": upstream_block(upstream)},
        admin_token="s3cret")
    rg = rg_factory(config=cfg)
    auth = {"Authorization": "Bearer s3cret"}
    assert rg.admin("POST", "/faults?upstream=pay&enabled=false", body=b"").status == 403
    assert rg.admin("POST", "/faults?upstream=pay&enabled=false", auth, b"").status == 200
    assert rg.admin("POST", "/faults?upstream=plain&enabled=true", auth, b"").status == 404
    assert rg.admin("POST", "/faults?upstream=nope&enabled=true", auth, b"").status == 404
    assert rg.admin("POST", "/faults?upstream=pay&enabled=maybe", auth, b"").status == 400
    f = get_faults(rg)
    assert list(f) == ["pay", "plain"] and f["plain"]["enabled"] is False


def test_check_warns_about_several_rules_and_stops_turned_off(tmp_path, upstream):
    from harness import render_yaml, run_binary
    cfg = make_config({"pay": upstream_block(upstream, faults=faults(
        {"kind": "abort", "percent": 1}, {"kind": "delay", "percent": 1, "delay": "1s"},
        stop={"after": "10m", "min_success_rate": 0, "max_amplification": 2.0}))})
    p = tmp_path / "c.yaml"
    p.write_text(render_yaml(cfg))
    out = run_binary("-c", str(p), "--check")
    assert out.returncode == 0, out.stderr
    assert "upstreams.pay.faults.rules: 2 rules" in out.stdout
    assert "upstreams.pay.faults.stop.min_success_rate: 0 turns" in out.stdout
    assert "faults.stop.after" not in out.stdout


# ------------------------------------------------------------------------------- no duplicates

class CountingUpstream:
    """Executes each POST (counted per Idempotency-Key) and answers 201."""

    def __init__(self):
        self.lock = threading.Lock()
        self.executed = collections.Counter()
        self.up = Upstream()
        self.up.set_default(self._handle)

    def _handle(self, req):
        with self.lock:
            self.executed[req.header("Idempotency-Key")] += 1
        return respond(201, body=b'{"order":"created"}')


@pytest.mark.timeout(120)
def test_lost_responses_on_keyed_posts_cause_no_duplicate_side_effect(rg_factory):
    app = CountingUpstream()
    try:
        # the service's own sidecar: enforces Idempotency-Key in front of the application
        inner = rg_factory(upstreams={"app": upstream_block(app.up, idempotency={
            "enabled": True})})
        # the caller's sidecar: loses half the responses, retries keyed POSTs
        outer = rg_factory(upstreams={"pay": upstream_block(
            "127.0.0.1:%d" % inner.port, retry={"max_attempts": 5},
            faults=faults({"kind": "lost-response", "percent": 50, "methods": ["POST"]}))})
        results = collections.Counter()
        for i in range(40):
            r = outer.post("/orders", b'{"sku":1}', headers={"Idempotency-Key": "order-%d" % i})
            results[r.status] += 1
        assert results[201] >= 30, results
        assert injected_of(outer) >= 10
        assert len(app.executed) == 40
        assert max(app.executed.values()) == 1, app.executed
        assert inner.metric("retrygate_idempotency_total", upstream="app",
                            result="replayed") >= 10
    finally:
        app.up.close()


def injected_of(rg):
    return rg.metric("retrygate_upstream_faults_injected_total", upstream="pay",
                     kind="lost-response")
