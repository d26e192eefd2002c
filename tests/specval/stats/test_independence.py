"""Cross-request independence: the exact Poisson-binomial law, the equal-token rate, PIT association,
identical sequences, and their MDEs.

Statistical tests use fixed seeds; each assertion states its false-fail rate. Size checks: the
rejection count of 2,000 replicates at alpha = 0.05 must have a Clopper-Pearson 99.9% interval that
contains alpha or lies below it (fails w.p. <= 0.0005 when the true size is <= alpha).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from scipy import stats
from statsmodels.stats.proportion import proportion_confint

from specval.stats import independence as ind
from specval.stats import sequence as sq
from specval.stats import sequence_power as sp
from specval.stats.montecarlo import EARLY_REJECTION
from tests.fixtures.spec_chain import Bugs, make_chain, sample

ALPHA = 0.05
SIZE_REPS = 2000
SIZE_CI = 0.001
LEVEL = 0.01
CHAIN = make_chain(vocab=32, seed=1)
NO_BUGS = Bugs()  # frozen: one shared default


def _assert_size(p_values) -> None:
    rejections = int((np.asarray(p_values) <= ALPHA).sum())
    low, _ = proportion_confint(rejections, len(p_values), alpha=SIZE_CI, method="beta")
    assert low <= ALPHA, f"{rejections} / {len(p_values)} rejections at {ALPHA}"


def _paired_run(num_pairs: int, length: int, seed: int, bugs: Bugs = NO_BUGS):
    """Pairs of requests (2m, 2m + 1) with a common start state, as one batch of the K = 3 sampler."""
    starts = np.repeat(np.random.default_rng(seed + 10_000).integers(0, CHAIN.vocab, num_pairs), 2)
    return sample(CHAIN, 2 * num_pairs, length, np.random.default_rng(seed), bugs=bugs, starts=starts), starts


def _paired_pits(run, seed: int, order: str) -> tuple[np.ndarray, np.ndarray]:
    lower, mass = sq.pit_parts(run.reference(CHAIN), run.tokens.reshape(-1), order=order)
    u = sq.randomized_pit(lower, mass, np.random.default_rng(seed)).reshape(run.tokens.shape)
    return u[0::2], u[1::2]


# ---------------------------------------------------------------- Poisson-binomial law


def _brute_force(probs: np.ndarray) -> np.ndarray:
    pmf = np.zeros(probs.size + 1)
    for outcome in itertools.product((0, 1), repeat=probs.size):
        hits = np.array(outcome, dtype=bool)
        pmf[hits.sum()] += np.prod(np.where(hits, probs, 1 - probs))
    return pmf


@pytest.mark.parametrize(
    "probs",
    [
        [],
        [0.3],
        [0.0, 1.0, 0.5],
        [1e-9, 0.999, 0.2, 0.2, 0.7],
        list(np.random.default_rng(0).random(10)),
        list(np.random.default_rng(1).random(9) ** 4),
    ],
)
def test_poisson_binomial_matches_brute_force(probs):
    probs = np.asarray(probs, dtype=np.float64)
    assert ind.poisson_binomial_pmf(probs) == pytest.approx(_brute_force(probs), abs=1e-14)


def test_poisson_binomial_reduces_to_the_binomial_and_pvalues_match_scipy():
    pmf = ind.poisson_binomial_pmf(np.full(601, 0.07))
    assert pmf == pytest.approx(stats.binom.pmf(np.arange(602), 601, 0.07), abs=1e-13)
    for k in (20, 42, 60):
        for alternative in ind.ALTERNATIVES:
            expected = stats.binomtest(k, 601, 0.07, alternative=alternative).pvalue
            assert ind.discrete_pvalue(pmf, k, alternative) == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="alternative"):
        ind.discrete_pvalue(pmf, 3, "both")
    # beyond DIRECT_MAX the blocks are multiplied by FFT: absolute error ~1e-15 per entry
    big = ind.poisson_binomial_pmf(np.full(3 * ind.DIRECT_MAX + 5, 0.3))
    assert big == pytest.approx(stats.binom.pmf(np.arange(big.size), big.size - 1, 0.3), abs=1e-13)


def _plain_recursion(probs: np.ndarray) -> np.ndarray:
    pmf = np.zeros(probs.size + 1)
    pmf[0] = 1.0
    for i, p in enumerate(probs):
        pmf[1 : i + 2] = pmf[1 : i + 2] * (1.0 - p) + pmf[: i + 1] * p
        pmf[0] *= 1.0 - p
    return pmf


def test_poisson_binomial_blocks_keep_the_relative_accuracy_of_the_plain_recursion_in_the_tails():
    # Deterministic. The blocked recursion and its direct convolutions add non-negative terms only,
    # so even entries near 1e-250 agree with the one-at-a-time recursion to rounding (observed
    # ~1e-14 relative; 1e-10 leaves room for other BLAS builds), at sizes that are not multiples
    # of the block and with probabilities 0 and 1 among them.
    rng = np.random.default_rng(7)
    for size in (1, ind.RECURSION_BLOCK - 1, ind.RECURSION_BLOCK + 3, 1000, ind.DIRECT_MAX):
        probs = rng.beta(4, 1, size)
        probs[:: max(size // 3, 1)] = [0.0, 1.0, 0.5, 0.25][: len(probs[:: max(size // 3, 1)])]
        fast, plain = ind.poisson_binomial_pmf(probs), _plain_recursion(probs)
        tiny = plain > 1e-290
        assert fast[~tiny].max(initial=0.0) <= 1e-280
        assert fast[tiny] == pytest.approx(plain[tiny], rel=1e-10), size


# ---------------------------------------------------------------- equal rate


def test_equal_rate_size_under_independence():
    # 2,000 replicates of 100 pairs, each pair with its own random 8-token laws p_a != p_b.
    rng = np.random.default_rng(3)
    p_a = rng.dirichlet(np.full(8, 0.5), size=(SIZE_REPS, 100))
    p_b = rng.dirichlet(np.full(8, 0.5), size=(SIZE_REPS, 100))
    t_a = (p_a.cumsum(axis=2) < rng.random((SIZE_REPS, 100, 1))).sum(axis=2).clip(max=7)
    t_b = (p_b.cumsum(axis=2) < rng.random((SIZE_REPS, 100, 1))).sum(axis=2).clip(max=7)
    _assert_size([ind.equal_rate(t_a[i], t_b[i], p_a[i], p_b[i]).p_value for i in range(SIZE_REPS)])


def test_equal_rate_sees_antithetic_and_shared_streams():
    # First committed token of 1,000 request pairs per replicate, 10 replicates per bug. Pilot runs:
    # antithetic streams give ratio ~0.55 (p < 1e-6), shared ones ratio ~5 (p ~ 0): one miss of 10
    # at LEVEL has probability < 1e-4.
    for bugs, alternative in ((Bugs(antithetic=True), "less"), (Bugs(shared_stream=True), "greater")):
        for rep in range(10):
            run, starts = _paired_run(1000, 1, rep, bugs)
            laws = CHAIN.target[starts[0::2]]
            result = ind.equal_rate(run.tokens[0::2, 0], run.tokens[1::2, 0], laws, laws, alternative)
            assert result.p_value <= LEVEL, (bugs, result)


def test_equal_rate_mde_is_exact():
    # The MDE r is solved from the exact laws, so a simulated count at pi (1 - r) rejects at rate
    # 0.8: over 4,000 replicates the rate lies in 0.8 +- 4 sd (sd 0.0063), failing w.p. < 1e-4.
    pi = ind.match_probabilities(CHAIN.target, CHAIN.target)[np.random.default_rng(5).integers(0, 32, 1000)]
    r = sp.equal_rate_mde(pi, [LEVEL], alternative="less")
    assert 0.05 < r < 0.5
    counts = (np.random.default_rng(6).random((4000, pi.size)) < pi * (1 - r)).sum(axis=1)
    pvalues = ind.all_pvalues(ind.poisson_binomial_pmf(pi), "less")
    assert abs((pvalues[counts] <= LEVEL).mean() - 0.8) < 4 * np.sqrt(0.8 * 0.2 / 4000)
    assert sp.equal_rate_mde(pi, [LEVEL], alternative="greater") > 0


# ---------------------------------------------------------------- PIT association


def test_pit_association_size_on_uniforms_and_end_to_end():
    u = np.random.default_rng(7).random((SIZE_REPS, 2, 100))
    _assert_size(
        [ind.pit_association(x[0], x[1], level=ALPHA, rng=np.random.default_rng(i)).p_value for i, x in enumerate(u)]
    )
    # End to end: 2,000 batches of 10 correct request pairs x 8 tokens, every position paired.
    run, _ = _paired_run(10 * SIZE_REPS, 8, 8)
    u_a, u_b = (x.reshape(SIZE_REPS, -1) for x in _paired_pits(run, 9, "index"))
    _assert_size(
        [
            ind.pit_association(a, b, level=ALPHA, rng=np.random.default_rng(i)).p_value
            for i, (a, b) in enumerate(zip(u_a, u_b))
        ]
    )


def test_pit_association_sees_antithetic_streams():
    # Index-order PITs of the first tokens of 200 request pairs (the sampler inverts CDFs in id
    # order). Pilot: rho ~ -0.45, p at the Monte Carlo floor in every replicate; 10 / 10 must reject
    # (one miss has probability < 1e-3).
    for rep in range(10):
        run, _ = _paired_run(200, 1, 100 + rep, Bugs(antithetic=True))
        u_a, u_b = _paired_pits(run, rep, "index")
        result = ind.pit_association(u_a[:, 0], u_b[:, 0], level=LEVEL, rng=np.random.default_rng(rep))
        assert result.p_value <= LEVEL and result.rho < 0, result


def test_pit_association_stops_at_rho_when_it_rejects_early():
    # Under the early rule an early-rejected |rho| decides the criterion: Bonferroni's 2 min(p) <= 2
    # p_rho, so p_chi2 is taken as 1 (a larger p-value than a valid one is valid) and its null is
    # never drawn. Antithetic PITs (u, 1 - u): rho = -1, deterministic.
    u = np.random.default_rng(3).random(400)
    early = ind.pit_association(u, 1 - u, level=LEVEL, rng=np.random.default_rng(0), rule=EARLY_REJECTION)
    assert early.mc_chi2 is None and early.chi2_p_value == 1.0 and early.p_value == 2 * early.rho_p_value <= LEVEL
    full = ind.pit_association(u, 1 - u, level=LEVEL, rng=np.random.default_rng(0))
    assert full.mc_chi2 is not None and full.p_value <= LEVEL


def test_pit_association_rho_mde_on_a_gaussian_copula():
    # A Gaussian copula with Spearman rho = the printed MDE (n = 400, level 0.05): rejection rate
    # over 200 replicates >= 0.7 (sd 0.028 at 0.8: fails w.p. < 3e-4, plus the normal
    # approximation of rho_hat, whose variance is 1 / n at rho = 0).
    n, level = 400, 0.05
    rho = sp.association_rho_mde(n, [level])
    assert 0.1 < rho < 0.25
    corr = 2 * np.sin(np.pi * rho / 6)  # Pearson correlation of the normal pair with that Spearman rho
    z = np.random.default_rng(11).standard_normal((200, 2, n))
    u_a = stats.norm.cdf(z[:, 0])
    u_b = stats.norm.cdf(corr * z[:, 0] + np.sqrt(1 - corr**2) * z[:, 1])
    rate = np.mean(
        [
            ind.pit_association(a, b, level=level, rng=np.random.default_rng(i)).p_value <= level
            for i, (a, b) in enumerate(zip(u_a, u_b))
        ]
    )
    assert rate >= 0.7, rate
    assert sp.association_tv_mde(n, [level]) < 1


# ---------------------------------------------------------------- identical sequences


def _masses(run, rows) -> np.ndarray:
    _, mass = sq.pit_parts(run.reference(TINY), run.tokens.reshape(-1))
    return mass.reshape(run.tokens.shape)[rows]


TINY = make_chain(vocab=4, seed=2)


def test_identical_sequences_size_with_frequent_coincidences():
    # A 4-token chain, sequences of 3 tokens: ~10% of independent pairs coincide by chance. 2,000
    # replicates of 50 pairs (one batch of 100 requests each).
    starts = np.repeat(np.random.default_rng(12).integers(0, 4, 50 * SIZE_REPS), 2)
    run = sample(TINY, 100 * SIZE_REPS, 3, np.random.default_rng(13), starts=starts)
    masses = _masses(run, slice(0, None, 2))
    match = np.exp(np.log(masses).sum(axis=1))
    assert [ind.sequence_match_probability(m) for m in masses[:5]] == pytest.approx(match[:5], rel=1e-12)
    p_values = []
    for rep in range(SIZE_REPS):
        pairs = slice(50 * rep, 50 * rep + 50)
        p_values.append(ind.identical_sequences(run.tokens[0::2][pairs], run.tokens[1::2][pairs], match[pairs]).p_value)
    _assert_size(p_values)
    assert 0.05 < match.mean() < 0.3


def test_identical_sequences_detects_shared_streams_at_the_printed_mde():
    # 24-token sequences of CHAIN: chance coincidences have probability ~1e-15. Pairs that share a
    # stream with probability f = the printed MDE (level 0.01): the rejection rate over 4,000
    # replicates must be >= 0.8 - 4 sd (fails w.p. < 1e-4).
    run, _ = _paired_run(200, 24, 14)
    _, mass = sq.pit_parts(run.reference(CHAIN), run.tokens.reshape(-1))
    match = np.array([ind.sequence_match_probability(m) for m in mass.reshape(run.tokens.shape)[0::2]])
    clean = ind.identical_sequences(run.tokens[0::2], run.tokens[1::2], match)
    assert clean.count == 0 and clean.p_value == 1.0 and clean.expected < 1e-6
    f = sp.identical_pairs_mde(match, [LEVEL])
    assert 0 < f < 0.05
    shared = np.random.default_rng(15).random((4000, match.size)) < f
    pvalues = ind.all_pvalues(ind.poisson_binomial_pmf(match), "greater")
    assert (pvalues[shared.sum(axis=1)] <= LEVEL).mean() >= 0.8 - 4 * np.sqrt(0.16 / 4000)
    copied = run.tokens[1::2].copy()
    copied[:3] = run.tokens[0::2][:3]
    result = ind.identical_sequences(run.tokens[0::2], copied, match)
    assert result.count == 3 and result.identical_pairs == [0, 1, 2] and result.p_value < 1e-20
    with pytest.raises(ValueError, match="match_probs"):
        ind.identical_sequences(run.tokens[0::2], copied, match[:-1])
