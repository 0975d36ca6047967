"""The admin port under pipelined requests from a client that does not read (SPEC §7): GETs
need no token and the port is often reachable from the scraper's network, so the memory a
connection can hold must be bounded; the answers, once read, are complete and in order."""

import socket
import threading
import time

import pytest

from harness import rss_bytes
from rawclient import try_parse_response

pytestmark = pytest.mark.timeout(180)

PIPELINED_BYTES = 700 * 1024
RSS_GROWTH_LIMIT = 48 << 20     # unbounded, 700 kB of /metrics GETs cost ~400 MB


def _sender(sock, data, sent):
    """Send DATA; sent[0] counts the bytes the kernel took (the server may stop reading)."""
    view = memoryview(data)
    try:
        while sent[0] < len(data):
            n = sock.send(view[sent[0]:sent[0] + 65536])
            if n <= 0:
                break
            sent[0] += n
    except OSError:
        pass


def _pipeline(paths):
    reqs, methods = [], []
    while sum(map(len, reqs)) < PIPELINED_BYTES:
        for p in paths:
            reqs.append(b"GET %s HTTP/1.1\r\nHost: admin\r\n\r\n" % p)
            methods.append(p)
    return reqs, methods


@pytest.mark.parametrize("paths", [
    [b"/metrics"],
    [b"/metrics", b"/stats", b"/healthz", b"/config", b"/retries", b"/faults", b"/unknown",
     b"/ready", b"/nope"],
], ids=["metrics", "every-get"])
def test_pipelined_admin_gets_bounded_memory_and_in_order(rg_factory, upstream, paths):
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream]}})
    base = rss_bytes(rg.pid)
    reqs, order = _pipeline(paths)
    data = b"".join(reqs)
    s = socket.create_connection(("127.0.0.1", rg.admin_port), timeout=60)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 * 1024)
    s.settimeout(30)
    sent = [0]
    t = threading.Thread(target=_sender, args=(s, data, sent), daemon=True)
    t.start()
    # read nothing for a while: everything the server does with the requests, it does now
    peak = base
    deadline = time.monotonic() + 4.0
    while time.monotonic() < deadline:
        peak = max(peak, rss_bytes(rg.pid))
        time.sleep(0.05)
    growth = peak - base
    print("admin pipelining: %d of %d bytes taken, RSS base %.1f MB peak %.1f MB"
          % (sent[0], len(data), base / 1e6, peak / 1e6))
    assert growth < RSS_GROWTH_LIMIT, "RSS grew by %.1f MB" % (growth / 1e6)

    # now read: every request gets its whole answer, in order
    s.settimeout(60)
    buf = bytearray()
    i = 0
    while i < len(order):
        r = try_parse_response(buf)
        if r is None:
            d = s.recv(1 << 20)
            assert d, "closed after %d of %d answers" % (i, len(order))
            buf += d
            continue
        resp, used = r
        del buf[:used]
        p = order[i]
        assert resp.status == (404 if p == b"/nope" else 200), (i, p, resp.status)
        if p == b"/metrics":
            assert b"retrygate_upstream_requests_total" in resp.body, (i, resp.body[:200])
        elif p == b"/healthz":
            assert resp.body == b"ok\n", (i, resp.body)
        elif p == b"/retries":
            assert resp.body == b'{"api":true}\n', (i, resp.body)
        i += 1
    t.join(30)
    assert sent[0] == len(data)
    assert not buf
    s.close()


def test_pipelined_admin_requests_then_half_close_all_answered(rg_factory, upstream):
    """printf '...' | nc: the client's EOF comes right behind its requests; each is still
    answered before the connection closes."""
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream]}})
    n = 200
    s = socket.create_connection(("127.0.0.1", rg.admin_port), timeout=30)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: admin\r\n\r\n" * n)
    s.shutdown(socket.SHUT_WR)
    buf = bytearray()
    while True:
        d = s.recv(1 << 20)
        if not d:
            break
        buf += d
    s.close()
    got = 0
    while buf:
        r = try_parse_response(buf)
        assert r is not None, "truncated after %d answers" % got
        assert r[0].status == 200 and r[0].complete
        del buf[:r[1]]
        got += 1
    assert got == n


@pytest.mark.parametrize("path", [b"/healthz", b"/metrics", b"/nope"])
def test_admin_head_answer_has_no_body_and_keeps_the_stream_in_sync(rg_factory, upstream, path):
    """RFC 9110 §9.3.2: a HEAD answer carries the length it would have, never the body; a body
    there is read by a pipelining client as the start of the next answer."""
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream]}})
    s = socket.create_connection(("127.0.0.1", rg.admin_port), timeout=10)
    s.sendall(b"HEAD %s HTTP/1.1\r\nHost: admin\r\n\r\nGET /healthz HTTP/1.1\r\nHost: admin\r\n"
              b"Connection: close\r\n\r\n" % path)
    buf = bytearray()
    while True:
        d = s.recv(65536)
        if not d:
            break
        buf += d
    s.close()
    head = try_parse_response(buf, "HEAD")
    assert head is not None, bytes(buf)
    assert head[0].status == (404 if path == b"/nope" else 200) and head[0].body == b""
    assert int(head[0].headers["Content-Length"]) > 0
    del buf[:head[1]]
    r = try_parse_response(buf, "GET", eof=True)
    assert r is not None and r[0].status == 200 and r[0].body == b"ok\n", bytes(buf[:300])
    assert r[1] == len(buf)
