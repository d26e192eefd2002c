"""Stream version 3's variates (specval/stats/variates.py): the portable log and log-factorials
against exact references with tolerances from the arithmetic, the ratio-of-uniforms hat, the
binomial and hypergeometric laws, the tables' joint laws, the words each draw consumes against a
scalar reference written from the specification, golden values, and the exact size of the
stratified tests' nulls drawn with them.

Deterministic (fixed keys) except where a law is checked; those state their false-fail rates.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from scipy import stats

from specval.stats import montecarlo, variates
from specval.stats.strata import stratified_gof, stratified_homogeneity
from specval.stats.stream import Stream

KEY = 0x0123456789ABCDEF_FEDCBA9876543210
EPS = 2.0**-52  # one ulp of 1.0
LAW_LEVEL = 1e-4  # each law check rejects a correct sampler with probability <= this (fixed keys)


def _ulps(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    return np.abs(got - want) / np.spacing(np.abs(want))


# ---------------------------------------------------------------- the portable functions


def test_log_is_within_five_ulp_of_the_true_log():
    # Error analysis: frexp and m - 1 are exact (Sterbenz), m + 1 and the division round once
    # each (s within 1.5 ulp), the series and Horner add ~1 ulp (z <= 0.0295 damps s**2's error),
    # the products by e and the two sums round three times, without cancellation (|log m| <=
    # 0.347 < ln 2 <= |e ln 2|): <= 4 ulp; math.log (the reference) is within 1 ulp.
    rng = np.random.default_rng(11)
    x = np.concatenate(
        [
            np.exp(rng.uniform(-700, 700, 100_000)),
            rng.uniform(0.5, 2.0, 100_000),
            1.0 + rng.uniform(-1e-6, 1e-6, 1_000),
            np.ldexp(1.0, np.arange(-1000, 1000)),
            np.array([variates.SQRT_HALF, np.nextafter(variates.SQRT_HALF, 0), 2.0**-53]),
        ]
    )
    x = x[x != 1.0]
    want = np.array([math.log(v) for v in x])
    assert _ulps(variates.log(x), want).max() <= 5
    assert variates.log(np.array([1.0]))[0] == 0.0


def test_log1p_is_within_seven_ulp():
    # The series branch (|t| < 1/4) as log's (+1 rounding of 2 + t); the other branch adds the
    # rounding of 1 + t, at most 0.5 ulp(1 + t) / |log1p(t)| <= 1.5 ulp of the result there;
    # plus log's 4 and the reference's 1.
    rng = np.random.default_rng(12)
    t = np.concatenate(
        [
            rng.uniform(-0.99, 5.0, 100_000),
            rng.uniform(-1e-3, 1e-3, 50_000),
            np.array([0.25, -0.25, np.nextafter(0.25, 0), 1e-300]),
        ]
    )
    want = np.array([math.log1p(v) for v in t])
    assert _ulps(variates.log1p(t), want).max() <= 7


def _exact_step(a: int, d: int) -> float:
    """log((a + d)!) - log(a!) as one correctly rounded sum of the logs (math.fsum)."""
    if d >= 0:
        return math.fsum(math.log(i) for i in range(a + 1, a + d + 1))
    return -math.fsum(math.log(i) for i in range(a + d + 1, a + 1))


def test_log_factorial_step_is_accurate_where_the_big_terms_cancel():
    # Tolerance: near the table (either argument < STIRLING_FROM) the difference of two values
    # each within ~k ulp of log k! (table: k sums of ~4-ulp logs; Stirling: ~8 ulp of (k + 1/2)
    # log k); elsewhere a few ulp of |d| (1 + log(a + d)), the largest term (docstring). The bound
    # below is 16 ulp of those magnitudes; the reference is within ~|d| ulp of log(a + d).
    rng = np.random.default_rng(13)
    a = np.concatenate(
        [rng.integers(0, 300, 1_500), rng.integers(0, 2**40, 1_500), (10 ** rng.uniform(2, 9, 1_500)).astype(np.int64)]
    )
    d = np.maximum(rng.integers(-3_000, 3_000, a.size), -a)
    got = variates.log_factorial_step(a, d)
    want = np.array([_exact_step(int(x), int(y)) for x, y in zip(a, d)])
    top = np.maximum(a, a + d).astype(np.float64)
    near = np.minimum(a, a + d) < variates.STIRLING_FROM
    magnitude = np.abs(d) * (1.0 + np.log(top + 1.0)) + np.where(near, top * (1.0 + np.log(top + 1.0)), 0.0)
    assert (np.abs(got - want) <= 16 * EPS * magnitude + 1e-300).all()
    assert (variates.log_factorial_step(a, np.zeros_like(a)) == 0.0).all()


def test_log_factorial_matches_lgamma():
    # Table entries k < 256: k in-order sums of logs within 4 ulp each, so within k ulp of the
    # running sum; Stirling: ~8 ulp of (k + 1/2) log k; lgamma within a few ulp.
    k = np.arange(0, 20_000)
    want = np.array([math.lgamma(v + 1.0) for v in k])
    scale = np.where(k < variates.STIRLING_FROM, k + 1.0, 16.0) * (k + 0.5) * np.log(k + 2.0)
    assert (np.abs(variates.log_factorial(k) - want) <= EPS * scale + 1e-15).all()


# ---------------------------------------------------------------- ratio of uniforms: the hat


def _hat_reach(logpmf, low: int, high: int, mean: float, var: float, mode: int) -> float:
    """max over x of |x - a| sqrt(f(floor x) / f(m)), divided by h / 2: <= 1 iff the acceptance
    region lies in the unit square (then the draws follow f exactly)."""
    a, h = mean + 0.5, variates.D1 * math.sqrt(var + 0.5) + variates.D2
    k = np.arange(low, high + 1)
    root = np.sqrt(np.exp(logpmf(k) - logpmf(np.array([mode]))))
    return float((np.maximum(np.abs(k - a), np.abs(k + 1 - a)) * root).max() / (h / 2))


def test_the_hat_covers_every_binomial():
    reach = 0.0
    for n in (1, 2, 3, 5, 10, 50, 192, 1000, 10**5):
        for p in (1e-6, 1e-3, 0.0052, 0.05, 0.2, 0.37, 0.5):
            q = 1 - p
            logpmf = functools.partial(stats.binom.logpmf, n=n, p=p)
            mode = min(int(math.floor((n + 1) * p)), n)
            reach = max(reach, _hat_reach(logpmf, 0, min(n, 2_000), n * p, n * p * q, mode))
    for lam in np.linspace(0.9, 1.1, 81):  # the tightest shape: Poisson(1) (reach 0.9999996)
        n = 10**9
        p = lam / n
        logpmf = functools.partial(stats.binom.logpmf, n=n, p=p)
        reach = max(reach, _hat_reach(logpmf, 0, 60, n * p, n * p * (1 - p), int(math.floor((n + 1) * p))))
    assert 0.99 < reach <= 1.0


def test_the_hat_covers_every_hypergeometric():
    reach = 0.0
    for total in (2, 3, 5, 10, 30, 100, 1000, 20_000):
        for share in (0.01, 0.1, 0.3, 0.5):
            good = max(1, int(total * share))
            bad = total - good
            for sample in sorted({1, 2, 3, total // 10, total // 3, total // 2, total - 1}):
                low, high = max(0, sample - bad), min(sample, good)
                if not 1 <= sample <= total or high <= low:
                    continue
                mean = sample * good / total
                var = mean * (bad / total) * ((total - sample) / (total - 1))
                mode = min(max(int(math.floor((sample + 1) * (good + 1) / (total + 2))), low), high)
                logpmf = functools.partial(stats.hypergeom.logpmf, M=total, n=good, N=sample)
                reach = max(reach, _hat_reach(logpmf, low, high, mean, var, mode))
    assert 0.9 < reach <= 1.0


# ---------------------------------------------------------------- the laws


def _law_p_value(draws: np.ndarray, pmf) -> float:
    """Chi-square p-value of the draws against pmf over the values of expected count >= 5 (the
    rest pooled into one cell)."""
    values, counts = np.unique(draws, return_counts=True)
    support = np.arange(values.min() - 50, values.max() + 50)
    expected = pmf(support) * draws.size
    seen = np.zeros(support.size)
    seen[np.searchsorted(support, values)] = counts
    big = expected >= 5
    observed = np.r_[seen[big], seen[~big].sum()]
    mean = np.r_[expected[big], draws.size - expected[big].sum()]
    if mean[-1] < 5:
        observed, mean = np.r_[observed[:-2], observed[-2:].sum()], np.r_[mean[:-2], mean[-2:].sum()]
    return float(stats.chisquare(observed, mean * observed.sum() / mean.sum()).pvalue)


BINOMIALS = [(1, 0.3), (7, 0.5), (40, 0.9), (1000, 0.01), (100_000, 1e-5), (262_144, 0.05), (3, 0.999)]


@pytest.mark.parametrize("n,p", BINOMIALS)
def test_binomial_law(n, p):
    # 200,000 draws, level 1e-4 (false-fail <= 7e-4 over the cases); a law off by TV 0.01 gives
    # noncentrality >= 80 and fails with probability > 0.999.
    draws = variates.binomial(Stream(KEY + n).raw, np.full(200_000, n), np.full(200_000, p))
    assert draws.min() >= 0 and draws.max() <= n
    assert _law_p_value(draws, lambda k: stats.binom.pmf(k, n, p)) > LAW_LEVEL


HYPERGEOMETRICS = [(6, 4, 3), (1, 9, 5), (200, 300, 100), (5, 100_000, 50_000), (262_144, 262_144, 30_000)]


@pytest.mark.parametrize("good,bad,sample", HYPERGEOMETRICS)
def test_hypergeometric_law(good, bad, sample):
    # As test_binomial_law: false-fail <= 5e-4 over the cases.
    draws = variates.hypergeometric(
        Stream(KEY + good).raw, np.full(200_000, good), np.full(200_000, bad), np.full(200_000, sample)
    )
    assert draws.min() >= max(0, sample - bad) and draws.max() <= min(sample, good)
    assert _law_p_value(draws, lambda k: stats.hypergeom.pmf(k, good + bad, good, sample)) > LAW_LEVEL


def test_degenerate_laws_draw_no_words():
    words = []

    def source(n):  # records every request
        words.append(n)
        return Stream(KEY).raw(n)

    assert variates.binomial(source, np.array([0, 5, 5]), np.array([0.3, 0.0, 1.0])).tolist() == [0, 0, 5]
    assert variates.hypergeometric(source, np.array([3, 0, 4]), np.array([0, 5, 2]), np.array([2, 3, 6])).tolist() == [
        2,
        0,
        4,
    ]
    assert words == []


def test_multinomial_table_joint_law():
    # Every composition of 5 trials over 4 cells (one of probability 0), 100,000 tables: chi-square
    # against the multinomial pmf at level 1e-4 (false-fail 1e-4).
    pvals = np.array([0.5, 0.0, 0.3, 0.2])
    tables = Stream(KEY).multinomial(5, pvals, size=100_000)
    assert (tables.sum(axis=1) == 5).all() and (tables[:, 1] == 0).all()
    cells = [c for c in itertools.product(range(6), repeat=4) if sum(c) == 5 and c[1] == 0]
    index = {c: i for i, c in enumerate(cells)}
    seen = np.bincount([index[tuple(row)] for row in tables.tolist()], minlength=len(cells))
    expected = stats.multinomial.pmf(np.array(cells), 5, pvals) * tables.shape[0]
    assert stats.chisquare(seen, expected).pvalue > LAW_LEVEL


def test_hypergeometric_table_joint_law():
    # Every split of 6 items drawn from colors (4, 0, 3, 5), 100,000 tables (false-fail 1e-4).
    colors = np.array([4, 0, 3, 5])
    tables = Stream(KEY).multivariate_hypergeometric(colors, 6, size=100_000)
    assert (tables.sum(axis=1) == 6).all() and (tables <= colors).all()
    cells = [c for c in itertools.product(*(range(k + 1) for k in colors)) if sum(c) == 6]
    index = {c: i for i, c in enumerate(cells)}
    seen = np.bincount([index[tuple(row)] for row in tables.tolist()], minlength=len(cells))
    expected = stats.multivariate_hypergeom.pmf(np.array(cells), colors, 6) * tables.shape[0]
    assert stats.chisquare(seen, expected).pvalue > LAW_LEVEL


# ---------------------------------------------------------------- the words, against the specification


def _rou_reference(words, params: list[tuple]) -> list[int]:
    """Scalar ratio of uniforms written from the docstring: params (mode, mean, var, low, high,
    log_ratio(k)); in a round with P pending entries each, in order, takes ceil(ROUND_PAIRS / P)
    candidates of two words (U, V) and the value of its first accepted one."""
    out, pending = [p[0] for p in params], list(range(len(params)))
    while pending:
        tries, still = -(-variates.ROUND_PAIRS // len(pending)), []
        for i in pending:
            mode, mean, var, low, high, log_ratio = params[i]
            a, h = mean + 0.5, variates.D1 * math.sqrt(var + 0.5) + variates.D2
            value = None
            for _ in range(tries):
                u, v = variates.uniform_from_words(words(2))
                x = a + h * (v - 0.5) / u
                if (
                    value is None
                    and low <= x < high + 1
                    and 2.0 * variates.log(np.array([u]))[0] <= log_ratio(math.floor(x))
                ):
                    value = math.floor(x)
            if value is None:
                still.append(i)
            else:
                out[i] = value
        pending = still
    return out


def _binomial_params(n: int, p: float) -> tuple:
    q = 1.0 - p
    mode = min(math.floor((n + 1) * p), n)
    step = variates.log(np.array([p / q]))[0]

    def log_ratio(k: int) -> float:
        d = k - mode
        return float(
            d * step
            - variates.log_factorial_step(np.array([mode]), np.array([d]))[0]
            - variates.log_factorial_step(np.array([n - mode]), np.array([-d]))[0]
        )

    return mode, n * p, n * p * q, 0, n, log_ratio


def _multinomial_reference(key: int, trials: list[int], pvals: list[float], group: int) -> list[list[int]]:
    """The tree of the docstring, one level at a time over a group of rows, row by row, node by node."""
    words = Stream(key).raw
    out = []
    for start in range(0, len(trials), group):
        rows = [[0] * len(pvals) for _ in trials[start : start + group]]
        for row, n in zip(rows, trials[start : start + group]):
            row[0] = n
        for level in variates._levels(len(pvals)):
            entries = []  # (row, lo, mid, n, p)
            for row in rows:
                for lo, mid, hi in level:
                    node = math.fsum(pvals[lo:hi])
                    p = math.fsum(pvals[lo:mid]) / node if node > 0 else 0.0
                    entries.append((row, lo, mid, row[lo], p))
            reduced = [1.0 - p if p > 0.5 else p for *_, p in entries]  # binomial draws min(p, 1 - p)
            live = [i for i, entry in enumerate(entries) if entry[3] > 0 and reduced[i] > 0]
            drawn = dict(zip(live, _rou_reference(words, [_binomial_params(entries[i][3], reduced[i]) for i in live])))
            for i, (row, lo, mid, n, p) in enumerate(entries):
                left = n - drawn.get(i, 0) if p > 0.5 else drawn.get(i, 0)
                row[lo], row[mid] = left, n - left
        out.extend(rows)
    return out


@pytest.mark.parametrize("group,pairs", [(variates.ROW_GROUP_ENTRIES, variates.ROUND_PAIRS), (12, 1), (12, 5)])
def test_multinomial_tables_take_the_words_of_the_specification(group, pairs, monkeypatch):
    pvals = [0.25, 0.0, 0.125, 0.5, 0.125]
    trials = [9, 0, 40, 1, 300]
    monkeypatch.setattr(variates, "ROW_GROUP_ENTRIES", group)  # 12 // 5 = 2 rows a group
    monkeypatch.setattr(variates, "ROUND_PAIRS", pairs)  # 1: one candidate a variate, several rounds
    got = Stream(KEY).multinomial(np.array(trials), np.array(pvals))
    assert got.tolist() == _multinomial_reference(KEY, trials, pvals, max(1, group // len(pvals)))


GOLDEN_TABLES = {
    "multinomial": [[99903, 200726, 299576, 250269, 149529], [99728, 199642, 300439, 250127, 150067]],
    "hypergeometric": [[2659, 32, 6310, 0], [2646, 36, 6318, 1]],
}


def test_golden_tables():
    # The stream version 3 in numbers (printed by this implementation, numpy 2.x, x86_64): a change
    # of any breaks the verification of every bundle sealed with version 3.
    stream = Stream(KEY)
    got = {
        "multinomial": stream.multinomial(1_000_003, [0.1, 0.2, 0.3, 0.25, 0.15], size=2).tolist(),
        "hypergeometric": stream.multivariate_hypergeometric(np.array([5000, 70, 12000, 1]), 9001, size=2).tolist(),
    }
    assert got == GOLDEN_TABLES


# ---------------------------------------------------------------- the nulls drawn with them


def test_version_3_table_nulls_have_exact_size():
    # 1,000 replicates per criterion of data drawn from H0 (numpy's generator, not the stream under
    # test), each keyed like a bundle's criterion; rejections at 0.05 must have a Clopper-Pearson
    # 99.9% interval containing 0.05 or lying below it (exact size fails w.p. <= 0.0005 per
    # criterion; a size of 0.075 fails w.p. > 0.9).
    data = np.random.default_rng(31)
    probs = np.array([0.4, 0.3, 0.15, 0.1, 0.05])
    gof, split = [], []
    for i in range(1_000):
        strata = [(("a",), data.multinomial(200, probs), probs), (("b",), data.multinomial(30, probs), probs)]
        gof.append(
            stratified_gof(
                strata,
                stratum_min=50,
                min_expected=5.0,
                level=0.05,
                rng=montecarlo.criterion_rng("size3", "gof", str(i)),
            ).p_value
        )
        pair = [(("a",), data.multinomial(150, probs), data.multinomial(120, probs), probs)]
        split.append(
            stratified_homogeneity(
                pair, stratum_min=50, min_expected=5.0, level=0.05, rng=montecarlo.criterion_rng("size3", "hom", str(i))
            ).p_value
        )
    for p_values in (gof, split):
        rejections = int((np.asarray(p_values) <= 0.05).sum())
        low = stats.beta.ppf(0.0005, rejections, len(p_values) - rejections + 1) if rejections else 0.0
        assert low <= 0.05, f"{rejections} / {len(p_values)} rejections at 0.05"


def test_the_tables_do_not_depend_on_numpy_simd_dispatch():
    """Deterministic: the golden tables again in a process whose numpy runs its baseline kernels
    only (`NPY_DISABLE_CPU_FEATURES`: no AVX2 / AVX-512 paths, as on an older x86-64 CPU), where
    numpy's own `log` and `exp` would take other code paths (feature names of numpy 2.4+)."""
    script = (
        f"import json, numpy as np; from specval.stats.stream import Stream; s = Stream({KEY}); "
        "print(json.dumps([s.multinomial(1_000_003, [0.1, 0.2, 0.3, 0.25, 0.15], size=2).tolist(), "
        "s.multivariate_hypergeometric(np.array([5000, 70, 12000, 1]), 9001, size=2).tolist()]))"
    )
    env = dict(os.environ, NPY_DISABLE_CPU_FEATURES="AVX512_SPR AVX512_ICL X86_V4 X86_V3")
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == [GOLDEN_TABLES["multinomial"], GOLDEN_TABLES["hypergeometric"]]
