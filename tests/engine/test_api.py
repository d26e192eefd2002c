"""Public API: bad input gets a ValueError naming the field; aborts and failures lose nothing."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from engine import Engine, EngineConfig, RequestOutput, SamplingParams
from tests.fixtures.engine_helpers import TINY_MODEL, looped_atol, tiny_llm

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)


@pytest.fixture
def engine() -> Engine:
    return tiny_llm(mode="sync").engine


def run_all(engine: Engine) -> dict[str, RequestOutput]:
    outputs = {}
    while engine.has_unfinished():
        outputs.update((o.request_id, o) for o in engine.step())
    return outputs


@pytest.mark.parametrize(
    "prompt, match",
    [
        ([], "prompt"),
        ("", "prompt"),
        ([1, 64], "outside"),
        ([-1], "outside"),
        ([1.5], "outside"),
        (None, "prompt"),
    ],
)
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
    cut = llm.generate([[1, 2, 3]], SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=(stop,)))[0]
    first = free.token_ids.index(stop)
    assert cut.token_ids == free.token_ids[: first + 1] and cut.finish_reason == "stop"
    assert len(cut.token_sources) == len(cut.token_ids)
    assert free.finish_reason == "length" and len(free.token_ids) == 12


def test_eos_stops_unless_ignored():
    config = dict(mode="nospec")
    free = tiny_llm(**config).generate([[1, 2]], SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True))[0]
    eos = free.token_ids[2]
    model = TINY_MODEL.__class__(**{**TINY_MODEL.__dict__, "eos_token_id": eos})
    stopped = tiny_llm(model_config=model, **config).generate([[1, 2]], SamplingParams(temperature=0.0, max_tokens=12))[
        0
    ]
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == eos
    assert stopped.token_ids == free.token_ids[: free.token_ids.index(eos) + 1]


def test_generate_accepts_text_and_keeps_order():
    llm = tiny_llm(mode="sync", model_config=TINY_MODEL.__class__(**{**TINY_MODEL.__dict__, "vocab_size": 256}))
    outputs = llm.generate(["hi", "there", "a"], SamplingParams(seed=1, max_tokens=3))
    assert [o.prompt_token_ids for o in outputs] == [list(b"hi"), list(b"there"), list(b"a")]
    with pytest.raises(ValueError, match="params"):
        llm.generate(["a", "b"], [GREEDY])
    assert llm.tokenizer.decode(llm.tokenizer.encode("héllo")) == "héllo"
    llm.close()


# ---------------------------------------------------------------- target logits along a sequence

ALONG_PROMPT = [5, 9, 17, 2, 33, 40, 1, 8, 12, 60, 7, 3]
ALONG_TOKENS = 70


def _recording_verify(runner, recorded: list):
    """Wrap the runner's verify readout so every round's target logits are kept (test only)."""
    verify = runner.ops.verify_probabilities

    def record(logits, rows, backend):
        recorded.append(logits.detach().clone())
        return verify(logits, rows, backend)

    runner.ops = dataclasses.replace(runner.ops, verify_probabilities=record)


def _decode_rows(recorded, sources) -> torch.Tensor:
    """The verify row behind each committed token: a round of one request emits tokens j = 1..m+1
    from its rows 0..m (m accepted drafts, then the correction or bonus)."""
    rows, token = [], 0
    for logits in recorded:
        end = next(i for i in range(token, len(sources)) if sources[i] in ("correction", "bonus"))
        rows.append(logits[: end - token + 1])
        token = end + 1
    assert token == len(sources)
    return torch.cat(rows)


def test_target_logits_along_equal_the_logits_the_decode_used():
    # Tolerance: row i of the decode comes from the paged, batched verify pass and row i here from
    # the dense serial replay; they run the same operations in different summation orders, bounded
    # by looped_atol (a rounding analysis of the chained reductions, tests/fixtures/engine_helpers.py).
    llm = tiny_llm(mode="sync", num_speculative_tokens=3, draft_loops=1)
    recorded = []
    _recording_verify(llm.engine.runner, recorded)
    params = SamplingParams(temperature=0.05, seed=5, max_tokens=ALONG_TOKENS, ignore_eos=True)
    (output,) = llm.generate([ALONG_PROMPT], params)
    decoded = _decode_rows(recorded, output.token_sources)
    along = llm.target_logits_along(ALONG_PROMPT, output.token_ids)
    assert along.shape == (ALONG_TOKENS, 64) and along.dtype == torch.float32
    assert "accepted" in output.token_sources and "correction" in output.token_sources
    torch.testing.assert_close(
        along, decoded, rtol=0, atol=looped_atol(llm.engine.model, decoded, len(ALONG_PROMPT) + ALONG_TOKENS)
    )
    torch.testing.assert_close(
        along[-1],
        llm.full_depth_logits(ALONG_PROMPT + output.token_ids[:-1]),
        rtol=0,
        atol=looped_atol(llm.engine.model, decoded, len(ALONG_PROMPT) + ALONG_TOKENS),
    )
    assert not llm.engine.has_unfinished() and llm.engine.scheduler.blocks.num_reserved == 0


def test_target_logits_along_leave_running_requests_alone():
    params = SamplingParams(temperature=0.05, seed=3, max_tokens=12, ignore_eos=True)
    (alone,) = tiny_llm(mode="sync").generate([ALONG_PROMPT], params)
    llm = tiny_llm(mode="sync")
    llm.engine.add_request("live", ALONG_PROMPT, params)
    llm.engine.step()  # the request now has committed tokens and KV in the paged cache
    llm.target_logits_along(ALONG_PROMPT, alone.token_ids)
    assert run_all(llm.engine)["live"].token_ids == alone.token_ids


@pytest.mark.parametrize(
    ("tokens", "match"),
    [
        ([], "token_ids"),
        ([64], "outside"),
        ([1.5], "outside"),
        ("ab", "token_ids"),
        ([1] * 21, "max_model_len=32"),
    ],
)
def test_target_logits_along_names_bad_input_and_the_length_limit(tokens, match):
    llm = tiny_llm(mode="sync", max_model_len=32)
    with pytest.raises(ValueError, match=match):
        llm.target_logits_along(ALONG_PROMPT, tokens)
    fits = llm.target_logits_along(ALONG_PROMPT, [1] * 20)  # 12 + 20 = 32 fits
    assert fits.shape == (20, 64)
    assert torch.equal(llm.target_logits_along(np.array(ALONG_PROMPT), np.ones(20, dtype=np.int64)), fits)


@pytest.mark.gpu
def test_target_logits_along_on_cuda_match_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    tokens = [1 + i % 63 for i in range(64)]  # 64 tokens, every id of the tiny model's V = 64 but 0
    cpu = tiny_llm(mode="sync").target_logits_along(ALONG_PROMPT, tokens)
    cuda = tiny_llm(mode="sync", device="cuda").target_logits_along(ALONG_PROMPT, tokens)
    assert cuda.device.type == "cpu"
    torch.testing.assert_close(cuda, cpu, rtol=0, atol=looped_atol(tiny_llm().engine.model, cpu, 76))


# ---------------------------------------------------------------- batched replays (the harness's chunks)

BATCH_ROWS = 5


def _rows(seed: int, count: int, length: int, vocab: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=(count, length))


@pytest.mark.parametrize("override", [None, "noisy", "adversarial", "temperature"])
def test_batched_replays_equal_one_replay_per_row(override):
    # Tolerance: the batch and the single rows run the same operations on [B, T] and [1, T]
    # inputs; a batched matmul may sum in another order, bounded by looped_atol (the rounding
    # analysis of the chained reductions, tests/fixtures/engine_helpers.py). The overrides are
    # elementwise in the logits (noise keyed by seed and position, negation, a division), so the
    # bound of the logits they read carries over (the temperature factor only shrinks it).
    extra = {} if override is None else {"draft_override": override}
    llm = tiny_llm(mode="async", num_speculative_tokens=3, draft_loops=1, **extra)
    rows, seeds = _rows(7, BATCH_ROWS, 9, 64), np.arange(100, 100 + BATCH_ROWS)
    target = llm.target_logits_along_batch(ALONG_PROMPT, rows)
    draft = llm.draft_logits_along_batch(ALONG_PROMPT, rows, seeds)
    assert target.shape == draft.shape == (BATCH_ROWS, 9, 64) and target.dtype == draft.dtype == torch.float32
    for b in range(BATCH_ROWS):
        one = llm.target_logits_along(ALONG_PROMPT, rows[b].tolist())
        atol = looped_atol(llm.engine.model, one, len(ALONG_PROMPT) + 9)
        torch.testing.assert_close(target[b], one, rtol=0, atol=atol)
        one_draft = llm.draft_logits_along(ALONG_PROMPT, rows[b].tolist(), int(seeds[b]))
        torch.testing.assert_close(draft[b], one_draft, rtol=0, atol=looped_atol(llm.engine.model, one_draft, 21))
    if override == "noisy":  # the noise follows each row's own seed, not its place in the batch
        swapped = llm.draft_logits_along_batch(ALONG_PROMPT, rows[::-1], seeds[::-1])
        torch.testing.assert_close(swapped.flip(0), draft, rtol=0, atol=looped_atol(llm.engine.model, draft, 21))


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (np.zeros((2, 0), dtype=np.int64), "token_rows of shape"),
        (np.full((2, 3), 64), "outside"),
        (np.full((2, 3), 1.5), "token_rows of shape"),
        (np.ones(3, dtype=np.int64), "token_rows of shape"),
        (np.ones((2, 21), dtype=np.int64), "max_model_len=32"),
    ],
)
def test_batched_replays_name_bad_input(rows, match):
    llm = tiny_llm(mode="sync", max_model_len=32)
    with pytest.raises(ValueError, match=match):
        llm.target_logits_along_batch(ALONG_PROMPT, rows)
    with pytest.raises(ValueError, match=match):
        llm.draft_logits_along_batch(ALONG_PROMPT, rows, np.zeros(len(rows), dtype=np.int64))
    assert llm.target_logits_along_batch(ALONG_PROMPT, np.ones((2, 20), dtype=np.int64)).shape == (2, 20, 64)
    one = llm.target_logits_along_batch(ALONG_PROMPT, np.full((2, 1), 3))  # only the prompt's own readout
    alone = llm.target_logits_along(ALONG_PROMPT, [3])
    torch.testing.assert_close(one[1], alone, rtol=0, atol=looped_atol(llm.engine.model, alone, len(ALONG_PROMPT) + 1))


def test_batched_replays_of_a_model_without_a_batch_pass_run_row_by_row(monkeypatch):
    """A depth model without `depth_logits_batch` (the real-model adapter) answers one serial
    replay per row: bit for bit the per-row calls (the same operations on the same shapes)."""
    from engine.models.looped import LoopedModel

    llm = tiny_llm(mode="async", num_speculative_tokens=3, draft_loops=1, draft_override="noisy")
    monkeypatch.delattr(LoopedModel, "depth_logits_batch")
    rows, seeds = _rows(11, 3, 6, 64), np.array([4, 5, 6])
    target = llm.target_logits_along_batch(ALONG_PROMPT, rows)
    draft = llm.draft_logits_along_batch(ALONG_PROMPT, rows, seeds)
    for b in range(3):
        assert torch.equal(target[b], llm.target_logits_along(ALONG_PROMPT, rows[b].tolist()))
        assert torch.equal(draft[b], llm.draft_logits_along(ALONG_PROMPT, rows[b].tolist(), int(seeds[b])))
