"""Time the Monte Carlo null tables of the stratified tests: stream version 2 (one word per trial
or item) against version 3 (conditional variates down a tree of the cells, specval.stats.variates).

    python -m benchmarks.null_tables [--rows 256] [--repeats 3]

Prints one markdown row per table shape: the median wall milliseconds of one call drawing `rows`
tables (multinomial: n trials over C cells of random probabilities; hypergeometric: C colors of
n / C items each, half of them sampled), per version, and their ratio. Single-threaded numpy.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from specval.stats.stream import Stream

SHAPES = [(200, 5), (5_000, 20), (30_000, 20), (262_144, 20), (262_144, 200)]  # (n, cells)


def _median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def _row(kind: str, n: int, cells: int, rows: int, repeats: int) -> str:
    pvals = np.random.default_rng(cells).dirichlet(np.ones(cells))
    colors = np.full(cells, n // cells, dtype=np.int64)
    ms = {}
    for version in (2, 3):
        stream = Stream(version, version=version)
        if kind == "multinomial":
            ms[version] = _median_ms(lambda stream=stream: stream.multinomial(n, pvals, size=rows), repeats)
        else:
            ms[version] = _median_ms(
                lambda stream=stream: stream.multivariate_hypergeometric(colors, int(colors.sum()) // 2, size=rows),
                repeats,
            )
    return f"| {kind} | {n:,} | {cells} | {ms[2]:,.1f} | {ms[3]:,.1f} | {ms[2] / ms[3]:,.1f}x |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=256, help="tables per call (a null batch)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"{args.rows} tables per call, median of {args.repeats} calls, ms")
    print("| table | n | cells | version 2 | version 3 | ratio |")
    print("|---|---:|---:|---:|---:|---:|")
    for kind in ("multinomial", "hypergeometric"):
        for n, cells in SHAPES:
            print(_row(kind, n, cells, args.rows, args.repeats), flush=True)


if __name__ == "__main__":
    main()
