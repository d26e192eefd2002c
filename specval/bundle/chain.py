"""The chain of chunk records: chunks.json of each stage, its genesis and head, chunk writes and checks.

Each sample chunk is recorded in its stage's chunks.json (the bundle's, or stage2/'s) as it is
written: its file, its sha256 and the hash of the record before it; the first record chains from
a genesis hashed from the plan run.json records and the stage. manifest.json names each stage's
head (`chunk_heads`), so the seal covers the chain.

Guarantees:
- `write_chunk` never leaves a chunk file without its record (temp file, hash, record, rename)
  and never replaces a written chunk (BundleError).
- `chain_problems` reports a record that does not chain, so a chain never moves to another
  protocol, registration, seed range or stage unnoticed; `check_chunks` reports a sample file
  never recorded, a recorded one missing (`complete`) and one whose sha256 differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specval.bundle.files import (
    CHUNKS_FILE,
    RUN_FILE,
    SAMPLES_DIR,
    STAGE2_DIR,
    BundleError,
    json_text,
    read_json,
    temp_path,
    write_json,
)
from specval.bundle.plan import CHAINED_FORMAT, RunPlan, _range_dicts
from specval.bundle.sums import sha256_file

CHAIN_TAG = "specval chunk chain v1"  # the start of every chain's genesis, so no other hash can pose as one


def _bundle_of(root: Path) -> Path:
    """The bundle a stage root (the bundle itself or its stage2/) belongs to."""
    return root.parent if root.name == STAGE2_DIR and not (root / RUN_FILE).exists() else root


def _stage_prefix(root: Path) -> str:
    return "" if _bundle_of(root) == root else f"{STAGE2_DIR}/"


def chain_genesis(root: Path) -> str:
    """The `prev` of a stage's first chunk record: a hash of the plan run.json records (protocol
    hash, registration, exploratory flag, seed ranges, semantics; stage 2's ranges for stage 2)
    and of the stage, so a chain never moves to another protocol, registration, seed range or
    stage unnoticed."""
    plan = RunPlan.from_dict(read_json(_bundle_of(root) / RUN_FILE))
    stage = _stage_prefix(root)
    anchor = {
        "tag": CHAIN_TAG,
        "stage": stage,
        "protocol_hash": plan.protocol_hash,
        "registration": plan.registration,
        "exploratory": plan.exploratory,
        "ranges": _range_dicts(plan.ranges),
        "semantics": dict(plan.semantics),
        "stage2_ranges": _range_dicts(plan.stage2_ranges) if stage else [],
    }
    return record_hash(anchor)


def record_hash(record: dict) -> str:
    """SHA-256 of one chunk record in canonical JSON (sorted keys, no spaces): the next record's `prev`."""
    return hashlib.sha256(json.dumps(record, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def read_chunk_records(root: Path) -> list | dict:
    """chunks.json of one stage as stored: a list of records (format 4) or a {file: sha256} map
    (formats 2 and 3); an empty list before the first chunk."""
    if not (root / CHUNKS_FILE).exists() and not (root / CHUNKS_FILE).is_symlink():
        return []
    records = read_json(root / CHUNKS_FILE)
    if not isinstance(records, (list, dict)):
        raise BundleError(
            f"{root / CHUNKS_FILE}: expected a JSON array of chunk records, found {type(records).__name__}"
        )
    return records


def chain_problems(root: Path, records: list | dict) -> list[str]:
    """Why one stage's chunk records do not chain (empty: each record names a file and its
    sha256 and carries the hash of the record before it, the first the stage's genesis)."""
    where = f"{_stage_prefix(root)}{CHUNKS_FILE}"
    if not isinstance(records, list):
        return [f"{where}: a map of hashes, not a chain of records (bundle format {CHAINED_FORMAT} chains them)"]
    prev = chain_genesis(root)
    for number, record in enumerate(records):
        if not (
            isinstance(record, dict)
            and set(record) == {"file", "sha256", "prev"}
            and all(isinstance(v, str) for v in record.values())
        ):
            return [f"{where}: record {number} is not {{file, sha256, prev}}"]
        if record["prev"] != prev:
            return [
                f"{where}: record {number} ({record['file']}) does not chain: its prev {record['prev'][:12]} is "
                f"not the hash {prev[:12]} of {'the record before' if number else 'the plan in run.json'}"
            ]
        prev = record_hash(record)
    return []


def chain_head(root: Path) -> str:
    """The hash a stage's next chunk record chains from: the last record's, or the genesis."""
    records = read_chunk_records(root)
    if not isinstance(records, list):
        raise BundleError(f"{root / CHUNKS_FILE}: a map of hashes, not a chain of records")
    return record_hash(records[-1]) if records else chain_genesis(root)


def chunk_heads(path: Path) -> dict[str, str]:
    """{chunks.json of each stage: its chain head}: what manifest.json records (`lifecycle.write_manifest`)."""
    return {f"{_stage_prefix(stage)}{CHUNKS_FILE}": chain_head(stage) for stage in _stages(path)}


def write_chunk(root: Path, path: Path, write: Callable[[Path], None]) -> None:
    """Write one sample chunk atomically and append its record to `root/chunks.json`.

    Order: temp file, hash, record, rename. A kill at any point leaves either no chunk file (its
    record, if any, is superseded by the record appended when the chunk is written again) or a
    chunk whose hash is recorded; never a chunk file without a record. A chunk already written is
    never replaced (BundleError)."""
    name = path.relative_to(root).as_posix()
    if os.path.lexists(path):
        raise BundleError(f"{path}: already written; a written sample chunk is never replaced")
    tmp = temp_path(path)
    try:
        write(tmp)
        record = {"file": name, "sha256": sha256_file(tmp), "prev": chain_head(root)}
        write_json(root / CHUNKS_FILE, [*read_chunk_records(root), record])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_chunk(root: Path, path: Path, obj: Any) -> None:
    """`write_chunk` of a JSON sample file (quality bundles)."""
    text = json_text(obj)
    write_chunk(root, path, lambda tmp: tmp.write_text(text))


def read_chunk_index(root: Path) -> dict[str, str]:
    """{file: sha256} of one stage's chunk records (a file recorded twice: its last record)."""
    records = read_chunk_records(root)
    if isinstance(records, dict):
        return records
    try:
        return {record["file"]: record["sha256"] for record in records}
    except (TypeError, KeyError) as err:
        raise BundleError(f"{root / CHUNKS_FILE}: a record is not {{file, sha256, prev}}") from err


def _sample_files(root: Path) -> set[str]:
    """Sample files under root/samples, temp files of an interrupted write (dot names) excluded."""
    directory = root / SAMPLES_DIR
    return (
        {p.relative_to(root).as_posix() for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")}
        if directory.is_dir()
        else set()
    )


def check_chunks(root: Path, complete: bool, chained: bool = True) -> list[str]:
    """Differences between the sample files of one stage (the bundle or stage2/) and the hashes
    recorded as they were written. `complete`: every recorded chunk must also exist (a finished
    bundle); otherwise a recorded chunk may be missing (a run killed before its rename).
    `chained`: the records must chain (`chain_problems`; formats before 4 recorded a map)."""
    where = _stage_prefix(root)
    if complete and not (root / CHUNKS_FILE).exists():
        return [f"{where}{CHUNKS_FILE} is missing"]
    records = read_chunk_records(root)
    problems = chain_problems(root, records) if chained else []
    if problems:
        return problems
    index, on_disk = read_chunk_index(root), _sample_files(root)
    problems = [
        f"{where}{name}: written but its sha256 was never recorded in {CHUNKS_FILE}"
        for name in sorted(on_disk - set(index))
    ]
    if complete:
        problems += [f"{where}{name}: recorded in {CHUNKS_FILE} but missing" for name in sorted(set(index) - on_disk)]
    problems += [
        f"{where}{name}: sha256 differs from the one recorded in {CHUNKS_FILE} when it was written"
        for name in sorted(on_disk & set(index))
        if sha256_file(root / name) != index[name]
    ]
    return problems


def _stages(path: Path) -> list[Path]:
    return [path] + ([path / STAGE2_DIR] if (path / STAGE2_DIR).is_dir() else [])
