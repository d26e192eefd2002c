"""The CI recipe of examples/ci/ cannot rot: its shell script runs the toy adapter's frozen protocol
(examples/adapter_minimal/), or a suite of it and a planted bug, with the installed specval
(SPECVAL_SKIP_INSTALL=1: the suite has no network); it keeps every bundle and the JUnit file (a
suite: one <testsuite> per member), writes the step summary (verdict, scope, failing criteria with
their sizes), and exits with specval's exit code. The GitHub Actions workflow and the GitLab CI job
parse, call the script and keep the evidence whatever the verdict.

False-fail rate: each PASS asserted is a smoke run on fixed seeds (a fresh ledger) with two p-valued
gating families at alpha 0.01: <= 0.02 over seed choices, fixed on a platform. The planted bug
(`residual_from_p`) FAILs the deterministic quadrature controls, whatever the seeds. The rest is
deterministic.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "examples" / "ci"
SCRIPT = RECIPE / "specval-check.sh"
WORKFLOW = RECIPE / "specval.yml"
GITLAB = RECIPE / "gitlab-ci.yml"
EXIT_PASS, EXIT_FAIL, EXIT_INPUT = 0, 1, 2
PLANTED = "residual_from_p"  # the toy adapter's bug that changes the output law
DETERMINISTIC_FAILS = {"quadrature.adversarial", "quadrature.sync"}  # PLANTED fails them on any seeds


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


def _example(tmp_path: Path) -> Path:
    return shutil.copytree(
        ROOT / "examples" / "adapter_minimal", tmp_path / "adapter", ignore=shutil.ignore_patterns("__pycache__")
    )


def _freeze(path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "specval", "freeze", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def _suite(example: Path, planted: bool) -> Path:
    """A frozen suite of the toy protocol and, with `planted`, a copy of it with the planted bug."""
    members = ["protocol.yaml"]
    if planted:
        raw = yaml.safe_load((example / "protocol.yaml").read_text())
        raw["name"], raw["sut"]["options"] = "toy_t2_planted", {"mutant": PLANTED}
        (example / "planted.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
        _freeze(example / "planted.yaml")
        members.append("planted.yaml")
    suite = example / "suite.yaml"
    suite.write_text(yaml.safe_dump({"kind": "suite", "name": "toy_suite", "members": members}))
    _freeze(suite)
    return suite


def _bundles(tmp_path: Path) -> list[Path]:
    return [Path(line) for line in (tmp_path / "out" / "bundle.txt").read_text().splitlines()]


def _summary_rows(text: str) -> dict[str, str]:
    """criterion -> its row, of every table in the step summary."""
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| criterion")]
    return {row.split(" | ")[0].removeprefix("| "): row for row in rows}


def test_the_script_runs_the_protocol_keeps_the_evidence_and_passes_on_the_exit_code(tmp_path):
    example = _example(tmp_path)
    done = _check(tmp_path, example / "protocol.yaml")
    assert done.returncode == EXIT_PASS, done.stdout + done.stderr
    (bundle,) = _bundles(tmp_path)
    assert bundle.parent == tmp_path / "out" and (bundle / "SHA256SUMS").is_file()
    assert ET.parse(tmp_path / "out" / "junit.xml").getroot().tag == "testsuite"
    assert re.search(r"^PASS: all \d+ control and primary criteria passed$", done.stdout, re.M)
    assert (tmp_path / "github_output").read_text() == f"bundle={bundle}\nexit-code=0\n"
    summary = (tmp_path / "summary.md").read_text()
    assert "exit 0" in summary and "**PASS: all" in summary and "\n- tested: prompt 'abc'" in summary
    assert summary == (tmp_path / "out" / "summary.md").read_text() and not _summary_rows(summary)
    (example / "frozen.lock").write_text("{}\n")  # the protocol is no longer frozen: an input error
    refused = _check(tmp_path, example / "protocol.yaml")
    assert refused.returncode == EXIT_INPUT and (tmp_path / "out" / "bundle.txt").read_text() == ""
    assert not (tmp_path / "out" / "junit.xml").exists() and "no JUnit file" in refused.stdout
    assert "No bundle was made" in (tmp_path / "out" / "summary.md").read_text()


def test_the_script_runs_a_suite_keeps_every_bundle_and_summarises_the_planted_failure(tmp_path):
    """A suite of the toy protocol and its planted bug: exit 1 (the suite's), one <testsuite> per
    member, every bundle in bundle.txt, and the step summary names each failing criterion with its size."""
    suite = _suite(_example(tmp_path), planted=True)
    done = _check(tmp_path, suite)
    assert done.returncode == EXIT_FAIL, done.stdout + done.stderr
    (directory,) = (tmp_path / "out").glob("toy_suite-suite-*")
    record = json.loads((directory / "suite.json").read_text())
    bundles = _bundles(tmp_path)
    assert [b.name for b in bundles] == [m["bundle"] for m in record["members"]] and len(bundles) == 2
    assert all((b / "SHA256SUMS").is_file() for b in bundles)
    assert (tmp_path / "github_output").read_text() == f"bundle={directory}\nexit-code=1\n"
    root = ET.parse(tmp_path / "out" / "junit.xml").getroot()
    assert [s.get("name") for s in root.findall("testsuite")] == ["specval.toy_t2", "specval.toy_t2_planted"]
    assert [int(s.get("failures")) > 0 for s in root.findall("testsuite")] == [False, True]
    summary = (tmp_path / "summary.md").read_text()
    assert "**FAIL: suite toy_suite, 2 of 2 member(s) run" in summary and "#### toy_t2: PASS" in summary
    failing = set(json.loads((bundles[1] / "summary.json").read_text())["confirmation"]["failing"])
    rows = _summary_rows(summary)
    assert failing >= DETERMINISTIC_FAILS and set(rows) == failing
    for name in DETERMINISTIC_FAILS:
        worst = re.search(r"worst case \w+: max abs error ([0-9.e+-]+) \(limit ([0-9.e+-]+)\)", rows[name])
        assert worst and float(worst[1]) > float(worst[2]), rows[name]
    for name in failing - DETERMINISTIC_FAILS:
        assert re.search(r"p \(Holm\) [0-9.e+-]+; MDE \(TV\) [0-9.e+-]+; n \d+", rows[name]), rows[name]


def test_the_script_passes_a_suite_of_passing_members(tmp_path):
    done = _check(tmp_path, _suite(_example(tmp_path), planted=False))
    assert done.returncode == EXIT_PASS, done.stdout + done.stderr
    assert (
        len(_bundles(tmp_path)) == 1
        and "**PASS: suite toy_suite, 1 of 1 member(s) run" in (tmp_path / "summary.md").read_text()
    )
    assert [s.get("name") for s in ET.parse(tmp_path / "out" / "junit.xml").getroot()] == ["specval.toy_t2"]


def test_the_script_refuses_missing_settings_before_anything_runs(tmp_path):
    done = _check(tmp_path, None)
    assert done.returncode == EXIT_INPUT and "SPECVAL_PROTOCOL is not set" in done.stderr
    done = _check(tmp_path, tmp_path / "p.yaml", SPECVAL_SKIP_INSTALL="0", SPECVAL_PACKAGE="")
    assert done.returncode == EXIT_INPUT and "SPECVAL_PACKAGE is not set" in done.stderr
    assert not (tmp_path / "out").exists()


def _documented(variables) -> None:
    header = SCRIPT.read_text().split("set -uo pipefail")[0]
    for name in variables:
        if name.startswith("SPECVAL_"):
            assert f"#   {name} " in header, f"{name} is set by a recipe but not documented by the script"


def test_the_workflow_calls_the_script_and_uploads_the_evidence_whatever_the_verdict():
    workflow = yaml.safe_load(WORKFLOW.read_text())
    (job,) = workflow["jobs"].values()
    steps = job["steps"]
    runs = [step for step in steps if "ci/specval-check.sh" in step.get("run", "")]
    assert len(runs) == 1
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "${{ env.SPECVAL_OUTPUT }}"
    assert steps.index(upload) > steps.index(runs[0])
    report = next(step for step in steps if "report_paths" in step.get("with", {}))
    assert report["if"] == "always()" and report["with"]["report_paths"] == "${{ env.SPECVAL_OUTPUT }}/junit.xml"
    _documented(job["env"])


@pytest.mark.parametrize("branch, profile", [("merge_request", "smoke"), ("default", "ci")])
def test_the_gitlab_job_calls_the_script_and_keeps_the_evidence_and_junit(branch, profile):
    """The job runs smoke on merge requests and ci on the default branch (as the workflow does), calls
    the script, and keeps the output folder and its JUnit report whatever the verdict."""
    (job,) = yaml.safe_load(GITLAB.read_text()).values()
    assert [line for line in job["script"] if "ci/specval-check.sh" in line] == ["bash ci/specval-check.sh"]
    artifacts = job["artifacts"]
    assert artifacts["when"] == "always" and artifacts["paths"] == ["$SPECVAL_OUTPUT/"]
    assert artifacts["reports"]["junit"] == "$SPECVAL_OUTPUT/junit.xml"
    rule = job["rules"][0 if branch == "merge_request" else 1]
    assert branch in rule["if"].lower() or "CI_DEFAULT_BRANCH" in rule["if"]
    assert {**job["variables"], **rule.get("variables", {})}["SPECVAL_PROFILE"] == profile
    _documented(job["variables"])
