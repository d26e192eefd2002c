"""Re-opening a bundle: whether an unsealed bundle may be resumed, or only completed, and by whom.

Guarantees:
- `check_resumable` refuses a sealed bundle, one whose run recorded its verdict
  (`recorded_verdict`: summary.json, the manifest or a report present, or a session that ended
  with a verdict), one of another format, one whose chunk records do not chain or whose written
  chunks differ from their records, one that holds anything but regular files and the layout's
  directories, one whose sample chunks break a bound of `specval.bundle.samples` (read from their
  footers, nothing decoded), or one that another process holds (naming the holder).
- `check_completable` refuses to complete anything but an unsealed, unsigned bundle of this
  format whose run recorded its verdict, with complete chunk records that chain, sample chunks
  within the bounds of `specval.bundle.samples`, and a summary.json
  that every finished session agrees with, on files (`verdict_files`) unchanged since.
- Both refuse with one BundleError line naming the bundle; after a refusal this process holds no
  lock of it, after a success it holds the lock until the seal.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from specval.bundle.chain import _stages, check_chunks, chunk_heads
from specval.bundle.files import (
    MANIFEST_FILE,
    READ_ERRORS,
    RUN_FILE,
    SEALED_FILES,
    SESSIONS_FILE,
    SHAPE_ERRORS,
    SIGNATURE_FILE,
    SUMMARY_FILE,
    SUMS_FILE,
    BundleError,
    check_entries,
    read_json,
    read_typed,
)
from specval.bundle.plan import BUNDLE_FORMAT, RunPlan
from specval.bundle.samples import check_sample_bounds
from specval.bundle.sessions import (
    FINISHED_OUTCOMES,
    VERDICT_FILES_KEY,
    lock_bundle,
    read_sessions,
    release_bundle,
)
from specval.bundle.sums import sha256_file


def _finished_session(path: Path) -> str | None:
    """Why the bundle's sessions say its run finished (None: no session ended with a verdict)."""
    for number, session in enumerate(read_sessions(path)):
        outcome = session.get("outcome") if isinstance(session, dict) else None
        if outcome in FINISHED_OUTCOMES:
            return (
                f"{SESSIONS_FILE} records a finished run "
                f"(session {number} ended {outcome} at {session.get('finished')})"
            )
    return None


def _refuse_reopen(path: Path) -> None:
    """BundleError unless the bundle is unsealed, undecided (no summary, manifest, report or
    session that records a verdict), of this format, with regular files only and chunk records
    that chain and match the written chunks."""
    never = "a finished bundle is never re-opened, start a new run"
    if (path / SUMS_FILE).exists() or (path / SUMS_FILE).is_symlink():
        raise BundleError(f"{path}: sealed ({SUMS_FILE} present); a sealed bundle is never re-opened, start a new run")
    decided = [name for name in (SUMMARY_FILE, *SEALED_FILES) if os.path.lexists(path / name)]
    if decided:
        raise BundleError(
            f"{path}: {decided[0]} is present: the run recorded its verdict and is never collected "
            "into again; `specval run --resume` only completes it (lifecycle.complete)"
        )
    entries = check_entries(path, None)
    if entries:
        raise BundleError(f"{path}: refusing to resume: {'; '.join(entries)}")
    finished = _finished_session(path)
    if finished:
        raise BundleError(f"{path}: {finished}; {never}")
    plan = RunPlan.from_dict(read_json(path / RUN_FILE))
    if plan.bundle_format != BUNDLE_FORMAT:
        raise BundleError(
            f"{path / RUN_FILE}: bundle format {plan.bundle_format}, this specval resumes format {BUNDLE_FORMAT} only"
        )
    problems = [p for stage in _stages(path) for p in check_chunks(stage, complete=False)]
    if problems:
        raise BundleError(
            f"{path}: refusing to resume, its written samples do not match their recorded hashes: {'; '.join(problems)}"
        )
    _refuse_over_bounds(path, "refusing to resume")


def _refuse_over_bounds(path: Path, doing: str) -> None:
    """BundleError naming the chunk, the bound and what it declares, when the written samples
    break a bound of `specval.bundle.samples` (checked from their footers: nothing is decoded)."""
    broken = check_sample_bounds(path)
    if broken:
        raise BundleError(f"{path}: {doing}: {broken[0]}")


def recorded_verdict(path: Path) -> bool:
    """True iff the bundle's run reached a verdict: summary.json, manifest.json or a report is
    present, or a session ended with a verdict. Such a bundle is never collected into again; an
    unsealed one only completes (`check_completable`, `lifecycle.complete`)."""
    if any(os.path.lexists(path / name) for name in (SUMMARY_FILE, *SEALED_FILES)):
        return True
    try:
        return _finished_session(path) is not None
    except READ_ERRORS:
        return False  # an unreadable sessions.json: the resume's own checks name it


def _refuse_completion(path: Path) -> None:
    """BundleError unless the unsealed bundle, whose run recorded a verdict, holds regular files
    only, is of this format, has complete chunk records that chain, a summary.json whose verdict
    every finished session recorded, each on files unchanged since (`verdict_files`), and, if
    manifest.json exists, the chain heads it names."""
    never = "refusing to complete it"
    entries = check_entries(path, None)
    if entries:
        raise BundleError(f"{path}: {never}: {'; '.join(entries)}")
    plan = RunPlan.from_dict(read_typed(path / RUN_FILE, dict))
    if plan.bundle_format != BUNDLE_FORMAT:
        raise BundleError(
            f"{path / RUN_FILE}: bundle format {plan.bundle_format}, this specval completes format {BUNDLE_FORMAT} only"
        )
    problems = [p for stage in _stages(path) for p in check_chunks(stage, complete=True)]
    if problems:
        raise BundleError(f"{path}: {never}, its samples do not match their chained records: {'; '.join(problems)}")
    _refuse_over_bounds(path, never)
    sessions = read_sessions(path)
    if not os.path.lexists(path / SUMMARY_FILE):
        finished = _finished_session(path)
        raise BundleError(f"{path}: {finished or 'the run recorded a verdict'} but {SUMMARY_FILE} is missing; {never}")
    verdict = read_typed(path / SUMMARY_FILE, dict).get("verdict")
    if verdict not in FINISHED_OUTCOMES:
        raise BundleError(f"{path / SUMMARY_FILE}: verdict {verdict!r} is not one of {', '.join(FINISHED_OUTCOMES)}")
    for number, session in enumerate(sessions):
        _check_finished_session(path, number, session, verdict)
    if os.path.lexists(path / MANIFEST_FILE) and read_typed(path / MANIFEST_FILE, dict).get(
        "chunk_heads"
    ) != chunk_heads(path):
        raise BundleError(f"{path / MANIFEST_FILE}: chunk_heads differ from the heads of the chunk records; {never}")


def _check_finished_session(path: Path, number: int, session: Any, verdict: str) -> None:
    """BundleError if session `number` ended with another verdict than `verdict`, or recorded
    files (`verdict_files`) that changed since."""
    if not isinstance(session, dict):
        raise BundleError(f"{path / SESSIONS_FILE}: session {number} is not a JSON object")
    outcome = session.get("outcome")
    if outcome in FINISHED_OUTCOMES and outcome != verdict:
        raise BundleError(
            f"{path}: session {number} ended {outcome} but {SUMMARY_FILE} says {verdict}; "
            "a recorded verdict never changes"
        )
    recorded = session.get(VERDICT_FILES_KEY) or {}
    if not isinstance(recorded, dict):
        raise BundleError(f"{path / SESSIONS_FILE}: session {number}: {VERDICT_FILES_KEY} is not a JSON object")
    for name, digest in sorted(recorded.items()):
        here = sha256_file(path / name) if os.path.lexists(path / name) else None
        if here != digest:
            state = "missing" if here is None else "changed"
            raise BundleError(
                f"{path}: {name} {state} since session {number} recorded its verdict {outcome}; refusing to complete it"
            )


def check_completable(path: Path) -> None:
    """Refuse (BundleError naming the bundle and what is wrong, in one line) to complete anything
    but an unsealed, unsigned bundle of this format whose run recorded a verdict
    (`recorded_verdict`), that no other process holds, with regular files only, complete chunk
    records that chain, and a summary.json that every finished session agrees with, on files
    unchanged since. Whether the summary follows from the raw samples is checked next, by the
    kind's recomputation (`lifecycle.complete`). From here to the seal this process holds the
    bundle's lock; a refusal gives it up."""
    if not (path / RUN_FILE).is_file():
        raise BundleError(f"{path}: not a bundle ({RUN_FILE} missing)")
    for seal in (SUMS_FILE, SIGNATURE_FILE):
        if os.path.lexists(path / seal):
            raise BundleError(f"{path}: sealed ({seal} present); a sealed bundle is never re-opened, start a new run")
    lock_bundle(path)
    try:
        _refuse_completion(path)
    except BaseException as err:
        release_bundle(path)
        if isinstance(err, SHAPE_ERRORS) and not isinstance(err, BundleError):
            raise BundleError(f"{path}: refusing to complete it: a record of the wrong shape ({err!r})") from err
        raise  # BundleError as it is; an OSError stays one (the environment: exit 5)


def check_resumable(path: Path) -> None:
    """Refuse (BundleError naming the bundle and what is wrong, in one line) to resume anything
    but an unsealed, unfinished bundle of this format that no other process holds, with regular
    files only and chunk records that chain and match the written chunks. Call it before the
    bundle is touched: a sealed bundle is refused before its lock file is made; otherwise this
    process holds the bundle's lock from here to the seal (`lifecycle.seal`)."""
    if not (path / RUN_FILE).is_file():
        raise BundleError(f"{path}: not a bundle ({RUN_FILE} missing)")
    if (path / SUMS_FILE).exists() or (path / SUMS_FILE).is_symlink():
        _refuse_reopen(path)  # refused before anything is written
    lock_bundle(path)
    try:
        _refuse_reopen(path)  # again under the lock: a holder may have sealed it since
    except (BundleError, *READ_ERRORS):
        release_bundle(path)
        raise
