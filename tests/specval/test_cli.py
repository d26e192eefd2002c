"""CLI: exit 0 PASS, 1 FAIL / does not verify, 2 usage or input error; every subcommand runs."""

from __future__ import annotations

import json
from pathlib import Path
from xml.etree import ElementTree as ET

import pytest
from click.testing import CliRunner

from specval.cli import main
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol


@pytest.fixture
def cli(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    return CliRunner()


def _run(cli, *args):
    return cli.invoke(main, list(args), catch_exceptions=False)


def test_run_pass_then_verify_then_seeds_ls_and_junit(cli, tmp_path):
    file = write_protocol(tmp_path, fake_protocol_dict())
    result = _run(cli, "run", str(file), "--profile", "ci", "--quiet", "--junit", "junit.xml")
    assert result.exit_code == 0, result.output
    assert "PASS: all" in result.output
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    assert bundle.parent == Path("results") and (tmp_path / bundle / "SHA256SUMS").exists()
    assert "<testsuite" in (tmp_path / "junit.xml").read_text()
    assert _run(cli, "verify", str(bundle)).exit_code == 0
    seeds = _run(cli, "seeds", str(file), "--profile", "ci")
    assert "held" in seeds.output and "[0, 800)" in seeds.output and "[1600, 2400)" in seeds.output
    assert "PASS" in _run(cli, "ls").output
    assert _run(cli, "report", str(bundle)).exit_code == 0
    summary = tmp_path / bundle / "summary.json"
    summary.write_text(summary.read_text().replace('"verdict": "PASS"', '"verdict": "FAIL"', 1))
    result = _run(cli, "verify", str(bundle))
    assert result.exit_code == 1 and "summary.json: sha256 differs" in result.output
    assert _run(cli, "report", str(bundle)).exit_code == 2  # refuses to re-seal a changed bundle


def test_failing_sut_exits_1(cli, tmp_path):
    raw = fake_protocol_dict(sut={"adapter": "tests.fixtures.fake_sut:BuggyFakeSUT"})
    result = _run(cli, "run", str(write_protocol(tmp_path, raw)), "--profile", "ci", "--quiet", "--junit", "j.xml")
    assert result.exit_code == 1 and "FAIL: failed:" in result.output
    cases = {case.get("name"): case for case in ET.parse(tmp_path / "j.xml").getroot().iter("testcase")}
    assert cases["quadrature.adversarial"].get("classname") == "control"
    assert cases["quadrature.adversarial"].find("failure") is not None


def test_input_errors_exit_2_before_any_sampling(cli, tmp_path):
    bad = write_protocol(tmp_path, fake_protocol_dict(alhpa=0.01), "bad.yaml")
    result = _run(cli, "validate", str(bad))
    assert result.exit_code == 2 and "alhpa: unknown key; did you mean 'alpha'?" in result.output
    groups = fake_protocol_dict()["groups"] + [{"name": "async", "mode": "async"}]
    unsupported = fake_protocol_dict(groups=groups)
    result = _run(cli, "run", str(write_protocol(tmp_path, unsupported, "u.yaml")), "--quiet")
    assert result.exit_code == 2 and "mode 'async' is not supported" in result.output
    assert not Path("results").exists()  # refused before any seed was claimed
    (tmp_path / "unfrozen").mkdir()
    unfrozen = write_protocol(tmp_path / "unfrozen", fake_protocol_dict(), frozen=False)
    result = _run(cli, "run", str(unfrozen), "--quiet")
    assert result.exit_code == 2 and "not frozen" in result.output and "--exploratory" in result.output
    assert _run(cli, "run", str(unfrozen), "--profile", "cj", "--quiet", "--exploratory").exit_code == 2
    assert not Path("results").exists()
    assert _run(cli, "run", "--quiet").exit_code == 2  # neither a protocol nor --resume


def test_freeze_validate_and_exploratory_run(cli, tmp_path):
    file = write_protocol(tmp_path, fake_protocol_dict(samples_per_group=400), frozen=False)
    result = _run(cli, "validate", str(file))
    assert result.exit_code == 0 and "not frozen" in result.output
    assert _run(cli, "freeze", str(file)).exit_code == 0
    lock = json.loads((tmp_path / "frozen.lock").read_text())
    assert "(frozen)" in _run(cli, "validate", str(file)).output
    assert _run(cli, "run", str(file), "--quiet").exit_code == 0
    write_protocol(tmp_path, fake_protocol_dict(samples_per_group=401), frozen=False)
    result = _run(cli, "validate", str(file))
    assert result.exit_code == 1 and "CHANGED" in result.output
    result = _run(cli, "run", str(file), "--confirmatory", "--quiet")
    assert result.exit_code == 2 and "changed since frozen" in result.output and str(file) in result.output
    result = _run(cli, "run", str(file), "--exploratory", "--quiet")
    assert result.exit_code == 0 and "EXPLORATORY PASS" in result.output
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["registration"] == {"state": "changed since frozen", "exploratory": True}
    assert _run(cli, "verify", str(bundle)).exit_code == 0
    assert json.loads((tmp_path / "frozen.lock").read_text()) == lock


def test_seed_offset_overlapping_the_ledger_is_refused(cli, tmp_path):
    file = write_protocol(tmp_path, fake_protocol_dict(samples_per_group=400))
    assert _run(cli, "run", str(file), "--quiet").exit_code == 0
    result = _run(cli, "run", str(file), "--quiet", "--seed-offset", "100")
    assert result.exit_code == 2 and "overlaps" in result.output


def test_ls_marks_exploratory_bundles(cli, tmp_path):
    """Deterministic: hand-made bundle folders (run.json, summary.json), one frozen, one exploratory."""
    for name, exploratory, verdict in (("a-1", False, "PASS"), ("b-1", True, "FAIL"), ("c-1", True, None)):
        bundle = tmp_path / "results" / name
        bundle.mkdir(parents=True)
        (bundle / "run.json").write_text(json.dumps({"exploratory": exploratory}))
        if verdict:
            (bundle / "summary.json").write_text(json.dumps({"verdict": verdict}))
    lines = _run(cli, "ls").output.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["PASS", "EXPLORATORY FAIL", "EXPLORATORY INCOMPLETE"]
    assert all(line.endswith(f"results/{name}") for line, name in zip(lines, ("a-1", "b-1", "c-1")))


MISSING_PACKAGE_SCRIPT = """
import sys
sys.modules[{name!r}] = None  # `import {name}` now raises ModuleNotFoundError, as in a venv without it
sys.argv = ["specval", *{argv!r}]
from specval.__main__ import entry
entry()
"""


@pytest.mark.parametrize(
    ("name", "argv"), [("click", ["--version"]), ("numpy", ["--version"]), ("cryptography", ["keygen", "KEY"])]
)
def test_a_missing_dependency_is_one_line_and_exit_5(name, argv, tmp_path):
    """The console script's guard: a third-party package missing from the environment (seen: a GPU
    machine without `cryptography`) is an environment error naming it, not a traceback, whether
    the command line imports it at start (click, numpy) or on first use (cryptography: keygen)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    argv = [str(tmp_path / "key") if arg == "KEY" else arg for arg in argv]
    done = subprocess.run(
        [sys.executable, "-c", MISSING_PACKAGE_SCRIPT.format(name=name, argv=argv)],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 5, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and f"'{name}'" in lines[0]
    assert not (tmp_path / "key").exists()


def test_the_guard_re_raises_a_missing_specval_module():
    """A module of specval itself missing is a bug: the guard must not dress it up as exit 5."""
    import subprocess
    import sys

    script = MISSING_PACKAGE_SCRIPT.format(name="specval.cli", argv=["--version"])
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1 and "ModuleNotFoundError" in done.stderr
