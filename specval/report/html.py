"""Self-contained HTML report: the markdown report's content with plots embedded as base64 PNGs."""

from __future__ import annotations

import base64
import html

from specval.report.markdown import (
    CRITERIA_HEADER,
    GROUP_HEADER,
    LOOK_HEADER,
    SESSION_HEADER,
    confirmation_lines,
    criteria_rows,
    fmt,
    group_rows,
    identity_text,
    look_rows,
    patch_text,
    provenance,
    semantics_text,
    sequential_blocks,
    sequential_lines,
    session_rows,
    verdict_text,
)

STYLE = (
    "body{font-family:sans-serif;max-width:1200px;margin:2em auto}table{border-collapse:collapse;"
    "font-size:13px}td,th{border:1px solid #ccc;padding:3px 6px}.PASS{color:#070}.FAIL{color:#b00}"
    ".INCONCLUSIVE{color:#a60}"
)


def heading(name: str, verdict: str, shown: str) -> str:
    """<h1>name: verdict</h1>, the verdict as `shown` (e.g. "EXPLORATORY PASS") styled by `verdict`."""
    return f"<h1>{html.escape(name)}: <span class='{verdict}'>{html.escape(shown)}</span></h1>"


def page(
    name: str,
    verdict: str,
    reason: str,
    facts: list[str],
    body: str,
    shown: str | None = None,
    first: list[str] | None = None,
) -> str:
    """A self-contained page: "name: verdict" (the verdict as `shown` when given), the reason,
    `first` (the system under test's identity in bold, then the scope and signer lines as a list,
    as the distribution report shows them; none: nothing), the facts as a list, then `body` (HTML)."""
    title = html.escape(name)
    items = "".join(f"<li>{html.escape(fact)}</li>" for fact in facts)
    lead = f"<p><b>{html.escape(first[0])}</b></p>{_scope(first[1:])}" if first else ""
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{title}</title><style>{STYLE}</style>"
        f"</head><body>{heading(name, verdict, shown or verdict)}"
        f"<p>{html.escape(reason)}</p>{lead}<ul>{items}</ul>{body}</body></html>\n"
    )


def html_table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(f'<td class="{html.escape(c)}">{html.escape(c)}</td>' for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def _confirmation(summary: dict) -> str:
    """The two-stage section: its summary lines as paragraphs, the stage-2 tables as HTML tables."""
    lines = [line for line in confirmation_lines(summary) if line and not line.startswith("|")]
    if not lines:
        return ""
    block = summary["confirmation"]
    out = []
    for line in lines:
        if line.startswith("### Stage 2 criteria"):
            out.append(f"<h3>Stage 2 criteria</h3>{html_table(CRITERIA_HEADER, criteria_rows(block['stage2']))}")
        elif line.startswith("### Stage 2 groups"):
            out.append(f"<h3>Stage 2 groups</h3>{html_table(GROUP_HEADER, group_rows(block['stage2']))}")
        elif line.startswith("## "):
            out.append(f"<h2>{html.escape(line[3:])}</h2>")
        else:
            out.append(f"<p>{html.escape(line.removeprefix('- '))}</p>")
    return "".join(out)


def _sequential(summary: dict) -> str:
    """The sequential section: its lines as paragraphs, the looks as an HTML table."""
    lines = sequential_lines(summary)
    if not lines:
        return ""
    rows = [row for stage, block in sequential_blocks(summary) for row in look_rows(stage, block)]
    paragraphs = "".join(
        f"<p>{html.escape(line.removeprefix('- '))}</p>" for line in lines[2:] if line and not line.startswith("|")
    )
    return f"<h2>Sequential looks</h2>{paragraphs}{html_table(LOOK_HEADER, rows)}"


def _semantics(summary: dict) -> str:
    text = semantics_text(summary)
    return "" if text is None else f"<p>{html.escape(text)}</p>"


def _identity(manifest: dict) -> str:
    text = identity_text(manifest)
    return "" if text is None else f"<p><b>{html.escape(text)}</b></p>"


def _patch(manifest: dict) -> str:
    text = patch_text(manifest)
    return "" if text is None else f"<p>{html.escape(text)}</p>"


def _scope(scope: list[str] | None) -> str:
    return "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in scope) + "</ul>" if scope else ""


def render_html(summary: dict, manifest: dict, figures: dict[str, bytes], scope: list[str] | None = None) -> str:
    """report.html of a distribution bundle (`scope`: as `render_markdown`'s)."""
    proto = summary["protocol"]
    images = "".join(
        f'<h3>{html.escape(name)}</h3><img alt="{html.escape(name)}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        for name, png in figures.items()
    )
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(proto['name'])}</title>"
        f"<style>{STYLE}</style></head><body>"
        f"{heading(proto['name'], summary['verdict'], verdict_text(summary))}"
        f"<p>{html.escape(summary['reason'])}</p>{_identity(manifest)}{_scope(scope)}"
        f"<p>protocol hash <code>{proto['hash']}</code>, profile {html.escape(str(proto['profile']))}, "
        f"alpha {proto['alpha']} (Holm within each family), {html.escape(provenance(manifest))}, "
        f"wall {fmt(manifest.get('wall_s'), 3)} s</p>"
        f"{_semantics(summary)}{_patch(manifest)}"
        f"<h2>Criteria</h2>{html_table(CRITERIA_HEADER, criteria_rows(summary))}"
        f"<p>MDE (TV): deviations of total-variation distance at least this large would have been detected "
        f"with power &ge; {proto['power']}.</p>"
        f"<h2>Groups</h2>{html_table(GROUP_HEADER, group_rows(summary))}"
        f"{_confirmation(summary)}{_sequential(summary)}"
        f"<h2>Sessions</h2>{html_table(SESSION_HEADER, session_rows(manifest))}"
        f"<h2>Figures</h2>{images}</body></html>\n"
    )
