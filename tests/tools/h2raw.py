"""A raw HTTP/2 client for hostile-input tests: frames built with hyperframe, header blocks
with hpack, nothing validated on the way out (so malformed requests can be sent), and a reader
that decodes what the server answers (SETTINGS acked, response headers decoded).

    c = H2Raw(port)                         # preface + SETTINGS sent (nodelay=True: TCP_NODELAY)
    sid = c.request([(":method", "GET"), (":path", "/"), ...], body=b"", end=True)
    ev = c.response(sid)                    # H2Response: status, headers, body, reset, code
    c.goaway()                              # wait for GOAWAY: (error_code, last_stream_id) or None
"""

import socket
import time

import hpack
from hyperframe.frame import (ContinuationFrame, DataFrame, Frame, GoAwayFrame, HeadersFrame,
                              PingFrame, RstStreamFrame, SettingsFrame, WindowUpdateFrame)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
PROTOCOL_ERROR, REFUSED_STREAM, CANCEL, ENHANCE_YOUR_CALM, NO_ERROR = 1, 7, 8, 11, 0
INTERNAL_ERROR = 2


class H2Response:
    def __init__(self):
        self.status = None
        self.headers = []
        self.trailers = []
        self.body = b""
        self.ended = False
        self.reset = None           # RST_STREAM error code

    def header(self, name):
        for k, v in self.headers:
            if k == name:
                return v
        return None

    def __repr__(self):
        return "H2Response(status=%r, reset=%r, ended=%r, headers=%r, body=%r)" % (
            self.status, self.reset, self.ended, self.headers, self.body[:200])


class H2Raw:
    def __init__(self, port, host="127.0.0.1", settings=None, timeout=10, auto_window=True,
                 preface=True, nodelay=False):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        if nodelay:
            # each frame its own segment, at once: a frame the reader sends on its own
            # (WINDOW_UPDATE, an ACK) then does not hold the next request behind Nagle until
            # the server's delayed ACK (40 ms a request), and the server reads frames one at
            # a time. Off by default: a test that sends on while the server closes on it
            # would more often see EPIPE
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.enc = hpack.Encoder()
        self.dec = hpack.Decoder()
        self.dec.max_allowed_table_size = 65536
        self.buf = b""
        self.next_id = 1
        self.streams = {}
        self.goaway_frame = None
        self.closed = False
        self.frames = []            # every frame received, in order
        self.auto_window = auto_window
        if preface:
            s = SettingsFrame(0)
            for k, v in (settings or {}).items():
                s.settings[k] = v
            self.send(PREFACE + s.serialize())

    # ---------------------------------------------------------------- sending
    def send(self, data):
        self.sock.sendall(data)

    def _reply(self, f):
        """A frame the reader sends on its own (an ACK, a WINDOW_UPDATE): a peer that closed
        on us is not an error here; the test sees self.closed."""
        try:
            self.sock.sendall(f.serialize())
        except OSError:
            self.closed = True

    def frame(self, f):
        self.send(f.serialize())

    def block(self, headers):
        return self.enc.encode([(k.encode() if isinstance(k, str) else k,
                                 v.encode() if isinstance(v, str) else v) for k, v in headers],
                               huffman=False)

    def headers(self, sid, headers, end=True, end_headers=True, raw_block=None):
        f = HeadersFrame(sid)
        f.data = raw_block if raw_block is not None else self.block(headers)
        if end:
            f.flags.add("END_STREAM")
        if end_headers:
            f.flags.add("END_HEADERS")
        self.frame(f)

    def data(self, sid, payload, end=True):
        f = DataFrame(sid)
        f.data = payload
        if end:
            f.flags.add("END_STREAM")
        self.frame(f)

    def rst(self, sid, code=CANCEL):
        self.frame(RstStreamFrame(sid, error_code=code))

    def new_id(self):
        sid = self.next_id
        self.next_id += 2
        self.streams[sid] = H2Response()
        return sid

    def request(self, headers, body=None, end=True, sid=None):
        """Send a request; body None or b"": END_STREAM on HEADERS (when END)."""
        if sid is None:
            sid = self.new_id()
        self.streams.setdefault(sid, H2Response())
        if body:
            self.headers(sid, headers, end=False)
            self.data(sid, body, end=end)
        else:
            self.headers(sid, headers, end=end)
        return sid

    def get(self, path="/", authority="example", extra=(), method="GET", body=None, end=True):
        h = [(":method", method), (":scheme", "http"), (":authority", authority),
             (":path", path)] + list(extra)
        return self.request(h, body, end)

    # ---------------------------------------------------------------- receiving
    def _read_frame(self, deadline):
        while True:
            if len(self.buf) >= 9:
                f, length = Frame.parse_frame_header(memoryview(self.buf[:9]))
                if len(self.buf) >= 9 + length:
                    f.parse_body(memoryview(self.buf[9:9 + length]))
                    self.buf = self.buf[9 + length:]
                    return f
            left = deadline - time.monotonic()
            if left <= 0 or self.closed:
                return None
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return None
            except (ConnectionResetError, BrokenPipeError):
                chunk = b""
            if not chunk:
                self.closed = True
                return None
            self.buf += chunk

    def _handle(self, f):
        self.frames.append(f)
        st = self.streams.get(f.stream_id) if f.stream_id else None
        if isinstance(f, SettingsFrame) and "ACK" not in f.flags:
            self._reply(SettingsFrame(0, flags=["ACK"]))
        elif isinstance(f, GoAwayFrame):
            self.goaway_frame = f
        elif isinstance(f, (HeadersFrame, ContinuationFrame)) and st is not None:
            hdrs = [(k.decode() if isinstance(k, bytes) else k,
                     v.decode() if isinstance(v, bytes) else v) for k, v in self.dec.decode(f.data)]
            status = dict(hdrs).get(":status")
            if status and status.startswith("1"):
                pass
            elif st.status is None and status:
                st.status = int(status)
                st.headers = [(k, v) for k, v in hdrs if not k.startswith(":")]
            else:
                st.trailers = hdrs
            if "END_STREAM" in f.flags:
                st.ended = True
        elif isinstance(f, DataFrame) and st is not None:
            st.body += f.data
            if "END_STREAM" in f.flags:
                st.ended = True
            if self.auto_window and f.flow_controlled_length:
                self._reply(WindowUpdateFrame(0, window_increment=f.flow_controlled_length))
                if "END_STREAM" not in f.flags:
                    self._reply(WindowUpdateFrame(f.stream_id,
                                                 window_increment=f.flow_controlled_length))
        elif isinstance(f, RstStreamFrame) and st is not None:
            st.reset = f.error_code

    def pump(self, until, timeout=10):
        """Read frames until UNTIL() is true (True), or EOF / timeout (False)."""
        deadline = time.monotonic() + timeout
        while not until():
            f = self._read_frame(deadline)
            if f is None:
                return until()
            self._handle(f)
        return True

    def response(self, sid, timeout=10):
        st = self.streams[sid]
        self.pump(lambda: st.ended or st.reset is not None, timeout)
        return st

    def goaway(self, timeout=10):
        self.pump(lambda: self.goaway_frame is not None, timeout)
        g = self.goaway_frame
        return (g.error_code, g.last_stream_id) if g else None

    def wait_closed(self, timeout=10):
        self.pump(lambda: False, timeout)
        return self.closed

    def settle(self, timeout=5):
        """Wait for the server's SETTINGS (acked by the reader): nothing of ours can then land
        in the middle of a header block we leave open."""
        return self.pump(lambda: any(isinstance(f, SettingsFrame) and "ACK" not in f.flags
                                     for f in self.frames), timeout)

    def ping(self, data=b"12345678"):
        self.frame(PingFrame(0, opaque_data=data))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
