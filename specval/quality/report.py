"""Report of a quality bundle: verdict, paired comparisons (McNemar, CI, margin), groups, provenance."""

from __future__ import annotations

from pathlib import Path

from specval import bundle as bundles
from specval.report import Section, summary_files
from specval.report.markdown import fmt, group_cells, tests_by_role

COMPARISON_HEADER = [
    "comparison",
    "role",
    "n pairs",
    "acc a",
    "acc b",
    "diff (b - a)",
    "CI",
    "wins / losses / ties",
    "McNemar p (exact)",
    "margin",
    "verdict",
    "reason",
]
GROUP_HEADER = [
    "group",
    "mode",
    "draft loops",
    "seeds",
    "n (planned / effective)",
    "accuracy",
    "acceptance rate",
    "mean tokens",
]
CAVEAT = (
    "A non-significant McNemar test alone is NOT evidence of no regression: with few discordant pairs it "
    "has little power. Only the pre-registered non-inferiority criterion gates (the lower end of the "
    "paired-difference interval above -margin); when the interval straddles -margin the comparison is "
    "INCONCLUSIVE, never PASS."
)


def comparison_rows(summary: dict) -> list[list[str]]:
    return [
        [
            name,
            t["role"],
            str(t["n"]),
            fmt(t["acc_a"], 3),
            fmt(t["acc_b"], 3),
            fmt(t["diff"], 3),
            f"[{t['ci_low']:+.3f}, {t['ci_high']:+.3f}]",
            f"{t['wins']} / {t['losses']} / {t['ties']}",
            fmt(t["p_value"], 3),
            fmt(t["margin"]),
            t["verdict"],
            t["reason"],
        ]
        for name, t in tests_by_role(summary)
    ]


def group_rows(summary: dict) -> list[list[str]]:
    return [
        [*group_cells(name, g), fmt(g["accuracy"], 3), fmt(g["acceptance_rate"], 3), fmt(g["mean_tokens"], 3)]
        for name, g in sorted(summary["groups"].items())
    ]


def _facts(summary: dict, manifest: dict) -> list[str]:
    proto = summary["protocol"]
    return [
        f"task {proto['task']} ({proto['prompt_format']} prompt), metric {proto['metric']}, "
        f"{proto['num_items']} items x {proto['seeds_per_item']} seeds, at most {proto['max_tokens']} tokens",
        f"paired: every group answers the same items with the same request seeds; alpha {proto['alpha']} "
        f"(two-sided Newcombe interval), non-inferiority margin {proto['margin']} against {proto['baseline']}",
    ]


def _sections(summary: dict, manifest: dict) -> list[Section]:
    return [
        Section("Paired comparisons", COMPARISON_HEADER, comparison_rows(summary), (CAVEAT,)),
        Section("Groups", GROUP_HEADER, group_rows(summary)),
    ]


def render_files(path: Path) -> dict[str, bytes]:
    """report.md and report.html of the quality bundle at `path`, from its files alone (deterministic)."""
    return summary_files(path, _facts, _sections)


def render(path: Path) -> None:
    """(Re-)write report.md and report.html of the quality bundle at `path`."""
    bundles.write_files(path, render_files(path))
