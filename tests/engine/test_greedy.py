"""Greedy speculation is lossless token for token: sync == nospec.

Greedy rows accept a draft iff it is the target argmax and emit the target argmax at the stop
point, so the committed tokens must equal plain greedy decoding whatever K, the draft depth,
the per-step token budget (ragged K_r) or max_tokens. Logits of one position differ between the
two modes only by float32 rounding of different batch shapes; the tiny model's top-2 logit gaps
are far above that, so a near-tie flip is not expected for these fixed prompts.
"""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.fixtures.engine_helpers import tiny_llm

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9] * 10, [33], [5, 17, 60, 2, 2, 41], [12, 13, 14]]
MAX_TOKENS = [10, 7, 1, 4, 2, 8]


def greedy_params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]


@pytest.fixture(scope="module")
def nospec_tokens() -> list[list[int]]:
    llm = tiny_llm(mode="nospec")
    return [o.token_ids for o in llm.generate(PROMPTS, greedy_params())]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
@pytest.mark.parametrize("draft_loops", [1, 2])
@pytest.mark.parametrize("budget", [16384, 15])
def test_sync_equals_nospec(nospec_tokens, k, draft_loops, budget):
    llm = tiny_llm(mode="sync", num_speculative_tokens=k, draft_loops=draft_loops, max_num_batched_tokens=budget)
    outputs = llm.generate(PROMPTS, greedy_params())
    assert [o.token_ids for o in outputs] == nospec_tokens
    for output, max_tokens in zip(outputs, MAX_TOKENS):
        assert len(output.token_ids) == max_tokens and output.finish_reason == "length"
        assert output.num_accepted_tokens <= output.num_draft_tokens <= k * output.num_rounds
        assert output.token_sources.count("accepted") == output.num_accepted_tokens
    assert sum(o.num_accepted_tokens for o in outputs) > 0


def test_budget_makes_rounds_ragged():
    """With a 15-token budget and K=5 not every round can draft 5: K_r < K must occur."""
    llm = tiny_llm(mode="sync", num_speculative_tokens=5, max_num_batched_tokens=15)
    outputs = llm.generate(PROMPTS, greedy_params())
    assert sum(o.num_draft_tokens for o in outputs) < 5 * sum(o.num_rounds for o in outputs)
