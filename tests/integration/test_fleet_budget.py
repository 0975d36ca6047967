"""SPEC §4 "Retry budget", budget.shared: one bucket for a fleet, in Redis.

Several retrygate processes (separate processes, one real redis-server) in front of one
dependency that answers 503 to everything, each driven at a steady rate. What the dependency
receives is counted: with budget.shared its retries stay within the bound of ONE bucket,
max_tokens + ratio x (the first attempts of all processes) + min_per_second x t (plus one
100 ms batch of credits per process); with per-process buckets it sees about N floors.
Then Redis is killed and restarted in the middle: each process falls back to its own bucket
(counted in retrygate_upstream_budget_shared_errors_total, logged), no request waits past its
deadline, and the shared bucket is used again once Redis answers. A stalled Redis (SIGSTOP)
delays a retry by connect_timeout at most. `--check` prints the fleet bound, and the demo's
fleet phase runs on its own."""

import threading
import time

import pytest

from harness import Client, respond, upstream_block, wait_for
from test_reconcile import Redis, redis  # noqa: F401 (fixture)

pytestmark = pytest.mark.timeout(90)

N = 4                   # sidecars
RATE = 25               # first attempts a second, per sidecar
SECONDS = 3.0
BUDGET = {"ratio": 0.05, "min_per_second": 5, "max_tokens": 20}
DEADLINE = "2s"


def fleet(rg_factory, upstream, shared):
    budget = dict(BUDGET)
    if shared:
        budget["shared"] = shared
    retry = {"max_attempts": 3, "budget": budget}
    ups = {"api": upstream_block(upstream.endpoint, retry, deadline={"default": DEADLINE})}
    return [rg_factory(upstreams=ups) for _ in range(N)]


def drive(rgs, seconds=SECONDS, rate=RATE, during=None):
    """Each sidecar gets RATE requests a second for SECONDS from its own thread (a keep-alive
    client). Returns (the first attempts sent, the slowest answer in seconds, the statuses)."""
    results = []
    lock = threading.Lock()

    def run(rg):
        c = Client(rg.port, timeout=10)
        t0 = time.monotonic()
        i = 0
        mine = []
        while True:
            at = t0 + i / rate
            if at - t0 >= seconds:
                break
            now = time.monotonic()
            if at > now:
                time.sleep(at - now)
            s = time.monotonic()
            try:
                r = c.get("/x%d" % i)
                mine.append((r.status, time.monotonic() - s))
            except OSError as e:
                mine.append(("error %s" % e, time.monotonic() - s))
                c.close()
                c = Client(rg.port, timeout=10)
            i += 1
        c.close()
        with lock:
            results.extend(mine)

    threads = [threading.Thread(target=run, args=(rg,)) for rg in rgs]
    for t in threads:
        t.start()
    if during:
        during()
    for t in threads:
        t.join(60)
    return len(results), max(d for _, d in results), [s for s, _ in results]


def counted(upstream):
    reqs = upstream.requests
    first = sum(1 for q in reqs if q.header("X-Retrygate-Attempt") == "1")
    return first, len(reqs) - first


def bound(first, seconds):
    """One bucket's bound, plus one batch interval of credits for each process."""
    return (BUDGET["max_tokens"] + BUDGET["ratio"] * first + BUDGET["min_per_second"] * seconds
            + N * BUDGET["ratio"] * RATE * 0.1)


def test_shared_budget_bounds_the_fleet_not_each_sidecar(rg_factory, upstream_factory, redis):
    # per-process buckets first: every sidecar brings its own burst and floor
    up = upstream_factory(default=respond(503))
    rgs = fleet(rg_factory, up, None)
    t0 = time.monotonic()
    sent, _, _ = drive(rgs)
    t_local = time.monotonic() - t0
    first_local, retries_local = counted(up)
    assert first_local == sent
    for rg in rgs:
        rg.stop()

    up2 = upstream_factory(default=respond(503))
    rgs = fleet(rg_factory, up2, "redis://127.0.0.1:%d/0" % redis.port)
    for rg in rgs:
        assert rg.stats()["upstreams"]["api"]["budget_shared"] is True
    t0 = time.monotonic()
    sent, slowest, statuses = drive(rgs)
    t_shared = time.monotonic() - t0
    first, retries = counted(up2)
    assert first == sent
    assert set(statuses) == {503}, statuses
    limit = bound(first, t_shared + 1.0)
    msg = ("%d sidecars, %.1fs: shared %d retries for %d first attempts (bound %.1f); "
           "per-process %d retries for %d first attempts"
           % (N, t_shared, retries, first, limit, retries_local, first_local))
    print(msg)
    assert retries <= limit, msg
    # each sidecar alone would allow max_tokens + min_per_second x t: the fleet N of them
    floor = BUDGET["max_tokens"] + BUDGET["min_per_second"] * t_local
    assert retries_local >= 0.8 * N * floor, msg
    assert retries_local >= 1.8 * retries, msg
    # nothing failed on the way: the shared bucket was in use throughout
    for rg in rgs:
        assert rg.metric("retrygate_upstream_budget_shared_errors_total", upstream="api") == 0
        st = rg.stats()["upstreams"]["api"]
        assert st["budget_shared_in_use"] is True
        assert 0 <= st["retry_budget_tokens"] <= BUDGET["max_tokens"]
    assert redis_level(redis) is not None


def redis_level(redis):
    import subprocess
    out = subprocess.run(["redis-cli", "-p", str(redis.port), "--raw", "HGET",
                          "retrygate:budget:api", "tokens"], capture_output=True, text=True,
                         timeout=5).stdout.strip()
    return float(out) if out else None


def test_redis_down_falls_back_and_comes_back(rg_factory, upstream_factory, redis):
    up = upstream_factory(default=respond(503))
    rgs = fleet(rg_factory, up, "redis://127.0.0.1:%d/0" % redis.port)

    def outage():
        time.sleep(1.0)
        redis.kill()
        time.sleep(1.5)
        redis.start()

    sent, slowest, statuses = drive(rgs, seconds=4.0, during=outage)
    # every request answered (the dependency's 503), none held past its deadline
    assert set(statuses) == {503}, statuses
    assert slowest < 2.0 + 1.5, slowest
    for rg in rgs:
        assert rg.metric("retrygate_upstream_budget_shared_errors_total", upstream="api") >= 1
        assert "retries take from this process's own bucket" in rg.stderr_text()
    # shared again: Redis (restarted empty) holds the bucket anew, every process uses it
    for rg in rgs:
        wait_for(lambda: rg.get("/again").status == 503 and
                 rg.stats()["upstreams"]["api"]["budget_shared_in_use"] is True, 10,
                 what="shared bucket in use again")
    wait_for(lambda: redis_level(redis) is not None, 5, what="the bucket back in Redis")
    first, retries = counted(up)
    # the shared bucket's bound, with a second full bucket (Redis restarted empty), plus what
    # each process's own bucket may give while Redis is away: the 1.5 s outage, up to 1 s
    # before a reconnect, and slack for a busy machine
    outage = 1.5 + 1.0 + 1.5
    local = BUDGET["max_tokens"] + BUDGET["min_per_second"] * outage
    limit = bound(first, 6.0) + BUDGET["max_tokens"] + N * local + BUDGET["ratio"] * first
    print("outage: %d retries for %d first attempts (bound %.1f)" % (retries, first, limit))
    assert retries <= limit, (first, retries, limit)


def test_check_prints_the_fleet_bound_and_warns_on_sidecar_figures(tmp_path):
    from harness import check_config, make_config
    def cfg(budget):
        return make_config(upstreams={"api": upstream_block(
            "127.0.0.1:1", {"budget": budget})})
    # --check contacts no Redis: this one does not exist
    url = "redis://:s3cret@127.0.0.1:1/2"
    cp = check_config(cfg({"shared": url}), workdir=tmp_path / "a")
    assert cp.returncode == 0, cp.stderr
    out = cp.stdout + cp.stderr
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("fleet "))
    assert "127.0.0.1:1/2" in line and "100 + 0.2 x" in line and "10/s" in line, line
    assert "s3cret" not in out
    assert "warning: upstreams.api.retry.budget.shared" in out, out
    # sized for a fleet: no warning; unshared: the fleet line says N sidecars add N floors
    cp = check_config(cfg({"shared": url, "max_tokens": 400, "min_per_second": 50}),
                      workdir=tmp_path / "b")
    assert "budget.shared" not in cp.stdout + cp.stderr
    assert "400 + 0.2 x" in cp.stdout
    cp = check_config(cfg({}), workdir=tmp_path / "c")
    line = next(ln for ln in cp.stdout.splitlines() if ln.strip().startswith("fleet "))
    assert "N x (100 + 10/s)" in line, line
    # not a redis URL: refused
    cp = check_config(cfg({"shared": "http://x"}), workdir=tmp_path / "d")
    assert cp.returncode != 0 and "budget.shared" in cp.stderr, cp.stderr


def test_demo_fleet_phase(tmp_path):
    """`make demo`'s fleet phase on its own (--round fleet --quick): the table and its verdicts."""
    import os
    import subprocess
    import sys
    from harness import default_binary
    from pathlib import Path
    demo = Path(__file__).resolve().parents[1] / "tools" / "demo.py"
    if Redis().exe is None:
        pytest.skip("redis-server not installed")
    cp = subprocess.run([sys.executable, str(demo), "--quick", "--round", "fleet", "--workdir",
                         str(tmp_path / "demo")],
                        env=dict(os.environ, RETRYGATE_BIN=str(default_binary())),
                        capture_output=True, text=True, timeout=60)
    out = cp.stdout
    assert cp.returncode == 0, out + cp.stderr
    assert "budget per sidecar" in out and "one shared budget" in out, out
    assert "PASS fleet phase: shared budget" in out, out
    assert "PASS fleet phase: per-sidecar budgets let through more" in out, out
    assert "FAIL" not in out, out


def test_a_stalled_redis_delays_a_retry_by_connect_timeout_at_most(rg_factory, upstream_factory,
                                                                   redis):
    """Redis stopped (SIGSTOP: connections open, no answer): a retry waits for its token no
    longer than connect_timeout, then the local bucket answers; back to shared after SIGCONT."""
    import signal
    up = upstream_factory(default=respond(503))
    budget = dict(BUDGET, shared="redis://127.0.0.1:%d/0" % redis.port)
    ups = {"api": upstream_block(up.endpoint, {"max_attempts": 3, "budget": budget},
                                 connect_timeout="100ms", deadline={"default": "10s"})}
    rgs = [rg_factory(upstreams=ups) for _ in range(2)]

    def stall():
        time.sleep(0.8)
        redis.p.send_signal(signal.SIGSTOP)
        time.sleep(1.5)
        redis.p.send_signal(signal.SIGCONT)

    sent, slowest, statuses = drive(rgs, seconds=3.5, rate=20, during=stall)
    assert set(statuses) == {503}, statuses
    # two retries, each waiting 100 ms at most for Redis (the link's own watchdog would take
    # 1 s, the deadline 10 s), with slack for a busy machine
    print("stalled redis: slowest answer %.3fs" % slowest)
    assert slowest < 0.8, slowest
    for rg in rgs:
        assert rg.metric("retrygate_upstream_budget_shared_errors_total", upstream="api") >= 1
        wait_for(lambda: rg.get("/again").status == 503 and
                 rg.stats()["upstreams"]["api"]["budget_shared_in_use"] is True, 10,
                 what="shared bucket in use again")
