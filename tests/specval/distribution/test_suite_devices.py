"""`specval run SUITE --devices N`: every distribution and sequence member runs over N torchrun ranks
(one launch per member, in order), the members of other kinds in the suite's own process; the suite's
exit code, record and JUnit files are as for a one-process suite (docs/harness.md, "Suites")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from click.testing import CliRunner

from specval.cli import main
from specval.distribution import sharding
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.sharded_runs import SMALL, samples, small_protocol

pytest.importorskip("torch.distributed")

REPO = Path(__file__).resolve().parents[3]
RANKS = 2
LAUNCH_TIMEOUT_S = 300  # a hang (a rank waiting for a collective) fails the test instead of blocking CI


def _suite(directory: Path, members: list[Path]) -> Path:
    """A suite of `members` written and frozen in `directory`."""
    path = directory / "suite.yaml"
    raw = {"kind": "suite", "name": "devices_suite", "members": [m.name for m in members]}
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    frozen = CliRunner().invoke(main, ["freeze", str(path)])
    assert frozen.exit_code == 0, frozen.output
    return path


def test_each_sharded_member_is_launched_over_the_devices_with_the_suites_options(tmp_path, monkeypatch):
    first = write_protocol(tmp_path, fake_protocol_dict(name="member_a", **SMALL), name="a.yaml")
    second = write_protocol(tmp_path, fake_protocol_dict(name="member_b", **SMALL), name="b.yaml")
    suite = _suite(tmp_path, [first, second])
    launched = []

    def launch(devices, argv):  # stands in for torchrun: makes the member's bundle folder
        launched.append((devices, argv))
        name = "member_a" if argv[1] == str(first) else "member_b"
        (tmp_path / "out" / f"{name}-20261208T000000Z").mkdir(parents=True)
        return 0 if name == "member_a" else 1

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sharding, "launch", launch)
    result = CliRunner().invoke(
        main, ["run", str(suite), "--devices", "2", "--quiet", "--output", "out", "--junit", "j/suite.xml"]
    )
    assert result.exit_code == 1, result.output  # the most severe member's
    assert [(devices, argv[:2]) for devices, argv in launched] == [(2, ["run", str(first)]), (2, ["run", str(second)])]
    for _, argv in launched:
        assert "--devices" not in argv and str(suite) not in argv and argv.count("--junit") == 1
        assert argv[argv.index("--output") + 1] == "out" and "--quiet" in argv
    assert launched[0][1][-1].endswith("member_a.junit.xml") and launched[1][1][-1].endswith("member_b.junit.xml")
    record = json.loads(next((tmp_path / "out").glob("devices_suite-*/suite.json")).read_text())
    assert [m["exit"] for m in record["members"]] == [0, 1]
    assert [Path(m["bundle"]).name for m in record["members"]] == [
        "member_a-20261208T000000Z",
        "member_b-20261208T000000Z",
    ]
    assert (tmp_path / "j" / "suite.xml").is_file()


def test_a_member_that_cannot_run_over_the_devices_refuses_the_suite_before_any_member_runs(tmp_path, monkeypatch):
    member = write_protocol(tmp_path, fake_protocol_dict(name="member_a", **SMALL), name="a.yaml")
    suite = _suite(tmp_path, [member])
    monkeypatch.setattr(sharding, "launch", lambda devices, argv: pytest.fail("launched"))
    monkeypatch.setattr(sharding, "protocol_device", lambda path: "cuda")  # a CUDA member, no GPUs here
    monkeypatch.setattr(sharding, "require_torch", lambda: None)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 0)
    result = CliRunner().invoke(main, ["run", str(suite), "--devices", "2", "--output", str(tmp_path / "out")])
    assert result.exit_code == 2 and "Traceback" not in result.output, result.output
    assert f"--devices 2: {member} runs on CUDA and this host has 0 GPU(s)" in result.output  # the member named
    assert not (tmp_path / "out").exists() or not list((tmp_path / "out").glob("devices_suite-*"))


def test_a_suite_over_two_gloo_ranks_passes_and_its_member_equals_one_process(tmp_path, one_process):
    member = small_protocol(tmp_path)  # the small protocol of the one-process run, frozen: the same seeds
    suite = _suite(tmp_path, [member])
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "specval.cli", "run", str(suite), "--devices", str(RANKS), "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=LAUNCH_TIMEOUT_S,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0 and "Traceback" not in output, output
    record = json.loads(next((tmp_path / "results").glob("devices_suite-*/suite.json")).read_text())
    (entry,) = record["members"]
    bundle = tmp_path / "results" / Path(entry["bundle"]).name
    assert entry["exit"] == 0 and json.loads((bundle / "manifest.json").read_text())["ranks"] == RANKS
    pd.testing.assert_frame_equal(samples(bundle), one_process)
