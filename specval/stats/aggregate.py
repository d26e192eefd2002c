"""Aggregate: combination of independent per-stratum chi-square tests into one test."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from scipy import stats

from specval.stats.results import StatResult


@dataclasses.dataclass(frozen=True)
class AggregateResult(StatResult):
    """Sum of per-stratum chi-squares with summed degrees of freedom.

    `num_strata` counts the strata given; `num_informative` those with df > 0 (degenerate strata
    add 0 to both sums). `out_of_support` sums the per-stratum out-of-support samples.
    """

    statistic: float
    df: int
    p_value: float
    num_strata: int
    num_informative: int
    n: int
    out_of_support: int = 0


def aggregate_chi2(
    statistics: Sequence[float], dfs: Sequence[int], ns: Sequence[int], out_of_support: int = 0
) -> AggregateResult:
    """Combine independent chi-square statistics: sum of statistics against chi2(sum of df).

    Assumptions: the strata are independent (disjoint samples) and each statistic is
    asymptotically chi2(df) under H0.
    Guarantee: under H0 the false-fail rate at level alpha is alpha up to the chi-square
    approximation of each stratum; p_value is 1.0 when the summed df is 0, and 0.0 when any
    sample was out of support (an immediate FAIL, as in each stratum).
    Scaling: the noncentralities add up: with n_s samples and deviation TV_s in stratum s,
    lambda = sum n_s w_s^2 >= 4 sum n_s TV_s^2 (w >= 2 TV per stratum). So
    `power.mde_tv(sum n, sum df + 1, alpha, power)` is the minimum detectable ROOT-MEAN-SQUARE
    TV over strata (weighted by n_s): if every stratum deviates by at least d, the aggregate
    detects it with the stated power; a deviation confined to one small stratum may not be.
    """
    if not (len(statistics) == len(dfs) == len(ns)):
        raise ValueError(
            f"statistics, dfs and ns must have one entry per stratum, got {len(statistics)}, {len(dfs)}, {len(ns)}"
        )
    total_stat = float(sum(float(s) for s, d in zip(statistics, dfs) if d > 0))
    total_df = int(sum(int(d) for d in dfs))
    if out_of_support > 0:
        p_value = 0.0
    elif total_df == 0:
        p_value = 1.0
    else:
        p_value = float(stats.chi2.sf(total_stat, total_df))
    return AggregateResult(
        statistic=total_stat,
        df=total_df,
        p_value=p_value,
        num_strata=len(dfs),
        num_informative=sum(1 for d in dfs if d > 0),
        n=int(sum(int(n) for n in ns)),
        out_of_support=int(out_of_support),
    )
