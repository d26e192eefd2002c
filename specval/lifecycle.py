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

import dataclasses
import datetime as dt
import hashlib
import importlib.util
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specval import bundle as bundles
from specval import seeds
from specval.identity import IDENTITY_KEY, identity_of, unrecorded
from specval.protocol.registration import lock_path, read_lock
from specval.protocol.sections import SETTINGS_KEY, settings_covered
from specval.semantics import FilterSemantics
from specval.sut import BUNDLED_ADAPTERS, ENTRY_POINT_GROUP, SUTError, load_adapter

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


def claim_bundle(
    output: Path,
    name: str,
    groups: list[str],
    size: int,
    base: int,
    offset: int | None,
    exploratory: bool = False,
) -> tuple[Path, list[seeds.SeedRange]]:
    """Claim the next seed ranges of protocol `name` in the run's seed space (`exploratory`: the
    exploratory space, `seeds.space_start`) and create its bundle, under the ledger lock (the
    bundle is created only once the ranges are known to be free; if the ledger then cannot be
    written, the new directory is removed and nothing is claimed)."""
    output.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []

    def create() -> str:
        made.append(new_bundle(output, name))
        return made[0].name

    try:
        ranges = seeds.claim_next(output, name, groups, size, base, offset, create, exploratory)
    except BaseException:
        if made:  # the ledger refused the claim (disk full): the directory holds only its lock file
            _discard(made[0])
        raise
    return made[0], ranges


def _discard(path: Path) -> None:
    """Remove a bundle directory that never recorded its plan (no sample exists in it)."""
    bundles.release_bundle(path)
    shutil.rmtree(path, ignore_errors=True)


def record_plan(path: Path, protocol_file: Path, written: Any, plan: bundles.RunPlan) -> None:
    """The bundle's record of what runs: the protocol file as given (protocol.yaml), the protocol
    as written in plain form (protocol.json, `written.to_dict()`) and the plan (run.json), with
    the frozen lock it started from (`lock_record`). run.json is written last: a bundle holding it
    holds its whole plan. An OSError on the way (disk full) removes the bundle directory, which
    holds no sample yet, and propagates: its seed ranges stay claimed in the ledger, unused."""
    try:
        shutil.copyfile(protocol_file, path / bundles.PROTOCOL_YAML)
        bundles.write_json(path / bundles.PROTOCOL_JSON, written.to_dict())
        plan = dataclasses.replace(plan, lock=lock_record(protocol_file, written.name))
        bundles.write_json(path / bundles.RUN_FILE, plan.to_dict())
    except OSError:
        _discard(path)  # no plan, no sample: nothing to resume; its seeds stay claimed (never reused)
        raise


def record_run(
    path: Path,
    protocol_file: Path,
    written: Any,
    protocol: Any,
    ranges: Sequence[tuple[str, int, int]],
    registration: str,
    exploratory: bool,
    semantics: FilterSemantics | None = None,
) -> None:
    """`record_plan` of the run of `protocol` (resolved; `written`: as in the file): its name,
    hash and profile, the seed `ranges` as (group, start, stop), its state in frozen.lock
    (`registration`, `exploratory`) and the filter semantics the reference will follow
    (`semantics`; None: not recorded)."""
    plan = bundles.RunPlan(
        protocol.name,
        protocol.hash,
        protocol.profile,
        tuple(ranges),
        registration=registration,
        exploratory=exploratory,
        semantics=tuple(sorted(semantics.to_dict().items())) if semantics is not None else (),
    )
    record_plan(path, protocol_file, written, plan)


def start_bundle(
    protocol_file: Path,
    written: Any,
    protocol: Any,
    output: Path,
    groups: list[str],
    size: int,
    seed_offset: int | None,
    registration: str,
    exploratory: bool,
    semantics: FilterSemantics | None = None,
) -> tuple[Path, list[seeds.SeedRange]]:
    """Claim `size` seeds for each of `groups` (`claim_bundle`, under the ledger lock), create the
    bundle and record its plan with the claimed ranges (`record_run`); nothing is sampled yet.

    The seeds come from the run's space (`specval.seeds`): a confirmatory run from
    `protocol.seed_base` on, as always; an exploratory one from `protocol.seed_base +
    seeds.EXPLORATORY_OFFSET` on, so that trying a protocol never draws the seeds its frozen run is
    judged on. run.json records the ranges beside `exploratory`; `seed_offset` places the run as given."""
    path, ranges = claim_bundle(
        output, protocol.name, groups, size, protocol.seed_base, seed_offset, exploratory=exploratory
    )
    claimed = [(r.group, r.start, r.stop) for r in ranges]
    record_run(path, protocol_file, written, protocol, claimed, registration, exploratory, semantics)
    return path, ranges


def lock_record(protocol_file: Path, name: str) -> tuple[tuple[str, str | None], ...]:
    """The frozen lock next to `protocol_file` as the run found it: `file` (its path as given),
    `sha256` of its bytes and `entry`, the hash it holds for protocol `name` (both None when
    there is no lock file; entry None when it names no such protocol)."""
    lock = lock_path(protocol_file)
    if not lock.is_file():
        return (("entry", None), ("file", str(lock)), ("sha256", None))
    return (("entry", read_lock(lock).get(name)), ("file", str(lock)), ("sha256", bundles.sha256_file(lock)))


def _adapter_module(adapter: str) -> str | None:
    """The module of `sut.adapter` ("module:Class", an entry point name or a bundled name)."""
    if ":" in adapter:
        return adapter.partition(":")[0]
    points = [ep for ep in metadata.entry_points(group=ENTRY_POINT_GROUP) if ep.name == adapter]
    value = points[0].value if points else BUNDLED_ADAPTERS.get(adapter)
    return value.partition(":")[0] if value else None


def adapter_identity(adapter: str) -> dict[str, Any]:
    """`sut.adapter`, its module and `sha256`: SHA-256 over the module's files (the module file;
    a package's every file, `__pycache__` left out, path then bytes, in path order), so a signed
    bundle names the adapter code that ran, whether or not git tracks it. None where the module
    cannot be found without importing new code."""
    module = _adapter_module(adapter)
    try:
        spec = importlib.util.find_spec(module) if module else None
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None or not Path(spec.origin).is_file():
        return {"adapter": adapter, "module": module, "sha256": None}
    origin = Path(spec.origin).resolve()
    files = (
        [p for p in sorted(origin.parent.rglob("*")) if p.is_file() and "__pycache__" not in p.parts]
        if origin.name == "__init__.py"
        else [origin]
    )
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.relative_to(origin.parent).as_posix().encode() + b"\0" + path.read_bytes())
    return {"adapter": adapter, "module": module, "sha256": digest.hexdigest()}


def sut_identity(adapter: str) -> dict[str, Any]:
    """manifest.json's `sut_identity` for `sut.adapter`: the adapter class's `identity()`
    (`specval.identity.identity_of`), taken from the files on disk when the manifest is written;
    {"unrecorded": reason} when the adapter cannot be loaded (a completion in another environment)."""
    try:
        adapter_class = load_adapter(adapter)
    except SUTError as err:
        return unrecorded(f"adapter {adapter!r} cannot be loaded: {err}")
    return identity_of(adapter_class)


def run_timing(started: str, clock: float, collect_s: float, drawn: int, phases: dict | None = None) -> dict:
    """The manifest's timing block: `started` (ISO time) and `clock` (perf_counter) at the start
    of the run, seconds spent collecting and samples drawn.

    `phases` (a distribution run) splits `wall_s` into consecutive, non-overlapping parts: `setup_s`
    (protocol, adapter and its probe, figure workers started, seed claims, device facts),
    `collect_s`, `analysis_s` (after collection: reference replay, quadrature sweeps, every
    criterion with its Monte Carlo p-value, Holm, summary.json; a stage-2 collection is left out, as
    `collect_stage2_s`) and `report_s` (the SUT closed and the report's figures); `analysis_share` =
    (analysis_s + report_s) / wall_s; `analysis_steps` splits analysis_s and report_s by step
    (`specval.distribution.runner.ANALYSIS_STEPS`; the rest of the two is bookkeeping between the
    steps); `kernel_compile` (adapters that say, `SUT.kernel_compile_time`: the engine on CUDA)
    counts the kernels built and loaded from a cache and their seconds, spent within setup_s (the
    probe) and collect_s (a shape's first batch). Nothing of the analysis overlaps the collection:
    the figure workers only start their imports then. What follows the manifest (report.md/html text
    from the figures, SHA256SUMS) is not in `wall_s`: milliseconds
    (benchmarks/analysis_profile.py)."""
    wall = time.perf_counter() - clock
    timing = {
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "wall_s": wall,
        "collect_s": collect_s,
        "samples_drawn": drawn,
        "samples_per_s": drawn / collect_s if collect_s > 0 else None,
    }
    if phases:
        timing.update(phases, analysis_share=(phases["analysis_s"] + phases["report_s"]) / wall if wall > 0 else None)
    return timing


def write_manifest(
    path: Path,
    protocol: Any,
    ranges: Sequence[seeds.SeedRange],
    device: dict,
    timing: dict,
    command: list[str] | None = None,
    seeds_stage2: Sequence[seeds.SeedRange] = (),
) -> None:
    """manifest.json. `command` None records this process's own invocation (`bundles.invocation`).
    `code` is the code version of this process; `sessions` every session of the bundle
    (sessions.json), so a resumed run lists each process that worked on it with its own code
    version; `seeds_stage2` (a two-stage distribution run) is recorded only when not empty;
    `chunk_heads` the head of every stage's chain of chunk records, so the seal covers them;
    `adapter` the identity of the protocol's adapter code (`adapter_identity`); `sut_identity` the
    code the adapter tests (`sut_identity`; None when the protocol names no adapter); `seed_space` the
    space its first seed lies in (`seeds.space_of`: "confirmatory" or "exploratory"), where the
    protocol has a seed_base; `settings` each group's adapter options (`settings_covered`: group
    name -> `sut.options` with the group's own merged over them), only where a group overrides one."""
    sut = getattr(protocol, "sut", None)
    manifest = {
        "chunk_heads": bundles.chunk_heads(path),
        "adapter": adapter_identity(sut.adapter) if sut is not None else None,
        IDENTITY_KEY: sut_identity(sut.adapter) if sut is not None else None,
        "protocol": {"name": protocol.name, "hash": protocol.hash, "profile": protocol.profile},
        "code": bundles.code_version(),
        "command": list(command or bundles.invocation()),
        "packages": bundles.package_versions(),
        "python": sys.version.split()[0],
        "device": device,
        "seeds": [r.to_dict() for r in ranges],
        "sessions": bundles.read_sessions(path),
        **timing,
    }
    if seeds_stage2:
        manifest["seeds_stage2"] = [r.to_dict() for r in seeds_stage2]
    base = getattr(protocol, "seed_base", None)
    if isinstance(base, int) and ranges:
        manifest["seed_space"] = seeds.space_of(min(r.start for r in ranges), base)
    settings = settings_covered(protocol) if sut is not None and hasattr(protocol, "groups") else {}
    if settings:
        manifest[SETTINGS_KEY] = settings
    bundles.write_json(path / bundles.MANIFEST_FILE, manifest)


def seal(path: Path) -> None:
    """Seal a bundle whose files are all written: temp files of a killed process removed, then
    SHA256SUMS over every file, then this process's lock of the bundle given up (its lock file
    removed: a sealed bundle holds exactly the files SHA256SUMS lists)."""
    bundles.remove_stale_temps(path)
    bundles.write_sums(path)
    bundles.release_bundle(path)


# ---------------------------------------------------------------- completion

# ledger run name of a bundle's second stage (as the distribution runner names it): a later stage of
# the bundle's run, which the ledger keeps in that run's seed space
STAGE2_RUN_SUFFIX = seeds.STAGE_SEPARATOR + "stage2"
UNRECORDED = (
    "not recorded: the run that collected this bundle stopped on an environment fault after its "
    "verdict and before its manifest; a later session completed it without the system under test"
)


def complete(
    path: Path,
    recompute: Callable[[Path], dict],
    finish: Callable[[Path], None],
    command: list[str] | None = None,
    announce: Callable[[Path], None] | None = None,
) -> dict:
    """Finish a bundle whose run recorded its verdict but was never sealed (an environment fault
    while writing the report, the manifest or SHA256SUMS): returns its summary, now sealed.

    Guarantee: nothing is collected and no verdict changes. The bundle must pass
    `bundle.check_completable` (regular files, format, chained and complete chunk records, every
    finished session agreeing with summary.json on unchanged files), and summary.json must equal
    `recompute(path)` (the kind's recomputation from the raw samples) value for value; otherwise
    BundleError naming the first difference, and nothing is written. Then: a session left open by
    the fault is closed as "error", this process's session is recorded (0 samples, the verdict),
    manifest.json is written (an existing one keeps its device and timing; a missing one records
    them as `UNRECORDED`), and `finish(path)` renders the report and seals. An OSError on the way
    leaves the bundle unsealed: it completes again."""
    bundles.check_completable(path)
    try:
        summary = _checked_summary(path, recompute)
        if announce:
            announce(path)
        _close_sessions(path, summary["verdict"], command)
        _complete_manifest(path, command)
        finish(path)
    except BaseException:
        bundles.release_bundle(path)
        raise
    return summary


def _checked_summary(path: Path, recompute: Callable[[Path], dict]) -> dict:
    """summary.json, after checking that it equals its recomputation from the raw samples."""
    stored = bundles.read_typed(path / bundles.SUMMARY_FILE, dict)
    try:
        differences = bundles.diff(stored, recompute(path))
    except bundles.SHAPE_ERRORS as err:  # an OSError is the environment's: it propagates
        raise bundles.BundleError(f"{path}: cannot recompute the summary ({err}); refusing to complete it") from err
    if differences:
        raise bundles.BundleError(
            f"{path}: {bundles.SUMMARY_FILE} differs from its recomputation from the raw "
            f"samples ({len(differences)} value(s), first: {differences[0]}); refusing to "
            "complete it"
        )
    return stored


def _close_sessions(path: Path, verdict: str, command: list[str] | None) -> None:
    """Close every session the fault left open as "error", then record this one: 0 samples drawn,
    outcome the recorded verdict."""
    for number, session in enumerate(bundles.read_sessions(path)):
        if session.get("finished") is None:
            bundles.end_session(path, number, None, "error")
    bundles.end_session(path, bundles.begin_session(path, command), 0, verdict)


def _complete_manifest(path: Path, command: list[str] | None) -> None:
    """manifest.json with this bundle's sessions and chain heads: an existing one keeps the rest
    (the device, timing and code of the run that decided); a missing one is rebuilt from run.json
    and protocol.json, its device and timing `UNRECORDED`."""
    if os.path.lexists(path / bundles.MANIFEST_FILE):
        manifest = bundles.read_typed(path / bundles.MANIFEST_FILE, dict)
        manifest.update(sessions=bundles.read_sessions(path), chunk_heads=bundles.chunk_heads(path))
        bundles.write_json(path / bundles.MANIFEST_FILE, manifest)
        return
    plan = bundles.RunPlan.from_dict(bundles.read_typed(path / bundles.RUN_FILE, dict))
    sut = bundles.read_typed(path / bundles.PROTOCOL_JSON, dict).get("sut")
    adapter = sut.get("adapter") if isinstance(sut, dict) else None
    protocol = SimpleNamespace(
        name=plan.protocol,
        hash=plan.protocol_hash,
        profile=plan.profile,
        sut=SimpleNamespace(adapter=adapter) if adapter else None,
    )
    ranges = [seeds.SeedRange(plan.protocol, path.name, g, a, b) for g, a, b in plan.ranges]
    stage2 = [seeds.SeedRange(plan.protocol, path.name + STAGE2_RUN_SUFFIX, g, a, b) for g, a, b in plan.stage2_ranges]
    sessions = bundles.read_sessions(path)
    drawn = sum(s.get("samples_drawn") or 0 for s in sessions)
    timing = {
        "started": sessions[0]["started"] if sessions else None,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "wall_s": None,
        "collect_s": None,
        "samples_drawn": drawn,
        "samples_per_s": None,
        "timing": UNRECORDED,
    }
    write_manifest(path, protocol, ranges, {"unrecorded": UNRECORDED}, timing, command, stage2)
