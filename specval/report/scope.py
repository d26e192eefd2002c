"""The scope block of a report's first screen: whether the protocol was frozen, what the run
tested, and in plain words what its PASS does not cover.

Guarantee: only bundles that record the system under test's identity (`markdown.has_identity`)
get these lines; bundles made before it render byte for byte as they were sealed, so `specval
verify` still re-renders them exactly. Every value shown comes from the bundle's files
(summary.json, protocol.json, manifest.json), never from the code that renders.
"""

from __future__ import annotations

import json
from typing import Any

from specval.protocol.sections import SETTINGS_KEY
from specval.report.markdown import has_identity, is_exploratory

FROZEN_TEXT = "frozen: the protocol's hash is registered in its frozen.lock, and the run drew confirmatory seeds"
EXPLORATORY_TEXT = "EXPLORATORY: the protocol is not frozen; this verdict is for trying the protocol and gates nothing"


def registration_text(summary: dict) -> str:
    """Frozen or exploratory, in words (another recorded state is named as recorded)."""
    if is_exploratory(summary):
        return EXPLORATORY_TEXT
    state = (summary.get("registration") or {}).get("state")
    return FROZEN_TEXT if state == "frozen" else f"registration: {state or 'not recorded'}"


def profile_setting(protocol: dict, profile: Any, key: str) -> Any:
    """`key` of the written protocol with its profile applied (protocol.json keeps the profiles apart)."""
    overrides = (protocol.get("profiles") or {}).get(profile) or {}
    return overrides.get(key, protocol.get(key))


def sampling_text(sampling: dict) -> str:
    """The sampling parameters as given, by name."""
    return ", ".join(f"{name} {value}" for name, value in sorted(sampling.items())) or "defaults"


OWN_DRAFT = "own"  # a sequence group's default draft: the engine's own


def group_text(name: str, group: dict) -> str:
    """A group of a summary as the tested line names it: its mode, and its draft loops, another
    draft than the engine's own and the companions it shares batches with, where set."""
    settings = [group["mode"]]
    settings += [f"draft loops {group['draft_loops']}"] if group.get("draft_loops") is not None else []
    settings += [f"draft {group['draft']}"] if group.get("draft", OWN_DRAFT) != OWN_DRAFT else []
    companions = "; ".join(sampling_text(c) for c in group.get("companions") or [])
    settings += [f"in batches with companions {companions}"] if companions else []
    return f"{name} ({', '.join(settings)})"


def tested_text(summary: dict, protocol: dict) -> str:
    """What a distribution run tested: prompt, sampling, K, positions, groups and their sizes, batches."""
    proto = summary["protocol"]
    groups = ", ".join(group_text(name, g) for name, g in sorted(summary["groups"].items()))
    batch = profile_setting(protocol, proto.get("profile"), "batch_size")
    return (
        f"tested: prompt {protocol.get('prompt')!r}; sampling {sampling_text(protocol.get('sampling') or {})}; "
        f"K = {protocol.get('num_speculative_tokens')}; token positions 1..{proto['positions']} of each "
        f"request; groups {groups}; {proto['samples_per_group']} requests per group, in batches of {batch} "
        "requests of this prompt"
    )


def not_covered_text(summary: dict) -> str:
    """What a distribution PASS does not cover, in plain words."""
    positions = summary["protocol"]["positions"]
    return (
        f"a PASS does not cover: tokens after position {positions}, other prompts or sampling "
        "parameters, batches mixing requests of other prompts or parameters, other engine settings, "
        "and deviations smaller than each criterion's MDE (TV) below"
    )


def distribution_scope(summary: dict, manifest: dict, protocol: dict | None) -> list[str]:
    """The distribution report's scope lines (empty: a bundle made before identities, or no protocol)."""
    if protocol is None or not has_identity(manifest):
        return []
    return [
        registration_text(summary),
        tested_text(summary, protocol),
        *settings_lines(manifest),
        not_covered_text(summary),
    ]


def summary_scope(
    summary: dict, manifest: dict, not_covered: str | None = None, tested: str | None = None
) -> list[str]:
    """The scope lines of a summary report (sequence, quality, performance): frozen or exploratory
    and, when the kind gives them, what the run tested and what its PASS does not cover (empty
    before identities)."""
    if not has_identity(manifest):
        return []
    return [registration_text(summary), *(line for line in (tested, *settings_lines(manifest), not_covered) if line)]


def settings_lines(manifest: dict) -> list[str]:
    """The settings a run covered, from manifest.json's `settings` (group -> the adapter options it
    ran with: `specval.protocol.sections.settings_covered`): one line naming, for each set of
    options, the groups that ran it, by the options that differ between groups, and the options
    every group shares. Empty for a run whose groups override no option (and every older bundle)."""
    settings = manifest.get(SETTINGS_KEY) or {}
    if not settings:
        return []
    first = next(iter(settings.values()))
    shared = {k: v for k, v in first.items() if all(k in o and o[k] == v for o in settings.values())}
    cells: dict[str, list[str]] = {}
    for name, options in sorted(settings.items()):
        varying = {k: v for k, v in options.items() if k not in shared}
        cells.setdefault(_options_text(varying) or "the adapter's defaults", []).append(name)
    common = _options_text(shared)
    return [
        "settings covered (adapter options by group, the same checks in each): "
        + "; ".join(f"{', '.join(names)}: {text}" for text, names in cells.items())
        + (f"; every group also: {common}" if common else "")
    ]


def _options_text(options: dict) -> str:
    """Adapter options as "key value, ..." (values as JSON), sorted by key."""
    return ", ".join(f"{key} {json.dumps(value, sort_keys=True)}" for key, value in sorted(options.items()))
