"""The run plan: run.json's record (`RunPlan`), the bundle formats, and the protocol it names.

run.json is written before any sample exists: the protocol and its hash, the profile, the seed
ranges (of stage 2 once claimed), the registration, the filter semantics, the frozen lock the run
started from and the bundle format, the version of the layout this module's constants name.

Guarantees:
- `RunPlan.from_dict(plan.to_dict())` equals `plan`; a run.json that records no format reads as
  LEGACY_FORMAT.
- `load_plan_protocol` returns a protocol only when protocol.json and protocol.yaml both have the
  hash run.json records (BundleError naming the file that differs otherwise); a protocol.yaml that
  is a link or a FIFO is reported, never opened.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specval.bundle.files import PROTOCOL_JSON, PROTOCOL_YAML, RUN_FILE, BundleError, read_json, regular_file

# 2: chunks.json, sessions.json, every file hashed, reports re-rendered by verify;
# 3: reference.json's probabilities and token ids as base64 arrays (`reference.Reference.to_dict`);
# 4: chunks.json a chain of records, its head in manifest.json (`chunk_heads`)
BUNDLE_FORMAT = 4
VERIFIABLE_FORMATS = (2, 3, 4)  # 2 and 3: chunks.json a {file: sha256} map, not chained
CHAINED_FORMAT = 4  # the first format whose chunk records chain
LEGACY_FORMAT = 1  # bundles whose run.json records no format


@dataclass(frozen=True)
class RunPlan:
    """What run.json records before any sampling."""

    protocol: str
    protocol_hash: str
    profile: str | None
    ranges: tuple[tuple[str, int, int], ...]  # (group, start, stop)
    stage2_ranges: tuple[tuple[str, int, int], ...] = ()  # the same, of stage 2 (empty: not claimed)
    bundle_format: int = BUNDLE_FORMAT
    registration: str = "frozen"  # the protocol's state in frozen.lock when the run started
    exploratory: bool = False  # run with --exploratory: the verdict is marked EXPLORATORY
    semantics: tuple[tuple[str, str], ...] = ()  # filter semantics the reference follows (empty: not recorded)
    lock: tuple[tuple[str, str | None], ...] = ()  # the frozen lock the run started from: file, sha256, entry

    def to_dict(self) -> dict:
        out = {
            "protocol": self.protocol,
            "protocol_hash": self.protocol_hash,
            "profile": self.profile,
            "ranges": _range_dicts(self.ranges),
            "bundle_format": self.bundle_format,
            "registration": self.registration,
            "exploratory": self.exploratory,
        }
        if self.stage2_ranges:
            out["stage2_ranges"] = _range_dicts(self.stage2_ranges)
        if self.semantics:
            out["semantics"] = dict(self.semantics)
        if self.lock:
            out["lock"] = dict(self.lock)
        return out

    @classmethod
    def from_dict(cls, data: dict) -> RunPlan:
        return cls(
            data["protocol"],
            data["protocol_hash"],
            data["profile"],
            _range_tuples(data["ranges"]),
            _range_tuples(data.get("stage2_ranges", [])),
            int(data.get("bundle_format", LEGACY_FORMAT)),
            data.get("registration", "frozen"),
            bool(data.get("exploratory", False)),
            tuple(sorted(data.get("semantics", {}).items())),
            tuple(sorted(data.get("lock", {}).items())),
        )

    def registration_block(self) -> dict:
        """The summary's `registration` entry: how the protocol stood against frozen.lock."""
        return {"state": self.registration, "exploratory": self.exploratory}


def _range_dicts(ranges: tuple[tuple[str, int, int], ...]) -> list[dict]:
    return [{"group": g, "start": a, "stop": b} for g, a, b in ranges]


def _range_tuples(entries: list[dict]) -> tuple[tuple[str, int, int], ...]:
    return tuple((r["group"], int(r["start"]), int(r["stop"])) for r in entries)


def load_plan_protocol(
    path: Path, parse: Callable[[Any, str], Any], load: Callable[[Path], Any]
) -> tuple[Any, RunPlan]:
    """(protocol, plan) of a bundle, refused (BundleError) unless its three records agree:
    protocol.json's canonical hash equals run.json's `protocol_hash`, and protocol.yaml, parsed with
    `load` (the schema of the protocol's kind), has that same hash. `parse(raw, file)` parses
    protocol.json's content."""
    plan = RunPlan.from_dict(read_json(path / RUN_FILE))
    protocol = parse(read_json(path / PROTOCOL_JSON), str(path / PROTOCOL_JSON))
    if protocol.hash != plan.protocol_hash:
        raise BundleError(
            f"{path / PROTOCOL_JSON}: hash {protocol.hash[:12]} differs from {RUN_FILE}'s {plan.protocol_hash[:12]}"
        )
    if os.path.lexists(path / PROTOCOL_YAML):
        regular_file(path / PROTOCOL_YAML)  # a FIFO or a link is reported, never opened
    written = load(path / PROTOCOL_YAML)
    if written.hash != protocol.hash:
        raise BundleError(
            f"{path / PROTOCOL_YAML}: parses to hash {written.hash[:12]}, not {PROTOCOL_JSON}'s {protocol.hash[:12]}"
        )
    return protocol, plan
