"""Strata: a group's samples as the statistics see them.

A group's rows with every token in [0, V), with the counts of the rows left out (`group_data`);
the strata of a position by prefix t_1..t_{k-1}, and by path (the source of each earlier token);
each stratum's counts on the support of its prefix's reference law (`stratum_counts`,
`supports_of`): O(n log k) per stratum, never O(V).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specval.distribution.collect import COUNT_COLUMNS
from specval.distribution.reference import Reference
from specval.sut import SOURCES


def strata(tokens: np.ndarray, position: int) -> list[tuple[tuple[int, ...], np.ndarray]]:
    """Split tokens[N, n] into strata of prefix t_1..t_{position-1}: [(prefix, t_position[n_s])]."""
    target = tokens[:, position - 1]
    if position == 1:
        return [((), target)]
    prefixes, rows = prefix_groups(tokens[:, : position - 1])
    return [(prefix, target[r]) for prefix, r in zip(prefixes, rows)]


def prefix_groups(keys: np.ndarray) -> tuple[list[tuple[int, ...]], list[np.ndarray]]:
    """Distinct rows of keys[N, j] in ascending order, and the row indices holding each
    (np.lexsort: np.unique(axis=0) is ~20x slower). j = 0 gives one group of every row."""
    if len(keys) == 0:
        return [], []
    if keys.shape[1] == 0:
        return [()], [np.arange(len(keys))]
    order = np.lexsort(keys.T[::-1])
    ordered = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], np.any(ordered[1:] != ordered[:-1], axis=1)]))
    return [tuple(int(t) for t in ordered[i]) for i in starts], np.split(order, starts[1:])


def path_strata(
    tokens: np.ndarray, paths: np.ndarray, position: int
) -> list[tuple[tuple[int, ...], tuple[int, ...], np.ndarray]]:
    """Strata of (prefix, path): paths[N, n] holds each token's source code (index in SOURCES)."""
    keyed = np.concatenate([tokens[:, : position - 1], paths[:, : position - 1]], axis=1)
    with_key = np.concatenate([keyed, tokens[:, position - 1 : position]], axis=1)
    width = position - 1
    return [(key[:width], key[width:], target) for key, target in strata(with_key, 2 * width + 1)]


@dataclass(frozen=True, eq=False)
class GroupData:
    """One group's samples as the statistics see them: rows with every token in [0, V) only."""

    tokens: np.ndarray  # int64[N, n] t_1..t_n
    paths: np.ndarray  # int64[N, n] index in SOURCES of each token's source
    num_out_of_range: int  # rows left out: some token < 0 or >= V
    num_impossible: int  # rows with a negative count or more accepted than drafted tokens


def source_codes(column: pd.Series) -> np.ndarray:
    """int64 index in SOURCES of each entry, -1 for anything else (missing values included):
    factorised once, then looked up (a per-row dict map costs ~10x more on 160k rows)."""
    codes, names = pd.factorize(column)  # code -1: a missing value
    lookup = np.array([SOURCES.index(n) if n in SOURCES else -1 for n in names] + [-1], dtype=np.int64)
    return lookup[codes]


def group_data(samples: pd.DataFrame, group: str, positions: int, vocab_size: int | None) -> GroupData:
    """Split a group's rows into in-range samples and the counts of invalid ones (never raises on
    any integer a SUT returned)."""
    rows = samples[samples["group"] == group]
    tokens = rows[[f"t{k}" for k in range(1, positions + 1)]].to_numpy(dtype=np.int64)
    paths = (
        np.stack([source_codes(rows[f"src{k}"]) for k in range(1, positions + 1)], axis=1)
        if len(rows)
        else tokens.copy()
    )
    in_range = np.all(tokens >= 0, axis=1) & (np.all(tokens < vocab_size, axis=1) if vocab_size else True)
    counts = rows[list(COUNT_COLUMNS)].to_numpy(dtype=np.int64)
    impossible = np.any(counts < 0, axis=1) | (
        rows["num_accepted_tokens"].to_numpy() > rows["num_draft_tokens"].to_numpy()
    )
    return GroupData(tokens[in_range], paths[in_range], int((~in_range).sum()), int(impossible.sum()))


# ---------------------------------------------------------------- supports


@dataclass(frozen=True)
class Support:
    """The tokens of positive reference probability after one prefix, and their probabilities."""

    tokens: np.ndarray  # int64[k] ascending
    probs: np.ndarray  # f64[k] > 0


def _support_counts(target: np.ndarray, support: Support) -> tuple[np.ndarray, int]:
    """(counts[k] of the target tokens on the support, number of targets outside it): O(n log k),
    never O(V), so a 152k vocabulary costs nothing per stratum."""
    index = np.minimum(np.searchsorted(support.tokens, target), support.tokens.size - 1)
    inside = support.tokens[index] == target
    return np.bincount(index[inside], minlength=support.tokens.size), int((~inside).sum())


def stratum_counts(tokens: np.ndarray, position: int, paths: np.ndarray | None, supports) -> list:
    """(key, prefix, counts on the prefix's support, out-of-support count) per stratum; key = prefix,
    or (prefix, path) with `paths`; `supports(prefix)` gives the prefix's `Support`."""
    if paths is None:
        parts = [(prefix, prefix, target) for prefix, target in strata(tokens, position)]
    else:
        parts = [
            ((prefix, tuple(SOURCES[c] for c in path)), prefix, target)
            for prefix, path, target in path_strata(tokens, paths, position)
        ]
    return [(key, prefix, *_support_counts(target, supports(prefix))) for key, prefix, target in parts]


StrataSource = Callable[[str, int, bool], list]  # (group, position, by_path) -> stratum_counts rows


def supports_of(ref: Reference) -> Callable[[tuple], Support]:
    """prefix -> its `Support`, computed once per prefix."""
    cache: dict[tuple, Support] = {}

    def support(prefix: tuple) -> Support:
        if prefix not in cache:
            probs = ref.probs(prefix)
            tokens = np.flatnonzero(probs > 0.0)
            cache[prefix] = Support(tokens, probs[tokens] / probs[tokens].sum())
        return cache[prefix]

    return support
