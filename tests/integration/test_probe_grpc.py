"""Active health that sees a sick gRPC server, and probes over TLS (SPEC §13).

* `kind: grpc`: the probe is the standard grpc.health.v1.Health/Check call; a real grpcio
  server implements the health service here (generic handlers and the two messages' bytes by
  hand: Debian's python3-grpcio ships no grpc_health) and switches SERVING / NOT_SERVING /
  SERVICE_UNKNOWN / an unknown service at run time; retrygate_endpoint_up follows.
* `kind: http` over HTTP/2 in front of grpcio: grpcio answers any GET `200` with
  `grpc-status: 2`; that is a failure, not a healthy server.
* TLS upstreams are probed as their attempts connect: SNI, CA, verification and the client
  certificate (the servers here require one); a CA or a server name that does not match
  takes the endpoint down.
Probes are not attempts: no attempt, request or budget figures move.
"""

import http.server
import shutil
import ssl
import threading
from concurrent import futures

import grpc
import pytest

from harness import check_config, make_config, wait_for
from test_mtls import TLSServer, _cert

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(not shutil.which("openssl"), reason="openssl CLI not installed")]

SERVING, NOT_SERVING, SERVICE_UNKNOWN = 1, 2, 3
FAST = {"interval": "100ms", "timeout": "1s", "unhealthy_after": 2, "healthy_after": 2}


def _varint(n):
    out = bytearray()
    while True:
        b, n = n & 0x7F, n >> 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _service_of(request):
    """HealthCheckRequest.service (field 1, a string) from the request's bytes."""
    i, service = 0, ""
    while i < len(request):
        key = request[i]
        i += 1
        assert key & 7 == 2, "unexpected field %r in %r" % (key, request)
        n, shift = 0, 0
        while True:
            b = request[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
        if key >> 3 == 1:
            service = request[i:i + n].decode()
        i += n
    return service


class HealthServer:
    """A grpcio server with grpc.health.v1.Health/Check: statuses maps a service name ("" is
    the server) to the ServingStatus it answers; a name not in it is NOT_FOUND, as the
    reference implementation answers. Each call is recorded as (service, time_remaining)."""

    def __init__(self, credentials=None):
        self.statuses = {"": SERVING}
        self.calls = []
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=8),
                                  options=[("grpc.so_reuseport", 0)])
        self.server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
            "grpc.health.v1.Health", {"Check": grpc.unary_unary_rpc_method_handler(self._check)}),))
        if credentials:
            self.port = self.server.add_secure_port("127.0.0.1:0", credentials)
        else:
            self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = "127.0.0.1:%d" % self.port
        self.server.start()

    def _check(self, request, context):
        service = _service_of(request)
        self.calls.append((service, context.time_remaining()))
        status = self.statuses.get(service)
        if status is None:
            context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
        return b"" if status == 0 else b"\x08" + _varint(status)

    def stop(self):
        self.server.stop(0)


@pytest.fixture
def health_server():
    made = []

    def make(**kw):
        s = HealthServer(**kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop()


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("probe-pki")
    p = {}
    p["ca"], _ = _cert(d, "ca", "test-ca", is_ca=True)
    p["other_ca"], _ = _cert(d, "other_ca", "other-ca", is_ca=True)
    p["client_ca"], _ = _cert(d, "client_ca", "test-client-ca", is_ca=True)
    p["server"], p["server_key"] = _cert(d, "server", "localhost", ca="ca")
    p["client"], p["client_key"] = _cert(d, "client", "svc-a", ca="client_ca")
    return p


def _read(path):
    with open(path, "rb") as f:
        return f.read()


def up(rg, endpoint):
    return rg.metric("retrygate_endpoint_up", upstream="api", endpoint=endpoint)


def wait_up(rg, endpoint, value, what):
    wait_for(lambda: up(rg, endpoint) == value, timeout=15, interval=0.05, what=what)


def assert_no_attempts(rg):
    """Probes are not attempts: no request metrics, no budget token, no slot."""
    m = rg.metrics()
    assert m.value("retrygate_upstream_attempts_total", upstream="api") == 0
    assert m.value("retrygate_upstream_requests_total", upstream="api") == 0
    assert m.value("retrygate_endpoint_attempts_total", upstream="api") == 0
    assert m.value("retrygate_upstream_retry_budget_tokens", upstream="api") == 10


def grpc_upstream(endpoint, active, **more):
    d = {"endpoints": [endpoint], "protocol": "h2",
         "retry": {"budget": {"max_tokens": 10}},
         "health": {"active": dict(FAST, **active)}}
    d.update(more)
    return {"api": d}


# ------------------------------------------------------------------------------- kind: grpc

def test_grpc_health_check_follows_the_serving_status(health_server, rg_factory):
    srv = health_server()
    srv.statuses["pkg.Api"] = SERVING
    rg = rg_factory(upstreams=grpc_upstream(srv.endpoint, {"kind": "grpc",
                                                           "service": "pkg.Api"}))
    wait_for(lambda: len(srv.calls) >= 3, timeout=10, what="health checks")
    assert up(rg, srv.endpoint) == 1
    service, remaining = srv.calls[0]
    assert service == "pkg.Api"
    # the probe's timeout travels as the call's deadline (grpc-timeout)
    assert remaining is not None and 0 < remaining <= 1.0

    srv.statuses["pkg.Api"] = NOT_SERVING
    wait_up(rg, srv.endpoint, 0, "NOT_SERVING takes the endpoint down")
    rg.wait_stderr(r"endpoint %s down: \d+ probes failed \(health NOT_SERVING" % srv.endpoint)

    srv.statuses["pkg.Api"] = SERVING
    wait_up(rg, srv.endpoint, 1, "SERVING brings it back")

    srv.statuses["pkg.Api"] = SERVICE_UNKNOWN
    wait_up(rg, srv.endpoint, 0, "SERVICE_UNKNOWN is a failure")
    srv.statuses["pkg.Api"] = SERVING
    wait_up(rg, srv.endpoint, 1, "up again")

    del srv.statuses["pkg.Api"]          # the server answers NOT_FOUND: a non-OK grpc-status
    wait_up(rg, srv.endpoint, 0, "an unknown service is a failure")
    rg.wait_stderr(r"grpc-status not-found")

    srv.statuses["pkg.Api"] = 0          # UNKNOWN: the empty message
    calls = len(srv.calls)
    wait_for(lambda: len(srv.calls) >= calls + 4, timeout=10, what="more checks")
    assert up(rg, srv.endpoint) == 0, "UNKNOWN is not SERVING"
    assert_no_attempts(rg)


def test_grpc_health_of_the_whole_server_and_a_stopped_one(health_server, rg_factory):
    srv = health_server()
    rg = rg_factory(upstreams=grpc_upstream(srv.endpoint, {"kind": "grpc"}))
    wait_for(lambda: len(srv.calls) >= 2, timeout=10, what="health checks")
    assert {s for s, _ in srv.calls} == {""}          # service "": the server as a whole
    assert up(rg, srv.endpoint) == 1
    srv.stop()                                        # a connection failure is a failure
    wait_up(rg, srv.endpoint, 0, "a stopped server goes down")
    assert_no_attempts(rg)


def test_http_probe_over_h2_sees_grpc_status(health_server, rg_factory):
    """grpcio answers GET /healthz with 200 and grpc-status 2 (UNKNOWN, "Bad method header"):
    every call fails, so the endpoint is down, whatever the :status says."""
    srv = health_server()
    rg = rg_factory(upstreams=grpc_upstream(srv.endpoint, {"path": "/healthz"}))
    wait_up(rg, srv.endpoint, 0, "a server failing every call goes down")
    rg.wait_stderr(r"status 200, grpc-status unknown")
    assert_no_attempts(rg)


def test_grpc_kind_needs_h2_and_is_reported(tmp_path):
    cfg = make_config(upstreams={"api": {"endpoints": ["127.0.0.1:9"], "health": {
        "active": {"kind": "grpc", "service": "pkg.Api"}}}})
    cp = check_config(cfg, workdir=tmp_path / "bad")
    assert cp.returncode != 0
    # FILE:LINE:COL at the kind
    assert "retrygate.yaml:" in cp.stderr and "health.active.kind: kind grpc needs protocol: h2" \
        in cp.stderr, cp.stderr
    line = [x for x in cp.stderr.splitlines() if "kind grpc needs" in x][0]
    _, ln, col = line.split(":")[:3]
    assert int(ln) > 0 and int(col) > 0
    cfg["upstreams"]["api"]["protocol"] = "h2"
    cp = check_config(cfg, workdir=tmp_path / "good")
    assert cp.returncode == 0, cp.stderr
    assert 'active health  grpc.health.v1 Check "pkg.Api" every 5s (timeout 1s)' in cp.stdout


# ------------------------------------------------------------------------------- TLS

def test_grpc_health_over_mtls(health_server, rg_factory, pki):
    creds = grpc.ssl_server_credentials([(_read(pki["server_key"]), _read(pki["server"]))],
                                        root_certificates=_read(pki["client_ca"]),
                                        require_client_auth=True)
    srv = health_server(credentials=creds)
    tls = {"sni": "localhost", "ca": pki["ca"], "verify": True, "cert": pki["client"],
           "key": pki["client_key"]}
    rg = rg_factory(upstreams=grpc_upstream(srv.endpoint, {"kind": "grpc"}, tls=tls))
    wait_for(lambda: len(srv.calls) >= 3, timeout=10, what="health checks over TLS")
    assert up(rg, srv.endpoint) == 1
    srv.statuses[""] = NOT_SERVING
    wait_up(rg, srv.endpoint, 0, "NOT_SERVING over TLS takes it down")
    srv.statuses[""] = SERVING
    wait_up(rg, srv.endpoint, 1, "SERVING over TLS brings it back")
    assert_no_attempts(rg)


class _Health(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self):
        srv = self.server
        srv.requests.append((self.path, self.headers.get("Host")))
        status = srv.status if self.path == "/healthz" else 404
        self.send_response(status)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


class TLSHealthServer(TLSServer):
    """HTTPS/1.1 with a client certificate required; records the SNI of each handshake."""

    def __init__(self, pki):
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(pki["server"], pki["server_key"])
        ctx.load_verify_locations(pki["client_ca"])
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.sni_callback = lambda sock, name, c: self.names.append(name)
        self.status, self.requests, self.names = 200, [], []
        super().__init__(ctx, _Health)
        self.endpoint = "127.0.0.1:%d" % self.server_address[1]


@pytest.fixture
def tls_health(pki):
    srv = TLSHealthServer(pki)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def http_tls_upstream(srv, pki, **tls):
    block = {"sni": "localhost", "ca": pki["ca"], "verify": True, "cert": pki["client"],
             "key": pki["client_key"]}
    block.update(tls)
    return {"api": {"endpoints": [srv.endpoint], "tls": block, "host_rewrite": "svc.example",
                    "retry": {"budget": {"max_tokens": 10}},
                    "health": {"active": dict(FAST, path="/healthz")}}}


def test_http_probe_over_tls(tls_health, rg_factory, pki):
    rg = rg_factory(upstreams=http_tls_upstream(tls_health, pki))
    wait_for(lambda: len(tls_health.requests) >= 3, timeout=10, what="probes over TLS")
    assert tls_health.requests[0] == ("/healthz", "svc.example")
    assert tls_health.names[0] == "localhost"               # SNI as the attempts send it
    assert up(rg, tls_health.endpoint) == 1
    tls_health.status = 503
    wait_up(rg, tls_health.endpoint, 0, "a failing health path over TLS takes it down")
    tls_health.status = 200
    wait_up(rg, tls_health.endpoint, 1, "and back up")
    assert_no_attempts(rg)


@pytest.mark.parametrize("wrong", ["ca", "sni"])
def test_http_probe_over_tls_verifies_the_server(tls_health, rg_factory, pki, wrong):
    """A server whose certificate does not verify (another CA, or a name it was not issued
    for) is down, as its attempts would fail."""
    tls = {"ca": pki["other_ca"]} if wrong == "ca" else {"sni": "elsewhere"}
    rg = rg_factory(upstreams=http_tls_upstream(tls_health, pki, **tls))
    wait_up(rg, tls_health.endpoint, 0, "an unverified server goes down")
    rg.wait_stderr(r"down: \d+ probes failed \(TLS: ")
    assert not tls_health.requests, "a probe was sent to an unverified server"
    assert_no_attempts(rg)
