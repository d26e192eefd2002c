"""The engine on CUDA (Triton sampling kernels through backend "auto"): skipped without a GPU."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, EngineConfig, SamplingParams

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PROMPTS = ["Return the number of", "Raise ValueError if", "A"]


def test_greedy_sync_equals_nospec_on_cuda():
    greedy = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
    plain = LLM(EngineConfig(mode="nospec", device="cuda")).generate(PROMPTS, greedy)
    spec = LLM(EngineConfig(mode="sync", device="cuda")).generate(PROMPTS, greedy)
    assert [o.token_ids for o in spec] == [o.token_ids for o in plain]


def test_seeded_random_replays_on_cuda():
    params = [SamplingParams(temperature=1.0, top_k=20, seed=s, max_tokens=12, ignore_eos=True) for s in (1, 2, 3)]
    first = LLM(EngineConfig(mode="sync", device="cuda")).generate(PROMPTS, params)
    again = LLM(EngineConfig(mode="sync", device="cuda")).generate(PROMPTS, params)
    assert [o.token_ids for o in first] == [o.token_ids for o in again]
    assert all(len(o.token_ids) == 12 and o.finish_reason == "length" for o in first)
