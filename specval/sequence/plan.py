"""Plan of a sequence protocol: every p-valued criterion's planned size and MDE, before any data.

Sizes follow the layout alone (`specval.sequence.protocol`): N sequences of L tokens per group,
N / 2 adjacent pairs, N / 2 cross pairs; buckets at their largest ((K + 1) x 4 for pit_position,
(K + 1) x (K + 2) for pit_path). pit_position and pit_path take the largest bucket X^2, so their MDE
is that of ONE bucket: the headline row a bucket of mean size (N L / buckets tokens), and one row per
round position j of a speculative group, `pit_position.<g> @ position j`, the MDE of a bug confined
to position j (in any one quarter of the sequence, or all of them) at the bucket size the planning
model gives: every draft accepted with probability PLAN_ACCEPTANCE, independently
(`sequence_power.position_shares`). Real acceptance varies; a run prints every bucket's own MDE
(`bucket_mde` in summary.json). pit_draft's rows are its buckets, the drafts at each draft
position j (`pit_draft.<g> @ draft j`), at the planning model's number of drafts there. MDEs are
computed at the Besag-Clifford part's level of the early-rejection rule
(`montecarlo.decision_level`), as the run decides. The equal-rate and
identical-sequence MDEs need the target's law of t1 and of whole sequences: the run prints them; the
plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from specval.sequence import looks, verdict
from specval.sequence.protocol import SequenceProtocol
from specval.stats import montecarlo, sequence_power
from specval.stats.power import NOTHING_DETECTABLE

PLAN_ACCEPTANCE = 0.8  # the planning model's per-draft acceptance (the bundled engine measures 0.80-0.88)


@dataclass(frozen=True)
class PlanRow:
    criterion: str
    role: str
    family_size: int
    level: float
    n: int
    mde: float | None  # None: needs the target's laws (printed by the run)
    label: str


def _num_buckets(protocol: SequenceProtocol, kind: str) -> int:
    k = protocol.num_speculative_tokens
    if kind == "pit_source":
        return 2 * k + 1  # (accepted, j), (correction, j) for j = 1..K, and the bonus
    if kind == "pit_draft":
        return k  # draft positions 1..K
    return (k + 1) * (verdict.QUARTERS if kind == "pit_position" else k + 2)


def _mde(protocol: SequenceProtocol, kind: str, criterion_level: float) -> tuple[int, float | None, str]:
    n_seq, length, k = protocol.sequences_per_group, protocol.sequence_length, protocol.num_speculative_tokens
    tokens, pairs = n_seq * length, n_seq // 2
    level = montecarlo.decision_level(criterion_level, montecarlo.EARLY_REJECTION)
    if kind == "pit_pooled":
        return (
            tokens,
            sequence_power.pit_uniformity_mde(tokens, [level], power=protocol.power),
            verdict.POOLED_LABEL,
        )
    if kind == "pit_draft":
        drafts = sum(planned_drafts(protocol))
        return (
            drafts // k,
            sequence_power.bucket_mde(drafts // k, [level], num_buckets=k, power=protocol.power),
            f"{verdict.BUCKET_LABEL}, of the drafts under q (acceptance {PLAN_ACCEPTANCE:g} assumed)",
        )
    if kind in ("pit_position", "pit_path", "pit_source"):
        buckets = _num_buckets(protocol, kind)
        return (
            tokens // buckets,
            sequence_power.bucket_mde(tokens // buckets, [level], num_buckets=buckets, power=protocol.power),
            verdict.BUCKET_LABEL,
        )
    if kind == "serial":
        return (
            tokens,
            sequence_power.serial_dependence_mde(n_seq * (length - 1), [level], max_lag=k + 1, power=protocol.power),
            "TV of one lag's pair-bin law from independence",
        )
    if kind.startswith("association"):
        n = pairs * length  # adjacent and cross pairs each use every row once
        return n, sequence_power.association_rho_mde(n, [level], power=protocol.power), "|Spearman rho| of paired PITs"
    if kind == "accepts":
        return tokens, None, "needs the target's and the draft's laws: printed by the run"
    return pairs, None, "needs the target's laws: printed by the run"


def position_rows(protocol: SequenceProtocol, group: str, role: str, family_size: int, level: float) -> list[PlanRow]:
    """pit_position's MDE per round position of a speculative group (module docstring): a bug
    confined to position j, judged at the planned size of one (position j, quarter) bucket."""
    spec = next(g for g in protocol.groups if g.name == group)
    if not spec.is_speculative:
        return []
    k, buckets = protocol.num_speculative_tokens, _num_buckets(protocol, "pit_position")
    tokens = protocol.sequences_per_group * protocol.sequence_length
    decided = montecarlo.decision_level(level, montecarlo.EARLY_REJECTION)
    rows = []
    for position, share in enumerate(sequence_power.position_shares(PLAN_ACCEPTANCE, k), start=1):
        n = int(tokens * share / verdict.QUARTERS)
        mde = sequence_power.bucket_mde(n, [decided], num_buckets=buckets, power=protocol.power)
        what = "the bonus" if position == k + 1 else f"round position {position}"
        label = f"binned PIT TV of {what} in one quarter (acceptance {PLAN_ACCEPTANCE:g} assumed)"
        mde_or_none = None if mde == NOTHING_DETECTABLE else mde
        rows.append(
            PlanRow(f"pit_position.{group} @ position {position}", role, family_size, level, n, mde_or_none, label)
        )
    return rows


def source_rows(protocol: SequenceProtocol, group: str, role: str, family_size: int, level: float) -> list[PlanRow]:
    """pit_source's MDE for the corrections at each draft position j and for the bonus: the planned
    size of those buckets under the acceptance model (a round reaches j w.p. a^(j-1), is corrected
    there w.p. 1 - a; the bonus follows K accepts)."""
    k, buckets = protocol.num_speculative_tokens, _num_buckets(protocol, "pit_source")
    a = PLAN_ACCEPTANCE
    rounds = protocol.sequences_per_group * protocol.sequence_length / sum(a**i for i in range(k + 1))
    decided = montecarlo.decision_level(level, montecarlo.EARLY_REJECTION)
    rows = []
    for position in range(1, k + 2):
        n = int(rounds * a ** (position - 1) * (1 - a if position <= k else 1))
        mde = sequence_power.bucket_mde(n, [decided], num_buckets=buckets, power=protocol.power)
        what = "the bonus" if position == k + 1 else f"corrections at draft position {position}"
        rows.append(
            PlanRow(
                f"pit_source.{group} @ {'bonus' if position == k + 1 else f'correction {position}'}",
                role,
                family_size,
                level,
                n,
                None if mde == NOTHING_DETECTABLE else mde,
                f"binned PIT TV of {what} under its source's law (acceptance {a:g} assumed)",
            )
        )
    return rows


def planned_drafts(protocol: SequenceProtocol) -> list[int]:
    """Drafts per draft position j = 1..K of one group under the planning model: a round reaches j
    w.p. a^(j-1) and emits sum_{i<=K} a^i tokens on average."""
    k, a = protocol.num_speculative_tokens, PLAN_ACCEPTANCE
    rounds = protocol.sequences_per_group * protocol.sequence_length / sum(a**i for i in range(k + 1))
    return [int(rounds * a ** (j - 1)) for j in range(1, k + 1)]


def draft_rows(protocol: SequenceProtocol, group: str, role: str, family_size: int, level: float) -> list[PlanRow]:
    """pit_draft's MDE per draft position j: a bug in the drafts of position j alone, judged at the
    planned number of drafts there (`planned_drafts`)."""
    k, decided = protocol.num_speculative_tokens, montecarlo.decision_level(level, montecarlo.EARLY_REJECTION)
    rows = []
    for position, n in enumerate(planned_drafts(protocol), start=1):
        mde = sequence_power.bucket_mde(n, [decided], num_buckets=k, power=protocol.power)
        label = f"binned PIT TV of the drafts at position {position} under q (acceptance {PLAN_ACCEPTANCE:g} assumed)"
        mde_or_none = None if mde == NOTHING_DETECTABLE else mde
        rows.append(PlanRow(f"pit_draft.{group} @ draft {position}", role, family_size, level, n, mde_or_none, label))
    return rows


def protocol_plan(protocol: SequenceProtocol) -> list[PlanRow]:
    """One row per p-valued criterion, in the order the run evaluates them; pit_position's followed by
    one row per round position of its group (`position_rows`). With looks, every row is at the last
    look's level (`looks.final_alpha`), the one a PASS is decided at, on every planned sequence."""
    sizes, rows = verdict.family_sizes(protocol), []
    for name, role, group in verdict.planned_criteria(protocol):
        kind = name.split(".")[0]
        if kind not in verdict.P_VALUED_FUNCTIONS:
            continue
        level = looks.final_alpha(protocol) / max(sizes.get(role, 1), 1)
        n, mde, label = _mde(protocol, kind, level)
        rows.append(
            PlanRow(
                name,
                role,
                sizes.get(role, 1),
                level,
                n,
                None if mde is None or mde == NOTHING_DETECTABLE else mde,
                label,
            )
        )
        if kind == "pit_position":
            rows += position_rows(protocol, group, role, sizes.get(role, 1), level)
        if kind == "pit_source":
            rows += source_rows(protocol, group, role, sizes.get(role, 1), level)
        if kind == "pit_draft":
            rows += draft_rows(protocol, group, role, sizes.get(role, 1), level)
    return rows
