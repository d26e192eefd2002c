"""Plan: sample sizes for a target TV, and the MDE of a given sample size, before any data exists.

Both directions use `specval.stats.power` (Pearson chi-square, noncentral chi-square power,
Cohen's w >= 2 TV). Guarantee: a deviation of total-variation distance >= `tv` spread over
`n_bins` cells is detected with probability >= `power` at level `alpha` with the planned n,
up to the asymptotic approximation (checked against a Monte Carlo power run in the tests).
A protocol's MDE per t1 criterion is stated at its planned samples per group, with the number
of cells bounded by the support of the sampling rule (top_k when it is set).
"""

from __future__ import annotations

from dataclasses import dataclass

from specval.protocol import Protocol
from specval.stats import power as powers
from specval.stats.results import StatResult


@dataclass(frozen=True)
class Plan(StatResult):
    """One planning answer: samples (one-sample GOF, and per group for homogeneity) and MDE."""

    tv: float
    n_bins: int
    alpha: float
    power: float
    samples_gof: int
    samples_per_group_homogeneity: int


def samples_for(tv: float, n_bins: int, alpha: float, power: float) -> Plan:
    """Samples needed to detect TV >= `tv` (ValueError naming a bad argument)."""
    return Plan(tv, n_bins, alpha, power, powers.samples_for_tv(tv, n_bins, alpha, power),
                powers.samples_for_tv_two_sample(tv, n_bins, alpha, power))


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
    """Minimum detectable TV at n samples (per group for the homogeneity test)."""
    return Detectable(n, n_bins, alpha, power, powers.mde_tv(n, n_bins, alpha, power),
                      powers.mde_tv_two_sample(n, n, n_bins, alpha, power))


def protocol_bins(protocol: Protocol, vocab_size: int | None = None) -> int:
    """Upper bound on the cells of a t1 test: top_k when set, else the vocabulary (if known)."""
    if protocol.sampling.top_k > 0:
        return protocol.sampling.top_k
    if vocab_size is None:
        raise ValueError("vocab_size is needed for a protocol without top_k (got None)")
    return vocab_size


def protocol_mde(protocol: Protocol, vocab_size: int | None = None) -> Detectable:
    """The MDE a protocol states at its planned samples per group, at its alpha and power."""
    return mde_for(protocol.samples_per_group, protocol_bins(protocol, vocab_size), protocol.alpha,
                   protocol.power)
