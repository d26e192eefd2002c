"""Admission is atomic: a batch with any invalid request is refused whole, before anything is
queued or any engine seed drawn, so the engine afterwards behaves exactly like a fresh one.

Deterministic: fixed engine seed, tiny random-weight model, CPU; tokens are compared exactly.
"""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.fixtures.engine_helpers import TINY_MODEL, tiny_llm

# Random requests without their own seed: each draws the next engine seed at admission, so a
# request left queued by a refused batch (or a seed drawn for it) changes every later output.
RANDOM = SamplingParams(temperature=1.0, max_tokens=5, ignore_eos=True)
VALID = [[1, 2, 3], [7, 8], [9, 10, 11, 12]]
MAX_MODEL_LEN = 32


def fresh_llm():
    return tiny_llm(mode="sync", seed=3, max_model_len=MAX_MODEL_LEN)


def tokens_and_seeds(outputs):
    return [(o.request_id, o.token_ids, o.seed) for o in outputs]


@pytest.mark.parametrize(
    "bad_prompt, match",
    [
        ([1, TINY_MODEL.vocab_size], "outside"),  # invalid token id (prompt_token_ids)
        ([5] * MAX_MODEL_LEN, "prompt of 32 tokens is too long"),  # too long (_check_fits)
    ],
)
def test_refused_batch_admits_nothing_and_draws_no_seed(bad_prompt, match):
    llm = fresh_llm()
    with pytest.raises(ValueError, match=f"request 2 of the batch .*{match}.*no request of the batch was admitted"):
        llm.generate([VALID[0], VALID[1], bad_prompt], RANDOM)
    assert not llm.engine.has_unfinished()
    expected = tokens_and_seeds(fresh_llm().generate(VALID, RANDOM))
    assert tokens_and_seeds(llm.generate(VALID, RANDOM)) == expected


def test_refused_add_request_draws_no_seed():
    """A single request refused after its prompt was read (too long for max_tokens) draws no seed."""
    llm = fresh_llm()
    with pytest.raises(ValueError, match="max_tokens=40 is invalid"):
        llm.engine.add_request("x", [1, 2], SamplingParams(max_tokens=40))
    expected = tokens_and_seeds(fresh_llm().generate(VALID, RANDOM))
    assert tokens_and_seeds(llm.generate(VALID, RANDOM)) == expected


def test_duplicate_request_id_within_a_batch_is_refused_whole():
    engine = fresh_llm().engine
    with pytest.raises(ValueError, match="request 1 of the batch \\('a'\\): request_id='a' is still"):
        engine.add_requests([("a", [1, 2], RANDOM), ("a", [3], RANDOM)])
    assert not engine.has_unfinished()


@pytest.mark.parametrize("prompt_len", [MAX_MODEL_LEN, MAX_MODEL_LEN + 5])
def test_over_long_prompt_names_its_length_and_max_model_len(prompt_len):
    engine = fresh_llm().engine
    with pytest.raises(ValueError) as error:
        engine.add_request("a", [1] * prompt_len, SamplingParams(max_tokens=1))
    message = str(error.value)
    assert f"prompt of {prompt_len} tokens" in message
    assert f"max_model_len={MAX_MODEL_LEN}" in message and "max_tokens" not in message


def test_prompt_that_fits_with_max_tokens_one_is_admitted():
    """The boundary of the length check: prompt + 1 generated token == max_model_len."""
    llm = tiny_llm(mode="nospec", max_model_len=MAX_MODEL_LEN, max_num_batched_tokens=64)
    out = llm.generate([[1] * (MAX_MODEL_LEN - 1)], SamplingParams(temperature=0.0, max_tokens=1))
    assert len(out[0].token_ids) == 1
