"""`specval plan` against a Monte Carlo power run, and its CLI.

Margin: at the planned n, the simulated rejection rate of 400 multinomial replicates must lie
within 0.08 of the planned power 0.8. The Monte Carlo standard error is 0.02, so a correct plan
fails by sampling error with probability ~1e-4 (4 SE); the remaining slack covers the noncentral
chi-square approximation. The seed is fixed, so the test is deterministic.
"""

from __future__ import annotations

import numpy as np
from click.testing import CliRunner

from specval import plan as planning
from specval.cli import main
from specval.stats import power as powers

MARGIN = 0.08
REPS = 400


def _tight_alternative(p0: np.ndarray, tv: float) -> np.ndarray:
    """p1 with |p1 - p0| / p0 constant (2 TV), so Cohen's w equals exactly 2 TV."""
    sign = np.where(np.arange(p0.size) % 2 == 0, 1.0, -1.0)
    sign[-1] = -sign[:-1] @ p0[:-1] / p0[-1]  # keep the total at 1
    return p0 * (1.0 + 2.0 * tv * sign)


def test_plan_agrees_with_monte_carlo_power():
    p0 = np.full(10, 0.1)
    tv = 0.06
    p1 = _tight_alternative(p0, tv)
    assert abs(0.5 * np.abs(p1 - p0).sum() - tv) < 1e-12
    plan = planning.samples_for(tv, p0.size, alpha=0.01, power=0.8)
    simulated = powers.simulate_power(p0, p1, plan.samples_gof, 0.01, REPS, np.random.default_rng(7))
    assert abs(simulated.power - 0.8) <= MARGIN, simulated
    smaller = powers.simulate_power(p0, p1, plan.samples_gof // 4, 0.01, REPS, np.random.default_rng(8))
    assert smaller.power < 0.8 - MARGIN  # the plan is not just "always enough"


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
