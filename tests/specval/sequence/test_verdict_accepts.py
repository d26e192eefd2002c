"""The `accepts` criterion (accepted drafts per draft position against Poisson-binomial(beta)) by
Monte Carlo: its size at zero shift, and its power at the MDE it prints.

Data: one speculative group of seq_fp32's smoke size (200 sequences of 64 tokens, K = 3, batches of
50) drawn by exact speculative sampling on the null model's chain (`tests/fixtures/sequence_null`,
acceptance ~0.8), optionally with the accept probability of ONE draft position scaled down (a draft
there is accepted with probability (1 - r) beta: the scale of the printed MDE, "relative drop of the
acceptance rate at one draft position"). Only what `accepts` reads is built (sources, beta).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from specval.sequence import verdict
from specval.sequence.protocol import load_sequence_protocol, resolve
from tests.fixtures import sequence_null

REPO = Path(__file__).resolve().parents[3]
PROTOCOL = resolve(load_sequence_protocol(REPO / "protocols" / "seq_fp32.yaml"), "smoke")
SHIPPED_LEVEL = PROTOCOL.alpha / verdict.family_sizes(PROTOCOL)["primary"]  # 0.01 / 50: Holm's first step
SIZE_LEVEL = 0.05  # the size check decides at a level a few thousand replicates resolve
POWER_REPLICATES = 400
SIZE_REPLICATES = 1000
SIZE_PROTOCOL = dataclasses.replace(PROTOCOL, sequences_per_group=100, sequence_length=32)  # a quarter of the work
FALSE_FAIL = 1e-3
CHAIN = sequence_null.make_chain(len(PROTOCOL.prompts), seed=11)


def _context(index: int, level: float, scale: tuple[float, ...] | None = None, protocol=PROTOCOL) -> verdict.Context:
    """A Context of one group (only sources, beta and round positions filled: all `accepts` reads)."""
    rng = np.random.default_rng([31, index])
    rows = np.arange(protocol.sequences_per_group)
    batch, slot = rows // protocol.batch_size, rows % protocol.batch_size
    k = protocol.num_speculative_tokens
    tokens, sources, states = sequence_null.sample_group(
        CHAIN, sequence_null.VOCAB + batch % len(protocol.prompts), protocol.sequence_length, k, True, rng, scale
    )
    beta = np.minimum(CHAIN.target, CHAIN.draft).sum(axis=1)[states]
    data = verdict.GroupSequences(tokens, sources, batch, slot, {"beta": beta}, tokens[:0], tokens[:0])
    position, previous = verdict.round_positions(sources, k)
    unused = np.zeros(tokens.shape)
    return verdict.Context(protocol, "async", data, unused, unused, position, previous, level, _unused_rng)


def _unused_rng(name: str) -> np.random.Generator:
    raise AssertionError(f"accepts draws no random numbers, asked for {name!r}")


def _p_value(index: int, level: float, scale: tuple[float, ...] | None = None, protocol=PROTOCOL) -> float:
    with sequence_null.mdes_not_printed():
        return verdict.accepts(_context(index, level, scale, protocol))[1]


def test_accepts_keeps_its_size_at_zero_shift():
    # 1,000 null replicates of 100 sequences of 32 tokens decided at 0.05: the rejection count must
    # have a two-sided 99.9% Clopper-Pearson interval that contains 0.05 or lies below it; fails
    # w.p. <= 0.0005 when the true size is <= 0.05 (the betas are predictable, so each accept is
    # Bernoulli(beta) given the past; the Poisson-binomial law conditions on the realised tested
    # drafts, whose number depends on earlier accepts: this measures what that costs). A true size
    # of 0.08 fails it with probability ~0.9.
    p_values = np.array([_p_value(10_000 + i, SIZE_LEVEL, None, SIZE_PROTOCOL) for i in range(SIZE_REPLICATES)])
    rejections = int((p_values <= SIZE_LEVEL).sum())
    low, _ = proportion_confint(rejections, SIZE_REPLICATES, alpha=2 * FALSE_FAIL / 2, method="beta")
    assert low <= SIZE_LEVEL, f"{rejections} / {SIZE_REPLICATES} null rejections at {SIZE_LEVEL}"


def test_accepts_detects_a_drop_of_its_printed_mde_at_the_position_that_prints_it():
    # The printed MDE is the largest over draft positions of each position's MDE (exact
    # Poisson-binomial powers at the shipped level 0.01 / 50, Bonferroni over positions, one-sided
    # region at half the level). Plant a drop of exactly that size at the position it comes from
    # (the fewest tested drafts: the last) and nowhere else; 400 replicates must reject at
    # >= the binomial 1e-3 quantile of Binomial(400, 0.8) (294, a rate of 0.735): fails w.p.
    # <= 1e-3 when the true power is >= 0.8. Planted: scaling min(1, s p / q) instead of
    # s min(1, p / q) (a drop that mostly vanishes where q < p) rejected 3 of 100 and fails it.
    null = verdict.accepts(_context(0, SHIPPED_LEVEL))
    mde, details = null[3], null[5]
    own = {j: d.mde for j, d in verdict.accepts_by_position(_context(0, SHIPPED_LEVEL)).items()}
    weakest = max(own, key=own.get)
    assert weakest == PROTOCOL.num_speculative_tokens and mde == own[weakest] and len(details["accepted"]) == 3
    assert null[4] == "relative drop of the acceptance rate at one draft position" and 0.02 < mde < 0.2
    scale = tuple(1.0 - mde if j == weakest else 1.0 for j in range(1, PROTOCOL.num_speculative_tokens + 1))
    hits = sum(_p_value(20_000 + i, SHIPPED_LEVEL, scale) <= SHIPPED_LEVEL for i in range(POWER_REPLICATES))
    floor = int(stats.binom.ppf(FALSE_FAIL, POWER_REPLICATES, PROTOCOL.power))
    assert floor == 294
    assert hits >= floor, f"{hits} / {POWER_REPLICATES} rejections at a drop of the printed MDE {mde:.4f}"
