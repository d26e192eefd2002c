"""A/A calibration of the sequence kind's verdict: family false-fail rate on an exact sampler.

Each replicate draws one speculative group (exact K-draft speculative sampling on a Markov chain,
`tests/fixtures/spec_chain.py`) in the sequence protocol's layout (batches of `--batch` requests,
batch b after prompt b mod 2, independent request streams), builds the reference parts from the
chain's exact laws (`specval.sequence.reference.sequence_parts`) and evaluates every criterion of
the group with `specval.sequence.verdict.evaluate` (pit, serial, independence; Holm at alpha over
the 9 p-valued criteria). Prints the family FAIL count, its rate and the Clopper-Pearson 95%
interval next to alpha, and each criterion's raw rejection count at its Holm first step.

    python -m benchmarks.sequence_calibration --replicates 10000 --workers 2
"""

from __future__ import annotations

import argparse
from concurrent.futures import ProcessPoolExecutor

import numpy as np

from specval.semantics import DEFAULT_SEMANTICS
from specval.sequence import reference, verdict
from specval.sequence.protocol import parse_sequence_protocol
from specval.stats.rates import rate_ci
from tests.fixtures import spec_chain

PROMPTS = 2


def _protocol(sequences: int, length: int, batch: int, k: int):
    return parse_sequence_protocol(
        {
            "kind": "sequence",
            "name": "calibration",
            "prompts": ["a", "b"],
            "sampling": {"temperature": 1.0},
            "num_speculative_tokens": k,
            "sequence_length": length,
            "groups": [{"name": "sync", "mode": "sync"}],
            "sequences_per_group": sequences,
            "batch_size": batch,
            "tests": [
                {"kind": "pit", "role": "primary"},
                {"kind": "serial", "role": "primary"},
                {"kind": "independence", "role": "primary"},
            ],
        },
        "<calibration>",
    )


def replicate(args: tuple) -> dict[str, str]:
    index, sequences, length, batch, k = args
    protocol = _protocol(sequences, length, batch, k)
    chain = spec_chain.make_chain(24, seed=7)
    rng = np.random.default_rng([20261205, index])
    rows = np.arange(sequences)
    starts = (rows // batch) % PROMPTS
    run = spec_chain.sample(chain, sequences, length, rng, k=k, starts=starts)
    sources = np.where(run.position == k + 1, "bonus", "accepted").astype(object)
    last = np.ones(run.position.shape, dtype=bool)
    last[:, :-1] = run.round_index[:, 1:] != run.round_index[:, :-1]
    sources = np.where(last & (run.position <= k), "correction", sources)
    logits = np.log(chain.target[run.prev])
    parts = [reference.sequence_parts(logits[r], run.tokens[r], protocol, DEFAULT_SEMANTICS) for r in rows]
    data = verdict.GroupSequences(
        tokens=run.tokens,
        sources=sources,
        batch=rows // batch,
        slot=rows % batch,
        parts={name: np.stack([p[name] for p in parts]) for name in reference.PART_COLUMNS},
        rerun_tokens=run.tokens[:1],
        rerun_expected=run.tokens[:1],
    )
    decided = verdict.evaluate(protocol, {"sync": data}, {"sync": (index * sequences, (index + 1) * sequences)})
    return {name: test["verdict"] for name, test in decided["tests"].items() if test["p_value"] is not None} | {
        "__run__": decided["verdict"]
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=10_000)
    parser.add_argument("--sequences", type=int, default=40)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("-k", type=int, default=3)
    parser.add_argument("--workers", type=int, default=1)
    args = parser.parse_args()
    jobs = [(i, args.sequences, args.length, args.batch, args.k) for i in range(args.replicates)]
    with ProcessPoolExecutor(args.workers) as pool:
        results = list(pool.map(replicate, jobs, chunksize=50))
    fails = sum(r["__run__"] == "FAIL" for r in results)
    low, high = rate_ci(fails, len(results), 0.05)
    print(
        f"replicates {len(results)}: family FAIL {fails} ({fails / len(results):.4f}), CP 95% [{low:.4f}, "
        f"{high:.4f}] vs alpha 0.01"
    )
    for name in sorted(k for k in results[0] if k != "__run__"):
        print(f"  {name}: FAIL {sum(r[name] == 'FAIL' for r in results)}")


if __name__ == "__main__":
    main()
