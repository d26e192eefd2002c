"""Smoke profiles: verdict and seconds of every shipped CPU protocol's `--profile smoke`.

Each protocol runs as an adapter author would first run it, `specval run <file> --profile smoke`,
in its own process and into its own fresh output root (so each draws a fresh ledger's first seeds),
one after the other. Reported per protocol: the exit status and verdict line, the process wall
seconds (interpreter start, imports, model load, collection, analysis, report) and the manifest's
collection seconds. Protocols whose device is not the CPU are listed as skipped: they are refused
without a GPU. A protocol whose adapter needs a package that is not installed (t2_vllm without the
`[vllm]` extra) exits 2 naming it, and is reported as such.

    python -m benchmarks.smoke_times --output results/smoke_times [--protocol protocols/t2_fp32.yaml ...]

Prints one markdown row per protocol as it finishes and writes `<output>/smoke_times.json`.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parent.parent
SMOKE = "smoke"
HEADER = "| protocol | exit | verdict | process wall (s) | collection (s) |\n| --- | ---: | --- | ---: | ---: |"


def shipped_protocols() -> list[Path]:
    """Every protocol file under protocols/ (suites and performance protocols included)."""
    return sorted(p for p in (REPO / "protocols").rglob("*.yaml"))


def _raw(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def skip_reason(raw: dict) -> str | None:
    """Why the protocol (its parsed YAML) is not run here (None: it is run)."""
    if raw.get("kind") == "suite":
        return "skipped: a suite (its members are rows of their own)"
    device = str((raw.get("sut") or {}).get("device", "cpu"))
    if device != "cpu":
        return f"skipped: device {device}"
    return None if SMOKE in (raw.get("profiles") or {}) else "skipped: no smoke profile"


def run_smoke(path: Path, raw: dict, output: Path) -> dict:
    """`specval run path --profile smoke` into `output/<stem>`: exit status, last verdict line,
    process wall seconds and the bundle manifest's collection seconds (None without a bundle)."""
    root = output / path.stem
    verb = "bench" if raw.get("kind") == "performance" else "run"
    command = [sys.executable, "-m", "specval", verb, str(path), "--profile", SMOKE, "--output", str(root), "--quiet"]
    start = time.perf_counter()
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    wall = time.perf_counter() - start
    lines = [line for line in done.stdout.splitlines() + done.stderr.splitlines() if line.strip()]
    verdicts = [
        line
        for line in lines
        if line.split(":")[0]
        in ("PASS", "FAIL", "INCONCLUSIVE", "EXPLORATORY PASS", "EXPLORATORY FAIL", "EXPLORATORY INCONCLUSIVE")
    ]
    manifests = sorted(root.glob("*/manifest.json"))
    collect = json.loads(manifests[-1].read_text()).get("collect_s") if manifests else None
    verdict = (verdicts or lines or [""])[-1].replace(f"{REPO}/", "")  # paths relative to the repository
    return {
        "protocol": str(path.relative_to(REPO)),
        "exit": done.returncode,
        "verdict": verdict[:100],
        "wall_s": round(wall, 1),
        "collect_s": None if collect is None else round(collect, 1),
    }


def row(result: dict) -> str:
    collect = "-" if result.get("collect_s") is None else f"{result['collect_s']:.1f}"
    wall = "-" if result.get("wall_s") is None else f"{result['wall_s']:.1f}"
    return f"| `{result['protocol']}` | {result['exit']} | {result['verdict']} | {wall} | {collect} |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", type=Path, required=True, help="Root of the per-protocol output roots.")
    parser.add_argument("--protocol", type=Path, action="append", help="Only these files (repeatable).")
    args = parser.parse_args(argv)
    args.output.mkdir(parents=True, exist_ok=True)
    paths = [p.resolve() for p in args.protocol] if args.protocol else shipped_protocols()
    print(HEADER, flush=True)
    results = []
    for path in paths:
        raw = _raw(path)
        why = skip_reason(raw)
        if why is not None:
            result = {
                "protocol": str(path.relative_to(REPO)),
                "exit": "-",
                "verdict": why,
                "wall_s": None,
                "collect_s": None,
            }
        else:
            result = run_smoke(path, raw, args.output.resolve())
        results.append(result)
        print(row(result), flush=True)
    (args.output / "smoke_times.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
