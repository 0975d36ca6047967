"""Values from the environment (SPEC §2): a string value written ${NAME} is the environment variable
NAME (secrets: admin.token, a Redis URL's password); an unset one is an error at the value's line
and column; /config redacts such values like the token."""

import json
import shutil
import socket
import subprocess

import pytest

from harness import (check_config, free_port, make_config, respond, upstream_block, wait_for,
                     LOOPBACK)
from test_idempotency import idem_upstream, post

pytestmark = pytest.mark.timeout(60)


def config_json(rg):
    r = rg.admin("GET", "/config")
    assert r.status == 200, r
    return json.loads(r.body)


def test_admin_token_from_the_environment(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, admin_token="${RG_T_TOKEN}")
    rg = rg_factory(cfg, env={"RG_T_TOKEN": "s3cr3t-from-env"})
    path = "/retries?upstream=api&enabled=false"
    assert rg.admin("POST", path, body=b"").status == 403
    assert rg.admin("POST", path, {"Authorization": "Bearer ${RG_T_TOKEN}"}, b"").status == 403
    r = rg.admin("POST", path, {"Authorization": "Bearer s3cr3t-from-env"}, b"")
    assert r.status == 200 and json.loads(r.body) == {"api": False}
    text = rg.admin("GET", "/config").text
    assert "s3cr3t-from-env" not in text
    assert json.loads(text)["admin"]["token"] == "<redacted>"


def test_any_string_value_from_the_environment_is_used_and_redacted(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream,
                                                       host_rewrite="${RG_T_HOST}")})
    rg = rg_factory(cfg, env={"RG_T_HOST": "internal.from-env.example"})
    assert rg.get("/from-env").status == 200
    assert upstream.requests[-1].header("Host") == "internal.from-env.example"
    live = config_json(rg)
    assert live["upstreams"]["api"]["host_rewrite"] == "<redacted>"
    assert "from-env.example" not in json.dumps(live)


def test_unset_variable_is_an_error_at_its_line_and_column(tmp_path, upstream):
    text = ("admin:\n"
            "  listen: \"127.0.0.1:@ADMIN_PORT@\"\n"
            "  token: ${RG_T_SURELY_UNSET}\n"
            "listeners:\n"
            "  - name: main\n"
            "    listen: \"127.0.0.1:@PORT@\"\n"
            "    routes: [{upstream: api}]\n"
            "upstreams:\n"
            "  api:\n"
            "    endpoints: [\"127.0.0.1:%d\"]\n"
            "    idempotency: {store: \"redis://:${RG_T_UNSET_PASS}@127.0.0.1:6379/0\"}\n"
            % upstream.port)
    cp = check_config(text, workdir=tmp_path)
    assert cp.returncode == 1, cp
    lines = cp.stderr.strip().splitlines()
    assert lines[0].startswith("%s:3:10: " % cp.path) and "RG_T_SURELY_UNSET" in lines[0], \
        cp.stderr
    assert any(l.startswith("%s:11:26: " % cp.path) and "RG_T_UNSET_PASS" in l
               for l in lines), cp.stderr


def test_unset_variable_on_reload_keeps_the_old_config(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)})
    rg = rg_factory(cfg)
    new = dict(cfg, admin=dict(cfg["admin"], token="${RG_T_SURELY_UNSET}"))
    log = rg.reload(new)
    assert "RG_T_SURELY_UNSET" in log and "fail" in log.lower(), log
    assert config_json(rg)["admin"]["token"] == ""
    assert rg.get("/").status == 200


@pytest.fixture
def redis_with_password():
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server not installed")
    port, password = free_port(), "p@ss:w/rd"
    p = subprocess.Popen([exe, "--port", str(port), "--bind", LOOPBACK, "--save", "",
                          "--appendonly", "no", "--requirepass", password],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():
        try:
            with socket.create_connection((LOOPBACK, port), 0.2) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"-NOAUTH")
        except OSError:
            return False
    wait_for(up, 10, what="redis-server")
    yield port, password
    p.kill()
    p.wait(5)


def test_redis_password_from_the_environment(upstream, rg_factory, redis_with_password):
    port, password = redis_with_password
    upstream.push(respond(201, body=b"paid"))
    url = "redis://:${RG_T_REDIS_PASS}@127.0.0.1:%d/0" % port
    rg = rg_factory(upstreams=idem_upstream(upstream, store=url),
                    env={"RG_T_REDIS_PASS": password})
    assert post(rg, "k-env")[0] == 201
    s, h, body = post(rg, "k-env")
    assert (s, body) == (201, b"paid") and h["Idempotency-Replayed"] == "true"
    assert len(upstream.requests) == 1
    store = config_json(rg)["upstreams"]["api"]["idempotency"]["store"]
    assert password not in store and "<redacted>" in store and str(port) in store, store
