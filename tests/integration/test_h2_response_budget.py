"""HTTP/2 clients that do not read (SPEC §9 "memory per connection stays bounded by the
limits"): the response bytes a connection's streams buffer together are capped (RESP_BUDGET,
1 MiB, in src/client/h2_session_impl.h; the whole process has a cap too), beyond which their
exchanges stop reading the upstreams; once the clients read, every response completes intact.

Zero-window clients (SETTINGS_INITIAL_WINDOW_SIZE 0: retrygate may send them no DATA) open
STREAMS streams each for responses of SIZE bytes from an HTTP/1.1 upstream. Without the
budget each stream buffered its 256 KiB (the exchange's per-stream mark) plus what its paused
upstream had read: 180 streams took about 60-90 MiB. With it, per connection: 1 MiB, plus per
stream what its paused upstream connection had read (at most 64 KiB): 6 * (1 + 30 * 64 / 1024)
MiB = 17 MiB of bytes, BOUND below with the allocator's overhead.
"""

import time

import pytest
from hyperframe.frame import SettingsFrame, WindowUpdateFrame

from h2raw import H2Raw
from harness import default_binary, rss_bytes
from upstream import respond

pytestmark = pytest.mark.timeout(150)

CONNS, STREAMS, SIZE = 6, 30, 512 * 1024
SAN = "/san/" in str(default_binary())
BOUND = (30 << 20) * (2 if SAN else 1)
INITIAL_WINDOW_SIZE = 4


def body_for(path):
    unit = (path + ";").encode()
    return (unit * (SIZE // len(unit) + 1))[:SIZE]


def mib(n):
    return "%.1f MiB" % (n / float(1 << 20))


def rss_once_steady(pid, quiet=1.0, slack=256 << 10, timeout=20):
    """RSS once it grew by less than SLACK in QUIET seconds: whatever the upstreams send goes
    into buffers until something stops it, so the figure is taken when nothing more comes,
    not after a fixed time (a busy machine fills the buffers more slowly)."""
    t_end = time.monotonic() + timeout
    last = rss_bytes(pid)
    while time.monotonic() < t_end:
        time.sleep(quiet)
        now = rss_bytes(pid)
        if now - last < slack:
            return max(now, last)
        last = now
    return rss_bytes(pid)


def test_zero_window_connections_hold_a_bounded_response_budget(rg_factory, upstream):
    upstream.set_default(lambda req: respond(200, body=body_for(req.path)))
    rg = rg_factory(upstreams={"api": {
        "endpoints": [upstream], "connect_timeout": "5s",
        "deadline": {"default": "60s", "max": "60s"},
        "retry": {"per_try_timeout": "60s"},
        "concurrency": {"max_in_flight": 1000}}},
        listener_limits={"idle_timeout": "60s"})
    time.sleep(0.5)
    base = rss_bytes(rg.pid)
    cs = []
    try:
        for _ in range(CONNS):
            c = H2Raw(rg.port, settings={INITIAL_WINDOW_SIZE: 0}, timeout=60)
            assert c.settle(10)
            cs.append(c)
        sids = [[c.get("/big/%d/%d" % (i, j)) for j in range(STREAMS)]
                for i, c in enumerate(cs)]
        rg.wait_metric("retrygate_upstream_in_flight", CONNS * STREAMS, op="==",
                       upstream="api", timeout=30)
        held = rss_once_steady(rg.pid)
        print("\nzero-window HTTP/2 clients: RSS %s -> %s (+%s) for %d connections x %d "
              "streams of %d KiB" % (mib(base), mib(held), mib(held - base), CONNS, STREAMS,
                                      SIZE // 1024))
        assert held - base <= BOUND, "RSS grew by %s, above %s" % (mib(held - base),
                                                                  mib(BOUND))
        # the clients read: every response completes, whole
        for c in cs:
            c.frame(SettingsFrame(0, settings={INITIAL_WINDOW_SIZE: 1 << 20}))
            c.frame(WindowUpdateFrame(0, window_increment=1 << 30))
        for i, c in enumerate(cs):
            for j, sid in enumerate(sids[i]):
                r = c.response(sid, timeout=60)
                assert r.status == 200 and r.ended, (i, j, r)
                assert r.body == body_for("/big/%d/%d" % (i, j)), (i, j, len(r.body))
    finally:
        for c in cs:
            c.close()
    rg.wait_metric("retrygate_upstream_in_flight", 0, op="==", upstream="api", timeout=20)
