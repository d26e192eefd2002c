"""Cold and warm start of one protocol run: where a fresh machine's first run spends its time.

    python3 -m benchmarks.cold_start protocols/t2_cuda_tv010.yaml [--profile full] [--runs 2]
        [--output results/cold_start]

Runs `specval run PROTOCOL --profile P --quiet` `--runs` times, each in a fresh process and into
its own output folder, one after the other. The first run gets an empty Triton cache
(`TRITON_CACHE_DIR` under the output folder), as on a fresh machine; the later runs reuse it, as a
warm machine does (other caches of the machine, e.g. the CUDA driver's, are not reset). Prints one
row per run (exit status, verdict, process wall, and the manifest's `wall_s`, `setup_s`,
`collect_s` with samples/s, `analysis_s`, `report_s` and `kernel_compile`), then the kernels the
first run compiled, by name, each with the second at which its cache entry was written (counted
from the first), which shows the order of the compiles and the gaps between them. Writes
`<output>/cold_start.json`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GROUP_FILE_PREFIX = "__grp__"  # Triton's per-kernel index files, not kernels
HEADER = (
    "| run | exit | verdict | process wall (s) | wall_s | setup_s | collect_s (samples/s) | analysis_s | "
    "report_s | kernels built (s) / loaded (s) |\n| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | "
    "---: | --- |"
)


def run_once(protocol: Path, profile: str, output: Path, cache: Path) -> dict:
    """One `specval run` in a fresh process: exit status, verdict line, process wall, manifest."""
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache)}
    command = [
        sys.executable,
        "-m",
        "specval",
        "run",
        str(protocol),
        "--profile",
        profile,
        "--output",
        str(output),
        "--quiet",
    ]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() if line.split(":")[0] in ("PASS", "FAIL", "INCONCLUSIVE")]
    manifests = sorted(output.glob("*/manifest.json"))
    manifest = json.loads(manifests[-1].read_text()) if manifests else {}
    return {
        "exit": done.returncode,
        "verdict": lines[-1] if lines else done.stderr.strip()[-200:],
        "process_wall_s": wall,
        "manifest": manifest,
    }


def compiled_kernels(cache: Path) -> list[tuple[float, str]]:
    """(seconds after the first, kernel name) of every kernel in a Triton cache, in order."""
    found = []
    for path in cache.glob("*/*.json"):
        if path.name.startswith(GROUP_FILE_PREFIX):
            continue
        try:
            name = json.loads(path.read_text()).get("name", "?")
        except (OSError, ValueError):
            continue
        found.append((path.stat().st_mtime, name))
    found.sort()
    return [(when - found[0][0], name) for when, name in found]


def row(index: int, result: dict) -> str:
    m = result["manifest"]

    def seconds(key: str) -> str:
        return f"{m[key]:.1f}" if isinstance(m.get(key), (int, float)) else "-"

    rate = f" ({m['samples_per_s']:,.0f})" if m.get("samples_per_s") else ""
    compiled = m.get("kernel_compile")
    kernels = (
        f"{compiled['compiled']} ({compiled['compile_s']:.1f}) / {compiled['loaded']} ({compiled['load_s']:.2f})"
        if compiled
        else "not reported"
    )
    return (
        f"| {'cold' if index == 0 else f'warm {index}'} | {result['exit']} | {result['verdict'][:60]} | "
        f"{result['process_wall_s']:.1f} | {seconds('wall_s')} | {seconds('setup_s')} | "
        f"{seconds('collect_s')}{rate} | {seconds('analysis_s')} | {seconds('report_s')} | {kernels} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("protocol", type=Path)
    parser.add_argument("--profile", default="full")
    parser.add_argument("--runs", type=int, default=2, help="the first cold, the others warm")
    parser.add_argument("--output", type=Path, default=REPO / "results" / "cold_start")
    args = parser.parse_args()
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: at least 1 (the cold run)")
    root = args.output / time.strftime("%Y%m%dT%H%M%S")
    cache = root / "triton_cache"
    cache.mkdir(parents=True)
    print(HEADER, flush=True)
    results = []
    for index in range(args.runs):
        results.append(run_once(args.protocol.resolve(), args.profile, root / f"run{index}", cache))
        print(row(index, results[-1]), flush=True)
        if index == 0:
            kernels = compiled_kernels(cache)
    print(
        f"\nkernels compiled by the cold run: {len(kernels)}; by name: "
        + ", ".join(f"{name} x{count}" for name, count in Counter(n for _, n in kernels).most_common())
    )
    for when, name in kernels:
        print(f"  {when:7.2f} s  {name}")
    summary = {
        "protocol": str(args.protocol),
        "profile": args.profile,
        "runs": results,
        "cold_kernels": [{"after_s": when, "name": name} for when, name in kernels],
    }
    (root / "cold_start.json").write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
