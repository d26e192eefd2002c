"""Sessions: the processes that work on a bundle, their records in sessions.json and the lock one holds.

A session is one process working on the bundle (a run, each resume): `begin_session` records its
command, start time and code, `end_session` its end, the samples it drew and its outcome, and, for
a verdict, the hash of every file the verdict came from (`verdict_files`). While it works the
process holds the bundle's lock (`.specval.lock`, `lock_bundle`) until `release_bundle` (the seal).

Guarantees:
- Two processes never work on one bundle at once: the second gets BundleError naming the holder's
  pid, host and start time. A killed holder's lock ends with it (the kernel drops a flock with
  its process), so a stale lock file never blocks a resume.
- A session that never ends (killed, or raised) keeps `finished` null; a session is ended once.
"""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import socket
from pathlib import Path

from specval.bundle.facts import code_version, invocation
from specval.bundle.files import (
    LOCK_FILE,
    SEALED_FILES,
    SESSIONS_FILE,
    TEMP_NAME,
    UNLISTED_FILES,
    BundleError,
    _files,
    json_text,
    read_typed,
    write_json,
)
from specval.bundle.sums import sha256_file

FINISHED_OUTCOMES = ("PASS", "FAIL", "INCONCLUSIVE")  # a session that ended with one of them finished the run


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
    files, the seals and what is written after the verdict (manifest, reports): what a session
    that ends with a verdict records (`end_session`)."""
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
