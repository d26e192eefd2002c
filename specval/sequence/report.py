"""Report of a sequence bundle: verdict, every criterion with its MDE, groups, what each test sees."""

from __future__ import annotations

from pathlib import Path

from specval import bundle as bundles
from specval.report import Section, summary_files
from specval.report.markdown import fmt, tests_by_role
from specval.report.scope import group_text, profile_setting, sampling_text

CRITERION_HEADER = ["criterion", "role", "n", "statistic", "p", "Holm p", "MDE", "MDE scale", "verdict", "reason"]
GROUP_HEADER = [
    "group",
    "mode",
    "draft loops",
    "draft",
    "seeds",
    "sequences",
    "tokens",
    "acceptance rate",
    "tokens by round position",
]
LOOK_HEADER = ["look", "fraction", "batches per group", "sequences per group", "level", "verdict", "failing gating"]
SCOPE = (
    "Every committed token is tested against the target's law given its actual prefix (randomized PIT), "
    "bucketed by round position 1..K+1 (the bonus is K+1) and by quarter of the sequence; serial "
    "dependence looks at lags 1..K+1 within a sequence; paired requests (adjacent slots, one slot of two "
    "batches) must be independent. Not seen: a request's law when it shares a batch with rows of other "
    "sampling parameters (the adapter contract runs one parameter set per call), and deviations below "
    "the MDEs. A binned-PIT MDE bounds the PIT's deviation, which is at most the token law's (data "
    "processing), so a token-law TV above the MDE can still pass when it moves mass within PIT bins."
)


def criterion_rows(summary: dict) -> list[list[str]]:
    return [
        [
            name,
            t["role"],
            str(t["effective_n"]),
            fmt(t["statistic"], 4),
            fmt(t["p_value"], 3),
            fmt(t["p_adjusted"], 3),
            fmt(t["mde_tv"], 3),
            t["mde_label"] or "-",
            t["verdict"],
            t["reason"],
        ]
        for name, t in tests_by_role(summary)
    ]


def group_rows(summary: dict) -> list[list[str]]:
    return [
        [
            name,
            g["mode"],
            fmt(g["draft_loops"]),
            g["draft"],
            f"[{g['seed_start']}, {g['seed_stop']})",
            str(g["sequences"]),
            str(g["tokens"]),
            fmt(g["acceptance_rate"], 3),
            ", ".join(f"{k}: {v}" for k, v in sorted(g["round_positions"].items(), key=lambda kv: int(kv[0]))),
        ]
        for name, g in sorted(summary["groups"].items())
    ]


def look_rows(summary: dict) -> list[list[str]]:
    """One row per look the run evaluated (empty for a protocol without looks)."""
    block = summary.get("sequential")
    if not block:
        return []
    batch_size = summary["protocol"]["batch_size"]
    return [
        [
            str(r["look"]),
            fmt(r["fraction"]),
            str(r["samples_per_group"] // batch_size),
            str(r["samples_per_group"]),
            fmt(r["level"], 3),
            r["verdict"],
            ", ".join(r["failing"]) or "-",
        ]
        for r in block["records"]
    ]


def _looks_note(block: dict) -> str:
    looks = ", ".join(f"{fmt(f)} ({n})" for f, n in zip(block["looks"], block["samples_per_group"]))
    levels = ", ".join(fmt(v, 3) for v in block["levels"])
    return (
        f"Rule (pre-registered): {block['rule']}. {block['spending']} spending of alpha {block['alpha']} over "
        f"{block['num_looks']} looks at {looks} sequences per group, levels {levels}."
    )


def _facts(summary: dict, manifest: dict) -> list[str]:
    proto = summary["protocol"]
    families = ", ".join(f"{role}: m = {size}" for role, size in sorted(proto["family_sizes"].items()))
    return [
        f"{len(proto['prompts'])} prompt(s), {proto['sequence_length']} tokens per sequence, K = "
        f"{proto['num_speculative_tokens']}, batches of {proto['batch_size']}",
        f"alpha {proto['alpha']} per role (Holm; {families}), power {proto['power']} at the MDEs",
    ]


def _sections(summary: dict, manifest: dict) -> list[Section]:
    sections = [
        Section("Criteria", CRITERION_HEADER, criterion_rows(summary), (SCOPE,)),
        Section("Groups", GROUP_HEADER, group_rows(summary)),
    ]
    if summary.get("sequential"):
        note = _looks_note(summary["sequential"])
        sections.append(Section("Sequential looks", LOOK_HEADER, look_rows(summary), (note,)))
    return sections


NOT_COVERED = (
    "a PASS does not cover: tokens after each sequence's length, other prompts or sampling parameters, "
    "a request sharing a batch with rows of other sampling parameters (beyond the groups' companions), "
    "other engine settings, and deviations smaller than each criterion's MDE (the scope under Criteria)"
)


PROMPT_CHARS = 40  # a prompt longer than this is cut in the tested line (the protocol holds it whole)


def _prompt(text: str) -> str:
    return repr(text if len(text) <= PROMPT_CHARS else text[:PROMPT_CHARS] + "...")


def tested_text(summary: dict, protocol: dict) -> str:
    """What a sequence run tested: prompts, sampling, K, whole sequences, groups and their sizes."""
    proto = summary["protocol"]
    sampling = profile_setting(protocol, proto["profile"], "sampling") or {}
    groups = ", ".join(group_text(name, g) for name, g in sorted(summary["groups"].items()))
    sizes = sorted({g["sequences"] for g in summary["groups"].values()})
    return (
        f"tested: whole sequences of {proto['sequence_length']} tokens from {len(proto['prompts'])} prompt(s) "
        f"({', '.join(_prompt(p) for p in proto['prompts'])}); sampling {sampling_text(sampling)}; K = "
        f"{proto['num_speculative_tokens']}; groups {groups}; {' / '.join(map(str, sizes))} sequences per "
        f"group, in batches of {proto['batch_size']}"
    )


def render_files(path: Path, signer: str | None = None) -> dict[str, bytes]:
    """report.md and report.html of the sequence bundle at `path`, from its files alone
    (deterministic; `signer`: as `specval.report.render_files`)."""
    return summary_files(path, _facts, _sections, NOT_COVERED, tested_text, signer)


def render(path: Path) -> None:
    bundles.write_files(path, render_files(path))
