"""Benchmark of the sequence statistics' Monte Carlo nulls on REJECTED criteria (the cost of a FAIL).

A rejected criterion draws its full budget, B = ceil(30 / level) null statistics
(`specval.stats.montecarlo`), so its time is B times the cost of one null statistic of N tokens.
Each row runs one criterion on a clearly deviating input (every null statistic stays below the
observed one, p = 1 / (B + 1)) at the level that makes B = --draws, three ways:

- before: the null samplers as they were before stream version 2 (stream version 1's
  `multinomial` and `integers`, pair tables by a bincount of gathered pair codes), restated here;
- v1 now: the criterion's function on stream version 1 (the same draws and p-values as before,
  tables counted on bit planes), what `specval verify` of a version-1 bundle runs;
- after: the criterion's function on the current stream (version 2: packed digits).

The p-values of "before" and "v1 now" are checked equal (the same draws); every time is one run,
in seconds, wall clock, single-threaded numpy (set OMP_NUM_THREADS=1).

Usage, from the repository root: python -m benchmarks.sequence_nulls [--draws B] [--sizes N ...]
"""

from __future__ import annotations

import argparse
import functools
import time

import numpy as np

from specval.stats import montecarlo
from specval.stats.independence import STATISTICS, pit_association
from specval.stats.sequence import (
    SERIAL_BINS,
    _lag_starts,
    _uniform_chi2,
    in_chunks,
    independence_chi2,
    pair_tables,
    pit_uniformity,
    serial_dependence,
    to_bins,
)

SEQUENCE_LENGTH = 64  # tokens per sequence of the serial rows (seq_fp32)
MAX_LAG = 4  # K + 1 at K = 3 (seq_fp32)
POSITION_BUCKETS = 16  # pit_position of seq_fp32: 4 round positions x 4 quarters


def _before_pit(u, buckets, level, rng):
    labels = np.zeros(u.size, dtype=np.int64) if buckets is None else buckets
    keys, group = np.unique(labels, return_inverse=True)
    counts = np.bincount(group * 10 + to_bins(u, 10), minlength=keys.size * 10).reshape(keys.size, 10)
    sizes = counts.sum(axis=1)
    uniform = np.full(10, 0.1)

    def draw(gen, size):
        return _uniform_chi2(gen.multinomial(sizes, uniform, size=(size, keys.size)), sizes, 10)

    return montecarlo.sequential_pvalue(float(_uniform_chi2(counts, sizes, 10)), draw, level, rng).p_value


def _before_lag_chi2(bins, starts):
    out = np.zeros((bins.shape[0], len(starts)))
    for column, first in enumerate(starts):
        out[:, column] = independence_chi2(pair_tables(bins[:, first], bins[:, first + column + 1], SERIAL_BINS))
    return out


def _before_serial(sequences, level, rng):
    flat = np.concatenate(sequences)
    starts = _lag_starts(np.array([s.size for s in sequences]), MAX_LAG)
    observed = float(_before_lag_chi2(to_bins(flat, SERIAL_BINS)[None], starts)[0].sum())

    def draw(gen, size):
        return _before_lag_chi2(gen.integers(0, SERIAL_BINS, size=(size, flat.size)), starts).sum(axis=1)

    return montecarlo.sequential_pvalue(observed, in_chunks(draw, flat.size), level, rng).p_value


def _before_association(u_a, u_b, level, rng):
    n = u_a.size
    rho = abs(float(12.0 * ((u_a - 0.5) * (u_b - 0.5)).mean()))
    chi2 = float(
        independence_chi2(pair_tables(to_bins(u_a, SERIAL_BINS)[None], to_bins(u_b, SERIAL_BINS)[None], SERIAL_BINS))[0]
    )

    def draw_rho(gen, size):
        return np.abs(12.0 * ((gen.random((size, n)) - 0.5) * (gen.random((size, n)) - 0.5)).mean(axis=-1))

    def draw_chi2(gen, size):
        bins = gen.integers(0, SERIAL_BINS, size=(2, size, n))
        return independence_chi2(pair_tables(bins[0], bins[1], SERIAL_BINS))

    p_rho = montecarlo.sequential_pvalue(rho, in_chunks(draw_rho, 2 * n), level / STATISTICS, rng).p_value
    p_chi2 = montecarlo.sequential_pvalue(chi2, in_chunks(draw_chi2, 2 * n), level / STATISTICS, rng).p_value
    return min(1.0, STATISTICS * min(p_rho, p_chi2))


def _rows(size: int, level: float):
    """(criterion, before, now(stream)) per criterion: callables returning a p-value."""
    data = np.random.default_rng(size)
    skewed = data.random(size) ** 1.3  # far from uniform: every null X^2 stays below the observed one
    x = data.random(size + 1)
    dependent = 0.7 * x[1:] + 0.3 * x[:-1]  # lag-1 dependence, uniform-ish margins
    sequences = list(dependent.reshape(-1, SEQUENCE_LENGTH))
    buckets = np.arange(size) % POSITION_BUCKETS
    half = size // 2
    rng = montecarlo.criterion_rng
    yield (
        "pit_uniformity, 1 bucket",
        lambda: _before_pit(skewed, None, level, rng("b", "pit", stream=montecarlo.FIRST_STREAM)),
        lambda s: pit_uniformity(skewed, level=level, rng=rng("b", "pit", stream=s)).p_value,
    )
    yield (
        f"pit_uniformity, {POSITION_BUCKETS} buckets",
        lambda: _before_pit(skewed, buckets, level, rng("b", "pos", stream=montecarlo.FIRST_STREAM)),
        lambda s: pit_uniformity(skewed, buckets, level=level, rng=rng("b", "pos", stream=s)).p_value,
    )
    yield (
        f"serial_dependence, lags 1..{MAX_LAG}",
        lambda: _before_serial(sequences, level, rng("b", "serial", stream=montecarlo.FIRST_STREAM)),
        lambda s: serial_dependence(sequences, MAX_LAG, level=level, rng=rng("b", "serial", stream=s)).p_value,
    )
    yield (
        f"pit_association, {half} pairs",
        lambda: _before_association(
            dependent[:half], dependent[1 : half + 1], level, rng("b", "pair", stream=montecarlo.FIRST_STREAM)
        ),
        lambda s: (
            pit_association(
                dependent[:half], dependent[1 : half + 1], level=level, rng=rng("b", "pair", stream=s)
            ).p_value
        ),
    )


def _timed(run):
    start = time.perf_counter()
    value = run()
    return value, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--draws", type=int, default=2000, help="B, the null statistics of a rejected criterion")
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[12_800, 102_400], help="N, tokens per criterion (multiples of 64)"
    )
    args = parser.parse_args(argv)
    level = montecarlo.EXCEEDANCES / args.draws
    assert montecarlo.num_draws(level) == args.draws
    print(f"null draws per rejected criterion: {args.draws} (level {level:.4g}); seconds, one run each")
    print("| criterion | N | draws | before (s) | v1 now (s) | after, v2 (s) | before / after |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for size in args.sizes:
        for name, before, now in _rows(size, level):
            p_before, t_before = _timed(before)
            p_first, t_first = _timed(functools.partial(now, montecarlo.FIRST_STREAM))
            p_after, t_after = _timed(functools.partial(now, montecarlo.CURRENT_STREAM))
            if p_before != p_first:
                raise AssertionError(f"{name}: version 1 p-value changed ({p_before} -> {p_first})")
            print(
                f"| {name} | {size:,} | {args.draws:,} | {t_before:.2f} | {t_first:.2f} | {t_after:.2f} | "
                f"{t_before / t_after:.1f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
