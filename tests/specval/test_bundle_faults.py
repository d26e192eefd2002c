"""Fault suite of the bundle's seals: every tampering a forger can do after the run, with
SHA256SUMS recomputed, is reported by verify; a sealed or tampered bundle is never resumed; a
corrupt file gives a one-line error, never a traceback; files follow the umask; the manifest lists
every session with the code version that ran. All deterministic (fixed seeds, no statistics
asserted beyond the fake SUT's fixed run)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner

import specval
from specval import bundle as bundles
from specval import seeds
from specval.bundle import facts as bundle_facts
from specval.bundle import verify as bundle_verify
from specval.cli import main
from specval.distribution import runner
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import FakeSUT
from tests.fixtures.small_bundles import SMALL, killed_bundle

DEFAULT_UMASK = 0o022


def _with_umask(mask: int, make):
    old = os.umask(mask)
    try:
        return make()
    finally:
        os.umask(old)


@pytest.fixture(scope="module")
def sealed(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("sealed")
    protocol = write_protocol(root, fake_protocol_dict(**SMALL))
    path, _ = _with_umask(
        DEFAULT_UMASK, lambda: runner.run(protocol, "ci", root / "results", sut_factory=FakeSUT, progress=False)
    )
    assert runner.verify(path) == []
    return path


@pytest.fixture
def copy(sealed, tmp_path) -> Path:
    return Path(shutil.copytree(sealed, tmp_path / sealed.name))


@pytest.fixture
def killed(tmp_path) -> Path:
    return killed_bundle(tmp_path)


def _reseal(bundle: Path) -> list[str]:
    bundles.write_sums(bundle)  # the forger recomputes SHA256SUMS
    return runner.verify(bundle)


def _first_chunk(bundle: Path) -> Path:
    return sorted((bundle / "samples").glob("sync-*.parquet"))[0]


def _edit_sample(chunk: Path) -> None:
    frame = pd.read_parquet(chunk)
    frame.loc[0, "t2"] = (frame.loc[0, "t2"] + 1) % 16
    frame.to_parquet(chunk, index=False)


# ---------------------------------------------------------------- verify


def test_an_edited_sample_differs_from_the_hash_recorded_when_it_was_written(copy):
    _edit_sample(_first_chunk(copy))
    name = _first_chunk(copy).relative_to(copy).as_posix()
    assert f"{name}: sha256 differs from the one recorded in chunks.json when it was written" in _reseal(copy)


def test_an_edited_report_is_caught_by_re_rendering(copy):
    for name in bundles.REPORT_FILES:
        text = (copy / name).read_text()
        assert "fake_t2: <span class='PASS'>PASS" in text or "# fake_t2: PASS" in text
        (copy / name).write_text(text.replace("PASS", "FAIL", 1))
    problems = _reseal(copy)
    assert "report.md: differs from its re-rendering from the bundle" in problems
    assert "report.html: differs from its re-rendering from the bundle" in problems


def test_an_edited_protocol_yaml_must_still_parse_to_protocol_json(copy):
    text = (copy / "protocol.yaml").read_text()
    assert "top_p: 0.95" in text
    (copy / "protocol.yaml").write_text(text.replace("top_p: 0.95", "top_p: 0.9"))
    problems = _reseal(copy)
    assert any("protocol.yaml: parses to hash" in p and "not protocol.json's" in p for p in problems), problems


def test_an_added_dotfile_is_hashed_and_outside_the_layout_even_when_resealed(copy):
    (copy / "samples" / ".notes").write_text("x")
    assert "samples/.notes: present but not listed in SHA256SUMS" in runner.verify(copy)
    assert "samples/.notes: not a file of the bundle layout" in _reseal(copy)


def test_manifest_sessions_must_match_the_session_records(copy):
    manifest = json.loads((copy / "manifest.json").read_text())
    manifest["sessions"][0]["code"]["commit"] = "0" * 40
    bundles.write_json(copy / "manifest.json", manifest)
    assert "manifest.json: sessions differ from sessions.json" in _reseal(copy)


@pytest.mark.parametrize(
    "name, content",
    [
        ("summary.json", "{not json"),
        ("summary.json", "[]"),
        ("summary.json", '{"verdict": "PASS"}'),
        ("manifest.json", "[]"),
        ("chunks.json", "[]"),
        ("sessions.json", "{"),
        ("run.json", "{}"),
    ],
)
def test_a_corrupt_file_fails_verify_in_lines_without_a_traceback(copy, name, content):
    (copy / name).write_text(content)
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    assert f"DIFFERS {name}: sha256 differs from SHA256SUMS" in result.output
    assert result.output.splitlines()[-1].startswith(f"FAIL: {copy} does not verify")


def test_a_resealed_reference_with_a_malformed_entry_fails_verify_naming_it(copy):
    """reference.json's base64 fields (format 3), corrupted and resealed: verify reads the
    reference to recompute the verdicts, so it fails in lines naming the entry, no traceback."""
    reference = bundles.read_json(copy / bundles.REFERENCE_FILE)
    reference["dists"][0]["probs"] = "not base64!"
    bundles.write_json(copy / bundles.REFERENCE_FILE, reference)
    bundles.write_sums(copy)
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    assert "dists prefix []: probs is not base64" in result.output, result.output
    assert result.output.splitlines()[-1].startswith(f"FAIL: {copy} does not verify")


def test_report_of_a_resealed_corrupt_summary_exits_2_in_one_line(copy):
    (copy / "summary.json").write_text("[]")
    bundles.write_sums(copy)
    result = CliRunner().invoke(main, ["report", str(copy)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert result.output.startswith(f"error: {copy}: cannot render the report:") and result.output.count("\n") == 1


def test_verify_of_a_directory_that_is_not_a_bundle_exits_2_naming_it(tmp_path):
    result = CliRunner().invoke(main, ["verify", str(tmp_path)])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit)
    assert result.output == f"error: {tmp_path}: not a bundle (run.json missing)\n"


def test_reports_rebuild_byte_for_byte_in_a_fresh_process(sealed):
    # a new interpreter: no matplotlib state, font cache or hash salt shared with the run
    env = {**os.environ, "PYTHONPATH": str(Path(specval.__file__).resolve().parents[1]), "PYTHONHASHSEED": "random"}
    done = subprocess.run(
        [sys.executable, "-m", "specval.cli", "verify", str(sealed)], capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------- resume


def test_resume_of_a_sealed_bundle_is_refused_before_anything_is_touched(copy):
    _edit_sample(_first_chunk(copy))  # the laundering attempt: tamper, then resume to re-seal
    before = {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    with pytest.raises(bundles.BundleError, match="sealed .SHA256SUMS present.; a sealed bundle is never re-opened"):
        runner.run(None, None, copy.parent, resume=copy, sut_factory=FakeSUT, progress=False)
    assert {p: p.read_bytes() for p in copy.rglob("*") if p.is_file()} == before


def test_resume_after_a_tampered_chunk_is_refused(killed):
    _edit_sample(sorted((killed / "samples").glob("*.parquet"))[0])
    with pytest.raises(bundles.BundleError, match="sha256 differs from the one recorded"):
        runner.run(None, None, killed.parent, resume=killed, sut_factory=FakeSUT, progress=False)


def test_resume_with_an_unrecorded_chunk_is_refused(killed):
    chunk = sorted((killed / "samples").glob("*.parquet"))[0]
    shutil.copyfile(chunk, killed / "samples" / "planted.parquet")
    with pytest.raises(bundles.BundleError, match="planted.parquet: written but its sha256 was never recorded"):
        bundles.check_resumable(killed)


def _as_format(bundle: Path, found: int) -> None:
    """Rewrite `bundle` as the format `found` wrote it: run.json's bundle_format, chunks.json a
    {file: sha256} map and no `chunk_heads` in manifest.json (before format 4, which verify
    checks the files bear out), and, for format 2, reference.json's tokens and probs as JSON
    lists of numbers (the same values)."""
    from specval.distribution.reference import Reference

    run = json.loads((bundle / bundles.RUN_FILE).read_text())
    run["bundle_format"] = found
    bundles.write_json(bundle / bundles.RUN_FILE, run)
    bundles.write_json(bundle / bundles.CHUNKS_FILE, bundles.read_chunk_index(bundle))
    manifest = bundles.read_json(bundle / bundles.MANIFEST_FILE)
    del manifest["chunk_heads"]
    bundles.write_json(bundle / bundles.MANIFEST_FILE, manifest)
    reference = Reference.from_dict(bundles.read_json(bundle / bundles.REFERENCE_FILE))
    entries = [
        {
            "prefix": list(prefix),
            "tokens": [int(t) for t in (probs > 0).nonzero()[0]],
            "probs": probs[probs > 0].tolist(),
        }
        for prefix, probs in sorted(reference.dists.items(), key=lambda item: (len(item[0]), item[0]))
    ]
    bundles.write_json(bundle / bundles.REFERENCE_FILE, {**reference.to_dict(), "dists": entries})


def test_a_format_2_bundle_still_verifies_and_format_1_is_refused_by_name(copy):
    """Format 2 differs from 3 only in reference.json's encoding (JSON lists), which is read too:
    its verdicts recompute. A bundle of format 1 (or a future format) is refused, naming it."""
    assert isinstance(bundles.read_json(copy / bundles.REFERENCE_FILE)["dists"][0]["probs"], str)  # base64
    _as_format(copy, 2)
    assert isinstance(bundles.read_json(copy / bundles.REFERENCE_FILE)["dists"][0]["probs"], list)
    assert _reseal(copy) == []
    for found in (1, bundles.BUNDLE_FORMAT + 1):
        run = json.loads((copy / bundles.RUN_FILE).read_text())
        run["bundle_format"] = found
        bundles.write_json(copy / bundles.RUN_FILE, run)
        assert f"run.json: bundle format {found}, this specval verifies formats 2, 3, 4 (re-run it)" in _reseal(copy)


def test_resume_of_an_older_format_bundle_is_refused(killed):
    run = json.loads((killed / bundles.RUN_FILE).read_text())
    run["bundle_format"] = 2
    bundles.write_json(killed / bundles.RUN_FILE, run)
    with pytest.raises(bundles.BundleError, match="bundle format 2, this specval resumes format 4 only"):
        bundles.check_resumable(killed)


def test_cli_resume_of_a_sealed_bundle_exits_2(sealed):
    result = CliRunner().invoke(main, ["run", "--resume", str(sealed), "--quiet"])
    assert result.exit_code == 2 and isinstance(result.exception, SystemExit), result.output
    assert "a sealed bundle is never re-opened" in result.output and "Traceback" not in result.output


def test_a_resumed_run_lists_every_session_with_its_code_version(killed):
    stale = bundles.temp_path(killed / "reference.json")  # left by a process killed while writing
    stale.write_text("{")
    path, summary = runner.run(
        None,
        None,
        killed.parent,
        resume=killed,
        sut_factory=FakeSUT,
        progress=False,
        command=["specval", "run", "--resume", "B"],
    )
    assert runner.verify(path) == [] and not stale.exists()
    sessions = json.loads((path / "manifest.json").read_text())["sessions"]
    assert len(sessions) == 2
    first, second = sessions
    # interrupted (KeyboardInterrupt): closed as such, samples not counted; a SIGKILL would leave all three None
    assert first["finished"] is not None and (first["samples_drawn"], first["outcome"]) == (None, "interrupted")
    assert second["command"] == ["specval", "run", "--resume", "B"]
    assert (second["samples_drawn"], second["outcome"]) == (400, summary["verdict"])  # 2 of 4 chunks of 200
    assert first["code"] == second["code"] == bundles.code_version()


# ---------------------------------------------------------------- sessions and code version


def test_sessions_begin_and_end_once(tmp_path):
    assert bundles.begin_session(tmp_path, ["a"]) == 0
    assert bundles.begin_session(tmp_path, ["b"]) == 1
    bundles.end_session(tmp_path, 1, 7, "PASS")
    records = bundles.read_sessions(tmp_path)
    assert [(r["command"], r["samples_drawn"], r["outcome"]) for r in records] == [
        (["a"], None, None),
        (["b"], 7, "PASS"),
    ]
    assert records[1]["finished"] >= records[1]["started"]
    for index in (1, 2):  # ended already; never begun
        with pytest.raises(bundles.BundleError, match="no open session"):
            bundles.end_session(tmp_path, index, 0, "PASS")


def test_code_version_is_the_package_checkout_not_the_current_directory(tmp_path, monkeypatch):
    package = Path(specval.__file__).resolve().parent
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=package, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("specval is not run from a git checkout")
    monkeypatch.chdir(tmp_path)  # outside any repository
    code = bundles.code_version()
    assert (code["version"], code["commit"]) == (specval.__version__, head.stdout.strip())
    assert isinstance(code["dirty"], bool)


def test_git_state_of_a_directory_no_checkout_tracks_is_none(tmp_path):
    assert bundles.git_state(tmp_path) == {"commit": None, "dirty": None}
    repo = tmp_path / "repo"  # a repository that merely contains the directory (a venv in a repo)
    (repo / "site-packages").mkdir(parents=True)
    (repo / "site-packages" / "module.py").write_text("")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    assert bundles.git_state(repo / "site-packages") == {"commit": None, "dirty": None}


# ---------------------------------------------------------------- file modes


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_every_file_of_a_bundle_and_the_ledger_follow_the_default_umask(sealed):
    files = [p for p in sealed.rglob("*") if p.is_file()] + [seeds.ledger_path(sealed.parent)]
    assert {p.relative_to(sealed.parent).as_posix(): _mode(p) for p in files if _mode(p) != 0o644} == {}


def test_atomic_writers_follow_another_umask(tmp_path):
    (tmp_path / "samples").mkdir()
    (tmp_path / bundles.RUN_FILE).write_text(bundles.json_text(bundles.RunPlan("p", "0" * 64, None, ()).to_dict()))

    def write_all():
        bundles.write_json(tmp_path / "a.json", {"x": 1})
        bundles.write_chunk(tmp_path, tmp_path / "samples" / "c.parquet", lambda tmp: tmp.write_bytes(b"c"))
        seeds.claim(tmp_path, [seeds.SeedRange("p", "r", "g", 0, 1)])

    _with_umask(0o027, write_all)
    written = [
        tmp_path / "a.json",
        tmp_path / "samples" / "c.parquet",
        tmp_path / "chunks.json",
        seeds.ledger_path(tmp_path),
    ]
    assert [_mode(p) for p in written] == [0o640] * 4
    assert not list(tmp_path.rglob(".*"))  # no temp file left behind


def _package_tree(root: Path) -> None:
    for name, files in {
        "specval": {"__init__.py": "x = 1\n"},
        "engine": {"__init__.py": "", "weights/model.pt": "\x00\x01"},
    }.items():
        for relative, text in files.items():
            (root / name / relative).parent.mkdir(parents=True, exist_ok=True)
            (root / name / relative).write_text(text)


def test_source_digest_moves_with_any_package_file_and_ignores_bytecode(tmp_path, monkeypatch):
    from types import SimpleNamespace

    _package_tree(tmp_path)
    monkeypatch.setattr(
        bundle_facts.importlib.util,
        "find_spec",
        lambda name: SimpleNamespace(origin=str(tmp_path / name / "__init__.py")),
    )
    first = bundles.source_digest()
    assert first == bundles.source_digest() and len(first) == 64
    (tmp_path / "engine" / "__pycache__").mkdir()
    (tmp_path / "engine" / "__pycache__" / "x.pyc").write_bytes(b"compiled")
    assert bundles.source_digest() == first  # bytecode is not source
    (tmp_path / "engine" / "weights" / "model.pt").write_text("\x00\x02")  # bundled weights count
    changed = bundles.source_digest()
    assert changed != first
    (tmp_path / "engine" / "weights" / "model.pt").rename(tmp_path / "engine" / "weights" / "other.pt")
    assert bundles.source_digest() not in (first, changed)  # a path is part of the digest


def test_verify_notes_when_the_bundle_was_made_by_other_code(copy, monkeypatch):
    made = json.loads((copy / "sessions.json").read_text())[0]["code"]["source_sha256"]
    assert made == bundles.source_digest()  # the fixture ran this checkout's code
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 0 and "note:" not in result.output, result.output
    for module in (bundles, bundle_facts, bundle_verify):  # the facade, code_version, code_note
        monkeypatch.setattr(module, "source_digest", lambda: "f" * 64)
    result = CliRunner().invoke(main, ["verify", str(copy)])
    assert result.exit_code == 0, result.output  # informational: the verdicts still recompute
    assert f"note: made by source sha256 {made[:16]}; recomputed with this checkout's {'f' * 16}" in result.output
