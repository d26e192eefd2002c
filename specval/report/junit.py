"""JUnit XML of a summary: one test case per criterion, for CI systems (FAIL -> failure,
INCONCLUSIVE -> error, so that a CI report tells "wrong" from "could not test"); of a suite, one
<testsuite> per member inside one <testsuites>.

Guarantees: the file's folders are created when missing (`check_target` refuses, before any seed is
claimed, only a path that could not be written even so); the XML is written whole or not at all
(a temporary file beside it, renamed over it)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from xml.etree import ElementTree as ET

from specval.preflight import check_writable_dir
from specval.protocol import GATING_ROLES, ProtocolError

INCONCLUSIVE = "INCONCLUSIVE"  # a criterion's verdict when it could not test


def failing(summary: Mapping[str, Any]) -> set[str]:
    """Gating criteria that fail the run: after confirmation, only the stage-1 FAILs stage 2 confirmed."""
    if "confirmation" in summary:
        return set(summary["confirmation"]["failing"])
    return {n for n, t in summary["tests"].items() if t["verdict"] == "FAIL" and t["role"] in GATING_ROLES}


def reason(summary: Mapping[str, Any], name: str) -> str:
    """The criterion's reason, with its stage-2 reason appended when a second stage ran."""
    second = (summary.get("confirmation") or {}).get("stage2")
    first = summary["tests"][name]["reason"]
    return f"{first}; stage 2: {second['tests'][name]['reason']}" if second else first


CASE_PROPERTIES = (  # property name -> the criterion's summary keys, first present wins
    ("statistic", ("statistic",)),
    ("p_value", ("p_value",)),
    ("p_adjusted", ("p_adjusted",)),
    ("mde", ("mde_tv",)),
    ("mde_label", ("mde_label",)),
    ("sample_size", ("effective_n", "n")),
    ("planned_n", ("planned_n",)),
)


def _properties(parent: ET.Element, pairs: list[tuple[str, object]]) -> None:
    """<properties> with one <property name value> per pair whose value is not None."""
    kept = [(name, value) for name, value in pairs if value is not None]
    if kept:
        block = ET.SubElement(parent, "properties")
        for name, value in kept:
            ET.SubElement(block, "property", name=name, value=str(value))


def _case_properties(test: dict, bundle: Path | None) -> list[tuple[str, object]]:
    values = [(name, next((test[k] for k in keys if test.get(k) is not None), None)) for name, keys in CASE_PROPERTIES]
    return values + [("bundle", bundle)]


def _suite_properties(summary: dict, bundle: Path | None) -> list[tuple[str, object]]:
    proto, registration = summary["protocol"], summary.get("registration") or {}
    looked = summary.get("sequential") or {}
    return [
        ("protocol", proto["name"]),
        ("protocol_hash", proto.get("hash")),
        ("profile", proto.get("profile")),
        ("verdict", summary["verdict"]),
        ("exploratory", registration.get("exploratory")),
        ("stopped_at_look", looked.get("stopped_at_look")),
        ("looks", looked.get("num_looks")),
        ("samples_per_group", looked.get("samples_per_group_at_stop")),
        ("bundle", bundle),
    ]


def inconclusive(summary: dict) -> set[str]:
    """Gating criteria that could not decide: they keep the run from a PASS (exit 4)."""
    return {n for n, t in summary["tests"].items() if t["verdict"] == INCONCLUSIVE and t["role"] in GATING_ROLES}


def run_element(summary: dict, bundle: Path | None = None, extra: Iterable[tuple[str, object]] = ()) -> ET.Element:
    """The <testsuite> of one run (as `write_junit` describes), with `extra` <properties> appended."""
    tests, failed, errors = summary["tests"], failing(summary), inconclusive(summary)
    suite = ET.Element(
        "testsuite",
        name=f"specval.{summary['protocol']['name']}",
        tests=str(len(tests)),
        failures=str(len(failed)),
        errors=str(len(errors)),
        skipped=str(sum(t["verdict"] != "PASS" and n not in failed | errors for n, t in tests.items())),
    )
    _properties(suite, _suite_properties(summary, bundle) + list(extra))
    for name, test in sorted(tests.items()):
        case = ET.SubElement(suite, "testcase", classname=test["role"], name=name)
        _properties(case, _case_properties(test, bundle))
        if name in failed:
            ET.SubElement(case, "failure", message=reason(summary, name)).text = reason(summary, name)
        elif name in errors:
            message = f"{INCONCLUSIVE} ({test['role']}): {reason(summary, name)}"
            ET.SubElement(case, "error", message=message, type=INCONCLUSIVE).text = message
        elif test["verdict"] != "PASS":
            ET.SubElement(case, "skipped", message=f"{test['verdict']} ({test['role']}): {test['reason']}")
    return suite


NO_VERDICT_CASE = "verdict"  # the one test case of a suite member that ended without a verdict
NO_VERDICT_TYPE = "NO_VERDICT"


def no_verdict_element(protocol: str, exit_code: int, why: str, extra: Iterable[tuple[str, object]] = ()) -> ET.Element:
    """The <testsuite> of a suite member that ended without a verdict (the adapter raised, an
    environment error, an interrupt): one test case in <error type="NO_VERDICT"> saying `why`, so a
    CI report never shows such a member as passed or as missing."""
    suite = ET.Element("testsuite", name=f"specval.{protocol}", tests="1", failures="0", errors="1", skipped="0")
    _properties(suite, [("protocol", protocol), ("exit", exit_code), *extra])
    case = ET.SubElement(suite, "testcase", classname="run", name=NO_VERDICT_CASE)
    message = f"no verdict: exit {exit_code}; {why}"
    ET.SubElement(case, "error", message=message, type=NO_VERDICT_TYPE).text = message
    return suite


COUNTS = ("tests", "failures", "errors", "skipped")


def grouped_element(name: str, suites: list[ET.Element]) -> ET.Element:
    """One <testsuites> named `name` holding `suites`, with their counts summed."""
    root = ET.Element("testsuites", name=name)
    for count in COUNTS:
        root.set(count, str(sum(int(s.get(count, "0")) for s in suites)))
    root.extend(suites)
    return root


def write_junit(summary: dict, path: Path, bundle: Path | None = None) -> None:
    """Gating FAIL that fails the run -> <failure>; gating INCONCLUSIVE (the criterion could not
    test, so the run is not a PASS) -> <error type="INCONCLUSIVE"> with its reason; any other
    non-PASS (a secondary criterion, a stage-1 FAIL that stage 2 did not confirm) -> <skipped>, as it
    does not gate. The suite carries
    the protocol, its hash, profile, verdict, exploratory flag and `bundle` as <properties>; each case
    its statistic, p-value, Holm p, MDE (TV) and its label, sample size (samples tested), planned n and
    `bundle` (those the criterion has). A run with sequential looks adds to the suite the look it
    stopped at, the number of looks and the samples per group it had collected then."""
    write_xml(run_element(summary, bundle), path)


def write_xml(root: ET.Element, path: Path) -> None:
    """Write `root` to `path` as UTF-8 XML, creating its folders; a reader sees the old file or the
    whole new one (written beside it, then renamed), never a torn one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            ET.ElementTree(root).write(out, encoding="utf-8", xml_declaration=True)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def check_target(path: Path, what: str) -> None:
    """ProtocolError, naming `what` and the path, unless the JUnit file could be written there: not a
    directory, replaceable if it exists, and its folder writable or creatable (missing folders are
    created when the file is written). Nothing is created."""
    path = Path(path)
    if path.is_dir():
        raise ProtocolError(f"{what} {path}: is a directory")
    if path.exists() and not os.access(path, os.W_OK):
        raise ProtocolError(f"{what} {path}: not writable")
    check_writable_dir(path.parent if str(path.parent) else Path("."), f"{what} {path}: folder")
