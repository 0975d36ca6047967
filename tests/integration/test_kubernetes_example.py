"""docker/kubernetes/: the pod example's invariants, read from its manifests (PyYAML), and its
config run by the real binary as the pod runs it.

* retrygate is a native sidecar: an init container with restartPolicy Always, a startupProbe
  (the app starts once it serves), started with the ConfigMap's file and --watch, the file
  mounted as a directory (a subPath mount is never updated);
* its probes ask /ready (startup, readiness) and /healthz (liveness) on the config's admin
  port, Prometheus' scrape annotations name that port and /metrics, its container ports are the
  config's listeners and admin port, and the Service sends callers to a listener that binds
  the pod's address;
* the admin token is `${ADMIN_TOKEN}` in the config and that variable comes from the Secret;
* terminationGracePeriodSeconds exceeds the longest preStop plus drain_timeout;
* memory requests and limits are set;
* the config passes --check with ADMIN_TOKEN set; run with the pod's arguments in a directory
  laid out as the kubelet lays out a ConfigMap volume, it answers the probes, takes the Secret's
  token for the kill switch, and reloads when the ConfigMap changes the way the kubelet
  changes it (a new timestamped directory, the ..data symlink renamed over).
"""

import os
import re
from pathlib import Path

import pytest
import yaml

from harness import REPO_ROOT, Retrygate, check_config, free_port, run_binary, wait_for

KDIR = REPO_ROOT / "docker/kubernetes"
TOKEN = "k8s-example-token"


def _docs():
    docs = []
    for f in sorted(KDIR.glob("*.yaml")):
        docs += [d for d in yaml.safe_load_all(f.read_text()) if d]
    return docs


def _one(docs, kind, name=None):
    found = [d for d in docs if d["kind"] == kind and name in (None, d["metadata"]["name"])]
    assert len(found) == 1, "%s %s: %d manifests" % (kind, name or "", len(found))
    return found[0]


def _duration_s(v):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", str(v))
    assert m, v
    n, unit = int(m.group(1)), m.group(2) or "ms"
    return n * {"ms": 0.001, "s": 1, "m": 60, "h": 3600}[unit]


def _port(listen):
    return int(str(listen).rsplit(":", 1)[1])


def _prestop_seconds(container):
    hook = container.get("lifecycle", {}).get("preStop")
    if not hook:
        return 0
    if "sleep" in hook:
        return int(hook["sleep"]["seconds"])
    cmd = hook["exec"]["command"]
    assert Path(cmd[0]).name == "sleep" and len(cmd) == 2, "a preStop other than sleep: %s" % cmd
    return int(cmd[1])


class Example:
    """The manifests, the sidecar, the app and the config the ConfigMap holds."""

    def __init__(self):
        self.docs = _docs()
        self.deploy = _one(self.docs, "Deployment", "orders")
        self.pod = self.deploy["spec"]["template"]
        self.spec = self.pod["spec"]
        sidecars = [c for c in self.spec.get("initContainers", [])
                    if c["image"].split(":")[0].endswith("retrygate")]
        assert len(sidecars) == 1, "one retrygate init container"
        self.sidecar = sidecars[0]
        self.apps = self.spec["containers"]
        args = list(self.sidecar["args"])
        self.config_path = args[args.index("-c") + 1]
        self.other_args = [a for i, a in enumerate(args)
                           if a != "-c" and (i == 0 or args[i - 1] != "-c")]
        mounts = [m for m in self.sidecar["volumeMounts"]
                  if self.config_path.startswith(m["mountPath"].rstrip("/") + "/")]
        assert len(mounts) == 1, "the config path %s is under one mount" % self.config_path
        self.mount = mounts[0]
        vol = [v for v in self.spec["volumes"] if v["name"] == self.mount["name"]][0]
        self.configmap = _one(self.docs, "ConfigMap", vol["configMap"]["name"])
        self.key = self.config_path[len(self.mount["mountPath"].rstrip("/")) + 1:]
        self.config_text = self.configmap["data"][self.key]
        self.config = yaml.safe_load(self.config_text)
        self.admin_port = _port(self.config["admin"]["listen"])
        self.listen = {ln["name"]: ln["listen"] for ln in self.config["listeners"]}


@pytest.fixture(scope="module")
def ex():
    return Example()


def test_sidecar_is_native(ex):
    assert ex.sidecar["restartPolicy"] == "Always"
    assert all(c["name"] != ex.sidecar["name"] for c in ex.apps)
    # the app waits for a sidecar that serves, not one that merely started
    probe = ex.sidecar["startupProbe"]["httpGet"]
    assert (probe["path"], probe["port"]) == ("/ready", ex.admin_port)


def test_config_from_the_configmap_with_watch(ex):
    assert "--watch" in ex.other_args
    # a directory mount: a subPath mount is never updated, and --watch would never fire
    assert "subPath" not in ex.mount and "/" not in ex.key
    assert ex.mount.get("readOnly") is True


def test_probes_ask_the_admin_port(ex):
    probes = {k: ex.sidecar[k]["httpGet"] for k in ("readinessProbe", "livenessProbe")}
    assert probes["readinessProbe"]["path"] == "/ready"
    assert probes["livenessProbe"]["path"] == "/healthz"
    ports = {p.get("name"): p["containerPort"] for p in ex.sidecar["ports"]}
    for p in probes.values():
        assert ports.get(p["port"], p["port"]) == ex.admin_port
    # the kubelet probes the pod's address: the admin listener must not be loopback only
    assert not ex.config["admin"]["listen"].startswith("127.")


def test_container_ports_are_the_listeners(ex):
    ports = {p["containerPort"] for p in ex.sidecar["ports"]}
    assert ports == {_port(a) for a in ex.listen.values()} | {ex.admin_port}
    # the Service reaches a listener bound to the pod's address
    svc = _one(ex.docs, "Service", "orders")
    for sp in svc["spec"]["ports"]:
        target = sp["targetPort"]
        names = {p.get("name"): p["containerPort"] for p in ex.sidecar["ports"]}
        target = names.get(target, target)
        bound = [a for a in ex.listen.values() if _port(a) == target]
        assert bound and not bound[0].startswith("127."), (target, ex.listen)


def test_scrape_annotations_name_the_admin_port(ex):
    ann = ex.pod["metadata"]["annotations"]
    assert ann["prometheus.io/scrape"] == "true"
    assert int(ann["prometheus.io/port"]) == ex.admin_port
    assert ann["prometheus.io/path"] == "/metrics"


def test_admin_token_from_the_secret(ex):
    assert ex.config["admin"]["token"] == "${ADMIN_TOKEN}"
    assert ex.config_text.count("${") == 1, "no other ${NAME} the pod does not set"
    env = {e["name"]: e for e in ex.sidecar["env"]}
    ref = env["ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
    secret = _one(ex.docs, "Secret", ref["name"])
    assert ref["key"] in secret.get("stringData", {}) or ref["key"] in secret.get("data", {})


def test_grace_period_covers_prestop_and_drain(ex):
    grace = ex.spec["terminationGracePeriodSeconds"]
    drain = _duration_s(ex.config.get("drain_timeout", "15s"))
    prestop = max(_prestop_seconds(c) for c in ex.apps + [ex.sidecar])
    # the app sleeps first, so callers that still have the pod's address meet a live app
    assert all(_prestop_seconds(c) > 0 for c in ex.apps)
    assert _prestop_seconds(ex.sidecar) > 0
    assert grace > prestop + drain, (grace, prestop, drain)


def test_memory_is_sized(ex):
    res = ex.sidecar["resources"]
    mib = lambda v: int(re.fullmatch(r"(\d+)Mi", v).group(1))
    # README: about 6 MiB at rest, 40 MiB with 5,000 connections, HTTP/2 responses waiting
    # for slow clients capped at 64 MiB per process
    assert 8 <= mib(res["requests"]["memory"]) <= mib(res["limits"]["memory"])
    assert mib(res["limits"]["memory"]) >= 64 + 40


def test_config_passes_check(ex, tmp_path):
    path = tmp_path / "retrygate.yaml"
    path.write_text(ex.config_text)
    cp = run_binary("-c", path, "--check", env={"ADMIN_TOKEN": TOKEN})
    assert cp.returncode == 0, cp.stderr


def _binary_knows(flag):
    cp = run_binary("--help")
    return flag in cp.stdout + cp.stderr


def _expands_env():
    cp = check_config('admin: { listen: "127.0.0.1:@ADMIN_PORT@", token: "${RG_K8S_UNSET_VAR}" }\n'
                      'listeners: [{ name: l, listen: "127.0.0.1:@PORT@", '
                      'routes: [{ upstream: u }] }]\n'
                      'upstreams: { u: { endpoints: ["127.0.0.1:1"] } }\n')
    return cp.returncode != 0


class ConfigMapVolume:
    """A directory laid out as the kubelet's atomic writer lays out a ConfigMap volume:
    KEY -> ..data/KEY, ..data -> ..<timestamp>/; update() writes a new timestamped directory,
    points ..data_tmp at it and renames it over ..data, then removes the old one."""

    def __init__(self, root, key):
        self.root, self.key, self.n, self.current = Path(root), key, 0, None
        self.root.mkdir(parents=True, exist_ok=True)

    def update(self, text):
        self.n += 1
        d = self.root / ("..2026_12_04_00_00_%02d.%d" % (self.n, os.getpid()))
        d.mkdir()
        (d / self.key).write_text(text)
        tmp = self.root / "..data_tmp"
        os.symlink(d.name, tmp)
        os.rename(tmp, self.root / "..data")
        if not (self.root / self.key).is_symlink():
            os.symlink("..data/" + self.key, self.root / self.key)
        if self.current:
            for f in self.current.iterdir():
                f.unlink()
            self.current.rmdir()
        self.current = d


def test_pod_runs_it(ex, tmp_path, upstream):
    if not _expands_env():
        pytest.skip("this binary does not expand ${NAME} config values yet")
    if not _binary_knows("--watch"):
        pytest.skip("this binary has no --watch yet")
    ports = {name: free_port() for name in ex.listen}
    admin = free_port()

    def config(max_attempts):
        text = ex.config_text.replace(ex.config["admin"]["listen"], "127.0.0.1:%d" % admin)
        for name, addr in ex.listen.items():
            text = text.replace('"%s"' % addr, '"127.0.0.1:%d"' % ports[name])
        text = text.replace('"127.0.0.1:8080"', '"%s"' % upstream.endpoint)
        return re.sub(r"(payments:\n(?:\s+.*\n)*?\s+max_attempts: )\d+", r"\g<1>%d" % max_attempts,
                      text)

    rg = Retrygate(config(3), workdir=tmp_path / "rg", start=False, env={"ADMIN_TOKEN": TOKEN},
                   args=ex.other_args, port=ports["ingress"], admin_port=admin)
    vol = ConfigMapVolume(tmp_path / "etc-retrygate", ex.key)
    vol.update(config(3))
    rg.config_path = vol.root / ex.key
    rg.start()
    try:
        assert rg.admin("GET", "/ready").status == 200
        assert rg.admin("GET", "/healthz").status == 200
        assert rg.admin("GET", "/metrics").status == 200
        assert rg.get("/hello").status == 200                 # the ingress reaches the app
        assert rg.set_retries(False, "payments").status == 403
        assert rg.set_retries(False, "payments", token=TOKEN).status == 200
        assert rg.set_retries(True, "payments", token=TOKEN).status == 200
        pay = lambda: rg.config_json()["upstreams"]["payments"]["retry"]["max_attempts"]
        assert pay() == 3
        vol.update(config(2))                                   # kubectl apply of a change
        wait_for(lambda: pay() == 2, timeout=20, what="--watch reloads the swapped ConfigMap")
        assert rg.get("/hello").status == 200
    finally:
        assert rg.stop() == 0
