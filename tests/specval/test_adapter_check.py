"""`specval check-adapter`: each planted break of the adapter contract is named as a FIX, a correct
adapter has nothing to fix, and the exit codes are 0 / 1 / 2.

Deterministic: the fault adapters are exact samplers with one break each (the quadrature check is an
exact sweep). The one timing check asserted (`vectorised`) compares a per-row Python loop, whose time
per row equals a one-row call's, against the threshold VECTORISED_RATIO = 0.1: load slows both calls
alike, so the ratio stays near 1 for the loop and near 0.01 or below for the vectorised FakeSUT.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import adapter_check as checks
from specval.cli import main
from specval.protocol import ProtocolError
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.sequence_protocol import write_sequence_protocol

FAULTS = "tests.fixtures.adapter_faults"
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "adapter_minimal"


def _levels(adapter: str, **options) -> dict[str, set[str]]:
    findings = checks.run_checks(checks.check_protocol(adapter, options, checks.DEFAULT_SPECULATIVE_TOKENS))
    out: dict[str, set[str]] = {checks.OK: set(), checks.FIX: set(), checks.ADVICE: set()}
    for finding in findings:
        out[finding.level].add(finding.check)
    return out


def test_a_correct_adapter_has_nothing_to_fix():
    levels = _levels(f"{FAULTS}:CheckedFakeSUT")
    assert levels[checks.FIX] == set() and levels[checks.ADVICE] == set()
    assert {
        "modes",
        "contract",
        "tokens",
        "reproducible",
        "batch_independent",
        "distinct_seeds",
        "target_logits",
        "quadrature",
        "vectorised",
        "speed",
        "describe",
    } <= levels[checks.OK]


@pytest.mark.parametrize(
    "adapter, fixes",
    [
        ("SeedIgnoredSUT", {"distinct_seeds"}),
        ("BatchSeededSUT", {"batch_independent"}),
        ("OutOfRangeSUT", {"tokens"}),
        ("ResidualFromPSUT", {"quadrature"}),
    ],
)
def test_each_planted_break_is_named(adapter, fixes):
    assert _levels(f"{FAULTS}:{adapter}")[checks.FIX] == fixes


def test_target_logits_that_drift_between_calls_are_named():
    assert {"target_logits", "reproducible"} <= _levels(f"{FAULTS}:DriftingTargetSUT")[checks.FIX]


def test_modes_declared_but_refused_and_the_default_describe_are_named():
    levels = _levels("tests.fixtures.fake_sut:FakeSUT")  # declares all modes, runs nospec and sync
    assert levels[checks.FIX] == {"modes"} and levels[checks.ADVICE] == {"describe"}


def test_a_per_row_accept_single_is_advised_to_vectorise():
    levels = _levels(f"{FAULTS}:PerRowAcceptSUT")
    assert levels[checks.FIX] == set() and "vectorised" in levels[checks.ADVICE]


@pytest.fixture
def toy_importable(monkeypatch):
    monkeypatch.syspath_prepend(str(EXAMPLE))
    yield
    sys.modules.pop("toy_adapter", None)


def test_exit_codes_and_output(toy_importable):
    cli = CliRunner()
    ok = cli.invoke(main, ["check-adapter", "toy_adapter:ToySUT"])
    assert ok.exit_code == 0 and ok.output.splitlines()[-1].startswith("OK: toy_adapter:ToySUT: 0 to fix, 0 advice")
    planted = cli.invoke(main, ["check-adapter", "toy_adapter:ToySUT", "--option", "mutant=residual_from_p"])
    assert planted.exit_code == 1 and "FIX     quadrature:" in planted.output
    for args, text in (
        (["nowhere.at_all:Missing"], "cannot import 'nowhere.at_all:Missing'"),
        ([f"{FAULTS}:RaisingConstructorSUT"], "the constructor raised RuntimeError: no model file"),
        (["toy_adapter:ToySUT", "--option", "mutant"], "--option 'mutant': expected KEY=VALUE"),
    ):
        refused = cli.invoke(main, ["check-adapter", *args])
        assert refused.exit_code == 2 and text in refused.output and "Traceback" not in refused.output, args


def test_the_command_takes_a_sequence_protocol(toy_importable):
    """`specval check-adapter ADAPTER --protocol sequence.yaml` runs the sequence checks (the
    source test's draft_logits_along among them) and exits 0 for the example; a planted residual
    bug of the toy is named with exit 1."""
    cli, path = CliRunner(), str(EXAMPLE / "sequence.yaml")
    ok = cli.invoke(main, ["check-adapter", "toy_adapter:ToySUT", "--protocol", path])
    assert ok.exit_code == 0 and "draft_logits_along" in ok.output, ok.output
    planted = cli.invoke(
        main, ["check-adapter", "toy_adapter:ToySUT", "--protocol", path, "--option", "mutant=residual_from_p"]
    )
    assert planted.exit_code == 1 and "FIX" in planted.output, planted.output


def test_a_protocol_supplies_the_settings(tmp_path):
    """--protocol: its groups (nospec and sync, no async) and sut settings are used; -k overrides K."""
    path = write_protocol(tmp_path, fake_protocol_dict())
    result = CliRunner().invoke(main, ["check-adapter", f"{FAULTS}:CheckedFakeSUT", "--protocol", str(path), "-k", "1"])
    assert result.exit_code == 0, result.output
    assert "check_groups accepts ['nospec', 'sync']" in result.output


def test_an_adapter_that_calls_sys_exit_on_import_exits_2_not_0():
    result = CliRunner().invoke(main, ["check-adapter", "tests.fixtures.exits_on_import:ExitingOnImportSUT"])
    assert result.exit_code == 2 and "raised SystemExit(0)" in result.output, result.output


# ---------------------------------------------------------------- sequence protocols


def _sequence_levels(path: Path, adapter: str, **options) -> dict[str, set[str]]:
    protocol = checks.with_adapter(checks.load_protocol(path), f"{FAULTS}:{adapter}", options)
    out: dict[str, set[str]] = {checks.OK: set(), checks.FIX: set(), checks.ADVICE: set()}
    for finding in checks.run_checks(protocol, path):
        out[finding.level].add(finding.check)
    return out


@pytest.fixture
def chain_protocol(tmp_path):
    """tests/fixtures/sequence_protocol.py: nospec, sync, an adversarial draft and a mixed group, a
    source test over the speculative ones."""
    return write_sequence_protocol(tmp_path)


def test_a_correct_sequence_adapter_has_nothing_to_fix(chain_protocol):
    levels = _sequence_levels(chain_protocol, "CheckedChainSUT")
    assert levels[checks.FIX] == set() and levels[checks.ADVICE] == set()
    assert {"capabilities", "contract", "target_logits_along", "draft_logits_along", "mixed"} <= levels[checks.OK]
    assert "quadrature" not in levels[checks.OK]  # a sequence protocol has none


@pytest.mark.parametrize(
    "adapter, options, fixes",
    [
        ("ShiftedDraftSUT", {}, {"draft_logits_along"}),
        ("DriftingDraftSUT", {}, {"draft_logits_along"}),
        ("SwappedSourcesSUT", {}, {"draft_logits_along"}),
        ("NoDraftSUT", {}, {"contract"}),
        ("UndeclaredMixedSUT", {}, {"capabilities"}),
        ("CheckedChainSUT", {"mutant": "mixed_leak"}, {"mixed"}),
        ("CheckedChainSUT", {"mutant": "greedy_ignored"}, {"mixed"}),
    ],
)
def test_each_planted_break_of_a_sequence_call_is_named(chain_protocol, adapter, options, fixes):
    """Deterministic (fixed seeds). Rows one position late (caught by draft_logits of each prefix,
    and, for the adversarial override, by tokens impossible under their source's law), rows that
    change between calls, accepted drafts and corrections reported under each other's label, no
    draft at all, companions the adapter does not declare, a mixed batch whose tested rows take a
    companion's temperature, greedy companions sampled at temperature 1."""
    assert _sequence_levels(chain_protocol, adapter, **options)[checks.FIX] == fixes


def test_a_shifted_target_replay_is_named(chain_protocol):
    """The replay itself one position late: target_logits_along's own check names it (every check
    that replays the target then sees wrong laws too)."""
    assert "target_logits_along" in _sequence_levels(chain_protocol, "ShiftedTargetSUT")[checks.FIX]


def test_the_example_sequence_protocol_has_nothing_to_fix(toy_importable):
    """examples/adapter_minimal/sequence.yaml (draft overrides, companions, a source test) and its
    toy adapter: every check of a sequence run OK, the planted correction from p still runs."""
    protocol = checks.load_protocol(EXAMPLE / "sequence.yaml")
    findings = checks.run_checks(protocol, EXAMPLE / "sequence.yaml")
    assert [f.line() for f in findings if f.level != checks.OK] == []
    contract = next(f for f in findings if f.check == "contract")
    assert "sample / sample_mixed (6 group(s)), target_logits_along, draft_logits_along" in contract.message


def test_only_distribution_and_sequence_protocols_are_taken(tmp_path):
    suite = tmp_path / "suite.yaml"
    suite.write_text("kind: suite\nname: s\nprotocols: [a.yaml]\n")
    with pytest.raises(ProtocolError, match="takes a distribution or sequence protocol, not kind .suite."):
        checks.load_protocol(suite)
    assert checks.load_protocol(write_protocol(tmp_path, fake_protocol_dict())).groups
