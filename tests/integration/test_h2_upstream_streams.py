"""HTTP/2 upstream: how far a stream got, and where streams go.

What "sent" means for a stream is what the kernel accepted of its HEADERS, not what entered
retrygate's output buffer (SPEC §4: a request that provably never left is a connect-failure,
retried whatever its method, and never a reconciliation record); and streams beyond the
server's MAX_CONCURRENT_STREAMS, learnt late, go to other connections instead of waiting.
"""

import time

from harness import FAST_RETRY, InThread, wait_for
from h2upstream import echo, respond

GENEROUS = {"budget": {"ratio": 100, "min_per_second": 1000, "max_tokens": 1000}}


def api(up, retry=None, **more):
    r = dict(FAST_RETRY)
    r.update(GENEROUS)
    r.update(retry or {})
    d = {"endpoints": [up.endpoint], "protocol": "h2", "retry": r,
         "concurrency": {"max_in_flight": 1000, "max_retries_in_flight": 1000}}
    d.update(more)
    return {"api": d}


def attempts(r):
    return r.headers.get("X-Retrygate-Attempts")


def unsent_to(port):
    """Bytes the kernel holds unsent or unacknowledged on sockets connected to PORT on the
    loopback (tx_queue in /proc/net/tcp)."""
    total = 0
    with open("/proc/net/tcp") as f:
        next(f)
        for line in f:
            cols = line.split()
            if int(cols[2].split(":")[1], 16) == port:
                total += int(cols[4].split(":")[0], 16)
    return total


def stalled_output(port):
    """The kernel's send queue towards PORT is not empty and did not move for 0.3 s: the
    peer's window is shut, so whatever retrygate writes next waits in its own output."""
    before = unsent_to(port)
    time.sleep(0.3)
    return before > 0 and unsent_to(port) == before


def test_streams_queued_behind_an_unread_output_were_never_sent(h2up, rg_factory):
    # The first connection reads the preface and SETTINGS, then nothing. It grants a 1 MiB
    # window, so a PUT's 200 KB body is more than the kernels can hold (their buffers are
    # small by RCVBUF and MSS, and do not grow towards a shut window): the rest waits in
    # retrygate's output. Keyless POSTs then come one per loop round: each HEADERS is a small
    # append to the waiting output, which the stream packs every 64 of them (moving its bytes
    # out and back). None of them reached the kernel: when the connection dies they are
    # connect-failures, retried on a new connection, and none is a reconciliation record.
    up = h2up(max_streams=1000, deaf=1, rcvbuf=2048, mss=536, window=1 << 20)
    up.set_default(echo())
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "20s", "max_body": "1MiB"},
                                  deadline={"default": "30s", "max": "30s"}))
    fill = InThread(rg.request, "PUT", "/fill", body=b"f" * 200000, timeout=30)
    up.wait_connections(1)
    wait_for(lambda: stalled_output(up.port), 20, what="the PUT filling the kernels' buffers")
    posts = []
    for i in range(80):
        posts.append(InThread(rg.request, "POST", "/p%d" % i, body=b"", timeout=30))
        time.sleep(0.01)
    time.sleep(0.5)
    assert up.connections == 1
    up.conns[0].kill()
    rs = [t(timeout=40) for t in posts]
    bad = [(i, r.status, r.headers.get("X-Retrygate-Reason"), attempts(r),
            r.headers.get("X-Retrygate-Retry-Refused")) for i, r in enumerate(rs)
           if r.status != 200]
    assert not bad, bad
    assert all(attempts(r) == "2" for r in rs), [attempts(r) for r in rs]
    assert fill(timeout=40).status == 200        # a PUT: retried after the reset
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="api",
                     outcome="connect-failure") >= 80
    assert rg.metric("retrygate_reconcile_recorded_total", upstream="api") == 0
    r = rg.admin("GET", "/unknown?upstream=api")
    assert r.status == 200 and "/p" not in r.text, r.text[:500]


def test_streams_beyond_a_limit_learnt_late_go_to_other_connections(h2up, rg_factory):
    # The server says MAX_CONCURRENT_STREAMS 2 only after a delay, and holds each stream for
    # HOLD seconds. Six requests at once all queue on the first connection meanwhile; once
    # the limit is known the four beyond it go to other connections (which assume the limit
    # learnt) instead of waiting for two rounds of slow responses.
    HOLD = 1.5
    up = h2up(max_streams=2, settings_delay=0.3)
    up.set_default(respond(200, body=b"slow", delay=HOLD))
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "20s"},
                                  deadline={"default": "30s", "max": "30s"}))
    start = time.monotonic()
    ts = [InThread(rg.request, "GET", "/s%d" % i, timeout=30) for i in range(6)]
    rs = [t(timeout=30) for t in ts]
    took = time.monotonic() - start
    assert all(r.status == 200 and r.body == b"slow" for r in rs), rs
    assert all(attempts(r) == "1" for r in rs), [attempts(r) for r in rs]
    assert up.connections >= 3, up.connections
    per_conn = {}
    for q in up.requests:
        per_conn[q.conn_id] = per_conn.get(q.conn_id, 0) + 1
    assert max(per_conn.values()) <= 2 and len(up.requests) == 6, per_conn
    assert took < 2 * HOLD, "6 requests took %.2f s (one response: %.1f s)" % (took, HOLD)
