#!/usr/bin/env python3
"""Soak (issue 16), by hand, not in `make test`: about a minute against build/retrygate (or
$RETRYGATE_BIN). Prints figures; exits 1 when a bound is broken.

  memory scenarios   two clients each, SOAK_SECONDS (default 8) apiece: uploads in 100-byte
                     writes to an upstream whose connect hangs; pipelined GETs never read;
                     200-byte pieces streamed to readers that never read. RSS and heap
                     (VmData) at the start, the peak, and after the clients left.
  reload under load  SIGHUP every 100 ms for SOAK_SECONDS while four keep-alive clients send
                     requests: requests ok / failed.
  drain under load   four clients sending, then SIGTERM: requests ok / failed, exit code.

    python3 tests/soak/soak.py
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT / "tests" / "integration", ROOT / "tests" / "tools"):
    sys.path.insert(0, str(p))

import memory_peers as mp  # noqa: E402
from harness import Blackhole, Client, Retrygate, free_port, make_config, port_open  # noqa: E402

SECONDS = float(os.environ.get("SOAK_SECONDS", "8"))
MEMORY_BOUND = 8 << 20         # growth per scenario, two connections
LONG = {"retry": {"per_try_timeout": "60s", "backoff": {"base": "1ms", "max": "2ms"}},
        "deadline": {"default": "60s", "max": "60s"}, "connect_timeout": "60s"}


def mib(n):
    return "%6.1f MiB" % (n / (1 << 20))


def fast_upstream(tmp):
    """tests/bench/upstream.c, compiled and started: (process, endpoint)."""
    exe = Path(tmp) / "upstream"
    subprocess.run(["cc", "-O2", "-o", str(exe), str(ROOT / "tests/bench/upstream.c")],
                   check=True)
    port = free_port()
    p = subprocess.Popen([str(exe), str(port)], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL)
    for _ in range(100):
        if port_open(port, 0.2):
            break
        time.sleep(0.05)
    return p, "127.0.0.1:%d" % port


def start(endpoint, **kw):
    up = dict(LONG, endpoints=[endpoint], concurrency={"max_in_flight": 4096})
    return Retrygate(make_config(upstreams={"api": up}, **kw))


def memory_scenario(name, endpoint, fn, failures):
    rg = start(endpoint)
    try:
        before, peak, _ = mp.memory_while(rg.pid, fn, rg.port, SECONDS, clients=2)
        time.sleep(1.5)
        end = mp.memory(rg.pid)
        print("%-28s rss %s -> peak %s -> end %s | heap %s -> peak %s -> end %s"
              % (name, mib(before[0]), mib(peak[0]), mib(end[0]), mib(before[1]),
                 mib(peak[1]), mib(end[1])))
        if peak[1] - before[1] > MEMORY_BOUND or peak[0] - before[0] > MEMORY_BOUND:
            failures.append("%s: memory grew past %s" % (name, mib(MEMORY_BOUND)))
    finally:
        rg.stop()


def load(rg, stop, counts, lock):
    """Keep-alive GETs until stop; a failed request opens a new connection."""
    c = None
    while not stop.is_set():
        try:
            if c is None:
                c = Client(rg.port, timeout=5)
            r = c.request("GET", "/soak")
            key = "ok" if r.status == 200 else "status %d" % r.status
        except ConnectionRefusedError:
            key = "refused (listener closed)"   # a new connection after the drain began
            c = None
        except Exception as e:  # noqa: BLE001 - counted, not raised
            key = "failed (%s)" % type(e).__name__
            if c is not None:
                c.close()
            c = None
        with lock:
            counts[key] = counts.get(key, 0) + 1
    if c is not None:
        c.close()


def run_load(rg, action, clients=4):
    stop, lock, counts = threading.Event(), threading.Lock(), {}
    ts = [threading.Thread(target=load, args=(rg, stop, counts, lock), daemon=True)
          for _ in range(clients)]
    for t in ts:
        t.start()
    action()
    stop.set()
    for t in ts:
        t.join(10)
    return counts


def reload_under_load(endpoint, failures):
    rg = start(endpoint)
    hups = [0]

    def hup():
        end = time.monotonic() + SECONDS
        while time.monotonic() < end:
            rg.send_signal(signal.SIGHUP)
            hups[0] += 1
            time.sleep(0.1)
    try:
        counts = run_load(rg, hup)
        print("%-28s %d SIGHUPs, requests %s" % ("reload under load", hups[0], counts))
        if set(counts) != {"ok"}:
            failures.append("reload under load: %s" % counts)
    finally:
        rg.stop()


def drain_under_load(endpoint, failures):
    rg = start(endpoint, drain_timeout="5s")
    rc = [None]

    def term():
        time.sleep(2)
        rg.send_signal(signal.SIGTERM)
        rc[0] = rg.wait_exit(15)
    counts = run_load(rg, term)
    # after the listener closed, new connections are refused: those are not drain failures
    print("%-28s requests %s, exit code %s" % ("drain under load", counts, rc[0]))
    lost = {k: v for k, v in counts.items() if k.startswith("failed") or k.startswith("status")}
    if rc[0] != 0 or lost:
        failures.append("drain under load: exit code %s, %s" % (rc[0], lost or "none lost"))


def main():
    if not os.environ.get("RETRYGATE_BIN"):
        os.environ["RETRYGATE_BIN"] = str(ROOT / "build" / "retrygate")
    if not shutil.which("cc"):
        sys.exit("soak: needs a C compiler for tests/bench/upstream.c")
    failures = []
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        up, ep = fast_upstream(tmp)
        hole = Blackhole()
        drip = mp.Drip()
        try:
            print("soak: %s, %.0f s per scenario" % (os.environ["RETRYGATE_BIN"], SECONDS))
            memory_scenario("upload 100-byte writes", hole.endpoint, mp.upload, failures)
            memory_scenario("pipelined GETs, no reads", ep, mp.pipeline, failures)
            memory_scenario("200-byte stream, no reads", drip.endpoint, mp.stream_down,
                            failures)
            reload_under_load(ep, failures)
            drain_under_load(ep, failures)
        finally:
            drip.close()
            hole.close()
            up.terminate()
            up.wait(5)
    print("soak: %.0f s, %s" % (time.monotonic() - t0,
                                "ok" if not failures else "FAILED: " + "; ".join(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
