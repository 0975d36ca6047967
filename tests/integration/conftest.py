"""pytest fixtures for retrygate's integration tests (helpers: harness.py).

Fixtures
  upstream            an Upstream (echo by default) on an ephemeral port; closed at teardown
  upstream_factory    make(**Upstream kwargs) -> Upstream; all closed at teardown
  rg_factory          make(config=None, **make_config kwargs | Retrygate kwargs) -> running
                      Retrygate; at teardown each is stopped (SIGTERM) and the test fails if it
                      crashed, exited non-zero, or printed a sanitizer report
  rg                  retrygate with a single upstream "up" -> the `upstream` fixture
  refusing            a Refusing port (connect refused)
  blackhole           a Blackhole port (connect hangs); skips the test where the kernel does
                      not make connect() block
  fast_upstream       "127.0.0.1:PORT" of tests/bench/upstream.c, compiled once per session
                      (fast_upstream_bin); skips the test without a C compiler

Time limits: every test phase (setup, call, teardown) is bounded by SIGALRM: default 120 s
(env RETRYGATE_TEST_TIMEOUT), per test @pytest.mark.timeout(SECONDS).
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent / "tools"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from harness import (REPO_ROOT, Blackhole, Refusing, Retrygate, RetrygateError,  # noqa: E402
                     Upstream, free_port, make_config, port_open, wait_for)
from h2upstream import H2Upstream  # noqa: E402

DEFAULT_TIMEOUT = float(os.environ.get("RETRYGATE_TEST_TIMEOUT", "120"))
_RETRYGATE_KWARGS = ("binary", "env", "args", "wait_ready", "ready_timeout", "start")


# ------------------------------------------------------------------------------- time limits

class PhaseTimeout(Exception):
    """A test phase ran past its time limit."""


def pytest_configure(config):
    config.addinivalue_line("markers", "timeout(seconds): time limit of each phase of the test "
                            "(default: RETRYGATE_TEST_TIMEOUT or 120)")


def _limit(item):
    m = item.get_closest_marker("timeout")
    return float(m.args[0]) if m and m.args else DEFAULT_TIMEOUT


def _bounded(item, phase):
    secs = _limit(item)
    if secs <= 0 or not hasattr(signal, "setitimer"):
        return None

    def on_alarm(signum, frame):
        raise PhaseTimeout("%s of %s exceeded %gs (raise it with @pytest.mark.timeout(S))"
                          % (phase, item.nodeid, secs))
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, secs)
    return old


def _unbound(old):
    signal.setitimer(signal.ITIMER_REAL, 0)
    if old is not None:
        signal.signal(signal.SIGALRM, old)


@contextlib.contextmanager
def _time_limit(item, phase):
    old = _bounded(item, phase)
    try:
        yield
    finally:
        _unbound(old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    with _time_limit(item, "setup"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    with _time_limit(item, "call"):
        yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    with _time_limit(item, "teardown"):
        yield


# ------------------------------------------------------------------------------- fixtures

@pytest.fixture
def upstream_factory():
    """make(**kwargs) -> Upstream (see tests/tools/upstream.py); closed at teardown."""
    made = []

    def make(**kw):
        u = Upstream(**kw)
        made.append(u)
        return u
    yield make
    leaked = [u.name for u in made if not u.close()]
    if leaked:
        pytest.fail("upstream threads did not stop: %s" % ", ".join(leaked), pytrace=False)


@pytest.fixture
def h2up():
    """make(**kwargs) -> H2Upstream (see tests/tools/h2upstream.py); closed at teardown."""
    made = []

    def make(**kw):
        up = H2Upstream(**kw)
        made.append(up)
        return up
    yield make
    for up in made:
        up.close()


@pytest.fixture
def grpcsrv():
    """grpcsrv(**kw) starts a grpcio test server (tests/tools/grpcserver.py); all are stopped
    at the end of the test."""
    from grpcserver import GrpcServer
    made = []

    def make(**kw):
        s = GrpcServer(**kw)
        made.append(s)
        return s
    yield make
    for s in made:
        s.stop(0)


@pytest.fixture
def upstream(upstream_factory):
    """One Upstream (default action: 200 JSON echo)."""
    return upstream_factory()


@pytest.fixture
def rg_factory(tmp_path):
    """make(config=None, **kw) -> a running Retrygate.

    config: a dict (make_config) or YAML text; when None, make_config(**kw) builds it, e.g.
    rg_factory(upstreams={"api": up}). Retrygate options can be mixed in: binary, env, args,
    wait_ready, ready_timeout, start. Each process gets its own directory under tmp_path.
    Teardown stops every process and fails the test on a crash, a non-zero exit after
    SIGTERM, or a sanitizer report.
    """
    made = []

    def make(config=None, **kw):
        rg_kw = {k: kw.pop(k) for k in _RETRYGATE_KWARGS if k in kw}
        if config is None:
            config = make_config(**kw)
        elif kw:
            raise TypeError("make_config arguments given with an explicit config: %s" % list(kw))
        start = rg_kw.pop("start", True)
        wait_ready = rg_kw.pop("wait_ready", True)
        rg = Retrygate(config, workdir=tmp_path / ("rg%d" % len(made)), start=False, **rg_kw)
        made.append(rg)
        if start:
            rg.start(wait_ready)
        return rg
    yield make
    problems = []
    for i, rg in enumerate(made):
        problems += ["retrygate #%d (%s): %s" % (i, rg.workdir, p) for p in rg.finish()]
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture
def rg(rg_factory, upstream):
    """retrygate with defaults in front of the `upstream` fixture, as upstream "up"."""
    return rg_factory(upstreams={"up": upstream})


@pytest.fixture
def refusing():
    r = Refusing()
    yield r
    r.close()


@pytest.fixture
def blackhole():
    b = Blackhole()
    if not b.blocks:
        b.close()
        pytest.skip("connect() to a full accept queue does not block on this kernel")
    yield b
    b.close()


@pytest.fixture(scope="session")
def fast_upstream_bin(tmp_path_factory):
    """tests/bench/upstream.c compiled (cc -O2); skips the test without it or a C compiler."""
    src = REPO_ROOT / "tests" / "bench" / "upstream.c"
    if not src.exists() or not shutil.which("cc"):
        pytest.skip("no tests/bench/upstream.c or no C compiler")
    out = tmp_path_factory.mktemp("fastup") / "upstream"
    subprocess.run(["cc", "-O2", "-o", str(out), str(src)], check=True, timeout=60)
    return out


@pytest.fixture
def fast_upstream(fast_upstream_bin):
    """The compiled fast upstream on a free port: its endpoint "127.0.0.1:PORT"."""
    port = free_port()
    p = subprocess.Popen([str(fast_upstream_bin), str(port)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_open(port, 0.5), 5, what="fast upstream")
        yield "127.0.0.1:%d" % port
    finally:
        p.terminate()
        p.wait(5)


__all__ = ["RetrygateError"]
