"""SPEC §6: idempotency enforcement at this hop — a duplicate gets the stored result, never a
second side effect. Memory store always; the redis store when redis-server is installed."""

import json
import shutil
import socket
import subprocess
import threading
import time

import pytest

from harness import free_port, respond, reset, wait_for


def idem_upstream(upstream, store="memory", **over):
    idem = {"enabled": True, "ttl": "1h", "lock_timeout": "2s"}
    if store != "memory":
        idem["store"] = store
    idem.update(over)
    return {"api": {"endpoints": [upstream], "idempotency": idem,
                    "retry": {"backoff": {"base": "1ms", "max": "2ms"}}}}


def post(rg, key, body=b'{"amount":10}', path="/pay", headers=None):
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Idempotency-Key"] = key
    h.update(headers or {})
    return tuple(rg.request("POST", path, headers=h, body=body))


def test_duplicate_gets_the_stored_response_and_no_second_execution(upstream, rg_factory):
    upstream.push(respond(201, headers={"X-Payment": "p-1"}, body=b'{"id":"p-1"}'))
    rg = rg_factory(upstreams=idem_upstream(upstream))
    s1, h1, b1 = post(rg, "k-1")
    assert (s1, b1) == (201, b'{"id":"p-1"}')
    assert "Idempotency-Replayed" not in h1
    s2, h2, b2 = post(rg, "k-1")
    assert (s2, b2) == (201, b'{"id":"p-1"}')
    assert h2["Idempotency-Replayed"] == "true"
    assert h2["X-Payment"] == "p-1"
    assert len(upstream.requests) == 1
    assert rg.metric("retrygate_idempotency_total", upstream="api", result="stored") == 1
    assert rg.metric("retrygate_idempotency_total", upstream="api", result="replayed") == 1


def test_same_key_different_request_is_422_even_while_in_progress(upstream, rg_factory):
    gate = threading.Event()
    upstream.push(respond(200, body=b"done", hold=gate))
    rg = rg_factory(upstreams=idem_upstream(upstream))
    out = {}
    t = threading.Thread(target=lambda: out.setdefault("r", post(rg, "k-2")))
    t.start()
    upstream.wait_requests(1)
    s, h, b = post(rg, "k-2", body=b'{"amount":99}')
    assert s == 422 and h["X-Retrygate-Reason"] == "idempotency-key-mismatch"
    s, h, b = post(rg, "k-2")
    assert s == 409 and h["X-Retrygate-Reason"] == "idempotency-in-progress"
    gate.set()
    t.join(10)
    assert out["r"][0] == 200
    s, h, b = post(rg, "k-2", body=b'{"amount":99}')
    assert s == 422
    assert len(upstream.requests) == 1
    assert rg.metric("retrygate_idempotency_total", upstream="api", result="mismatch") == 2
    assert rg.metric("retrygate_idempotency_total", upstream="api", result="conflict") == 1


def test_fingerprint_covers_path_query_and_content_type(upstream, rg_factory):
    rg = rg_factory(upstreams=idem_upstream(upstream))
    assert post(rg, "k-3", path="/pay?x=1")[0] == 200
    assert post(rg, "k-3", path="/pay?x=2")[0] == 422
    assert post(rg, "k-3", path="/pay?x=1", headers={"Content-Type": "text/plain"})[0] == 422
    assert post(rg, "k-3", path="/pay?x=1")[0] == 200
    assert len(upstream.requests) == 1


def test_scope_headers_separate_tenants(upstream, rg_factory):
    rg = rg_factory(upstreams=idem_upstream(upstream))
    a = post(rg, "k-4", headers={"Authorization": "Bearer alice"})
    b = post(rg, "k-4", headers={"Authorization": "Bearer bob"})
    assert a[0] == b[0] == 200
    assert "Idempotency-Replayed" not in b[1]
    assert len(upstream.requests) == 2


def test_require_key_refuses_without_key_and_other_methods_pass(upstream, rg_factory):
    rg = rg_factory(upstreams=idem_upstream(upstream, require_key=True))
    s, h, b = post(rg, None)
    assert s == 400 and h["X-Retrygate-Reason"] == "idempotency-key-required"
    assert json.loads(b)["error"] == "idempotency-key-required"
    assert tuple(rg.request("GET", "/x"))[0] == 200
    assert len(upstream.requests) == 1


def test_without_require_key_a_keyless_post_is_forwarded_each_time(upstream, rg_factory):
    rg = rg_factory(upstreams=idem_upstream(upstream))
    assert post(rg, None)[0] == 200
    assert post(rg, None)[0] == 200
    assert len(upstream.requests) == 2


def test_body_over_idempotency_max_body_with_key_is_413(upstream, rg_factory):
    rg = rg_factory(upstreams=idem_upstream(upstream, max_body="1KiB"))
    s, h, b = post(rg, "k-5", body=b"x" * 2048)
    assert s == 413 and h["X-Retrygate-Reason"] == "body-too-large"
    assert upstream.requests == []


def test_5xx_keeps_the_claim_until_lock_timeout_then_it_may_run_again(upstream, rg_factory):
    upstream.push(respond(500, body=b"boom"))
    rg = rg_factory(upstreams=idem_upstream(upstream, lock_timeout="1s"))
    assert post(rg, "k-6")[0] == 500
    assert post(rg, "k-6")[0] == 409          # outcome unknown: not a second execution
    time.sleep(1.3)
    assert post(rg, "k-6")[0] == 200          # the claim lapsed: claimable again
    assert len(upstream.requests) == 2


def test_reset_keeps_the_claim(upstream, rg_factory):
    upstream.push(reset())
    up = idem_upstream(upstream)
    up["api"]["retry"]["enabled"] = False
    rg = rg_factory(upstreams=up)
    assert post(rg, "k-7")[0] == 502
    assert post(rg, "k-7")[0] == 409
    assert len(upstream.requests) == 1


def test_response_over_max_response_reaches_client_but_key_stays_claimed(upstream, rg_factory):
    big = b"y" * 4096
    upstream.push(respond(200, body=big))
    rg = rg_factory(upstreams=idem_upstream(upstream, max_response="1KiB"))
    s, h, b = post(rg, "k-8")
    assert (s, b) == (200, big)
    assert post(rg, "k-8")[0] == 409
    assert len(upstream.requests) == 1


def test_keyed_post_is_retried_with_the_same_key_and_stored_once(upstream, rg_factory):
    upstream.push(respond(503), respond(201, body=b"ok"))
    rg = rg_factory(upstreams=idem_upstream(upstream))
    s, h, b = post(rg, "k-9")
    assert s == 201 and h["X-Retrygate-Attempts"] == "2"
    reqs = upstream.wait_requests(2)
    assert reqs[0].header("Idempotency-Key") == reqs[1].header("Idempotency-Key") == "k-9"
    assert reqs[0].body == reqs[1].body
    assert post(rg, "k-9")[1]["Idempotency-Replayed"] == "true"
    assert len(upstream.requests) == 2


def test_memory_store_is_shared_by_workers(upstream, rg_factory):
    rg = rg_factory(upstreams=idem_upstream(upstream), workers=2)
    results = []

    def one():
        results.append(post(rg, "k-10")[0])
    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(upstream.requests) == 1
    assert results.count(200) >= 1 and set(results) <= {200, 409}


# ------------------------------------------------------------------ redis

@pytest.fixture
def redis_url():
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server not installed")
    port = free_port()
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False
    wait_for(up, 10, what="redis-server")
    yield "redis://127.0.0.1:%d/0" % port, p
    p.kill()
    p.wait(5)


def test_redis_store_dedupes_across_two_replicas(upstream, rg_factory, redis_url):
    url, _ = redis_url
    upstream.push(respond(201, body=b"paid"))
    a = rg_factory(upstreams=idem_upstream(upstream, store=url))
    b = rg_factory(upstreams=idem_upstream(upstream, store=url))
    assert post(a, "k-r1")[0] == 201
    s, h, body = post(b, "k-r1")
    assert (s, body) == (201, b"paid") and h["Idempotency-Replayed"] == "true"
    assert post(b, "k-r1", body=b"other")[0] == 422
    assert len(upstream.requests) == 1


def test_an_outcome_is_in_redis_before_its_answer_leaves(upstream, rg_factory, redis_url):
    # A caller that repeats a key at another replica as soon as it has the answer is served
    # the stored response, never 409: the outcome goes on the wire to Redis before the
    # answer's last bytes go to the caller (and a released claim likewise: SPEC §6).
    url, _ = redis_url
    upstream.set_default(respond(201, body=b"paid"))
    a = rg_factory(upstreams=idem_upstream(upstream, store=url))
    b = rg_factory(upstreams=idem_upstream(upstream, store=url))
    got = []
    for i in range(60):
        assert post(a, "k-seq%d" % i)[0] == 201
        s, h, body = post(b, "k-seq%d" % i)
        got.append((s, h.get("Idempotency-Replayed"), h.get("X-Retrygate-Reason")))
    assert all(g == (201, "true", None) for g in got), (sum(g[0] != 201 for g in got), got[:3])
    assert len(upstream.requests) == 60
    upstream.set_default(respond(503, body=b"later"))
    for i in range(30):
        assert post(a, "k-rel%d" % i)[0] == 503
        upstream.set_default(respond(201, body=b"paid"))
        assert post(b, "k-rel%d" % i)[0] == 201, i
        upstream.set_default(respond(503, body=b"later"))


def test_redis_down_fails_closed(upstream, rg_factory, redis_url):
    url, proc = redis_url
    rg = rg_factory(upstreams=idem_upstream(upstream, store=url))
    assert post(rg, "k-r2")[0] == 200
    proc.kill()
    proc.wait(5)
    s, h, b = post(rg, "k-r3")
    assert s == 503 and h["X-Retrygate-Reason"] == "idempotency-store-unavailable"
    assert len(upstream.requests) == 1
