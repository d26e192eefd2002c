"""`specval plan` against a Monte Carlo power run of the test as it is run, and its CLI.

At the planned n the Monte Carlo test (`stratified_gof`, one stratum, decided at alpha) must reject
the least favourable alternative at rate >= 0.8 - 3 SE (SE = 0.02 at 400 replicates: a correct plan
fails with probability < 0.0015), and at a quarter of n at rate < 0.8 - 0.08 (the plan is not just
"always enough"). The seeds are fixed, so the test is deterministic.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from specval.cli import main
from specval.distribution import plan as planning
from specval.stats.strata import stratified_gof

REPO = Path(__file__).resolve().parents[3]

MARGIN = 0.08
REPS = 400


def _tight_alternative(p0: np.ndarray, tv: float) -> np.ndarray:
    """p1 with |p1 - p0| / p0 constant (2 TV), so Cohen's w equals exactly 2 TV."""
    sign = np.where(np.arange(p0.size) % 2 == 0, 1.0, -1.0)
    sign[-1] = -sign[:-1] @ p0[:-1] / p0[-1]  # keep the total at 1
    return p0 * (1.0 + 2.0 * tv * sign)


def _rejection_rate(p0: np.ndarray, p1: np.ndarray, n: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    hits = 0
    for r in range(REPS):
        result = stratified_gof(
            [((), rng.multinomial(n, p1), p0)],
            stratum_min=1,
            min_expected=5.0,
            level=0.01,
            rng=np.random.default_rng([seed, r]),
        )
        hits += result.p_value <= 0.01
    return hits / REPS


def test_plan_agrees_with_monte_carlo_power():
    p0 = np.full(10, 0.1)
    tv = 0.06
    p1 = _tight_alternative(p0, tv)
    assert abs(0.5 * np.abs(p1 - p0).sum() - tv) < 1e-12
    plan = planning.samples_for(tv, p0.size, alpha=0.01, power=0.8)
    assert _rejection_rate(p0, p1, plan.samples_gof, 7) >= 0.8 - 3 * np.sqrt(0.16 / REPS)
    assert _rejection_rate(p0, p1, plan.samples_gof // 4, 8) < 0.8 - MARGIN


def test_mde_inverts_samples():
    plan = planning.samples_for(0.05, 20, 0.01, 0.8)
    detectable = planning.mde_for(plan.samples_gof, 20, 0.01, 0.8)
    assert detectable.mde_gof <= 0.05 < planning.mde_for(plan.samples_gof - 50, 20, 0.01, 0.8).mde_gof
    assert plan.samples_per_group_homogeneity == 2 * plan.samples_gof


def test_plan_cli_prints_samples_and_mde_and_refuses_bad_input():
    runner = CliRunner()
    out = runner.invoke(main, ["plan", "--tv", "0.05", "--bins", "20"])
    assert out.exit_code == 0 and f"{planning.samples_for(0.05, 20, 0.01, 0.8).samples_gof} samples" in out.output
    out = runner.invoke(main, ["plan", "--n", "3000", "--bins", "20"])
    assert out.exit_code == 0 and f"TV >= {planning.mde_for(3000, 20, 0.01, 0.8).mde_gof:.4g}" in out.output
    bad = runner.invoke(main, ["plan", "--tv", "2", "--bins", "20"])
    assert bad.exit_code == 2 and "tv" in bad.output


def test_protocol_plan_lists_every_criterion_at_its_holm_level_and_stages(tmp_path):
    from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

    file = write_protocol(tmp_path, fake_protocol_dict(confirmation={"stages": 2, "alpha_stage2": 0.01}))
    out = CliRunner().invoke(main, ["plan", "--protocol", str(file), "--profile", "ci"])
    assert out.exit_code == 0, out.output
    # fake_t2: control family {t1_gof x 2} (m = 2), primary {t2_gof x 2, t2_homogeneity.sync_vs_nospec} (m = 3)
    assert "t1_gof.sync (control, m = 2, level 0.0025, 0.0025" in out.output
    assert "t2_homogeneity.sync_vs_nospec (primary, m = 3" in out.output and "two-stage" in out.output


def test_protocol_plan_without_top_k_needs_and_uses_the_vocabulary_size(tmp_path):
    from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

    raw = fake_protocol_dict()
    raw["sampling"] = {**raw["sampling"], "top_k": 0}
    file = write_protocol(tmp_path, raw)
    refused = CliRunner().invoke(main, ["plan", "--protocol", str(file)])
    assert refused.exit_code == 2 and "--vocab-size" in refused.output
    out = CliRunner().invoke(main, ["plan", "--protocol", str(file), "--vocab-size", "64"])
    assert out.exit_code == 0, out.output
    assert "t1_gof.sync (control" in out.output and "df <= 63)" in out.output  # 64 cells bound t1


@pytest.mark.parametrize(
    "protocol", ["protocols/performance/perf_async_vs_serial_graphs_c1.yaml", "protocols/quality_arith.yaml"]
)
def test_a_command_of_statistical_protocols_names_the_kind_it_refuses(protocol):
    out = CliRunner().invoke(main, ["plan", "--protocol", str(REPO / protocol)])
    assert out.exit_code == 2 and "kind:" in out.output and "specval run" in out.output, out.output
