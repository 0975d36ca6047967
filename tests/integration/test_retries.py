"""SPEC §4 (retries), end to end: one test per rule and per refusal reason, each asserting the
status, X-Retrygate-Retry-Refused (or its absence), X-Retrygate-Attempts, the attempts the
scripted upstream saw, and that retrygate_upstream_retries_refused_total moved by exactly one
for exactly that reason. Then the outcomes (connect-failure, reset, timeout, bad response),
Retry-After (delta-seconds, HTTP-date, 0, malformed, honor: false, holds on endpoints), "the
client gets the last response any attempt produced", and the hop's own headers.

Timing is measured at the upstream (Request.time, the monotonic time its head arrived)."""

import email.utils
import json
import threading
import time

import pytest

from harness import (InThread, Refusing, close, echo, raw, reset, respond, retry_after, stall,
                     upstream_block, wait_for)

pytestmark = pytest.mark.timeout(30)

FAST = {"backoff": {"base": "1ms", "max": "5ms"}}
REASONS = ["max-attempts", "non-idempotent", "body-too-large", "deadline", "retry-after",
           "budget", "retries-in-flight", "nested", "disabled"]
REFUSED = "retrygate_upstream_retries_refused_total"


def api(up, retry=None, **more):
    """Upstream "api": endpoint(s) up, fast backoff unless retry overrides it."""
    return {"api": upstream_block(up, retry, base_retry=FAST, **more)}


def refusals(rg, upstream="api"):
    m = rg.metrics()
    return {r: m.value(REFUSED, upstream=upstream, reason=r) for r in REASONS}


class Refusals:
    """Snapshot of the refusal counters; expect(reason=n, ...) asserts exact deltas (all other
    reasons unchanged)."""

    def __init__(self, rg, upstream="api"):
        self.rg, self.upstream = rg, upstream
        self.before = refusals(rg, upstream)

    def expect(self, **deltas):
        want = {r: self.before[r] + deltas.get(r.replace("-", "_"), 0) for r in REASONS}
        try:
            wait_for(lambda: refusals(self.rg, self.upstream) == want, 3.0, 0.05,
                     "refusal counters %r" % want)
        except AssertionError:
            got = refusals(self.rg, self.upstream)
            raise AssertionError("refusal counter deltas: expected %r, got %r" % (
                {k: v - self.before[k] for k, v in want.items() if v != self.before[k]},
                {k: v - self.before[k] for k, v in got.items() if v != self.before[k]}))


def check(r, status, attempts, refused=None, reason=None):
    """Status, X-Retrygate-Attempts (exactly one), X-Retrygate-Retry-Refused (exactly this one,
    or none), and X-Retrygate-Reason (for responses made by retrygate; none otherwise)."""
    assert r.status == status, r
    assert r.headers.get_all("X-Retrygate-Attempts") == [str(attempts)], r
    if refused is None:
        assert "X-Retrygate-Retry-Refused" not in r.headers, r
    else:
        assert r.headers.get_all("X-Retrygate-Retry-Refused") == [refused], r
    if reason is None:
        assert "X-Retrygate-Reason" not in r.headers, r
    else:
        assert r.headers.get("X-Retrygate-Reason") == reason, r
        assert json.loads(r.body) == {"error": reason, "upstream": "api", "attempts": attempts}


def attempts_seen(up, n, settle=0.15):
    """Wait for n requests at the upstream, then make sure no more arrive."""
    up.wait_requests(n) if n else None
    time.sleep(settle)
    reqs = up.requests
    assert len(reqs) == n, "upstream saw %d attempts, expected %d: %s" % (len(reqs), n,
                                                                         up.summary())
    return reqs


def attempt_numbers(reqs):
    return [q.header("X-Retrygate-Attempt") for q in reqs]


# ------------------------------------------------------------------------------- rule 3 and basics

def test_max_attempts(upstream, rg_factory):
    upstream.set_default(respond(503, body=b"busy"))
    rg = rg_factory(upstreams=api(upstream, {"max_attempts": 3}))
    ref = Refusals(rg)
    r = rg.request("GET", "/m")
    check(r, 503, 3, "max-attempts")
    assert r.body == b"busy"
    reqs = attempts_seen(upstream, 3)
    assert attempt_numbers(reqs) == ["1", "2", "3"]
    assert all(q.header_all("X-Retrygate-Attempt") == [str(i + 1)] for i, q in enumerate(reqs))
    ref.expect(max_attempts=1)
    rg.wait_metric("retrygate_upstream_retries_total", 2, op="==", upstream="api")
    assert rg.metric("retrygate_upstream_attempts_total", upstream="api") == 3
    assert rg.metric("retrygate_upstream_requests_total", upstream="api") == 1
    assert rg.metric("retrygate_upstream_responses_total", upstream="api", code="5xx") == 3
    # client-visible duration: one observation for the request, all attempts included
    assert rg.metric("retrygate_upstream_request_duration_seconds_count", upstream="api") == 1
    assert rg.metric("retrygate_upstream_request_duration_seconds_bucket", upstream="api",
                     le="+Inf") == 1
    assert rg.metric("retrygate_downstream_requests_total", code="5xx") == 1


def test_max_attempts_1_makes_one_attempt(upstream, rg_factory):
    upstream.set_default(503)
    rg = rg_factory(upstreams=api(upstream, {"max_attempts": 1}))
    ref = Refusals(rg)
    check(rg.request("GET", "/m"), 503, 1, "max-attempts")
    attempts_seen(upstream, 1)
    ref.expect(max_attempts=1)


def test_retry_until_success(upstream, rg_factory):
    upstream.push(503, reset(), respond(200, body=b"ok"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    r = rg.request("GET", "/s")
    check(r, 200, 3)
    assert r.body == b"ok"
    assert attempt_numbers(attempts_seen(upstream, 3)) == ["1", "2", "3"]
    ref.expect()
    rg.wait_metric("retrygate_upstream_retries_total", 2, op="==", upstream="api")
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api", outcome="reset") == 1


@pytest.mark.parametrize("status", [500, 404, 429, 501])
def test_status_not_in_retry_on_is_relayed_without_refusal(upstream, rg_factory, status):
    upstream.set_default(respond(status, headers={"X-From": "up"}, body=b"as it came"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    r = rg.request("GET", "/n")
    check(r, status, 1)
    assert r.body == b"as it came" and r.headers["X-From"] == "up"
    attempts_seen(upstream, 1)
    ref.expect()


def test_retry_on_any_listed_status(upstream, rg_factory):
    upstream.push(500, 418, 200)
    upstream.set_default(503)
    rg = rg_factory(upstreams=api(upstream, {"on": [500, 418, "reset"]}))
    check(rg.request("GET", "/a"), 200, 3)
    # 503 is not listed here: relayed at once, no refusal header
    check(rg.request("GET", "/b"), 503, 1)
    attempts_seen(upstream, 4)


# ------------------------------------------------------------------------------- rule 4: methods

@pytest.mark.parametrize("method", ["GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"])
def test_idempotent_methods_are_retried_without_key(upstream, rg_factory, method):
    upstream.push(reset(), 503)
    rg = rg_factory(upstreams=api(upstream))
    r = rg.request(method, "/i", body=b"put-body" if method == "PUT" else None)
    check(r, 200, 3)
    reqs = attempts_seen(upstream, 3)
    assert all(q.method == method for q in reqs)
    if method == "PUT":
        assert [q.body for q in reqs] == [b"put-body"] * 3


@pytest.mark.parametrize("method", ["POST", "PATCH"])
@pytest.mark.parametrize("first", ["reset", "503"])
def test_non_idempotent_without_key_is_not_retried(upstream, rg_factory, method, first):
    upstream.push(reset() if first == "reset" else respond(503, body=b"unavailable"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    r = rg.request(method, "/pay", body=b"amount=10")
    if first == "reset":
        check(r, 502, 1, "non-idempotent", reason="reset")
    else:
        check(r, 503, 1, "non-idempotent")
        assert r.body == b"unavailable"
    attempts_seen(upstream, 1)
    ref.expect(non_idempotent=1)


def test_empty_idempotency_key_is_no_key(upstream, rg_factory):
    upstream.push(503)
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    check(rg.request("POST", "/pay", {"Idempotency-Key": ""}, b"x"), 503, 1, "non-idempotent")
    attempts_seen(upstream, 1)
    ref.expect(non_idempotent=1)


@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_post_with_key_is_retried_with_same_key_and_identical_body(upstream, rg_factory, chunked):
    body = bytes(range(256)) * 20 + b"\r\n0\r\n\r\n"      # binary, and framing-like bytes
    upstream.push(respond(503), reset(), respond(201, body=b"created"))
    rg = rg_factory(upstreams=api(upstream))
    send = [body[:1000], body[1000:3000], body[3000:]] if chunked else body
    r = rg.request("POST", "/pay", {"Idempotency-Key": "k-123", "Content-Type": "x/y"}, send,
                   chunked=chunked)
    check(r, 201, 3)
    assert r.body == b"created"
    reqs = attempts_seen(upstream, 3)
    assert [q.body for q in reqs] == [body] * 3
    assert [q.header_all("Idempotency-Key") for q in reqs] == [["k-123"]] * 3
    assert [q.header("Content-Type") for q in reqs] == ["x/y"] * 3
    assert attempt_numbers(reqs) == ["1", "2", "3"]


def test_custom_idempotency_header_is_the_key(upstream, rg_factory):
    upstream.push(503, 200, 503)
    rg = rg_factory(upstreams=api(upstream, idempotency={"header": "X-Op-Id"}))
    ref = Refusals(rg)
    check(rg.request("POST", "/pay", {"X-Op-Id": "op-1"}, b"a"), 200, 2)
    # the default header name is not the key any more
    check(rg.request("POST", "/pay", {"Idempotency-Key": "k"}, b"a"), 503, 1, "non-idempotent")
    reqs = attempts_seen(upstream, 3)
    assert [q.header("X-Op-Id") for q in reqs[:2]] == ["op-1", "op-1"]
    ref.expect(non_idempotent=1)


def test_post_after_connect_failure_is_retried_without_key(rg_factory):
    with Refusing() as dead:
        rg = rg_factory(upstreams=api(dead, {"max_attempts": 3}))
        ref = Refusals(rg)
        r = rg.request("POST", "/pay", body=b"x")
        check(r, 502, 3, "max-attempts", reason="connect-failure")
        ref.expect(max_attempts=1)
        rg.wait_metric("retrygate_upstream_outcomes_total", 3, op="==", upstream="api",
                       outcome="connect-failure")
        assert rg.metric("retrygate_upstream_retries_total", upstream="api") == 2


def test_post_after_connect_failure_reaches_the_live_endpoint(upstream, rg_factory):
    with Refusing() as dead:
        rg = rg_factory(upstreams=api([dead, upstream]))
        for i in range(4):
            r = rg.request("POST", "/pay/%d" % i, body=b"body-%d" % i)
            assert r.status == 200 and r.headers["X-Retrygate-Attempts"] in ("1", "2"), r
        reqs = attempts_seen(upstream, 4)
        # each POST executed exactly once, and at least one got there on a retry
        assert sorted(q.path for q in reqs) == ["/pay/0", "/pay/1", "/pay/2", "/pay/3"]
        assert "2" in attempt_numbers(reqs)
        assert rg.metric("retrygate_upstream_outcomes_total", upstream="api",
                         outcome="connect-failure") >= 1


def test_non_idempotent_never(upstream, rg_factory):
    upstream.set_default(503)
    rg = rg_factory(upstreams=api(upstream, {"non_idempotent": "never"}))
    ref = Refusals(rg)
    check(rg.request("POST", "/pay", {"Idempotency-Key": "k"}, b"x"), 503, 1, "non-idempotent")
    attempts_seen(upstream, 1)
    ref.expect(non_idempotent=1)
    # ... but a connect-failure provably never reached the upstream: retried even so
    with Refusing() as dead:
        rg2 = rg_factory(upstreams=api(dead, {"non_idempotent": "never"}))
        check(rg2.request("POST", "/pay", body=b"x"), 502, 3, "max-attempts",
              reason="connect-failure")


def test_non_idempotent_always(upstream, rg_factory):
    upstream.push(reset(), 503)
    rg = rg_factory(upstreams=api(upstream, {"non_idempotent": "always"}))
    check(rg.request("POST", "/pay", body=b"x"), 200, 3)
    assert [q.body for q in attempts_seen(upstream, 3)] == [b"x"] * 3


# ------------------------------------------------------------------------------- rule 5: body

@pytest.mark.parametrize("first", ["503", "reset"])
@pytest.mark.parametrize("chunked", [False, True], ids=["length", "chunked"])
def test_body_over_max_body_is_streamed_and_not_resent(upstream, rg_factory, first, chunked):
    body = b"B" * 4096
    upstream.push(reset() if first == "reset" else respond(503, body=b"busy"))
    rg = rg_factory(upstreams=api(upstream, {"max_body": "1KiB"}))
    ref = Refusals(rg)
    send = [body[i:i + 512] for i in range(0, 4096, 512)] if chunked else body
    r = rg.request("PUT", "/big", {"Idempotency-Key": "k"}, send, chunked=chunked)
    if first == "reset":
        check(r, 502, 1, "body-too-large", reason="reset")
    else:
        check(r, 503, 1, "body-too-large")
    (q,) = attempts_seen(upstream, 1)
    assert q.body == body
    ref.expect(body_too_large=1)


def test_body_at_max_body_is_retried(upstream, rg_factory):
    body = b"b" * 1024
    upstream.push(503)
    rg = rg_factory(upstreams=api(upstream, {"max_body": "1KiB"}))
    check(rg.request("PUT", "/edge", body=body), 200, 2)
    assert [q.body for q in attempts_seen(upstream, 2)] == [body, body]


def test_body_too_large_holds_for_connect_failure(rg_factory):
    with Refusing() as dead:
        rg = rg_factory(upstreams=api(dead, {"max_body": "1KiB"}))
        ref = Refusals(rg)
        r = rg.request("PUT", "/big", body=b"B" * 4096)
        check(r, 502, 1, "body-too-large", reason="connect-failure")
        ref.expect(body_too_large=1)


def test_non_idempotent_is_named_before_body_too_large(upstream, rg_factory):
    upstream.push(503)
    rg = rg_factory(upstreams=api(upstream, {"max_body": "1KiB"}))
    ref = Refusals(rg)
    check(rg.request("POST", "/big", body=b"B" * 4096), 503, 1, "non-idempotent")
    ref.expect(non_idempotent=1)


# ------------------------------------------------------------------------------- rule 6: the wait

def test_deadline_refuses_a_backoff_that_would_end_past_it(upstream, rg_factory):
    upstream.push(respond(503, body=b"b"), reset())
    rg = rg_factory(upstreams=api(upstream, {"backoff": {"base": "1h", "max": "1h"}}))
    ref = Refusals(rg)
    t = time.monotonic()
    r = rg.request("GET", "/d", {"X-Timeout-Ms": "2000"})
    check(r, 503, 1, "deadline")
    r = rg.request("GET", "/d", {"X-Timeout-Ms": "2000"})
    check(r, 502, 1, "deadline", reason="reset")
    assert time.monotonic() - t < 1.0, "a wait that cannot fit must not be started"
    attempts_seen(upstream, 2)
    ref.expect(deadline=2)


def test_deadline_refuses_a_retry_after_that_does_not_fit(upstream, rg_factory):
    upstream.push(retry_after(2, body=b"later"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    t = time.monotonic()
    r = rg.request("GET", "/d", {"X-Timeout-Ms": "1000"})
    assert time.monotonic() - t < 0.8
    check(r, 503, 1, "deadline")
    assert r.headers["Retry-After"] == "2" and r.body == b"later"
    attempts_seen(upstream, 1)
    ref.expect(deadline=1)


def test_deadline_min_is_kept_free_at_the_end(upstream, rg_factory):
    """Retry-After: 1 with 1080 ms left: the retry would start with 80 ms left. With
    deadline.min 100ms that is refused; with 5ms it is made."""
    upstream.push(retry_after(1))
    rg = rg_factory(upstreams=api(upstream, deadline={"min": "100ms"}))
    ref = Refusals(rg)
    check(rg.request("GET", "/d", {"X-Timeout-Ms": "1080"}), 503, 1, "deadline")
    ref.expect(deadline=1)
    upstream.reset_log()
    upstream.push(retry_after(1))
    rg2 = rg_factory(upstreams=api(upstream, deadline={"min": "5ms"}))
    check(rg2.request("GET", "/d", {"X-Timeout-Ms": "1080"}), 200, 2)
    attempts_seen(upstream, 2)


@pytest.mark.parametrize("status", [503, 429])
def test_retry_after_above_max_is_relayed_unchanged(upstream, rg_factory, status):
    upstream.push(retry_after(30, status=status, headers={"X-Keep": "me"}, body=b"come back"))
    rg = rg_factory(upstreams=api(upstream, {"on": ["reset", 503, 429]}))
    ref = Refusals(rg)
    t = time.monotonic()
    r = rg.request("GET", "/ra")
    assert time.monotonic() - t < 1.0
    check(r, status, 1, "retry-after")
    assert r.headers.get_all("Retry-After") == ["30"]
    assert r.headers["X-Keep"] == "me" and r.body == b"come back"
    attempts_seen(upstream, 1)
    ref.expect(retry_after=1)


def test_retry_after_http_date_above_max(upstream, rg_factory):
    date = email.utils.formatdate(time.time() + 60, usegmt=True)
    upstream.push(retry_after(date))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    r = rg.request("GET", "/ra")
    check(r, 503, 1, "retry-after")
    assert r.headers["Retry-After"] == date
    ref.expect(retry_after=1)


def test_retry_after_is_named_before_deadline(upstream, rg_factory):
    upstream.push(retry_after(30))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    check(rg.request("GET", "/ra", {"X-Timeout-Ms": "500"}), 503, 1, "retry-after")
    ref.expect(retry_after=1)


# ------------------------------------------------------------------------------- rule 7: gates

def test_budget_refuses_the_second_retry(upstream, rg_factory):
    upstream.push(503, 200, respond(503, body=b"no token"))
    rg = rg_factory(upstreams=api(upstream, {
        "budget": {"ratio": 0, "min_per_second": 0, "max_tokens": 1}}))
    ref = Refusals(rg)
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == 1
    check(rg.request("GET", "/b1"), 200, 2)
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == 0
    r = rg.request("GET", "/b2")
    check(r, 503, 1, "budget")
    assert r.body == b"no token"
    attempts_seen(upstream, 3)
    ref.expect(budget=1)
    assert rg.metric("retrygate_upstream_retries_total", upstream="api") == 1


def test_no_token_is_taken_when_another_rule_refuses(upstream, rg_factory):
    upstream.push(503, 503, 503)
    rg = rg_factory(upstreams=api(upstream, {
        "max_attempts": 2, "budget": {"ratio": 0, "min_per_second": 0, "max_tokens": 1}}))
    ref = Refusals(rg)
    # POST without key: refused non-idempotent; then max-attempts after one retry
    check(rg.request("POST", "/x", body=b"x"), 503, 1, "non-idempotent")
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == 1
    check(rg.request("GET", "/y"), 503, 2, "max-attempts")
    assert rg.metric("retrygate_upstream_retry_budget_tokens", upstream="api") == 0
    ref.expect(non_idempotent=1, max_attempts=1)


def test_retries_in_flight_slot_is_held_through_the_wait(upstream, rg_factory):
    upstream.push(retry_after(1), respond(503, body=b"no slot"))
    rg = rg_factory(upstreams=api(upstream, concurrency={"max_retries_in_flight": 1}))
    ref = Refusals(rg)
    a = InThread(rg.request, "GET", "/a")
    upstream.wait_requests(1)
    rg.wait_metric("retrygate_upstream_retries_in_flight", 1, op="==", upstream="api")
    r = rg.request("GET", "/b")
    check(r, 503, 1, "retries-in-flight")
    assert r.body == b"no slot"
    check(a(timeout=15), 200, 2)
    reqs = attempts_seen(upstream, 3)
    assert [(q.path, q.header("X-Retrygate-Attempt")) for q in reqs] == \
        [("/a", "1"), ("/b", "1"), ("/a", "2")]
    ref.expect(retries_in_flight=1)
    rg.wait_metric("retrygate_upstream_retries_in_flight", 0, op="==", upstream="api")


def test_budget_is_named_before_retries_in_flight(upstream, rg_factory):
    """Both gates of rule 7 refuse: the budget comes first in SPEC §4's list."""
    upstream.push(retry_after(1), 503)
    rg = rg_factory(upstreams=api(upstream, {
        "budget": {"ratio": 0, "min_per_second": 0, "max_tokens": 1}},
        concurrency={"max_retries_in_flight": 1}))
    ref = Refusals(rg)
    a = InThread(rg.request, "GET", "/a")
    upstream.wait_requests(1)
    rg.wait_metric("retrygate_upstream_retries_in_flight", 1, op="==", upstream="api")
    check(rg.request("GET", "/b"), 503, 1, "budget")
    check(a(timeout=15), 200, 2)
    ref.expect(budget=1)


def test_retry_without_max_in_flight_slot_at_send_time(upstream, rg_factory):
    """The retry of /a waits 1 s (Retry-After); meanwhile /b takes the only max_in_flight slot.
    When /a's retry is due, no slot is free: it ends refused retries-in-flight and the client
    gets the 503 its first attempt produced."""
    gate = threading.Event()
    upstream.on_path("/b", respond(200, body=b"b done", hold=gate, hold_timeout=10))
    upstream.push(retry_after(1, body=b"first"))
    rg = rg_factory(upstreams=api(upstream, {"per_try_timeout": "5s"},
                                  concurrency={"max_in_flight": 1}))
    ref = Refusals(rg)
    a = InThread(rg.request, "GET", "/a")
    upstream.wait_requests(1)
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    b = InThread(rg.request, "GET", "/b")
    upstream.wait_requests(2)
    ra = a(timeout=15)
    check(ra, 503, 1, "retries-in-flight")
    assert ra.body == b"first" and ra.headers["Retry-After"] == "1"
    gate.set()
    check(b(timeout=15), 200, 1)
    attempts_seen(upstream, 2)
    ref.expect(retries_in_flight=1)
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")
    rg.wait_metric("retrygate_upstream_retries_in_flight", 0, op="==", upstream="api")


# ------------------------------------------------------------------------------- rule 2: nested

@pytest.mark.parametrize("hdrs", [
    {"X-Retrygate-Attempts": "2"},
    {"X-Retrygate-Attempts": "3", "X-Retrygate-Retry-Refused": "max-attempts"},
    {"X-Retrygate-Retry-Refused": "budget"},
    {"X-Retrygate-Attempts": "1", "X-Retrygate-Retry-Refused": "non-idempotent"},
], ids=["attempts-2", "attempts-3-refused", "refused-only", "attempts-1-refused"])
def test_response_from_a_deeper_retrygate_is_not_retried(upstream, rg_factory, hdrs):
    upstream.push(respond(503, headers=hdrs, body=b"deep"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    r = rg.request("GET", "/n")
    # this hop's headers replace the deeper hop's
    check(r, 503, 1, "nested")
    assert r.body == b"deep"
    attempts_seen(upstream, 1)
    ref.expect(nested=1)


def test_response_with_attempts_1_is_not_nested(upstream, rg_factory):
    upstream.push(respond(503, headers={"X-Retrygate-Attempts": "1"}))
    rg = rg_factory(upstreams=api(upstream))
    check(rg.request("GET", "/n"), 200, 2)
    attempts_seen(upstream, 2)


@pytest.mark.parametrize("name,value", [("X-Retrygate-Attempt", "2"),
                                        ("x-envoy-attempt-count", "2"),
                                        ("grpc-previous-rpc-attempts", "1"),
                                        ("X-Retrygate-Attempt", "5")])
@pytest.mark.parametrize("outcome", ["503", "reset"])
def test_request_marked_as_a_retry_gets_one_attempt(upstream, rg_factory, name, value, outcome):
    upstream.set_default(reset() if outcome == "reset" else respond(503, body=b"x"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    r = rg.request("GET", "/m", {name: value})
    if outcome == "reset":
        check(r, 502, 1, "nested", reason="reset")
    else:
        check(r, 503, 1, "nested")
    (q,) = attempts_seen(upstream, 1)
    assert q.header_all(name) == [value], "marker %s not forwarded unchanged: %r" % (
        name, q.headers.items())
    if name == "X-Retrygate-Attempt":
        assert q.header_all("X-Retrygate-Attempt") == [value]
    ref.expect(nested=1)


@pytest.mark.parametrize("name,value", [("X-Retrygate-Attempt", "1"),
                                        ("x-envoy-attempt-count", "1"),
                                        ("grpc-previous-rpc-attempts", "0")])
def test_request_marked_as_a_first_attempt_is_retried(upstream, rg_factory, name, value):
    upstream.push(503, 503)
    rg = rg_factory(upstreams=api(upstream))
    check(rg.request("GET", "/m", {name: value}), 200, 3)
    reqs = attempts_seen(upstream, 3)
    # this hop numbers its own attempts: one X-Retrygate-Attempt header, never the client's
    assert [q.header_all("X-Retrygate-Attempt") for q in reqs] == [["1"], ["2"], ["3"]]


# ------------------------------------------------------------------------------- rule 1: disabled

def test_retry_enabled_false(upstream, rg_factory):
    upstream.push(respond(503, body=b"s"), reset(), respond(500, body=b"t"))
    rg = rg_factory(upstreams=api(upstream, {"enabled": False}))
    ref = Refusals(rg)
    check(rg.request("GET", "/d"), 503, 1, "disabled")
    check(rg.request("GET", "/d"), 502, 1, "disabled", reason="reset")
    # an outcome not in retry.on is not a refusal at all (rule 1 names "disabled" only for
    # outcomes that are listed)
    check(rg.request("GET", "/d"), 500, 1)
    attempts_seen(upstream, 3)
    ref.expect(disabled=2)


def test_runtime_switch(upstream_factory, rg_factory):
    up, other = upstream_factory(), upstream_factory()
    up.set_default(503)
    rg = rg_factory(upstreams={"api": {"endpoints": [up], "retry": FAST},
                               "other": {"endpoints": [other], "retry": FAST}})
    assert rg.retries() == {"api": True, "other": True}
    resp = rg.set_retries(False, upstream="api")
    assert resp.status == 200 and resp.json() == {"api": False, "other": True}
    assert rg.retries() == {"api": False, "other": True}
    ref = Refusals(rg)
    check(rg.request("GET", "/x", {"Host": "api"}), 503, 1, "disabled")
    attempts_seen(up, 1)
    ref.expect(disabled=1)
    assert rg.set_retries(True, upstream="api").json() == {"api": True, "other": True}
    up.reset_log()
    check(rg.request("GET", "/x", {"Host": "api"}), 503, 3, "max-attempts")
    attempts_seen(up, 3)
    # without upstream=: all of them
    assert rg.set_retries(False).json() == {"api": False, "other": False}
    assert rg.set_retries(True).json() == {"api": True, "other": True}
    assert rg.set_retries(False, upstream="nope").status == 404
    assert rg.retries() == {"api": True, "other": True}


# ------------------------------------------------------------------------------- outcomes

@pytest.mark.parametrize("listed", [True, False])
def test_connect_failure(rg_factory, listed):
    on = ["connect-failure", "reset", "timeout", 502, 503, 504] if listed else ["reset", 503]
    with Refusing() as dead:
        rg = rg_factory(upstreams=api(dead, {"on": on}))
        ref = Refusals(rg)
        r = rg.request("GET", "/c")
        if listed:
            check(r, 502, 3, "max-attempts", reason="connect-failure")
            ref.expect(max_attempts=1)
        else:
            check(r, 502, 1, reason="connect-failure")
            ref.expect()
        rg.wait_metric("retrygate_upstream_outcomes_total", 3 if listed else 1, op="==",
                       upstream="api", outcome="connect-failure")


def test_connect_timeout_is_a_connect_failure(blackhole, rg_factory):
    rg = rg_factory(upstreams=api(blackhole, {"max_attempts": 2}, connect_timeout="150ms"))
    t = time.monotonic()
    r = rg.request("POST", "/c", body=b"never sent")      # provably unsent: retried
    took = time.monotonic() - t
    check(r, 502, 2, "max-attempts", reason="connect-failure")
    assert 0.29 <= took < 2.0, took
    rg.wait_metric("retrygate_upstream_outcomes_total", 2, op="==", upstream="api",
                   outcome="connect-failure")


@pytest.mark.parametrize("listed", [True, False])
@pytest.mark.parametrize("how", ["reset", "close"])
def test_reset(upstream, rg_factory, listed, how):
    upstream.set_default(reset() if how == "reset" else close())
    on = ["reset", 503] if listed else ["connect-failure", 503]
    rg = rg_factory(upstreams=api(upstream, {"on": on}))
    ref = Refusals(rg)
    r = rg.request("GET", "/r")
    if listed:
        check(r, 502, 3, "max-attempts", reason="reset")
    else:
        check(r, 502, 1, reason="reset")
    attempts_seen(upstream, 3 if listed else 1)
    ref.expect(max_attempts=1 if listed else 0)
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api",
                     outcome="reset") == (3 if listed else 1)


@pytest.mark.parametrize("listed", [True, False])
def test_timeout(upstream, rg_factory, listed):
    upstream.set_default(stall(5))
    on = ["timeout", 503] if listed else ["reset", 503]
    rg = rg_factory(upstreams=api(upstream, {"on": on, "per_try_timeout": "150ms"}))
    ref = Refusals(rg)
    t = time.monotonic()
    r = rg.request("GET", "/t", {"X-Timeout-Ms": "5000"})
    took = time.monotonic() - t
    if listed:
        check(r, 504, 3, "max-attempts", reason="timeout")
        assert 0.45 <= took < 2.5
    else:
        check(r, 504, 1, reason="timeout")
        assert 0.15 <= took < 1.5
    reqs = attempts_seen(upstream, 3 if listed else 1)
    assert all(100 <= int(q.header("X-Timeout-Ms")) <= 150 for q in reqs)
    ref.expect(max_attempts=1 if listed else 0)
    rg.wait_metric("retrygate_upstream_outcomes_total", 3 if listed else 1, op="==",
                   upstream="api", outcome="timeout")
    # each timed-out attempt's connection was closed
    for q in reqs:
        assert upstream.wait_conn_closed(q.conn_id, timeout=3) == "peer"


BAD = b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello"


def test_invalid_response_counts_as_reset(upstream, rg_factory):
    upstream.push(raw(BAD), raw(b"HTTP/9 what\r\n\r\n"))
    rg = rg_factory(upstreams=api(upstream))
    check(rg.request("GET", "/bad"), 200, 3)
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api", outcome="reset") == 2
    upstream.push(raw(BAD))
    ref = Refusals(rg)
    check(rg.request("POST", "/bad", body=b"x"), 502, 1, "non-idempotent", reason="bad-response")
    ref.expect(non_idempotent=1)


# ------------------------------------------------------------------------------- the last response

def test_last_response_wins_over_a_later_connect_failure(upstream, rg_factory):
    """503 from the live endpoint, then the retry goes to the untried dead one: the client gets
    the 503, not a 502 made by retrygate."""
    upstream.set_default(respond(503, headers={"X-Real": "yes"}, body=b"real 503"))
    with Refusing() as dead:
        rg = rg_factory(upstreams=api([upstream, dead], {"max_attempts": 2}))
        ref = Refusals(rg)
        for i in range(6):
            r = rg.request("GET", "/l")
            # either order (503 then connect-failure, or connect-failure then 503): the
            # client gets the 503 the live endpoint produced
            check(r, 503, 2, "max-attempts")
            assert r.body == b"real 503" and r.headers["X-Real"] == "yes", r
            if upstream.last.header("X-Retrygate-Attempt") == "1":
                break
        assert upstream.last.header("X-Retrygate-Attempt") == "1", \
            "the live endpoint never got a first attempt"
        ref.expect(max_attempts=i + 1)
        assert upstream.request_count == i + 1
        assert rg.metric("retrygate_upstream_outcomes_total", upstream="api",
                         outcome="connect-failure") == i + 1


@pytest.mark.parametrize("then", ["reset", "timeout", "close"])
def test_last_response_wins_over_later_failures(upstream, rg_factory, then):
    later = {"reset": reset(), "timeout": stall(3), "close": close()}[then]
    upstream.push(respond(503, headers={"X-N": "1"}, body=b"the response"), later, later)
    rg = rg_factory(upstreams=api(upstream, {"per_try_timeout": "200ms"}))
    r = rg.request("GET", "/l", {"X-Timeout-Ms": "5000"})
    check(r, 503, 3, "max-attempts")
    assert r.body == b"the response" and r.headers["X-N"] == "1"
    attempts_seen(upstream, 3)


def test_the_last_of_several_responses_wins(upstream, rg_factory):
    upstream.push(respond(503, body=b"one"), respond(502, body=b"two"), reset())
    rg = rg_factory(upstreams=api(upstream))
    r = rg.request("GET", "/l")
    check(r, 502, 3, "max-attempts")
    assert r.body == b"two"


# ------------------------------------------------------------------------------- Retry-After

def test_retry_after_delta_seconds_is_waited_and_replaces_the_backoff(upstream, rg_factory):
    upstream.push(retry_after(1))
    # a 1 h backoff would never fit; the hint replaces it; 1 s is not more than max 1s
    rg = rg_factory(upstreams=api(upstream, {"backoff": {"base": "1h", "max": "1h"},
                                             "retry_after": {"max": "1s"}}))
    r = rg.request("GET", "/ra")
    check(r, 200, 2)
    q0, q1 = attempts_seen(upstream, 2)
    gap = q1.time - q0.time
    assert 0.999 <= gap < 2.0, "retry came %.3fs after the 503 with Retry-After: 1" % gap


def test_retry_after_http_date_is_waited(upstream, rg_factory):
    target = int(time.time()) + 2
    date = email.utils.formatdate(target, usegmt=True)
    upstream.push(retry_after(date))
    rg = rg_factory(upstreams=api(upstream))
    check(rg.request("GET", "/ra"), 200, 2)
    q0, q1 = attempts_seen(upstream, 2)
    wall_q1 = time.time() - (time.monotonic() - q1.time)
    assert wall_q1 >= target - 0.01, "retry %.3fs before the date it was told" % (target - wall_q1)
    assert q1.time - q0.time < 3.5


@pytest.mark.parametrize("value", ["0", "soon", "1.5", "-1", ""])
def test_retry_after_zero_or_malformed_is_no_wait_and_no_hold(upstream, rg_factory, value):
    upstream.push(respond(503, headers={"Retry-After": value}), echo(), 503)
    rg = rg_factory(upstreams=api(upstream))
    t = time.monotonic()
    check(rg.request("GET", "/ra"), 200, 2)
    # no hold was set: the next request's retry is not delayed either
    check(rg.request("GET", "/ra"), 200, 2)
    assert time.monotonic() - t < 1.0
    attempts_seen(upstream, 4)


def test_retry_after_past_date_is_no_wait(upstream, rg_factory):
    upstream.push(retry_after(email.utils.formatdate(time.time() - 3600, usegmt=True)))
    rg = rg_factory(upstreams=api(upstream))
    t = time.monotonic()
    check(rg.request("GET", "/ra"), 200, 2)
    assert time.monotonic() - t < 1.0


def test_retry_after_honor_false(upstream, rg_factory):
    upstream.push(retry_after(30), echo(), 503)
    rg = rg_factory(upstreams=api(upstream, {"retry_after": {"honor": False}}))
    t = time.monotonic()
    check(rg.request("GET", "/ra"), 200, 2)
    # no hold either: another request's retry goes at once
    check(rg.request("GET", "/ra"), 200, 2)
    assert time.monotonic() - t < 1.0
    attempts_seen(upstream, 4)


def test_retry_after_only_counts_on_429_and_503(upstream, rg_factory):
    upstream.push(respond(500, headers={"Retry-After": "30"}), echo(), respond(503))
    rg = rg_factory(upstreams=api(upstream, {"on": [500, 503]}))
    t = time.monotonic()
    check(rg.request("GET", "/ra"), 200, 2)
    check(rg.request("GET", "/ra"), 200, 2)      # and no hold was set by the 500
    assert time.monotonic() - t < 1.0


def test_hold_delays_other_requests_retries_not_their_first_attempts(upstream, rg_factory):
    """A POST (not retried) gets 503 + Retry-After: 1: the endpoint is held for 1 s. A GET right
    after still makes its first attempt at once, but its retry waits for the hold's end."""
    upstream.push(retry_after(1, body=b"post"), respond(503, body=b"get"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    check(rg.request("POST", "/p", body=b"x"), 503, 1, "non-idempotent")
    t_post_answered = time.monotonic()
    check(rg.request("GET", "/g"), 200, 2)
    qp, qg1, qg2 = attempts_seen(upstream, 3)
    assert qg1.time - t_post_answered < 0.5, "first attempt delayed by the hold"
    assert qg2.time - qp.time >= 0.999, "retry sent %.3fs into a 1 s hold" % (qg2.time - qp.time)
    ref.expect(non_idempotent=1)


def test_hold_lasts_past_retry_after_max(upstream, rg_factory):
    upstream.push(retry_after(30), respond(503, body=b"plain"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    check(rg.request("GET", "/a"), 503, 1, "retry-after")
    # the endpoint stays held for 30 s: a plain 503 cannot be retried within retry_after.max
    r = rg.request("GET", "/b")
    check(r, 503, 1, "retry-after")
    assert r.body == b"plain"
    attempts_seen(upstream, 2)
    ref.expect(retry_after=2)


def test_429_without_retry_on_still_sets_a_hold(upstream, rg_factory):
    upstream.push(retry_after(30, status=429), 503)
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    check(rg.request("GET", "/a"), 429, 1)          # 429 is not in the default retry.on
    check(rg.request("GET", "/b"), 503, 1, "retry-after")
    ref.expect(retry_after=1)


def test_hold_on_one_endpoint_sends_the_retry_to_the_other(upstream_factory, rg_factory):
    a, b = upstream_factory(name="A"), upstream_factory(name="B")
    for u in (a, b):
        u.on_path(lambda q: q.path == "/one" and q.header("X-Retrygate-Attempt") == "1",
                  default=retry_after(1))
        u.on_path(lambda q: q.path == "/hold", default=retry_after(4))
        u.on_path(lambda q: q.path == "/r503" and q.header("X-Retrygate-Attempt") == "1",
                  default=503)
    rg = rg_factory(upstreams=api([a, b]))

    # 1. 503 + Retry-After: 1 from one endpoint: the retry goes to the other, after 1 s
    check(rg.request("GET", "/one"), 200, 2)
    reqs = sorted(a.requests + b.requests, key=lambda q: q.time)
    assert [q.header("X-Retrygate-Attempt") for q in reqs] == ["1", "2"]
    assert reqs[0].upstream != reqs[1].upstream, "retry went to the endpoint it was told to avoid"
    assert reqs[1].time - reqs[0].time >= 0.999

    # 2. hold one endpoint for 4 s (a POST is not retried, but the hold is set)
    check(rg.request("POST", "/hold", body=b"x"), 503, 1, "non-idempotent")
    held = a if any(q.path == "/hold" for q in a.requests) else b
    free = b if held is a else a
    t_hold = time.monotonic()

    # 3. first attempts still go to the held endpoint: round-robin continues
    for i in range(6):
        check(rg.request("GET", "/spread/%d" % i), 200, 1)
    firsts = [q for q in held.requests if q.path.startswith("/spread/")]
    assert len(firsts) >= 1, "no first attempt went to the held endpoint (%s)" % held.name

    # 4. retries never go to the held endpoint while the hold lasts
    for i in range(4):
        check(rg.request("GET", "/r503"), 200, 2)
    assert time.monotonic() - t_hold < 3.5, "retries waited for the hold instead of using %s" \
        % free.name
    # (step 1's retry may have gone to it before its hold: only step 4's retries count)
    assert not [q for q in held.requests
                if q.path == "/r503" and q.header("X-Retrygate-Attempt") != "1"]


# ------------------------------------------------------------------------------- this hop's headers

def test_x_retrygate_attempts_from_the_upstream_is_replaced(upstream, rg_factory):
    upstream.push(respond(200, headers={"X-Retrygate-Attempts": "7"}),
                  respond(404, headers=[("X-Retrygate-Attempts", "2"),
                                        ("X-Retrygate-Attempts", "9")]))
    rg = rg_factory(upstreams=api(upstream))
    check(rg.request("GET", "/h"), 200, 1)
    check(rg.request("GET", "/h"), 404, 1)


def test_retry_refused_from_the_upstream_passes_unless_this_hop_refused(upstream, rg_factory):
    upstream.push(respond(200, headers={"X-Retrygate-Retry-Refused": "budget"}),
                  respond(500, headers={"X-Retrygate-Retry-Refused": "deadline"}),
                  respond(503, headers={"X-Retrygate-Retry-Refused": "deadline"}))
    rg = rg_factory(upstreams=api(upstream))
    check(rg.request("GET", "/h"), 200, 1, "budget")        # not ours: passes through
    check(rg.request("GET", "/h"), 500, 1, "deadline")      # 500 not in retry.on: passes
    check(rg.request("GET", "/h"), 503, 1, "nested")        # we refused: ours replaces it


def test_retrygate_made_response_after_retries_counts_them(upstream, rg_factory):
    upstream.set_default(reset())
    rg = rg_factory(upstreams=api(upstream, {"max_attempts": 4}))
    r = rg.request("GET", "/h")
    check(r, 502, 4, "max-attempts", reason="reset")
    assert r.json() == {"error": "reset", "upstream": "api", "attempts": 4}


# ------------------------------------------------------------------------------- more of §4

def test_hold_set_during_a_wait_delays_or_refuses_the_retry(upstream, rg_factory):
    """Two GETs wait 1 s (Retry-After: 1). Meanwhile a POST gets 503 + Retry-After: 2: the
    endpoint's hold moves to +2 s. The GET whose deadline the new hold does not fit is refused
    (deadline) when its wait ends; the other waits for the hold's end."""
    upstream.on_path("/short", retry_after(1, body=b"short"), default=echo())
    upstream.on_path("/long", retry_after(1, body=b"long"), default=echo())
    upstream.on_path("/post", retry_after(2, body=b"post"))
    rg = rg_factory(upstreams=api(upstream))
    ref = Refusals(rg)
    short = InThread(rg.request, "GET", "/short", {"X-Timeout-Ms": "1700"})
    long_ = InThread(rg.request, "GET", "/long", {"X-Timeout-Ms": "5000"})
    upstream.wait_requests(2)
    check(rg.request("POST", "/post", body=b"x"), 503, 1, "non-idempotent")
    t_post = upstream.wait_for(lambda: [q.time for q in upstream.requests if q.path == "/post"],
                               what="the POST")[0]
    rs = short(timeout=15)
    check(rs, 503, 1, "deadline")
    assert rs.body == b"short"
    check(long_(timeout=15), 200, 2)
    retry = [q for q in upstream.requests if q.path == "/long" and
             q.header("X-Retrygate-Attempt") == "2"]
    assert len(retry) == 1 and retry[0].time - t_post >= 1.999, \
        "retry sent %.3fs into a 2 s hold" % (retry[0].time - t_post)
    assert not [q for q in upstream.requests if q.path == "/short" and
                q.header("X-Retrygate-Attempt") != "1"]
    ref.expect(non_idempotent=1, deadline=1)


def test_per_try_timeout_cutting_a_connect_is_a_connect_failure(blackhole, rg_factory):
    rg = rg_factory(upstreams=api(blackhole, {"per_try_timeout": "150ms"},
                                  connect_timeout="5s"))
    r = rg.request("POST", "/c", body=b"x", headers={"X-Timeout-Ms": "3000"})
    check(r, 502, 3, "max-attempts", reason="connect-failure")
    rg.wait_metric("retrygate_upstream_outcomes_total", 3, op="==", upstream="api",
                   outcome="connect-failure")
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api", outcome="timeout") == 0


def test_reset_on_a_reused_connection_is_a_reset(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    check(rg.request("GET", "/1"), 200, 1)
    upstream.push(reset())
    check(rg.request("GET", "/2"), 200, 2)
    q1, q2a, q2b = attempts_seen(upstream, 3)
    assert q2a.conn_id == q1.conn_id, "the second request did not reuse the pooled connection"
    assert q2b.conn_id != q1.conn_id
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api", outcome="reset") == 1


def test_pooled_connection_closed_by_the_upstream_is_replaced_without_outcome(upstream,
                                                                               rg_factory):
    rg = rg_factory(upstreams=api(upstream))
    for i in range(4):
        check(rg.request("GET", "/warm/%d" % i), 200, 1)
        upstream.wait_for(lambda: upstream.idle_connections(), what="an idle pooled connection")
        (idle,) = upstream.idle_connections()
        upstream.close_idle(reset=bool(i % 2))
        upstream.wait_conn_closed(idle.id)
        time.sleep(0.05)
        check(rg.request("GET", "/after/%d" % i), 200, 1)
        assert upstream.last.conn_id != idle.id
    attempts_seen(upstream, 8)
    m = rg.metrics()
    assert m.value("retrygate_upstream_outcomes_total", upstream="api") == 0
    assert m.value("retrygate_upstream_attempts_total", upstream="api") == 8


def test_backoff_is_full_jitter_capped_at_max(upstream, rg_factory):
    """Backoff before retry n is uniform in [0, min(max, base * 2^(n-1))]: gaps never exceed
    the cap (plus scheduling slack), and they are not all at the cap."""
    upstream.set_default(503)
    rg = rg_factory(upstreams=api(upstream, {"max_attempts": 4,
                                             "backoff": {"base": "100ms", "max": "150ms"}}))
    gaps = []
    for i in range(3):
        upstream.reset_log()
        check(rg.request("GET", "/b/%d" % i), 503, 4, "max-attempts")
        reqs = attempts_seen(upstream, 4, settle=0)
        for n, (a, b) in enumerate(zip(reqs, reqs[1:]), 1):
            cap = min(0.150, 0.100 * 2 ** (n - 1))
            gap = b.time - a.time
            assert gap <= cap + 0.1, "gap before retry %d: %.3fs, cap %.3fs" % (n, gap, cap)
            gaps.append(gap / cap)
    assert min(gaps) < 0.8, "no jitter: every gap near the cap %r" % gaps


def test_runtime_switch_needs_the_token_when_set(upstream, rg_factory):
    rg = rg_factory(upstreams=api(upstream), admin_token="s3cret")
    assert rg.set_retries(False, upstream="api").status == 403
    assert rg.set_retries(False, upstream="api", token="wrong").status == 403
    assert rg.retries() == {"api": True}
    r = rg.set_retries(False, upstream="api", token="s3cret")
    assert r.status == 200 and r.json() == {"api": False}
    upstream.push(503)
    check(rg.request("GET", "/x"), 503, 1, "disabled")


def test_retry_enabled_false_shows_the_runtime_switch_separately(upstream, rg_factory):
    """GET /retries shows the runtime switch; retries happen only when it and retry.enabled
    are both on."""
    rg = rg_factory(upstreams=api(upstream, {"enabled": False}))
    assert rg.retries() == {"api": True}
    upstream.push(503)
    check(rg.request("GET", "/x"), 503, 1, "disabled")


def test_failed_attempts_slot_is_released_before_the_decision(upstream, rg_factory):
    """max_in_flight 1: the retry can only be sent if the failed attempt gave its slot back."""
    upstream.push(503, reset())
    rg = rg_factory(upstreams=api(upstream, concurrency={"max_in_flight": 1}))
    check(rg.request("GET", "/x"), 200, 3)
    attempts_seen(upstream, 3)
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api")


def test_max_retries_in_flight_above_max_in_flight_is_capped_by_it(upstream, rg_factory):
    """max_in_flight 1 governs max_retries_in_flight 32: while one retry waits, another
    request's retry is refused at its decision, not after waiting."""
    upstream.push(retry_after(1), respond(503, body=b"second"))
    rg = rg_factory(upstreams=api(upstream, concurrency={"max_in_flight": 1,
                                                         "max_retries_in_flight": 32}))
    a = InThread(rg.request, "GET", "/a")
    upstream.wait_requests(1)
    rg.wait_metric("retrygate_upstream_retries_in_flight", 1, op="==", upstream="api")
    t = time.monotonic()
    r = rg.request("GET", "/b")
    check(r, 503, 1, "retries-in-flight")
    assert time.monotonic() - t < 0.5, "refused only after waiting"
    check(a(timeout=15), 200, 2)


def test_last_response_with_a_large_body_wins_over_later_failures(upstream, rg_factory):
    big = b"L" * (256 * 1024)
    upstream.push(respond(503, body=big), reset(), reset())
    rg = rg_factory(upstreams=api(upstream, {"max_body": "64KiB"}))
    r = rg.request("GET", "/big503")
    check(r, 503, 3, "max-attempts")
    assert r.body == big
