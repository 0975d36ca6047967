"""gRPC deadlines that fit streams (SPEC §10 "Markers and deadline"), seen by two clients.

Every rule runs with grpcio (Python) and with Node's @grpc/grpc-js (tests/tools/
grpc_node_client.js, installed by `make deps` under build/deps/node): both must see the same.
The server is tests/tools/grpcserver.py (grpcio, scripted per call by metadata), which records
the deadline each attempt was given (time_remaining: grpcio's reading of grpc-timeout) and,
for a call cut while it waited, the time it still had (cut_left: a cancellation, not its
deadline). Where the rule is about the wire (grpc-timeout's text, RST_STREAM's code) the
upstream is tests/tools/h2upstream.py.

The rules: an attempt is told the call's remaining time (grpc-timeout and x-timeout-ms), not
min(per_try_timeout, remaining); per_try_timeout bounds the wait for the response head only,
and an attempt it cuts is cancelled upstream (RST_STREAM CANCEL) as a retried timeout; a
server's DEADLINE_EXCEEDED is never retried.
"""

import json
import os
import shutil
import subprocess
import time

import grpc
import pytest

from harness import FAST_RETRY, REPO_ROOT, wait_for
from h2upstream import stall
from test_grpc import metadata

pytestmark = pytest.mark.timeout(90)

UNARY = "/test.Svc/Unary"
STREAM = "/test.Svc/Stream"
CATALOG = "/test.Catalog/Get"
CANCEL = 8                          # RST_STREAM error code CANCEL (RFC 9113 §7)
NODE_MODULES = REPO_ROOT / "build" / "deps" / "node" / "node_modules"
NODE_CLIENT = REPO_ROOT / "tests" / "tools" / "grpc_node_client.js"
BY_NUMBER = {c.value[0]: c for c in grpc.StatusCode}


def node_missing():
    if not shutil.which("node"):
        return "node is not installed"
    if not (NODE_MODULES / "@grpc" / "grpc-js").is_dir():
        return "@grpc/grpc-js is not under %s (run make deps)" % NODE_MODULES
    return None


@pytest.fixture(params=["grpcio", "node"])
def client(request):
    """The client kind; the Node variant is skipped only when Node or @grpc/grpc-js is
    missing (make deps installs it)."""
    if request.param == "node" and node_missing():
        pytest.skip(node_missing())
    return request.param


class Res:
    """What the client saw of one call: code, details, messages, both metadata blocks merged
    (a Trailers-Only answer has everything in the trailing block), elapsed seconds."""

    def __init__(self, code, details, messages, initial, trailing, elapsed):
        self.code, self.details, self.messages = code, details, messages
        self.md = dict(initial or ())
        self.md.update(dict(trailing or ()))
        self.elapsed = elapsed

    def __repr__(self):
        return "Res(%s %r, %d message(s), md=%r, %.3fs)" % (
            self.code, self.details, len(self.messages), self.md, self.elapsed)


def grpcio_call(port, path, kind, req, md, timeout):
    ch = grpc.insecure_channel("127.0.0.1:%d" % port, options=[("grpc.enable_retries", 0)])
    t0 = time.monotonic()
    msgs = []
    try:
        if kind == "unary":
            resp, c = ch.unary_unary(path).with_call(req, metadata=md, timeout=timeout)
            msgs = [resp]
        else:
            c = ch.unary_stream(path)(req, metadata=md, timeout=timeout)
            for x in c:
                msgs.append(x)
        return Res(c.code(), c.details(), msgs, c.initial_metadata(), c.trailing_metadata(),
                   time.monotonic() - t0)
    except grpc.RpcError as e:
        return Res(e.code(), e.details(), msgs, e.initial_metadata(), e.trailing_metadata(),
                   time.monotonic() - t0)
    finally:
        ch.close()


def node_call(port, path, kind, req, md, timeout):
    spec = {"target": "127.0.0.1:%d" % port, "path": path, "kind": kind,
            "request": req.decode("latin-1"), "metadata": md,
            "timeout_ms": None if timeout is None else int(timeout * 1000)}
    env = dict(os.environ, NODE_PATH=str(NODE_MODULES))
    p = subprocess.run(["node", str(NODE_CLIENT), json.dumps(spec)], env=env,
                       capture_output=True, timeout=(timeout or 30) + 30)
    assert p.returncode == 0, p.stderr.decode(errors="replace")
    r = json.loads(p.stdout)
    return Res(BY_NUMBER[r["code"]], r["details"], [m.encode("latin-1") for m in r["messages"]],
               r["initial"], r["trailing"], r["elapsed"])


def call(client, rg, path=UNARY, kind="unary", req=b"req", timeout=10.0, script=None,
         key=None, xkey=None):
    md = metadata(script=script, key=key, xkey=xkey)
    return (node_call if client == "node" else grpcio_call)(rg.port, path, kind, req, md,
                                                            timeout)


def api(server, retry=None):
    """One upstream over HTTP/2, fast backoff, /test.Catalog/ idempotent, RETRY on top."""
    r = dict(FAST_RETRY, idempotent_paths=["/test.Catalog/"])
    r.update(retry or {})
    return {"api": {"endpoints": [server.endpoint], "protocol": "h2", "retry": r}}


# ------------------------------------------------------------------------------- the rules

def test_a_stream_runs_past_per_try_timeout_to_the_calls_deadline(client, grpcsrv, rg_factory):
    """300 messages 10 ms apart (3 s and more) with per_try_timeout 1 s and a 20 s deadline:
    the server is told the call's time, not the per-try time, so nothing cuts the stream."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "1s"}))
    r = call(client, rg, STREAM, kind="stream", script="messages:300,gap:10", timeout=20)
    assert r.code == grpc.StatusCode.OK, r
    assert len(r.messages) == 300 and r.messages[-1] == b"msg-300", r
    assert r.elapsed > 2.5, r
    c = srv.wait_calls(1)[0]
    assert c.time_remaining is not None and c.time_remaining > 15, c.time_remaining
    # grpcio rounds its grpc-timeout up (100 ms steps from 10 s): up to 20100m for 20 s
    assert 15000 < int(c.header("x-timeout-ms")) <= 20100, c.metadata


def test_every_attempt_is_told_the_calls_remaining_time(client, grpcsrv, rg_factory):
    """Retried UNAVAILABLE: each attempt carries what is left of the call (shrinking), far
    above per_try_timeout, in grpc-timeout (the server's time_remaining) and x-timeout-ms."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "500ms"}))
    r = call(client, rg, CATALOG, script="fail:2:unavailable,sleep:300", xkey="rt", timeout=8)
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "3", r
    calls = srv.wait_calls(3, key="rt")
    ms = [int(c.header("x-timeout-ms")) for c in calls]
    assert 6000 < ms[0] <= 8010 and ms[0] - ms[1] >= 250 and ms[1] - ms[2] >= 250, ms
    for c, m in zip(calls, ms):
        assert c.time_remaining is not None and abs(c.time_remaining * 1000 - m) < 300, \
            (c.time_remaining, m)


def test_a_call_without_a_deadline_is_told_the_default(client, grpcsrv, rg_factory):
    """No deadline from the client: the server is still told one, deadline.default (5 s
    in the test config), not per_try_timeout."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "800ms"}))
    r = call(client, rg, timeout=None)
    assert r.code == grpc.StatusCode.OK, r
    c = srv.wait_calls(1)[0]
    assert 4000 <= int(c.header("x-timeout-ms")) <= 5000, c.metadata
    assert c.time_remaining is not None and 3.9 < c.time_remaining <= 5.0, c.time_remaining


def test_pushback_wait_comes_off_the_next_attempts_time(client, grpcsrv, rg_factory):
    """grpc-retry-pushback-ms 1200 (longer than per_try_timeout) is waited, and the retry is
    told the call's time less that wait."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "500ms"}))
    r = call(client, rg, CATALOG, script="fail:1:unavailable,pushback:1200", xkey="pb",
             timeout=8)
    assert r.code == grpc.StatusCode.OK and r.md.get("x-retrygate-attempts") == "2", r
    first, second = srv.wait_calls(2, key="pb")
    assert second.t - first.t >= 1.15, second.t - first.t
    ms = [int(c.header("x-timeout-ms")) for c in (first, second)]
    assert ms[0] > 6000 and ms[0] - ms[1] >= 1150, ms
    assert second.time_remaining is not None and second.time_remaining > 5, second.time_remaining


def test_a_slow_head_is_cut_at_per_try_cancelled_and_retried(client, grpcsrv, rg_factory):
    """A unary call whose server sleeps 1.5 s: per_try_timeout (1 s) cuts each attempt before
    its head, the server sees a cancellation with seconds of the call still left (not its own
    deadline), and the cut is a timeout, retried: two attempts, then UNAVAILABLE timeout."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"per_try_timeout": "1s", "max_attempts": 2}))
    r = call(client, rg, CATALOG, script="sleep:1500", xkey="slow", timeout=10)
    assert r.code == grpc.StatusCode.UNAVAILABLE, r
    assert r.md.get("x-retrygate-reason") == "timeout", r
    assert r.md.get("x-retrygate-attempts") == "2", r
    assert 1.8 < r.elapsed < 6, r
    calls = srv.wait_calls(2, key="slow")
    for c in calls:
        assert c.time_remaining is not None and c.time_remaining > 7, c.time_remaining
    # the server noticed the cut while sleeping, with most of the call's time left
    wait_for(lambda: all(c.cut_left is not None for c in calls), timeout=10,
             what="both attempts cut while the server slept")
    assert all(c.cut_left > 6 for c in calls), [c.cut_left for c in calls]


def test_the_cut_is_rst_stream_cancel_and_the_wire_says_the_calls_time(client, h2up, rg_factory):
    """On the wire: grpc-timeout in gRPC format and x-timeout-ms with the call's remaining
    time, and an attempt cut at per_try_timeout is reset with CANCEL."""
    up = h2up()
    up.push(stall(5), stall(5))
    rg = rg_factory(upstreams=api(up, {"per_try_timeout": "400ms", "max_attempts": 2}))
    r = call(client, rg, CATALOG, timeout=6)
    assert r.code == grpc.StatusCode.UNAVAILABLE and r.md.get("x-retrygate-reason") == "timeout", r
    reqs = up.wait_requests(2)
    for q in reqs:
        gt, ms = q.header("grpc-timeout"), int(q.header("x-timeout-ms"))
        assert gt and gt[:-1].isdigit() and len(gt) <= 9 and gt[-1] == "m", gt
        assert int(gt[:-1]) == ms and 4000 < ms <= 6010, (gt, ms)
    assert int(reqs[0].header("x-timeout-ms")) - int(reqs[1].header("x-timeout-ms")) >= 350
    want = {(q.conn_id, q.stream_id) for q in reqs}
    wait_for(lambda: want <= {(c, s) for c, s, code in up.resets if code == CANCEL},
             timeout=10, what="RST_STREAM CANCEL for both attempts: %r" % (up.resets,))


def test_a_servers_deadline_exceeded_is_never_retried(client, grpcsrv, rg_factory):
    """deadline-exceeded listed in retry.on: still one attempt, and the answer says why."""
    srv = grpcsrv()
    rg = rg_factory(upstreams=api(srv, {"on": ["unavailable", "deadline-exceeded"]}))
    r = call(client, rg, CATALOG, script="code:deadline-exceeded", xkey="dx", timeout=8)
    assert r.code == grpc.StatusCode.DEADLINE_EXCEEDED, r
    assert r.md.get("x-retrygate-retry-refused") == "deadline", r
    assert r.md.get("x-retrygate-attempts") == "1", r
    assert len(srv.calls_for("dx")) == 1
