"""Variates: binomial and hypergeometric draws, and multinomial and multivariate hypergeometric
tables built from them, in O(cells) per table and in IEEE float64 basic operations only.

Why: the Monte Carlo nulls of the stratified tests draw one table per null replicate. Placing each
of n trials with its own uniform (stream versions 1 and 2) costs O(n) per table: at 262,144
samples per group that is most of a GPU run's wall time. Conditional binomials cost O(1) each,
but numpy's samplers may change between releases and call the platform's `log` and `exp`, whose
last bits differ between libraries and SIMD paths. Here every value is a fixed sequence of
additions, subtractions, multiplications, divisions, square roots, `frexp` and floors, each
correctly rounded by IEEE 754 on every platform, so a key gives the same draws everywhere.

The pieces (stream version 3, `specval.stats.stream`):

- `log(x)`: x = m 2**e with m in [sqrt(1/2), sqrt(2)) (`frexp`, then m *= 2 if m < sqrt(1/2));
  s = (m - 1) / (m + 1); log x = e LN2_HI + (2 s P(s**2) + e LN2_LO), P the atanh series
  1 + z/3 + ... + z**10/21 evaluated by Horner from the highest term. Within a few ulp of the
  true value (|s| <= 0.1716: the first omitted term is < 1e-18 relative).
- `log1p(t)`: the same series on s = t / (2 + t) for |t| < 1/4, else log(1 + t).
- `log_factorial(k)`: k < STIRLING_FROM from a table (cumulative sums of log(i) in order), else
  Stirling's series (k + 1/2) log k - k + log(2 pi) / 2 + 1/(12 k) - 1/(360 k**3) + 1/(1260 k**5)
  (next term < 1e-20 at k >= 256).
- `log_factorial_step(a, d)` = log((a + d)!) - log(a!): the difference of two table or Stirling
  values when either argument is below STIRLING_FROM, else (a + 1/2) log1p(d / a) + d log(a + d)
  - d + c(a + d) - c(a), c the series' tail: the large terms cancel on paper, not in floats, so
  the absolute error stays within a few ulp of |d| log(a + d) (measured: <= 6e-11 for
  |d| <= 10,000 and a + d < 2**40) instead of a few ulp of a log a.
- `ratio_of_uniforms`: Stadlober's minimal ratio-of-uniforms rejection for a discrete log-concave
  law with mode m, mean mu and variance var on the integers [low, high]: a = mu + 1/2,
  h = D1 sqrt(var + 1/2) + D2 (D1 = 2 sqrt(2/e), D2 = 3 - 2 sqrt(3/e)). A candidate is a pair
  of uniforms, U then V (uniform_from_words: ((w >> 11) + 1/2) 2**-53, in (0, 1)), and
  x = a + h (V - 1/2) / U; it is accepted iff low <= x < high + 1 and 2 log U <= log f(floor x)
  - log f(m), giving the value floor x. In a round with P variates still pending, each takes
  c = ceil(ROUND_PAIRS / P) candidates (variate after variate, candidate after candidate, two
  words each) and the value of its first accepted one (a rejected variate waits for the next
  round): a handful of rounds however few variates a call draws. Exact for the law f (a uniform
  point of the region {(u, v): u**2 <= f(floor x) / f(m)} has x distributed as f) as long as the
  region lies in the unit square, which a test checks over a grid of parameters; the float64
  evaluation of log f(k) - log f(m) (two or four log_factorial_step terms) moves the acceptance
  boundary by at most ~2.4e-10 in log (|k - m| <= 10,000), a relative error of that size in the
  accepted probabilities: the only departure from the exact law.
- `binomial(n, p)`: p > 1/2 draws n - Binomial(n, 1 - p); n = 0 or p = 0 is 0 without uniforms;
  otherwise ratio_of_uniforms with m = floor((n + 1) p), mu = n p, var = n p (1 - p), on [0, n].
- `hypergeometric(good, bad, sample)`: the successes among `sample` items drawn without
  replacement; a support [max(0, sample - bad), min(sample, good)] of one value is that value
  without uniforms; otherwise ratio_of_uniforms with m = floor((sample + 1)(good + 1) / (N + 2))
  clipped to the support, mu = sample good / N, var = mu (bad / N) (N - sample) / (N - 1).
- Tables: the cells [0, C) split into a binary tree (a node [lo, hi) with hi - lo >= 2 splits at
  (lo + hi) // 2); a node's count goes to its left child as Binomial(count, w(left) / w(node))
  (multinomial; w the cells' probabilities summed by `math.fsum`) or Hypergeometric(colors of
  left, colors of right, count) (multivariate hypergeometric), the right child taking the rest.
  Rows are drawn in groups of max(1, ROW_GROUP_ENTRIES // C) consecutive rows; within a group the
  tree's levels go root first; within a level the variates go row by row, node by node left to
  right, and one `ratio_of_uniforms` call draws all of them (its rounds take the stream's words
  in the order above).

Guarantee: deterministic in the words given; the laws are the exact binomial and hypergeometric
up to the acceptance-boundary error above. Scaling: O(rows x cells) variates whatever the number
of trials, each ~1.4 to ~4 candidates of ~100 float64 operations (acceptance ~0.73 for a wide
law, ~0.24 for a near-degenerate one), plus at least ROUND_PAIRS candidates per round.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

WordSource = Callable[[int], np.ndarray]  # n -> the stream's next n raw words, uint64[n]

UNIT_SHIFT = 11  # 64 - 53: the top 53 bits of a word
UNIT_SCALE = 2.0**-53
SQRT_HALF = 0.70710678118654752440
LN2_HI = 6.93147180369123816490e-01  # ln 2 with its low 32 bits zero: e * LN2_HI is exact for |e| < 2**20
LN2_LO = 1.90821492927058770002e-10  # ln 2 - LN2_HI
ATANH_TERMS = 11  # 1, z/3, ..., z**10/21: the omitted z**11/23 is < 1e-18 at z <= 0.0295
LOG1P_SERIES_BELOW = 0.25  # |t| below this: the series on t / (2 + t) (|s| <= 1/7)
STIRLING_FROM = 256  # log k! from a table below, from Stirling's series at and above
HALF_LOG_2PI = 0.91893853320467274178
D1 = 1.7155277699214135  # 2 sqrt(2 / e): Stadlober's hat width per standard deviation
D2 = 0.8989161620588988  # 3 - 2 sqrt(3 / e): the hat's width at variance 0
ROW_GROUP_ENTRIES = 1 << 16  # rows x cells drawn together, at most (a group of one row if C is larger)
ROUND_PAIRS = 1024  # candidate pairs per rejection round, at least: few rounds however few entries wait


def uniform_from_words(words: np.ndarray) -> np.ndarray:
    """float64 in (0, 1): ((w >> 11) + 1/2) 2**-53, never 0 (its log is finite)."""
    return ((words >> np.uint64(UNIT_SHIFT)).astype(np.float64) + 0.5) * UNIT_SCALE


def _atanh_times_two(s: np.ndarray) -> np.ndarray:
    """2 atanh(s) = 2 s (1 + s**2/3 + ... + s**20/21), Horner from the highest term."""
    z = s * s
    poly = np.full_like(z, 1.0 / (2 * ATANH_TERMS - 1))
    for j in range(ATANH_TERMS - 2, -1, -1):
        poly = poly * z + 1.0 / (2 * j + 1)
    return 2.0 * s * poly


def log(x: np.ndarray) -> np.ndarray:
    """Natural log of positive, finite, normal float64 values (module docstring)."""
    x = np.asarray(x, dtype=np.float64)
    m, e = np.frexp(x)
    low = m < SQRT_HALF
    m = np.where(low, 2.0 * m, m)
    e = (e - low).astype(np.float64)
    return e * LN2_HI + (_atanh_times_two((m - 1.0) / (m + 1.0)) + e * LN2_LO)


def log1p(t: np.ndarray) -> np.ndarray:
    """log(1 + t) for t > -1, accurate to a few ulp of the result also for small t."""
    t = np.asarray(t, dtype=np.float64)
    small = np.abs(t) < LOG1P_SERIES_BELOW
    if small.all():
        return _atanh_times_two(t / (2.0 + t))
    out = np.empty_like(t)
    out[small] = _atanh_times_two(t[small] / (2.0 + t[small]))
    out[~small] = log(1.0 + t[~small])
    return out


def _factorial_table() -> np.ndarray:
    logs = log(np.arange(1, STIRLING_FROM, dtype=np.float64))
    return np.concatenate([[0.0], np.cumsum(logs)])  # cumsum adds in order: the same sums everywhere


_TABLE = _factorial_table()  # log k! for k < STIRLING_FROM; read-only


def _stirling_tail(k: np.ndarray) -> np.ndarray:
    """c(k) = 1/(12 k) - 1/(360 k**3) + 1/(1260 k**5), Horner in 1 / k**2."""
    inverse = 1.0 / k
    square = inverse * inverse
    return inverse * (1.0 / 12 - square * (1.0 / 360 - square * (1.0 / 1260)))


def log_factorial(k: np.ndarray) -> np.ndarray:
    """log k! of int64 values k >= 0 (module docstring): float64 of k's shape."""
    k = np.asarray(k, dtype=np.int64)
    out = np.empty(k.shape, dtype=np.float64)
    small = k < STIRLING_FROM
    out[small] = _TABLE[k[small]]
    if not small.all():
        big = k[~small].astype(np.float64)
        out[~small] = (big + 0.5) * log(big) - big + HALF_LOG_2PI + _stirling_tail(big)
    return out


def log_factorial_step(a: np.ndarray, d: np.ndarray) -> np.ndarray:
    """log((a + d)!) - log(a!) for int64 a >= 0, a + d >= 0 (module docstring)."""
    a, d = np.broadcast_arrays(np.asarray(a, dtype=np.int64), np.asarray(d, dtype=np.int64))
    x = a + d
    out = np.empty(a.shape, dtype=np.float64)
    near = (a < STIRLING_FROM) | (x < STIRLING_FROM)
    if near.any():
        out[near] = log_factorial(x[near]) - log_factorial(a[near])
    if near.all():
        return out
    af, df, xf = a[~near].astype(np.float64), d[~near].astype(np.float64), x[~near].astype(np.float64)
    out[~near] = ((af + 0.5) * log1p(df / af) + df * log(xf) - df) + (_stirling_tail(xf) - _stirling_tail(af))
    return out


LogRatio = Callable[[np.ndarray, np.ndarray], np.ndarray]  # (indices of variates, k) -> log f(k) - log f(m)


def ratio_of_uniforms(
    words: WordSource,
    mode: np.ndarray,
    mean: np.ndarray,
    var: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    log_ratio: LogRatio,
) -> np.ndarray:
    """One draw per entry of the log-concave laws described by the arrays (module docstring):
    int64 of their length. A round with P pending entries gives each c = ceil(ROUND_PAIRS / P)
    candidate pairs (entry after entry, candidate after candidate, two words each: U then V); an
    entry takes its first accepted candidate."""
    a = mean + 0.5
    h = D1 * np.sqrt(var + 0.5) + D2
    out = mode.astype(np.int64)  # a copy
    pending = np.arange(mode.size)
    while pending.size:
        tries = -(-ROUND_PAIRS // pending.size)
        pair = uniform_from_words(words(2 * tries * pending.size)).reshape(pending.size, tries, 2)
        u, v = pair[..., 0], pair[..., 1]
        entry = np.broadcast_to(pending[:, None], u.shape)
        x = a[entry] + h[entry] * (v - 0.5) / u
        inside = (x >= low[entry]) & (x < high[entry] + 1.0)
        k = np.floor(x[inside]).astype(np.int64)
        accepted = inside.copy()
        accepted[inside] = 2.0 * log(u[inside]) <= log_ratio(entry[inside], k)
        taken = accepted.any(axis=1)
        first = accepted.argmax(axis=1)[taken]
        out[pending[taken]] = np.floor(x[np.flatnonzero(taken), first]).astype(np.int64)
        pending = pending[~taken]
    return out


def binomial(words: WordSource, n: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Binomial(n, p) per entry of the int64 `n` and float64 `p` arrays (one length): int64."""
    n, p = np.asarray(n, dtype=np.int64), np.asarray(p, dtype=np.float64)
    flipped = p > 0.5
    p = np.where(flipped, 1.0 - p, p)
    out = np.zeros(n.shape, dtype=np.int64)
    live = np.flatnonzero((n > 0) & (p > 0))
    if live.size:
        nl, pl = n[live], p[live]
        ql = 1.0 - pl
        mode = np.minimum(np.floor((nl + 1).astype(np.float64) * pl).astype(np.int64), nl)
        mean = nl.astype(np.float64) * pl
        step_log = log(pl / ql)

        def log_ratio(index: np.ndarray, k: np.ndarray) -> np.ndarray:
            m, d = mode[index], k - mode[index]
            return d * step_log[index] - log_factorial_step(m, d) - log_factorial_step(nl[index] - m, -d)

        out[live] = ratio_of_uniforms(
            words, mode, mean, mean * ql, np.zeros(live.size), nl.astype(np.float64), log_ratio
        )
    return np.where(flipped, n - out, out)


def hypergeometric(words: WordSource, good: np.ndarray, bad: np.ndarray, sample: np.ndarray) -> np.ndarray:
    """Successes among `sample` items drawn without replacement from `good` + `bad`, per entry of
    the int64 arrays (one length; 0 <= sample <= good + bad): int64."""
    good, bad, sample = (np.asarray(x, dtype=np.int64) for x in (good, bad, sample))
    low, high = np.maximum(0, sample - bad), np.minimum(sample, good)
    out = low.copy()
    live = np.flatnonzero(high > low)
    if live.size:
        g, b, s = good[live], bad[live], sample[live]
        total = (g + b).astype(np.float64)
        mode = np.clip(
            np.floor((s + 1).astype(np.float64) * (g + 1) / (total + 2.0)).astype(np.int64), low[live], high[live]
        )
        mean = s * (g / total)
        var = mean * (b / total) * ((total - s) / (total - 1.0))

        def log_ratio(index: np.ndarray, k: np.ndarray) -> np.ndarray:
            m, d = mode[index], k - mode[index]
            return -(
                log_factorial_step(m, d)
                + log_factorial_step(g[index] - m, -d)
                + log_factorial_step(s[index] - m, -d)
                + log_factorial_step(b[index] - s[index] + m, d)
            )

        out[live] = ratio_of_uniforms(
            words, mode, mean, var, low[live].astype(np.float64), high[live].astype(np.float64), log_ratio
        )
    return out


# ---------------------------------------------------------------- tables by a binary tree of cells


def _levels(num_cells: int) -> list[list[tuple[int, int, int]]]:
    """The tree's splitting nodes (lo, mid, hi) level by level, root first, left to right."""
    levels, current = [], [(0, num_cells)]
    while current:
        split = [(lo, (lo + hi) // 2, hi) for lo, hi in current if hi - lo >= 2]
        if split:
            levels.append(split)
        current = [child for lo, mid, hi in split for child in ((lo, mid), (mid, hi))]
    return levels


Split = Callable[[np.ndarray, int], np.ndarray]  # (counts of the level's nodes [rows, nodes], level) -> left counts


def _tree_table(totals: np.ndarray, num_cells: int, levels: list, split: Split) -> np.ndarray:
    """int64[rows, num_cells]: each row's total sent down the tree (`levels`, from `_levels`) by
    `split`, level by level, in groups of rows (module docstring)."""
    out = np.empty((totals.size, num_cells), dtype=np.int64)
    per_group = max(1, ROW_GROUP_ENTRIES // max(num_cells, 1))
    for start in range(0, totals.size, per_group):
        counts = out[start : start + per_group]
        counts[:] = 0
        counts[:, 0] = totals[start : start + per_group]  # a node's count sits in its first cell until it splits
        for depth, level in enumerate(levels):
            lo = np.array([node[0] for node in level])
            mid = np.array([node[1] for node in level])
            node_counts = counts[:, lo]
            left = split(node_counts, depth).reshape(node_counts.shape)
            counts[:, lo] = left
            counts[:, mid] = node_counts - left
    return out


def multinomial_table(words: WordSource, trials: np.ndarray, pvals: np.ndarray) -> np.ndarray:
    """int64[rows, C]: one multinomial(trials[r], pvals) per row, by conditional binomials down
    the tree (module docstring). pvals: float64[C] weights >= 0 with a positive sum."""
    weights = [float(w) for w in pvals]
    levels = _levels(len(weights))
    left_share = [np.array([_share(weights, lo, mid, hi) for lo, mid, hi in level]) for level in levels]

    def split(node_counts: np.ndarray, depth: int) -> np.ndarray:
        p = np.broadcast_to(left_share[depth], node_counts.shape)
        return binomial(words, node_counts.reshape(-1), p.reshape(-1))

    return _tree_table(trials, len(weights), levels, split)


def _share(weights: list[float], lo: int, mid: int, hi: int) -> float:
    """w(left) / w(node) with exactly rounded sums (0 for a node of weight 0: it never has trials)."""
    node = math.fsum(weights[lo:hi])
    return math.fsum(weights[lo:mid]) / node if node > 0 else 0.0


def hypergeometric_table(words: WordSource, colors: np.ndarray, nsample: int, rows: int) -> np.ndarray:
    """int64[rows, C]: per row, the counts per color of `nsample` items drawn without
    replacement, by conditional hypergeometrics down the tree (module docstring)."""
    colors = np.asarray(colors, dtype=np.int64)
    ends = np.concatenate([[0], np.cumsum(colors)])
    levels = _levels(colors.size)
    sizes = [
        (
            np.array([ends[mid] - ends[lo] for lo, mid, hi in level], dtype=np.int64),
            np.array([ends[hi] - ends[mid] for lo, mid, hi in level], dtype=np.int64),
        )
        for level in levels
    ]

    def split(node_counts: np.ndarray, depth: int) -> np.ndarray:
        good, bad = (np.broadcast_to(x, node_counts.shape).reshape(-1) for x in sizes[depth])
        return hypergeometric(words, good, bad, node_counts.reshape(-1))

    return _tree_table(np.full(rows, nsample, dtype=np.int64), colors.size, levels, split)
