"""The supervisor (specval.supervisor): `specval run` and `check-adapter`, as a user or CI starts
them (`python -m specval ...`), never exit 0 without a sealed PASS (or the command's own report of
success), whatever the adapter does: `os._exit(0)` on import, in its constructor or in `sample`,
SIGSEGV or SIGKILL to itself, an atexit hook ending the process with 0. Each such end is exit 3 and
one line naming the worker's status, the last adapter call and the kept, resumable bundle.
Deterministic: the fake SUT's fixed runs and planted bundles, no statistic asserted."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from specval import bundle as bundles
from specval import channel, supervisor
from specval.supervisor import Outcome, decide
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.small_bundles import SMALL

REPO = Path(__file__).resolve().parents[2]
DYING = "tests.fixtures.dying_suts"
TIMEOUT_S = 300  # generous: each run is seconds on a loaded 2-core CPU
HANG_TIMEOUT_S = 8  # seconds: past the worker's start and probe, well before the hanging call's end
KILL_GRACE_S = 2  # seconds between the timeout's SIGTERM and SIGKILL when SPECVAL_STOP_GRACE_S sets it
FIRST_COLLECTION_CALL = 3  # the probe makes one sample call per group (2), the run's first batch is the 3rd


def _no_core_dump() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # SIGSEGV must leave no core file behind
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a test runner in the background may ignore it


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DYING_SUT_") and k != channel.CHANNEL_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    return {**env, **extra}


def _specval(cwd: Path, *args: object, **env: str) -> subprocess.CompletedProcess:
    """`python -m specval ARGS` in `cwd`: the supervised command line, as a user starts it."""
    return subprocess.run(
        [sys.executable, "-m", "specval", *map(str, args)],
        cwd=cwd,
        env=_env(**env),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        preexec_fn=_no_core_dump,
    )


def _protocol(tmp_path: Path, adapter: str) -> Path:
    return write_protocol(tmp_path, fake_protocol_dict(**SMALL, sut={"adapter": adapter}))


def _run(tmp_path: Path, adapter: str, **env: str) -> subprocess.CompletedProcess:
    return _specval(tmp_path, "run", _protocol(tmp_path, adapter), "--profile", "ci", "--quiet", **env)


def _last_line(done: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in done.stdout + done.stderr, done.stderr
    return done.stderr.strip().splitlines()[-1]


def _announced(done: subprocess.CompletedProcess) -> Path:
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("bundle: ") and "resume with" in line]
    return Path(line.split()[1])


# ---------------------------------------------------------------- run: the adapter ends the process


@pytest.mark.parametrize(
    ("at", "call"),
    [("import", "the adapter's import or constructor, running"), ("init", "the adapter's import or constructor")],
)
def test_os_exit_0_before_any_bundle_is_exit_3_in_one_line(tmp_path, at, call):
    done = _run(tmp_path, f"{DYING}:DyingSUT", DYING_SUT_AT=at)
    assert done.returncode == 3, done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("error: run: the worker exited with status 0 without reporting an outcome"), line
    assert f"last adapter call: {call}" in line and line.endswith("; no bundle was announced"), line


@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("exit0", "exited with status 0"),
        ("SIGSEGV", "was killed by SIGSEGV (Segmentation fault)"),
        ("SIGKILL", "was killed by SIGKILL (Killed)"),
    ],
)
def test_an_adapter_ending_the_worker_in_sample_is_exit_3_and_the_bundle_resumes(tmp_path, how, status):
    done = _run(
        tmp_path,
        f"{DYING}:DyingSUT",
        DYING_SUT_AT="sample",
        DYING_SUT_CALL=str(FIRST_COLLECTION_CALL + 1),
        DYING_SUT_HOW=how,
    )
    assert done.returncode == 3, done.stdout + done.stderr
    name = _announced(done)
    bundle = tmp_path / name
    line = _last_line(done)
    assert line.startswith(f"error: run: the worker {status} without reporting an outcome"), line
    assert "(last adapter call: sample, running)" in line, line
    assert line.endswith(f"; the bundle {name} is kept; resume with: specval run --resume {name}"), line
    assert not (bundle / bundles.SUMS_FILE).exists()
    resumed = _specval(tmp_path, "run", "--resume", bundle, "--quiet")  # the fault is switched off by the env
    assert resumed.returncode == 0 and "PASS: " in resumed.stdout, resumed.stdout + resumed.stderr
    assert (bundle / bundles.SUMS_FILE).is_file()


def _hang_in_sample(tmp_path: Path, how: str, **env: str) -> subprocess.CompletedProcess:
    """A run whose first collection `sample` call never returns (DYING_SUT_HOW `how`: hang or
    deaf), under SPECVAL_TIMEOUT_S = HANG_TIMEOUT_S."""
    return _run(
        tmp_path,
        f"{DYING}:DyingSUT",
        DYING_SUT_AT="sample",
        DYING_SUT_CALL=str(FIRST_COLLECTION_CALL + 1),
        DYING_SUT_HOW=how,
        SPECVAL_TIMEOUT_S=str(HANG_TIMEOUT_S),
        **env,
    )


def test_a_hang_past_the_stated_timeout_is_exit_3_and_the_bundle_resumes(tmp_path):
    """A `sample` call that never returns, under SPECVAL_TIMEOUT_S: the worker is stopped (SIGTERM:
    it ends as an interrupted run, which alone would be 130) and the command exits 3 naming the
    timeout and the call; the kept bundle resumes to PASS."""
    done = _hang_in_sample(tmp_path, "hang")
    assert done.returncode == 3, done.stdout + done.stderr
    name = _announced(done)
    line = _last_line(done)
    assert line.startswith(f"error: run: the worker did not finish within {HANG_TIMEOUT_S} s (SPECVAL_TIMEOUT_S)"), line
    assert "last adapter call: sample" in line and line.endswith(f"resume with: specval run --resume {name}"), line
    resumed = _specval(tmp_path, "run", "--resume", tmp_path / name, "--quiet")
    assert resumed.returncode == 0 and "PASS: " in resumed.stdout, resumed.stdout + resumed.stderr


def test_a_worker_deaf_to_sigterm_is_killed_after_the_grace_and_exits_3(tmp_path):
    """The hang of the test above, but the adapter ignores SIGTERM first: only the SIGKILL that
    follows the grace (SPECVAL_STOP_GRACE_S, 30 s unless set) ends the worker. The command exits 3
    naming the timeout, the kill and the call, no sooner than timeout + grace, and the bundle stays
    kept and unsealed."""
    started = time.monotonic()
    done = _hang_in_sample(tmp_path, "deaf", SPECVAL_STOP_GRACE_S=str(KILL_GRACE_S))
    elapsed = time.monotonic() - started
    assert done.returncode == 3, done.stdout + done.stderr
    name = _announced(done)
    line = _last_line(done)
    assert line.startswith(
        f"error: run: the worker did not finish within {HANG_TIMEOUT_S} s (SPECVAL_TIMEOUT_S) and was killed "
        f"(SIGKILL: still running {KILL_GRACE_S} s after SIGTERM, SPECVAL_STOP_GRACE_S)"
    ), line
    assert "(last adapter call: sample, running)" in line and line.endswith(f"resume with: specval run --resume {name}")
    assert elapsed >= HANG_TIMEOUT_S + KILL_GRACE_S and not (tmp_path / name / bundles.SUMS_FILE).exists()


@pytest.mark.parametrize("variable", ["SPECVAL_TIMEOUT_S", "SPECVAL_STOP_GRACE_S"])
@pytest.mark.parametrize("value", ["abc", "0", "-5", "inf"])
def test_a_bad_timeout_or_grace_is_an_input_error_naming_the_variable(tmp_path, variable, value):
    done = _run(tmp_path, "tests.fixtures.fake_sut:FakeSUT", **{variable: value})
    assert done.returncode == 2 and done.stdout == "", done.stdout + done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line == f"error: {variable}={value!r} is invalid: expected a number of seconds > 0", line


def test_an_atexit_os_exit_0_keeps_the_verdicts_code(tmp_path):
    done = _run(tmp_path, f"{DYING}:AtExitPointMassSUT")
    assert done.returncode == 4, done.stdout + done.stderr  # INCONCLUSIVE, which the hook's 0 would hide
    assert "INCONCLUSIVE: " in done.stdout
    line = _last_line(done)
    assert line.startswith("note: the worker reported exit 4, then exited with status 0"), line


def test_a_correct_run_still_exits_0_and_a_sealed_pass_is_written(tmp_path):
    done = _run(tmp_path, "tests.fixtures.fake_sut:FakeSUT")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stderr == "" and "PASS: " in done.stdout
    (bundle,) = (tmp_path / "results").glob("fake_t2-*")
    assert supervisor.seal_problem(bundle, 0.0) is None


def test_sigterm_to_the_supervisor_reaches_the_worker_and_exits_130(tmp_path):
    protocol = _protocol(tmp_path, "tests.fixtures.fault_suts:SlowSUT")
    child = subprocess.Popen(
        [sys.executable, "-m", "specval", "run", str(protocol), "--profile", "ci", "--quiet"],
        cwd=tmp_path,
        env=_env(FAULT_SLEEP_S="0.2"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_no_core_dump,
    )
    first = child.stdout.readline()
    assert first.startswith("bundle: "), first + child.stderr.read()
    bundle = tmp_path / first.split()[1]
    deadline = time.monotonic() + TIMEOUT_S
    while not list((bundle / "samples").glob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.05)
    child.send_signal(signal.SIGTERM)  # to the supervisor alone: it must pass it on
    out, err = child.communicate(timeout=TIMEOUT_S)
    assert child.returncode == 130, out + err
    assert f"resume with: specval run --resume {first.split()[1]}" in err and "Traceback" not in err
    assert not (bundle / bundles.SUMS_FILE).exists()


# ---------------------------------------------------------------- check-adapter


def test_check_adapter_ok_comes_from_the_worker_and_os_exit_is_exit_3(tmp_path):
    ok = _specval(tmp_path, "check-adapter", "tests.fixtures.adapter_faults:CheckedFakeSUT")
    assert ok.returncode == 0 and ok.stdout.splitlines()[-1].startswith("OK: "), ok.stdout + ok.stderr
    for env in ({"DYING_SUT_AT": "init"}, {"DYING_SUT_AT": "sample", "DYING_SUT_CALL": "2"}):
        done = _specval(tmp_path, "check-adapter", f"{DYING}:DyingSUT", **env)
        assert done.returncode == 3, done.stdout + done.stderr
        (line,) = done.stderr.strip().splitlines()
        assert line.startswith("error: check-adapter: the worker exited with status 0 without reporting"), line


# ---------------------------------------------------------------- the decision, without processes


def _outcome(**fields) -> Outcome:
    base = {"status": 0, "reported": 0, "ok": False, "bundles": (), "call": None, "interrupted": False}
    return Outcome(**{**base, **fields})


def _sealed(tmp_path: Path, verdict: str = "PASS") -> Path:
    path = tmp_path / "bundle"
    path.mkdir()
    bundles.write_json(path / bundles.SUMMARY_FILE, {"verdict": verdict})
    bundles.write_sums(path)
    return path


def test_a_reported_0_of_run_needs_a_pass_sealed_since_the_start(tmp_path):
    path = _sealed(tmp_path)
    assert decide("run", _outcome(bundles=(path,)), time.time()) == supervisor.Decision(0, None)
    for outcome, started, why in (
        (_outcome(), 0.0, "no bundle was announced"),
        (_outcome(bundles=(path,)), time.time() + 60, "was sealed before this command started"),
        (_outcome(bundles=(path, tmp_path / "other")), 0.0, "is not sealed (no SHA256SUMS)"),
    ):
        decision = decide("run", outcome, started)
        assert decision.code == 3 and why in decision.line and "exit 3, not PASS" in decision.line, decision


@pytest.mark.parametrize("verdict", ["FAIL", "INCONCLUSIVE", None])
def test_a_reported_0_over_a_sealed_non_pass_is_exit_3(tmp_path, verdict):
    decision = decide("bench", _outcome(bundles=(_sealed(tmp_path, verdict),)), 0.0)
    assert decision.code == 3 and f"the sealed verdict of the bundle {tmp_path / 'bundle'} is" in decision.line


def test_a_summary_changed_after_the_seal_is_not_a_pass(tmp_path):
    path = _sealed(tmp_path, "FAIL")
    bundles.write_json(path / bundles.SUMMARY_FILE, {"verdict": "PASS"})
    decision = decide("run", _outcome(bundles=(path,)), 0.0)
    assert decision.code == 3 and "is not the one its SHA256SUMS seals" in decision.line


def test_a_reported_0_of_check_adapter_needs_its_own_ok():
    assert decide("check-adapter", _outcome(ok=True), 0.0).code == 0
    decision = decide("check-adapter", _outcome(), 0.0)
    assert decision.code == 3 and "check-adapter never reported its own success" in decision.line


@pytest.mark.parametrize("code", [1, 2, 3, 4, 5, 130])
def test_a_reported_non_zero_status_is_kept_even_if_the_worker_left_with_0(code):
    decision = decide("run", _outcome(reported=code, status=0), 0.0)
    assert decision.code == code and f"reported exit {code}, then exited with status 0" in decision.line
    assert decide("run", _outcome(reported=code, status=code), 0.0) == supervisor.Decision(code, None)


def test_no_report_is_3_or_130_when_interrupted(tmp_path):
    call = channel.Call("sample", channel.RUNNING, "1")
    outcome = _outcome(reported=None, status=-signal.SIGSEGV, call=call, bundles=(tmp_path,))
    line = decide("run", outcome, 0.0).line
    assert decide("run", outcome, 0.0).code == 3
    assert line == (
        "error: run: the worker was killed by SIGSEGV (Segmentation fault) without reporting an outcome "
        f"(last adapter call: sample, running, rank 1); the bundle {tmp_path} is kept; resume with: "
        f"specval run --resume {tmp_path}"
    )
    interrupted = Outcome(**{**outcome.__dict__, "interrupted": True})
    assert decide("run", interrupted, 0.0).code == 130


def test_which_command_lines_are_supervised():
    assert supervisor.wanted(["run", "p.yaml"], {}) and supervisor.wanted(["check-adapter", "m:C"], {})
    assert supervisor.wanted(["mutate", "p"], {}) and supervisor.wanted(["bench", "p"], {})
    assert not supervisor.wanted(["run", "p.yaml"], {channel.CHANNEL_ENV: "/x"})  # the worker itself
    assert not supervisor.wanted(["run", "--help"], {}) and not supervisor.wanted(["verify", "b"], {})
    assert not supervisor.wanted(["--version"], {})
    assert supervisor.wanted(["run", "p"], {"RANK": "0"}) and not supervisor.wanted(["run", "p"], {"RANK": "1"})


# ---------------------------------------------------------------- the channel


def test_the_channel_skips_torn_lines_and_keeps_the_last_call(tmp_path, monkeypatch):
    monkeypatch.setenv(channel.CHANNEL_ENV, str(tmp_path))
    channel.report_bundle(Path("b1"))
    with (tmp_path / channel.EVENTS_FILE).open("a") as handle:
        handle.write('{"kind": "exit", "pid": 1, "val')  # a process killed mid-line
    channel.report_exit(0)
    with channel.adapter_call("sample"):
        assert channel.last_call(tmp_path) == channel.Call("sample", channel.RUNNING, os.environ.get("RANK"))
    assert channel.last_call(tmp_path).state == channel.RETURNED
    events = channel.read_events(tmp_path)
    assert [(e.kind, e.value, e.pid) for e in events] == [
        (channel.BUNDLE, "b1", os.getpid()),
        (channel.EXIT, 0, os.getpid()),  # the torn record is skipped, the one after it kept
    ]
