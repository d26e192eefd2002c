"""Async error flags: a live flag fails its request once and leaks nothing; stale flags are ignored.

Deterministic (tiny model, greedy and fixed seeds).
"""

from __future__ import annotations

import dataclasses

import torch

from engine import SamplingParams
from engine.runners.base import probabilities
from engine.sampling import ERR_INVALID_TARGET
from engine.scheduler import Scheduler
from tests.fixtures.engine_helpers import tiny_llm

PROMPTS = [[1, 2, 3], [6, 7], [20, 21, 22, 23]]
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True)
VICTIM_TEMPERATURE = 0.75  # identifies the poisoned request's rows on the device


def assert_nothing_leaks(engine) -> None:
    blocks = engine.scheduler.blocks
    assert blocks.num_free == blocks.num_blocks and blocks.num_reserved == 0
    assert not engine.scheduler.in_flight and not engine.scheduler.running
    assert engine.runner.frontier.num_free == engine.config.max_num_seqs


def poison_after(num_calls: int, temperature: float):
    """A verify `probabilities` that, from its num_calls-th call on, turns the logits of rows
    with the given temperature into NaN (on the device: no host read)."""
    calls = []

    def poisoned(logits, rows, backend):
        calls.append(None)
        if len(calls) >= num_calls:
            logits = torch.where((rows.temperature == temperature)[:, None], float("nan"), logits)
        return probabilities(logits, rows, backend)

    return poisoned


def test_nan_in_one_request_fails_it_once_and_others_continue(monkeypatch):
    """From the 3rd round on, request 1's logits are NaN: its round raises the error flag while
    its next round is queued; it finishes with "error" through one cleanup call, keeping only
    the tokens of its earlier rounds; the others are unchanged and nothing leaks."""
    params = [
        GREEDY,
        SamplingParams(temperature=VICTIM_TEMPERATURE, seed=5, max_tokens=12, ignore_eos=True),
        SamplingParams(temperature=1.0, seed=6, max_tokens=12, ignore_eos=True),
    ]
    reference = tiny_llm(mode="async").generate(PROMPTS, params)
    failures = []
    fail = Scheduler.fail
    monkeypatch.setattr(Scheduler, "fail", lambda self, r: (failures.append(r.request_id), fail(self, r)))
    # each round builds its target rows once; poison them from the 3rd round on
    llm = tiny_llm(mode="async")
    runner = llm.engine.runner
    runner.ops = dataclasses.replace(runner.ops, verify_probabilities=poison_after(3, VICTIM_TEMPERATURE))
    outputs = llm.generate(PROMPTS, params)
    assert outputs[1].finish_reason == "error" and failures == [outputs[1].request_id]
    assert 0 < len(outputs[1].token_ids) < len(reference[1].token_ids)
    assert outputs[1].token_ids == reference[1].token_ids[: len(outputs[1].token_ids)]
    assert [outputs[0].token_ids, outputs[2].token_ids] == [reference[0].token_ids, reference[2].token_ids]
    assert_nothing_leaks(llm.engine)


def test_stale_flags_in_reused_buffers_never_fail_a_round():
    """Every row of both host result buffers is pre-filled with an error flag and out-of-range
    tokens; rounds overwrite only their own rows and are decoded within them, so the run equals
    a clean one (live flags are the previous test's)."""
    params = [
        SamplingParams(temperature=1.0, seed=s, max_tokens=m, ignore_eos=True) for s, m in zip((1, 2, 3), (12, 5, 3))
    ]  # shrinking rounds leave stale rows
    clean = tiny_llm(mode="async").generate(PROMPTS, params)
    llm = tiny_llm(mode="async")
    for buffer in llm.engine.runner.host_buffers:
        buffer.fill_(10**6)
        buffer[:, -1] = ERR_INVALID_TARGET
    outputs = llm.generate(PROMPTS, params)
    assert [o.token_ids for o in outputs] == [o.token_ids for o in clean]
    assert all(o.finish_reason == "length" for o in outputs)
    assert_nothing_leaks(llm.engine)
