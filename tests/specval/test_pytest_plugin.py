"""The pytest plugin, run as a team runs it: pytest on a copy of examples/pytest/ (the example the
docs point to, so it cannot rot) plus failing uses of the marker, in a subprocess with `-p
specval.pytest_plugin` (the example's pytest.ini), which works with or without the installed entry
point.

False-fail rate: the example's PASS test runs the toy protocol's smoke profile on fixed seeds (two
p-valued gating families at alpha 0.01: <= 0.02 over seed choices, fixed on a platform); the planted
bug is caught by the exact quadrature (deterministic); the refusals are deterministic.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"

FAILING_USES = """
import pytest

@pytest.mark.specval("planted.yaml", profile="smoke", exploratory=True)
def test_planted_bug_fails_the_test(specval_result):
    raise AssertionError("not reached: the run FAILs before the body")

@pytest.mark.specval("planted.yaml", profile="smoke")
def test_unfrozen_protocol_is_refused(specval_result):
    raise AssertionError("not reached")

@pytest.mark.specval(profile="smoke")
def test_marker_without_protocol(specval_result):
    raise AssertionError("not reached")
"""


def _example_copy(tmp_path: Path) -> Path:
    for name in ("pytest", "adapter_minimal"):
        shutil.copytree(EXAMPLES / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "results"))
    suite = tmp_path / "pytest"
    raw = yaml.safe_load((tmp_path / "adapter_minimal" / "protocol.yaml").read_text())
    raw["sut"]["options"] = {"mutant": "residual_from_p"}
    (suite / "planted.yaml").write_text(yaml.safe_dump(raw))
    (suite / "test_failing_uses.py").write_text(FAILING_USES)
    return suite


def _pytest(suite: Path, *args: str) -> tuple[int, str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    return done.returncode, done.stdout + done.stderr


def test_the_example_suite_passes_and_a_failing_run_names_its_criteria_and_bundle(tmp_path):
    suite = _example_copy(tmp_path)
    code, out = _pytest(suite, "--junitxml", "j.xml", "--specval-output", "bundles", "-o", "junit_family=xunit1")
    assert code == 1 and "1 failed, 2 passed, 2 errors" in out, out  # refusals: setup errors
    failure = out[out.index("test_planted_bug_fails_the_test") :]
    assert "toy_t2 (smoke): EXPLORATORY FAIL" in failure and "quadrature.sync" in failure
    assert f"bundle: {suite / 'bundles'}" in failure and "raise AssertionError" not in out  # no traceback
    assert "specval refused" in out and "not frozen" in out.lower() and "During handling" not in out
    assert "@pytest.mark.specval takes one protocol path" in out
    cases = {case.get("name"): case for case in ET.parse(suite / "j.xml").getroot().iter("testcase")}
    recorded = {p.get("name"): p.get("value") for p in cases["test_toy_sampler_is_lossless"].iter("property")}
    assert recorded["specval_verdict"] == "PASS" and Path(recorded["specval_bundle"]).parent == suite / "bundles"
    assert (Path(recorded["specval_bundle"]) / "SHA256SUMS").is_file()


def test_the_profile_option_overrides_every_profile(tmp_path):
    """Deterministic and quick: a profile the protocol lacks is refused before any seed is claimed."""
    suite = _example_copy(tmp_path)
    code, out = _pytest(suite, "test_toy_sampler.py::test_toy_sampler_is_lossless", "--specval-profile", "nope")
    assert code == 1 and "1 error" in out and "specval refused the run" in out and "'nope'" in out, out
