"""Confirmation: error rates of a pre-registered two-stage design (FAIL only if both stages fail).

Stage 2 runs only after a stage-1 FAIL, on a fresh disjoint seed range, so the two stages are
independent given the sampler under test.
"""

from __future__ import annotations

import dataclasses

from specval.stats import checks
from specval.stats.results import StatResult


@dataclasses.dataclass(frozen=True)
class TwoStageRates(StatResult):
    """Per-stage and combined error rates of a two-stage confirmation.

    false_fail = alpha1 * alpha2 (a correct sampler fails both stages); power = power1 * power2
    (a sampler off by at least the MDE must fail both); expected_stages counts stage runs per
    run for a correct sampler (1 + alpha1).
    """

    alpha1: float
    alpha2: float
    power1: float
    power2: float
    false_fail: float
    power: float
    expected_stages: float


def two_stage(alpha1: float, alpha2: float, power1: float, power2: float) -> TwoStageRates:
    """Combined error rates of "FAIL iff stage 1 fails and then stage 2 fails".

    Assumptions: the stages use disjoint seeds (independent); each stage's false-fail rate is
    at most its alpha and its power at the deviation of interest is at least its power.
    Guarantee: combined false-fail rate <= alpha1 * alpha2; combined power >= power1 * power2.
    Scaling: e.g. alpha = 0.01 per stage gives 1e-4 overall while power 0.9 per stage keeps 0.81;
    raising stage 2's sample size raises power2 at no cost to the false-fail rate.
    """
    alpha1 = checks.probability("alpha1", alpha1)
    alpha2 = checks.probability("alpha2", alpha2)
    power1 = checks.probability("power1", power1, allow_one=True)
    power2 = checks.probability("power2", power2, allow_one=True)
    return TwoStageRates(alpha1, alpha2, power1, power2, alpha1 * alpha2, power1 * power2, 1 + alpha1)
