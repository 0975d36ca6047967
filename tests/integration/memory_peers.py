"""Raw-socket peers that make retrygate hold bytes: the memory scenarios of issue 16, shared by
tests/integration/test_reliability.py (short runs) and tests/soak/soak.py (long runs).

Each scenario feeds retrygate many small pieces while the far side does not read, so every
piece is a separate socket read that retrygate must keep until its watermark stops it. What a
scenario returns is the growth of retrygate's RSS, measured by the caller around run().

  upload(rg_port, seconds)            one client POSTs in 100-byte writes to an upstream that
                                      never reads (Sink) or never accepts (a Blackhole)
  pipeline(rg_port, seconds)          one client pipelines small GETs and never reads
  stream_down(rg_port, seconds)       the upstream (Drip) streams 200-byte pieces; the client
                                      never reads
Small SO_RCVBUF on the non-reading side keeps the kernel from absorbing the bytes instead.
"""

import socket
import threading
import time

SMALL_RCVBUF = 4096
# between two small writes: long enough that retrygate reads each on its own, short enough to
# fill the kernel's socket buffers (which grow to a few MiB) within seconds
PACE = 0.00005


def _small_rcvbuf(sock):
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, SMALL_RCVBUF)


class _Server:
    """A listener on 127.0.0.1 with a small receive buffer (inherited by accepted sockets);
    serve(conn) runs in a thread per connection. close() ends everything."""

    def __init__(self):
        self.lsock = socket.socket()
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        _small_rcvbuf(self.lsock)
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(64)
        self.port = self.lsock.getsockname()[1]
        self.endpoint = "127.0.0.1:%d" % self.port
        self.stop = threading.Event()
        self.conns = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.lsock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except OSError:
                continue
            self.conns.append(c)
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, conn):
        raise NotImplementedError

    def close(self):
        self.stop.set()
        self.lsock.close()
        for c in self.conns:
            try:
                c.close()
            except OSError:
                pass


class Sink(_Server):
    """An upstream that accepts and never reads (nor answers)."""

    def serve(self, conn):
        self.stop.wait()


class Drip(_Server):
    """An upstream that reads a request head, answers 200 with a huge Content-Length, then
    writes 200-byte pieces, one per send with a short pause, until it is stopped."""

    def serve(self, conn):
        conn.settimeout(5)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buf = b""
        try:
            while b"\r\n\r\n" not in buf:
                d = conn.recv(4096)
                if not d:
                    return
                buf += d
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000000\r\n\r\n")
            conn.settimeout(0.5)
            piece = b"d" * 200
            while not self.stop.is_set():
                try:
                    conn.send(piece)
                except socket.timeout:
                    continue        # retrygate stopped reading: its watermark works
                time.sleep(PACE)
        except OSError:
            return


def _client(port):
    c = socket.socket()
    _small_rcvbuf(c)
    c.settimeout(5)
    c.connect(("127.0.0.1", port))
    c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return c


def send_pieces(port, first, piece, seconds, pace):
    """Connects, sends FIRST, then PIECE one write at a time (PACE s apart) for SECONDS, never
    reading. Returns the pieces sent."""
    c = _client(port)
    n = 0
    try:
        c.sendall(first)
        c.settimeout(0.5)
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            try:
                c.sendall(piece)
                n += 1
            except socket.timeout:
                continue            # backpressure reached the client: fine
            if pace:
                time.sleep(pace)
    except OSError:
        pass
    finally:
        c.close()
    return n


def upload(port, seconds):
    """POST with a large Content-Length, the body in 100-byte writes. Returns bytes sent."""
    head = b"POST /up HTTP/1.1\r\nHost: a\r\nContent-Length: 1000000000\r\n\r\n"
    return 100 * send_pieces(port, head, b"u" * 100, seconds, PACE)


def pipeline(port, seconds):
    """Small GETs, pipelined, one per write; never reads. Returns requests sent."""
    req = b"GET /p HTTP/1.1\r\nHost: a\r\n\r\n"
    return 1 + send_pieces(port, req, req, seconds, 0)


def stream_down(port, seconds):
    """GET a streaming response and never read it. Returns after seconds."""
    c = _client(port)
    try:
        c.sendall(b"GET /s HTTP/1.1\r\nHost: a\r\n\r\n")
        time.sleep(seconds)
    finally:
        c.close()
    return 0


def memory(pid):
    """(VmRSS, VmData) of pid in bytes: resident memory, and the heap's size (what malloc
    took, touched or not: a 32 KiB chain holding 100 bytes touches one page of it)."""
    out = {}
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmData"):
                out[k] = int(v.split()[0]) * 1024
    return out["VmRSS"], out["VmData"]


def memory_while(pid, fn, *args, clients=1):
    """Runs fn(*args) in `clients` threads. Returns (before, peak, results): before and peak
    are (rss, data) pairs, peak the largest of each seen while fn ran."""
    before = memory(pid)
    peak = list(before)
    done = threading.Event()

    def sample():
        while not done.is_set():
            try:
                now = memory(pid)
            except (OSError, KeyError):
                return
            peak[0], peak[1] = max(peak[0], now[0]), max(peak[1], now[1])
            done.wait(0.05)
    st = threading.Thread(target=sample, daemon=True)
    st.start()
    out = [None] * clients

    def one(i):
        out[i] = fn(*args)
    ts = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(clients)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(args[-1] + 30)
    done.set()
    st.join(5)
    return before, tuple(peak), out
