"""Stream: the Monte Carlo null draws' random numbers, specified by this project, so that a
bundle's p-values redraw bit for bit under every numpy and scipy version the project supports.

numpy promises a stable stream from each bit generator (`random_raw`), but not from
`Generator.multinomial`, `integers`, `multivariate_hypergeometric` and the rest, whose algorithms
may change between releases (NEP 19). A `Stream` therefore takes only raw 64-bit words from
Philox-4x64-10 (a counter-based generator: word i of a key is a fixed function of the key and i)
and turns them into values with the transforms below, written here in integer and IEEE float64
operations whose results do not depend on the library version:

- raw words: `np.random.Philox(key=K).random_raw(n)`, K the 128-bit key, counter from 0; every
  method consumes words in order, in C order of its output, and never more than it says.
- `random(size)`: one word w per value, (w >> 11) * 2**-53: a float64 in [0, 1).
- `integers(low, high, size)`: uniform on [low, high), high - low <= 2**32, by Lemire's
  multiply-and-reject on the top 32 bits x of a word: m = x * r, accept iff (m mod 2**32) >=
  (2**32 - r) mod r, value low + (m >> 32); a rejected word is skipped, so exactly as many words are
  consumed as candidates were tried (each is accepted with probability > 1/2).
- `multinomial(n, pvals, size)`: n categorical draws per cell, each from one `random` value u: the
  category is the first j with u * c[-1] < c[j], c = cumsum(pvals) in float64 (zero-probability
  categories are never drawn; a rounding past the end falls on the last positive category); the
  counts of the n draws. Cells (C order of the output's leading shape) draw one after the other.
- `multivariate_hypergeometric(colors, nsample, size)`: per replicate, one word per item (items laid
  out color by color); the sample is the `nsample` items of smallest word, ties at the cut taken in
  item order (a tie has probability < total**2 / 2**65: about 4e-11 for 40,000 items); the counts
  per color of the sample.

Guarantee: the same key gives the same values on every platform and every numpy >= 1.17 (Philox
and `random_raw`); the draws are exact (multinomial: the categorical law of the float64 cdf;
integers: exactly uniform; hypergeometric: a uniform random subset, up to the tie rule).
Scaling (versions 1 and 2): one word per uniform, per candidate integer, per multinomial trial and
per hypergeometric item: O(n) per multinomial cell (numpy's own is O(categories)); work is split
into chunks of at most CHUNK_WORDS words, so memory stays bounded whatever the size. Version 3
draws a table in a few words per cell (2 per rejection round of each
conditional variate) whatever n (`specval.stats.variates`).

Versions. A stream is named by its version: `philox4x64-10/specval-1` (STREAM_V1) is everything
above; `philox4x64-10/specval-2` (STREAM_V2) is the same plus one transform, `uniform_digits`,
which the null samplers of the sequence statistics use in place of `multinomial(n, uniform)` and
`integers(0, base)` (`specval.stats.sequence`); `philox4x64-10/specval-3` (STREAM_V3, the current
one) is version 2 with other `multinomial` and `multivariate_hypergeometric` transforms: conditional
binomials and hypergeometrics down a binary tree of the cells, each drawn by ratio of uniforms in
IEEE float64 basic operations (`specval.stats.variates` specifies them), O(cells) per table
instead of O(trials) or O(items). Every other method draws the same words and values in every
version; a bundle records its version and `specval verify` redraws with it
(`montecarlo.criterion_rng`).

- `uniform_digits(base, size)` (version 2): uint8 values uniform on [0, base), 2 <= base <= 256,
  packed k to a field: k is the digits per field that maximises the expected digits per word,
  k * (64 // b) * base**k / 2**b with b = bit length of base**k - 1, over base**k <= 2**16 (ties
  to the smaller k; base 10: k = 3, 10-bit fields, 6 a word; base 5: k = 3, 7-bit fields, 9 a
  word). Field j of a word w is (w >> (b j)) & (2**b - 1), j = 0, 1, ... (low bits first); a field
  v < base**k is accepted and gives its k base-`base` digits, most significant first; a larger one
  is skipped. The last axis of `size` is a row: each row starts at a fresh word and takes words
  one after the other until it has its digits; what its last word holds beyond them is discarded.
  Rows draw one after the other in C order, so a row's digits do not depend on how many rows one
  call draws (the null samplers' batch and chunk sizes do not enter the draws). Exact: accepted
  fields are uniform on [0, base**k), so their digits are i.i.d. uniform. Cost: ~1 / 17.6 word
  per decimal digit, ~1 / 26.4 per base-5 digit (one word per value for `integers`, `multinomial`).
  Words drawn past the last row's end are kept for the next call, so every method still consumes
  the stream's words strictly in order and exactly as many as it says.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specval.stats import variates
from specval.stats.variates import UNIT_SCALE, UNIT_SHIFT  # the top 53 bits of a word make a float64 uniform

STREAM_V1 = "philox4x64-10/specval-1"  # bundles sealed before `uniform_digits` existed
STREAM_V2 = "philox4x64-10/specval-2"  # adds `uniform_digits` (module docstring)
STREAM_V3 = "philox4x64-10/specval-3"  # tables by conditional binomials / hypergeometrics (module docstring)
STREAM_NAME = STREAM_V3  # the current version, recorded in a summary's `monte_carlo_stream`
VERSIONS = {STREAM_V1: 1, STREAM_V2: 2, STREAM_V3: 3}
TREE_TABLES_FROM = 3  # the first version whose tables are drawn by `specval.stats.variates`
MAX_PACKED = 1 << 16  # base**k of one field of `uniform_digits`, at most (its digit table's rows)
CHUNK_WORDS = 1 << 22  # words (32 MiB) drawn at once, at most
MAX_INTEGER_RANGE = 2**32  # `integers` draws from one 32-bit half-word per candidate
LOW_BITS = np.uint64(0xFFFFFFFF)
Size = int | Sequence[int] | None


def _shape(size: Size) -> tuple[int, ...]:
    if size is None:
        return ()
    return (int(size),) if np.ndim(size) == 0 else tuple(int(s) for s in size)


class Stream:
    """The project's generator of null draws for one 128-bit key (see the module docstring); it
    offers the `numpy.random.Generator` methods the null samplers of specval.stats call."""

    def __init__(self, key: int, version: int = VERSIONS[STREAM_NAME]):
        if not 0 <= key < 2**128:
            raise ValueError(f"key must be a 128-bit unsigned integer, got {key!r}")
        if version not in VERSIONS.values():
            raise ValueError(f"stream version must be one of {sorted(VERSIONS.values())}, got {version!r}")
        self.key = key
        self.version = version
        self._bits = np.random.Philox(key=key)
        self._kept = np.zeros(0, dtype=np.uint64)  # words drawn ahead by `uniform_digits`, not yet consumed

    def raw(self, n: int) -> np.ndarray:
        """The next n raw words: uint64[n]."""
        n = int(n)
        if n <= 0:
            return np.zeros(0, dtype=np.uint64)
        if not self._kept.size:
            return self._bits.random_raw(n)
        head, self._kept = self._kept[:n], self._kept[n:]
        return head if head.size == n else np.concatenate([head, self._bits.random_raw(n - head.size)])

    def _keep(self, words: np.ndarray) -> None:
        """Give back words drawn ahead: the next `raw` returns them first."""
        self._kept = np.concatenate([words, self._kept]) if self._kept.size else words.copy()

    def random(self, size: Size = None) -> np.ndarray | float:
        """Uniforms in [0, 1): float64 of shape `size` (a float when None)."""
        shape = _shape(size)
        words = self.raw(math.prod(shape))
        values = (words >> np.uint64(UNIT_SHIFT)).astype(np.float64) * UNIT_SCALE
        return float(values[0]) if size is None else values.reshape(shape)

    def integers(self, low: int, high: int | None = None, size: Size = None) -> np.ndarray | int:
        """Uniform integers in [low, high) ([0, low) when high is None): int64 of shape `size`."""
        low, high = (0, int(low)) if high is None else (int(low), int(high))
        span = high - low
        if not 0 < span <= MAX_INTEGER_RANGE:
            raise ValueError(f"integers: high - low must lie in [1, 2**32], got {span}")
        shape = _shape(size)
        count = math.prod(shape)
        threshold = np.uint64((MAX_INTEGER_RANGE - span) % span)
        out, done = np.empty(count, dtype=np.int64), 0
        while done < count:  # each round draws exactly the words still needed: no word is left over
            product = (self.raw(min(count - done, CHUNK_WORDS)) >> np.uint64(32)) * np.uint64(span)
            accepted = (product >> np.uint64(32))[(product & LOW_BITS) >= threshold]
            out[done : done + accepted.size] = accepted.astype(np.int64) + low
            done += accepted.size
        return int(out[0]) if size is None else out.reshape(shape)

    def multinomial(self, n, pvals, size: Size = None) -> np.ndarray:
        """Counts of n categorical draws over pvals: int64 of shape broadcast(size, shape of n) +
        (len(pvals),); cells draw in C order."""
        pvals = np.asarray(pvals, dtype=np.float64)
        if pvals.ndim != 1 or pvals.size == 0 or not (pvals >= 0).all() or not pvals.sum() > 0:
            raise ValueError("multinomial: pvals must be a non-empty 1-d array of weights >= 0, not all 0")
        trials = np.asarray(n, dtype=np.int64)
        shape = _shape(size) if size is not None else trials.shape
        trials = np.broadcast_to(trials, shape).reshape(-1)
        if (trials < 0).any():
            raise ValueError("multinomial: n must be >= 0")
        if self.version >= TREE_TABLES_FROM:
            return variates.multinomial_table(self.raw, trials, pvals).reshape(shape + (pvals.size,))
        cdf = np.cumsum(pvals)
        last = int(np.flatnonzero(pvals > 0)[-1])
        counts = np.zeros((trials.size, pvals.size), dtype=np.int64)
        for cells in _chunks(trials):
            draws = np.minimum(
                np.searchsorted(cdf, self.random(int(trials[cells].sum())) * cdf[-1], side="right"), last
            )
            owner = np.repeat(np.arange(cells.start, cells.stop), trials[cells])
            flat = np.bincount((owner - cells.start) * pvals.size + draws, minlength=len(trials[cells]) * pvals.size)
            counts[cells] = flat.reshape(-1, pvals.size)
        return counts.reshape(shape + (pvals.size,))

    def multivariate_hypergeometric(
        self, colors, nsample: int, size: Size = None, method: str | None = None
    ) -> np.ndarray:
        """Counts per color of `nsample` items drawn without replacement: int64 of shape size +
        (len(colors),). `method` is accepted for numpy's signature and ignored: one rule here."""
        colors = np.asarray(colors, dtype=np.int64)
        total, nsample = int(colors.sum()), int(nsample)
        if (colors < 0).any() or not 0 <= nsample <= total:
            raise ValueError(f"multivariate_hypergeometric: need colors >= 0 and 0 <= nsample <= {total}")
        shape = _shape(size)
        rows = math.prod(shape)
        if self.version >= TREE_TABLES_FROM:
            return variates.hypergeometric_table(self.raw, colors, nsample, rows).reshape(shape + (colors.size,))
        ends = np.cumsum(colors)
        counts = np.empty((rows, colors.size), dtype=np.int64)
        per_chunk = max(1, CHUNK_WORDS // max(total, 1))
        for start in range(0, rows, per_chunk):
            stop = min(rows, start + per_chunk)
            chosen = _smallest(self.raw((stop - start) * total).reshape(stop - start, total), nsample)
            taken = np.concatenate([np.zeros((stop - start, 1), dtype=np.int64), np.cumsum(chosen, axis=1)], axis=1)
            counts[start:stop] = np.diff(taken[:, np.r_[0, ends]], axis=1)
        return counts.reshape(shape + (colors.size,))

    def uniform_digits(self, base: int, size: Size) -> np.ndarray:
        """Values uniform on [0, base), packed k to a field of a word (module docstring): uint8 of
        shape `size`, whose last axis is a row (each row starts at a fresh word). Version 2 only."""
        shape = _shape(size)
        if not shape:
            raise ValueError("uniform_digits: size must have at least one axis (a row)")
        rows, width = math.prod(shape[:-1]), shape[-1]
        out = np.empty((rows, width), dtype=np.uint8)
        for start, stop, fields, table in self._field_rows(base, rows, width):
            out[start:stop] = np.take(table, fields, axis=0).reshape(stop - start, -1)[:, :width]
        return out.reshape(shape)

    def uniform_digit_counts(self, base: int, sizes, rows: int) -> np.ndarray:
        """int64[rows, G, base]: per row of uniform_digits(base, (rows, sum(sizes))), the count of
        each value among segment g's digits (the next sizes[g] digits of the row): the same draws,
        counted a field (k digits) at a time where a field lies inside one segment. Version 2 only."""
        sizes = np.asarray(sizes, dtype=np.int64)
        if sizes.ndim != 1 or (sizes < 0).any():
            raise ValueError("uniform_digit_counts: sizes must be a 1-d array of counts >= 0")
        width = int(sizes.sum())
        digits = _packing(base)[0]
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        full = []  # per segment: its fields [a, b) whose k digits all lie inside it
        for g in range(sizes.size):
            a, b = -(-int(bounds[g]) // digits), int(bounds[g + 1]) // digits
            full.append((a, max(a, b)))
        covered = np.zeros(width, dtype=bool)
        for a, b in full:
            covered[a * digits : b * digits] = True
        loose = np.flatnonzero(~covered)  # digits of fields that straddle a segment's edge or the end
        loose_segment = np.searchsorted(bounds, loose, side="right") - 1
        counts = np.zeros((rows, sizes.size, base), dtype=np.int64)
        for start, stop, fields, table in self._field_rows(base, rows, width):
            part = counts[start:stop]
            values = table.shape[0]
            offsets = (np.arange(stop - start, dtype=np.int64) * values)[:, None]
            for g, (a, b) in enumerate(full):
                if b > a:
                    histogram = np.bincount((fields[:, a:b] + offsets).reshape(-1), minlength=(stop - start) * values)
                    part[:, g] += _digit_marginals(histogram.reshape(stop - start, values), base)
            if loose.size:
                loose_digits = table[fields[:, loose // digits], loose % digits].astype(np.int64)
                codes = (np.arange(stop - start)[:, None] * sizes.size + loose_segment) * base + loose_digits
                part += np.bincount(codes.reshape(-1), minlength=part.size).reshape(part.shape)
        return counts

    def _field_rows(self, base: int, rows: int, width: int):
        """Yield (start, stop, fields uint16[stop - start, need], table) over chunks of rows: each row's
        `need` = ceil(width / k) accepted fields, words consumed row after row (a row starts at a
        fresh word), the words past the last row kept for the next call."""
        if self.version < 2:
            raise ValueError(
                f"uniform_digits is a transform of stream version 2, this stream is version {self.version}"
            )
        digits, bits, table = _packing(int(base))
        need = -(-width // digits)
        if rows == 0 or need == 0:
            if rows:
                yield 0, rows, np.zeros((rows, 0), dtype=np.uint16), table
            return
        per_word = (64 // bits) * (table.shape[0] / 2.0**bits)  # expected accepted fields per word
        rows_per_chunk = max(1, int(CHUNK_WORDS * per_word) // need)
        for start in range(0, rows, rows_per_chunk):
            stop = min(rows, start + rows_per_chunk)
            yield start, stop, self._fields_of_rows(stop - start, need, bits, table.shape[0]), table

    def _fields_of_rows(self, rows: int, need: int, bits: int, values: int) -> np.ndarray:
        per = 64 // bits
        expected = rows * need / (per * values / 2.0**bits)
        words = self.raw(int(expected + 6 * math.sqrt(expected) + rows + 16))
        while True:
            fields = _fields(words, bits, per)  # uint16[words, per]
            accepted = fields < values
            rejected = np.bincount(np.flatnonzero(~accepted.reshape(-1)) // per, minlength=words.size)
            ends = np.cumsum(per - rejected)  # accepted fields in words[:i + 1]
            first, last_word = np.empty(rows, dtype=np.int64), np.empty(rows, dtype=np.int64)
            taken, last = 0, -1
            for row in range(rows):  # row r ends at the first word holding its need-th field
                first[row] = taken
                last = int(np.searchsorted(ends, taken + need, side="left"))
                if last >= words.size:
                    break
                last_word[row], taken = last, int(ends[last])
            else:
                self._keep(words[last + 1 :])
                used = accepted[: last + 1].copy()
                before = np.where(last_word > 0, ends[last_word - 1], 0)  # accepted before each row's last word
                keep = need - (before - first)  # of its last word's accepted fields, the first `keep`
                rank = np.cumsum(accepted[last_word], axis=1)
                used[last_word] &= rank <= keep[:, None]
                return fields[: last + 1][used].reshape(rows, need)
            words = np.concatenate([words, self.raw(max(words.size // 4, 64))])


def _digit_marginals(histogram: np.ndarray, base: int) -> np.ndarray:
    """int64[R, base]: counts of each digit value over the k digits of the fields counted in
    histogram[R, base**k]: histogram @ (digit counts of each field), in float64, whose sums of
    integers below 2**53 are exact in any order (so BLAS's order does not matter)."""
    per_field = _PER_FIELD.get(base)
    if per_field is None:
        table = _packing(base)[2]
        per_field = np.zeros((table.shape[0], base))
        for position in range(table.shape[1]):
            per_field[np.arange(table.shape[0]), table[:, position]] += 1.0
        _PER_FIELD[base] = per_field
    return (histogram.astype(np.float64) @ per_field).astype(np.int64)


_PER_FIELD: dict[int, np.ndarray] = {}


def _packing(base: int) -> tuple[int, int, np.ndarray]:
    """(digits per field k, field bits b, table uint8[base**k, k]) of `uniform_digits`."""
    if not 2 <= base <= 256:
        raise ValueError(f"uniform_digits: base must lie in [2, 256], got {base}")
    return _PACKINGS.get(base) or _PACKINGS.setdefault(base, _make_packing(base))


def _make_packing(base: int) -> tuple[int, int, np.ndarray]:
    best = None
    for digits in range(1, 17):
        values = base**digits
        if values > MAX_PACKED:
            break
        bits = (values - 1).bit_length()
        rate = digits * (64 // bits) * values / 2**bits
        if best is None or rate > best[0]:
            best = (rate, digits, bits)
    _, digits, bits = best
    values = np.arange(base**digits)
    table = np.stack([(values // base ** (digits - 1 - i)) % base for i in range(digits)], axis=1)
    return digits, bits, table.astype(np.uint8)


_PACKINGS: dict[int, tuple[int, int, np.ndarray]] = {}


def _fields(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """uint16[len(words), count]: field j of each word, (w >> (bits j)) & (2**bits - 1) (bits <= 16)."""
    shifts = np.arange(count, dtype=np.uint64) * np.uint64(bits)
    return ((words[:, None] >> shifts) & np.uint64((1 << bits) - 1)).astype(np.uint16)


def _chunks(trials: np.ndarray):
    """Consecutive slices of cells whose trials add up to at most CHUNK_WORDS (a larger cell alone)."""
    start, ends = 0, np.cumsum(trials)
    while start < trials.size:
        base = ends[start - 1] if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, base + CHUNK_WORDS, side="right")))
        yield slice(start, stop)
        start = stop


def _smallest(keys: np.ndarray, count: int) -> np.ndarray:
    """bool[rows, items]: per row, the `count` smallest keys, ties at the cut in item order."""
    if count == 0:
        return np.zeros(keys.shape, dtype=bool)
    cut = np.partition(keys, count - 1, axis=1)[:, count - 1 : count]  # the count-th smallest value: unique
    below, at = keys < cut, keys == cut
    room = count - below.sum(axis=1, keepdims=True)
    return below | (at & (np.cumsum(at, axis=1) <= room))
