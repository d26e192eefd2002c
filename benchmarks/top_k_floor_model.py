"""How many candidates a top-k row keeps at its top-k floor, by a numpy model of the kernel (no
GPU): the chunk kernel's quick floors (mean + z std of each chunk, z aimed at CAPACITY / 4 of
CHUNK tokens) and, per row, `_top_k_floor` (the lowest of the 32 pivot levels at which the
chunk maxima and stored counts prove k tokens, then `top_k_floor_steps` halvings of the gap to
the level above, keeping the highest midpoint they prove). It prints, over ROWS rows of
i.i.d. normal logits, the candidates at or above the largest chunk floor alone and at or above
the raised floor (at its level and refined), how many rows exceed the tiny block, and how many
chunks have a max at or above the raised floor (the chunks `chunk_list` compacts, against all
of them without it). The model computes in float64 on the chunks' float32 values, so a token
within rounding of a floor may count differently from the kernel; it estimates the sizes, it
does not check the kernel (the tests do).

Usage, from the repository root:
    python3 -m benchmarks.top_k_floor_model [--k 50] [--rows 200] [--vocab 152064]
"""

from __future__ import annotations

import argparse
from statistics import NormalDist

import numpy as np

from engine.sampling.kernels.probabilities.config import DEFAULT_CONFIG, LEVEL_ZERO, QUICK_FLOOR_SHARE

SCALE = 5 / 0.8  # benchmarks.sampling's N(0, 5^2) logits at temperature 0.8
NUM_LEVELS = 32


def chunk_statistics(x: np.ndarray, chunk: int, z: float):
    """(maxima, floors, stored counts, finite means) of the row's chunks, as the chunk kernel."""
    padded = np.full(-(-x.size // chunk) * chunk, -np.inf, np.float32)
    padded[: x.size] = x
    chunks = padded.reshape(-1, chunk)
    finite = np.isfinite(chunks)
    n = finite.sum(1)
    maxima = chunks.max(1)
    d = np.where(finite, maxima[:, None] - chunks, 0.0)
    mean_d = d.sum(1) / n
    std_d = np.sqrt(np.maximum((d * d).sum(1) / n - mean_d**2, 0.0))
    floors = maxima - np.maximum(mean_d - z * std_d, 0.0)
    return maxima, floors, (chunks >= floors[:, None]).sum(1), maxima - mean_d


def top_k_floor(maxima, floors, counts, spread, m, k, steps) -> tuple[float, float]:
    """(level floor, refined floor): the pivot of the lowest level the chunks prove k tokens
    at (-inf if none does), and that raised by `steps` halvings of the gap to the level above
    to the highest midpoint they prove."""

    def pivot(level):
        return m if level == 0 else m - spread * 2 ** ((level - LEVEL_ZERO.value) / 4)

    def proves(v):
        return np.maximum(maxima >= v, np.where(floors >= v, counts, 0)).sum() >= k

    for level in range(NUM_LEVELS):
        if proves(pivot(level)):
            lo, hi = pivot(level), pivot(level - 1) if level > 0 else None
            for _ in range(steps if hi is not None else 0):
                mid = lo / 2 + hi / 2
                lo, hi = (mid, hi) if proves(mid) else (lo, mid)
            return pivot(level), lo
    return -np.inf, -np.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=50)
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--vocab", type=int, default=152064)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    config = DEFAULT_CONFIG
    chunk = config.chunk_size(args.vocab)
    z = NormalDist().inv_cdf(1 - config.chunk_capacity / (QUICK_FLOOR_SHARE * chunk))
    rng = np.random.default_rng(args.seed)
    steps = config.top_k_floor_steps
    at_f, at_level, at_floor, hot_level, hot = [], [], [], [], []
    for _ in range(args.rows):
        x = (rng.standard_normal(args.vocab) * SCALE).astype(np.float32)
        maxima, floors, counts, means = chunk_statistics(x, chunk, z)
        m = maxima.max()
        f = floors.max()
        level, v = top_k_floor(maxima, floors, counts, m - means.mean(), m, args.k, steps)
        at_f.append(int((x >= f).sum()))
        at_level.append(int((x >= max(f, level)).sum()))
        at_floor.append(int((x >= max(f, v)).sum()))
        hot_level.append(int((maxima >= max(f, level)).sum()))
        hot.append(int((maxima >= max(f, v)).sum()))
    for name, counts in (
        ("candidates at or above the largest chunk floor", at_f),
        ("candidates at or above the top-k floor at its level", at_level),
        (f"candidates at or above the top-k floor, {steps} halvings", at_floor),
        (f"chunks (of {maxima.size}) whose max reaches the top-k floor at its level", hot_level),
        (f"chunks (of {maxima.size}) whose max reaches the top-k floor, {steps} halvings", hot),
    ):
        q = np.percentile(counts, [0, 50, 90, 100])
        print(f"{name}: min {q[0]:.0f}, median {q[1]:.0f}, 90% {q[2]:.0f}, max {q[3]:.0f}")
    print(
        f"rows above tiny_compact ({config.tiny_compact}): "
        f"{sum(c > config.tiny_compact for c in at_floor)} of {args.rows}"
    )


if __name__ == "__main__":
    main()
