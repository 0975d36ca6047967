#!/usr/bin/env python3
"""A scriptable gRPC server for retrygate's tests and demo (python3-grpcio, no .proto).

Generic handlers with raw bytes in and out, so a test needs no generated code:

    /test.Svc/Unary      unary:            answers b"echo:" + the request
    /test.Svc/Stream     server-streaming: answers `messages` messages (default 3), b"msg-N"
    /test.Svc/Collect    client-streaming: answers b"|".join(the request messages)
    /test.Svc/Chat       bidirectional: once the client half-closed, answers b"re:" + each
    /test.Catalog/Get    unary, as Unary: a second service, for retry.idempotent_paths

What a call does is chosen by its metadata, so a test scripts each call (and every retry of it,
since retrygate re-sends the same metadata) without touching the server:

    x-key: K        the key the call's counters use (default: its idempotency-key, else its
                    method): "first N calls of this key" and side effects are counted per key
    x-script: S     steps joined by ",", all optional:
        fail:N:CODE         the first N calls of the key fail with CODE (a name of SPEC §10,
                            e.g. unavailable, resource-exhausted) before any message — grpcio
                            then sends Trailers-Only; later calls go on with the other steps
        code:CODE           every call fails with CODE before any message
        pushback:MS         a failure also carries trailing grpc-retry-pushback-ms: MS (MS may
                            be -1 or any text: the value is sent as written)
        headers-first       a failure sends its (empty) initial metadata first: HEADERS, then
                            trailers, no DATA (the linkerd2#7701 shape)
        executed            a failure happens after the side effect (the "did it happen?" case)
        sleep:MS            wait MS before answering (stops early when the call is cancelled)
        sleep-first:MS      as sleep, for the first call of the key only (a hedge's race)
        messages:N          Stream sends N messages
        gap:MS              Stream waits MS before each message after the first
        after-message:CODE  Stream sends one message, then fails with CODE (committed call)
        trailer:NAME=VALUE  an OK answer carries this trailing metadata too
        initial:NAME=VALUE  an OK answer carries this initial metadata too

Without x-script, a server given phases (the demo's flaky dependency) follows them on
CLOCK_MONOTONIC like tests/tools/flaky.py: in "healthy"/"recovered" every call is served; in
"outage" a call fails UNAVAILABLE with probability fail_rate (seeded), and a fraction
executed_rate of those failures happen after the side effect (the caller cannot tell "failed"
from "done"); in "overloaded" calls above `capacity` a second are refused UNAVAILABLE with
grpc-retry-pushback-ms: `pushback_ms` (default 1000), before any side effect. With dedupe, a call whose
idempotency-key already executed answers OK and executes nothing, as real services that honour
keys do.

A side effect is one execution of a call: a call that answered OK, or failed after `executed`.
Per call the server records what it received: method, key, metadata (as the application sees
it), the deadline it was given (time_remaining, seconds; None without one), the request
messages, the side effect. grpcio consumes grpc-timeout and te itself (they show as
time_remaining); tests that need the wire headers use tests/tools/h2upstream.py. A call that
stopped being active while the server still waited (a sleep or gap) records .cut_left, the
time it had left then (seconds): far from 0, the client cancelled it; near 0, its deadline.

In-process (tests):
    srv = GrpcServer()            # listens on 127.0.0.1:<free port>, srv.endpoint
    srv.calls                     # [Call]: .method .key .metadata (dict) .time_remaining
                                  #   .messages .effect .t (monotonic) .code (as answered)
    srv.wait_calls(n, timeout)  srv.calls_for(key)  srv.effects (dict key -> n)
    srv.stats()  srv.reset()  srv.stop()
    GrpcServer(phases=[("healthy", 2), ("outage", 5)], fail_rate=, executed_rate=, capacity=,
               pushback_ms=, dedupe=True); srv.start_timeline(at)    # each Call has .phase

As a process (the demo): grpcserver.py [--listen 127.0.0.1:0] [--stats 127.0.0.1:0] [--seed S]
[--phases healthy:2,outage:5,...] [--fail-rate F] [--executed-rate E] [--capacity N]
[--pushback-ms MS] [--dedupe]
prints "grpc 127.0.0.1:PORT stats 127.0.0.1:PORT" once listening, and serves on the stats port:
    GET /stats      {"calls": N, "effects": {key: n}, "by_code": {name: n}, "keys": {key: n}}
    GET /calls      the records as JSON (metadata included)
    POST /start?at=T  start the phases at CLOCK_MONOTONIC time T (default now)
    POST /reset     forget every record and counter
"""

import argparse
import json
import random
import signal
import sys
import threading
import time
from concurrent import futures
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from urllib.parse import parse_qs, urlsplit

import grpc

from flaky import Timeline, parse_phases     # the same clock of phases as the HTTP demo

LOOPBACK = "127.0.0.1"

# SPEC §10's code names, index = numeric code
CODE_NAMES = ("ok", "cancelled", "unknown", "invalid-argument", "deadline-exceeded",
              "not-found", "already-exists", "permission-denied", "resource-exhausted",
              "failed-precondition", "aborted", "out-of-range", "unimplemented", "internal",
              "unavailable", "data-loss", "unauthenticated")
BY_NAME = {n: grpc.StatusCode[n.upper().replace("-", "_")] for n in CODE_NAMES}


def code_of(name):
    """A grpc.StatusCode from a SPEC §10 name ("resource-exhausted") or a grpcio name."""
    n = name.strip().lower().replace("_", "-")
    if n not in BY_NAME:
        raise ValueError("unknown gRPC code name %r" % name)
    return BY_NAME[n]


def name_of(code):
    """SPEC §10's name of a grpc.StatusCode."""
    return code.name.lower().replace("_", "-")


class Script:
    """One call's x-script, parsed."""

    def __init__(self, text):
        self.fail_n, self.fail_code, self.always = 0, None, None
        self.pushback, self.headers_first, self.executed = None, False, False
        self.sleep_ms, self.messages, self.after_message = 0, 3, None
        self.sleep_first_ms = 0
        self.gap_ms = 0
        self.trailers, self.initial = [], []
        for step in filter(None, (s.strip() for s in (text or "").split(","))):
            kind, _, arg = step.partition(":")
            if kind == "fail":
                n, _, code = arg.partition(":")
                self.fail_n, self.fail_code = int(n), code_of(code or "unavailable")
            elif kind == "code":
                self.always = code_of(arg)
            elif kind == "pushback":
                self.pushback = arg
            elif kind == "headers-first":
                self.headers_first = True
            elif kind == "executed":
                self.executed = True
            elif kind == "sleep":
                self.sleep_ms = int(arg)
            elif kind == "sleep-first":
                self.sleep_first_ms = int(arg)
            elif kind == "messages":
                self.messages = int(arg)
            elif kind == "gap":
                self.gap_ms = int(arg)
            elif kind == "after-message":
                self.after_message = code_of(arg or "unavailable")
            elif kind in ("trailer", "initial"):
                k, _, v = arg.partition("=")
                (self.trailers if kind == "trailer" else self.initial).append((k, v))
            else:
                raise ValueError("unknown x-script step %r" % step)


class Call:
    def __init__(self, method, key, metadata, time_remaining, seq):
        self.method, self.key, self.metadata = method, key, metadata
        self.time_remaining = time_remaining
        self.messages = []
        self.effect = False
        self.code = None
        self.seq = seq
        self.t = time.monotonic()
        self.phase = None
        self.cut_left = None            # seconds left when it went inactive during a wait

    def header(self, name):
        return self.metadata.get(name.lower())

    def as_json(self):
        return {"seq": self.seq, "method": self.method, "key": self.key,
                "metadata": self.metadata, "time_remaining": self.time_remaining,
                "messages": [m.decode("latin-1") for m in self.messages],
                "effect": self.effect, "code": self.code, "t": self.t, "phase": self.phase,
                "cut_left": self.cut_left}


class GrpcServer:
    def __init__(self, listen="%s:0" % LOOPBACK, workers=64, seed=1, phases=None,
                 fail_rate=0.8, executed_rate=0.4, capacity=40.0, pushback_ms=1000,
                 dedupe=False):
        self.lock = threading.Lock()
        self.calls, self.effects, self.seen, self.by_code = [], {}, {}, {}
        self.rng = random.Random(seed)
        self.timeline = Timeline(phases) if phases else None
        self.fail_rate, self.executed_rate = fail_rate, executed_rate
        self.capacity, self.pushback_ms, self.dedupe = capacity, pushback_ms, dedupe
        self.tokens, self.tokens_at = capacity / 10.0, time.monotonic()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers),
                                  maximum_concurrent_rpcs=None,
                                  options=[("grpc.so_reuseport", 0)])
        self.server.add_generic_rpc_handlers((
            grpc.method_handlers_generic_handler("test.Svc", {
                "Unary": self._unary_handler("/test.Svc/Unary"),
                "Stream": grpc.unary_stream_rpc_method_handler(self._stream),
                "Collect": grpc.stream_unary_rpc_method_handler(self._collect),
                "Chat": grpc.stream_stream_rpc_method_handler(self._chat)}),
            grpc.method_handlers_generic_handler("test.Catalog", {
                "Get": self._unary_handler("/test.Catalog/Get")})))
        host, _, port = listen.rpartition(":")
        self.port = self.server.add_insecure_port("%s:%s" % (host, port))
        if not self.port:
            raise RuntimeError("grpcserver: cannot listen on %s" % listen)
        self.endpoint = "%s:%d" % (host, self.port)
        self.server.start()

    # -- records ---------------------------------------------------------------------------
    def reset(self):
        with self.lock:
            self.calls, self.effects, self.seen, self.by_code = [], {}, {}, {}

    def start_timeline(self, at=None):
        """The phases start at CLOCK_MONOTONIC time AT (default now); before, the first
        phase applies."""
        if self.timeline is not None:
            self.timeline.start = time.monotonic() if at is None else at

    def calls_for(self, key):
        with self.lock:
            return [c for c in self.calls if c.key == key]

    def wait_calls(self, n, timeout=10.0, key=None):
        end = time.monotonic() + timeout
        while True:
            got = self.calls_for(key) if key is not None else list(self.calls)
            if len(got) >= n:
                return got
            if time.monotonic() >= end:
                raise AssertionError("grpcserver: %d call(s)%s after %.1fs, wanted %d"
                                     % (len(got), " for key %r" % key if key else "",
                                        timeout, n))
            time.sleep(0.01)

    def stats(self):
        with self.lock:
            return {"calls": len(self.calls), "effects": dict(self.effects),
                    "keys": dict(self.seen), "by_code": dict(self.by_code)}

    def stop(self, grace=0.5):
        self.server.stop(grace).wait(5)

    # -- one call --------------------------------------------------------------------------
    def _begin(self, method, context):
        md = {}
        for k, v in context.invocation_metadata():
            md[k] = v if k not in md else md[k] + "," + v
        key = md.get("x-key") or md.get("idempotency-key") or method
        script = Script(md.get("x-script"))
        with self.lock:
            n = self.seen.get(key, 0) + 1
            self.seen[key] = n
            left = context.time_remaining()     # grpcio: about 2**63 ns without a deadline
            call = Call(method, key, md, left if left is not None and left < 1e9 else None,
                        len(self.calls) + 1)
            call.phase = self.timeline.phase_at(call.t) if self.timeline else None
            call.nth = n
            self.calls.append(call)
            fail, executed, pushback = None, script.executed, script.pushback
            if script.always is not None:
                fail = script.always
            elif n <= script.fail_n:
                fail = script.fail_code
            elif "x-script" not in md and call.phase == "outage":
                if self.rng.random() < self.fail_rate:
                    fail = grpc.StatusCode.UNAVAILABLE
                    executed = self.rng.random() < self.executed_rate
            elif "x-script" not in md and call.phase == "overloaded" and not self._admit(call.t):
                fail, pushback = grpc.StatusCode.UNAVAILABLE, str(self.pushback_ms)
        return call, script, fail, executed, pushback

    def _admit(self, now):
        """The overloaded dependency's capacity: a token bucket of CAPACITY a second (a tenth
        of a second of burst). Called with the lock held."""
        self.tokens = min(self.capacity / 10.0,
                          self.tokens + (now - self.tokens_at) * self.capacity)
        self.tokens_at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def _replay(self, call):
        """With dedupe: a key that already executed executes nothing again."""
        with self.lock:
            return self.dedupe and "idempotency-key" in call.metadata and \
                self.effects.get(call.key, 0) > 0

    def _effect(self, call):
        if self._replay(call):
            return
        with self.lock:
            call.effect = True
            self.effects[call.key] = self.effects.get(call.key, 0) + 1

    def _answered(self, call, code):
        with self.lock:
            call.code = name_of(code)
            self.by_code[call.code] = self.by_code.get(call.code, 0) + 1

    @staticmethod
    def _wait(call, ms, context):
        """Wait MS; False (and .cut_left recorded) when the call went inactive meanwhile."""
        end = time.monotonic() + ms / 1000.0
        while time.monotonic() < end:
            if not context.is_active():
                if call.cut_left is None:
                    call.cut_left = context.time_remaining() or 0.0
                return False
            time.sleep(0.005)
        return True

    def _fail(self, call, script, code, context, pushback):
        """Fail the call with CODE: before any message, so grpcio sends Trailers-Only (or
        HEADERS then trailers with headers-first)."""
        trailers = []
        if pushback is not None:
            trailers.append(("grpc-retry-pushback-ms", pushback))
        if script.headers_first:
            context.send_initial_metadata(())
        self._answered(call, code)
        if trailers:
            context.set_trailing_metadata(tuple(trailers))
        context.abort(code, "grpcserver: %s (call %d of key %s)"
                      % (name_of(code), self.seen.get(call.key, 0), call.key))

    def _run(self, method, context, messages, answer):
        call, script, fail, executed, pushback = self._begin(method, context)
        call.messages = list(messages)
        self._wait(call, script.sleep_ms, context)
        if call.nth == 1 and script.sleep_first_ms and \
                not self._wait(call, script.sleep_first_ms, context):
            return call, script, b""     # cancelled: nobody reads the answer
        if fail is not None:
            if executed:
                self._effect(call)
            self._fail(call, script, fail, context, pushback)
        if script.initial:
            context.send_initial_metadata(tuple(script.initial))
        if script.trailers:
            context.set_trailing_metadata(tuple(script.trailers))
        return call, script, answer(call, script)

    def _unary_handler(self, method):
        def unary(request, context):
            call, script, out = self._run(method, context, [request],
                                          lambda c, s: b"echo:" + request)
            self._effect(call)
            self._answered(call, grpc.StatusCode.OK)
            return out
        return grpc.unary_unary_rpc_method_handler(unary)

    def _collect(self, request_iterator, context):
        msgs = list(request_iterator)
        call, script, out = self._run("/test.Svc/Collect", context, msgs,
                                      lambda c, s: b"|".join(msgs))
        self._effect(call)
        self._answered(call, grpc.StatusCode.OK)
        return out

    def _chat(self, request_iterator, context):
        msgs = list(request_iterator)
        call, script, _ = self._run("/test.Svc/Chat", context, msgs, lambda c, s: None)
        self._effect(call)
        for m in msgs:
            yield b"re:" + m
        self._answered(call, grpc.StatusCode.OK)

    def _stream(self, request, context):
        call, script, _ = self._run("/test.Svc/Stream", context, [request], lambda c, s: None)
        self._effect(call)
        if script.after_message is not None:
            yield b"msg-1"
            self._answered(call, script.after_message)
            context.abort(script.after_message, "grpcserver: %s after a message"
                          % name_of(script.after_message))
        for i in range(script.messages):
            if i > 0 and script.gap_ms and not self._wait(call, script.gap_ms, context):
                return
            yield b"msg-%d" % (i + 1)
        self._answered(call, grpc.StatusCode.OK)


# ------------------------------------------------------------------------------- process

def _stats_server(srv, listen):
    class H(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def _send(self, code, obj):
            body = json.dumps(obj).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            if self.path == "/stats":
                self._send(200, srv.stats())
            elif self.path == "/calls":
                with srv.lock:
                    self._send(200, [c.as_json() for c in srv.calls])
            else:
                self._send(404, {"error": "no such path"})

        def do_POST(self):
            n = int(self.headers.get("Content-Length") or 0)
            if n:
                self.rfile.read(n)          # no POST takes a body: drain it for keep-alive
            try:
                if self.path.split("?")[0] == "/start":
                    q = parse_qs(urlsplit(self.path).query)
                    srv.start_timeline(float(q["at"][0]) if "at" in q else None)
                    self._send(200, {"start": srv.timeline.start if srv.timeline else None})
                elif self.path == "/reset":
                    srv.reset()
                    self._send(200, {"reset": True})
                else:
                    self._send(404, {"error": "no such path"})
            except (ValueError, TypeError) as e:
                self._send(400, {"error": str(e)})

    host, _, port = listen.rpartition(":")
    httpd = ThreadingHTTPServer((host, int(port)), H)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd


def main(argv=None):
    ap = argparse.ArgumentParser(description="scriptable gRPC server (tests/tools/grpcserver.py)")
    ap.add_argument("--listen", default="%s:0" % LOOPBACK)
    ap.add_argument("--stats", default="%s:0" % LOOPBACK)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--phases", help='e.g. "healthy:2,outage:5,overloaded:3,recovered:2"')
    ap.add_argument("--fail-rate", type=float, default=0.8)
    ap.add_argument("--executed-rate", type=float, default=0.4)
    ap.add_argument("--capacity", type=float, default=40.0)
    ap.add_argument("--pushback-ms", type=int, default=1000)
    ap.add_argument("--dedupe", action="store_true")
    a = ap.parse_args(argv)
    srv = GrpcServer(a.listen, seed=a.seed, phases=parse_phases(a.phases) if a.phases else None,
                     fail_rate=a.fail_rate, executed_rate=a.executed_rate,
                     capacity=a.capacity, pushback_ms=a.pushback_ms, dedupe=a.dedupe)
    httpd = _stats_server(srv, a.stats)
    done = threading.Event()
    for s in (signal.SIGTERM, signal.SIGINT):
        signal.signal(s, lambda *_: done.set())
    print("grpc %s stats %s:%d" % (srv.endpoint, LOOPBACK, httpd.server_address[1]), flush=True)
    done.wait()
    httpd.shutdown()
    srv.stop(0.2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
