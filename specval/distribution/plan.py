"""Plan: sample sizes for a target TV, and the MDE of a given sample size, before any data exists.

Both directions use the computation that every criterion's printed MDE uses
(`specval.stats.power.criterion_mde` through `specval.distribution.criteria`): the noncentral chi-square power
of the least favourable deviation (w = 2 TV) at the level the criterion is decided at (Holm's
first step alpha / m of its family, halved for the Monte Carlo resolution, one level per stage of
the confirmation rule), each stage needing power / decision_power.

A protocol's plan lists every p-valued criterion at its planned samples per group with an UPPER
bound on its degrees of freedom (cells of a pooled table hold an expected count >= min_expected,
and there are at most top_k^position (prefix, token) pairs), so the planned MDE is never smaller
than the one the run will print.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from specval.distribution.criteria import (
    P_VALUED_KINDS,
    applicable_groups,
    criterion_name,
    decision_levels,
    family_sizes,
    mde_label,
    mde_power,
)
from specval.protocol import Protocol
from specval.stats import power as powers
from specval.stats.montecarlo import DECISION_LEVEL_FACTOR
from specval.stats.results import StatResult

MAX_SAMPLES = 10**9  # the search for a sample size gives up above this


@dataclass(frozen=True)
class Plan(StatResult):
    """One planning answer: samples (one-sample GOF, and per group for homogeneity) and MDE."""

    tv: float
    n_bins: int
    alpha: float
    power: float
    samples_gof: int
    samples_per_group_homogeneity: int


def _single_mde(n: float, n_bins: int, alpha: float, power: float) -> float:
    levels = [alpha * DECISION_LEVEL_FACTOR]
    return powers.criterion_mde(n, n_bins - 1, levels, mde_power(power, levels))


def samples_for(tv: float, n_bins: int, alpha: float, power: float) -> Plan:
    """Samples a single-stage criterion of `n_bins` cells decided at `alpha` needs to detect TV >= `tv`
    (ValueError naming a bad argument)."""
    powers.samples_for_tv(tv, n_bins, alpha, power)  # validates every argument, names the bad one
    low, high = 1, 2
    while _single_mde(high, n_bins, alpha, power) > tv:
        low, high = high, 2 * high
        if high > MAX_SAMPLES:
            raise ValueError(f"tv = {tv!r} needs more than {MAX_SAMPLES} samples")
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if _single_mde(mid, n_bins, alpha, power) > tv else (low, mid)
    return Plan(tv, n_bins, alpha, power, high, 2 * high)


@dataclass(frozen=True)
class Detectable(StatResult):
    """MDE at a given sample size: one-sample GOF and two equal groups of n (homogeneity)."""

    n: int
    n_bins: int
    alpha: float
    power: float
    mde_gof: float
    mde_homogeneity: float


def mde_for(n: int, n_bins: int, alpha: float, power: float) -> Detectable:
    """Minimum detectable TV at n samples (per group for the homogeneity test), single stage."""
    return Detectable(
        n, n_bins, alpha, power, _single_mde(n, n_bins, alpha, power), _single_mde(n / 2, n_bins, alpha, power)
    )


def protocol_bins(protocol: Protocol, vocab_size: int | None = None) -> int:
    """Upper bound on the cells of a t1 test: top_k when set, else the vocabulary (if known)."""
    if protocol.sampling.top_k > 0:
        return protocol.sampling.top_k
    if vocab_size is None:
        raise ValueError("the protocol has no top_k: give its vocabulary size (--vocab-size) to bound the cells")
    return vocab_size


@dataclass(frozen=True)
class CriterionPlan(StatResult):
    """The planned MDE of one criterion (upper bound on df, so an upper bound on the run's MDE)."""

    criterion: str
    role: str
    family_size: int
    levels: list
    n: float
    df_bound: int
    mde_tv: float
    label: str


def protocol_plan(protocol: Protocol, vocab_size: int | None = None) -> list[CriterionPlan]:
    """Every p-valued criterion of the protocol at its planned samples per group."""
    sizes, rows = family_sizes(protocol), []
    for test in (t for t in protocol.tests if t.kind in P_VALUED_KINDS):
        per_group = protocol.samples_per_group
        n = per_group / 2 if test.kind == "homogeneity" else per_group
        pairs = protocol_bins(protocol, vocab_size) ** test.position
        df = max(1, min(pairs - 1, math.floor(per_group / protocol.min_expected)))
        levels = decision_levels(protocol, test.role)
        mde = powers.criterion_mde(n, df, levels, mde_power(protocol.power, levels))
        for group in applicable_groups(protocol, test):
            rows.append(
                CriterionPlan(
                    criterion_name(test, group), test.role, sizes[test.role], levels, n, df, mde, mde_label(test, group)
                )
            )
    return rows
