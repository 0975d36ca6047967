"""TLS: termination on a listener (listeners[].tls) and TLS to an upstream (upstreams.*.tls),
with SNI and certificate verification; a failed handshake is a connect-failure (SPEC §4)."""

import http.client
import shutil
import ssl
import subprocess

import pytest

from harness import make_config

pytestmark = pytest.mark.skipif(not shutil.which("openssl"), reason="openssl CLI not installed")


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    key, crt = d / "server.key", d / "server.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
                    "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True, timeout=60)
    other_key, other_crt = d / "other.key", d / "other.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=elsewhere", "-addext", "subjectAltName=DNS:elsewhere",
                    "-keyout", str(other_key), "-out", str(other_crt)],
                   check=True, capture_output=True, timeout=60)
    return {"key": str(key), "crt": str(crt), "other_crt": str(other_crt)}


def https_get(port, path, cafile):
    ctx = ssl.create_default_context(cafile=cafile)
    conn = http.client.HTTPSConnection("localhost", port, context=ctx, timeout=10)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


def test_listener_terminates_tls(upstream, rg_factory, certs):
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream]}},
                    listener_tls={"cert": certs["crt"], "key": certs["key"]})
    status, headers, body = https_get(rg.port, "/secure", certs["crt"])
    assert status == 200 and headers["x-retrygate-attempts"] == "1"
    req = upstream.wait_requests(1)[0]
    assert req.path == "/secure"
    assert req.header("X-Forwarded-Proto") == "https"


def test_upstream_tls_with_sni_and_verification(upstream, rg_factory, certs):
    # the "remote" side: a TLS listener of a second retrygate in front of the app
    inner = rg_factory(upstreams={"app": {"endpoints": [upstream]}},
                       listener_tls={"cert": certs["crt"], "key": certs["key"]})
    outer = rg_factory(upstreams={"remote": {
        "endpoints": ["127.0.0.1:%d" % inner.port],
        "tls": {"sni": "localhost", "ca": certs["crt"], "verify": True}}})
    status, headers, body = outer.request("GET", "/through-tls")
    assert status == 200, body
    assert upstream.wait_requests(1)[0].path == "/through-tls"


def test_upstream_tls_verification_failure_is_a_connect_failure(upstream, rg_factory, certs):
    inner = rg_factory(upstreams={"app": {"endpoints": [upstream]}},
                       listener_tls={"cert": certs["crt"], "key": certs["key"]})
    outer = rg_factory(upstreams={"remote": {
        "endpoints": ["127.0.0.1:%d" % inner.port],
        "tls": {"sni": "localhost", "ca": certs["other_crt"], "verify": True},
        "retry": {"max_attempts": 2, "backoff": {"base": "1ms", "max": "2ms"}}}})
    status, headers, body = outer.request("GET", "/x")
    assert status == 502 and headers["X-Retrygate-Reason"] == "connect-failure"
    assert headers["X-Retrygate-Attempts"] == "2"
    assert upstream.requests == []
    assert outer.metric("retrygate_upstream_outcomes_total", upstream="remote",
                        outcome="connect-failure") == 2


def test_bad_certificate_path_stops_startup(tmp_path, certs):
    from harness import Retrygate, RetrygateError
    cfg = make_config(upstreams={"api": ["127.0.0.1:9"]},
                      listener_tls={"cert": str(tmp_path / "missing.pem"), "key": certs["key"]})
    with pytest.raises((RetrygateError, AssertionError)):
        rg = Retrygate(cfg)
        rg.stop()
