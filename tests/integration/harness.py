"""Integration-test harness: run build/retrygate against scripted upstreams.

Fixtures (conftest.py): upstream, upstream_factory, rg_factory, rg, refusing, blackhole.
Everything else: ``from harness import ...``. Standard library only; every network operation
has a timeout, and every test phase is bounded (default 120 s, @pytest.mark.timeout(S)).

    def test_retry_then_ok(upstream, rg_factory):
        upstream.push(503, 503)                              # then the default: 200 echo
        rg = rg_factory(upstreams={"api": {"endpoints": [upstream],
                                           "retry": {"backoff": {"base": "1ms", "max": "5ms"}}}})
        status, headers, body = rg.request("GET", "/x")
        assert status == 200 and headers["X-Retrygate-Attempts"] == "3"
        reqs = upstream.wait_requests(3)
        assert [r.header("X-Retrygate-Attempt") for r in reqs] == ["1", "2", "3"]
        assert rg.wait_metric("retrygate_upstream_retries_total", 2, upstream="api")

Upstream (tests/tools/upstream.py)
    up.push(*specs) / up.set_default(spec) / up.on_path(prefix|pred, *specs, default=)
    spec: respond(status, headers, body, delay=, delay_body=, chunked=, keep_alive=, interim=,
          hold=Event, after=b"", content_length=) | echo() | retry_after(2, status=503) |
          close() | reset() | close_before_read() | reset_before_read() | stall(seconds=None) |
          raw(bytes, close=True) | partial(status, headers, body_prefix) |
          slow_body(chunks, interval) | respond_100_then(...) | interim(103, headers, ...) |
          an int status | a name | {"action": name, ...} | fn(req) -> spec
    up.requests -> [Request]: method target path version headers(HeaderMap) raw_head body
          raw_body chunked trailers conn_id seq time(t head complete) t_done complete action
    up.wait_requests(n, timeout) up.wait_connections(n) up.wait_conn_closed(id) -> closed_by
    up.wait_for(pred, timeout, what) up.connections up.conns up.errors up.active up.max_active
    up.close_idle(reset=False) up.kill_connections(reset=False) up.reset_log() up.endpoint
    Refusing().endpoint (connect refused), Blackhole().endpoint (connect hangs; .blocks)

Retrygate (rg_factory(config=None, **make_config kwargs) or Retrygate(dict | yaml text))
    make_config(upstreams={name: Upstream | [eps] | {"endpoints": [...], ...}}, routes=,
                listener_limits=, admin_token=, workers=1, access_log=, drain_timeout="2s")
    rg.port rg.admin_port rg.url(p) rg.request(m, p, headers, body, timeout=, chunked=)
    rg.get/post  rg.client() (keep-alive)  rg.raw(bytes, read_timeout) -> (bytes, closed)
    rg.raw_conn() -> RawConn  rg.admin(m, p)  rg.ready()  rg.metrics()  rg.metric(n, **lbl)
    rg.wait_metric(n, v, op=">=", **lbl)  rg.stats()  rg.config_json()  rg.retries()
    rg.set_retries(enabled, upstream=, token=)  rg.reload(cfg) -> new stderr
    rg.send_signal(sig)  rg.stop(sig=SIGTERM, timeout=15) -> rc  rg.kill()  rg.wait_exit()
    rg.stderr_text()  rg.stdout_text()  rg.wait_stderr(regex)
    check_config(cfg) -> CompletedProcess (--check)   run_binary("--version")
    upstream_block(eps, retry=None, base_retry=FAST_RETRY, **keys) -> one upstream's block,
          fast backoff (1-2 ms) updated with retry

Helpers
    wait_for(pred, timeout, what=)  free_port()  port_open(port, timeout)  rss_bytes(pid)
    InThread(fn, *a, **kw): fn runs in a thread at once; call it (timeout=20) for its result

Raw HTTP (tests/tools/rawclient.py)
    raw_request(port, bytes, read_timeout=2) -> (bytes, closed)
    parse_response(bytes, method="GET") -> RawResponse(status, headers, body, interim,
          complete, framing)   parse_responses(bytes, methods) -> [RawResponse]
    RawConn(port): send, read_response, read_interim, recv_some, read_until_close,
          wait_closed -> bool, was_reset, shutdown_write, reset, close

The binary is $RETRYGATE_BIN, else build/retrygate under the repository root.
"""

import collections
import copy
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
TOOLS = REPO_ROOT / "tests" / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

from rawclient import (ConnectionClosed, HeaderMap, HTTPParseError, RawConn,  # noqa: E402
                       RawResponse, ResponseMixin, normalize_headers, parse_response,
                       parse_responses, raw_request)
from upstream import (ACTIONS, Action, Blackhole, Refusing, Request, Upstream,  # noqa: E402,F401
                      build_head, callback, close, close_before_read, dynamic, echo, interim,
                      make_action, partial, raw, register_action, reset, reset_before_read,
                      respond, respond_100_then, retry_after, slow_body, stall)

__all__ = [
    # this module
    "REPO_ROOT", "Retrygate", "RetrygateError", "Response", "Client", "Metrics",
    "make_config", "render_yaml", "yaml_scalar", "ports_from_yaml", "free_port", "wait_for",
    "http_request", "parse_metrics", "sanitizer_reports", "check_config", "run_binary",
    "default_binary", "port_open", "rss_bytes", "InThread", "FAST_RETRY", "upstream_block",
    # rawclient
    "ConnectionClosed", "HeaderMap", "HTTPParseError", "RawConn", "RawResponse",
    "normalize_headers", "parse_response", "parse_responses", "raw_request",
    # upstream
    "ACTIONS", "Action", "Blackhole", "Refusing", "Request", "Upstream", "build_head",
    "callback", "close", "close_before_read", "dynamic", "echo", "interim", "make_action",
    "partial", "raw", "register_action", "reset", "reset_before_read", "respond",
    "respond_100_then", "retry_after", "slow_body", "stall",
]

LOOPBACK = "127.0.0.1"
SANITIZER_MARKERS = (
    "ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:",
    "AddressSanitizer:DEADLYSIGNAL", "SUMMARY: AddressSanitizer",
    "SUMMARY: UndefinedBehaviorSanitizer", "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer",
)
READY_TIMEOUT = float(os.environ.get("RETRYGATE_READY_TIMEOUT", "10"))


class RetrygateError(AssertionError):
    """The retrygate process did something the harness cannot work with (no start, crash)."""


def default_binary():
    """$RETRYGATE_BIN, else <repo>/build/retrygate."""
    b = os.environ.get("RETRYGATE_BIN")
    return Path(b) if b else REPO_ROOT / "build" / "retrygate"


_handed_ports = collections.deque(maxlen=256)


def free_port():
    """A currently free loopback TCP port (bind port 0, read it, close), never one handed out
    recently by this process: the kernel may give the same port to two binds in a row once
    the first socket is closed, and a config with two such ports cannot start."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((LOOPBACK, 0))
            port = s.getsockname()[1]
        if port not in _handed_ports:
            _handed_ports.append(port)
            return port
    raise RuntimeError("no fresh free port after 64 tries")


def wait_for(pred, timeout=10.0, interval=0.02, what="condition"):
    """Poll pred() until truthy; return its value. AssertionError after timeout seconds."""
    end = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= end:
            raise AssertionError("timed out after %.1fs waiting for %s" % (timeout, what))
        time.sleep(interval)


def port_open(port, timeout=1.0, host=LOOPBACK):
    """True when a TCP connect to host:port succeeds within timeout seconds."""
    with socket.socket() as s:
        s.settimeout(timeout)
        return s.connect_ex((host, port)) == 0


def rss_bytes(pid):
    """VmRSS of process pid, in bytes (from /proc/PID/status)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS for pid %d" % pid)


class InThread:
    """fn(*a, **kw), started at once in a daemon thread. Calling the object joins it: returns
    fn's value or raises what fn raised; AssertionError if it still runs after timeout seconds.
    .thread is the Thread (thread.join() waits without looking at the outcome)."""

    def __init__(self, fn, *a, **kw):
        self._box = {}
        self.thread = threading.Thread(target=self._run, args=(fn, a, kw), daemon=True)
        self.thread.start()

    def _run(self, fn, a, kw):
        try:
            self._box["r"] = fn(*a, **kw)
        except BaseException as e:  # noqa: BLE001 - raised again in the caller's thread
            self._box["e"] = e

    def __call__(self, timeout=20):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "background request still running"
        if "e" in self._box:
            raise self._box["e"]
        return self._box["r"]


# ------------------------------------------------------------------------------- YAML

_PLAIN = re.compile(r"^[A-Za-z0-9_/][A-Za-z0-9_./+-]*$")
_RESERVED = {"y", "n", "yes", "no", "on", "off", "true", "false", "null", "~"}
_NUMLIKE = re.compile(r"^[-+]?(\.?[0-9][0-9_]*(\.[0-9_]*)?([eE][-+]?[0-9]+)?|0x[0-9a-f_]+|"
                      r"0o[0-7_]+|\.inf|\.nan)$", re.I)


def _endpoint(x):
    if hasattr(x, "endpoint"):
        return x.endpoint
    if isinstance(x, int) and not isinstance(x, bool):
        return "%s:%d" % (LOOPBACK, x)
    return x


def yaml_scalar(v):
    """One YAML scalar: bools/ints/floats plain; strings plain when unambiguous (so 250ms,
    64KiB, auto, payments stay plain), else double-quoted ("off", "127.0.0.1:9001", "*.x")."""
    if hasattr(v, "endpoint"):
        v = v.endpoint
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        r = repr(v)
        if "e" in r:                      # the config parser wants plain decimals: 0.00001
            r = ("%.12f" % v).rstrip("0")
            r = r + "0" if r.endswith(".") else r
        return r
    if isinstance(v, Path):
        v = str(v)
    if isinstance(v, str):
        if _PLAIN.match(v) and v.lower() not in _RESERVED and not _NUMLIKE.match(v):
            return v
        return json.dumps(v)
    raise TypeError("cannot render %r as a YAML scalar" % (v,))


def _yaml_key(k):
    k = str(k)
    return k if _PLAIN.match(k) else json.dumps(k)


def _is_scalar(x):
    return not isinstance(x, (dict, list, tuple))


def _emit(obj, indent, lines):
    pad = " " * indent
    for k, v in obj.items():
        if v is None:
            continue
        key = _yaml_key(k)
        if isinstance(v, dict):
            if all(x is None for x in v.values()):
                lines.append("%s%s: {}" % (pad, key))
            else:
                lines.append("%s%s:" % (pad, key))
                _emit(v, indent + 2, lines)
        elif isinstance(v, (list, tuple)):
            if all(_is_scalar(x) for x in v):
                lines.append("%s%s: [%s]" % (pad, key, ", ".join(yaml_scalar(x) for x in v)))
                continue
            lines.append("%s%s:" % (pad, key))
            for item in v:
                if isinstance(item, dict):
                    sub = []
                    _emit(item, indent + 4, sub)
                    if not sub:
                        lines.append("%s  - {}" % pad)
                    else:
                        sub[0] = "%s  - %s" % (pad, sub[0][indent + 4:])
                        lines.extend(sub)
                elif _is_scalar(item):
                    lines.append("%s  - %s" % (pad, yaml_scalar(item)))
                else:
                    lines.append("%s  - [%s]" % (pad, ", ".join(yaml_scalar(x) for x in item)))
        else:
            lines.append("%s%s: %s" % (pad, key, yaml_scalar(v)))


def render_yaml(cfg):
    """Render a config dict as block YAML (keys in dict order; None values omitted; lists of
    scalars in flow style; Upstream/Refusing/Blackhole objects become their "host:port")."""
    lines = []
    _emit(cfg, 0, lines)
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------- config

def _upstream_spec(spec):
    if hasattr(spec, "endpoint") or isinstance(spec, (str, int)):
        return {"endpoints": [_endpoint(spec)]}
    if isinstance(spec, (list, tuple)):
        return {"endpoints": [_endpoint(x) for x in spec]}
    if isinstance(spec, dict):
        d = copy.deepcopy({k: v for k, v in spec.items() if k != "endpoints"})
        out = {}
        if "endpoints" in spec:
            eps = spec["endpoints"]
            out["endpoints"] = [_endpoint(x) for x in eps] if isinstance(eps, (list, tuple)) \
                else eps
        out.update(d)
        return out
    raise TypeError("upstream spec must be an Upstream, endpoint, list or dict: %r" % (spec,))


FAST_RETRY = {"backoff": {"base": "1ms", "max": "2ms"}}


def upstream_block(endpoints, retry=None, base_retry=FAST_RETRY, **more):
    """One upstream's config block: endpoints (one or a list); "retry" is a copy of base_retry
    (default FAST_RETRY: backoff 1-2 ms) updated with the keys of retry; the other keys
    (concurrency=, idempotency=, host_rewrite=, ...) are set as given."""
    r = dict(base_retry)
    r.update(retry or {})
    d = {"endpoints": endpoints if isinstance(endpoints, list) else [endpoints], "retry": r}
    d.update(more)
    return d


def make_config(upstreams, routes=None, listener_limits=None, admin_token=None, workers=1,
                access_log=None, drain_timeout="2s", port=None, admin_port=None,
                listener_name="main", listener_tls=None, extra_listeners=(), **extra):
    """A config dict per SPEC §2, with ephemeral loopback ports for the listener and admin.

    upstreams: {name: spec}; spec is an Upstream (or Refusing/Blackhole, or "host:port", or a
      port int), a list of those (the endpoints), or a full upstream dict whose "endpoints" may
      hold such objects, e.g. {"endpoints": [up], "retry": {"max_attempts": 2}}.
    routes: list of route dicts; default: one upstream -> [{"upstream": it}] (any host, "/");
      several -> one route per upstream matching Host == its name.
    listener_limits: the listener's limits: block. drain_timeout defaults to 2s here (not the
      product's 15s) so teardown is quick; pass None to leave it out.
    extra_listeners: more listener dicts (a missing "listen" gets a free port).
    **extra: more top-level keys, rendered as given (e.g. for unknown-key tests).
    Render with render_yaml(); Retrygate() accepts the dict directly.
    """
    ups = {name: _upstream_spec(spec) for name, spec in upstreams.items()}
    if routes is None:
        names = list(ups)
        routes = [{"upstream": names[0]}] if len(names) == 1 else \
            [{"host": n, "upstream": n} for n in names]
    admin = {"listen": "%s:%d" % (LOOPBACK, admin_port or free_port())}
    if admin_token is not None:
        admin["token"] = admin_token
    cfg = {"admin": admin, "workers": workers}
    if drain_timeout is not None:
        cfg["drain_timeout"] = drain_timeout
    if access_log is not None:
        cfg["access_log"] = str(access_log)
    listener = {"name": listener_name, "listen": "%s:%d" % (LOOPBACK, port or free_port())}
    if listener_tls:
        listener["tls"] = listener_tls
    if listener_limits:
        listener["limits"] = dict(listener_limits)
    listener["routes"] = list(routes)
    listeners = [listener]
    for i, el in enumerate(extra_listeners):
        el = dict(el)
        el.setdefault("name", "%s%d" % (listener_name, i + 2))
        el.setdefault("listen", "%s:%d" % (LOOPBACK, free_port()))
        listeners.append(el)
    cfg["listeners"] = listeners
    cfg["upstreams"] = ups
    cfg.update(extra)
    return cfg


def _port_of(listen):
    return int(str(listen).rsplit(":", 1)[1])


def ports_from_yaml(text):
    """(listener_port, admin_port) found in YAML text: the first "listen:" under "admin:" and
    the first under "listeners:" (None when absent)."""
    section = None
    found = {}
    for line in text.splitlines():
        if re.match(r"^[A-Za-z_]", line):
            section = line.split(":", 1)[0].strip()
        m = re.match(r"""^\s*(?:-\s+)?listen:\s*["']?([^"'\s#]+)""", line)
        if m and section in ("admin", "listeners") and section not in found:
            try:
                found[section] = _port_of(m.group(1))
            except (IndexError, ValueError):
                pass
    return found.get("listeners"), found.get("admin")


def _fill_placeholders(text, port=None, admin_port=None):
    """Replace @PORT@ / @ADMIN_PORT@ in YAML text; returns (text, port, admin_port)."""
    if "@PORT@" in text:
        port = port or free_port()
        text = text.replace("@PORT@", str(port))
    if "@ADMIN_PORT@" in text:
        admin_port = admin_port or free_port()
        text = text.replace("@ADMIN_PORT@", str(admin_port))
    return text, port, admin_port


# ------------------------------------------------------------------------------- HTTP client

class Response(ResponseMixin):
    """status (int), reason, headers (HeaderMap: case-insensitive, multi-value), body (bytes);
    .text, .json(); unpacks as ``status, headers, body``."""

    def __init__(self, status, reason, headers, body, version="HTTP/1.1"):
        self.status = status
        self.reason = reason
        self.headers = headers if isinstance(headers, HeaderMap) else HeaderMap(headers)
        self.body = body
        self.version = version

    def __repr__(self):
        return "<Response %d %r %r body=%r>" % (self.status, self.reason, self.headers.items(),
                                                self.body[:200])


def _send(conn, method, path, headers, body, chunked):
    hdrs = normalize_headers(headers)
    names = {n.lower() for n, _ in hdrs}
    conn.putrequest(method, path, skip_host="host" in names, skip_accept_encoding=True)
    for n, v in hdrs:
        conn.putheader(n, v)
    if body is None:
        conn.endheaders()
    elif chunked:
        pieces = [body] if isinstance(body, (bytes, str)) else list(body)
        pieces = [p.encode() if isinstance(p, str) else p for p in pieces]
        if "transfer-encoding" not in names:
            conn.putheader("Transfer-Encoding", "chunked")
        conn.endheaders(iter(pieces), encode_chunked=True)
    else:
        if isinstance(body, str):
            body = body.encode()
        if "content-length" not in names and "transfer-encoding" not in names:
            conn.putheader("Content-Length", str(len(body)))
        conn.endheaders(body)
    r = conn.getresponse()
    data = r.read()
    return Response(r.status, r.reason, r.getheaders(), data,
                    "HTTP/1.0" if r.version == 10 else "HTTP/1.1")


def http_request(port, method, path, headers=None, body=None, timeout=10.0, chunked=False,
                 host=LOOPBACK):
    """One request on a fresh connection (http.client). headers: dict or list of pairs (a Host
    given here replaces the default "127.0.0.1:PORT"). body: bytes/str; with chunked=True, a
    list of pieces sent chunked. Content-Length is added for a body. Note: http.client treats
    a relayed 103 as final: test 1xx with RawConn."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        return _send(conn, method, path, headers, body, chunked)
    finally:
        conn.close()


class Client:
    """A keep-alive client (one http.client connection reused): request(...) like
    http_request; .conn is the underlying HTTPConnection."""

    def __init__(self, port, host=LOOPBACK, timeout=10.0):
        self.conn = http.client.HTTPConnection(host, port, timeout=timeout)

    def request(self, method, path, headers=None, body=None, chunked=False):
        return _send(self.conn, method, path, headers, body, chunked)

    def get(self, path, headers=None):
        return self.request("GET", path, headers)

    def close(self):
        self.conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------------------- metrics

_METRIC_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)(\s+-?\d+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _unescape(s):
    return re.sub(r"\\(.)", lambda m: {"n": "\n"}.get(m.group(1), m.group(1)), s)


class Metrics(dict):
    """{(name, frozenset(labels.items())): float} parsed from Prometheus text 0.0.4."""

    def value(self, name, **labels):
        """Sum of every series of name whose labels include the given ones (0.0 if none):
        exact when all labels are given; value("x_total", upstream="a") sums over the others."""
        want = {k: str(v) for k, v in labels.items()}
        total = 0.0
        for (n, ls), v in self.items():
            if n == name and all(dict(ls).get(k) == x for k, x in want.items()):
                total += v
        return total

    def series(self, name):
        """[(labels dict, value)] for every series of name."""
        return [(dict(ls), v) for (n, ls), v in self.items() if n == name]

    def names(self):
        return {n for n, _ in self}


def parse_metrics(text):
    """Parse Prometheus text format; raises ValueError on a line it cannot read."""
    out = Metrics()
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _METRIC_LINE.match(line)
        if not m:
            raise ValueError("bad metrics line: %r" % line)
        name, _, labels_s, value = m.group(1), m.group(2), m.group(3), m.group(4)
        labels = {}
        if labels_s:
            pos = 0
            while pos < len(labels_s):
                lm = _LABEL.match(labels_s, pos)
                if not lm:
                    raise ValueError("bad labels in metrics line: %r" % line)
                labels[lm.group(1)] = _unescape(lm.group(2))
                pos = lm.end()
        out[(name, frozenset(labels.items()))] = float(value)
    return out


# ------------------------------------------------------------------------------- process

def _write(path, text):
    Path(path).write_text(text)


def _signame(n):
    try:
        return signal.Signals(n).name
    except ValueError:
        return "?"


def sanitizer_reports(text):
    """Excerpts of sanitizer reports found in text (empty list when clean)."""
    lines = text.splitlines()
    out = []
    i = 0
    while i < len(lines):
        if any(mk in lines[i] for mk in SANITIZER_MARKERS):
            out.append("\n".join(lines[max(0, i - 2):i + 40]))
            i += 40
        else:
            i += 1
    return out


class Retrygate:
    """One retrygate process.

    Retrygate(config, binary=None, workdir=None, env=None, args=(), start=True,
              wait_ready=True, ready_timeout=10, port=None, admin_port=None)
    config: a dict (make_config) or YAML text. In text, @PORT@ / @ADMIN_PORT@ are replaced by
    free ports; otherwise the ports are read from the text (or pass port=/admin_port=).
    The process runs in the repository root with -c WORKDIR/retrygate.yaml; its stdout and
    stderr go to WORKDIR/stdout.log and stderr.log; ASAN_OPTIONS/UBSAN_OPTIONS are set.
    """

    def __init__(self, config, binary=None, workdir=None, env=None, args=(), start=True,
                 wait_ready=True, ready_timeout=None, port=None, admin_port=None):
        self.binary = Path(binary) if binary else default_binary()
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="retrygate-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.workdir / "retrygate.yaml"
        self.stdout_path = self.workdir / "stdout.log"
        self.stderr_path = self.workdir / "stderr.log"
        self.extra_env = dict(env or {})
        self.args = [str(a) for a in args]
        self.ready_timeout = READY_TIMEOUT if ready_timeout is None else ready_timeout
        self.proc = None
        self.port = port
        self.admin_port = admin_port
        self.config = None
        self.stop_timed_out = False
        self._signals_sent = set()
        self._exit_observed = False
        self._clients = []
        self._files = []
        self.write_config(config, keep_ports=False)
        if start:
            self.start(wait_ready)

    # -- config -------------------------------------------------------------------------------
    def write_config(self, config, keep_ports=True):
        """Write config (dict or text) to self.config_path. keep_ports=True (reloads): a dict's
        admin and first listener addresses are set to the running ports."""
        if isinstance(config, dict):
            cfg = copy.deepcopy(config)
            if keep_ports and self.port and cfg.get("listeners"):
                cfg["listeners"][0]["listen"] = "%s:%d" % (LOOPBACK, self.port)
            if keep_ports and self.admin_port and isinstance(cfg.get("admin"), dict):
                cfg["admin"]["listen"] = "%s:%d" % (LOOPBACK, self.admin_port)
            if not keep_ports or not self.port:
                try:
                    self.port = _port_of(cfg["listeners"][0]["listen"])
                except (KeyError, IndexError, TypeError, ValueError):
                    pass
                try:
                    self.admin_port = _port_of(cfg["admin"]["listen"])
                except (KeyError, TypeError, ValueError):
                    pass
            self.config = cfg
            text = render_yaml(cfg)
        else:
            text, p, a = _fill_placeholders(str(config), self.port if keep_ports else None,
                                            self.admin_port if keep_ports else None)
            fp, fa = ports_from_yaml(text)
            if not keep_ports or not self.port:
                self.port = self.port or p or fp
                self.admin_port = self.admin_port or a or fa
            self.config = None
        self.config_text = text
        _write(self.config_path, text)
        return text

    # -- process ------------------------------------------------------------------------------
    def _env(self):
        env = dict(os.environ)
        env.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        env.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
        env.update(self.extra_env)
        return env

    def start(self, wait_ready=True):
        if not self.binary.exists():
            raise RetrygateError("retrygate binary not found: %s (build it with `make`, or set "
                                 "RETRYGATE_BIN)" % self.binary)
        out = open(self.stdout_path, "ab")
        err = open(self.stderr_path, "ab")
        self._files += [out, err]
        self.proc = subprocess.Popen([str(self.binary), "-c", str(self.config_path)] + self.args,
                                     stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                     cwd=str(REPO_ROOT), env=self._env())
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=None):
        """Wait for GET /ready -> 200 on the admin port. RetrygateError (with stderr) if the
        process exits first or timeout passes (the process is then killed)."""
        timeout = self.ready_timeout if timeout is None else timeout
        if not self.admin_port:
            raise RetrygateError("no admin port known: cannot wait for /ready")
        end = time.monotonic() + timeout
        while True:
            rc = self.proc.poll()
            if rc is not None:
                self._exit_observed = True
                raise RetrygateError("retrygate exited with %s before it was ready; stderr:\n%s"
                                     % (rc, self.stderr_text()[-6000:]))
            try:
                r = http_request(self.admin_port, "GET", "/ready", timeout=1.0)
                if r.status == 200:
                    return
            except (OSError, http.client.HTTPException):
                pass
            if time.monotonic() >= end:
                self.proc.kill()
                self.proc.wait(5)
                self._exit_observed = True
                raise RetrygateError("retrygate not ready within %.1fs (killed); stderr:\n%s"
                                     % (timeout, self.stderr_text()[-6000:]))
            time.sleep(0.05)

    @property
    def pid(self):
        return self.proc.pid if self.proc else None

    @property
    def running(self):
        return self.proc is not None and self.proc.poll() is None

    def send_signal(self, sig):
        """Send a signal (recorded: a test-sent fatal signal is not reported as a crash)."""
        self._signals_sent.add(sig)
        self.proc.send_signal(sig)

    def wait_exit(self, timeout=15.0):
        """Wait for the process to exit on its own; return its exit code (TimeoutError)."""
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise TimeoutError("retrygate still running after %.1fs" % timeout)
        self._exit_observed = True
        self._close_files()
        return rc

    def stop(self, sig=signal.SIGTERM, timeout=15.0):
        """Send sig (default SIGTERM) and wait up to timeout for the exit; SIGKILL after that
        (stop_timed_out = True). Returns the exit code (negative: killed by that signal).
        Safe to call twice."""
        return self._stop(sig, timeout, by_test=True)

    def _stop(self, sig, timeout, by_test):
        for c in self._clients:
            c.close()
        self._clients = []
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            if by_test:
                self._signals_sent.add(sig)
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.stop_timed_out = True
                self.proc.kill()
                self.proc.wait(10)
        if by_test:
            self._exit_observed = True
        self._close_files()
        return self.proc.returncode

    def kill(self):
        """SIGKILL (deliberate: not reported as a crash)."""
        return self.stop(signal.SIGKILL, 10)

    def _close_files(self):
        for f in self._files:
            try:
                f.close()
            except OSError:
                pass
        self._files = []

    def finish(self, timeout=15.0):
        """Teardown: stop if running, and return a list of problems (empty when clean):
        sanitizer reports in stderr, a crash (death by a signal the test did not send), a
        non-zero exit on the harness's SIGTERM, an unexpected exit, a stop that timed out."""
        problems = []
        if self.proc is None:
            return problems
        was_running = self.proc.poll() is None
        rc = self._stop(signal.SIGTERM, timeout, by_test=False)
        if self.stop_timed_out:
            problems.append("did not exit within %.0fs of SIGTERM (SIGKILLed)" % timeout)
        elif rc is not None and rc < 0 and (-rc not in self._signals_sent or -rc in (
                signal.SIGTERM, signal.SIGINT, signal.SIGHUP)):
            problems.append("crashed: killed by signal %d (%s)" % (-rc, _signame(-rc)))
        elif was_running and rc != 0:
            problems.append("exit code %s after SIGTERM (expected 0)" % rc)
        elif not was_running and not self._exit_observed and rc != 0:
            problems.append("exited on its own with code %s during the test" % rc)
        reports = sanitizer_reports(self.stderr_text())
        if reports:
            problems.append("sanitizer report(s) in stderr:\n" + "\n-----\n".join(reports))
        if problems:
            problems.append("stderr tail (%s):\n%s" % (self.stderr_path,
                                                       self.stderr_text()[-3000:]))
        return problems

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        problems = self.finish()
        if problems and exc[0] is None:
            raise RetrygateError("\n".join(problems))

    # -- logs ---------------------------------------------------------------------------------
    def stderr_text(self):
        try:
            return self.stderr_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stdout_text(self):
        try:
            return self.stdout_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_stderr(self, pattern, timeout=5.0, start=0):
        """Wait until stderr (from byte offset start) matches regex pattern; return the match."""
        rx = re.compile(pattern)
        return wait_for(lambda: rx.search(self.stderr_text()[start:]), timeout,
                        what="stderr to match %r" % pattern)

    # -- reload -------------------------------------------------------------------------------
    def reload(self, new_config=None, timeout=3.0, keep_ports=True):
        """Rewrite the config (if given; dicts keep the running ports), send SIGHUP, and wait
        until retrygate logs something new on stderr (at most timeout s), then /ready.
        Returns the stderr text written since the SIGHUP (e.g. to check a refused config)."""
        if new_config is not None:
            self.write_config(new_config, keep_ports=keep_ports)
        start = len(self.stderr_text())
        self.send_signal(signal.SIGHUP)
        try:
            wait_for(lambda: len(self.stderr_text()) > start, timeout, 0.02, "reload log line")
        except AssertionError:
            pass
        time.sleep(0.05)
        if self.running:
            wait_for(lambda: self.ready() == 200, timeout, 0.05, "/ready after reload")
        return self.stderr_text()[start:]

    # -- HTTP ---------------------------------------------------------------------------------
    def url(self, path="/"):
        return "http://%s:%d%s" % (LOOPBACK, self.port, path)

    def admin_url(self, path="/"):
        return "http://%s:%d%s" % (LOOPBACK, self.admin_port, path)

    def request(self, method, path, headers=None, body=None, timeout=10.0, chunked=False,
                port=None):
        """One request to the (first) listener on a fresh connection -> Response, which
        unpacks as (status, headers, body). See http_request."""
        return http_request(port or self.port, method, path, headers, body, timeout, chunked)

    def get(self, path, headers=None, **kw):
        return self.request("GET", path, headers, **kw)

    def post(self, path, body=b"", headers=None, **kw):
        return self.request("POST", path, headers, body, **kw)

    def client(self, timeout=10.0, port=None):
        """A keep-alive Client on the listener (closed at stop)."""
        c = Client(port or self.port, timeout=timeout)
        self._clients.append(c)
        return c

    def raw(self, data, read_timeout=2.0, **kw):
        """raw_request() to the listener -> (bytes, closed)."""
        return raw_request(self.port, data, read_timeout, **kw)

    def raw_conn(self, timeout=10.0):
        """A RawConn to the listener (close it, or use `with`)."""
        return RawConn(self.port, timeout=timeout)

    def admin(self, method, path, headers=None, body=None, timeout=10.0):
        """A request to the admin listener -> Response."""
        return http_request(self.admin_port, method, path, headers, body, timeout)

    def ready(self):
        """Status of GET /ready (0 when the admin port does not answer)."""
        try:
            return self.admin("GET", "/ready", timeout=2.0).status
        except (OSError, http.client.HTTPException):
            return 0

    def metrics_text(self):
        r = self.admin("GET", "/metrics")
        assert r.status == 200, "GET /metrics -> %r" % r
        return r.text

    def metrics(self):
        """GET /metrics parsed: {(name, frozenset(labels.items())): value} (a Metrics dict)."""
        return parse_metrics(self.metrics_text())

    def metric(self, name, **labels):
        """One metric value (float; 0.0 if absent). Labels given must match; series with more
        labels than given are summed (metric("retrygate_upstream_retries_refused_total",
        upstream="a") = all reasons)."""
        return self.metrics().value(name, **labels)

    def wait_metric(self, name, value, timeout=5.0, op=">=", **labels):
        """Wait until metric(name, **labels) op value (op: ">=", "==", "<=", ">", "<");
        return the final value. Metrics may lag the response by a moment."""
        ops = {">=": float.__ge__, "==": float.__eq__, "<=": float.__le__,
               ">": float.__gt__, "<": float.__lt__}
        cmp = ops[op]
        last = [None]

        def check():
            last[0] = self.metric(name, **labels)
            return cmp(last[0], float(value))
        try:
            wait_for(check, timeout, 0.05, "metric %s%r %s %s" % (name, labels, op, value))
        except AssertionError as e:
            raise AssertionError("%s (last value %r)" % (e, last[0]))
        return last[0]

    def stats(self):
        """GET /stats as JSON."""
        r = self.admin("GET", "/stats")
        assert r.status == 200, "GET /stats -> %r" % r
        return r.json()

    def config_json(self):
        """GET /config as JSON."""
        r = self.admin("GET", "/config")
        assert r.status == 200, "GET /config -> %r" % r
        return r.json()

    def retries(self):
        """GET /retries as JSON {upstream: bool}."""
        return self.admin("GET", "/retries").json()

    def set_retries(self, enabled, upstream=None, token=None):
        """POST /retries?[upstream=NAME&]enabled=true|false -> Response."""
        q = "enabled=%s" % ("true" if enabled else "false")
        if upstream is not None:
            q = "upstream=%s&%s" % (upstream, q)
        h = {"Authorization": "Bearer %s" % token} if token else None
        return self.admin("POST", "/retries?" + q, h, b"")

    def __repr__(self):
        return "<Retrygate pid=%s port=%s admin=%s>" % (self.pid, self.port, self.admin_port)


def run_binary(*args, binary=None, timeout=30.0, env=None):
    """Run the binary with args (e.g. "--version") -> subprocess.CompletedProcess (text)."""
    b = Path(binary) if binary else default_binary()
    if not b.exists():
        raise RetrygateError("retrygate binary not found: %s" % b)
    e = dict(os.environ)
    e.setdefault("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
    e.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
    e.update(env or {})
    return subprocess.run([str(b)] + [str(a) for a in args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout, cwd=str(REPO_ROOT),
                          env=e)


def check_config(config, workdir=None, binary=None, timeout=30.0, name="retrygate.yaml"):
    """Write config (dict or text) to WORKDIR/name and run `retrygate -c FILE --check`.
    Returns the CompletedProcess with .path (the file) set; .returncode, .stdout, .stderr."""
    wd = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="retrygate-check-"))
    wd.mkdir(parents=True, exist_ok=True)
    path = wd / name
    text = render_yaml(config) if isinstance(config, dict) else _fill_placeholders(str(config))[0]
    _write(path, text)
    cp = run_binary("-c", str(path), "--check", binary=binary, timeout=timeout)
    cp.path = str(path)
    return cp
