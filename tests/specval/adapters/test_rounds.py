"""Token sources derived from the chunks transformers streams (specval.adapters.rounds); pure, no model."""

from __future__ import annotations

import numpy as np
import pytest

from specval.adapters.rounds import RoundLog, assisted_trace, plain_trace
from specval.sut import SUTError

PROMPT = [11, 12, 13, 14]


def test_round_log_keeps_chunks_as_token_lists():
    log = RoundLog()
    log.put(np.array([PROMPT]))
    log.put(np.array([[5, 6]]))
    log.end()
    assert log.chunks == [PROMPT, [5, 6]]


def test_plain_trace_is_all_plain_without_rounds():
    trace = plain_trace([PROMPT, [1], [2], [3]])
    assert trace.tokens == (1, 2, 3) and trace.sources == ("plain",) * 3
    assert (trace.num_rounds, trace.num_draft_tokens, trace.num_accepted_tokens) == (0, 0, 0)


def test_assisted_trace_follows_the_capped_constant_schedule():
    # K = 4, 6 new tokens: max_length 10. Round drafts = min(4, 10 - cur_len - 1):
    # cur_len 4 -> 4 drafts, 2 tokens (1 accepted + correction); cur_len 6 -> 3 drafts, all 3
    # accepted + bonus (4 tokens): 10 tokens in all.
    trace = assisted_trace([PROMPT, [1, 2], [3, 4, 5, 6]], num_assistant_tokens=4, max_new_tokens=6)
    assert trace.tokens == (1, 2, 3, 4, 5, 6)
    assert trace.sources == ("accepted", "correction", "accepted", "accepted", "accepted", "bonus")
    assert (trace.num_rounds, trace.num_draft_tokens, trace.num_accepted_tokens) == (2, 7, 4)


def test_a_round_without_drafts_is_a_bonus():
    # cur_len 9 of max_length 10: no room for a draft, the token is drawn from p directly.
    trace = assisted_trace([PROMPT, [1], [2], [3], [4], [5], [6]], num_assistant_tokens=4, max_new_tokens=6)
    assert trace.sources == ("correction",) * 5 + ("bonus",)
    assert trace.num_draft_tokens == 4 + 4 + 3 + 2 + 1 + 0


def test_more_matches_than_drafts_is_refused():
    with pytest.raises(SUTError, match="round 0: 6 tokens after at most 4 drafts"):
        assisted_trace([PROMPT, [1, 2, 3, 4, 5, 6]], num_assistant_tokens=4, max_new_tokens=6)


def test_empty_stream_is_refused():
    with pytest.raises(SUTError, match="streamed nothing"):
        assisted_trace([], num_assistant_tokens=4, max_new_tokens=6)
