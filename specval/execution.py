"""Execution: how a run ends when it does not end in a verdict.

Exit codes of `specval run` and `specval bench` (and what raises them), one meaning each:

    0  PASS                     the run's verdict, after summary.json is written and the bundle sealed
    1  FAIL                     the run's verdict
    2  input or usage error     ProtocolError, BundleError, SeedOverlapError, SUTError (a refusal)
    3  the system under test    SUTRaised before any seed (probe, import or constructor), RunFailed after
                                (bundle marked ERROR); SystemExit raised by adapter code included
    4  INCONCLUSIVE             the run's verdict: it could not decide (nothing testable, too few samples)
    5  environment error        OSError of the harness (disk full, file too large, permissions, a path
                                of the wrong type): EnvironmentFailed while a bundle is open, else the
                                OSError itself; the bundle is kept, unsealed, and resumes
    130 interrupted             RunInterrupted (SIGINT or SIGTERM)

Guarantees:
- `verdict_exit` is the only map from a verdict to an exit code: 0 for "PASS" and nothing else.
- `guard_bundle` turns an exception raised by the system under test while a bundle is open into
  RunFailed: the traceback goes to `error.log` in the bundle (appended, one block per failure), the
  bundle stays unsealed and resumable (its lock given up), and the terminal gets one line. An
  OSError raised by the harness there becomes EnvironmentFailed (the session is closed as "error"
  when the disk lets it; the lock is given up either way).
- An interrupt (SIGINT, or SIGTERM once `signals_interrupt` is installed) becomes RunInterrupted
  naming the bundle. Chunks are written atomically (temp file + rename), so an interrupted chunk is
  either complete or absent; `--resume` collects what is missing.
- A probe failure of a new run (no bundle exists yet) goes to `probe-error-<UTC time>.log` in the
  output root; of a resumed run, to the bundle's `error.log`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import errno
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specval import bundle as bundles
from specval.exits import (  # the statuses live below the harness, where the supervisor reads them too
    EXIT_ENVIRONMENT,
    EXIT_FAIL,
    EXIT_INCONCLUSIVE,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_PASS,
    EXIT_SUT,
    VERDICT_EXITS,
    resume_command,
    verdict_exit,
)
from specval.preflight import SUTRaised

ERROR_LOG = bundles.ERROR_LOG  # in a bundle: tracebacks of the system under test, one block per failure
PROBE_LOG_PREFIX = "probe-error-"  # in the output root: a probe failure (no bundle exists yet)


class RunFailed(Exception):
    """The system under test raised while the bundle `path` was open; its traceback is in `log`."""

    def __init__(self, path: Path, log: Path, cause: SUTRaised):
        super().__init__(str(cause))
        self.path, self.log, self.cause = path, log, cause


class EnvironmentFailed(Exception):
    """The operating system refused the harness (`cause`: disk full, file too large, permission...)
    while the bundle `path` was open; the bundle is kept, unsealed, and resumes."""

    def __init__(self, path: Path, cause: OSError):
        super().__init__(describe_os_error(cause))
        self.path, self.cause = path, cause


class WorkerDied(SUTRaised):
    """The worker process of a Python API run (specval.worker) ended without an outcome that the
    bundle on disk bears out: it exited (`os._exit`, `sys.exit` outside the adapter's calls), was
    killed by a signal or crashed, or was stopped at the stated timeout. A SUTRaised, so it is what
    the CLI's exit 3 is: `str(err)` is the one line naming what happened, `call` the adapter call it
    was in or made last, `path` the bundle kept for `specval.resume` (None: none was announced) and
    `status` the worker's exit status (negative: the signal that killed it)."""

    def __init__(self, line: str, call: str, path: Path | None, status: int):
        super().__init__(call, line)
        self.args = (line,)
        self.path, self.status = path, status


class RunInterrupted(Exception):
    """SIGINT or SIGTERM arrived while the bundle `path` was open (None: before it existed)."""

    def __init__(self, path: Path | None):
        super().__init__("interrupted")
        self.path = path


def describe_os_error(err: OSError) -> str:
    """One line for an OSError: errno name, message and the file(s) it names, e.g.
    "ENOSPC (No space left on device): results/b/samples/x.parquet"."""
    name = errno.errorcode.get(err.errno, "") if isinstance(err.errno, int) else ""
    text = err.strerror or str(err) or type(err).__name__
    files = [str(f) for f in (err.filename, err.filename2) if f is not None]
    head = f"{name} ({text})" if name else text
    return f"{head}: {' -> '.join(files)}" if files else head


def _stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat()


def append_log(log: Path, err: SUTRaised) -> Path:
    """Append the failure's traceback to `log` (created with the process umask)."""
    with log.open("a") as handle:
        handle.write(f"=== {_stamp()}: {err}\n{err.details.rstrip()}\n\n")
    return log


def probe_log(directory: Path, err: SUTRaised) -> Path:
    """Write a probe failure's traceback to a new log file in `directory` (the output root of a new
    run, created if needed: preflight found it creatable; the bundle of a resumed one)."""
    directory.mkdir(parents=True, exist_ok=True)
    name = PROBE_LOG_PREFIX + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S%fZ") + ".log"
    return append_log(directory / name, err)


@contextmanager
def guard_bundle(path: Path, session: int | None = None) -> Iterator[None]:
    """While the bundle at `path` is open: SUTRaised -> RunFailed (logged), OSError of the harness ->
    EnvironmentFailed, interrupt -> RunInterrupted; each way the open `session` (bundle.begin_session)
    is closed as "error" or "interrupted" (for EnvironmentFailed: when the disk still takes it)."""
    try:
        yield
    except SUTRaised as err:
        _close(path, session, "error")
        raise RunFailed(path, append_log(path / ERROR_LOG, err), err) from err
    except OSError as err:
        _close_if_possible(path, session, "error")
        raise EnvironmentFailed(path, err) from err
    except KeyboardInterrupt as err:
        _close(path, session, "interrupted")
        raise RunInterrupted(path) from err


def _close(path: Path, session: int | None, outcome: str) -> None:
    """Close the open session as `outcome` and give up this process's lock of the bundle."""
    try:
        if session is not None:
            bundles.end_session(path, session, None, outcome)
    finally:
        bundles.release_bundle(path)


def _close_if_possible(path: Path, session: int | None, outcome: str) -> None:
    """`_close`, unless the file system that just failed refuses that too: the session then stays
    open (`finished` null), as for a killed process, and the bundle still resumes."""
    with contextlib.suppress(OSError):  # the original OSError is what the user is told about
        _close(path, session, outcome)


def _raise_interrupt(signum, frame) -> None:  # noqa: ARG001 - signal handler signature
    raise KeyboardInterrupt


@contextmanager
def signals_interrupt() -> Iterator[None]:
    """SIGTERM behaves like SIGINT (KeyboardInterrupt) inside the block; the old handler comes back after."""
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


__all__ = [
    "EXIT_ENVIRONMENT",
    "EXIT_FAIL",
    "EXIT_INCONCLUSIVE",
    "EXIT_INPUT",
    "EXIT_INTERRUPTED",
    "EXIT_PASS",
    "EXIT_SUT",
    "VERDICT_EXITS",
    "EnvironmentFailed",
    "RunFailed",
    "RunInterrupted",
    "WorkerDied",
    "append_log",
    "describe_os_error",
    "guard_bundle",
    "probe_log",
    "resume_command",
    "signals_interrupt",
    "verdict_exit",
]
