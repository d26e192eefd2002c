"""Capacity pressure: a tiny block pool makes requests queue; nothing is corrupted or lost."""

from __future__ import annotations

from engine import SamplingParams
from tests.fixtures.engine_helpers import tiny_llm


def workload():
    prompts = [[(7 * i + j) % 63 + 1 for j in range(1 + i % 9)] for i in range(40)]
    params = [
        SamplingParams(temperature=0.0 if i % 3 == 0 else 1.0, top_k=30, seed=i, max_tokens=3 + i % 7, ignore_eos=True)
        for i in range(40)
    ]
    return prompts, params


def test_tiny_pool_finishes_everything_with_unpressured_outputs():
    prompts, params = workload()
    roomy = tiny_llm(mode="sync", num_speculative_tokens=3).generate(prompts, params)
    # 3 depths x ceil((9 + 9) / 4) = 15 blocks for the largest request: at most a few fit at once
    llm = tiny_llm(mode="sync", num_speculative_tokens=3, num_kv_blocks=40)
    progress = []
    pressured = llm.generate(prompts, params, progress=lambda done, total: progress.append(done))
    assert [o.token_ids for o in pressured] == [o.token_ids for o in roomy]
    assert all(o.finish_reason == "length" for o in pressured)
    assert not llm.engine.scheduler.running and not llm.engine.scheduler.waiting
    assert progress[-1] == len(prompts) and len(progress) > 10  # many steps: requests queued
    blocks = llm.engine.scheduler.blocks
    assert blocks.num_free == 40 and blocks.num_reserved == 0


def test_max_num_seqs_limits_the_running_batch():
    prompts, params = workload()
    llm = tiny_llm(mode="nospec", max_num_seqs=4)
    engine, seen = llm.engine, []
    for i, (prompt, p) in enumerate(zip(prompts[:10], params[:10])):
        engine.add_request(str(i), prompt, p)
    while engine.has_unfinished():
        engine.step()
        seen.append(len(engine.scheduler.running))
    assert max(seen) == 4
