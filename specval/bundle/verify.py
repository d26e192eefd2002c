"""Verification: every check `specval verify` makes of a sealed bundle, and the pinned-protocol check.

`verify_bundle` lists every difference between the bundle and its seals (SHA256SUMS, layout,
chunk records and their heads), its sessions, the summary recomputed from its raw files and the
reports re-rendered from them; `code_note` and `format_note` add informational lines;
`check_pinned` says why a bundle did not run a pinned frozen protocol.

Guarantees:
- A difference is reported if any byte of any file changed, if a file was added or removed, if an
  entry is a symbolic link, a FIFO, a device or a directory holding no file of SHA256SUMS (and then
  nothing more is read: no link is followed out of the bundle), if the chunk records do not chain
  to the heads the manifest names, if a sample chunk differs from its recorded hash, if any value
  of summary.json differs from its recomputation, or if a report differs byte for byte from its
  re-rendering.
- A bundle whose run.json records a format before the chained one while its chunk records chain
  or its manifest names their heads is reported: the format cannot be lowered to skip a check.
- Sample chunks over the bounds of `specval.bundle.samples` (rows from run.json's planned seeds,
  cells, bytes) are reported from their parquet footers before any sample is decoded, and then
  nothing is recomputed.
- `check_profile` reports a bundle whose run.json records another profile than the pinned one.
- A check that cannot read what it checks reports that as a difference; it never raises.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from specval.bundle.chain import _stages, check_chunks, chunk_heads, read_chunk_index, read_chunk_records
from specval.bundle.compare import diff
from specval.bundle.facts import source_digest
from specval.bundle.files import (
    CHUNKS_FILE,
    ERROR_LOG,
    MANIFEST_FILE,
    PROTOCOL_JSON,
    PROTOCOL_YAML,
    QUADRATURE_FILE,
    READ_ERRORS,
    REFERENCE_FILE,
    REPORT_FILES,
    RUN_FILE,
    SESSIONS_FILE,
    SIGNATURE_FILE,
    STAGE2_DIR,
    SUMMARY_FILE,
    BundleError,
    _files,
    check_entries,
    read_json,
    read_typed,
    regular_file,
)
from specval.bundle.plan import CHAINED_FORMAT, VERIFIABLE_FORMATS, RunPlan
from specval.bundle.samples import check_sample_bounds
from specval.bundle.sessions import read_sessions
from specval.bundle.sums import check_sums, read_sums


def check_format(path: Path) -> list[str]:
    """The bundle format recorded in run.json must be one this code verifies (VERIFIABLE_FORMATS),
    and one its files bear out: a format before CHAINED_FORMAT with chained chunk records or
    manifest.json's `chunk_heads` (what only CHAINED_FORMAT writes) is refused, so the format
    cannot be lowered to skip the chain check."""
    found = RunPlan.from_dict(read_json(path / RUN_FILE)).bundle_format
    if found not in VERIFIABLE_FORMATS:
        return [
            f"{RUN_FILE}: bundle format {found}, this specval verifies formats "
            f"{', '.join(map(str, VERIFIABLE_FORMATS))} (re-run it)"
        ]
    if found < CHAINED_FORMAT:
        return [
            f"{RUN_FILE}: bundle format {found}, but {shown} (format {CHAINED_FORMAT}): the format was lowered"
            for shown in _chained_layout(path)
        ]
    return []


def _chained_layout(path: Path) -> list[str]:
    """What in the bundle only CHAINED_FORMAT writes: chunks.json a list of records (a stage of
    an earlier format holds a {file: sha256} map), manifest.json's `chunk_heads`."""
    shown = [
        f"{'' if stage == path else STAGE2_DIR + '/'}{CHUNKS_FILE} is a chain of records"
        for stage in _stages(path)
        if os.path.lexists(stage / CHUNKS_FILE) and isinstance(read_chunk_records(stage), list)
    ]
    if os.path.lexists(path / MANIFEST_FILE) and "chunk_heads" in read_typed(path / MANIFEST_FILE, dict):
        shown.append(f"{MANIFEST_FILE} records chunk_heads")
    return shown


def code_note(path: Path) -> str | None:
    """A line for `specval verify` when the code that recomputes the bundle is not provably the
    code that made it: a session recorded another `source_sha256`, or none (older bundles). None
    when every session ran this checkout's source. Informational: verdicts are compared anyway."""
    try:
        made = {(session.get("code") or {}).get("source_sha256") for session in read_sessions(path)}
    except READ_ERRORS:
        return None  # verify reports the unreadable file itself
    here = source_digest()
    if made == {here}:
        return None
    recorded = ", ".join(sorted(str(digest)[:16] for digest in made if digest)) or "none recorded"
    return f"note: made by source sha256 {recorded}; recomputed with this checkout's {str(here)[:16]}"


def format_note(path: Path) -> str | None:
    """A line for `specval verify` when the bundle is of a verifiable format older than the one
    that chains chunk records (None otherwise, and for a run.json that cannot be read: verify
    reports that itself)."""
    try:
        found = _format(path)
    except READ_ERRORS:
        return None
    if found in VERIFIABLE_FORMATS and found < CHAINED_FORMAT:
        return (
            f"note: bundle format {found}: made before chunk records were chained (format {CHAINED_FORMAT}); "
            "its chunks are checked against their recorded hashes only"
        )
    return None


def check_sessions(path: Path) -> list[str]:
    """manifest.json must list exactly the session records of sessions.json."""
    sessions = read_sessions(path)
    if not sessions:
        return [f"{SESSIONS_FILE}: missing or empty"]
    if read_typed(path / MANIFEST_FILE, dict).get("sessions") != sessions:
        return [f"{MANIFEST_FILE}: sessions differ from {SESSIONS_FILE}"]
    return []


LAYOUT_FILES = frozenset(
    {
        PROTOCOL_YAML,
        PROTOCOL_JSON,
        RUN_FILE,
        CHUNKS_FILE,
        SESSIONS_FILE,
        REFERENCE_FILE,
        QUADRATURE_FILE,
        SUMMARY_FILE,
        MANIFEST_FILE,
        ERROR_LOG,
        SIGNATURE_FILE,
        *REPORT_FILES,
        f"{STAGE2_DIR}/{CHUNKS_FILE}",
        f"{STAGE2_DIR}/{REFERENCE_FILE}",
    }
)


def check_layout(path: Path) -> list[str]:
    """Every file must be a file of the documented layout or a sample chunk recorded in a
    chunks.json: a file added and listed in a recomputed SHA256SUMS is still reported."""
    allowed = set(LAYOUT_FILES)
    for stage in _stages(path):
        prefix = "" if stage == path else f"{STAGE2_DIR}/"
        allowed |= {prefix + name for name in read_chunk_index(stage)}
    return [f"{name}: not a file of the bundle layout" for name in _files(path) if name not in allowed]


def _format(path: Path) -> int:
    return RunPlan.from_dict(read_json(path / RUN_FILE)).bundle_format


def check_all_chunks(path: Path) -> list[str]:
    """`check_chunks` of every stage of a finished bundle; from format 4 on, the chains too and
    their heads against the ones manifest.json records."""
    chained = _format(path) >= CHAINED_FORMAT
    problems = [p for stage in _stages(path) for p in check_chunks(stage, complete=True, chained=chained)]
    if chained and not problems and read_typed(path / MANIFEST_FILE, dict).get("chunk_heads") != chunk_heads(path):
        problems.append(f"{MANIFEST_FILE}: chunk_heads differ from the heads of the chunk records")
    return problems


def check_rendered(path: Path, render: Callable[[Path], dict[str, bytes]]) -> list[str]:
    """Each report file must equal, byte for byte, its re-rendering from the bundle's files."""
    try:
        rendered = render(path)
    except READ_ERRORS as err:
        return [f"cannot re-render the report: {err}"]
    return [
        f"{name}: differs from its re-rendering from the bundle"
        for name, data in sorted(rendered.items())
        if _regular_bytes(path / name) != data
    ]


def _regular_bytes(path: Path) -> bytes | None:
    """The bytes of a regular file; None for anything else (a link is not followed)."""
    try:
        return regular_file(path).read_bytes()
    except (BundleError, OSError):
        return None


def _run_check(check: Callable[[Path], list[str]], path: Path) -> list[str]:
    try:
        return check(path)
    except READ_ERRORS as err:
        return [f"cannot check ({check.__name__}): {err}"]


def _recheck_summary(path: Path, recompute: Callable[[Path], dict]) -> list[str]:
    try:
        stored, recomputed = read_json(path / SUMMARY_FILE), recompute(path)
    except READ_ERRORS as err:
        return [f"cannot recompute the summary: {err}"]
    return [f"{SUMMARY_FILE}: {d}" for d in diff(stored, recomputed)]


def check_listed_entries(path: Path) -> list[str]:
    """`check_entries` against the files SHA256SUMS lists (none readable: links and other entries only)."""
    try:
        listed = set(read_sums(path))
    except BundleError:
        listed = None
    return check_entries(path, listed)


def verify_bundle(
    path: Path, recompute: Callable[[Path], dict], render: Callable[[Path], dict[str, bytes]]
) -> list[str]:
    """Every difference between the bundle and its seals (SHA256SUMS, layout, chunks.json), its
    sessions, the summary `recompute(path)` derives from its raw files, and the reports
    `render(path)` makes. A bundle holding anything but regular files and directories of
    SHA256SUMS gets those entries and the checksums only: nothing else is read. A bundle whose
    sample chunks break a bound of `specval.bundle.samples` gets that line and no recomputation:
    no sample is decoded. A bundle of another
    format gets one line naming its format plus the checks every format promised (checksums,
    recomputed summary), not a line per missing record."""
    entries = _run_check(check_listed_entries, path)
    if entries:
        return entries + check_sums(path)  # nothing more is read: no link is followed out of the bundle
    old_format = _run_check(check_format, path)
    problems = check_sums(path) + old_format
    if not old_format:
        problems += [p for check in (check_layout, check_sessions, check_all_chunks) for p in _run_check(check, path)]
    bounds = _run_check(check_sample_bounds, path)
    if bounds:
        return problems + bounds  # no sample is decoded: nothing is recomputed or re-rendered
    problems += _recheck_summary(path, recompute)
    return problems + ([] if old_format else check_rendered(path, render))


# ---------------------------------------------------------------- pinned protocol


def check_pinned(path: Path, protocol_hash: str) -> list[str]:
    """Why the bundle did not run exactly the frozen protocol of hash `protocol_hash` (empty: it
    did): run.json must record that hash and a frozen, confirmatory registration. That run.json,
    protocol.json and protocol.yaml agree, and that the summary follows from them, is verify's."""
    try:
        plan = RunPlan.from_dict(read_typed(path / RUN_FILE, dict))
    except READ_ERRORS as err:
        return [f"cannot check the pinned protocol: {err}"]
    problems = []
    if plan.protocol_hash != protocol_hash:
        problems.append(f"{RUN_FILE}: ran protocol hash {plan.protocol_hash}, not the pinned {protocol_hash}")
    if plan.registration != "frozen" or plan.exploratory:
        problems.append(
            f"{RUN_FILE}: registration {plan.registration!r}"
            f"{' (exploratory)' if plan.exploratory else ''}: the pinned protocol must run frozen"
        )
    return problems


def check_profile(path: Path, profile: str) -> list[str]:
    """Why the bundle did not run the profile `profile` (empty: it did): run.json, sealed and
    signed with the bundle, records the profile the run resolved."""
    try:
        found = ran_profile(path)
    except READ_ERRORS as err:
        return [f"cannot check the pinned profile: {err}"]
    return [] if found == profile else [f"{RUN_FILE}: ran profile {found!r}, not the pinned {profile!r}"]


def ran_profile(path: Path) -> str | None:
    """The profile run.json records (None: the protocol's defaults); BundleError or a read error."""
    return RunPlan.from_dict(read_typed(path / RUN_FILE, dict)).profile
