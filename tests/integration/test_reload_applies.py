"""A reload applies everything in the file (SPEC §1 SIGHUP): a listener added, moved to another
address, and admin.listen moved are opened and closed; a key that needs a restart (workers) keeps
its live value with one warning; faults.enabled that differs from the live switch is said in one
line; a new address that cannot be bound fails the reload and the old config keeps serving."""

import copy
import json
import re
import socket

import pytest

from harness import (RawConn, free_port, make_config, port_open, respond, upstream_block, wait_for,
                     LOOPBACK)
from test_reload_listeners import GET, answered_or_closed, connect_refused, side_port, two_listeners

pytestmark = pytest.mark.timeout(60)


def addr(port):
    return "%s:%d" % (LOOPBACK, port)


def served(port):
    """A GET on a fresh connection to port answers 200."""
    c = RawConn(port)
    try:
        c.send(GET)
        return c.read_response(timeout=5).status == 200
    finally:
        c.close()


def live_config(rg):
    r = rg.admin("GET", "/config")
    assert r.status == 200, r
    return json.loads(r.body)


@pytest.mark.parametrize("workers", [1, 2])
def test_added_listener_opens(rg_factory, upstream, workers):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, workers=workers)
    rg = rg_factory(cfg)
    new = copy.deepcopy(cfg)
    port = free_port()
    new["listeners"].append({"name": "side", "listen": addr(port),
                             "routes": [{"upstream": "api"}]})
    log = rg.reload(new)
    assert "fail" not in log.lower(), log
    wait_for(lambda: port_open(port), 3, what="the added listener to accept")
    for _ in range(4 * workers):
        assert served(port)
    assert served(rg.port)
    assert [l["name"] for l in live_config(rg)["listeners"]] == ["main", "side"]


@pytest.mark.parametrize("workers", [1, 2])
def test_moved_listener_opens_at_the_new_address_and_closes_the_old(rg_factory, upstream,
                                                                    workers):
    cfg = two_listeners(upstream, workers=workers)
    rg = rg_factory(cfg)
    old_port = side_port(cfg)
    idle = RawConn(old_port)
    idle.send(GET)
    assert idle.read_response().status == 200            # keep-alive, now idle
    new = copy.deepcopy(cfg)
    new_port = free_port()
    new["listeners"][1]["listen"] = addr(new_port)
    log = rg.reload(new)
    assert "moved" in log and str(new_port) in log, log
    wait_for(lambda: port_open(new_port), 3, what="the moved listener at its new address")
    for _ in range(4 * workers):
        assert served(new_port)
    assert answered_or_closed(idle), "an idle connection at the old address hangs"
    idle.close()
    wait_for(lambda: connect_refused(old_port), 3, what="the old address refused")
    # and back again: the old address can be taken up anew
    log = rg.reload(cfg)
    wait_for(lambda: port_open(old_port), 3, what="the listener back at its first address")
    assert served(old_port)
    wait_for(lambda: connect_refused(new_port), 3, what="the second address refused")


def test_moved_main_listener_with_a_request_in_flight(rg_factory, upstream):

    upstream.on_path("/slow", default=respond(200, body=b"slow-done", delay=1.0))
    cfg = make_config(upstreams={"api": upstream_block(upstream,
                                                       retry={"per_try_timeout": "5s"})})
    rg = rg_factory(cfg)
    old_port = rg.port
    c = RawConn(old_port)
    c.send(b"GET /slow HTTP/1.1\r\nHost: h\r\n\r\n")
    upstream.wait_requests(1)
    new = copy.deepcopy(cfg)
    new["listeners"][0]["listen"] = addr(free_port())
    rg.reload(new, keep_ports=False)
    r = c.read_response(timeout=5)
    assert r.status == 200 and r.body == b"slow-done"
    assert r.headers.get("Connection", "").lower() == "close"
    assert c.wait_closed(2)
    c.close()
    assert served(rg.port) and rg.port != old_port
    wait_for(lambda: connect_refused(old_port), 3, what="the old address refused")


def test_moved_admin_listen(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)})
    rg = rg_factory(cfg)
    old_admin = rg.admin_port
    new = copy.deepcopy(cfg)
    new["admin"]["listen"] = addr(free_port())
    log = rg.reload(new, keep_ports=False)          # waits for /ready at the new address
    assert rg.admin_port != old_admin
    assert rg.admin("GET", "/ready").status == 200
    assert live_config(rg)["admin"]["listen"] == new["admin"]["listen"]
    assert "admin" in log and new["admin"]["listen"] in log, log
    wait_for(lambda: not port_open(old_admin), 3, what="the old admin address closed")
    assert served(rg.port)


def test_workers_change_keeps_the_live_count_with_one_warning(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, workers=1)
    rg = rg_factory(cfg)
    new = copy.deepcopy(cfg)
    new["workers"] = 2
    log = rg.reload(new)
    lines = [l for l in log.splitlines() if re.search(r"\bworkers\b", l)]
    assert len(lines) == 1 and re.search(r"warn", lines[0], re.I), log
    assert live_config(rg)["workers"] == 1
    assert served(rg.port)
    # unchanged: no warning
    log = rg.reload(cfg)
    assert not re.search(r"\bworkers\b", log), log


def test_faults_enabled_differing_from_the_live_switch_is_said_in_one_line(rg_factory, upstream):
    rule = {"kind": "abort", "percent": 100, "status": 500}
    off = {"after": 0, "min_success_rate": 0, "max_amplification": 0}
    cfg = make_config({"pay": upstream_block(upstream, retry={"max_attempts": 1},
                                             faults={"enabled": False, "rules": [rule],
                                                     "stop": off})})
    rg = rg_factory(cfg)
    new = copy.deepcopy(cfg)
    new["upstreams"]["pay"]["faults"]["enabled"] = True
    log = rg.reload(new)
    lines = [l for l in log.splitlines() if "faults.enabled" in l]
    assert len(lines) == 1 and "pay" in lines[0], log
    faults = json.loads(rg.admin("GET", "/faults").body)
    assert faults["pay"]["enabled"] is False
    assert rg.get("/").status == 200
    # the file agreeing with the live switch: nothing to say
    log = rg.reload(cfg)
    assert "faults.enabled" not in log, log


def test_new_address_that_cannot_be_bound_fails_the_reload(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)})
    rg = rg_factory(cfg)
    squatter = socket.socket()
    squatter.bind((LOOPBACK, 0))
    squatter.listen(1)
    taken = squatter.getsockname()[1]
    try:
        new = copy.deepcopy(cfg)
        new["listeners"].append({"name": "side", "listen": addr(taken),
                                 "routes": [{"upstream": "api"}]})
        new["admin"]["token"] = "changed"
        log = rg.reload(new)
        assert "fail" in log.lower() and str(taken) in log, log
        live = live_config(rg)
        assert [l["name"] for l in live["listeners"]] == ["main"]
        assert live["admin"]["token"] == ""           # nothing of the new file applied
        assert served(rg.port)
    finally:
        squatter.close()
