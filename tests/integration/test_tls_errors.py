"""Failed TLS handshakes are seen (issue 27, SPEC §7): counted by reason in
retrygate_downstream_tls_handshake_errors_total{reason} (the proxy listeners) and
retrygate_upstream_tls_handshake_errors_total{upstream,reason}, and logged once per peer a
minute. The certificates and servers are test_mtls.py's."""

import re

from test_h2_upstream import api, certs  # noqa: F401
from test_mtls import (_curl, _mtls_listener, _tls_upstream, mtls_upstream, pki,  # noqa: F401
                       pytestmark)


def test_client_refused_by_the_listener_is_counted_and_logged_once(upstream, rg_factory, pki):
    rg = _mtls_listener(rg_factory, upstream, pki, True)
    for _ in range(3):
        rc, body, _ = _curl(rg.port, pki)
        assert rc != 0, body
    assert rg.wait_metric("retrygate_downstream_tls_handshake_errors_total", 3,
                          reason="no-client-cert")
    rc, body, _ = _curl(rg.port, pki, cert="rogue")     # self-signed: no CA we trust
    assert rc != 0, body
    assert rg.wait_metric("retrygate_downstream_tls_handshake_errors_total", 1, reason="unknown-ca")
    assert rg.metric("retrygate_downstream_tls_handshake_errors_total", reason="other") == 0
    assert rg.stats()["downstream"]["tls_handshake_errors"]["no-client-cert"] == 3
    # a good client is not counted
    rc, _, err = _curl(rg.port, pki, cert="client")
    assert rc == 0, err
    assert rg.metric("retrygate_downstream_tls_handshake_errors_total", reason="no-client-cert") == 3
    # four failures from one peer within a minute: one line, naming the peer, listener, reason
    rg.wait_stderr(r"WARN (\[s\d+\] )?TLS handshake with client 127\.0\.0\.1 on listener main "
                   r"failed: no-client-cert")
    lines = re.findall(r".*TLS handshake with client.*", rg.stderr_text())
    assert len(lines) == 1, lines
    assert upstream.requests and all(r.path == "/m" for r in upstream.requests)


def test_upstream_certificate_from_an_unknown_ca_is_counted(rg_factory, mtls_upstream, pki):
    # we trust only the client CA: the upstream's server certificate does not chain to it
    rg = rg_factory(upstreams={"secure": _tls_upstream(mtls_upstream, pki, ca=pki["client_ca"])})
    for _ in range(2):
        r = rg.request("GET", "/who")
        assert r.status == 502 and r.headers["X-Retrygate-Reason"] == "connect-failure"
    assert rg.metric("retrygate_upstream_tls_handshake_errors_total", upstream="secure",
                     reason="unknown-ca") == 4     # two attempts each
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="secure",
                     outcome="connect-failure") == 4
    assert rg.stats()["upstreams"]["secure"]["tls_errors"]["unknown-ca"] == 4
    rg.wait_stderr(r"WARN upstream secure: TLS handshake with 127\.0\.0\.1:%d failed: unknown-ca "
                   r"\(certificate verify failed" % mtls_upstream.server_address[1])
    assert len(re.findall(r"upstream secure: TLS handshake", rg.stderr_text())) == 1


def test_upstream_refusing_our_certificate_is_counted(rg_factory, mtls_upstream, pki):
    # no client certificate: the upstream's alert refuses the handshake
    rg = rg_factory(upstreams={"secure": _tls_upstream(mtls_upstream, pki)})
    # an attempt may see the server's reset before its alert (it closes with our request
    # unread): that one says nothing about TLS and is not counted; a few requests see an alert
    for _ in range(10):
        assert rg.request("GET", "/who").status == 502
        if rg.metric("retrygate_upstream_tls_handshake_errors_total", upstream="secure",
                     reason="peer-refused") >= 1:
            break
    assert rg.metric("retrygate_upstream_tls_handshake_errors_total", upstream="secure",
                     reason="peer-refused") >= 1
    assert rg.metric("retrygate_upstream_tls_handshake_errors_total", upstream="secure",
                     reason="other") == 0
    rg.wait_stderr(r"WARN upstream secure: TLS handshake with 127\.0\.0\.1:\d+ failed: peer-refused "
                   r"\(tlsv13 alert certificate required\)")


def test_h2_upstream_certificate_from_an_unknown_ca_is_counted(h2up, rg_factory, certs, pki):
    # an HTTP/2 connection's handshake fails once for the streams waiting on it
    up = h2up(tls=(certs["crt"], certs["key"]))
    rg = rg_factory(upstreams=api(up, {"max_attempts": 2},
                                  tls={"sni": "localhost", "ca": pki["ca"], "verify": True}))
    r = rg.request("GET", "/x")
    assert r.status == 502 and r.headers["X-Retrygate-Reason"] == "connect-failure", r
    assert rg.metric("retrygate_upstream_tls_handshake_errors_total", upstream="api",
                     reason="unknown-ca") == 2
    rg.wait_stderr(r"WARN upstream api: TLS handshake with 127\.0\.0\.1:\d+ failed: unknown-ca")
    assert up.requests == []
