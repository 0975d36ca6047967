"""Hostile input, request side (issue 3): SPEC §5 (refusals) and §8 (framing rules), black-box.

Every refused payload asserts: the status, SPEC §5's reason in `X-Retrygate-Reason` and in the
JSON body (`{"error", "upstream", "attempts": 0}`), `X-Retrygate-Attempts: 0`, exactly one
response, that the connection was closed, and that the scripted upstream received nothing (not
even a connection). Payload sources, cited per row:

  RFC 9112 (message syntax, framing, §6.3 ambiguous lengths, §7.1 chunk lines), RFC 9110;
  llhttp / Node.js: CVE-2022-32213 / -32214 / -32215 (bare LF, TE obs-fold), CVE-2022-35256
  (header lines not ended by CRLF), CVE-2023-30589 (bare CR), CVE-2024-22019 (unbounded chunk
  extensions), CVE-2024-27982 (space before the first header: CL obfuscation);
  HAProxy CVE-2023-25725 (empty header name);
  request-smuggling research (Linhart et al. 2005, Kettle 2019 "HTTP Desync Attacks": CL.TE,
  TE.CL, TE.TE obfuscations; duplicate CL; underscore framing headers).

The payloads run against one retrygate (defaults, limits as SPEC §2) in front of one upstream
that must never see a connection; valid look-alikes (positive controls) run against another.
"""

import json
import time

import pytest

from harness import (RawConn, Retrygate, Upstream, make_config, parse_response,
                     parse_responses, raw_request, respond)

pytestmark = pytest.mark.timeout(60)

H = b"Host: a\r\n"
KIB = 1024


# ------------------------------------------------------------------------------- fixtures

class Gate:
    def __init__(self, rg, up):
        self.rg = rg
        self.up = up


def _gate(tmp_path_factory, name, **kw):
    up = Upstream(name=name)
    rg = Retrygate(make_config(upstreams={"up": {"endpoints": [up],
                                                 "retry": {"backoff": {"base": "1ms",
                                                                       "max": "2ms"}}}},
                               **kw),
                   workdir=tmp_path_factory.mktemp(name))
    return Gate(rg, up)


def _finish(g):
    problems = g.rg.finish()
    g.up.close()
    if problems:
        pytest.fail("retrygate (%s): %s" % (g.rg.workdir, "\n".join(problems)), pytrace=False)


@pytest.fixture(scope="module")
def refusing_gate(tmp_path_factory):
    """retrygate with the default limits; its upstream must never be contacted."""
    g = _gate(tmp_path_factory, "never")
    yield g
    try:
        assert g.up.connections == 0, "the upstream was contacted: %r" % (g.up.requests,)
    finally:
        _finish(g)


@pytest.fixture(scope="module")
def open_gate(tmp_path_factory):
    """retrygate with the default limits, for valid look-alikes."""
    g = _gate(tmp_path_factory, "ok")
    yield g
    _finish(g)


# ------------------------------------------------------------------------------- helpers

def check_refusal(gate, payload, status, reason, read_timeout=3.0):
    """Send payload on a fresh connection: one response made by retrygate, the connection
    closed, nothing at the upstream. Returns the response."""
    before = gate.up.connections
    data, closed = raw_request(gate.rg.port, payload, read_timeout=read_timeout)
    assert data, "no response at all to %r (closed=%s)" % (payload[:120], closed)
    r = parse_response(data)
    assert r.status == status, (r, r.body, payload[:200])
    assert r.headers.get("X-Retrygate-Reason") == reason, r.headers
    assert r.headers.get("X-Retrygate-Attempts") == "0", r.headers
    assert "json" in (r.headers.get("Content-Type") or ""), r.headers
    doc = json.loads(r.body)
    assert doc["error"] == reason and doc["attempts"] == 0 and "upstream" in doc, doc
    assert r.raw == data, "more than one response: %r" % data
    assert closed, "connection left open after a %d refusal" % status
    assert gate.rg.running, "retrygate died on %r" % payload[:200]
    # anything forwarded would have reached the upstream before the refusal came back
    time.sleep(0.02)
    assert gate.up.connections == before, "upstream contacted: %r" % gate.up.requests[-3:]
    return r


def post_chunked(chunks, extra=b"", version=b"HTTP/1.1"):
    return (b"POST /c " + version + b"\r\n" + H + extra +
            b"Transfer-Encoding: chunked\r\n\r\n" + chunks)


def headers_n(n, prefix=b"X-H"):
    return b"".join(b"%s%d: v\r\n" % (prefix, i) for i in range(n))


LONG_TARGET = b"/" + b"a" * (8 * KIB)            # 8 KiB + 1: over the default max_uri_bytes
BIG_HEADER = b"X-Big: " + b"b" * (33 * KIB) + b"\r\n"   # the head over the default 32 KiB
LINES_101 = headers_n(100)                       # with Host: 101 header lines

# (id, payload, status, reason) -- the reason follows from the status (SPEC §5)
REASONS = {400: "bad-request", 414: "uri-too-long", 431: "headers-too-large",
           501: "not-implemented", 505: "version-not-supported"}

CASES = [
    # --- bare LF / bare CR (RFC 9112 §2.2; CVE-2022-32214, CVE-2022-35256, CVE-2023-30589)
    ("bare-LF-ends-request-line", b"GET / HTTP/1.1\n" + H + b"\r\n", 400),
    ("bare-LF-ends-every-line", b"GET / HTTP/1.1\nHost: a\n\n", 400),
    ("bare-LF-ends-a-header", b"GET / HTTP/1.1\r\nHost: a\nX: b\r\n\r\n", 400),
    ("bare-LF-ends-the-head", b"GET / HTTP/1.1\r\n" + H + b"\n", 400),
    ("bare-LF-hides-TE", b"POST / HTTP/1.1\r\n" + H + b"X: y\nTransfer-Encoding: chunked\r\n"
     b"Content-Length: 3\r\n\r\n0\r\n\r\n", 400),
    ("bare-LF-before-request-line", b"\nGET / HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("bare-CR-in-header-value", b"GET / HTTP/1.1\r\n" + H + b"X: a\rb\r\n\r\n", 400),
    ("bare-CR-ends-a-header", b"GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n", 400),
    ("bare-CR-hides-CL", b"POST / HTTP/1.1\r\n" + H + b"X: y\rContent-Length: 5\r\n\r\nhello",
     400),
    ("bare-CR-in-request-line", b"GET /\r HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("bare-CR-before-request-line", b"\rGET / HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("CR-CR-LF-ends-request-line", b"GET / HTTP/1.1\r\r\n" + H + b"\r\n", 400),
    ("bare-LF-ends-chunk-size", post_chunked(b"5\nhello\r\n0\r\n\r\n"), 400),
    ("bare-LF-ends-chunk-data", post_chunked(b"5\r\nhello\n0\r\n\r\n"), 400),
    ("bare-CR-ends-chunk-data", post_chunked(b"5\r\nhello\r0\r\n\r\n"), 400),
    ("bare-LF-ends-last-chunk", post_chunked(b"0\n\r\n"), 400),
    ("bare-CR-in-chunk-extension", post_chunked(b"5;a=b\rc\r\nhello\r\n0\r\n\r\n"), 400),
    ("bare-LF-in-trailers", post_chunked(b"0\r\nX: y\n\r\n"), 400),
    # --- obs-fold (RFC 9112 §5.2; CVE-2022-32215: multi-line Transfer-Encoding)
    ("obs-fold-SP", b"GET / HTTP/1.1\r\n" + H + b"X: a\r\n b\r\n\r\n", 400),
    ("obs-fold-HTAB", b"GET / HTTP/1.1\r\n" + H + b"X: a\r\n\tb\r\n\r\n", 400),
    ("obs-fold-TE-value-on-next-line", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding:\r\n chunked\r\n\r\n0\r\n\r\n", 400),
    ("obs-fold-continues-TE", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: chunked\r\n , identity\r\n\r\n0\r\n\r\n", 400),
    ("obs-fold-after-CL", b"POST / HTTP/1.1\r\n" + H +
     b"Content-Length: 5\r\n 0\r\n\r\nhello", 400),
    ("obs-fold-in-trailer", post_chunked(b"0\r\nX: a\r\n b\r\n\r\n"), 400),
    # --- whitespace before the first header / before the colon (CVE-2024-27982, RFC 9112 §2.2, §5.1)
    ("space-before-first-header", b"GET / HTTP/1.1\r\n Host: a\r\n\r\n", 400),
    ("space-before-first-header-CL", b"POST / HTTP/1.1\r\n Content-Length: 5\r\n" + H +
     b"\r\nhello", 400),
    ("tab-before-first-header-TE", b"POST / HTTP/1.1\r\n\tTransfer-Encoding: chunked\r\n" + H +
     b"\r\n0\r\n\r\n", 400),
    ("space-before-colon", b"GET / HTTP/1.1\r\nHost : a\r\n\r\n", 400),
    ("space-before-colon-TE", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n", 400),
    ("tab-before-colon-CL", b"POST / HTTP/1.1\r\n" + H + b"Content-Length\t: 5\r\n\r\nhello", 400),
    # --- empty header name (HAProxy CVE-2023-25725)
    ("empty-header-name", b"GET / HTTP/1.1\r\n" + H + b": x\r\n\r\n", 400),
    ("empty-header-name-then-CL", b"POST / HTTP/1.1\r\n" + H + b":\r\nContent-Length: 5\r\n\r\n"
     b"hello", 400),
    ("empty-name-hides-CL", b"POST / HTTP/1.1\r\n" + H + b": Content-Length: 5\r\n\r\nhello", 400),
    # --- CL.TE / TE.CL (RFC 9112 §6.3: both present is refused here)
    ("CL.TE", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 13\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nSMUGGLED", 400),
    ("TE.CL", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n"
     b"Content-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n", 400),
    ("CL.TE-identity", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 3\r\n"
     b"Transfer-Encoding: identity\r\n\r\nabc", 400),
    ("CL-zero.TE", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    # --- TE.TE obfuscations (Kettle 2019)
    ("TE-xchunked", post_chunked(b"0\r\n\r\n").replace(b"chunked\r\n\r\n", b"xchunked\r\n\r\n"),
     400),
    ("TE-chunkedx", post_chunked(b"0\r\n\r\n").replace(b"chunked\r\n\r\n", b"chunkedx\r\n\r\n"),
     400),
    ("TE-vertical-tab", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding:\x0bchunked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("TE-form-feed-after", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\x0c\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("TE-quoted", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: \"chunked\"\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("TE-NUL-inside", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: chun\x00ked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("TE-non-ASCII", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: \xc4\x8dhunked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("TE-chunked-twice-two-lines", post_chunked(b"0\r\n\r\n",
                                                extra=b"Transfer-Encoding: chunked\r\n"), 400),
    ("TE-chunked-twice-one-line", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n", 400),
    ("TE-chunked-case-twice", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: Chunked\r\nTransfer-Encoding: CHUNKED\r\n\r\n0\r\n\r\n", 400),
    ("TE-then-identity-line", post_chunked(b"0\r\n\r\n") .replace(
        b"Transfer-Encoding: chunked\r\n", b"Transfer-Encoding: chunked\r\n"
        b"Transfer-Encoding: identity\r\n"), 400),
    ("TE-empty-element-first", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: , chunked\r\n\r\n0\r\n\r\n", 400),
    ("TE-empty-element-last", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: chunked,\r\n\r\n0\r\n\r\n", 400),
    ("TE-empty-element-middle", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: gzip,,chunked\r\n\r\n0\r\n\r\n", 400),
    ("TE-chunked-then-identity", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n", 400),
    ("TE-chunked-then-gzip", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: chunked, gzip\r\n\r\n0\r\n\r\n", 400),
    ("TE-identity", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: identity\r\n\r\n", 400),
    ("TE-gzip-alone", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n\r\nxyz", 400),
    ("TE-empty", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding:\r\n\r\n", 400),
    ("TE-blank", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding:    \r\n\r\n", 400),
    ("TE-on-HTTP/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("TE-on-HTTP/1.0-with-Host", post_chunked(b"0\r\n\r\n", version=b"HTTP/1.0"), 400),
    ("TE-gzip-chunked-on-HTTP/1.0", b"POST / HTTP/1.0\r\nTransfer-Encoding: gzip, chunked\r\n"
     b"\r\n0\r\n\r\n", 400),
    # --- transfer-codings before chunked: 501 (SPEC §5)
    ("TE-gzip-chunked", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip, chunked\r\n\r\n"
     b"0\r\n\r\n", 501),
    ("TE-gzip-then-chunked-lines", b"POST / HTTP/1.1\r\n" + H + b"Transfer-Encoding: gzip\r\n"
     b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 501),
    ("TE-deflate-chunked-mixed-case", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: DEFLATE , Chunked\r\n\r\n0\r\n\r\n", 501),
    # --- Content-Length: repeated, differing, malformed (RFC 9110 §8.6, RFC 9112 §6.3)
    ("CL-repeated-identical", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n"
     b"Content-Length: 5\r\n\r\nhello", 400),
    ("CL-differing", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n"
     b"Content-Length: 3\r\n\r\nhello", 400),
    ("CL-list", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5, 5\r\n\r\nhello", 400),
    ("CL-plus", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: +5\r\n\r\nhello", 400),
    ("CL-negative", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: -1\r\n\r\n", 400),
    ("CL-hex", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 0x5\r\n\r\nhello", 400),
    ("CL-inner-space", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 1 2\r\n\r\nhello", 400),
    ("CL-trailing-junk", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5a\r\n\r\nhello", 400),
    ("CL-empty", b"POST / HTTP/1.1\r\n" + H + b"Content-Length:\r\n\r\n", 400),
    ("CL-overflow", b"POST / HTTP/1.1\r\n" + H +
     b"Content-Length: 99999999999999999999999\r\n\r\nx", 400),
    # --- underscore spellings of the framing headers (SPEC §8)
    ("Transfer_Encoding", b"POST / HTTP/1.1\r\n" + H + b"Transfer_Encoding: chunked\r\n\r\n"
     b"0\r\n\r\n", 400),
    ("Content_Length", b"POST / HTTP/1.1\r\n" + H + b"Content_Length: 5\r\n\r\nhello", 400),
    ("content_length-lower", b"POST / HTTP/1.1\r\n" + H + b"content_length: 5\r\n\r\nhello", 400),
    ("TRANSFER_ENCODING-upper", b"POST / HTTP/1.1\r\n" + H +
     b"TRANSFER_ENCODING: chunked\r\n\r\n0\r\n\r\n", 400),
    ("Content_Length-with-CL", b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\n"
     b"Content_Length: 0\r\n\r\nhello", 400),
    # --- chunk lines over 4 KiB (CVE-2024-22019; SPEC §8)
    ("chunk-extension-5KiB", post_chunked(b"1;" + b"a" * (5 * KIB) + b"\r\nx\r\n0\r\n\r\n"), 400),
    ("chunk-many-extensions", post_chunked(b"1" + b";a=b" * 1200 + b"\r\nx\r\n0\r\n\r\n"), 400),
    ("chunk-size-zero-padded-5KiB", post_chunked(b"0" * (5 * KIB) + b"1\r\nx\r\n0\r\n\r\n"), 400),
    ("last-chunk-extension-5KiB", post_chunked(b"0;" + b"e" * (5 * KIB) + b"\r\n\r\n"), 400),
    ("second-chunk-extension-5KiB", post_chunked(b"1\r\nx\r\n1;" + b"a" * (5 * KIB) +
                                                 b"\r\ny\r\n0\r\n\r\n"), 400),
    # --- other chunked framing errors (RFC 9112 §7.1)
    ("chunk-size-not-hex", post_chunked(b"zz\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-size-0x", post_chunked(b"0x5\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-size-negative", post_chunked(b"-5\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-size-empty", post_chunked(b"\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-size-overflow", post_chunked(b"10000000000000000\r\nx\r\n0\r\n\r\n"), 400),
    ("chunk-data-longer-than-size", post_chunked(b"3\r\nhello\r\n0\r\n\r\n"), 400),
    ("chunk-size-space-inside", post_chunked(b"1 0\r\n" + b"x" * 16 + b"\r\n0\r\n\r\n"), 400),
    ("control-byte-in-chunk-extension", post_chunked(b"5;a=\x01\r\nhello\r\n0\r\n\r\n"), 400),
    ("space-before-trailer-colon", post_chunked(b"0\r\nX : y\r\n\r\n"), 400),
    # --- request target (SPEC §8; RFC 9112 §3.2)
    ("fragment", b"GET /a#frag HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("fragment-alone", b"GET /# HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("fragment-in-absolute-form", b"GET http://a/x#y HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("control-byte-in-target", b"GET /a\x01b HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("NUL-in-target", b"GET /a\x00b HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("DEL-in-target", b"GET /a\x7fb HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("tab-in-target", b"GET /a\tb HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("space-in-target", b"GET /a b HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("non-ASCII-UTF8-in-target", b"GET /caf\xc3\xa9 HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("non-ASCII-latin1-in-target", b"GET /\xff HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("non-ASCII-0x80-in-query", b"GET /?q=\x80 HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("star-GET", b"GET * HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("star-HEAD", b"HEAD * HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("star-POST", b"POST * HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n", 400),
    ("star-DELETE", b"DELETE * HTTP/1.1\r\n" + H + b"\r\n", 400),
    # the HTTP/2 preface is HTTP/2 on a listener with http2: true (SPEC §9); with http2: false
    # it is refused 400: test_h2_client.py::test_http2_false_refuses_preface
    # --- absolute-form authority vs Host (SPEC §8; RFC 9112 §3.2.2)
    ("absolute-form-other-host", b"GET http://evil.example/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("absolute-form-other-port", b"GET http://a:8080/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("absolute-form-Host-has-port", b"GET http://a/ HTTP/1.1\r\nHost: a:8080\r\n\r\n", 400),
    ("absolute-form-https-default-is-443", b"GET https://a/ HTTP/1.1\r\nHost: a:80\r\n\r\n", 400),
    ("absolute-form-userinfo", b"GET http://a@evil.example/ HTTP/1.1\r\n"
     b"Host: evil.example\r\n\r\n", 400),
    ("absolute-form-other-host-HTTP/1.0", b"GET http://evil.example/ HTTP/1.0\r\n" + H + b"\r\n",
     400),
    # --- Host (SPEC §8)
    ("Host-missing-HTTP/1.1", b"GET / HTTP/1.1\r\nX: y\r\n\r\n", 400),
    ("Host-repeated-identical", b"GET / HTTP/1.1\r\n" + H + H + b"\r\n", 400),
    ("Host-repeated-differing", b"GET / HTTP/1.1\r\nHost: a\r\nhost: evil.example\r\n\r\n", 400),
    ("Host-repeated-HTTP/1.0", b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n", 400),
    ("Host-with-space", b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
    ("Host-with-path", b"GET / HTTP/1.1\r\nHost: a/b\r\n\r\n", 400),
    ("Host-list", b"GET / HTTP/1.1\r\nHost: a, evil.example\r\n\r\n", 400),
    # --- invalid tokens (RFC 9110 §5.1, §9.1)
    ("separator-in-method", b"G(T / HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("NUL-before-method", b"\x00GET / HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("separator-in-header-name", b"GET / HTTP/1.1\r\n" + H + b"X(y): z\r\n\r\n", 400),
    ("space-in-header-name", b"GET / HTTP/1.1\r\n" + H + b"X y: z\r\n\r\n", 400),
    ("non-ASCII-header-name", b"GET / HTTP/1.1\r\n" + H + b"X\xe9: z\r\n\r\n", 400),
    ("header-line-without-colon", b"GET / HTTP/1.1\r\n" + H + b"Foo\r\n\r\n", 400),
    ("NUL-in-header-value", b"GET / HTTP/1.1\r\n" + H + b"X: a\x00b\r\n\r\n", 400),
    ("control-byte-in-header-value", b"GET / HTTP/1.1\r\n" + H + b"X: a\x01b\r\n\r\n", 400),
    ("DEL-in-header-value", b"GET / HTTP/1.1\r\n" + H + b"X: a\x7fb\r\n\r\n", 400),
    ("two-spaces-after-method", b"GET  / HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("tab-after-method", b"GET\t/ HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("two-spaces-before-version", b"GET /  HTTP/1.1\r\n" + H + b"\r\n", 400),
    ("space-after-version", b"GET / HTTP/1.1 \r\n" + H + b"\r\n", 400),
    ("relative-target", b"GET foo HTTP/1.1\r\n" + H + b"\r\n", 400),
    # --- versions (SPEC §5)
    ("version-HTTP/2.0", b"GET / HTTP/2.0\r\n" + H + b"\r\n", 505),
    ("version-HTTP/1.2", b"GET / HTTP/1.2\r\n" + H + b"\r\n", 505),
    ("version-HTTP/0.9", b"GET / HTTP/0.9\r\n" + H + b"\r\n", 505),
    ("version-HTTP/3.0", b"GET / HTTP/3.0\r\n" + H + b"\r\n", 505),
    ("version-HTTP/9.9", b"GET / HTTP/9.9\r\n" + H + b"\r\n", 505),
    ("version-lower-case", b"GET / http/1.1\r\n" + H + b"\r\n", 400),
    ("version-no-minor", b"GET / HTTP/1\r\n" + H + b"\r\n", 400),
    ("version-none", b"GET /\r\n" + H + b"\r\n", 400),
    ("version-two-digit-minor", b"GET / HTTP/1.10\r\n" + H + b"\r\n", 400),
    ("version-leading-zero", b"GET / HTTP/01.1\r\n" + H + b"\r\n", 400),
    ("version-HTTPS", b"GET / HTTPS/1.1\r\n" + H + b"\r\n", 400),
    ("version-space-inside", b"GET / HTTP/ 1.1\r\n" + H + b"\r\n", 400),
    ("version-1.1.1", b"GET / HTTP/1.1.1\r\n" + H + b"\r\n", 400),
    # --- methods (SPEC §5: CONNECT and methods outside RFC 9110 / PATCH / RFC 4918)
    ("CONNECT", b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n\r\n", 501),
    ("unknown-method", b"FOO / HTTP/1.1\r\n" + H + b"\r\n", 501),
    ("lower-case-get", b"get / HTTP/1.1\r\n" + H + b"\r\n", 501),
    ("PURGE", b"PURGE / HTTP/1.1\r\n" + H + b"\r\n", 501),
    ("SEARCH", b"SEARCH / HTTP/1.1\r\n" + H + b"\r\n", 501),
    ("QUERY", b"QUERY / HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n", 501),
    ("M-SEARCH", b"M-SEARCH / HTTP/1.1\r\n" + H + b"\r\n", 501),
    ("long-unknown-method", b"X" * 100 + b" / HTTP/1.1\r\n" + H + b"\r\n", 501),
    # --- sizes: 414, 431 (SPEC §2 limits, §5)
    ("target-over-8KiB", b"GET " + LONG_TARGET + b" HTTP/1.1\r\n" + H + b"\r\n", 414),
    ("target-over-32KiB-head", b"GET /" + b"a" * (40 * KIB) + b" HTTP/1.1\r\n" + H + b"\r\n",
     414),
    ("head-over-32KiB", b"GET / HTTP/1.1\r\n" + H + BIG_HEADER + b"\r\n", 431),
    ("head-over-32KiB-many-lines", b"GET / HTTP/1.1\r\n" + H +
     b"".join(b"X-%d: %s\r\n" % (i, b"v" * 400) for i in range(90)) + b"\r\n", 431),
    ("101-header-lines", b"GET / HTTP/1.1\r\n" + H + LINES_101 + b"\r\n", 431),
    ("thousand-header-lines", b"GET / HTTP/1.1\r\n" + H + headers_n(1000) + b"\r\n", 431),
    # --- precedence: 400 > 414/431 > 501/505 (SPEC §8), 414 before the head size (§5)
    ("prec-414-then-bare-LF", b"GET " + LONG_TARGET + b" HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", 400),
    ("prec-414-then-CL.TE", b"POST " + LONG_TARGET + b" HTTP/1.1\r\n" + H +
     b"Content-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
    ("prec-414-with-fragment-at-end", b"GET " + LONG_TARGET + b"#f HTTP/1.1\r\n" + H + b"\r\n",
     400),
    ("prec-431-lines-then-obs-fold", b"GET / HTTP/1.1\r\n" + H + LINES_101 +
     b"X: a\r\n b\r\n\r\n", 400),
    ("prec-431-lines-then-duplicate-CL", b"POST / HTTP/1.1\r\n" + H + LINES_101 +
     b"Content-Length: 1\r\nContent-Length: 1\r\n\r\nx", 400),
    ("prec-431-lines-then-missing-Host", b"GET / HTTP/1.1\r\n" + LINES_101 + b"\r\n", 400),
    ("prec-431-lines-then-abs-form-mismatch", b"GET http://evil.example/ HTTP/1.1\r\n" + H +
     LINES_101 + b"\r\n", 400),
    ("prec-501-then-bare-LF", b"FOO / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n", 400),
    ("prec-501-then-missing-Host", b"FOO / HTTP/1.1\r\nX: y\r\n\r\n", 400),
    ("prec-CONNECT-then-two-Hosts", b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\nHost: b\r\n\r\n",
     400),
    ("prec-501-gzip-chunked-then-dup-CL", b"POST / HTTP/1.1\r\n" + H +
     b"Transfer-Encoding: gzip, chunked\r\nContent-Length: 1\r\n\r\n0\r\n\r\n", 400),
    ("prec-505-then-obs-fold", b"GET / HTTP/2.0\r\n" + H + b"X: a\r\n b\r\n\r\n", 400),
    ("prec-505-then-fragment", b"GET /#x HTTP/1.2\r\n" + H + b"\r\n", 400),
    ("prec-505-then-TE-not-chunked", b"POST / HTTP/1.2\r\n" + H +
     b"Transfer-Encoding: gzip\r\n\r\n", 400),
    ("prec-505-then-underscore", b"GET / HTTP/2.0\r\n" + H + b"Content_Length: 0\r\n\r\n", 400),
    ("prec-501-with-414", b"FOO " + LONG_TARGET + b" HTTP/1.1\r\n" + H + b"\r\n", 414),
    ("prec-505-with-414", b"GET " + LONG_TARGET + b" HTTP/2.0\r\n" + H + b"\r\n", 414),
    ("prec-501-with-431", b"FOO / HTTP/1.1\r\n" + H + LINES_101 + b"\r\n", 431),
    ("prec-505-with-431", b"GET / HTTP/1.2\r\n" + H + LINES_101 + b"\r\n", 431),
    ("prec-CONNECT-with-431", b"CONNECT a:443 HTTP/1.1\r\nHost: a:443\r\n" + BIG_HEADER + b"\r\n",
     431),
    ("prec-gzip-chunked-with-431", b"POST / HTTP/1.1\r\n" + H + LINES_101 +
     b"Transfer-Encoding: gzip, chunked\r\n\r\n0\r\n\r\n", 431),
    ("prec-414-before-431", b"GET " + LONG_TARGET + b" HTTP/1.1\r\n" + H + BIG_HEADER + b"\r\n",
     414),
    ("prec-414-before-431-lines", b"GET " + LONG_TARGET + b" HTTP/1.1\r\n" + H + LINES_101 +
     b"\r\n", 414),
]


@pytest.mark.parametrize("payload,status", [pytest.param(p, s, id=i) for i, p, s in CASES])
def test_refused_payload(refusing_gate, payload, status):
    check_refusal(refusing_gate, payload, status, REASONS[status])


@pytest.mark.parametrize("payload,status", [
    pytest.param(p, s, id=i) for i, p, s in CASES
    if i in ("CL.TE", "TE.CL", "obs-fold-continues-TE", "bare-CR-hides-CL", "101-header-lines",
             "TE-gzip-chunked", "version-HTTP/2.0", "chunk-extension-5KiB")])
def test_refused_payload_sent_byte_by_byte(refusing_gate, payload, status):
    """The same verdict when the bytes trickle in one at a time (no reliance on one read)."""
    with RawConn(refusing_gate.rg.port) as c:
        for i in range(len(payload)):
            try:
                c.send(payload[i:i + 1])
            except OSError:
                break
        data, closed = c.read_until_close(timeout=5)
    r = parse_response(data) if data else None
    assert r is not None and r.status == status, (r, data[:300])
    assert r.headers.get("X-Retrygate-Reason") == REASONS[status]
    assert closed
    assert refusing_gate.up.connections == 0


def test_refusal_after_a_valid_request_on_the_same_connection(open_gate):
    """A keep-alive connection that sends a smuggling payload after a valid exchange: the first
    is served, the second refused with a close, and nothing of it reaches the upstream."""
    g = open_gate
    n0 = len(g.up.requests)
    with RawConn(g.rg.port) as c:
        c.send(b"GET /first HTTP/1.1\r\n" + H + b"\r\n")
        r = c.read_response()
        assert r.status == 200
        c.send(b"POST /second HTTP/1.1\r\n" + H + b"Content-Length: 4\r\n"
               b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /smuggled HTTP/1.1\r\n" + H +
               b"\r\n")
        r2 = c.read_response()
        assert r2.status == 400 and r2.headers["X-Retrygate-Reason"] == "bad-request"
        assert r2.headers["X-Retrygate-Attempts"] == "0"
        assert c.wait_closed(3)
        assert c.recv_some(0.2) == b""
    time.sleep(0.1)
    assert [q.target for q in g.up.requests[n0:]] == ["/first"]


def test_bytes_after_a_refused_head_are_never_parsed(refusing_gate):
    """A refused request followed by a second request in the same write: one 400, a close,
    and the second is never forwarded (RFC 9112 §6.3: the connection cannot be resynced)."""
    payload = (b"POST / HTTP/1.1\r\n" + H + b"Content-Length: 5\r\nContent-Length: 5\r\n\r\n"
               b"GET /smuggled HTTP/1.1\r\n" + H + b"\r\n")
    r = check_refusal(refusing_gate, payload, 400, "bad-request")
    assert r.body.count(b"bad-request") == 1


# ------------------------------------------------------------------------------- pipelining

def _expect_pair_then_refusal(g, third, n_valid=2, first_two=None):
    n0 = len(g.up.requests)
    first_two = first_two or (b"GET /1 HTTP/1.1\r\n" + H + b"\r\n" +
                              b"GET /2 HTTP/1.1\r\n" + H + b"\r\n")
    data, closed = raw_request(g.rg.port, first_two + third, read_timeout=3)
    rs = parse_responses(data)
    assert [r.status for r in rs] == [200] * n_valid + [400], data[-600:]
    last = rs[-1]
    assert last.headers["X-Retrygate-Reason"] == "bad-request"
    assert last.headers["X-Retrygate-Attempts"] == "0"
    assert sum(len(r.raw) for r in rs) == len(data), "bytes after the refusal"
    assert closed
    time.sleep(0.1)
    got = g.up.requests[n0:]
    for q in got:
        assert b"/smuggled" not in q.raw_head, q.raw_head
    return got


SMUGGLE = b"GET /smuggled HTTP/1.1\r\n" + H + b"\r\n"


@pytest.mark.parametrize("third", [
    pytest.param(b"POST /3 HTTP/1.1\r\n" + H + b"Content-Length: 4\r\nTransfer-Encoding: chunked"
                 b"\r\n\r\n0\r\n\r\n" + SMUGGLE, id="CL.TE"),
    pytest.param(b"POST /3 HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\nContent-Length: 4"
                 b"\r\n\r\n%x\r\n" % len(SMUGGLE) + SMUGGLE + b"\r\n0\r\n\r\n", id="TE.CL"),
    pytest.param(b"POST /3 HTTP/1.1\r\n" + H + b"Transfer-Encoding: xchunked\r\n"
                 b"Content-Length: 0\r\n\r\n" + SMUGGLE, id="TE.TE"),
    pytest.param(b"POST /3 HTTP/1.1\r\n" + H + b"Content-Length: 0\r\nContent-Length: %d\r\n\r\n"
                 % len(SMUGGLE) + SMUGGLE, id="duplicate-CL"),
    pytest.param(b"POST /3 HTTP/1.1\r\n" + H + b"Transfer-Encoding:\r\n chunked\r\n\r\n"
                 b"0\r\n\r\n" + SMUGGLE, id="obs-fold-TE"),
    pytest.param(b"GET /3 HTTP/1.1\r\n" + H + b"X: y\nContent-Length: %d\r\n\r\n"
                 % len(SMUGGLE) + SMUGGLE, id="bare-LF-CL"),
    pytest.param(b"GET /3 HTTP/1.1\r\n" + H + b": x\r\nContent-Length: %d\r\n\r\n"
                 % len(SMUGGLE) + SMUGGLE, id="empty-name"),
    pytest.param(b"POST /3 HTTP/1.1\r\n" + H + b"Transfer_Encoding: chunked\r\n"
                 b"Content-Length: 5\r\n\r\n0\r\n\r\n" + SMUGGLE, id="underscore-TE"),
    pytest.param(b"POST /3 HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n"
                 b"1;" + b"a" * 5000 + b"\r\nx\r\n0\r\n\r\n" + SMUGGLE, id="chunk-extension"),
])
def test_valid_pipelined_pair_then_smuggled_third(open_gate, third):
    got = _expect_pair_then_refusal(open_gate, third)
    assert [q.target for q in got] == ["/1", "/2"]


def test_pipelined_bodies_carrying_requests_are_bodies(open_gate):
    """A valid Content-Length body and a valid chunked body whose bytes look like requests are
    forwarded as bodies (re-framed), then a smuggling third is refused; /smuggled never
    reaches the upstream as a request."""
    fake = b"0\r\n\r\n" + SMUGGLE
    pair = (b"POST /1 HTTP/1.1\r\n" + H + b"Content-Length: %d\r\n\r\n" % len(fake) + fake +
            b"POST /2 HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n" +
            b"%x\r\n" % len(SMUGGLE) + SMUGGLE + b"\r\n0\r\n\r\n")
    third = (b"POST /3 HTTP/1.1\r\n" + H + b"Content-Length: 1\r\nTransfer-Encoding: chunked"
             b"\r\n\r\n0\r\n\r\n" + SMUGGLE)
    got = _expect_pair_then_refusal(open_gate, third, first_two=pair)
    assert [q.target for q in got] == ["/1", "/2"]
    assert got[0].body == fake and got[1].body == SMUGGLE
    # re-serialized: the upstream saw framing computed by retrygate, not the client's
    assert got[1].framing in ("length", "chunked")


def test_pipelined_valid_requests_are_each_reframed(open_gate):
    """Three valid pipelined requests, the last with a zero-length body and a trailing CRLF
    pair: exactly three requests at the upstream, in order."""
    g = open_gate
    n0 = len(g.up.requests)
    payload = (b"GET /a HTTP/1.1\r\n" + H + b"\r\n" +
               b"POST /b HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n" +
               b"PUT /c HTTP/1.1\r\n" + H + b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    with RawConn(g.rg.port) as c:
        c.send(payload)
        rs = [c.read_response() for _ in range(3)]
        assert [r.status for r in rs] == [200, 200, 200]
        assert c.recv_some(0.2) == b""
    time.sleep(0.05)
    assert [(q.method, q.target) for q in g.up.requests[n0:]] == [
        ("GET", "/a"), ("POST", "/b"), ("PUT", "/c")]


# ------------------------------------------------------------------------------- look-alikes

def _served(g, payload, method="GET"):
    n0 = len(g.up.requests)
    with RawConn(g.rg.port) as c:
        c.send(payload)
        r = c.read_response(method)
        assert r.status == 200, (r, r.body[:300])
        assert "X-Retrygate-Reason" not in r.headers
    g.up.wait_requests(n0 + 1)
    return g.up.requests[n0]


def test_TE_case_insensitive_and_OWS_accepted(open_gate):
    q = _served(open_gate, b"POST /u HTTP/1.1\r\n" + H + b"Transfer-Encoding:\tCHUNKED\r\n\r\n"
                b"5\r\nhello\r\n0\r\n\r\n")
    assert q.body == b"hello"
    assert q.header("Transfer-Encoding") in (None, "chunked")


def test_chunk_line_up_to_4KiB_accepted_extension_dropped(open_gate):
    q = _served(open_gate, post_chunked(b"5;" + b"e" * 4000 + b"\r\nhello\r\n0;x=y\r\nT: v\r\n"
                                        b"\r\n"))
    assert q.body == b"hello"
    assert q.chunk_extensions == [] and q.trailers == []
    assert b"eeee" not in q.raw_head + q.raw_body


def test_other_underscore_header_forwarded(open_gate):
    q = _served(open_gate, b"GET /u HTTP/1.1\r\n" + H + b"X_Custom_Thing: 1\r\n\r\n")
    assert q.header("X_Custom_Thing") == "1"


def test_exactly_100_header_lines_accepted(open_gate):
    q = _served(open_gate, b"GET /h HTTP/1.1\r\n" + H + headers_n(99) + b"\r\n")
    assert q.header("X-H98") == "v"


def test_target_of_exactly_max_uri_bytes_accepted(open_gate):
    target = b"/" + b"t" * (8 * KIB - 1)
    q = _served(open_gate, b"GET " + target + b" HTTP/1.1\r\n" + H + b"\r\n")
    assert q.target.encode() == target


def test_absolute_form_default_port_equals_host_without_port(open_gate):
    q = _served(open_gate, b"GET http://A:80/x?q=1 HTTP/1.1\r\nHost: a\r\n\r\n")
    assert q.target == "/x?q=1"
    assert q.headers.count("Host") == 1
    q = _served(open_gate, b"GET https://a/y HTTP/1.1\r\nHost: a:443\r\n\r\n")
    assert q.target == "/y"


def test_http10_without_host_accepted(open_gate):
    q = _served(open_gate, b"GET /ten HTTP/1.0\r\n\r\n")
    assert q.target == "/ten"


def test_leading_empty_line_before_request_line_ignored(open_gate):
    """RFC 9112 §2.2: a server SHOULD ignore at least one empty line (CRLF) before the
    request-line."""
    q = _served(open_gate, b"\r\nGET /crlf HTTP/1.1\r\n" + H + b"\r\n")
    assert q.target == "/crlf"


@pytest.mark.parametrize("method", ["PATCH", "PROPFIND", "MKCOL", "LOCK", "OPTIONS", "TRACE"])
def test_served_methods_are_forwarded(open_gate, method):
    q = _served(open_gate, method.encode() + b" /m HTTP/1.1\r\n" + H + b"Content-Length: 0\r\n\r\n")
    assert q.method == method


def test_options_star_is_not_refused(open_gate):
    """SPEC §8: `*` is refused for every method but OPTIONS."""
    with RawConn(open_gate.rg.port) as c:
        c.send(b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n")
        r = c.read_response()
        assert r.status != 400, (r, r.body)
        assert r.headers.get("X-Retrygate-Reason") != "bad-request"
        assert not c.wait_closed(0.3)


def test_options_star_goes_to_the_catch_all_route(open_gate):
    """`OPTIONS *` is about the server as a whole: the route with path_prefix "/" takes it,
    and it is forwarded with its target unchanged."""
    q = _served(open_gate, b"OPTIONS * HTTP/1.1\r\n" + H + b"\r\n")
    assert q.method == "OPTIONS" and q.target == "*"


def test_refusals_never_reach_the_upstream_in_total(refusing_gate):
    """After the whole table: the upstream behind the refusing gate never saw a connection,
    and retrygate is alive and ready."""
    assert refusing_gate.up.connections == 0
    assert refusing_gate.rg.running and refusing_gate.rg.ready() == 200


# ------------------------------------------------------------------------------- limits, streamed

def test_smaller_limit_governs_uri_above_header_bytes(rg_factory, upstream):
    """SPEC §2: max_uri_bytes above max_header_bytes -> the smaller governs; a target too long
    for the head is a 414 (checked before the head size), a long header a 431."""
    rg = rg_factory(upstreams={"up": upstream},
                    listener_limits={"max_header_bytes": "4KiB", "max_uri_bytes": "16KiB"})
    g = Gate(rg, upstream)
    check_refusal(g, b"GET /" + b"u" * (6 * KIB) + b" HTTP/1.1\r\n" + H + b"\r\n", 414,
                  "uri-too-long")
    check_refusal(g, b"GET / HTTP/1.1\r\n" + H + b"X: " + b"v" * (5 * KIB) + b"\r\n\r\n", 431,
                  "headers-too-large")
    check_refusal(g, b"GET /" + b"u" * (3 * KIB) + b" HTTP/1.1\r\n" + H + b"X: " +
                  b"v" * (2 * KIB) + b"\r\n\r\n", 431, "headers-too-large")
    assert upstream.connections == 0


def test_configured_small_limits(rg_factory, upstream):
    rg = rg_factory(upstreams={"up": upstream},
                    listener_limits={"max_header_bytes": "2KiB", "max_uri_bytes": "512B"})
    g = Gate(rg, upstream)
    check_refusal(g, b"GET /" + b"u" * 600 + b" HTTP/1.1\r\n" + H + b"\r\n", 414, "uri-too-long")
    check_refusal(g, b"GET / HTTP/1.1\r\n" + H + b"X: " + b"v" * 2100 + b"\r\n\r\n", 431,
                  "headers-too-large")
    r = rg.request("GET", "/" + "u" * 500, {"Host": "a"})
    assert r.status == 200


def test_bad_chunk_after_streaming_began_never_completes_upstream(rg_factory, upstream):
    """A chunked body larger than retry.max_body is streamed as it comes; a framing error
    after that point: 400 and close for the client, and the upstream never receives a
    complete request (its connection is cut before the last chunk)."""
    rg = rg_factory(upstreams={"up": {"endpoints": [upstream], "retry": {"max_body": "1KiB"}}})
    upstream.set_default(respond(200, read_body=True))
    good = b"".join(b"400\r\n" + b"d" * 1024 + b"\r\n" for _ in range(8))
    bad = b"1;" + b"x" * (5 * KIB) + b"\r\nx\r\n0\r\n\r\n"
    with RawConn(rg.port) as c:
        c.send(post_chunked(good))
        time.sleep(0.3)                 # streaming has begun
        try:
            c.send(bad)
        except OSError:
            pass
        data, closed = c.read_until_close(timeout=5)
    assert closed
    if data:
        r = parse_response(data)
        assert r.status in (400, 502), r
        if r.status == 400:
            assert r.headers["X-Retrygate-Reason"] == "bad-request"
    time.sleep(0.3)
    assert upstream.connections >= 1, "the body was not streamed: the test proves nothing"
    assert upstream.requests and all(not q.complete for q in upstream.requests), \
        upstream.requests
    assert data and parse_response(data).status == 400, data[:300]


def test_never_an_open_proxy(rg_factory, upstream_factory):
    """SPEC §8: only configured upstreams are contacted. An absolute-form target naming
    another server (with a matching Host), or a CONNECT to it, never reaches that server."""
    configured = upstream_factory(name="configured")
    other = upstream_factory(name="other")
    rg = rg_factory(upstreams={"up": configured})
    target = "127.0.0.1:%d" % other.port
    with RawConn(rg.port) as c:
        c.send(b"GET http://%s/secret HTTP/1.1\r\nHost: %s\r\n\r\n" % (target.encode(),
                                                                       target.encode()))
        r = c.read_response()
    assert r.status == 200 and json.loads(r.body)["upstream"] == "configured"
    data, closed = raw_request(rg.port, b"CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n"
                               % (target.encode(), target.encode()), read_timeout=2)
    assert parse_response(data).status == 501 and closed
    time.sleep(0.2)
    assert other.connections == 0
    (q,) = configured.wait_requests(1)
    assert q.target == "/secret"
