"""Markdown report of a bundle: verdict, criteria table, groups, provenance."""

from __future__ import annotations

from collections.abc import Callable

from specval.identity import IDENTITY_KEY, describe_record
from specval.semantics import FilterSemantics

EXPLORATORY = "EXPLORATORY"  # marks the verdict of a protocol run unfrozen (--exploratory)


def is_exploratory(summary: dict) -> bool:
    """True iff the summary records an exploratory run (bundles made before the field: False)."""
    return bool((summary.get("registration") or {}).get("exploratory"))


def verdict_text(summary: dict) -> str:
    """The verdict as titles and listings show it: "EXPLORATORY PASS" for an exploratory run."""
    return f"{EXPLORATORY} {summary['verdict']}" if is_exploratory(summary) else summary["verdict"]


def fmt(value, digits: int = 4) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}"
    return str(value)


def tests_by_role(summary: dict) -> list[tuple[str, dict]]:
    """(name, test) of every criterion of `summary`, by role, then by name: the order every
    report lists them in."""
    return sorted(summary["tests"].items(), key=lambda kv: (kv[1]["role"], kv[0]))


def criteria_rows(summary: dict) -> list[list[str]]:
    """One row per criterion: name, role, statistic, df, p, Holm p, MDE (TV), coverage, verdict, reason.
    `summary` is a run's summary or its `confirmation.stage2` block (same `tests` layout)."""
    rows = []
    for name, test in tests_by_role(summary):
        coverage = test.get("coverage")
        cover = (
            f"{coverage['strata_covered']}/{coverage['strata_total']} strata, "
            f"{coverage['samples_covered']}/{coverage['samples_total']} samples"
            if coverage
            else "-"
        )
        rows.append(
            [
                name,
                test["role"],
                fmt(test["statistic"]),
                fmt(test["df"]),
                fmt(test["p_value"]),
                fmt(test["p_adjusted"]),
                fmt(test["mde_tv"], 3),
                cover,
                test["verdict"],
                test["reason"],
            ]
        )
    return rows


CRITERIA_HEADER = ["criterion", "role", "statistic", "df", "p", "p (Holm)", "MDE (TV)", "coverage", "verdict", "reason"]
GROUP_HEADER = ["group", "mode", "draft loops", "seeds", "n (planned / effective)", "acceptance rate"]


def group_cells(name: str, group: dict) -> list[str]:
    """The first cells of a group's row, as the distribution and quality reports show them: name,
    mode, draft loops, seed range, n (planned / effective)."""
    return [
        name,
        group["mode"],
        fmt(group["draft_loops"]),
        f"[{group['seed_start']}, {group['seed_stop']})",
        f"{group['planned_n']} / {group['effective_n']}",
    ]


def group_rows(summary: dict) -> list[list[str]]:
    return [[*group_cells(name, g), fmt(g["acceptance_rate"], 3)] for name, g in sorted(summary["groups"].items())]


def escape_cell(text: str) -> str:
    """`text` as one markdown table cell: `|` escaped as `\\|` (GitHub and GitLab render a pipe, not a
    cell border) and line breaks as spaces (a row is one line)."""
    return " ".join(text.splitlines()).replace("|", "\\|")


def legacy_cell(text: str) -> str:
    """How bundles sealed before identities wrote a cell (`|` as `/`): kept for them alone, so that
    `specval verify` still re-renders their report.md byte for byte."""
    return text.replace("|", "/")


def table_cell(manifest: dict) -> Callable[[str], str]:
    """The cell writer of a bundle's report.md: `escape_cell`, or `legacy_cell` for a bundle made
    before identities (`has_identity`)."""
    return escape_cell if has_identity(manifest) else legacy_cell


def md_table(header: list[str], rows: list[list[str]], cell: Callable[[str], str] = escape_cell) -> str:
    """A markdown table; each body cell written by `cell`."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(text) for text in row) + " |" for row in rows]
    return "\n".join(lines)


def confirmation_lines(summary: dict, cell: Callable[[str], str] = escape_cell) -> list[str]:
    """The two-stage section: rule, per-stage and combined error rates, stage-2 outcome (empty for
    a one-stage protocol, or a summary written before confirmation existed)."""
    block = summary.get("confirmation")
    if not block or block["stages"] < 2:
        return []
    rates = block["rates"]
    lines = [
        "## Two-stage confirmation",
        "",
        f"Rule (pre-registered): {block['rule']}.",
        "",
        f"- stage 1 alpha {block['alpha_stage1']}, stage 2 alpha {block['alpha_stage2']} (Holm within each "
        f"family in each stage); power {rates['power1']} per stage at each criterion's MDE",
        f"- combined false-fail rate per family <= alpha1 * alpha2 = {fmt(rates['false_fail'], 3)}; "
        f"run (over {block['gating_families']} gating families) <= {fmt(block['run_false_fail_bound'], 3)}",
        f"- combined power >= power1 * power2 = {fmt(rates['power'], 3)} at a TV >= both stages' MDE; "
        f"expected stages per run of a correct sampler {fmt(rates['expected_stages'], 4)}",
    ]
    if block["deterministic"]:
        lines.append(f"- stage 2 not run: deterministic failure of {', '.join(block['deterministic'])}")
    elif not block["triggered"]:
        lines.append("- stage 2 not run: stage 1 did not FAIL")
    else:
        second = block["stage2"]
        lines += [
            f"- stage 2 ran on fresh seeds: {second['verdict']}: {second['reason']}",
            "",
            "### Stage 2 criteria",
            "",
            md_table(CRITERIA_HEADER, criteria_rows(second), cell),
            "",
            "### Stage 2 groups",
            "",
            md_table(GROUP_HEADER, group_rows(second), cell),
        ]
    return lines + [""]


LOOK_HEADER = ["stage", "look", "fraction", "samples per group", "level", "verdict", "failing gating criteria"]


def look_rows(stage: str, block: dict) -> list[list[str]]:
    return [
        [
            stage,
            str(r["look"]),
            fmt(r["fraction"]),
            str(r["samples_per_group"]),
            fmt(r["level"], 3),
            r["verdict"],
            ", ".join(r["failing"]) or "-",
        ]
        for r in block["records"]
    ]


def sequential_blocks(summary: dict) -> list[tuple[str, dict]]:
    """(stage, `sequential` entry) of each stage that ran with looks (empty: a fixed-size protocol)."""
    first = summary.get("sequential")
    if not first:
        return []
    second = ((summary.get("confirmation") or {}).get("stage2") or {}).get("sequential")
    return [("1", first)] + ([("2", second)] if second else [])


def sequential_lines(summary: dict, cell: Callable[[str], str] = escape_cell) -> list[str]:
    """The sequential section: rule, boundary, where each stage stopped, one row per look taken
    (empty for a protocol without looks)."""
    blocks = sequential_blocks(summary)
    if not blocks:
        return []
    first = blocks[0][1]
    lines = ["## Sequential looks", "", f"Rule (pre-registered): {first['rule']}.", ""]
    for stage, block in blocks:
        looks = ", ".join(f"{fmt(f)} ({n})" for f, n in zip(block["looks"], block["samples_per_group"]))
        lines += [
            f"- stage {stage}: {block['spending']} spending of alpha {block['alpha']} over "
            f"{block['num_looks']} looks at {looks} samples per group, levels "
            f"{', '.join(fmt(v, 3) for v in block['levels'])}; {sequential_text(block)}"
        ]
    rows = [row for stage, block in blocks for row in look_rows(stage, block)]
    return lines + ["", md_table(LOOK_HEADER, rows, cell), ""]


def sequential_text(block: dict) -> str:
    """Where a stage with looks stopped, in words."""
    if block["stopped_early"]:
        return (
            f"stopped with FAIL at look {block['stopped_at_look']} of {block['num_looks']}, after "
            f"{block['samples_per_group_at_stop']} of {block['samples_per_group'][-1]} planned samples per group"
        )
    return f"ran all {block['num_looks']} looks ({block['samples_per_group_at_stop']} samples per group)"


SESSION_HEADER = ["session", "command", "started", "finished", "samples drawn", "outcome", "code"]


def code_text(code: dict, labelled: bool = False) -> str:
    """specval version, commit and dirty flag of one code-version record (format-1 manifests
    recorded only `git {commit, dirty}`). `labelled` (a bundle that records the SUT's identity,
    `has_identity`): the commit is named specval's, "specval git ...", so that no reader takes it
    for the engine's; older bundles render as they were sealed."""
    git = "specval git" if labelled else "git"
    text = f"specval {code.get('version', '?')}, {git} {code.get('commit')} (dirty: {code.get('dirty')})"
    return text + (f", source sha256 {code['source_sha256'][:16]}" if code.get("source_sha256") else "")


def has_identity(manifest: dict) -> bool:
    """True iff the manifest records the system under test's identity (`sut_identity`, possibly
    null): bundles made before it render unchanged, so that `verify` still re-renders them byte for byte."""
    return IDENTITY_KEY in manifest


def identity_text(manifest: dict) -> str | None:
    """The system under test's identity in one line (None: a bundle made before it was recorded)."""
    return f"system under test: {describe_record(manifest[IDENTITY_KEY])}" if has_identity(manifest) else None


def identity_lines(manifest: dict) -> list[str]:
    text = identity_text(manifest)
    return [] if text is None else [f"- {text}"]


def provenance(manifest: dict) -> str:
    """The code that finished the bundle and the number of sessions that worked on it."""
    code = manifest.get("code") or manifest.get("git") or {}
    return f"{code_text(code, has_identity(manifest))}; {len(manifest.get('sessions') or [])} session(s)"


def session_rows(manifest: dict) -> list[list[str]]:
    """One row per session; a session that never finished (killed, or raised) shows `-`."""
    return [
        [
            str(i),
            " ".join(s["command"]),
            s["started"],
            fmt(s["finished"]),
            fmt(s["samples_drawn"]),
            fmt(s["outcome"]),
            code_text(s["code"], has_identity(manifest)),
        ]
        for i, s in enumerate(manifest.get("sessions") or [])
    ]


def semantics_text(summary: dict) -> str | None:
    """The filter semantics the reference followed, in one line (None: a bundle that did not record them)."""
    recorded = summary.get("semantics")
    return None if recorded is None else f"filter semantics: {FilterSemantics.from_dict(recorded).describe()}"


def semantics_lines(summary: dict) -> list[str]:
    text = semantics_text(summary)
    return [] if text is None else [f"- {text}"]


def patch_text(manifest: dict) -> str | None:
    """The adapter's own account of a change it made to the engine under test (`describe()["patched"]`,
    a sentence), or None when it made none (or the bundle predates the key)."""
    patched = ((manifest.get("device") or {}).get("sut") or {}).get("patched")
    return f"system under test patched: {patched}" if isinstance(patched, str) and patched else None


def patch_lines(manifest: dict) -> list[str]:
    text = patch_text(manifest)
    return [] if text is None else [f"- {text}"]


def render_markdown(summary: dict, manifest: dict, figures: dict[str, bytes], scope: list[str] | None = None) -> str:
    """report.md of a distribution bundle; `scope`: the first screen's scope lines
    (`specval.report.scope.distribution_scope`), listed under the system under test."""
    cell = table_cell(manifest)
    proto = summary["protocol"]
    lines = [
        f"# {proto['name']}: {verdict_text(summary)}",
        "",
        summary["reason"],
        "",
        *identity_lines(manifest),
        *[f"- {line}" for line in scope or []],
        f"- protocol hash: `{proto['hash']}` (profile: {proto['profile']})",
        f"- alpha {proto['alpha']}, Holm within each family (control / primary / secondary); the run passes "
        "iff every control and primary criterion passes",
        f"- stratum minimum {proto['stratum_min']} samples, cells pooled to expected count >= {proto['min_expected']}",
        *semantics_lines(summary),
        *patch_lines(manifest),
        f"- {provenance(manifest)}; started {manifest.get('started')}, "
        f"wall {fmt(manifest.get('wall_s'), 3)} s, {fmt(manifest.get('samples_per_s'), 3)} samples/s",
        "",
        "## Criteria" + (" (stage 1)" if summary.get("confirmation", {}).get("triggered") else ""),
        "",
        md_table(CRITERIA_HEADER, criteria_rows(summary), cell),
        "",
        "MDE (TV): deviations of total-variation distance >= this value would have been detected with power "
        f">= {proto['power']} at the run's sample size.",
        "",
        "## Groups",
        "",
        md_table(GROUP_HEADER, group_rows(summary), cell),
        "",
        *confirmation_lines(summary, cell),
        *sequential_lines(summary, cell),
        "## Sessions",
        "",
        md_table(SESSION_HEADER, session_rows(manifest), cell),
        "",
        "## Figures",
        "",
    ]
    lines += [f"- `{name}` (embedded in report.html)" for name in figures]
    return "\n".join(lines) + "\n"
