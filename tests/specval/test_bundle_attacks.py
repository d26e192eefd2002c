"""The attacks of issue 38 by an adversary with write access to a bundle, each ending in exit 2
with one line naming what is wrong (`--resume`) or in a failed verify: laundering through
`--resume` (1a relabelled criteria, 1b swapped samples, 1c an exploratory run relabelled
frozen), entries outside the manifest (2: links, FIFOs, devices, empty directories) and two
processes on one bundle (3). All deterministic: the fake SUT's fixed run, no statistic asserted."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import specval
from specval import bundle as bundles
from specval import protocol as protocols
from specval.bundle import chain as bundle_chain
from specval.cli import main
from specval.distribution import runner
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import FakeSUT
from tests.fixtures.forge import reseal
from tests.fixtures.small_bundles import SMALL, killed_bundle


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    """A sealed bundle; its run records which process held the bundle's lock at each chunk."""
    root = tmp_path_factory.mktemp("sealed")
    protocol = write_protocol(root, fake_protocol_dict(**SMALL))
    holders, real = [], bundles.write_chunk

    def spy(stage, path, write):
        holders.append(json.loads((stage / bundles.LOCK_FILE).read_text())["pid"])
        real(stage, path, write)

    with pytest.MonkeyPatch.context() as patch:
        for module in (bundles, bundle_chain):  # the callers outside the package, write_json_chunk
            patch.setattr(module, "write_chunk", spy)
        path, _ = runner.run(protocol, "ci", root / "results", sut_factory=FakeSUT, progress=False)
    (path / "holders.json").write_text(json.dumps(holders))  # outside the bundle's manifest: moved below
    os.replace(path / "holders.json", root / "holders.json")
    return path


@pytest.fixture
def copy(sealed, tmp_path) -> Path:
    return Path(shutil.copytree(sealed, tmp_path / sealed.name, symlinks=True))


@pytest.fixture
def killed(tmp_path) -> Path:
    return killed_bundle(tmp_path)


def _resume(bundle: Path):
    return CliRunner().invoke(main, ["run", "--resume", str(bundle), "--quiet"])


def _refused(result, *words: str) -> str:
    """The one line of a resume refused with exit 2 (no traceback), holding every word."""
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert result.output.count("\n") == 1 and result.output.startswith("error: "), result.output
    assert all(word in result.output for word in words), result.output
    return result.output


def _verify(bundle: Path):
    return CliRunner().invoke(main, ["verify", str(bundle)])


def _strip_seal(bundle: Path) -> None:
    """The forger removes every trace of the finished run: seal, manifest, reports, summary, and
    the finished session's outcome."""
    for name in (bundles.SUMS_FILE, bundles.MANIFEST_FILE, bundles.SUMMARY_FILE, *bundles.REPORT_FILES):
        (bundle / name).unlink(missing_ok=True)
    sessions = bundles.read_json(bundle / bundles.SESSIONS_FILE)
    sessions[-1].update(finished=None, samples_drawn=None, outcome=None)
    bundles.write_json(bundle / bundles.SESSIONS_FILE, sessions)


def _relabel_primary_as_secondary(bundle: Path) -> str:
    """Attack 1a's edit: the homogeneity criterion made secondary in protocol.yaml and
    protocol.json, the new protocol hash written into run.json. Returns the new hash."""
    text = (bundle / bundles.PROTOCOL_YAML).read_text()
    marker = "- kind: homogeneity\n  position: 2\n  role: primary"
    assert marker in text
    (bundle / bundles.PROTOCOL_YAML).write_text(text.replace(marker, marker.replace("primary", "secondary")))
    relabelled = protocols.load_protocol(bundle / bundles.PROTOCOL_YAML)
    bundles.write_json(bundle / bundles.PROTOCOL_JSON, relabelled.to_dict())
    run = bundles.read_json(bundle / bundles.RUN_FILE)
    bundles.write_json(bundle / bundles.RUN_FILE, {**run, "protocol_hash": relabelled.hash})
    return relabelled.hash


# ---------------------------------------------------------------- 1: laundering through --resume


def test_1a_relabelled_criteria_cannot_be_resealed_by_resume(copy):
    _relabel_primary_as_secondary(copy)
    (copy / bundles.SUMS_FILE).unlink()  # a resume would complete it, but re-checks the chain first
    _refused(
        _resume(copy), "refusing to complete it", "chunks.json: record 0", "does not chain", "the plan in run.json"
    )
    _strip_seal(copy)  # every trace of the seal gone: the chain still starts from the old protocol hash
    _refused(_resume(copy), "chunks.json: record 0", "does not chain", "the plan in run.json")


def test_1b_swapped_samples_with_rehashed_records_do_not_chain(copy):
    """The sync group's chunks replaced by the nospec group's (seeds relabelled), each record's
    sha256 re-hashed in place: the chain breaks at the first edited record."""
    import pandas as pd

    records = bundles.read_json(copy / bundles.CHUNKS_FILE)
    nospec = sorted(r["file"] for r in records if "/nospec-" in r["file"])
    sync = sorted(r["file"] for r in records if "/sync-" in r["file"])
    for source, target in zip(nospec, sync):
        frame = pd.read_parquet(copy / source)
        offset = int(target.split("-")[-2]) - int(source.split("-")[-2])
        frame["seed"], frame["group"] = frame["seed"] + offset, "sync"
        frame.to_parquet(copy / target, index=False)
    for record in records:
        record["sha256"] = bundles.sha256_file(copy / record["file"])
    bundles.write_json(copy / bundles.CHUNKS_FILE, records)
    bundles.write_sums(copy)
    result = _verify(copy)
    assert result.exit_code == 1 and "does not chain" in result.output, result.output
    (copy / bundles.SUMS_FILE).unlink()
    _strip_seal(copy)
    _refused(_resume(copy), "refusing to resume", "chunks.json: record", "does not chain")


def _forge_consistently(bundle: Path) -> None:
    """The forger finishes the job: chains, heads and SHA256SUMS recomputed, summary.json
    recomputed from the relabelled records, the reports re-rendered and re-sealed (`specval report`)."""
    reseal(bundle)
    bundles.write_json(bundle / bundles.SUMMARY_FILE, runner._recompute_bundle(bundle))
    bundles.write_sums(bundle)
    assert CliRunner().invoke(main, ["report", str(bundle)]).exit_code == 0


def _pinned(bundle: Path, protocol_file: Path):
    return CliRunner().invoke(main, ["verify", str(bundle), "--protocol", str(protocol_file)])


def test_4_relabelled_criteria_verify_unless_the_frozen_protocol_is_pinned(sealed, copy):
    relabelled = _relabel_primary_as_secondary(copy)
    _forge_consistently(copy)
    plain = _verify(copy)
    assert plain.exit_code == 0 and "unsigned: internal consistency only" in plain.output, plain.output
    frozen = sealed.parent.parent / "protocol.yaml"  # the file the run was frozen from
    result = _pinned(copy, frozen)
    assert result.exit_code == 1, result.output
    original = protocols.load_protocol(frozen).hash
    assert f"DIFFERS run.json: ran protocol hash {relabelled}, not the pinned {original}" in result.output
    assert bundles.check_pinned(sealed, original) == []  # the honest bundle passes the same pin
    assert bundles.check_pinned(copy, original) == [
        f"run.json: ran protocol hash {relabelled}, not the pinned {original}"
    ]
    by_hash = CliRunner().invoke(main, ["verify", str(copy), "--protocol-hash", "xyz"])
    assert by_hash.exit_code == 2 and "--protocol-hash 'xyz': not a SHA-256 in hex" in by_hash.output


def test_1c_and_4_an_exploratory_run_relabelled_frozen_is_not_resumed_and_fails_the_pin(tmp_path):
    frozen = write_protocol(tmp_path, fake_protocol_dict(**SMALL))
    (tmp_path / "try").mkdir()
    tried = write_protocol(tmp_path / "try", fake_protocol_dict(**{**SMALL, "alpha": 0.2}), frozen=False)
    path, _ = runner.run(tried, "ci", tmp_path / "results", exploratory=True, sut_factory=FakeSUT, progress=False)
    run = bundles.read_json(path / bundles.RUN_FILE)
    bundles.write_json(path / bundles.RUN_FILE, {**run, "registration": "frozen", "exploratory": False})
    forged = Path(shutil.copytree(path, tmp_path / "forged"))

    (path / bundles.SUMS_FILE).unlink()  # 1c through --resume: completing it re-checks the chain first
    _refused(_resume(path), "refusing to complete it", "chunks.json: record 0", "does not chain")
    _strip_seal(path)  # every trace gone: the chain still starts from the exploratory plan
    _refused(_resume(path), "chunks.json: record 0", "does not chain", "the plan in run.json")

    _forge_consistently(forged)  # 1c by hand: summary, reports and seals recomputed
    assert runner.verify(forged) == []  # internally consistent
    result = _pinned(forged, frozen)
    assert result.exit_code == 1 and "not the pinned" in result.output, result.output
    unfrozen = _pinned(forged, tried)  # pinning a protocol that is not frozen is an input error
    assert unfrozen.exit_code == 2 and "only a frozen protocol can be pinned" in unfrozen.output


def test_check_pinned_requires_a_frozen_confirmatory_run(killed):
    run = bundles.read_json(killed / bundles.RUN_FILE)
    assert bundles.check_pinned(killed, run["protocol_hash"]) == []
    bundles.write_json(killed / bundles.RUN_FILE, {**run, "exploratory": True})
    assert bundles.check_pinned(killed, run["protocol_hash"]) == [
        "run.json: registration 'frozen' (exploratory): the pinned protocol must run frozen"
    ]


def test_a_finished_session_alone_refuses_resume(killed):
    sessions = bundles.read_json(killed / bundles.SESSIONS_FILE)
    sessions[0]["outcome"] = "FAIL"
    bundles.write_json(killed / bundles.SESSIONS_FILE, sessions)
    _refused(_resume(killed), "sessions.json records a finished run (session 0 ended FAIL")


def test_chunk_records_chain_from_the_protocol_hash(killed):
    records = bundles.read_json(killed / bundles.CHUNKS_FILE)
    assert [r["file"].split("/")[0] for r in records] == ["samples", "samples"]
    assert records[0]["prev"] == bundles.chain_genesis(killed)
    assert records[1]["prev"] == bundles.record_hash(records[0])
    assert bundles.chain_head(killed) == bundles.record_hash(records[1])
    dropped = [records[1]]  # the first record removed: the second no longer chains
    bundles.write_json(killed / bundles.CHUNKS_FILE, dropped)
    with pytest.raises(bundles.BundleError, match="record 0 .* does not chain"):
        bundles.check_resumable(killed)


def test_a_written_chunk_is_never_replaced(killed):
    chunk = sorted((killed / "samples").glob("*.parquet"))[0]
    with pytest.raises(bundles.BundleError, match="already written; a written sample chunk is never replaced"):
        bundles.write_chunk(killed, chunk, lambda tmp: tmp.write_bytes(b"x"))


def test_a_killed_run_resumes_and_its_manifest_names_the_chain_heads(killed):
    path, _ = runner.run(None, None, killed.parent, resume=killed, sut_factory=FakeSUT, progress=False)
    assert bundles.check_sums(path) == [] and bundles.check_all_chunks(path) == []
    assert not (path / bundles.LOCK_FILE).exists()
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    assert manifest["chunk_heads"] == {"chunks.json": bundles.chain_head(path)}
    assert len(bundles.read_json(path / bundles.CHUNKS_FILE)) == 4  # 2 chunks before the kill, 2 after
    manifest["chunk_heads"]["chunks.json"] = "0" * 64
    bundles.write_json(path / bundles.MANIFEST_FILE, manifest)
    assert bundles.check_all_chunks(path) == ["manifest.json: chunk_heads differ from the heads of the chunk records"]


# ---------------------------------------------------------------- 2: only regular files


def _outside(tmp_path: Path, data: bytes) -> Path:
    target = tmp_path / "outside"
    target.write_bytes(data)
    return target


PLANTS = {
    "link to /etc": (lambda b, t: os.symlink("/etc", b / "etc"), "etc: a symbolic link"),
    "link to /dev/null": (
        lambda b, t: os.symlink("/dev/null", b / "samples" / "null"),
        "samples/null: a symbolic link",
    ),
    "FIFO": (lambda b, t: os.mkfifo(b / "pipe"), "pipe: a FIFO"),
    "empty directory": (lambda b, t: (b / "empty").mkdir(), "empty/: a directory holding no file of SHA256SUMS"),
    "report replaced by a link with the same bytes": (
        lambda b, t: (
            (b / "report.md").unlink()
            or os.symlink(_outside(t, (b.parent / "report.md").read_bytes()), b / "report.md")
        ),
        "report.md: a symbolic link",
    ),
}


@pytest.mark.parametrize("plant", PLANTS, ids=list(PLANTS))
def test_2_verify_refuses_entries_that_are_not_regular_files_of_the_manifest(copy, tmp_path, plant):
    shutil.copyfile(copy / "report.md", tmp_path / "report.md")  # the bytes the forger's link points at
    make, line = PLANTS[plant]
    make(copy, tmp_path)
    result = _verify(copy)
    assert result.exit_code == 1 and "Traceback" not in result.output, result.output
    assert f"DIFFERS {line}" in result.output, result.output
    bundles.write_sums(copy)  # the forger re-seals: a link or a FIFO is still refused, never followed
    assert f"DIFFERS {line}" in _verify(copy).output


RESUME_PLANTS = {  # attack 2 on an unsealed bundle: what a resume must refuse before touching it
    "FIFO": (lambda b: os.mkfifo(b / "samples" / "pipe"), "samples/pipe: a FIFO"),
    "link to /etc": (lambda b: os.symlink("/etc", b / "etc"), "etc: a symbolic link"),
    "link to /dev/null": (lambda b: os.symlink("/dev/null", b / "samples" / "null"), "samples/null: a symbolic link"),
    "empty directory": (lambda b: (b / "empty").mkdir(), "empty/: a directory outside the bundle layout"),
}


def test_2_resume_refuses_a_bundle_holding_any_entry_but_its_files(killed):
    """One killed bundle, each entry planted in turn: exit 2, one line naming it, nothing followed."""
    for make, line in RESUME_PLANTS.values():
        make(killed)
        _refused(_resume(killed), f"refusing to resume: {line}")
        entry = killed / line.split(":")[0].rstrip("/")
        entry.rmdir() if entry.is_dir() and not entry.is_symlink() else entry.unlink()
    assert _resume(killed).exit_code == 0  # the entries gone, it resumes


def test_entry_kind_names_devices_and_sockets():
    assert bundles.entry_kind(stat.S_IFCHR | 0o600) == "a character device"
    assert bundles.entry_kind(stat.S_IFBLK | 0o600) == "a block device"
    assert bundles.entry_kind(stat.S_IFSOCK | 0o600) == "a socket"


def test_read_json_never_opens_a_fifo(tmp_path):
    os.mkfifo(tmp_path / "summary.json")
    with pytest.raises(bundles.BundleError, match="summary.json: a FIFO, not a regular file"):
        bundles.read_json(tmp_path / "summary.json")
    with pytest.raises(bundles.BundleError, match="a FIFO, not a regular file"):
        bundles.sha256_file(tmp_path / "summary.json")


# ---------------------------------------------------------------- 3: one process per bundle

HOLD = (
    "import sys; from pathlib import Path; from specval import bundle; "
    "bundle.lock_bundle(Path(sys.argv[1])); print('held', flush=True); sys.stdin.read()"
)


def test_3_a_second_resume_exits_2_naming_the_holder(killed):
    env = {**os.environ, "PYTHONPATH": str(Path(specval.__file__).resolve().parents[1])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(killed)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout.readline() == "held\n"
        _refused(
            _resume(killed), f"in use by pid {holder.pid} on ", " since ", "one process works on a bundle at a time"
        )
    finally:
        holder.communicate("")
    bundles.check_resumable(killed)  # the holder is gone: its lock file left behind blocks nothing
    bundles.release_bundle(killed)
    assert not (killed / bundles.LOCK_FILE).exists()


def test_a_run_holds_its_bundle_from_its_claim_to_its_seal(sealed):
    holders = json.loads((sealed.parent.parent / "holders.json").read_text())
    assert holders == [os.getpid()] * 4  # every chunk written under this process's lock
    assert not (sealed / bundles.LOCK_FILE).exists()  # given up at the seal, not listed in SHA256SUMS
