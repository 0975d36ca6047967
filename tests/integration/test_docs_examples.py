"""What the README, the reference config, docker/ and /metrics tell an operator holds on its own:
no reference to a document the repository does not have, an mTLS example whose certificates
are made by the commands it shows (run here as shown, then the config with --check and curl's
answers), and one formula for the retry budget's bound wherever it is stated."""

import re
import subprocess
from pathlib import Path

from harness import REPO_ROOT, Retrygate, free_port, run_binary

README = REPO_ROOT / "README.md"
# The bound of the retry budget, written the same way everywhere it is stated.
BOUND = "retries <= max_tokens + ratio x requests + min_per_second x t"


def _user_docs():
    """README.md, every config under conf/ and every text file under docker/."""
    files = [README] + sorted((REPO_ROOT / "conf").rglob("*.yaml"))
    files += [p for p in sorted((REPO_ROOT / "docker").rglob("*"))
              if p.is_file() and p.suffix in (".md", ".yaml", ".yml", ".json", "")]
    return files


def test_docs_cite_no_missing_spec_file():
    bad = []
    for path in _user_docs():
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bSPEC\b|SPEC\.md|\.\./shared", line):
                bad.append("%s:%d: %s" % (path.relative_to(REPO_ROOT), n, line.strip()))
    assert not bad, "documents cite a SPEC the repository does not have:\n" + "\n".join(bad)


def test_metrics_help_cites_no_missing_spec_file(rg):
    text = rg.admin("GET", "/metrics").text
    helps = [line for line in text.splitlines() if line.startswith("# HELP")]
    assert helps
    assert [h for h in helps if "SPEC" in h or "§" in h] == []


def test_one_formula_for_the_budget_bound():
    readme = README.read_text()
    intro = readme.split("\n## ", 1)[0]
    gray = readme.split("\n## Run a gray test", 1)[1].split("\n## ", 1)[0]
    flat = lambda s: re.sub(r"\s+", " ", s)
    assert BOUND in flat(intro)
    assert BOUND in flat(gray)
    conf = (REPO_ROOT / "conf/retrygate.yaml").read_text()
    assert BOUND in flat(conf.replace("#", " "))
    # the amplification that follows from it always keeps the floor of min_per_second
    for text in (readme, conf):
        for m in re.finditer(r"1 \+ ratio\b", flat(text.replace("#", " "))):
            after = flat(text.replace("#", " "))[m.end():m.end() + 30]
            assert after.lstrip(" +").startswith("min_per_second"), after


def _mtls_blocks():
    readme = README.read_text()
    part = readme[readme.index("**mTLS.**"):]
    blocks = re.findall(r"```(\w+)\n(.*?)```", part, re.S)
    assert [lang for lang, _ in blocks[:3]] == ["sh", "yaml", "sh"], blocks[:3]
    return [body for _, body in blocks[:3]]


def test_mtls_example_makes_its_certificates_and_runs(tmp_path, upstream):
    commands, config, session = _mtls_blocks()
    cp = subprocess.run(["sh", "-ec", commands], cwd=tmp_path, capture_output=True, text=True,
                        timeout=120)
    assert cp.returncode == 0, cp.stderr
    named = set(re.findall(r'"(tls/[^"]+)"', config))
    assert named and all((tmp_path / f).is_file() for f in named), named

    # the config as shown, with its files found from the repository root
    shown = config.replace('"tls/', '"%s/tls/' % tmp_path)
    cp = run_binary("-c", _write(tmp_path / "shown.yaml", shown), "--check")
    assert cp.returncode == 0, cp.stderr

    # and run: free ports, the app being tests/tools/upstream.py
    port = free_port()
    running = ('admin: { listen: "127.0.0.1:@ADMIN_PORT@" }\n' +
               shown.replace("127.0.0.1:15443", "127.0.0.1:%d" % port)
                    .replace("127.0.0.1:8080", upstream.endpoint))
    rg = Retrygate(running, workdir=tmp_path / "rg", port=port)
    try:
        steps = re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", session, re.M)
        assert len(steps) == 2
        for cmd, want in steps:
            cmd = cmd.replace("localhost:15443", "localhost:%d" % port)
            cp = subprocess.run(["bash", "-c", cmd], cwd=tmp_path, capture_output=True,
                                text=True, timeout=30)
            got = [line.strip() for line in cp.stdout.splitlines()]
            assert got == [line.strip() for line in want.splitlines()], (cmd, cp.stdout,
                                                                          cp.stderr)
    finally:
        rg.stop()


def _write(path, text):
    Path(path).write_text(text)
    return str(path)
