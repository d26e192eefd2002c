"""Sections: the parts of a protocol file that every protocol kind shares, parsed into frozen
dataclasses: the system under test (`sut`), the sampling parameters (`sampling`), the groups
(`groups`) and the scale profiles (`profiles`, applied by `resolve`).

A group may override adapter options (`groups[i].options`, merged over `sut.options` for that group
only: `SutSpec.options_for`), so that one protocol runs the same checks across the settings a team
serves with; `settings_covered` lists each group's effective options where any group overrides one.

Guarantee: each parser returns frozen dataclasses or raises ProtocolError naming the file, the
key and the value (`specval.protocol.readers`).
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from specval.protocol.readers import (
    check_keys,
    fail,
    read_draft_loops,
    read_float,
    read_int,
    read_mapping,
    read_name,
    read_str,
    read_unit,
)
from specval.semantics import CHOICES as SEMANTICS_CHOICES

NOSPEC_MODE = "nospec"
# Below this temperature engines decode greedily (vLLM's _SAMPLING_EPS); logits / T overflow
# float32 from T ~ 1e-37 on. Either way the law is a point mass: nothing to test.
MIN_TEMPERATURE = 1e-5
GREEDY_TOP_K = 1  # keeps one token: greedy decoding, nothing to test
PROFILE_KEYS = ("samples_per_group", "chunk_size", "batch_size")
SETTINGS_KEY = "settings"  # manifest.json's record of `settings_covered`


class Profiled(typing.Protocol):
    """What `resolve` reads of a protocol dataclass (every kind's: distribution, sequence,
    quality, performance): its fields, `name`, `hash` and `profiles` ((name, overrides) pairs)."""

    __dataclass_fields__: ClassVar[dict[str, dataclasses.Field[Any]]]

    @property
    def name(self) -> str: ...

    @property
    def hash(self) -> str: ...

    @property
    def profiles(self) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]: ...


AnyProtocol = TypeVar("AnyProtocol", bound=Profiled)  # a protocol dataclass of any kind


@dataclass(frozen=True)
class SutSpec:
    """Which system under test runs the protocol, and how it is configured."""

    adapter: str = "engine"  # "engine" or "package.module:ClassName" or an entry point name
    model: str = "looped"
    dtype: str = "float32"
    device: str = "cpu"
    options: tuple[tuple[str, Any], ...] = ()  # free-form (key, value) pairs passed to the adapter

    def options_for(self, group: GroupSpec) -> tuple[tuple[str, Any], ...]:
        """The adapter options `group` runs with: `options` with the group's own (`GroupSpec.options`)
        merged over them, sorted by key. Equal to `options` for a group that overrides none."""
        own = getattr(group, "options", ())  # a duck-typed group of an adapter's own tests may lack it
        return tuple(sorted({**dict(self.options), **dict(own)}.items())) if own else self.options


@dataclass(frozen=True)
class SamplingSpec:
    """Sampling parameters shared by every request of every group. `semantics` holds the filter
    semantics the protocol pins ((field, value) pairs of `specval.semantics.FilterSemantics`,
    sorted; empty: none pinned, the adapter's declaration stands)."""

    temperature: float
    top_k: int = -1
    top_p: float = 1.0
    semantics: tuple[tuple[str, str], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain form; `semantics` only when pinned, so a protocol without pins hashes as before the key."""
        out: dict[str, Any] = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        if self.semantics:
            out["semantics"] = dict(self.semantics)
        return out


@dataclass(frozen=True)
class GroupSpec:
    """One arm of the experiment: an engine mode, its draft depth and the adapter options it
    overrides (`options`: (key, value) pairs sorted by key, merged over `sut.options` for this
    group only; empty: none, and then absent from the canonical form, so the hash is unchanged)."""

    name: str
    mode: str
    draft_loops: int | None = None
    options: tuple[tuple[str, Any], ...] = ()

    @property
    def is_speculative(self) -> bool:
        return self.mode != NOSPEC_MODE


def parse_sut(raw: Any, file: str) -> SutSpec:
    """The `sut` section (every key optional)."""
    raw = read_mapping(raw, file, "sut")
    check_keys(raw, SutSpec, file, "sut")
    options = read_mapping(raw.get("options", {}), file, "sut.options")
    return SutSpec(
        adapter=read_str(raw.get("adapter", "engine"), file, "sut.adapter"),
        model=read_str(raw.get("model", "looped"), file, "sut.model"),
        dtype=read_str(raw.get("dtype", "float32"), file, "sut.dtype"),
        device=read_str(raw.get("device", "cpu"), file, "sut.device"),
        options=tuple(sorted((str(k), v) for k, v in options.items())),
    )


def parse_sampling(raw: Any, file: str) -> SamplingSpec:
    """The `sampling` section: temperature >= MIN_TEMPERATURE (finite), top_k -1 or 0 (off)
    or >= 2, top_p in (0, 1], pinned semantics."""
    raw = read_mapping(raw, file, "sampling")
    check_keys(raw, SamplingSpec, file, "sampling")
    temperature = read_float(raw["temperature"], file, "sampling.temperature")
    if not temperature >= MIN_TEMPERATURE:
        fail(
            file,
            "sampling.temperature",
            f"must be >= {MIN_TEMPERATURE:g} (below, decoding is greedy: a point mass has no distribution to test)",
            raw["temperature"],
        )
    top_k = read_int(raw.get("top_k", -1), file, "sampling.top_k", minimum=-1)
    if top_k == GREEDY_TOP_K:
        fail(file, "sampling.top_k", "1 keeps one token (greedy decoding): nothing to test; use -1 for no top-k", top_k)
    top_p = read_unit(raw.get("top_p", 1.0), file, "sampling.top_p", upper_closed=True)
    return SamplingSpec(
        temperature=temperature, top_k=top_k, top_p=top_p, semantics=parse_semantics(raw.get("semantics", {}), file)
    )


def parse_semantics(raw: Any, file: str) -> tuple[tuple[str, str], ...]:
    """The pinned filter semantics: each key a field of FilterSemantics, each value one of its choices."""
    raw = read_mapping(raw, file, "sampling.semantics")
    pins = []
    for key, value in raw.items():
        where = f"sampling.semantics.{key}"
        if key not in SEMANTICS_CHOICES:
            close = difflib.get_close_matches(str(key), list(SEMANTICS_CHOICES), n=1)
            fail(file, where, "unknown key", suggestion=close[0] if close else None)
        pins.append((key, read_str(value, file, where, SEMANTICS_CHOICES[key])))
    return tuple(sorted(pins))


def parse_group(raw: Any, file: str, where: str) -> GroupSpec:
    """One entry of `groups` (at `where`, e.g. "groups[2]")."""
    raw = read_mapping(raw, file, where)
    check_keys(raw, GroupSpec, file, where)
    return GroupSpec(
        name=read_name(raw["name"], file, f"{where}.name"),
        mode=read_name(raw["mode"], file, f"{where}.mode"),
        draft_loops=read_draft_loops(raw, file, where),
        options=read_group_options(raw, file, where),
    )


def read_group_options(raw: Any, file: str, where: str) -> tuple[tuple[str, Any], ...]:
    """`where.options` of a group: absent (none), or a non-empty mapping of option names
    ([a-z][a-z0-9_]*) to values, as (key, value) pairs sorted by key. The adapter checks the keys
    and values as it checks `sut.options` (an unknown key or a bad value is refused, exit 2)."""
    if "options" not in raw:
        return ()
    options = read_mapping(raw["options"], file, f"{where}.options")
    if not options:
        fail(file, f"{where}.options", "expected a non-empty mapping (leave the key out to override nothing)", {})
    for key in options:
        read_name(key, file, f"{where}.options")
    return tuple(sorted(options.items()))


def settings_covered(protocol: Any) -> dict[str, dict[str, Any]]:
    """Group name -> the adapter options it runs with (`SutSpec.options_for`), for a protocol where
    some group overrides `sut.options`; empty otherwise (every group runs `sut.options` alone)."""
    if not any(getattr(g, "options", ()) for g in protocol.groups):
        return {}
    return {g.name: dict(protocol.sut.options_for(g)) for g in protocol.groups}


def parse_groups(
    raw: Any, file: str, parse: Callable[[Any, str, str], GroupSpec] | None = None
) -> tuple[GroupSpec, ...]:
    """The `groups` list: non-empty, names unique; each entry read by `parse` (default `parse_group`)."""
    if not isinstance(raw, list) or not raw:
        fail(file, "groups", "expected a non-empty list", raw)
    groups = tuple((parse or parse_group)(g, file, f"groups[{i}]") for i, g in enumerate(raw))
    names = [g.name for g in groups]
    for name in names:
        if names.count(name) > 1:
            fail(file, "groups", "duplicate group name", name)
    return groups


def parse_profiles(
    raw: Any,
    file: str,
    keys: tuple[str, ...] = PROFILE_KEYS,
    zero_ok: tuple[str, ...] = (),
    text_keys: tuple[str, ...] = (),
    unit_keys: tuple[str, ...] = (),
) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """Profiles: name -> overrides of `keys` (integers >= 1, or >= 0 for those in `zero_ok`, or
    non-empty strings for those in `text_keys`, or numbers in (0, 1) for those in `unit_keys`,
    kept as floats). An integer or string override is kept as written, so the profiles of a
    protocol without `unit_keys` hash as before."""
    raw = read_mapping(raw, file, "profiles")
    profiles = []
    for name, overrides in sorted(raw.items()):
        read_name(name, file, f"profiles.{name}")
        overrides = read_mapping(overrides, file, f"profiles.{name}")
        parsed = {}
        for key, value in overrides.items():
            where = f"profiles.{name}.{key}"
            if key not in keys:
                close = difflib.get_close_matches(str(key), keys, n=1)
                fail(file, where, f"a profile may only set {list(keys)}", key, close[0] if close else None)
            parsed[key] = _profile_value(value, file, where, key, zero_ok, text_keys, unit_keys)
        profiles.append((name, tuple(sorted(parsed.items()))))
    return tuple(profiles)


def _profile_value(
    value: Any,
    file: str,
    where: str,
    key: str,
    zero_ok: tuple[str, ...],
    text_keys: tuple[str, ...],
    unit_keys: tuple[str, ...],
) -> Any:
    """One profile override read by its key's kind (see `parse_profiles`)."""
    if key in text_keys:
        return read_str(value, file, where)
    if key in unit_keys:
        return read_unit(value, file, where)
    return read_int(value, file, where, minimum=0 if key in zero_ok else 1)


def resolve(protocol: AnyProtocol, profile: str | None) -> AnyProtocol:
    """Apply a profile's overrides; None keeps the protocol's own values. Works for every protocol
    dataclass with `name`, `hash`, `profiles` ((name, overrides) pairs), `profile` and `file_hash`."""
    if profile is None:
        return protocol
    profiles = dict(protocol.profiles)
    if profile not in profiles:
        close = difflib.get_close_matches(profile, list(profiles), n=1)
        fail(
            protocol.name,
            "profile",
            f"unknown profile, choose from {sorted(profiles)}",
            profile,
            close[0] if close else None,
        )
    return dataclasses.replace(protocol, profile=profile, file_hash=protocol.hash, **dict(profiles[profile]))
