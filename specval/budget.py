"""The Monte Carlo budget: what a protocol's Monte Carlo p-values may cost, computed from the
protocol alone, and the refusal of a protocol over it before a run reads the seed ledger.

A Monte Carlo p-value tested at level t draws at most `montecarlo.max_draws(t, rule)` null
statistics: ceil(30 / t) under Besag-Clifford (the distribution kind), ceil(30 / (t / 2)) under the
early-rejection rule (the sequence kind). A criterion that PASSes stops far earlier (about
30 (1 + ln(cap / 30)) draws); one that is rejected, or nearly, draws them all. A criterion's planned
cost is the sum of its caps at the levels it is tested at (Holm's first step alpha / m of its
family, at every look of either stage); the run's, the sum over its criteria. The count is what
alpha and the family sizes drive (it grows as 1 / level); the time and the memory of a criterion's
largest batch (about half its cap) are the count times the cost of one null statistic, which the
protocol's sizes fix (a table of the criterion's cells; one uniform per token of the group).

Guarantees: `planned_cost` bounds from above the null statistics each criterion of a run of the
protocol draws (and their sum, the run's); `check` raises ProtocolError (the CLI's exit 2), one
line naming the file, the profile, the criterion that costs most with its planned draws and level,
MC_DRAW_BUDGET and the smallest alpha at which the protocol fits, for every protocol one of whose
criteria plans more draws than the budget. Kinds without Monte Carlo p-values (quality,
performance, suite) cost nothing.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specval.distribution.criteria import P_VALUED_KINDS, applicable_groups, criterion_name, family_sizes
from specval.protocol import MAX_ALPHA, MIN_ALPHA, Protocol, ProtocolError, resolve
from specval.sequence import verdict as sequence_verdict
from specval.sequence.protocol import SequenceProtocol
from specval.stats import montecarlo
from specval.stats.sequential import spend

# The null statistics one criterion may plan to draw (module doc). 2**23 (8.4e6) holds every shipped
# protocol with room (the most a shipped criterion plans: 1.2e6, seq_fp32's and seq_cuda's PIT
# criteria at level 1e-4 under early rejection; four looks of them, 4.8e6) and refuses alpha 1e-6
# for any family: one criterion alone plans 3e7 draws there (Besag-Clifford), 6e7 (early rejection).
MC_DRAW_BUDGET = 2**23
SEQUENCE_RULE = montecarlo.EARLY_REJECTION  # the rule of a new sequence analysis (specval.sequence.verdict)
# Sequence criteria with a Monte Carlo p-value -> how many they combine at level / that many (Bonferroni):
# the PIT and serial tests one, the association tests two (specval.stats.independence.STATISTICS).
SEQUENCE_MC = {
    "pit_pooled": 1,
    "pit_position": 1,
    "pit_path": 1,
    "pit_source": 1,
    "pit_draft": 1,
    "serial": 1,
    "association_adjacent": 2,
    "association_cross": 2,
}
ALPHA_SEARCH_STEPS = 60  # bisection steps of `smallest_alpha` over log(alpha): far below 1% in alpha


@dataclass(frozen=True)
class CostRow:
    """One criterion's Monte Carlo cap: its name, the smallest level it is tested at and the null
    statistics it may draw over every look and stage."""

    criterion: str
    level: float
    draws: int


@dataclass(frozen=True)
class Cost:
    """The planned Monte Carlo cost of a protocol: one row per criterion with a Monte Carlo p-value."""

    rows: tuple[CostRow, ...]

    @property
    def draws(self) -> int:
        return sum(row.draws for row in self.rows)

    def largest(self) -> CostRow | None:
        """The criterion that plans the most draws (None: no Monte Carlo p-value)."""
        return max(self.rows, key=lambda row: row.draws, default=None)

    @property
    def within_budget(self) -> bool:
        top = self.largest()
        return top is None or top.draws <= MC_DRAW_BUDGET

    def line(self) -> str:
        """What `specval plan` prints: the criterion that plans the most draws, the budget and the run's sum."""
        top = self.largest()
        if top is None:
            return "Monte Carlo: no Monte Carlo p-value"
        state = "within" if self.within_budget else "OVER"
        return (
            f"Monte Carlo: at most {top.draws:,} null draws for one criterion ({top.criterion}, level "
            f"{top.level:.3g}; {state} the budget of {MC_DRAW_BUDGET:,} a criterion), {self.draws:,} for "
            f"the run, if every criterion is rejected"
        )


def planned_cost(protocol: Any) -> Cost:
    """The planned Monte Carlo cost of a protocol (a profile already resolved), any kind."""
    if isinstance(protocol, Protocol):
        return Cost(tuple(_distribution_rows(protocol)))
    if isinstance(protocol, SequenceProtocol):
        return Cost(tuple(_sequence_rows(protocol)))
    return Cost(())


def check(protocol: Any, file: Path | str) -> Cost:
    """The planned cost of `protocol` (profile resolved), or ProtocolError naming `file`, the
    profile, the cost, the budget and the smallest alpha that fits when it is over the budget."""
    cost = planned_cost(protocol)
    top = cost.largest()
    if top is None or cost.within_budget:
        return cost
    fits = smallest_alpha(protocol)
    remedy = (
        f"alpha >= {fits:.2g} fits"
        if fits is not None
        else f"no alpha up to {MAX_ALPHA:g} fits: test fewer criteria in a family"
    )
    profile = f" (profile {protocol.profile})" if protocol.profile else ""
    raise ProtocolError(
        f"{file}{profile}: the planned Monte Carlo cost of {top.criterion} is {top.draws:,} null draws "
        f"(rejected at level {top.level:.3g}), over the budget of {MC_DRAW_BUDGET:,} a "
        f"criterion (specval.budget.MC_DRAW_BUDGET); {remedy}"
    )


def check_profile(protocol: Any, profile: str | None, file: Path | str) -> Cost:
    """`check` of the parsed `protocol` at `profile` (resolved here; ProtocolError for an unknown
    one), for a kind with Monte Carlo p-values; the empty Cost for the others."""
    if not isinstance(protocol, (Protocol, SequenceProtocol)):
        return Cost(())
    return check(resolve(protocol, profile), file)


def smallest_alpha(protocol: Any) -> float | None:
    """The smallest alpha (two significant digits, rounded up) at which `protocol`, all else equal,
    is within the budget; None when not even MAX_ALPHA is (too many criteria, or a fixed
    `confirmation.alpha_stage2` too small)."""

    def fits(alpha: float) -> bool:
        return planned_cost(dataclasses.replace(protocol, alpha=alpha)).within_budget

    if not fits(MAX_ALPHA):
        return None
    low, high = math.log(MIN_ALPHA), math.log(MAX_ALPHA)
    for _ in range(ALPHA_SEARCH_STEPS):
        middle = (low + high) / 2
        low, high = (low, middle) if fits(math.exp(middle)) else (middle, high)
    alpha = math.exp(high)
    step = 10.0 ** (math.floor(math.log10(alpha)) - 1)
    return min(math.ceil(alpha / step) * step, MAX_ALPHA)


# ---------------------------------------------------------------- the kinds


def _look_alphas(alpha: float, sequential: Any) -> list[float]:
    """The levels a stage of alpha is spent at: every look's, or alpha itself without looks."""
    return [alpha] if sequential is None else list(spend(alpha, sequential.looks, sequential.spending).levels)


def _distribution_rows(protocol: Protocol) -> list[CostRow]:
    """gof and homogeneity: one Besag-Clifford p-value each at alpha / m, at every look of each stage."""
    sizes = family_sizes(protocol)
    stages = [protocol.alpha] + ([protocol.alpha_stage2] if protocol.confirmation.is_two_stage else [])
    alphas = [a for stage in stages for a in _look_alphas(stage, protocol.sequential)]
    rows = []
    for test in (t for t in protocol.tests if t.kind in P_VALUED_KINDS):
        m = max(sizes[test.role], 1)
        draws = sum(montecarlo.max_draws(a / m) for a in alphas)
        for group in applicable_groups(protocol, test):
            rows.append(CostRow(criterion_name(test, group), min(alphas) / m, draws))
    return rows


def _sequence_rows(protocol: SequenceProtocol) -> list[CostRow]:
    """The PIT, serial and association criteria: early-rejection p-values at alpha / m (divided
    among the statistics a criterion combines), at every look."""
    sizes = sequence_verdict.family_sizes(protocol)
    alphas = _look_alphas(protocol.alpha, getattr(protocol, "sequential", None))
    rows = []
    for name, role, _ in sequence_verdict.planned_criteria(protocol):
        statistics = SEQUENCE_MC.get(name.split(".")[0])
        if statistics is None:
            continue
        levels = [a / max(sizes.get(role, 1), 1) / statistics for a in alphas]
        draws = statistics * sum(montecarlo.max_draws(level, SEQUENCE_RULE) for level in levels)
        rows.append(CostRow(name, min(levels), draws))
    return rows
