"""Homogeneity: two-sample chi-square test that two samplers emit tokens from the same law."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy import stats

from specval.stats import checks
from specval.stats.aggregate import AggregateResult, aggregate_chi2
from specval.stats.pooling import OUT_OF_SUPPORT, CellPooling, pool_cells
from specval.stats.results import StatResult


@dataclasses.dataclass(frozen=True)
class HomogeneityResult(StatResult):
    """One stratum's two-sample test on the pooled 2 x num_cells table.

    `out_of_hint` counts samples (both groups) on tokens that `probs_hint` gives probability 0;
    they form one extra column of the table, so they still count as evidence.
    `is_degenerate`: fewer than 2 cells or an empty group; then df = 0 and p_value = 1.0.
    """

    statistic: float
    df: int
    p_value: float
    n_a: int
    n_b: int
    num_cells: int
    expected_min: float
    min_expected: float
    out_of_hint: int
    is_degenerate: bool


def homogeneity(
    counts_a: np.ndarray,
    counts_b: np.ndarray,
    probs_hint: np.ndarray | None = None,
    *,
    min_expected: float = 5.0,
) -> HomogeneityResult:
    """Chi-square homogeneity test of token counts `counts_a` [V] vs `counts_b` [V].

    Pooling (decided before the a-vs-b split is looked at): without a hint, column j's smallest
    expected count under H0 is min(n_a, n_b) * (a_j + b_j) / N, which depends on the MARGINS only
    (pooled column totals and group sizes), never on how a column splits between the groups;
    with `probs_hint` (reference probabilities) it is min(n_a, n_b) * hint_j, fixed before any
    data. `pool_cells` then merges tokens so that every table cell reaches `min_expected`.
    The table is tested with `scipy.stats.chi2_contingency(correction=False)`.

    Assumptions: the two samples are independent (disjoint seeds) and i.i.d. within a group.
    Guarantee: under H0 (same law) the false-fail rate at level alpha is alpha up to the
    chi-square approximation (descriptive only: the verdict uses the exact-size permutation test
    `strata.stratified_homogeneity`); a TV distance d between the two groups' cell-level laws is
    detected with power >= `power` when d >= `power.mde_tv_two_sample(n_a, n_b, num_cells,
    alpha, power)`; nothing is promised below that.
    Scaling: the detectable TV shrinks like 1 / sqrt(n_a n_b / (n_a + n_b)).
    """
    counts_a = checks.as_counts("counts_a", counts_a)
    counts_b = checks.as_counts("counts_b", counts_b)
    checks.same_length("counts_a", counts_a, "counts_b", counts_b)
    n_a, n_b = int(counts_a.sum()), int(counts_b.sum())
    pooling = _pooling(counts_a + counts_b, n_a, n_b, probs_hint, min_expected)
    table = np.stack([pooling.cell_counts(counts_a), pooling.cell_counts(counts_b)])
    out_of_hint = int((counts_a + counts_b)[pooling.cell_of_token == OUT_OF_SUPPORT].sum())
    if out_of_hint > 0:
        outside = pooling.cell_of_token == OUT_OF_SUPPORT
        table = np.column_stack([table, [counts_a[outside].sum(), counts_b[outside].sum()]])
    table = table[:, table.sum(axis=0) > 0]
    return _test_table(table, n_a, n_b, min_expected, out_of_hint)


def _pooling(totals: np.ndarray, n_a: int, n_b: int, probs_hint: np.ndarray | None, min_expected: float) -> CellPooling:
    """Cell pooling from the margins (no hint) or from the reference hint."""
    smaller = min(n_a, n_b)
    if probs_hint is None:
        total = totals.sum()
        expected = smaller * totals / total if total > 0 else np.zeros(totals.shape)
    else:
        hint = checks.as_weights("probs_hint", probs_hint)
        checks.same_length("probs_hint", hint, "counts_a", totals)
        expected = smaller * hint / hint.sum()
    return pool_cells(expected, min_expected)


def _test_table(table: np.ndarray, n_a: int, n_b: int, min_expected: float, out_of_hint: int) -> HomogeneityResult:
    """chi2_contingency on the 2 x C table, or the degenerate result."""
    num_cells = int(table.shape[1])
    if num_cells < 2 or n_a == 0 or n_b == 0:
        return HomogeneityResult(0.0, 0, 1.0, n_a, n_b, num_cells, 0.0, float(min_expected), out_of_hint, True)
    test = stats.chi2_contingency(table, correction=False)
    return HomogeneityResult(
        statistic=float(test.statistic),
        df=int(test.dof),
        p_value=float(test.pvalue),
        n_a=n_a,
        n_b=n_b,
        num_cells=num_cells,
        expected_min=float(test.expected_freq.min()),
        min_expected=float(min_expected),
        out_of_hint=out_of_hint,
        is_degenerate=False,
    )


def aggregate_homogeneity(results: Sequence[HomogeneityResult]) -> AggregateResult:
    """Aggregate per-stratum homogeneity results: sum of chi-squares against chi2(sum of df).

    Assumptions / Guarantee / Scaling: as `aggregate.aggregate_chi2`; `n` is the total of both
    groups over all strata; degenerate strata add nothing.
    """
    return aggregate_chi2(
        [r.statistic for r in results],
        [r.df for r in results],
        [r.n_a + r.n_b for r in results],
    )
