"""Benchmark of the verdict analysis (statistics only, no SUT) at GPU-run size.

Builds a synthetic t2_fp32-shaped run: five groups of N samples (default 160,000), positions 2,
a vocabulary of 152,064 with top-k 20 truncation (so ~20 strata of t1, each with ~20 tokens),
drawn from an exact float64 reference (`specval.distribution.calibrate.exact_counts`), and times
`specval.distribution.verdict.evaluate` (validity criteria, 5 t1 + 5 t2 GOF, 4 homogeneity and 4 by-path
criteria with Monte Carlo p-values, Holm). Rows: the correct sampler, and the same run with one
group's t2 drawn from a perturbed law (its criteria FAIL, which costs the full Monte Carlo budget
of num_draws(level) draws each). Wall times are single runs after one warm-up, in seconds.

Usage, from the repository root: python -m benchmarks.analysis [--samples N] [--vocab V]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd

from specval.distribution.calibrate import exact_counts
from specval.distribution.decision import FAIL
from specval.distribution.reference import Reference, transform
from specval.distribution.verdict import evaluate
from specval.protocol import SamplingSpec, parse_protocol

GROUPS = ("nospec", "sync", "sync_d1", "async", "async_d1")
TOP_K = 20
PERTURBED_GROUP = "sync"


def _protocol(samples: int):
    tests = [
        {"kind": "gof", "position": 1, "role": "control"},
        {"kind": "gof", "position": 2, "role": "control", "groups": ["nospec"]},
        {"kind": "gof", "position": 2, "role": "primary", "groups": list(GROUPS[1:])},
        {"kind": "homogeneity", "position": 2, "role": "primary", "baseline": "nospec"},
        {"kind": "gof", "position": 2, "role": "secondary", "groups": list(GROUPS[1:]), "by_path": True},
    ]
    groups = [
        {
            "name": g,
            "mode": "nospec" if g == "nospec" else g.split("_")[0],
            **({} if g == "nospec" else {"draft_loops": 1 if g.endswith("d1") else 2}),
        }
        for g in GROUPS
    ]
    return parse_protocol(
        {
            "name": "bench_analysis",
            "prompt": "x",
            "sampling": {"temperature": 1.0, "top_k": TOP_K},
            "num_speculative_tokens": 3,
            "positions": 2,
            "groups": groups,
            "samples_per_group": samples,
            "tests": tests,
        }
    )


def _reference(vocab: int, rng: np.random.Generator) -> Reference:
    sampling = SamplingSpec(1.0, TOP_K, 1.0)
    root = transform(rng.standard_normal(vocab) * 2, sampling)
    dists = {(): root}
    for token in np.flatnonzero(root > 0):
        dists[(int(token),)] = transform(rng.standard_normal(vocab) * 2, sampling)
    return Reference(vocab, (0,), dists)


def _frame(reference: Reference, samples: int, rng: np.random.Generator, perturbed: bool) -> pd.DataFrame:
    frames = []
    for g, group in enumerate(GROUPS):
        tree = exact_counts(reference, 2, samples, rng)
        pairs = [
            (prefix[0], token, count)
            for prefix, counts in tree.items()
            if prefix
            for token, count in zip(np.flatnonzero(counts), counts[counts > 0])
        ]
        t1 = np.repeat([p[0] for p in pairs], [p[2] for p in pairs])
        t2 = np.repeat([p[1] for p in pairs], [p[2] for p in pairs])
        if perturbed and group == PERTURBED_GROUP:
            t2 = np.where(rng.random(t2.size) < 0.05, t2.max(), t2)  # 5% of t2 moved to one token
        frames.append(
            pd.DataFrame(
                {
                    "seed": np.arange(samples) + g * samples,
                    "group": group,
                    "t1": t1,
                    "t2": t2,
                    "src1": "plain",
                    "src2": "plain",
                    "num_rounds": 0,
                    "num_draft_tokens": 0,
                    "num_accepted_tokens": 0,
                }
            )
        )
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=160_000)
    parser.add_argument("--vocab", type=int, default=152_064)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    protocol, reference = _protocol(args.samples), _reference(args.vocab, rng)
    ranges = {g: (i * args.samples, (i + 1) * args.samples) for i, g in enumerate(GROUPS)}
    print("| sampler | samples per group | vocab | criteria | FAILed | analysis s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for perturbed in (False, True):
        frame = _frame(reference, args.samples, rng, perturbed)
        evaluate(protocol, frame.iloc[: 10 * len(GROUPS)].copy(), reference, {}, ranges) if not perturbed else None
        start = time.perf_counter()
        summary = evaluate(protocol, frame, reference, {}, ranges)
        elapsed = time.perf_counter() - start
        failed = sum(t["verdict"] == FAIL for t in summary["tests"].values())
        name = f"perturbed {PERTURBED_GROUP} t2" if perturbed else "exact"
        print(f"| {name} | {args.samples} | {args.vocab} | {len(summary['tests'])} | {failed} | {elapsed:.2f} |")


if __name__ == "__main__":
    main()
