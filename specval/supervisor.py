"""The supervisor: the `specval` process a user or CI starts for a command that runs adapter code
(`SUPERVISED_COMMANDS`) runs that command in a worker process and decides the exit status from what
the worker reported (specval.channel) and what is sealed on disk.

The worker is the same Python re-running the same command line (`worker_argv`: interpreter flags,
`sys.path[0]` and `sys.argv[0]` as here), with the channel directory in its environment; it
inherits stdin, stdout and stderr, so the user sees its output unchanged. The adapter is imported,
built and called only in the worker (and in the processes it starts: torchrun's ranks, mutate's
workers), never here; this process imports the standard library, specval.channel and
specval.exits, and specval.bundle once the worker is gone.

Guarantees, whatever adapter code does (return, raise, `sys.exit`, `os._exit` with any status, an
atexit hook, a signal, a crash of the interpreter):
- 0 only if the worker reported exit 0 and: for `run` and `bench` (`SEALING_COMMANDS`), every bundle
  the run announced has a SHA256SUMS written since this supervisor started that seals a
  summary.json whose verdict is PASS (at least one bundle); for the other commands, the command
  reported its success itself (`channel.report_ok`, written just before it exits 0).
- A reported non-zero status is kept (1, 2, 3, 4, 5, 130); a status the worker left with that
  differs from the one it reported (code run at exit) adds one note line, and the reported one stands.
- A worker that exits, is killed or crashes without reporting is exit 3 with one line: its exit
  status or signal, the adapter call it was in or made last, and the kept bundle (with the
  `specval run --resume` command) or "no bundle was announced"; 130 if this supervisor was
  interrupted meanwhile.
- SIGTERM (and SIGINT sent to this process alone) is passed on to the worker, which stops as an
  interrupted run does (130). A Ctrl-C at a terminal reaches the worker directly (one process
  group), so it is not sent a second time.
- With TIMEOUT_ENV set, a worker still running that long after the start gets SIGTERM and, if it
  is still running the grace later (GRACE_ENV, default STOP_GRACE_S), SIGKILL: exit 3, one line
  naming the timeout, the last adapter call and whether the worker had to be killed.
The channel is the worker's word; the seal check is what makes a 0 more than that word. Adapter
code that forges a sealed PASS bundle on purpose is outside what a status can show: `specval
verify` recomputes the verdict from the raw samples.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from specval import channel
from specval.exits import (
    EXIT_ENVIRONMENT,
    EXIT_INPUT,
    EXIT_INTERRUPTED,
    EXIT_PASS,
    EXIT_SUT,
    PASS_VERDICT,
    resume_command,
)

SUPERVISED_COMMANDS = frozenset({"run", "bench", "check-adapter", "mutate", "calibrate"})  # they run adapter code
SEALING_COMMANDS = frozenset({"run", "bench"})  # their 0 stands on sealed PASS bundles
HELP_FLAGS = frozenset({"-h", "--help"})  # help runs no adapter: not supervised
RANK_ENV, LEADER_RANK = "RANK", "0"  # torchrun's rank variable (specval.distribution.sharding) and rank 0
SEAL_CLOCK_SLACK_S = 2.0  # a file's mtime may lag time.time() by a clock tick of the file system
FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM)
TIMEOUT_ENV = "SPECVAL_TIMEOUT_S"  # the longest a supervised command may run, in seconds (unset: no limit)
TICK_S = 0.05  # how often `wait_worker` calls its `tick` while the worker runs
STOP_GRACE_S = 30.0  # after a timeout's SIGTERM, the worker's time to stop as an interrupted run before SIGKILL
GRACE_ENV = "SPECVAL_STOP_GRACE_S"  # overrides STOP_GRACE_S, in seconds (unset: STOP_GRACE_S)
# The worker's first statement: take this process's sys.path[0] and argv[0] (as `-c` has neither),
# then run the command line as `specval` does.
WORKER_BOOT = (
    "import sys; sys.path[0] = sys.argv[1]; sys.argv[:3] = sys.argv[2:3]; from specval.__main__ import entry; entry()"
)


@dataclass(frozen=True)
class Outcome:
    """What a finished worker left: its `status` (negative: killed by that signal), the status it
    reported (None: none), whether its command reported success, the bundles announced (by it or
    its ranks, in order), the adapter call made last, and whether this supervisor was interrupted."""

    status: int
    reported: int | None
    ok: bool
    bundles: tuple[Path, ...]
    call: channel.Call | None
    interrupted: bool


@dataclass(frozen=True)
class Decision:
    """The supervisor's exit status and the one line it prints on stderr (None: nothing to add)."""

    code: int
    line: str | None


def command_of(args: list[str]) -> str | None:
    """The command named by a command line's arguments (its first word that is not an option)."""
    return next((arg for arg in args if not arg.startswith("-")), None)


def wanted(args: list[str], environ: Mapping[str, str] = os.environ) -> bool:
    """Whether `specval ARGS` runs under a supervisor: a command that runs adapter code, not asking
    for help, in a process that is not itself a supervised worker, nor a torchrun rank other than 0
    (rank 0 decides a multi-rank run's status; another rank exits with the code rank 0 sends it and
    announces no bundle)."""
    return (
        channel.directory(environ) is None
        and environ.get(RANK_ENV, LEADER_RANK) == LEADER_RANK
        and command_of(args) in SUPERVISED_COMMANDS
        and not HELP_FLAGS.intersection(args)
    )


def worker_argv(argv: list[str]) -> list[str]:
    """The worker's command line for this process's `argv`: same interpreter and flags, same
    sys.path[0] and argv[0] (so the adapter imports as it would here)."""
    flags = subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]  # noqa: SLF001 - multiprocessing's own
    return [sys.executable, *flags, "-c", WORKER_BOOT, sys.path[0], argv[0], *argv[1:]]


def supervise(argv: list[str]) -> int:
    """Run `argv` (this process's sys.argv) in a worker and return the exit status it earns (see
    the module doc), after printing its one line, if any, on stderr."""
    command = command_of(argv[1:]) or ""
    started = time.time()
    try:
        timeout, grace = stated_timeout(os.environ), stated_grace(os.environ)
    except ValueError as err:
        return _say(Decision(EXIT_INPUT, f"error: {err}"))
    with tempfile.TemporaryDirectory(prefix="specval-channel-", ignore_cleanup_errors=True) as name:
        root = Path(name)
        try:
            worker = subprocess.Popen(worker_argv(argv), env={**os.environ, channel.CHANNEL_ENV: name})
        except OSError as err:
            return _say(Decision(EXIT_ENVIRONMENT, f"error: environment: cannot start the worker ({err})"))
        forwarder = _Forwarder(worker)
        with forwarder.installed():
            status, hung = wait_worker(worker, timeout, grace, lambda: channel.last_call(root))
        outcome = read_outcome(root, worker.pid, status, forwarder.interrupted)
    if hung is not None:
        return _say(_timed_out(command, outcome, hung))
    return _say(decide(command, outcome, started))


def stated_timeout(environ: Mapping[str, str]) -> float | None:
    """The seconds TIMEOUT_ENV allows a supervised command (None: unset or empty); ValueError naming
    the variable and the value unless it is a finite number > 0."""
    return _stated_seconds(environ, TIMEOUT_ENV)


def stated_grace(environ: Mapping[str, str]) -> float:
    """The seconds a worker stopped at the timeout has between SIGTERM and SIGKILL: GRACE_ENV, else
    STOP_GRACE_S; ValueError naming the variable and the value unless it is a finite number > 0."""
    grace = _stated_seconds(environ, GRACE_ENV)
    return STOP_GRACE_S if grace is None else grace


def _stated_seconds(environ: Mapping[str, str], name: str) -> float | None:
    raw = environ.get(name, "")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{name}={raw!r} is invalid: expected a number of seconds > 0")
    return seconds


@dataclass(frozen=True)
class Hung:
    """A worker stopped at the stated timeout: the adapter call it was in or had made last then,
    whether SIGKILL ended it (it outlived the grace after SIGTERM), and the timeout and grace."""

    call: channel.Call | None
    killed: bool
    timeout: float
    grace: float

    def text(self) -> str:
        """How it was stopped, e.g. "did not finish within 600 s (SPECVAL_TIMEOUT_S) and was stopped"."""
        how = (
            f"was killed (SIGKILL: still running {self.grace:g} s after SIGTERM, {GRACE_ENV})"
            if self.killed
            else "was stopped"
        )
        return f"did not finish within {self.timeout:g} s ({TIMEOUT_ENV}) and {how}"


def wait_worker(
    worker: subprocess.Popen,
    timeout: float | None,
    grace: float,
    last_call: Callable[[], channel.Call | None],
    tick: Callable[[], None] | None = None,
) -> tuple[int, Hung | None]:
    """(the worker's status, Hung if it ran past `timeout`, else None). Past it, the worker gets
    SIGTERM (it stops as an interrupted run: the bundle kept, resumable) and, if still running
    `grace` seconds later (a hang that no signal handler reaches), SIGKILL. `tick`, if given, is
    called every TICK_S while the worker runs (what the Python API's worker watches)."""
    deadline = math.inf if timeout is None else time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        step = min(left, TICK_S) if tick is not None else (None if timeout is None else left)
        try:
            return worker.wait(timeout=None if step is None else max(step, 0.0)), None
        except subprocess.TimeoutExpired:
            if tick is not None:
                tick()
            if time.monotonic() >= deadline:
                break
    call = last_call()  # before the stop, whose own calls (close) would hide it
    with contextlib.suppress(ProcessLookupError):
        worker.send_signal(signal.SIGTERM)
    try:
        return worker.wait(timeout=grace), Hung(call, False, float(timeout or 0), grace)
    except subprocess.TimeoutExpired:
        worker.kill()
        return worker.wait(), Hung(call, True, float(timeout or 0), grace)


def _timed_out(command: str, outcome: Outcome, hung: Hung) -> Decision:
    """Exit 3 for a worker stopped at the stated timeout, whatever it reported while stopping."""
    return Decision(
        EXIT_SUT,
        f"error: {command}: the worker {hung.text()} ({call_text(hung.call)}){_where(command, outcome)}",
    )


def _say(decision: Decision) -> int:
    if decision.line:
        sys.stdout.flush()
        print(decision.line, file=sys.stderr, flush=True)
    return decision.code


class _Forwarder:
    """Passes SIGTERM, and SIGINT that the terminal did not deliver to the worker itself, on to it."""

    def __init__(self, worker: subprocess.Popen) -> None:
        self.worker = worker
        self.interrupted = False

    def handle(self, signum: int, frame: object) -> None:  # noqa: ARG002 - signal handler signature
        self.interrupted = True
        if signum == signal.SIGINT and terminal_foreground():
            return  # Ctrl-C: the terminal sent it to the whole process group, the worker included
        with contextlib.suppress(ProcessLookupError):
            self.worker.send_signal(signum)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        previous = {signum: signal.getsignal(signum) for signum in FORWARDED_SIGNALS}
        for signum, handler in previous.items():
            if handler is not signal.SIG_IGN:  # a signal ignored by whoever started us stays ignored
                signal.signal(signum, self.handle)
        try:
            yield
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)


def terminal_foreground() -> bool:
    """Whether this process is in the foreground process group of a terminal it is attached to."""
    for fd in (0, 1, 2):
        with contextlib.suppress(OSError):
            if os.isatty(fd):
                return os.tcgetpgrp(fd) == os.getpgrp()
    return False


def read_outcome(root: Path, pid: int, status: int, interrupted: bool) -> Outcome:
    """The Outcome of the worker `pid` from the channel directory `root`."""
    events = channel.read_events(root)
    own = [event for event in events if event.pid == pid]
    reported = [event.value for event in own if event.kind == channel.EXIT and isinstance(event.value, int)]
    return Outcome(
        status=status,
        reported=reported[-1] if reported else None,
        ok=any(event.kind == channel.OK for event in own),
        bundles=tuple(Path(str(event.value)) for event in events if event.kind == channel.BUNDLE),
        call=channel.last_call(root),
        interrupted=interrupted,
    )


# ---------------------------------------------------------------- the decision


def decide(command: str, outcome: Outcome, started: float) -> Decision:
    """The exit status earned by `outcome` of `command` (see the module doc); `started`: when the
    supervisor started (time.time()), the earliest a seal of this run can be."""
    if outcome.reported is None:
        if outcome.interrupted:
            return Decision(EXIT_INTERRUPTED, f"interrupted{_where(command, outcome)}")
        return Decision(
            EXIT_SUT,
            f"error: {command}: the worker {describe_status(outcome.status)} without reporting an outcome "
            f"({call_text(outcome.call)}){_where(command, outcome)}",
        )
    if outcome.reported == EXIT_PASS:
        problem = _unproven_pass(command, outcome, started)
        if problem:
            return Decision(
                EXIT_SUT,
                f"error: {command}: the worker reported exit 0, but {problem}; exit 3, not PASS "
                f"({call_text(outcome.call)}){_where(command, outcome)}",
            )
    return Decision(outcome.reported, _changed_status(outcome))


def describe_status(status: int) -> str:
    """A worker's end in words: "exited with status 0", "was killed by SIGSEGV (Segmentation fault)"."""
    if status >= 0:
        return f"exited with status {status}"
    try:
        name = signal.Signals(-status).name
    except ValueError:
        return f"was killed by signal {-status}"
    return f"was killed by {name} ({signal.strsignal(-status) or name})"


def call_text(call: channel.Call | None) -> str:
    """The adapter call a worker was in or made last, in words (what its one line names)."""
    if call is None:
        return "no adapter call was recorded"
    rank = f", rank {call.rank}" if call.rank is not None else ""
    return f"last adapter call: {call.name}, {call.state}{rank}"


def _where(command: str, outcome: Outcome) -> str:
    """What became of the run's bundle: sealed, kept for --resume, or none announced."""
    if command not in SEALING_COMMANDS:
        return ""
    if not outcome.bundles:
        return "; no bundle was announced"
    from specval import bundle as bundles

    path = outcome.bundles[-1]
    if (path / bundles.SUMS_FILE).is_file():
        return f"; the bundle {path} is sealed: check it with: specval verify {path}"
    if command == "bench":
        return f"; the bundle {path} is kept unsealed; a performance run is not resumed: start a new one"
    return f"; the bundle {path} is kept; resume with: {resume_command(path)}"


def _changed_status(outcome: Outcome) -> str | None:
    if outcome.status == outcome.reported:
        return None
    return (
        f"note: the worker reported exit {outcome.reported}, then {describe_status(outcome.status)} "
        f"(code that ran at exit, an atexit hook say); exit {outcome.reported} stands"
    )


def _unproven_pass(command: str, outcome: Outcome, started: float) -> str | None:
    """Why a reported 0 of `command` is not borne out (None: it is)."""
    if command not in SEALING_COMMANDS:
        return None if outcome.ok else f"{command} never reported its own success"
    if not outcome.bundles:
        return "no bundle was announced"
    return next(filter(None, (seal_problem(path, started) for path in outcome.bundles)), None)


def seal_problem(path: Path, started: float) -> str | None:
    """Why the bundle at `path` is not a PASS sealed since `started` (None: it is one): SHA256SUMS
    present, written since, listing summary.json with its present hash, whose verdict is PASS."""

    summary, problem = sealed_summary(path, started)
    if summary is None:
        return problem
    verdict = summary.get("verdict") if isinstance(summary, dict) else None
    return None if verdict == PASS_VERDICT else f"the sealed verdict of the bundle {path} is {verdict!r}"


def sealed_summary(path: Path, started: float) -> tuple[dict | None, str | None]:
    """(summary.json of the bundle at `path`, None) when SHA256SUMS is present, written since
    `started` (time.time()) and lists summary.json with its present hash, whatever its verdict;
    else (None, why not)."""
    from specval import bundle as bundles
    from specval.bundle.sums import read_sums

    sums = path / bundles.SUMS_FILE
    summary = path / bundles.SUMMARY_FILE
    try:
        if not sums.is_file():
            return None, f"the bundle {path} is not sealed (no {bundles.SUMS_FILE})"
        if sums.stat().st_mtime < started - SEAL_CLOCK_SLACK_S:
            return None, f"the bundle {path} was sealed before this command started"
        if read_sums(path).get(bundles.SUMMARY_FILE) != bundles.sha256_file(summary):
            return None, f"the {bundles.SUMMARY_FILE} of the bundle {path} is not the one its {bundles.SUMS_FILE} seals"
        return bundles.read_json(summary), None
    except (bundles.BundleError, *bundles.READ_ERRORS) as err:
        return None, f"the bundle {path} cannot be read ({err})"
