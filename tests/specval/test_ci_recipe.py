"""The CI recipe of examples/ci/ cannot rot: its shell script runs the toy adapter's frozen protocol
(examples/adapter_minimal/) with the installed specval (SPECVAL_SKIP_INSTALL=1: the suite has no
network), keeps the bundle and the JUnit file, and exits with specval's exit code; the GitHub Actions
workflow parses, calls the script and uploads the evidence whatever the verdict.

False-fail rate of the PASS assertion: the smoke profile on fixed seeds (a fresh ledger), two p-valued
gating families at alpha 0.01: <= 0.02 over seed choices, fixed on a platform. The rest is
deterministic.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "ci"
SCRIPT = RECIPE / "specval-check.sh"
WORKFLOW = RECIPE / "specval.yml"
EXIT_INPUT = 2


def _check(tmp_path: Path, protocol: Path | None, **extra: str) -> subprocess.CompletedProcess:
    adapter = protocol.parent if protocol else tmp_path
    env = {
        **os.environ,
        "SPECVAL_SKIP_INSTALL": "1",
        "SPECVAL_PYTHON": sys.executable,
        "SPECVAL_OUTPUT": str(tmp_path / "out"),
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(adapter)]),
        "GITHUB_OUTPUT": str(tmp_path / "github_output"),
        "GITHUB_STEP_SUMMARY": str(tmp_path / "summary.md"),
    }
    env.pop("SPECVAL_PROTOCOL", None)
    env.update({"SPECVAL_PROTOCOL": str(protocol)} if protocol else {})
    env.update(extra)
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)


def test_the_script_runs_the_protocol_keeps_the_evidence_and_passes_on_the_exit_code(tmp_path):
    example = shutil.copytree(
        ROOT / "examples" / "adapter_minimal", tmp_path / "adapter", ignore=shutil.ignore_patterns("__pycache__")
    )
    done = _check(tmp_path, example / "protocol.yaml")
    assert done.returncode == 0, done.stdout + done.stderr
    bundle = Path((tmp_path / "out" / "bundle.txt").read_text().strip())
    assert bundle.parent == tmp_path / "out" and (bundle / "SHA256SUMS").is_file()
    assert "<testsuite" in (tmp_path / "out" / "junit.xml").read_text()
    assert re.search(r"^PASS: all \d+ control and primary criteria passed$", done.stdout, re.M)
    assert (tmp_path / "github_output").read_text() == f"bundle={bundle}\nexit-code=0\n"
    assert "exit 0" in (tmp_path / "summary.md").read_text()
    (example / "frozen.lock").write_text("{}\n")  # the protocol is no longer frozen: an input error
    assert _check(tmp_path, example / "protocol.yaml").returncode == EXIT_INPUT


def test_the_script_refuses_missing_settings_before_anything_runs(tmp_path):
    done = _check(tmp_path, None)
    assert done.returncode == EXIT_INPUT and "SPECVAL_PROTOCOL is not set" in done.stderr
    done = _check(tmp_path, tmp_path / "p.yaml", SPECVAL_SKIP_INSTALL="0", SPECVAL_PACKAGE="")
    assert done.returncode == EXIT_INPUT and "SPECVAL_PACKAGE is not set" in done.stderr
    assert not (tmp_path / "out").exists()


def test_the_workflow_calls_the_script_and_uploads_the_evidence_whatever_the_verdict():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    steps = job["steps"]
    runs = [step for step in steps if "ci/specval-check.sh" in step.get("run", "")]
    assert len(runs) == 1
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "${{ env.SPECVAL_OUTPUT }}"
    assert steps.index(upload) > steps.index(runs[0])
    header = SCRIPT.read_text().split("set -uo pipefail")[0]
    for name in job["env"]:
        if name.startswith("SPECVAL_"):
            assert f"#   {name} " in header, f"{name} is set by the workflow but not documented by the script"
