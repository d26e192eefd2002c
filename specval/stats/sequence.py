"""Sequence: randomized PITs of every committed token, their uniformity and their serial dependence.

Why PITs. A test of t_1..t_3 after one prompt cannot see a bug at a later draft position, in the
bonus token, in a later round (uniform offsets that freeze or overlap between rounds) or in stale
context. Every committed token x_i of a sequence has a reference law p_i, the target's filtered
conditional law given the ACTUAL prefix x_<i. Its randomized probability integral transform

    U_i = F_i(x_i^-) + V_i p_i(x_i),   V_i ~ U(0, 1) independent of everything else,

(F_i the CDF of p_i in a fixed vocabulary order) is U(0, 1) given the past, so under a correct
sampler U_1, U_2, ... of one sequence are i.i.d. U(0, 1) EXACTLY (the sequential randomized PIT, a
discrete Rosenblatt transform), whatever the prefixes; so are the U of a subsequence picked by a
predictable rule (a bucket of a sequence-index range, or of the round position j_i in 1..K+1,
which depends on the past only). Monte Carlo nulls are therefore cheap: i.i.d. uniforms with the
same bucket sizes or sequence lengths. They are exact where those sizes are fixed in advance (one
bucket, fixed lengths); where the realised bucket sizes depend on earlier U (a speculative sampler's
round positions follow its accepts, which follow its tokens) the null conditions on sizes that are
not independent of the U, and the size is measured instead (docs/harness.md section 9,
"Exactness, stated").

Vocabulary order. `order="rank"` (the default) sorts the vocabulary by DESCENDING reference
probability, ties by ascending token id. Then U near 0 means "a likely token", U near 1 "an unlikely
one", so the common ways of moving mass between likely and unlikely tokens (a wrong temperature,
top-k / top-p not applied or applied twice, a row of another position) shift U toward 0 or 1 and
show in a few equal-probability bins. `order="index"` (token id order) is kept for SUTs whose
inverse-CDF sampling works in id order, where a bias in the uniforms maps to a shift of U directly.

V_i comes from a SPECIFIED stream (`montecarlo.criterion_rng`, or a documented
`np.random.Generator(np.random.Philox(key))`), drawn in the array order of the tokens, so that
`specval verify` redraws the same U bit for bit.

Null draws, and why they are cheap. A rejected criterion draws its full Monte Carlo budget, B =
ceil(30 / level) null statistics (24,000 at level 1.25e-3), each of N tokens, so the cost of one
null statistic decides how fast a broken sampler FAILs. Measured on N = 12,800 (a smoke group) the
first stream version spent ~0.96 ms per uniformity statistic (one Philox word, a float and a cdf
search per token: `Stream.multinomial`) and ~2.2 ms per serial statistic (one word per token by
`Stream.integers`, then a bincount of gathered pair codes per lag). Two exact changes, kept
because they remove most of that without touching the tests' size or power
(benchmarks/sequence_nulls.py prints the table):

- Stream version 2 (`philox4x64-10/specval-2`, `Stream.uniform_digits`): uniform bins packed three
  to a 10- or 7-bit field of a raw word (17.6 decimal or 26.4 base-5 digits a word where version 1
  used one word a value; Philox words cost ~20 ns each here). The bins are still exactly i.i.d.
  uniform (a field is accepted only below base**3), so the null law, the p-value's exact size, the
  power and the MDEs are those of version 1; only the random numbers differ. The uniformity null
  draws each bucket's n_g bins and counts them (multinomial(n_g, uniform) exactly); the serial and
  association nulls use the bins themselves. Bundles that record version 1 redraw with
  `multinomial` and `integers` as they were sealed (`_uniform_counts`, `uniform_bins`).
- Pair tables counted on bit planes (`pair_counts`, `lag_tables`): one bitset per bin value,
  a lag is a shift, a cell is the popcount of an AND, 64 tokens a word operation. The tables are
  the same integers the gathered bincount gave, so every statistic and p-value of both versions is
  unchanged bit for bit; only the time differs.

Not done: a stopping rule that ends a clearly rejected criterion early. Any rule that stops after
n0 draws with no exceedance spends 1 / (n0 + 1) of the level on that state, so for it to reject at
t it needs n0 >= 1 / t - 1 draws (B / 30), and the spent mass raises every other state's p-value:
keeping the rejection of k <= 29 exceedances at B draws (decision power 0.9996 at an exact p of
t / 2, which the MDEs assume) leaves ~t**2 / 30 to spend, far below 1 / (n0 + 1) for any useful n0.
A faster FAIL by stopping needs a change of the pre-registered decision rule and of the MDEs: the
sequence kind's criteria version 2 made it (`montecarlo.EARLY_REJECTION`, the level split in two).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable, Sequence

import numpy as np

from specval.stats import checks
from specval.stats.montecarlo import BESAG_CLIFFORD, McPValue, NullDraws, sequential_pvalue
from specval.stats.results import StatResult
from specval.stats.stream import Stream

ORDERS = ("rank", "index")
PIT_BINS = 10  # equal-probability bins of U for the uniformity test (expected n / 10 per bin)
SERIAL_BINS = 5  # bins per axis of the lag tables: 5 x 5 cells, (5 - 1)^2 = 16 df per lag
CHUNK_ELEMENTS = 1 << 22  # rows x vocabulary entries handled at once by pit_parts (32 MiB of f64)
NULL_ELEMENTS = 1 << 22  # null uniforms drawn at once by the serial test (bounds its memory)
TOP_OF_UNIT = np.nextafter(1.0, 0.0)  # U is clipped to [0, 1): rounding of lower + mass may reach 1
WORD_BITS = 64
_BYTE_POPCOUNT = np.array([bin(i).count("1") for i in range(256)], dtype=np.uint8)


# ---------------------------------------------------------------- PIT parts


def _as_prob_rows(probs: object) -> np.ndarray:
    array = np.asarray(probs, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] == 0:
        raise ValueError(f"probs must be 2-D [N, V] with V >= 1, got shape {array.shape}")
    if not np.isfinite(array).all() or (array < 0).any():
        raise ValueError("probs must be finite and non-negative")
    totals = array.sum(axis=1)
    if array.shape[0] and not (totals > 0).all():
        raise ValueError(f"probs rows must have a positive total, row {int(np.argmin(totals > 0))} has {totals.min()}")
    return array / totals[:, None]


def _as_tokens(tokens: object, num_rows: int, vocab: int) -> np.ndarray:
    array = np.asarray(tokens)
    if array.shape != (num_rows,) or array.dtype.kind not in "iu":
        raise ValueError(f"tokens must be 1-D integers of length {num_rows}, got {array.dtype} {array.shape}")
    bad = (array < 0) | (array >= vocab)
    if bad.any():
        raise ValueError(f"tokens must lie in [0, {vocab}), got {array[bad][:3]}")
    return array.astype(np.int64)


def pit_parts(probs: np.ndarray, tokens: np.ndarray, order: str = "rank") -> tuple[np.ndarray, np.ndarray]:
    """(lower, mass) of each token: lower = F(x^-), the reference mass of the tokens before x in
    `order`, and mass = p(x); both float64[N].

    Assumptions: `probs[i]` is token i's reference law (unnormalised rows are normalised in float64).
    Guarantee: lower + mass <= 1 up to rounding; mass == 0 marks a token outside the support (proof
    of a bug, failed by the out-of-support criterion; its U carries no information). Rank order is
    descending probability, ties by ascending token id (module docstring).
    Scaling: O(N V) time, O(CHUNK_ELEMENTS) extra memory.
    """
    if order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS}, got {order!r}")
    probs = _as_prob_rows(probs)
    num_rows, vocab = probs.shape
    tokens = _as_tokens(tokens, num_rows, vocab)
    ids = np.arange(vocab)
    mass = probs[np.arange(num_rows), tokens]
    lower = np.empty(num_rows)
    step = max(1, CHUNK_ELEMENTS // vocab)
    for start in range(0, num_rows, step):
        rows, tok, px = (
            probs[start : start + step],
            tokens[start : start + step, None],
            mass[start : start + step, None],
        )
        before = ids < tok
        if order == "rank":
            before = (rows > px) | ((rows == px) & before)
        lower[start : start + step] = np.where(before, rows, 0.0).sum(axis=1)
    return lower, mass


def randomized_pit(lower: np.ndarray, mass: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """U = lower + V * mass with V = rng.random(N) drawn in array order; float64[N] in [0, 1).

    Assumptions: (lower, mass) from `pit_parts`; `rng` a specified, seeded stream.
    Guarantee: under a correct sampler U is i.i.d. U(0, 1) in sequence order (module docstring);
    deterministic in `rng`.
    """
    lower = np.asarray(lower, dtype=np.float64)
    mass = np.asarray(mass, dtype=np.float64)
    checks.same_length("lower", lower, "mass", mass)
    if lower.ndim != 1 or not (np.isfinite(lower).all() and np.isfinite(mass).all()):
        raise ValueError(f"lower and mass must be finite 1-D arrays, got shape {lower.shape}")
    if (lower < 0).any() or (mass < 0).any() or (lower + mass > 1 + 1e-9).any():
        raise ValueError("lower and mass must be >= 0 with lower + mass <= 1")
    return np.minimum(lower + rng.random(lower.size) * mass, TOP_OF_UNIT)


def as_pit(name: str, values: object) -> np.ndarray:
    """A 1-D float64 array of PITs in [0, 1], or ValueError naming `name`."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {array.shape}")
    if not ((array >= 0) & (array <= 1)).all():
        raise ValueError(f"{name} must lie in [0, 1], got {array[~((array >= 0) & (array <= 1))][:3]}")
    return array


def to_bins(u: np.ndarray, num_bins: int) -> np.ndarray:
    """Equal-probability bin of each U: floor(U * num_bins), U = 1 in the last bin; int64."""
    return np.minimum((u * num_bins).astype(np.int64), num_bins - 1)


# ---------------------------------------------------------------- uniformity


@dataclasses.dataclass(frozen=True)
class PitUniformityResult(StatResult):
    """Pearson X^2 of the (bucket, bin) table of U against uniform bins given the bucket sizes.

    `counts[g][b]` is bucket `bucket_keys[g]`'s count in bin b; `bucket_statistics[g]` its own X^2.
    `combine`: "sum" (statistic = the sum over buckets, df = buckets * (bins - 1)) or "max" (the
    largest bucket X^2, df = bins - 1 of that bucket); df is used for the MDE only, the p-value is
    the exact Monte Carlo one, `mc`. `is_degenerate`: n == 0 or one bin, p = 1, no evidence.
    """

    statistic: float
    df: int
    p_value: float
    mc: McPValue | None
    n: int
    num_bins: int
    bucket_keys: list
    bucket_sizes: list
    counts: list
    is_degenerate: bool
    combine: str = "sum"
    bucket_statistics: list = dataclasses.field(default_factory=list)


COMBINES = ("sum", "max")  # how pit_uniformity combines its buckets' X^2


def _bucket_chi2(counts: np.ndarray, sizes: np.ndarray, num_bins: int) -> np.ndarray:
    """X^2 of each bucket of counts[..., G, B] against sizes[G] / B per cell: f64[..., G]."""
    expected = sizes[:, None] / num_bins
    return (((counts - expected) ** 2) / expected).sum(axis=-1)


def _uniform_chi2(counts: np.ndarray, sizes: np.ndarray, num_bins: int) -> np.ndarray:
    """X^2 of counts[..., G, B] against sizes[G] / B per cell, summed over (G, B): f64[...]."""
    expected = sizes[:, None] / num_bins
    return (((counts - expected) ** 2) / expected).sum(axis=(-2, -1))


def _combined_chi2(counts: np.ndarray, sizes: np.ndarray, num_bins: int, combine: str) -> np.ndarray:
    """The statistic of `combine`: the sum over (G, B) (bit for bit `_uniform_chi2`, the summation
    order of bundles sealed before "max" existed) or the largest bucket X^2: f64[...]."""
    if combine == "sum":
        return _uniform_chi2(counts, sizes, num_bins)
    return _bucket_chi2(counts, sizes, num_bins).max(axis=-1)


def packed_digits(gen) -> bool:
    """Whether `gen` draws uniform bins with `Stream.uniform_digits` (stream version >= 2); the
    first version and the legacy numpy stream draw them with `multinomial` and `integers`."""
    return isinstance(gen, Stream) and gen.version >= 2


def uniform_bins(gen, num_bins: int, shape: tuple[int, ...]) -> np.ndarray:
    """i.i.d. uniform bins in [0, num_bins) of `shape` (last axis: one null statistic's tokens):
    packed digits (stream version 2) or `integers` (version 1, legacy), as the bundle's stream says."""
    if packed_digits(gen):
        return gen.uniform_digits(num_bins, shape)
    return gen.integers(0, num_bins, size=shape)


def _uniform_counts(gen, sizes: np.ndarray, num_bins: int, rows: int) -> np.ndarray:
    """int64[rows, G, B]: per row, multinomial(sizes[g], uniform over B bins) for every bucket g. Stream
    version 2: one row of sum(sizes) packed digits, bucket g's the next sizes[g] of them, counted;
    version 1 and legacy: `multinomial(sizes, uniform, size=(rows, G))` as those bundles drew it."""
    if not packed_digits(gen):
        return gen.multinomial(sizes, np.full(num_bins, 1.0 / num_bins), size=(rows, sizes.size))
    return gen.uniform_digit_counts(num_bins, sizes, rows)


def pit_uniformity(
    u: np.ndarray,
    buckets: Sequence[Hashable] | np.ndarray | None = None,
    *,
    num_bins: int = PIT_BINS,
    level: float,
    rng: np.random.Generator,
    combine: str = "sum",
    rule: str = BESAG_CLIFFORD,
) -> PitUniformityResult:
    """Exact-size test that the U of all committed tokens are U(0, 1) within each bucket.

    Design: ONE table of (bucket, bin) cells, each bucket's Pearson X^2 of its bins against
    n_g / num_bins, combined by `combine`. "sum": the buckets' noncentralities add, so its MDE is
    stated for the n-weighted mean over buckets of the per-bucket TV
    (`sequence_power.pit_uniformity_mde`): most power when every bucket deviates alike. "max": the
    largest bucket X^2, a max-type statistic whose exact null accounts for the number of buckets,
    so a deviation confined to ONE bucket is detected at that bucket's size, not diluted over all
    of them (`sequence_power.bucket_mde`). One criterion per call keeps the Holm family as it is.
    Assumptions: under H0 the U are i.i.d. U(0, 1) given the bucket labels (labels predictable:
    round position, sequence-index bucket); `level` is the level the criterion is decided at (its
    Holm first step); `rng` the criterion's Monte Carlo stream; `rule` the Monte Carlo rule
    (`montecarlo.RULES`).
    Guarantee: P(p <= a) <= a under H0 for every a, given the bucket sizes (multinomial(n_g,
    uniform) per bucket simulated exactly, sequential Monte Carlo p-value), when the sizes are
    independent of the U (fixed in advance, or one bucket); labels whose realised sizes depend on
    earlier U satisfy the assumption only approximately (module docstring); deterministic in `rng`.
    Scaling: O(N + draws * N) (stream version 2: ~N / 17.6 words per draw; version 1: N words);
    draws ~ 30 (1 + ln(1 / (30 level))) ... ceil(30 / level).
    """
    u = as_pit("u", u)
    num_bins = checks.count("num_bins", num_bins, minimum=1)
    if combine not in COMBINES:
        raise ValueError(f"combine must be one of {COMBINES}, got {combine!r}")
    labels = np.zeros(u.size, dtype=np.int64) if buckets is None else np.asarray(buckets)
    if labels.shape != u.shape:
        raise ValueError(f"buckets must have the shape of u {u.shape}, got {labels.shape}")
    keys, group = np.unique(labels, return_inverse=True)
    group = group.reshape(-1)
    counts = np.bincount(group * num_bins + to_bins(u, num_bins), minlength=keys.size * num_bins)
    counts = counts.reshape(keys.size, num_bins)
    sizes = counts.sum(axis=1)
    common = dict(
        n=int(u.size),
        num_bins=num_bins,
        bucket_keys=keys.tolist(),
        bucket_sizes=sizes.tolist(),
        counts=counts.tolist(),
        combine=combine,
    )
    if u.size == 0 or num_bins < 2:
        return PitUniformityResult(0.0, 0, 1.0, None, is_degenerate=True, **common)
    statistic = float(_combined_chi2(counts, sizes, num_bins, combine))
    per_bucket = _bucket_chi2(counts, sizes, num_bins).tolist()

    def draw(gen: np.random.Generator, size: int) -> np.ndarray:
        return _combined_chi2(_uniform_counts(gen, sizes, num_bins, size), sizes, num_bins, combine)

    mc = sequential_pvalue(statistic, in_chunks(draw, u.size), level, rng, rule)
    df = (keys.size if combine == "sum" else 1) * (num_bins - 1)
    return PitUniformityResult(
        statistic, df, mc.p_value, mc, is_degenerate=False, bucket_statistics=per_bucket, **common
    )


# ---------------------------------------------------------------- dependence tables


def in_chunks(draw: NullDraws, width: int) -> NullDraws:
    """`draw` called on at most NULL_ELEMENTS // width rows at a time (null draws of a statistic of
    `width` uniforms per row), so a large Monte Carlo batch never holds more than NULL_ELEMENTS
    uniforms. The rows come from the stream in the same order, so the draws are deterministic."""
    rows = max(1, NULL_ELEMENTS // max(1, width))

    def chunked(gen: np.random.Generator, size: int) -> np.ndarray:
        return np.concatenate([draw(gen, min(rows, size - done)) for done in range(0, size, rows)])

    return chunked


def independence_chi2(tables: np.ndarray) -> np.ndarray:
    """Pearson X^2 of independence of tables[..., B, B] with margins estimated from each table
    (E = row * column / n; cells of an empty row or column add 0): f64[...]."""
    tables = np.asarray(tables, dtype=np.float64)
    total = tables.sum(axis=(-2, -1))[..., None, None]
    expected = tables.sum(axis=-1)[..., :, None] * tables.sum(axis=-2)[..., None, :]
    expected = np.divide(expected, total, out=np.zeros_like(expected), where=total > 0)
    terms = np.divide((tables - expected) ** 2, expected, out=np.zeros_like(expected), where=expected > 0)
    return terms.sum(axis=(-2, -1))


def pair_tables(bins_a: np.ndarray, bins_b: np.ndarray, num_bins: int) -> np.ndarray:
    """Counts of (bins_a[r, i], bins_b[r, i]) pairs per row r: int64[R, B, B] (a bincount of pair
    codes: the reference `pair_counts` and `lag_tables` are checked against)."""
    rows, width = bins_a.shape
    codes = (np.arange(rows)[:, None] * num_bins + bins_a) * num_bins + bins_b
    return np.bincount(codes.reshape(-1), minlength=rows * num_bins * num_bins).reshape(rows, num_bins, num_bins)


def popcount(words: np.ndarray) -> np.ndarray:
    """Set bits of each uint64 word: uint8 of the same shape (numpy's bitwise_count where it has one,
    else a byte table: the same integers)."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words)
    return (
        _BYTE_POPCOUNT[np.ascontiguousarray(words).view(np.uint8)]
        .reshape(words.shape + (8,))
        .sum(axis=-1, dtype=np.uint8)
    )


def bit_planes(bins: np.ndarray, num_bins: int) -> np.ndarray:
    """uint64[R, B, W]: bit i of plane b of row r is set iff bins[r, i] == b (bit i is bit i % 64 of
    word i // 64); W = N // 64 + 1 words, the bits past N are 0 (so a shift reads zeros there)."""
    rows, width = bins.shape
    planes = np.zeros((rows, num_bins, (width // WORD_BITS + 1) * 8), dtype=np.uint8)
    for value in range(num_bins):
        planes[:, value, : (width + 7) // 8] = np.packbits(bins == value, axis=-1, bitorder="little")
    return planes.view("<u8").astype(np.uint64)


def _shift_down(planes: np.ndarray, lag: int) -> np.ndarray:
    """Bit i of the result is bit i + lag of `planes` (zeros past the end), on the last axis."""
    skip, bits = divmod(lag, WORD_BITS)
    out = np.zeros_like(planes)
    source = planes[..., skip:]
    count = source.shape[-1]
    if bits == 0:
        out[..., :count] = source
    else:
        out[..., :count] = source >> np.uint64(bits)
        out[..., : count - 1] |= source[..., 1:] << np.uint64(WORD_BITS - bits)
    return out


def _plane_tables(first: np.ndarray, second: np.ndarray) -> np.ndarray:
    """int64[R, B, B]: cell (a, b) = set bits of first[r, a] & second[r, b], summed over words."""
    return popcount(first[:, :, None, :] & second[:, None, :, :]).sum(axis=-1, dtype=np.int64)


def pair_counts(bins_a: np.ndarray, bins_b: np.ndarray, num_bins: int) -> np.ndarray:
    """`pair_tables` (the same integers) counted on bit planes: ~B^2 / 64 word operations a token."""
    return _plane_tables(bit_planes(bins_a, num_bins), bit_planes(bins_b, num_bins))


def lag_tables(bins: np.ndarray, starts: list[np.ndarray], num_bins: int) -> np.ndarray:
    """int64[R, L, B, B]: lag l's table of (bins[r, i], bins[r, i + l]) over i in starts[l - 1],
    = pair_tables(bins[:, first], bins[:, first + l]) (the same integers) on bit planes."""
    rows, width = bins.shape
    planes = bit_planes(bins, num_bins)
    out = np.zeros((rows, len(starts), num_bins, num_bins), dtype=np.int64)
    for column, first in enumerate(starts):
        if first.size:
            mask = np.zeros((1, width), dtype=bool)
            mask[0, first] = True
            valid = bit_planes(mask.astype(np.int8), 2)[:, 1:2]  # uint64[1, 1, W]: the positions i
            out[:, column] = _plane_tables(planes & valid, _shift_down(planes, column + 1))
    return out


# ---------------------------------------------------------------- serial dependence


@dataclasses.dataclass(frozen=True)
class SerialDependenceResult(StatResult):
    """Sum over lags 1..max_lag of the independence X^2 of the B x B table of (U_i, U_{i+lag}) pairs
    within sequences. `lag_statistics[l - 1]`, `lag_pairs[l - 1]`: lag l's X^2 and pair count;
    `df = max_lag * (B - 1)^2` (MDE only: overlapping pairs make the classic df wrong, so the p-value
    is the exact Monte Carlo one)."""

    statistic: float
    df: int
    p_value: float
    mc: McPValue | None
    n: int
    num_sequences: int
    max_lag: int
    num_bins: int
    lag_statistics: list
    lag_pairs: list
    is_degenerate: bool


def _lag_starts(lengths: np.ndarray, max_lag: int) -> list[np.ndarray]:
    """Per lag l: flat indices i whose partner i + l lies in the same sequence."""
    offsets = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    position = np.arange(int(lengths.sum())) - np.repeat(offsets, lengths)
    remaining = np.repeat(lengths, lengths) - position  # tokens from i to the end of its sequence
    return [np.flatnonzero(remaining > lag) for lag in range(1, max_lag + 1)]


def _lag_chi2(bins: np.ndarray, starts: list[np.ndarray], num_bins: int) -> np.ndarray:
    """f64[R, L]: each lag's independence X^2 for rows of flat bins[R, N] (a lag with no pair: 0)."""
    out = np.zeros((bins.shape[0], len(starts)))
    tables = lag_tables(bins, starts, num_bins)
    for column, first in enumerate(starts):
        if first.size:
            out[:, column] = independence_chi2(tables[:, column])
    return out


def serial_dependence(
    u_by_sequence: Sequence[np.ndarray],
    max_lag: int,
    *,
    num_bins: int = SERIAL_BINS,
    level: float,
    rng: np.random.Generator,
    rule: str = BESAG_CLIFFORD,
) -> SerialDependenceResult:
    """Exact-size test of dependence between U_i and U_{i+l} within sequences, l = 1..max_lag.

    Statistic: sum over lags of the B x B binned independence X^2 (margins estimated per table, so
    it sees dependence, linear or not, and leaves marginal non-uniformity to `pit_uniformity`).
    Use max_lag = K + 1: frozen or overlapping uniform offsets between rounds make tokens a round
    apart (lag 1..K+1) near-functions of each other, PIT pairs near the diagonal.
    Assumptions: under H0 every sequence's U are i.i.d. U(0, 1) (module docstring) and sequences
    are independent; `level`, `rng`, `rule` as in `pit_uniformity`.
    Guarantee: P(p <= a) <= a under H0 (the null simulates i.i.d. uniform bins with the same
    sequence lengths, pairs overlapping exactly as observed); deterministic in `rng`.
    Scaling: O(draws * N * (1 + max_lag * B^2 / 64)); memory O(NULL_ELEMENTS * B^2 / 8).
    """
    sequences = [as_pit(f"u_by_sequence[{i}]", s) for i, s in enumerate(u_by_sequence)]
    max_lag = checks.count("max_lag", max_lag, minimum=1)
    num_bins = checks.count("num_bins", num_bins, minimum=2)
    lengths = np.array([s.size for s in sequences], dtype=np.int64)
    flat = np.concatenate(sequences) if sequences else np.zeros(0)
    starts = _lag_starts(lengths, max_lag)
    lag_stats = _lag_chi2(to_bins(flat, num_bins)[None, :], starts, num_bins)[0]
    common = dict(
        n=int(flat.size),
        num_sequences=len(sequences),
        max_lag=max_lag,
        num_bins=num_bins,
        lag_statistics=lag_stats.tolist(),
        lag_pairs=[int(s.size) for s in starts],
    )
    used = sum(s.size > 0 for s in starts)
    if used == 0:
        return SerialDependenceResult(0.0, 0, 1.0, None, is_degenerate=True, **common)

    def draw(gen: np.random.Generator, size: int) -> np.ndarray:
        return _lag_chi2(uniform_bins(gen, num_bins, (size, flat.size)), starts, num_bins).sum(axis=1)

    statistic = float(lag_stats.sum())
    mc = sequential_pvalue(statistic, in_chunks(draw, flat.size), level, rng, rule)
    return SerialDependenceResult(statistic, used * (num_bins - 1) ** 2, mc.p_value, mc, is_degenerate=False, **common)
