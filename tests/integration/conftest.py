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

Time limits: every test phase (setup, call, teardown) is bounded by SIGALRM: default 120 s
(env RETRYGATE_TEST_TIMEOUT), per test @pytest.mark.timeout(SECONDS).
"""

import os
import signal
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
for p in (HERE, HERE.parent / "tools"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

from harness import (Blackhole, Refusing, Retrygate, RetrygateError, Upstream,  # noqa: E402
                     make_config)

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_setup(item):
    old = _bounded(item, "setup")
    try:
        yield
    finally:
        _unbound(old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    old = _bounded(item, "call")
    try:
        yield
    finally:
        _unbound(old)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item):
    old = _bounded(item, "teardown")
    try:
        yield
    finally:
        _unbound(old)


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


__all__ = ["RetrygateError"]
