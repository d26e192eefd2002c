"""Sequence protocol: the pre-registered YAML of a whole-sequence check (top-level `kind: sequence`).

A sequence protocol collects long sequences (every committed token of many rounds, after several
prompts) from each group and tests every token against the target's conditional law given its
ACTUAL prefix (`specval.sequence.reference`), every round position 1..K+1 (the bonus included),
serial dependence within a sequence and independence between requests of one batch
(`specval.sequence.verdict`). Groups may replace the draft (`draft`: own, noisy, adversarial,
temperature) to show that the committed law does not depend on the draft, and may share every
batch with companion requests of other sampling parameters (`companions`: greedy rows or rows of
another temperature, top-k or top-p) to show that a request's law does not depend on its neighbours.

Layout of the requests, fixed by the protocol: a group's requests run in calls ("batches") of
`batch_size` requests that the SUT runs together, batch b after prompt b mod P (P prompts), row r
in slot r. Pairs for the independence tests are (a) adjacent slots 2i, 2i + 1 of one batch and
(b) one slot of batches b and b + P (the same prompt, another batch). A group with companions runs
2 x batch_size requests per call: the tested ones in slots 0..B-1 and one companion per tested
request in slots B..2B-1, companion j with sampling `companions[j mod C]` and seed
COMPANION_SEED_BIT | (its tested partner's seed), a seed outside every claimed range.

Sequential looks (`sequential: {looks, spending}`, the distribution kind's schema): look k decides
on the first ceil(t_k x N / B) whole batches of every group (`look_batches`), at its share of alpha;
`specval.sequence.looks` collects and decides them. Absent, the protocol hashes as before the key.

Guarantees (as for the other kinds): unknown keys and bad values raise ProtocolError naming the
file, the key and the value; `hash` is the canonical sha256 of the parsed file; profiles do not
change it (`resolve`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specval.protocol.canonical import canonical_hash, plain_form
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
from specval.protocol.schema import GATING_ROLES, MIN_ALPHA, ROLES, SequentialSpec, parse_sequential
from specval.protocol.sections import (
    MIN_TEMPERATURE,
    GroupSpec,
    SamplingSpec,
    SutSpec,
    parse_groups,
    parse_profiles,
    parse_sampling,
    parse_sut,
    read_group_options,
)
from specval.protocol.sections import resolve as resolve_profile
from specval.protocol.strict_yaml import read_yaml
from specval.stats.sequential import look_sizes, spend
from specval.sut import DRAFT_OVERRIDES as DRAFTS
from specval.sut import OWN_DRAFT

SEQUENCE_KIND = "sequence"
TEST_KINDS = ("pit", "serial", "independence", "reproducibility", "source", "drafts")
SOURCE_KIND = "source"  # white box: each token against its source's law (needs `SUT.draft_logits_along`)
DRAFTS_KIND = "drafts"  # white box: the drafted tokens against q (needs `SampleBatch.drafts` too)
DRAFT_KINDS = (SOURCE_KIND, DRAFTS_KIND)  # test kinds that read the draft's q: speculative groups only
DETERMINISTIC_KINDS = ("reproducibility",)
MAX_SPECULATIVE_TOKENS = 8  # K: round positions 1..K+1 are tested as buckets
MAX_SEQUENCE_LENGTH = 1024
MIN_SEQUENCE_LENGTH = 2  # serial dependence needs pairs within a sequence
PROFILE_KEYS = ("sequences_per_group", "batch_size", "sequence_length")
DEFAULT_SUPPORT_TOLERANCE = 1e-4  # logits: a token is out of support only if a boost of this many keeps it out
COMPANION_SEED_BIT = 1 << 62  # companion seeds: the partner's seed with this bit set (claimed ranges stay below)
MAX_COMPANION_SAMPLINGS = 8
COMPANION_KEYS = ("temperature", "top_k", "top_p")


@dataclass(frozen=True)
class SequenceGroup(GroupSpec):
    """A group of a sequence protocol: an engine mode, its draft depth, the draft it runs (`own`:
    the SUT's own draft; any other needs the adapter's `draft_overrides` capability) and the
    sampling of the companion requests sharing its batches (empty: none; any needs the adapter's
    `mixed_sampling` capability; temperature 0 is a greedy companion)."""

    draft: str = OWN_DRAFT
    companions: tuple[SamplingSpec, ...] = ()


@dataclass(frozen=True)
class SequenceTest:
    """One test family applied to `groups` (empty: every group it applies to)."""

    kind: str
    role: str
    groups: tuple[str, ...] = ()

    @property
    def is_p_valued(self) -> bool:
        return self.kind not in DETERMINISTIC_KINDS


@dataclass(frozen=True)
class SequenceProtocol:
    """A parsed sequence protocol; `profile` is set once `resolve` applied one."""

    kind: str
    name: str
    prompts: tuple[str, ...]
    sampling: SamplingSpec
    num_speculative_tokens: int
    sequence_length: int
    groups: tuple[SequenceGroup, ...]
    sequences_per_group: int
    batch_size: int
    tests: tuple[SequenceTest, ...]
    description: str = ""
    sut: SutSpec = SutSpec()
    seed_base: int = 0
    alpha: float = 0.01
    power: float = 0.8
    support_tolerance: float = DEFAULT_SUPPORT_TOLERANCE
    sequential: SequentialSpec | None = None  # pre-registered looks (`specval.sequence.looks`)
    profiles: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    profile: str | None = field(default=None, compare=False)
    file_hash: str | None = field(default=None, compare=False, repr=False)

    @property
    def positions(self) -> int:
        """Tokens tested per request (the preflight probe samples this many)."""
        return self.sequence_length

    @property
    def num_batches(self) -> int:
        return self.sequences_per_group // self.batch_size

    @property
    def look_batches(self) -> tuple[int, ...]:
        """Batches per group at each look: ceil(t_k x num_batches) for the `sequential` looks t_k
        (whole batches), or (num_batches,) without looks. ValueError when two looks would hold the
        same number of batches."""
        if self.sequential is None:
            return (self.num_batches,)
        return look_sizes(self.num_batches, self.sequential.looks)

    def max_tokens(self, group: GroupSpec) -> int:
        """Tokens each request generates: the tested ones plus K of headroom for a speculative
        group, so that no round's drafts are cut short by the length limit."""
        return self.sequence_length + (self.num_speculative_tokens if group.is_speculative else 0)

    def group(self, name: str) -> SequenceGroup:
        return next(g for g in self.groups if g.name == name)

    def groups_of(self, test: SequenceTest) -> tuple[str, ...]:
        """The groups a test applies to: those it lists, else every group (every speculative one for
        a `source` or `drafts` test: a nospec group has no draft, so no source to condition on)."""
        if test.groups:
            return test.groups
        return tuple(g.name for g in self.groups if g.is_speculative or test.kind not in DRAFT_KINDS)

    def to_dict(self) -> dict[str, Any]:
        """Plain form; a group's `companions` only when it has some and `sequential` only when the
        protocol has looks, so protocols without them hash as before the keys existed."""
        out = plain_form(self)
        if self.sequential is None:
            out.pop("sequential")
        for group, spec in zip(out["groups"], self.groups):
            group.pop("companions")
            if spec.companions:
                group["companions"] = [c.to_dict() for c in spec.companions]
        return out

    @property
    def hash(self) -> str:
        return self.file_hash or canonical_hash(self.to_dict())


def _parse_companion(raw: Any, file: str, where: str) -> SamplingSpec:
    """One companion sampling: temperature 0 (greedy) or >= MIN_TEMPERATURE, top_k >= -1, top_p in (0, 1]."""
    raw = read_mapping(raw, file, where)
    unknown = sorted(set(raw) - set(COMPANION_KEYS))
    if unknown:
        fail(file, f"{where}.{unknown[0]}", f"unknown key; expected one of {list(COMPANION_KEYS)}", raw[unknown[0]])
    if "temperature" not in raw:
        fail(file, f"{where}.temperature", "required (0 for a greedy companion)", None)
    temperature = read_float(raw["temperature"], file, f"{where}.temperature")
    if temperature != 0.0 and not temperature >= MIN_TEMPERATURE:
        fail(file, f"{where}.temperature", f"must be 0 (greedy) or >= {MIN_TEMPERATURE:g}", raw["temperature"])
    return SamplingSpec(
        temperature=temperature,
        top_k=read_int(raw.get("top_k", -1), file, f"{where}.top_k", minimum=-1),
        top_p=read_unit(raw.get("top_p", 1.0), file, f"{where}.top_p", upper_closed=True),
    )


def _parse_companions(raw: Any, file: str, where: str) -> tuple[SamplingSpec, ...]:
    if not isinstance(raw, list) or not 1 <= len(raw) <= MAX_COMPANION_SAMPLINGS:
        fail(file, where, f"expected a list of 1..{MAX_COMPANION_SAMPLINGS} samplings", raw)
    return tuple(_parse_companion(c, file, f"{where}[{i}]") for i, c in enumerate(raw))


def _parse_group(raw: Any, file: str, where: str) -> SequenceGroup:
    raw = read_mapping(raw, file, where)
    check_keys(raw, SequenceGroup, file, where)
    group = SequenceGroup(
        name=read_name(raw["name"], file, f"{where}.name"),
        mode=read_name(raw["mode"], file, f"{where}.mode"),
        draft_loops=read_draft_loops(raw, file, where),
        options=read_group_options(raw, file, where),
        draft=read_str(raw.get("draft", OWN_DRAFT), file, f"{where}.draft", DRAFTS),
        companions=_parse_companions(raw["companions"], file, f"{where}.companions") if "companions" in raw else (),
    )
    if group.draft != OWN_DRAFT and not group.is_speculative:
        fail(file, f"{where}.draft", "a draft override needs a speculative mode", group.draft)
    return group


def _parse_test(raw: Any, file: str, where: str, groups: tuple[SequenceGroup, ...]) -> SequenceTest:
    raw = read_mapping(raw, file, where)
    check_keys(raw, SequenceTest, file, where)
    listed = raw.get("groups", [])
    if not isinstance(listed, list):
        fail(file, f"{where}.groups", "expected a list of group names", listed)
    names = tuple(g.name for g in groups)
    test = SequenceTest(
        kind=read_str(raw["kind"], file, f"{where}.kind", TEST_KINDS),
        role=read_str(raw["role"], file, f"{where}.role", ROLES),
        groups=tuple(read_str(n, file, f"{where}.groups", names) for n in listed),
    )
    plain = [g.name for g in groups if g.name in test.groups and not g.is_speculative]
    if test.kind in DRAFT_KINDS and plain:
        fail(file, f"{where}.groups", f"a {test.kind} test needs speculative groups (nospec has no drafts)", plain[0])
    return test


def _parse_tests(raw: Any, file: str, groups: tuple[SequenceGroup, ...]) -> tuple[SequenceTest, ...]:
    if not isinstance(raw, list) or not raw:
        fail(file, "tests", "expected a non-empty list", raw)
    tests = tuple(_parse_test(t, file, f"tests[{i}]", groups) for i, t in enumerate(raw))
    if not any(t.role in GATING_ROLES for t in tests):
        fail(file, "tests", f"needs at least one test of role {' or '.join(GATING_ROLES)}", [t.role for t in tests])
    seen = [(t.kind, t.groups) for t in tests]
    for ident in seen:
        if seen.count(ident) > 1:
            fail(file, "tests", "duplicate test (same kind and groups)", ident[0])
    return tests


def _parse_prompts(raw: Any, file: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        fail(file, "prompts", "expected a non-empty list of prompt texts", raw)
    return tuple(read_str(p, file, f"prompts[{i}]") for i, p in enumerate(raw))


def check_layout(protocol: SequenceProtocol, file: str) -> None:
    """The request layout the tests pair over: even batches, whole batches, two batches per prompt."""
    where = f"profile {protocol.profile}: " if protocol.profile else ""
    if protocol.batch_size % 2:
        fail(file, "batch_size", f"{where}must be even (adjacent slots are paired)", protocol.batch_size)
    if protocol.sequences_per_group % protocol.batch_size:
        fail(
            file,
            "sequences_per_group",
            f"{where}must be a multiple of batch_size ({protocol.batch_size})",
            protocol.sequences_per_group,
        )
    if protocol.num_batches < 2 * len(protocol.prompts):
        fail(
            file,
            "sequences_per_group",
            f"{where}needs at least 2 batches per prompt ({2 * len(protocol.prompts)} "
            f"x batch_size {protocol.batch_size})",
            protocol.sequences_per_group,
        )
    if not MIN_SEQUENCE_LENGTH <= protocol.sequence_length <= MAX_SEQUENCE_LENGTH:
        fail(
            file,
            "sequence_length",
            f"{where}must lie in [{MIN_SEQUENCE_LENGTH}, {MAX_SEQUENCE_LENGTH}]",
            protocol.sequence_length,
        )


def check_looks(protocol: SequenceProtocol, file: str) -> None:
    """The looks of one resolved profile: every look holds more whole batches than the one before,
    the first at least 2 per prompt (so that adjacent and cross pairs exist at every look, as
    `check_layout` asks of the whole run), and no look's level falls below MIN_ALPHA (the Monte
    Carlo draws a level needs are bounded)."""
    if protocol.sequential is None:
        return
    where, looks = f"profile {protocol.profile}: " if protocol.profile else "", list(protocol.sequential.looks)
    try:
        first = protocol.look_batches[0]
    except ValueError as err:
        fail(file, "sequential.looks", f"{where}{protocol.num_batches} batches per group are too few ({err})", looks)
    if first < 2 * len(protocol.prompts):
        fail(
            file,
            "sequential.looks",
            f"{where}the first look holds {first} of {protocol.num_batches} batches per group; every look "
            f"needs at least 2 batches per prompt ({2 * len(protocol.prompts)})",
            looks,
        )
    smallest = min(spend(protocol.alpha, looks, protocol.sequential.spending).levels)
    if smallest < MIN_ALPHA:
        fail(
            file,
            "sequential.spending",
            f"spends alpha = {protocol.alpha:g} down to a look level of {smallest:.3g}, below {MIN_ALPHA:g} "
            "(the Monte Carlo draws a level needs are bounded)",
            protocol.sequential.spending,
        )


def parse_sequence_protocol(raw: Any, file: str = "<protocol>") -> SequenceProtocol:
    """Parse a YAML mapping with `kind: sequence`; ProtocolError naming file, key and value. Every
    profile is resolved and its layout checked here, so a bad profile fails `specval validate`."""
    raw = read_mapping(raw, file, "")
    check_keys(raw, SequenceProtocol, file, "")
    if raw.get("kind") != SEQUENCE_KIND:
        fail(file, "kind", f"expected {SEQUENCE_KIND!r}", raw.get("kind"))
    groups = parse_groups(raw["groups"], file, _parse_group)
    protocol = SequenceProtocol(
        kind=SEQUENCE_KIND,
        name=read_name(raw["name"], file, "name"),
        description=str(raw.get("description", "")),
        sut=parse_sut(raw.get("sut", {}), file),
        prompts=_parse_prompts(raw["prompts"], file),
        sampling=parse_sampling(raw["sampling"], file),
        num_speculative_tokens=read_int(raw["num_speculative_tokens"], file, "num_speculative_tokens", minimum=1),
        sequence_length=read_int(raw["sequence_length"], file, "sequence_length", minimum=1),
        groups=groups,
        sequences_per_group=read_int(raw["sequences_per_group"], file, "sequences_per_group", minimum=1),
        batch_size=read_int(raw["batch_size"], file, "batch_size", minimum=1),
        tests=_parse_tests(raw["tests"], file, groups),
        seed_base=read_int(raw.get("seed_base", 0), file, "seed_base", minimum=0),
        alpha=read_unit(raw.get("alpha", 0.01), file, "alpha"),
        power=read_unit(raw.get("power", 0.8), file, "power"),
        support_tolerance=read_float(
            raw.get("support_tolerance", DEFAULT_SUPPORT_TOLERANCE), file, "support_tolerance"
        ),
        sequential=parse_sequential(raw.get("sequential"), file),
        profiles=parse_profiles(raw.get("profiles", {}), file, PROFILE_KEYS),
    )
    if protocol.num_speculative_tokens > MAX_SPECULATIVE_TOKENS:
        fail(file, "num_speculative_tokens", f"at most {MAX_SPECULATIVE_TOKENS}", protocol.num_speculative_tokens)
    if not protocol.support_tolerance >= 0.0:
        fail(file, "support_tolerance", "must be >= 0", raw.get("support_tolerance"))
    for profile in (None, *dict(protocol.profiles)):
        check_layout(resolve(protocol, profile), file)
        check_looks(resolve(protocol, profile), file)
    return protocol


def resolve(protocol: SequenceProtocol, profile: str | None) -> SequenceProtocol:
    """Apply a profile's overrides (`specval.protocol.sections.resolve`)."""
    return resolve_profile(protocol, profile)


def load_sequence_protocol(path: str | Path) -> SequenceProtocol:
    return parse_sequence_protocol(read_yaml(path), str(path))
