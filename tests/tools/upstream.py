#!/usr/bin/env python3
"""A scriptable, fault-injecting HTTP/1.1 upstream for retrygate's tests (standard library only).

Raw sockets and one thread per connection (not http.server): every byte it sends is chosen by
the test. Loopback only.

Library use::

    from upstream import Upstream, respond, reset, stall, retry_after
    up = Upstream()                        # ephemeral port on 127.0.0.1, serving in the background
    up.endpoint                            # "127.0.0.1:PORT" (for a retrygate config)
    up.push(503, reset(), respond(200, body=b"ok"))   # consumed one per request, FIFO
    up.set_default(stall())                # what to do when the queue is empty (the outage switch)
    up.on_path("/slow", respond(200, delay=2))        # per-path rule (prefix), checked first
    reqs = up.wait_requests(3, timeout=10) # -> [Request]; raises AssertionError on timeout
    reqs[1].header("X-Retrygate-Attempt"), reqs[1].body, reqs[1].conn_id, reqs[1].time
    up.close()                             # listener, connections, threads: all gone

Action specs accepted everywhere (push, set_default, on_path): an Action object, an int (a
status: ``503`` == ``respond(503)``), a name (``"reset"``), a dict (``{"action": "respond",
"status": 503, "headers": {"Retry-After": "1"}}``), or a callable ``fn(request) -> spec``
resolved when the request arrives. Add a new action by subclassing ``Action`` (override
``run(conn, req)``; return True to keep the connection for the next request) and, for the dict
and CLI forms, ``register_action(name, factory)``.

How a request is handled: its head is read; the action is chosen (the first matching path rule's
queue, then that rule's default, then the global queue, then the global default); if the request
has ``Expect: 100-continue`` and the action allows it (``expect_continue``), ``100 Continue`` is
sent; the body is read (Content-Length or chunked, de-chunked) unless the action sets
``read_body=False`` (then the connection closes after the action); the request is recorded;
the action runs. Connection-level actions (``close_before_read``, ``reset_before_read``) are
consumed when a connection is accepted, before anything is read, if they are at the head of the
global queue or are the global default; met at request time (from a path rule, or behind
another action in the queue on a reused connection) they close right after the head is read.

Every wait inside an action ends early when the peer closes the connection (recorded in
``Conn.closed_by == "peer"``) or when the upstream is closed, so tests never wait on it.

CLI (for ``make run``)::

    python3 tests/tools/upstream.py --listen 127.0.0.1:9001 [--quiet]
        [--default '{"action":"respond","status":503,"headers":{"Retry-After":"2"}}']
        [--script '[503, "reset", 200]'] [--flaky /flaky]

serves by default a 200 JSON echo of the method, target and headers, with keep-alive.
``--flaky PREFIX``: paths under PREFIX answer 503 to a request's first attempt and echo a
retry (``X-Retrygate-Attempt: 2`` or more): behind retrygate a GET there shows
``X-Retrygate-Attempts: 2`` and an unkeyed POST ``X-Retrygate-Retry-Refused: non-idempotent``
(the README guide).
"""

import argparse
import collections
import http
import json
import os
import select
import signal
import socket
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from rawclient import (HeaderMap, HTTPParseError, normalize_headers,  # noqa: E402
                       parse_chunked, parse_head_lines)

__all__ = [
    "Upstream", "Request", "Conn", "Refusing", "Blackhole",
    "Action", "Respond", "Echo", "Close", "Reset", "CloseBeforeRead", "ResetBeforeRead", "Stall",
    "Raw", "Partial", "Dynamic", "Callback",
    "respond", "echo", "retry_after", "close", "reset", "close_before_read", "reset_before_read",
    "stall", "raw", "partial", "slow_body", "respond_100_then", "interim", "dynamic", "callback",
    "make_action", "register_action", "build_head", "ACTIONS",
]

MAX_HEAD = 1 << 20
SEND_TIMEOUT = 10.0


def _reason(status):
    try:
        return http.HTTPStatus(status).phrase
    except ValueError:
        return "Status %d" % status


def build_head(status, headers=None, reason=None, version="HTTP/1.1"):
    """Serialize a response head (status line, headers in the given order, blank line)."""
    out = bytearray(("%s %d %s\r\n" % (version, status,
                                       _reason(status) if reason is None else reason))
                    .encode("latin-1"))
    for n, v in normalize_headers(headers):
        out += n.encode("latin-1") + b": " + v.encode("latin-1") + b"\r\n"
    out += b"\r\n"
    return bytes(out)


def _bytes(x):
    if x is None:
        return b""
    if isinstance(x, str):
        return x.encode("utf-8")
    return bytes(x)


# ------------------------------------------------------------------------------- records

class Request:
    """One request as the upstream received it.

    method, target, version (str); headers (HeaderMap, names as sent, in order); raw_head (bytes,
    request line to blank line, exactly as received); body (bytes, de-chunked); raw_body (bytes
    as on the wire, chunk framing included); chunked (bool); trailers, chunk_extensions;
    framing ("none" | "length" | "chunked"); complete (False if the peer closed mid-body);
    conn_id (which connection; equal ids = connection reuse), seq (0 = first request on its
    connection); t_first_byte, time (head complete), t_done (body complete), all
    time.monotonic(); action (name of the action that answered); sent_continue (a 100 Continue
    was sent); upstream (name of the Upstream).
    """

    def __init__(self, upstream, conn_id, seq, method, target, version, headers, raw_head,
                 t_first_byte, t_head):
        self.upstream = upstream
        self.conn_id = conn_id
        self.seq = seq
        self.method = method
        self.target = target
        self.version = version
        self.headers = HeaderMap(headers)
        self.raw_head = raw_head
        self.t_first_byte = t_first_byte
        self.time = t_head
        self.t_done = None
        self.body = b""
        self.raw_body = b""
        self.chunked = False
        self.trailers = []
        self.chunk_extensions = []
        self.framing = "none"
        self.content_length = 0
        self.complete = False
        self.body_read = True
        self.sent_continue = False
        self.action = None

    @property
    def path(self):
        return self.target.split("?", 1)[0]

    @property
    def query(self):
        return self.target.split("?", 1)[1] if "?" in self.target else ""

    def header(self, name, default=None):
        """First value of header name (case-insensitive), or default."""
        return self.headers.get(name, default)

    def header_all(self, name):
        return self.headers.get_all(name)

    @property
    def connection_tokens(self):
        return {t.strip().lower() for v in self.headers.get_all("connection") for t in v.split(",")}

    @property
    def wants_close(self):
        """The client asked for the connection to close after this exchange."""
        toks = self.connection_tokens
        if "close" in toks:
            return True
        return self.version == "HTTP/1.0" and "keep-alive" not in toks

    @property
    def expects_continue(self):
        return (self.headers.get("expect") or "").strip().lower() == "100-continue"

    def json(self):
        return json.loads(self.body)

    def __repr__(self):
        return "<Request conn=%d seq=%d %s %s %s body=%d%s action=%s>" % (
            self.conn_id, self.seq, self.method, self.target, self.version, len(self.body),
            "" if self.complete else " INCOMPLETE", self.action)


class Conn:
    """The server side of one accepted connection, as seen by actions and by tests.

    For tests: id, peer, accepted_at, closed_at, closed_by ("peer" | "upstream" | "reset" |
    "shutdown" | "killed" | None while open), requests (count), bytes_in, bytes_out, state
    ("new" | "idle" | "reading" | "busy" | "closed"), closed (bool).
    For actions: send(bytes) -> bool, wait(seconds) -> bool, wait_event(event, timeout) -> bool,
    end_with_reset = True (RST instead of FIN when the connection ends).
    """

    def __init__(self, up, sock, peer, cid):
        self.up = up
        self.sock = sock
        self.peer = peer
        self.id = cid
        self.buf = bytearray()
        self.accepted_at = time.monotonic()
        self.closed_at = None
        self.closed_by = None
        self.peer_closed = False
        self.requests = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.state = "new"
        self.end_with_reset = False
        self._kill = None

    @property
    def closed(self):
        return self.state == "closed"

    # -- I/O for actions ------------------------------------------------------------------
    def fill(self, timeout=None):
        """Receive once into buf. True: data; False: EOF, reset, killed or upstream stopping;
        None: timeout (only with a timeout)."""
        if self.peer_closed or self._kill or self.up._stopping.is_set():
            return False
        try:
            r, _, _ = select.select([self.sock, self.up._wake_r], [], [], timeout)
        except (OSError, ValueError):
            return False
        if self.up._stopping.is_set() or self._kill:
            return False
        if not r:
            return None
        try:
            d = self.sock.recv(65536)
        except (BlockingIOError, socket.timeout):
            return True
        except OSError:
            self.peer_closed = True
            return False
        if self._kill:
            return False
        if not d:
            self.peer_closed = True
            return False
        self.buf += d
        self.bytes_in += len(d)
        return True

    def wait(self, seconds):
        """Sleep seconds (None: until the peer closes or the upstream stops), buffering whatever
        the peer sends meanwhile. True if the full time passed; False if the peer closed, the
        connection was killed, or the upstream is stopping."""
        end = None if seconds is None else time.monotonic() + seconds
        while True:
            left = None if end is None else end - time.monotonic()
            if left is not None and left <= 0:
                return True
            if self.fill(left) is False:
                return False

    def wait_event(self, event, timeout=None):
        """Wait until threading.Event event is set (True), or timeout/peer close/stop (False)."""
        end = None if timeout is None else time.monotonic() + timeout
        while not event.is_set():
            left = 0.02 if end is None else min(0.02, end - time.monotonic())
            if left <= 0 or not self.wait(left):
                return event.is_set()
        return True

    def send(self, data):
        """sendall; False if the peer is gone (never raises)."""
        if not data:
            return True
        try:
            self.sock.sendall(data)
        except OSError:
            self.peer_closed = True
            return False
        self.bytes_out += len(data)
        return True

    # -- control from other threads --------------------------------------------------------
    def kill(self, reset=False):
        """Close this connection from outside its thread (FIN, or RST with reset=True)."""
        self._kill = "reset" if reset else "close"
        try:
            self.sock.shutdown(socket.SHUT_RD)   # wakes the connection thread, sends nothing
        except OSError:
            pass

    def _shutdown_now(self):
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def _finish(self):
        if self.state == "closed":
            return
        reset = self.end_with_reset or self._kill == "reset"
        if reset:
            try:
                self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        try:
            self.sock.close()
        except OSError:
            pass
        if self._kill:
            by = "killed"
        elif reset:
            by = "reset"
        elif self.peer_closed:
            by = "peer"
        elif self.up._stopping.is_set():
            by = "shutdown"
        else:
            by = "upstream"
        with self.up._cond:
            self.closed_by = by
            self.closed_at = time.monotonic()
            self.state = "closed"
            self.up._cond.notify_all()

    def __repr__(self):
        return "<Conn %d %s requests=%d closed_by=%s>" % (self.id, self.state, self.requests,
                                                          self.closed_by)


# ------------------------------------------------------------------------------- actions

class Action:
    """Base class. Override run(conn, req) -> bool (True: keep the connection open for the next
    request). req is None for actions run at accept time (at_accept = True).

    Class/instance attributes read by the upstream:
      at_accept        consumed when a connection is accepted, before anything is read
      expect_continue  send 100 Continue for "Expect: 100-continue" before reading the body
      read_body        read the request body before run() (False: the connection closes after)
    """
    name = "action"
    at_accept = False
    expect_continue = True
    read_body = True

    def run(self, conn, req):
        return True

    def __repr__(self):
        return "<%s>" % self.name


class Respond(Action):
    """Send a response. See respond() for the parameters."""
    name = "respond"

    def __init__(self, status=200, headers=None, body=b"", delay=0.0, chunked=False,
                 keep_alive=True, reason=None, delay_head=None, delay_body=0.0, interval=0.0,
                 interim=(), delay_interim=0.0, trailers=None, chunk_ext=None,
                 content_length=True, hold=None, hold_timeout=None, version="HTTP/1.1",
                 expect_continue=True, read_body=True, after=b"", reset_after=False):
        self.status = int(status)
        self.headers = normalize_headers(headers)
        self.pieces = [_bytes(p) for p in body] if isinstance(body, (list, tuple)) \
            else [_bytes(body)]
        self.delay = delay if delay_head is None else delay_head
        self.chunked = chunked
        self.keep_alive = keep_alive
        self.reason = reason
        self.delay_body = delay_body
        self.interval = interval
        self.interim = [(x, None) if isinstance(x, int) else
                        (int(x[0]), x[1] if len(x) > 1 else None) for x in interim]
        self.delay_interim = delay_interim
        self.trailers = normalize_headers(trailers)
        self.chunk_ext = chunk_ext
        self.content_length = content_length
        self.hold = hold
        self.hold_timeout = hold_timeout
        self.version = version
        self.expect_continue = expect_continue
        self.read_body = read_body
        self.after = _bytes(after)
        self.reset_after = reset_after

    def __repr__(self):
        return "<respond %d%s>" % (self.status, " delay=%s" % self.delay if self.delay else "")

    def _frame(self, piece):
        if not self.chunked:
            return piece
        if not piece:
            return b""
        ext = (";" + self.chunk_ext).encode("latin-1") if self.chunk_ext else b""
        return b"%x" % len(piece) + ext + b"\r\n" + piece + b"\r\n"

    def _last_chunk(self):
        out = b"0\r\n"
        for n, v in self.trailers:
            out += n.encode("latin-1") + b": " + v.encode("latin-1") + b"\r\n"
        return out + b"\r\n"

    def run(self, conn, req):
        if self.hold is not None and not conn.wait_event(self.hold, self.hold_timeout):
            return False
        if self.delay_interim and not conn.wait(self.delay_interim):
            return False
        for st, hd in self.interim:
            if not conn.send(build_head(st, hd, version=self.version)):
                return False
        if self.delay and not conn.wait(self.delay):
            return False
        is_head = req is not None and req.method == "HEAD"
        bodyless = self.status in (204, 304) or 100 <= self.status < 200
        send_body = not is_head and not bodyless
        closing = (not self.keep_alive or not (req is None or req.body_read)
                   or (req is not None and req.wants_close)
                   or (self.content_length is False and not self.chunked))
        hdrs = list(self.headers)
        names = {n.lower() for n, _ in hdrs}
        total = sum(len(p) for p in self.pieces)
        if self.chunked:
            if "transfer-encoding" not in names:
                hdrs.append(("Transfer-Encoding", "chunked"))
        elif self.content_length is True:
            if not bodyless and "content-length" not in names and "transfer-encoding" not in names:
                hdrs.append(("Content-Length", str(total)))
        elif self.content_length is not False:
            hdrs.append(("Content-Length", str(int(self.content_length))))
        if "connection" not in names:
            if closing:
                hdrs.append(("Connection", "close"))
            elif req is not None and req.version == "HTTP/1.0":
                hdrs.append(("Connection", "keep-alive"))
        head = build_head(self.status, hdrs, self.reason, self.version)
        if not send_body:
            ok = conn.send(head)
        elif not self.delay_body and not self.interval:
            data = head + b"".join(self._frame(p) for p in self.pieces)
            if self.chunked:
                data += self._last_chunk()
            ok = conn.send(data)
        else:
            ok = conn.send(head)
            if ok and self.delay_body:
                ok = conn.wait(self.delay_body)
            for i, p in enumerate(self.pieces):
                if not ok:
                    break
                if i and self.interval:
                    ok = conn.wait(self.interval)
                    if not ok:
                        break
                ok = conn.send(self._frame(p))
            if ok and self.chunked:
                ok = conn.send(self._last_chunk())
        if ok and self.after:
            ok = conn.send(self.after)
        if self.reset_after:
            conn.end_with_reset = True
            return False
        return ok and not closing


class Echo(Respond):
    """200 (or status) with a JSON body describing the request: method, target, version,
    headers, body (latin-1 text, truncated to 4 KiB), body_length, conn, seq, upstream.
    Adds ``X-Upstream: NAME``. Keep-alive."""
    name = "echo"

    def __init__(self, status=200, headers=None, **kw):
        super().__init__(status, headers, b"", **kw)

    def run(self, conn, req):
        doc = {"upstream": conn.up.name}
        if req is not None:
            doc.update(method=req.method, target=req.target, version=req.version,
                       headers=[[n, v] for n, v in req.headers.items()],
                       body=req.body[:4096].decode("latin-1"), body_length=len(req.body),
                       conn=req.conn_id, seq=req.seq)
        body = (json.dumps(doc, indent=1) + "\n").encode()
        r = Respond(self.status, list(self.headers) + [("Content-Type", "application/json"),
                                                       ("X-Upstream", conn.up.name)], body)
        r.__dict__.update({k: v for k, v in self.__dict__.items()
                           if k not in ("status", "headers", "pieces")})
        return r.run(conn, req)

    def __repr__(self):
        return "<echo %d>" % self.status


class Close(Action):
    """Read the request, then close (FIN) without answering, after an optional delay."""
    name = "close"

    def __init__(self, delay=0.0):
        self.delay = delay

    def run(self, conn, req):
        if self.delay:
            conn.wait(self.delay)
        return False


class Reset(Action):
    """Read the request, then abort the connection with a RST (SO_LINGER 0)."""
    name = "reset"

    def __init__(self, delay=0.0):
        self.delay = delay

    def run(self, conn, req):
        if self.delay:
            conn.wait(self.delay)
        conn.end_with_reset = True
        return False


class CloseBeforeRead(Action):
    """Accept, then close at once without reading a byte.

    From the client's side connect() succeeded (the kernel completed the handshake before the
    accept), so the client has usually written its request already: the close is then seen
    as a reset after writing (and Linux sends RST instead of FIN when unread bytes are
    pending). For a deterministic connect-failure use Refusing or Blackhole."""
    name = "close_before_read"
    at_accept = True
    read_body = False
    expect_continue = False

    def run(self, conn, req):
        return False


class ResetBeforeRead(CloseBeforeRead):
    """Accept, then RST at once without reading. The RST can arrive before the client's
    connect() has reported success, which then fails with ECONNRESET."""
    name = "reset_before_read"

    def run(self, conn, req):
        conn.end_with_reset = True
        return False


class Stall(Action):
    """Read the request, send nothing; close after seconds (None: only when the peer closes or
    the upstream stops). reset=True ends with RST instead of FIN."""
    name = "stall"

    def __init__(self, seconds=None, reset=False):
        self.seconds = seconds
        self.reset = reset

    def run(self, conn, req):
        conn.wait(self.seconds)
        conn.end_with_reset = self.reset
        return False


class Raw(Action):
    """Send arbitrary bytes (after delay); then close (FIN, or RST with reset=True) unless
    close=False, in which case the connection goes on reading the next request."""
    name = "raw"

    def __init__(self, data, close=True, delay=0.0, reset=False):
        self.data = _bytes(data)
        self.close = close
        self.delay = delay
        self.reset = reset

    def run(self, conn, req):
        if self.delay and not conn.wait(self.delay):
            return False
        ok = conn.send(self.data)
        if self.reset:
            conn.end_with_reset = True
            return False
        return ok and not self.close


class Partial(Action):
    """Send a head promising content_length bytes (default len(body_prefix) + 1000), send only
    body_prefix, then close (or RST with reset=True): a truncated body."""
    name = "partial"

    def __init__(self, status=200, headers=None, body_prefix=b"", content_length=None,
                 delay=0.0, reset=False, linger=0.0):
        self.status = status
        self.headers = normalize_headers(headers)
        self.prefix = _bytes(body_prefix)
        self.content_length = content_length if content_length is not None \
            else len(self.prefix) + 1000
        self.delay = delay
        self.reset = reset
        self.linger = linger

    def run(self, conn, req):
        if self.delay and not conn.wait(self.delay):
            return False
        hdrs = [h for h in self.headers if h[0].lower() != "content-length"]
        hdrs.append(("Content-Length", str(self.content_length)))
        if conn.send(build_head(self.status, hdrs) + self.prefix) and self.linger:
            conn.wait(self.linger)
        conn.end_with_reset = self.reset
        return False


class Dynamic(Action):
    """fn(request) -> action spec, resolved when the request head has arrived."""
    name = "dynamic"

    def __init__(self, fn):
        self.fn = fn

    def resolve(self, req):
        return make_action(self.fn(req))


class Callback(Action):
    """Low-level: fn(conn, req) -> keep_alive (bool); may use conn.send / conn.wait."""
    name = "callback"

    def __init__(self, fn, read_body=True, expect_continue=True):
        self.fn = fn
        self.read_body = read_body
        self.expect_continue = expect_continue

    def run(self, conn, req):
        return bool(self.fn(conn, req))


# Constructors (the names tests use) --------------------------------------------------------

def respond(status=200, headers=None, body=b"", delay=0.0, chunked=False, keep_alive=True, **kw):
    """A response.

    status, headers (dict, possibly with list values, or list of (name, value) pairs, order
    kept), body (bytes | str | list of pieces); Content-Length is added automatically (unless
    chunked, given in headers, 1xx/204/304, or content_length=False for a close-delimited body;
    content_length=N forces that value). HEAD requests get no body.
      delay / delay_head   seconds before the final head (after any interim responses)
      delay_body           seconds between the head and the first body byte
      interval             seconds between body pieces (body given as a list)
      chunked, trailers, chunk_ext   chunked encoding of the pieces
      keep_alive=False     add "Connection: close" and close after (also when the request asked)
      interim=[103, (100, {...})]    1xx heads sent first; delay_interim before them
      hold=threading.Event answer only once it is set (hold_timeout), e.g. to pile up in-flight
      after=b"..."         raw bytes sent after the response (e.g. junk on an idle connection)
      reset_after=True     RST once the response is sent
      reason, version      status line text
      expect_continue, read_body     see Action
    """
    return Respond(status, headers, body, delay=delay, chunked=chunked, keep_alive=keep_alive,
                   **kw)


def echo(status=200, headers=None, **kw):
    """The friendly default: 200 with a JSON description of the request."""
    return Echo(status, headers, **kw)


def retry_after(value=1, status=503, headers=None, **kw):
    """A 503 (or 429) carrying Retry-After: value (seconds, or an HTTP-date string)."""
    h = normalize_headers(headers) + [("Retry-After", str(value))]
    return Respond(status, h, kw.pop("body", b""), **kw)


def close(delay=0.0):
    return Close(delay)


def reset(delay=0.0):
    return Reset(delay)


def close_before_read():
    return CloseBeforeRead()


def reset_before_read():
    return ResetBeforeRead()


def stall(seconds=None, reset=False):
    return Stall(seconds, reset)


def raw(data, close=True, delay=0.0, reset=False):
    return Raw(data, close, delay, reset)


def partial(status=200, headers=None, body_prefix=b"", content_length=None, delay=0.0,
            reset=False, linger=0.0):
    return Partial(status, headers, body_prefix, content_length, delay, reset, linger)


def slow_body(chunks, interval, status=200, headers=None, chunked=False, **kw):
    """Head at once, then each chunk (a body piece) every interval seconds. Content-Length is
    the total unless chunked."""
    return Respond(status, headers, list(chunks), chunked=chunked, interval=interval, **kw)


def respond_100_then(status=200, headers=None, body=b"", continue_headers=None, **kw):
    """Send "100 Continue" (whether or not the request asked for it), then the final response.
    The automatic 100 for Expect: 100-continue is suppressed, so exactly one 100 goes out."""
    kw.setdefault("expect_continue", False)
    return Respond(status, headers, body, interim=[(100, continue_headers)], **kw)


def interim(status=103, headers=None, final_status=200, final_headers=None, body=b"", **kw):
    """An interim 1xx (default 103 Early Hints) with headers, then the final response."""
    return Respond(final_status, final_headers, body, interim=[(status, headers)], **kw)


def dynamic(fn):
    return Dynamic(fn)


def callback(fn, read_body=True, expect_continue=True):
    return Callback(fn, read_body, expect_continue)


ACTIONS = {
    "respond": respond, "echo": echo, "retry_after": retry_after, "close": close,
    "reset": reset, "close_before_read": close_before_read,
    "reset_before_read": reset_before_read, "stall": stall, "raw": raw, "partial": partial,
    "slow_body": slow_body, "respond_100_then": respond_100_then, "interim": interim,
}


def register_action(name, factory):
    """Make factory(**kwargs) -> Action available as {"action": name, ...} and by name."""
    ACTIONS[name] = factory


def make_action(spec):
    """Action | int status | name | dict {"action": name, **kwargs} | callable(req)->spec."""
    if isinstance(spec, Action):
        return spec
    if isinstance(spec, bool):
        raise TypeError("not an action spec: %r" % (spec,))
    if isinstance(spec, int):
        return Respond(spec)
    if isinstance(spec, str):
        if spec not in ACTIONS:
            raise ValueError("unknown action %r (known: %s)" % (spec, ", ".join(sorted(ACTIONS))))
        return ACTIONS[spec]()
    if isinstance(spec, dict):
        d = dict(spec)
        name = d.pop("action", "respond")
        if name not in ACTIONS:
            raise ValueError("unknown action %r (known: %s)" % (name, ", ".join(sorted(ACTIONS))))
        return ACTIONS[name](**d)
    if callable(spec):
        return Dynamic(spec)
    raise TypeError("not an action spec: %r" % (spec,))


# ------------------------------------------------------------------------------- upstream

class _Rule:
    def __init__(self, match, actions, default):
        self.match = match
        self.queue = collections.deque(make_action(a) for a in actions)
        self.default = None if default is None else make_action(default)

    def matches(self, req):
        if callable(self.match):
            return bool(self.match(req))
        return req.path.startswith(self.match)


def _request_framing(headers):
    te = headers.get_all("transfer-encoding")
    cl = headers.get_all("content-length")
    if te and cl:
        raise HTTPParseError("both Transfer-Encoding and Content-Length")
    if te:
        codings = [c.strip().lower() for c in ",".join(te).split(",")]
        if "" in codings or codings[-1] != "chunked" or codings.count("chunked") != 1:
            raise HTTPParseError("bad Transfer-Encoding %r" % te)
        return "chunked", None
    if cl:
        if len(cl) > 1:
            raise HTTPParseError("repeated Content-Length %r" % cl)
        if not cl[0].isdigit():
            raise HTTPParseError("bad Content-Length %r" % cl[0])
        return "length", int(cl[0])
    return "none", 0


class Upstream:
    """A fault-injecting HTTP/1.1 server on 127.0.0.1, serving from a background thread.

    Upstream(port=0, host="127.0.0.1", default=echo(), name=None, quiet=True,
             idle_timeout=None, auto_continue=True)

    Script: push(*specs), set_default(spec), on_path(prefix_or_pred, *specs, default=None),
    clear_script(), pending (actions left in the global queue).
    Records: requests, errors, conns (snapshots), connections (accepted count), active /
    max_active (requests being handled now / at peak), last.
    Waits (raise AssertionError with a summary on timeout): wait_requests(n, timeout),
    wait_connections(n, timeout), wait_for(pred, timeout, what), wait_conn_closed(conn_id).
    Control: idle_connections(), close_idle(reset=False), kill_connections(reset=False),
    reset_log(), close().
    """

    def __init__(self, port=0, host="127.0.0.1", default=None, name=None, quiet=True,
                 idle_timeout=None, auto_continue=True, backlog=128, log=None):
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._queue = collections.deque()
        self._rules = []
        self._default = echo() if default is None else make_action(default)
        self._requests = []
        self._errors = []
        self._conns = []
        self._accepted = 0
        self._threads = []
        self._next_id = 1
        self.active = 0
        self.max_active = 0
        self.idle_timeout = idle_timeout
        self.auto_continue = auto_continue
        self.quiet = quiet
        self._log_fn = log
        self._closed = False
        self._clean = True
        self._stopping = threading.Event()
        self._wake_r, self._wake_w = os.pipe()
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            self._lsock.bind((host, port))
            self._lsock.listen(backlog)
        except OSError:
            self._lsock.close()
            os.close(self._wake_r)
            os.close(self._wake_w)
            raise
        self.host, self.port = self._lsock.getsockname()[:2]
        self.name = name or "%s:%d" % (self.host, self.port)
        self._accept_thread = threading.Thread(target=self._accept_loop, daemon=True,
                                               name="upstream-%d-accept" % self.port)
        self._accept_thread.start()

    # -- addresses ----------------------------------------------------------------------------
    @property
    def endpoint(self):
        """"127.0.0.1:PORT", as written in a retrygate config."""
        return "%s:%d" % (self.host, self.port)

    address = endpoint

    def url(self, path="/"):
        return "http://%s%s" % (self.endpoint, path)

    # -- script -------------------------------------------------------------------------------
    def push(self, *specs):
        """Append actions to the global FIFO queue (one consumed per request)."""
        acts = [make_action(s) for s in specs]
        with self._lock:
            self._queue.extend(acts)
        return self

    script = push

    def set_default(self, spec):
        """The action used when the queue is empty (e.g. set_default(reset()) for an outage,
        set_default(echo()) to heal)."""
        a = make_action(spec)
        with self._lock:
            self._default = a
        return self

    def on_path(self, match, *specs, default=None):
        """Per-path rule, checked before the global queue: match is a path prefix (str) or a
        predicate fn(req) -> bool. Its own queue (specs) is consumed first, then its default;
        when it has neither left, the request falls through to the global queue/default.
        The first matching rule (in the order added) applies."""
        rule = _Rule(match, specs, default)
        with self._lock:
            self._rules.append(rule)
        return rule

    def clear_script(self):
        """Drop the queue and every path rule (the default stays)."""
        with self._lock:
            self._queue.clear()
            self._rules.clear()

    @property
    def pending(self):
        """Actions left in the global queue."""
        with self._lock:
            return len(self._queue)

    def _select(self, req):
        with self._lock:
            act = None
            for rule in self._rules:
                if rule.matches(req):
                    if rule.queue:
                        act = rule.queue.popleft()
                    elif rule.default is not None:
                        act = rule.default
                    break
            if act is None:
                act = self._queue.popleft() if self._queue else self._default
        for _ in range(100):
            if not isinstance(act, Dynamic):
                return act
            act = act.resolve(req)
        raise RuntimeError("dynamic action did not resolve")

    def _accept_action(self):
        with self._lock:
            if self._queue:
                return self._queue.popleft() if self._queue[0].at_accept else None
            return self._default if self._default.at_accept else None

    # -- records ------------------------------------------------------------------------------
    @property
    def requests(self):
        """Snapshot list of every Request received, in arrival order."""
        with self._lock:
            return list(self._requests)

    @property
    def errors(self):
        """Snapshot list of (conn_id, message, raw bytes) for malformed/truncated requests."""
        with self._lock:
            return list(self._errors)

    @property
    def conns(self):
        """Snapshot list of every Conn accepted (open and closed)."""
        with self._lock:
            return list(self._conns)

    @property
    def connections(self):
        """Number of connections accepted (since the last reset_log())."""
        with self._lock:
            return self._accepted

    @property
    def request_count(self):
        with self._lock:
            return len(self._requests)

    @property
    def last(self):
        with self._lock:
            return self._requests[-1] if self._requests else None

    def reset_log(self):
        """Forget recorded requests, errors, closed connections and counters (open connections
        are kept, and keep their ids)."""
        with self._lock:
            self._requests.clear()
            self._errors.clear()
            self._conns = [c for c in self._conns if not c.closed]
            self._accepted = 0
            self.max_active = self.active

    def summary(self):
        with self._lock:
            reqs = ", ".join("%s %s (conn %d%s)" % (r.method, r.target, r.conn_id,
                                                    "" if r.complete else ", incomplete")
                             for r in self._requests[-20:])
            return "%s: %d request(s) [%s], %d connection(s), %d error(s)%s" % (
                self.name, len(self._requests), reqs, self._accepted, len(self._errors),
                (": %r" % self._errors[-3:]) if self._errors else "")

    # -- waits --------------------------------------------------------------------------------
    def wait_for(self, pred, timeout=10.0, what="condition"):
        """Wait until pred() is truthy (evaluated under the upstream's lock whenever something
        changes, and every 50 ms); return its value. AssertionError on timeout."""
        end = time.monotonic() + timeout
        with self._cond:
            while True:
                v = pred()
                if v:
                    return v
                left = end - time.monotonic()
                if left <= 0:
                    raise AssertionError("%s: timed out after %.1fs waiting for %s; %s" % (
                        self.name, timeout, what, self.summary()))
                self._cond.wait(min(left, 0.05))

    def wait_requests(self, n, timeout=10.0):
        """Wait until at least n requests were received; return the list of all of them."""
        self.wait_for(lambda: len(self._requests) >= n, timeout, "%d request(s)" % n)
        return self.requests

    def wait_connections(self, n, timeout=10.0):
        """Wait until at least n connections were accepted; return the count."""
        self.wait_for(lambda: self._accepted >= n, timeout, "%d connection(s)" % n)
        return self.connections

    def wait_conn_closed(self, conn_id, timeout=10.0):
        """Wait until connection conn_id is closed; return its closed_by."""
        def done():
            for c in self._conns:
                if c.id == conn_id and c.closed:
                    return c.closed_by
            return None
        return self.wait_for(done, timeout, "connection %d to close" % conn_id)

    def wait_idle(self, timeout=10.0):
        """Wait until no request is being handled."""
        self.wait_for(lambda: self.active == 0, timeout, "no active request")

    # -- connection control -------------------------------------------------------------------
    def idle_connections(self):
        """Open connections waiting for their next request."""
        with self._lock:
            return [c for c in self._conns if c.state == "idle" and not c._kill]

    def close_idle(self, reset=False):
        """Close every idle keep-alive connection (FIN, or RST): the peer's pooled connections
        go stale. Returns how many were closed."""
        conns = self.idle_connections()
        for c in conns:
            c.kill(reset)
        return len(conns)

    def kill_connections(self, reset=False):
        """Close every open connection, busy or idle (an upstream crash)."""
        with self._lock:
            conns = [c for c in self._conns if not c.closed and not c._kill]
        for c in conns:
            c.kill(reset)
        return len(conns)

    # -- lifecycle ----------------------------------------------------------------------------
    def close(self, timeout=5.0):
        """Stop: close the listener and every connection, join all threads. Idempotent.
        Returns True when every thread ended (False means a thread leaked)."""
        if self._closed:
            return self._clean
        self._closed = True
        self._stopping.set()
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        end = time.monotonic() + timeout
        self._accept_thread.join(max(0.0, end - time.monotonic()))
        try:
            self._lsock.close()
        except OSError:
            pass
        with self._lock:
            conns = [c for c in self._conns if not c.closed]
            threads = list(self._threads)
        for c in conns:
            c._shutdown_now()
        for t in threads:
            t.join(max(0.0, end - time.monotonic()))
        self._clean = not self._accept_thread.is_alive() and not any(t.is_alive()
                                                                     for t in threads)
        if self._clean:
            os.close(self._wake_r)
            os.close(self._wake_w)
        return self._clean

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<Upstream %s>" % self.name

    # -- internals ----------------------------------------------------------------------------
    def _log(self, msg):
        if self._log_fn is not None:
            self._log_fn(msg)
        elif not self.quiet:
            sys.stderr.write("[upstream %s] %s\n" % (self.name, msg))
            sys.stderr.flush()

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                r, _, _ = select.select([self._lsock, self._wake_r], [], [])
            except (OSError, ValueError):
                break
            if self._stopping.is_set():
                break
            try:
                s, peer = self._lsock.accept()
            except OSError:
                continue
            s.settimeout(SEND_TIMEOUT)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._cond:
                conn = Conn(self, s, peer, self._next_id)
                self._next_id += 1
                self._conns.append(conn)
                self._accepted += 1
                self._threads = [t for t in self._threads if t.is_alive()]
                t = threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                     name="upstream-%d-conn-%d" % (self.port, conn.id))
                self._threads.append(t)
                self._cond.notify_all()
            t.start()

    def _error(self, conn, msg, data):
        with self._cond:
            self._errors.append((conn.id, msg, bytes(data[:4096])))
            self._cond.notify_all()
        self._log("conn#%d error: %s" % (conn.id, msg))

    def _serve(self, conn):
        try:
            act = self._accept_action()
            if act is not None:
                self._log("conn#%d accepted -> %s" % (conn.id, act.name))
                act.run(conn, None)
                return
            while not self._stopping.is_set():
                req = self._read_head(conn)
                if req is None:
                    break
                action = self._select(req)
                req.action = action.name
                with self._cond:
                    self.active += 1
                    self.max_active = max(self.max_active, self.active)
                    self._cond.notify_all()
                try:
                    keep = self._handle(conn, req, action)
                finally:
                    with self._cond:
                        self.active -= 1
                        self._cond.notify_all()
                if not keep:
                    break
        except Exception as e:  # a bug in an action or here: make it visible to the test
            self._error(conn, "upstream internal error: %r" % (e,), b"")
        finally:
            conn._finish()

    def _read_head(self, conn):
        t_first = None
        while True:
            while conn.buf[:2] == b"\r\n":          # RFC 9112 §2.2: ignore leading CRLFs
                del conn.buf[:2]
            if conn.buf and t_first is None:
                t_first = time.monotonic()
            end = conn.buf.find(b"\r\n\r\n")
            if end >= 0:
                break
            if len(conn.buf) > MAX_HEAD:
                self._error(conn, "request head too large", conn.buf)
                conn.send(build_head(431, [("Content-Length", "0"), ("Connection", "close")]))
                return None
            with self._cond:
                conn.state = "reading" if conn.buf else "idle"
                self._cond.notify_all()
            r = conn.fill(self.idle_timeout if conn.state == "idle" else None)
            if r is None:
                return None
            if r is False:
                if conn.buf and not self._stopping.is_set():
                    self._error(conn, "connection closed in the middle of a request head",
                                conn.buf)
                return None
        t_head = time.monotonic()
        with self._cond:
            conn.state = "busy"
        head = bytes(conn.buf[:end + 4])
        del conn.buf[:end + 4]
        try:
            start, headers = parse_head_lines(head)
            parts = start.split(" ")
            if len(parts) != 3 or not parts[2].startswith("HTTP/") or not parts[0] \
                    or not parts[1]:
                raise HTTPParseError("bad request line %r" % start)
            req = Request(self.name, conn.id, conn.requests, parts[0], parts[1], parts[2],
                          headers, head, t_first or t_head, t_head)
            req.framing, req.content_length = _request_framing(req.headers)
            req.chunked = req.framing == "chunked"
        except HTTPParseError as e:
            self._error(conn, str(e), head)
            conn.send(build_head(400, [("Content-Length", "0"), ("Connection", "close")]))
            return None
        conn.requests += 1
        return req

    def _read_body(self, conn, req):
        """True: complete; False: the peer went away mid-body; None: malformed (400 sent)."""
        if req.framing == "length":
            n = req.content_length
            while len(conn.buf) < n:
                if not conn.fill():
                    req.body = req.raw_body = bytes(conn.buf)
                    conn.buf.clear()
                    return False
            req.body = req.raw_body = bytes(conn.buf[:n])
            del conn.buf[:n]
        elif req.framing == "chunked":
            while True:
                try:
                    r = parse_chunked(conn.buf)
                except HTTPParseError as e:
                    self._error(conn, "bad chunked body: %s" % e, conn.buf)
                    req.raw_body = bytes(conn.buf)
                    conn.send(build_head(400, [("Content-Length", "0"), ("Connection", "close")]))
                    return None
                if r is not None:
                    break
                if not conn.fill():
                    req.raw_body = bytes(conn.buf)
                    conn.buf.clear()
                    return False
            req.body, req.trailers, end, req.chunk_extensions = r
            req.raw_body = bytes(conn.buf[:end])
            del conn.buf[:end]
        req.complete = True
        req.t_done = time.monotonic()
        return True

    def _record(self, req):
        with self._cond:
            self._requests.append(req)
            self._cond.notify_all()
        self._log("conn#%d %s %s %s body=%d -> %s" % (req.conn_id, req.method, req.target,
                                                      req.version, len(req.body), req.action))

    def _handle(self, conn, req, action):
        has_body = req.framing == "chunked" or (req.framing == "length" and req.content_length)
        if (has_body and req.expects_continue and req.version == "HTTP/1.1"
                and self.auto_continue and action.expect_continue):
            conn.send(b"HTTP/1.1 100 Continue\r\n\r\n")
            req.sent_continue = True
        if has_body and not action.read_body:
            req.body_read = False
            ok = True
        else:
            ok = self._read_body(conn, req)
        self._record(req)
        if not ok:
            return False
        keep = action.run(conn, req)
        return bool(keep) and req.body_read


# ------------------------------------------------------------------------------- no-server ports

class Refusing:
    """A loopback port where connect() is refused (RST at once).

    A socket is bound to the port but never listens: Linux refuses connections to it, and the
    port stays reserved (no other process can take it) until close().
    """

    def __init__(self, host="127.0.0.1"):
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind((host, 0))
        self.host, self.port = self._sock.getsockname()[:2]

    @property
    def endpoint(self):
        return "%s:%d" % (self.host, self.port)

    def close(self):
        self._sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class Blackhole:
    """A loopback port where connect() hangs (for connect-timeout tests; no external address
    may be used, so an unroutable IP is not an option).

    How: a listener with backlog 0 that never accepts; the constructor fills its accept queue
    with its own connection(s). Linux then drops every further SYN (tcp_abort_on_overflow=0, the
    default), so the caller's connect() stays in SYN-SENT, retransmitting, until its own timeout.
    Measured at construction: ``blocks`` is True when a probe connect() did not complete within
    probe_timeout (measured True on the development kernel, 6.x: one connection fills a
    backlog-0 queue, the next connect hangs). If ``blocks`` is False on some kernel, a
    connect-timeout test should pytest.skip. Limitation: only while the queue stays full; the
    kernel never completes the handshake, so no request byte is ever written (a pure
    connect-failure).
    """

    def __init__(self, host="127.0.0.1", probe_timeout=0.3, max_fill=8):
        self._lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._lsock.bind((host, 0))
        self._lsock.listen(0)
        self.host, self.port = self._lsock.getsockname()[:2]
        self._fillers = []
        self.blocks = False
        for _ in range(max_fill):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.setblocking(False)
            s.connect_ex((self.host, self.port))
            _, w, _ = select.select([], [s], [], probe_timeout)
            if w and s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
                self._fillers.append(s)
                continue
            s.close()
            self.blocks = True
            break

    @property
    def endpoint(self):
        return "%s:%d" % (self.host, self.port)

    def close(self):
        for s in self._fillers:
            s.close()
        self._fillers = []
        self._lsock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ------------------------------------------------------------------------------- CLI

def first_attempt_fails(fail, then):
    """A spec answering FAIL to a request's first attempt (X-Retrygate-Attempt 1, or absent:
    a client that does not retry) and THEN to a retry, so that each request through retrygate
    shows one retry, whatever the order of the requests."""
    def pick(req):
        return fail if (req.header("X-Retrygate-Attempt") or "1") == "1" else then
    return dynamic(pick)


def _parse_spec(text):
    text = text.strip()
    if text[:1] in "{[" or text[:1].isdigit():
        return json.loads(text)
    return text


def main(argv=None):
    p = argparse.ArgumentParser(
        description="Scriptable HTTP/1.1 test upstream (default: 200 JSON echo, keep-alive).")
    p.add_argument("--listen", default="127.0.0.1:9001", help="HOST:PORT (default %(default)s)")
    p.add_argument("--quiet", action="store_true", help="no log lines")
    p.add_argument("--name", help="name shown in logs and the X-Upstream header")
    p.add_argument("--default", help='action when the script is empty: a JSON action '
                   '(\'{"action":"respond","status":503,"headers":{"Retry-After":"2"}}\'), '
                   'a status (503) or a name (reset, close, stall, echo)')
    p.add_argument("--script", help='JSON list of actions consumed one per request first, '
                   'e.g. \'[503, "reset", {"action":"respond","status":200,"body":"ok"}]\'')
    p.add_argument("--flaky", metavar="PREFIX", help="paths under PREFIX answer 503 to a "
                   "request's first attempt and echo a retry (X-Retrygate-Attempt >= 2)")
    args = p.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    default = make_action(_parse_spec(args.default)) if args.default else None
    up = Upstream(port=int(port), host=host or "127.0.0.1", default=default, name=args.name,
                  quiet=args.quiet)
    if args.script:
        up.push(*json.loads(args.script))
    if args.flaky:
        up.on_path(args.flaky, default=first_attempt_fails(
            respond(503, {"Content-Type": "text/plain"}, b"flaky: 503 this time\n"), echo()))
    if not args.quiet:
        sys.stderr.write("upstream: listening on %s\n" % up.endpoint)
        sys.stderr.flush()
    stop = threading.Event()
    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass
    up.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
