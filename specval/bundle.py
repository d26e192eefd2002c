"""Bundle: the evidence directory of one run, its manifest, its checksums and its verification.

Layout of `results/<protocol>-<UTC timestamp>/`:

    protocol.yaml      the protocol file exactly as run
    protocol.json      its parsed canonical form (the input of the protocol hash)
    run.json           the run plan: profile, seed ranges; written before sampling, used by --resume
                       (two-stage protocols: `stage2_ranges` is added when stage 2 is claimed)
    samples/*.parquet  raw samples, one file per seed chunk
    reference.json     exact reference distributions (sparse, float64 round-trip)
    stage2/            second stage of a two-stage protocol, only when stage 1 FAILed:
                       stage2/samples/*.parquet and stage2/reference.json
    quadrature.json    exact output laws of the accept kernel (when the protocol has a quadrature test)
    summary.json       every criterion's statistic, df, p, alpha, verdict, MDE; planned vs effective n
    report.md, report.html
    manifest.json      protocol hash, git commit and dirty flag, command, versions, device, seeds, times
    SHA256SUMS         sha256 of every other file

Guarantee of `verify`: it reports a difference if any byte of any file changed, if a file was
added or removed, or if any value of summary.json differs from a recomputation from the raw
samples, the stored reference and the stored quadrature laws.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Iterator

SUMS_FILE = "SHA256SUMS"
RUN_FILE = "run.json"
SUMMARY_FILE = "summary.json"
MANIFEST_FILE = "manifest.json"
REFERENCE_FILE = "reference.json"
QUADRATURE_FILE = "quadrature.json"
PROTOCOL_YAML = "protocol.yaml"
PROTOCOL_JSON = "protocol.json"
STAGE2_DIR = "stage2"
PACKAGES = ("specval", "torch", "triton", "numpy", "scipy", "pandas", "pyarrow", "statsmodels", "matplotlib",
            "click", "pyyaml", "tqdm")


class BundleError(ValueError):
    """A bundle is missing a file or holds one that cannot be read."""


@dataclass(frozen=True)
class RunPlan:
    """What run.json records before any sampling."""

    protocol: str
    protocol_hash: str
    profile: str | None
    ranges: tuple[tuple[str, int, int], ...]  # (group, start, stop)
    stage2_ranges: tuple[tuple[str, int, int], ...] = ()  # the same, of stage 2 (empty: not claimed)
    registration: str = "frozen"  # the protocol's state in frozen.lock when the run started
    exploratory: bool = False  # run with --exploratory: the verdict is marked EXPLORATORY

    def to_dict(self) -> dict:
        out = {"protocol": self.protocol, "protocol_hash": self.protocol_hash, "profile": self.profile,
               "ranges": _range_dicts(self.ranges), "registration": self.registration,
               "exploratory": self.exploratory}
        if self.stage2_ranges:
            out["stage2_ranges"] = _range_dicts(self.stage2_ranges)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> "RunPlan":
        return cls(data["protocol"], data["protocol_hash"], data["profile"], _range_tuples(data["ranges"]),
                   _range_tuples(data.get("stage2_ranges", [])), data.get("registration", "frozen"),
                   bool(data.get("exploratory", False)))

    def registration_block(self) -> dict:
        """The summary's `registration` entry: how the protocol stood against frozen.lock."""
        return {"state": self.registration, "exploratory": self.exploratory}


def _range_dicts(ranges: tuple[tuple[str, int, int], ...]) -> list[dict]:
    return [{"group": g, "start": a, "stop": b} for g, a, b in ranges]


def _range_tuples(entries: list[dict]) -> tuple[tuple[str, int, int], ...]:
    return tuple((r["group"], int(r["start"]), int(r["stop"])) for r in entries)


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename), sorted keys, strict (no NaN)."""
    text = json.dumps(obj, indent=1, sort_keys=True, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError as err:
        raise BundleError(f"{path}: missing") from err
    except json.JSONDecodeError as err:
        raise BundleError(f"{path}: not valid JSON ({err})") from err


# ---------------------------------------------------------------- checksums


def _files(bundle: Path) -> Iterator[str]:
    for path in sorted(bundle.rglob("*")):
        if path.is_file() and path.name != SUMS_FILE and not path.name.startswith("."):
            yield path.relative_to(bundle).as_posix()


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_sums(bundle: Path) -> None:
    lines = [f"{sha256_file(bundle / name)}  {name}\n" for name in _files(bundle)]
    (bundle / SUMS_FILE).write_text("".join(lines))


def check_sums(bundle: Path) -> list[str]:
    """Differences between SHA256SUMS and the files on disk (empty list: all match)."""
    path = bundle / SUMS_FILE
    if not path.exists():
        return [f"{SUMS_FILE} is missing"]
    listed = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        listed[name] = digest
    problems = []
    on_disk = set(_files(bundle))
    for name in sorted(set(listed) - on_disk):
        problems.append(f"{name}: listed in {SUMS_FILE} but missing")
    for name in sorted(on_disk - set(listed)):
        problems.append(f"{name}: present but not listed in {SUMS_FILE}")
    for name in sorted(on_disk & set(listed)):
        if sha256_file(bundle / name) != listed[name]:
            problems.append(f"{name}: sha256 differs from {SUMS_FILE}")
    return problems


# ---------------------------------------------------------------- manifest facts


def git_state(cwd: Path) -> dict[str, Any]:
    """Commit and dirty flag of the working tree that holds `cwd` (None outside git)."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return None
        return done.stdout.strip()

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": commit, "dirty": None if status is None else bool(status)}


def package_versions() -> dict[str, str | None]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def device_facts() -> dict[str, Any]:
    """CUDA device name, UUID and driver where CUDA is present; the CPU otherwise."""
    import platform

    import torch

    facts: dict[str, Any] = {"cpu": platform.processor() or platform.machine(), "cuda": torch.cuda.is_available()}
    if facts["cuda"]:
        props = torch.cuda.get_device_properties(0)
        facts.update(name=props.name, uuid=str(getattr(props, "uuid", "")), cuda_version=torch.version.cuda)
        try:
            facts["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, check=True).stdout.strip().splitlines()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            facts["driver"] = None
    return facts


def invocation() -> list[str]:
    """The command line of this run with the program named `specval`: the manifest records what
    was asked, not where the program is installed."""
    return ["specval", *sys.argv[1:]]


# ---------------------------------------------------------------- diff of recomputed values

FLOAT_RTOL = 1e-9  # relative agreement of a recomputed float (rounding of another machine)
FLOAT_ATOL = 1e-12  # absolute agreement near 0 (p-values far below any alpha)


def diff(stored: Any, recomputed: Any, path: str = "") -> list[str]:
    """Paths where two JSON values differ, with both values.

    Verdicts, reasons, counts and every other non-float are compared exactly. Two floats agree
    when they are within a relative FLOAT_RTOL (or FLOAT_ATOL near 0): a chi-square summed in
    another order (another numpy or BLAS build, another machine) moves the last bits, and a
    bundle made on a GPU machine must verify anywhere. A deliberate edit of a statistic is far
    outside that."""
    if isinstance(stored, dict) and isinstance(recomputed, dict):
        out = []
        for key in sorted(set(stored) | set(recomputed), key=str):
            sub = f"{path}.{key}" if path else str(key)
            if key not in stored or key not in recomputed:
                out.append(f"{sub}: {'missing in stored' if key not in stored else 'not recomputed'}")
            else:
                out.extend(diff(stored[key], recomputed[key], sub))
        return out
    if isinstance(stored, list) and isinstance(recomputed, list) and len(stored) == len(recomputed):
        return [d for i, (a, b) in enumerate(zip(stored, recomputed)) for d in diff(a, b, f"{path}[{i}]")]
    if isinstance(stored, float) and isinstance(recomputed, float):
        same = math.isclose(stored, recomputed, rel_tol=FLOAT_RTOL, abs_tol=FLOAT_ATOL) or (
            math.isnan(stored) and math.isnan(recomputed))
    else:
        same = stored == recomputed and type(stored) is type(recomputed)
    return [] if same else [f"{path}: stored {_short(stored)}, recomputed {_short(recomputed)}"]


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."
