"""What operators expect beside retrygate's own figures (issue 15): retrygate_build_info,
the process_* basics read from /proc/self at scrape, config reload results and the time of
the last successful load, all valid for `promtool check metrics`; and log_format: json, where
every stderr line is one JSON object."""

import json
import os
import shutil
import subprocess
import time

import pytest

from harness import make_config, upstream_block, wait_for


def _promtool_ok(text):
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus)")
    cp = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                        text=True, timeout=30)
    assert cp.returncode == 0 and not cp.stdout.strip() and not cp.stderr.strip(), \
        (cp.stdout, cp.stderr)


def _families(text):
    """{name: type} from the # TYPE lines"""
    return {ln.split()[2]: ln.split()[3] for ln in text.splitlines() if ln.startswith("# TYPE ")}


def test_build_and_process_figures(rg_factory, upstream):
    t0 = time.time()
    rg = rg_factory(upstreams={"api": upstream})
    assert rg.get("/").status == 200
    text = rg.metrics_text()
    _promtool_ok(text)
    fam = _families(text)
    for name, typ in (("retrygate_build_info", "gauge"),
                      ("process_resident_memory_bytes", "gauge"),
                      ("process_open_fds", "gauge"),
                      ("process_cpu_seconds_total", "counter"),
                      ("process_start_time_seconds", "gauge"),
                      ("retrygate_config_reloads_total", "counter"),
                      ("retrygate_config_last_reload_success_timestamp_seconds", "gauge")):
        assert fam.get(name) == typ, (name, fam.get(name))
    from harness import run_binary
    version = run_binary("--version").stdout.split()[1]
    mx = rg.metrics()
    assert mx.value("retrygate_build_info", version=version) == 1
    pid = rg.proc.pid
    with open("/proc/%d/status" % pid) as f:
        rss_kb = int(next(ln for ln in f if ln.startswith("VmRSS:")).split()[1])
    rss = mx.value("process_resident_memory_bytes")
    assert 0.5 * rss_kb * 1024 < rss < 2 * rss_kb * 1024 + 4e6, (rss, rss_kb)
    fds = len(os.listdir("/proc/%d/fd" % pid))
    assert abs(mx.value("process_open_fds") - fds) <= 3, (mx.value("process_open_fds"), fds)
    assert t0 - 5 < mx.value("process_start_time_seconds") <= time.time() + 1
    assert 0 <= mx.value("process_cpu_seconds_total") < 60
    loaded = mx.value("retrygate_config_last_reload_success_timestamp_seconds")
    assert t0 - 1 < loaded <= time.time() + 1
    st = rg.stats()["process"]
    assert st["build_info"] == {"version": version}
    assert st["config_reloads"] == {"ok": 0, "failed": 0}


def test_reloads_counted_by_result(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream})
    rg = rg_factory(cfg)
    first = rg.metric("retrygate_config_last_reload_success_timestamp_seconds")
    assert rg.metric("retrygate_config_reloads_total", result="ok") == 0
    bad = rg.config_text.replace("endpoints:", "endpoits:")
    log = rg.reload(bad)
    assert "failed" in log
    assert rg.metric("retrygate_config_reloads_total", result="failed") == 1
    assert rg.metric("retrygate_config_reloads_total", result="ok") == 0
    # a failed reload leaves the time of the config in use
    assert rg.metric("retrygate_config_last_reload_success_timestamp_seconds") == first
    time.sleep(0.01)
    rg.reload(cfg)
    assert rg.metric("retrygate_config_reloads_total", result="ok") == 1
    assert rg.metric("retrygate_config_last_reload_success_timestamp_seconds") > first
    _promtool_ok(rg.metrics_text())


def test_log_format_json_every_line_parses(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, log_format="json")
    rg = rg_factory(cfg, env={"RETRYGATE_LOG": "debug"})
    upstream.push(503)
    assert rg.get("/retry").status == 200                  # debug lines per attempt
    data, _ = rg.raw(b"GET / HTTP/1.1\r\nX-Odd: \"quoted\\\"\r\n\r\n")   # no Host: refused
    assert data.startswith(b"HTTP/1.1 400")
    bad = rg.config_text.replace("endpoints:", "endpoits:")
    rg.reload(bad)                                          # errors quoting the config file
    rg.reload(cfg)
    rg.stop()
    lines = rg.stderr_text().rstrip("\n").split("\n")
    assert len(lines) >= 5, lines
    objs = []
    for ln in lines:
        obj = json.loads(ln)                                # every line is one object
        assert set(obj) >= {"time", "level", "msg"}, obj
        assert obj["level"] in ("debug", "info", "warn", "error"), obj
        assert obj["time"].endswith("Z") and "T" in obj["time"], obj
        objs.append(obj)
    assert any(o["level"] == "error" and "endpoits" in o["msg"] for o in objs), objs
    refused = [o for o in objs if o["msg"].startswith("refused 400")]
    assert refused and isinstance(refused[0].get("session"), int), objs
    assert any(o["msg"].startswith("reloaded") for o in objs)
    assert objs[-1]["msg"] == "stopped"


def test_log_format_text_by_default_and_checked(rg_factory, upstream):
    from harness import check_config
    rg = rg_factory(upstreams={"api": upstream})
    rg.stop()
    assert not rg.stderr_text().startswith("{")
    cp = check_config(make_config(upstreams={"api": ["127.0.0.1:9"]}, log_format="jsn"))
    assert cp.returncode == 1
    assert 'log_format: unknown value "jsn" (did you mean "json"?)' in cp.stderr, cp.stderr
