"""Plan of a sequence protocol: every p-valued criterion's planned size and MDE, before any data.

Sizes follow the layout alone (`specval.sequence.protocol`): N sequences of L tokens per group,
N / 2 adjacent pairs, N / 2 cross pairs; buckets at their largest ((K + 1) x 4 for pit_position,
(K + 1) x (K + 2) for pit_path), so the printed MDE is the worst case of the run (a run prints
its own, for the buckets it observed). The equal-rate and identical-sequence MDEs need the target's
law of t1 and of whole sequences: the run prints them; the plan says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from specval.sequence import verdict
from specval.sequence.protocol import SequenceProtocol
from specval.stats import sequence_power
from specval.stats.power import NOTHING_DETECTABLE


@dataclass(frozen=True)
class PlanRow:
    criterion: str
    role: str
    family_size: int
    level: float
    n: int
    mde: float | None  # None: needs the target's laws (printed by the run)
    label: str


def _mde(protocol: SequenceProtocol, kind: str, level: float) -> tuple[int, float | None, str]:
    n_seq, length, k = protocol.sequences_per_group, protocol.sequence_length, protocol.num_speculative_tokens
    tokens, pairs = n_seq * length, n_seq // 2
    if kind == "pit_pooled":
        return (
            tokens,
            sequence_power.pit_uniformity_mde(tokens, [level], power=protocol.power),
            "mean binned PIT TV over buckets",
        )
    if kind in ("pit_position", "pit_path"):
        buckets = (k + 1) * (verdict.QUARTERS if kind == "pit_position" else k + 2)
        return (
            tokens,
            sequence_power.pit_uniformity_mde(tokens, [level], num_buckets=buckets, power=protocol.power),
            "mean binned PIT TV over buckets",
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
    return pairs, None, "needs the target's laws: printed by the run"


def protocol_plan(protocol: SequenceProtocol) -> list[PlanRow]:
    """One row per p-valued criterion, in the order the run evaluates them."""
    sizes, rows = verdict.family_sizes(protocol), []
    for name, role, _ in verdict.planned_criteria(protocol):
        kind = name.split(".")[0]
        if kind not in verdict.P_VALUED_FUNCTIONS:
            continue
        level = protocol.alpha / max(sizes.get(role, 1), 1)
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
    return rows
