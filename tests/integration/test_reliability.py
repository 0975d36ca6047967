"""Reliability (issue 16): memory held is bounded by what the watermarks count, even when a peer
sends in small pieces; idle keep-alive connections get the request they already sent served
through a drain; repeated signals during teardown do not kill the process; memory goes back
to the system after a burst of connections. Slow variants of the memory scenarios: tests/soak.
"""

import os
import signal
import socket
import threading
import time

import pytest

import memory_peers as mp
from harness import RawConn, default_binary, parse_response, rss_bytes, wait_for

# Each scenario once fed ~300x its byte count into the heap (a 32 KiB chain per small read,
# one page of it touched): tens of MiB for a few connections. The bound is ~256 KiB counted per
# connection plus chain overhead. The heap (VmData) is the sharp figure, RSS the user's one.
SCENARIO_SECONDS = float(os.environ.get("RETRYGATE_RELIABILITY_SECONDS", "6"))
# measured for two connections, before the fix: heap +48..+129 MiB, RSS +7..+18 MiB; after:
# heap +2.5..+4.7 MiB, RSS +2.5..+4.7 MiB
HEAP_LIMIT = 16 << 20
RSS_LIMIT = 12 << 20
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
