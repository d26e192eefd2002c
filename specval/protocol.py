"""Protocol: a pre-registered YAML file parsed into frozen dataclasses.

A protocol holds everything decided before any data exists: the system under test, the model,
the prompt, the sampling parameters, the groups, the sample sizes, the tests and their roles,
alpha and the multiplicity correction. Guarantees:

- Unknown keys are errors naming the key, the file and the closest valid key.
- Missing required keys and bad values are errors naming the key, the value and the file.
- `Protocol.hash` is the sha256 of the canonical JSON of the parsed protocol (sorted keys, fixed
  separators): comments, whitespace and key order never change it; any value does.
- `confirmation` (one stage by default) is left out of the canonical form at its default, so a
  one-stage protocol hashes exactly as before the key existed; a two-stage block enters the hash.
  Likewise `sampling.semantics` (pinned filter semantics) enters the canonical form only when set.
- Profiles (`ci`, `full`) override a fixed set of scale keys inside one file; `resolve` applies one.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, TypeVar

import yaml

from specval.semantics import CHOICES as SEMANTICS_CHOICES

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]*$")
TEST_KINDS = ("gof", "homogeneity", "quadrature")
ROLES = ("control", "primary", "secondary")
GATING_ROLES = ("control", "primary")
MULTIPLICITY_METHODS = ("holm",)
NOSPEC_MODE = "nospec"
MAX_POSITIONS = 3
PROFILE_KEYS = ("samples_per_group", "chunk_size", "batch_size")
LOCK_FILE_NAME = "frozen.lock"
MAX_STAGES = 2
AnyProtocol = TypeVar("AnyProtocol")  # a protocol dataclass: Protocol or a quality protocol


class ProtocolError(ValueError):
    """Bad protocol input: the message names the file, the key, the value and a suggestion."""


def _fail(file: str, key: str, message: str, value: Any = None, suggestion: str | None = None):
    text = f"{file}: {key}: {message}"
    if value is not None:
        text += f" (got {value!r})"
    if suggestion:
        text += f"; did you mean {suggestion!r}?"
    raise ProtocolError(text)


@dataclass(frozen=True)
class SutSpec:
    """Which system under test runs the protocol, and how it is configured."""

    adapter: str = "engine"  # "engine" or "package.module:ClassName" or an entry point name
    model: str = "looped"
    dtype: str = "float32"
    device: str = "cpu"
    options: tuple[tuple[str, Any], ...] = ()  # free-form (key, value) pairs passed to the adapter


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
        out = {"temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p}
        if self.semantics:
            out["semantics"] = dict(self.semantics)
        return out


@dataclass(frozen=True)
class GroupSpec:
    """One arm of the experiment: an engine mode and its draft depth."""

    name: str
    mode: str
    draft_loops: int | None = None

    @property
    def is_speculative(self) -> bool:
        return self.mode != NOSPEC_MODE


@dataclass(frozen=True)
class TestSpec:
    """One statistical test applied to some groups; its criteria gate the run by `role`."""

    kind: str
    role: str
    position: int | None = None
    groups: tuple[str, ...] = ()  # empty: every applicable group
    baseline: str | None = None  # homogeneity: the group compared against
    tol: float = 1e-9  # quadrature: max |law - p| allowed
    by_path: bool = False  # gof: strata of (t_1..t_{k-1}, how each was produced)

    @property
    def name(self) -> str:
        if self.kind == "quadrature":
            return self.kind
        return f"t{self.position}_{self.kind}" + ("_by_path" if self.by_path else "")


@dataclass(frozen=True)
class ConfirmationSpec:
    """Pre-registered confirmation: with `stages == 2`, a run whose first stage FAILs a p-valued
    gating criterion collects a second stage on fresh disjoint seeds and FAILs only if the same
    criterion fails there too (at level `alpha_stage2`; None: the protocol's alpha)."""

    stages: int = 1
    alpha_stage2: float | None = None

    @property
    def is_two_stage(self) -> bool:
        return self.stages == MAX_STAGES


ONE_STAGE = ConfirmationSpec()


@dataclass(frozen=True)
class Protocol:
    """A parsed protocol; `profile` is set once a profile has been applied by `resolve`."""

    name: str
    prompt: str
    sampling: SamplingSpec
    num_speculative_tokens: int
    positions: int
    groups: tuple[GroupSpec, ...]
    samples_per_group: int
    tests: tuple[TestSpec, ...]
    description: str = ""
    sut: SutSpec = SutSpec()
    seed_base: int = 0
    alpha: float = 0.01
    power: float = 0.8
    stratum_min: int = 200
    min_expected: float = 5.0
    multiplicity: str = "holm"
    confirmatory: bool = False
    draft_headroom: bool = True
    chunk_size: int = 1000
    batch_size: int = 1000
    confirmation: ConfirmationSpec = ONE_STAGE
    profiles: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    profile: str | None = field(default=None, compare=False)
    file_hash: str | None = field(default=None, compare=False, repr=False)  # set by `resolve`

    def max_tokens(self, group: GroupSpec) -> int:
        """Tokens each request generates: the tested positions, plus K for a speculative group when
        `draft_headroom` is on, so that no round's drafts are cut short by the length limit."""
        extra = self.num_speculative_tokens if group.is_speculative and self.draft_headroom else 0
        return self.positions + extra

    def group(self, name: str) -> GroupSpec:
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form (profile excluded): for an unresolved protocol, the input of the hash."""
        out = plain_form(self)
        if self.confirmation == ONE_STAGE:
            out.pop("confirmation")  # keeps the hash of every one-stage protocol as it was
        return out

    @property
    def alpha_stage2(self) -> float:
        """Level of the second stage (the protocol's alpha unless the confirmation block sets one)."""
        return self.alpha if self.confirmation.alpha_stage2 is None else self.confirmation.alpha_stage2

    @property
    def hash(self) -> str:
        """Canonical hash of the protocol as written in its file (profiles do not change it)."""
        return self.file_hash or canonical_hash(self.to_dict())


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def plain_form(protocol: Any) -> dict[str, Any]:
    """The JSON-able form every protocol kind starts its `to_dict` from: its dataclass fields as
    plain values without `profile` and `file_hash`, `sut.options` and `profiles` as mappings, and
    `sampling` in its own plain form (`SamplingSpec.to_dict`)."""
    out = _plain(dataclasses.asdict(protocol))
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


# ---------------------------------------------------------------- generic mapping -> dataclass


def _check_keys(raw: Mapping, cls: type, file: str, where: str) -> None:
    names = [f.name for f in dataclasses.fields(cls) if f.name not in ("profile", "file_hash")]
    for key in raw:
        if key not in names:
            close = difflib.get_close_matches(str(key), names, n=1)
            _fail(file, _join(where, key), "unknown key", suggestion=close[0] if close else None)
    for f in dataclasses.fields(cls):
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if required and f.name not in raw:
            _fail(file, _join(where, f.name), "missing required key")


def _join(where: str, key: Any) -> str:
    return f"{where}.{key}" if where else str(key)


def _mapping(raw: Any, file: str, where: str) -> Mapping:
    if not isinstance(raw, Mapping):
        _fail(file, where or "<top level>", "expected a mapping", raw)
    return raw


def _int(value: Any, file: str, key: str, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        _fail(file, key, "expected an integer", value)
    if minimum is not None and value < minimum:
        _fail(file, key, f"must be >= {minimum}", value)
    return value


def _float(value: Any, file: str, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        _fail(file, key, "expected a number", value)
    if not math.isfinite(value):
        _fail(file, key, "expected a finite number", value)
    return float(value)


def _str(value: Any, file: str, key: str, choices: tuple[str, ...] | None = None) -> str:
    if not isinstance(value, str) or not value:
        _fail(file, key, "expected a non-empty string", value)
    if choices is not None and value not in choices:
        close = difflib.get_close_matches(value, choices, n=1)
        _fail(file, key, f"must be one of {list(choices)}", value, close[0] if close else None)
    return value


def _name(value: Any, file: str, key: str) -> str:
    _str(value, file, key)
    if not NAME_PATTERN.match(value):
        _fail(file, key, "must match [a-z][a-z0-9_]*", value)
    return value


def _unit_open(value: Any, file: str, key: str, upper_closed: bool = False) -> float:
    number = _float(value, file, key)
    ok = 0.0 < number < 1.0 or (upper_closed and number == 1.0)
    if not ok:
        _fail(file, key, "must lie in (0, 1]" if upper_closed else "must lie in (0, 1)", value)
    return number


# ---------------------------------------------------------------- sections


def _parse_sut(raw: Any, file: str) -> SutSpec:
    raw = _mapping(raw, file, "sut")
    _check_keys(raw, SutSpec, file, "sut")
    options = _mapping(raw.get("options", {}), file, "sut.options")
    return SutSpec(
        adapter=_str(raw.get("adapter", "engine"), file, "sut.adapter"),
        model=_str(raw.get("model", "looped"), file, "sut.model"),
        dtype=_str(raw.get("dtype", "float32"), file, "sut.dtype"),
        device=_str(raw.get("device", "cpu"), file, "sut.device"),
        options=tuple(sorted((str(k), v) for k, v in options.items())),
    )


def _parse_sampling(raw: Any, file: str) -> SamplingSpec:
    raw = _mapping(raw, file, "sampling")
    _check_keys(raw, SamplingSpec, file, "sampling")
    temperature = _float(raw["temperature"], file, "sampling.temperature")
    if not temperature > 0.0:
        _fail(file, "sampling.temperature", "must be > 0 (greedy decoding has no distribution)", raw["temperature"])
    top_k = _int(raw.get("top_k", -1), file, "sampling.top_k", minimum=-1)
    top_p = _unit_open(raw.get("top_p", 1.0), file, "sampling.top_p", upper_closed=True)
    return SamplingSpec(temperature=temperature, top_k=top_k, top_p=top_p,
                        semantics=_parse_semantics(raw.get("semantics", {}), file))


def _parse_semantics(raw: Any, file: str) -> tuple[tuple[str, str], ...]:
    """The pinned filter semantics: each key a field of FilterSemantics, each value one of its choices."""
    raw = _mapping(raw, file, "sampling.semantics")
    pins = []
    for key, value in raw.items():
        where = f"sampling.semantics.{key}"
        if key not in SEMANTICS_CHOICES:
            close = difflib.get_close_matches(str(key), list(SEMANTICS_CHOICES), n=1)
            _fail(file, where, "unknown key", suggestion=close[0] if close else None)
        pins.append((key, _str(value, file, where, SEMANTICS_CHOICES[key])))
    return tuple(sorted(pins))


def _draft_loops(raw: dict, file: str, where: str) -> int | None:
    """`where.draft_loops` of a group or an arm: absent (the engine's default) or an integer >= 1."""
    value = raw.get("draft_loops")
    return None if value is None else _int(value, file, f"{where}.draft_loops", minimum=1)


def _parse_group(raw: Any, file: str, where: str) -> GroupSpec:
    raw = _mapping(raw, file, where)
    _check_keys(raw, GroupSpec, file, where)
    return GroupSpec(
        name=_name(raw["name"], file, f"{where}.name"),
        mode=_name(raw["mode"], file, f"{where}.mode"),
        draft_loops=_draft_loops(raw, file, where),
    )


def _parse_groups(raw: Any, file: str) -> tuple[GroupSpec, ...]:
    if not isinstance(raw, list) or not raw:
        _fail(file, "groups", "expected a non-empty list", raw)
    groups = tuple(_parse_group(g, file, f"groups[{i}]") for i, g in enumerate(raw))
    names = [g.name for g in groups]
    for name in names:
        if names.count(name) > 1:
            _fail(file, "groups", "duplicate group name", name)
    return groups


def _parse_test(raw: Any, file: str, where: str, groups: tuple[GroupSpec, ...], positions: int) -> TestSpec:
    raw = _mapping(raw, file, where)
    _check_keys(raw, TestSpec, file, where)
    kind = _str(raw["kind"], file, f"{where}.kind", TEST_KINDS)
    role = _str(raw["role"], file, f"{where}.role", ROLES)
    group_names = tuple(g.name for g in groups)
    listed = raw.get("groups", [])
    if not isinstance(listed, list):
        _fail(file, f"{where}.groups", "expected a list of group names", listed)
    for name in listed:
        _str(name, file, f"{where}.groups", group_names)
    position = raw.get("position")
    if kind != "quadrature":
        position = _int(position, file, f"{where}.position", minimum=1)
        if position > positions:
            _fail(file, f"{where}.position", f"exceeds positions ({positions})", position)
    elif position is not None:
        _fail(file, f"{where}.position", "quadrature tests the single-draft step and takes no position", position)
    baseline = raw.get("baseline")
    if kind == "homogeneity":
        baseline = _str(baseline, file, f"{where}.baseline", group_names)
    elif baseline is not None:
        _fail(file, f"{where}.baseline", "only homogeneity tests take a baseline", baseline)
    if kind != "gof":
        for name in listed:
            group = next(g for g in groups if g.name == name)
            if not group.is_speculative or name == baseline:
                _fail(file, f"{where}.groups", f"{kind} applies to speculative groups other than the baseline", name)
    tol = _float(raw.get("tol", 1e-9), file, f"{where}.tol")
    if not tol > 0.0:
        _fail(file, f"{where}.tol", "must be > 0", raw.get("tol"))
    by_path = _bool(raw.get("by_path", False), file, f"{where}.by_path")
    if by_path and kind != "gof":
        _fail(file, f"{where}.by_path", "only gof tests take path-aware strata", by_path)
    return TestSpec(kind=kind, role=role, position=position, groups=tuple(listed), baseline=baseline, tol=tol,
                    by_path=by_path)


def _parse_tests(raw: Any, file: str, groups: tuple[GroupSpec, ...], positions: int) -> tuple[TestSpec, ...]:
    if not isinstance(raw, list) or not raw:
        _fail(file, "tests", "expected a non-empty list", raw)
    tests = tuple(_parse_test(t, file, f"tests[{i}]", groups, positions) for i, t in enumerate(raw))
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for test in tests:
        ident = (test.name, test.groups)
        if ident in seen:
            _fail(file, "tests", "duplicate test (same kind, position and groups)", test.name)
        seen.add(ident)
    return tests


def _parse_confirmation(raw: Any, file: str) -> ConfirmationSpec:
    raw = _mapping(raw, file, "confirmation")
    _check_keys(raw, ConfirmationSpec, file, "confirmation")
    stages = _int(raw.get("stages", 1), file, "confirmation.stages", minimum=1)
    if stages > MAX_STAGES:
        _fail(file, "confirmation.stages", f"at most {MAX_STAGES} stages are supported", stages)
    alpha_stage2 = raw.get("alpha_stage2")
    if alpha_stage2 is not None:
        alpha_stage2 = _unit_open(alpha_stage2, file, "confirmation.alpha_stage2")
        if stages == 1:
            _fail(file, "confirmation.alpha_stage2", "only a two-stage protocol (stages: 2) takes a second-stage alpha",
                  alpha_stage2)
    return ConfirmationSpec(stages=stages, alpha_stage2=alpha_stage2)


def _parse_profiles(raw: Any, file: str, keys: tuple[str, ...] = PROFILE_KEYS,
                    zero_ok: tuple[str, ...] = (), text_keys: tuple[str, ...] = ()
                    ) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """Profiles: name -> overrides of `keys` (integers >= 1, or >= 0 for those in `zero_ok`, or
    non-empty strings for those in `text_keys`)."""
    raw = _mapping(raw, file, "profiles")
    profiles = []
    for name, overrides in sorted(raw.items()):
        _name(name, file, f"profiles.{name}")
        overrides = _mapping(overrides, file, f"profiles.{name}")
        for key, value in overrides.items():
            where = f"profiles.{name}.{key}"
            if key not in keys:
                close = difflib.get_close_matches(str(key), keys, n=1)
                _fail(file, where, f"a profile may only set {list(keys)}", key, close[0] if close else None)
            if key in text_keys:
                _str(value, file, where)
            else:
                _int(value, file, where, minimum=0 if key in zero_ok else 1)
        profiles.append((name, tuple(sorted(overrides.items()))))
    return tuple(profiles)


# ---------------------------------------------------------------- top level


def parse_protocol(raw: Any, file: str = "<protocol>") -> Protocol:
    """Parse a YAML mapping into a Protocol; raises ProtocolError naming file, key and value."""
    raw = _mapping(raw, file, "")
    if "kind" in raw:  # a quality or performance protocol given to a command of statistical ones
        _fail(file, "kind", "this command takes statistical protocols (no `kind` key); run a protocol of another "
                            "kind with `specval run` (performance: also `specval bench`)", raw["kind"])
    _check_keys(raw, Protocol, file, "")
    positions = _int(raw["positions"], file, "positions", minimum=1)
    if positions > MAX_POSITIONS:
        _fail(file, "positions", f"at most {MAX_POSITIONS} positions are supported", positions)
    groups = _parse_groups(raw["groups"], file)
    protocol = Protocol(
        name=_name(raw["name"], file, "name"),
        description=str(raw.get("description", "")),
        sut=_parse_sut(raw.get("sut", {}), file),
        prompt=_str(raw["prompt"], file, "prompt"),
        sampling=_parse_sampling(raw["sampling"], file),
        num_speculative_tokens=_int(raw["num_speculative_tokens"], file, "num_speculative_tokens", minimum=1),
        positions=positions,
        groups=groups,
        samples_per_group=_int(raw["samples_per_group"], file, "samples_per_group", minimum=1),
        tests=_parse_tests(raw["tests"], file, groups, positions),
        seed_base=_int(raw.get("seed_base", 0), file, "seed_base", minimum=0),
        alpha=_unit_open(raw.get("alpha", 0.01), file, "alpha"),
        power=_unit_open(raw.get("power", 0.8), file, "power"),
        stratum_min=_int(raw.get("stratum_min", 200), file, "stratum_min", minimum=1),
        min_expected=_float(raw.get("min_expected", 5.0), file, "min_expected"),
        multiplicity=_str(raw.get("multiplicity", "holm"), file, "multiplicity", MULTIPLICITY_METHODS),
        confirmatory=_bool(raw.get("confirmatory", False), file, "confirmatory"),
        draft_headroom=_bool(raw.get("draft_headroom", True), file, "draft_headroom"),
        chunk_size=_int(raw.get("chunk_size", 1000), file, "chunk_size", minimum=1),
        batch_size=_int(raw.get("batch_size", 1000), file, "batch_size", minimum=1),
        confirmation=_parse_confirmation(raw.get("confirmation", {}), file),
        profiles=_parse_profiles(raw.get("profiles", {}), file),
    )
    if not protocol.min_expected > 0.0:
        _fail(file, "min_expected", "must be > 0", raw.get("min_expected"))
    return protocol


def _bool(value: Any, file: str, key: str) -> bool:
    if not isinstance(value, bool):
        _fail(file, key, "expected true or false", value)
    return value


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (YAML's default keeps the last)
    and remembers the line of every mapping key (`_KeyLines`), so errors can point at the file."""


class _DuplicateKey(yaml.YAMLError):
    """A mapping key given twice; the message names both lines."""


class _KeyLines(dict):
    """A parsed mapping with `lines`: key -> 1-based line of the key in the file."""

    lines: dict[Any, int]


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> _KeyLines:
    loader.flatten_mapping(node)
    out, lines = _KeyLines(), {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        if key in lines:
            raise _DuplicateKey(f"key {key!r} given twice (lines {lines[key]} and {line}); "
                                "a pre-registered protocol must say each thing once")
        lines[key] = line
        out[key] = loader.construct_object(value_node, deep=deep)
    out.lines = lines
    return out


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def read_yaml(path: str | Path) -> Any:
    """The parsed YAML of a protocol file; unreadable files, YAML syntax errors and keys given
    twice in one mapping become ProtocolError naming the file (and both lines of a duplicate)."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ProtocolError(f"{path}: cannot read protocol ({err.strerror})") from err
    except UnicodeDecodeError as err:
        raise ProtocolError(f"{path}: not a text file ({err.reason})") from err
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except _DuplicateKey as err:
        raise ProtocolError(f"{path}: {err}") from err
    except yaml.YAMLError as err:
        raise ProtocolError(f"{path}: invalid YAML: {err}") from err


def line_of(raw: Any, key_path: tuple[Any, ...]) -> int | None:
    """1-based line of the key at `key_path` (e.g. ("groups", 2, "mode")) in a mapping returned by
    `read_yaml`; the deepest key found on the way when the full path is absent; None if none."""
    line, node = None, raw
    for key in key_path:
        if isinstance(node, _KeyLines) and key in node:
            line, node = node.lines[key], node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            break
    return line


def load_protocol(path: str | Path) -> Protocol:
    """Read and parse a protocol file; YAML syntax errors become ProtocolError too."""
    return parse_protocol(read_yaml(path), str(path))


def resolve(protocol: AnyProtocol, profile: str | None) -> AnyProtocol:
    """Apply a profile's overrides; None keeps the protocol's own values. Works for every protocol
    dataclass with `name`, `hash`, `profiles` ((name, overrides) pairs), `profile` and `file_hash`."""
    if profile is None:
        return protocol
    profiles = dict(protocol.profiles)
    if profile not in profiles:
        close = difflib.get_close_matches(profile, list(profiles), n=1)
        _fail(protocol.name, "profile", f"unknown profile, choose from {sorted(profiles)}", profile,
              close[0] if close else None)
    return dataclasses.replace(protocol, profile=profile, file_hash=protocol.hash, **dict(profiles[profile]))


# ---------------------------------------------------------------- freeze


def lock_path(protocol_file: str | Path) -> Path:
    """The lock file kept in git next to the protocol files."""
    return Path(protocol_file).parent / LOCK_FILE_NAME


def read_lock(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ProtocolError(f"{path}: lock file is not valid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ProtocolError(f"{path}: lock file must map protocol name -> hash")
    return data


def freeze(protocol_file: str | Path,
           loader: Callable[[str | Path], Any] | None = None) -> tuple[Path, str]:
    """Record the protocol's canonical hash in the lock file; returns (lock file, hash).
    `loader` parses the file (default `load_protocol`; quality protocols pass their own)."""
    protocol = (loader or load_protocol)(protocol_file)
    path = lock_path(protocol_file)
    lock = read_lock(path)
    lock[protocol.name] = protocol.hash
    path.write_text(json.dumps(lock, indent=2, sort_keys=True) + "\n")
    return path, protocol.hash


FROZEN, CHANGED, NOT_FROZEN = "frozen", "changed since frozen", "not frozen"


def registration(protocol: Any, protocol_file: str | Path) -> str:
    """FROZEN if the lock next to the file holds the protocol's hash, CHANGED if it holds another
    hash for the same name, NOT_FROZEN if it holds none."""
    frozen = read_lock(lock_path(protocol_file)).get(protocol.name)
    if frozen is None:
        return NOT_FROZEN
    return FROZEN if frozen == protocol.hash else CHANGED


def check_registered(protocol: Any, protocol_file: str | Path, exploratory: bool) -> str:
    """The registration state; ProtocolError unless FROZEN or the run is declared `exploratory`."""
    state = registration(protocol, protocol_file)
    if state != FROZEN and not exploratory:
        raise ProtocolError(f"{protocol_file}: protocol {protocol.name!r} is {state} in {lock_path(protocol_file)}; "
                            f"run `specval freeze {protocol_file}` to pre-register it, or pass --exploratory "
                            "(the verdict is then marked EXPLORATORY)")
    return state
