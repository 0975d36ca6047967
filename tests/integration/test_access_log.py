"""The access log (SPEC §2 access_log, issue 7): one JSON line per request with who answered,
after how many attempts and why a retry was refused; `outcome` ok / failed / unknown; SIGUSR1
reopens the file (log rotation)."""

import copy
import datetime
import json
import os
import signal
import threading
import time

import pytest

from harness import make_config, reset, respond, stall, upstream_block, wait_for

pytestmark = pytest.mark.timeout(60)

REQUIRED = ("time", "request_id", "method", "path", "route", "upstream", "status", "attempts",
            "tries", "retry_refused", "deadline_ms", "deadline_left_ms", "duration_ms",
            "idempotency_key", "outcome")


def read_lines(path):
    try:
        text = open(path).read()
    except FileNotFoundError:
        return []
    assert text == "" or text.endswith("\n"), "a partial line: %r" % text[-200:]
    return [json.loads(ln) for ln in text.splitlines()]


def wait_lines(path, n, timeout=5):
    """The log's records once it holds at least n lines (retrygate flushes within ~0.2 s)."""
    return wait_for(lambda: (lambda ls: ls if len(ls) >= n else None)(read_lines(path)),
                    timeout, what="%d access log lines in %s" % (n, path))


@pytest.fixture
def logged(rg_factory, upstream, tmp_path):
    """(rg, log path) with one upstream "api" and fast retries."""
    path = tmp_path / "access.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "300ms"})},
                    access_log=path)
    return rg, path


# ------------------------------------------------------------------------------- lines

def test_one_json_line_per_request_with_every_field(logged, upstream):
    rg, path = logged
    upstream.push(503, 200)
    rg.get("/a?x=1", {"X-Timeout-Ms": "4000"})
    rg.post("/b", b"body", {"Idempotency-Key": "key-1"})
    rg.request("DELETE", "/c")
    recs = wait_lines(path, 3)
    time.sleep(0.3)
    recs = read_lines(path)
    assert len(recs) == 3
    for r in recs:
        for k in REQUIRED:
            assert k in r, (k, r)
        assert r["outcome"] in ("ok", "failed", "unknown")
        ts = r["time"].replace("Z", "+00:00")
        t = datetime.datetime.fromisoformat(ts)
        assert abs((datetime.datetime.now(datetime.timezone.utc) - t).total_seconds()) < 60
        assert isinstance(r["tries"], list) and len(r["tries"]) == r["attempts"]
        for tr in r["tries"]:
            assert tr["endpoint"] == upstream.endpoint
    a, b, c = recs
    assert (a["method"], a["upstream"], a["status"], a["attempts"]) == ("GET", "api", 200, 2)
    assert a["path"] in ("/a", "/a?x=1")
    assert [t.get("status") for t in a["tries"]] == [503, 200]
    assert a["retry_refused"] is None and a["outcome"] == "ok"
    assert a["deadline_ms"] == 4000
    assert 0 < a["deadline_left_ms"] <= 4000
    assert a["deadline_left_ms"] + a["duration_ms"] == pytest.approx(4000, abs=50)
    assert (b["method"], b["path"], b["idempotency_key"]) == ("POST", "/b", "key-1")
    assert a["idempotency_key"] is None
    assert c["method"] == "DELETE" and c["deadline_ms"] == 5000          # deadline.default
    assert len({r["request_id"] for r in recs}) == 3


def test_route_in_log(rg_factory, upstream, tmp_path):
    path = tmp_path / "a.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, access_log=path,
                    routes=[{"host": "*.svc", "path_prefix": "/v1", "upstream": "api"}])
    rg.get("/v1/x", {"Host": "a.svc"})
    rg.get("/v2/x", {"Host": "a.svc"})
    ok, nor = wait_lines(path, 2)
    assert ok["route"] and "*.svc" in json.dumps(ok["route"]) and "/v1" in json.dumps(ok["route"])
    assert ok["upstream"] == "api"
    assert nor["status"] == 404 and nor["route"] is None and nor["upstream"] is None
    assert nor["attempts"] == 0 and nor["tries"] == []
    assert nor["outcome"] == "failed" or nor["outcome"] == "ok"


def test_request_id_is_the_one_sent_upstream(logged, upstream):
    rg, path = logged
    rg.get("/gen")
    rg.get("/given", {"X-Request-Id": "client-id-42"})
    q1, q2 = upstream.wait_requests(2)
    r1, r2 = wait_lines(path, 2)
    assert r1["request_id"] == q1.header("X-Request-Id")
    assert r2["request_id"] == "client-id-42" == q2.header("X-Request-Id")


def test_refused_reason_and_per_attempt_outcomes(logged, upstream, refusing):
    rg, path = logged
    upstream.push(503)
    rg.post("/post", b"x")                                        # non-idempotent: refused
    upstream.push(503, reset(), stall())
    rg.get("/mixed")                                              # 503, reset, timeout
    recs = wait_lines(path, 2)
    p, mx = recs
    assert p["status"] == 503 and p["retry_refused"] == "non-idempotent"
    assert p["outcome"] == "failed"
    # the last response any attempt produced is relayed (SPEC §4): the 503
    assert mx["attempts"] == 3 and mx["status"] == 503
    assert mx["tries"][0].get("status") == 503
    assert mx["tries"][1].get("outcome") == "reset"
    assert mx["tries"][2].get("outcome") == "timeout"
    assert mx["retry_refused"] == "max-attempts"
    assert mx["outcome"] == "failed"


def test_refused_max_attempts_logged(logged, upstream):
    rg, path = logged
    upstream.set_default(503)
    rg.get("/x")
    (r,) = wait_lines(path, 1)
    assert r["attempts"] == 3 and r["retry_refused"] == "max-attempts"


def test_duration_and_deadline_left(logged, upstream):
    rg, path = logged
    upstream.push(respond(200, delay=0.25))
    rg.get("/slow", {"X-Timeout-Ms": "2000"})
    (r,) = wait_lines(path, 1)
    assert 250 <= r["duration_ms"] < 1500, r
    assert r["deadline_ms"] == 2000
    assert 500 < r["deadline_left_ms"] <= 1750, r


def test_own_responses_are_logged(logged, upstream):
    rg, path = logged
    rg.get("/x", {"X-Timeout-Ms": "0"})                  # 504 deadline-exceeded
    rg.get("/x", {"X-Timeout-Ms": "abc"})                # 400 bad-deadline
    recs = wait_lines(path, 2)
    assert [r["status"] for r in recs] == [504, 400]
    assert all(r["attempts"] == 0 and r["outcome"] == "failed" for r in recs)


def test_malformed_request_is_logged(logged, upstream):
    rg, path = logged
    data, closed = rg.raw(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 400")
    rg.get("/after")
    recs = wait_lines(path, 1)
    time.sleep(0.4)
    recs = read_lines(path)
    assert [r["status"] for r in recs] == [400, 200], recs


# ------------------------------------------------------------------------------- outcome

@pytest.mark.parametrize("method,action,want_status,want", [
    ("POST", "reset", 502, "unknown"),
    ("PATCH", "reset", 502, "unknown"),
    ("POST", "stall", 504, "unknown"),
    ("GET", "reset", 502, "failed"),
    ("GET", "stall", 504, "failed"),
    ("PUT", "reset", 502, "failed"),
    ("POST", "ok", 200, "ok"),
    ("POST", "404", 404, "ok"),
    ("POST", "503", 503, "failed"),
    ("GET", "503", 503, "failed"),
])
def test_outcome_values(rg_factory, upstream, tmp_path, method, action, want_status, want):
    path = tmp_path / "o.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "300ms",
                                                                    "max_attempts": 2})},
                    access_log=path)
    upstream.set_default({"reset": reset(), "stall": stall(), "ok": respond(200),
                          "404": respond(404), "503": respond(503)}[action])
    r = rg.request(method, "/o", body=b"x" if method != "GET" else None)
    assert r.status == want_status
    (rec,) = wait_lines(path, 1)
    assert rec["outcome"] == want, rec


def test_outcome_unknown_for_post_connect_failure_is_failed(rg_factory, refusing, tmp_path):
    # a connect-failure provably never reached the upstream: not unknown
    path = tmp_path / "c.log"
    rg = rg_factory(upstreams={"api": upstream_block(refusing)}, access_log=path)
    assert rg.post("/x", b"b").status == 502
    (rec,) = wait_lines(path, 1)
    assert rec["outcome"] == "failed" and rec["attempts"] == 3


def test_outcome_unknown_when_last_attempt_reset_after_earlier_response(rg_factory, upstream,
                                                                        tmp_path):
    # POST with a key: 503 (retried), then reset: the 503 is relayed, but the last attempt may
    # have executed -> unknown (SPEC §6 "even if an earlier response is relayed")
    path = tmp_path / "u.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"max_attempts": 2})},
                    access_log=path)
    upstream.push(503, reset())
    r = rg.post("/k", b"b", {"Idempotency-Key": "k1"})
    assert r.status == 503 and r.headers["X-Retrygate-Attempts"] == "2"
    (rec,) = wait_lines(path, 1)
    assert [t.get("status") or t.get("outcome") for t in rec["tries"]] == [503, "reset"]
    assert rec["outcome"] == "unknown", rec


def test_outcome_unknown_when_deadline_cuts_a_sent_post(rg_factory, upstream, tmp_path):
    path = tmp_path / "d.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "5s"})},
                    access_log=path)
    upstream.set_default(stall())
    r = rg.post("/d", b"b", {"X-Timeout-Ms": "300"})
    assert r.status == 504 and r.headers["X-Retrygate-Reason"] == "deadline-exceeded"
    (rec,) = wait_lines(path, 1)
    assert rec["outcome"] == "unknown", rec


def test_outcome_known_when_post_with_key_retried_to_success(rg_factory, upstream, tmp_path):
    path = tmp_path / "k.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, access_log=path)
    upstream.push(reset(), 200)
    r = rg.post("/k", b"b", {"Idempotency-Key": "k2"})
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "2"
    (rec,) = wait_lines(path, 1)
    assert rec["outcome"] == "ok"
    assert rec["tries"][0].get("outcome") == "reset"


# ------------------------------------------------------------------------------- files

def test_sigusr1_reopens_the_file(logged, upstream):
    rg, path = logged
    rg.get("/before-1")
    rg.get("/before-2")
    wait_lines(path, 2)
    rotated = path.with_name("access.log.1")
    os.rename(path, rotated)
    rg.get("/between")                      # still written to the renamed file (open fd)
    wait_lines(rotated, 3)
    rg.send_signal(signal.SIGUSR1)
    wait_for(lambda: path.exists(), 5, what="a new access log file")
    rg.get("/after-1")
    rg.get("/after-2")
    new = wait_lines(path, 2)
    assert [r["path"] for r in new] == ["/after-1", "/after-2"]
    assert [r["path"] for r in read_lines(rotated)] == ["/before-1", "/before-2", "/between"]
    assert rg.running


def test_sigusr1_without_rotation_keeps_appending(logged, upstream):
    rg, path = logged
    rg.get("/1")
    wait_lines(path, 1)
    rg.send_signal(signal.SIGUSR1)
    time.sleep(0.2)
    rg.get("/2")
    assert [r["path"] for r in wait_lines(path, 2)] == ["/1", "/2"]


def test_access_log_stdout(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, access_log="stdout")
    rg.get("/s1")
    rg.get("/s2")

    def lines():
        out = rg.stdout_text()
        ls = [json.loads(x) for x in out.splitlines() if x.strip()]
        return ls if len(ls) >= 2 else None
    recs = wait_for(lines, 5, what="2 lines on stdout")
    assert [r["path"] for r in recs] == ["/s1", "/s2"]


def test_access_log_off_writes_nothing(rg_factory, upstream, tmp_path):
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, access_log="off")
    rg.get("/x")
    time.sleep(0.4)
    assert rg.stdout_text() == ""
    assert not (tmp_path / "off").exists()


def test_access_log_flushed_at_exit(rg_factory, upstream, tmp_path):
    path = tmp_path / "exit.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, access_log=path)
    for i in range(5):
        rg.get("/%d" % i)
    assert rg.stop() == 0
    assert len(read_lines(path)) == 5


def test_access_log_many_workers_whole_lines(rg_factory, upstream, tmp_path):
    path = tmp_path / "many.log"
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, access_log=path, workers=2)

    def client(n):
        c = rg.client()
        for i in range(25):
            c.get("/w%d/%d" % (n, i))
    ts = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    recs = wait_lines(path, 100)
    assert len(recs) == 100
    assert len({r["request_id"] for r in recs}) == 100


def test_reload_changes_access_log_path(rg_factory, upstream, tmp_path):
    p1, p2 = tmp_path / "one.log", tmp_path / "two.log"
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, access_log=p1)
    rg = rg_factory(cfg)
    rg.get("/1")
    wait_lines(p1, 1)
    new = copy.deepcopy(cfg)
    new["access_log"] = str(p2)
    rg.reload(new)
    rg.get("/2")
    assert [r["path"] for r in wait_lines(p2, 1)] == ["/2"]
    assert [r["path"] for r in read_lines(p1)] == ["/1"]


def test_unwritable_access_log_is_a_startup_error(rg_factory, upstream, tmp_path):
    from harness import RetrygateError
    with pytest.raises(RetrygateError):
        rg_factory(upstreams={"api": upstream_block(upstream)},
                   access_log=tmp_path / "no" / "such" / "dir" / "x.log", ready_timeout=5)


# ------------------------------------------------------------------------------- a stuck reader

def test_stdout_nobody_reads_does_not_stall_requests(rg_factory, upstream, tmp_path):
    # a container's log driver that stopped reading: stdout is a pipe that stays full
    import fcntl
    rg = rg_factory(upstreams={"api": upstream_block(upstream)}, access_log="stdout",
                    workers=2, start=False)
    os.mkfifo(rg.stdout_path)
    reader = os.open(rg.stdout_path, os.O_RDONLY | os.O_NONBLOCK)   # held open, never read
    try:
        fcntl.fcntl(reader, getattr(fcntl, "F_SETPIPE_SZ", 1031), 4096)
        rg.start()
        slowest = 0.0
        for i in range(400):            # some 100 KiB of lines: far more than the pipe holds
            t0 = time.monotonic()
            assert rg.get("/x%d" % i, timeout=5).status == 200
            slowest = max(slowest, time.monotonic() - t0)
        assert slowest < 1.0, "a request took %.2fs behind a full stdout" % slowest
        assert "retrygate_access_log_dropped_lines_total " in rg.metrics_text()
        assert rg.stop() == 0
    finally:
        os.close(reader)
