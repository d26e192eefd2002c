"""Fault injection: a malformed or hostile bundle, run through the CLI, gets its documented exit
code and one line naming what is wrong, never a traceback. Duplicate or malformed SHA256SUMS
lines, JSON nested 200,000 deep or larger than the bound (verify, verify --key, ls, --resume), a
signature removed from a bundle that recorded a signing session, an envelope whose keyid names
another key, `report` on a read-only bundle, and a bundle_format lowered to skip the chain check.
Deterministic: the fake SUT's fixed run, no statistic asserted."""

from __future__ import annotations

import base64
import errno
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import bundle as bundles
from specval import signing
from specval.bundle import files, samples
from specval.bundle.verify import check_format
from specval.cli import main
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.small_bundles import SMALL, killed_bundle

DEEP = "[" * 200_000 + "]" * 200_000  # a RecursionError for an unbounded parser


def _cli(*args: object):
    return CliRunner().invoke(main, [str(arg) for arg in args])


def _no_traceback(result) -> None:
    assert "Traceback" not in result.output and not isinstance(result.exception, RecursionError), result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)


def _fails_verify(result, *words: str) -> str:
    """The one DIFFERS line of a verify that exits 1, holding every word."""
    _no_traceback(result)
    assert result.exit_code == 1, result.output
    differs = [line for line in result.output.splitlines() if line.startswith("DIFFERS")]
    lines = [line for line in differs if all(w in line for w in words)]
    assert lines, result.output
    assert result.output.rstrip().splitlines()[-1].startswith("FAIL: ")
    return lines[0]


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("keys")
    for name in ("team", "other"):
        assert _cli("keygen", root / name).exit_code == 0
    return {name: root / name for name in ("team", "team.pub", "other", "other.pub")}


@pytest.fixture(scope="module")
def signed(tmp_path_factory, keys) -> Path:
    """A bundle of `specval run --sign`, its session recording the command as a shell gives it."""
    root = tmp_path_factory.mktemp("signed")
    protocol = write_protocol(root, fake_protocol_dict(**SMALL))
    args = ["run", protocol, "--profile", "ci", "--output", root / "results", "--quiet", "--sign", keys["team"]]
    argv = sys.argv
    sys.argv = ["specval", *map(str, args)]  # sessions.json records sys.argv
    try:
        result = _cli(*args)
    finally:
        sys.argv = argv
    assert result.exit_code == 0, result.output
    (path,) = (root / "results").glob("fake_t2-*")
    return path


@pytest.fixture
def copy(signed, tmp_path) -> Path:
    return Path(shutil.copytree(signed, tmp_path / signed.name))


@pytest.fixture(scope="module")
def made_unsigned(tmp_path_factory) -> Path:
    """A bundle of `specval run` without --sign."""
    root = tmp_path_factory.mktemp("unsigned")
    protocol = write_protocol(root, fake_protocol_dict(**SMALL))
    result = _cli("run", protocol, "--profile", "ci", "--output", root / "results", "--quiet")
    assert result.exit_code == 0, result.output
    (path,) = (root / "results").glob("fake_t2-*")
    return path


@pytest.fixture
def unsigned(made_unsigned, tmp_path) -> Path:
    path = Path(shutil.copytree(made_unsigned, tmp_path / made_unsigned.name))
    result = _cli("verify", path)
    assert result.exit_code == 0 and signing.UNSIGNED_LINE in result.output, result.output
    return path


# ---------------------------------------------------------------- SHA256SUMS


def test_a_file_listed_twice_in_sha256sums_fails_verify(unsigned):
    sums = unsigned / bundles.SUMS_FILE
    lines = sums.read_text().splitlines()
    name = bundles.SUMMARY_FILE
    (line,) = [line for line in lines if line.endswith(f"  {name}")]
    sums.write_text("\n".join([*lines, f"{'0' * 64}  {name}"]) + "\n")  # the last would win
    number = len(lines) + 1
    _fails_verify(_cli("verify", unsigned), f"SHA256SUMS: line {number} lists {name} again")
    sums.write_text("\n".join([*lines, line]) + "\n")  # even the same line twice
    _fails_verify(_cli("verify", unsigned), f"SHA256SUMS: line {number} lists {name} again")


@pytest.mark.parametrize(
    "bad",
    ["abc  summary.json", f"{'A' * 64}  summary.json", f"{'0' * 64} summary.json", f"{'0' * 64}  ", ""],
)
def test_a_malformed_sha256sums_line_fails_verify(unsigned, bad):
    sums = unsigned / bundles.SUMS_FILE
    lines = sums.read_text().splitlines()
    sums.write_text("\n".join([bad, *lines]) + "\n")
    _fails_verify(_cli("verify", unsigned), "SHA256SUMS: line 1 is not `<sha256>  <path>`")


# ---------------------------------------------------------------- bounded JSON


@pytest.mark.parametrize(
    "name",
    [bundles.SUMMARY_FILE, bundles.RUN_FILE, bundles.SESSIONS_FILE, bundles.MANIFEST_FILE, bundles.CHUNKS_FILE],
)
def test_deeply_nested_json_fails_verify_in_one_line(copy, keys, name):
    (copy / name).write_text(DEEP)
    bundles.write_sums(copy)
    _fails_verify(_cli("verify", copy), name, f"nested deeper than {files.MAX_JSON_DEPTH} levels")
    # with --key the signature is checked first: the changed file is never parsed
    _fails_verify(_cli("verify", copy, "--key", keys["team.pub"]), f"{name}: changed after signing")


def test_a_deeply_nested_signature_or_payload_fails_verify_in_one_line(copy, keys):
    (copy / signing.SIGNATURE_FILE).write_text(DEEP)
    for args in ((), ("--key", keys["team.pub"])):
        _fails_verify(_cli("verify", copy, *args), signing.SIGNATURE_FILE, "nested deeper than")
    envelope = {"payloadType": signing.PAYLOAD_TYPE, "payload": base64.b64encode(DEEP.encode()).decode()}
    envelope["signatures"] = [{"keyid": "k", "sig": base64.b64encode(b"x" * 64).decode()}]
    bundles.write_json(copy / signing.SIGNATURE_FILE, envelope)
    _fails_verify(_cli("verify", copy, "--key", keys["team.pub"]), "payload", "nested deeper than")


def test_json_over_the_size_bound_is_refused_unread(copy, monkeypatch):
    monkeypatch.setattr(files, "MAX_JSON_BYTES", 1000)  # the bound, not gigabytes, is what is tested
    _fails_verify(_cli("verify", copy), bundles.SUMMARY_FILE, "larger than 1000 bytes")


def test_ls_lists_a_deeply_nested_summary_as_corrupt(copy):
    (copy / bundles.SUMMARY_FILE).write_text(DEEP)
    (copy / bundles.RUN_FILE).write_text(DEEP)
    result = _cli("ls", "--output", copy.parent)
    _no_traceback(result)
    assert result.exit_code == 0 and result.output.split() == ["CORRUPT", "sealed", str(copy)], result.output


@pytest.mark.parametrize("name", [bundles.RUN_FILE, bundles.SESSIONS_FILE, bundles.CHUNKS_FILE])
def test_resume_refuses_deeply_nested_json_in_one_line(tmp_path, name):
    bundle = killed_bundle(tmp_path)
    (bundle / name).write_text(DEEP)
    result = CliRunner().invoke(main, ["run", "--resume", str(bundle), "--quiet"])
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert name in line and "nested deeper than" in line, line


# ---------------------------------------------------------------- signatures


def test_a_removed_signature_fails_verify_when_a_session_signed(copy, keys):
    assert bundles.read_sessions(copy)[0]["command"].count("--sign") == 1
    (copy / signing.SIGNATURE_FILE).unlink()
    for args in ((), ("--key", keys["team.pub"])):
        result = _cli("verify", copy, *args)
        line = _fails_verify(result, signing.SIGNATURE_FILE, "is missing", "records a signing session (--sign")
        assert signing.UNSIGNED_LINE not in result.output and signing.MISSING_LINE in result.output, line


def test_an_envelope_keyid_of_another_key_is_refused_naming_both(copy, keys):
    team = signing.key_id(signing.load_public_key(keys["team.pub"]))
    other = signing.key_id(signing.load_public_key(keys["other.pub"]))
    envelope = bundles.read_json(copy / signing.SIGNATURE_FILE)
    envelope["signatures"][0]["keyid"] = other  # the signature itself still verifies
    bundles.write_json(copy / signing.SIGNATURE_FILE, envelope)
    for args in ((), ("--key", keys["team.pub"])):
        _fails_verify(_cli("verify", copy, *args), f"the envelope's keyid {other} is not the id {team}")


# ---------------------------------------------------------------- report, format


def test_report_on_a_read_only_bundle_exits_5(copy, monkeypatch):
    replace = os.replace

    def read_only(src, dst, *args, **kwargs):  # root writes through a mode of 0555: refuse as the file system would
        if Path(dst).parent == copy:
            raise OSError(errno.EROFS, "Read-only file system", str(dst))
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", read_only)
    result = _cli("report", copy)
    _no_traceback(result)
    assert result.exit_code == 5, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: environment: EROFS (Read-only file system): ") and str(copy) in line, line


def test_a_lowered_bundle_format_is_refused(unsigned):
    run = bundles.read_json(unsigned / bundles.RUN_FILE)
    run["bundle_format"] = 3
    bundles.write_json(unsigned / bundles.RUN_FILE, run)
    bundles.write_sums(unsigned)  # a consistent re-seal: only the layout tells
    result = _cli("verify", unsigned)
    _fails_verify(result, "run.json: bundle format 3, but chunks.json is a chain of records (format 4)")
    _fails_verify(result, "run.json: bundle format 3, but manifest.json records chunk_heads (format 4)")


def test_kept_bundles_of_formats_2_and_3_bear_out_their_format():
    kept = [p.parent for p in sorted(Path("reports").glob("*/run.json"))]
    old = [p for p in kept if json.loads((p / bundles.RUN_FILE).read_text()).get("bundle_format") in (2, 3)]
    if not old:
        pytest.skip("no kept bundle of format 2 or 3")
    assert {str(p): check_format(p) for p in old} == {str(p): [] for p in old}


# ---------------------------------------------------------------- bounded samples, signature first


def _huge_chunk(bundle: Path) -> str:
    """Replace the first sample chunk by a parquet of one int8 column one row over the bundle's
    row bound (a run of zeros: a few KB on disk, 16 M rows declared); its name."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = samples.planned_seeds(bundle) * samples.MAX_ROWS_PER_SEED + 1
    name = samples.sample_files(bundle)[0]
    (bundle / name).unlink()
    pq.write_table(pa.table({"seed": np.zeros(rows, dtype=np.int8)}), bundle / name)
    return name


def _no_decode(monkeypatch) -> None:
    """Any decode of sample data fails the test: the bound must refuse from the footers."""
    import pandas as pd
    import pyarrow.parquet as pq

    def refuse(*args, **kwargs):
        raise AssertionError("a sample chunk was decoded")

    monkeypatch.setattr(pq, "read_table", refuse)
    monkeypatch.setattr(pd, "read_parquet", refuse)


def test_a_chunk_over_the_row_bound_fails_verify_from_its_footer(unsigned, monkeypatch):
    name = _huge_chunk(unsigned)
    _no_decode(monkeypatch)
    line = _fails_verify(_cli("verify", unsigned), name, "rows", "over the bound of", "nothing was decoded")
    assert f"{samples.planned_seeds(unsigned)} planned seeds x {samples.MAX_ROWS_PER_SEED}" in line, line


def test_a_chunk_that_is_not_parquet_fails_verify_in_one_line(unsigned):
    name = samples.sample_files(unsigned)[0]
    (unsigned / name).write_bytes(b"PAR1 not a parquet file")
    _fails_verify(_cli("verify", unsigned), name, "not a readable parquet file")


def test_verify_key_checks_the_signature_before_reading_any_sample(copy, keys, monkeypatch):
    name = _huge_chunk(copy)
    _no_decode(monkeypatch)
    monkeypatch.setattr(samples, "chunk_size", lambda file: pytest.fail("a footer was read before the signature"))
    result = _cli("verify", copy, "--key", keys["team.pub"])
    _fails_verify(result, f"{name}: changed after signing")
    assert "nothing else was read" in result.output.splitlines()[-1], result.output


def test_the_api_verify_with_a_key_checks_the_signature_before_reading_any_sample(copy, keys, monkeypatch):
    """`specval.verify(bundle, key=...)` (the Python API) refuses as the CLI does: the signature
    first, no footer or sample read, the signature's difference alone."""
    from specval import api

    name = _huge_chunk(copy)
    _no_decode(monkeypatch)
    monkeypatch.setattr(samples, "chunk_size", lambda file: pytest.fail("a footer was read before the signature"))
    found = api.verify(copy, key=keys["team.pub"])
    assert not found.ok and any(f"{name}: changed after signing" in d for d in found.differences), found


def test_resume_refuses_samples_over_a_bound_in_one_line(tmp_path, monkeypatch):
    bundle = killed_bundle(tmp_path)
    monkeypatch.setattr(samples, "MAX_ROWS_PER_SEED", 0)  # every written chunk is now over the bound
    result = CliRunner().invoke(main, ["run", "--resume", str(bundle), "--quiet"])
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "refusing to resume" in line and "over the bound of 0" in line, line


def test_report_refuses_samples_over_a_bound_in_one_line(unsigned, monkeypatch):
    monkeypatch.setattr(samples, "MAX_SAMPLE_CELLS", 1)
    result = _cli("report", unsigned)
    _no_traceback(result)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert "refusing to render" in line and "cells (rows x columns), over the bound of 1" in line, line


# ---------------------------------------------------------------- pinned profile


def test_verify_profile_pins_the_profile_the_bundle_ran(unsigned):
    result = _cli("verify", unsigned, "--profile", "ci")
    assert result.exit_code == 0 and "ran the pinned profile 'ci'" in result.output, result.output
    result = _cli("verify", unsigned, "--profile", "full")
    _no_traceback(result)
    assert result.exit_code == 1, result.output
    assert result.output.splitlines()[-1].endswith("run.json: ran profile 'ci', not the pinned 'full'"), result.output


# ---------------------------------------------------------------- bounded time and memory

MEMORY_BOUND = 1 << 30  # bytes of resident memory a command may reach on a hostile bundle (issue 57)
CPU_BOUND_S = 10.0  # CPU seconds (user + system) it may spend: CPU, not wall, so a loaded machine passes


# A fork keeps the parent's peak: Linux carries a process's maxrss across exec, so a child forked
# from a pytest worker of several GB would report that worker's size. The command therefore runs as
# the grandchild of a small Python started fresh, which reports the grandchild's own rusage last.
PROBE = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-m", "specval", *sys.argv[1:]])
_, status, usage = os.wait4(child.pid, 0)
sys.stdout.flush()
print("rusage", usage.ru_maxrss, usage.ru_utime + usage.ru_stime, flush=True)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def _bounded(*args: object) -> tuple[int, str]:
    """`python -m specval ARGS` in a child process: (exit status, output), after checking that the
    command never held more than MEMORY_BOUND resident and spent at most CPU_BOUND_S of CPU (its own
    rusage, taken by PROBE: the interpreter's start-up and imports included, a few seconds)."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        text=True,
    )
    *lines, last = done.stdout.rstrip("\n").split("\n")
    word, maxrss_kib, cpu_s = last.split()
    output = "\n".join(lines) + "\n"
    assert word == "rusage" and "Traceback" not in output, done.stdout
    assert int(maxrss_kib) * 1024 < MEMORY_BOUND, f"{maxrss_kib} KiB resident: {args}"
    assert float(cpu_s) < CPU_BOUND_S, f"{float(cpu_s):.1f} s CPU: {args}"
    return done.returncode, output


def test_hostile_bundles_are_refused_within_the_time_and_memory_bounds(copy, unsigned, keys, tmp_path):
    """The attacks of this module that could cost memory or time without bounds, each through the
    real command line in a child process: a 16 M-row chunk (verify, verify --key, report), JSON
    nested 200,000 deep (verify, ls, --resume). Each ends with its documented exit code, no traceback,
    under 1 GiB resident and 10 CPU seconds (the bounds of issue 57)."""
    huge = _huge_chunk(copy)
    code, output = _bounded("verify", copy)
    assert code == 1 and huge in output and "over the bound of" in output, output
    code, output = _bounded("verify", copy, "--key", keys["team.pub"])
    assert code == 1 and f"{huge}: changed after signing" in output, output
    code, output = _bounded("report", copy)
    assert code == 2 and len(output.strip().splitlines()) == 1 and huge in output, output
    (unsigned / bundles.SUMMARY_FILE).write_text(DEEP)
    code, output = _bounded("ls", "--output", unsigned.parent)
    assert code == 0 and ["CORRUPT", "sealed", str(unsigned)] in [line.split() for line in output.splitlines()], output
    bundles.write_sums(unsigned)
    code, output = _bounded("verify", unsigned)
    assert code == 1 and "nested deeper than" in output, output
    (tmp_path / "killed").mkdir()
    killed = killed_bundle(tmp_path / "killed")
    (killed / bundles.RUN_FILE).write_text(DEEP)
    code, output = _bounded("run", "--resume", killed, "--quiet")
    assert code == 2 and len(output.strip().splitlines()) == 1 and "nested deeper than" in output, output
