"""Bundle: the evidence directory of one run, its manifest, its checksums and its verification.

Layout of `results/<protocol>-<UTC timestamp>/`:

    protocol.yaml      the protocol file exactly as run
    protocol.json      its parsed canonical form (the input of the protocol hash)
    run.json           the run plan: bundle format, profile, seed ranges; written before sampling, used by
                       --resume (two-stage protocols: `stage2_ranges` is added when stage 2 is claimed)
    samples/*.parquet  raw samples, one file per seed chunk
    chunks.json        sha256 of every sample chunk, recorded as each chunk was written
    sessions.json      one record per process that worked on the bundle (a resumed run has several)
    reference.json     exact reference distributions (sparse, float64 round-trip)
    stage2/            second stage of a two-stage protocol, only when stage 1 FAILed:
                       stage2/samples/*.parquet, stage2/chunks.json and stage2/reference.json
    quadrature.json    exact output laws of the accept kernel (when the protocol has a quadrature test)
    summary.json       every criterion's statistic, df, p, alpha, verdict, MDE; planned vs effective n
    report.md, report.html
    manifest.json      protocol hash, code version, sessions, command, versions, device, seeds, times
    SHA256SUMS         sha256 of every other file, dotfiles included

Guarantees:
- A bundle is sealed once SHA256SUMS exists; `check_resumable` refuses to re-open it, and refuses an
  unsealed bundle whose written sample chunks differ from the hashes recorded when they were written.
- `verify_bundle` reports a difference if any byte of any file changed, if a file was added or
  removed, if a sample chunk differs from its recorded hash, if protocol.yaml does not parse to
  protocol.json, if any value of summary.json differs from a recomputation from the raw samples,
  or if report.md / report.html differ byte for byte from a re-rendering of the bundle.
- It cannot see a change that moves no statistic (two samples swapped within one stratum, with
  every hash recomputed), and the hashes prove that the bundle is self-consistent, not who made it.
- Every file is created with the process umask (0644 under the default umask 022).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import importlib.util
import json
import math
import os
import re
import secrets
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Iterator

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
CHUNKS_FILE = "chunks.json"  # {"samples/<file>": sha256} of one stage (the bundle or stage2/)
SESSIONS_FILE = "sessions.json"
REPORT_FILES = ("report.md", "report.html")
# 2: chunks.json, sessions.json, every file hashed, reports re-rendered by verify;
# 3: reference.json's probabilities and token ids as base64 arrays (`reference.Reference.to_dict`)
BUNDLE_FORMAT = 3
VERIFIABLE_FORMATS = (2, 3)  # format 2 differs only in reference.json's encoding, which is read too
LEGACY_FORMAT = 1  # bundles whose run.json records no format
PACKAGES = ("specval", "torch", "triton", "numpy", "scipy", "pandas", "pyarrow", "statsmodels", "matplotlib",
            "click", "pyyaml", "tqdm")


class BundleError(ValueError):
    """A bundle is missing a file or holds one that cannot be read."""


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

    def to_dict(self) -> dict:
        out = {"protocol": self.protocol, "protocol_hash": self.protocol_hash, "profile": self.profile,
               "ranges": _range_dicts(self.ranges), "bundle_format": self.bundle_format,
               "registration": self.registration, "exploratory": self.exploratory}
        if self.stage2_ranges:
            out["stage2_ranges"] = _range_dicts(self.stage2_ranges)
        if self.semantics:
            out["semantics"] = dict(self.semantics)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "RunPlan":
        return cls(data["protocol"], data["protocol_hash"], data["profile"], _range_tuples(data["ranges"]),
                   _range_tuples(data.get("stage2_ranges", [])), int(data.get("bundle_format", LEGACY_FORMAT)),
                   data.get("registration", "frozen"), bool(data.get("exploratory", False)),
                   tuple(sorted(data.get("semantics", {}).items())))

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
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise BundleError(f"{path}: missing") from err
    except json.JSONDecodeError as err:
        raise BundleError(f"{path}: not valid JSON ({err})") from err


# ---------------------------------------------------------------- checksums


def _files(bundle: Path) -> Iterator[str]:
    """Every file of the bundle but SHA256SUMS, dotfiles and files in subdirectories included."""
    for path in sorted(bundle.rglob("*")):
        name = path.relative_to(bundle).as_posix()
        if path.is_file() and name != SUMS_FILE:
            yield name


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(bundle: Path) -> None:
    lines = [f"{sha256_file(bundle / name)}  {name}\n" for name in _files(bundle)]
    (bundle / SUMS_FILE).write_text("".join(lines))


def check_sums(bundle: Path) -> list[str]:
    """Differences between SHA256SUMS and the files on disk (empty list: all match)."""
    path = bundle / SUMS_FILE
    if not path.exists():
        return [f"{SUMS_FILE} is missing"]
    listed = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        digest, _, name = line.partition("  ")
        if not name:
            return [f"{SUMS_FILE}: line {number} is not `<sha256>  <path>`"]
        listed[name] = digest
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
    return {"version": specval.__version__, **git_state(Path(specval.__file__).resolve().parent),
            "source_sha256": source_digest()}


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
            facts["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            facts["driver"] = None
    return facts


def invocation() -> list[str]:
    """The command line of this run with the program named `specval`: the manifest records what
    was asked, not where the program is installed."""
    return ["specval", *sys.argv[1:]]


# ---------------------------------------------------------------- protocol copies


def load_plan_protocol(path: Path, parse: Callable[[Any, str], Any], load: Callable[[Path], Any]) -> tuple[Any, RunPlan]:
    """(protocol, plan) of a bundle, refused (BundleError) unless its three records agree:
    protocol.json's canonical hash equals run.json's `protocol_hash`, and protocol.yaml, parsed with
    `load` (the schema of the protocol's kind), has that same hash. `parse(raw, file)` parses
    protocol.json's content."""
    plan = RunPlan.from_dict(read_json(path / RUN_FILE))
    protocol = parse(read_json(path / PROTOCOL_JSON), str(path / PROTOCOL_JSON))
    if protocol.hash != plan.protocol_hash:
        raise BundleError(f"{path / PROTOCOL_JSON}: hash {protocol.hash[:12]} differs from "
                          f"{RUN_FILE}'s {plan.protocol_hash[:12]}")
    written = load(path / PROTOCOL_YAML)
    if written.hash != protocol.hash:
        raise BundleError(f"{path / PROTOCOL_YAML}: parses to hash {written.hash[:12]}, not "
                          f"{PROTOCOL_JSON}'s {protocol.hash[:12]}")
    return protocol, plan


# ---------------------------------------------------------------- sessions


def read_typed(path: Path, kind: type) -> Any:
    """`read_json` of a file whose top level must be a `kind` (dict or list); BundleError otherwise."""
    value = read_json(path)
    if not isinstance(value, kind):
        raise BundleError(f"{path}: expected a JSON {'object' if kind is dict else 'array'}, found "
                          f"{type(value).__name__}")
    return value


def read_sessions(path: Path) -> list[dict]:
    """The session records of the bundle (empty before the first session began)."""
    return read_typed(path / SESSIONS_FILE, list) if (path / SESSIONS_FILE).exists() else []


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def begin_session(path: Path, command: list[str] | None = None) -> int:
    """Record that a process starts working on the bundle (a run, or a resume): its command
    (None: this process's own, `invocation()`), start time and code version. Returns its index
    for `end_session`. A session that never ends (killed, or raised) keeps `finished` null."""
    sessions = read_sessions(path)
    sessions.append({"command": list(command or invocation()), "started": _now(), "code": code_version(),
                     "finished": None, "samples_drawn": None, "outcome": None})
    write_json(path / SESSIONS_FILE, sessions)
    return len(sessions) - 1


def end_session(path: Path, index: int, samples_drawn: int | None, outcome: str) -> None:
    """Fill in the end of session `index`: finish time, samples it drew (None: not counted, the
    session failed or was interrupted), outcome (the verdict, "error" or "interrupted")."""
    sessions = read_sessions(path)
    if not 0 <= index < len(sessions) or sessions[index]["finished"] is not None:
        raise BundleError(f"{path / SESSIONS_FILE}: no open session {index}")
    drawn = None if samples_drawn is None else int(samples_drawn)
    sessions[index].update(finished=_now(), samples_drawn=drawn, outcome=outcome)
    write_json(path / SESSIONS_FILE, sessions)


# ---------------------------------------------------------------- sample chunks


def write_chunk(root: Path, path: Path, write: Callable[[Path], None]) -> None:
    """Write one sample chunk atomically and record its sha256 in `root/chunks.json`.

    Order: temp file, hash, record, rename. A kill at any point leaves either no chunk file (its
    record, if any, is replaced when the chunk is written again) or a chunk whose hash is recorded;
    never a chunk file without a record."""
    tmp = temp_path(path)
    try:
        write(tmp)
        index = read_chunk_index(root)
        index[path.relative_to(root).as_posix()] = sha256_file(tmp)
        write_json(root / CHUNKS_FILE, index)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_json_chunk(root: Path, path: Path, obj: Any) -> None:
    """`write_chunk` of a JSON sample file (quality bundles)."""
    text = json_text(obj)
    write_chunk(root, path, lambda tmp: tmp.write_text(text))


def read_chunk_index(root: Path) -> dict[str, str]:
    return read_typed(root / CHUNKS_FILE, dict) if (root / CHUNKS_FILE).exists() else {}


def _sample_files(root: Path) -> set[str]:
    """Sample files under root/samples, temp files of an interrupted write (dot names) excluded."""
    directory = root / SAMPLES_DIR
    return {p.relative_to(root).as_posix() for p in directory.rglob("*")
            if p.is_file() and not p.name.startswith(".")} if directory.is_dir() else set()


def check_chunks(root: Path, complete: bool) -> list[str]:
    """Differences between the sample files of one stage (the bundle or stage2/) and the hashes
    recorded as they were written. `complete`: every recorded chunk must also exist (a finished
    bundle); otherwise a recorded chunk may be missing (a run killed before its rename)."""
    where = "" if root.name != STAGE2_DIR else f"{STAGE2_DIR}/"
    if complete and not (root / CHUNKS_FILE).exists():
        return [f"{where}{CHUNKS_FILE} is missing"]
    index, on_disk = read_chunk_index(root), _sample_files(root)
    problems = [f"{where}{name}: written but its sha256 was never recorded in {CHUNKS_FILE}"
                for name in sorted(on_disk - set(index))]
    if complete:
        problems += [f"{where}{name}: recorded in {CHUNKS_FILE} but missing" for name in sorted(set(index) - on_disk)]
    problems += [f"{where}{name}: sha256 differs from the one recorded in {CHUNKS_FILE} when it was written"
                 for name in sorted(on_disk & set(index)) if sha256_file(root / name) != index[name]]
    return problems


def _stages(path: Path) -> list[Path]:
    return [path] + ([path / STAGE2_DIR] if (path / STAGE2_DIR).is_dir() else [])


def check_resumable(path: Path) -> None:
    """Refuse (BundleError naming the bundle) to resume anything but an unsealed bundle whose
    written chunks match their recorded hashes. Call it before the bundle is touched."""
    if not (path / RUN_FILE).is_file():
        raise BundleError(f"{path}: not a bundle ({RUN_FILE} missing)")
    if (path / SUMS_FILE).exists():
        raise BundleError(f"{path}: sealed ({SUMS_FILE} present); a sealed bundle is never re-opened, "
                          "start a new run")
    plan = RunPlan.from_dict(read_json(path / RUN_FILE))
    if plan.bundle_format != BUNDLE_FORMAT:
        raise BundleError(f"{path / RUN_FILE}: bundle format {plan.bundle_format}, this specval resumes "
                          f"format {BUNDLE_FORMAT} only")
    problems = [p for stage in _stages(path) for p in check_chunks(stage, complete=False)]
    if problems:
        raise BundleError(f"{path}: refusing to resume, its written samples do not match their recorded "
                          f"hashes: {'; '.join(problems)}")


# ---------------------------------------------------------------- verification


# what reading a corrupt bundle file can raise (BundleError is a ValueError; a JSON value of the
# wrong shape gives KeyError, TypeError, IndexError or AttributeError further on)
READ_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError, OSError)


def check_format(path: Path) -> list[str]:
    """The bundle format recorded in run.json must be one this code verifies (VERIFIABLE_FORMATS)."""
    found = RunPlan.from_dict(read_json(path / RUN_FILE)).bundle_format
    if found in VERIFIABLE_FORMATS:
        return []
    return [f"{RUN_FILE}: bundle format {found}, this specval verifies formats "
            f"{', '.join(map(str, VERIFIABLE_FORMATS))} (re-run it)"]


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


def check_sessions(path: Path) -> list[str]:
    """manifest.json must list exactly the session records of sessions.json."""
    sessions = read_sessions(path)
    if not sessions:
        return [f"{SESSIONS_FILE}: missing or empty"]
    if read_typed(path / MANIFEST_FILE, dict).get("sessions") != sessions:
        return [f"{MANIFEST_FILE}: sessions differ from {SESSIONS_FILE}"]
    return []


LAYOUT_FILES = frozenset({PROTOCOL_YAML, PROTOCOL_JSON, RUN_FILE, CHUNKS_FILE, SESSIONS_FILE, REFERENCE_FILE,
                          QUADRATURE_FILE, SUMMARY_FILE, MANIFEST_FILE, ERROR_LOG, *REPORT_FILES,
                          f"{STAGE2_DIR}/{CHUNKS_FILE}", f"{STAGE2_DIR}/{REFERENCE_FILE}"})


def check_layout(path: Path) -> list[str]:
    """Every file must be a file of the documented layout or a sample chunk recorded in a
    chunks.json: a file added and listed in a recomputed SHA256SUMS is still reported."""
    allowed = set(LAYOUT_FILES)
    for stage in _stages(path):
        prefix = "" if stage == path else f"{STAGE2_DIR}/"
        allowed |= {prefix + name for name in read_chunk_index(stage)}
    return [f"{name}: not a file of the bundle layout" for name in _files(path) if name not in allowed]


def check_all_chunks(path: Path) -> list[str]:
    """`check_chunks` of every stage of a finished bundle."""
    return [p for stage in _stages(path) for p in check_chunks(stage, complete=True)]


def check_rendered(path: Path, render: Callable[[Path], dict[str, bytes]]) -> list[str]:
    """Each report file must equal, byte for byte, its re-rendering from the bundle's files."""
    try:
        rendered = render(path)
    except READ_ERRORS as err:
        return [f"cannot re-render the report: {err}"]
    return [f"{name}: differs from its re-rendering from the bundle" for name, data in sorted(rendered.items())
            if not (path / name).is_file() or (path / name).read_bytes() != data]


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


def verify_bundle(path: Path, recompute: Callable[[Path], dict],
                  render: Callable[[Path], dict[str, bytes]]) -> list[str]:
    """Every difference between the bundle and its seals (SHA256SUMS, layout, chunks.json), its
    sessions, the summary `recompute(path)` derives from its raw files, and the reports
    `render(path)` makes. A bundle of another format gets one line naming its format plus the
    checks every format promised (checksums, recomputed summary), not a line per missing record."""
    old_format = _run_check(check_format, path)
    problems = check_sums(path) + old_format
    if not old_format:
        problems += [p for check in (check_layout, check_sessions, check_all_chunks) for p in _run_check(check, path)]
    problems += _recheck_summary(path, recompute)
    return problems + ([] if old_format else check_rendered(path, render))


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
            math.isnan(stored) and math.isnan(recomputed))
    else:
        same = stored == recomputed and type(stored) is type(recomputed)
    return [] if same else [f"{path}: stored {_short(stored)}, recomputed {_short(recomputed)}"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
