"""Bundle files: their names, the bundle's error, atomic writes, the JSON form, entry kinds.

Holds the name of every file and directory of the bundle layout (`specval.bundle`'s docstring
says what each holds), `BundleError` and the errors any read of a bundle can raise
(`SHAPE_ERRORS`, `READ_ERRORS`), temp files and atomic writes, the bundle's JSON form and its
reading, and the kinds of directory entries with the listings built on them. The bottom layer of
the package: it imports no other module of it.

Guarantees:
- `atomic_write` (and `write_json`, `write_files` through it) leaves `path` absent, with its old
  content or with the complete new one, never a partial file; the file is created with the
  process umask (0644 under the default umask 022), never a fixed 0600.
- `read_json`, `read_typed` and `regular_file` never follow a symbolic link nor open a FIFO or a
  device: such an entry is a BundleError naming what it is.
- `read_json` and `parse_json` read at most MAX_JSON_BYTES and refuse JSON nested deeper than
  MAX_JSON_DEPTH with a BundleError, never a RecursionError.
- `check_entries`, `regular_files` and the other listings read no file and follow no link.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

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
SEALED_FILES = (MANIFEST_FILE, *REPORT_FILES)  # written only after the run's verdict, just before the seal


class BundleError(ValueError):
    """A bundle is missing a file or holds one that cannot be read."""


# what reading a corrupt bundle file can raise (BundleError is a ValueError; a JSON value of the
# wrong shape gives KeyError, TypeError, IndexError or AttributeError further on), and with the
# operating system's refusals (OSError) what any read of a bundle can raise
SHAPE_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError)
READ_ERRORS = (*SHAPE_ERRORS, OSError)


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


# Every JSON file of a bundle is read within these bounds, so that a hostile bundle (say a
# summary.json of 200,000 nested brackets, or one of gigabytes) is a one-line BundleError in
# verify, ls, report and --resume, never a RecursionError traceback or an exhausted memory.
# 256 MiB is 15 times the largest JSON file of a kept bundle (a reference.json of 17 MB over a
# 49,152-token vocabulary); 32 levels is four times the deepest a bundle writes (summary.json's
# criteria within tests within groups, 8).
MAX_JSON_BYTES = 256 << 20
MAX_JSON_DEPTH = 32


def parse_json(data: bytes | str, where: object) -> Any:
    """The JSON value of `data` read from `where` (a path or a name), refused (BundleError naming
    `where` and the bound) when over MAX_JSON_BYTES, nested deeper than MAX_JSON_DEPTH or not JSON."""
    if len(data) > MAX_JSON_BYTES:
        raise BundleError(f"{where}: larger than {MAX_JSON_BYTES} bytes, the most a bundle's JSON file may hold")
    try:
        value = json.loads(data)
    except RecursionError as err:  # the parser's own recursion bound, far above MAX_JSON_DEPTH
        raise BundleError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels, the most a bundle's JSON may") from err
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BundleError(f"{where}: not valid JSON ({err})") from err
    if _depth(value) > MAX_JSON_DEPTH:
        raise BundleError(f"{where}: nested deeper than {MAX_JSON_DEPTH} levels, the most a bundle's JSON may")
    return value


def _depth(value: Any) -> int:
    """How deep arrays and objects nest in `value` (0: a scalar), without recursion."""
    deepest, pending = 0, [(value, 1)]
    while pending:
        item, level = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_JSON_DEPTH:  # one level past the bound is enough to refuse
            pending.extend((child, level + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def read_json(path: Path) -> Any:
    """The JSON value of the regular file `path` (BundleError if it is missing, not a regular
    file, e.g. a symbolic link or a FIFO, which is never followed or opened, larger than
    MAX_JSON_BYTES, which is never read whole, nested deeper than MAX_JSON_DEPTH, or not JSON)."""
    try:
        with regular_file(path).open("rb") as handle:
            data = handle.read(MAX_JSON_BYTES + 1)
    except FileNotFoundError as err:
        raise BundleError(f"{path}: missing") from err
    return parse_json(data, path)


def read_typed(path: Path, kind: type) -> Any:
    """`read_json` of a file whose top level must be a `kind` (dict or list); BundleError otherwise."""
    value = read_json(path)
    if not isinstance(value, kind):
        raise BundleError(
            f"{path}: expected a JSON {'object' if kind is dict else 'array'}, found {type(value).__name__}"
        )
    return value


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
