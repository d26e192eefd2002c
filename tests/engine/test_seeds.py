"""Seeded replay and per-request RNG ownership (tiny random model, fixed seeds, deterministic).

These tests are deterministic: each request's uniforms depend only on (seed, position, slot).
The "different seeds differ" check could only fail by chance collision of two 12-token samples;
at temperature 1.5 over the tiny model's near-uniform 64-token vocabulary that chance is below
1e-15 per pair.
"""

from __future__ import annotations

import pytest

from engine import SamplingParams
from tests.fixtures.engine_helpers import tiny_llm

PROMPTS = [[3, 1, 4, 1, 5], [9, 2, 6], [5, 3, 5, 8, 9, 7, 9]]


def random_params(seed: int | None, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=1.5, top_k=40, top_p=0.95, seed=seed, max_tokens=max_tokens, ignore_eos=True)


@pytest.mark.parametrize("mode", ["nospec", "sync"])
def test_same_seed_same_tokens_different_seed_different_tokens(mode):
    seeds = [11, 12, 13, 11]
    first = tiny_llm(mode=mode).generate([PROMPTS[0]] * 4, [random_params(s) for s in seeds])
    again = tiny_llm(mode=mode).generate([PROMPTS[0]] * 4, [random_params(s) for s in seeds])
    tokens = [o.token_ids for o in first]
    assert tokens == [o.token_ids for o in again]
    assert tokens[0] == tokens[3]
    assert len({tuple(t) for t in tokens[:3]}) == 3
    assert [o.seed for o in first] == seeds


@pytest.mark.parametrize("mode", ["nospec", "sync"])
def test_tokens_do_not_depend_on_batch_neighbours(mode):
    alone = tiny_llm(mode=mode).generate([PROMPTS[1]], [random_params(21)])[0]
    neighbours = [random_params(s) for s in (5, 6)] + [random_params(21)]
    crowded = tiny_llm(mode=mode).generate([PROMPTS[0], PROMPTS[2], PROMPTS[1]], neighbours)[2]
    assert crowded.token_ids == alone.token_ids


@pytest.mark.parametrize("mode", ["nospec", "sync"])
def test_greedy_unchanged_next_to_random_requests(mode):
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    alone = tiny_llm(mode=mode).generate(PROMPTS, greedy)
    mixed = tiny_llm(mode=mode).generate(PROMPTS * 2, [greedy] * 3 + [random_params(s) for s in (1, 2, 3)])
    assert [o.token_ids for o in mixed[:3]] == [o.token_ids for o in alone]
    assert all(o.seed is None for o in mixed[:3])


def test_assigned_seeds_are_recorded_and_replay():
    llm = tiny_llm(mode="sync", seed=99)
    outputs = llm.generate([PROMPTS[2]] * 3, random_params(None))
    seeds = [o.seed for o in outputs]
    assert all(isinstance(s, int) and s >= 0 for s in seeds) and len(set(seeds)) == 3
    replayed = tiny_llm(mode="sync").generate([PROMPTS[2]] * 3, [random_params(s) for s in seeds])
    assert [o.token_ids for o in replayed] == [o.token_ids for o in outputs]
    assert [o.seed for o in tiny_llm(mode="sync", seed=99).generate([PROMPTS[2]] * 3, random_params(None))] == seeds


def test_shared_prompt_prefill_matches_separate_runs():
    """One prompt, many seeds in one step: the prefill is computed once and copied; every
    request must still produce what it produces alone."""
    seeds = [31, 32, 33, 34, 35]
    together = tiny_llm(mode="sync").generate([PROMPTS[2]] * 5, [random_params(s) for s in seeds])
    for seed, output in zip(seeds, together):
        alone = tiny_llm(mode="sync").generate([PROMPTS[2]], [random_params(seed)])[0]
        assert output.token_ids == alone.token_ids
