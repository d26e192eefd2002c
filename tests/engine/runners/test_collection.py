"""Batched collection (engine.runners.collection) gives the tokens of `LLM.generate`.

Exact equality: both paths run the same device round on the same logits with uniforms keyed by
(seed, committed tokens), so any difference is a bug, not rounding. CPU, small random model.
"""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from engine import LLM, EngineConfig, ModelConfig, SamplingParams
from engine.api import Engine
from engine.runners import collection
from engine.runners.collection import BatchCollector
from engine.sampling import PLACEHOLDER_TOKEN

MODEL = ModelConfig(vocab_size=64, hidden_size=32, num_heads=2, num_layers=1, num_loops=3, intermediate_size=64, seed=3)
PROMPT = [5, 9, 17, 2, 33, 40, 1, 8, 12, 60, 7, 3, 22, 19, 11, 4, 50]  # 17 tokens: two KV blocks
SEEDS = [0, 1, 2, 3, 7, 11, 12345, 2**40]
MAX_TOKENS = 5
RANDOM = dict(temperature=0.8, top_k=20, top_p=0.9)
CONFIGS = {  # name -> EngineConfig keywords
    "nospec": dict(mode="nospec"),
    "sync_d1": dict(mode="sync", draft_loops=1),
    "sync_d2": dict(mode="sync", draft_loops=2),
    "async_d1": dict(mode="async", draft_loops=1),
}


def make_llm(name: str, **extra) -> LLM:
    return LLM(EngineConfig(model_config=MODEL, num_speculative_tokens=3, num_kv_blocks=512, **CONFIGS[name], **extra))


def generated(llm: LLM, sampling: dict, seeds=SEEDS):
    params = [
        SamplingParams(
            **sampling, seed=None if not sampling.get("temperature", 1.0) else s, max_tokens=MAX_TOKENS, ignore_eos=True
        )
        for s in seeds
    ]
    return llm.generate([PROMPT] * len(seeds), params)


def as_columns(outputs):
    return (
        np.array([o.token_ids for o in outputs]),
        np.array([o.token_sources for o in outputs], dtype=object),
        np.array([[o.num_rounds, o.num_draft_tokens, o.num_accepted_tokens] for o in outputs]),
    )


def collected(collector: BatchCollector, sampling: dict, seeds=SEEDS, batch_size=None):
    out = collector.collect(
        PROMPT,
        SamplingParams(**sampling, max_tokens=MAX_TOKENS, ignore_eos=True),
        list(seeds),
        MAX_TOKENS,
        batch_size=batch_size,
    )
    assert not out.is_error.any()
    counts = np.stack([out.num_rounds, out.num_draft_tokens, out.num_accepted_tokens], axis=1)
    return out.tokens, out.source_names(), counts


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("sampling", [RANDOM, dict(temperature=0.0)], ids=["random", "greedy"])
def test_batched_collection_equals_generate(name, sampling):
    llm = make_llm(name)
    expected = as_columns(generated(llm, sampling))
    got = collected(BatchCollector(llm.engine), sampling)
    for want, have in zip(expected, got):
        np.testing.assert_array_equal(have, want)
    if name != "nospec" and sampling is RANDOM:  # the seeds exercise ragged rounds and rejections
        assert len(set(map(tuple, expected[1].tolist()))) > 1


MIXED = [RANDOM, dict(temperature=0.0), dict(temperature=0.6, top_k=5)]  # a row's sampling: MIXED[r % 3]


@pytest.mark.parametrize("name", ["nospec", "sync_d1", "async_d1"])
def test_a_mixed_batch_equals_generate_and_each_row_alone(name):
    """One batch of random, greedy and other-temperature rows (companions of a sequence
    protocol) gives every row the tokens and sources `LLM.generate` gives the same mixed batch,
    and each row the tokens it gets in a batch of its own sampling (a row's law ignores its
    neighbours)."""
    samplings = [MIXED[r % len(MIXED)] for r in range(len(SEEDS))]
    params = [
        SamplingParams(**sp, seed=s if sp["temperature"] else None, max_tokens=MAX_TOKENS, ignore_eos=True)
        for sp, s in zip(samplings, SEEDS)
    ]
    expected = as_columns(make_llm(name).generate([PROMPT] * len(SEEDS), params))
    collector = BatchCollector(make_llm(name).engine)
    out = collector.collect(PROMPT, params, list(SEEDS), MAX_TOKENS, batch_size=len(SEEDS) + 1)
    np.testing.assert_array_equal(out.tokens, expected[0])
    np.testing.assert_array_equal(out.source_names(), expected[1])
    for which, sampling in enumerate(MIXED):
        rows = [r for r in range(len(SEEDS)) if r % len(MIXED) == which]
        alone = collected(collector, sampling, [SEEDS[r] for r in rows])
        np.testing.assert_array_equal(out.tokens[rows], alone[0])
    with pytest.raises(ValueError, match="params has 2 entries for 8 seeds"):
        collector.collect(PROMPT, params[:2], list(SEEDS), MAX_TOKENS)


@pytest.mark.parametrize("name", ["nospec", "sync_d1"])
def test_batched_collection_ignores_batch_composition(name):
    """Split batches, padding rows and a reused (cached) state give the same rows."""
    collector = BatchCollector(make_llm(name).engine)
    whole = collected(collector, RANDOM)
    first = collected(collector, RANDOM, SEEDS[:3], batch_size=len(SEEDS) + 2)
    second = collected(collector, RANDOM, SEEDS[3:], batch_size=len(SEEDS) + 2)
    for all_rows, head, tail in zip(whole, first, second):
        np.testing.assert_array_equal(np.concatenate([head, tail]), all_rows)


def test_a_kept_prompt_prefill_gives_the_rows_of_a_fresh_one(monkeypatch):
    """Later batches of a prompt copy its kept prefill blocks (another prompt in between, and
    dropped once more than KEPT_PROMPTS prompts were seen): the same rows as a new collector's."""
    monkeypatch.setattr(collection, "KEPT_PROMPTS", 1)
    collector = BatchCollector(make_llm("sync_d1").engine)
    fresh = collected(BatchCollector(make_llm("sync_d1").engine), RANDOM)
    np.testing.assert_array_equal(collected(collector, RANDOM)[0], fresh[0])  # prefilled and kept
    again = collected(collector, RANDOM)  # the kept blocks, copied into every request
    other = collector.collect(
        PROMPT[:9], SamplingParams(**RANDOM, max_tokens=MAX_TOKENS, ignore_eos=True), list(SEEDS), MAX_TOKENS
    )
    assert list(collector._prompt_kv) == [tuple(PROMPT[:9])]  # the first prompt's blocks were dropped
    after = collected(collector, RANDOM)  # prefilled anew
    for want, *have in zip(fresh, again, after):
        for rows in have:
            np.testing.assert_array_equal(rows, want)
    assert not np.array_equal(other.tokens, fresh[0])


def counts_through(full, n: int, k: int) -> np.ndarray:
    """[B, 3] rounds, drafts, accepted of the rounds of a full run (its provenance) up to the one
    that emitted token n. Drafts are K a round: the rounds before token n keep their whole K when
    max_tokens >= n + K (K_r = min(K, max_tokens - generated - 1), generated <= n - 1)."""
    rounds = full.round_index[:, n - 1] + 1
    accepted = ((full.round_index < rounds[:, None]) & (full.source_names() == "accepted")).sum(axis=1)
    return np.stack([rounds, k * rounds, accepted], axis=1)


@pytest.mark.parametrize("name", ["nospec", "sync_d1", "async_d1"])
def test_stopping_after_n_tokens_gives_the_full_runs_first_n_and_the_rounds_that_made_them(name):
    """`stop_after=n`: the first n columns of the full run (tokens, sources, rounds, positions), the
    counts of the rounds up to the one that emitted token n, and fewer rounds in all."""
    collector = BatchCollector(make_llm(name).engine)
    params = SamplingParams(**RANDOM, max_tokens=MAX_TOKENS, ignore_eos=True)
    seeds = list(range(40))  # enough rows that some need a second round for token 2 and more for token 5
    full = collector.collect(PROMPT, params, seeds, MAX_TOKENS)
    n, k = 2, 0 if name == "nospec" else collector.k
    assert n + k <= MAX_TOKENS  # the headroom counts_through relies on
    stopped = collector.collect(PROMPT, params, seeds, MAX_TOKENS, stop_after=n)
    for column in ("tokens", "sources", "round_index", "round_position", "drafts"):
        np.testing.assert_array_equal(getattr(stopped, column), getattr(full, column)[:, :n])
    counts = np.stack([stopped.num_rounds, stopped.num_draft_tokens, stopped.num_accepted_tokens], axis=1)
    np.testing.assert_array_equal(counts, counts_through(full, n, k))
    assert stopped.num_rounds.sum() < full.num_rounds.sum()  # rows stopped sooner
    with pytest.raises(ValueError, match="stop_after=6"):
        collector.collect(PROMPT, params, seeds, MAX_TOKENS, stop_after=MAX_TOKENS + 1)


@pytest.mark.parametrize("name", ["nospec", "sync_d1", "async_d1"])
def test_the_drafts_stand_at_accepted_and_corrected_tokens_only(name):
    """`CollectedBatch.drafts`: the token itself where a draft was accepted; where it was rejected,
    the rejected draft, a token id that is never the correction drawn after it (a draft x is
    rejected only where p(x) < q(x), where max(p - q, 0) has no mass); PLACEHOLDER_TOKEN at a bonus
    or plain token, the last rounds' cut-back bonus included. A row's drafts do not depend on its
    batch: split batches with padding rows give the same ones."""
    collector = BatchCollector(make_llm(name).engine)
    params = SamplingParams(**RANDOM, max_tokens=12, ignore_eos=True)
    seeds = list(range(40))
    out = collector.collect(PROMPT, params, seeds, 12)
    names, drafts = out.source_names(), out.drafts
    accepted, correction = names == "accepted", names == "correction"
    np.testing.assert_array_equal(drafts[accepted], out.tokens[accepted])
    assert (drafts[correction] >= 0).all() and (drafts[correction] < MODEL.vocab_size).all()
    assert (drafts[correction] != out.tokens[correction]).all()
    assert (drafts[~(accepted | correction)] == PLACEHOLDER_TOKEN).all()
    assert correction.sum() > 20 or name == "nospec"  # rejected drafts are reported
    parts = [collector.collect(PROMPT, params, half, 12, batch_size=len(seeds) + 3) for half in (seeds[:9], seeds[9:])]
    np.testing.assert_array_equal(np.concatenate([part.drafts for part in parts]), drafts)


def test_a_batch_reuses_the_device_block_ids_only_when_they_are_the_same():
    """The block manager gives a batch the blocks the one before gave back: their device tensor
    is reused; once other blocks are held, the batch's own ids are copied (and the rows stay)."""
    collector = BatchCollector(make_llm("sync_d1").engine)
    blocks = collector.engine.scheduler.blocks
    first = collected(collector, RANDOM)
    ids = collector._ids[1]
    again = collected(collector, RANDOM)
    assert collector._ids[1] is ids
    held = blocks.take(3)  # the next batch gets other blocks
    moved = collected(collector, RANDOM)
    blocks.give_back(held, 0)
    assert collector._ids[1] is not ids and not set(held) & set(collector._ids[1].tolist())
    np.testing.assert_array_equal(collector._ids[1].numpy(), collector._ids[0])
    for want, *have in zip(first, again, moved):
        for rows in have:
            np.testing.assert_array_equal(rows, want)


def test_batched_collection_returns_its_blocks_and_refuses_a_busy_engine():
    llm = make_llm("sync_d1")
    blocks = llm.engine.scheduler.blocks
    free, reserved = blocks.num_free, blocks.num_reserved
    collector = BatchCollector(llm.engine)
    collected(collector, RANDOM)
    assert (blocks.num_free, blocks.num_reserved) == (free, reserved)
    llm.engine.add_request("live", PROMPT, SamplingParams(max_tokens=2))
    with pytest.raises(RuntimeError, match="idle engine"):
        collected(collector, RANDOM)


def test_planned_batches_pad_the_probe_on_cuda_and_warm_the_kernels_of_their_rows(monkeypatch):
    """`EngineSUT.plan_batches`: with the batched collection on CUDA, later batches (the probe's
    two requests too) run as the planned rows, and the sampling kernels of a round of those rows
    start compiling (`warm_round`); on the CPU, or with the default collection,
    nothing changes. The engine itself warms a scheduler step's rows, 1 to max_num_seqs x (K + 1)."""
    import engine.sampling
    from specval.adapters.engine import EngineSUT
    from specval.protocol import SutSpec

    warmed = []
    monkeypatch.setattr(
        engine.sampling, "warm_round", lambda vocab, rows, k, device, backend: warmed.append((vocab, rows, k))
    )
    for kind, device in (("batched", "cpu"), ("engine", "cuda"), ("batched", "cuda")):
        sut = EngineSUT(SutSpec(adapter="engine", model="looped", options=(("collection", kind),)), 3)
        llm = sut._any_llm()
        monkeypatch.setattr(llm.engine, "device", torch.device(device))
        sut.plan_batches(64)
        assert sut._batch_size == (64 if (kind, device) == ("batched", "cuda") else 0)
    assert warmed == [(256, 64, 3)]
    scheduler = SimpleNamespace(config=make_llm("sync_d1", max_num_seqs=24).engine.config)
    assert Engine._sampling_rows(scheduler) == (1, 24 * 4)
    nospec = SimpleNamespace(config=replace(scheduler.config, mode="nospec"))
    assert Engine._sampling_rows(nospec) == (1, 24)


def test_batched_collection_names_num_kv_blocks_when_the_batch_does_not_fit():
    llm = LLM(EngineConfig(model_config=MODEL, mode="sync", draft_loops=1, num_kv_blocks=8))
    with pytest.raises(ValueError, match="num_kv_blocks=8"):
        collected(BatchCollector(llm.engine), RANDOM)


def test_engine_sut_batched_collection_equals_engine_collection():
    """The specval adapter with `collection: batched` returns the tokens and sources of the default
    path; it stops each request after the tested tokens, so its counts are those of the rounds up
    to the one that emitted the last tested token."""
    from specval.adapters.engine import EngineSUT
    from specval.protocol import GroupSpec, SamplingSpec, SutSpec

    sampling = SamplingSpec(**RANDOM)
    group = GroupSpec(name="sync", mode="sync", draft_loops=1)
    batches = []
    for kind in ("engine", "batched"):
        spec = SutSpec(adapter="engine", model="looped", options=(("collection", kind),))
        sut = EngineSUT(spec, 3)
        batches.append(sut.sample(group, PROMPT, sampling, np.array(SEEDS), 2, MAX_TOKENS))
        if kind == "batched":  # the same requests run to MAX_TOKENS, with their provenance
            full = BatchCollector(sut._group_llm(group).engine).collect(
                PROMPT, SamplingParams(**RANDOM, max_tokens=MAX_TOKENS, ignore_eos=True), SEEDS, MAX_TOKENS
            )
        facts = sut.describe()
        # the manifest says how the batched rounds ran (no graphs on the CPU), and nothing otherwise
        assert facts.get("collection") == (
            {"sync/draft_loops=1": "eager (no CUDA Graphs on this device)"} if kind == "batched" else None
        )
        sut.close()
    for name in ("tokens", "sources"):
        np.testing.assert_array_equal(getattr(batches[1], name), getattr(batches[0], name))
    np.testing.assert_array_equal(full.tokens[:, :2], batches[0].tokens)
    counts = np.stack([batches[1].num_rounds, batches[1].num_draft_tokens, batches[1].num_accepted_tokens], axis=1)
    np.testing.assert_array_equal(counts, counts_through(full, 2, 3))


def test_engine_sut_mixed_batches_equal_across_collections():
    """`EngineSUT.sample_mixed` (a sequence protocol's companions) gives the same tokens and
    sources through `collection: batched` as through the default path."""
    from specval.adapters.engine import EngineSUT
    from specval.protocol import GroupSpec, SamplingSpec, SutSpec

    samplings = [SamplingSpec(**MIXED[r % len(MIXED)]) for r in range(len(SEEDS))]
    group = GroupSpec(name="async", mode="async", draft_loops=1)
    batches = []
    for kind in ("engine", "batched"):
        sut = EngineSUT(SutSpec(adapter="engine", model="looped", options=(("collection", kind),)), 3)
        batches.append(sut.sample_mixed(group, PROMPT, samplings, np.array(SEEDS), MAX_TOKENS, MAX_TOKENS))
        sut.close()
    for name in ("tokens", "sources"):
        np.testing.assert_array_equal(getattr(batches[1], name), getattr(batches[0], name))


# ---------------------------------------------------------------- long sequences, provenance, K up to 8

LONG_TOKENS = 64
SHARP = dict(temperature=0.05)  # the random model's logits are flat (std ~0.1): sharpen to get long accepted runs


def check_provenance(batch, k: int) -> None:
    """Every token's (round, position j, source) is consistent with the rounds the request made:
    rounds are numbered 0, 1, ... in order, j counts 1, 2, ... inside a round, a round ends with its
    one correction or bonus, drafts sit at j <= K, a bonus at j = K_r + 1 <= K + 1."""
    names = batch.source_names()
    for b in range(batch.tokens.shape[0]):
        rounds, positions, sources = batch.round_index[b], batch.round_position[b], names[b]
        ends = np.flatnonzero(np.isin(sources, ("correction", "bonus")))
        assert ends[-1] == len(sources) - 1 and len(ends) == batch.num_rounds[b]
        starts = np.concatenate([[0], ends[:-1] + 1])
        for number, (start, end) in enumerate(zip(starts, ends)):
            assert (rounds[start : end + 1] == number).all()
            np.testing.assert_array_equal(positions[start : end + 1], np.arange(1, end - start + 2))
            assert (sources[start:end] == "accepted").all()
        assert (positions[sources == "accepted"] <= k).all() and (positions <= k + 1).all()
        assert (positions[sources == "correction"] <= k).all()


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_long_sequences_carry_round_provenance_and_equal_generate(mode):
    k = 8  # the largest K the harness asks for (no cap below it exists in engine/)
    llm = LLM(EngineConfig(model_config=MODEL, mode=mode, num_speculative_tokens=k, draft_loops=1, num_kv_blocks=512))
    seeds = SEEDS[:3]
    params = [SamplingParams(**SHARP, seed=s, max_tokens=LONG_TOKENS, ignore_eos=True) for s in seeds]
    outputs = llm.generate([PROMPT] * len(seeds), params)
    collector = BatchCollector(llm.engine)
    first = collector.collect(PROMPT, params[0], seeds[:2], LONG_TOKENS)
    second = collector.collect(PROMPT, params[0], seeds[2:], LONG_TOKENS, batch_size=3)
    tokens = np.concatenate([first.tokens, second.tokens])
    np.testing.assert_array_equal(tokens, np.array([o.token_ids for o in outputs]))
    np.testing.assert_array_equal(
        np.concatenate([first.source_names(), second.source_names()]),
        np.array([o.token_sources for o in outputs], dtype=object),
    )
    for batch in (first, second):
        check_provenance(batch, k)
    np.testing.assert_array_equal(first.slots, np.arange(2))
    np.testing.assert_array_equal(second.slots, np.arange(1))  # padded to 3 rows, one real
    assert (first.batch_index, second.batch_index) == (0, 1)
    full_bonus = (first.round_position == k + 1) & (first.source_names() == "bonus")
    assert full_bonus.any()  # the rounds reach the bonus after all K drafts, K = 8 included


@pytest.mark.parametrize("name", ["nospec", "sync_d1", "async_d1"])
def test_warm_round_asks_for_every_kernel_a_batched_round_launches(monkeypatch, name):
    """`engine.sampling.warm_round` compiles, before the first round, the Philox, categorical
    and accept kernels that rounds of the batched collection launch: every launch of a
    collected batch (the Triton backend, interpreted) has the specialisation of one of its
    requests. Triton specialises a launch on its constexprs and options, each tensor's dtype
    and 16-byte alignment, and each integer's value class (1, a multiple of 16, 32 or 64 bits);
    the warm-up's tensors are dtypes, taken as aligned. The probabilities kernels' requests are
    checked in tests/engine/sampling/kernels/test_warmup.py."""
    from engine.sampling.kernels import accept, categorical, rng
    from engine.sampling.kernels.accept import accept_warmup
    from engine.sampling.kernels.categorical import categorical_warmup
    from engine.sampling.kernels.rng import uniform_blocks_warmup

    launched = set()
    for module, attribute in (
        (accept, "_accept_kernel"),
        (categorical, "_categorical_kernel"),
        (rng, "_uniform_blocks_kernel"),
    ):
        monkeypatch.setattr(module, attribute, RecordingKernel(getattr(module, attribute), launched))
    llm = make_llm(name, sampling_backend="triton")
    seeds = SEEDS[:4]
    collected(BatchCollector(llm.engine), RANDOM, seeds=seeds)
    k = 3 if llm.engine.config.is_speculative else 0
    requests = [uniform_blocks_warmup(1), categorical_warmup(MODEL.vocab_size)]
    if k:
        requests += [
            uniform_blocks_warmup(2 * k + 1),
            *(accept_warmup(len(seeds) * k, MODEL.vocab_size, k, limit) for limit in (False, True)),
        ]
    warmed = {specialisation(kernel.fn.__name__, arguments, options) for kernel, arguments, _, options in requests}
    assert launched and launched <= warmed, launched - warmed


class RecordingKernel:
    """A Triton kernel whose launches `kernel[grid](...)` are recorded (`specialisation`)."""

    def __init__(self, kernel, launched: set):
        self.kernel, self.launched, self.fn = kernel, launched, kernel.fn

    def __getitem__(self, grid):
        def launch(*arguments, **options):
            self.launched.add(specialisation(self.kernel.fn.__name__, arguments, options))
            return self.kernel[grid](*arguments, **options)

        return launch


def specialisation(name: str, arguments, options) -> tuple:
    """What Triton's JIT keys a launch on (a dtype given in place of a tensor is an aligned one)."""

    def one(value):
        if isinstance(value, torch.dtype):
            return ("tensor", value, True)
        if isinstance(value, torch.Tensor):
            return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
        if isinstance(value, bool) or not isinstance(value, int):
            return (type(value).__name__,)
        return ("int", value == 1, value % 16 == 0, -(2**31) <= value < 2**31)

    return name, tuple(one(value) for value in arguments), tuple(sorted(options.items()))
