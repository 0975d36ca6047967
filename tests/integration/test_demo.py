"""`make demo` in its fast mode: run tests/tools/demo.py --quick and hold it to its claims.

The demo runs the same load against a flaky dependency (tests/tools/flaky.py) through retrygate
twice, as a naive retry policy and as retrygate's default policy, then the replica phase, then
the gRPC round (tests/tools/demo_grpc.py: grpcio client and dependency, SPEC §10), and prints
PASS/FAIL lines.
Here we check its exit status, the PASS lines, the numbers behind them (from --json), and that
it leaves no process behind, also when interrupted with Ctrl-C.
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "tests" / "tools" / "demo.py"
PYTHON = sys.executable or "/usr/bin/python3"


def binary():
    b = os.environ.get("RETRYGATE_BIN")
    return Path(b) if b else REPO / "build" / "retrygate"


def alive(pid):
    """True if pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def pids_of(workdir):
    p = workdir / "pids"
    if not p.exists():
        return {}
    out = {}
    for line in p.read_text().splitlines():
        if line.strip():
            name, pid = line.split()
            out[name] = int(pid)
    return out


def run_demo(tmp_path, *extra, timeout=100):
    env = dict(os.environ, RETRYGATE_BIN=str(binary()))
    env.pop("DEMO_QUICK", None)
    cmd = [PYTHON, str(DEMO), "--quick", "--workdir", str(tmp_path / "demo"),
           "--json", str(tmp_path / "demo.json")] + list(extra)
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    if not os.access(binary(), os.X_OK):
        pytest.skip("%s not built" % binary())
    tmp = tmp_path_factory.mktemp("demo")
    t0 = time.monotonic()
    r = run_demo(tmp)
    return {"proc": r, "out": r.stdout, "seconds": time.monotonic() - t0, "tmp": tmp,
            "json": json.loads((tmp / "demo.json").read_text())
            if (tmp / "demo.json").exists() else None}


def _explain(demo):
    return "exit %s\n--- stdout\n%s\n--- stderr\n%s" % (
        demo["proc"].returncode, demo["out"][-6000:], demo["proc"].stderr[-3000:])


@pytest.mark.timeout(150)
def test_demo_quick_passes(demo):
    assert demo["proc"].returncode == 0, _explain(demo)
    assert "FAIL" not in demo["out"], _explain(demo)
    assert "demo: PASS" in demo["out"], _explain(demo)
    assert demo["seconds"] < 50, "quick mode took %.1fs" % demo["seconds"]


@pytest.mark.timeout(150)
def test_demo_prints_the_table_and_the_metrics(demo):
    out = demo["out"]
    for row in ("requests sent", "attempts the dependency saw",
                "amplification during the outage", "duplicate POST side effects",
                "success rate after recovery", "p99", "deadlines kept",
                "attempts_total/requests_total", "retries_refused_total{reason}"):
        assert row in out, "missing %r\n%s" % (row, _explain(demo))
    assert "naive retries" in out and "retrygate default" in out


@pytest.mark.timeout(150)
@pytest.mark.parametrize("line", [
    "PASS retrygate: amplification during the outage",
    "PASS retrygate: zero duplicate side effects",
    "PASS retrygate: every unknown POST outcome reconciled",
    "PASS retrygate: normal success rate",
    "PASS retrygate: deadlines kept",
    "PASS naive: amplification during the outage",
    "PASS naive: duplicate side effects > 0",
    "PASS gRPC retrygate: amplification during the outage",
    "PASS gRPC retrygate: zero duplicate side effects",
    "PASS gRPC retrygate: it retried",
    "PASS gRPC retrygate: /metrics grpc_responses_total",
    "PASS gRPC naive: amplification during the outage",
    "PASS gRPC naive: duplicate side effects > 0",
])
def test_demo_acceptance_line(demo, line):
    assert line in demo["out"], _explain(demo)


@pytest.mark.timeout(150)
def test_demo_replica_phase(demo):
    """SPEC §13 in the demo: one of two replicas dies; with passive health retrygate ejects it
    (the log line is in the text) and keeps the callers' success; without, the dead replica
    keeps getting first attempts."""
    out = demo["out"]
    assert "When a replica dies" in out and "success rate after it died" in out, _explain(demo)
    assert "ejected for 10000 ms after 5 failures in a row" in out, _explain(demo)
    r = demo["json"]["replica"]
    n, g = r["naive"], r["retrygate"]
    assert g["ejections"] >= 1 and n["ejections"] == 0
    assert g["success"] >= 0.98
    assert g["dead_attempts"] < n["dead_attempts"]
    assert g["amplification"] < n["amplification"]


@pytest.mark.timeout(150)
def test_demo_grpc_round(demo):
    """SPEC §10 in the demo: the naive policy re-sends every UNAVAILABLE (about 1 + f + f^2
    attempts per call at failure rate f, and unkeyed writes executed twice); retrygate stays
    within its budget bound, re-sends no unkeyed write, and counts the gRPC statuses."""
    out = demo["out"]
    for row in ("gRPC round", "gRPC calls sent", "amplification during the overload (pushback)",
                "duplicate side effects (unkeyed writes run twice)", "unkeyed writes re-sent",
                "grpc_responses_total ok / unavailable"):
        assert row in out, "missing %r\n%s" % (row, _explain(demo))
    d = demo["json"]["grpc"]
    n, g = d["naive"], d["retrygate"]
    assert n["calls"] == g["calls"] == g["planned"] > 0
    b = g["budget"]
    retries = g["outage_attempts"] - g["outage_first_attempts"]
    assert retries <= (b["max_tokens"] + b["ratio"] * g["outage_token_earners"]
                       + b["min_per_second"] * g["outage_seconds"]) + 1e-9
    assert g["amp_outage"] < n["amp_outage"] and n["amp_outage"] >= 2.0
    assert g["duplicates"] == 0 and g["nokey_resent"] == 0
    assert n["duplicates_by_kind"]["write-nokey"] > 0 and n["duplicates_by_kind"]["write-key"] == 0
    assert g["metrics"]["grpc_responses"].get("unavailable", 0) == \
        g["dep_by_code"].get("unavailable", 0) > 0
    assert g["metrics"]["attempts_total"] == g["dep_attempts"]
    assert g["metrics"]["refused"].get("non-idempotent", 0) > 0
    # pushback obeyed: the overload is not amplified the way the naive policy amplifies it
    assert g["amp_overload"] < n["amp_overload"]


@pytest.mark.timeout(150)
def test_demo_numbers_back_the_claims(demo):
    d = demo["json"]
    assert d is not None, _explain(demo)
    n, g = d["naive"], d["retrygate"]
    # same load both runs
    assert n["requests"] == g["requests"] == g["planned"] > 0
    # the budget bound, recomputed here from the raw counts (SPEC §4)
    b = g["budget"]
    retries = g["outage_attempts"] - g["outage_first_attempts"]
    assert retries <= (b["max_tokens"] + b["ratio"] * g["outage_token_earners"]
                       + b["min_per_second"] * g["outage_seconds"]) + 1e-9
    assert g["outage_token_earners"] >= g["outage_requests"]
    assert g["amp_outage"] < n["amp_outage"]
    assert n["amp_outage"] >= 2.5                     # ~ max_attempts 3: no budget
    assert g["duplicates"] == 0 and n["duplicates"] > 0
    assert n["duplicates_by_kind"]["POST-key"] == 0  # the dependency dedupes keyed POSTs
    # retrygate's own metrics agree with what the dependency saw
    assert g["metrics"]["attempts_total"] == g["dep_attempts"]
    assert g["metrics"]["requests_total"] == g["requests"]
    # the refusals name reasons from SPEC §4, and the budget is one of them
    reasons = {"max-attempts", "non-idempotent", "body-too-large", "deadline", "retry-after",
               "budget", "retries-in-flight", "nested", "disabled"}
    assert set(g["metrics"]["refused"]) <= reasons
    assert g["metrics"]["refused"].get("budget", 0) > 0
    assert g["metrics"]["refused"].get("non-idempotent", 0) > 0
    assert set(n["metrics"]["refused"]) <= {"max-attempts"}
    # reconciliation settled every unknown outcome
    assert g["recon"]["resolved"] == g["recon"]["unknown"]
    assert g["keyed_exactly_once"] == g["keyed_intents"]


@pytest.mark.timeout(150)
def test_demo_leaves_nothing_running(demo):
    pids = pids_of(demo["tmp"] / "demo")
    assert set(pids) == {"flaky-naive", "retrygate-naive", "flaky-retrygate",
                         "retrygate-retrygate", "replica-a-naive", "replica-b-naive",
                         "retrygate-replica-naive", "replica-a-retrygate", "replica-b-retrygate",
                         "retrygate-replica-retrygate", "grpcserver-naive",
                         "retrygate-grpc-naive", "grpcserver-retrygate",
                         "retrygate-grpc-retrygate"}, pids
    assert not [n for n, p in pids.items() if alive(p)]
    for name in ("naive.yaml", "retrygate.yaml", "grpc-naive.yaml", "grpc-retrygate.yaml"):
        assert (demo["tmp"] / "demo" / name).exists()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("round_,proxy,dependency", [
    ("all", "retrygate-naive", "flaky-naive"),
    ("grpc", "retrygate-grpc-naive", "grpcserver-naive")])
def test_demo_ctrl_c_stops_everything(tmp_path, round_, proxy, dependency):
    if not os.access(binary(), os.X_OK):
        pytest.skip("%s not built" % binary())
    workdir = tmp_path / "demo"
    env = dict(os.environ, RETRYGATE_BIN=str(binary()))
    p = subprocess.Popen([PYTHON, str(DEMO), "--quick", "--workdir", str(workdir),
                          "--round", round_], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 20
        while time.monotonic() < end and proxy not in pids_of(workdir):
            assert p.poll() is None, p.communicate()
            time.sleep(0.05)
        time.sleep(1.0)                           # mid-load
        pids = pids_of(workdir)
        assert dependency in pids and proxy in pids, pids
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=15)
        assert p.returncode == 130, (p.returncode, out, err)
        assert "interrupted" in err
        left = [n for n, pid in pids_of(workdir).items() if alive(pid)]
        assert not left, "still running after Ctrl-C: %s" % left
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
