"""Reliability (issue 16): memory held is bounded by what the watermarks count, even when a peer
sends in small pieces; idle keep-alive connections get the request they already sent served
through a drain; repeated signals during teardown do not kill the process; memory goes back
to the system after a burst of connections. Slow variants of the memory scenarios: tests/soak.
"""

import os
import signal
import socket
import time

import pytest

import memory_peers as mp
from test_idempotency import redis_url  # noqa: F401 - the fixture: redis-server on a free port
from harness import RawConn, default_binary, parse_response, respond, rss_bytes, wait_for

# Each scenario once fed ~300x its byte count into the heap (a 32 KiB chain per small read,
# one page of it touched): tens of MiB for a few connections. The bound is ~256 KiB counted per
# connection plus chain overhead. The heap (VmData) is the sharp figure, RSS the user's one.
SCENARIO_SECONDS = float(os.environ.get("RETRYGATE_RELIABILITY_SECONDS", "6"))
# measured for two connections, before the fix: heap +48..+129 MiB, RSS +7..+18 MiB; with
# right-sized reads only: +2.5..+4.7 MiB; with the output packed too: +0.7..+0.9 MiB
HEAP_LIMIT = 8 << 20
RSS_LIMIT = 8 << 20
SLOW = {"per_try_timeout": "60s"}
LONG_DEADLINE = {"default": "60s", "max": "60s"}


def mib(n):
    return "%.1f MiB" % (n / (1 << 20))


def slow_upstream(ep):
    return {"api": {"endpoints": [ep], "retry": dict(SLOW, backoff={"base": "1ms", "max": "2ms"}),
                    "deadline": LONG_DEADLINE}}


def sanitized():
    """True for a sanitizer build: its allocator and quarantine make other memory figures."""
    with open(default_binary(), "rb") as f:
        return b"__asan_init" in f.read()


def check_growth(what, before, peak):
    rss, heap = peak[0] - before[0], peak[1] - before[1]
    print("%s: rss %s -> %s, heap %s -> %s" % (what, mib(before[0]), mib(peak[0]),
                                               mib(before[1]), mib(peak[1])))
    if sanitized():
        return      # the run itself is the check there: no report (rg_factory looks)
    assert heap < HEAP_LIMIT and rss < RSS_LIMIT, \
        "%s: heap grew by %s, RSS by %s" % (what, mib(heap), mib(rss))


@pytest.mark.timeout(60)
def test_small_upload_writes_to_a_stalled_upstream_hold_little_memory(rg_factory, blackhole):
    # the connect hangs, so the body waits in retrygate's memory and not in a kernel buffer
    up = slow_upstream(blackhole.endpoint)
    up["api"]["connect_timeout"] = "60s"
    rg = rg_factory(upstreams=up)
    before, peak, _ = mp.memory_while(rg.pid, mp.upload, rg.port, SCENARIO_SECONDS, clients=2)
    check_growth("two uploads in 100-byte writes", before, peak)


@pytest.mark.timeout(60)
def test_pipelined_gets_never_read_hold_little_memory(rg_factory, fast_upstream):
    rg = rg_factory(upstreams=slow_upstream(fast_upstream))
    assert rg.request("GET", "/warm", timeout=5).status == 200
    before, peak, _ = mp.memory_while(rg.pid, mp.pipeline, rg.port, SCENARIO_SECONDS,
                                      clients=2)
    check_growth("two clients pipelining GETs, never reading", before, peak)


@pytest.mark.timeout(60)
def test_small_pieces_streamed_to_a_slow_reader_hold_little_memory(rg_factory):
    drip = mp.Drip()
    try:
        rg = rg_factory(upstreams=slow_upstream(drip.endpoint))
        before, peak, _ = mp.memory_while(rg.pid, mp.stream_down, rg.port, SCENARIO_SECONDS,
                                          clients=2)
        check_growth("two slow readers of 200-byte pieces", before, peak)
    finally:
        drip.close()


@pytest.mark.timeout(60)
def test_keyed_post_buffered_in_small_pieces_holds_little_memory(upstream, rg_factory):
    """A keyed POST is buffered whole (up to idempotency.max_body, 1 MiB) before it is sent:
    chains moved into that buffer keep their allocation, ~20x the bytes for 100-byte pieces
    (measured +20 MiB for one 1 MB body; +1.5 MiB with the pieces copied)."""
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream], "idempotency": {"enabled": True},
                                       "deadline": LONG_DEADLINE}})
    head = (b"POST /k HTTP/1.1\r\nHost: a\r\nIdempotency-Key: k1\r\n"
            b"Content-Length: 1000000\r\n\r\n")

    def one(port, seconds):
        return mp.send_pieces(port, head, b"u" * 100, seconds, mp.PACE)
    before, peak, _ = mp.memory_while(rg.pid, one, rg.port, SCENARIO_SECONDS, clients=1)
    check_growth("a keyed POST in 100-byte writes", before, peak)


# ------------------------------------------------------------------ signals during teardown

@pytest.mark.timeout(90)
def test_repeated_sigterm_during_teardown_still_exits_0(upstream, rg_factory):
    """Freeing the signal events used to restore the default disposition: a second SIGTERM
    in the teardown killed the process (exit 143). Every run must exit 0."""
    codes = []
    for _ in range(20):
        rg = rg_factory(upstreams={"api": upstream}, drain_timeout="1s")
        assert rg.request("GET", "/x", timeout=5).status == 200
        rg.send_signal(signal.SIGTERM)
        end = time.monotonic() + 10
        while rg.running and time.monotonic() < end:
            try:
                os.kill(rg.pid, signal.SIGTERM)
            except ProcessLookupError:
                break
            time.sleep(0.0005)
        codes.append(rg.wait_exit(10))
    assert codes == [0] * 20, "exit codes: %s" % codes


# ------------------------------------------------------------------ memory after a burst

# The goal is RSS after a burst within 2x of before. A small absolute slack keeps a tiny "before"
# from making the bound tighter than what a burst may rightly keep: each worker's bounded free
# lists (64 exchanges, 64 attempts, 256 evbuffers, about 1 MiB of pages once scattered) and
# libevent's per-fd entries (40 bytes a number).
BURST_SLACK = 4 << 20


def burst(port, n, concurrent=500):
    """n keep-alive connections, `concurrent` open at a time, each one GET; all closed. The
    status does not matter here (some may time out on a loaded machine): the memory does."""
    req = b"GET /b HTTP/1.1\r\nHost: a\r\n\r\n"
    done = 0
    while done < n:
        socks = []
        for _ in range(min(concurrent, n - done)):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)
            s.sendall(req)
            socks.append(s)
        for s in socks:
            got = b""
            while b"\r\n\r\n" not in got:
                d = s.recv(4096)
                assert d, "connection closed before the response"
                got += d
            assert got.startswith(b"HTTP/1.1 "), got[:80]    # 200, or 504 if overloaded
        for s in socks:
            s.close()
        done += len(socks)


@pytest.mark.timeout(120)
def test_rss_returns_after_a_burst_of_connections(rg_factory, upstream):
    # the upstream closes after each response: no idle upstream connection keeps memory in use
    upstream.set_default(respond(200, body=b"ok", keep_alive=False))
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream],
                                       "concurrency": {"max_in_flight": 4096}}}, workers=2)
    burst(rg.port, 200, 100)
    time.sleep(1.5)
    before = rss_bytes(rg.pid)
    burst(rg.port, 5000, 2500)
    wait_for(lambda: rg.metric("retrygate_downstream_connections_active") == 0, 10,
             what="connections closed")
    # the trims run from a 1 s timer: once the connections have gone, and again once the
    # loops have freed what their free lists kept of the burst (two of their 1 s ticks); the
    # RSS must be back within 10 s
    # measured (before ~6 MiB): without the trim +26..+48 MiB; with it +11..+14 MiB, the rest
    # being pages pinned by libevent's per-fd entries, made one by one among the connections'
    # memory; with those made ahead in blocks (loop_fd_seen) +1.6..+2.7 MiB; with the loops'
    # free lists keeping up to 1,024 buffers each, +4.9..+7.4 MiB; with what those lists do
    # not need scavenged, back to before (-0.4..+0.1 MiB) some 4 s after the connections closed
    limit = before + BURST_SLACK
    t0 = time.monotonic()
    seen = []
    while not seen or (seen[-1][1] > limit and time.monotonic() - t0 < 10):
        time.sleep(0.25)
        seen.append((time.monotonic() - t0, rss_bytes(rg.pid)))
    print("burst: rss before %s; after: %s" % (mib(before), ", ".join(
        "%.1fs %s" % (t, mib(r)) for t, r in seen[::4] + seen[-1:])))
    if sanitized():
        return
    after = seen[-1][1]
    assert after <= limit, "RSS 10 s after 5000 connections: %s (before: %s, limit %s)" \
        % (mib(after), mib(before), mib(limit))


# ------------------------------------------------------------------ request line and Host

@pytest.mark.timeout(30)
def test_request_line_without_version_is_400_at_once(upstream, rg_factory):
    rg = rg_factory(upstreams={"api": upstream})
    t0 = time.monotonic()
    data, closed = rg.raw(b"GET /\r\n", read_timeout=5)
    took = time.monotonic() - t0
    r = parse_response(data)
    assert r.status == 400 and r.headers["X-Retrygate-Reason"] == "bad-request", data[:200]
    assert closed and took < 2.0, "answered after %.1fs (header_timeout is 10s)" % took
    assert upstream.requests == []


@pytest.mark.timeout(30)
@pytest.mark.parametrize("host", [b"Host:", b"Host: ", b"Host:\t \t"])
def test_empty_host_is_400_and_not_forwarded(upstream, rg_factory, host):
    rg = rg_factory(upstreams={"api": upstream})
    data, closed = rg.raw(b"GET /x HTTP/1.1\r\n" + host + b"\r\n\r\n", read_timeout=5)
    r = parse_response(data)
    assert r.status == 400 and r.headers["X-Retrygate-Reason"] == "bad-request", data[:200]
    assert closed
    time.sleep(0.2)
    assert upstream.requests == []


# ------------------------------------------------------------------ idempotency store stall

def keyed_post(rg, key):
    r = rg.request("POST", "/pay", headers={"Idempotency-Key": key,
                                             "Content-Type": "application/json"},
                   body=b'{"amount":1}', timeout=10)
    return r.status, r.headers.get("X-Retrygate-Reason")


@pytest.mark.timeout(60)
def test_claim_buffered_by_a_stalled_redis_does_not_block_the_retry(upstream, rg_factory,
                                                                    redis_url):
    url, proc = redis_url
    rg = rg_factory(upstreams={"api": {
        "endpoints": [upstream],
        "idempotency": {"enabled": True, "store": url, "ttl": "1h", "lock_timeout": "30s"}}})
    assert keyed_post(rg, "warm")[0] == 200             # connected, clock offset known
    proc.send_signal(signal.SIGSTOP)
    try:
        assert keyed_post(rg, "stalled") == (503, "idempotency-store-unavailable")
    finally:
        proc.send_signal(signal.SIGCONT)
    # the store reconnects (backoff up to 2 s); the stalled claim ran on the server meanwhile
    wait_for(lambda: keyed_post(rg, "probe-%f" % time.monotonic())[0] == 200, 10,
             what="store back")
    assert len([r for r in upstream.requests if r.path == "/pay"]) >= 2
    before = len(upstream.requests)
    assert keyed_post(rg, "stalled") == (200, None), "the retry found a ghost claim"
    assert len(upstream.requests) == before + 1


# ------------------------------------------------------------------ drain

DRAIN_CONNS = 32


def drain_round(rg):
    """DRAIN_CONNS keep-alive connections, each idle after one request; then SIGTERM and, as
    soon as the drain has begun (its log line), a request on every one: a client cannot know
    of the drain, and one that sent before retrygate read its request would be served as a
    request in flight anyway. Returns what each connection got: "ok" (a complete response
    with Connection: close), or what went wrong."""
    conns = [RawConn(rg.port, timeout=10) for _ in range(DRAIN_CONNS)]
    req = b"GET /d HTTP/1.1\r\nHost: a\r\n\r\n"
    for c in conns:
        c.send(req)
        assert c.read_response(timeout=5).status == 200
    mark = len(rg.stderr_text())
    rg.send_signal(signal.SIGTERM)
    rg.wait_stderr(r"draining", timeout=5, start=mark)
    for c in conns:
        try:
            c.send(req)
        except OSError:
            pass            # already closed: reported below as what the client saw
    out = []
    for c in conns:
        try:
            r = c.read_response(timeout=5)
            conn_hdr = (r.headers.get("Connection") or "").lower()
            out.append("ok" if r.status == 200 and "close" in conn_hdr else
                       "status %d, Connection: %r" % (r.status, conn_hdr))
        except Exception as e:  # noqa: BLE001 - what the client saw is the result
            out.append("%s: %s" % (type(e).__name__, str(e)[:80]))
        c.close()
    return out


@pytest.mark.timeout(60)
def test_drain_serves_requests_already_sent(upstream, rg_factory):
    rg = rg_factory(upstreams={"api": upstream}, drain_timeout="5s")
    got = drain_round(rg)
    assert rg.wait_exit(15) == 0
    bad = [g for g in got if g != "ok"]
    assert not bad, "%d of %d connections lost their request: %s" % (len(bad), len(got),
                                                                       sorted(set(bad)))
