"""gRPC failures that count as failures, and gRPC faults (SPEC §10 "Metrics and log", §11, §12;
issue 26).

A gRPC error travels in an HTTP 200, so these tests look where an operator looks: the
downstream metric by grpc-status, the access log's outcome, the reconciliation queue (GET
/unknown), and abort fault rules with grpc_status / pushback_ms seen by a real grpcio client.
The server is tests/tools/grpcserver.py (grpcio), scripted per call by metadata; the fault
pushback test runs with grpcio and with Node's @grpc/grpc-js as the client.
"""

import json

import grpc
import pytest

from harness import wait_for
from test_grpc import CATALOG, UNARY, api, call, channel  # noqa: F401 (fixture)
from test_grpc_deadlines import call as either_call, client  # noqa: F401 (grpcio and Node)

pytestmark = pytest.mark.timeout(60)

DOWN = "retrygate_downstream_grpc_responses_total"


def log_records(path, n):
    """The access log's records once it holds at least N (it is flushed within ~0.2 s)."""
    def read():
        if not path.exists():
            return None
        recs = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
        return recs if len(recs) >= n else None
    return wait_for(read, 5, what="%d access log lines" % n)


def unknown(rg):
    r = rg.admin("GET", "/unknown")
    assert r.status == 200, r
    return json.loads(r.body)


def faults(*rules):
    off = {"after": 0, "min_success_rate": 0, "max_amplification": 0}
    return {"enabled": True, "rules": list(rules), "stop": off}


# ------------------------------------------------------------------------------- outcomes

def test_downstream_metric_counts_what_grpc_clients_received(grpcsrv, rg_factory, channel):
    """Every call is an HTTP 200; the new metric tells OK from UNAVAILABLE and INTERNAL, counts
    retrygate's own gRPC errors, and /stats shows the same figures."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"max_attempts": 1}))
    ch = channel(rg)
    assert call(ch, xkey="u1", script="code:unavailable").code == grpc.StatusCode.UNAVAILABLE
    assert call(ch, xkey="u2", script="code:unavailable").code == grpc.StatusCode.UNAVAILABLE
    assert call(ch, xkey="i", script="code:internal").code == grpc.StatusCode.INTERNAL
    assert call(ch, xkey="ok").code == grpc.StatusCode.OK
    # retrygate's own answer (a refused bad deadline) is counted as its client read it
    r = call(ch, extra=[("x-timeout-ms", "soon")])
    assert r.code == grpc.StatusCode.INVALID_ARGUMENT, r

    rg.wait_metric(DOWN, 1, status="invalid-argument")
    assert rg.metric(DOWN, status="unavailable") == 2
    assert rg.metric(DOWN, status="internal") == 1
    assert rg.metric(DOWN, status="ok") == 1
    assert rg.metric(DOWN, status="not-found") == 0
    # what the HTTP view says of the same calls: all 2xx
    assert rg.metric("retrygate_downstream_requests_total", code="2xx") == 5
    stats = json.loads(rg.admin("GET", "/stats").body)
    g = stats["downstream"]["grpc_status"]
    assert (g["ok"], g["unavailable"], g["internal"], g["invalid-argument"]) == (1, 2, 1, 1), g


def test_access_log_outcome_and_reconciliation_follow_the_grpc_status(grpcsrv, rg_factory,
                                                                      channel, tmp_path):
    srv = grpcsrv()
    log = tmp_path / "access.log"
    rg = rg_factory(upstreams=api(srv, {"idempotent_paths": ["/test.Catalog/"]}),
                    access_log=str(log))
    ch = channel(rg)
    # not retried (no key, not an idempotent path): UNAVAILABLE may have executed -> unknown
    assert call(ch, xkey="a", script="code:unavailable").code == grpc.StatusCode.UNAVAILABLE
    # a keyed call retried to exhaustion: the last answer UNAVAILABLE -> unknown
    r = call(ch, key="k-3", script="code:unavailable")
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.md.get("x-retrygate-attempts") == "3", r
    # INTERNAL is no definite answer either
    assert call(ch, xkey="b", script="code:internal").code == grpc.StatusCode.INTERNAL
    # a definite error: failed, nothing to reconcile
    assert call(ch, xkey="c", script="code:invalid-argument").code == \
        grpc.StatusCode.INVALID_ARGUMENT
    # an idempotent path: its failure is just a failure
    assert call(ch, CATALOG, xkey="d", script="code:unavailable").code == \
        grpc.StatusCode.UNAVAILABLE
    # RESOURCE_EXHAUSTED is in idempotency.release_on by default: the call did not run
    assert call(ch, xkey="f", script="code:resource-exhausted").code == \
        grpc.StatusCode.RESOURCE_EXHAUSTED
    assert call(ch, xkey="e").code == grpc.StatusCode.OK

    recs = log_records(log, 7)
    got = [(x["path"], x["status"], x["outcome"]) for x in recs]
    assert got == [(UNARY, 200, "unknown"), (UNARY, 200, "unknown"), (UNARY, 200, "unknown"),
                   (UNARY, 200, "failed"), (CATALOG, 200, "failed"), (UNARY, 200, "failed"),
                   (UNARY, 200, "ok")], got

    recorded = unknown(rg)      # newest first
    assert [(x["path"], x["last_outcome"]) for x in recorded] == [
        (UNARY, "internal"), (UNARY, "unavailable"), (UNARY, "unavailable")], recorded
    keyed = recorded[1]
    assert keyed["idempotency_key"] == "k-3" and keyed["attempts"] == 3, keyed
    assert keyed["method"] == "POST" and keyed["endpoint"] == srv.endpoint, keyed
    assert recorded[2]["idempotency_key"] is None and recorded[2]["attempts"] == 1
    assert {x["id"] for x in recorded} == {recs[i]["request_id"] for i in (0, 1, 2)}
    assert rg.metric("retrygate_reconcile_recorded_total", upstream="api") == 3
    assert rg.metric("retrygate_upstream_unknown_outcomes_total", upstream="api") == 3


# ------------------------------------------------------------------------------- faults

def test_fault_grpc_status_is_a_trailers_only_answer_retried_after_its_pushback(
        grpcsrv, rg_factory, client):
    """An abort rule with grpc_status: unavailable and pushback_ms: a keyed call is retried by
    retrygate (UNAVAILABLE is in the default retry.on), each retry after the pushback, and the
    client gets the gRPC error with its pushback; nothing reaches the server."""
    srv = grpcsrv()
    rule = {"kind": "abort", "percent": 100, "grpc_status": "unavailable", "pushback_ms": 400}
    rg = rg_factory(upstreams=api(srv, {"max_attempts": 3}, faults=faults(rule)))
    r = either_call(client, rg, key="f-1", timeout=8)
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.md.get("x-retrygate-attempts") == "3", r
    assert r.md.get("grpc-retry-pushback-ms") == "400", r
    assert r.md.get("x-retrygate-fault") == "abort", r
    assert r.elapsed >= 0.78, "two pushbacks of 400 ms took %.3fs" % r.elapsed
    assert srv.calls == []
    assert rg.metric("retrygate_upstream_faults_injected_total", upstream="api",
                     kind="abort") == 3
    assert rg.metric("retrygate_upstream_retries_total", upstream="api") == 2
    assert rg.metric("retrygate_upstream_grpc_responses_total", upstream="api",
                     status="unavailable") == 3
    rg.wait_metric(DOWN, 1, status="unavailable")


def test_fault_grpc_status_then_the_server_answers(grpcsrv, rg_factory, channel):
    """Half the attempts aborted UNAVAILABLE: every keyed call still ends OK through
    retrygate's retries (the fault is judged like the real thing)."""
    srv = grpcsrv()
    rule = {"kind": "abort", "percent": 50, "grpc_status": "unavailable"}
    rg = rg_factory(upstreams=api(srv, {"max_attempts": 20, "budget": {"ratio": 10}},
                                  faults=faults(rule)))
    ch = channel(rg)
    codes = [call(ch, key="g-%d" % i, timeout=8).code for i in range(12)]
    assert codes == [grpc.StatusCode.OK] * 12, codes
    assert len(srv.calls) == 12
    assert rg.metric("retrygate_upstream_retries_total", upstream="api") == \
        rg.metric("retrygate_upstream_faults_injected_total", upstream="api", kind="abort") > 0


def test_http_request_hit_by_a_grpc_only_rule_gets_status(grpcsrv, rg_factory, channel):
    """grpc_status is for gRPC calls: an HTTP request hit by the same rule gets `status`,
    503 by default, with no gRPC field; and a rule without grpc_status answers a gRPC call
    with its HTTP status (a client reads 503 as UNAVAILABLE)."""
    srv = grpcsrv()
    rules = [{"kind": "abort", "percent": 100, "path_prefix": "/test.", "grpc_status": "internal"},
             {"kind": "abort", "percent": 100, "status": 503}]
    rg = rg_factory(upstreams=api(srv, {"max_attempts": 1}, faults=faults(*rules)))
    r = rg.get("/test.Svc/Unary")
    assert r.status == 503 and r.headers.get("X-Retrygate-Fault") == "abort", r
    assert r.headers.get("grpc-status") is None, r
    r = call(channel(rg), path=UNARY)
    assert r.code == grpc.StatusCode.INTERNAL and r.md.get("x-retrygate-fault") == "abort", r
    r = call(channel(rg), path="/other.Svc/Unary")
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.md.get("grpc-status") is None, r
    rg.wait_metric(DOWN, 1, status="unavailable")
    assert rg.metric(DOWN, status="internal") == 1


# ------------------------------------------------------------------------------- holds

def test_a_retry_refused_for_another_calls_hold_says_which_endpoint_and_how_long(
        grpcsrv, rg_factory, channel, tmp_path):
    """A's pushback (5 s, beyond retry_after.max) holds the endpoint; B's UNAVAILABLE carries
    no hint, yet its retry is refused retry-after: the access log line names the held endpoint
    and the time left, /stats counts the refusal under held_endpoints, and the endpoint's last
    failure is named as gRPC names it."""
    srv = grpcsrv()
    log = tmp_path / "access.log"
    rg = rg_factory(upstreams=api(srv, {"retry_after": {"max": "1s"}}), access_log=str(log))
    ch = channel(rg)
    a = call(ch, key="A", script="fail:1:unavailable,pushback:5000")
    assert a.code == grpc.StatusCode.UNAVAILABLE, a
    b = call(ch, key="B", script="fail:1:unavailable")
    assert b.code == grpc.StatusCode.UNAVAILABLE, b
    assert b.md.get("x-retrygate-retry-refused") == "retry-after", b

    recs = log_records(log, 2)
    assert "held" not in recs[0], recs[0]      # A's own pushback refused it
    held = recs[1].get("held")
    assert recs[1]["retry_refused"] == "retry-after", recs[1]
    assert held and held["endpoint"] == srv.endpoint, recs[1]
    assert 2500 < held["ms_left"] <= 5000, held

    st = json.loads(rg.admin("GET", "/stats").body)["upstreams"]["api"]
    h = st["held_endpoints"][srv.endpoint]
    assert h["retries_refused"] == 1 and 2000 < h["hold_ms_left"] <= 5000, h
    addr = st["endpoints"][srv.endpoint]["addresses"][0]
    assert addr["last_failure"]["what"] == "unavailable", addr
