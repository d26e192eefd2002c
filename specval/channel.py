"""The channel from a supervised worker to its supervisor (specval.supervisor): files in a directory
that the supervisor names in the worker's environment (`CHANNEL_ENV`).

Standard library only, so that both sides import it for nothing. Two kinds of file:

- `events.jsonl`: one JSON object a line, appended (O_APPEND, one write each) by any process that
  inherited the variable (the worker, the ranks torchrun starts for it): `bundle` (a bundle exists,
  before any sample is drawn), `ok` (the command itself found nothing wrong: check-adapter, mutate,
  calibrate), `exit` (the status a process leaves with, from its SystemExit). Each names its pid.
- `call-<pid>`: the adapter call a process is in or made last (`adapter_call`), rewritten in place
  at offset 0 (one pwrite per call boundary, so the file never grows).

Guarantees: every write is one system call of a short record, so a process killed at any point
leaves whole records or none (`read_events` skips a torn line rather than trusting it); no write
raises (a channel that cannot be written costs the supervisor information, never the run); without
`CHANNEL_ENV` in the environment nothing is written. The channel is a report, not a proof: the
supervisor checks what it says against the bundle on disk before it exits 0.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

CHANNEL_ENV = "SPECVAL_SUPERVISOR_CHANNEL"  # the channel directory; set in a supervised worker only
EVENTS_FILE = "events.jsonl"
CALL_PREFIX = "call-"
CALL_RECORD_BYTES = 512  # a call record's fixed width, padded: its name and rank are cut to NAME_CHARS
NAME_CHARS = 96  # ASCII after `_short`, at most 2 JSON bytes a character: 2 fields * 192 + keys < 512
RUNNING, RETURNED = "running", "returned"
BUNDLE, OK, EXIT = "bundle", "ok", "exit"


@dataclass(frozen=True)
class Event:
    """One line of events.jsonl: `kind` (BUNDLE, OK, EXIT) from process `pid`; `value` the bundle's
    path, the command's name or the exit status."""

    kind: str
    pid: int
    value: str | int


@dataclass(frozen=True)
class Call:
    """The adapter call a process is in (`state` RUNNING) or made last (RETURNED), and its rank."""

    name: str
    state: str
    rank: str | None


def directory(environ: Mapping[str, str] = os.environ) -> Path | None:
    """The channel directory of this (worker) process; None when nothing supervises it."""
    value = environ.get(CHANNEL_ENV)
    return Path(value) if value else None


# ---------------------------------------------------------------- the worker's side


def _append(kind: str, value: str | int) -> None:
    root = directory()
    if root is None:
        return
    # a leading newline too: a record torn by a process killed mid-write never swallows this one
    line = "\n" + json.dumps({"kind": kind, "pid": os.getpid(), "value": value}) + "\n"
    with contextlib.suppress(OSError):
        fd = os.open(root / EVENTS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, line.encode())
        finally:
            os.close(fd)


def report_bundle(path: Path) -> None:
    """Tell the supervisor the bundle at `path` exists (what a crash message names)."""
    _append(BUNDLE, str(path))


def report_ok(command: str) -> None:
    """Tell the supervisor `command` found nothing wrong: what its exit 0 stands on (check-adapter,
    mutate, calibrate; a run's stands on its sealed bundle)."""
    _append(OK, command)


def report_exit(code: int) -> None:
    """Tell the supervisor the status this process is leaving with."""
    _append(EXIT, code)


@contextlib.contextmanager
def exit_reported() -> Iterator[None]:
    """Report the status of a SystemExit leaving the block (click ends every command with one), then
    let it go on. Anything else is not reported: the supervisor reads its absence as a crash."""
    try:
        yield
    except SystemExit as done:
        report_exit(exit_status(done.code))
        raise


def exit_status(code: object) -> int:
    """The status Python leaves with for SystemExit(code): the int, 0 for None, else 1."""
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


class _CallFile:
    """This process's call-<pid> file, opened on first use (again after a fork: the pid changed)."""

    def __init__(self) -> None:
        self.pid = -1
        self.fd: int | None = None

    def write(self, name: str, state: str) -> None:
        root = directory()
        if root is None:
            return
        rank = os.environ.get("RANK")
        record = json.dumps({"name": _short(name), "state": state, "rank": None if rank is None else _short(rank)})
        with contextlib.suppress(OSError):
            if self.pid != os.getpid():
                self.pid, self.fd = os.getpid(), None
                self.fd = os.open(root / f"{CALL_PREFIX}{self.pid}", os.O_WRONLY | os.O_CREAT, 0o600)
            if self.fd is not None:
                os.pwrite(self.fd, record.encode().ljust(CALL_RECORD_BYTES), 0)


def _short(text: str) -> str:
    return text.encode("ascii", "backslashreplace").decode()[:NAME_CHARS]


_CALLS = _CallFile()


@contextlib.contextmanager
def adapter_call(name: str) -> Iterator[None]:
    """Record that the adapter's `name` is running, and that it returned (or raised) once it has."""
    _CALLS.write(name, RUNNING)
    try:
        yield
    finally:
        _CALLS.write(name, RETURNED)


# ---------------------------------------------------------------- the supervisor's side


def read_events(root: Path) -> list[Event]:
    """The whole records of events.jsonl, in order (none if the file is missing)."""
    try:
        text = (root / EVENTS_FILE).read_text(errors="replace")
    except OSError:
        return []
    return [event for event in map(_event, filter(None, text.splitlines())) if event is not None]


def _event(line: str) -> Event | None:
    try:
        raw = json.loads(line)
        kind, pid, value = raw["kind"], raw["pid"], raw["value"]
    except (ValueError, TypeError, KeyError):
        return None
    if kind not in (BUNDLE, OK, EXIT) or not isinstance(pid, int) or not isinstance(value, (str, int)):
        return None
    return Event(kind, pid, value)


def last_call(root: Path) -> Call | None:
    """The call record written last by any process of the worker (None: no adapter call was made)."""
    files = sorted(root.glob(f"{CALL_PREFIX}*"), key=_modified)
    for path in reversed(files):
        try:
            raw = json.loads(path.read_bytes().rstrip())
            return Call(str(raw["name"]), str(raw["state"]), raw.get("rank"))
        except (OSError, ValueError, TypeError, KeyError):
            continue
    return None


def _modified(path: Path) -> int:
    try:
        return path.stat().st_mtime_ns
    except OSError:
        return 0
