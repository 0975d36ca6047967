"""`make run` as the README guide shows it: conf/retrygate.yaml in front of
tests/tools/upstream.py --flaky /flaky (ports moved to free ones), and the answers the guide
prints: a retried GET, an unkeyed POST whose retry is refused, a keyed POST retried; and the
--check report it shows, which must be what the binary prints."""

import re
import subprocess
import sys

import pytest

from harness import (LOOPBACK, REPO_ROOT, free_port, http_request, wait_for, port_open,
                     run_binary)


@pytest.fixture
def flaky_upstream():
    port = free_port()
    p = subprocess.Popen([sys.executable, str(REPO_ROOT / "tests/tools/upstream.py"),
                          "--listen", "%s:%d" % (LOOPBACK, port), "--flaky", "/flaky", "--quiet"],
                         stdin=subprocess.DEVNULL)
    try:
        wait_for(lambda: port_open(port), timeout=10, what="upstream.py listening")
        yield port
    finally:
        p.terminate()
        p.wait(timeout=10)


@pytest.fixture
def guide(rg_factory, flaky_upstream):
    text = (REPO_ROOT / "conf/retrygate.yaml").read_text()
    for fixed in ("127.0.0.1:15001", "127.0.0.1:9901", "127.0.0.1:9001"):
        assert fixed in text, "conf/retrygate.yaml no longer uses %s: update the guide" % fixed
    text = (text.replace("127.0.0.1:15001", "127.0.0.1:@PORT@")
                .replace("127.0.0.1:9901", "127.0.0.1:@ADMIN_PORT@")
                .replace("127.0.0.1:9001", "127.0.0.1:%d" % flaky_upstream))
    return rg_factory(config=text)


def test_flaky_path_fails_first_attempts_only_without_retrygate(flaky_upstream):
    assert http_request(flaky_upstream, "GET", "/flaky/orders").status == 503
    assert http_request(flaky_upstream, "GET", "/flaky/orders").status == 503
    r = http_request(flaky_upstream, "GET", "/flaky/orders", [("X-Retrygate-Attempt", "2")])
    assert r.status == 200
    assert http_request(flaky_upstream, "GET", "/hello").status == 200


def test_guide_answers(guide):
    r = guide.get("/hello")
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "1"
    for _ in range(2):
        r = guide.get("/flaky/orders")
        assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "2"
    r = guide.request("POST", "/flaky/orders", body=b"amount=10")
    assert r.status == 503
    assert r.headers["X-Retrygate-Retry-Refused"] == "non-idempotent"
    r = guide.request("POST", "/flaky/orders", [("Idempotency-Key", "order-42")], b"amount=10")
    assert r.status == 200 and r.headers["X-Retrygate-Attempts"] == "2"
    assert guide.metric("retrygate_upstream_retries_refused_total", upstream="demo",
                        reason="non-idempotent") == 1


def test_guide_kill_switch(guide):
    assert guide.set_retries(False, "demo").json() == {"demo": False}
    r = guide.get("/flaky/orders")
    assert r.status == 503 and r.headers["X-Retrygate-Retry-Refused"] == "disabled"
    r = guide.set_retries(True, "dmeo")
    assert r.status == 404 and r.json() == {"error": "unknown upstream", "upstream": "dmeo"}
    assert guide.set_retries(True).json() == {"demo": True}


def test_guide_check_report_is_the_real_one():
    readme = (REPO_ROOT / "README.md").read_text()
    m = re.search(r"\n\$ build/retrygate -c conf/retrygate.yaml --check\n(.*?)```", readme, re.S)
    assert m, "README no longer shows the --check report of conf/retrygate.yaml"
    cp = run_binary("-c", "conf/retrygate.yaml", "--check")
    assert cp.returncode == 0, cp.stderr
    assert m.group(1) == cp.stdout, "README's --check report differs from the binary's:\n" + cp.stdout
