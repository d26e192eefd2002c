"""Power: minimum detectable total-variation distance of the chi-square tests, and sample sizes.

Why TV = w / 2: Cohen's effect size of a deviation from p0 to p1 is w = sqrt(sum (p1 - p0)^2 / p0).
By Cauchy-Schwarz, (sum |p1 - p0|)^2 = (sum |p1 - p0| / sqrt(p0) * sqrt(p0))^2 <= w^2 * sum p0 = w^2,
so w >= sum |p1 - p0| = 2 TV. Power grows with w, so every deviation with TV >= w* / 2 has
w >= w* and is detected with at least the power that w* has. Equality holds when |p1 - p0| / p0
is constant, so the bound is tight.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, special
from statsmodels.stats.power import GofChisquarePower
from statsmodels.stats.proportion import proportion_confint

from specval.stats import checks
from specval.stats.gof import goodness_of_fit
from specval.stats.results import StatResult

NOTHING_DETECTABLE = math.inf  # mde_tv when the test has no degrees of freedom or no samples


def mde_tv(n: float, n_bins: int, alpha: float, power: float = 0.8) -> float:
    """Minimum total-variation distance that a chi-square GOF test detects with `power`.

    Assumptions: Pearson's chi-square with df = n_bins - 1 at level alpha and n i.i.d. samples;
    power from the noncentral chi-square approximation (statsmodels GofChisquarePower),
    accurate when the expected cell counts are >= 5. TV is measured between the cell-level laws
    (deviations that cancel inside a pooled cell are invisible).
    Guarantee: any deviation with TV >= the returned d is detected with power >= `power`
    (w >= 2 TV, module docstring); a value >= 1 means no deviation is guaranteed detectable.
    Returns NOTHING_DETECTABLE (inf) when n == 0 or n_bins < 2.
    Scaling: d ~ sqrt(lambda(df, alpha, power) / n) / 2, i.e. 1 / sqrt(n).
    """
    n = checks.non_negative("n", n)
    n_bins = checks.count("n_bins", n_bins)
    alpha = checks.probability("alpha", alpha)
    power = checks.probability("power", power)
    if n == 0 or n_bins < 2:
        return NOTHING_DETECTABLE
    w = GofChisquarePower().solve_power(effect_size=None, nobs=n, alpha=alpha, power=power, n_bins=n_bins)
    return float(w) / 2.0


def samples_for_tv(tv: float, n_bins: int, alpha: float, power: float = 0.8) -> int:
    """Samples a chi-square GOF test with `n_bins` cells needs to detect TV >= `tv` with `power`.

    Assumptions: as `mde_tv` (the returned n is the inverse of `mde_tv`, rounded up).
    Guarantee: mde_tv(samples_for_tv(tv, ...), ...) <= tv.
    Scaling: n ~ lambda(df, alpha, power) / (2 tv)^2.
    """
    tv = checks.probability("tv", tv, allow_one=True)
    n_bins = checks.count("n_bins", n_bins, minimum=2)
    alpha = checks.probability("alpha", alpha)
    power = checks.probability("power", power)
    n = GofChisquarePower().solve_power(effect_size=2.0 * tv, nobs=None, alpha=alpha, power=power, n_bins=n_bins)
    return int(math.ceil(float(n)))


def samples_for_tv_two_sample(tv: float, n_bins: int, alpha: float, power: float = 0.8) -> int:
    """Samples PER GROUP (equal groups) the homogeneity test needs to detect TV >= `tv`.

    Assumptions: as `mde_tv_two_sample`; equal groups of n give n_eff = n / 2.
    Guarantee: mde_tv_two_sample(n, n, ...) <= tv for the returned n.
    Scaling: twice the one-sample size (per group), four times in total.
    """
    return int(math.ceil(2 * samples_for_tv(tv, n_bins, alpha, power)))


def effective_n(n_a: float, n_b: float) -> float:
    """n_eff = n_a n_b / (n_a + n_b): the two-sample test's equivalent one-sample size (0 if empty)."""
    n_a = checks.non_negative("n_a", n_a)
    n_b = checks.non_negative("n_b", n_b)
    return n_a * n_b / (n_a + n_b) if n_a + n_b > 0 else 0.0


def mde_tv_two_sample(n_a: float, n_b: float, n_bins: int, alpha: float, power: float = 0.8) -> float:
    """Minimum TV distance between two groups' laws that the homogeneity test detects with `power`.

    Assumptions: chi2_contingency on a 2 x n_bins table. Under a local alternative its
    noncentrality is n_eff * w2^2 with n_eff = n_a n_b / (n_a + n_b) and
    w2^2 = sum (pa - pb)^2 / pbar (pbar the pooled law), the same noncentral chi-square with
    df = n_bins - 1 as a GOF test with n_eff samples; by Cauchy-Schwarz w2 >= 2 TV(pa, pb).
    Guarantee: TV(pa, pb) >= the returned d is detected with power >= `power`, up to the
    asymptotic approximation; NOTHING_DETECTABLE when a group is empty or n_bins < 2.
    Scaling: d ~ 1 / sqrt(n_eff); equal groups give n_eff = n / 2 each.
    """
    return mde_tv(effective_n(n_a, n_b), n_bins, alpha, power)


@dataclasses.dataclass(frozen=True)
class SimulatedPower(StatResult):
    """Monte Carlo rejection rate of `goodness_of_fit` with its Clopper-Pearson 95% interval."""

    power: float
    rejections: int
    reps: int
    ci_low: float
    ci_high: float


def simulate_power(
    p0: np.ndarray,
    p1: np.ndarray,
    n: int,
    alpha: float,
    reps: int,
    rng: np.random.Generator,
    *,
    min_expected: float = 5.0,
) -> SimulatedPower:
    """Fraction of `reps` multinomial(n, p1) samples that `goodness_of_fit(., p0)` rejects at alpha.

    Assumptions: `rng` is seeded by the caller (results are reproducible for a fixed seed).
    Guarantee: the exact rejection rate lies in [ci_low, ci_high] with probability >= 0.95.
    With p1 == p0 the result estimates the false-fail rate.
    Scaling: O(reps * V log V); the Monte Carlo standard error is sqrt(power (1 - power) / reps).
    """
    p0 = checks.as_weights("p0", p0)
    p1 = checks.as_weights("p1", p1)
    checks.same_length("p0", p0, "p1", p1)
    n = checks.count("n", n, minimum=1)
    reps = checks.count("reps", reps, minimum=1)
    alpha = checks.probability("alpha", alpha)
    samples = rng.multinomial(n, p1 / p1.sum(), size=reps)
    rejections = sum(goodness_of_fit(row, p0, min_expected=min_expected).p_value < alpha for row in samples)
    low, high = proportion_confint(rejections, reps, alpha=0.05, method="beta")
    return SimulatedPower(rejections / reps, int(rejections), reps, float(low), float(high))


def stage_power(tv: float, n: float, df: int, level: float) -> float:
    """Power of a chi-square test with `df` degrees of freedom at `level` against the least
    favourable deviation of total variation `tv` with n samples: noncentrality 4 n tv^2 (w >= 2 TV).

    Assumptions: the noncentral chi-square approximation of Pearson's statistic (checked by Monte
    Carlo in the suite at the criteria's shapes).
    """
    critical = special.chdtri(df, level)  # chi2.isf(level, df), without scipy.stats' per-call overhead
    return float(1.0 - special.chndtr(critical, df, 4.0 * n * tv * tv))  # ncx2.sf


def criterion_mde(n: float, df: int, levels: Sequence[float], power: float = 0.8) -> float:
    """Minimum TV that a criterion run as a sequence of stages FAILs with probability >= `power`.

    `levels` holds, per stage, the level at which the criterion is decided: its Holm first step
    alpha / m of its family, times `montecarlo.DECISION_LEVEL_FACTOR` for a Monte Carlo p-value.
    A criterion FAILs the run only if it is rejected in every stage (independent seeds), so the
    power is the product of the stages' powers.
    Assumptions: as `stage_power`; for a stratified criterion n is the number of tested samples
    (or the summed effective two-sample size) and df the summed df of its components, and the TV
    is the n-weighted MEAN over strata of the per-stratum cell-level TV: the noncentralities add,
    sum n_s w_s^2 >= 4 sum n_s tv_s^2 >= 4 n (sum n_s tv_s / n)^2 (Cauchy-Schwarz), so every
    alternative with that mean TV has at least the power of the least favourable one.
    Guarantee: returns d with prod_i stage_power(d, n, df, levels[i]) >= power (up to the
    approximation); NOTHING_DETECTABLE when n == 0, df < 1, or even TV = 1 falls short.
    Scaling: d ~ 1 / sqrt(n).
    """
    n = checks.non_negative("n", n)
    power = checks.probability("power", power)
    levels = [checks.probability("level", level) for level in levels]
    if n == 0 or df < 1 or not levels:
        return NOTHING_DETECTABLE

    def shortfall(tv: float) -> float:
        return float(np.prod([stage_power(tv, n, df, level) for level in levels])) - power

    if shortfall(1.0) < 0:
        return NOTHING_DETECTABLE
    return float(optimize.brentq(shortfall, 0.0, 1.0, xtol=1e-10))
