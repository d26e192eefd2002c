"""Independence: tests that PAIRED requests (distinct seeds in one batch, or one slot of two batches)
draw independent random streams.

A sampler whose every request has the exact law can still correlate requests (two requests drawing
u and 1 - u, a seed shared by two slots, an offset that two slots overlap on): each marginal is
exact, the joint law is wrong. Three tests:

- `equal_rate`: the count of pairs with t_a == t_b against its exact law under independence, a
  Poisson-binomial with success probabilities pi_i = sum_x p_a,i(x) p_b,i(x);
- `pit_association`: dependence between the paired randomized PITs (`sequence.randomized_pit`),
  a rank correlation and a binned independence X^2, with the exact null of independent uniforms;
- `identical_sequences`: the count of pairs whose whole sequences are identical, with its exact law
  given the sequences of side a.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np
from scipy import signal

from specval.stats import checks
from specval.stats.montecarlo import BESAG_CLIFFORD, EARLY_REJECTION, McPValue, rejected_early, sequential_pvalue
from specval.stats.results import StatResult
from specval.stats.sequence import (
    SERIAL_BINS,
    as_pit,
    in_chunks,
    independence_chi2,
    packed_digits,
    pair_counts,
    to_bins,
    uniform_bins,
)

ALTERNATIVES = ("two-sided", "greater", "less")
PMF_RTOL = 1e-7  # two-sided p-value: outcomes with pmf <= pmf(observed) * (1 + PMF_RTOL) count (scipy's rule)
RHO_SCALE = 12.0  # 12 E[(U - 1/2)(V - 1/2)] is Spearman's rho of a pair with U(0, 1) margins
DIRECT_MAX = 2048  # Poisson-binomial: exact recursion up to this many probabilities per block
RECURSION_BLOCK = 32  # the recursion runs on blocks of this many probabilities at once (`_pmf_direct`)
STATISTICS = 2  # pit_association combines two Monte Carlo p-values (Bonferroni)


# ---------------------------------------------------------------- Poisson-binomial law


def as_probabilities(name: str, values: object) -> np.ndarray:
    """A 1-D float64 array of probabilities in [0, 1], or ValueError naming `name`."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1 or not ((array >= 0) & (array <= 1)).all():
        raise ValueError(f"{name} must be a 1-D array of probabilities in [0, 1], got shape {array.shape}")
    return array


def _pmf_direct(probs: np.ndarray) -> np.ndarray:
    """Poisson-binomial pmf by the recursion pmf_i(k) = pmf_{i-1}(k) (1 - p_i) + pmf_{i-1}(k - 1) p_i,
    run on every block of RECURSION_BLOCK probabilities at once, the blocks' pmfs then multiplied
    pairwise by direct convolution: sums of non-negative terms only, so every entry, tails included,
    has a small RELATIVE error (the same guarantee as the plain recursion, ~6x faster at n = 2,000)."""
    blocks = -(-max(probs.size, 1) // RECURSION_BLOCK)
    padded = np.zeros(blocks * RECURSION_BLOCK)  # a padded probability of 0 multiplies by 1
    padded[: probs.size] = probs
    padded = padded.reshape(blocks, RECURSION_BLOCK)
    pmf = np.zeros((blocks, RECURSION_BLOCK + 1))
    pmf[:, 0] = 1.0
    for i in range(RECURSION_BLOCK):
        p = padded[:, i : i + 1]
        pmf[:, 1 : i + 2] = pmf[:, 1 : i + 2] * (1.0 - p) + pmf[:, : i + 1] * p
        pmf[:, 0] *= 1.0 - padded[:, i]
    polys = list(pmf)
    while len(polys) > 1:
        polys = [np.convolve(*polys[i : i + 2]) if i + 1 < len(polys) else polys[i] for i in range(0, len(polys), 2)]
    return polys[0][: probs.size + 1]


def poisson_binomial_pmf(probs: np.ndarray) -> np.ndarray:
    """pmf[k] = P(sum of independent Bernoulli(probs[i]) = k), k = 0..n: float64[n + 1].

    Up to DIRECT_MAX probabilities: the exact recursion (`_pmf_direct`, O(n^2)). Beyond: the
    recursion per block of DIRECT_MAX, the blocks' pmfs multiplied pairwise in a balanced tree with
    scipy.signal.fftconvolve (O(n^2 / DIRECT_MAX + n log^2 n)).
    Guarantee: entries >= 0 summing to 1; relative error ~1e-13 per entry for n <= DIRECT_MAX (tails
    included); beyond, absolute error <~ 1e-15 per entry (FFT rounding), so tails below ~1e-13 are
    rounding noise (p-values that small are reported as such, never as 0 > true). Checked against
    brute-force enumeration and the binomial law in the suite.
    """
    probs = as_probabilities("probs", probs)
    blocks = [_pmf_direct(probs[i : i + DIRECT_MAX]) for i in range(0, max(probs.size, 1), DIRECT_MAX)]
    width = max(block.size for block in blocks)
    polys = np.stack([np.pad(block, (0, width - block.size)) for block in blocks])
    while polys.shape[0] > 1:
        if polys.shape[0] % 2:
            polys = np.concatenate([polys, np.eye(1, polys.shape[1])])
        polys = signal.fftconvolve(polys[0::2], polys[1::2], axes=1)
    pmf = np.clip(polys[0][: probs.size + 1], 0.0, None)
    return pmf / pmf.sum()


def discrete_pvalue(pmf: np.ndarray, observed: int, alternative: str) -> float:
    """p-value of `observed` under the law `pmf` on 0..n: upper tail ('greater'), lower tail
    ('less'), or the total mass of outcomes no more likely than observed ('two-sided', scipy's
    binomtest rule)."""
    return float(all_pvalues(pmf, alternative)[observed])


def all_pvalues(pmf: np.ndarray, alternative: str) -> np.ndarray:
    """`discrete_pvalue` of every outcome k = 0..n at once: float64[n + 1] (O(n log n))."""
    if alternative not in ALTERNATIVES:
        raise ValueError(f"alternative must be one of {ALTERNATIVES}, got {alternative!r}")
    if alternative == "greater":
        return np.minimum(1.0, np.cumsum(pmf[::-1])[::-1])
    if alternative == "less":
        return np.minimum(1.0, np.cumsum(pmf))
    ordered = np.sort(pmf)
    below = np.searchsorted(ordered, pmf * (1 + PMF_RTOL), side="right")  # outcomes no more likely
    return np.minimum(1.0, np.concatenate([[0.0], np.cumsum(ordered)])[below])


# ---------------------------------------------------------------- equal rate


@dataclasses.dataclass(frozen=True)
class EqualRateResult(StatResult):
    """Count of pairs with t_a == t_b against Poisson-binomial(pi). `ratio` = count / expected."""

    count: int
    expected: float
    ratio: float
    p_value: float
    alternative: str
    n_pairs: int


def match_probabilities(p_a: np.ndarray, p_b: np.ndarray) -> np.ndarray:
    """pi_i = sum_x p_a[i, x] p_b[i, x] (rows normalised): float64[n]."""
    p_a, p_b = np.asarray(p_a, dtype=np.float64), np.asarray(p_b, dtype=np.float64)
    if p_a.ndim != 2 or p_a.shape != p_b.shape:
        raise ValueError(f"p_a and p_b must be 2-D of one shape, got {p_a.shape} and {p_b.shape}")
    for name, rows in (("p_a", p_a), ("p_b", p_b)):
        if not (np.isfinite(rows).all() and (rows >= 0).all() and (rows.sum(axis=1) > 0).all()):
            raise ValueError(f"{name} rows must be finite, >= 0 and have a positive total")
    return np.clip((p_a * p_b).sum(axis=1) / (p_a.sum(axis=1) * p_b.sum(axis=1)), 0.0, 1.0)


def equal_rate(
    tokens_a: np.ndarray, tokens_b: np.ndarray, p_a: np.ndarray, p_b: np.ndarray, alternative: str = "two-sided"
) -> EqualRateResult:
    """Exact test of the count of equal paired tokens against independence.

    Assumptions: pair i's tokens are independent draws from p_a[i] and p_b[i] under H0, and the
    indicators 1[t_a,i == t_b,i] are independent across pairs given their laws: one compared position
    per pair of requests (e.g. t_1 after the pair's common prompt), or positions whose laws do not
    depend on earlier comparisons. (For later positions of the same request pair pi_i depends on
    the earlier tokens; the count is then a martingale sum with the same mean and the
    Poisson-binomial law is approximate: use `pit_association`, exact there.)
    Alternatives: 'greater' sees shared or overlapping streams (more equal tokens), 'less'
    antithetic streams (u and 1 - u: fewer), 'two-sided' both.
    Guarantee: P(p <= a) <= a under H0 (exact discrete law, no approximation).
    Scaling: O(n log^2 n).
    """
    tokens_a, tokens_b = checks.as_counts("tokens_a", tokens_a), checks.as_counts("tokens_b", tokens_b)
    checks.same_length("tokens_a", tokens_a, "tokens_b", tokens_b)
    pi = match_probabilities(p_a, p_b)
    if pi.size != tokens_a.size:
        raise ValueError(f"p_a must have one row per pair ({tokens_a.size}), got {pi.size}")
    count = int((tokens_a == tokens_b).sum())
    expected = float(pi.sum())
    p_value = discrete_pvalue(poisson_binomial_pmf(pi), count, alternative)
    ratio = count / expected if expected > 0 else float("inf") if count else 1.0
    return EqualRateResult(count, expected, ratio, p_value, alternative, int(pi.size))


# ---------------------------------------------------------------- PIT association


@dataclasses.dataclass(frozen=True)
class PitAssociationResult(StatResult):
    """Rank correlation and binned independence X^2 of paired PITs. `rho` = 12 mean((u_a - 1/2)
    (u_b - 1/2)), Spearman's rho of the pair law estimated with its known uniform margins (sd
    1 / sqrt(n) under H0); `p_value` = min(1, 2 min(rho_p_value, chi2_p_value)) (Bonferroni)."""

    rho: float
    rho_p_value: float
    chi2: float
    chi2_df: int
    chi2_p_value: float
    p_value: float
    n: int
    num_bins: int
    mc_rho: McPValue | None
    mc_chi2: McPValue | None


def _rho(u_a: np.ndarray, u_b: np.ndarray) -> np.ndarray:
    return RHO_SCALE * ((u_a - 0.5) * (u_b - 0.5)).mean(axis=-1)


def pit_association(
    u_a: np.ndarray,
    u_b: np.ndarray,
    *,
    num_bins: int = SERIAL_BINS,
    level: float,
    rng: np.random.Generator,
    rule: str = BESAG_CLIFFORD,
) -> PitAssociationResult:
    """Exact-size test that paired PITs are independent: |rho| (linear, monotone dependence such as
    antithetic u, 1 - u) and the B x B independence X^2 (any dependence), each a sequential Monte
    Carlo p-value at level / 2, combined by Bonferroni.

    Assumptions: u_a[i], u_b[i] are the randomized PITs of the i-th committed token of the two
    requests of pair i's slot (any positions, as long as the same rule pairs them); under H0 the
    requests are independent, so with the tokens interleaved a_1, b_1, a_2, b_2, ... every U is
    U(0, 1) given all earlier ones: the pairs are i.i.d. uniform on the unit square, EXACTLY.
    Guarantee: P(p <= a) <= a under H0 (each p-value by `rule`, `montecarlo.RULES`); deterministic
    in `rng` (rho's null first, then X^2's; the
    X^2 null's bins are packed digits under stream version 2, `integers` under version 1).
    Scaling: O(draws * n).
    """
    u_a, u_b = as_pit("u_a", u_a), as_pit("u_b", u_b)
    checks.same_length("u_a", u_a, "u_b", u_b)
    num_bins = checks.count("num_bins", num_bins, minimum=2)
    n = int(u_a.size)
    if n == 0:
        return PitAssociationResult(0.0, 1.0, 0.0, 0, 1.0, 1.0, 0, num_bins, None, None)
    rho = float(_rho(u_a, u_b))
    chi2 = float(
        independence_chi2(pair_counts(to_bins(u_a, num_bins)[None], to_bins(u_b, num_bins)[None], num_bins))[0]
    )

    def draw_rho(gen: np.random.Generator, size: int) -> np.ndarray:
        return np.abs(_rho(gen.random((size, n)), gen.random((size, n))))

    def draw_chi2(gen: np.random.Generator, size: int) -> np.ndarray:
        if packed_digits(gen):  # stream version 2: each null pair's rows a, b one after the other
            bins = uniform_bins(gen, num_bins, (size, 2, n))
            return independence_chi2(pair_counts(bins[:, 0], bins[:, 1], num_bins))
        bins = gen.integers(0, num_bins, size=(2, size, n))  # version 1 and legacy: every row a, then every b
        return independence_chi2(pair_counts(bins[0], bins[1], num_bins))

    mc_rho = sequential_pvalue(abs(rho), in_chunks(draw_rho, 2 * n), level / STATISTICS, rng, rule)
    if rule == EARLY_REJECTION and rejected_early(mc_rho):
        # |rho| already rejected at its early look: Bonferroni's 2 min(p_rho, p_chi2) <= 2 p_rho, so
        # taking p_chi2 = 1 gives a p-value >= a valid one (valid) and no second null to draw
        p_value = min(1.0, STATISTICS * mc_rho.p_value)
        return PitAssociationResult(
            rho, mc_rho.p_value, chi2, (num_bins - 1) ** 2, 1.0, p_value, n, num_bins, mc_rho, None
        )
    mc_chi2 = sequential_pvalue(chi2, in_chunks(draw_chi2, 2 * n), level / STATISTICS, rng, rule)
    p_value = min(1.0, STATISTICS * min(mc_rho.p_value, mc_chi2.p_value))
    return PitAssociationResult(
        rho, mc_rho.p_value, chi2, (num_bins - 1) ** 2, mc_chi2.p_value, p_value, n, num_bins, mc_rho, mc_chi2
    )


# ---------------------------------------------------------------- identical sequences


@dataclasses.dataclass(frozen=True)
class IdenticalSequencesResult(StatResult):
    """Pairs whose whole sequences are identical, against Poisson-binomial(match probabilities)."""

    count: int
    expected: float
    p_value: float
    n_pairs: int
    identical_pairs: list


def sequence_match_probability(mass: np.ndarray) -> float:
    """P_b(seq_b = seq_a | seq_a) = prod_j p_b(a_j | a_<j), from side b's reference masses of a's
    tokens (`pit_parts`' mass along a's own prefixes; the same as a's when both requests share the
    prompt and the sampling parameters). Computed as exp(sum log) to avoid underflow issues."""
    mass = np.asarray(mass, dtype=np.float64)
    if mass.ndim != 1 or not ((mass >= 0) & (mass <= 1)).all():
        raise ValueError(f"mass must be 1-D probabilities, got shape {mass.shape}")
    with np.errstate(divide="ignore"):
        return float(np.exp(np.log(mass).sum()))


def identical_sequences(
    seqs_a: Sequence[np.ndarray], seqs_b: Sequence[np.ndarray], match_probs: np.ndarray
) -> IdenticalSequencesResult:
    """Deterministic count of pairs (distinct seeds) that produced identical whole sequences, with
    its exact law given side a's sequences.

    Assumptions: pairs are independent of each other; under H0 sequence b is independent of
    sequence a, so 1[seq_b == seq_a] given seq_a is Bernoulli(P_b(seq_a)); `match_probs[i]` is
    P_b(seq_a,i) (`sequence_match_probability`, a sequence ending at an end token includes its
    mass) OR AN UPPER BOUND of it (e.g. computed with the largest mass per position).
    Guarantee: the count is Poisson-binomial(P_b(seq_a,i)) given the a-sequences, so
    p = P(count' >= count) is exact with exact match probabilities; the upper tail is increasing in
    every pi_i, so upper bounds give a larger, still valid p-value (P(p <= a) <= a under H0).
    Identical sequences of length L have match probability ~ exp(-L * entropy): a handful of them is
    overwhelming evidence of shared streams.
    Scaling: O(total tokens + n log^2 n).
    """
    if len(seqs_a) != len(seqs_b):
        raise ValueError(f"seqs_a and seqs_b must pair up, got {len(seqs_a)} and {len(seqs_b)}")
    pi = as_probabilities("match_probs", match_probs)
    if pi.size != len(seqs_a):
        raise ValueError(f"match_probs must have one entry per pair ({len(seqs_a)}), got {pi.size}")
    same = [i for i, (a, b) in enumerate(zip(seqs_a, seqs_b)) if np.array_equal(np.asarray(a), np.asarray(b))]
    p_value = discrete_pvalue(poisson_binomial_pmf(pi), len(same), "greater")
    return IdenticalSequencesResult(len(same), float(pi.sum()), p_value, int(pi.size), same)
