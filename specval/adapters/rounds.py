"""Token sources of one assisted-generation request, derived from the chunks its streamer received.

transformers' `generate(streamer=...)` calls `streamer.put` once with the prompt and then once per
step: one token per step without an assistant, and `n_matches + 1` tokens per round with one (the
accepted drafts, then the token drawn after them). It does not say how many drafts a round
proposed; with the constant schedule that number is fixed by its `_calculate_new_tokens`:

    drafts = min(num_assistant_tokens, max_length - cur_len - 1)

where `cur_len` is the sequence length before the round and `max_length` = prompt + max_new_tokens.
From the drafts d and the chunk length m of a round: the first m - 1 tokens are accepted drafts; the
last is a "correction" (drawn from max(p - q, 0) after a rejection) when m - 1 < d and a "bonus"
(drawn from p after every draft was accepted) when m - 1 == d. A round with d == 0 samples p
directly, which is the bonus case with no drafts. m - 1 > d cannot happen and is reported.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specval.sut import SampleBatch, SUTError

PLAIN, ACCEPTED, CORRECTION, BONUS = "plain", "accepted", "correction", "bonus"


class RoundLog:
    """A streamer for `generate(streamer=...)`: keeps every chunk `put` hands it, as token lists."""

    def __init__(self) -> None:
        self.chunks: list[list[int]] = []

    def put(self, value) -> None:  # value: int64 tensor [1, m] or [m]
        self.chunks.append([int(t) for t in value.reshape(-1).tolist()])

    def end(self) -> None:
        """Nothing to flush: the chunks are read after `generate` returns."""


@dataclass(frozen=True)
class RoundTrace:
    """What one request's rounds produced, token by token, and its speculative counts."""

    tokens: tuple[int, ...]  # generated tokens, prompt excluded
    sources: tuple[str, ...]  # one of specval.sut.SOURCES per token
    num_rounds: int
    num_draft_tokens: int
    num_accepted_tokens: int


def plain_trace(chunks: list[list[int]]) -> RoundTrace:
    """Trace of a request generated without an assistant: every token is "plain", no rounds."""
    tokens = tuple(t for chunk in chunks[1:] for t in chunk)
    return RoundTrace(tokens, (PLAIN,) * len(tokens), 0, 0, 0)


def assisted_trace(chunks: list[list[int]], num_assistant_tokens: int, max_new_tokens: int) -> RoundTrace:
    """Trace of an assisted request from its streamed chunks (prompt first, then one chunk per round),
    under the constant schedule of `num_assistant_tokens` drafts and a length limit of
    `max_new_tokens`. Raises SUTError if a round accepted more tokens than it can have drafted."""
    if not chunks:
        raise SUTError("transformers streamed nothing (not even the prompt)")
    max_length = len(chunks[0]) + max_new_tokens
    cur_len, tokens, sources, drafted, accepted = len(chunks[0]), [], [], 0, 0
    for index, chunk in enumerate(chunks[1:]):
        num_drafts = max(0, min(num_assistant_tokens, max_length - cur_len - 1))
        num_matches = len(chunk) - 1
        if not 0 <= num_matches <= num_drafts:
            raise SUTError(
                f"round {index}: {len(chunk)} tokens after at most {num_drafts} drafts; "
                f"transformers' draft schedule is not the constant one this adapter assumes"
            )
        last = BONUS if num_matches == num_drafts else CORRECTION
        tokens += chunk
        sources += [ACCEPTED] * num_matches + [last]
        drafted, accepted, cur_len = drafted + num_drafts, accepted + num_matches, cur_len + len(chunk)
    return RoundTrace(tuple(tokens), tuple(sources), len(chunks) - 1, drafted, accepted)


def batch_of(traces: list[RoundTrace], group: str, num_tokens: int) -> SampleBatch:
    """The SampleBatch of one row per trace: its first `num_tokens` tokens and sources, and its
    counts (which cover the whole request). SUTError naming `group` if a request ended early."""
    short = [t for t in traces if len(t.tokens) < num_tokens]
    if short:
        raise SUTError(f"group {group!r}: a request ended after {len(short[0].tokens)} of {num_tokens} tokens")
    rows = len(traces)
    return SampleBatch(
        tokens=np.array([t.tokens[:num_tokens] for t in traces], dtype=np.int64).reshape(rows, num_tokens),
        sources=np.array([t.sources[:num_tokens] for t in traces], dtype=object).reshape(rows, num_tokens),
        num_rounds=np.array([t.num_rounds for t in traces], dtype=np.int64),
        num_draft_tokens=np.array([t.num_draft_tokens for t in traces], dtype=np.int64),
        num_accepted_tokens=np.array([t.num_accepted_tokens for t in traces], dtype=np.int64),
    )
