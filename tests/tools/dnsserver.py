#!/usr/bin/env python3
"""A tiny authoritative DNS server over UDP for retrygate's endpoint-resolution tests
(standard library only; no dnslib on Debian 12 by default).

    dns = DnsServer()                       # 127.0.0.1, ephemeral port, serving in a thread
    dns.endpoint                            # "127.0.0.1:PORT" (for `resolvers:`)
    dns.set("svc.test", ["127.0.0.2", "127.0.0.3"], ttl=1)   # A (and AAAA for IPv6 literals)
    dns.fail = True                         # answer SERVFAIL to everything (a failing lookup)
    dns.queries                             # [(name, qtype)] seen
    dns.close()

Unknown names get NXDOMAIN; a name with no address of the asked family gets an empty answer.
"""

import socket
import struct
import threading

A, AAAA = 1, 28


class DnsServer:
    def __init__(self, host="127.0.0.1"):
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind((host, 0))
        self.sock.settimeout(0.2)
        self.host, self.port = self.sock.getsockname()[:2]
        self.records = {}
        self.fail = False
        self.queries = []
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def endpoint(self):
        return "%s:%d" % (self.host, self.port)

    def set(self, name, addrs, ttl=1):
        with self._lock:
            self.records[name.lower().rstrip(".")] = (list(addrs), ttl)

    def close(self):
        self._stop = True
        self._thread.join(2)
        self.sock.close()

    def _serve(self):
        while not self._stop:
            try:
                data, peer = self.sock.recvfrom(2048)
            except socket.timeout:
                continue
            except OSError:
                return
            try:
                reply = self._answer(data)
            except (ValueError, IndexError, struct.error):
                continue
            if reply:
                self.sock.sendto(reply, peer)

    def _answer(self, q):
        qid, flags, qd = struct.unpack("!HHH", q[:6])
        labels, i = [], 12
        while q[i]:
            n = q[i]
            labels.append(q[i + 1:i + 1 + n].decode("ascii", "replace"))
            i += 1 + n
        qtype, qclass = struct.unpack("!HH", q[i + 1:i + 5])
        question = q[12:i + 5]
        name = ".".join(labels).lower()
        self.queries.append((name, qtype))
        rd = flags & 0x0100
        if self.fail:
            return struct.pack("!HHHHHH", qid, 0x8000 | rd | 0x0080 | 2, 1, 0, 0, 0) + question
        with self._lock:
            rec = self.records.get(name)
        if rec is None:
            return struct.pack("!HHHHHH", qid, 0x8400 | rd | 0x0080 | 3, 1, 0, 0, 0) + question
        addrs, ttl = rec
        answers = b""
        count = 0
        for a in addrs:
            fam = socket.AF_INET6 if ":" in a else socket.AF_INET
            t = AAAA if fam == socket.AF_INET6 else A
            if t != qtype:
                continue
            raw = socket.inet_pton(fam, a)
            answers += struct.pack("!HHHIH", 0xC00C, t, 1, ttl, len(raw)) + raw
            count += 1
        return struct.pack("!HHHHHH", qid, 0x8400 | rd | 0x0080, 1, count, 0, 0) + question + answers
