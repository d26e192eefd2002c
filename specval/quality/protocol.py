"""Quality protocol: the pre-registered YAML of a paired accuracy comparison (top-level `kind: quality`).

Every group answers the SAME items with the SAME request seeds, so item i / seed j of one group is
paired with item i / seed j of every other group. The primary comparisons are each speculative
group against `baseline`; the comparisons among speculative groups are secondary. Guarantees (as
for distribution protocols, `specval.protocol`): unknown keys and bad values raise ProtocolError
naming the file, the key and the value; `hash` is the canonical sha256 of the file's parsed form
(profiles included) and applying a profile does not change it. A profile may set `num_items`,
`seeds_per_item`, `max_tokens`, `batch_size` and `margin`; the resolved protocol's margin is the
one every verdict of the run (and its re-computation by `specval verify`) is judged against.
"""

from __future__ import annotations

import dataclasses
import difflib
import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specval.protocol import read_yaml
from specval.protocol.canonical import canonical_hash, plain_form, plain_value
from specval.protocol.readers import check_keys, fail, read_bool, read_int, read_mapping, read_name, read_str, read_unit
from specval.protocol.sections import (
    GroupSpec,
    SamplingSpec,
    SutSpec,
    parse_groups,
    parse_profiles,
    parse_sampling,
    parse_sut,
)
from specval.protocol.sections import resolve as protocol_resolve

QUALITY_KIND = "quality"
TASKS = ("arith", "gsm8k")
PROMPT_FORMATS = ("plain", "chat")
METRICS = {"arith": ("exact",), "gsm8k": ("flexible_extract", "strict_match")}
PROFILE_KEYS = ("num_items", "seeds_per_item", "max_tokens", "batch_size", "margin")
# A profile's margin (a number in (0, 1), like the top-level one) replaces the protocol's in the
# verdict, summary.json, the report and `specval verify`: a small profile can then decide against
# a coarser margin that its size can resolve (the smoke) while `full` keeps the registered one.
PROFILE_UNIT_KEYS = ("margin",)


@dataclass(frozen=True)
class TaskSpec:
    """Which items, how they are prompted and how a completion is scored."""

    name: str
    metric: str
    prompt_format: str = "plain"
    options: tuple[tuple[str, Any], ...] = ()  # arith: ArithConfig fields other than num_items


@dataclass(frozen=True)
class QualityProtocol:
    """A parsed quality protocol; `profile` is set once `resolve` applied one."""

    kind: str
    name: str
    task: TaskSpec
    sampling: SamplingSpec
    num_speculative_tokens: int
    max_tokens: int
    groups: tuple[GroupSpec, ...]
    baseline: str
    num_items: int
    seeds_per_item: int
    margin: float
    description: str = ""
    sut: SutSpec = SutSpec()
    seed_base: int = 0
    alpha: float = 0.05
    batch_size: int = 64
    confirmatory: bool = False
    profiles: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    profile: str | None = field(default=None, compare=False)
    file_hash: str | None = field(default=None, compare=False, repr=False)

    @property
    def num_pairs(self) -> int:
        """Paired units per group: items x seeds."""
        return self.num_items * self.seeds_per_item

    def comparisons(self) -> list[tuple[str, str, str]]:
        """(role, group a, group b): b is compared against a; primary = each group vs the baseline."""
        others = [g.name for g in self.groups if g.name != self.baseline]
        primary = [("primary", self.baseline, name) for name in others]
        return primary + [("secondary", a, b) for a, b in itertools.combinations(others, 2)]

    def to_dict(self) -> dict[str, Any]:
        out = plain_form(self)
        out["task"]["options"] = dict(self.task.options)
        return out

    @property
    def hash(self) -> str:
        return self.file_hash or canonical_hash(self.to_dict())


def _parse_task(raw: Any, file: str) -> TaskSpec:
    raw = read_mapping(raw, file, "task")
    check_keys(raw, TaskSpec, file, "task")
    name = read_str(raw["name"], file, "task.name", TASKS)
    options = read_mapping(raw.get("options", {}), file, "task.options")
    if name == "gsm8k" and options:
        fail(file, "task.options", "gsm8k takes no options", dict(options))
    if name == "arith":
        _check_arith_options(options, file)
    return TaskSpec(
        name=name,
        metric=read_str(raw["metric"], file, "task.metric", METRICS[name]),
        prompt_format=read_str(raw.get("prompt_format", "plain"), file, "task.prompt_format", PROMPT_FORMATS),
        options=tuple(sorted((str(k), plain_value(v)) for k, v in options.items())),
    )


def _check_arith_options(options: dict, file: str) -> None:
    from specval.tasks.arith import ArithConfig

    names = [f.name for f in dataclasses.fields(ArithConfig) if f.name != "num_items"]
    for key in options:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            fail(file, f"task.options.{key}", "unknown arith option", suggestion=close[0] if close else None)
    try:
        arith_config(dict(options), 1)
    except (ValueError, TypeError) as err:  # TypeError: a value of the wrong shape (operators: 3)
        fail(file, "task.options", str(err))


def arith_config(options: dict, num_items: int):
    """ArithConfig of the protocol's options (YAML lists become tuples)."""
    from specval.tasks.arith import ArithConfig

    values = {k: tuple(v) if isinstance(v, list) else v for k, v in options.items()}
    return ArithConfig(num_items=num_items, **values)


def parse_quality_protocol(raw: Any, file: str = "<protocol>") -> QualityProtocol:
    """Parse a YAML mapping into a QualityProtocol; ProtocolError names file, key and value."""
    raw = read_mapping(raw, file, "")
    check_keys(raw, QualityProtocol, file, "")
    read_str(raw["kind"], file, "kind", (QUALITY_KIND,))
    groups = parse_groups(raw["groups"], file)
    baseline = read_str(raw["baseline"], file, "baseline", tuple(g.name for g in groups))
    if len(groups) < 2:
        fail(file, "groups", "a paired comparison needs at least two groups", [g.name for g in groups])
    margin = read_unit(raw["margin"], file, "margin")
    protocol = QualityProtocol(
        kind=QUALITY_KIND,
        name=read_name(raw["name"], file, "name"),
        description=str(raw.get("description", "")),
        task=_parse_task(raw["task"], file),
        sut=parse_sut(raw.get("sut", {}), file),
        sampling=parse_sampling(raw["sampling"], file),
        num_speculative_tokens=read_int(raw["num_speculative_tokens"], file, "num_speculative_tokens", minimum=1),
        max_tokens=read_int(raw["max_tokens"], file, "max_tokens", minimum=1),
        groups=groups,
        baseline=baseline,
        num_items=read_int(raw["num_items"], file, "num_items", minimum=1),
        seeds_per_item=read_int(raw["seeds_per_item"], file, "seeds_per_item", minimum=1),
        margin=margin,
        seed_base=read_int(raw.get("seed_base", 0), file, "seed_base", minimum=0),
        alpha=read_unit(raw.get("alpha", 0.05), file, "alpha"),
        batch_size=read_int(raw.get("batch_size", 64), file, "batch_size", minimum=1),
        confirmatory=read_bool(raw.get("confirmatory", False), file, "confirmatory"),
        profiles=parse_profiles(raw.get("profiles", {}), file, PROFILE_KEYS, unit_keys=PROFILE_UNIT_KEYS),
    )
    return protocol


def load_quality_protocol(path: str | Path) -> QualityProtocol:
    """Read and parse a quality protocol file; YAML syntax errors become ProtocolError too."""
    return parse_quality_protocol(read_yaml(path), str(path))


resolve = protocol_resolve  # one profile rule for every protocol kind
