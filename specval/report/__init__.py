"""Report: report.md and a self-contained report.html rendered from a bundle's files."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from html import escape
from pathlib import Path

import pandas as pd

from specval import bundle as bundles
from specval.distribution.collect import load_samples
from specval.distribution.reference import Reference
from specval.report import plots
from specval.report.html import html_table, page, render_html
from specval.report.markdown import (
    SESSION_HEADER,
    fmt,
    has_identity,
    identity_text,
    md_table,
    provenance,
    render_markdown,
    session_rows,
    table_cell,
    verdict_text,
)
from specval.report.scope import distribution_scope, summary_scope
from specval.report.signer import signer_lines
from specval.seeds import SeedRange


def bundle_samples(path: Path, manifest: dict, summary: dict | None = None) -> pd.DataFrame:
    """The stage-1 samples of the bundle at `path`, by the seed ranges its manifest records; a run
    that stopped at a sequential look (`summary["sequential"]`) holds each range's first
    `samples_per_group_at_stop` seeds only."""
    ranges = [SeedRange(s["protocol"], s["run"], s["group"], s["start"], s["stop"]) for s in manifest["seeds"]]
    looked = (summary or {}).get("sequential")
    if looked:
        ranges = [dataclasses.replace(r, stop=r.start + looked["samples_per_group_at_stop"]) for r in ranges]
    return load_samples(path, ranges)


OBSERVED_TITLE = "observed vs expected: "  # + the criterion's name
PVALUES_TITLE = "p-values across strata"
SOURCES_TITLE = "token sources by position"


def observed_criteria(summary: dict) -> list[tuple[str, dict]]:
    """(name, test) of every non-control token-stratified GOF criterion that has strata, by name:
    the criteria with an observed-vs-expected figure."""
    out = []
    for name, test in sorted(summary["tests"].items()):
        rows = test.get("strata") or []
        if test["kind"] == "gof" and test["role"] != "control" and rows and "path" not in rows[0]:
            out.append((name, test))
    return out


def assemble(
    observed: list[tuple[str, bytes | None]], pvalues: bytes | None, sources: bytes | None
) -> dict[str, bytes]:
    """The report's figures in report order, those that came out None left out: `observed` as
    (criterion name, png) in `observed_criteria` order, then p-values, then token sources."""
    out = {f"{OBSERVED_TITLE}{name}": png for name, png in observed if png}
    for title, png in ((PVALUES_TITLE, pvalues), (SOURCES_TITLE, sources)):
        if png:
            out[title] = png
    return out


def read_reference(path: Path) -> Reference:
    """The stage-1 reference of the bundle at `path` (reference.json), as the figures read it."""
    return Reference.from_dict(bundles.read_json(path / bundles.REFERENCE_FILE))


def figures(path: Path, summary: dict, samples: pd.DataFrame) -> dict[str, bytes]:
    """Observed vs expected for every non-control token-stratified GOF criterion, p-values, token
    sources; `samples` are the bundle's stage-1 samples (`bundle_samples`). Rendered here, one
    after the other: the reference rendering (a `FigurePool` gives the same bytes)."""
    reference, positions = read_reference(path), summary["protocol"]["positions"]
    observed = [
        (name, plots.observed_vs_expected(name, test, samples, reference, positions))
        for name, test in observed_criteria(summary)
    ]
    return assemble(
        observed, plots.pvalues_across_strata(summary["tests"]), plots.acceptance_by_position(summary["groups"])
    )


def render_files(
    path: Path,
    pngs: dict[str, bytes] | None = None,
    render_figures: Callable[[Path, dict, pd.DataFrame], dict[str, bytes]] = figures,
    signer: str | None = None,
) -> dict[str, bytes]:
    """report.md and report.html of the bundle at `path`, rendered from its files alone.
    Deterministic: the same bundle gives the same bytes (no clock, no PNG timestamp or software
    tag, sorted iteration), on any machine with the same matplotlib build. `pngs`: the bundle's
    `figures`, when the caller already rendered them (a run, from the samples it holds in memory);
    else `render_figures` (`figures`, or a `FigurePool`'s) renders them. `signer`: the key id of
    the signature about to be written (`specval.report.signer`); None: the envelope's, if any."""
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    if pngs is None:
        pngs = render_figures(path, summary, bundle_samples(path, manifest, summary))
    protocol = bundles.read_typed(path / bundles.PROTOCOL_JSON, dict) if has_identity(manifest) else None
    scope = [*distribution_scope(summary, manifest, protocol), *signer_lines(path, manifest, signer)]
    return {
        "report.md": render_markdown(summary, manifest, pngs, scope).encode(),
        "report.html": render_html(summary, manifest, pngs, scope).encode(),
    }


def render(path: Path, pngs: dict[str, bytes] | None = None, signer: str | None = None) -> None:
    """(Re-)write report.md and report.html of the bundle at `path` (`pngs`, `signer`: as `render_files`)."""
    bundles.write_files(path, render_files(path, pngs, signer=signer))


@dataclass(frozen=True)
class Section:
    """One section of a summary-only report: a titled table, then paragraphs of notes."""

    title: str
    header: list[str]
    rows: list[list[str]]
    notes: tuple[str, ...] = ()


def _first_screen(
    path: Path,
    summary: dict,
    manifest: dict,
    not_covered: str | None,
    tested: Callable[[dict, dict], str] | None,
    signer: str | None,
) -> list[str]:
    """A summary report's lines above its protocol hash: the system under test's identity, the
    scope (`scope.summary_scope`) and the signer; empty for a bundle made before identities."""
    if not has_identity(manifest):
        return []
    protocol = bundles.read_typed(path / bundles.PROTOCOL_JSON, dict) if tested else None
    return [
        identity_text(manifest),
        *summary_scope(summary, manifest, not_covered, tested(summary, protocol) if tested else None),
        *signer_lines(path, manifest, signer),
    ]


def summary_files(
    path: Path,
    facts: Callable[[dict, dict], list[str]],
    sections: Callable[[dict, dict], list[Section]],
    not_covered: str | None = None,
    tested: Callable[[dict, dict], str] | None = None,
    signer: str | None = None,
) -> dict[str, bytes]:
    """report.md and report.html of a bundle whose report is rendered from its summary.json and
    manifest.json (and protocol.json, for `tested`) (quality, sequence and performance bundles):
    "name: verdict", the reason, a list of the system under test's identity (bundles that record
    it), the protocol's hash and profile, `facts(summary, manifest)`, the run's provenance and
    wall time, then `sections(summary, manifest)` and the sessions, the same content in both
    files. Deterministic, as `render_files`. A bundle that records the system under test's
    identity lists it first, then its first screen's scope (`scope.summary_scope`: frozen or
    exploratory, `tested(summary, protocol)`, what was tested, and `not_covered`, what the kind's
    PASS does not cover) and its signer (`signer`: as `render_files`)."""
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    proto = summary["protocol"]
    first = _first_screen(path, summary, manifest, not_covered, tested, signer)
    listed = [
        f"protocol hash {proto['hash']} (profile: {proto['profile']})",
        *facts(summary, manifest),
        f"{provenance(manifest)}; wall {fmt(manifest.get('wall_s'), 3)} s",
    ]
    parts = [*sections(summary, manifest), Section("Sessions", SESSION_HEADER, session_rows(manifest))]
    name, verdict, reason = proto["name"], summary["verdict"], summary["reason"]
    shown = verdict_text(summary)
    lines = [f"# {name}: {shown}", "", reason, ""] + [f"- {fact}" for fact in [*first, *listed]]
    for part in parts:
        lines += ["", f"## {part.title}", "", md_table(part.header, part.rows, table_cell(manifest))]
        lines += [line for note in part.notes for line in ("", note)]
    body = "".join(
        f"<h2>{part.title}</h2>{html_table(part.header, part.rows)}"
        + "".join(f"<p>{escape(note)}</p>" for note in part.notes)
        for part in parts
    )
    return {
        "report.md": ("\n".join(lines) + "\n").encode(),
        "report.html": page(name, verdict, reason, listed, body, shown, first).encode(),
    }
