"""The Python API's worker (specval.worker): `specval.run` and the pytest plugin never come out as a
PASS, nor take their caller down, when the adapter ends its process; the adapter runs in a fresh
Python (an importable name) or a forked child (an object without one), and only a sealed bundle
comes back as a Result.

Deterministic: the fake SUT's fixed runs end the worker at a fixed call; no statistic is asserted
but the PASS of the fork path's run, whose false-fail rate is that of the fake protocol's ci
profile (two p-valued gating families at alpha 0.01 on fixed seeds: <= 0.02 over seed choices,
fixed on a platform).
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest

import specval
from specval import worker
from specval.execution import EnvironmentFailed, RunFailed, RunInterrupted
from specval.preflight import SUTRaised
from specval.seeds import LedgerError, SeedOverlapError
from specval.sut import SUTError
from tests.fixtures.dying_suts import DyingSUT
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import FakeSUT
from tests.fixtures.small_bundles import SMALL

REPO = Path(__file__).resolve().parents[2]
FIRST_COLLECTION_CALL = 3  # the probe makes one sample call per group (2), the run's first batch is the 3rd
API_TIMEOUT_S = 3  # a forked worker reaches its hanging call in well under a second


@pytest.fixture
def protocol(tmp_path) -> Path:
    return write_protocol(tmp_path, fake_protocol_dict(**SMALL))


def _die_in_sample(monkeypatch, how: str) -> None:
    monkeypatch.setenv("DYING_SUT_AT", "sample")
    monkeypatch.setenv("DYING_SUT_CALL", str(FIRST_COLLECTION_CALL + 1))
    monkeypatch.setenv("DYING_SUT_HOW", how)


def test_os_exit_0_in_sample_through_the_api_is_worker_died_not_a_result(protocol, tmp_path, monkeypatch):
    """An importable adapter (a fresh Python) calling os._exit(0) in its 4th sample call."""
    _die_in_sample(monkeypatch, "exit0")
    with pytest.raises(specval.WorkerDied) as caught:
        specval.run(protocol, profile="ci", sut="tests.fixtures.dying_suts:DyingSUT", output=tmp_path / "out")
    died = caught.value
    assert isinstance(died, specval.SUTRaised) and died.status == 0 and died.path is not None
    assert str(died) == (
        "the worker exited with status 0 without reporting an outcome (last adapter call: sample, running); "
        f"the bundle {died.path} is kept; resume it with specval.resume({str(died.path)!r})"
    )
    assert died.path.parent == tmp_path / "out" and not (died.path / "SHA256SUMS").exists()


def test_a_signal_in_a_forked_worker_is_worker_died(protocol, tmp_path, monkeypatch):
    """An adapter without an importable name (a lambda) runs in a forked child; SIGKILL there."""
    _die_in_sample(monkeypatch, "SIGKILL")
    with pytest.raises(specval.WorkerDied) as caught:
        specval.run(protocol, profile="ci", sut=lambda spec, k: DyingSUT(spec, k), output=tmp_path / "out")
    assert caught.value.status == -9 and str(caught.value).startswith(
        "the worker was killed by SIGKILL (Killed) without reporting an outcome (last adapter call: sample, running)"
    )


def test_a_forked_worker_returns_the_sealed_result_and_announces_before_sampling(protocol, tmp_path):
    seen: list[list[Path]] = []
    result = specval.run(
        protocol,
        profile="ci",
        sut=lambda spec, k: FakeSUT(spec, k),
        output=tmp_path / "out",
        announce=lambda path: seen.append(sorted((path / "samples").glob("*"))),
    )
    assert result.passed and (result.bundle / "SHA256SUMS").is_file() and seen == [[]]
    assert specval.Result.from_bundle(result.bundle) == result


def test_a_hang_past_the_timeout_through_the_api_is_worker_died(protocol, tmp_path, monkeypatch):
    _die_in_sample(monkeypatch, "hang")
    monkeypatch.setenv("SPECVAL_TIMEOUT_S", str(API_TIMEOUT_S))
    with pytest.raises(specval.WorkerDied, match=rf"did not finish within {API_TIMEOUT_S} s \(SPECVAL_TIMEOUT_S\)"):
        specval.run(protocol, profile="ci", sut=lambda spec, k: DyingSUT(spec, k), output=tmp_path / "out")


def test_an_answer_the_disk_does_not_bear_out_is_worker_died(tmp_path):
    """A worker that answers with a bundle it never sealed (adapter code forging the answer)."""
    bundle = tmp_path / "forged"
    bundle.mkdir()

    def forge(root: Path) -> None:
        (root / worker.ANSWER_FILE).write_text(f'{{"bundle": "{bundle}"}}')

    request = worker.Request(str(tmp_path), (), protocol="p.yaml")
    with pytest.raises(specval.WorkerDied, match=f"answered with the bundle {bundle}, but .* is not sealed"):
        worker.delegate(request, None, forge)


@pytest.mark.parametrize(
    "error",
    [
        RunFailed(Path("b"), Path("b/error.log"), SUTRaised("sample", "ValueError: x", "Traceback ...")),
        EnvironmentFailed(Path("b"), OSError(errno.ENOSPC, "No space left on device", "b/x.parquet")),
        RunInterrupted(Path("b")),
        RunInterrupted(None),
        SUTRaised("encode", "KeyError: 'a'", "Traceback ..."),
        FileNotFoundError(errno.ENOENT, "No such file or directory", "p.yaml"),
        specval.ProtocolError("p.yaml: alpha: must lie in [1e-06, 0.2]"),
        SeedOverlapError("overlap"),
        LedgerError("not a ledger"),
        specval.BundleError("b: not a bundle"),
        SUTError("sut: cannot import 'x:Y'"),
        TypeError("sut: 3 is not a SUT"),
    ],
)
def test_every_answered_exception_comes_back_as_itself(error):
    back = worker.decode(worker.encode(error))
    assert type(back) is type(error) and str(back) == str(error)
    for field in ("path", "log", "call", "message", "details", "errno", "filename"):
        assert getattr(back, field, None) == getattr(error, field, None), field
    if isinstance(error, (RunFailed, EnvironmentFailed)):
        assert type(back.cause) is type(error.cause) and str(back.cause) == str(error.cause)


PLUGIN_USE = """
import pytest

@pytest.mark.specval("protocol.yaml", profile="ci", sut="tests.fixtures.dying_suts:DyingSUT")
def test_an_adapter_ending_the_worker(specval_result):
    raise AssertionError("not reached: no verdict")

def test_the_session_goes_on():
    pass
"""


def test_the_pytest_plugin_fails_a_test_whose_adapter_ends_the_worker(tmp_path):
    """pytest in a subprocess (the plugin with `-p`): the marked test is an error naming what
    happened, not a pass, and the session goes on to its next test."""
    write_protocol(tmp_path, fake_protocol_dict(**SMALL))
    (tmp_path / "test_dying.py").write_text(PLUGIN_USE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        "DYING_SUT_AT": "sample",
        "DYING_SUT_CALL": str(FIRST_COLLECTION_CALL + 1),
    }
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "specval.pytest_plugin", "-p", "no:cacheprovider"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "1 passed, 1 error" in out, out
    assert "specval: the worker exited with status 0 without reporting an outcome" in out, out
    assert "not reached" not in out and "Traceback" not in out
