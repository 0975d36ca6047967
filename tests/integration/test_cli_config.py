"""SPEC §1 (command line) and §2 (configuration), black-box: the binary's flags, what --check
prints and exits with, that a bad config never starts a process, and that the documented
formats, defaults and overlaps behave as written."""

import re
import socket
import subprocess

import pytest

from harness import (REPO_ROOT, check_config, default_binary, free_port, make_config,
                     run_binary)

pytestmark = pytest.mark.timeout(60)

ERROR_LINE = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): (?P<msg>\S.*)$")
BAD_DIR = REPO_ROOT / "tests" / "conf" / "bad"


def _valid_text(admin_port=None, port=None):
    """A small valid config as text, with known line numbers (see VALID_LINES)."""
    return VALID.format(admin=admin_port or free_port(), port=port or free_port())


# line numbers matter below: keep this text in sync with the mutation table
VALID = """\
admin:
  listen: "127.0.0.1:{admin}"
workers: 1
listeners:
  - name: main
    listen: "127.0.0.1:{port}"
    routes:
      - upstream: api
upstreams:
  api:
    endpoints: ["127.0.0.1:9"]
    connect_timeout: 250ms
    deadline:
      default: 5s
      max: 30s
      min: 5ms
    retry:
      max_attempts: 3
      per_try_timeout: 1s
      backoff: {{ base: 25ms, max: 250ms }}
"""


def _section(out, name):
    """The block of --check output about upstream NAME: from the first unindented line naming
    it (not a route line, "... -> NAME") to the next unindented line."""
    blocks, cur = [], []
    for ln in out.splitlines():
        if ln and not ln[0].isspace() and cur:
            blocks.append(cur)
            cur = []
        cur.append(ln)
    blocks.append(cur)
    for b in blocks:
        if re.search(r"\b%s\b" % re.escape(name), b[0]) and "->" not in b[0]:
            return "\n".join(b)
    raise AssertionError("no section for upstream %s in:\n%s" % (name, out))


def _mutate(text, line_no, new_line):
    lines = text.split("\n")
    lines[line_no - 1] = new_line
    return "\n".join(lines)


def _errors(stderr):
    """Every stderr line parsed as FILE:LINE:COL: message (AssertionError on another line)."""
    out = []
    for ln in stderr.splitlines():
        if not ln.strip():
            continue
        m = ERROR_LINE.match(ln)
        assert m, "stderr line is not FILE:LINE:COL: message: %r" % ln
        out.append((m.group("file"), int(m.group("line")), int(m.group("col")), m.group("msg")))
    return out


# ------------------------------------------------------------------------------- --version

def test_version_prints_name_and_semver():
    cp = run_binary("--version")
    assert cp.returncode == 0, cp
    assert re.fullmatch(r"retrygate \d+\.\d+\.\d+\n", cp.stdout), repr(cp.stdout)
    makefile = (REPO_ROOT / "Makefile").read_text()
    m = re.search(r"^VERSION\s*:?=\s*(\S+)", makefile, re.M)
    if m:
        assert cp.stdout.strip() == "retrygate %s" % m.group(1)


def test_version_needs_no_config(tmp_path):
    # no conf/ lookup happens for --version: it works from any directory with no config at all
    cp = subprocess.run([str(default_binary()), "--version"], cwd=str(tmp_path),
                        capture_output=True, text=True, timeout=10)
    assert cp.returncode == 0 and cp.stdout.startswith("retrygate ")


# ------------------------------------------------------------------------------- --check ok

def test_check_ok_prints_worst_case_per_upstream_then_ok(tmp_path):
    cfg = make_config(upstreams={
        "payments": {"endpoints": ["127.0.0.1:9001"],
                     "retry": {"max_attempts": 4, "per_try_timeout": "200ms",
                               "budget": {"ratio": 0.5, "min_per_second": 10,
                                          "max_tokens": 100}}},
        "ledger": {"endpoints": ["127.0.0.1:9002", "127.0.0.1:9003"],
                   "retry": {"max_attempts": 2, "per_try_timeout": "300ms",
                             "budget": {"ratio": 0.1}}},
    })
    cp = check_config(cfg, workdir=tmp_path)
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout
    lines = out.rstrip("\n").split("\n")
    assert lines[-1] == "%s: ok" % cp.path, out
    assert "error" not in cp.stderr.lower()
    # one section per upstream, each naming its worst case
    for name, attempts, ratio in (("payments", "4", "1.5"), ("ledger", "2", "1.1")):
        section = _section(out, name)
        assert re.search(r"\b%s\b" % attempts, section), (name, section)
        assert ratio in section, "amplification figure %s missing for %s:\n%s" % (
            ratio, name, section)
        assert "deadline" in section, "no latency-vs-deadline line for %s:\n%s" % (name, section)


def test_check_amplification_by_traffic(tmp_path):
    # the budget bound is 1 + ratio + min_per_second / rate, capped at max_attempts: at low
    # traffic the time term dominates, so "1 + ratio" alone would understate it
    cfg = make_config(upstreams={
        "api": {"endpoints": ["127.0.0.1:9001"],
                "retry": {"max_attempts": 3,
                          "budget": {"ratio": 0.1, "min_per_second": 4, "max_tokens": 50}}},
    })
    cp = check_config(cfg, workdir=tmp_path)
    assert cp.returncode == 0, cp.stderr
    section = _section(cp.stdout, "api")
    assert "a burst of 50 retries (max_tokens), never above 3x per request (max_attempts)" \
        in section, section
    assert ("sustained      3.00x at 1 first attempt/s (max_attempts), 1.50x at 10/s, "
            "1.14x at 100/s, 1.10x at 1000/s") in section, section


CHECK_FILES = """\
access_log: {log}
listeners:
  - listen: "127.0.0.1:@PORT@"
    tls: {{ cert: {cert}, key: {key} }}
    routes: [{{ upstream: a }}]
upstreams:
  a:
    endpoints: ["127.0.0.1:9001"]
    tls: {{ ca: {ca} }}
"""


def test_check_reads_every_file_the_config_names(tmp_path):
    # --check opens what startup would: TLS cert/key/CA as PEM, the access log's directory
    key, crt = tmp_path / "k.pem", tmp_path / "c.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
                    "-subj", "/CN=localhost", "-keyout", str(key), "-out", str(crt)],
                   check=True, capture_output=True, timeout=60)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    good = CHECK_FILES.format(log=tmp_path / "access.log", cert=crt, key=key, ca=crt)
    cp = check_config(good, workdir=tmp_path / "good")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.endswith("%s: ok\n" % cp.path)

    bad = CHECK_FILES.format(log=tmp_path / "no" / "dir" / "access.log", cert=junk,
                             key=tmp_path / "missing.pem", ca=key)
    cp = check_config(bad, workdir=tmp_path / "bad")
    assert cp.returncode == 1, cp.stdout
    errs = _errors(cp.stderr)
    got = {(line, msg.split(":")[0]) for _, line, _, msg in errs}
    assert got == {(1, "access_log"), (4, "listeners[0].tls.cert"), (4, "listeners[0].tls.key"),
                   (9, "upstreams.a.tls.ca")}, cp.stderr
    text = cp.stderr
    assert "junk.pem\" does not hold a PEM certificate" in text
    assert "missing.pem\": No such file or directory" in text
    assert "k.pem\" does not hold PEM CA certificates" in text
    assert "directory" in text and "/no/dir" in text


def test_check_latency_line_reflects_attempts_and_deadline(tmp_path):
    # 3 attempts of 1s cannot fit a 2s default deadline: the report must say something about it
    tight = make_config(upstreams={"api": {"endpoints": ["127.0.0.1:9001"],
                                           "deadline": {"default": "2s"},
                                           "retry": {"max_attempts": 3,
                                                     "per_try_timeout": "1s"}}})
    roomy = make_config(upstreams={"api": {"endpoints": ["127.0.0.1:9001"],
                                           "deadline": {"default": "10s"},
                                           "retry": {"max_attempts": 3,
                                                     "per_try_timeout": "1s"}}})
    a = check_config(tight, workdir=tmp_path / "a")
    b = check_config(roomy, workdir=tmp_path / "b")
    assert a.returncode == 0 and b.returncode == 0
    assert a.stdout.rstrip().endswith(": ok") and b.stdout.rstrip().endswith(": ok")
    # the same upstream with a different deadline gives a different latency verdict
    body_a = a.stdout.replace(a.path, "F")
    body_b = b.stdout.replace(b.path, "F")
    assert body_a != body_b
    assert re.search(r"\b3\b", body_a) and ("2s" in body_a)


def test_check_warns_about_unsafe_settings(tmp_path):
    safe = make_config(upstreams={"api": {"endpoints": ["127.0.0.1:9001"]}})
    unsafe = make_config(upstreams={"api": {"endpoints": ["127.0.0.1:9001"],
                                            "retry": {"non_idempotent": "always"}}})
    s = check_config(safe, workdir=tmp_path / "s")
    u = check_config(unsafe, workdir=tmp_path / "u")
    assert s.returncode == 0 and u.returncode == 0, (s.stderr, u.stderr)
    warn_s = [ln for ln in s.stdout.replace(s.path, "F").splitlines() if "warn" in ln.lower()]
    warn_u = [ln for ln in u.stdout.replace(u.path, "F").splitlines() if "warn" in ln.lower()]
    assert not warn_s, warn_s
    assert warn_u and any("non_idempotent" in ln or "always" in ln for ln in warn_u), u.stdout
    assert u.stdout.rstrip().split("\n")[-1] == "%s: ok" % u.path


def test_check_grpc_retry_on_and_idempotent_paths(tmp_path):
    """SPEC §10: retry.on takes the gRPC code names; --check lists them and the
    idempotent_paths of each upstream, and warns when an h2 upstream replays every call."""
    cfg = make_config(upstreams={
        "shop": {"endpoints": ["127.0.0.1:9001"], "protocol": "h2",
                 "retry": {"on": ["reset", "unavailable", "resource-exhausted"],
                           "idempotent_paths": ["/shop.Catalog/", "/shop.Search/"]}},
        "cart": {"endpoints": ["127.0.0.1:9002"], "protocol": "h2",
                 "retry": {"non_idempotent": "always"}},
    })
    cp = check_config(cfg, workdir=tmp_path)
    assert cp.returncode == 0, cp.stderr
    shop = _section(cp.stdout, "shop")
    assert "on reset, resource-exhausted, unavailable;" in shop, shop
    assert "/shop.Catalog/, /shop.Search/" in shop, shop
    assert "/shop.Catalog/" not in _section(cp.stdout, "cart")
    # the warning names the upstream and where non_idempotent was written
    text = open(cp.path).read().split("\n")
    line = next(i + 1 for i, ln in enumerate(text) if "non_idempotent" in ln)
    warn = [ln for ln in cp.stdout.splitlines()
            if ln.startswith("warning: upstreams.cart.retry.non_idempotent: %s:%d:" % (cp.path, line))]
    assert warn and "h2" in warn[0] and "gRPC" in warn[0], cp.stdout
    assert not any("upstreams.shop" in ln for ln in cp.stdout.splitlines()
                   if ln.startswith("warning:")), cp.stdout


@pytest.mark.parametrize("retry,where,msg", [
    ({"on": ["unavailable", "ok"]}, "retry.on", 'gRPC status "ok" is a success'),
    ({"on": ["unavailible"]}, "retry.on", 'did you mean "unavailable"?'),
    ({"on": ["UNAVAILABLE"]}, "retry.on", 'unknown condition "UNAVAILABLE"'),
    ({"idempotent_paths": ["shop.Catalog/"]}, "retry.idempotent_paths",
     'bad path prefix "shop.Catalog/"'),
    ({"idempotent_paths": "/shop.Catalog/"}, "retry.idempotent_paths", "expected"),
    ({"idempotent_path": ["/a/"]}, "retry.idempotent_path", "did you mean idempotent_paths?"),
])
def test_check_rejects_bad_grpc_retry_keys(tmp_path, retry, where, msg):
    cfg = make_config(upstreams={"api": {"endpoints": ["127.0.0.1:9001"], "retry": retry}})
    cp = check_config(cfg, workdir=tmp_path)
    assert cp.returncode == 1, cp.stdout
    errs = _errors(cp.stderr)
    assert len(errs) == 1, cp.stderr
    f, line, col, m = errs[0]
    assert f == cp.path and line > 0 and col > 0
    assert m.startswith("upstreams.api.%s: " % where) and msg in m, m


def test_check_does_not_bind_or_serve(tmp_path):
    port, admin = free_port(), free_port()
    cfg = make_config(upstreams={"api": "127.0.0.1:9001"}, port=port, admin_port=admin)
    # hold the listener's port: --check must not try to bind it
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
        s.listen(1)
        cp = check_config(cfg, workdir=tmp_path)
    assert cp.returncode == 0, cp.stderr


# ------------------------------------------------------------------------------- --check bad

def test_check_reports_every_error_with_line_and_column(tmp_path):
    text = _valid_text()
    # three independent errors on three lines (lines from VALID: 12 connect_timeout,
    # 18 max_attempts, 19 per_try_timeout)
    text = _mutate(text, 12, "    connect_timeout: 0ms")
    text = _mutate(text, 18, "      max_attempts: 0")
    text = _mutate(text, 19, "      per_try_timeout: fast")
    cp = check_config(text, workdir=tmp_path)
    assert cp.returncode == 1, cp
    assert not cp.stdout.rstrip().endswith("ok"), cp.stdout
    errs = _errors(cp.stderr)
    assert {e[0] for e in errs} == {cp.path}, errs
    lines = sorted(e[1] for e in errs)
    assert lines == [12, 18, 19], cp.stderr
    cols = {e[1]: e[2] for e in errs}
    assert cols[12] == len("    connect_timeout: ") + 1
    assert cols[18] == len("      max_attempts: ") + 1
    assert cols[19] == len("      per_try_timeout: ") + 1


MUTATIONS = [
    # (id, line, new line, expected line, expected column or None)
    ("unknown-key", 12, "    conect_timeout: 250ms", 12, 5),
    ("unknown-top-key", 3, "wrokers: 1", 3, 1),
    ("wrong-type-int", 18, "      max_attempts: three", 18, 21),
    ("wrong-type-mapping", 13, "    deadline: 3\n    dl:", 13, 15),
    ("default-above-max", 14, "      default: 40s", 14, None),
    ("min-not-below-default", 16, "      min: 5s", 16, None),
    ("max-attempts-zero", 18, "      max_attempts: 0", 18, 21),
    ("zero-connect-timeout", 12, "    connect_timeout: 0s", 12, 22),
    ("zero-per-try", 19, "      per_try_timeout: 0", 19, 24),
    ("backoff-base-above-max", 20, "      backoff: { base: 1s, max: 250ms }", 20, None),
    ("duration-fraction", 19, "      per_try_timeout: 1.5s", 19, 24),
    ("duration-compound", 15, "      max: 1m30s", 15, 12),
    ("undefined-upstream", 8, "      - upstream: nope", 8, 19),
    ("no-endpoints", 11, "    endpoints: []", 11, None),
    ("bad-workers", 3, "workers: many", 3, 10),
]


@pytest.mark.parametrize("case", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_check_rejects_with_position(tmp_path, case):
    _, line, new, exp_line, exp_col = case
    cp = check_config(_mutate(_valid_text(), line, new), workdir=tmp_path)
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    assert "ok" not in cp.stdout.split("\n")[-2:] and not cp.stdout.rstrip().endswith(": ok")
    errs = _errors(cp.stderr)
    assert errs, "no error printed"
    hits = [e for e in errs if e[0] == cp.path and e[1] == exp_line]
    assert hits, "no error at line %d: %s" % (exp_line, cp.stderr)
    if exp_col is not None:
        assert any(e[2] == exp_col for e in hits), cp.stderr


def test_check_missing_required_parts(tmp_path):
    cases = {
        "no-listeners": "upstreams:\n  a:\n    endpoints: [\"127.0.0.1:1\"]\n",
        "no-upstreams": "listeners:\n  - listen: \"127.0.0.1:%d\"\n    routes: [{upstream: a}]\n"
                        % free_port(),
        "route-no-upstream": "listeners:\n  - listen: \"127.0.0.1:%d\"\n    routes: [{path_prefix: /}]\n"
                             "upstreams:\n  a:\n    endpoints: [\"127.0.0.1:1\"]\n" % free_port(),
        "empty": "",
    }
    for name, text in cases.items():
        cp = check_config(text, workdir=tmp_path / name)
        assert cp.returncode == 1, (name, cp.stdout, cp.stderr)
        assert _errors(cp.stderr), (name, cp.stderr)


def _bad_corpus():
    if not BAD_DIR.is_dir():
        return []
    return sorted(BAD_DIR.glob("*.yaml"))


@pytest.mark.parametrize("path", _bad_corpus(), ids=lambda p: p.stem)
def test_bad_config_corpus(path):
    """Every file of tests/conf/bad: exit 1, and the error at the line:col its `# expect:`
    comment names."""
    first = path.read_text(errors="replace").split("\n", 1)[0]
    m = re.match(r"#\s*expect:\s*:(\d+):(\d+):", first)
    cp = run_binary("-c", str(path), "--check")
    assert cp.returncode == 1, (cp.stdout, cp.stderr)
    assert not cp.stdout.rstrip().endswith(": ok")
    errs = _errors(cp.stderr)
    assert errs
    if m:
        want = (int(m.group(1)), int(m.group(2)))
        assert any(e[0] == str(path) and (e[1], e[2]) == want for e in errs), \
            "expected an error at %s:%d:%d, got:\n%s" % (path, want[0], want[1], cp.stderr)


# ------------------------------------------------------------------------------- never starts

@pytest.mark.parametrize("case", [m for m in MUTATIONS if m[0] in (
    "unknown-key", "default-above-max", "max-attempts-zero", "zero-connect-timeout",
    "backoff-base-above-max", "wrong-type-int")], ids=lambda m: m[0])
def test_process_never_starts_on_bad_config(tmp_path, case):
    port, admin = free_port(), free_port()
    text = _mutate(_valid_text(admin_port=admin, port=port), case[1], case[2])
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    proc = subprocess.Popen([str(default_binary()), "-c", str(path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd=str(REPO_ROOT))
    try:
        out, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("retrygate kept running on a bad config (%s)" % case[0])
    assert proc.returncode != 0
    errs = [e for e in _errors_lenient(err)]
    assert any(e[1] == case[3] for e in errs), err      # reported at the right line
    for p in (port, admin):
        with socket.socket() as s:
            s.settimeout(1)
            assert s.connect_ex(("127.0.0.1", p)) != 0, "port %d is open" % p


def _errors_lenient(stderr):
    out = []
    for ln in stderr.splitlines():
        m = ERROR_LINE.match(ln)
        if m:
            out.append((m.group("file"), int(m.group("line")), int(m.group("col")),
                        m.group("msg")))
    return out


def test_missing_config_file_is_an_error(tmp_path):
    cp = run_binary("-c", str(tmp_path / "nope.yaml"))
    assert cp.returncode != 0
    assert "nope.yaml" in cp.stderr
    cp = run_binary("-c", str(tmp_path / "nope.yaml"), "--check")
    assert cp.returncode == 1 and "nope.yaml" in cp.stderr


def test_unknown_flag_is_an_error():
    cp = run_binary("--no-such-flag")
    assert cp.returncode != 0 and cp.stderr


# ------------------------------------------------------------------------------- formats

@pytest.mark.parametrize("value,ok", [
    ("250ms", True), ("2s", True), ("1m", True), ("24h", True), ("1500", True),
    ("1.5s", False), ("1m30s", False), ("2 s", False), ("-1s", False), ("5sec", False),
    ("s", False), ("1d", False),
])
def test_duration_formats(tmp_path, value, ok):
    text = _mutate(_valid_text(), 12, "    connect_timeout: %s" % value)
    cp = check_config(text, workdir=tmp_path)
    assert (cp.returncode == 0) == ok, (value, cp.stdout, cp.stderr)
    if not ok:
        assert any(e[1] == 12 for e in _errors(cp.stderr)), cp.stderr


@pytest.mark.parametrize("value,ok", [
    ("512", True), ("512B", True), ("64KiB", True), ("1MiB", True), ("1GiB", True),
    ("64KB", False), ("1.5MiB", False), ("1 MiB", False), ("-1", False), ("64kib", False),
])
def test_size_formats(tmp_path, value, ok):
    text = _valid_text() + "      max_body: %s\n" % value
    cp = check_config(text, workdir=tmp_path)
    assert (cp.returncode == 0) == ok, (value, cp.stdout, cp.stderr)
    if not ok:
        assert any(e[1] == 21 for e in _errors(cp.stderr)), cp.stderr


def test_duration_and_size_values_as_configured(rg_factory, upstream):
    """A bare integer is milliseconds; sizes with units are bytes: seen in /config."""
    rg = rg_factory(upstreams={"api": {"endpoints": [upstream], "connect_timeout": 1500,
                                       "retry": {"max_body": "2MiB"}}},
                    listener_limits={"max_header_bytes": "16KiB", "max_body": "1GiB"})
    c = rg.config_json()
    up = c["upstreams"]["api"]
    assert _as_ms(up["connect_timeout"]) == 1500
    assert up["retry"]["max_body"] in (2 * 1024 * 1024, "2MiB")
    lim = c["listeners"][0]["limits"]
    assert lim["max_header_bytes"] in (16 * 1024, "16KiB")
    assert lim["max_body"] in (1 << 30, "1GiB")


def _as_ms(v):
    if isinstance(v, (int, float)):
        return v
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", str(v))
    assert m, v
    return int(m.group(1)) * {None: 1, "ms": 1, "s": 1000, "m": 60000, "h": 3600000}[m.group(2)]


def test_defaults_are_the_documented_ones(rg_factory, upstream):
    """Every key left out takes the default shown in SPEC §2."""
    port, admin = free_port(), free_port()
    text = ("admin:\n  listen: \"127.0.0.1:%d\"\nlisteners:\n  - listen: \"127.0.0.1:%d\"\n"
            "    routes: [{upstream: api}]\nupstreams:\n  api:\n    endpoints: [\"%s\"]\n"
            % (admin, port, upstream.endpoint))
    rg = rg_factory(text)
    c = rg.config_json()
    assert c["workers"] == 1
    assert _as_ms(c["drain_timeout"]) == 15000
    assert c["access_log"] == "off"
    assert c["admin"]["token"] in ("", None)
    lim = c["listeners"][0]["limits"]
    assert _size(lim["max_header_bytes"]) == 32 * 1024
    assert _as_ms(lim["header_timeout"]) == 10000
    assert _size(lim["max_uri_bytes"]) == 8 * 1024
    assert _as_ms(lim["idle_timeout"]) == 60000
    assert _size(lim["max_body"]) == 0
    assert lim["max_connections"] == 10000
    route = c["listeners"][0]["routes"][0]
    assert route["path_prefix"] == "/" and route["upstream"] == "api"
    u = c["upstreams"]["api"]
    assert u["host_rewrite"] in ("", None)
    assert _as_ms(u["connect_timeout"]) == 250
    assert [_as_ms(u["deadline"][k]) for k in ("default", "max", "min")] == [5000, 30000, 5]
    r = u["retry"]
    assert r["enabled"] is True and r["max_attempts"] == 3
    assert _as_ms(r["per_try_timeout"]) == 1000
    assert [str(x) for x in r["on"]] == ["connect-failure", "reset", "timeout", "502", "503",
                                         "504", "unavailable"]
    assert r["idempotent_paths"] == []
    assert _as_ms(r["backoff"]["base"]) == 25 and _as_ms(r["backoff"]["max"]) == 250
    assert r["retry_after"]["honor"] is True and _as_ms(r["retry_after"]["max"]) == 10000
    assert r["budget"] == {"ratio": 0.2, "min_per_second": 10, "max_tokens": 100}
    assert r["non_idempotent"] == "require-key" and _size(r["max_body"]) == 64 * 1024
    assert u["concurrency"]["max_in_flight"] == 256
    assert u["concurrency"]["max_retries_in_flight"] == 32
    i = u["idempotency"]
    assert i["enabled"] is False and i["header"] == "Idempotency-Key"
    assert i["methods"] == ["POST", "PATCH"] and i["require_key"] is False
    assert i["scope_headers"] == ["Authorization"]
    assert _as_ms(i["ttl"]) == 24 * 3600 * 1000 and _as_ms(i["lock_timeout"]) == 30000
    assert _size(i["max_body"]) == 1 << 20 and _size(i["max_response"]) == 1 << 20
    assert i["store"] == "memory"


def _size(v):
    if isinstance(v, int):
        return v
    m = re.fullmatch(r"(\d+)(B|KiB|MiB|GiB)?", str(v))
    assert m, v
    return int(m.group(1)) * {None: 1, "B": 1, "KiB": 1 << 10, "MiB": 1 << 20,
                              "GiB": 1 << 30}[m.group(2)]


def test_workers_auto_is_accepted(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream}, workers="auto")
    for _ in range(4):
        assert rg.get("/x").status == 200


def test_uri_limit_above_header_limit_the_smaller_governs(rg_factory, upstream):
    rg = rg_factory(upstreams={"api": upstream},
                    listener_limits={"max_header_bytes": "1KiB", "max_uri_bytes": "8KiB"})
    assert rg.get("/" + "a" * 300).status == 200
    # a target of 2 KiB is below max_uri_bytes but above max_header_bytes: refused; since
    # the URI limit is clamped to the header limit, it is refused as a too-long URI (414)
    data, closed = rg.raw(b"GET /" + b"a" * 2048 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert data.startswith(b"HTTP/1.1 414"), data[:200]
    assert b"uri-too-long" in data


def test_example_config_checks_ok():
    cp = run_binary("-c", "conf/retrygate.yaml", "--check")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.rstrip().split("\n")[-1] == "conf/retrygate.yaml: ok"


def test_default_config_path_is_conf_retrygate_yaml():
    # without -c the binary reads conf/retrygate.yaml (relative to its working directory)
    cp = run_binary("--check")
    assert cp.returncode == 0, cp.stderr
    assert cp.stdout.rstrip().endswith("conf/retrygate.yaml: ok")


def test_host_patterns_in_config(tmp_path):
    good = make_config(upstreams={"a": "127.0.0.1:1"},
                       routes=[{"host": "*.example.com", "upstream": "a"},
                               {"host": "Payments", "upstream": "a"}])
    assert check_config(good, workdir=tmp_path / "g").returncode == 0
