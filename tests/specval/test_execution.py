"""Exit codes, one meaning each: 0 PASS, 1 FAIL, 2 input, 3 the system under test raised or exited,
4 INCONCLUSIVE, 5 environment error, 130 interrupted (specval.execution).

Codes 0, 1 and 2 are also proven by tests/specval/test_cli.py, 130 by
tests/specval/distribution/test_runner_faults.py, 4 of the quality and performance kinds by their
own test files. Environment faults are simulated by monkeypatching the writes (an OSError with the
errno the kernel gives), never by filling a disk. Every test here is deterministic: the fake
adapters are exact samplers on fixed seeds, and the faults are planted at fixed calls.
"""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path
from xml.etree import ElementTree as ET

import pandas as pd
import pytest
from click.testing import CliRunner

from specval import execution, seeds
from specval.cli import main
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

SMALL = {"samples_per_group": 400, "chunk_size": 100, "batch_size": 100}
GOF_ONLY = [
    {"kind": "gof", "position": 2, "role": "primary"},
    {"kind": "homogeneity", "position": 2, "role": "primary", "baseline": "nospec"},
]


@pytest.fixture
def cli(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return CliRunner()


def _run(cli, *args):
    return cli.invoke(main, list(args), catch_exceptions=False)


def _protocol(tmp_path, adapter="tests.fixtures.fake_sut:FakeSUT", **overrides) -> Path:
    return write_protocol(tmp_path, fake_protocol_dict(**{"sut": {"adapter": adapter}, **SMALL, **overrides}))


def _bundle_of(output: str) -> Path:
    line = next(line for line in output.splitlines() if line.startswith("bundle: "))
    return Path(line.removeprefix("bundle: ").split(" (resume with")[0])


def _nothing_claimed(output: Path) -> bool:
    return not output.exists() or (not seeds.read_ledger(output) and not list(output.glob("fake_t2-*")))


def _one_error_line(output: str) -> str:
    """The one line a fault prints after the bundle's announcement; no traceback."""
    assert "Traceback" not in output, output
    lines = [line for line in output.strip().splitlines() if not line.startswith("bundle: ")]
    assert len(lines) == 1, output
    return lines[0]


@pytest.mark.parametrize(
    "verdict,code", [("PASS", 0), ("FAIL", 1), ("INCONCLUSIVE", 4), ("pass", 1), (None, 1), ("ERROR", 1)]
)
def test_only_a_pass_verdict_exits_0(verdict, code):
    assert execution.verdict_exit(verdict) == code


# ---------------------------------------------------------------- 3: the system under test raised or exited


def test_adapter_calling_sys_exit_on_import_exits_3_not_0(cli, tmp_path):
    result = _run(
        cli, "run", str(_protocol(tmp_path, adapter="tests.fixtures.exits_on_import:ExitingOnImportSUT")), "--quiet"
    )
    assert result.exit_code == 3, result.output
    line = _one_error_line(result.output)
    assert "SystemExit: 0" in line and "import or constructor" in line and "no seed was claimed" in line
    assert _nothing_claimed(tmp_path / "results") and list((tmp_path / "results").glob("probe-error-*.log"))


def test_adapter_calling_sys_exit_in_the_probe_exits_3(cli, tmp_path):
    result = _run(cli, "run", str(_protocol(tmp_path, adapter="tests.fixtures.fault_suts:ExitingSUT")), "--quiet")
    assert result.exit_code == 3 and "failed in sample: SystemExit: 0; no seed was claimed" in _one_error_line(
        result.output
    )
    assert _nothing_claimed(tmp_path / "results")


def test_adapter_calling_sys_exit_mid_run_exits_3_and_keeps_an_error_bundle(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("FAULT_EXIT_AT_CALL", "4")  # 2 probe calls, then the 2nd chunk of collection
    result = _run(cli, "run", str(_protocol(tmp_path, adapter="tests.fixtures.fault_suts:ExitingSUT")), "--quiet")
    assert result.exit_code == 3 and "SystemExit: 0" in _one_error_line(result.output)
    bundle = _bundle_of(result.output)
    assert "SystemExit: 0" in (bundle / "error.log").read_text() and not (bundle / "summary.json").exists()
    assert json.loads((bundle / "sessions.json").read_text())[-1]["outcome"] == "error"


# ---------------------------------------------------------------- 4: INCONCLUSIVE


def test_a_run_that_could_test_nothing_exits_4_and_junit_reports_errors(cli, tmp_path):
    file = _protocol(tmp_path, adapter="tests.fixtures.fault_suts:PointMassSUT", tests=GOF_ONLY)
    result = _run(cli, "run", str(file), "--quiet", "--junit", "junit.xml")
    assert result.exit_code == 4, result.output
    assert "INCONCLUSIVE: inconclusive: t2_gof.nospec, t2_gof.sync, t2_homogeneity.sync_vs_nospec" in result.output
    suite = ET.parse(tmp_path / "junit.xml").getroot()
    errors = suite.findall("testcase/error")
    assert suite.get("errors") == str(len(errors)) == "3" and suite.get("skipped") == "0"
    assert all(e.get("type") == "INCONCLUSIVE" and "no sample could be tested" in e.get("message") for e in errors)
    assert not suite.findall("testcase/skipped") and not suite.findall("testcase/failure")
    assert _run(cli, "verify", str(_bundle_of(result.output))).exit_code == 0


# ---------------------------------------------------------------- 5: environment errors


def _fail_writes_from(monkeypatch, call: int, code: int) -> None:
    """Every parquet write from the `call`-th on raises OSError(`code`), as a full disk would."""
    real, calls = pd.DataFrame.to_parquet, []

    def to_parquet(frame, path, *args, **kwargs):
        calls.append(path)
        if len(calls) >= call:
            raise OSError(code, os.strerror(code), str(path))
        return real(frame, path, *args, **kwargs)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", to_parquet)


def test_disk_full_mid_collection_exits_5_keeps_the_bundle_and_it_resumes(cli, tmp_path, monkeypatch):
    file = _protocol(tmp_path)
    with monkeypatch.context() as patch:
        _fail_writes_from(patch, 3, errno.ENOSPC)
        result = _run(cli, "run", str(file), "--quiet")
    assert result.exit_code == 5, result.output
    line = _one_error_line(result.output)
    bundle = _bundle_of(result.output)
    assert line.startswith("error: environment: ENOSPC (No space left on device): ") and ".parquet" in line
    assert f"resume with: specval run --resume {bundle}" in line
    assert len(list((bundle / "samples").glob("*.parquet"))) == 2 and not (bundle / "SHA256SUMS").exists()
    assert not list((bundle / "samples").glob(".*"))  # the failed chunk's temp file is gone
    resumed = _run(cli, "run", "--resume", str(bundle), "--quiet")
    assert resumed.exit_code == 0 and "PASS" in resumed.output
    assert _run(cli, "verify", str(bundle)).exit_code == 0


@pytest.mark.parametrize("code", [errno.EFBIG, errno.EACCES, errno.EROFS])
def test_file_limits_and_permissions_exit_5_with_one_line(cli, tmp_path, monkeypatch, code):
    _fail_writes_from(monkeypatch, 1, code)
    result = _run(cli, "run", str(_protocol(tmp_path)), "--quiet")
    assert result.exit_code == 5, result.output
    assert _one_error_line(result.output).startswith(f"error: environment: {errno.errorcode[code]} (")


def test_ledger_that_is_a_directory_exits_5_before_any_seed(cli, tmp_path):
    (tmp_path / "results" / seeds.LEDGER_FILE_NAME).mkdir(parents=True)
    result = _run(cli, "run", str(_protocol(tmp_path)), "--quiet")
    assert result.exit_code == 5, result.output
    line = _one_error_line(result.output)
    assert "EISDIR (Is a directory)" in line and seeds.LEDGER_FILE_NAME in line
    assert not list((tmp_path / "results").glob("fake_t2-*"))
    listed = _run(cli, "seeds", str(_protocol(tmp_path)))  # any command: one line, exit 5
    assert listed.exit_code == 5 and "EISDIR" in _one_error_line(listed.output)


def test_a_corrupt_ledger_exits_5_before_any_seed(cli, tmp_path):
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / seeds.LEDGER_FILE_NAME).write_text("{ not json")
    result = _run(cli, "run", str(_protocol(tmp_path)), "--quiet")
    assert result.exit_code == 5 and "corrupt seed ledger" in _one_error_line(result.output)
    assert not list((tmp_path / "results").glob("fake_t2-*"))


def test_an_unwritable_junit_file_after_the_verdict_exits_5(cli, tmp_path, monkeypatch):
    from specval.report import junit

    def full(summary, path, *bundle):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(junit, "write_junit", full)
    result = _run(cli, "run", str(_protocol(tmp_path)), "--quiet", "--junit", "j.xml")
    assert result.exit_code == 5 and "PASS: all" in result.output
    assert result.output.strip().splitlines()[-1].startswith("error: environment: --junit j.xml: cannot write (ENOSPC")
