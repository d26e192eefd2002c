"""Report: report.md and a self-contained report.html rendered from a bundle's files."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pandas as pd

from specval import bundle as bundles
from specval.collect import load_samples
from specval.reference import Reference
from specval.report import plots
from specval.report.html import render_html
from specval.report.markdown import render_markdown
from specval.seeds import SeedRange


def bundle_samples(path: Path, manifest: dict) -> pd.DataFrame:
    """The stage-1 samples of the bundle at `path`, by the seed ranges its manifest records."""
    ranges = [SeedRange(s["protocol"], s["run"], s["group"], s["start"], s["stop"]) for s in manifest["seeds"]]
    return load_samples(path, ranges)


def figures(path: Path, summary: dict, samples: pd.DataFrame) -> dict[str, bytes]:
    """Observed vs expected for every non-control token-stratified GOF criterion, p-values, token
    sources; `samples` are the bundle's stage-1 samples (`bundle_samples`)."""
    reference = Reference.from_dict(bundles.read_json(path / bundles.REFERENCE_FILE))
    positions = summary["protocol"]["positions"]
    out = {}
    for name, test in sorted(summary["tests"].items()):
        rows = test.get("strata") or []
        if test["kind"] == "gof" and test["role"] != "control" and rows and "path" not in rows[0]:
            png = plots.observed_vs_expected(name, test, samples, reference, positions)
            if png:
                out[f"observed vs expected: {name}"] = png
    for title, png in (("p-values across strata", plots.pvalues_across_strata(summary["tests"])),
                       ("token sources by position", plots.acceptance_by_position(summary["groups"]))):
        if png:
            out[title] = png
    return out


def render_files(path: Path, pngs: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """report.md and report.html of the bundle at `path`, rendered from its files alone.
    Deterministic: the same bundle gives the same bytes (no clock, no PNG timestamp or software
    tag, sorted iteration), on any machine with the same matplotlib build. `pngs`: the bundle's
    `figures`, when the caller already rendered them (a run, from the samples it holds in memory)."""
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    if pngs is None:
        pngs = figures(path, summary, bundle_samples(path, manifest))
    return {"report.md": render_markdown(summary, manifest, pngs).encode(),
            "report.html": render_html(summary, manifest, pngs).encode()}


def render(path: Path, pngs: dict[str, bytes] | None = None) -> None:
    """(Re-)write report.md and report.html of the bundle at `path` (`pngs`: as `render_files`)."""
    bundles.write_files(path, render_files(path, pngs))


def summary_files(path: Path, markdown: Callable[[dict, dict], str],
                  html: Callable[[dict, dict], str]) -> dict[str, bytes]:
    """report.md and report.html of a bundle whose report is rendered from summary.json and
    manifest.json alone (quality and performance bundles): `markdown(summary, manifest)` and
    `html(summary, manifest)`. Deterministic, as `render_files`."""
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    manifest = bundles.read_json(path / bundles.MANIFEST_FILE)
    return {"report.md": markdown(summary, manifest).encode(), "report.html": html(summary, manifest).encode()}
