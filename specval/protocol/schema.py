"""Schema of a distribution protocol (no top-level `kind`): a pre-registered YAML file parsed into
frozen dataclasses.

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
- `sequential` (pre-registered looks, `SequentialSpec`) enters the canonical form only when present,
  so a protocol without looks keeps its hash.
- Profiles (`ci`, `full`) override a fixed set of scale keys inside one file; `resolve` applies one.
- Every number is range-checked as it is read, against what the run can test: a protocol whose
  levels need more Monte Carlo draws than a run can make, whose power does not exceed its level,
  or whose sample size (in any profile) cannot fill two cells of min_expected is refused here,
  before any seed is claimed (`_check_testable`).

The parts shared with the other kinds live beside it: `readers`, `sections`, `canonical`,
`strict_yaml`, `registration`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specval.protocol.canonical import canonical_hash, plain_form
from specval.protocol.readers import (
    check_keys,
    fail,
    read_bool,
    read_bounded,
    read_float,
    read_int,
    read_mapping,
    read_name,
    read_str,
    read_unit,
)
from specval.protocol.sections import (
    GroupSpec,
    SamplingSpec,
    SutSpec,
    parse_groups,
    parse_profiles,
    parse_sampling,
    parse_sut,
)
from specval.protocol.strict_yaml import read_yaml
from specval.stats.sequential import MAX_LOOKS, MIN_LOOKS, POCOCK, SPENDINGS, check_fractions, look_sizes, spend

TEST_KINDS = ("gof", "homogeneity", "quadrature")
ROLES = ("control", "primary", "secondary")
GATING_ROLES = ("control", "primary")
MULTIPLICITY_METHODS = ("holm",)
# t1..t3 after the prompt: the exact reference of t_j is a marginal over V^(j-1) prefixes. Later tokens
# and every round position 1..K+1 (K <= 8) are the sequence kind's (specval/sequence/protocol.py).
MAX_POSITIONS = 3
MAX_STAGES = 2
# alpha (and alpha_stage2): a criterion rejected at level t costs 30 / t Monte Carlo null draws
# (specval.stats.montecarlo.num_draws), 3e7 per criterion at 1e-6 before Holm divides it further;
# below, a FAIL cannot be computed in a run's time (at 1e-300 the draw count overflows).
MIN_ALPHA, MAX_ALPHA = 1e-6, 0.2
# power: above MAX_ALPHA, so that every minimum detectable effect exists (at power <= level none
# does); below 1 by a margin the root finders of specval.stats.power resolve.
MIN_POWER, MAX_POWER = 0.5, 0.9999
MIN_CELLS = 2  # a table needs two cells of expected count >= min_expected to test anything


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
class SequentialSpec:
    """Pre-registered sequential looks: after each fraction of `looks` (strictly increasing, the
    last 1.0) of the planned samples per group, the gating criteria are decided at that look's
    share of alpha (`spending`, `specval.stats.sequential.spend`); the run stops with FAIL at the
    first look that crosses and PASSes only at the last."""

    looks: tuple[float, ...]
    spending: str = POCOCK


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
    sequential: SequentialSpec | None = None
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
        if self.sequential is None:
            out.pop("sequential")  # keeps the hash of every protocol without looks as it was
        return out

    @property
    def alpha_stage2(self) -> float:
        """Level of the second stage (the protocol's alpha unless the confirmation block sets one)."""
        return self.alpha if self.confirmation.alpha_stage2 is None else self.confirmation.alpha_stage2

    @property
    def hash(self) -> str:
        """Canonical hash of the protocol as written in its file (profiles do not change it)."""
        return self.file_hash or canonical_hash(self.to_dict())


def _parse_test(raw: Any, file: str, where: str, groups: tuple[GroupSpec, ...], positions: int) -> TestSpec:
    raw = read_mapping(raw, file, where)
    check_keys(raw, TestSpec, file, where)
    kind = read_str(raw["kind"], file, f"{where}.kind", TEST_KINDS)
    role = read_str(raw["role"], file, f"{where}.role", ROLES)
    group_names = tuple(g.name for g in groups)
    listed = raw.get("groups", [])
    if not isinstance(listed, list):
        fail(file, f"{where}.groups", "expected a list of group names", listed)
    for name in listed:
        read_str(name, file, f"{where}.groups", group_names)
    position = raw.get("position")
    if kind != "quadrature":
        position = read_int(position, file, f"{where}.position", minimum=1)
        if position > positions:
            fail(file, f"{where}.position", f"exceeds positions ({positions})", position)
    elif position is not None:
        fail(file, f"{where}.position", "quadrature tests the single-draft step and takes no position", position)
    baseline = raw.get("baseline")
    if kind == "homogeneity":
        baseline = read_str(baseline, file, f"{where}.baseline", group_names)
    elif baseline is not None:
        fail(file, f"{where}.baseline", "only homogeneity tests take a baseline", baseline)
    if kind != "gof":
        _check_compared(kind, listed, groups, baseline, file, where)
    tol = read_float(raw.get("tol", 1e-9), file, f"{where}.tol")
    if not tol > 0.0:
        fail(file, f"{where}.tol", "must be > 0", raw.get("tol"))
    by_path = read_bool(raw.get("by_path", False), file, f"{where}.by_path")
    if by_path and kind != "gof":
        fail(file, f"{where}.by_path", "only gof tests take path-aware strata", by_path)
    return TestSpec(
        kind=kind, role=role, position=position, groups=tuple(listed), baseline=baseline, tol=tol, by_path=by_path
    )


def _check_compared(
    kind: str, listed: list[Any], groups: tuple[GroupSpec, ...], baseline: str | None, file: str, where: str
) -> None:
    """ProtocolError unless every group a quadrature or homogeneity test lists is speculative (or,
    for homogeneity, an option cell of its baseline: `_option_cell`) and is not the baseline."""
    by_name = {g.name: g for g in groups}
    cells = ", or to a group that differs from the baseline only by options" if kind == "homogeneity" else ""
    for name in listed:
        group = by_name[name]
        cell = baseline is not None and kind == "homogeneity" and _option_cell(group, by_name[baseline])
        if not (group.is_speculative or cell) or name == baseline:
            fail(file, f"{where}.groups", f"{kind} applies to speculative groups other than the baseline{cells}", name)


def _option_cell(group: GroupSpec, baseline: GroupSpec) -> bool:
    """True iff `group` runs the baseline's mode and draft depth under other adapter options (a
    cell of the settings matrix: the same law is expected, so homogeneity between them is a test
    of the settings, nospec groups included)."""
    same_cell = (group.mode, group.draft_loops) == (baseline.mode, baseline.draft_loops)
    return same_cell and group.options != baseline.options


def _parse_tests(raw: Any, file: str, groups: tuple[GroupSpec, ...], positions: int) -> tuple[TestSpec, ...]:
    if not isinstance(raw, list) or not raw:
        fail(file, "tests", "expected a non-empty list", raw)
    tests = tuple(_parse_test(t, file, f"tests[{i}]", groups, positions) for i, t in enumerate(raw))
    seen: set[tuple[str, tuple[str, ...]]] = set()
    for test in tests:
        ident = (test.name, test.groups)
        if ident in seen:
            fail(file, "tests", "duplicate test (same kind, position and groups)", test.name)
        seen.add(ident)
    return tests


def _parse_confirmation(raw: Any, file: str) -> ConfirmationSpec:
    raw = read_mapping(raw, file, "confirmation")
    check_keys(raw, ConfirmationSpec, file, "confirmation")
    stages = read_int(raw.get("stages", 1), file, "confirmation.stages", minimum=1)
    if stages > MAX_STAGES:
        fail(file, "confirmation.stages", f"at most {MAX_STAGES} stages are supported", stages)
    alpha_stage2 = raw.get("alpha_stage2")
    if alpha_stage2 is not None:
        alpha_stage2 = _read_alpha(alpha_stage2, file, "confirmation.alpha_stage2")
        if stages == 1:
            fail(
                file,
                "confirmation.alpha_stage2",
                "only a two-stage protocol (stages: 2) takes a second-stage alpha",
                alpha_stage2,
            )
    return ConfirmationSpec(stages=stages, alpha_stage2=alpha_stage2)


def parse_sequential(raw: Any, file: str) -> SequentialSpec | None:
    """The `sequential` block of a protocol of any kind that takes looks (None when absent):
    ProtocolError naming `sequential.looks` or `sequential.spending`, the value and the file."""
    if raw is None:
        return None
    raw = read_mapping(raw, file, "sequential")
    check_keys(raw, SequentialSpec, file, "sequential")
    looks = raw["looks"]
    if not isinstance(looks, list) or not MIN_LOOKS <= len(looks) <= MAX_LOOKS:
        fail(
            file,
            "sequential.looks",
            f"expected a list of {MIN_LOOKS} to {MAX_LOOKS} fractions of the planned "
            "samples (one look is the fixed-size design: leave `sequential` out)",
            looks,
        )
    fractions = tuple(read_unit(f, file, f"sequential.looks[{i}]", upper_closed=True) for i, f in enumerate(looks))
    try:
        check_fractions(fractions)
    except ValueError as err:
        fail(file, "sequential.looks", str(err).removeprefix("looks: ").split(", got")[0], looks)
    spending = read_str(raw.get("spending", POCOCK), file, "sequential.spending", SPENDINGS)
    return SequentialSpec(looks=fractions, spending=spending)


def parse_protocol(raw: Any, file: str = "<protocol>") -> Protocol:
    """Parse a YAML mapping into a Protocol; raises ProtocolError naming file, key and value."""
    raw = read_mapping(raw, file, "")
    if "kind" in raw:  # a quality or performance protocol given to a command of statistical ones
        fail(
            file,
            "kind",
            "this command takes statistical protocols (no `kind` key); run a protocol of another "
            "kind with `specval run` (performance: also `specval bench`)",
            raw["kind"],
        )
    check_keys(raw, Protocol, file, "")
    positions = read_int(raw["positions"], file, "positions", minimum=1)
    if positions > MAX_POSITIONS:
        fail(
            file,
            "positions",
            f"at most {MAX_POSITIONS} positions are supported (the exact reference of "
            f"t_j sums over V^(j-1) prefixes); a `kind: sequence` protocol tests every "
            f"token and round position 1..K+1",
            positions,
        )
    groups = parse_groups(raw["groups"], file)
    protocol = Protocol(
        name=read_name(raw["name"], file, "name"),
        description=str(raw.get("description", "")),
        sut=parse_sut(raw.get("sut", {}), file),
        prompt=read_str(raw["prompt"], file, "prompt"),
        sampling=parse_sampling(raw["sampling"], file),
        num_speculative_tokens=read_int(raw["num_speculative_tokens"], file, "num_speculative_tokens", minimum=1),
        positions=positions,
        groups=groups,
        samples_per_group=read_int(raw["samples_per_group"], file, "samples_per_group", minimum=1),
        tests=_parse_tests(raw["tests"], file, groups, positions),
        seed_base=read_int(raw.get("seed_base", 0), file, "seed_base", minimum=0),
        alpha=_read_alpha(raw.get("alpha", 0.01), file, "alpha"),
        power=read_bounded(
            raw.get("power", 0.8), file, "power", MIN_POWER, MAX_POWER, "every minimum detectable effect must exist"
        ),
        stratum_min=read_int(raw.get("stratum_min", 200), file, "stratum_min", minimum=1),
        min_expected=read_float(raw.get("min_expected", 5.0), file, "min_expected"),
        multiplicity=read_str(raw.get("multiplicity", "holm"), file, "multiplicity", MULTIPLICITY_METHODS),
        confirmatory=read_bool(raw.get("confirmatory", False), file, "confirmatory"),
        draft_headroom=read_bool(raw.get("draft_headroom", True), file, "draft_headroom"),
        chunk_size=read_int(raw.get("chunk_size", 1000), file, "chunk_size", minimum=1),
        batch_size=read_int(raw.get("batch_size", 1000), file, "batch_size", minimum=1),
        confirmation=_parse_confirmation(raw.get("confirmation", {}), file),
        sequential=parse_sequential(raw.get("sequential"), file),
        profiles=parse_profiles(raw.get("profiles", {}), file),
    )
    if not protocol.min_expected > 0.0:
        fail(file, "min_expected", "must be > 0", raw.get("min_expected"))
    _check_testable(protocol, file)
    _check_looks(protocol, file)
    return protocol


def _read_alpha(value: Any, file: str, key: str) -> float:
    return read_bounded(value, file, key, MIN_ALPHA, MAX_ALPHA, "the Monte Carlo draws a level needs are bounded")


def _check_testable(protocol: Protocol, file: str) -> None:
    """ProtocolError unless every profile's sample size can fill MIN_CELLS cells of expected count
    >= min_expected (fewer samples pool every table into one cell: nothing could be tested)."""
    for key, size in _profile_sizes(protocol):
        if size < MIN_CELLS * protocol.min_expected:
            fail(
                file,
                "min_expected",
                f"{MIN_CELLS} cells of this expected count need more samples than {key} "
                f"({size}): every table would pool into one cell and nothing could be tested",
                protocol.min_expected,
            )


def _profile_sizes(protocol: Protocol) -> list[tuple[str, int]]:
    """(key, samples per group) of the protocol and of every profile that sets its own."""
    sizes = [("samples_per_group", protocol.samples_per_group)]
    return sizes + [
        (f"profiles.{name}.samples_per_group", dict(overrides)["samples_per_group"])
        for name, overrides in protocol.profiles
        if "samples_per_group" in dict(overrides)
    ]


def _check_looks(protocol: Protocol, file: str) -> None:
    """ProtocolError unless every look of every profile sees more samples than the one before, and
    every look's level (alpha and alpha_stage2 spent) is one a Monte Carlo p-value resolves."""
    if protocol.sequential is None:
        return
    looks = protocol.sequential.looks
    for key, size in _profile_sizes(protocol):
        try:
            first = look_sizes(size, looks)[0]
        except ValueError as err:
            fail(file, "sequential.looks", f"{key} = {size} is too small for these looks ({err})", list(looks))
        if first < MIN_CELLS * protocol.min_expected:
            fail(
                file,
                "sequential.looks",
                f"the first look sees {first} of {key} = {size} samples per group, too "
                f"few to fill {MIN_CELLS} cells of expected count {protocol.min_expected:g}",
                list(looks),
            )
    alphas = [("alpha", protocol.alpha)] + (
        [("confirmation.alpha_stage2", protocol.alpha_stage2)] if protocol.confirmation.is_two_stage else []
    )
    for key, alpha in alphas:
        smallest = min(spend(alpha, looks, protocol.sequential.spending).levels)
        if smallest < MIN_ALPHA:
            fail(
                file,
                "sequential.spending",
                f"spends {key} = {alpha:g} down to a look level of {smallest:.3g}, below "
                f"{MIN_ALPHA:g} (the Monte Carlo draws a level needs are bounded)",
                protocol.sequential.spending,
            )


def load_protocol(path: str | Path) -> Protocol:
    """Read and parse a protocol file; YAML syntax errors become ProtocolError too."""
    return parse_protocol(read_yaml(path), str(path))
