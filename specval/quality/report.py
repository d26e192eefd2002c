"""Report of a quality bundle: verdict, paired comparisons (McNemar, CI, margin), groups, provenance."""

from __future__ import annotations

from pathlib import Path

from specval import bundle as bundles
from specval.report import Section, summary_files
from specval.report.markdown import fmt, group_cells, tests_by_role
from specval.report.scope import group_text, profile_setting, sampling_text

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


NOT_COVERED = (
    "a PASS does not cover: other tasks, prompt formats or sampling parameters, answers beyond the "
    "token limit, an accuracy drop smaller than the margin (non-inferiority: a group up to the "
    "margin worse still passes), changes of the output distribution that leave the metric unchanged "
    "(distribution and sequence protocols test those), and other engine settings"
)


def tested_text(summary: dict, protocol: dict) -> str:
    """What a quality run tested: task and metric, items and seeds, sampling, K, the token limit,
    the groups and the baseline each is compared with."""
    proto = summary["protocol"]
    sampling = profile_setting(protocol, proto["profile"], "sampling") or {}
    groups = ", ".join(group_text(name, g) for name, g in sorted(summary["groups"].items()))
    return (
        f"tested: task {proto['task']} ({proto['prompt_format']} prompt, metric {proto['metric']}), "
        f"{proto['num_items']} items x {proto['seeds_per_item']} seeds = "
        f"{proto['num_items'] * proto['seeds_per_item']} paired requests per group; sampling "
        f"{sampling_text(sampling)}; K = {profile_setting(protocol, proto['profile'], 'num_speculative_tokens')}; "
        f"at most {proto['max_tokens']} tokens per answer; groups {groups}, compared with the "
        f"baseline {proto['baseline']} at non-inferiority margin {proto['margin']}"
    )


def render_files(path: Path, signer: str | None = None) -> dict[str, bytes]:
    """report.md and report.html of the quality bundle at `path`, from its files alone
    (deterministic; `signer`: as `specval.report.render_files`)."""
    return summary_files(path, _facts, _sections, NOT_COVERED, tested_text, signer)


def render(path: Path) -> None:
    """(Re-)write report.md and report.html of the quality bundle at `path`."""
    bundles.write_files(path, render_files(path))
