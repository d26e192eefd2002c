"""Filter semantics: how an engine applies top-k and top-p after temperature, as declared data.

Engines agree on temperature (logits / T) but differ on three documented points of truncation.
Each is one field of `FilterSemantics`, with the values below; the default of every field is
specval's historical behaviour, so an adapter that declares nothing is tested as before.

- `top_k_ties` (top-k on the logits after temperature, k >= 1, disabled by 0, -1 or k >= V):
  - `keep`: x survives iff fewer than k tokens have a strictly larger logit, so every token tied
    at the k-th value survives (more than k tokens may survive);
  - `lowest_index`: exactly k survive: x survives iff fewer than k tokens come before it in the
    order (logit descending, token id ascending).
- `top_p_crossing` (top-p on the probabilities p of the tokens still alive, 0 < top_p < 1):
  - `keep`: x survives iff the mass of tokens with probability strictly larger than p[x] is
    < top_p (the token that crosses top_p survives, with its ties);
  - `drop`: x survives iff the mass of tokens with probability >= p[x] (itself and its ties
    included) is < top_p, or p[x] is the largest probability (the top token, with its ties,
    always survives, so a row is never empty).
  Both rules read values only, never a sort order: tied tokens share one fate.
- `order`: `top_k_then_top_p` (top-p sees the probabilities renormalised over the top-k
  survivors) or `top_p_then_top_k` (top-p sees the full softmax; top-k then ranks its survivors).

A protocol may pin any field under `sampling.semantics`; a pin that differs from what the adapter
declares refuses the run before any seed is claimed (specval.preflight).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TIES_KEEP, TIES_LOWEST_INDEX = "keep", "lowest_index"
CROSSING_KEEP, CROSSING_DROP = "keep", "drop"
TOP_K_THEN_TOP_P, TOP_P_THEN_TOP_K = "top_k_then_top_p", "top_p_then_top_k"
CHOICES: dict[str, tuple[str, ...]] = {
    "top_k_ties": (TIES_KEEP, TIES_LOWEST_INDEX),
    "top_p_crossing": (CROSSING_KEEP, CROSSING_DROP),
    "order": (TOP_K_THEN_TOP_P, TOP_P_THEN_TOP_K),
}


@dataclass(frozen=True)
class FilterSemantics:
    """One choice per documented point of truncation (module docstring); defaults: today's."""

    top_k_ties: str = TIES_KEEP
    top_p_crossing: str = CROSSING_KEEP
    order: str = TOP_K_THEN_TOP_P

    def __post_init__(self) -> None:
        for name, allowed in CHOICES.items():
            value = getattr(self, name)
            if value not in allowed:
                raise ValueError(f"FilterSemantics.{name}: {value!r} is not one of {list(allowed)}")

    def to_dict(self) -> dict[str, str]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> FilterSemantics:
        """ValueError naming an unknown field or value."""
        unknown = sorted(set(data) - set(CHOICES))
        if unknown:
            raise ValueError(f"filter semantics: unknown field(s) {unknown}; expected {list(CHOICES)}")
        return cls(**{str(k): v for k, v in data.items()})

    def describe(self) -> str:
        """One line for reports: every field and its value."""
        return ", ".join(f"{name} {getattr(self, name)}" for name in CHOICES)


DEFAULT_SEMANTICS = FilterSemantics()
