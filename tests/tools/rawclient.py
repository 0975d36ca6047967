"""HTTP/1.1 wire helpers for tests: a raw-socket client and byte-level parsers.

Standard library only. Shared by ``upstream.py`` (request side) and the integration harness
(response side). Everything here works on bytes, so tests can send exactly the bytes they mean
(smuggling, malformed heads, pipelining) and see exactly what came back.

Cheat-sheet::

    data, closed = raw_request(port, b"GET / HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n", read_timeout=2)
    resp = parse_response(data)            # first final response: .status .headers .body
    resps = parse_responses(data)          # every response in the stream (pipelining)

    with RawConn(port) as c:               # a persistent connection, byte control
        c.send(b"GET / HTTP/1.1\\r\\nHost: a\\r\\n\\r\\n")
        r = c.read_response()              # returns as soon as one full response is in
        assert c.wait_closed(timeout=2)    # True when the peer closed (FIN or RST)

Every socket operation is bounded by a timeout.
"""

import json
import select
import socket
import struct
import time

__all__ = [
    "HeaderMap", "HTTPParseError", "ResponseMixin", "RawResponse", "RawConn",
    "raw_request", "parse_response", "parse_responses", "try_parse_response",
    "find_head_end", "parse_head_lines", "parse_chunked", "normalize_headers",
]

CRLF = b"\r\n"
MAX_HEAD = 1 << 20          # refuse to buffer more than 1 MiB of head
MAX_CHUNK_LINE = 64 * 1024


class HTTPParseError(ValueError):
    """Bytes that are not valid HTTP/1.1 framing."""


class HeaderMap:
    """Ordered, case-insensitive, multi-value headers (names and values as str, latin-1).

    ``h["x"]`` / ``h.get("x")`` give the first value, ``h.get_all("x")`` every value in order,
    ``"x" in h`` tests presence, ``h.items()`` the raw (name, value) list as received.
    """

    __slots__ = ("_items",)

    def __init__(self, items=()):
        self._items = [(str(n), str(v)) for n, v in normalize_headers(items)]

    def get(self, name, default=None):
        name = name.lower()
        for n, v in self._items:
            if n.lower() == name:
                return v
        return default

    def get_all(self, name):
        name = name.lower()
        return [v for n, v in self._items if n.lower() == name]

    def count(self, name):
        return len(self.get_all(name))

    def items(self):
        return list(self._items)

    def keys(self):
        return [n for n, _ in self._items]

    def names_lower(self):
        return {n.lower() for n, _ in self._items}

    def to_dict(self):
        """{lower-case name: values joined with ", "}."""
        out = {}
        for n, v in self._items:
            k = n.lower()
            out[k] = v if k not in out else out[k] + ", " + v
        return out

    def __getitem__(self, name):
        v = self.get(name)
        if v is None:
            raise KeyError(name)
        return v

    def __contains__(self, name):
        return self.get(name) is not None

    def __iter__(self):
        return iter(self.keys())

    def __len__(self):
        return len(self._items)

    def __repr__(self):
        return "HeaderMap(%r)" % (self._items,)


def normalize_headers(headers):
    """None | dict | HeaderMap | iterable of (name, value) -> list of (name, value).

    A dict value that is a list/tuple yields one header line per element. Values that are not
    str are converted with str() (ints, floats).
    """
    if headers is None:
        return []
    if isinstance(headers, HeaderMap):
        return headers.items()
    if isinstance(headers, dict):
        out = []
        for n, v in headers.items():
            if isinstance(v, (list, tuple)):
                out.extend((n, x) for x in v)
            else:
                out.append((n, v))
    else:
        out = list(headers)
    return [(_hstr(n), _hstr(v)) for n, v in out]


def _hstr(x):
    if isinstance(x, str):
        return x
    if isinstance(x, (bytes, bytearray)):
        return bytes(x).decode("latin-1")
    return str(x)


def find_head_end(buf, start=0):
    """Index just past the first CRLFCRLF at or after start, or -1."""
    i = buf.find(b"\r\n\r\n", start)
    return -1 if i < 0 else i + 4


def parse_head_lines(head):
    """Split a head (bytes ending in CRLFCRLF, or without it) into (start_line, [(name, value)]).

    Strict: every line must end in CRLF, every header line must be ``name: value`` with a
    non-empty name without whitespace; obs-fold (a line starting with SP/HT) is an error.
    Names and values are decoded as latin-1; values are stripped of SP/HT.
    """
    head = bytes(head)
    if head.endswith(b"\r\n\r\n"):
        head = head[:-4]
    lines = head.split(b"\r\n")
    start = lines[0]
    headers = []
    for ln in lines[1:]:
        if not ln:
            raise HTTPParseError("empty line inside head")
        if ln[:1] in (b" ", b"\t"):
            raise HTTPParseError("obs-fold line: %r" % ln)
        if b"\n" in ln or b"\r" in ln:
            raise HTTPParseError("bare CR/LF in header line: %r" % ln)
        name, sep, value = ln.partition(b":")
        if not sep or not name or name != name.strip(b" \t") or b" " in name or b"\t" in name:
            raise HTTPParseError("bad header line: %r" % ln)
        headers.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
    if b"\n" in start or b"\r" in start:
        raise HTTPParseError("bare CR/LF in start line: %r" % start)
    return start.decode("latin-1"), headers


def parse_chunked(buf, start=0):
    """Decode a chunked body beginning at buf[start].

    Returns None if more bytes are needed, else (body, trailers, end, extensions) where end is
    the index just past the final CRLF and extensions lists every chunk-extension string seen.
    Raises HTTPParseError on malformed framing.
    """
    pos = start
    body = bytearray()
    exts = []
    n = len(buf)
    while True:
        eol = buf.find(b"\r\n", pos)
        if eol < 0:
            if n - pos > MAX_CHUNK_LINE:
                raise HTTPParseError("chunk-size line too long")
            return None
        line = bytes(buf[pos:eol])
        size_s, _, ext = line.partition(b";")
        size_s = size_s.strip(b" \t")
        if ext:
            exts.append(ext.decode("latin-1"))
        if not size_s or any(c not in b"0123456789abcdefABCDEF" for c in size_s):
            raise HTTPParseError("bad chunk-size line: %r" % line)
        size = int(size_s, 16)
        pos = eol + 2
        if size == 0:
            trailers = []
            while True:
                eol = buf.find(b"\r\n", pos)
                if eol < 0:
                    return None
                tl = bytes(buf[pos:eol])
                pos = eol + 2
                if not tl:
                    return bytes(body), trailers, pos, exts
                name, sep, value = tl.partition(b":")
                if not sep or not name:
                    raise HTTPParseError("bad trailer line: %r" % tl)
                trailers.append((name.decode("latin-1"), value.strip(b" \t").decode("latin-1")))
        if n < pos + size + 2:
            return None
        body += buf[pos:pos + size]
        if buf[pos + size:pos + size + 2] != b"\r\n":
            raise HTTPParseError("chunk data not followed by CRLF")
        pos += size + 2


class ResponseMixin:
    """What every response class of the tests has, given .status, .headers and .body (bytes):
    .text, .json(), and unpacking as ``status, headers, body``."""

    @property
    def text(self):
        return self.body.decode("utf-8", "replace")

    def json(self):
        return json.loads(self.body)

    def __iter__(self):
        return iter((self.status, self.headers, self.body))


class RawResponse(ResponseMixin):
    """One parsed response.

    Attributes: version, status (int), reason, headers (HeaderMap), body (bytes, de-chunked),
    raw (the bytes of this response on the wire, interim responses excluded), interim (list of
    1xx RawResponse that preceded it), trailers, framing ("length" | "chunked" | "close" |
    "none"), complete (False when the stream ended before the framing said it would).
    Unpacks as ``status, headers, body``.
    """

    def __init__(self, version, status, reason, headers, raw_head):
        self.version = version
        self.status = status
        self.reason = reason
        self.headers = HeaderMap(headers)
        self.raw_head = raw_head
        self.body = b""
        self.raw = raw_head
        self.interim = []
        self.trailers = []
        self.chunk_extensions = []
        self.framing = "none"
        self.complete = True

    def __repr__(self):
        return "<RawResponse %s %d %r body=%d bytes%s>" % (
            self.version, self.status, self.reason, len(self.body),
            "" if self.complete else " INCOMPLETE")


def _parse_status_line(line):
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or len(parts[1]) != 3 \
            or not parts[1].isdigit():
        raise HTTPParseError("bad status line: %r" % line)
    return parts[0], int(parts[1]), parts[2] if len(parts) > 2 else ""


def _content_length(headers):
    vals = headers.get_all("content-length")
    if not vals:
        return None
    if len(set(vals)) != 1 or not vals[0].isdigit():
        raise HTTPParseError("bad/conflicting Content-Length: %r" % vals)
    return int(vals[0])


def try_parse_response(buf, method="GET", eof=False):
    """Parse one final response (with any 1xx before it) from the start of buf.

    Returns (RawResponse, consumed) or None when more bytes are needed. With eof=True the stream
    is known to be over: a close-delimited body takes the rest, and a truncated body gives a
    response with complete=False instead of None. 101 is final (the rest is a tunnel).
    """
    buf = bytes(buf)
    pos = 0
    interim = []
    while True:
        end = find_head_end(buf, pos)
        if end < 0:
            if len(buf) - pos > MAX_HEAD:
                raise HTTPParseError("response head too large")
            return None
        start, hdrs = parse_head_lines(buf[pos:end])
        version, status, reason = _parse_status_line(start)
        resp = RawResponse(version, status, reason, hdrs, buf[pos:end])
        if 100 <= status < 200 and status != 101:
            interim.append(resp)
            pos = end
            continue
        break
    resp.interim = interim
    h = resp.headers
    body_start = end
    if method.upper() == "HEAD" or status in (204, 304, 101) or 100 <= status < 200:
        resp.framing = "none"
        consumed = body_start
    elif "transfer-encoding" in h and h.get_all("transfer-encoding")[-1].split(",")[-1] \
            .strip().lower() == "chunked":
        resp.framing = "chunked"
        r = parse_chunked(buf, body_start)
        if r is None:
            if not eof:
                return None
            resp.complete = False
            resp.body = buf[body_start:]  # raw, undecoded: it could not be decoded
            consumed = len(buf)
        else:
            resp.body, resp.trailers, consumed, resp.chunk_extensions = r
    elif _content_length(h) is not None:
        resp.framing = "length"
        cl = _content_length(h)
        if len(buf) - body_start < cl:
            if not eof:
                return None
            resp.complete = False
            resp.body = buf[body_start:]
            consumed = len(buf)
        else:
            resp.body = buf[body_start:body_start + cl]
            consumed = body_start + cl
    else:
        resp.framing = "close"
        if not eof:
            return None
        resp.body = buf[body_start:]
        consumed = len(buf)
    resp.raw = buf[pos:consumed]
    return resp, consumed


def parse_response(data, method="GET"):
    """The first final response in data (a complete stream: as if EOF followed).

    Raises HTTPParseError if data does not hold a complete response head.
    """
    r = try_parse_response(data, method, eof=True)
    if r is None:
        raise HTTPParseError("no complete response head in %d bytes: %r" % (len(data), data[:200]))
    return r[0]


def parse_responses(data, methods=None):
    """Every response in a complete stream, in order (for pipelined requests).

    methods: the request method of each response in order (default all GET); it matters only
    for HEAD. Stops at the first incomplete or unparseable remainder.
    """
    out = []
    pos = 0
    data = bytes(data)
    while pos < len(data):
        m = methods[len(out)] if methods and len(out) < len(methods) else "GET"
        try:
            r = try_parse_response(data[pos:], m, eof=True)
        except HTTPParseError:
            break
        if r is None:
            break
        out.append(r[0])
        pos += r[1]
        if r[0].status == 101:
            break
    return out


class ConnectionClosed(ConnectionError):
    """The peer closed before a complete response arrived."""


class RawConn:
    """A raw client connection with a receive buffer. All reads are bounded by a timeout.

    send(bytes); read_response(method, timeout) -> RawResponse (returns as soon as one response
    is complete); recv_some(timeout) -> bytes; read_until_close(timeout) -> (bytes, closed);
    wait_closed(timeout) -> bool; shutdown_write(); reset() (RST); close().
    ``closed`` is True once the peer's FIN or RST was seen; ``was_reset`` tells RST apart.
    """

    def __init__(self, port, host="127.0.0.1", timeout=10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.buf = bytearray()
        self.closed = False
        self.was_reset = False
        self.timeout = timeout

    def send(self, data):
        if isinstance(data, str):
            data = data.encode("latin-1")
        self.sock.settimeout(self.timeout)
        self.sock.sendall(data)

    def _recv(self, timeout):
        """Receive once into buf. Returns number of bytes, 0 on EOF, None on timeout."""
        if self.closed:
            return 0
        r, _, _ = select.select([self.sock], [], [], max(0.0, timeout))
        if not r:
            return None
        try:
            d = self.sock.recv(65536)
        except ConnectionResetError:
            self.closed = self.was_reset = True
            return 0
        except OSError:
            self.closed = True
            return 0
        if not d:
            self.closed = True
            return 0
        self.buf += d
        return len(d)

    def recv_some(self, timeout=5.0):
        """Whatever arrives next (waits up to timeout for at least one byte); b"" on EOF/timeout."""
        if not self.buf:
            self._recv(timeout)
        d = bytes(self.buf)
        self.buf.clear()
        return d

    def read_response(self, method="GET", timeout=10.0):
        """One response (1xx interims attached to it). Raises TimeoutError or ConnectionClosed."""
        deadline = time.monotonic() + timeout
        while True:
            r = try_parse_response(self.buf, method, eof=self.closed)
            if r is not None:
                resp, used = r
                del self.buf[:used]
                return resp
            if self.closed:
                raise ConnectionClosed("peer closed%s after %d unparsed bytes: %r" % (
                    " (RST)" if self.was_reset else "", len(self.buf), bytes(self.buf[:300])))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no complete response within %.1fs; have %r" % (
                    timeout, bytes(self.buf[:300])))
            self._recv(left)

    def read_interim(self, timeout=10.0):
        """Read one 1xx response head only (e.g. the 100 Continue before sending a body)."""
        deadline = time.monotonic() + timeout
        while True:
            end = find_head_end(self.buf)
            if end >= 0:
                start, hdrs = parse_head_lines(self.buf[:end])
                version, status, reason = _parse_status_line(start)
                resp = RawResponse(version, status, reason, hdrs, bytes(self.buf[:end]))
                if not 100 <= status < 200:
                    raise HTTPParseError("expected a 1xx, got %d" % status)
                del self.buf[:end]
                return resp
            if self.closed:
                raise ConnectionClosed("peer closed while waiting for a 1xx: %r" % bytes(self.buf))
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no 1xx within %.1fs; have %r" % (timeout, bytes(self.buf)))
            self._recv(left)

    def read_until_close(self, timeout=5.0, idle=None):
        """Everything until the peer closes (closed=True) or until timeout / idle seconds without
        a byte (closed=False). Returns (bytes, closed) and empties the buffer."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            if self._recv(min(left, idle) if idle else left) is None and idle:
                break
        d = bytes(self.buf)
        self.buf.clear()
        return d, self.closed

    def wait_closed(self, timeout=5.0):
        """True once the peer has closed (FIN or RST) within timeout; buffered data is kept."""
        deadline = time.monotonic() + timeout
        while not self.closed:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            self._recv(left)
        return True

    def shutdown_write(self):
        try:
            self.sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def reset(self):
        """Abort the connection with a RST (SO_LINGER 0)."""
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        self.close()

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def raw_request(port, data, read_timeout=2.0, host="127.0.0.1", connect_timeout=5.0,
                max_time=30.0, shutdown_write=False):
    """Send data on a fresh connection and collect the reply.

    Reads until the peer closes (closed=True) or until no byte arrived for read_timeout seconds
    (closed=False); max_time bounds the whole read. A RST counts as closed. Returns
    (bytes_received, closed). shutdown_write=True half-closes after sending.
    """
    c = RawConn(port, host=host, timeout=connect_timeout)
    try:
        try:
            c.send(data)
        except (BrokenPipeError, ConnectionResetError):
            c.closed = True
        if shutdown_write:
            c.shutdown_write()
        return c.read_until_close(timeout=max_time, idle=read_timeout)
    finally:
        c.close()
