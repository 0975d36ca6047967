"""mTLS (SPEC §2): a client certificate towards an upstream (upstreams.*.tls.cert/key), and
client-certificate verification on a listener (listeners[].tls.client_ca,
require_client_cert). An upstream refusing us is a connect-failure; a listener refusing a
client fails its handshake. Certificates are made here with the openssl CLI: one CA for the
servers, one for the clients, and a client certificate no configured CA signed."""

import http.server
import shutil
import socketserver
import ssl
import subprocess
import threading

import pytest

pytestmark = pytest.mark.skipif(not shutil.which("openssl") or not shutil.which("curl"),
                                reason="openssl or curl CLI not installed")


def _openssl(*args):
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _cert(d, name, cn, ca=None, is_ca=False):
    """d/name.pem and d/name.key: an EC certificate for CN, signed by CA (a name in d) or
    self-signed."""
    key, crt = d / (name + ".key"), d / (name + ".pem")
    args = ["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-nodes", "-days", "2", "-subj", "/CN=" + cn, "-keyout", str(key), "-out", str(crt)]
    if not is_ca:
        args += ["-addext", "subjectAltName=DNS:" + cn,
                 "-addext", "basicConstraints=critical,CA:FALSE"]
    if ca:
        args += ["-CA", str(d / (ca + ".pem")), "-CAkey", str(d / (ca + ".key"))]
    _openssl(*args)
    return str(crt), str(key)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("mtls")
    p = {}
    p["ca"], _ = _cert(d, "ca", "test-ca", is_ca=True)
    p["client_ca"], _ = _cert(d, "client_ca", "test-client-ca", is_ca=True)
    p["server"], p["server_key"] = _cert(d, "server", "localhost", ca="ca")
    p["client"], p["client_key"] = _cert(d, "client", "svc-a", ca="client_ca")
    p["rogue"], p["rogue_key"] = _cert(d, "rogue", "svc-rogue")     # self-signed
    return p


class _Hello(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        peer = self.connection.getpeercert() or {}
        cn = dict(x[0] for x in peer.get("subject", ())).get("commonName", "")
        body = ("hello " + cn).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


class TLSServer(socketserver.ThreadingMixIn, http.server.HTTPServer):
    """An HTTPS server on CTX (a thread per connection, the handshake in that thread);
    failed handshakes are listed in handshake_errors."""
    daemon_threads = True

    def __init__(self, ctx, handler=None):
        self.ctx = ctx
        self.handshake_errors = []
        super().__init__(("127.0.0.1", 0), handler or _Hello)

    def get_request(self):
        sock, addr = self.socket.accept()
        sock.settimeout(10)
        return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request, client_address):
        try:
            request.do_handshake()
        except (ssl.SSLError, OSError) as e:
            self.handshake_errors.append(str(e))
            return
        super().finish_request(request, client_address)

    def handle_error(self, request, client_address):
        pass


@pytest.fixture
def mtls_upstream(pki):
    """An HTTPS upstream (Python ssl) that requires a client certificate signed by client_ca."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(pki["server"], pki["server_key"])
    ctx.load_verify_locations(pki["client_ca"])
    ctx.verify_mode = ssl.CERT_REQUIRED
    srv = TLSServer(ctx)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _tls_upstream(srv, pki, **tls):
    block = {"sni": "localhost", "ca": pki["ca"], **tls}
    return {"endpoints": ["127.0.0.1:%d" % srv.server_address[1]], "tls": block,
            "retry": {"max_attempts": 2, "backoff": {"base": "1ms", "max": "2ms"}}}


def test_upstream_client_certificate_is_presented(rg_factory, mtls_upstream, pki):
    rg = rg_factory(upstreams={"secure": _tls_upstream(
        mtls_upstream, pki, cert=pki["client"], key=pki["client_key"])})
    status, headers, body = rg.request("GET", "/who")
    assert status == 200, body
    assert body == b"hello svc-a" and headers["X-Retrygate-Attempts"] == "1"


def test_upstream_refusing_us_is_a_connect_failure(rg_factory, mtls_upstream, pki):
    rg = rg_factory(upstreams={"secure": _tls_upstream(mtls_upstream, pki)})
    status, headers, body = rg.request("GET", "/who")
    assert status == 502 and headers["X-Retrygate-Reason"] == "connect-failure", body
    assert headers["X-Retrygate-Attempts"] == "2"
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="secure",
                     outcome="connect-failure") == 2
    assert rg.metric("retrygate_upstream_outcomes_total", upstream="secure", outcome="reset") == 0


def test_upstream_certificate_the_server_does_not_trust_is_a_connect_failure(
        rg_factory, mtls_upstream, pki):
    rg = rg_factory(upstreams={"secure": _tls_upstream(
        mtls_upstream, pki, cert=pki["rogue"], key=pki["rogue_key"])})
    status, headers, body = rg.request("GET", "/who")
    assert status == 502 and headers["X-Retrygate-Reason"] == "connect-failure", body
    assert headers["X-Retrygate-Attempts"] == "2"


def _curl(port, pki, cert=None, http2=False):
    """curl over TLS to the listener -> (exit code, body, stderr)."""
    args = ["curl", "-sS", "--max-time", "10", "--cacert", pki["ca"],
            "--resolve", "localhost:%d:127.0.0.1" % port, "https://localhost:%d/m" % port]
    if http2:
        args += ["--http2", "-w", "\n%{http_version}"]
    if cert:
        args += ["--cert", pki[cert], "--key", pki[cert + "_key"]]
    cp = subprocess.run(args, capture_output=True, timeout=30)
    return cp.returncode, cp.stdout, cp.stderr.decode(errors="replace")


def _mtls_listener(rg_factory, upstream, pki, require):
    return rg_factory(upstreams={"app": {"endpoints": [upstream]}},
                      listener_tls={"cert": pki["server"], "key": pki["server_key"],
                                    "client_ca": pki["client_ca"],
                                    "require_client_cert": require})


def test_listener_requiring_a_certificate(upstream, rg_factory, pki):
    rg = _mtls_listener(rg_factory, upstream, pki, True)
    rc, body, err = _curl(rg.port, pki)
    assert rc != 0, body
    rc, body, err = _curl(rg.port, pki, cert="rogue")
    assert rc != 0, body
    assert upstream.requests == []
    rc, body, err = _curl(rg.port, pki, cert="client")
    assert rc == 0, err
    assert upstream.wait_requests(1)[0].path == "/m"


def test_listener_requiring_a_certificate_over_http2(upstream, rg_factory, pki):
    # SPEC §2/§9: the certificate is checked in the handshake, before ALPN picks h2
    rg = _mtls_listener(rg_factory, upstream, pki, True)
    rc, body, err = _curl(rg.port, pki, http2=True)
    assert rc != 0, body
    rc, body, err = _curl(rg.port, pki, cert="rogue", http2=True)
    assert rc != 0, body
    assert upstream.requests == []
    rc, body, err = _curl(rg.port, pki, cert="client", http2=True)
    assert rc == 0, err
    assert body.rstrip().endswith(b"\n2"), body     # the request went over HTTP/2
    assert upstream.wait_requests(1)[0].path == "/m"


def test_listener_with_optional_certificates(upstream, rg_factory, pki):
    rg = _mtls_listener(rg_factory, upstream, pki, False)
    rc, body, err = _curl(rg.port, pki)
    assert rc == 0, err
    rc, body, err = _curl(rg.port, pki, cert="client")
    assert rc == 0, err
    assert len(upstream.wait_requests(2)) == 2
    rc, body, err = _curl(rg.port, pki, cert="rogue")
    assert rc != 0, body
    assert len(upstream.requests) == 2


def test_check_reads_the_mtls_files(pki, tmp_path):
    from harness import check_config, make_config
    cfg = make_config(upstreams={"secure": {
        "endpoints": ["127.0.0.1:9"],
        "tls": {"ca": pki["ca"], "cert": pki["client"], "key": str(tmp_path / "nokey.pem")}}},
        listener_tls={"cert": pki["server"], "key": pki["server_key"],
                      "client_ca": str(tmp_path / "noca.pem")})
    cp = check_config(cfg, workdir=tmp_path)
    assert cp.returncode == 1, cp.stdout
    errs = cp.stderr.strip().split("\n")
    assert any("listeners[0].tls.client_ca: cannot read" in e for e in errs), cp.stderr
    assert any("upstreams.secure.tls.key: cannot read" in e for e in errs), cp.stderr
    assert len(errs) == 2, cp.stderr


def test_check_reports_mtls(pki, tmp_path):
    from harness import check_config, make_config
    cfg = make_config(upstreams={"secure": {
        "endpoints": ["127.0.0.1:9"],
        "tls": {"ca": pki["ca"], "cert": pki["client"], "key": pki["client_key"]}}},
        listener_tls={"cert": pki["server"], "key": pki["server_key"],
                      "client_ca": pki["client_ca"], "require_client_cert": False})
    cp = check_config(cfg, workdir=tmp_path)
    assert cp.returncode == 0, cp.stderr
    assert "(tls, client certificates verified when offered)" in cp.stdout, cp.stdout
    assert "upstream secure: 1 endpoint (127.0.0.1:9), tls with a client certificate\n" in cp.stdout
