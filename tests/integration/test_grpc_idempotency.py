"""SPEC §10 idempotency enforcement on the wire: a stored gRPC response replays its header
block (with idempotency-replayed: true there and only there), its messages and its trailers;
a Trailers-Only answer replays as one HEADERS frame that ends the stream; only a definite
grpc-status is stored, any other code leaves the outcome unknown until lock_timeout; trailers
count against max_response; the redis store carries trailers from one replica to another.

The client is tests/tools/h2raw.py, so every frame of the replay can be looked at; the
upstream is tests/tools/h2upstream.py. tests/integration/test_grpc.py has the grpcio view of
the same rules.
"""
import shutil
import socket
import subprocess
import time

import pytest
from hyperframe.frame import DataFrame, HeadersFrame

from harness import FAST_RETRY, free_port, wait_for
from h2raw import H2Raw
from h2upstream import respond

MSG = b"\x00\x00\x00\x00\x05order"          # one uncompressed gRPC message
GRPC = [("content-type", "application/grpc")]


def api(up, store=None, **idem):
    i = {"enabled": True, "ttl": "1h", "lock_timeout": "1s"}
    if store:
        i["store"] = store
    i.update(idem)
    r = dict(FAST_RETRY)
    r["max_attempts"] = 1
    return {"api": {"endpoints": [up.endpoint], "protocol": "h2", "retry": r,
                    "idempotency": i}}


def call(rg, key, path="/shop.Orders/Place", body=MSG):
    """One unary call on a fresh connection: (response, its HEADERS frames, its DATA bytes)."""
    c = H2Raw(rg.port)
    sid = c.request([(":method", "POST"), (":scheme", "http"), (":authority", "shop"),
                     (":path", path), ("content-type", "application/grpc"), ("te", "trailers"),
                     ("idempotency-key", key)], body=body)
    r = c.response(sid)
    frames = [f for f in c.frames if f.stream_id == sid]
    c.close()
    assert r.ended and r.reset is None, r
    return r, [f for f in frames if isinstance(f, HeadersFrame)], \
        [f for f in frames if isinstance(f, DataFrame)]


def names(fields):
    return [n for n, _ in fields]


def test_replay_carries_head_messages_and_trailers(h2up, rg_factory):
    up = h2up()
    up.push(respond(200, headers=GRPC + [("x-app", "yes")], body=MSG,
                    trailers=[("grpc-status", "0"), ("grpc-message", "placed"),
                              ("x-order", "o-42")]))
    rg = rg_factory(upstreams=api(up))
    first, _, _ = call(rg, "pay-1")
    assert first.status == 200 and first.body == MSG, first
    assert first.header("idempotency-replayed") is None
    again, heads, _ = call(rg, "pay-1")
    assert again.status == 200 and again.body == MSG, again
    assert again.header("idempotency-replayed") == "true"
    assert again.header("x-app") == "yes" and again.header("content-type") == "application/grpc"
    assert again.header("x-retrygate-attempts") == "0"
    # the marker goes in the first header block only; the trailers are the stored ones
    assert dict(again.trailers) == {"grpc-status": "0", "grpc-message": "placed",
                                    "x-order": "o-42"}, again.trailers
    assert len(heads) == 2 and "END_STREAM" not in heads[0].flags
    assert "END_STREAM" in heads[1].flags
    assert len(up.requests) == 1
    assert rg.metric("retrygate_idempotency_total", upstream="api", result="replayed") == 1


def test_trailers_only_replays_as_trailers_only(h2up, rg_factory):
    up = h2up()
    up.push(respond(200, headers=GRPC + [("grpc-status", "5"), ("grpc-message", "no order")]))
    rg = rg_factory(upstreams=api(up))
    call(rg, "nf-1")
    again, heads, datas = call(rg, "nf-1")
    assert again.header("idempotency-replayed") == "true", again
    assert again.header("grpc-status") == "5" and again.header("grpc-message") == "no order"
    assert len(heads) == 1 and "END_STREAM" in heads[0].flags, heads
    assert not datas and again.trailers == []
    assert len(up.requests) == 1


def test_headers_then_trailers_without_data_is_stored(h2up, rg_factory):
    up = h2up()
    up.push(respond(200, headers=GRPC, trailers=[("grpc-status", "6")]))
    rg = rg_factory(upstreams=api(up))
    call(rg, "ae-1")
    again, heads, _ = call(rg, "ae-1")
    assert again.header("idempotency-replayed") == "true", again
    assert again.body == b"" and dict(again.trailers) == {"grpc-status": "6"}
    assert len(up.requests) == 1


@pytest.mark.parametrize("code", ["14", "13", "4", "2"])
def test_an_unknown_code_is_not_stored(h2up, rg_factory, code):
    up = h2up()
    up.set_default(respond(200, headers=GRPC, body=MSG, trailers=[("grpc-status", code)]))
    rg = rg_factory(upstreams=api(up))
    first, _, _ = call(rg, "unk-1")
    assert dict(first.trailers).get("grpc-status") == code, first
    # outcome unknown: claimed until lock_timeout (1 s), never replayed
    busy, _, _ = call(rg, "unk-1")
    assert busy.header("x-retrygate-reason") == "idempotency-in-progress", busy
    assert busy.header("idempotency-replayed") is None
    assert len(up.requests) == 1
    time.sleep(1.5)
    later, _, _ = call(rg, "unk-1")
    assert later.header("idempotency-replayed") is None and later.body == MSG, later
    assert len(up.requests) == 2


def test_trailers_count_against_max_response(h2up, rg_factory):
    up = h2up()
    trailers = [("grpc-status", "0"), ("x-receipt", "r" * 40)]
    up.set_default(respond(200, headers=GRPC, body=MSG, trailers=trailers))
    # the message (10 bytes) fits 48 alone; with the trailers it does not
    rg = rg_factory(upstreams=api(up, max_response="48"))
    first, _, _ = call(rg, "big-1")
    assert first.body == MSG and dict(first.trailers) == dict(trailers), first
    # relayed whole, not stored: the key stays claimed (ttl), a repeat never runs again
    busy, _, _ = call(rg, "big-1")
    assert busy.header("x-retrygate-reason") == "idempotency-in-progress", busy
    time.sleep(1.3)
    busy, _, _ = call(rg, "big-1")
    assert busy.header("x-retrygate-reason") == "idempotency-in-progress", busy
    assert len(up.requests) == 1


@pytest.fixture
def redis_url():
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server not installed")
    port = free_port()
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)

    def up():
        try:
            with socket.create_connection(("127.0.0.1", port), 0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False
    wait_for(up, 10, what="redis-server")
    yield "redis://127.0.0.1:%d/0" % port
    p.kill()
    p.wait(5)


def test_redis_replica_replays_the_trailers(h2up, rg_factory, redis_url):
    up = h2up()
    up.push(respond(200, headers=GRPC, body=MSG,
                    trailers=[("grpc-status", "0"), ("x-order", "o-7")]))
    a = rg_factory(upstreams=api(up, store=redis_url))
    b = rg_factory(upstreams=api(up, store=redis_url))
    call(a, "r-1")
    again, heads, _ = call(b, "r-1")
    assert again.header("idempotency-replayed") == "true" and again.body == MSG, again
    assert dict(again.trailers) == {"grpc-status": "0", "x-order": "o-7"}
    assert len(up.requests) == 1


def test_a_call_repeated_at_another_replica_at_once_is_replayed(h2up, rg_factory, redis_url):
    # The outcome is in Redis before the trailers leave: a caller that repeats the key at
    # another replica as soon as its call ended is replayed, never ABORTED in-progress.
    up = h2up()
    up.set_default(respond(200, headers=GRPC, body=MSG, trailers=[("grpc-status", "0")]))
    a = rg_factory(upstreams=api(up, store=redis_url))
    b = rg_factory(upstreams=api(up, store=redis_url))
    for i in range(30):
        call(a, "s-%d" % i)
        again, _, _ = call(b, "s-%d" % i)
        assert again.header("idempotency-replayed") == "true", (i, again)
    assert len(up.requests) == 30
