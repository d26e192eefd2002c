"""Suites (`kind: suite`): one command runs every member protocol, one exit status, a verifiable record.

Members are small ChainSUT sequence protocols and the fake distribution protocol, so a whole suite
runs in seconds. False-fail rate: the passing members are exact samplers whose runs FAIL with
probability <= alpha = 0.01 each (fixed seeds: the outcome is deterministic); the failing member
serves its greedy companions by sampling (`greedy_ignored`), a deterministic FAIL of its
`companions` criterion, while its tested requests stay exact (so its Monte Carlo nulls stop early).
"""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from specval.cli import main
from specval.suite import (
    EXIT_ENVIRONMENT,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_PASS,
    EXIT_SUT,
    SUITE_FILE,
    MemberResult,
    suite_exit,
)
from tests.fixtures.fake_protocol import fake_protocol_dict
from tests.fixtures.sequence_protocol import sequence_protocol_dict

SMOKE = {"sequences_per_group": 80}
MIXED = {"name": "mixed", "mode": "sync", "companions": [{"temperature": 0}]}
FAKE_TESTS = [{"kind": "gof", "position": 1, "role": "control"}, {"kind": "gof", "position": 2, "role": "primary"}]
SEQUENCE = {
    "groups": [{"name": "sync", "mode": "sync"}],
    "sequences_per_group": 160,
    "batch_size": 20,
    "tests": [{"kind": "pit", "role": "primary"}, {"kind": "reproducibility", "role": "control"}],
    "profiles": {"smoke": SMOKE},
}


def _write(directory: Path, name: str, raw: dict, freeze: bool = True) -> str:
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    if freeze:
        result = CliRunner().invoke(main, ["freeze", str(path)])
        assert result.exit_code == 0, result.output
    return path.name


def _suite(directory: Path, members: list[str], name: str = "team_suite", freeze: bool = True, **extra) -> Path:
    return directory / _write(directory, name, {"kind": "suite", "name": name, "members": members, **extra}, freeze)


@pytest.fixture(scope="module")
def members(tmp_path_factory) -> Path:
    """A protocol directory: two passing members of two kinds and one failing member."""
    root = tmp_path_factory.mktemp("protocols")
    _write(root, "seq_ok", sequence_protocol_dict(name="seq_ok", **SEQUENCE))
    _write(root, "fake_t2", fake_protocol_dict(tests=FAKE_TESTS, profiles={"smoke": {"samples_per_group": 800}}))
    _write(
        root,
        "seq_bug",
        sequence_protocol_dict(
            name="seq_bug",
            **(SEQUENCE | {"groups": [MIXED]}),
            sut={"adapter": "tests.fixtures.chain_sut:ChainSUT", "options": {"mutant": "greedy_ignored"}},
        ),
    )
    return root


def _run(suite: Path, output: Path, *args: str):
    return CliRunner().invoke(
        main, ["run", str(suite), "--profile", "smoke", "--output", str(output), "--quiet", *args]
    )


@pytest.fixture(scope="module")
def failing_suite(members, tmp_path_factory):
    output = tmp_path_factory.mktemp("results")
    junit = output / "reports" / "suite.xml"  # a folder that does not exist yet: the run creates it
    result = _run(_suite(members, ["seq_ok.yaml", "fake_t2.yaml", "seq_bug.yaml"]), output, "--junit", str(junit))
    directories = [p for p in output.iterdir() if p.name.startswith("team_suite-suite-")]
    return result, directories[0] if directories else None


def test_a_suite_runs_every_member_and_exits_with_the_most_severe_status(failing_suite):
    result, directory = failing_suite
    assert result.exit_code == EXIT_FAIL, result.output
    record = json.loads((directory / SUITE_FILE).read_text())
    assert [m["exit"] for m in record["members"]] == [EXIT_PASS, EXIT_PASS, EXIT_FAIL]
    assert record["verdict"] == "FAIL" and record["profile"] == "smoke" and record["registration"] == "frozen"
    for member in record["members"]:
        summary = json.loads((directory.parent / member["bundle"] / "summary.json").read_text())
        assert summary["verdict"] == member["verdict"]
        assert (directory / f"{member['protocol']}.junit.xml").is_file()
    assert "FAIL: suite team_suite, 3 of 3 member(s) run" in result.output


def test_a_suite_with_junit_writes_one_testsuite_per_member_in_order(failing_suite):
    """Deterministic given the members' verdicts above: one <testsuite> per member with its criteria,
    its file and exit status; the FAILed member's failures counted at the top."""
    result, directory = failing_suite
    root = ET.parse(directory.parent / "reports" / "suite.xml").getroot()
    record = json.loads((directory / SUITE_FILE).read_text())
    assert root.tag == "testsuites" and root.get("name") == "specval.team_suite"
    members = root.findall("testsuite")
    assert [m.get("name") for m in members] == [f"specval.{m['protocol']}" for m in record["members"]]
    facts = [{p.get("name"): p.get("value") for p in m.findall("properties/property")} for m in members]
    assert [(f["member_file"], f["exit"]) for f in facts] == [(m["file"], str(m["exit"])) for m in record["members"]]
    assert [int(m.get("failures")) > 0 for m in members] == [False, False, True]
    assert (
        root.get("failures") == members[2].get("failures") and f"junit: {directory.parent / 'reports'}" in result.output
    )


def test_a_suite_of_passing_members_exits_0_and_verifies(members, tmp_path):
    result = _run(_suite(members, ["seq_ok.yaml"], name="ok_suite"), tmp_path)
    assert result.exit_code == EXIT_PASS, result.output
    directory = next(tmp_path.glob("ok_suite-suite-*"))
    verified = CliRunner().invoke(main, ["verify", str(directory)])
    assert verified.exit_code == 0 and "OK: suite" in verified.output, verified.output


def test_verify_finds_a_changed_record_or_a_missing_member(failing_suite, tmp_path):
    _, directory = failing_suite
    assert CliRunner().invoke(main, ["verify", str(directory)]).exit_code == 0
    copy = tmp_path / "results"
    shutil.copytree(directory.parent, copy)
    suite_dir = copy / directory.name
    record = json.loads((suite_dir / SUITE_FILE).read_text())
    record["members"][2]["verdict"], record["members"][2]["exit"], record["exit"] = "PASS", 0, 0
    (suite_dir / SUITE_FILE).write_text(json.dumps(record))
    relabelled = CliRunner().invoke(main, ["verify", str(suite_dir)])
    assert relabelled.exit_code == 1 and "verdict FAIL, the suite records PASS" in relabelled.output
    shutil.rmtree(copy / record["members"][0]["bundle"])
    missing = CliRunner().invoke(main, ["verify", str(suite_dir)])
    assert missing.exit_code == 1 and "is missing" in missing.output


@pytest.mark.parametrize(
    "case, needle",
    [
        ("unfrozen_member", "not frozen"),
        ("missing_profile", "unknown profile"),
        ("missing_file", "does not exist"),
        ("suite_member", "a suite lists protocols of kinds"),
        ("unknown_key", "unknown key"),
    ],
)
def test_a_suite_refuses_before_any_member_runs(members, tmp_path, case, needle):
    """Deterministic: exit 2 with one line, no ledger, no record."""
    if case == "unfrozen_member":
        listed = [_write(members, "seq_draft", sequence_protocol_dict(name="seq_draft", **SEQUENCE), freeze=False)]
    elif case == "missing_profile":
        listed = [_write(members, "fake_noprofile", fake_protocol_dict(name="fake_noprofile"))]
    elif case == "missing_file":
        listed = ["nowhere.yaml"]
    elif case == "suite_member":
        listed = [_suite(members, ["seq_ok.yaml"], name="inner").name]
    else:
        listed = ["seq_ok.yaml"]
    extra = {"profiles": {}} if case == "unknown_key" else {}
    result = _run(
        _suite(members, ["seq_ok.yaml", *listed], name=f"refused_{case}", freeze=case != "unknown_key", **extra),
        tmp_path,
    )
    assert result.exit_code == 2 and needle in result.output, result.output
    assert not any(tmp_path.iterdir())  # nothing claimed, nothing written


def test_the_most_severe_status_wins():
    def of(*codes):
        return suite_exit([MemberResult(str(i), "p", "h", c, None) for i, c in enumerate(codes)])

    assert of(EXIT_PASS, EXIT_PASS) == EXIT_PASS
    assert of(EXIT_PASS, EXIT_INCONCLUSIVE) == EXIT_INCONCLUSIVE
    assert of(EXIT_INCONCLUSIVE, EXIT_ENVIRONMENT) == EXIT_ENVIRONMENT
    assert of(EXIT_ENVIRONMENT, EXIT_SUT) == EXIT_SUT
    assert of(EXIT_SUT, EXIT_FAIL, EXIT_PASS) == EXIT_FAIL


def test_the_shipped_suite_lists_frozen_cpu_protocols_that_all_have_smoke_and_ci():
    """Deterministic: `specval run protocols/sampler_suite.yaml --profile smoke` (or ci) is refused
    for none of its members."""
    from specval.kinds import read_protocol_file
    from specval.protocol import FROZEN, registration, resolve

    suite_file = Path("protocols/sampler_suite.yaml")
    suite = read_protocol_file(suite_file).load()
    assert registration(suite, suite_file) == FROZEN and "seq_fp32.yaml" in suite.members
    for path in suite.member_paths(suite_file):
        protocol = read_protocol_file(path).load()
        assert registration(protocol, path) == FROZEN, path
        assert protocol.sut.device == "cpu" and resolve(protocol, "smoke") and resolve(protocol, "ci"), path
