"""Token sources of a vLLM request from its per-step speculative metrics (deterministic)."""

import pytest

from specval.adapters.vllm_rounds import spec_trace
from specval.sut import SUTError


def test_draft_model_steps():
    # prefill -> t1; step 1: 4 drafts, 2 accepted + correction; step 2: 4 drafts all accepted + bonus
    trace = spec_trace(list(range(9)), drafted=[4, 4], accepted=[2, 4])
    assert trace.sources == (
        "plain",
        "accepted",
        "accepted",
        "correction",
        "accepted",
        "accepted",
        "accepted",
        "accepted",
        "bonus",
    )
    assert (trace.num_rounds, trace.num_draft_tokens, trace.num_accepted_tokens) == (2, 8, 6)


def test_output_cut_at_max_tokens_in_the_last_step():
    trace = spec_trace([7, 8, 9], drafted=[4], accepted=[4])
    assert trace.sources == ("plain", "accepted", "accepted")


def test_ngram_steps_without_drafts_are_plain():
    drafts_at = lambda n: n in (2,)  # noqa: E731 - the proposer matches only after 2 tokens
    trace = spec_trace([1, 2, 3, 4, 5], drafted=[3], accepted=[0], drafts_at=drafts_at)
    assert trace.sources == ("plain", "plain", "correction", "plain", "plain")


def test_unrecorded_drafting_step_is_an_error():
    with pytest.raises(SUTError, match="did not record"):
        spec_trace([1, 2, 3], drafted=[], accepted=[], drafts_at=lambda n: True)


def test_unused_recorded_steps_are_an_error():
    with pytest.raises(SUTError, match="do not account"):
        spec_trace([1, 2, 3], drafted=[4, 4, 4], accepted=[0, 0, 0], drafts_at=lambda n: n == 1)


def test_more_accepted_than_drafted_is_an_error():
    with pytest.raises(SUTError, match="accepted of"):
        spec_trace([1, 2, 3], drafted=[1], accepted=[2])
