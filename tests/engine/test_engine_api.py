"""Public API: bad input gets a ValueError naming the field; aborts and failures lose nothing."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, RequestOutput, SamplingParams
from tests.fixtures.engine_helpers import TINY_MODEL, tiny_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture
def engine() -> Engine:
    return tiny_llm(mode="sync").engine


def run_all(engine: Engine) -> dict[str, RequestOutput]:
    outputs = {}
    while engine.has_unfinished():
        outputs.update((o.request_id, o) for o in engine.step())
    return outputs


@pytest.mark.parametrize("prompt, match", [
    ([], "prompt"), ("", "prompt"), ([1, 64], "outside"), ([-1], "outside"), ([1.5], "outside"),
    (None, "prompt"),
])
def test_bad_prompt(engine, prompt, match):
    with pytest.raises(ValueError, match=match):
        engine.add_request("a", prompt, GREEDY)
    assert not engine.has_unfinished()


def test_bad_params_and_lengths(engine):
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    with pytest.raises(ValueError, match="params"):
        engine.add_request("a", [1], {"temperature": 0})
    with pytest.raises(ValueError, match="max_tokens"):
        engine.add_request("a", [1, 2], SamplingParams(max_tokens=5000))
    with pytest.raises(ValueError, match="request_id"):
        engine.add_request("", [1], GREEDY)
    small = Engine(EngineConfig(model_config=TINY_MODEL, num_kv_blocks=4, block_size=4))
    with pytest.raises(ValueError, match="num_kv_blocks"):
        small.add_request("a", [1] * 8, GREEDY)


def test_request_id_in_use_then_reusable_after_finish(engine):
    engine.add_request("x", [1, 2, 3], GREEDY)
    with pytest.raises(ValueError, match="request_id='x' is still in use"):
        engine.add_request("x", [4], GREEDY)
    first = run_all(engine)["x"]
    engine.add_request("x", [1, 2, 3], GREEDY)
    assert run_all(engine)["x"].token_ids == first.token_ids


def test_abort_frees_blocks_and_others_keep_running(engine):
    reference = run_all_one(tiny_llm(mode="sync").engine, "keep", [5, 6, 7])
    engine.add_request("keep", [5, 6, 7], GREEDY)
    engine.add_request("drop", [8, 9], SamplingParams(max_tokens=30, ignore_eos=True, seed=1))
    engine.add_request("queued", [8, 9], GREEDY)
    engine.step()
    engine.abort("drop")
    with pytest.raises(ValueError, match="request_id"):
        engine.abort("never-added")
    outputs = run_all(engine)
    assert outputs["drop"].finish_reason == "abort"
    assert outputs["keep"].token_ids == reference
    assert outputs["queued"].finish_reason == "length"
    blocks = engine.scheduler.blocks
    assert blocks.num_free == blocks.num_blocks and blocks.num_reserved == 0


def run_all_one(engine: Engine, request_id: str, prompt: list[int]) -> list[int]:
    engine.add_request(request_id, prompt, GREEDY)
    return run_all(engine)[request_id].token_ids


@pytest.mark.parametrize("mode", ["nospec", "sync"])
def test_failed_request_frees_blocks_and_others_are_intact(mode):
    """A poisoned token's embedding is NaN: the request whose prompt holds it fails with
    "error" (random and greedy alike); the others, which never see it, are unchanged."""
    reference = tiny_llm(mode=mode).generate([[1, 2, 3], [6, 7]], GREEDY)
    poison = min(set(range(1, 64)) - {t for o in reference for t in o.token_ids + o.prompt_token_ids})
    prompts = [[1, 2, 3], [4, poison, 5], [6, 7], [poison]]
    params = [GREEDY, SamplingParams(temperature=1.0, seed=3, max_tokens=6), GREEDY, GREEDY]
    llm = tiny_llm(mode=mode)
    with torch.no_grad():
        llm.engine.model.embedding.weight[poison] = float("nan")
    outputs = llm.generate(prompts, params)
    for failed in (outputs[1], outputs[3]):
        assert failed.finish_reason == "error" and failed.token_ids == []
    assert [outputs[0].token_ids, outputs[2].token_ids] == [o.token_ids for o in reference]
    blocks = llm.engine.scheduler.blocks
    assert blocks.num_free == blocks.num_blocks and blocks.num_reserved == 0
    again = llm.generate([prompts[0]] * 3, GREEDY)  # reused blocks were zeroed: no NaN leaks
    assert all(o.token_ids == reference[0].token_ids for o in again)


def test_stop_tokens_eos_and_length():
    llm = tiny_llm(mode="sync", num_speculative_tokens=3)
    free = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    stop = free.token_ids[4]
    cut = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=12,
                                                   stop_token_ids=(stop,)))[0]
    first = free.token_ids.index(stop)
    assert cut.token_ids == free.token_ids[:first + 1] and cut.finish_reason == "stop"
    assert len(cut.token_sources) == len(cut.token_ids)
    assert free.finish_reason == "length" and len(free.token_ids) == 12


def test_eos_stops_unless_ignored():
    config = dict(mode="nospec")
    free = tiny_llm(**config).generate([[1, 2]], SamplingParams(temperature=0.0, max_tokens=12,
                                                                ignore_eos=True))[0]
    eos = free.token_ids[2]
    model = TINY_MODEL.__class__(**{**TINY_MODEL.__dict__, "eos_token_id": eos})
    stopped = tiny_llm(model_config=model, **config).generate(
        [[1, 2]], SamplingParams(temperature=0.0, max_tokens=12))[0]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == eos
    assert stopped.token_ids == free.token_ids[:free.token_ids.index(eos) + 1]


def test_generate_accepts_text_and_keeps_order():
    llm = tiny_llm(mode="sync", model_config=TINY_MODEL.__class__(
        **{**TINY_MODEL.__dict__, "vocab_size": 256}))
    outputs = llm.generate(["hi", "there", "a"], SamplingParams(seed=1, max_tokens=3))
    assert [o.prompt_token_ids for o in outputs] == [list(b"hi"), list(b"there"), list(b"a")]
    with pytest.raises(ValueError, match="params"):
        llm.generate(["a", "b"], [GREEDY])
    assert llm.tokenizer.decode(llm.tokenizer.encode("héllo")) == "héllo"
    llm.close()
