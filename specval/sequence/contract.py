"""Contract: what a sequence run accepts from the adapter, checked on every call the run makes.

Every `sample` / `sample_mixed` batch (the probe's, each collected batch, each re-run) and every
`target_logits_along` answer is checked before it is written or used; a breach is `SUTRaised`
(exit 3, the bundle kept for `--resume`) naming the adapter call, the field and the value or shape
seen, never a traceback and never a verdict:

- a batch is a `specval.sut.SampleBatch`; `tokens` and `sources` are [rows, sequence_length],
  `num_rounds`, `num_draft_tokens`, `num_accepted_tokens` are [rows]; tokens and counts have an
  integer dtype; every token lies in [0, vocab_size) (a token outside it cannot be replayed, so
  no criterion could judge it); every source is one of `specval.sut.SOURCES`;
- `drafts`, where the batch reports them (a group under a `drafts` test must: `check_drafts`), is
  int[rows, sequence_length]: at an "accepted" token the token itself, at a "correction" token a
  token id in [0, vocab_size) (the rejected draft), at a bonus or plain token `NO_DRAFT` (-1);
- `target_logits_along` returns float[sequence_length, vocab_size] with no NaN and no +inf, and
  at least one finite logit per row (-inf masks a token; a row of them is no law).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from specval.preflight import SUTRaised
from specval.sut import NO_DRAFT, SOURCES, SampleBatch

COUNT_FIELDS = ("num_rounds", "num_draft_tokens", "num_accepted_tokens")


def _first_bad(mask: np.ndarray, values: np.ndarray, axes: tuple[str, str] = ("row", "position")) -> str:
    """ "row r, position i: value" of the first True entry of `mask` (2-D) in `values`."""
    r, i = (int(x) for x in np.argwhere(mask)[0])
    value = values[r, i]
    return f"{axes[0]} {r}, {axes[1]} {i}: {value.item() if isinstance(value, np.generic) else value!r}"


def check_batch(call: str, batch: Any, rows: int, length: int, vocab: int) -> SampleBatch:
    """`batch`, after checking it as the module doc says (SUTRaised(`call`, ...) otherwise)."""
    if not isinstance(batch, SampleBatch):
        raise SUTRaised(call, f"returned {type(batch).__name__}, expected specval.sut.SampleBatch")
    for name, shape in (("tokens", (rows, length)), ("sources", (rows, length)), *((f, (rows,)) for f in COUNT_FIELDS)):
        array = np.asarray(getattr(batch, name))
        if array.shape != shape:
            raise SUTRaised(call, f"{name} has shape {array.shape}, expected {shape}")
        if name != "sources" and not np.issubdtype(array.dtype, np.integer):
            raise SUTRaised(call, f"{name} has dtype {array.dtype}, expected an integer dtype")
    tokens = np.asarray(batch.tokens)
    outside = (tokens < 0) | (tokens >= vocab)
    if outside.any():
        raise SUTRaised(
            call,
            f"tokens holds {int(outside.sum())} token id(s) outside [0, {vocab}), first at "
            f"{_first_bad(outside, tokens)}",
        )
    sources = np.asarray(batch.sources)
    unknown = ~np.isin(sources.astype(str), SOURCES)
    if unknown.any():
        raise SUTRaised(
            call,
            f"sources holds {int(unknown.sum())} unknown value(s), first at "
            f"{_first_bad(unknown, sources)}; expected one of {SOURCES}",
        )
    if batch.drafts is not None:
        check_drafts(call, batch.drafts, tokens, sources.astype(str), vocab)
    return batch


def check_drafts(call: str, drafts: Any, tokens: np.ndarray, sources: np.ndarray, vocab: int) -> None:
    """SUTRaised(`call`, ...) unless `drafts` holds, where `sources` (str[rows, length]) say
    "accepted", the token itself, where they say "correction", a token id in [0, vocab), and
    NO_DRAFT elsewhere (module docstring); `tokens` int[rows, length]."""
    array = np.asarray(drafts)
    if array.shape != tokens.shape or not np.issubdtype(array.dtype, np.integer):
        raise SUTRaised(call, f"drafts has {array.dtype}{list(array.shape)}, expected int{list(tokens.shape)}")
    accepted, correction = sources == "accepted", sources == "correction"
    breaches = (
        (accepted & (array != tokens), "differ from the accepted token there"),
        (correction & ((array < 0) | (array >= vocab)), f"lie outside [0, {vocab}) at a correction"),
        (~(accepted | correction) & (array != NO_DRAFT), f"are not {NO_DRAFT} at a bonus or plain token"),
    )
    for mask, what in breaches:
        if mask.any():
            raise SUTRaised(
                call, f"drafts holds {int(mask.sum())} draft(s) that {what}, first at {_first_bad(mask, array)}"
            )


def check_logits_along(call: str, logits: Any, length: int, vocab: int) -> np.ndarray:
    """The logits as float32[length, vocab], after checking them as the module doc says."""
    array = np.asarray(logits)
    if array.shape != (length, vocab) or not np.issubdtype(array.dtype, np.floating):
        raise SUTRaised(call, f"returned {array.dtype}{list(array.shape)}, expected float[{length}, {vocab}]")
    array = array.astype(np.float32)  # what the reference uses: a logit beyond float32 is +inf here
    for what, mask in (("NaN", np.isnan(array)), ("+inf", np.isposinf(array))):
        if mask.any():
            raise SUTRaised(
                call,
                f"returned {int(mask.sum())} {what} logit(s), first at "
                f"{_first_bad(mask, array, ('position', 'token'))}",
            )
    empty = ~np.isfinite(array).any(axis=1)
    if empty.any():
        raise SUTRaised(call, f"returned no finite logit at position {int(np.flatnonzero(empty)[0])} (all -inf)")
    return array


def check_logits_rows(call: str, row_call: Callable[[int], str], logits: Any, rows: int, length: int, vocab: int):
    """The answer of a batched replay (`target_logits_along_batch`: one array [rows, length, vocab]
    or a list of `rows` arrays) as float32[rows, length, vocab], each row checked by
    `check_logits_along` under the name `row_call(r)`; `call` names a wrong number of rows or shape."""
    if isinstance(logits, (list, tuple)):
        if len(logits) != rows:
            raise SUTRaised(call, f"returned {len(logits)} rows, expected {rows}")
    else:
        array = np.asarray(logits)
        if array.shape != (rows, length, vocab) or not np.issubdtype(array.dtype, np.floating):
            expected = f"float[{rows}, {length}, {vocab}]"
            raise SUTRaised(call, f"returned {array.dtype}{list(array.shape)}, expected {expected}")
        logits = array
    out = np.empty((rows, length, vocab), dtype=np.float32)
    for r in range(rows):
        out[r] = check_logits_along(row_call(r), logits[r], length, vocab)
    return out
