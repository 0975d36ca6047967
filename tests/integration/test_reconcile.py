"""The reconciliation queue (SPEC §12, issue 14): each unknown outcome recorded once with its
fields, GET /unknown newest first with ?upstream=, POST /unknown/ack, the keep bound, the
metrics, publishing to a Redis stream (a real redis-server: XRANGE) that loses no local record
while Redis is down and resumes when it is back; and X-Request-Id on every response, relayed
or made by retrygate, so a caller can find its record."""

import json
import shutil
import socket
import subprocess
import time

import pytest

from harness import Refusing, free_port, make_config, reset, respond, stall, upstream_block, wait_for

pytestmark = pytest.mark.timeout(90)


def unknown(rg, upstream=None):
    r = rg.admin("GET", "/unknown" + ("?upstream=%s" % upstream if upstream else ""))
    assert r.status == 200, r
    return json.loads(r.body)


def ack(rg, rid, headers=None):
    return rg.admin("POST", "/unknown/ack?id=%s" % rid, headers, b"")


def test_each_unknown_outcome_is_recorded_once_with_its_fields(rg_factory, upstream_factory):
    a, b = upstream_factory(), upstream_factory()
    rg = rg_factory(upstreams={
        "pay": upstream_block(a, retry={"max_attempts": 3, "per_try_timeout": "300ms"}),
        "mail": upstream_block(b)})
    a.push(reset(), reset(), reset())
    # a keyed POST reset three times: one record, 3 attempts, the key
    r = rg.post("/charge?x=1", b"{}", headers={"Host": "pay", "Idempotency-Key": "k-1"})
    assert r.status == 502
    rid1 = r.headers.get("X-Request-Id")
    assert rid1
    # an unkeyed POST that times out: not retried, one record, last outcome timeout
    a.push(stall(2))
    r = rg.post("/charge", b"{}", headers={"Host": "pay", "X-Request-Id": "client-id-2"})
    assert r.status == 504 and r.headers.get("X-Request-Id") == "client-id-2"
    # a request elsewhere: an unknown outcome there too
    b.push(reset())
    assert rg.post("/send", b"x", headers={"Host": "mail"}).status == 502
    # not unknown: a GET reset (idempotent), a POST answered
    a.push(reset(), reset(), reset())
    assert rg.get("/", headers={"Host": "pay"}).status == 502
    assert rg.post("/ok", b"{}", headers={"Host": "pay"}).status == 200

    recs = unknown(rg)
    assert [x["upstream"] for x in recs] == ["mail", "pay", "pay"]      # newest first
    pay = unknown(rg, "pay")
    assert [x["id"] for x in pay] == ["client-id-2", rid1]
    t, k = pay
    assert k["method"] == "POST" and k["path"] == "/charge?x=1"
    assert k["idempotency_key"] == "k-1" and k["attempts"] == 3
    assert k["last_outcome"] == "reset" and k["endpoint"] == a.endpoint
    assert k["time"].endswith("Z") and "T" in k["time"]
    assert t["idempotency_key"] is None and t["attempts"] == 1
    assert t["last_outcome"] == "timeout"
    assert rg.metric("retrygate_reconcile_recorded_total", upstream="pay") == 2
    assert rg.metric("retrygate_reconcile_recorded_total", upstream="mail") == 1
    assert rg.metric("retrygate_reconcile_pending") == 3

    # ack removes; an id not there is 404
    assert ack(rg, rid1).status == 200
    assert [x["id"] for x in unknown(rg, "pay")] == ["client-id-2"]
    assert ack(rg, rid1).status == 404
    assert rg.metric("retrygate_reconcile_pending") == 2


def test_ack_needs_the_token(rg_factory, upstream):
    rg = rg_factory(upstreams={"pay": upstream_block(upstream)}, admin_token="t0k")
    upstream.push(reset())
    rid = rg.post("/", b"{}").headers.get("X-Request-Id")
    assert ack(rg, rid).status == 403
    assert ack(rg, rid, {"Authorization": "Bearer t0k"}).status == 200
    assert unknown(rg) == []


def test_keep_bounds_the_queue_and_drops_the_oldest(rg_factory, upstream):
    rg = rg_factory(upstreams={"pay": upstream_block(upstream)}, reconcile={"keep": 3})
    ids = []
    for i in range(5):
        upstream.push(reset())
        r = rg.post("/", b"{}", headers={"X-Request-Id": "r%d" % i})
        assert r.status == 502
        ids.append("r%d" % i)
    assert [x["id"] for x in unknown(rg)] == ["r4", "r3", "r2"]
    assert rg.metric("retrygate_reconcile_pending") == 3
    assert rg.metric("retrygate_reconcile_recorded_total", upstream="pay") == 5


# ------------------------------------------------------------------------------- Redis

class Redis:
    def __init__(self, port=None):
        self.exe = shutil.which("redis-server")
        if not self.exe:
            pytest.skip("redis-server not installed")
        self.port = port or free_port()
        self.p = None

    def start(self):
        self.p = subprocess.Popen([self.exe, "--port", str(self.port), "--bind", "127.0.0.1",
                                   "--save", "", "--appendonly", "no"],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self.up, 10, what="redis-server")

    def up(self):
        try:
            with socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def kill(self):
        if self.p:
            self.p.kill()
            self.p.wait(5)
            self.p = None

    def ids_in(self, stream="retrygate:unknown"):
        """The "id" field of every entry of the stream (XRANGE - +, raw: one word a line)."""
        out = subprocess.run(["redis-cli", "-p", str(self.port), "--raw", "XRANGE", stream,
                              "-", "+"], capture_output=True, text=True, timeout=5).stdout
        words = out.split("\n")
        return [words[i + 1] for i, w in enumerate(words[:-1]) if w == "id"]

    def entry(self, stream="retrygate:unknown"):
        out = subprocess.run(["redis-cli", "-p", str(self.port), "--raw", "XRANGE", stream,
                              "-", "+", "COUNT", "1"], capture_output=True, text=True,
                             timeout=5).stdout.split("\n")
        vals = out[1:]
        return dict(zip(vals[0::2], vals[1::2]))


@pytest.fixture
def redis():
    r = Redis()
    r.start()
    yield r
    r.kill()


def unknown_post(rg, upstream, rid, key=None):
    upstream.push(reset())
    h = {"X-Request-Id": rid}
    if key:
        h["Idempotency-Key"] = key
    r = rg.post("/pay", b"{}", headers=h)
    assert r.status in (502, 504), r
    return r


def test_records_reach_the_redis_stream(rg_factory, upstream, redis):
    rg = rg_factory(upstreams={"pay": upstream_block(upstream, retry={"max_attempts": 1})},
                    reconcile={"redis": "redis://127.0.0.1:%d/0" % redis.port,
                               "stream": "rg:test"})
    unknown_post(rg, upstream, "s1", key="key-1")
    unknown_post(rg, upstream, "s2")
    wait_for(lambda: redis.ids_in("rg:test") == ["s1", "s2"], 5, what="records in the stream")
    e = redis.entry("rg:test")
    assert e["id"] == "s1" and e["upstream"] == "pay" and e["method"] == "POST"
    assert e["path"] == "/pay" and e["idempotency_key"] == "key-1" and e["attempts"] == "1"
    assert e["last_outcome"] == "reset" and e["endpoint"] == upstream.endpoint
    assert all(x["published"] for x in unknown(rg))
    assert rg.metric("retrygate_reconcile_publish_errors_total") == 0


@pytest.mark.timeout(120)
def test_redis_down_loses_no_local_record_and_publishing_resumes(rg_factory, upstream, redis):
    rg = rg_factory(upstreams={"pay": upstream_block(upstream, retry={"max_attempts": 1})},
                    reconcile={"redis": "redis://127.0.0.1:%d/0" % redis.port})
    unknown_post(rg, upstream, "before")
    wait_for(lambda: redis.ids_in() == ["before"], 5, what="first record in the stream")
    redis.kill()
    for i in range(3):
        unknown_post(rg, upstream, "during-%d" % i)
    # kept locally, counted as not published
    recs = unknown(rg)
    assert [x["id"] for x in recs] == ["during-2", "during-1", "during-0", "before"]
    wait_for(lambda: rg.metric("retrygate_reconcile_publish_errors_total") >= 1, 10,
             what="a publish error counted")
    assert [x["published"] for x in unknown(rg)] == [False, False, False, True]
    assert rg.get("/").status == 200        # serving goes on meanwhile
    # Redis comes back (empty: it kept nothing): the waiting records go, the old one does not
    redis.start()
    wait_for(lambda: redis.ids_in() == ["during-0", "during-1", "during-2"], 15,
             what="the records of the outage in the stream")
    unknown_post(rg, upstream, "after")
    wait_for(lambda: redis.ids_in()[-1:] == ["after"], 5, what="publishing resumed")
    assert "reconcile: redis" in rg.stderr_text()


@pytest.mark.timeout(60)
def test_a_redis_that_never_answers_is_given_up_and_counted(rg_factory, upstream, blackhole):
    # one that never completes the connect, one that accepts and never replies
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    try:
        for port in (blackhole.port, silent.getsockname()[1]):
            rg = rg_factory(upstreams={"pay": upstream_block(upstream,
                                                             retry={"max_attempts": 1})},
                            reconcile={"redis": "redis://127.0.0.1:%d/0" % port})
            unknown_post(rg, upstream, "stuck-%d" % port)
            wait_for(lambda: rg.metric("retrygate_reconcile_publish_errors_total") >= 1, 15,
                     what="the stuck publish counted")
            assert [x["published"] for x in unknown(rg)] == [False]
            assert rg.get("/").status == 200
            rg.stop()
    finally:
        silent.close()


# ------------------------------------------------------------------------------- X-Request-Id

def test_x_request_id_on_every_response(rg_factory, upstream):
    refusing = Refusing()
    try:
        cfg = make_config({"ok": upstream_block(upstream), "down": upstream_block(refusing),
                           "slow": upstream_block(upstream, retry={"max_attempts": 1,
                                                                  "per_try_timeout": "200ms"})},
                          routes=[{"host": "ok", "upstream": "ok"},
                                  {"host": "down", "upstream": "down"},
                                  {"host": "slow", "upstream": "slow"}])
        rg = rg_factory(config=cfg)
        # relayed: the client's id comes back, and it is the one the upstream saw
        r = rg.get("/", headers={"Host": "ok", "X-Request-Id": "abc-123"})
        assert r.status == 200 and r.headers.get("X-Request-Id") == "abc-123"
        # relayed without one: ours, the same the upstream got
        upstream.push(respond(200, headers={"X-Request-Id": "upstream-made"}))
        r = rg.get("/", headers={"Host": "ok"})
        seen = upstream.requests[-1].header("X-Request-Id")
        assert r.status == 200 and r.headers.get("X-Request-Id") == seen and len(seen) == 32
        # 502 made by retrygate
        r = rg.get("/", headers={"Host": "down"})
        assert r.status == 502 and len(r.headers.get("X-Request-Id") or "") == 32
        # 504 (per-try timeout)
        upstream.push(stall(2))
        r = rg.get("/", headers={"Host": "slow", "X-Request-Id": "t-504"})
        assert r.status == 504 and r.headers.get("X-Request-Id") == "t-504"
        # 404 no-route
        r = rg.get("/", headers={"Host": "nowhere", "X-Request-Id": "n-404"})
        assert r.status == 404 and r.headers.get("X-Request-Id") == "n-404"
        # 504 deadline already gone on arrival
        r = rg.get("/", headers={"Host": "ok", "X-Timeout-Ms": "0", "X-Request-Id": "d-0"})
        assert r.status == 504 and r.headers.get("X-Request-Id") == "d-0"
    finally:
        refusing.close()
