"""Seconds to decide a kill table's sequence bundles under each criteria version.

`specval mutate protocols/seq_fp32.yaml --profile smoke` writes one bundle per mutant; its seconds to
kill are collection, replay and the analysis under the current criteria rules. This script reads
those bundles back and times the analysis alone (`specval.sequence.runner.summarise`, what
`specval verify` recomputes) under each rules version asked for, so a kill table can show the
seconds "without the new rules" beside the measured ones: the first rules draw every rejected
criterion's Monte Carlo null to its cap (B = 30 / level), the later ones stop a clear rejection
early (`stats.montecarlo.EARLY_REJECTION`). The samples are the bundle's, so the verdicts compare
like for like.

    OMP_NUM_THREADS=1 python -m benchmarks.sequence_rules_cost MUTATE_ROOT [--rules 1 --rules 3]

Prints one markdown row per bundle: the mutant, the tokens, and per rules version the verdict and
the analysis seconds (wall).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from specval import bundle as bundles
from specval.sequence import runner, verdict


def sequence_bundles(root: Path) -> list[Path]:
    """Every sealed sequence bundle under `root` (a mutate root: <mutant>/<bundle>/)."""
    out = []
    for summary in sorted(root.rglob(bundles.SUMMARY_FILE)):
        if bundles.read_json(summary).get("kind") == "sequence":
            out.append(summary.parent)
    return out


def timed(path: Path, rules: int) -> tuple[str, float, int]:
    """(verdict, analysis wall seconds, tokens) of `path` recomputed under `rules`."""
    protocol, ranges = runner.load_bundle_protocol(path)
    start = time.perf_counter()
    summary = runner.summarise(path, protocol, ranges, rules=rules)
    tokens = sum(group["tokens"] for group in summary["groups"].values())
    return summary["verdict"], time.perf_counter() - start, tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", type=Path)
    parser.add_argument("--rules", type=int, action="append", choices=verdict.RULES)
    args = parser.parse_args()
    versions = args.rules or [verdict.FIRST_RULES, verdict.CURRENT_RULES]
    cells = " | ".join(f"rules {r}: verdict | rules {r}: analysis (s)" for r in versions)
    print(f"| mutant | tokens | {cells} |")
    print("| --- | ---: |" + " --- | ---: |" * len(versions))
    for path in sequence_bundles(args.root):
        results = [timed(path, r) for r in versions]
        row = " | ".join(f"{v} | {s:.1f}" for v, s, _ in results)
        print(f"| {path.parent.name} | {results[0][2]:,} | {row} |", flush=True)


if __name__ == "__main__":
    main()
