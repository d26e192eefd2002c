"""Asynchronous block speculation: equality with sync/nospec, pipelining, serial replay, stops.

Deterministic tests (fixed prompts and seeds). Greedy equality relies, like the sync == nospec
tests, on the tiny model's top-2 logit gaps being far above float32 rounding of different batch
shapes. Random async == sync relies on both modes drawing the same uniforms (counter-based RNG
keyed by the committed length) and their logits agreeing: a uniform would have to fall within
float32 rounding of a CDF or accept threshold to flip a token, which these fixed seeds do not do.
"""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, SamplingParams
from tests.fixtures.engine_helpers import (
    TINY_MODEL,
    count_non_argmax_accepted,
    looped_atol,
    no_host_reads,
    run_checking_live,
    tiny_llm,
)

PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9] * 10, [33], [5, 17, 60, 2, 2, 41], [12, 13, 14]]
MAX_TOKENS = [10, 7, 1, 4, 2, 8]


def greedy_params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_tokens=m, ignore_eos=True) for m in MAX_TOKENS]


def random_params(seed: int, max_tokens: int = 12) -> SamplingParams:
    return SamplingParams(temperature=1.5, top_k=40, top_p=0.95, seed=seed, max_tokens=max_tokens, ignore_eos=True)


def tokens(outputs) -> list[list[int]]:
    return [o.token_ids for o in outputs]


@pytest.fixture(scope="module")
def nospec_greedy() -> list[list[int]]:
    return tokens(tiny_llm(mode="nospec").generate(PROMPTS, greedy_params()))


@pytest.mark.parametrize("k, draft_loops, budget", [(0, 1, 16384), (1, 2, 16384), (3, 2, 16384), (5, 1, 15)])
def test_greedy_async_equals_sync_equals_nospec(nospec_greedy, k, draft_loops, budget):
    """K = 0 rounds, ragged K_r (max_tokens, a 15-token budget) and full rounds."""
    options = dict(num_speculative_tokens=k, draft_loops=draft_loops, max_num_batched_tokens=budget)
    sync = tiny_llm(mode="sync", **options).generate(PROMPTS, greedy_params())
    llm = tiny_llm(mode="async", **options)
    outputs = llm.generate(PROMPTS, greedy_params())
    assert tokens(outputs) == tokens(sync) == nospec_greedy
    assert [o.token_sources for o in outputs] == [o.token_sources for o in sync]
    assert [o.num_rounds for o in outputs] == [o.num_rounds for o in sync]
    assert all(o.finish_reason == "length" for o in outputs)
    assert_nothing_leaks(llm.engine)


def test_random_async_equals_sync_token_for_token():
    """Same seeds, fp32: async rounds draw the sync rounds' uniforms from the device frontier."""
    params = [random_params(s, m) for s, m in zip(range(40, 46), MAX_TOKENS)]
    params[2] = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)  # one greedy row
    sync = tiny_llm(mode="sync").generate(PROMPTS, params)
    first = tiny_llm(mode="async").generate(PROMPTS, params)
    again = tiny_llm(mode="async").generate(PROMPTS, params)
    assert tokens(first) == tokens(sync) == tokens(again)
    assert [o.token_sources for o in first] == [o.token_sources for o in sync]
    serial = tiny_llm(mode="async", rounds_in_flight=1)
    pending = []
    execute = serial.engine.runner.execute
    serial.engine.runner.execute = lambda *a: (execute(*a), pending.append(len(serial.engine.runner.in_flight)))[0]
    assert tokens(serial.generate(PROMPTS, params)) == tokens(sync)
    assert pending and not any(pending)  # one round in flight: collected in its own step


def assert_nothing_leaks(engine: Engine) -> None:
    blocks, runner = engine.scheduler.blocks, engine.runner
    assert blocks.num_free == blocks.num_blocks and blocks.num_reserved == 0
    assert not engine.scheduler.in_flight and not engine.scheduler.running
    assert runner.frontier.num_free == engine.config.max_num_seqs


def record_rounds(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Log ("submit", id, committed length, K_r) and ("collect", id, accepted); submissions run
    with every host read of tensor data forbidden."""
    runner, log = engine.runner, []
    submit, collect = runner.submit, runner.collect

    def guarded_submit(requests, num_drafts):
        log.extend(("submit", r.request_id, len(r.token_ids), k) for r, k in zip(requests, num_drafts))
        with no_host_reads(monkeypatch):
            return submit(requests, num_drafts)

    def logged_collect(pending):
        ready = collect(pending)
        log.extend(("collect", r.request_id, o.num_accepted) for r, o in ready)
        return ready

    monkeypatch.setattr(runner, "submit", guarded_submit)
    monkeypatch.setattr(runner, "collect", logged_collect)
    return log


def test_second_round_runs_before_the_first_is_committed(monkeypatch):
    """Trained model, draft_loops 1, temperature 1.5: the first rounds stop at every position
    0..K (checked). Each request's round 2 is submitted while the host still holds only its
    prompt, and the result still equals the synchronous run."""
    config = EngineConfig(mode="async", num_speculative_tokens=3, draft_loops=1, block_size=4)
    engine = Engine(config)
    prompt = engine.tokenizer.encode("Return a new list of")
    params = [SamplingParams(temperature=1.5, seed=s, max_tokens=10, ignore_eos=True) for s in range(16)]
    log = record_rounds(engine, monkeypatch)
    outputs = run(engine, {f"r{s}": (prompt, p) for s, p in enumerate(params)})
    first_accepted = set()
    for s in range(16):
        events = [e for e in log if e[1] == f"r{s}"]
        assert events[0] == ("submit", f"r{s}", len(prompt), 3)
        assert events[1] == ("submit", f"r{s}", len(prompt), 3)  # round 2 before round 1's commit
        assert events[2][0] == "collect"
        first_accepted.add(events[2][2])
    assert first_accepted == {0, 1, 2, 3}
    sync = Engine(EngineConfig(mode="sync", num_speculative_tokens=3, draft_loops=1, block_size=4))
    expected = run(sync, {f"r{s}": (prompt, p) for s, p in enumerate(params)})
    assert {k: o.token_ids for k, o in outputs.items()} == {k: o.token_ids for k, o in expected.items()}


def run(engine: Engine, requests: dict) -> dict:
    for request_id, (prompt, params) in requests.items():
        engine.add_request(request_id, prompt, params)
    outputs = {}
    while engine.has_unfinished():
        outputs.update((o.request_id, o) for o in engine.step())
    return outputs


def device_view(engine: Engine, request) -> list[int]:
    """The request's tokens as the device knows them: committed + its round in flight."""
    ids = list(request.token_ids)
    for pending in engine.runner.in_flight:
        if request in pending.requests:
            row = pending.result[pending.requests.index(request)].tolist()
            ids += row[: row[-2] + 1] if row[-1] == 0 else []
    return ids


def check_device_state(engine: Engine, request) -> None:
    """Frontier (next input, position) and every depth's KV of the device's view == replay."""
    ids, kv, model = device_view(engine, request), engine.kv, engine.model
    slot = engine.runner.frontier.slots_for((request,))[0]
    assert int(engine.runner.frontier.tokens[slot]) == ids[-1]
    assert int(engine.runner.frontier.positions[slot]) == len(ids) - 1
    replay = model.replay(torch.tensor(ids), model.num_depths)
    length = len(ids) - 1
    for depth, table in enumerate(request.block_tables):
        for layer in range(model.num_layers_per_depth):
            for pool, expected in ((kv.key[layer], replay.keys), (kv.value[layer], replay.values)):
                stored = pool[torch.tensor(table)].flatten(0, 1)[:length]
                expected_kv = expected[depth, layer, :length]  # paged vs serial summation order
                torch.testing.assert_close(stored, expected_kv, rtol=0, atol=looped_atol(model, expected_kv, length))


def test_in_flight_state_equals_serial_replay():
    """Trained model, temperature 1 / top_k 20: accepted non-argmax drafts occur. After every
    step, the device frontier and the KV of committed + in-flight tokens match a serial replay;
    max_tokens 7 and 9 make ragged and zero-draft final rounds."""
    engine = Engine(EngineConfig(mode="async", num_speculative_tokens=3, draft_loops=2, block_size=4))
    prompt = engine.tokenizer.encode("Return a new list of")
    requests = {
        f"r{i}": (
            prompt,
            SamplingParams(temperature=1.0, top_k=20, seed=100 + i, max_tokens=7 + 2 * (i % 2), ignore_eos=True),
        )
        for i in range(4)
    }
    requests["g"] = (prompt, SamplingParams(temperature=0.0, max_tokens=9, ignore_eos=True))
    for request_id, (ids, params) in requests.items():
        engine.add_request(request_id, ids, params)
    outputs, checked = run_checking_live(engine, check_device_state)
    assert checked >= 10 and len(outputs) == 5
    assert sum(o.num_draft_tokens < 3 * o.num_rounds for o in outputs) > 0  # ragged / K_r = 0
    assert count_non_argmax_accepted(engine, outputs) > 0
    assert_nothing_leaks(engine)


def test_eos_inside_an_accepted_prefix_ends_the_request_there():
    """The EOS token is accepted mid-round, with more tokens after it in that round and the
    next round already queued: none of them is delivered."""
    greedy = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    free = tiny_llm(mode="async").generate([[1, 2]], greedy)[0]
    index = next(
        i
        for i, (t, s) in enumerate(zip(free.token_ids, free.token_sources))
        if s == "accepted" and t not in free.token_ids[:i] and i >= 3
    )
    eos = free.token_ids[index]
    model = TINY_MODEL.__class__(**{**TINY_MODEL.__dict__, "eos_token_id": eos})
    llm = tiny_llm(mode="async", model_config=model)
    stopped = llm.generate([[1, 2]], SamplingParams(temperature=0.0, max_tokens=16))[0]
    assert stopped.token_ids == free.token_ids[: index + 1] and stopped.finish_reason == "stop"
    assert len(stopped.token_sources) == len(stopped.token_ids)
    assert_nothing_leaks(llm.engine)


def test_abort_mid_flight_and_request_id_reuse():
    llm = tiny_llm(mode="async")
    engine = llm.engine
    alone = tiny_llm(mode="async").generate([PROMPTS[0]], [random_params(7)])[0]
    engine.add_request("a", PROMPTS[0], random_params(7))
    engine.add_request("b", PROMPTS[1], random_params(8))
    engine.step()
    engine.step()
    assert engine.runner.in_flight  # a round of "b" is queued
    engine.abort("b")
    outputs = run(engine, {})
    assert outputs["b"].finish_reason == "abort" and outputs["a"].token_ids == alone.token_ids
    assert_nothing_leaks(engine)
    again = run(engine, {"b": (PROMPTS[0], random_params(7))})["b"]  # the ID is free again
    assert again.token_ids == alone.token_ids and again.finish_reason == "length"
    assert_nothing_leaks(engine)
