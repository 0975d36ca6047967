"""Operator experience (issue 15): one instance per address, the command line (a named bad
flag, --help's signals and environment, --health over http and https) and the admin
listener's JSON 404 for an unknown upstream."""

import copy
import shutil
import signal
import subprocess

import pytest

from harness import LOOPBACK, free_port, render_yaml, run_binary


def _second_instance(tmp_path, cfg, **changes):
    """Run a second process on CFG with CHANGES ("admin" / "listen" -> address) -> its
    CompletedProcess. It must exit by itself (a bind refusal); the timeout fails the test."""
    c = copy.deepcopy(cfg)
    if "admin" in changes:
        c["admin"]["listen"] = changes["admin"]
    if "listen" in changes:
        c["listeners"][0]["listen"] = changes["listen"]
    path = tmp_path / "second.yaml"
    path.write_text(render_yaml(c))
    try:
        return run_binary("-c", str(path), timeout=10)
    except subprocess.TimeoutExpired:
        pytest.fail("the second instance did not exit: it shares the first one's ports")


# ------------------------------------------------------------------------------- one instance

def test_second_instance_on_the_proxy_port_refuses_to_start(tmp_path, rg_factory, upstream):
    a = rg_factory(upstreams={"up": upstream}, workers=2)
    addr = "%s:%d" % (LOOPBACK, a.port)
    cp = _second_instance(tmp_path, a.config, admin="%s:%d" % (LOOPBACK, free_port()))
    assert cp.returncode == 1
    assert addr in cp.stderr and "another process" in cp.stderr, cp.stderr
    assert "listener main" in cp.stderr
    # A is untouched: every request is A's, and so is every kill-switch POST
    for _ in range(6):
        assert a.get("/x").status == 200
    for on in (False, True, False):
        assert a.set_retries(on, "up").status == 200
        assert a.retries() == {"up": on}
    assert a.stats()["upstreams"]["up"]["retries_enabled"] is False


def test_second_instance_on_the_admin_port_refuses_to_start(tmp_path, rg_factory, upstream):
    a = rg_factory(upstreams={"up": upstream})
    addr = "%s:%d" % (LOOPBACK, a.admin_port)
    cp = _second_instance(tmp_path, a.config, listen="%s:%d" % (LOOPBACK, free_port()))
    assert cp.returncode == 1
    assert "admin" in cp.stderr and addr in cp.stderr and "another process" in cp.stderr
    for _ in range(10):
        assert a.set_retries(False).status == 200
        assert a.retries() == {"up": False}
        assert a.set_retries(True).status == 200
        assert a.retries() == {"up": True}


def test_admin_listener_has_one_socket_without_reuseport(rg_factory, upstream):
    """Another socket with SO_REUSEPORT (any process of the same user) cannot join the admin
    address; it could join a proxy address only before the probe (not tested: a race)."""
    import socket
    a = rg_factory(upstreams={"up": upstream})
    s = socket.socket()
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        with pytest.raises(OSError):
            s.bind((LOOPBACK, a.admin_port))
    finally:
        s.close()


def test_many_workers_of_one_process_share_the_port(rg_factory, upstream):
    a = rg_factory(upstreams={"up": upstream}, workers=4)
    for _ in range(8):
        assert a.get("/x").status == 200


def test_restart_on_the_same_ports_after_a_stop(tmp_path, rg_factory, upstream):
    """TIME_WAIT leftovers of the first process are no 'other process'."""
    a = rg_factory(upstreams={"up": upstream}, workers=2)
    c = a.client()
    assert c.get("/x").status == 200
    c.close()
    cfg = copy.deepcopy(a.config)
    assert a.stop() == 0
    b = rg_factory(config=cfg)
    assert b.get("/x").status == 200


# ------------------------------------------------------------------------------- command line

def test_unknown_flag_is_named_with_the_usage():
    cp = run_binary("--chek")
    assert cp.returncode == 2
    first = cp.stderr.splitlines()[0]
    assert first == "retrygate: unknown option --chek"
    assert "usage: retrygate" in cp.stderr


def test_missing_value_and_stray_argument_are_named():
    cp = run_binary("-c")
    assert cp.returncode == 2 and "a value is missing after -c" in cp.stderr
    cp = run_binary("conf/retrygate.yaml")
    assert cp.returncode == 2 and "unexpected argument conf/retrygate.yaml" in cp.stderr


def test_help_names_the_signals_and_the_environment():
    cp = run_binary("--help")
    assert cp.returncode == 0
    for word in ("SIGHUP", "SIGTERM", "SIGINT", "SIGUSR1", "RETRYGATE_LOG=debug", "--health",
                 "https://"):
        assert word in cp.stdout, word


def test_health_http_against_admin_ready(rg):
    cp = run_binary("--health", "http://%s:%d/ready" % (LOOPBACK, rg.admin_port))
    assert cp.returncode == 0, cp.stderr
    cp = run_binary("--health", "http://%s:%d/nope" % (LOOPBACK, rg.admin_port))
    assert cp.returncode == 1 and "answered 404" in cp.stderr


def test_health_closed_port_and_other_schemes_fail():
    port = free_port()
    cp = run_binary("--health", "https://%s:%d/ready" % (LOOPBACK, port))
    assert cp.returncode == 1 and "cannot connect" in cp.stderr
    cp = run_binary("--health", "ftp://%s:%d/" % (LOOPBACK, port))
    assert cp.returncode == 1 and "only http:// and https://" in cp.stderr


@pytest.mark.skipif(not shutil.which("openssl"), reason="openssl CLI not installed")
def test_health_https_without_verification(tmp_path, rg_factory, upstream):
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True, timeout=60)
    rg = rg_factory(upstreams={"up": upstream}, listener_tls={"cert": str(crt), "key": str(key)})
    cp = run_binary("--health", "https://localhost:%d/ready" % rg.port)
    assert cp.returncode == 0, cp.stderr
    req = upstream.wait_requests(1)[0]
    assert req.path == "/ready"
    # plain http to the TLS listener is no 2xx
    cp = run_binary("--health", "http://%s:%d/ready" % (LOOPBACK, rg.port))
    assert cp.returncode == 1


def test_health_https_handshake_failure_is_reported(rg):
    cp = run_binary("--health", "https://%s:%d/ready" % (LOOPBACK, rg.admin_port))
    assert cp.returncode == 1 and "TLS handshake" in cp.stderr


# ------------------------------------------------------------------------------- admin JSON

def test_kill_switch_unknown_upstream_is_json(rg):
    r = rg.set_retries(False, "nope")
    assert r.status == 404
    assert r.headers["Content-Type"] == "application/json"
    assert r.json() == {"error": "unknown upstream", "upstream": "nope"}
    assert rg.retries() == {"up": True}


def test_kill_switch_unknown_upstream_name_is_escaped(rg):
    r = rg.admin("POST", '/retries?upstream=a"b\\c&enabled=false', body=b"")
    assert r.status in (400, 404)
    if r.status == 404:
        assert r.json() == {"error": "unknown upstream", "upstream": 'a"b\\c'}


def test_sigterm_still_exits_zero_after_a_refused_second_instance(tmp_path, rg_factory,
                                                                   upstream):
    a = rg_factory(upstreams={"up": upstream})
    _second_instance(tmp_path, a.config, admin="%s:%d" % (LOOPBACK, free_port()))
    assert a.stop(signal.SIGTERM) == 0
