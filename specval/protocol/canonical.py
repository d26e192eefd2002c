"""Canonical form: the plain JSON-able form of a protocol and its hash, shared by every protocol kind.

Guarantee: `canonical_hash` is the sha256 of the canonical JSON (sorted keys, fixed separators,
ASCII, no NaN) of its argument, so comments, whitespace and key order of a protocol file never
change a protocol's hash and any value does.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any


def plain_value(value: Any) -> Any:
    """`value` with every dict, list and tuple inside it made a plain dict or list."""
    if isinstance(value, dict):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    return value


def plain_form(protocol: Any) -> dict[str, Any]:
    """The JSON-able form every protocol kind starts its `to_dict` from: its dataclass fields as
    plain values without `profile` and `file_hash`, `sut.options` and `profiles` as mappings,
    `sampling` in its own plain form (`SamplingSpec.to_dict`), and a group's `options` as a mapping
    only where the group has some (`group_forms`), so a protocol without them keeps its hash."""
    out: dict[str, Any] = plain_value(dataclasses.asdict(protocol))
    out.pop("profile")
    out.pop("file_hash")
    out["sut"]["options"] = dict(protocol.sut.options)
    out["profiles"] = {name: dict(pairs) for name, pairs in protocol.profiles}
    out["sampling"] = protocol.sampling.to_dict()  # pinned semantics only when set
    if "groups" in out:
        out["groups"] = group_forms(out["groups"], protocol.groups)
    return out


def group_forms(forms: list[dict[str, Any]], groups: Any) -> list[dict[str, Any]]:
    """The plain `forms` of `groups` with `options` a mapping where a group overrides adapter
    options and left out where it overrides none (the form every protocol had before the key)."""
    for form, group in zip(forms, groups):
        form.pop("options", None)
        if getattr(group, "options", ()):
            form["options"] = dict(group.options)
    return forms


def canonical_hash(obj: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace) of `obj`."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()
