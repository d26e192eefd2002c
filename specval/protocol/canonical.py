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
    plain values without `profile` and `file_hash`, `sut.options` and `profiles` as mappings, and
    `sampling` in its own plain form (`SamplingSpec.to_dict`)."""
    out: dict[str, Any] = plain_value(dataclasses.asdict(protocol))
    out.pop("profile")
    out.pop("file_hash")
    out["sut"]["options"] = dict(protocol.sut.options)
    out["profiles"] = {name: dict(pairs) for name, pairs in protocol.profiles}
    out["sampling"] = protocol.sampling.to_dict()  # pinned semantics only when set
    return out


def canonical_hash(obj: Any) -> str:
    """sha256 of the canonical JSON (sorted keys, no whitespace) of `obj`."""
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()
