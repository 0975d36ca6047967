"""Keyed retries through an idempotent hop (SPEC §6 release_on, §4 rule 4 at the enforcing hop).

The README's topology: a caller's egress retrygate retries keyed writes; the service's ingress
retrygate enforces Idempotency-Key in front of it (`idempotency.enabled`, retrying only a
connect-failure itself, as conf/examples/ingress.yaml does). A service that refuses a request
(503, RESOURCE_EXHAUSTED; UNAVAILABLE where release_on lists it) did not take it: the ingress
releases the claim at once, so the egress's retry with the same key runs — every intent
executed once and answered, never a 409 / ABORTED caused by our own retry.

And the enforcing hop itself: the service behind it does not deduplicate, so a key there
licenses a retry only after an outcome that cannot have executed. A service that runs the
write and then answers UNAVAILABLE (or 502, or drops the connection) is not called again: the
client gets that answer with x-retrygate-retry-refused: non-idempotent, and each key runs once.
A write whose client goes away while it runs may have executed too: its key stays claimed.

Servers count executions per key: tests/tools/upstream.py (HTTP) and tests/tools/grpcserver.py
(grpcio); the gRPC clients are grpcio with their own retries off (one layer retries).
"""

import collections
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from harness import FAST_RETRY, reset, respond
from grpcserver import GrpcServer

pytestmark = pytest.mark.timeout(90)

UNARY = "/test.Svc/Unary"
KEYS = 24


def ingress_block(app, protocol=None, **idem):
    """The service's own sidecar: enforces the key; retries only what never reached it."""
    i = {"enabled": True, "lock_timeout": "30s"}
    i.update(idem)
    d = {"endpoints": [app], "retry": dict(FAST_RETRY, on=["connect-failure"]),
         "idempotency": i}
    if protocol:
        d["protocol"] = protocol
    return d


def egress_block(ingress, protocol=None, on=None):
    """The caller's sidecar: retries keyed writes (non_idempotent: require-key, the default)."""
    r = dict(FAST_RETRY, max_attempts=4)
    if on:
        r["on"] = on
    d = {"endpoints": ["127.0.0.1:%d" % ingress.port], "retry": r}
    if protocol:
        d["protocol"] = protocol
    return d


def in_parallel(fn, n, workers=8):
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, range(n)))


# ------------------------------------------------------------------ HTTP: egress -> ingress

class RefusingThenServing:
    """Refuses key i's first (i % 3) requests with STATUS (before doing anything), then
    executes the request (counted per Idempotency-Key) and answers 201."""

    def __init__(self, upstream, status):
        self.lock = threading.Lock()
        self.seen = collections.Counter()
        self.executed = collections.Counter()
        self.status = status
        upstream.set_default(self._handle)

    def _handle(self, req):
        key = req.header("Idempotency-Key")
        with self.lock:
            self.seen[key] += 1
            if self.seen[key] <= int(key.rsplit("-", 1)[1]) % 3:
                return respond(self.status, body=b"busy")
            self.executed[key] += 1
        return respond(201, body=("done " + key).encode())


@pytest.mark.parametrize("status", [503, 429])
def test_keyed_posts_through_an_idempotent_hop_run_once_and_are_answered(upstream, rg_factory,
                                                                         status):
    app = RefusingThenServing(upstream, status)
    ingress = rg_factory(upstreams={"app": ingress_block(upstream)})
    on = ["connect-failure", "reset", "timeout", 502, 503, 504] + ([429] if status == 429 else [])
    egress = rg_factory(upstreams={"pay": egress_block(ingress, on=on)})

    def one(i):
        key = "order-%d" % i
        r = egress.post("/orders", b'{"amount":1}', headers={"Idempotency-Key": key})
        return key, r
    got = in_parallel(one, KEYS)
    for key, r in got:
        assert r.status == 201 and r.body == ("done " + key).encode(), (key, r)
        want = int(key.rsplit("-", 1)[1]) % 3 + 1
        assert r.headers["X-Retrygate-Attempts"] == str(want), (key, r)
    # every intent executed exactly once, and no retry of ours met our own claim
    assert len(app.executed) == KEYS and set(app.executed.values()) == {1}, app.executed
    assert ingress.metric("retrygate_idempotency_total", upstream="app",
                          result="conflict") == 0
    # the refusals stored nothing: a repeat now gets the stored 201
    r = egress.post("/orders", b'{"amount":1}', headers={"Idempotency-Key": "order-2"})
    assert r.status == 201 and r.headers["Idempotency-Replayed"] == "true", r
    assert app.executed["order-2"] == 1


# ------------------------------------------------------------------ gRPC: egress -> ingress

def grpc_call(ch, key, script, timeout=10.0):
    """One unary call; never raises: (code, details, response or None, metadata dict)."""
    md = [("idempotency-key", key), ("x-script", script)]
    try:
        resp, c = ch.unary_unary(UNARY).with_call(b"pay", metadata=md, timeout=timeout)
        meta = dict(c.initial_metadata() or ())
        meta.update(dict(c.trailing_metadata() or ()))
        return c.code(), c.details(), resp, meta
    except grpc.RpcError as e:
        meta = dict(e.initial_metadata() or ())
        meta.update(dict(e.trailing_metadata() or ()))
        return e.code(), e.details(), None, meta


@pytest.mark.parametrize("code,release_on", [
    ("resource-exhausted", None),                                   # the default release_on
    ("unavailable", [429, 503, "resource-exhausted", "unavailable"]),
])
def test_keyed_calls_through_an_idempotent_hop_run_once_and_are_answered(grpcsrv, rg_factory,
                                                                         code, release_on):
    srv = grpcsrv()
    idem = {"release_on": release_on} if release_on else {}
    ingress = rg_factory(upstreams={"app": ingress_block(srv.endpoint, "h2", **idem)})
    on = ["connect-failure", "reset", "timeout", 503, code]
    egress = rg_factory(upstreams={"pay": egress_block(ingress, "h2", on=on)})
    ch = grpc.insecure_channel("127.0.0.1:%d" % egress.port,
                               options=[("grpc.enable_retries", 0)])
    try:
        # key i: refused (before any side effect) on its first i % 3 calls, then served
        got = in_parallel(lambda i: grpc_call(ch, "call-%d" % i, "fail:%d:%s" % (i % 3, code)),
                          KEYS)
    finally:
        ch.close()
    for i, (c, details, resp, md) in enumerate(got):
        assert c == grpc.StatusCode.OK and resp == b"echo:pay", (i, c, details, md)
        assert md.get("x-retrygate-attempts") == str(i % 3 + 1), (i, md)
    assert srv.effects == {"call-%d" % i: 1 for i in range(KEYS)}, srv.effects
    assert ingress.metric("retrygate_idempotency_total", upstream="app",
                          result="conflict") == 0


# ------------------------------------------------------------------ the enforcing hop itself

def test_enforcing_hop_never_retries_a_call_that_may_have_run(grpcsrv, rg_factory):
    """The service executes each key's first call and answers UNAVAILABLE (grpcio's answer to
    a call it may have run), then would serve a retry by running it again: it does not
    deduplicate, this hop does. UNAVAILABLE is in retry.on but not in release_on."""
    srv = grpcsrv()
    rg = rg_factory(upstreams={"app": {"endpoints": [srv.endpoint], "protocol": "h2",
                                       "retry": dict(FAST_RETRY),
                                       "idempotency": {"enabled": True, "lock_timeout": "30s"}}})
    ch = grpc.insecure_channel("127.0.0.1:%d" % rg.port, options=[("grpc.enable_retries", 0)])
    try:
        got = in_parallel(lambda i: grpc_call(ch, "w-%d" % i, "fail:1:unavailable,executed"),
                          48, workers=16)
        for c, details, _, md in got:
            assert c == grpc.StatusCode.UNAVAILABLE and "grpcserver" in details, (c, details)
            assert md.get("x-retrygate-retry-refused") == "non-idempotent", md
            assert md.get("x-retrygate-attempts") == "1", md
        # the outcome is unknown: a repeat is not run again either
        c, details, _, _ = grpc_call(ch, "w-0", "fail:1:unavailable,executed")
        assert c == grpc.StatusCode.ABORTED and details == "idempotency-in-progress", (c, details)
    finally:
        ch.close()
    assert srv.effects == {"w-%d" % i: 1 for i in range(48)}, srv.effects
    assert len(srv.calls) == 48
    assert rg.metric("retrygate_upstream_retries_refused_total", upstream="app",
                     reason="non-idempotent") == 48


def test_enforcing_hop_retries_a_call_the_service_refused(grpcsrv, rg_factory):
    """RESOURCE_EXHAUSTED (in release_on, listed in retry.on) before any side effect: retried
    at the enforcing hop, and run once; refused on every attempt, the claim is released, so
    the caller's own retry with the same key runs at once."""
    srv = grpcsrv()
    rg = rg_factory(upstreams={"app": {
        "endpoints": [srv.endpoint], "protocol": "h2",
        "retry": dict(FAST_RETRY, on=["connect-failure", "unavailable", "resource-exhausted"]),
        "idempotency": {"enabled": True, "lock_timeout": "30s"}}})
    ch = grpc.insecure_channel("127.0.0.1:%d" % rg.port, options=[("grpc.enable_retries", 0)])
    try:
        c, details, resp, md = grpc_call(ch, "re-1", "fail:2:resource-exhausted")
        assert c == grpc.StatusCode.OK and resp == b"echo:pay", (c, details)
        assert md.get("x-retrygate-attempts") == "3", md
        # three refusals: the client gets the last, nothing is stored, the key is free
        c, details, _, md = grpc_call(ch, "re-2", "fail:3:resource-exhausted")
        assert c == grpc.StatusCode.RESOURCE_EXHAUSTED and "grpcserver" in details, (c, details)
        assert md.get("x-retrygate-retry-refused") == "max-attempts", md
        c, details, resp, md = grpc_call(ch, "re-2", "fail:3:resource-exhausted")
        assert c == grpc.StatusCode.OK and resp == b"echo:pay", (c, details, md)
        assert "idempotency-replayed" not in md, md
    finally:
        ch.close()
    assert srv.effects == {"re-1": 1, "re-2": 1}, srv.effects


class ExecutingThenFailing:
    """Executes every POST (counted per Idempotency-Key), then fails it with ANSWER."""

    def __init__(self, upstream, answer):
        self.lock = threading.Lock()
        self.executed = collections.Counter()
        self.answer = answer
        upstream.set_default(self._handle)

    def _handle(self, req):
        with self.lock:
            self.executed[req.header("Idempotency-Key")] += 1
        return self.answer()


@pytest.mark.parametrize("answer,status,reason", [
    (lambda: respond(502, body=b"bad gateway"), 502, None),
    (lambda: reset(), 502, "reset"),
])
def test_enforcing_hop_never_retries_a_post_that_may_have_run(upstream, rg_factory, answer,
                                                              status, reason):
    app = ExecutingThenFailing(upstream, answer)
    rg = rg_factory(upstreams={"app": {"endpoints": [upstream], "retry": dict(FAST_RETRY),
                                       "idempotency": {"enabled": True}}})
    got = in_parallel(lambda i: rg.post("/orders", b"x", headers={"Idempotency-Key": "p-%d" % i}),
                      16)
    for r in got:
        assert r.status == status and r.headers.get("X-Retrygate-Reason") == reason, r
        assert r.headers["X-Retrygate-Retry-Refused"] == "non-idempotent", r
        assert r.headers["X-Retrygate-Attempts"] == "1", r
    assert len(app.executed) == 16 and set(app.executed.values()) == {1}, app.executed
    # outcome unknown: the key stays claimed, the repeat runs nothing
    r = rg.post("/orders", b"x", headers={"Idempotency-Key": "p-3"})
    assert r.status == 409 and r.headers["X-Retrygate-Reason"] == "idempotency-in-progress", r
    assert app.executed["p-3"] == 1


def test_a_write_cut_in_flight_by_its_client_keeps_its_claim(upstream, rg_factory):
    """The client goes away while the app runs its keyed POST: the app may have executed it,
    so the key stays claimed (409 for a repeat), never a second execution."""
    upstream.set_default(lambda req: respond(201, body=b"done", delay=1.0)
                         if req.header("Idempotency-Key") else respond(200))
    rg = rg_factory(upstreams={"app": {"endpoints": [upstream], "retry": dict(FAST_RETRY),
                                       "idempotency": {"enabled": True}}})
    c = rg.raw_conn()
    c.send(b"POST /orders HTTP/1.1\r\nHost: a\r\nIdempotency-Key: cut-1\r\n"
           b"Content-Length: 1\r\n\r\nx")
    (q,) = upstream.wait_requests(1)
    c.close()
    assert upstream.wait_conn_closed(q.conn_id, timeout=5) == "peer"
    r = rg.post("/orders", b"x", headers={"Idempotency-Key": "cut-1"})
    assert r.status == 409 and r.headers["X-Retrygate-Reason"] == "idempotency-in-progress", r
    assert len(upstream.requests) == 1
