"""The shipped sequence protocols end to end at their smoke size: the bundled engine's on its looped
model and on SmolLM2-135M, and the transformers one (SmolLM2-135M through transformers'
generate); the SmolLM2 ones skip with a reason without the real-model extras
(`scripts/setup.sh --real`, which the README's test command runs).

`specval run protocols/seq_fp32.yaml --profile smoke` (7 groups x 200 sequences x 64 tokens,
mixed-batch companions included) must PASS and verify. False-fail rate: <= alpha = 0.01 (Holm over
the family; the shipped family's calibration on a null model: 11 FAILs in 2,000 replicates, 0.0055,
docs/validation.md); the seeds are the ledger's first ranges of a fresh output root,
so the outcome is fixed and the test does not flake from run to run.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from specval.cli import main
from tests.fixtures.real_model import require_smollm2

REPO = Path(__file__).resolve().parents[3]


def _smoke_passes_and_verifies(name: str, output: Path) -> dict:
    """Run protocols/<name>.yaml's smoke profile into `output`; assert exit 0, a PASS summary and a
    bundle that verifies; return the summary."""
    result = CliRunner().invoke(
        main,
        ["run", str(REPO / "protocols" / f"{name}.yaml"), "--profile", "smoke", "--output", str(output), "--quiet"],
    )
    assert result.exit_code == 0, result.output
    bundle = Path(result.output.strip().splitlines()[-1].removeprefix("bundle: "))
    summary = json.loads((bundle / "summary.json").read_text())
    assert summary["verdict"] == "PASS"
    verified = CliRunner().invoke(main, ["verify", str(bundle)])
    assert verified.exit_code == 0, verified.output
    return summary


def test_seq_fp32_smoke_passes_every_criterion_and_verifies(tmp_path):
    summary = _smoke_passes_and_verifies("seq_fp32", tmp_path)
    assert len(summary["tests"]) >= 53
    assert summary["tests"]["companions.async_mixed"]["effective_n"] == 200 * 64
    assert summary["groups"]["async"]["round_positions"]["4"] > 0  # bonus tokens after K = 3 accepts


def test_seq_fp32_k8_smoke_gates_every_round_position_up_to_the_bonus_after_eight_drafts(tmp_path):
    """`specval run protocols/seq_fp32_k8.yaml --profile smoke` PASSes and verifies, and positions 1..9
    each hold tokens in every group (at K = 8 the bonus is round position 9). False-fail rate as
    above (<= alpha = 0.01, exact-size criteria under Holm); the seeds are a fresh ledger's first."""
    summary = _smoke_passes_and_verifies("seq_fp32_k8", tmp_path)
    for group in ("sync", "async"):
        positions = summary["groups"][group]["round_positions"]
        assert sorted(positions, key=int) == [str(j) for j in range(1, 10)] and min(positions.values()) >= 100
        assert summary["tests"][f"pit_position.{group}"]["verdict"] == "PASS"


def test_seq_transformers_smoke_passes_and_verifies(tmp_path):
    """The shipped smoke profile of seq_transformers (8 sequences of 16 tokens per group, batches of 2;
    ci and full run 64 tokens) PASSes and its bundle verifies. False-fail rate <= alpha = 0.01 as
    above; fixed seeds (a fresh ledger's first ranges)."""
    require_smollm2("transformers")
    _smoke_passes_and_verifies("seq_transformers", tmp_path)


def test_seq_smollm2_smoke_passes_and_verifies(tmp_path):
    """The shipped smoke profile of seq_smollm2 (the engine on SmolLM2-135M: five groups, the
    noisy draft and mixed batches included, 8 sequences of 16 tokens per group in batches of 2)
    PASSes every criterion and its bundle verifies, and every speculative group commits tokens
    after an accepted draft (round position >= 2: the early exit after 24 of 30 layers accepts
    about one draft in four). False-fail rate <= alpha = 0.01 as above; fixed seeds."""
    require_smollm2()
    summary = _smoke_passes_and_verifies("seq_smollm2", tmp_path)
    assert len(summary["tests"]) >= 41
    for group in ("sync", "async", "async_noisy", "async_mixed"):
        assert summary["groups"][group]["round_positions"].get("2", 0) > 0
