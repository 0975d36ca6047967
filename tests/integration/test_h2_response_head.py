"""The response head an HTTP/2 client gets (SPEC §9): every field of the upstream's head with its
name lower-cased and its value as it was, whatever the name's length and whichever token
characters it has (the HTTP/2 responder lower-cases names a word at a time and hands nghttp2
its own copy of the bytes), this hop's markers, an X-Request-Id, and the same for 1xx heads and
for a §5 error made on the stream. Clients: the raw client of tests/tools/h2raw.py (it decodes
HPACK itself, so a name left in capitals shows) and curl."""

import shutil
import subprocess

import pytest

from harness import make_config
from h2raw import NO_ERROR, H2Raw
from upstream import interim, respond

CURL = shutil.which("curl")
FAST = {"backoff": {"base": "1ms", "max": "2ms"}}

# names of every length from 1 to 40, mixing capitals, small letters, digits and the token
# characters next to the letters in ASCII ('^', '_', '`', '|', '~'), so that every position of
# an 8-byte word and the bytes around 'A'..'Z' and 'a'..'z' are met
TOKEN = "AbZaz09^_`|~-.!#$%&'*+"


def mixed_name(n):
    return "".join(("X" if i == 0 else TOKEN[(i * 7 + n) % len(TOKEN)]) for i in range(n))


def api(up):
    return {"api": {"endpoints": [up], "retry": dict(FAST)}}


def test_every_name_lowercased_values_kept(upstream, rg_factory):
    fields = [("%s%d" % (mixed_name(n), n), "Value-%d MiXeD ~ case" % n) for n in range(1, 41)]
    upstream.set_default(respond(200, headers=fields + [("Content-Type", "Text/Plain")],
                                 body=b"hello"))
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    r = c.response(c.get("/names"))
    assert r.status == 200 and r.body == b"hello", r
    got = dict(r.headers)
    assert len(got) == len(r.headers), r.headers           # no field twice
    for name, value in fields:
        assert got.get(name.lower()) == value, (name, r.headers)
    assert got["content-type"] == "Text/Plain"
    assert got["content-length"] == "5"
    assert got["x-retrygate-attempts"] == "1"
    assert len(got["x-request-id"]) > 0
    assert all(k == k.lower() for k in got), r.headers
    # the same connection again: HPACK's dynamic table now holds the fields that repeat
    r2 = c.response(c.get("/names"))
    assert dict(r2.headers) == {**got, "x-request-id": dict(r2.headers)["x-request-id"]}
    assert dict(r2.headers)["x-request-id"] != got["x-request-id"]


def test_many_streams_each_their_own_head(upstream, rg_factory):
    """Heads of streams in flight together do not share bytes: each keeps its own until sent;
    300 responses on one connection, past the point where the X-Request-Id name is indexed
    in HPACK's table again, each with its own id."""
    upstream.set_default(respond(200, headers=[("X-Long-Header-Name-Of-Forty-Bytes-Each", "v")],
                                 body=b"ok"))
    rg = rg_factory(upstreams=api(upstream))
    c = H2Raw(rg.port)
    for batch in range(15):
        ids = ["req-%03d" % (batch * 20 + i) for i in range(20)]
        sids = [c.get("/s", extra=[("x-request-id", rid)]) for rid in ids]
        for rid, sid in zip(ids, sids):
            r = c.response(sid)
            assert r.status == 200 and r.body == b"ok", r
            assert r.header("x-request-id") == rid
            assert r.header("x-long-header-name-of-forty-bytes-each") == "v"
            assert r.header("x-retrygate-attempts") == "1"


def test_error_made_on_the_stream_lowercase(rg_factory, refusing):
    """A §5 answer retrygate makes itself: its own fields lower-cased too."""
    rg = rg_factory(upstreams={"api": {"endpoints": ["127.0.0.1:%d" % refusing.port],
                                       "retry": {"max_attempts": 1}}})
    c = H2Raw(rg.port)
    r = c.response(c.get("/down", extra=[("x-request-id", "mine-1")]))
    assert r.status == 502, r
    assert r.header("x-retrygate-reason") == "connect-failure"
    assert r.header("x-retrygate-attempts") == "1"
    assert r.header("x-request-id") == "mine-1"
    assert r.header("content-type") == "application/json"
    assert int(r.header("content-length")) == len(r.body)
    assert all(k == k.lower() for k, _ in r.headers), r.headers


@pytest.mark.skipif(not CURL, reason="curl not installed")
def test_103_fields_lowercased_then_final(upstream, rg_factory):
    upstream.push(interim(103, {"Link": "</s.css>; rel=Preload", "X-Early-HINT-Field": "Ab"},
                          final_headers={"X-Final-Field": "Cd"}, body=b"final"))
    rg = rg_factory(upstreams=api(upstream))
    p = subprocess.run([CURL, "-s", "-S", "-i", "--http2-prior-knowledge", rg.url("/early")],
                       capture_output=True, timeout=20)
    assert p.returncode == 0, p.stderr
    out = p.stdout.decode()
    early, _, rest = out.partition("\r\n\r\n")
    assert early.startswith("HTTP/2 103"), out
    assert "link: </s.css>; rel=Preload" in early.split("\r\n")
    assert "x-early-hint-field: Ab" in early.split("\r\n")
    assert rest.startswith("HTTP/2 200"), out
    assert "x-final-field: Cd" in rest.split("\r\n")
    assert rest.endswith("final")


def test_reset_after_response_only_where_due(upstream, rg_factory):
    """SPEC §9: a response that closes (413 over max_body) while its client is still sending
    is followed by RST_STREAM NO_ERROR; streams answered beside it, before and after, end
    normally and are not reset."""
    cfg = make_config(upstreams=api(upstream), listener_limits={"max_body": "1KiB"})
    rg = rg_factory(config=cfg)
    c = H2Raw(rg.port)
    before = [c.get("/a%d" % i) for i in range(3)]
    big = c.get("/big", method="PUT", body=b"y" * 2000, end=False)
    after = [c.get("/b%d" % i) for i in range(3)]
    r = c.response(big)
    assert r.status == 413 and r.header("x-retrygate-reason") == "body-too-large"
    c.pump(lambda: r.reset is not None, timeout=3)
    assert r.reset == NO_ERROR
    for sid in before + after:
        x = c.response(sid)
        assert x.status == 200 and x.ended and x.reset is None, x
    x = c.response(c.get("/later"))
    assert x.status == 200 and x.ended and x.reset is None, x
    assert not c.closed
