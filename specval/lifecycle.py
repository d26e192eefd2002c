"""Lifecycle: what every kind of run (distribution, quality, performance) does with its bundle.

    claim seeds and create the bundle -> record the plan (protocol.yaml, protocol.json, run.json)
    -> sessions (`specval.bundle.begin_session` / `end_session`) -> timing -> manifest -> seal

Guarantees: a bundle directory is created only once its seed ranges are claimed in the ledger
(`claim_bundle`, under the ledger lock), and never reuses an existing directory (`new_bundle`);
the process that creates (or resumes) a bundle holds its lock (`bundle.lock_bundle`) until it
seals it, or until the run ends without a verdict (`execution.guard_bundle`); `seal` writes
SHA256SUMS last, after stale temp files of a killed process are removed, then gives up the lock. The kinds
differ only in what they sample and how they decide; the bundle's life is this module's.
"""

from __future__ import annotations

import datetime as dt
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from specval import bundle as bundles
from specval import seeds

STAMP_FORMAT = "%Y%m%dT%H%M%SZ"  # UTC time in a bundle's directory name


def timestamp() -> str:
    """The current UTC time as it appears in a bundle's name."""
    return dt.datetime.now(dt.timezone.utc).strftime(STAMP_FORMAT)


def new_bundle(output: Path, name: str) -> Path:
    """A new bundle directory `<output>/<name>-<stamp>[-<n>]` (never an existing one), locked by
    this process (`bundle.lock_bundle`: its lock file is the only entry)."""
    stamp = timestamp()
    path, suffix = output / f"{name}-{stamp}", 1
    while path.exists():
        suffix += 1
        path = output / f"{name}-{stamp}-{suffix}"
    path.mkdir(parents=True)
    bundles.lock_bundle(path)
    return path


def claim_bundle(output: Path, name: str, groups: list[str], size: int, base: int,
                 offset: int | None) -> tuple[Path, list[seeds.SeedRange]]:
    """Claim the next seed ranges of protocol `name` and create its bundle, under the ledger lock
    (the bundle is created only once the ranges are known to be free)."""
    output.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []

    def create() -> str:
        made.append(new_bundle(output, name))
        return made[0].name

    ranges = seeds.claim_next(output, name, groups, size, base, offset, create)
    return made[0], ranges


def record_plan(path: Path, protocol_file: Path, written: Any, plan: bundles.RunPlan) -> None:
    """The bundle's record of what runs: the protocol file as given (protocol.yaml), the protocol
    as written in plain form (protocol.json, `written.to_dict()`) and the plan (run.json)."""
    shutil.copyfile(protocol_file, path / bundles.PROTOCOL_YAML)
    bundles.write_json(path / bundles.PROTOCOL_JSON, written.to_dict())
    bundles.write_json(path / bundles.RUN_FILE, plan.to_dict())


def run_timing(started: str, clock: float, collect_s: float, drawn: int, phases: dict | None = None) -> dict:
    """The manifest's timing block: `started` (ISO time) and `clock` (perf_counter) at the start
    of the run, seconds spent collecting and samples drawn.

    `phases` (a distribution run) splits `wall_s` into consecutive, non-overlapping parts:
    `setup_s` (protocol, adapter and its probe, figure workers started, seed claims, device
    facts), `collect_s`, `analysis_s` (after collection: reference replay, quadrature sweeps,
    every criterion with its Monte Carlo p-value, Holm, summary.json; a stage-2 collection is left
    out, as `collect_stage2_s`) and `report_s` (the SUT closed and the report's figures);
    `analysis_share` = (analysis_s + report_s) / wall_s; `analysis_steps` splits analysis_s and
    report_s by step (`specval.distribution.runner.ANALYSIS_STEPS`; the rest of the two is
    bookkeeping between the steps). Nothing of the analysis overlaps the collection: the figure
    workers only start their imports then. What follows the manifest (report.md/html text from
    the figures, SHA256SUMS) is not in `wall_s`: milliseconds (benchmarks/analysis_profile.py)."""
    wall = time.perf_counter() - clock
    timing = {"started": started, "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
              "wall_s": wall, "collect_s": collect_s, "samples_drawn": drawn,
              "samples_per_s": drawn / collect_s if collect_s > 0 else None}
    if phases:
        timing.update(phases, analysis_share=(phases["analysis_s"] + phases["report_s"]) / wall if wall > 0 else None)
    return timing


def write_manifest(path: Path, protocol: Any, ranges: Sequence[seeds.SeedRange], device: dict,
                   timing: dict, command: list[str] | None = None,
                   seeds_stage2: Sequence[seeds.SeedRange] = ()) -> None:
    """manifest.json. `command` None records this process's own invocation (`bundles.invocation`).
    `code` is the code version of this process; `sessions` every session of the bundle
    (sessions.json), so a resumed run lists each process that worked on it with its own code
    version; `seeds_stage2` (a two-stage distribution run) is recorded only when not empty;
    `chunk_heads` the head of every stage's chain of chunk records, so the seal covers them."""
    manifest = {"chunk_heads": bundles.chunk_heads(path),"protocol": {"name": protocol.name, "hash": protocol.hash, "profile": protocol.profile},
                "code": bundles.code_version(), "command": list(command or bundles.invocation()),
                "packages": bundles.package_versions(), "python": sys.version.split()[0], "device": device,
                "seeds": [r.to_dict() for r in ranges], "sessions": bundles.read_sessions(path), **timing}
    if seeds_stage2:
        manifest["seeds_stage2"] = [r.to_dict() for r in seeds_stage2]
    bundles.write_json(path / bundles.MANIFEST_FILE, manifest)


def seal(path: Path) -> None:
    """Seal a bundle whose files are all written: temp files of a killed process removed, then
    SHA256SUMS over every file, then this process's lock of the bundle given up (its lock file
    removed: a sealed bundle holds exactly the files SHA256SUMS lists)."""
    bundles.remove_stale_temps(path)
    bundles.write_sums(path)
    bundles.release_bundle(path)
