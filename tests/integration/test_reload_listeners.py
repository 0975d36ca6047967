"""Reloads that take things away (SPEC §1 SIGHUP): a listener removed from the config closes its
socket, its connections end (served, then closed) instead of hanging, and a line says so; a
reload that fails after validation leaves everything as it was, the access log included."""

import copy
import errno
import socket
import time

import pytest

from harness import RawConn, make_config, respond, upstream_block, wait_for

pytestmark = pytest.mark.timeout(60)

GET = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n"


def two_listeners(upstream, workers=1, extra_limits=None):
    extra = {"name": "side", "routes": [{"upstream": "api"}]}
    if extra_limits:
        extra["limits"] = extra_limits
    return make_config(upstreams={"api": upstream_block(upstream, retry={"per_try_timeout": "5s"})},
                       workers=workers, extra_listeners=[extra])


def side_port(cfg):
    return int(cfg["listeners"][1]["listen"].rsplit(":", 1)[1])


def without_side(cfg):
    new = copy.deepcopy(cfg)
    new["listeners"] = new["listeners"][:1]
    return new


def connect_refused(port):
    """True when a connect to port is refused (or reset before a byte) within 2 s."""
    s = socket.socket()
    s.settimeout(2)
    try:
        if s.connect_ex(("127.0.0.1", port)) in (errno.ECONNREFUSED, errno.ECONNRESET):
            return True
        s.sendall(GET)
        return s.recv(1) == b""
    except (ConnectionResetError, BrokenPipeError):
        return True
    except socket.timeout:
        return False
    finally:
        s.close()


def answered_or_closed(conn, timeout=2.0):
    """The connection either answers a request or is closed, within timeout (not left hanging)."""
    try:
        conn.send(GET)
    except OSError:
        return True
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if b"\r\n\r\n" in bytes(conn.buf):
            return True
        n = conn._recv(0.1)
        if n == 0:
            return True
    return False


@pytest.mark.parametrize("workers", [1, 2])
def test_removed_listener_closes_its_socket_and_ends_its_connections(rg_factory, upstream,
                                                                     workers):
    cfg = two_listeners(upstream, workers=workers)
    rg = rg_factory(cfg)
    port = side_port(cfg)
    idle = RawConn(port)
    idle.send(GET)
    assert idle.read_response().status == 200          # keep-alive, now idle
    log = rg.reload(without_side(cfg))
    t0 = time.monotonic()
    assert answered_or_closed(idle), "an idle connection of the removed listener hangs"
    wait_for(lambda: connect_refused(port), 3, what="connects to the removed listener refused")
    assert time.monotonic() - t0 < 3
    assert "side" in log and "removed" in log, log
    idle.close()
    # the listener that stayed serves on
    assert rg.get("/still").status == 200


def test_removed_listener_finishes_a_request_in_flight_then_closes(rg_factory, upstream):
    upstream.on_path("/slow", default=respond(200, body=b"slow-done", delay=1.0))
    cfg = two_listeners(upstream)
    rg = rg_factory(cfg)
    c = RawConn(side_port(cfg))
    c.send(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
    upstream.wait_requests(1)
    rg.reload(without_side(cfg))
    r = c.read_response(timeout=5)
    assert r.status == 200 and r.body == b"slow-done"
    assert r.headers.get("Connection", "").lower() == "close"
    assert c.wait_closed(2)
    c.close()


def test_removed_listener_at_its_cap_does_not_hold_a_waiting_client(rg_factory, upstream):
    # one place: the second client waits (SPEC §2: at the cap a connection waits); once the
    # listener is gone it must not wait forever
    cfg = two_listeners(upstream, extra_limits={"max_connections": 1})
    rg = rg_factory(cfg)
    port = side_port(cfg)
    first = RawConn(port)
    first.send(GET)
    assert first.read_response().status == 200
    waiting = RawConn(port)
    waiting.send(GET)
    assert waiting.recv_some(0.3) == b""                # held at the cap
    rg.reload(without_side(cfg))
    assert answered_or_closed(waiting, 3), "a client waiting at the cap hangs after the removal"
    assert answered_or_closed(first, 3)
    first.close()
    waiting.close()


def test_reload_failing_after_validation_keeps_the_access_log(rg_factory, upstream, tmp_path):
    old_log, new_log = tmp_path / "old.log", tmp_path / "new.log"
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, access_log=old_log)
    rg = rg_factory(cfg)
    assert rg.get("/before").status == 200
    bad = copy.deepcopy(cfg)
    bad["access_log"] = str(new_log)
    # valid YAML and schema; the certificate is only read when the new runtime is built
    bad["listeners"][0]["tls"] = {"cert": str(tmp_path / "missing.pem"),
                                  "key": str(tmp_path / "missing.key")}
    log = rg.reload(bad)
    assert "fail" in log.lower(), log
    assert rg.get("/after").status == 200
    wait_for(lambda: "/after" in old_log.read_text(), 3, what="/after in the old access log")
    assert not new_log.exists() or new_log.read_text() == ""
