#!/usr/bin/env python3
"""A scriptable HTTP/2 upstream for retrygate's tests (python3-h2), in the spirit of upstream.py.

Cleartext prior knowledge, or TLS with ALPN (``tls=(cert, key)``, ``alpn=["h2"]``; an ALPN list
without "h2" makes an endpoint that does not select h2). One thread per connection; each
request's action runs in its own thread once the request ended (END_STREAM), or at its HEADERS
for actions marked ``early``. Every frame write holds the connection's lock.

    up = H2Upstream(max_streams=1, settings_delay=0.5)
    up.push(respond(200, body=b"ok", trailers=[("grpc-status", "0")]), rst(REFUSED_STREAM))
    up.set_default(echo())
    reqs = up.wait_requests(2)      # -> [H2Request]: headers (list, pseudo included), header(n),
                                    #    body, conn_id, stream_id, time
    up.resets                       # [(conn_id, stream_id, error_code)] RST_STREAM received
    up.connections                  # connections accepted so far
    up.close()

    H2Upstream(deaf=1, rcvbuf=2048, mss=536)    # the first connection reads the client's
                                    # preface and SETTINGS, then nothing more until killed;
                                    # RCVBUF and MSS (set on the listening socket) keep the
                                    # bytes the kernels hold for an unread connection small
    H2Upstream(window=1 << 20)      # the stream and connection flow-control windows it grants
                                    # (SETTINGS_INITIAL_WINDOW_SIZE, a WINDOW_UPDATE on stream 0)

Actions: respond(status, headers, body, trailers, delay, delay_body, early, rst_after, hold) |
echo() |
rst(code, after_head=False, body=b"", together=False) | raw(frames) | goaway(last_stream_id, code=0) | stall(seconds) |
kill() (close the TCP connection) | a dict {"action": name, ...}.
"""

import json
import socket
import ssl
import threading
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from h2.errors import ErrorCodes

NO_ERROR = ErrorCodes.NO_ERROR
PROTOCOL_ERROR = ErrorCodes.PROTOCOL_ERROR
INTERNAL_ERROR = ErrorCodes.INTERNAL_ERROR
REFUSED_STREAM = ErrorCodes.REFUSED_STREAM
CANCEL = ErrorCodes.CANCEL


def respond(status=200, headers=(), body=b"", trailers=None, delay=0.0, delay_body=0.0,
            early=False, rst_after=None, hold=None, hold_timeout=30.0):
    """EARLY: answer at the request's HEADERS, before its body ended; RST_AFTER: then reset
    the stream with that code (NO_ERROR: "send no more of the request body"); HOLD: a
    threading.Event, answer only once it is set (at most HOLD_TIMEOUT s), so a test can pile
    up streams in flight and release them when it has looked."""
    return {"action": "respond", "status": status, "headers": list(headers), "body": body,
            "trailers": trailers, "delay": delay, "delay_body": delay_body, "early": early,
            "rst_after": rst_after, "hold": hold, "hold_timeout": hold_timeout}


def echo():
    return {"action": "echo"}


def rst(code=INTERNAL_ERROR, after_head=False, body=b"", early=False, together=False):
    """TOGETHER (with AFTER_HEAD): the head, the body and the reset in one write, so the
    proxy reads them at once; else the reset follows 0.1 s later."""
    return {"action": "rst", "code": code, "after_head": after_head, "body": body,
            "early": early, "together": together}


def raw(*frames):
    """A response written past h2's checks, for the malformed ones: each frame is
    ("headers", [(name, value)], end_stream) or ("data", bytes, end_stream)."""
    return {"action": "raw", "frames": frames}


def goaway(last_stream_id=0, code=NO_ERROR):
    return {"action": "goaway", "last": last_stream_id, "code": code, "early": True}


def stall(seconds=30.0):
    return {"action": "stall", "seconds": seconds}


def kill():
    return {"action": "kill", "early": True}


class H2Request:
    def __init__(self, conn_id, stream_id, headers):
        self.conn_id = conn_id
        self.stream_id = stream_id
        self.headers = headers          # [(name, value)] as str, pseudo-headers first
        self.body = b""
        self.trailers = None            # [(name, value)] when the request ended with trailers
        self.time = time.monotonic()
        self.complete = False
        self.never_indexed = set()      # names that came as never-indexed literals

    def header(self, name):
        for n, v in self.headers:
            if n == name.lower():
                return v
        return None

    def names(self):
        return [n for n, _ in self.headers]


class _Conn:
    def __init__(self, up, sock, cid):
        self.up, self.sock, self.id = up, sock, cid
        self.lock = threading.Lock()
        self.dead = False
        cfg = h2.config.H2Configuration(client_side=False, header_encoding="utf-8",
                                        validate_inbound_headers=False)
        self.h2 = h2.connection.H2Connection(config=cfg)
        initial = {}
        if up.max_streams is not None:
            initial[h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS] = up.max_streams
        if up.window is not None:
            initial[h2.settings.SettingCodes.INITIAL_WINDOW_SIZE] = up.window
        if initial:
            self.h2.local_settings = h2.settings.Settings(client=False, initial_values=initial)
        self.reqs = {}
        self.deaf = False

    def flush(self):
        data = self.h2.data_to_send()
        if data and not self.dead:
            try:
                self.sock.sendall(data)
            except OSError:
                self.dead = True

    def do(self, fn):
        with self.lock:
            if self.dead:
                return False
            try:
                fn()
            except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError, KeyError):
                return False
            self.flush()
            return True

    def goaway_raw(self, last_stream_id, code=0):
        """A GOAWAY written past h2's state machine, which would refuse to answer after its
        own: the streams at or below LAST_STREAM_ID can still be answered."""
        from hyperframe.frame import GoAwayFrame
        f = GoAwayFrame(0)
        f.last_stream_id, f.error_code = last_stream_id, code
        with self.lock:
            self.flush()
            try:
                self.sock.sendall(f.serialize())
            except OSError:
                self.dead = True

    def kill(self):
        with self.lock:
            self.dead = True
            try:
                self.sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def run(self):
        if self.up.settings_delay:
            time.sleep(self.up.settings_delay)
        self.do(self.h2.initiate_connection)
        if self.up.window is not None and self.up.window > 65535:
            self.do(lambda: self.h2.increment_flow_control_window(self.up.window - 65535))
        if self.deaf:
            self.read_settings_then_nothing()
            return
        try:
            while not self.dead and not self.up.closed:
                events = self.receive(65536)
                if events is None:
                    break
                for ev in events:
                    self.event(ev)
        finally:
            self.dead = True
            try:
                self.sock.close()
            except OSError:
                pass

    def read_settings_then_nothing(self):
        """Small reads until the client's SETTINGS came, then none: what follows stays in
        the kernels' buffers, and the client's output waits."""
        seen = False
        while not seen and not self.dead and not self.up.closed:
            events = self.receive(16)
            if events is None:
                break
            seen = any(isinstance(e, h2.events.RemoteSettingsChanged) for e in events)
        self.wait(3600)

    def receive(self, size):
        """One read of at most SIZE bytes through the h2 state machine, its answer flushed:
        the events ([] after a timeout), or None once the connection ended (EOF, a socket
        error, a protocol error)."""
        try:
            data = self.sock.recv(size)
        except socket.timeout:
            return []
        except OSError:
            return None
        if not data:
            return None
        with self.lock:
            try:
                events = self.h2.receive_data(data)
            except h2.exceptions.ProtocolError:
                self.flush()
                return None
            self.flush()
        return events
        try:
            self.sock.close()
        except OSError:
            pass

    def event(self, ev):
        if isinstance(ev, h2.events.RequestReceived):
            req = H2Request(self.id, ev.stream_id, [(n, v) for n, v in ev.headers])
            # HPACK never-indexed literals (RFC 7541 §6.2.3), as the sender flagged them
            req.never_indexed = {n for n, v in (h for h in ev.headers
                                                if not getattr(h, "indexable", True))}
            self.reqs[ev.stream_id] = req
            action = self.up.next_action()
            req.action = action
            if action.get("early"):
                self.up.record(req)
                self.start(req, action)
            if ev.stream_ended:
                self.ended(req)
        elif isinstance(ev, h2.events.DataReceived):
            req = self.reqs.get(ev.stream_id)
            if req:
                req.body += ev.data
            self.do(lambda: self.h2.acknowledge_received_data(ev.flow_controlled_length,
                                                             ev.stream_id))
            if ev.stream_ended and req:
                self.ended(req)
        elif isinstance(ev, h2.events.TrailersReceived):
            req = self.reqs.get(ev.stream_id)
            if req:
                req.trailers = [(n, v) for n, v in ev.headers]
                if ev.stream_ended:
                    self.ended(req)
        elif isinstance(ev, h2.events.StreamEnded):
            req = self.reqs.get(ev.stream_id)
            if req and not req.complete:
                self.ended(req)
        elif isinstance(ev, h2.events.StreamReset):
            self.up.resets.append((self.id, ev.stream_id, ev.error_code))

    def ended(self, req):
        if req.complete:
            return
        req.complete = True
        if not req.action.get("early"):
            self.up.record(req)
            self.start(req, req.action)

    def start(self, req, action):
        threading.Thread(target=self.act, args=(req, action), daemon=True).start()

    def wait(self, seconds):
        end = time.monotonic() + seconds
        while time.monotonic() < end and not self.dead and not self.up.closed:
            time.sleep(0.01)

    def wait_event(self, event, timeout):
        end = time.monotonic() + timeout
        while not event.is_set() and time.monotonic() < end and not self.dead \
                and not self.up.closed:
            event.wait(0.01)

    def act(self, req, a):
        sid, kind = req.stream_id, a["action"]
        if kind == "kill":
            self.kill()
        elif kind == "goaway":
            self.do(lambda: self.h2.close_connection(error_code=a["code"],
                                                     last_stream_id=a["last"]))
        elif kind == "stall":
            self.wait(a["seconds"])
        elif kind == "rst" and a["after_head"] and a.get("together"):
            def cut():
                self.h2.send_headers(sid, [(":status", "200"), ("content-length", "100000")])
                if a["body"]:
                    self.h2.send_data(sid, a["body"])
                self.h2.reset_stream(sid, error_code=a["code"])
            self.do(cut)
        elif kind == "rst":
            if a["after_head"]:
                self.do(lambda: self.h2.send_headers(sid, [(":status", "200"),
                                                            ("content-length", "100000")]))
                if a["body"]:
                    self.do(lambda: self.h2.send_data(sid, a["body"]))
                self.wait(0.1)
            self.do(lambda: self.h2.reset_stream(sid, error_code=a["code"]))
        elif kind == "raw":
            from hyperframe.frame import DataFrame, HeadersFrame
            with self.lock:
                self.flush()
                for what, payload, end in a["frames"]:
                    f = HeadersFrame(sid) if what == "headers" else DataFrame(sid)
                    if what == "headers":
                        f.data = self.h2.encoder.encode(
                            [(n.encode("latin-1"), v.encode("latin-1")) for n, v in payload])
                        f.flags.add("END_HEADERS")
                    else:
                        f.data = payload
                    if end:
                        f.flags.add("END_STREAM")
                    try:
                        self.sock.sendall(f.serialize())
                    except OSError:
                        self.dead = True
        elif kind in ("respond", "echo"):
            if kind == "echo":
                body = json.dumps({"method": req.header(":method"), "path": req.header(":path"),
                                   "headers": req.headers, "body_len": len(req.body)}).encode()
                status, headers, trailers = 200, [("content-type", "application/json")], None
            else:
                body, status, headers, trailers = a["body"], a["status"], a["headers"], a["trailers"]
                if isinstance(body, str):
                    body = body.encode()
                if a.get("hold") is not None:
                    self.wait_event(a["hold"], a.get("hold_timeout", 30.0))
                self.wait(a["delay"])
            hs = [(":status", str(status))] + list(headers)
            if trailers is None and not any(n == "content-length" for n, _ in headers):
                hs.append(("content-length", str(len(body))))
            end_now = not body and not trailers
            self.do(lambda: self.h2.send_headers(sid, hs, end_stream=end_now))
            if a.get("delay_body"):
                self.wait(a["delay_body"])
            if body:
                self.send_body(sid, body, end=not trailers)
            if trailers:
                self.do(lambda: self.h2.send_headers(sid, list(trailers), end_stream=True))
            if a.get("rst_after") is not None:
                self.do(lambda: self.h2.reset_stream(sid, error_code=a["rst_after"]))

    def send_body(self, sid, body, end):
        off = 0
        while off < len(body) and not self.dead:
            with self.lock:
                try:
                    n = min(self.h2.local_flow_control_window(sid),
                            self.h2.max_outbound_frame_size, len(body) - off)
                except (h2.exceptions.StreamClosedError, KeyError):
                    return
                if n > 0:
                    last = off + n == len(body)
                    try:
                        self.h2.send_data(sid, body[off:off + n], end_stream=last and end)
                    except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError):
                        return
                    off += n
                    self.flush()
            if n <= 0:
                time.sleep(0.005)   # window closed: WINDOW_UPDATE arrives through run()
        if not body and end:
            self.do(lambda: self.h2.end_stream(sid))


class H2Upstream:
    def __init__(self, max_streams=None, settings_delay=0.0, tls=None, alpn=("h2",), deaf=0,
                 rcvbuf=None, mss=None, window=None):
        self.max_streams = max_streams
        self.window = window
        self.deaf = deaf
        self.settings_delay = settings_delay
        self.queue, self.default = [], echo()
        self.requests, self.resets, self.conns = [], [], []
        self.lock = threading.Lock()
        self.closed = False
        self.ctx = None
        if tls:
            self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            self.ctx.load_cert_chain(tls[0], tls[1])
            self.ctx.set_alpn_protocols(list(alpn))
        self.lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if rcvbuf:
            self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
        if mss:
            self.lsock.setsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG, mss)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(128)
        self.lsock.settimeout(0.2)
        self.port = self.lsock.getsockname()[1]
        self.endpoint = "127.0.0.1:%d" % self.port
        threading.Thread(target=self.accept_loop, daemon=True).start()

    @property
    def connections(self):
        return len(self.conns)

    def push(self, *actions):
        with self.lock:
            self.queue.extend(actions)

    def set_default(self, action):
        self.default = action

    def next_action(self):
        with self.lock:
            return self.queue.pop(0) if self.queue else self.default

    def record(self, req):
        with self.lock:
            self.requests.append(req)

    def accept_loop(self):
        while not self.closed:
            try:
                s, _ = self.lsock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            s.settimeout(0.2)
            # HEADERS and DATA go out as separate writes: without this the DATA waits for
            # the peer's delayed ACK (40 ms a response)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.ctx:
                try:
                    s.settimeout(5)
                    s = self.ctx.wrap_socket(s, server_side=True)
                    s.settimeout(0.2)
                except (OSError, ssl.SSLError):
                    s.close()
                    continue
                if s.selected_alpn_protocol() != "h2":
                    self.conns.append(None)
                    threading.Thread(target=self.not_h2, args=(s,), daemon=True).start()
                    continue
            c = _Conn(self, s, len(self.conns))
            c.deaf = len(self.conns) < self.deaf
            self.conns.append(c)
            threading.Thread(target=c.run, daemon=True).start()

    def not_h2(self, s):
        """An HTTP/1.1 server behind TLS: whatever arrives gets a 200 it will never see as h2."""
        try:
            s.recv(65536)
            s.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        except OSError:
            pass
        s.close()

    def wait_for(self, pred, timeout=10, what="condition"):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if pred():
                return
            time.sleep(0.01)
        raise AssertionError("h2upstream: timed out waiting for " + what)

    def wait_requests(self, n, timeout=10):
        self.wait_for(lambda: len(self.requests) >= n, timeout, "%d requests" % n)
        return list(self.requests)

    def wait_connections(self, n, timeout=10):
        self.wait_for(lambda: len(self.conns) >= n, timeout, "%d connections" % n)

    def kill_connections(self):
        for c in list(self.conns):
            if c:
                c.kill()

    def close(self):
        self.closed = True
        try:
            self.lsock.close()
        except OSError:
            pass
        self.kill_connections()


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description="HTTP/2 echo upstream (prior knowledge)")
    ap.add_argument("--max-streams", type=int)
    args = ap.parse_args()
    up = H2Upstream(max_streams=args.max_streams)
    print(up.endpoint, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        up.close()
