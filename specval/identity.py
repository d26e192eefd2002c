"""The identity of a system under test: which engine code a bundle's evidence is about.

`SutIdentity` names the code behind an adapter: a name, a version, a SHA-256 digest of its source
files and, where they sit in a git checkout, the commit and dirty flag. `SUT.identity()` returns
one; its default is `package_identity` of the adapter's top-level package (`top_package`), and an
adapter whose engine lives elsewhere (the bundled `engine` adapter: the `engine` package) names
that package instead. manifest.json records it as `sut_identity` (`identity_record`), so the seal
and the signature cover it, the report shows it and `specval verify --sut-digest` pins it.

What the digest covers (`tree_digest`): every file under the package's directory (a module that is
no package: its one file), found by walking the directory without entering directories reached
through a link (a link to a file counts with its target's bytes), `__pycache__` directories left
out. Each file is named by its path relative to the package's parent directory, with `/` between
parts (`engine/api.py`); the digest is the SHA-256 of the text `<sha256 of the file>  <path>\\n`,
one line per file in path order, which is what

    cd <parent> && find <package> -type f -not -path '*/__pycache__/*' | LC_ALL=C sort | xargs sha256sum | sha256sum

prints for a tree without links or spaces in its names. The digest is always over the files as they
are on disk when the manifest is written, installed or not: an installed distribution's RECORD
hashes are not used, since a file edited after installation would not change them. The version
and name come from the installed distribution that provides the package (`importlib.metadata`),
else the name is the package's and the version its `__version__` (None when it has none).

Guarantee: two bundles with the same digest ran adapters whose package held byte-identical files;
editing, adding, removing or renaming any file of the package changes the digest. It does not cover
the package's dependencies (the manifest's `packages` names some), model weights outside the
package, or code an adapter loads from elsewhere at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from specval.bundle.facts import git_state
from specval.version import __version__

DIGEST_PATTERN = re.compile(r"^[0-9a-f]{64}$")  # a SHA-256 in lowercase hex
SKIPPED_DIRECTORY = "__pycache__"  # compiled bytecode: what the interpreter wrote, not the source
IDENTITY_KEY = "sut_identity"  # manifest.json's key
UNRECORDED_KEY = "unrecorded"  # the record's key when no identity could be taken: the reason
HARNESS_PACKAGE = "specval"  # this package: `harness_identity` names its own code
COMPARED_KEYS = ("name", "version", "digest")  # what `same_code` compares (not where the files sit)
SHORT_DIGEST = 12  # hex digits of a digest in `brief_record`'s line (48 bits: a chance match is negligible)


class IdentityError(ValueError):
    """A package whose files cannot be found, or an identity that is not well formed."""


@dataclass(frozen=True)
class SutIdentity:
    """The code behind an adapter. `digest`: SHA-256 (64 lowercase hex digits) of the files
    `covers` names; `commit` / `dirty`: the git checkout holding them (None: not in one)."""

    name: str
    version: str | None
    digest: str
    commit: str | None = None
    dirty: bool | None = None
    covers: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise IdentityError(f"SutIdentity.name: expected a non-empty string, got {self.name!r}")
        if not isinstance(self.digest, str) or not DIGEST_PATTERN.match(self.digest):
            raise IdentityError(f"SutIdentity.digest: expected 64 lowercase hex digits, got {self.digest!r}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> SutIdentity:
        keys = ("name", "version", "digest", "commit", "dirty")
        return cls(**{key: raw.get(key) for key in keys}, covers=raw.get("covers") or "")

    def describe(self) -> str:
        """One line: name, version, digest, what it covers, commit."""
        return describe_record(self.to_dict())


def walk_files(root: Path) -> Iterator[Path]:
    """Every file under the directory `root` (`tree_digest`'s selection), in no particular order."""
    for directory, subdirectories, names in os.walk(root):
        subdirectories[:] = [d for d in subdirectories if d != SKIPPED_DIRECTORY]
        for name in names:
            path = Path(directory) / name
            if path.is_file():
                yield path


def tree_digest(root: Path) -> tuple[str, int]:
    """(digest, number of files) of the package at `root`: a directory (a package) or one file
    (a module), as the module docstring defines it. IdentityError when `root` is neither."""
    root = Path(root)
    if root.is_file():
        files = [root]
    elif root.is_dir():
        files = list(walk_files(root))
    else:
        raise IdentityError(f"{root}: no such package directory or module file")
    named = sorted((path.relative_to(root.parent).as_posix(), path) for path in files)
    listing = "".join(f"{hashlib.sha256(path.read_bytes()).hexdigest()}  {name}\n" for name, path in named)
    return hashlib.sha256(listing.encode()).hexdigest(), len(named)


def top_package(module: str) -> str:
    """The top-level package of a dotted module name (`mypkg.adapters.sut` -> `mypkg`)."""
    return module.partition(".")[0]


def package_root(package: str) -> Path:
    """The directory of the top-level `package` (a module that is no package: its file), found
    without importing it. IdentityError naming the package when it cannot be found."""
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError) as err:
        raise IdentityError(f"package {package!r}: cannot be found ({err})") from err
    if spec is None:
        raise IdentityError(f"package {package!r}: cannot be found")
    if spec.origin and Path(spec.origin).is_file():
        origin = Path(spec.origin).resolve()
        return origin.parent if spec.submodule_search_locations is not None else origin
    locations = sorted(spec.submodule_search_locations or [])
    if len(locations) != 1:  # a namespace package split over several directories, or a built-in module
        raise IdentityError(f"package {package!r}: not one directory or file ({locations or spec.origin})")
    return Path(locations[0]).resolve()


def distribution_of(package: str) -> tuple[str, str] | None:
    """(name, version) of the installed distribution that provides the top-level `package`
    (the first by name when several do), else None."""
    names = sorted(set(metadata.packages_distributions().get(package, ())))
    for name in names:
        try:
            return name, metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def package_identity(package: str, name: str | None = None) -> SutIdentity:
    """The identity of the top-level `package`: the installed distribution's name and version
    (else the package's name and its `__version__`), `tree_digest` of its files, and the git
    state of the checkout holding them. `name` replaces the name (the version is kept)."""
    root = package_root(package)
    digest, count = tree_digest(root)
    installed = distribution_of(package)
    version = installed[1] if installed else getattr(sys.modules.get(package), "__version__", None)
    kind = "package" if root.is_dir() else "module"
    return SutIdentity(
        name=name or (installed[0] if installed else package),
        version=version if isinstance(version, str) else None,
        digest=digest,
        **git_state(root if root.is_dir() else root.parent, only_here=True),
        covers=f"{kind} {package}: {count} file(s)",
    )


def harness_identity() -> SutIdentity:
    """specval as this process imports it: name "specval", `specval.version.__version__` and
    `tree_digest` of the package's files; no git state (a copy of a checkout keeps stale git
    metadata; the digest alone says which files run). Two processes with the same digest import
    byte-identical specval source, wherever it sits (installed, a checkout, a copy on PYTHONPATH)."""
    digest, count = tree_digest(package_root(HARNESS_PACKAGE))
    return SutIdentity(HARNESS_PACKAGE, __version__, digest, covers=f"package {HARNESS_PACKAGE}: {count} file(s)")


def same_code(record: dict[str, Any], reference: dict[str, Any]) -> bool:
    """Whether two identity records (`SutIdentity.to_dict()`, `identity_of`) name the same code:
    equal name, version and digest (`COMPARED_KEYS`). Two unrecorded records (no digest) compare
    equal: there is nothing to tell them apart; an unrecorded one never equals a recorded one."""
    return all(record.get(key) == reference.get(key) for key in COMPARED_KEYS)


def brief_record(record: dict[str, Any]) -> str:
    """An identity record in a few words for a one-line error: `name version (digest <12 hex>)`,
    or `not recorded (reason)`."""
    if not isinstance(record.get("digest"), str):
        return f"not recorded ({record.get(UNRECORDED_KEY)})"
    version = f" {record['version']}" if record.get("version") else ""
    return f"{record.get('name')}{version} (digest {record['digest'][:SHORT_DIGEST]})"


def identity_of(adapter: type) -> dict[str, Any]:
    """manifest.json's `sut_identity` for the adapter class `adapter`: its `identity()` as a dict,
    or {"unrecorded": reason} when the adapter's identity() raises or answers something other than
    a SutIdentity (the run's verdict stands; the bundle then cannot be pinned by digest)."""
    try:
        found = adapter.identity()  # type: ignore[attr-defined]  # SUT.identity, or a duck-typed one
    except Exception as err:  # noqa: BLE001  # an adapter's fault is recorded, never raised after the verdict
        return unrecorded(f"{adapter.__name__}.identity() raised {type(err).__name__}: {err}")
    if not isinstance(found, SutIdentity):
        return unrecorded(f"{adapter.__name__}.identity() returned {type(found).__name__}, not a SutIdentity")
    return found.to_dict()


def unrecorded(reason: str) -> dict[str, Any]:
    """The `sut_identity` record of a run whose identity could not be taken, with the reason."""
    return {UNRECORDED_KEY: reason}


def recorded_digest(manifest: dict[str, Any]) -> tuple[str | None, str]:
    """(digest, why not) of a manifest's SUT identity: the digest and "" when it records one,
    else None and the reason, in words (a bundle made before identities, or an unrecorded one)."""
    if IDENTITY_KEY not in manifest:
        return None, "the bundle records no system-under-test identity (made before specval recorded one)"
    record = manifest[IDENTITY_KEY]
    if not isinstance(record, dict):
        return None, "the bundle records no system-under-test identity (the protocol names no adapter)"
    digest = record.get("digest")
    if not isinstance(digest, str):
        return None, f"the bundle's system-under-test identity was not recorded: {record.get(UNRECORDED_KEY)}"
    return digest, ""


def pinned_digest_problem(manifest: dict[str, Any], expected: str) -> str | None:
    """None when the manifest's SUT digest is `expected` (lowercase hex), else the problem in one
    line naming what was expected and what was found (or why nothing was)."""
    found, why = recorded_digest(manifest)
    if found is None:
        return f"cannot pin the system under test to {expected}: {why}"
    if found != expected:
        return f"system under test digest {found}, expected {expected}"
    return None


def describe_record(record: Any) -> str:
    """A manifest's `sut_identity` in one line, as the reports show it."""
    if not isinstance(record, dict):
        return "not recorded (the protocol names no adapter)"
    if "digest" not in record:
        return f"not recorded ({record.get(UNRECORDED_KEY)})"
    version = f" {record['version']}" if record.get("version") else ""
    git = (
        f", git {record['commit']} (dirty: {record.get('dirty')})"
        if record.get("commit")
        else ", not in a git checkout"
    )
    return f"{record.get('name')}{version}, sha256 {record['digest']} ({record.get('covers')}){git}"
