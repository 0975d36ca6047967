#!/usr/bin/env python3
"""A flaky dependency for `make demo`: a small payment-like HTTP/1.1 API whose health follows a
scripted timeline of phases (standard library only, loopback only).

Phases (each "NAME:SECONDS", comma-separated, e.g. "healthy:3,outage:7,overloaded:4,recovered:4";
the last phase lasts until the process stops):

  healthy, recovered  every request is served (a few ms of work)
  outage              503 for everything, except that a fraction (--drop) of POSTs *execute their
                      side effect and then drop the connection* without answering: the response
                      is lost, the caller cannot tell "failed" from "done", and a blind replay of
                      an unkeyed POST pays twice
  overloaded          capacity is --capacity attempts/s (token bucket); the excess is refused,
                      alternately 429 and 503, with "Retry-After: 1", before any side effect

The API:

  GET  /items/<anything>     200 {"ok": true}                     (no side effect)
  POST /payments             executes a payment: one side effect per execution, recorded under
                             the request's X-Intent-Id (unique per logical operation). With an
                             Idempotency-Key, a repeat of a key already executed returns the
                             stored result with "Idempotent-Replayed: true" and executes nothing
                             (a different body under the same key: 422), the way real payment
                             APIs deduplicate.
  GET  /payments/<intent>    200 {"intent", "executions"} if executed, 404 if not: the
                             reconciliation query a client makes when an outcome was unknown.

Every attempt is recorded (time since the timeline start, phase, method, intent, the
X-Retrygate-Attempt number, what was done). Control endpoints (never via the proxy):

  POST /_flaky/start?at=T    start the timeline at CLOCK_MONOTONIC time T (seconds, float;
                             default: now). Before it starts, the first phase applies.
  GET  /_flaky/stats         JSON: phases, start, attempts, executions per intent, counters

Library use (in-process)::

    f = Flaky(phases=[("healthy", 3), ("outage", 5)], drop=0.3, capacity=40)
    f.port; f.start_timeline(); ...; f.stats(); f.close()

CLI::

    python3 tests/tools/flaky.py --listen 127.0.0.1:0 --phases healthy:3,outage:5 [--seed N]

prints "flaky listening on 127.0.0.1:PORT" on stdout once it accepts connections.
"""

import argparse
import hashlib
import json
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit

PHASE_KINDS = {"healthy": "healthy", "recovered": "healthy", "outage": "outage",
               "overloaded": "overloaded"}


def parse_phases(text):
    """"healthy:3,outage:5" -> [("healthy", 3.0), ("outage", 5.0)]."""
    out = []
    for part in text.split(","):
        name, _, secs = part.strip().partition(":")
        if name not in PHASE_KINDS:
            raise ValueError("unknown phase %r (one of %s)" % (name, ", ".join(PHASE_KINDS)))
        out.append((name, float(secs)))
    if not out:
        raise ValueError("no phases")
    return out


class Timeline:
    """Phases on CLOCK_MONOTONIC (time.monotonic(), the same clock in every process)."""

    def __init__(self, phases, start=None):
        self.phases = list(phases)
        self.start = start

    def phase_at(self, t):
        if self.start is None or t < self.start:
            return self.phases[0][0]
        rel = t - self.start
        for name, secs in self.phases:
            if rel < secs:
                return name
            rel -= secs
        return self.phases[-1][0]

    @property
    def total(self):
        """Seconds of all the phases."""
        return sum(s for _, s in self.phases)

    def duration(self, name):
        """Seconds of the phases called name."""
        return sum(s for n, s in self.phases if n == name)

    def bounds(self):
        """[(name, start_offset, end_offset)], offsets from the timeline start."""
        out, t = [], 0.0
        for name, secs in self.phases:
            out.append((name, t, t + secs))
            t += secs
        return out


class Flaky:
    def __init__(self, phases, host="127.0.0.1", port=0, drop=0.3, capacity=40.0,
                 work_ms=2.0, seed=1):
        self.timeline = Timeline(phases)
        self.drop = drop
        self.capacity = capacity
        self.work_ms = work_ms
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.attempts = []           # [t_rel, phase, method, intent, attempt_no, action]
        self.executions = {}         # intent -> number of side effects executed
        self.keys = {}               # Idempotency-Key -> (body hash, status, body)
        self.counters = {}
        self.tokens = capacity / 10.0
        self.tokens_at = time.monotonic()
        self.flip = 0
        handler = type("FlakyHandler", (_Handler,), {"flaky": self})
        self.server = _Server((host, port), handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.1}, name="flaky", daemon=True)
        self.thread.start()

    # ------------------------------------------------------------------ control
    def start_timeline(self, at=None):
        with self.lock:
            self.timeline.start = time.monotonic() if at is None else float(at)
            return self.timeline.start

    def stats(self):
        with self.lock:
            return {
                "phases": self.timeline.phases,
                "start": self.timeline.start,
                "attempts": list(self.attempts),
                "executions": dict(self.executions),
                "counters": dict(self.counters),
                "keys": len(self.keys),
            }

    def close(self):
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    # ------------------------------------------------------------------ behaviour
    def _count(self, what):
        self.counters[what] = self.counters.get(what, 0) + 1

    def _admit(self, now):
        """Overload capacity: a token bucket of `capacity`/s, burst capacity/10."""
        self.tokens = min(self.capacity / 10.0,
                          self.tokens + (now - self.tokens_at) * self.capacity)
        self.tokens_at = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def _execute(self, intent, key, body):
        """The side effect, with the dependency's own dedupe by Idempotency-Key.
        Returns (status, body dict, replayed). Caller holds the lock."""
        digest = hashlib.sha256(body).hexdigest()
        if key:
            if key in self.keys:
                stored_digest, status, stored = self.keys[key]
                if stored_digest != digest:
                    self._count("key_mismatch")
                    return 422, {"error": "idempotency-key-mismatch"}, False
                self._count("replayed")
                return status, stored, True
        self.executions[intent] = self.executions.get(intent, 0) + 1
        self._count("executed")
        result = {"intent": intent, "status": "paid",
                  "payment": "pay-%s-%d" % (intent, self.executions[intent])}
        if key:
            self.keys[key] = (digest, 201, result)
        return 201, result, False

    def decide(self, method, path, headers, body):
        """-> (status or None for "drop the connection", extra headers, body dict)."""
        now = time.monotonic()
        intent = headers.get("X-Intent-Id", "")
        key = headers.get("Idempotency-Key", "")
        try:
            attempt_no = int(headers.get("X-Retrygate-Attempt", "1"))
        except ValueError:
            attempt_no = 0
        with self.lock:
            phase = self.timeline.phase_at(now)
            kind = PHASE_KINDS[phase]
            t_rel = (now - self.timeline.start) if self.timeline.start is not None else None
            rec = [t_rel, phase, method, intent, attempt_no, None]
            self.attempts.append(rec)
            is_payment = method == "POST" and path.startswith("/payments")
            if kind == "outage":
                if is_payment and self.rng.random() < self.drop:
                    status, _, replayed = self._execute(intent, key, body)
                    rec[5] = ("replayed" if replayed else "executed" if status < 300
                              else str(status)) + "+drop"
                    self._count("dropped")
                    return None, {}, None
                rec[5] = "503"
                self._count("503")
                return 503, {}, {"error": "outage"}
            if kind == "overloaded" and not self._admit(now):
                self.flip ^= 1
                status = 429 if self.flip else 503
                rec[5] = "%d" % status
                self._count("%d" % status)
                return status, {"Retry-After": "1"}, {"error": "overloaded"}
            # served
            if is_payment:
                status, result, replayed = self._execute(intent, key, body)
                rec[5] = "replayed" if replayed else ("executed" if status < 300 else str(status))
                return status, ({"Idempotent-Replayed": "true"} if replayed else {}), result
            if method == "GET" and path.startswith("/payments/"):
                who = path[len("/payments/"):]
                n = self.executions.get(who, 0)
                rec[5] = "query"
                if n:
                    return 200, {}, {"intent": who, "executions": n}
                return 404, {}, {"intent": who, "executions": 0}
            rec[5] = "200"
            return 200, {}, {"ok": True}


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True      # small responses: no Nagle/delayed-ACK 40 ms stalls
    flaky = None

    def log_message(self, fmt, *args):
        pass

    def _body(self):
        te = self.headers.get("Transfer-Encoding", "")
        if "chunked" in te.lower():
            out = b""
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _reply(self, status, headers, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers.items():
            self.send_header(k, v)
        self._headers_buffer.append(b"\r\n" + data)    # head and body in one write
        self.flush_headers()

    def _handle(self):
        body = self._body()
        url = urlsplit(self.path)
        if url.path == "/_flaky/start" and self.command == "POST":
            at = parse_qs(url.query).get("at", [None])[0]
            t0 = self.flaky.start_timeline(at)
            return self._reply(200, {}, {"start": t0})
        if url.path == "/_flaky/stats" and self.command == "GET":
            return self._reply(200, {}, self.flaky.stats())
        if self.flaky.work_ms:
            time.sleep(self.flaky.work_ms / 1000.0)
        status, headers, obj = self.flaky.decide(self.command, url.path, self.headers, body)
        if status is None:
            # The side effect happened; the response is lost: close without a byte.
            self.close_connection = True
            self.wfile.flush()
            return
        self._reply(status, headers, obj)

    do_GET = do_POST = do_PUT = do_DELETE = do_HEAD = _handle


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--listen", default="127.0.0.1:0", help="HOST:PORT (port 0: ephemeral)")
    ap.add_argument("--phases", default="healthy:3,outage:7,overloaded:4,recovered:4")
    ap.add_argument("--drop", type=float, default=0.3,
                    help="outage: fraction of POSTs executed then dropped (default 0.3)")
    ap.add_argument("--capacity", type=float, default=40.0,
                    help="overloaded: attempts/s served (default 40)")
    ap.add_argument("--work-ms", type=float, default=2.0, help="service time per request")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", action="store_true", help="start the timeline at once")
    a = ap.parse_args(argv)
    host, _, port = a.listen.rpartition(":")
    if host not in ("127.0.0.1", "localhost", "::1", "[::1]"):
        ap.error("loopback only")
    f = Flaky(parse_phases(a.phases), host=host.strip("[]"), port=int(port), drop=a.drop,
              capacity=a.capacity, work_ms=a.work_ms, seed=a.seed)
    if a.start:
        f.start_timeline()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print("flaky listening on %s:%d" % (host, f.port), flush=True)
    while not stop.wait(0.2):
        pass
    f.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
