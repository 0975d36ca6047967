"""An outage leaves a trace in the log (issue 27): per upstream, a WARN line summarising the
attempts that failed and the retries refused, at most one per 10 s per upstream and kind, with
the budget's tokens left; and with RETRYGATE_LOG=debug one line per attempt's outcome with the
retry decision, its reason and the backoff."""

import re
import time
from datetime import datetime

import pytest

from harness import InThread, upstream_block

STAMP = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z"
FAILED = re.compile(STAMP + r" WARN upstream pay: (\d+) attempts failed (?:since start|in the last "
                    r"[\d.]+ s) \(([^)]*)\); retry budget [\d.]+ of 3 tokens left")
REFUSED = re.compile(STAMP + r" WARN upstream pay: (\d+) retries refused \(([^)]*)\) and (\d+) "
                     r"requests rejected \(([^)]*)\) (?:since start|in the last [\d.]+ s); "
                     r"retry budget ([\d.]+) of 3 tokens left")


def _when(stamp):
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%f").timestamp()


def _counts(text):
    return {k: int(v) for k, v in (part.rsplit(" ", 1) for part in text.split(", "))}


def _hammer(rg, stop):
    n = 0
    while not stop():
        rg.request("GET", "/x", timeout=10)
        n += 1
    return n


@pytest.mark.timeout(90)
def test_connect_failures_are_summarised_at_most_once_per_10s(rg_factory, refusing):
    # a dead endpoint, a small budget that empties: every request fails, most retries refused
    rg = rg_factory(upstreams={"pay": upstream_block(
        refusing.endpoint,
        retry={"max_attempts": 3, "budget": {"ratio": 0, "min_per_second": 0.1, "max_tokens": 3}})})
    t0 = time.monotonic()
    # keep failing until the second line of each kind, 10 s after the first, summarises the burst
    worker = InThread(_hammer, rg, lambda: min(len(FAILED.findall(rg.stderr_text())),
                                               len(REFUSED.findall(rg.stderr_text()))) >= 2
                      or time.monotonic() - t0 > 40)
    sent = worker(timeout=60)
    elapsed = time.monotonic() - t0
    err = rg.stderr_text()
    failed, refused = FAILED.findall(err), REFUSED.findall(err)
    assert len(failed) >= 2, err[-3000:]
    assert len(refused) >= 2, err[-3000:]
    # rate limit: never two lines of one kind within 10 s, so at most 1 + elapsed/10 of each
    for lines in (failed, refused):
        assert len(lines) <= 1 + elapsed / 10, (elapsed, lines)
        stamps = [_when(line[0]) for line in lines]
        assert all(b - a >= 9.9 for a, b in zip(stamps, stamps[1:])), stamps
    # the second failure line counts what happened since the first: hundreds of failures
    counts = _counts(failed[1][2])
    assert set(counts) == {"connect-failure"}, failed[1]
    assert int(failed[1][1]) == counts["connect-failure"] > 50, (failed[1], sent)
    total = sum(int(line[1]) for line in failed)
    assert total <= rg.metric("retrygate_upstream_outcomes_total", upstream="pay",
                              outcome="connect-failure")
    # the refusal line names its reasons: the budget ran dry
    reasons = _counts(refused[1][2]) if refused[1][2] != "none" else {}
    assert reasons.get("budget", 0) > 50 and int(refused[1][1]) == sum(reasons.values()), refused
    assert float(refused[1][5]) < 1.0, refused[1]
    # tens of thousands of failures would make no more lines than this
    assert len(re.findall(r" WARN upstream pay: ", err)) <= 2 * (1 + elapsed / 10) + 1, err[-3000:]


def test_debug_says_outcome_decision_reason_and_backoff(rg_factory, upstream):
    upstream.push(503, 503)         # then 200
    rg = rg_factory(upstreams={"pay": upstream_block(upstream, retry={"max_attempts": 2})},
                    env={"RETRYGATE_LOG": "debug"})
    status, headers, _ = rg.request("GET", "/x")
    assert status == 503 and headers["X-Retrygate-Retry-Refused"] == "max-attempts"
    assert rg.request("GET", "/y").status == 200
    rg.wait_stderr(r"upstream pay attempt 1: status 503; decision: retry \(outcome in retry\.on"
                   r"[^)]*\), backoff [\d.]+ ms")
    rg.wait_stderr(r"upstream pay attempt 2: status 503; decision: no retry, reason max-attempts")
    rg.wait_stderr(r"upstream pay attempt 1: status 200; decision: no retry, reason not-listed")


def test_debug_names_a_failure_and_its_refusal(rg_factory, refusing):
    rg = rg_factory(upstreams={"pay": upstream_block(
        refusing.endpoint, retry={"max_attempts": 2, "budget": {
            "max_tokens": 1, "min_per_second": 0, "ratio": 0}})},
                    env={"RETRYGATE_LOG": "debug"})
    # the one token goes to the first request's retry; the second finds the budget empty
    assert rg.request("GET", "/x").status == 502
    assert rg.request("GET", "/x").status == 502
    rg.wait_stderr(r"upstream pay attempt 1: connect-failure; decision: retry \(outcome in "
                   r"retry\.on[^)]*\), backoff [\d.]+ ms")
    rg.wait_stderr(r"upstream pay attempt 2: connect-failure; decision: no retry, reason "
                   r"max-attempts")
    rg.wait_stderr(r"upstream pay attempt 1: connect-failure; decision: no retry, reason budget")
