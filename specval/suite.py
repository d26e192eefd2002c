"""Suite: one pre-registered list of protocols run as one command, with one verdict and exit code.

A suite file (top-level `kind: suite`) names member protocol files (paths relative to the suite
file) of any runnable kind; `specval run SUITE.yaml --profile P` runs every member with profile P,
each into its own bundle under the output root (sharing its seed ledger, so every member's seeds
are disjoint from every other run's), and writes the suite record `<output>/<suite>-<time>/suite.json`:
each member's file, protocol hash, bundle, verdict and exit status, the suite's verdict and exit.

Guarantees:
- Before any member runs, every member file parses, is frozen as written (unless the run is
  exploratory) and has profile P: otherwise exit 2 and nothing is claimed. The suite file itself
  is frozen in the lock beside it like any protocol; its hash covers the member list.
- The suite exits with the most severe member status: 1 (a member FAILed: a proven deviation stands
  whatever the others did), then 3 (an adapter raised), 5 (environment), 4 (INCONCLUSIVE), 0 only when
  every member PASSed. An interrupt (130) stops the suite at once; the running member's bundle is
  kept for `--resume` as usual.
- `specval verify SUITE_DIR` verifies every member bundle and checks that each still holds the
  verdict and protocol hash the record names, and the digest of its SHA256SUMS.
- `junit_report` gives one <testsuite> per member run, in order: its criteria as a single run's
  JUnit file has them, or, for a member that ended without a verdict, one <error> naming its exit
  status, so no member that ran is missing from a CI report or shown as passed.
"""

from __future__ import annotations

import datetime as dt
import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from specval import bundle as bundles
from specval.protocol.canonical import canonical_hash
from specval.protocol.readers import check_keys, fail, read_mapping, read_name, read_str
from specval.protocol.strict_yaml import read_yaml
from specval.report import junit as junits

SUITE_KIND = "suite"
SUITE_FILE = "suite.json"
MAX_MEMBERS = 64
EXIT_PASS, EXIT_FAIL, EXIT_SUT, EXIT_INCONCLUSIVE, EXIT_ENVIRONMENT = 0, 1, 3, 4, 5
SEVERITY = (EXIT_FAIL, EXIT_SUT, EXIT_ENVIRONMENT, EXIT_INCONCLUSIVE, EXIT_PASS)  # most severe first
VERDICTS = {
    EXIT_PASS: "PASS",
    EXIT_FAIL: "FAIL",
    EXIT_INCONCLUSIVE: "INCONCLUSIVE",
    EXIT_SUT: "ERROR",
    EXIT_ENVIRONMENT: "ERROR",
}


@dataclass(frozen=True)
class SuiteProtocol:
    """A parsed suite file: its members as written (paths relative to the suite file)."""

    kind: str
    name: str
    members: tuple[str, ...]
    description: str = ""
    profile: str | None = field(default=None, compare=False)
    file_hash: str | None = field(default=None, compare=False, repr=False)

    @property
    def profiles(self) -> tuple:
        """None of its own: `--profile` is applied to every member (each must have it)."""
        return ()

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "name": self.name, "description": self.description, "members": list(self.members)}

    @property
    def hash(self) -> str:
        return self.file_hash or canonical_hash(self.to_dict())

    def member_paths(self, suite_file: Path) -> list[Path]:
        return [Path(suite_file).parent / member for member in self.members]


def parse_suite(raw: Any, file: str = "<suite>") -> SuiteProtocol:
    """Parse a YAML mapping with `kind: suite`; ProtocolError naming the file, key and value."""
    raw = read_mapping(raw, file, "")
    check_keys(raw, SuiteProtocol, file, "")
    if raw.get("kind") != SUITE_KIND:
        fail(file, "kind", f"expected {SUITE_KIND!r}", raw.get("kind"))
    members = raw["members"]
    if not isinstance(members, list) or not 1 <= len(members) <= MAX_MEMBERS:
        fail(file, "members", f"expected a list of 1..{MAX_MEMBERS} protocol files", members)
    listed = tuple(read_str(m, file, f"members[{i}]") for i, m in enumerate(members))
    for i, member in enumerate(listed):
        if listed.index(member) != i:
            fail(file, f"members[{i}]", "listed twice", member)
    return SuiteProtocol(
        kind=SUITE_KIND,
        name=read_name(raw["name"], file, "name"),
        description=str(raw.get("description", "")),
        members=listed,
    )


def load_suite(path: str | Path) -> SuiteProtocol:
    return parse_suite(read_yaml(path), str(path))


def resolve(suite: SuiteProtocol, profile: str | None) -> SuiteProtocol:
    """A suite has no sizes of its own: the profile is applied to each member when it runs."""
    return suite


# ---------------------------------------------------------------- the record


@dataclass(frozen=True)
class MemberResult:
    """One member's run: its exit status and bundle (None: none was announced)."""

    file: str
    protocol: str
    protocol_hash: str
    exit: int
    bundle: Path | None

    @property
    def verdict(self) -> str:
        return VERDICTS.get(self.exit, "ERROR")


def suite_exit(results: list[MemberResult]) -> int:
    """The most severe member status (SEVERITY order); 2 for statuses outside it (a member refused)."""
    codes = {r.exit for r in results}
    unknown = codes - set(SEVERITY)
    if unknown:
        return 2
    return next((code for code in SEVERITY if code in codes), EXIT_PASS)


def _digest(path: Path) -> str | None:
    sums = path / bundles.SUMS_FILE
    return hashlib.sha256(sums.read_bytes()).hexdigest() if sums.is_file() else None


def record(
    directory: Path,
    suite: SuiteProtocol,
    suite_file: Path,
    profile: str | None,
    registration: str,
    results: list[MemberResult],
    started: str,
) -> dict:
    """Write `directory/suite.json` (member bundles relative to the directory) and return it."""
    members = [
        {
            "file": r.file,
            "protocol": r.protocol,
            "protocol_hash": r.protocol_hash,
            "exit": r.exit,
            "verdict": r.verdict,
            "bundle": None if r.bundle is None else _relative(r.bundle, directory),
            "sums_sha256": None if r.bundle is None else _digest(r.bundle),
        }
        for r in results
    ]
    code = suite_exit(results)
    data = {
        "kind": SUITE_KIND,
        "suite": suite.name,
        "suite_hash": suite.hash,
        "suite_file": str(suite_file),
        "profile": profile,
        "registration": registration,
        "started": started,
        "finished": dt.datetime.now(dt.timezone.utc).isoformat(),
        "members": members,
        "verdict": VERDICTS.get(code, "ERROR"),
        "exit": code,
    }
    bundles.write_json(directory / SUITE_FILE, data)
    return data


def junit_report(suite: SuiteProtocol, results: list[MemberResult]) -> ET.Element:
    """<testsuites name="specval.SUITE"> with one <testsuite> per member run (see the module's
    guarantees); each carries the member's file and exit status as <properties>."""
    return junits.grouped_element(f"specval.{suite.name}", [_member_element(r) for r in results])


def _member_element(result: MemberResult) -> ET.Element:
    facts = [("member_file", result.file), ("exit", result.exit)]
    summary, why = _member_summary(result.bundle)
    if summary is not None:
        return junits.run_element(summary, result.bundle, facts)
    return junits.no_verdict_element(result.protocol, result.exit, why, [("member_file", result.file)])


def _member_summary(bundle: Path | None) -> tuple[dict | None, str]:
    """The member bundle's summary, or None and why there is none."""
    if bundle is None:
        return None, "no bundle was made (see the suite's output)"
    try:
        return bundles.read_json(bundle / bundles.SUMMARY_FILE), ""
    except bundles.BundleError:
        return None, f"the bundle {bundle} holds no verdict (see its log; it may resume)"


def _relative(path: Path, directory: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(directory.resolve().parent).as_posix())
    except ValueError:
        return str(Path(path).resolve())


def new_directory(output: Path, name: str) -> Path:
    """`<output>/<name>-suite-<UTC time>` (a second later if taken), created."""
    stamp = dt.datetime.now(dt.timezone.utc)
    while True:
        path = Path(output) / f"{name}-suite-{stamp.strftime('%Y%m%dT%H%M%SZ')}"
        try:
            path.mkdir(parents=True)
            return path
        except FileExistsError:
            stamp += dt.timedelta(seconds=1)


def is_suite_directory(path: Path) -> bool:
    return (Path(path) / SUITE_FILE).is_file() and not (Path(path) / bundles.RUN_FILE).exists()


def verify(directory: Path, verify_bundle: Callable[[Path], list[str]]) -> list[str]:
    """Every difference between the suite record and its member bundles (`verify_bundle` verifies
    one bundle of any kind and returns its differences)."""
    try:
        data = bundles.read_json(directory / SUITE_FILE)
        members = data["members"]
    except (bundles.BundleError, KeyError, TypeError) as err:
        return [f"{SUITE_FILE}: unreadable ({err})"]
    problems = []
    for member in members:
        if member.get("bundle") is None:
            if member.get("exit") == EXIT_PASS:
                problems.append(f"{member.get('file')}: recorded PASS without a bundle")
            continue
        path = directory.parent / member["bundle"]
        if not (path / bundles.RUN_FILE).is_file():
            problems.append(f"{member['file']}: bundle {member['bundle']} is missing")
            continue
        problems += [f"{member['bundle']}: {p}" for p in verify_bundle(path)]
        problems += _member_differences(member, path)
    expected = suite_exit([MemberResult(m.get("file"), "", "", m.get("exit"), None) for m in members])
    if data.get("exit") != expected:
        problems.append(f"{SUITE_FILE}: exit {data.get('exit')} but its members give {expected}")
    return problems


def _member_differences(member: dict, path: Path) -> list[str]:
    """The record of one member against its bundle: protocol hash, sealed verdict, SHA256SUMS digest."""
    out = []
    plan = bundles.read_json(path / bundles.RUN_FILE)
    if plan.get("protocol_hash") != member.get("protocol_hash"):
        out.append(
            f"{member['bundle']}: ran protocol {str(plan.get('protocol_hash'))[:12]}, the suite records "
            f"{str(member.get('protocol_hash'))[:12]}"
        )
    summary = path / bundles.SUMMARY_FILE
    verdict = bundles.read_json(summary).get("verdict") if summary.is_file() else None
    if member.get("exit") in (EXIT_PASS, EXIT_FAIL, EXIT_INCONCLUSIVE) and verdict != member.get("verdict"):
        out.append(f"{member['bundle']}: verdict {verdict}, the suite records {member.get('verdict')}")
    if member.get("sums_sha256") != _digest(path):
        out.append(f"{member['bundle']}: {bundles.SUMS_FILE} changed since the suite recorded it")
    return out
