"""Pooling: the cell structure of a chi-square test, decided from EXPECTED counts only.

The rule (deterministic, and blind to observed counts by construction: its only input is the
vector of expected counts):

1. A token with expected count exactly 0 is not a cell: it is in the out-of-support set
   (`cell_of_token == OUT_OF_SUPPORT`).
2. A token with expected count >= `min_expected` is a cell on its own ("big" cells), numbered
   first, in token order.
3. The remaining "small" tokens (0 < expected < `min_expected`) are sorted by (expected count,
   token index) ascending and merged greedily: a group is closed as soon as its expected sum
   reaches `min_expected`. Closed groups are numbered after the big cells, in closing order.
4. A last remainder whose sum stays below `min_expected` joins the existing cell (big or closed
   group) with the smallest expected sum, lowest cell number on ties. If no cell exists at all
   (the total expected count is below `min_expected`), the remainder is the single cell.

Afterwards every cell has expected count >= `min_expected`, unless there is only one cell.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from specval.stats import checks
from specval.stats.results import StatResult

OUT_OF_SUPPORT = -1  # cell_of_token value of a token whose expected count is exactly 0


@dataclasses.dataclass(frozen=True, eq=False)
class CellPooling(StatResult):
    """Mapping of tokens to chi-square cells.

    `cell_of_token[v]` is the cell of token v, or OUT_OF_SUPPORT; `cell_expected[c]` is the summed
    expected count of cell c.
    """

    cell_of_token: np.ndarray  # [V] int64, cell index or OUT_OF_SUPPORT
    cell_expected: np.ndarray  # [C] float64
    min_expected: float

    _UNSERIALISED = ("cell_of_token",)

    @property
    def num_cells(self) -> int:
        return int(self.cell_expected.shape[0])

    @property
    def num_pooled_tokens(self) -> int:
        """Tokens that share their cell with at least one other token."""
        in_support = self.cell_of_token[self.cell_of_token != OUT_OF_SUPPORT]
        sizes = np.bincount(in_support, minlength=self.num_cells)
        return int(sizes[sizes > 1].sum())

    def cell_counts(self, observed: np.ndarray) -> np.ndarray:
        """Observed counts [V] summed into cells [C]; out-of-support tokens are left out."""
        in_support = self.cell_of_token != OUT_OF_SUPPORT
        return np.bincount(
            self.cell_of_token[in_support], weights=observed[in_support], minlength=self.num_cells
        ).astype(np.int64)

    def to_dict(self) -> dict:
        out = super().to_dict()
        out.update(num_cells=self.num_cells, num_pooled_tokens=self.num_pooled_tokens)
        return out


def pool_cells(expected: np.ndarray, min_expected: float) -> CellPooling:
    """Pool tokens into chi-square cells by the rule in the module docstring.

    Assumptions: `expected` [V] holds finite non-negative expected counts (e.g. n * p).
    Guarantee: deterministic in `expected` alone; every token with expected > 0 is in exactly one
    cell; every cell reaches `min_expected` unless there is a single cell; `min_expected == 0`
    makes every token of positive expectation its own cell.
    Scaling: O(V log V) for the sort of the small tokens.
    """
    expected = np.asarray(expected, dtype=np.float64)
    if expected.ndim != 1 or not np.all(np.isfinite(expected)) or np.any(expected < 0):
        raise ValueError(f"expected must be a 1-D array of finite counts >= 0, got {expected[:5]}")
    min_expected = checks.non_negative("min_expected", min_expected)
    cell_of_token = np.full(expected.shape, OUT_OF_SUPPORT, dtype=np.int64)
    big = np.flatnonzero(expected >= min_expected)
    big = big[expected[big] > 0]
    cell_of_token[big] = np.arange(big.size)
    cell_expected = list(expected[big])
    small = np.flatnonzero((expected > 0) & (expected < min_expected))
    small = small[np.lexsort((small, expected[small]))]
    _merge_small(expected, small, min_expected, cell_of_token, cell_expected)
    return CellPooling(cell_of_token, np.asarray(cell_expected, dtype=np.float64), min_expected)


def _merge_small(
    expected: np.ndarray,
    small: np.ndarray,
    min_expected: float,
    cell_of_token: np.ndarray,
    cell_expected: list[float],
) -> None:
    """Greedy merge of the sorted small tokens (rule steps 3-4); fills the two outputs in place.

    A group's running sum is csum[j] - csum[start - 1] over one float64 cumulative sum, so the
    loop runs once per group (not per token) and stays deterministic.
    """
    csum = np.cumsum(expected[small])
    start, base = 0, 0.0
    while start < small.size:
        end = _group_end(csum, start, base, min_expected)
        if end == small.size:
            break
        cell_of_token[small[start : end + 1]] = len(cell_expected)
        cell_expected.append(float(csum[end] - base))
        start, base = end + 1, float(csum[end])
    if start == small.size:
        return
    remainder = small[start:]
    remainder_sum = float(csum[-1] - base)
    target = int(np.argmin(cell_expected)) if cell_expected else 0
    if not cell_expected:
        cell_expected.append(0.0)
    cell_of_token[remainder] = target
    cell_expected[target] += remainder_sum


def _group_end(csum: np.ndarray, start: int, base: float, min_expected: float) -> int:
    """First j >= start with csum[j] - base >= min_expected (len(csum) if none).

    csum[j] - base is non-decreasing in j, so a binary search gives a candidate that is then
    corrected by the exact test against rounding of base + min_expected.
    """
    j = max(start, int(np.searchsorted(csum, base + min_expected, side="left")))
    while j > start and csum[j - 1] - base >= min_expected:
        j -= 1
    while j < csum.size and csum[j] - base < min_expected:
        j += 1
    return j
