"""The fleet phase of `make demo` (SPEC §4 budget.shared): several sidecars, each its own
retrygate process, in front of one dependency that answers 503 to everything, with the same
steady load — once with a retry budget per sidecar, once with one budget shared through a
redis-server. It prints what the dependency went through and the bound of each setup:

  per sidecar:  retries <= N x (max_tokens + min_per_second x t) + ratio x requests
  shared:       retries <= max_tokens + ratio x requests + min_per_second x t
                (+ one 100 ms batch of credits per sidecar)

Skipped (with a line saying so) when redis-server is not installed."""

import http.client
import shutil
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from demo_common import LOOPBACK, free_port
from demo_common import start_retrygate as start_retrygate_on

FLEET = {"sidecars": 6, "seconds": 4.0, "rate": 20.0}
FLEET_QUICK = {"sidecars": 4, "seconds": 2.0, "rate": 20.0}
# fleet figures: the burst and floor the dependency takes from all sidecars together
BUDGET = {"ratio": 0.1, "min_per_second": 10, "max_tokens": 50}
BATCH_S = 0.1


class Dependency:
    """503 to everything; counts first attempts and retries by X-Retrygate-Attempt."""

    def __init__(self):
        counts = self.counts = {"first": 0, "retries": 0}
        lock = threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                with lock:
                    counts["first" if self.headers.get("X-Retrygate-Attempt", "1") == "1"
                           else "retries"] += 1
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass

        self.server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def start_redis(procs, workdir):
    exe = shutil.which("redis-server")
    if not exe:
        return None, None
    port = free_port()
    p = procs.spawn("redis-fleet", [exe, "--port", str(port), "--bind", LOOPBACK, "--save", "",
                                    "--appendonly", "no"],
                    stdout=subprocess.DEVNULL, stderr=open(workdir / "redis-fleet.log", "w"))
    end = time.monotonic() + 5
    while time.monotonic() < end:
        try:
            socket.create_connection((LOOPBACK, port), timeout=0.2).close()
            return p, port
        except OSError:
            time.sleep(0.05)
    procs.stop(p)
    return None, None


def fleet_run(procs, binary, workdir, spec, tag, shared, stop, log):
    dep = Dependency()
    budget = dict(BUDGET, shared=shared) if shared else dict(BUDGET)
    retry = {"max_attempts": 3, "backoff": {"base": "1ms", "max": "5ms"}, "budget": budget}
    sidecars = []
    try:
        for i in range(spec["sidecars"]):
            p, port, _ = start_retrygate_on(
                procs, binary, workdir / ("fleet-%s-%d.yaml" % (tag, i)),
                workdir / ("retrygate-fleet-%s-%d.log" % (tag, i)),
                "fleet sidecar %d (%s)" % (i, tag), "tests/tools/demo_fleet.py",
                ["%s:%d" % (LOOPBACK, dep.port)], {"retry": retry}, "fleet-%s-%d" % (tag, i))
            sidecars.append((p, port))

        def drive(port):
            conn = None
            t0 = time.monotonic()
            i = 0
            while not stop.is_set():
                at = t0 + i / spec["rate"]
                if at - t0 >= spec["seconds"]:
                    break
                time.sleep(max(0.0, at - time.monotonic()))
                try:
                    if conn is None:
                        conn = http.client.HTTPConnection(LOOPBACK, port, timeout=5)
                    conn.request("GET", "/pay/%d" % i, headers={"X-Timeout-Ms": "1000"})
                    conn.getresponse().read()
                except (OSError, http.client.HTTPException):
                    conn = None
                i += 1
            if conn:
                conn.close()

        t0 = time.monotonic()
        threads = [threading.Thread(target=drive, args=(port,), daemon=True)
                   for _, port in sidecars]
        for t in threads:
            t.start()
        for t in threads:
            t.join(spec["seconds"] + 15)
        t = time.monotonic() - t0
    finally:
        for p, _ in sidecars:
            procs.stop(p)
        dep.close()
    first, retries = dep.counts["first"], dep.counts["retries"]
    n = spec["sidecars"]
    fleet_bound = (BUDGET["max_tokens"] + BUDGET["ratio"] * first + BUDGET["min_per_second"] * t
                   + n * BUDGET["ratio"] * spec["rate"] * BATCH_S)
    sidecar_bound = (n * (BUDGET["max_tokens"] + BUDGET["min_per_second"] * t)
                     + BUDGET["ratio"] * first)
    log("  %s: %d sidecars x %g req/s for %.1fs: %d requests, %d retries"
        % (tag, n, spec["rate"], t, first, retries))
    return {"tag": tag, "sidecars": n, "seconds": t, "requests": first, "retries": retries,
            "amplification": (first + retries) / first if first else 0.0,
            "bound": fleet_bound if shared else sidecar_bound,
            "bound_amp": 1 + (fleet_bound if shared else sidecar_bound) / first if first else 0.0}


def fleet_phase(procs, binary, workdir, quick, stop, log):
    """Returns (per-sidecar run, shared run), or None when there is no redis-server."""
    spec = FLEET_QUICK if quick else FLEET
    log("")
    log("Fleet phase: %d sidecars, one dependency answering 503, per-sidecar budgets vs one "
        "shared budget (redis)." % spec["sidecars"])
    rp, rport = start_redis(procs, workdir)
    if rp is None:
        log("  skipped: no redis-server")
        return None
    try:
        own = fleet_run(procs, binary, workdir, spec, "per-sidecar", None, stop, log)
        shared = fleet_run(procs, binary, workdir, spec, "shared",
                           "redis://%s:%d/0" % (LOOPBACK, rport), stop, log)
    finally:
        procs.stop(rp)
    return own, shared


def fleet_table(own, shared):
    rows = [
        ("requests (first attempts), all sidecars", "%d" % own["requests"],
         "%d" % shared["requests"]),
        ("retries the dependency saw", "%d" % own["retries"], "%d" % shared["retries"]),
        ("  amplification", "%.2fx" % own["amplification"], "%.2fx" % shared["amplification"]),
        ("  its bound", "<= %.0f (%.2fx)" % (own["bound"], own["bound_amp"]),
         "<= %.0f (%.2fx)" % (shared["bound"], shared["bound_amp"])),
    ]
    w0 = max(len(r[0]) for r in rows) + 2
    out = ["%-*s %20s %20s" % (w0, "", "budget per sidecar", "one shared budget"),
           "%-*s %20s %20s" % (w0, "", "-" * 18, "-" * 17)]
    out += ["%-*s %20s %20s" % (w0, a, b, c) for a, b, c in rows]
    out.append("(budget %s; per sidecar the floor counts %d times: N x (max_tokens + "
               "min_per_second x t))" % (", ".join("%s %s" % kv for kv in BUDGET.items()),
                                         own["sidecars"]))
    return "\n".join(out)


def fleet_acceptance(own, shared):
    return [
        ("PASS" if shared["retries"] <= shared["bound"] else "FAIL",
         "fleet phase: shared budget, %d retries <= the fleet bound %.0f"
         % (shared["retries"], shared["bound"])),
        ("PASS" if own["retries"] > 1.5 * shared["retries"] else "FAIL",
         "fleet phase: per-sidecar budgets let through more (%d) than one shared budget (%d)"
         % (own["retries"], shared["retries"])),
    ]
