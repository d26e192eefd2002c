"""The worker of a Python API run: `specval.run` and `specval.resume` run the protocol in a child
process, under the rules of the command line's supervisor (specval.supervisor), and return only what
a sealed bundle on disk bears out.

The caller's process reads the protocol file (or the bundle's kind) and checks the arguments; the
adapter is imported, built and called only in the worker, started one of two ways:

- a fresh Python (this interpreter and its flags, this process's `sys.path`, working directory and
  environment) that imports the adapter by name: the protocol's `sut.adapter`, a name given as
  `sut`, or a class or function given as `sut` that `importable_name` finds (the same object as
  `module:qualname`, outside `__main__`). The default: the adapter imports and holds its devices
  (a GPU) as it does under `specval run`.
- a child forked from this process (`CAN_FORK`: POSIX), which calls the object itself: for an
  adapter with no importable name (a lambda, a closure, a class defined in a function or in
  `__main__`). A fork copies this process as it is: a CUDA context this process holds cannot be
  used in the child, and a lock another thread holds stays held there; give such an adapter a
  module-level name and it runs in a fresh Python. Without fork such an adapter is refused
  (TypeError, in `specval.api`).

The request (the call's arguments, `Request`) and the answer (the bundle, or the exception the call
raised) are JSON files in the supervisor's channel directory (specval.channel), which also carries
the bundle as soon as it exists and the adapter call the worker is in.

Guarantees, whatever the adapter does (return, raise, `sys.exit`, `os._exit` with any status, an
atexit hook, a signal, a crash, a hang past SPECVAL_TIMEOUT_S):
- `delegate` returns only a bundle whose SHA256SUMS, written since the call began, seals its
  summary.json (whatever its verdict), and only when the worker answered that bundle;
- an exception of the API that the run raised in the worker (`ANSWERED`) is raised again here:
  the same class (a subclass comes back as the first class of its MRO in `ANSWERED`), message and
  fields (`path`, `log`, `cause`, `call`, `errno`, file names);
- anything else raises execution.WorkerDied, a SUTRaised (the CLI's exit 3) whose one line names
  the worker's exit status or signal (or the timeout), the adapter call it was in or made last and
  the kept bundle: no answer (an exception outside the API's, a harness bug, leaves its traceback on
  the worker's stderr), an answer the disk does not bear out, a stop at SPECVAL_TIMEOUT_S (SIGTERM,
  then SIGKILL after SPECVAL_STOP_GRACE_S);
- a KeyboardInterrupt of the caller while it waits stops the worker as an interrupted run
  (RunInterrupted naming the kept bundle); a caller that leaves any other way kills the worker
  first; a worker whose caller died stops as an interrupted run within PARENT_POLL_S;
- `announce(bundle)` runs in the caller once the worker reports the bundle, and the worker draws no
  sample until it has returned (or ACK_WAIT_S passed).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from specval import channel, supervisor
from specval.bundle.files import BundleError
from specval.execution import EnvironmentFailed, RunFailed, RunInterrupted, WorkerDied, signals_interrupt
from specval.preflight import SUTRaised
from specval.protocol import ProtocolError
from specval.seeds import LedgerError, SeedOverlapError
from specval.sut import SUTError

REQUEST_FILE, ANSWER_FILE, ACK_PREFIX = "request.json", "answer.json", "announced-"
MAX_ANSWER_BYTES = 1 << 20  # an answer is a few KiB (a traceback at most); a larger file is no answer
ACK_POLL_S = 0.01  # how often the worker looks for the caller's acknowledgement of a bundle
ACK_WAIT_S = 60.0  # the longest the worker waits for the caller's `announce` to return
PARENT_POLL_S = 1.0  # how often the worker checks that its caller is alive
CAN_FORK = hasattr(os, "fork")
# The fresh worker's first statement: take the caller's sys.path (so specval and the adapter import
# as they do there), then serve the request of the channel directory given as its one argument.
BOOT = (
    "import json, os, sys; root = sys.argv[1]; "
    f"sys.path[:] = json.load(open(os.path.join(root, {REQUEST_FILE!r})))['sys_path']; "
    "from specval.api import serve; serve(root)"
)
# The exceptions the API raises, answered by class name; a message-only class is rebuilt from it.
MESSAGE_ONLY = (ProtocolError, SeedOverlapError, LedgerError, BundleError, SUTError, ValueError, TypeError)
ANSWERED = (RunFailed, EnvironmentFailed, RunInterrupted, SUTRaised, OSError, *MESSAGE_ONLY)
CLASSES = {cls.__name__: cls for cls in ANSWERED}


@dataclasses.dataclass(frozen=True)
class Request:
    """One API call for the worker: a new run of `protocol` (at `profile`, into `output`) or, with
    `resume`, the continuation of that bundle. `sut`: the adapter's name (None: the protocol's);
    `sut_object`: it names an object (`module:qualname`) rather than a `sut.adapter` value;
    `announce`: the caller waits to announce the bundle; `command`: the session record;
    `sys_path`: the caller's."""

    output: str
    command: tuple[str, ...]
    resume: str | None = None
    protocol: str | None = None
    profile: str | None = None
    exploratory: bool = False
    seed_offset: int | None = None
    junit: str | None = None
    progress: bool = False
    sut: str | None = None
    sut_object: bool = False
    announce: bool = False
    sys_path: tuple[str, ...] = ()


def supervised() -> bool:
    """Whether this process is itself a supervised worker (the CLI's or the API's): an API call here
    runs in this process, under that supervisor."""
    return channel.directory() is not None


def importable_name(obj: object) -> str | None:
    """`module:qualname` of `obj` when a fresh Python with this process's sys.path finds the same
    object there (a module-level class or function of a module other than __main__), else None."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or module == "__main__" or "<" in qualname:
        return None
    found: Any = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None)
    return f"{module}:{qualname}" if found is obj else None


def import_object(name: str) -> Any:
    """The object `importable_name` named (in the worker); SUTError naming it if it is not there."""
    module, _, qualname = name.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as err:
        raise SUTError(f"sut: cannot import {name!r} in the worker process ({err})") from err
    return found


# ---------------------------------------------------------------- the caller's side


def delegate(
    request: Request,
    announce: Callable[[Path], None] | None,
    forked: Callable[[Path], None] | None = None,
) -> tuple[Path, dict]:
    """Run `request` in a worker and return (bundle, its sealed summary.json), or raise (module
    doc). `forked(channel directory)`: run in a forked child instead of a fresh Python. ValueError
    naming SPECVAL_TIMEOUT_S or SPECVAL_STOP_GRACE_S when set to anything but seconds > 0."""
    timeout, grace = supervisor.stated_timeout(os.environ), supervisor.stated_grace(os.environ)
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="specval-worker-", ignore_cleanup_errors=True) as name:
        root = Path(name)
        (root / REQUEST_FILE).write_text(json.dumps(dataclasses.asdict(request)))
        worker = _start(root, forked)
        try:
            status, hung, interrupted = _watch(worker, root, timeout, grace, announce)
        finally:
            _reap(worker)
        return _outcome(root, status, hung, interrupted, started)


def _start(root: Path, forked: Callable[[Path], None] | None) -> subprocess.Popen | _Forked:
    if forked is None:
        flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]  # noqa: SLF001 - multiprocessing's own
        argv = [sys.executable, *flags, "-c", BOOT, str(root)]
        return subprocess.Popen(argv, env={**os.environ, channel.CHANNEL_ENV: str(root)})
    import multiprocessing

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()  # or the child would write this process's buffered output again
    process = multiprocessing.get_context("fork").Process(target=_forked_main, args=(root, forked), name="specval")
    process.start()
    return _Forked(process)


def _forked_main(root: Path, forked: Callable[[Path], None]) -> None:
    os.environ[channel.CHANNEL_ENV] = str(root)
    forked(root)


class _Forked:
    """A forked worker (multiprocessing.Process) behind the part of subprocess.Popen the waits use."""

    def __init__(self, process: Any) -> None:
        self.process, self.pid = process, process.pid

    def wait(self, timeout: float | None = None) -> int:
        self.process.join(timeout)
        if self.process.exitcode is None:
            raise subprocess.TimeoutExpired("specval worker", timeout or 0.0)
        return int(self.process.exitcode)

    def poll(self) -> int | None:
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    def kill(self) -> None:
        self.process.kill()


def _watch(
    worker: subprocess.Popen | _Forked,
    root: Path,
    timeout: float | None,
    grace: float,
    announce: Callable[[Path], None] | None,
) -> tuple[int, supervisor.Hung | None, bool]:
    """(status, Hung or None, whether the caller was interrupted) once the worker has ended."""
    last = lambda: channel.last_call(root)  # noqa: E731 - a name for the one expression both waits take
    tick = None if announce is None else _Acknowledger(root, announce).tick
    try:
        status, hung = supervisor.wait_worker(worker, timeout, grace, last, tick)  # type: ignore[arg-type]
        return status, hung, False
    except KeyboardInterrupt:
        if not supervisor.terminal_foreground():  # a terminal's Ctrl-C reached the worker already
            with contextlib.suppress(ProcessLookupError):
                worker.send_signal(signal.SIGINT)
        status, _ = supervisor.wait_worker(worker, grace, grace, last)  # type: ignore[arg-type]
        return status, None, True


def _reap(worker: subprocess.Popen | _Forked) -> None:
    """Kill and reap the worker if it still runs (the caller is leaving by an exception)."""
    if worker.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            worker.kill()
        worker.wait()


class _Acknowledger:
    """Calls `announce` for each bundle the worker reports, then lets the worker go on."""

    def __init__(self, root: Path, announce: Callable[[Path], None]) -> None:
        self.root, self.announce, self.done = root, announce, 0

    def tick(self) -> None:
        reported = [e for e in channel.read_events(self.root) if e.kind == channel.BUNDLE]
        for event in reported[self.done :]:
            self.announce(Path(str(event.value)))
            (self.root / f"{ACK_PREFIX}{self.done}").touch()
            self.done += 1


def _outcome(
    root: Path, status: int, hung: supervisor.Hung | None, interrupted: bool, started: float
) -> tuple[Path, dict]:
    reported = [Path(str(e.value)) for e in channel.read_events(root) if e.kind == channel.BUNDLE]
    kept, call = (reported[-1] if reported else None), channel.last_call(root)
    if hung is not None:
        raise _died(f"the worker {hung.text()}", hung.call, kept, status)
    answer = _read_answer(root)
    if isinstance(answer, BaseException):
        raise answer
    if answer is None or interrupted:  # an interrupted caller gets no result, even of a run that ended
        if interrupted:
            raise RunInterrupted(kept)
        raise _died(f"the worker {supervisor.describe_status(status)} without reporting an outcome", call, kept, status)
    summary, problem = supervisor.sealed_summary(answer, started)
    if not isinstance(summary, dict) or "verdict" not in summary:
        problem = problem or f"the summary.json of the bundle {answer} records no verdict"
        raise _died(f"the worker answered with the bundle {answer}, but {problem}", call, answer, status)
    return answer, summary


def _died(what: str, call: channel.Call | None, kept: Path | None, status: int) -> WorkerDied:
    text = supervisor.call_text(call)
    if kept is None:
        where = "; no bundle was announced"
    elif (kept / "SHA256SUMS").is_file():
        where = f"; the bundle {kept} is sealed: check it with specval.verify({str(kept)!r})"
    else:
        where = f"; the bundle {kept} is kept; resume it with specval.resume({str(kept)!r})"
    return WorkerDied(f"{what} ({text}){where}", text, kept, status)


def _read_answer(root: Path) -> Path | BaseException | None:
    """The bundle the worker answered, the exception it answered, or None (no answer it could
    have written: missing, too large, not JSON, not of the answer's shape)."""
    try:
        with (root / ANSWER_FILE).open("rb") as handle:
            text = handle.read(MAX_ANSWER_BYTES + 1)
        if len(text) > MAX_ANSWER_BYTES:
            return None
        raw = json.loads(text)
        if "bundle" in raw:
            return Path(_text(raw["bundle"]))
        return decode(raw["error"])
    except (OSError, ValueError, TypeError, KeyError, RecursionError):
        return None


# ---------------------------------------------------------------- the worker's side


def read_request(root: Path) -> Request:
    """The Request in the channel directory `root` (written by `delegate`)."""
    raw = json.loads((root / REQUEST_FILE).read_text())
    return Request(**{**raw, "command": tuple(raw["command"]), "sys_path": tuple(raw["sys_path"])})


def answer_call(root: Path, wait_for_ack: bool, call: Callable[[Callable[[Path], None]], Path]) -> None:
    """Run `call(announce)` (the API run, returning its sealed bundle) with SIGTERM as an interrupt
    and the caller watched, and write the answer: the bundle, or the exception of `ANSWERED` it
    raised (a KeyboardInterrupt answers RunInterrupted naming the announced bundle). Anything else
    propagates: the worker ends without an answer."""
    announcer = _Announcer(root, wait_for_ack)
    _watch_caller(os.getppid())
    try:
        with signals_interrupt():
            answer: dict = {"bundle": str(call(announcer))}
    except ANSWERED as err:
        answer = {"error": encode(err)}
    except KeyboardInterrupt:
        answer = {"error": encode(RunInterrupted(announcer.last))}
    _write_answer(root / ANSWER_FILE, answer)


class _Announcer:
    """The worker's `announce`: report the bundle on the channel, then (when the caller announces it
    itself) wait until the caller has."""

    def __init__(self, root: Path, wait_for_ack: bool) -> None:
        self.root, self.wait_for_ack, self.count, self.last = root, wait_for_ack, 0, None

    def __call__(self, path: Path) -> None:
        channel.report_bundle(path)
        self.last, self.count = Path(path), self.count + 1
        if self.wait_for_ack:
            ack, deadline = self.root / f"{ACK_PREFIX}{self.count - 1}", time.monotonic() + ACK_WAIT_S
            while not ack.exists() and time.monotonic() < deadline:
                time.sleep(ACK_POLL_S)


def _watch_caller(caller: int) -> None:
    """A daemon thread that sends this process SIGTERM (an interrupt: the bundle is kept) once its
    caller `caller` is gone (this process was re-parented)."""

    def watch() -> None:
        while os.getppid() == caller:
            time.sleep(PARENT_POLL_S)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="specval-caller-watch", daemon=True).start()


# ---------------------------------------------------------------- the answer's codec


def encode(err: BaseException) -> dict:
    """An exception of `ANSWERED` as JSON: its class (the first of its MRO in ANSWERED), message
    and the fields its constructor takes."""
    cls = next(c for c in type(err).__mro__ if c in ANSWERED)
    raw: dict[str, Any] = {"class": cls.__name__, "message": str(err)}
    if isinstance(err, (RunFailed, EnvironmentFailed)):
        raw |= {"path": str(err.path), "cause": encode(err.cause)}
        raw |= {"log": str(err.log)} if isinstance(err, RunFailed) else {}
    elif isinstance(err, RunInterrupted):
        raw["path"] = None if err.path is None else str(err.path)
    elif isinstance(err, SUTRaised):
        raw |= {"call": err.call, "sut_message": err.message, "details": err.details}
    elif isinstance(err, OSError):
        raw |= {"errno": err.errno, "strerror": err.strerror}
        raw |= {"filename": _name(err.filename), "filename2": _name(err.filename2)}
    return raw


def decode(raw: dict) -> BaseException:
    """The exception `encode` wrote (TypeError or KeyError for anything else)."""
    cls = CLASSES[_text(raw["class"])]
    if cls is RunFailed:
        return RunFailed(Path(_text(raw["path"])), Path(_text(raw["log"])), _cause(raw, SUTRaised))
    if cls is EnvironmentFailed:
        return EnvironmentFailed(Path(_text(raw["path"])), _cause(raw, OSError))
    if cls is RunInterrupted:
        return RunInterrupted(None if raw["path"] is None else Path(_text(raw["path"])))
    if cls is SUTRaised:
        return SUTRaised(_text(raw["call"]), _text(raw["sut_message"]), _text(raw["details"]))
    if cls is OSError and isinstance(raw["errno"], int):
        return OSError(raw["errno"], _text(raw["strerror"] or ""), raw["filename"], None, raw["filename2"])
    return cls(_text(raw["message"]))


def _cause(raw: dict, cls: type) -> Any:
    cause = decode(raw["cause"])
    if not isinstance(cause, cls):
        raise TypeError(f"the cause of a {raw['class']} must be a {cls.__name__}")
    return cause


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {type(value).__name__}")
    return value


def _name(value: Any) -> str | None:
    return None if value is None else os.fsdecode(value) if isinstance(value, (str, bytes)) else str(value)


def _write_answer(path: Path, raw: dict) -> None:
    """Write `raw` to `path` whole or not at all (temp file + rename); an answer the disk refused is
    one the caller finds missing (WorkerDied)."""
    temp = path.with_name(path.name + ".tmp")
    with contextlib.suppress(OSError):
        temp.write_text(json.dumps(raw))
        os.replace(temp, path)
