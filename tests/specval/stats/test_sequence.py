"""Whole-sequence statistics: randomized PITs, their uniformity and serial dependence, and the MDEs.

Statistical tests use fixed seeds; each assertion states its false-fail rate. Size checks: the
rejection count of R >= 2,000 replicates at alpha = 0.05 must have a Clopper-Pearson 99.9% interval
that contains alpha or lies below it (fails w.p. <= 0.0005 when the true size is <= alpha).
Power checks use `tests.fixtures.spec_chain` (an exact K = 3 speculative sampler with planted bugs).
"""

from __future__ import annotations

import numpy as np
import pytest
from statsmodels.stats.proportion import proportion_confint

from specval.stats import sequence as sq
from specval.stats import sequence_power as sp
from specval.stats.montecarlo import criterion_rng
from tests.fixtures.spec_chain import Bugs, make_chain, sample, sample_plain, wrong_rows

ALPHA = 0.05
SIZE_REPS = 2000
SIZE_CI = 0.001  # two-sided 99.9% Clopper-Pearson: the lower end exceeds a true size <= alpha w.p. <= 0.0005
LEVEL = 0.01  # the power tests decide at this level (a Holm first step of a small family)
K = 3
CHAIN = make_chain(vocab=32, seed=1)


def _pits(run, chain, seed: int, order: str = "rank") -> np.ndarray:
    lower, mass = sq.pit_parts(run.reference(chain), run.tokens.reshape(-1), order=order)
    return sq.randomized_pit(lower, mass, np.random.default_rng(seed)).reshape(run.tokens.shape)


def _assert_size(p_values) -> None:
    rejections = int((np.asarray(p_values) <= ALPHA).sum())
    low, _ = proportion_confint(rejections, len(p_values), alpha=SIZE_CI, method="beta")
    assert low <= ALPHA, f"{rejections} / {len(p_values)} rejections at {ALPHA}"


# ---------------------------------------------------------------- PIT parts


def test_pit_parts_rank_order_is_descending_probability_then_token_id():
    probs = np.array([[0.1, 0.4, 0.1, 0.4]])
    # rank order: token 1 (0.4), token 3 (0.4, larger id), token 0 (0.1), token 2 (0.1)
    lowers = [sq.pit_parts(probs, np.array([t]))[0][0] for t in range(4)]
    assert lowers == pytest.approx([0.8, 0.0, 0.9, 0.4])
    lower, mass = sq.pit_parts(probs * 3, np.array([2]), order="index")  # rows are normalised
    assert lower[0] == pytest.approx(0.5) and mass[0] == pytest.approx(0.1)


def test_pit_parts_and_pit_refuse_bad_input_by_name():
    with pytest.raises(ValueError, match="order"):
        sq.pit_parts(np.ones((1, 3)), np.array([0]), order="sorted")
    with pytest.raises(ValueError, match="tokens"):
        sq.pit_parts(np.ones((1, 3)), np.array([3]))
    with pytest.raises(ValueError, match="probs"):
        sq.pit_parts(np.ones(3), np.array([0]))
    with pytest.raises(ValueError, match="lower"):
        sq.randomized_pit(np.array([0.9]), np.array([0.5]), np.random.default_rng(0))


def test_randomized_pit_is_uniform_and_redrawn_by_its_stream():
    # One discrete law, 20,000 tokens: the U must be U(0, 1). KS at n = 20,000 fails a uniform
    # sample w.p. 1e-3 at the 0.001 critical value 1.95 / sqrt(n) = 0.0138.
    probs = np.tile([0.5, 0.3, 0.15, 0.05], (20_000, 1))
    tokens = np.random.default_rng(0).choice(4, size=20_000, p=probs[0])
    lower, mass = sq.pit_parts(probs, tokens)
    u = sq.randomized_pit(lower, mass, criterion_rng("proto", "pit", "0-100"))
    assert np.array_equal(u, sq.randomized_pit(lower, mass, criterion_rng("proto", "pit", "0-100")))
    assert np.abs(np.sort(u) - (np.arange(u.size) + 0.5) / u.size).max() < 0.0138


# ---------------------------------------------------------------- size


def test_uniformity_size_on_iid_uniforms_with_buckets():
    u = np.random.default_rng(1).random((SIZE_REPS, 200))
    buckets = np.arange(200) % 4
    _assert_size(
        [sq.pit_uniformity(x, buckets, level=ALPHA, rng=np.random.default_rng(i)).p_value for i, x in enumerate(u)]
    )


def test_size_end_to_end_on_a_sampled_markov_chain():
    # 2,000 replicates of 10 sequences x 16 tokens drawn token by token from a 16-token chain.
    chain, seqs, length = make_chain(vocab=16, seed=3), 10, 16
    u = _pits(sample_plain(chain, SIZE_REPS * seqs, length, np.random.default_rng(2)), chain, 3)
    u = u.reshape(SIZE_REPS, seqs, length)
    _assert_size(
        [sq.pit_uniformity(x.reshape(-1), level=ALPHA, rng=np.random.default_rng(i)).p_value for i, x in enumerate(u)]
    )
    _assert_size(
        [
            sq.serial_dependence(list(x), K + 1, level=ALPHA, rng=np.random.default_rng(i)).p_value
            for i, x in enumerate(u)
        ]
    )


def test_correct_speculative_sampler_passes_at_its_rate():
    # 2,000 replicates of 10 sequences x 16 committed tokens of the correct K = 3 sampler, PITs
    # bucketed by round position (the sampler's own predictable labels).
    seqs, length = 10, 16
    run = sample(CHAIN, SIZE_REPS * seqs, length, np.random.default_rng(4), k=K)
    u = _pits(run, CHAIN, 5).reshape(SIZE_REPS, seqs * length)
    position = run.position.reshape(SIZE_REPS, seqs * length)
    _assert_size(
        [
            sq.pit_uniformity(x, j, level=ALPHA, rng=np.random.default_rng(i)).p_value
            for i, (x, j) in enumerate(zip(u, position))
        ]
    )


# ---------------------------------------------------------------- power on planted bugs


def _reject_all(reps: int, num_sequences: int, bugs: Bugs, test) -> list[float]:
    p_values = []
    for rep in range(reps):
        run = sample(CHAIN, num_sequences, 24, np.random.default_rng(100 + rep), k=K, bugs=bugs)
        p_values.append(test(run, rep))
    return p_values


def _by_position(run, rep: int) -> float:
    u = _pits(run, CHAIN, rep).reshape(-1)
    return sq.pit_uniformity(u, run.position.reshape(-1), level=LEVEL, rng=np.random.default_rng(rep)).p_value


def _serial(run, rep: int) -> float:
    return sq.serial_dependence(
        list(_pits(run, CHAIN, rep)), K + 1, level=LEVEL, rng=np.random.default_rng(rep)
    ).p_value


def _by_round_shape(run, rep: int) -> float:
    # index order, first tokens of a round bucketed by the previous round's length (predictable):
    # a round that accepted draft 1 handed the next round a draft uniform below p / q.
    u = _pits(run, CHAIN, rep, order="index").reshape(-1)
    labels = np.where(run.position == 1, 10 + run.previous_length, run.position).reshape(-1)
    return sq.pit_uniformity(u, labels, level=LEVEL, rng=np.random.default_rng(rep)).p_value


# Each planted bug at a stated size: 10 replicates, all rejected at LEVEL. Pilot runs (40 replicates
# per bug) put every p-value at the Monte Carlo floor 1 / (B + 1) (the exact p-values are far below
# LEVEL / 2, where `decision_power` is 0.9996), so one miss among 10 has probability < 1e-2 even at
# power 0.999; the lower end of the one-sided 95% Clopper-Pearson interval of 40 / 40 is 0.93 >= 0.8.
# Against the printed MDE (`pit_uniformity_mde`, 6,000 tokens, level 0.01, power 0.8): the bugs'
# n-weighted mean binned PIT TV, measured on 960,000 tokens, is 0.087 (wrong row, MDE 0.040), 0.040
# (wrong bonus, MDE 0.040) and 0.050 (reuse, index order, 8 round-shape buckets, MDE 0.046). They
# are rejected far more often than 0.8 because the deviation sits in one or two buckets: the MDE
# bounds the least favourable spread (equal TV in every bucket), and concentration only adds power.
@pytest.mark.parametrize(
    "bugs, num_sequences, test",
    [
        (Bugs(wrong_row_from=3, wrong_mix=0.5), 250, _by_position),
        (Bugs(wrong_bonus=True, wrong_mix=0.5), 250, _by_position),
        (Bugs(freeze_after=4), 40, _serial),
        (Bugs(reuse_accept=True), 250, _by_round_shape),
    ],
    ids=["wrong_row_from_3", "wrong_bonus", "freeze_after_4", "reuse_accept"],
)
def test_planted_bugs_are_rejected(bugs, num_sequences, test):
    p_values = _reject_all(10, num_sequences, bugs, test)
    assert max(p_values) <= LEVEL, p_values


# ---------------------------------------------------------------- MDE


def test_pit_uniformity_mde_is_met_by_the_least_favourable_deviation():
    # U's binned law with |p1 - p0| / p0 constant at TV = the printed MDE (n = 2,000, 10 bins,
    # level 0.05): the rejection rate over 300 replicates must reach 0.8 up to the Monte Carlo error
    # (sd 0.023; the bound 0.72 fails w.p. < 1e-3 at true power 0.8; the noncentral chi-square
    # approximation is accurate at 200 expected per bin).
    n, bins, level = 2000, 10, 0.05
    tv = sp.pit_uniformity_mde(n, [level], num_bins=bins)
    assert 0.02 < tv < 0.2
    law = np.full(bins, 1 / bins) * (1 + 2 * tv * np.tile([1, -1], bins // 2))
    rng = np.random.default_rng(9)
    bin_of = rng.choice(bins, size=(300, n), p=law)
    u = (bin_of + rng.random((300, n))) / bins
    rate = np.mean(
        [sq.pit_uniformity(x, level=level, rng=np.random.default_rng(i)).p_value <= level for i, x in enumerate(u)]
    )
    assert rate >= 0.72, rate
    assert sp.pit_uniformity_mde(4 * n, [level], num_bins=bins) == pytest.approx(tv / 2, rel=0.05)


def test_token_tv_maps_to_a_smaller_pit_tv_for_a_wrong_row():
    # The bug "wrong target row" (mix 0.5 with the next state's row) on CHAIN: per state, the exact
    # binned (10 bins, rank order) PIT law under the wrong row against uniform. Data processing:
    # PIT TV <= token TV for every state. Measured on this chain (deterministic, no sampling): mean
    # token TV 0.362, mean PIT TV 0.313, ratio 0.86 (0.63-0.95 per state): for this bug class a
    # token TV d moves the binned PIT law by about 0.86 d, so the PIT MDE is met at a token TV of
    # about MDE / 0.86; no ratio holds in general (the bound is one-sided).
    bins = 10
    p, wrong = CHAIN.target, wrong_rows(CHAIN, 0.5)
    token_tv = 0.5 * np.abs(wrong - p).sum(axis=1)
    lower, mass = sq.pit_parts(np.repeat(p, p.shape[1], axis=0), np.tile(np.arange(p.shape[1]), p.shape[0]))
    lower, mass = lower.reshape(p.shape), mass.reshape(p.shape)
    edges = np.arange(bins + 1) / bins
    overlap = np.clip(
        np.minimum(lower[..., None] + mass[..., None], edges[1:]) - np.maximum(lower[..., None], edges[:-1]), 0, None
    )  # [state, token, bin]
    binned = (wrong[..., None] * overlap / mass[..., None]).sum(axis=1)
    pit_tv = 0.5 * np.abs(binned - 1 / bins).sum(axis=1)
    assert np.all(pit_tv <= token_tv + 1e-12)
    ratio = pit_tv.mean() / token_tv.mean()
    assert 0.8 < ratio < 0.9, (token_tv.mean(), pit_tv.mean(), ratio)


def test_serial_dependence_mde_and_validation():
    mde = sp.serial_dependence_mde(5000, [0.01], max_lag=4)
    assert 0 < mde < sp.serial_dependence_mde(1000, [0.01], max_lag=4) < 1
    assert sp.serial_dependence_mde(5000, [0.01], max_lag=1) < mde  # fewer lags, fewer noise df
    with pytest.raises(ValueError, match="max_lag"):
        sq.serial_dependence([np.zeros(3)], 0, level=0.05, rng=np.random.default_rng(0))
    empty = sq.serial_dependence([np.zeros(1)], 2, level=0.05, rng=np.random.default_rng(0))
    assert empty.is_degenerate and empty.p_value == 1.0
    assert sq.pit_uniformity(np.zeros(0), level=0.05, rng=np.random.default_rng(0)).is_degenerate


def test_serial_dependence_sees_a_diagonal_lag():
    # PITs that repeat every 4 tokens (frozen offsets, one token per round): lag 4 carries the whole
    # statistic. A deterministic dependence: p at the Monte Carlo floor (fails w.p. ~0).
    base = np.random.default_rng(0).random((50, 4))
    u = list(np.tile(base, 5))
    result = sq.serial_dependence(u, 4, level=0.01, rng=np.random.default_rng(1))
    assert result.p_value <= 0.01 and np.argmax(result.lag_statistics) == 3
    assert result.lag_pairs == [50 * 19, 50 * 18, 50 * 17, 50 * 16]
    assert result.to_dict()["mc"]["draws"] == result.mc.draws


def test_serial_dependence_mde_is_met_by_the_least_favourable_lag_law():
    # Bins of U follow a Markov chain on 4 bins with T = (1 + 2 d (-1)^(a + b)) / 4: uniform margins,
    # pair-bin TV from independence exactly d (|p1 - p0| / p0 constant: Cauchy-Schwarz is tight),
    # d = the printed MDE for 50 sequences x 20 tokens, max_lag 1, level 0.1. Measured rate 0.89
    # (the MDE is computed at level / 2 for the Monte Carlo resolution, so it is conservative);
    # the bound 0.72 over 120 replicates fails w.p. 1.4% at a true power of exactly 0.8, < 1e-6
    # at 0.89.
    bins, seqs, length, level, reps = 4, 50, 20, 0.1, 120
    d = sp.serial_dependence_mde(seqs * (length - 1), [level], max_lag=1, num_bins=bins)
    cdf = ((1 + 2 * d * (-1.0) ** np.add.outer(np.arange(bins), np.arange(bins))) / bins).cumsum(axis=1)
    rng, rejections = np.random.default_rng(21), 0
    for rep in range(reps):
        state = np.zeros((seqs, length), dtype=np.int64)
        state[:, 0] = rng.integers(0, bins, seqs)
        for i in range(1, length):
            state[:, i] = (cdf[state[:, i - 1]] < rng.random((seqs, 1))).sum(axis=1)
        u = (state + rng.random((seqs, length))) / bins
        result = sq.serial_dependence(list(u), 1, num_bins=bins, level=level, rng=np.random.default_rng(rep))
        rejections += result.p_value <= level
    assert rejections / reps >= 0.72, rejections


# ---------------------------------------------------------------- pair tables on bit planes


def test_pair_tables_on_bit_planes_are_the_bincount_tables():
    # Random bins (fixed seed), ragged sequences, lags below and past a 64-bit word, and a row
    # width that is not a multiple of 64: every cell must equal the gathered bincount's.
    data = np.random.default_rng(5)
    bins = data.integers(0, 5, size=(3, 1000))
    lengths = np.array([1, 64, 130, 5, 300, 500])
    starts = sq._lag_starts(lengths, 70)
    tables = sq.lag_tables(bins, starts, 5)
    for lag, first in enumerate(starts, start=1):
        assert np.array_equal(tables[:, lag - 1], sq.pair_tables(bins[:, first], bins[:, first + lag], 5))
    other = data.integers(0, 5, size=(3, 1000))
    assert np.array_equal(sq.pair_counts(bins, other, 5), sq.pair_tables(bins, other, 5))
    words = data.integers(0, 2**63, size=100, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    by_table = sq._BYTE_POPCOUNT[words.view(np.uint8)].reshape(100, 8).sum(axis=1)
    assert np.array_equal(sq.popcount(words).astype(np.int64), by_table)


# ---------------------------------------------------------------- max-type buckets (one bug, one bucket)

BUCKET_K, BUCKET_LENGTH, BUCKET_QUARTERS = 3, 64, 4
BUCKET_ACCEPT = 0.8  # a draft is accepted iff its PIT is below this: labels depend on earlier PITs


def _predictable_buckets(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(position, bucket) int64[S, L] of a K = 3 round model driven by the PITs themselves: a token
    at position j <= K is an accepted draft (the round goes on) iff U < BUCKET_ACCEPT, the bonus
    (j = K + 1) closes the round. Every label depends on earlier PITs only (predictable), and the
    bucket SIZES depend on them, the case the realised-size conditioning has to survive."""
    position = np.ones(u.shape, dtype=np.int64)
    for i in range(1, u.shape[1]):
        going_on = (u[:, i - 1] < BUCKET_ACCEPT) & (position[:, i - 1] <= BUCKET_K)
        position[:, i] = np.where(going_on, position[:, i - 1] + 1, 1)
    quarter = (np.arange(u.shape[1]) * BUCKET_QUARTERS // u.shape[1])[None, :]
    return position, position * BUCKET_QUARTERS + quarter


def test_max_combine_is_the_largest_bucket_x2_and_sum_is_unchanged():
    rng = np.random.default_rng(4)
    u, labels = rng.random(3000), rng.integers(0, 6, 3000)
    summed = sq.pit_uniformity(u, labels, level=0.01, rng=np.random.default_rng(1))
    largest = sq.pit_uniformity(u, labels, level=0.01, rng=np.random.default_rng(1), combine="max")
    assert largest.statistic == max(largest.bucket_statistics) and largest.df == 9
    assert summed.statistic == pytest.approx(sum(summed.bucket_statistics), rel=1e-12) and summed.df == 54
    assert largest.bucket_statistics == summed.bucket_statistics and largest.combine == "max"
    with pytest.raises(ValueError, match="combine"):
        sq.pit_uniformity(u, labels, level=0.01, rng=np.random.default_rng(1), combine="mean")


def test_bucket_mde_is_met_by_a_bug_in_one_bucket_and_the_family_keeps_its_size():
    # The pit criteria of one group as the sequence kind runs them (pit_pooled: sum over one bucket;
    # pit_position: max over (round position, quarter); the early-rejection rule), Holm over the 3
    # at ALPHA, on a faithful cheaper model: 100 sequences of 64 PITs whose round positions are
    # driven by the PITs (predictable labels, realised bucket sizes that depend on earlier PITs).
    # Size: 2,000 null replicates; the family's false-FAIL rate must pass `_assert_size` (fails
    # w.p. <= 0.0005 when the true rate is <= ALPHA). Power: the same model with the bonus tokens
    # of the last quarter (~280 of 6,400) following a binned law at TV = the printed bucket MDE
    # (least favourable pattern, every bin off by the same relative amount); 2,000 replicates must
    # reject at a rate >= 0.77 (true power 0.8: sd 0.009, so 0.77 fails w.p. < 0.001; the MDE is
    # conservative, Bonferroni over buckets, so a correct MDE passes by a margin).
    from specval.stats import montecarlo

    rule, level, bins, reps = montecarlo.EARLY_REJECTION, ALPHA / 3, 10, SIZE_REPS
    rng = np.random.default_rng(2026)

    def family_p(u: np.ndarray, seed: int) -> tuple[float, float]:
        _, bucket = _predictable_buckets(u)
        gens = [np.random.default_rng([seed, i]) for i in range(2)]
        pooled = sq.pit_uniformity(u.reshape(-1), level=level, rng=gens[0], rule=rule).p_value
        by_bucket = sq.pit_uniformity(
            u.reshape(-1), bucket.reshape(-1), level=level, rng=gens[1], combine="max", rule=rule
        ).p_value
        return pooled, by_bucket

    null = [family_p(rng.random((100, BUCKET_LENGTH)), rep) for rep in range(reps)]
    _assert_size([min(1.0, 3 * min(p)) for p in null])  # Holm's first step decides a false FAIL

    u0 = rng.random((100, BUCKET_LENGTH))
    position, bucket = _predictable_buckets(u0)
    target = (BUCKET_K + 1) * BUCKET_QUARTERS + BUCKET_QUARTERS - 1  # the bonus, last quarter
    num_buckets = np.unique(bucket).size
    n_bonus = int((bucket == target).sum())
    tv = sp.bucket_mde(n_bonus, [montecarlo.decision_level(level, rule)], num_buckets=num_buckets)
    assert 0.05 < tv < 0.5 and 200 < n_bonus < 400, (tv, n_bonus)
    law = np.full(bins, 1 / bins) * (1 + 2 * tv * np.tile([1, -1], bins // 2))
    hits = 0
    for rep in range(reps):
        u = rng.random((100, BUCKET_LENGTH))
        _, bucket = _predictable_buckets(u)
        bad = bucket == target
        u[bad] = (rng.choice(bins, size=int(bad.sum()), p=law) + rng.random(int(bad.sum()))) / bins
        hits += family_p(u, 10_000 + rep)[1] <= level
    assert hits / reps >= 0.77, hits / reps
