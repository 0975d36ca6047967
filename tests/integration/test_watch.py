"""--watch (SPEC §1): retrygate reloads, as on SIGHUP, when its config file changes: rewritten in
place, replaced by an editor's write-then-rename, or updated by the kubelet's symlink swap of a
mounted ConfigMap. A bad new file is logged and the old config keeps serving."""

import copy
import json
import os
import re
import shutil

import pytest

from harness import make_config, render_yaml, upstream_block, wait_for

pytestmark = pytest.mark.timeout(60)


def live_drain(rg):
    r = rg.admin("GET", "/config")
    assert r.status == 200, r
    return json.loads(r.body)["drain_timeout"]


def with_drain(cfg, value):
    new = copy.deepcopy(cfg)
    new["drain_timeout"] = value
    return render_yaml(new)


def reloads(rg):
    return len(re.findall(r"\breloaded\b", rg.stderr_text()))


def watched(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, drain_timeout="2s")
    return cfg, rg_factory(cfg, args=["--watch"])


def test_rewrite_in_place_reloads(rg_factory, upstream):
    cfg, rg = watched(rg_factory, upstream)
    assert live_drain(rg) == "2s"
    with open(rg.config_path, "r+") as f:       # same inode, truncated and written
        f.truncate(0)
        f.write(with_drain(cfg, "3s"))
    wait_for(lambda: live_drain(rg) == "3s", 5, what="/config after the rewrite")
    assert rg.get("/").status == 200


def test_editor_write_then_rename_reloads_once_per_save(rg_factory, upstream):
    cfg, rg = watched(rg_factory, upstream)
    before = reloads(rg)
    for n, value in enumerate(["3s", "4s"], 1):
        tmp = rg.config_path.with_name(".retrygate.yaml.swp")
        tmp.write_text(with_drain(cfg, value))
        os.rename(tmp, rg.config_path)
        wait_for(lambda: live_drain(rg) == value, 5, what="/config after save %d" % n)
        wait_for(lambda: reloads(rg) >= before + n, 3, what="reload %d logged" % n)
    assert reloads(rg) == before + 2, rg.stderr_text()


def kubelet_update(mount, text, stamp):
    """What the kubelet does to a ConfigMap volume: the files in a new timestamped directory,
    a ..data_tmp symlink to it renamed atomically onto ..data, then the old directory removed."""
    new_dir = mount / stamp
    new_dir.mkdir()
    (new_dir / "retrygate.yaml").write_text(text)
    old = os.readlink(mount / "..data") if (mount / "..data").is_symlink() else None
    os.symlink(stamp, mount / "..data_tmp")
    os.rename(mount / "..data_tmp", mount / "..data")
    if old:
        shutil.rmtree(mount / old)


def test_configmap_symlink_swap_reloads(rg_factory, upstream):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, drain_timeout="2s")
    rg = rg_factory(cfg, args=["--watch"], start=False)
    mount = rg.config_path.parent
    text = rg.config_path.read_text()
    rg.config_path.unlink()
    kubelet_update(mount, text, "..2026_12_04_10_00_00.000000001")
    os.symlink("..data/retrygate.yaml", rg.config_path)     # FILE -> ..data/FILE
    rg.start()
    assert live_drain(rg) == "2s"
    kubelet_update(mount, with_drain(cfg, "3s"), "..2026_12_04_10_01_00.000000002")
    wait_for(lambda: live_drain(rg) == "3s", 5, what="/config after the first swap")
    # the second swap: the directory the first one pointed to is gone by now
    kubelet_update(mount, with_drain(cfg, "4s"), "..2026_12_04_10_02_00.000000003")
    wait_for(lambda: live_drain(rg) == "4s", 5, what="/config after the second swap")
    assert rg.get("/").status == 200


def test_bad_file_is_logged_and_the_old_config_serves_until_a_good_one(rg_factory, upstream):
    cfg, rg = watched(rg_factory, upstream)
    start = len(rg.stderr_text())
    rg.config_path.write_text(with_drain(cfg, "3s").replace("drain_timeout", "drain_timeoutt"))
    rg.wait_stderr(r"reload of .* failed", 5, start=start)
    assert "drain_timeoutt" in rg.stderr_text()[start:]
    assert live_drain(rg) == "2s"
    assert rg.get("/").status == 200
    rg.config_path.write_text(with_drain(cfg, "3s"))
    wait_for(lambda: live_drain(rg) == "3s", 5, what="/config after the good file")
    assert rg.get("/").status == 200


def test_symlink_to_a_file_elsewhere_follows_its_target(rg_factory, upstream, tmp_path):
    cfg = make_config(upstreams={"api": upstream_block(upstream)}, drain_timeout="2s")
    rg = rg_factory(cfg, args=["--watch"], start=False)
    elsewhere = tmp_path / "etc-retrygate"
    elsewhere.mkdir()
    target = elsewhere / "real.yaml"
    target.write_text(rg.config_path.read_text())
    rg.config_path.unlink()
    os.symlink(target, rg.config_path)
    rg.start()
    tmp = elsewhere / "real.yaml.new"
    tmp.write_text(with_drain(cfg, "3s"))
    os.rename(tmp, target)                           # only the target's directory sees this
    wait_for(lambda: live_drain(rg) == "3s", 5, what="/config after the target changed")
