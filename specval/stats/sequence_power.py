"""Sequence power: minimum detectable deviations of the whole-sequence and cross-request tests.

Each function returns the smallest deviation, on a STATED effect scale, that the test as it is run
rejects with probability >= `power` at every stage level in `levels` (a criterion FAILs only if
every stage rejects; independent stages multiply). Monte Carlo p-values are decided at the level
times `montecarlo.DECISION_LEVEL_FACTOR` and need power / `decision_power` per stage, as in
`power.criterion_mde`.

What an MDE promises, and what it does not:
- `bucket_mde` is the same TV for ONE bucket of the max-type statistic: a bug confined to one
  round position (or one source at one position) is judged at the size that bucket holds.
- `pit_uniformity_mde` is a TV between the BINNED law of U and the uniform bins (n-weighted mean
  over buckets). U is a randomized function of the token whose kernel does not depend on the
  sampler, so by the data-processing inequality TV(binned U law) <= TV(token law): a token-law
  deviation of TV d moves the binned PIT law by AT MOST d, often much less (mass moved between
  tokens of one bin is invisible; exchanging the labels of two equally likely tokens is invisible
  altogether). The MDE therefore promises detection of every bug whose binned PIT TV reaches it and
  nothing about a token TV; the suite measures the ratio for one bug class (a wrong target row).
- `serial_dependence_mde` is a TV between the pair-bin law of (U_i, U_{i+l}) at ONE lag and the
  product of its margins, with the pair count of that lag; the other lags add only null noise
  (their df count).
- `association_rho_mde` is Spearman's rho of the paired PITs; `association_tv_mde` the TV of their
  pair-bin law from independence.
- `equal_rate_mde` is a relative excess r of every pair's match probability (pi -> (1 + r) pi,
  'greater') or deficit (pi -> (1 - r) pi, 'less'), computed from the exact Poisson-binomial laws.
- `identical_pairs_mde` is the fraction of pairs that share a stream outright (identical sequences).
All the chi-square MDEs use the noncentral chi-square approximation (`power.stage_power`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import optimize, stats

from specval.stats import checks
from specval.stats.independence import STATISTICS, all_pvalues, as_probabilities, poisson_binomial_pmf
from specval.stats.montecarlo import DECISION_LEVEL_FACTOR, decision_power
from specval.stats.power import NOTHING_DETECTABLE, criterion_mde

XTOL = 1e-10


def _mc_levels(levels: Sequence[float], split: int = 1) -> tuple[list[float], float]:
    """Decision levels of Monte Carlo p-values tested at level / split, and the power factor that
    the Monte Carlo resolution costs (product of `decision_power`)."""
    levels = [checks.probability("level", level) / split for level in levels]
    factor = float(np.prod([decision_power(level) for level in levels]))
    return [level * DECISION_LEVEL_FACTOR for level in levels], factor


def _chi2_mde(n: float, df: int, levels: Sequence[float], power: float, split: int = 1) -> float:
    power = checks.probability("power", power)
    decided, factor = _mc_levels(levels, split)
    if power / factor >= 1:
        return NOTHING_DETECTABLE
    return criterion_mde(n, df, decided, power / factor)


def pit_uniformity_mde(
    n: float, levels: Sequence[float], *, num_bins: int = 10, num_buckets: int = 1, power: float = 0.8
) -> float:
    """Minimum n-weighted mean over buckets of TV(binned U law, uniform bins) that `pit_uniformity`
    detects with `power` (df = buckets * (bins - 1)). Scaling: ~ 1 / sqrt(n)."""
    num_bins = checks.count("num_bins", num_bins, minimum=2)
    num_buckets = checks.count("num_buckets", num_buckets, minimum=1)
    return _chi2_mde(n, num_buckets * (num_bins - 1), levels, power)


def bucket_mde(n: float, levels: Sequence[float], *, num_buckets: int, num_bins: int = 10, power: float = 0.8) -> float:
    """Minimum TV(binned U law, uniform bins) of ONE bucket holding n tokens that the max-type
    `pit_uniformity` (combine="max") over `num_buckets` buckets detects with `power`, every other
    bucket exact. Assumptions: each bucket's X^2 ~ chi-square(bins - 1) under H0 (as every MDE here).
    Guarantee (conservative): the max statistic's exact null tail is at most the sum of the
    buckets' tails, so its critical value is at most the Bonferroni one at level / num_buckets; the
    MDE computed there is at least the true one. Scaling: ~ sqrt(log(num_buckets) / n)."""
    num_bins = checks.count("num_bins", num_bins, minimum=2)
    num_buckets = checks.count("num_buckets", num_buckets, minimum=1)
    power = checks.probability("power", power)
    decided, factor = _mc_levels(levels)
    if n <= 0 or power / factor >= 1:
        return NOTHING_DETECTABLE
    return criterion_mde(n, num_bins - 1, [level / num_buckets for level in decided], power / factor)


def position_shares(acceptance: float, num_speculative_tokens: int) -> np.ndarray:
    """f64[K + 1]: the expected share of a speculative group's tokens at round position j = 1..K+1
    when every draft is accepted with probability `acceptance` independently (a round reaches
    position j iff its first j - 1 drafts are accepted): a^(j-1) / sum_i a^i. A planning model,
    stated as such: real acceptance varies along the sequence, and the run prints its own sizes."""
    acceptance = checks.probability("acceptance", acceptance, allow_zero=True, allow_one=True)
    reach = acceptance ** np.arange(checks.count("num_speculative_tokens", num_speculative_tokens) + 1)
    return reach / reach.sum()


def serial_dependence_mde(
    pairs: float, levels: Sequence[float], *, max_lag: int, num_bins: int = 5, power: float = 0.8
) -> float:
    """Minimum TV between one lag's pair-bin law and the product of its margins that
    `serial_dependence` detects with `power`, given that lag's pair count `pairs` (noncentrality
    n w^2 >= 4 n TV^2 by Cauchy-Schwarz; df of all max_lag tables). Scaling: ~ sqrt(max_lag) / sqrt(n)
    for large df."""
    max_lag = checks.count("max_lag", max_lag, minimum=1)
    num_bins = checks.count("num_bins", num_bins, minimum=2)
    return _chi2_mde(pairs, max_lag * (num_bins - 1) ** 2, levels, power)


def association_tv_mde(n: float, levels: Sequence[float], *, num_bins: int = 5, power: float = 0.8) -> float:
    """Minimum TV of the paired PITs' pair-bin law from independence that `pit_association`'s X^2
    (tested at level / 2) detects with `power`."""
    num_bins = checks.count("num_bins", num_bins, minimum=2)
    return _chi2_mde(n, (num_bins - 1) ** 2, levels, power, split=STATISTICS)


def association_rho_mde(n: float, levels: Sequence[float], *, power: float = 0.8) -> float:
    """Minimum |Spearman rho| of the paired PITs that `pit_association`'s |rho| (two-sided, at level
    / 2) detects with `power`. Assumptions: rho_hat ~ N(rho, 1 / n) (its exact null variance; under
    weak dependence the variance stays ~ 1 / n). Scaling: (z_{t/2} + z_power) / sqrt(n)."""
    n = checks.non_negative("n", n)
    power = checks.probability("power", power)
    decided, factor = _mc_levels(levels, STATISTICS)
    if n == 0 or power / factor >= 1:
        return NOTHING_DETECTABLE

    def shortfall(rho: float) -> float:
        return (
            float(np.prod([stats.norm.sf(stats.norm.isf(t / 2) - rho * math.sqrt(n)) for t in decided]))
            - power / factor
        )

    return float(optimize.brentq(shortfall, 0.0, 1.0, xtol=XTOL)) if shortfall(1.0) > 0 else NOTHING_DETECTABLE


def equal_rate_mde(
    match_probs: np.ndarray, levels: Sequence[float], *, alternative: str = "greater", power: float = 0.8
) -> float:
    """Minimum relative change r of every match probability that `equal_rate` (exact, tested with
    `alternative` 'greater' (pi -> min(1, (1 + r) pi)) or 'less' (pi -> (1 - r) pi)) detects with
    `power` at every stage level. Exact: powers from the Poisson-binomial laws, no approximation.
    Scaling: r ~ (z_t + z_power) / sqrt(sum pi) for small pi."""
    if alternative not in ("greater", "less"):
        raise ValueError(f"alternative must be 'greater' or 'less' for an MDE, got {alternative!r}")
    pi = as_probabilities("match_probs", match_probs)
    power = checks.probability("power", power)
    levels = [checks.probability("level", level) for level in levels]
    pvalues = all_pvalues(poisson_binomial_pmf(pi), alternative)
    regions = [pvalues <= level for level in levels]
    sign = 1.0 if alternative == "greater" else -1.0
    top = 1.0 if alternative == "less" else max(0.0, 1.0 / max(pi.max(initial=0.0), 1e-300) - 1.0)

    def shortfall(r: float) -> float:
        pmf = poisson_binomial_pmf(np.clip(pi * (1 + sign * r), 0.0, 1.0))
        return float(np.prod([pmf[region].sum() for region in regions])) - power

    if pi.size == 0 or top == 0 or shortfall(top) < 0:
        return NOTHING_DETECTABLE
    return float(optimize.brentq(shortfall, 0.0, top, xtol=XTOL))


def identical_pairs_mde(match_probs: np.ndarray, levels: Sequence[float], *, power: float = 0.8) -> float:
    """Minimum fraction f of pairs sharing a stream outright (so their sequences are identical) that
    `identical_sequences` detects with `power`: the smallest f with P(Binomial(n, f) >= c_t) >= power
    per stage, c_t the exact critical count at level t. Chance identities under H0 only add to the
    count, so the bound is conservative."""
    pi = as_probabilities("match_probs", match_probs)
    power = checks.probability("power", power)
    levels = [checks.probability("level", level) for level in levels]
    pvalues = all_pvalues(poisson_binomial_pmf(pi), "greater")
    critical = [int(np.argmax(pvalues <= level)) if (pvalues <= level).any() else None for level in levels]
    if pi.size == 0 or None in critical:
        return NOTHING_DETECTABLE

    def shortfall(f: float) -> float:
        return float(np.prod([stats.binom.sf(c - 1, pi.size, f) for c in critical])) - power

    return float(optimize.brentq(shortfall, 0.0, 1.0, xtol=XTOL)) if shortfall(1.0) > 0 else NOTHING_DETECTABLE
