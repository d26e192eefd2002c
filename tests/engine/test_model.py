"""The looped model's paged path (prefill + decode through block tables) equals serial replay."""

from __future__ import annotations

import pytest
import torch

from engine import SamplingParams
from engine.models.looped import LoopedModel
from engine.runners.layout import depth_metadata, layout_rows
from tests.fixtures.engine_helpers import TINY_MODEL, looped_atol, tiny_llm


def test_paged_prefill_and_decode_match_replay():
    llm = tiny_llm(mode="nospec")
    engine = llm.engine
    prompts = [[1, 2, 3, 4, 5, 6, 7], [9, 8], [40, 41, 42, 43, 44]]
    for i, prompt in enumerate(prompts):
        engine.add_request(str(i), prompt, SamplingParams(temperature=0.0, max_tokens=3))
    batch = engine.scheduler.schedule()
    engine.runner.prefill(batch.prefill)
    requests = batch.decode
    layout = engine.runner.layout([r.num_computed for r in requests], [1] * len(requests))
    hidden = engine.model.embed(engine.runner.last_tokens(requests))
    for depth in range(1, engine.model.num_depths + 1):
        hidden = engine.runner.run_depths(hidden, layout, requests, depth, depth)
        logits = engine.model.readout(hidden)
        for row, prompt in enumerate(prompts):
            expected = engine.model.replay(torch.tensor(prompt), depth).logits[-1, -1]
            # batched (paged) vs serial evaluation: the same function in another summation order
            atol = looped_atol(engine.model, expected, len(prompt))
            torch.testing.assert_close(logits[row], expected, atol=atol, rtol=0)


def test_layout_refuses_a_block_table_too_short():
    layout = layout_rows([0, 5], [3, 2], block_size=4, device=torch.device("cpu"))
    with pytest.raises(RuntimeError, match="cannot hold position 6"):
        depth_metadata(layout, [[1], [2]])


def test_random_weights_are_a_function_of_the_seed():
    a, b = LoopedModel.from_seed(TINY_MODEL), LoopedModel.from_seed(TINY_MODEL)
    c = LoopedModel.from_seed(TINY_MODEL.__class__(**{**TINY_MODEL.__dict__, "seed": 2}))
    ids = torch.tensor([1, 2, 3])
    assert torch.equal(a.replay(ids, 3).logits, b.replay(ids, 3).logits)
    assert not torch.equal(a.replay(ids, 3).logits, c.replay(ids, 3).logits)
    with pytest.raises(ValueError, match="depth"):
        a.replay(ids, 4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 2, 17])
def test_target_logits_are_replays_last_readout_bit_for_bit(dtype, length):
    """The same operations in the same order: equal bits, not merely close ones."""
    model = LoopedModel.from_seed(TINY_MODEL).to(dtype)
    ids = torch.randint(0, model.vocab_size, (length,), generator=torch.Generator().manual_seed(length))
    expected = model.replay(ids, model.num_depths).logits[-1]
    assert model.target_logits(ids).dtype == torch.float32
    assert torch.equal(model.target_logits(ids), expected)


@pytest.mark.parametrize("mode", ["nospec", "sync"])
def test_bfloat16_engine_generates(mode):
    llm = tiny_llm(mode=mode, dtype="bfloat16")
    assert llm.engine.model.embedding.weight.dtype == torch.bfloat16
    assert llm.engine.kv.key[0].dtype == torch.bfloat16
    outputs = llm.generate(
        [[1, 2, 3]] * 2, [SamplingParams(temperature=0.0, max_tokens=5), SamplingParams(seed=4, max_tokens=5)]
    )
    assert all(len(o.token_ids) == 5 and o.finish_reason == "length" for o in outputs)
    assert llm.full_depth_logits([1, 2, 3]).dtype == torch.float32


def test_engine_serves_an_injected_depth_model():
    """A ready-built DepthModel replaces the configured one; the config only sets the engine."""
    model = LoopedModel.from_seed(TINY_MODEL.__class__(**{**TINY_MODEL.__dict__, "seed": 5}))
    injected = tiny_llm(mode="sync", model_config=TINY_MODEL)
    injected = type(injected)(injected.engine.config, model=model)
    built = tiny_llm(mode="sync", model_config=TINY_MODEL.__class__(**{**TINY_MODEL.__dict__, "seed": 5}))
    greedy = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    assert injected.engine.model is model
    assert injected.generate([[1, 2, 3]], greedy)[0].token_ids == built.generate([[1, 2, 3]], greedy)[0].token_ids
