"""Strata: stratified chi-square tables with exact-size Monte Carlo p-values (GOF and homogeneity).

A stratified criterion tests t_k within every stratum (a prefix, or a prefix and its path). Its
cells are decided from EXPECTED counts only (`pooling.pool_cells`), in components:

- a stratum holding at least `stratum_min` samples is a component on its own;
- every other stratum joins ONE joint component whose cells are (stratum, token) pairs with
  expected count n_s * p(token | stratum), pooled by expected count across strata.

So every sample of every stratum is tested. The statistic is the sum over components of Pearson's
X^2 = sum over cells (O - E)^2 / E, with E the stratum-conditional expectation (for homogeneity,
E = sum over the cell's strata of n_{g,s} * total_{s,cell} / N_s). Its null law is simulated
exactly, conditionally on the strata sizes: multinomial(n_s, p(. | s)) per stratum (GOF), or the
group split of each stratum's cell totals drawn as multivariate hypergeometric (homogeneity: a
permutation test given the margins). The p-value is `montecarlo.sequential_pvalue`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

import numpy as np
from scipy import special

from specval.stats.montecarlo import McPValue, sequential_pvalue
from specval.stats.pooling import pool_cells
from specval.stats.results import StatResult

JOINT = "joint"  # the key of the joint component of the strata below stratum_min


@dataclasses.dataclass(frozen=True, eq=False)
class Component:
    """One table: per stratum, the cells its in-support tokens fall in and a weight per cell.

    GOF: `weights[s]` are the cell probabilities p(cell | s) (summing to 1), `sizes[s] = n_s`.
    Homogeneity: `weights[s]` are the stratum's cell totals of both groups, `sizes[s] = n_{a,s}`.
    """

    keys: tuple[Hashable, ...]  # [S] stratum keys
    cells: tuple[np.ndarray, ...]  # [S] int64[k_s] distinct cell indices
    weights: tuple[np.ndarray, ...]  # [S] f64[k_s] (GOF) or int64[k_s] (homogeneity)
    sizes: np.ndarray  # int64[S]
    num_cells: int
    observed: np.ndarray  # int64[C] (homogeneity: group a)

    @property
    def is_joint(self) -> bool:
        return len(self.keys) > 1


@dataclasses.dataclass(frozen=True)
class StratifiedResult(StatResult):
    """A stratified criterion's test. `df` = sum over components of (cells - 1), an upper bound of
    the statistic's degrees of freedom (used only for the MDE); `n` the samples tested (GOF) or the
    effective two-sample size sum n_a n_b / (n_a + n_b) (homogeneity)."""

    statistic: float
    df: int
    p_value: float
    mc: McPValue
    n: float
    num_strata: int
    num_joint_strata: int
    num_cells: int
    components: list  # per component: keys, n, cells, X^2 (descriptive rows of the summary)


def _checked(counts: np.ndarray, probs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """int64 counts and float64 probabilities of one stratum, or ValueError naming the bad one
    (a cheap check: this runs once per stratum of every criterion)."""
    counts, probs = np.asarray(counts), np.asarray(probs, dtype=np.float64)
    if counts.shape != probs.shape or counts.ndim != 1:
        raise ValueError(f"counts and probs must be 1-D of one length, got {counts.shape} and {probs.shape}")
    if counts.dtype.kind not in "iu" or counts.min(initial=0) < 0:
        raise ValueError(f"counts must be non-negative integers, got dtype {counts.dtype}, min {counts.min()}")
    if not (np.isfinite(probs).all() and probs.min() >= 0 and probs.sum() > 0):
        raise ValueError(f"probs must be finite, >= 0, with a positive total, got {probs[:5]}")
    return counts.astype(np.int64, copy=False), probs


def _compact(cell_of_entry: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct cells of one stratum's entries and the summed `values` per cell."""
    cells, inverse = np.unique(cell_of_entry, return_inverse=True)
    return cells, np.bincount(inverse.reshape(-1), weights=values, minlength=cells.size)


def _component(keys, supports, expected, weights, sizes, observed, min_expected) -> Component:
    """Pool the concatenated (stratum, token) entries of some strata into one component."""
    pooling = pool_cells(np.concatenate(expected), min_expected)
    bounds = np.cumsum([len(s) for s in supports])[:-1]
    per_stratum = np.split(pooling.cell_of_token, bounds)
    cells, cell_weights = zip(*(_compact(c, w) for c, w in zip(per_stratum, weights)))
    counts = np.bincount(pooling.cell_of_token, weights=np.concatenate(observed), minlength=pooling.num_cells)
    return Component(
        tuple(keys),
        tuple(c.astype(np.int64) for c in cells),
        tuple(cell_weights),
        np.asarray(sizes, dtype=np.int64),
        pooling.num_cells,
        counts.astype(np.int64),
    )


def _split(entries: list, is_big) -> list[list]:
    """Components: each big entry alone, the others together (if any)."""
    big = [[e] for e in entries if is_big(e)]
    small = [e for e in entries if not is_big(e)]
    return big + ([small] if small else [])


# ---------------------------------------------------------------- goodness of fit


def gof_components(
    strata: Sequence[tuple[Hashable, np.ndarray, np.ndarray]], stratum_min: int, min_expected: float
) -> list[Component]:
    """Components of a stratified GOF from (key, counts[V], probs[V]) per stratum.

    Samples on tokens of probability 0 are left out (they FAIL the out-of-support criterion);
    n_s counts the in-support samples. Strata with no in-support sample are dropped.
    """
    entries = []
    for key, counts, probs in strata:
        counts, probs = _checked(counts, probs)
        support = np.flatnonzero(probs > 0)
        n = int(counts[support].sum())
        if n:
            entries.append((key, support, probs[support] / probs[support].sum(), n, counts[support]))
    return [
        _component(
            [e[0] for e in part],
            [e[1] for e in part],
            [e[3] * e[2] for e in part],
            [e[2] for e in part],
            [e[3] for e in part],
            [e[4] for e in part],
            min_expected,
        )
        for part in _split(entries, lambda e: e[3] >= stratum_min)
    ]


def _gof_expected(component: Component) -> np.ndarray:
    expected = np.zeros(component.num_cells)
    for cells, probs, n in zip(component.cells, component.weights, component.sizes):
        expected[cells] += n * probs
    return expected


def _pearson(counts: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Pearson X^2 of counts[b, C] against expected[C] (> 0): f64[b]."""
    return (((counts - expected) ** 2) / expected).sum(axis=1)


def _gof_null(components: list[Component]):
    expected = [_gof_expected(c) for c in components]

    def draw(rng: np.random.Generator, size: int) -> np.ndarray:
        total = np.zeros(size)
        for component, mean in zip(components, expected):
            counts = np.zeros((size, component.num_cells))
            for cells, probs, n in zip(component.cells, component.weights, component.sizes):
                counts[:, cells] += rng.multinomial(int(n), probs / probs.sum(), size=size)
            total += _pearson(counts, mean)
        return total

    def observed() -> float:
        return float(sum(_pearson(c.observed[None, :].astype(np.float64), m)[0] for c, m in zip(components, expected)))

    return draw, observed, expected


def stratified_gof(
    strata: Sequence[tuple[Hashable, np.ndarray, np.ndarray]],
    *,
    stratum_min: int,
    min_expected: float,
    level: float,
    rng: np.random.Generator,
) -> StratifiedResult:
    """Exact-size stratified GOF of per-stratum token counts against the reference probabilities.

    Assumptions: given the strata sizes, the samples of a stratum are i.i.d. from its `probs`
    under H0 (the exact reference), and strata are independent.
    Guarantee: P(p_value <= a) <= a under H0 for every a (Monte Carlo under the known reference,
    `montecarlo`); every in-support sample is in some tested cell.
    Scaling: O(draws * sum over strata of cells); draws ~ 250 under H0, num_draws(level) when
    rejected.
    """
    components = gof_components(strata, stratum_min, min_expected)
    draw, observed, expected = _gof_null(components)
    rows = [
        _row(c, float(c.sizes.sum()), _pearson(c.observed[None, :].astype(np.float64), m)[0])
        for c, m in zip(components, expected)
    ]
    return _result(components, observed(), draw, level, rng, float(sum(c.sizes.sum() for c in components)), rows)


# ---------------------------------------------------------------- homogeneity


def homogeneity_components(
    strata: Sequence[tuple[Hashable, np.ndarray, np.ndarray, np.ndarray]], stratum_min: int, min_expected: float
) -> list[Component]:
    """Components of a stratified homogeneity test from (key, counts_a[V], counts_b[V], probs[V]).

    Cells are pooled by min(n_a, n_b) * p(token | s) (the reference as a hint fixed before the
    split is looked at); a stratum is big iff min(n_a, n_b) >= stratum_min. Strata reached by
    one group only carry no information about the split and are dropped.
    """
    entries = []
    for key, counts_a, counts_b, probs in strata:
        counts_a, probs = _checked(counts_a, probs)
        counts_b, _ = _checked(counts_b, probs)
        support = np.flatnonzero(probs > 0)
        a, b = counts_a[support], counts_b[support]
        smaller = min(int(a.sum()), int(b.sum()))
        if smaller:
            entries.append((key, support, smaller * probs[support] / probs[support].sum(), a, b, smaller))
    return [
        _component(
            [e[0] for e in part],
            [e[1] for e in part],
            [e[2] for e in part],
            [e[3] + e[4] for e in part],
            [int(e[3].sum()) for e in part],
            [e[3] for e in part],
            min_expected,
        )
        for part in _split(entries, lambda e: e[5] >= stratum_min)
    ]


def _split_weights(component: Component) -> tuple[np.ndarray, np.ndarray, float]:
    """(1 / E_a + 1 / E_b per cell (0 where a cell cannot vary), E_a, effective n) of a component."""
    mean_a, mean_b, n_eff = np.zeros(component.num_cells), np.zeros(component.num_cells), 0.0
    for cells, totals, n_a in zip(component.cells, component.weights, component.sizes):
        total = totals.sum()
        mean_a[cells] += n_a * totals / total
        mean_b[cells] += (total - n_a) * totals / total
        n_eff += n_a * (total - n_a) / total
    varies = (mean_a > 0) & (mean_b > 0)
    inverse = np.zeros(component.num_cells)
    inverse[varies] = 1.0 / mean_a[varies] + 1.0 / mean_b[varies]
    return inverse, mean_a, n_eff


def _homogeneity_null(components: list[Component]):
    weights = [_split_weights(c) for c in components]

    def statistic(counts_a: np.ndarray, inverse: np.ndarray, mean_a: np.ndarray) -> np.ndarray:
        return (((counts_a - mean_a) ** 2) * inverse).sum(axis=1)  # X^2 of the 2 x C table, f64[b]

    def draw(rng: np.random.Generator, size: int) -> np.ndarray:
        total = np.zeros(size)
        for component, (inverse, mean_a, _) in zip(components, weights):
            counts = np.zeros((size, component.num_cells))
            for cells, totals, n_a in zip(component.cells, component.weights, component.sizes):
                counts[:, cells] += rng.multivariate_hypergeometric(
                    totals.astype(np.int64), int(n_a), size=size, method="marginals"
                )
            total += statistic(counts, inverse, mean_a)
        return total

    per_component = [
        statistic(c.observed[None, :].astype(np.float64), w[0], w[1])[0] for c, w in zip(components, weights)
    ]
    return draw, per_component, [w[2] for w in weights]


def stratified_homogeneity(
    strata: Sequence[tuple[Hashable, np.ndarray, np.ndarray, np.ndarray]],
    *,
    stratum_min: int,
    min_expected: float,
    level: float,
    rng: np.random.Generator,
) -> StratifiedResult:
    """Exact-size stratified two-sample test (group a vs group b) of per-stratum token counts.

    Assumptions: the groups are independent (disjoint seeds), i.i.d. within a group and stratum.
    Guarantee: conditionally on every stratum's margins (its cell totals and group sizes), the
    group labels are exchangeable under H0, and the null is simulated exactly from that
    permutation law, so P(p_value <= a) <= a for every a.
    Scaling: O(draws * sum over strata of cells), as `stratified_gof`.
    """
    components = homogeneity_components(strata, stratum_min, min_expected)
    draw, per_component, n_eff = _homogeneity_null(components)
    rows = [_row(c, e, x) for c, e, x in zip(components, n_eff, per_component)]
    return _result(components, float(sum(per_component)), draw, level, rng, float(sum(n_eff)), rows)


# ---------------------------------------------------------------- shared


def _row(component: Component, n: float, statistic: float) -> dict:
    """A component's descriptive row: its strata keys (None for a lone stratum: see `key`), size,
    cells, X^2 and the asymptotic chi-square p-value (descriptive only: the criterion's p-value is
    the Monte Carlo one of the summed statistic)."""
    df = component.num_cells - 1
    return {
        "key": component.keys[0] if not component.is_joint else JOINT,
        "joint_keys": list(component.keys) if component.is_joint else None,
        "n": float(n),
        "num_cells": component.num_cells,
        "statistic": float(statistic),
        "df": df,
        "p_value": float(special.chdtrc(df, statistic)) if df > 0 else 1.0,
    }


def _result(
    components: list[Component],
    observed: float,
    draw,
    level: float,
    rng: np.random.Generator,
    n: float,
    rows: list[dict],
) -> StratifiedResult:
    df = int(sum(c.num_cells - 1 for c in components))
    mc = sequential_pvalue(observed, draw, level, rng) if df > 0 else McPValue(1.0, 0, 0, 0, False)
    return StratifiedResult(
        statistic=observed,
        df=df,
        p_value=mc.p_value,
        mc=mc,
        n=n,
        num_strata=int(sum(len(c.keys) for c in components)),
        num_joint_strata=int(sum(len(c.keys) for c in components if c.is_joint)),
        num_cells=int(sum(c.num_cells for c in components)),
        components=rows,
    )
