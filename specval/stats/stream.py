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
Scaling: one word per uniform, per candidate integer, per multinomial trial and per hypergeometric
item: O(n) per multinomial cell (numpy's own is O(categories)); work is split into chunks of at
most CHUNK_WORDS words, so memory stays bounded whatever the size.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

STREAM_NAME = "philox4x64-10/specval-1"  # recorded in a summary's `monte_carlo_stream`
CHUNK_WORDS = 1 << 22  # words (32 MiB) drawn at once, at most
UNIT_SHIFT = 11  # 64 - 53: the top 53 bits of a word make a float64 uniform
UNIT_SCALE = 2.0**-53
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

    def __init__(self, key: int):
        if not 0 <= key < 2**128:
            raise ValueError(f"key must be a 128-bit unsigned integer, got {key!r}")
        self.key = key
        self._bits = np.random.Philox(key=key)

    def raw(self, n: int) -> np.ndarray:
        """The next n raw words: uint64[n]."""
        return self._bits.random_raw(int(n)) if n > 0 else np.zeros(0, dtype=np.uint64)

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
            out[done:done + accepted.size] = accepted.astype(np.int64) + low
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
        cdf = np.cumsum(pvals)
        last = int(np.flatnonzero(pvals > 0)[-1])
        counts = np.zeros((trials.size, pvals.size), dtype=np.int64)
        for cells in _chunks(trials):
            draws = np.minimum(np.searchsorted(cdf, self.random(int(trials[cells].sum())) * cdf[-1], side="right"),
                               last)
            owner = np.repeat(np.arange(cells.start, cells.stop), trials[cells])
            flat = np.bincount((owner - cells.start) * pvals.size + draws, minlength=len(trials[cells]) * pvals.size)
            counts[cells] = flat.reshape(-1, pvals.size)
        return counts.reshape(shape + (pvals.size,))

    def multivariate_hypergeometric(self, colors, nsample: int, size: Size = None, method: str | None = None
                                    ) -> np.ndarray:
        """Counts per color of `nsample` items drawn without replacement: int64 of shape size +
        (len(colors),). `method` is accepted for numpy's signature and ignored: one rule here."""
        colors = np.asarray(colors, dtype=np.int64)
        total, nsample = int(colors.sum()), int(nsample)
        if (colors < 0).any() or not 0 <= nsample <= total:
            raise ValueError(f"multivariate_hypergeometric: need colors >= 0 and 0 <= nsample <= {total}")
        shape = _shape(size)
        rows = math.prod(shape)
        ends = np.cumsum(colors)
        counts = np.empty((rows, colors.size), dtype=np.int64)
        per_chunk = max(1, CHUNK_WORDS // max(total, 1))
        for start in range(0, rows, per_chunk):
            stop = min(rows, start + per_chunk)
            chosen = _smallest(self.raw((stop - start) * total).reshape(stop - start, total), nsample)
            taken = np.concatenate([np.zeros((stop - start, 1), dtype=np.int64), np.cumsum(chosen, axis=1)], axis=1)
            counts[start:stop] = np.diff(taken[:, np.r_[0, ends]], axis=1)
        return counts.reshape(shape + (colors.size,))


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
    cut = np.partition(keys, count - 1, axis=1)[:, count - 1:count]  # the count-th smallest value: unique
    below, at = keys < cut, keys == cut
    room = count - below.sum(axis=1, keepdims=True)
    return below | (at & (np.cumsum(at, axis=1) <= room))
