"""The system under test's identity (specval/identity.py): the digest covers exactly the files the
module docstring names, the default names the adapter's top-level package with its git state, the
bundled engine adapter names the `engine` package, and an adapter's faulty identity() is recorded,
never raised. Deterministic (no sampling)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from specval import lifecycle
from specval.identity import (
    IdentityError,
    SutIdentity,
    brief_record,
    describe_record,
    harness_identity,
    identity_of,
    package_identity,
    pinned_digest_problem,
    same_code,
    tree_digest,
    unrecorded,
)
from specval.sut import SUT

ENGINE = Path(__file__).resolve().parents[2] / "engine"
GIT_ENV = {  # a commit needs an author; nothing of the user's configuration is read
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.org",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.org",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def _package(root: Path, name: str = "toyengine") -> Path:
    """A package of two modules and a compiled file under __pycache__ (which the digest skips)."""
    package = root / name
    (package / "__pycache__").mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "1.2"\n')
    (package / "core.py").write_text("SCALE = 1.0\n")
    (package / "__pycache__" / "core.cpython-310.pyc").write_bytes(b"\0compiled")
    return package


def _documented_digest(parent: Path, names: list[str]) -> str:
    """The digest as the module docstring defines it, computed independently."""
    lines = "".join(f"{hashlib.sha256((parent / n).read_bytes()).hexdigest()}  {n}\n" for n in sorted(names))
    return hashlib.sha256(lines.encode()).hexdigest()


def test_the_digest_is_the_documented_listing_without_pycache(tmp_path):
    package = _package(tmp_path)
    digest, count = tree_digest(package)
    assert count == 2
    assert digest == _documented_digest(tmp_path, ["toyengine/__init__.py", "toyengine/core.py"])
    (package / "__pycache__" / "other.pyc").write_bytes(b"more bytecode")
    assert tree_digest(package) == (digest, 2)


@pytest.mark.parametrize("change", ["edit", "add", "remove", "rename"])
def test_any_change_to_the_packages_files_changes_the_digest(tmp_path, change):
    package = _package(tmp_path)
    before, _ = tree_digest(package)
    core = package / "core.py"
    if change == "edit":
        core.write_text("SCALE = 1.0  # one line edited\n")
    elif change == "add":
        (package / "sub").mkdir()
        (package / "sub" / "extra.py").write_text("")
    elif change == "remove":
        core.unlink()
    else:
        core.rename(package / "kernel.py")
    assert tree_digest(package)[0] != before


def test_a_missing_package_is_an_identity_error(tmp_path):
    with pytest.raises(IdentityError, match="no such package"):
        tree_digest(tmp_path / "absent")
    with pytest.raises(IdentityError, match="'no_such_package_here'"):
        package_identity("no_such_package_here")


def _adapter_in(package: str) -> type:
    """A SUT subclass that says it is defined in `package.adapter` (the default reads only that)."""
    return type("ToySUT", (SUT,), {"__module__": f"{package}.adapter"})


def test_the_default_identity_is_the_adapters_top_level_package(tmp_path, monkeypatch):
    _package(tmp_path, "toyengine_default")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = _adapter_in("toyengine_default").identity()
    assert found.name == "toyengine_default" and found.version is None  # not installed, not imported
    assert found.digest == tree_digest(tmp_path / "toyengine_default")[0]
    assert (found.commit, found.dirty) == (None, None)  # tmp_path is no git checkout
    assert found.covers == "package toyengine_default: 2 file(s)"


def _git(cwd: Path, *args: str) -> str:
    env = {**os.environ, **GIT_ENV}
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_a_package_in_a_git_checkout_names_its_commit_and_whether_it_changed(tmp_path, monkeypatch):
    repo = tmp_path / "repo"
    package = _package(repo, "toyengine_git")
    (repo / ".gitignore").write_text("__pycache__/\n")
    (repo / "README").write_text("outside the package\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "toy")
    (repo / "README").write_text("edited: a change of the checkout, not of the package\n")
    monkeypatch.syspath_prepend(str(repo))
    clean = package_identity("toyengine_git")
    assert clean.commit == _git(repo, "rev-parse", "HEAD").strip() and clean.dirty is False
    (package / "core.py").write_text("SCALE = 2.0\n")
    edited = package_identity("toyengine_git")
    assert edited.dirty is True and edited.commit == clean.commit and edited.digest != clean.digest


def test_the_engine_adapters_identity_covers_the_engine_package(tmp_path):
    """Every module of engine/ is under the digest: the engine adapter's identity is the tree digest
    of the engine package, and a copy of that package with one line of one module edited has another
    digest (the real tree is shared, so the edit is made to a copy)."""
    pytest.importorskip("torch")
    from specval.adapters.engine import EngineSUT

    found = EngineSUT.identity()
    assert found.name == "engine" and found.covers.startswith("package engine: ")
    assert found.digest == tree_digest(ENGINE)[0]
    copy = tmp_path / "engine"
    shutil.copytree(ENGINE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert tree_digest(copy)[0] == found.digest
    for module in (copy / "sampling" / "accept.py", copy / "api.py"):
        original = module.read_text()
        module.write_text(original + "# one line\n")
        assert tree_digest(copy)[0] != found.digest, module
        module.write_text(original)


class _Raises(SUT):
    @classmethod
    def identity(cls) -> SutIdentity:
        raise RuntimeError("no version file")


class _WrongType(SUT):
    @classmethod
    def identity(cls):  # type: ignore[override]  # the fault under test
        return {"digest": "0" * 64}


def test_an_adapters_faulty_identity_is_recorded_not_raised():
    assert identity_of(_Raises) == {"unrecorded": "_Raises.identity() raised RuntimeError: no version file"}
    assert identity_of(_WrongType) == {"unrecorded": "_WrongType.identity() returned dict, not a SutIdentity"}
    assert lifecycle.sut_identity("no_such_module_here:SUT")["unrecorded"].startswith(
        "adapter 'no_such_module_here:SUT' cannot be loaded"
    )


def test_an_identity_must_carry_a_whole_sha256():
    with pytest.raises(IdentityError, match="SutIdentity.digest"):
        SutIdentity("toy", "1", "abc")
    with pytest.raises(IdentityError, match="SutIdentity.name"):
        SutIdentity("", "1", "0" * 64)
    record = SutIdentity("toy", "1", "0" * 64, "c0ffee", False, "package toy: 1 file(s)").to_dict()
    assert SutIdentity.from_dict(record).to_dict() == record


def test_a_pinned_digest_is_checked_against_the_record():
    record = SutIdentity("toy", "1", "a" * 64, covers="package toy: 1 file(s)").to_dict()
    assert pinned_digest_problem({"sut_identity": record}, "a" * 64) is None
    assert pinned_digest_problem({"sut_identity": record}, "b" * 64) == (
        f"system under test digest {'a' * 64}, expected {'b' * 64}"
    )
    assert "made before specval recorded one" in pinned_digest_problem({}, "a" * 64)
    assert "the protocol names no adapter" in pinned_digest_problem({"sut_identity": None}, "a" * 64)
    assert "no version file" in pinned_digest_problem({"sut_identity": {"unrecorded": "no version file"}}, "a" * 64)
    assert describe_record(record) == f"toy 1, sha256 {'a' * 64} (package toy: 1 file(s)), not in a git checkout"


def test_a_module_adapter_is_covered_by_its_one_file(tmp_path, monkeypatch):
    (tmp_path / "toy_single_module.py").write_text("X = 1\n")
    (tmp_path / "neighbour.py").write_text("Y = 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = _adapter_in("toy_single_module").identity()
    assert found.covers == "module toy_single_module: 1 file(s)"
    assert found.digest == _documented_digest(tmp_path, ["toy_single_module.py"])


def test_the_harness_identity_is_the_digest_of_specvals_own_files():
    import specval

    mine = harness_identity()
    assert (mine.name, mine.version) == ("specval", specval.__version__)
    assert mine.digest == tree_digest(Path(specval.__file__).parent)[0] and mine.commit is None


def test_same_code_compares_name_version_and_digest_only():
    record = SutIdentity("toy", "1.0", "a" * 64, commit="c1", dirty=False, covers="package toy: 2 file(s)").to_dict()
    elsewhere = {**record, "commit": None, "dirty": None, "covers": "package toy: 2 file(s) (a copy)"}
    assert same_code(elsewhere, record)  # where the files sit does not matter, only what they are
    for key, value in (("name", "toy2"), ("version", "1.1"), ("digest", "b" * 64)):
        assert not same_code({**record, key: value}, record), key
    assert not same_code(unrecorded("identity() raised"), record)
    assert same_code(unrecorded("one reason"), unrecorded("another"))  # nothing to tell them apart


def test_a_brief_record_shows_the_name_version_and_the_digests_head():
    assert brief_record(SutIdentity("toy", "1.0", "ab" * 32).to_dict()) == "toy 1.0 (digest abababababab)"
    assert brief_record(SutIdentity("toy", None, "ab" * 32).to_dict()) == "toy (digest abababababab)"
    assert brief_record(unrecorded("no adapter")) == "not recorded (no adapter)"
