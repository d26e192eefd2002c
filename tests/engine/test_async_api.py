"""Async speculation through the public API only (`engine.LLM`).

Deterministic: fixed seeds on the tiny model. The "different seeds differ" check could only fail
by a chance collision of two 12-token samples at temperature 1.5 over a near-uniform 64-token
vocabulary (probability below 1e-15 per pair).
"""

from __future__ import annotations

from engine import LLM, EngineConfig, SamplingParams
from tests.fixtures.engine_helpers import TINY_MODEL

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)


def async_llm(**overrides) -> LLM:
    options = dict(mode="async", model_config=TINY_MODEL, block_size=4, num_kv_blocks=512)
    options.update(overrides)
    return LLM(EngineConfig(**options))


def random_params(seed: int | None) -> SamplingParams:
    return SamplingParams(temperature=1.5, top_k=40, top_p=0.95, seed=seed, max_tokens=12, ignore_eos=True)


def test_random_requests_complete_replay_and_close_cleanly():
    seeds = [11, 12, 13, 11]
    llm = async_llm()
    first = llm.generate([PROMPTS[0]] * 4, [random_params(s) for s in seeds])
    assert all(o.finish_reason == "length" and len(o.token_ids) == 12 for o in first)
    assert [o.seed for o in first] == seeds
    assert first[0].token_ids == first[3].token_ids
    assert len({tuple(o.token_ids) for o in first[:3]}) == 3
    assert sum(o.num_accepted_tokens for o in first) > 0
    again = async_llm().generate([PROMPTS[0]] * 4, [random_params(s) for s in seeds])
    assert [o.token_ids for o in again] == [o.token_ids for o in first]
    llm.close()
    assert not llm.engine.has_unfinished() and llm.engine.kv is None


def test_assigned_seeds_replay():
    outputs = async_llm(seed=99).generate([PROMPTS[2]] * 3, random_params(None))
    seeds = [o.seed for o in outputs]
    assert len(set(seeds)) == 3
    replayed = async_llm().generate([PROMPTS[2]] * 3, [random_params(s) for s in seeds])
    assert [o.token_ids for o in replayed] == [o.token_ids for o in outputs]


def test_greedy_unchanged_next_to_random_requests():
    alone = async_llm().generate(PROMPTS, GREEDY)
    mixed = async_llm().generate(PROMPTS * 2, [GREEDY] * 3 + [random_params(s) for s in (1, 2, 3)])
    assert [o.token_ids for o in mixed[:3]] == [o.token_ids for o in alone]
    assert all(o.seed is None for o in mixed[:3])
    assert [o.token_ids for o in async_llm(mode="nospec").generate(PROMPTS, GREEDY)] == [o.token_ids for o in alone]
