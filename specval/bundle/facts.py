"""The facts a bundle records of its making: the code, the packages, the device, the command.

What sessions.json and manifest.json say about where a run ran: specval's version with the git
state and the source digest of the code (`code_version`), the versions of the PACKAGES it depends
on, the device (`device_facts`), and the command line (`invocation`). It reads no bundle.

Guarantee: two sessions with the same `source_digest` ran the same harness and engine source and
the same bundled weights (see `source_digest` for what it does not cover).
"""

from __future__ import annotations

import hashlib
import importlib.util
import subprocess
import sys
from importlib import metadata
from pathlib import Path
from typing import Any

from specval.version import __version__

PACKAGES = (
    "specval",
    "torch",
    "triton",
    "numpy",
    "scipy",
    "pandas",
    "pyarrow",
    "statsmodels",
    "matplotlib",
    "click",
    "pyyaml",
    "tqdm",
    "cryptography",
)


def git_state(source: Path, only_here: bool = False) -> dict[str, Any]:
    """Commit and dirty flag of the git checkout whose tracked files include the directory
    `source`; both None when `source` is not tracked by a checkout (an installed package, or a
    package directory that some unrelated repository merely contains, e.g. a venv inside a repo).
    `dirty`: any tracked file of the checkout changed; with `only_here`, any file under `source`
    changed, added or not yet tracked (ignored files left out)."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=source, capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        return done.stdout.strip()

    if not git("ls-files", "--", "."):
        return {"commit": None, "dirty": None}
    commit = git("rev-parse", "HEAD")
    scope = ("--untracked-files=all", "--", ".") if only_here else ("--untracked-files=no",)
    status = git("status", "--porcelain", *scope)
    return {"commit": commit, "dirty": None if status is None else bool(status)}


SOURCE_PACKAGES = ("specval", "engine")  # the harness and the bundled system under test


def source_digest() -> str | None:
    """SHA-256 over every file of the installed `specval` and `engine` packages (each file's path
    relative to its package's parent, then its bytes, in path order; `__pycache__` left out).

    Guarantee: two sessions with the same digest ran the same harness and engine source and the
    same bundled weights, whatever the git metadata beside them says (a copied tree keeps stale
    git metadata; an installed package has none). It does not cover the dependencies (their
    versions are under `packages`) or an external adapter. None if a package cannot be found."""
    digest = hashlib.sha256()
    for name in SOURCE_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is None or spec.origin is None:
            return None
        root = Path(spec.origin).resolve().parent
        for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
            digest.update(path.relative_to(root.parent).as_posix().encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()


def code_version() -> dict[str, Any]:
    """The code that runs: specval's version, the commit and dirty flag of the checkout that
    holds the package's own source (not of the current directory), and `source_digest()`."""
    return {
        "version": __version__,
        **git_state(Path(__file__).resolve().parents[1]),  # the specval package directory
        "source_sha256": source_digest(),
    }


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


TORCH_ABSENT = "not installed"  # device facts' `torch` where it is absent (`pip install specval`)


def device_facts() -> dict[str, Any]:
    """CUDA device name, UUID and driver where CUDA is present; the CPU otherwise. CUDA is read
    through torch, which the harness does not need (`pip install specval` leaves it out): without
    torch the facts say so (`torch: "not installed"`) and `cuda` is None (not looked at)."""
    import platform

    cpu = platform.processor() or platform.machine()
    try:
        import torch  # the `engine` extra; a lazy import (tests/test_layering.py, TORCH_LAZY)
    except ImportError:
        return {"cpu": cpu, "cuda": None, "torch": TORCH_ABSENT}
    facts: dict[str, Any] = {"cpu": cpu, "cuda": torch.cuda.is_available()}
    if facts["cuda"]:
        props = torch.cuda.get_device_properties(0)
        facts.update(name=props.name, uuid=str(getattr(props, "uuid", "")), cuda_version=torch.version.cuda)
        try:
            facts["driver"] = (
                subprocess.run(
                    ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                    capture_output=True,
                    text=True,
                    check=True,
                )
                .stdout.strip()
                .splitlines()[0]
            )
        except (OSError, subprocess.CalledProcessError, IndexError):
            facts["driver"] = None
    return facts


def invocation() -> list[str]:
    """The command line of this run with the program named `specval`: the manifest records what
    was asked, not where the program is installed."""
    return ["specval", *sys.argv[1:]]
