"""Random rows against a serial replay: committed tokens, next input, per-depth KV, RNG protocol.

Uses the trained default model at temperature 1 / top_k 20 (acceptance ~0.9 at draft_loops 2),
so rounds accept non-argmax drafts and also reject some. Tolerance: paged (batched) and serial
(dense) evaluation of the same positions differ only in float32 summation order; keys, values
and logits are compared within tests/fixtures/engine_helpers.py looped_atol (a rounding analysis of the chained
reductions), scaled by each compared tensor's magnitude.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.sampling import Sampler, categorical, speculative_accept, uniform_blocks
from tests.fixtures.engine_helpers import count_non_argmax_accepted, looped_atol, run_checking_live

PROMPT = "Return a new list of"


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(EngineConfig(mode="sync", num_speculative_tokens=3, draft_loops=2, block_size=4))


def paged(pool: torch.Tensor, table: list[int], length: int) -> torch.Tensor:
    """Positions 0..length-1 of one sequence from a [blocks, bs, H, Dh] pool."""
    return pool[torch.tensor(table)].flatten(0, 1)[:length]


def check_against_replay(engine: Engine, request) -> None:
    model, kv = engine.model, engine.kv
    length = request.num_computed
    replay = model.replay(torch.tensor(request.token_ids), model.num_depths)
    for depth, table in enumerate(request.block_tables):
        assert len(table) == -(-length // kv.layout.block_size)  # rejected tail truncated
        for layer in range(model.num_layers_per_depth):
            for pool, expected in ((kv.key[layer], replay.keys), (kv.value[layer], replay.values)):
                expected = expected[depth, layer, :length]
                torch.testing.assert_close(
                    paged(pool, table, length), expected, rtol=0, atol=looped_atol(model, expected, length)
                )
    expected = replay.logits[-1, -1]
    torch.testing.assert_close(
        frontier_logits(engine, request), expected, rtol=0, atol=looped_atol(model, expected, length + 1)
    )


def frontier_logits(engine: Engine, request) -> torch.Tensor:
    """Full-depth logits of the next round's first row, built the way the runner builds it
    (its input token and position), over the paged cache. The KV it writes at the frontier is
    what the next step writes there too."""
    runner, requests = engine.runner, (request,)
    for table in request.block_tables:
        engine.scheduler.blocks.grow(table, request.num_computed + 1)
    layout = runner.layout([request.num_computed], [1])
    hidden = runner.run_depths(
        engine.model.embed(runner.last_tokens(requests)), layout, requests, 1, engine.model.num_depths
    )
    return engine.model.readout(hidden)[0]


def test_committed_state_equals_serial_replay(engine):
    prompt = engine.tokenizer.encode(PROMPT)
    for i in range(4):
        engine.add_request(
            f"r{i}", prompt, SamplingParams(temperature=1.0, top_k=20, seed=100 + i, max_tokens=14, ignore_eos=True)
        )
    engine.add_request("g", prompt, SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True))
    outputs, checked = run_checking_live(engine, check_against_replay)
    assert checked >= 5 and len(outputs) == 5
    assert count_non_argmax_accepted(engine, outputs) > 0


def model_logits(engine: Engine, ids: list[int]) -> torch.Tensor:
    return engine.model.replay(torch.tensor(ids), engine.model.num_depths).logits[-1, -1]


def test_first_round_follows_the_rng_protocol(engine):
    """Round 1 of a random request, rebuilt serially: one block uniform_blocks(seed, n, 2K+1),
    drafts categorical(q_j, u[j-1]), accept tests u[K:2K], correction/bonus u[2K]."""
    k, seed, params = 3, 7, SamplingParams(temperature=1.0, top_k=20, seed=7, max_tokens=4, ignore_eos=True)
    prompt = engine.tokenizer.encode(PROMPT)
    engine.add_request("proto", prompt, params)
    while engine.has_unfinished():
        (output,) = engine.step() or (None,)
    u = uniform_blocks(torch.tensor([seed]), torch.tensor([len(prompt)]), 2 * k + 1)
    sampler, ids, drafts, q, p = Sampler(), list(prompt), [], [], []
    for j in range(k + 1):
        p.append(sampler.probabilities(model_logits(engine, ids), params))
        if j == k:
            break
        draft_logits = engine.model.replay(torch.tensor(ids), 2).logits[-1, -1]
        q.append(sampler.probabilities(draft_logits, params))
        drafts.append(int(categorical(q[-1][None], u[:, j])[0]))
        ids.append(drafts[-1])
    result = speculative_accept(
        torch.tensor(drafts), torch.tensor([0, k]), torch.stack(q), torch.stack(p), u, torch.tensor([False])
    )
    num_accepted = int(result.num_accepted[0])
    assert output.token_ids[: num_accepted + 1] == result.tokens[0, : num_accepted + 1].tolist()
    assert output.token_sources[num_accepted] == ("bonus" if num_accepted == k else "correction")


def test_nospec_token_follows_the_rng_protocol():
    engine = Engine(EngineConfig(mode="nospec"))
    prompt = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=11, max_tokens=2, ignore_eos=True)
    engine.add_request("n", prompt, params)
    outputs = []
    while engine.has_unfinished():
        outputs += engine.step()
    ids = prompt + outputs[0].token_ids
    for i in range(2):
        probs = Sampler().probabilities(model_logits(engine, ids[: len(prompt) + i]), params)
        u = uniform_blocks(torch.tensor([11]), torch.tensor([len(prompt) + i]), 1)[:, 0]
        assert int(categorical(probs[None], u)[0]) == outputs[0].token_ids[i]
    assert outputs[0].token_sources == ["plain", "plain"]
