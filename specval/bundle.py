"""Bundle: the evidence directory of one run, its manifest, its checksums and its verification.

Layout of `results/<protocol>-<UTC timestamp>/`:

    protocol.yaml      the protocol file exactly as run
    protocol.json      its parsed canonical form (the input of the protocol hash)
    run.json           the run plan: bundle format, profile, seed ranges; written before sampling, used by
                       --resume (two-stage protocols: `stage2_ranges` is added when stage 2 is claimed)
    samples/*.parquet  raw samples, one file per seed chunk
    chunks.json        one record per sample chunk, appended as each chunk was written: its file, its
                       sha256 and the hash of the previous record (the first chains from the protocol
                       hash); manifest.json names the head, so the seal covers the chain
    sessions.json      one record per process that worked on the bundle (a resumed run has several)
    reference.json     exact reference distributions (sparse, float64 round-trip)
    stage2/            second stage of a two-stage protocol, only when stage 1 FAILed:
                       stage2/samples/*.parquet, stage2/chunks.json and stage2/reference.json
    quadrature.json    exact output laws of the accept kernel (when the protocol has a quadrature test)
    summary.json       every criterion's statistic, df, p, alpha, verdict, MDE; planned vs effective n
    report.md, report.html
    manifest.json      protocol hash, code version, sessions, command, versions, device, seeds, times
    SHA256SUMS         sha256 of every other file, dotfiles included

While a process works on the bundle it holds `.specval.lock` (its pid, host and start time);
`lifecycle.seal` removes it after writing SHA256SUMS.

Guarantees:
- A bundle is sealed once SHA256SUMS exists (written atomically); `check_resumable` refuses to
  re-open it, or one whose run recorded its verdict (`recorded_verdict`: summary.json, the manifest
  or a report present, or a session that ended with a verdict), or whose chunk records do not
  chain, or whose written sample chunks differ from the hashes recorded when they were written, or
  that holds anything but regular files and directories, or that another process holds
  (`lock_bundle`, naming the holder).
- An unsealed bundle whose run recorded its verdict can only be completed (`check_completable`,
  then `lifecycle.complete`): refused unless its chunk records are complete and chain, every
  session that ended with a verdict ended with summary.json's, on files (`verdict_files`)
  unchanged since.
- `verify_bundle` reports a difference if any byte of any file changed, if a file was added or
  removed, if an entry is a symbolic link, a FIFO, a device or a directory holding no file of
  SHA256SUMS (and then reads nothing more: no link is followed out of the bundle), if the chunk
  records do not chain to the head the manifest names, if a sample chunk differs from its recorded hash, if protocol.yaml does not parse to
  protocol.json, if any value of summary.json differs from a recomputation from the raw samples,
  or if report.md / report.html differ byte for byte from a re-rendering of the bundle.
- It cannot see a change that moves no statistic (two samples swapped within one stratum, with
  every hash recomputed), and the hashes prove that the bundle is self-consistent, not who made it.
- Every file is created with the process umask (0644 under the default umask 022).
"""

from __future__ import annotations

import datetime as dt
import fcntl
import hashlib
import importlib.util
import json
import math
import os
import re
import secrets
import socket
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import specval

SUMS_FILE = "SHA256SUMS"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
MANIFEST_FILE = "manifest.json"
REFERENCE_FILE = "reference.json"
QUADRATURE_FILE = "quadrature.json"
PROTOCOL_YAML = "protocol.yaml"
PROTOCOL_JSON = "protocol.json"
STAGE2_DIR = "stage2"
ERROR_LOG = "error.log"  # tracebacks of the system under test, one block per failed session (specval.execution)
SAMPLES_DIR = "samples"
CHUNKS_FILE = "chunks.json"  # the chained chunk records of one stage (the bundle or stage2/)
SESSIONS_FILE = "sessions.json"
REPORT_FILES = ("report.md", "report.html")
LOCK_FILE = ".specval.lock"  # held by the process working on an unsealed bundle (`lock_bundle`)
SIGNATURE_FILE = "signature.dsse.json"  # the DSSE envelope of a signed bundle (`specval.signing`)
# 2: chunks.json, sessions.json, every file hashed, reports re-rendered by verify;
# 3: reference.json's probabilities and token ids as base64 arrays (`reference.Reference.to_dict`);
# 4: chunks.json a chain of records, its head in manifest.json (`chunk_heads`)
BUNDLE_FORMAT = 4
VERIFIABLE_FORMATS = (2, 3, 4)  # 2 and 3: chunks.json a {file: sha256} map, not chained
CHAINED_FORMAT = 4  # the first format whose chunk records chain
LEGACY_FORMAT = 1  # bundles whose run.json records no format
SEALED_FILES = (MANIFEST_FILE, *REPORT_FILES)  # written only after the run's verdict, just before the seal
FINISHED_OUTCOMES = ("PASS", "FAIL", "INCONCLUSIVE")  # a session that ended with one of them finished the run
PACKAGES = (
    "specval",
    "torch",
    "triton",
    "numpy",
    "scipy",
    "pandas",
    "pyarrow",
    "statsmodels",
    "matplotlib",
    "click",
    "pyyaml",
    "tqdm",
    "cryptography",
)


class BundleError(ValueError):
    """A bundle is missing a file or holds one that cannot be read."""


# what reading a corrupt bundle file can raise (BundleError is a ValueError; a JSON value of the
# wrong shape gives KeyError, TypeError, IndexError or AttributeError further on), and with the
# operating system's refusals (OSError) what any read of a bundle can raise
SHAPE_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError)
READ_ERRORS = (*SHAPE_ERRORS, OSError)


@dataclass(frozen=True)
class RunPlan:
    """What run.json records before any sampling."""

    protocol: str
    protocol_hash: str
    profile: str | None
    ranges: tuple[tuple[str, int, int], ...]  # (group, start, stop)
    stage2_ranges: tuple[tuple[str, int, int], ...] = ()  # the same, of stage 2 (empty: not claimed)
    bundle_format: int = BUNDLE_FORMAT
    registration: str = "frozen"  # the protocol's state in frozen.lock when the run started
    exploratory: bool = False  # run with --exploratory: the verdict is marked EXPLORATORY
    semantics: tuple[tuple[str, str], ...] = ()  # filter semantics the reference follows (empty: not recorded)
    lock: tuple[tuple[str, str | None], ...] = ()  # the frozen lock the run started from: file, sha256, entry

    def to_dict(self) -> dict:
        out = {
            "protocol": self.protocol,
            "protocol_hash": self.protocol_hash,
            "profile": self.profile,
            "ranges": _range_dicts(self.ranges),
            "bundle_format": self.bundle_format,
            "registration": self.registration,
            "exploratory": self.exploratory,
        }
        if self.stage2_ranges:
            out["stage2_ranges"] = _range_dicts(self.stage2_ranges)
        if self.semantics:
            out["semantics"] = dict(self.semantics)
        if self.lock:
            out["lock"] = dict(self.lock)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> RunPlan:
        return cls(
            data["protocol"],
            data["protocol_hash"],
            data["profile"],
            _range_tuples(data["ranges"]),
            _range_tuples(data.get("stage2_ranges", [])),
            int(data.get("bundle_format", LEGACY_FORMAT)),
            data.get("registration", "frozen"),
            bool(data.get("exploratory", False)),
            tuple(sorted(data.get("semantics", {}).items())),
            tuple(sorted(data.get("lock", {}).items())),
        )

    def registration_block(self) -> dict:
        """The summary's `registration` entry: how the protocol stood against frozen.lock."""
        return {"state": self.registration, "exploratory": self.exploratory}


def _range_dicts(ranges: tuple[tuple[str, int, int], ...]) -> list[dict]:
    return [{"group": g, "start": a, "stop": b} for g, a, b in ranges]


def _range_tuples(entries: list[dict]) -> tuple[tuple[str, int, int], ...]:
    return tuple((r["group"], int(r["start"]), int(r["stop"])) for r in entries)


TEMP_NAME = re.compile(r"^\..+\.[0-9a-f]{12}\.tmp$")  # `temp_path`'s names


def temp_path(path: Path) -> Path:
    """A fresh hidden name next to `path` for its temp file (not created here)."""
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")


def remove_stale_temps(bundle: Path) -> None:
    """Delete temp files a killed process left behind (names of `temp_path` only), before sealing."""
    for path in bundle.rglob(".*"):
        if path.is_file() and TEMP_NAME.match(path.name):
            path.unlink()


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` creates a temp file next to `path`, then it is renamed over `path`: `path` is
    either absent, its old content or the complete new one. The file is created by `write` with
    the process umask (never a fixed 0600 as tempfile.mkstemp would)."""
    tmp = temp_path(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_files(path: Path, files: dict[str, bytes]) -> None:
    """Write each `name -> bytes` under `path`, atomically."""
    for name, data in files.items():
        atomic_write(path / name, lambda tmp, data=data: tmp.write_bytes(data))


def json_text(obj: Any) -> str:
    """The bundle's JSON form: indented, sorted keys, strict (no NaN)."""
    return json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n"


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    text = json_text(obj)
    atomic_write(path, lambda tmp: tmp.write_text(text))


def read_json(path: Path) -> Any:
    """The JSON value of the regular file `path` (BundleError if it is missing, not a regular
    file, e.g. a symbolic link or a FIFO, which is never followed or opened, or not JSON)."""
    try:
        return json.loads(regular_file(path).read_text())
    except FileNotFoundError as err:
        raise BundleError(f"{path}: missing") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{path}: not valid JSON ({err})") from err


# ---------------------------------------------------------------- entries


ENTRY_KINDS = (
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISREG, "a regular file"),
)


def entry_kind(mode: int) -> str:
    """What an `lstat` mode describes, in words ("a symbolic link", "a FIFO", ...)."""
    return next((words for test, words in ENTRY_KINDS if test(mode)), f"an entry of mode {mode:o}")


def regular_file(path: Path) -> Path:
    """`path` when it is a regular file; BundleError naming what it is otherwise. A symbolic link
    is reported as one, never followed (FileNotFoundError when nothing is there)."""
    mode = path.lstat().st_mode
    if not stat.S_ISREG(mode):
        raise BundleError(f"{path}: {entry_kind(mode)}, not a regular file")
    return path


def _entries(directory: Path, prefix: str = "") -> Iterator[tuple[str, int]]:
    """(name relative to the bundle, lstat mode) of every entry under `directory`, in name order;
    a symbolic link is listed, never followed."""
    with os.scandir(directory) as found:
        entries = sorted(found, key=lambda entry: entry.name)
    for entry in entries:
        name, mode = prefix + entry.name, entry.stat(follow_symlinks=False).st_mode
        yield name, mode
        if stat.S_ISDIR(mode):
            yield from _entries(Path(entry.path), f"{name}/")


LAYOUT_DIRS = frozenset({SAMPLES_DIR, STAGE2_DIR, f"{STAGE2_DIR}/{SAMPLES_DIR}"})  # every directory a bundle has


def check_entries(bundle: Path, listed: set[str] | None) -> list[str]:
    """Every entry of the bundle that is neither a regular file nor a directory (symbolic links,
    FIFOs, devices, sockets) and every directory that is not one of LAYOUT_DIRS or, when `listed`
    (the files of SHA256SUMS) is given, that holds none of them. Reads no file."""
    holders = {"/".join(name.split("/")[:depth]) for name in listed or () for depth in range(1, name.count("/") + 1)}
    problems = []
    for name, mode in _entries(bundle):
        if stat.S_ISDIR(mode):
            if listed is not None and name not in holders:
                problems.append(f"{name}/: a directory holding no file of {SUMS_FILE}")
            elif name not in LAYOUT_DIRS:
                problems.append(f"{name}/: a directory outside the bundle layout")
        elif not stat.S_ISREG(mode):
            problems.append(f"{name}: {entry_kind(mode)}; a bundle holds regular files only (nothing is followed)")
    return problems


# ---------------------------------------------------------------- checksums


UNLISTED_FILES = (SUMS_FILE, SIGNATURE_FILE)  # files on disk that SHA256SUMS never lists (the seals)


def _files(bundle: Path, unlisted: tuple[str, ...] = UNLISTED_FILES) -> Iterator[str]:
    """Every regular file of the bundle but `unlisted`, dotfiles and files in subdirectories
    included (symbolic links and other entries are `check_entries`' to report)."""
    for name, mode in _entries(bundle):
        if stat.S_ISREG(mode) and name not in unlisted:
            yield name


def regular_files(bundle: Path) -> list[str]:
    """Every regular file of the bundle, in name order (links and other entries left out)."""
    return list(_files(bundle, ()))


NO_FOLLOW = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)  # a FIFO does not block


def sha256_file(path: Path) -> str:
    """SHA-256 of the regular file `path` (BundleError for a symbolic link or any other entry)."""
    try:
        handle = os.fdopen(os.open(path, NO_FOLLOW), "rb")
    except OSError as err:
        if path.is_symlink():
            raise BundleError(f"{path}: a symbolic link, not a regular file") from err
        raise
    with handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise BundleError(f"{path}: {entry_kind(mode)}, not a regular file")
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(bundle: Path) -> None:
    """SHA256SUMS over every regular file but itself and the lock file of the sealing process,
    written atomically: a fault while sealing (disk full) leaves no SHA256SUMS, never a partial
    one, so the bundle still completes (`check_completable`)."""
    text = "".join(f"{sha256_file(bundle / name)}  {name}\n" for name in _files(bundle, (*UNLISTED_FILES, LOCK_FILE)))
    atomic_write(bundle / SUMS_FILE, lambda tmp: tmp.write_text(text))


def read_sums(bundle: Path) -> dict[str, str]:
    """{file: sha256} of SHA256SUMS (BundleError if it is missing, not a regular file or malformed)."""
    path = bundle / SUMS_FILE
    try:
        text = regular_file(path).read_text(errors="replace")
    except FileNotFoundError as err:
        raise BundleError(f"{SUMS_FILE} is missing") from err
    listed = {}
    for number, line in enumerate(text.splitlines(), 1):
        digest, _, name = line.partition("  ")
        if not name:
            raise BundleError(f"{SUMS_FILE}: line {number} is not `<sha256>  <path>`")
        listed[name] = digest
    return listed


def check_sums(bundle: Path) -> list[str]:
    """Differences between SHA256SUMS and the files on disk (empty list: all match)."""
    try:
        listed = read_sums(bundle)
    except BundleError as err:
        return [str(err)]
    problems = []
    on_disk = set(_files(bundle))
    for name in sorted(set(listed) - on_disk):
        problems.append(f"{name}: listed in {SUMS_FILE} but missing")
    for name in sorted(on_disk - set(listed)):
        problems.append(f"{name}: present but not listed in {SUMS_FILE}")
    for name in sorted(on_disk & set(listed)):
        if sha256_file(bundle / name) != listed[name]:
            problems.append(f"{name}: sha256 differs from {SUMS_FILE}")
    return problems


# ---------------------------------------------------------------- manifest facts


def git_state(source: Path) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout whose tracked files include the directory
    `source`; both None when `source` is not tracked by a checkout (an installed package, or a
    package directory that some unrelated repository merely contains, e.g. a venv inside a repo)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=source, capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        return done.stdout.strip()

    if not git("ls-files", "--", "."):
        return {"commit": None, "dirty": None}
    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


SOURCE_PACKAGES = ("specval", "engine")  # the harness and the bundled system under test


def source_digest() -> str | None:
    """SHA-256 over every file of the installed `specval` and `engine` packages (each file's path
    relative to its package's parent, then its bytes, in path order; `__pycache__` left out).

    Guarantee: two sessions with the same digest ran the same harness and engine source and the
    same bundled weights, whatever the git metadata beside them says (a copied tree keeps stale
    git metadata; an installed package has none). It does not cover the dependencies (their
    versions are under `packages`) or an external adapter. None if a package cannot be found."""
    digest = hashlib.sha256()
    for name in SOURCE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            return None
        root = Path(spec.origin).resolve().parent
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def code_version() -> dict[str, Any]:
    """The code that runs: specval's version, the commit and dirty flag of the checkout that
    holds the package's own source (not of the current directory), and `source_digest()`."""
    return {
        "version": specval.__version__,
        **git_state(Path(specval.__file__).resolve().parent),
        "source_sha256": source_digest(),
    }


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_facts() -> dict[str, Any]:
    """CUDA device name, UUID and driver where CUDA is present; the CPU otherwise."""
    import platform

    import torch

    facts: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cuda": torch.cuda.is_available()}
    if facts["cuda"]:
        props = torch.cuda.get_device_properties(0)
        facts.update(name=props.name, uuid=str(getattr(props, "uuid", "")), cuda_version=torch.version.cuda)
        try:
            facts["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, subprocess.CalledProcessError, IndexError):
            facts["driver"] = None
    return facts


def invocation() -> list[str]:
    """The command line of this run with the program named `specval`: the manifest records what
    was asked, not where the program is installed."""
    return ["specval", *sys.argv[1:]]


# ---------------------------------------------------------------- protocol copies


def load_plan_protocol(
    path: Path, parse: Callable[[Any, str], Any], load: Callable[[Path], Any]
) -> tuple[Any, RunPlan]:
    """(protocol, plan) of a bundle, refused (BundleError) unless its three records agree:
    protocol.json's canonical hash equals run.json's `protocol_hash`, and protocol.yaml, parsed with
    `load` (the schema of the protocol's kind), has that same hash. `parse(raw, file)` parses
    protocol.json's content."""
    plan = RunPlan.from_dict(read_json(path / RUN_FILE))
    protocol = parse(read_json(path / PROTOCOL_JSON), str(path / PROTOCOL_JSON))
    if protocol.hash != plan.protocol_hash:
        raise BundleError(
            f"{path / PROTOCOL_JSON}: hash {protocol.hash[:12]} differs from {RUN_FILE}'s {plan.protocol_hash[:12]}"
        )
    if os.path.lexists(path / PROTOCOL_YAML):
        regular_file(path / PROTOCOL_YAML)  # a FIFO or a link is reported, never opened
    written = load(path / PROTOCOL_YAML)
    if written.hash != protocol.hash:
        raise BundleError(
            f"{path / PROTOCOL_YAML}: parses to hash {written.hash[:12]}, not {PROTOCOL_JSON}'s {protocol.hash[:12]}"
        )
    return protocol, plan


# ---------------------------------------------------------------- sessions


def read_typed(path: Path, kind: type) -> Any:
    """`read_json` of a file whose top level must be a `kind` (dict or list); BundleError otherwise."""
    value = read_json(path)
    if not isinstance(value, kind):
        raise BundleError(
            f"{path}: expected a JSON {'object' if kind is dict else 'array'}, found {type(value).__name__}"
        )
    return value


def read_sessions(path: Path) -> list[dict]:
    """The session records of the bundle (empty before the first session began)."""
    return read_typed(path / SESSIONS_FILE, list) if (path / SESSIONS_FILE).exists() else []


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def begin_session(path: Path, command: list[str] | None = None) -> int:
    """Record that a process starts working on the bundle (a run, or a resume): its command
    (None: this process's own, `invocation()`), start time and code version. Returns its index
    for `end_session`. A session that never ends (killed, or raised) keeps `finished` null. The
    process holds the bundle's lock from here on (`lock_bundle`; BundleError if another does)."""
    lock_bundle(path)
    sessions = read_sessions(path)
    sessions.append(
        {
            "command": list(command or invocation()),
            "started": _now(),
            "code": code_version(),
            "finished": None,
            "samples_drawn": None,
            "outcome": None,
        }
    )
    write_json(path / SESSIONS_FILE, sessions)
    return len(sessions) - 1


VERDICT_FILES_KEY = "verdict_files"  # a session that recorded a verdict: {file: sha256} it was decided from


def verdict_files(path: Path) -> dict[str, str]:
    """{file: sha256} of every regular file of the bundle but the session records, the lock, temp
    files, the seals and what is written after the verdict (manifest, reports): what a session that ends with a verdict records (`end_session`)."""
    skipped = (SESSIONS_FILE, LOCK_FILE, *UNLISTED_FILES, *SEALED_FILES)
    return {
        name: sha256_file(path / name) for name in _files(path, skipped) if not TEMP_NAME.match(name.rsplit("/", 1)[-1])
    }


def end_session(path: Path, index: int, samples_drawn: int | None, outcome: str) -> None:
    """Fill in the end of session `index`: finish time, samples it drew (None: not counted, the
    session failed or was interrupted), outcome (the verdict, "error" or "interrupted"). A
    session that ends with a verdict also records `verdict_files`, the hash of every file its
    verdict came from, which a resume that completes the bundle checks (`check_completable`)."""
    sessions = read_sessions(path)
    if not 0 <= index < len(sessions) or sessions[index]["finished"] is not None:
        raise BundleError(f"{path / SESSIONS_FILE}: no open session {index}")
    drawn = None if samples_drawn is None else int(samples_drawn)
    sessions[index].update(finished=_now(), samples_drawn=drawn, outcome=outcome)
    if outcome in FINISHED_OUTCOMES:
        sessions[index][VERDICT_FILES_KEY] = verdict_files(path)
    write_json(path / SESSIONS_FILE, sessions)


# ---------------------------------------------------------------- sample chunks

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


# ---------------------------------------------------------------- the bundle lock

# The bundles this process holds: resolved path -> descriptor of its lock file. A flock belongs
# to an open file, which must stay open from the claim (or the resume's checks) to the seal,
# across calls whose shapes every kind shares; the table is this process's, as the locks are.
_HELD_LOCKS: dict[Path, int] = {}


def _holder(path: Path) -> str:
    """Who holds the bundle's lock, as its lock file says ("pid 12 on host h since T")."""
    try:
        holder = json.loads((path / LOCK_FILE).read_text())
        return f"pid {holder['pid']} on {holder['host']} since {holder['since']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (its lock file names none)"


def lock_bundle(path: Path) -> None:
    """Hold the bundle's lock (`.specval.lock`, an exclusive flock) for this process until
    `release_bundle` or the process's end; held already by this process: nothing to do.

    Guarantee: two processes never work on one bundle at once; the second gets BundleError
    naming the holder's pid, host and start time. A killed holder's lock ends with it (the
    kernel drops a flock with its process), so a stale lock file never blocks a resume."""
    key = path.resolve()
    if key in _HELD_LOCKS:
        return
    try:
        fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o666)
    except OSError as err:
        raise BundleError(f"{path / LOCK_FILE}: cannot create the bundle's lock ({err.strerror or err})") from err
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as err:
        os.close(fd)
        raise BundleError(f"{path}: in use by {_holder(path)}; one process works on a bundle at a time") from err
    holder = {"pid": os.getpid(), "host": socket.gethostname(), "since": _now()}
    os.ftruncate(fd, 0)
    os.write(fd, json_text(holder).encode())
    _HELD_LOCKS[key] = fd


def release_bundle(path: Path) -> None:
    """Give up this process's lock of the bundle (none held: nothing to do); its lock file goes."""
    fd = _HELD_LOCKS.pop(path.resolve(), None)
    if fd is not None:
        (path / LOCK_FILE).unlink(missing_ok=True)
        os.close(fd)


# ---------------------------------------------------------------- resume


def _finished_session(path: Path) -> str | None:
    """Why the bundle's sessions say its run finished (None: no session ended with a verdict)."""
    for number, session in enumerate(read_sessions(path)):
        outcome = session.get("outcome") if isinstance(session, dict) else None
        if outcome in FINISHED_OUTCOMES:
            return f"{SESSIONS_FILE} records a finished run (session {number} ended {outcome} at {session.get('finished')})"
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


# ---------------------------------------------------------------- verification


def check_format(path: Path) -> list[str]:
    """The bundle format recorded in run.json must be one this code verifies (VERIFIABLE_FORMATS)."""
    found = RunPlan.from_dict(read_json(path / RUN_FILE)).bundle_format
    if found in VERIFIABLE_FORMATS:
        return []
    return [
        f"{RUN_FILE}: bundle format {found}, this specval verifies formats "
        f"{', '.join(map(str, VERIFIABLE_FORMATS))} (re-run it)"
    ]


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
        if not _regular_bytes(path / name) == data
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
    SHA256SUMS gets those entries and the checksums only: nothing else is read. A bundle of another format gets one line naming its format plus the
    checks every format promised (checksums, recomputed summary), not a line per missing record."""
    entries = _run_check(check_listed_entries, path)
    if entries:
        return entries + check_sums(path)  # nothing more is read: no link is followed out of the bundle
    old_format = _run_check(check_format, path)
    problems = check_sums(path) + old_format
    if not old_format:
        problems += [p for check in (check_layout, check_sessions, check_all_chunks) for p in _run_check(check, path)]
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


# ---------------------------------------------------------------- diff of recomputed values

FLOAT_RTOL = 1e-9  # relative agreement of a recomputed float (rounding of another machine)
FLOAT_ATOL = 1e-12  # absolute agreement near 0 (p-values far below any alpha)


def diff(stored: Any, recomputed: Any, path: str = "") -> list[str]:
    """Paths where two JSON values differ, with both values.

    Verdicts, reasons, counts and every other non-float are compared exactly. Two floats agree
    when they are within a relative FLOAT_RTOL (or FLOAT_ATOL near 0): a chi-square summed in
    another order (another numpy or BLAS build, another machine) moves the last bits, and a
    bundle made on a GPU machine must verify anywhere. A deliberate edit of a statistic is far
    outside that."""
    if isinstance(stored, dict) and isinstance(recomputed, dict):
        out = []
        for key in sorted(set(stored) | set(recomputed), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in stored or key not in recomputed:
                out.append(f"{sub}: {'missing in stored' if key not in stored else 'not recomputed'}")
            else:
                out.extend(diff(stored[key], recomputed[key], sub))
        return out
    if isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        return [d for i, (a, b) in enumerate(zip(stored, recomputed)) for d in diff(a, b, f"{path}[{i}]")]
    if isinstance(stored, float) and isinstance(recomputed, float):
        same = math.isclose(stored, recomputed, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_ATOL) or (
            math.isnan(stored) and math.isnan(recomputed)
        )
    else:
        same = stored == recomputed and type(stored) is type(recomputed)
    return [] if same else [f"{path}: stored {_short(stored)}, recomputed {_short(recomputed)}"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
