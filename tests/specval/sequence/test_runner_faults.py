"""The sequence runner under faults: what each fault of the adapter or the environment does to the
exit code, the ledger, the bundle and its lock, and that a resume afterwards completes and verifies.

Faults are planted in FaultyChainSUT (tests/fixtures/chain_faults.py: ChainSUT with one fault at a
chosen call) or by monkeypatching one write (the errno the kernel gives), never by filling a disk.
Runs go through the command line in this process (one line on the terminal, never a traceback).
Deterministic: one group of 16 sequences of 16 tokens on fixed seeds (the healthy run PASSes);
no statistic is asserted beyond that verdict.
"""

from __future__ import annotations

import errno
import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval.bundle import chain as bundle_chain
from specval.bundle import files as bundle_files
from specval.bundle import sums as bundle_sums
from specval.cli import main
from specval.protocol import ProtocolError
from specval.sequence import collect, reference, runner
from tests.fixtures import chain_faults
from tests.fixtures.chain_faults import OTHER_SEMANTICS, TINY, Fault, declare, heal, plant
from tests.fixtures.chain_sut import VOCAB, ChainSUT
from tests.fixtures.sequence_protocol import write_sequence_protocol

ROOT = Path(__file__).resolve().parents[3]
MIXED = {"groups": [{"name": "mixed", "mode": "sync", "companions": [{"temperature": 0}]}]}
NOISY = {"groups": [{"name": "sync", "mode": "sync", "draft": "noisy"}]}


@pytest.fixture(autouse=True)
def healthy(monkeypatch):
    heal(monkeypatch)
    declare(monkeypatch)
    # the manifest's device facts import torch (seconds), which no fault here involves
    monkeypatch.setattr(bundles, "device_facts", lambda: {"device": "test"})


def _cli(*args):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def _run(tmp_path: Path, **overrides):
    protocol = write_sequence_protocol(tmp_path, **{**TINY, **overrides})
    return _cli("run", protocol, "--output", tmp_path / "out", "--exploratory", "--quiet")


def _resume(path: Path):
    return _cli("run", "--resume", path, "--quiet")


def _one_line(result, code: int) -> str:
    """The one line (after the bundle's announcement) of a run that exited `code`; no traceback."""
    assert result.exit_code == code and isinstance(result.exception, SystemExit), result.output
    lines = [line for line in result.output.strip().splitlines() if not line.startswith("bundle: ")]
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    return lines[0]


def _bundle(tmp_path: Path) -> Path:
    (path,) = (tmp_path / "out").glob("chain_seq-*")
    return path


def _lock_free(path: Path) -> bool:
    """True iff another open file (as another process would open it) gets the bundle's lock."""
    lock = path / bundles.LOCK_FILE
    if not lock.exists():
        return True
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)  # closing the descriptor gives up a lock it took
    return True


def _completes(path: Path) -> None:
    """A healed resume of the kept bundle PASSes, seals it and `specval verify` agrees."""
    assert _lock_free(path) and not (path / bundles.SUMS_FILE).exists()
    resumed = _resume(path)
    assert resumed.exit_code == 0 and "EXPLORATORY PASS" in resumed.output, resumed.output
    assert (path / bundles.SUMS_FILE).exists() and not (path / bundles.LOCK_FILE).exists()
    verified = _cli("verify", path)
    assert verified.exit_code == 0, verified.output


def _fail_writing(monkeypatch, suffix: str, code: int) -> None:
    """Every atomic write and sample chunk of a file whose name ends with `suffix` raises OSError(`code`)."""
    write, chunk = bundles.atomic_write, bundles.write_chunk

    def fail(path):
        if Path(path).name.endswith(suffix):
            raise OSError(code, os.strerror(code), str(path))

    for module in (bundles, bundle_files, bundle_sums):  # the facade, write_json / write_files, write_sums
        monkeypatch.setattr(module, "atomic_write", lambda path, w: (fail(path), write(path, w))[1])
    for module in (bundles, bundle_chain):  # the facade (the kinds' collection), write_json_chunk
        monkeypatch.setattr(module, "write_chunk", lambda root, path, w: (fail(path), chunk(root, path, w))[1])


# ---------------------------------------------------------------- 1. probe before claim


@pytest.mark.parametrize(
    "fault, overrides, words",
    [
        (Fault("__init__", "raises"), {}, ["the adapter's import or constructor", "planted constructor failure"]),
        # the probe draws K + 2 = 5 tokens per sequence (runner.probe_length), not the run's 16
        (Fault("sample", "short"), {}, ["sample (probe, group 'sync')", "tokens has shape (2, 4), expected (2, 5)"]),
        (Fault("sample", "raises"), {}, ["sample: RuntimeError: planted adapter failure"]),
        (
            Fault("sample_mixed", "float_tokens"),
            MIXED,
            ["sample_mixed (probe, group 'mixed')", "tokens has dtype float64"],
        ),
        (Fault("target_logits_along", "nan"), {}, ["target_logits_along (probe, group 'sync')", "1 NaN logit(s)"]),
    ],
    ids=["constructor", "sample", "sample_raises", "sample_mixed", "target_logits_along"],
)
def test_a_broken_adapter_is_refused_by_the_probe_before_any_seed_is_claimed(
    tmp_path, monkeypatch, fault, overrides, words
):
    plant(monkeypatch, fault)
    line = _one_line(_run(tmp_path, **overrides), 3)
    assert all(word in line for word in words) and "no seed was claimed" in line, line
    out = tmp_path / "out"
    assert not (out / "ledger.json").exists() and not list(out.glob("chain_seq-*"))
    assert len(list(out.glob("probe-error-*.log"))) == 1


@pytest.mark.parametrize(
    "capabilities, overrides, word",
    [
        ({"draft_overrides": ()}, NOISY, "draft_overrides"),
        ({"mixed_sampling": False}, MIXED, "mixed_sampling"),
    ],
)
def test_a_protocol_asking_what_the_adapter_does_not_declare_is_refused(
    tmp_path, monkeypatch, capabilities, overrides, word
):
    declare(monkeypatch, capabilities=capabilities)
    line = _one_line(_run(tmp_path, **overrides), 2)
    assert word in line and "does not declare" in line, line
    assert not (tmp_path / "out").exists()


def test_an_adapter_without_target_logits_along_is_refused(tmp_path):
    file = write_sequence_protocol(tmp_path, **TINY)
    with pytest.raises(ProtocolError, match="needs target_logits_along"):
        runner.run(
            file, None, tmp_path / "out", exploratory=True, progress=False, sut_factory=chain_faults.WithoutReplay
        )
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- 2. the contract, checked on every call


@pytest.mark.parametrize(
    "fault, overrides, words",
    [
        (Fault("sample", "not_a_batch", 1), {}, ["sample (batch 0, group 'sync')", "returned tuple"]),
        (Fault("sample", "short", 1), {}, ["tokens has shape (4, 15), expected (4, 16)"]),
        (Fault("sample", "missing_row", 1), {}, ["tokens has shape (3, 16), expected (4, 16)"]),
        (Fault("sample", "float_tokens", 1), {}, ["tokens has dtype float64, expected an integer dtype"]),
        (Fault("sample", "count_shape", 1), {}, ["num_rounds has shape (3,), expected (4,)"]),
        (Fault("sample", "unknown_source", 1), {}, ["sources holds 1 unknown value(s)", "row 0, position 0: 'draft'"]),
        (Fault("sample", "out_of_range", 1), {}, [f"outside [0, {VOCAB})", f"row 0, position 0: {VOCAB}"]),
        (Fault("sample", "short", 5), {}, ["sample (re-run, group 'sync')", "tokens has shape (4, 15)"]),
        (
            Fault("sample_mixed", "short", 1),
            MIXED,
            ["sample_mixed (batch 0, group 'mixed')", "tokens has shape (8, 15)"],
        ),
        (
            Fault("target_logits_along", "short", 1),
            {},
            ["target_logits_along (group 'sync', sequence 0)", "returned float32[15, 24]"],
        ),
        (Fault("target_logits_along", "int", 1), {}, ["returned int64[16, 24], expected float[16, 24]"]),
        (Fault("target_logits_along", "nan", 1), {}, ["1 NaN logit(s)", "position 1, token 2: nan"]),
        (Fault("target_logits_along", "posinf", 1), {}, ["1 +inf logit(s)", "position 1, token 2: inf"]),
        (Fault("target_logits_along", "no_finite", 1), {}, ["no finite logit at position 1"]),
        (Fault("target_logits_along", "nan", 1), MIXED, ["target_logits_along (group 'mixed', sequence 0)"]),
    ],
    ids=lambda v: f"{v.call}-{v.kind}-{v.after}" if isinstance(v, Fault) else "mixed" if v == MIXED else "",
)
def test_a_malformed_answer_mid_run_exits_3_naming_call_field_and_value(tmp_path, monkeypatch, fault, overrides, words):
    """The probe's call passes (`after`), the run's first (or the re-run's) breaks the contract."""
    plant(monkeypatch, fault)
    line = _one_line(_run(tmp_path, **overrides), 3)
    path = _bundle(tmp_path)
    assert all(word in line for word in words) and f"the bundle {path} is marked ERROR and kept" in line, line
    assert (path / "error.log").is_file() and _lock_free(path)
    assert bundles.read_sessions(path)[-1]["outcome"] == "error"


def test_a_bundle_stopped_by_a_malformed_answer_resumes_where_it_stopped(tmp_path, monkeypatch):
    plant(monkeypatch, Fault("sample", "out_of_range", 3))  # the probe and batches 0 and 1 are whole
    _one_line(_run(tmp_path), 3)
    path = _bundle(tmp_path)
    assert sorted(p.name for p in (path / "samples").glob("*.parquet")) == [
        "sync-b00000.parquet",
        "sync-b00001.parquet",
    ]
    heal(monkeypatch)
    _completes(path)


def test_a_token_outside_the_vocabulary_already_on_disk_is_out_of_support():
    """A bundle collected before batches were checked may hold one: its replay marks exactly that
    token OUT_OF_SUPPORT (it FAILs `support`), never in the support of a made-up law."""
    from specval.protocol import SutSpec
    from specval.semantics import DEFAULT_SEMANTICS
    from specval.sequence.protocol import parse_sequence_protocol

    protocol = parse_sequence_protocol(
        {
            **TINY,
            "kind": "sequence",
            "name": "chain_seq",
            "sampling": {"temperature": 1.0},
            "num_speculative_tokens": 3,
        }
    )
    sut = ChainSUT(SutSpec(adapter="chain"), 3)
    batch = collect.Batch("sync", 0, (0, 1), 0)
    samples = collect.sample_batch(sut, protocol, [sut.encode("alpha")], batch)
    samples.loc[5, "token"] = VOCAB
    status = reference.build_group(sut, protocol, [sut.encode("alpha")], samples, DEFAULT_SEMANTICS, "sync")["status"]
    assert status[5] == reference.OUT_OF_SUPPORT and (status.drop(5) != reference.OUT_OF_SUPPORT).all()


# ---------------------------------------------------------------- 3. the adapter a resume runs


def test_a_resume_under_other_filter_semantics_is_refused(tmp_path, monkeypatch):
    plant(monkeypatch, Fault("sample", "raises", 1))
    _one_line(_run(tmp_path), 3)
    path = _bundle(tmp_path)
    before = {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}
    heal(monkeypatch)
    declare(monkeypatch, capabilities={"semantics": OTHER_SEMANTICS})
    line = _one_line(_resume(path), 2)
    assert "semantics" in line and "top_k_ties keep" in line and "now declares (top_k_ties lowest_index" in line, line
    assert {p: p.read_bytes() for p in path.rglob("*") if p.is_file()} == before and _lock_free(path)
    declare(monkeypatch)
    _completes(path)


def test_a_resume_whose_adapter_fails_the_probe_leaves_the_bundle_as_it_was(tmp_path, monkeypatch):
    plant(monkeypatch, Fault("sample", "raises", 1))
    _one_line(_run(tmp_path), 3)
    path = _bundle(tmp_path)
    plant(monkeypatch, Fault("target_logits_along", "posinf"))
    line = _one_line(_resume(path), 3)
    assert "target_logits_along (probe, group 'sync')" in line and f"{path}/error.log" in line, line
    assert len(bundles.read_sessions(path)) == 1 and _lock_free(path)
    heal(monkeypatch)
    _completes(path)


# ---------------------------------------------------------------- 4. after collection: replay, verdict, report


def _interrupt(*args, **kwargs):
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    "stage, code",
    [
        ("replay_raises", 3),
        ("replay_enospc", 5),
        ("verdict_interrupted", 130),
        ("summary_efbig", 5),
        ("report_enospc", 5),
    ],
)
def test_a_fault_after_collection_keeps_the_bundle_and_a_resume_completes_it(tmp_path, monkeypatch, stage, code):
    with monkeypatch.context() as patch:
        if stage == "replay_raises":
            plant(patch, Fault("target_logits_along", "raises", 3))
        elif stage == "replay_enospc":
            _fail_writing(patch, reference.REFERENCE_SUFFIX, errno.ENOSPC)
        elif stage == "verdict_interrupted":
            patch.setattr(runner.verdict, "evaluate", _interrupt)
        elif stage == "summary_efbig":
            _fail_writing(patch, bundles.SUMMARY_FILE, errno.EFBIG)
        else:
            _fail_writing(patch, "report.md", errno.ENOSPC)
        line = _one_line(_run(tmp_path), code)
    path = _bundle(tmp_path)
    assert str(path) in line and f"resume with: specval run --resume {path}" in line, line
    assert {"ENOSPC": stage.endswith("enospc"), "EFBIG": stage.endswith("efbig")} == {
        name: name in line for name in ("ENOSPC", "EFBIG")
    }, line
    assert (path / bundles.SUMMARY_FILE).exists() == (stage == "report_enospc")
    heal(monkeypatch)
    _completes(path)


# ---------------------------------------------------------------- 5. the bundle's lock


def test_a_sealed_run_holds_no_lock(tmp_path):
    assert _run(tmp_path).exit_code == 0
    path = _bundle(tmp_path)
    assert not (path / bundles.LOCK_FILE).exists() and _lock_free(path)


@pytest.mark.parametrize("fault", ["interrupt", "enospc"])
def test_the_lock_is_given_up_when_collection_stops(tmp_path, monkeypatch, fault):
    """(An adapter error: every test of malformed answers above checks the same.)"""
    with monkeypatch.context() as patch:
        if fault == "enospc":
            _fail_writing(patch, "-b00001.parquet", errno.ENOSPC)
        else:
            plant(patch, Fault("sample", "interrupt", 2))
        line = _one_line(_run(tmp_path), {"interrupt": 130, "enospc": 5}[fault])
    path = _bundle(tmp_path)
    assert f"the bundle {path} is kept" in line and _lock_free(path), line
    assert bundles.read_sessions(path)[-1]["outcome"] == {"interrupt": "interrupted", "enospc": "error"}[fault]


SECOND_RESUME = """import sys
from pathlib import Path
from specval import bundle
try:
    bundle.check_resumable(Path(sys.argv[1]))
except bundle.BundleError as err:
    print(err)
    sys.exit(2)
"""


def test_a_second_resume_of_a_bundle_in_use_is_refused(tmp_path, monkeypatch):
    """The first resume, while it collects, starts a second one in another process (its first step,
    `bundle.check_resumable`, where a resume takes the lock: the whole command would only add its
    imports): refused, naming this process as the holder; the first completes."""
    plant(monkeypatch, Fault("sample", "raises", 1))
    _one_line(_run(tmp_path), 3)
    path = _bundle(tmp_path)
    second = []

    def resume_again():
        if not second:
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
            second.append(
                subprocess.run(
                    [sys.executable, "-c", SECOND_RESUME, str(path)], cwd=ROOT, env=env, capture_output=True, text=True
                )
            )

    chain_faults.hook(monkeypatch, resume_again)
    plant(monkeypatch, Fault("sample", "hook", 1))  # after the probe's call: the first collected batch
    _completes(path)
    (done,) = second
    assert done.returncode == 2 and f"in use by pid {os.getpid()}" in done.stdout, (done.stdout, done.stderr)
    assert len(bundles.read_sessions(path)) == 2
