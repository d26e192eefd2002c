"""A bundle's life through environment faults: an OSError (disk full, file too large, permission)
at each step after the seed claim exits 5 with one line, and what it leaves either holds no
sample (nothing kept: its directory is removed) or is kept and completes with `--resume`: a run
that recorded its verdict is finished (report, manifest, seal) without the system under test,
only when its verdict recomputes unchanged from data unchanged since (specval.lifecycle.complete).

Faults are planted by monkeypatching one write (the errno the kernel gives), never by filling a
disk. Deterministic: the fake SUT's fixed run on fixed seeds, no statistic asserted.
"""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval import seeds, signing
from specval.bundle import files as bundle_files
from specval.bundle import sums as bundle_sums
from specval.cli import main
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.small_bundles import SMALL


def _cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def _protocol(tmp_path: Path) -> Path:
    return write_protocol(tmp_path, fake_protocol_dict(**SMALL))


def _run(tmp_path: Path, *extra):
    return _cli("run", _protocol(tmp_path), "--profile", "ci", "--output", tmp_path / "results", "--quiet", *extra)


def _fail_writing(monkeypatch, name: str, code: int = errno.ENOSPC) -> None:
    """Every atomic write of a file called `name` (in any bundle) raises OSError(`code`)."""
    real = bundles.atomic_write

    def atomic_write(path, write):
        if Path(path).name == name:
            raise OSError(code, os.strerror(code), str(path))
        return real(path, write)

    for module in (bundles, bundle_files, bundle_sums):  # the facade, write_json / write_files, write_sums
        monkeypatch.setattr(module, "atomic_write", atomic_write)


def _one_line(result, code: int) -> str:
    """The one line (after the bundle's announcement) of a run that exited `code`; no traceback."""
    assert result.exit_code == code and isinstance(result.exception, SystemExit), result.output
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("bundle: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def _bundle(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "results").glob("fake_t2-*")
    return path


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> Path:
    key = tmp_path_factory.mktemp("keys") / "team"
    assert _cli("keygen", key).exit_code == 0
    return key


# ---------------------------------------------------------------- before any sample


@pytest.mark.parametrize("name", [seeds.LEDGER_FILE_NAME, bundles.RUN_FILE])
def test_a_fault_before_the_plan_is_recorded_exits_5_and_leaves_no_bundle(tmp_path, monkeypatch, name):
    """The ledger, protocol.json or run.json cannot be written: no plan, no sample, so no bundle
    to resume; the directory is removed (a claimed range stays claimed, never reused)."""
    with monkeypatch.context() as patch:
        _fail_writing(patch, name)
        if name == seeds.LEDGER_FILE_NAME:  # seeds.py holds its own reference to atomic_write
            patch.setattr(seeds, "atomic_write", bundles.atomic_write)
        line = _one_line(_run(tmp_path), 5)
    assert line.startswith("error: environment: ENOSPC (No space left on device): ") and name in line, line
    assert not list((tmp_path / "results").glob("fake_t2-*"))
    if name == seeds.LEDGER_FILE_NAME:
        assert not seeds.read_ledger(tmp_path / "results")  # nothing claimed
        assert _run(tmp_path).exit_code == 0  # the next run starts afresh


def test_a_fault_opening_the_first_session_keeps_the_bundle_and_it_resumes(tmp_path, monkeypatch):
    with monkeypatch.context() as patch:
        _fail_writing(patch, bundles.SESSIONS_FILE)
        line = _one_line(_run(tmp_path), 5)
    path = _bundle(tmp_path)
    assert f"the bundle {path} is kept; resume with: specval run --resume {path}" in line
    assert not list((path / "samples").glob("*.parquet"))
    assert _cli("run", "--resume", path, "--quiet").exit_code == 0
    assert _cli("verify", path).exit_code == 0


# ---------------------------------------------------------------- after the verdict

AFTER_VERDICT = {  # the file whose write fails -> what the fault leaves on disk
    "manifest.json": "summary.json",
    "report.html": "manifest.json",
    bundles.SUMS_FILE: "report.html",
}


@pytest.mark.parametrize("name", list(AFTER_VERDICT))
def test_a_fault_after_the_verdict_exits_5_and_resume_completes_it_without_collecting(
    tmp_path, monkeypatch, keys, name
):
    """The seal's fault is of a signed run (`--sign`): its resume, given the key again, signs."""
    sign = ("--sign", keys) if name == bundles.SUMS_FILE else ()
    with monkeypatch.context() as patch:
        _fail_writing(patch, name)
        line = _one_line(_run(tmp_path, *sign), 5)
    path = _bundle(tmp_path)
    assert line.startswith("error: environment: ENOSPC") and f"the bundle {path} is kept; resume with" in line
    assert (path / AFTER_VERDICT[name]).exists() and not (path / name).exists()
    chunks = bundles.read_json(path / bundles.CHUNKS_FILE)
    summary = (path / bundles.SUMMARY_FILE).read_bytes()
    resumed = _cli("run", "--resume", path, "--quiet", *sign)
    assert resumed.exit_code == 0 and "PASS" in resumed.output, resumed.output
    assert bundles.read_json(path / bundles.CHUNKS_FILE) == chunks  # nothing collected
    assert (path / bundles.SUMMARY_FILE).read_bytes() == summary  # the recorded verdict, byte for byte
    sessions = bundles.read_json(path / bundles.SESSIONS_FILE)
    assert sessions[-1]["outcome"] == "PASS" and sessions[-1]["samples_drawn"] == 0
    verified = _cli("verify", path, *(("--key", f"{keys}.pub") if sign else ()))
    said = "signed by key" if sign else "unsigned: internal consistency only"
    assert verified.exit_code == 0 and said in verified.output, verified.output
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    assert ("unrecorded" in manifest["device"]) == (name == "manifest.json")  # said so where it was lost


def _unsigned_line(result, code: int, path: Path) -> None:
    last = result.output.strip().splitlines()[-1]
    assert result.exit_code == 5 and "Traceback" not in result.output, result.output
    assert last.startswith(f"error: environment: {errno.errorcode[code]} (") and signing.SIGNATURE_FILE in last
    assert last.endswith(f"the bundle {path} is sealed and unsigned; sign it with: specval sign {path} --key KEY")


def test_a_fault_writing_the_signature_exits_5_and_specval_sign_finishes(tmp_path, monkeypatch, keys):
    """`run --sign` (disk full) and `specval sign` (permission denied): exit 5, one line, the
    sealed bundle intact but for its report, which names the signer whose signature is missing;
    `specval sign` then signs it."""
    with monkeypatch.context() as patch:
        _fail_writing(patch, signing.SIGNATURE_FILE)
        result = _run(tmp_path, "--sign", keys)
    path = _bundle(tmp_path)
    assert "PASS: all" in result.output
    _unsigned_line(result, errno.ENOSPC, path)
    with monkeypatch.context() as patch:
        _fail_writing(patch, signing.SIGNATURE_FILE, errno.EACCES)
        _unsigned_line(_cli("sign", path, "--key", keys), errno.EACCES, path)
    unsigned = _cli("verify", path)  # sealed; only the report says more than the bundle holds
    assert unsigned.exit_code == 1 and [line for line in unsigned.output.splitlines() if "DIFFERS" in line] == [
        "DIFFERS report.html: differs from its re-rendering from the bundle",
        "DIFFERS report.md: differs from its re-rendering from the bundle",
    ], unsigned.output
    assert _cli("sign", path, "--key", keys).exit_code == 0
    assert _cli("verify", path, "--key", f"{keys}.pub").exit_code == 0


def test_keygen_exits_5_when_the_disk_refuses_and_2_when_a_key_exists(tmp_path, monkeypatch, keys):
    with monkeypatch.context() as patch:
        patch.setattr(
            signing.os,
            "open",
            lambda *a: (_ for _ in ()).throw(OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "k"))),
        )
        line = _one_line(_cli("keygen", tmp_path / "k"), 5)
    assert line.startswith(f"error: environment: {tmp_path / 'k'}: cannot write the key pair (ENOSPC")
    assert _one_line(_cli("keygen", keys), 2).startswith(f"error: {keys}: cannot write the key pair")


# ---------------------------------------------------------------- completion launders nothing


@pytest.fixture(scope="module")
def stranded(tmp_path_factory) -> Path:
    """A PASS bundle whose seal failed (disk full writing SHA256SUMS)."""
    root = tmp_path_factory.mktemp("stranded")
    with pytest.MonkeyPatch.context() as patch:
        _fail_writing(patch, bundles.SUMS_FILE)
        _one_line(_run(root), 5)
    return _bundle(root)


@pytest.fixture
def copy(stranded, tmp_path) -> Path:
    return Path(shutil.copytree(stranded, tmp_path / stranded.name))


def _refused(bundle: Path, *words: str) -> None:
    before = {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file() and p.name != bundles.LOCK_FILE}
    line = _one_line(_cli("run", "--resume", bundle, "--quiet"), 2)
    assert line.startswith("error: ") and all(word in line for word in words), line
    assert {p: p.read_bytes() for p in bundle.rglob("*") if p.is_file() and p.name != bundles.LOCK_FILE} == before


def test_completion_refuses_a_summary_that_does_not_recompute(copy):
    summary = bundles.read_json(copy / bundles.SUMMARY_FILE)
    summary["verdict"] = "FAIL"
    bundles.write_json(copy / bundles.SUMMARY_FILE, summary)
    _refused(copy, "session 0 ended PASS but summary.json says FAIL", "a recorded verdict never changes")
    sessions = bundles.read_json(copy / bundles.SESSIONS_FILE)
    for session in sessions:
        session.pop(bundles.VERDICT_FILES_KEY)
        session["outcome"] = "FAIL"
    bundles.write_json(copy / bundles.SESSIONS_FILE, sessions)  # the forger makes the sessions agree
    _refused(copy, "summary.json differs from its recomputation from the raw samples", "verdict")


def test_completion_refuses_files_changed_since_the_verdict(copy):
    reference = bundles.read_json(copy / bundles.REFERENCE_FILE)
    reference["note"] = "edited"
    bundles.write_json(copy / bundles.REFERENCE_FILE, reference)
    _refused(copy, "reference.json changed since session 0 recorded its verdict PASS")


def test_completion_refuses_samples_that_do_not_chain(copy):
    chunk = sorted((copy / "samples").glob("*.parquet"))[0]
    chunk.write_bytes(chunk.read_bytes() + b"\0")
    _refused(copy, "refusing to complete it", "sha256 differs from the one recorded in chunks.json")


def test_completion_refuses_a_signed_bundle(copy):
    """A signature is written only after a seal: its presence says the bundle was sealed."""
    (copy / signing.SIGNATURE_FILE).write_text("{}")
    _refused(copy, f"sealed ({signing.SIGNATURE_FILE} present)", "never re-opened")
    (copy / signing.SIGNATURE_FILE).unlink()
    assert _cli("run", "--resume", copy, "--quiet").exit_code == 0


def test_a_sequence_bundle_stranded_after_its_verdict_completes_the_same_way(tmp_path, monkeypatch):
    """The completion is the lifecycle's, not a kind's: a sequence run (ChainSUT, 80 sequences per
    group) whose manifest write failed completes and verifies."""
    from tests.fixtures.sequence_protocol import write_sequence_protocol

    protocol = write_sequence_protocol(
        tmp_path,
        groups=[{"name": "nospec", "mode": "nospec"}, {"name": "sync", "mode": "sync"}],
        tests=[{"kind": "pit", "role": "primary"}, {"kind": "reproducibility", "role": "control"}],
        sequences_per_group=80,
        batch_size=20,
    )
    with monkeypatch.context() as patch:
        _fail_writing(patch, bundles.MANIFEST_FILE)
        _one_line(_cli("run", protocol, "--output", tmp_path / "results", "--exploratory", "--quiet"), 5)
    (path,) = (tmp_path / "results").glob("chain_seq-*")
    resumed = _cli("run", "--resume", path, "--quiet")
    assert resumed.exit_code == 0 and "EXPLORATORY PASS" in resumed.output, resumed.output
    assert _cli("verify", path).exit_code == 0
