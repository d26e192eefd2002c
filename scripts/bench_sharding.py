"""Samples/s of a protocol collected by 1 and by N ranks (specval run --devices N), one table.

Runs PROTOCOL (default protocols/t2_cuda_batched.yaml) with `samples_per_group` set to --samples,
once per rank count in --ranks, each on a fresh output root (so every run gets the same seed
ranges), and prints per run: stage-1 samples drawn, collection seconds, samples/s (the manifest's
`collect_s` and `samples_per_s`), run wall (`wall_s`), process wall, the speed-up of samples/s over
the first row, and whether its sample table equals the first row's (it must: a seed's samples do
not depend on the rank that draws them). The copy of the protocol with the new size is not frozen,
so the runs are --exploratory. Needs as many GPUs as the largest rank count for a CUDA protocol.

Usage, from the repository root:
    python scripts/bench_sharding.py --samples 160000 --ranks 1,2 [--output DIR] [--protocol FILE]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from specval import bundle as bundles  # noqa: E402
from specval import collect, runner  # noqa: E402

DEFAULT_PROTOCOL = REPO / "protocols" / "t2_cuda_batched.yaml"
BUNDLE_PREFIX = "bundle: "


def _sized_copy(protocol: Path, samples: int, directory: Path) -> Path:
    raw = yaml.safe_load(protocol.read_text())
    raw["samples_per_group"] = samples
    copy = directory / protocol.name
    copy.write_text(yaml.safe_dump(raw, sort_keys=False))
    return copy


def _run(protocol: Path, ranks: int, output: Path) -> tuple[Path, float]:
    """One `specval run`; returns its bundle and the process wall time (s)."""
    command = [
        sys.executable,
        "-m",
        "specval",
        "run",
        str(protocol),
        "--exploratory",
        "--quiet",
        "--output",
        str(output),
        "--devices",
        str(ranks),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if done.returncode not in (0, 1):
        sys.exit(f"{' '.join(command)} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    line = next(line for line in done.stdout.splitlines() if line.startswith(BUNDLE_PREFIX))
    return Path(line.removeprefix(BUNDLE_PREFIX).split(" (resume with")[0]), wall


def _samples(bundle: Path) -> pd.DataFrame:
    _, ranges = runner.load_bundle_protocol(bundle)
    return collect.load_samples(bundle, ranges)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--protocol", type=Path, default=DEFAULT_PROTOCOL)
    parser.add_argument("--samples", type=int, default=160_000, help="samples per group")
    parser.add_argument("--ranks", default="1,2", help="comma-separated rank counts, first is the baseline")
    parser.add_argument("--output", type=Path, default=None, help="root of the bundles (default: a temp dir)")
    args = parser.parse_args()
    root = args.output or Path(tempfile.mkdtemp(prefix="bench_sharding-"))
    root.mkdir(parents=True, exist_ok=True)
    protocol = _sized_copy(args.protocol, args.samples, root)
    print(f"{args.protocol.name} at {args.samples} samples per group; bundles under {root}")
    print(
        "| ranks | samples drawn | collect (s) | samples/s | run wall (s) | process wall (s) | speed-up | "
        "samples equal |"
    )
    print("|---|---|---|---|---|---|---|---|")
    first_rate, first_samples = None, None
    for ranks in (int(r) for r in args.ranks.split(",")):
        bundle, wall = _run(protocol, ranks, root / f"ranks{ranks}")
        manifest = bundles.read_json(bundle / bundles.MANIFEST_FILE)
        samples = _samples(bundle)
        rate = manifest["samples_per_s"]
        if first_rate is None:
            first_rate, first_samples = rate, samples
        equal = "yes" if samples.equals(first_samples) else "NO"
        print(
            f"| {ranks} | {manifest['samples_drawn']:,} | {manifest['collect_s']:.1f} | {rate:,.0f} | "
            f"{manifest['wall_s']:.1f} | {wall:.1f} | {rate / first_rate:.2f}x | {equal} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
