"""Paths of the chunked Triton kernel of batched_probabilities, at small sizes (interpreter).

Every case is also compared with the exact float64 distribution (as is the row-wise reference:
`assert_rows_match`, with the rounding band and value bound of tests/fixtures/sampling_helpers.py), so a path
that is taken but wrong fails as well as one that is not taken.
"""

import dataclasses
import functools

import pytest
import torch

from engine.sampling.backend import compiles_natively
from engine.sampling.kernels.launch_overlap import supports_overlap
from engine.sampling.scratch import Scratch
from tests.fixtures.sampling_helpers import assert_rows_match, baseline_config, generator, params, triton_can_run_on

pytestmark = pytest.mark.skipif(not triton_can_run_on(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")


def kernel():
    """The probabilities kernels' package (its public names: configuration and launch)."""
    from engine.sampling.kernels import probabilities

    return probabilities


def launch_module():
    """The module of the kernels' launch, for its private helpers."""
    from engine.sampling.kernels.probabilities import plan

    return plan


def test_heavy_upper_tail_takes_the_pivot_search():
    """A chunk with 6 tokens far above the rest: the quick floor (mean + z std) lets all 6
    through, more than the 4 slots, so the chunk searches the pivot levels instead; the row
    is still proven on the candidates (SPARSE), which needs the searched floor."""
    k = kernel()
    logits = torch.randn(2, 128, generator=generator(21)) * 0.1  # two chunks of 64
    logits[:, :6] = 10 + torch.rand(2, 6, generator=generator(22))
    t, top_k, p = params([1.0, 1.0], [2, -1], [1.0, 0.5])
    config = baseline_config(chunk=64, chunk_capacity=4)
    result = k.run_probabilities(logits, t, top_k, p, config)
    assert_rows_match(result.probs, logits, t, top_k, p)
    assert result.row_mode.tolist() == [k.RowMode.SPARSE] * 2


def test_a_vocabulary_of_one_chunk_keeps_every_token_and_never_falls_back():
    """V <= chunk: one chunk of next_power_of_2(V) slots holds every finite logit, so top-k and
    top-p rows are SPARSE however the logits fall (with 4 slots per chunk some of these rows
    take the fallback); a row holding NaN still takes the exact whole-row kernel."""
    k = kernel()
    logits = torch.randn(5, 200, generator=generator(25)) * 3
    logits[3, 1::3] = float("-inf")
    t, top_k, p = params([1.0, 0.7, 1.3, 1.0, 1.0], [20, -1, 150, 50, 20], [1.0, 0.9, 0.95, 1.0, 1.0])
    config = baseline_config(chunk=256, chunk_capacity=4)
    result = k.run_probabilities(logits, t, top_k, p, config)
    assert_rows_match(result.probs, logits, t, top_k, p)
    assert result.row_mode.tolist() == [k.RowMode.SPARSE] * 5
    multi = k.run_probabilities(logits, t, top_k, p, baseline_config(chunk=128, chunk_capacity=4))
    assert k.RowMode.FALLBACK in multi.row_mode.tolist()  # the same rows over two chunks
    logits[4, 7] = float("nan")
    with_nan = k.run_probabilities(logits, t, top_k, p, config)
    assert with_nan.row_mode.tolist()[4] == k.RowMode.WHOLE_ROW
    assert_rows_match(with_nan.probs[:4], logits[:4], t[:4], top_k[:4], p[:4])


def test_compact_overflow_falls_back_exactly():
    """More candidates at or above the row floor than `compact` slots: the rows take the
    fallback, and are still exact. The split pivots hold top-k 5 and the top-p 0.9 row in 8
    slots (FALLBACK), but not top-k 12 (the whole-row kernel: WHOLE_ROW); with room for the
    chunk candidates the same rows are SPARSE."""
    k = kernel()
    logits = torch.randn(3, 1000, generator=generator(23)) * 3
    t, top_k, p = params([1.0, 0.7, 1.0], [5, -1, 12], [1.0, 0.9, 0.95])
    small = k.run_probabilities(logits, t, top_k, p, baseline_config(chunk=128, chunk_capacity=32, compact=8))
    assert_rows_match(small.probs, logits, t, top_k, p)
    assert small.row_mode.tolist() == [k.RowMode.FALLBACK] * 2 + [k.RowMode.WHOLE_ROW]
    roomy = k.run_probabilities(logits, t, top_k, p, baseline_config(chunk=128, chunk_capacity=32, compact=512))
    assert torch.equal(roomy.probs > 0, small.probs > 0)
    assert roomy.row_mode.tolist() == [k.RowMode.SPARSE] * 3


def test_the_top_k_floor_lets_a_row_fit_without_the_fallback():
    """The rows of the test above with 16 compact slots: the top-k 5 row has more than 16
    stored candidates at the largest chunk floor (FALLBACK without a tiny block), but with a
    tiny block of 8 (k <= 8) its floor is raised to `_top_k_floor`, few enough candidates
    reach that, and it is SPARSE. Either way every row is exact."""
    k = kernel()
    logits = torch.randn(3, 1000, generator=generator(23)) * 3
    t, top_k, p = params([1.0, 0.7, 1.0], [5, -1, 12], [1.0, 0.9, 0.95])
    modes = {}
    for tiny in (0, 8):
        config = baseline_config(chunk=128, chunk_capacity=32, compact=16, tiny_compact=tiny)
        result = k.run_probabilities(logits, t, top_k, p, config)
        assert_rows_match(result.probs, logits, t, top_k, p)
        modes[tiny] = result.row_mode.tolist()
    assert modes == {
        0: [k.RowMode.FALLBACK, k.RowMode.FALLBACK, k.RowMode.WHOLE_ROW],
        8: [k.RowMode.SPARSE, k.RowMode.FALLBACK, k.RowMode.WHOLE_ROW],
    }


@pytest.mark.parametrize("floor_steps", [0, 3])
@pytest.mark.parametrize("single_launch_entries", [0, 2**20])
def test_the_chunk_list_changes_no_result(single_launch_entries, floor_steps):
    """`chunk_list` (top-k floor rows compact only the chunks whose max reaches the floor) on
    and off: bitwise the same probabilities and row modes, exact either way, in three launches
    and in the single launch, with the select kernel's top-k floor at its level and refined
    (`top_k_floor_steps`; the single launch keeps the level). 24 chunks of 128 entries and 2
    chunks per compaction step, so the listed chunks take several steps; the rows: top-k 5,
    top-k 3 + top-p 0.8, top-k 40 (above the tiny block: not listed), top-p alone, greedy and no
    truncation."""
    k = kernel()
    logits = torch.randn(6, 3000, generator=generator(29)) * 3
    t, top_k, p = params([1.0, 0.7, 1.3, 1.0, 0.0, 1.0], [5, 3, 40, -1, -1, -1], [1.0, 0.8, 1.0, 0.9, 1.0, 1.0])
    results = {}
    for listed in (False, True):
        config = baseline_config(
            chunk=128,
            chunk_capacity=32,
            select_block=64,
            small_compact=1024,
            tiny_compact=16,
            chunk_list=listed,
            single_launch_entries=single_launch_entries,
            top_k_floor_steps=floor_steps,
        )
        assert k.launch_plan(config, *logits.shape).single == (single_launch_entries > 0)
        results[listed] = k.run_probabilities(logits, t, top_k, p, config)
        assert_rows_match(results[listed].probs, logits, t, top_k, p)
    assert torch.equal(results[True].probs, results[False].probs)
    assert torch.equal(results[True].row_mode, results[False].row_mode)
    assert results[True].row_mode[:2].tolist() == [k.RowMode.SPARSE] * 2


@pytest.mark.parametrize("single_launch_entries", [0, 2**20])
def test_hoisted_loads_change_no_result(single_launch_entries):
    """`hoist_loads` (the chunk kernel loads a row's k and p with its T and logits) on and off:
    bitwise the same probabilities and row modes, exact, in three launches and in the single
    launch. Rows: no truncation, greedy, top-k, top-k + top-p, top-p alone, and a fallback row
    (top-k 400 is more than its chunks store)."""
    k = kernel()
    logits = torch.randn(6, 2900, generator=generator(31)) * 3
    t, top_k, p = params([1.0, 0.0, 0.7, 1.3, 1.0, 1.0], [-1, -1, 5, 30, -1, 400], [1.0, 1.0, 1.0, 0.8, 0.3, 1.0])
    results = []
    for hoist in (False, True):
        config = baseline_config(
            chunk=128, chunk_capacity=16, hoist_loads=hoist, single_launch_entries=single_launch_entries
        )
        results.append(k.run_probabilities(logits, t, top_k, p, config))
        assert_rows_match(results[-1].probs, logits, t, top_k, p)
    assert torch.equal(results[0].probs, results[1].probs)
    assert torch.equal(results[0].row_mode, results[1].row_mode)
    assert results[0].row_mode.tolist() == [k.RowMode.DENSE, k.RowMode.GREEDY] + [k.RowMode.SPARSE] * 3 + [
        k.RowMode.FALLBACK
    ]


def test_reverse_write_changes_no_result(monkeypatch):
    """`reverse_write` (a row's write chunks in reverse order) on and off: bitwise the same
    probabilities and row modes, exact, every element written (the buffers start as NaN and
    -7). Rows: no truncation (its values are the reversed programs' work), greedy with a tie
    across chunks (lowest index), top-k, top-k + top-p, top-p alone, and a fallback row (top-k
    400 is more than its chunks store: its split counts are indexed by write chunk). 128-entry
    write chunks: 23 write programs per row."""
    k = kernel()
    logits = torch.randn(6, 2900, generator=generator(33)) * 3
    logits[1, [300, 2000]] = 20.0
    t, top_k, p = params([1.0, 0.0, 0.7, 1.3, 1.0, 1.0], [-1, -1, 5, 30, -1, 400], [1.0, 1.0, 1.0, 0.8, 0.3, 1.0])
    monkeypatch.setattr(torch, "empty", poisoned_empty(torch.empty))
    results = []
    for reverse in (False, True):
        config = baseline_config(chunk=128, chunk_capacity=16, write_chunk=128, reverse_write=reverse)
        assert dict(k.launch_plan(config, 6, 2900).launches[2].constexprs)["REVERSE"] is reverse
        results.append(k.run_probabilities(logits, t, top_k, p, config))
    monkeypatch.undo()
    for result in results:
        assert not result.probs.isnan().any()
        assert_rows_match(result.probs, logits, t, top_k, p)
    assert torch.equal(results[0].probs, results[1].probs)
    assert torch.equal(results[0].row_mode, results[1].row_mode)
    assert results[0].row_mode.tolist() == [k.RowMode.DENSE, k.RowMode.GREEDY] + [k.RowMode.SPARSE] * 3 + [
        k.RowMode.FALLBACK
    ]
    assert int(results[1].probs[1].argmax()) == 300


def test_the_flushing_exp_is_compiled_only_for_a_device():
    """`ftz_sum` takes inline PTX, which the interpreter cannot run: the plan turns it on only
    for a native compile, in the chunk kernel and the single launch alike."""
    k = kernel()
    config = dataclasses.replace(k.DEFAULT_CONFIG, ftz_sum=True)
    for rows, vocab in ((8, 152064), (1, 700)):  # three launches, then the single launch
        for native in (False, True):
            launch = k.launch_plan(config, rows, vocab, native=native).launches[0]
            assert dict(launch.constexprs)["FTZ_SUM"] is native
    # these tests run under the interpreter, which compiles nothing, for CUDA tensors too
    assert not compiles_natively(torch.device("cpu"))
    assert not compiles_natively(torch.device("cuda"))


def test_keep_in_l2_sets_the_store_policy_of_the_chunk_statistics():
    """`keep_in_l2` is the evict-last L2 policy of the chunk kernel's statistics and candidate
    stores (the single launch's too), and the default; off, the stores take no policy."""
    k = kernel()
    for config, policy in (
        (k.DEFAULT_CONFIG, "evict_last"),
        (dataclasses.replace(k.DEFAULT_CONFIG, keep_in_l2=False), ""),
    ):
        for rows, vocab in ((8, 152064), (1, 700)):  # three launches, then the single launch
            launch = k.launch_plan(config, rows, vocab).launches[0]
            assert dict(launch.constexprs)["EVICTION"] == policy


def poisoned_empty(real_empty):
    """torch.empty that fills float tensors with NaN and integer tensors with -7."""

    def empty(*shape, dtype=None, device=None, **kw):
        out = real_empty(*shape, dtype=dtype, device=device, **kw)
        return out.fill_(float("nan") if out.is_floating_point() else -7)

    return empty


@pytest.mark.parametrize("write_chunk", [64, 2048])
def test_every_output_element_is_written(monkeypatch, write_chunk):
    """Greedy (ties across chunks), dense, sparse and fallback rows over several chunks, with
    every buffer the launcher allocates pre-filled with garbage: an element no program writes
    shows up as NaN, a scratch value read before it is written as a wrong row. The write
    kernel's chunk is independent of the chunk kernel's (smaller and larger here)."""
    k = kernel()
    logits = torch.randn(5, 700, generator=generator(24)) * 2
    logits[0, [130, 650]] = 9.0  # greedy tie in chunks 1 and 5: lowest index
    t, top_k, p = params([0.0, 1.0, 0.8, 1.0, 1.3], [-1, -1, 10, 300, -1], [1.0, 1.0, 0.9, 1.0, 0.6])
    monkeypatch.setattr(torch, "empty", poisoned_empty(torch.empty))
    config = baseline_config(chunk=128, chunk_capacity=16, write_chunk=write_chunk)
    result = k.run_probabilities(logits, t, top_k, p, config)
    monkeypatch.undo()
    assert not result.probs.isnan().any()
    assert_rows_match(result.probs, logits, t, top_k, p)
    assert int(result.probs[0].argmax()) == 130
    modes = result.row_mode.tolist()
    assert modes[:4] == [k.RowMode.GREEDY, k.RowMode.DENSE, k.RowMode.SPARSE, k.RowMode.FALLBACK]


def test_quick_floor_aims_at_a_quarter_of_the_slots():
    """On normal logits the quick floor keeps about CAPACITY / 4 tokens per chunk: z is the
    normal quantile of 1 - CAPACITY / (4 * chunk), 1 - 1 / 64 for the default."""
    from statistics import NormalDist

    config = baseline_config()
    assert config.chunk_capacity / (4 * config.chunk) == 1 / 64
    assert config.pivot_sigmas(config.chunk) == pytest.approx(NormalDist().inv_cdf(1 - 1 / 64))
    assert config.pivot_sigmas(2 * config.chunk) > config.pivot_sigmas(config.chunk)


def test_fallback_row_with_masked_logits_reads_only_written_scratch(monkeypatch):
    """A whole-row fallback row holding -inf logits has mean -inf, so its pivot is -inf; the
    lanes past V (read as -inf) must not be counted as candidates, or the scatter reads scratch
    slots nobody wrote. Scratch is poisoned with a huge finite value and index 0, so such a read
    lands as a wrong (infinite) probability at token 0 instead of an out-of-bounds store."""
    k = kernel()
    real_empty = torch.empty

    def poisoned(*shape, dtype=None, device=None, **kw):
        out = real_empty(*shape, dtype=dtype, device=device, **kw)
        return out.fill_(1e30 if out.is_floating_point() else 0)

    logits = torch.randn(3, 700, generator=generator(31))
    logits[:, 1::5] = float("-inf")
    t, top_k, p = params([1.0, 0.7, 1.0], [50, 200, -1], [1.0, 0.9, 0.8])
    monkeypatch.setattr(torch, "empty", poisoned)
    result = k.run_probabilities(logits, t, top_k, p, baseline_config(chunk=128, chunk_capacity=1))
    monkeypatch.undo()
    assert result.row_mode.tolist() == [k.RowMode.FALLBACK] * 3
    assert torch.isfinite(result.probs).all()
    assert_rows_match(result.probs, logits, t, top_k, p)


def test_rows_with_a_large_k_aim_at_the_wide_candidate_share():
    """32 chunks of 128 with 16 slots: the narrow floor (4 tokens per chunk) leaves 46-80 tokens
    of these rows at or above the row floor, fewer than k = 100, so they would all take the
    whole-row fallback; k > wide_k_limit (32) aims at 8 per chunk (126-172 at or above the row
    floor) and the rows are proven on the candidates. With the wide share set to the narrow one
    the same rows fall back, so the test fails if large-k rows stop aiming lower."""
    k = kernel()
    logits = torch.randn(4, 4096, generator=generator(41)) * 3
    t, top_k, p = params([1.0] * 4, [100] * 4, [1.0, 0.95, 0.9, 1.0])
    config = baseline_config(chunk=128, chunk_capacity=16)
    assert k.wide_k_limit(32, 16) == 32
    result = k.run_probabilities(logits, t, top_k, p, config)
    assert_rows_match(result.probs, logits, t, top_k, p)
    assert result.row_mode.tolist() == [k.RowMode.SPARSE] * 4
    narrow_config = baseline_config(chunk=128, chunk_capacity=16, wide_share=k.QUICK_FLOOR_SHARE)
    narrow = k.run_probabilities(logits, t, top_k, p, narrow_config)
    assert narrow.row_mode.tolist() == [k.RowMode.FALLBACK] * 4
    assert_rows_match(narrow.probs, logits, t, top_k, p)


def test_split_fallback_over_several_programs_is_exact(monkeypatch):
    """One slot per chunk: no truncating row is proven on the chunk candidates, so every one
    takes the split fallback, over 3 programs per row (write_chunk 256): top-p only,
    top-k + top-p, a large k, -inf logits, a flat row and a row with ties at the cut. All must
    be proven on a split pivot (FALLBACK, not WHOLE_ROW) and match the reference, with every
    scratch buffer poisoned (an unwritten candidate or count shows up as a wrong row)."""
    k = kernel()
    logits = torch.randn(6, 700, generator=generator(51)) * 2
    logits[3, 1::5] = float("-inf")
    logits[4] *= 0.01  # flat: top-p 0.5 keeps about half the row
    logits[5, 100:110] = 20.0  # ten tied tokens above the rest: top-k 5 keeps all ten
    t, top_k, p = params([1.0, 0.8, 1.0, 1.3, 1.0, 1.0], [-1, 10, 300, 40, -1, 5], [0.6, 0.9, 1.0, 0.95, 0.5, 1.0])
    monkeypatch.setattr(torch, "empty", poisoned_empty(torch.empty))
    config = baseline_config(chunk=128, chunk_capacity=1, write_chunk=256)
    result = k.run_probabilities(logits, t, top_k, p, config)
    monkeypatch.undo()
    assert result.row_mode.tolist() == [k.RowMode.FALLBACK] * 6
    assert_rows_match(result.probs, logits, t, top_k, p)
    assert int((result.probs[5] > 0).sum()) == 10  # top-k keeps ties


def poison_(tensors):
    """Fill float tensors with NaN and integer tensors with -7, in place."""
    for t in tensors:
        t.fill_(float("nan") if t.is_floating_point() else -7)


def test_reused_scratch_holds_no_state_between_calls():
    """probabilities_triton reuses its scratch for the next call of the same shape: the second
    call gets the first call's buffers (the cache hit is checked), poisoned in between, with
    other rows (dense, sparse, fallback, greedy swapped around), and must still match the
    reference: every scratch element a call reads was written by that call."""
    k = kernel()
    config = baseline_config(chunk=128, chunk_capacity=16, write_chunk=256)
    k.SCRATCH.clear()
    first = torch.randn(4, 700, generator=generator(61)) * 2
    t, top_k, p = params([1.0, 0.8, 0.0, 1.0], [-1, 10, -1, 300], [1.0, 0.9, 1.0, 0.95])
    k.probabilities_triton(first, t, top_k, p, config=config)
    ((cached, pointers),) = k.SCRATCH._entries.values()
    assert pointers == tuple(t.data_ptr() for t in cached)
    poison_(cached)
    second = torch.randn(4, 700, generator=generator(62)) * 2
    t, top_k, p = params([0.0, 1.0, 1.3, 0.8], [-1, 300, -1, 10], [1.0, 0.95, 0.6, 0.9])
    out = k.probabilities_triton(second, t, top_k, p, config=config)
    ((again, _),) = k.SCRATCH._entries.values()
    assert all(a is b for a, b in zip(again, cached)) and len(k.SCRATCH) == 1
    assert not out.isnan().any()
    assert_rows_match(out, second, t, top_k, p)
    k.SCRATCH.clear()


def key_of(k, plan, logits, t, top_k, p):
    pointers = tuple(x.data_ptr() for x in (logits, t, top_k, p))
    return k.specialisation_key(plan, logits, top_k, pointers)


def test_the_specialisation_key_tells_apart_vocabularies_with_the_same_constexprs():
    """V = 152,064 and 152,063 have the same chunks, pads and constexprs, but Triton compiles V
    differently (a multiple of 16 or not): a compiled kernel reused across them would assume
    the wrong V, so their keys must differ; the caller's dtypes and alignment count too."""
    k = kernel()
    t, top_k, p = params([1.0], [5], [1.0])
    plans = [k.launch_plan(k.DEFAULT_CONFIG, 1, vocab) for vocab in (152064, 152063)]
    assert plans[0].chunk_constexprs == plans[1].chunk_constexprs
    assert plans[0].write_constexprs == plans[1].write_constexprs
    logits = torch.zeros(1, 152064 + 4)
    keys = {key_of(k, plan, logits[:, : plan.vocab], t, top_k, p) for plan in plans}
    assert len(keys) == 2
    variants = [logits[:, 1:152065], logits[:, :152064].bfloat16(), logits[:, :152064]]
    keys = {key_of(k, plans[0], x, t, top_k, p) for x in variants}
    assert len(keys) == 3  # unaligned float32, bfloat16, aligned float32
    unaligned_p = torch.zeros(2)[1:]
    assert key_of(k, plans[0], variants[2], t, top_k, unaligned_p) not in keys
    assert key_of(k, plans[0], variants[2], t, top_k.int(), p) not in keys


def test_launch_arguments_follow_the_kernel_signatures():
    """`LaunchPlan.arguments` gives each kernel its runtime parameters in signature order (the
    compiled kernels take them positionally): a parameter `<name>_ptr` gets buffer `<name>`,
    the integers their plan values, and the constexprs follow exactly."""
    k = kernel()
    for num_rows, vocab in ((1, 700), (64, 152064)):
        plan = k.launch_plan(k.DEFAULT_CONFIG, num_rows, vocab)
        assert len(plan.launches) == (1 if plan.single else 3)
        values = {
            "V": vocab,
            "NUM_CHUNKS": plan.num_chunks,
            "pivot_sigmas": plan.pivot_sigmas,
            "wide_sigmas": plan.wide_sigmas,
            "wide_k": plan.wide_k,
        }
        for launch, args in zip(plan.launches, plan.arguments(k.BUFFERS), strict=True):
            names = launch.kernel.arg_names
            assert names[len(args) :] == [name for name, _ in launch.constexprs]
            for name, arg in zip(names, args):
                expected = name.removesuffix("_ptr") if name.endswith("_ptr") else values[name]
                assert arg == expected, (launch.kernel.fn.__name__, name)


def test_scratch_views_match_the_buffer_names():
    """`_make_scratch` returns the scratch in BUFFERS' order: the row modes are the last view
    (int64 [B]) and the tickets the single launch zeroes are int32 [B]."""
    k = kernel()
    plan = k.launch_plan(k.DEFAULT_CONFIG, 3, 700)
    scratch = dict(zip(k.BUFFERS[5:], launch_module()._make_scratch(plan, torch.device("cpu")), strict=True))
    assert scratch["row_mode"].dtype == torch.int64 and scratch["row_mode"].shape == (3,)
    assert scratch["ticket"].dtype == torch.int32 and scratch["ticket"].shape == (3,)
    assert scratch["compact"].shape == (3, k.DEFAULT_CONFIG.compact)
    assert scratch["cand"].shape == (3 * plan.num_chunks, plan.capacity)


# Rows of every kind for the single launch: greedy with a tie across chunks, dense, top-k,
# top-p, -inf logits, ten tied tokens at a top-k 5 cut, and a large k.
SINGLE_ROWS = ([0.0, 1.0, 0.8, 1.3, 1.0, 1.0, 1.0], [-1, -1, 10, -1, 40, 5, 300], [1.0, 1.0, 0.9, 0.6, 0.95, 1.0, 1.0])


def single_rows(seed):
    logits = torch.randn(7, 700, generator=generator(seed)) * 2
    logits[0, [130, 650]] = 9.0  # greedy tie in chunks 1 and 5: lowest index
    logits[4, 1::5] = float("-inf")
    logits[5, 100:110] = 20.0
    return logits, *params(*SINGLE_ROWS)


@pytest.mark.parametrize(
    "capacity, compact, truncated", [(16, 4096, "SPARSE"), (1, 4096, "FALLBACK"), (1, 8, "WHOLE_ROW")]
)
def test_single_launch_takes_the_paths_of_the_three_launches(monkeypatch, capacity, compact, truncated):
    """B * V <= single_launch_entries: one launch, whose last program per row selects and writes the
    dense and fallback rows itself. With every buffer poisoned it must match the reference and
    give each row the RowMode the three launches give it: capacity 16 (greedy, dense, SPARSE),
    capacity 1 (truncating rows FALLBACK, counted serially), compact 8 (truncating rows no
    split pivot proves in 8 slots: WHOLE_ROW)."""
    k = kernel()
    logits, t, top_k, p = single_rows(71)
    three = baseline_config(chunk=128, chunk_capacity=capacity, compact=compact)
    single = baseline_config(chunk=128, chunk_capacity=capacity, compact=compact, single_launch_entries=7 * 700)
    assert k.launch_plan(single, 7, 700).single and not k.launch_plan(three, 7, 700).single
    expected = k.run_probabilities(logits, t, top_k, p, three)
    monkeypatch.setattr(torch, "empty", poisoned_empty(torch.empty))
    result = k.run_probabilities(logits, t, top_k, p, single)
    monkeypatch.undo()
    assert not result.probs.isnan().any()
    assert_rows_match(result.probs, logits, t, top_k, p)
    assert result.row_mode.tolist() == expected.row_mode.tolist()
    assert int(result.probs[0].argmax()) == 130
    assert int((result.probs[5] > 0).sum()) == 10  # top-k keeps ties
    assert result.row_mode.tolist()[:2] == [k.RowMode.GREEDY, k.RowMode.DENSE]
    assert k.RowMode[truncated] in result.row_mode.tolist()[2:]


def test_single_launch_leaves_its_tickets_at_zero():
    """The single launch's scratch is reused by the next call of the shape; its tickets are
    zeroed once, when allocated, so every call must leave them at zero: the second call
    (other rows, every other scratch buffer poisoned) must still be exact."""
    k = kernel()
    config = baseline_config(chunk=128, chunk_capacity=16, single_launch_entries=7 * 700)
    k.SCRATCH.clear()
    first, t, top_k, p = single_rows(72)
    k.probabilities_triton(first, t, top_k, p, config=config)
    ((cached, _),) = k.SCRATCH._entries.values()
    ticket = cached[7]
    assert ticket.tolist() == [0] * 7
    poison_([buffer for i, buffer in enumerate(cached) if i != 7])
    second, t, top_k, p = single_rows(73)
    order = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    t, top_k, p = t[order], top_k[order], p[order]
    out = k.probabilities_triton(second, t, top_k, p, config=config)
    assert not out.isnan().any()
    assert_rows_match(out, second, t, top_k, p)
    assert ticket.tolist() == [0] * 7
    k.SCRATCH.clear()


def test_single_launch_of_one_chunk_rows_and_bfloat16():
    """A vocabulary of one chunk (small models: every token a candidate) has one program per
    row, which is its own last program (ticket 0 == NUM_CHUNKS - 1); bfloat16 logits are read
    as in the three launches. Both must match the reference and the three launches' modes."""
    k = kernel()
    logits = (torch.randn(4, 200, generator=generator(74)) * 3).bfloat16()
    t, top_k, p = params([0.0, 1.0, 0.7, 1.2], [-1, -1, 20, -1], [1.0, 1.0, 0.9, 0.5])
    single = baseline_config(chunk=256, chunk_capacity=4, single_launch_entries=4 * 200)
    assert k.launch_plan(single, 4, 200).num_chunks == 1
    result = k.run_probabilities(logits, t, top_k, p, single)
    three = k.run_probabilities(logits, t, top_k, p, baseline_config(chunk=256, chunk_capacity=4))
    assert_rows_match(result.probs, logits.float(), t, top_k, p)
    assert (
        result.row_mode.tolist()
        == three.row_mode.tolist()
        == [k.RowMode.GREEDY, k.RowMode.DENSE, k.RowMode.SPARSE, k.RowMode.SPARSE]
    )
    assert torch.equal(result.probs > 0, three.probs > 0)


def test_default_single_launch_threshold():
    """The default sends B * V <= 2**17 to the single launch (B <= 4 at V = 32,000, B <= 2 at
    49,152, never at 152,064) and larger batches to the three launches."""
    k = kernel()
    plan = functools.partial(k.launch_plan, k.DEFAULT_CONFIG)
    assert plan(4, 32000).single and not plan(5, 32000).single
    assert plan(2, 49152).single and not plan(3, 49152).single
    assert not plan(1, 152064).single


def test_device_plan_is_the_launch_plan_of_the_device():
    """`device_plan` (one cache lookup per eager call) gives the plan `launch_plan` gives with
    the device's overlap support and native compilation, the same object each time."""
    k = kernel()
    device = torch.device("cpu")
    plan = k.device_plan(k.DEFAULT_CONFIG, 3, 700, device)
    assert plan is k.launch_plan(k.DEFAULT_CONFIG, 3, 700, supports_overlap(device), compiles_natively(device))
    assert plan is k.device_plan(dataclasses.replace(k.DEFAULT_CONFIG), 3, 700, device)
    assert plan is not k.device_plan(k.DEFAULT_CONFIG, 4, 700, device)


def test_the_write_kernel_alone_takes_the_register_cap():
    """`write_registers` becomes the write launch's `maxnreg` compile option (64 by default,
    none at 0); the chunk and select launches and the single launch never take it."""
    k = kernel()

    def options(config, rows):
        return {launch.kernel.__name__: dict(launch.options) for launch in k.launch_plan(config, rows, 152064).launches}

    assert options(k.DEFAULT_CONFIG, 8) == {"_chunk_kernel": {}, "_select_kernel": {}, "_write_kernel": {"maxnreg": 64}}
    uncapped = dataclasses.replace(k.DEFAULT_CONFIG, write_registers=0)
    assert options(uncapped, 8)["_write_kernel"] == {}
    single = dataclasses.replace(k.DEFAULT_CONFIG, single_launch_entries=152064)
    assert options(single, 1) == {"_single_kernel": {}}


def test_overlapped_launches_follow_the_device_and_the_config():
    """Where the device supports programmatic dependent launch (`overlap`) and the configuration
    asks for it, the select and write launches take it (compile option and PDL constexpr) and
    the chunk kernel lets them start (`overlap_launches`), or the write launch alone does
    (`overlap_write`, the default), then launched serially in a captured call; the single
    launch, a configuration with neither and a device without it take none. The CPU never
    supports it."""
    from engine.sampling.kernels.launch_overlap import supports_overlap

    k = kernel()

    def pdl(launch):
        return dict(launch.constexprs)["PDL"], dict(launch.options).get("launch_pdl", False)

    both = dataclasses.replace(k.DEFAULT_CONFIG, overlap_launches=True)
    plan = k.launch_plan(both, 8, 152064, overlap=True)
    chunk, select, write = plan.launches
    assert dict(chunk.constexprs)["PDL"] and chunk.options == ()
    assert pdl(select) == pdl(write) == (True, True) and not plan.serial_in_capture
    plan = k.launch_plan(k.DEFAULT_CONFIG, 8, 152064, overlap=True)
    chunk, select, write = plan.launches
    assert k.DEFAULT_CONFIG.overlap_write and plan.serial_in_capture
    assert not dict(chunk.constexprs)["PDL"] and pdl(select) == (False, False)
    assert pdl(write) == (True, True)
    neither = dataclasses.replace(k.DEFAULT_CONFIG, overlap_write=False)
    for plan in (
        k.launch_plan(neither, 8, 152064, overlap=True),
        k.launch_plan(both, 8, 152064, overlap=False),
        k.launch_plan(k.DEFAULT_CONFIG, 8, 152064, overlap=False),
    ):
        assert all(pdl(launch) == (False, False) for launch in plan.launches)
        assert not plan.serial_in_capture
    for config in (both, k.DEFAULT_CONFIG):
        plan = k.launch_plan(config, 1, 700, overlap=True)
        (single,) = plan.launches
        assert "PDL" not in dict(single.constexprs) and single.options == ()
        assert not plan.serial_in_capture
    assert not supports_overlap(torch.device("cpu"))


@pytest.mark.parametrize("capturing", [False, True])
def test_a_captured_call_launches_serially_where_the_plan_says(monkeypatch, capturing):
    """`_launch` asks whether the current stream is being captured only for a plan with
    `serial_in_capture`, and passes the answer to the launches as `serial`; other plans never
    launch serially (and never ask)."""
    k = kernel()
    asked, seen = [], []
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: asked.append(1) or capturing)
    monkeypatch.setattr(k.LAUNCHES, "launch", lambda *args: seen.append(args[-1]))
    logits, t, top_k, top_p = (torch.zeros(8, 152064), torch.ones(8), torch.zeros(8, dtype=torch.int64), torch.ones(8))
    for overlap in (True, False):
        plan = k.launch_plan(k.DEFAULT_CONFIG, 8, 152064, overlap=overlap)
        scratch = Scratch.of(launch_module()._make_scratch(plan, logits.device))
        launch_module()._launch(logits, t, top_k, top_p, plan, torch.empty_like(logits), scratch, None)
    assert seen == [capturing, False] and len(asked) == 1


@pytest.mark.parametrize(
    "field, value",
    [
        ("single_launch_entries", -1),
        ("single_launch_entries", 1.5),
        ("single_warps", 3),
        ("overlap_launches", 1),
        ("overlap_write", 1),
        ("chunk_list", 1),
        ("hoist_loads", 1),
        ("ftz_sum", "yes"),
        ("keep_in_l2", 0),
        ("tiny_compact", 3),
        ("tiny_compact", 4096),
        ("write_registers", 16),
        ("write_registers", 256),
        ("write_registers", 1.5),
    ],
)
def test_single_launch_fields_are_checked(field, value):
    with pytest.raises(ValueError, match=field):
        baseline_config(**{field: value})


def packed_candidates(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """int64 candidates as the chunk kernel packs them: float32 bits high, index low."""
    return (x.float().view(torch.int32).to(torch.int64) << 32) | index.to(torch.int64)


def run_select_block(cand, count, floor, m, z, k, p, vocab, *, capacity, tile, compact, small, tiny=0):
    """(compacted candidates, kept row, (num, proven, norm)) of `compact_and_prove`."""
    from tests.fixtures.select_block_kernel import compact_and_prove

    compacted = torch.full((compact,), -7, dtype=torch.int64)
    out = torch.zeros(vocab)
    result = torch.zeros(3)
    compact_and_prove[(1,)](
        cand,
        count,
        compacted,
        out,
        result,
        count.numel(),
        floor,
        m,
        z,
        k,
        p,
        CAPACITY=capacity,
        TILE=tile,
        COMPACT=compact,
        SMALL=small,
        TINY=tiny,
    )
    return compacted, out, result.tolist()


def float_keys(x: torch.Tensor) -> torch.Tensor:
    """The select kernel's order-preserving int32 key of float32 x (`_key`), on the host."""
    bits = x.float().view(torch.int32).long()
    return torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


# Rows for the key searches: a span across zero wider than 2**31, keys a few ulps apart with
# ties, a -inf, and a typical candidate set (logits ~ N(15, 3^2)).
SEARCH_ROWS = {
    "wide": [-3e38, -1.0, -0.0, 1e-30, 5.0, 3e38, 5.0],
    "ulps": [1.0 + i * 2.0**-23 for i in (0, 1, 1, 2, 3, 3, 3, 4)],
    "with -inf": [float("-inf"), -2.0, 7.5, 7.5, 100.0],
    "typical": (15.0 + 3.0 * torch.randn(200, generator=generator(97))).tolist(),
}


@pytest.mark.parametrize("name", list(SEARCH_ROWS))
def test_key_searches_find_the_exact_cut_whatever_the_span_of_the_keys(name):
    """`_kth_key` and `_top_p_key` bisect only between the smallest and largest key that can
    hold the answer. Against brute force on the host: the k-th largest key for every k from 1
    (the largest key) to n (the smallest), and for top-p the largest key v whose mass at or
    above v reaches the target, for targets at and between the cumulative masses. Masses are
    multiples of 1/64, so every float32 sum is exact and the comparison is exact too."""
    from tests.fixtures.select_block_kernel import key_searches

    x = torch.tensor(SEARCH_ROWS[name], dtype=torch.float32)
    n = x.numel()
    keys = float_keys(x)
    g = generator(98)
    mass = torch.randint(0, 5, (n,), generator=g).float() / 64  # some slots without mass
    mass[keys.argmax()] = 1.0  # at least one positive mass
    desc = keys.sort(descending=True).values
    levels = keys[mass > 0].unique().sort(descending=True).values
    at_or_above = torch.stack([mass[keys >= v].sum() for v in levels])
    targets = torch.cat([at_or_above, (at_or_above[:-1] + at_or_above[1:]) / 2])

    def search(k, target):
        result = torch.zeros(2, dtype=torch.int32)
        key_searches[(1,)](x, mass, result, n, k, target, BLOCK=256)
        return result.tolist()

    for k in range(1, n + 1):
        assert search(k, targets[0].item())[0] == desc[k - 1].item(), k
    for target in targets.tolist():
        expected = levels[(at_or_above >= target).nonzero()[0, 0]].item()
        assert search(1, target)[1] == expected, target


@pytest.mark.parametrize("tile", [1, 4, 16])
def test_compaction_keeps_stored_candidates_at_the_floor_in_chunk_order(tile):
    """`_compact` copies, chunk by chunk and slot by slot, every stored candidate (slot < the
    chunk's count) with x >= floor, whatever the tile (13 chunks: the last tile is partial).
    Slots past a chunk's count hold huge x that would pass the floor if they were read."""
    g = generator(91)
    num_chunks, capacity = 13, 8
    x = torch.randn(num_chunks, capacity, generator=g)
    count = torch.randint(0, capacity + 1, (num_chunks,), generator=g, dtype=torch.int32)
    stored = torch.arange(capacity)[None, :] < count[:, None].long()
    x = torch.where(stored, x, torch.full_like(x, 1e30))
    cand = packed_candidates(x.flatten(), torch.arange(num_chunks * capacity))
    compacted, _, (num, _, _) = run_select_block(
        cand, count, 0.0, 1.0, 1.0, 3, 1.0, 128, capacity=capacity, tile=tile, compact=128, small=0
    )
    expected = cand[(stored & (x >= 0.0)).flatten()]
    assert 0 < expected.numel() < stored.sum()
    assert int(num) == expected.numel()
    assert torch.equal(compacted[: expected.numel()], expected)


@pytest.mark.parametrize("floor", [0.5, 1.5, float("-inf")])
def test_compaction_over_the_listed_chunks_takes_the_same_candidates(floor):
    """`_compact_listed` over the chunks `_list_hot_chunks` lists (max not below the floor)
    writes exactly what `_compact` over every chunk writes, in the same order. 37 chunks of 8
    slots, tile 4: several steps of listed chunks. Chunk maxima are at or above the stored
    candidates (some chunks hold a larger unstored token); slots past a chunk's count hold
    huge x; one chunk's max is NaN (listed whatever the floor), and one chunk with a max at
    the floor stores a candidate equal to it. The list starts filled with a listed chunk, as
    a previous row would leave it, so reading past its end would copy candidates twice."""
    from tests.fixtures.select_block_kernel import both_compactions

    g = generator(95)
    num_chunks, capacity, tile, compact = 37, 8, 4, 512
    x = torch.randn(num_chunks, capacity, generator=g)
    count = torch.randint(0, capacity + 1, (num_chunks,), generator=g, dtype=torch.int32)
    stored = torch.arange(capacity)[None, :] < count[:, None].long()
    chunk_max = torch.where(stored, x, float("-inf")).amax(1)
    chunk_max += torch.where(torch.rand(num_chunks, generator=g) < 0.3, 0.25, 0.0)
    if floor > float("-inf"):
        count[5], x[5, 0], chunk_max[5] = 1, floor, floor
    count[11], x[11, 0], chunk_max[11] = max(int(count[11]), 1), 2.0, float("nan")
    x = torch.where(stored | (torch.arange(capacity)[None, :] < count[:, None].long()), x, torch.full_like(x, 1e30))
    cand = packed_candidates(x.flatten(), torch.arange(num_chunks * capacity))
    full, listed = (torch.full((compact,), -7, dtype=torch.int64) for _ in range(2))
    result = torch.zeros(3, dtype=torch.int32)
    stale_list = torch.full((64,), 11, dtype=torch.int32)  # a chunk read twice would show
    both_compactions[(1,)](
        cand,
        count,
        chunk_max,
        stale_list,
        full,
        listed,
        result,
        num_chunks,
        floor,
        CHUNKS_PAD=64,
        CAPACITY=capacity,
        TILE=tile,
        COMPACT=compact,
    )
    num_full, num_listed, num_hot = result.tolist()
    expected_hot = int(((chunk_max >= floor) | chunk_max.isnan()).sum())
    assert num_hot == expected_hot and (num_hot < num_chunks or floor == float("-inf"))
    assert num_hot > 2 * tile or floor > 1.0
    assert num_listed == num_full > 0
    assert torch.equal(listed, full)


@pytest.mark.parametrize("num", [40, 100])
def test_rows_with_few_candidates_search_the_small_block_with_the_same_cut(num):
    """`_prove_and_scatter` with SMALL = 64: a row of 40 candidates bisects a 64-slot block, one
    of 100 the 256-slot block; either way the kept tokens (top-k 10, then the top-p prefix of
    6: p is set halfway between two prefix masses, far from any rounding) and their values
    are those of SMALL = 0 and of the exact float64 cut. The largest candidate sits in the last
    slot, so a block that misses a slot fails."""
    g = generator(92)
    vocab = 300
    x = torch.arange(num, dtype=torch.float64) * -0.7 + torch.rand(num, generator=g, dtype=torch.float64) * 0.3
    x = x.float()[torch.randperm(num, generator=g)]
    last = int(x.argmax())
    x[last], x[-1] = x[-1].clone(), x[last].clone()  # the largest in the last slot read
    index = torch.randperm(vocab, generator=g)[:num]
    cand = packed_candidates(x, index)
    count = torch.full((num // 4,), 4, dtype=torch.int32)  # chunks of 4 slots, all stored
    order = x.double().sort(descending=True)
    e = (order.values - order.values[0]).exp()
    z = float(e.sum())
    prefix = e[:10].cumsum(0)
    p = float((prefix[4] + prefix[5]) / 2 / prefix[-1])
    expected = torch.zeros(vocab, dtype=torch.float64)
    expected[index[order.indices[:6]]] = e[:6] / e[:6].sum()
    rows = {
        small: run_select_block(
            cand, count, float("-inf"), float(x.max()), z, 10, p, vocab, capacity=4, tile=8, compact=256, small=small
        )
        for small in (0, 64)
    }
    for _compacted, out, (found, proven, _) in rows.values():
        assert (int(found), proven) == (num, 1.0)
        # float32 exp(x - m) (x - m rounded: <= 7u relative after exp for |x - m| <= 70 * 0.7)
        # over a float32 sum of 6 positive terms (<= 5u): 3e-5 covers both with room
        torch.testing.assert_close(out.double(), expected, rtol=3e-5, atol=0)
    assert torch.equal(rows[0][1] > 0, rows[64][1] > 0)


def top_k_survivors(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(keys, float64 exp(x - max), survivors) of float32 candidates x: top-k keeps every key
    >= the k-th largest, ties included; k <= 0 keeps all."""
    keys = float_keys(x)
    e = (x.double() - x.double().max()).exp()
    kept = keys >= keys.sort(descending=True).values[k - 1] if k > 0 else keys > keys.min() - 1
    return keys, e, kept


def host_cut(x: torch.Tensor, k: int, p: float) -> torch.Tensor:
    """Kept mask of float32 candidates x by the select kernel's rule, in float64: the top-k
    survivors (`top_k_survivors`); top-p then keeps a survivor iff the mass of the survivors
    with a strictly larger key is < p * their total."""
    keys, e, kept = top_k_survivors(x, k)
    total = e[kept].sum()
    above = torch.stack([e[kept & (keys > key)].sum() for key in keys])
    return kept & (above < p * total) if p < 1.0 else kept


def halfway_p(x: torch.Tensor, k: int, level: int) -> float:
    """A top-p between the survivors' masses at and above two consecutive distinct keys (level
    and level + 1, from the top), so no float32 rounding of the sums can move the cut."""
    keys, e, kept = top_k_survivors(x, k)
    levels = keys[kept].unique().sort(descending=True).values
    at_or_above = torch.stack([e[kept & (keys >= v)].sum() for v in levels[: level + 2]])
    return float((at_or_above[level] + at_or_above[level + 1]) / 2 / e[kept].sum())


@pytest.mark.parametrize("num", [1, 13, 64, 256])
def test_tiny_block_finds_the_cut_of_the_searches(num):
    """`_prove_tiny` (TINY = 256: no search, one pairwise pass) keeps the tokens of the key
    searches on the 512-slot block (TINY = 0) and of the host's rule (`host_cut`), for top-k
    alone (k = 1, a k inside a run of ties, k = num), top-k + top-p, top-p alone (then the row
    Z decides coverage: a Z beyond the candidates' mass leaves the row unproven), and k > num
    (unproven). Candidates are multiples of 1/4, so ties are common; num = 13 ends inside a
    step of the pass, num = 256 fills the block."""
    g = generator(93)
    vocab = 600
    x = (torch.randn(num, generator=g) * 8).round() / 4
    index = torch.randperm(vocab, generator=g)[:num]
    cand = packed_candidates(x, index)
    count = torch.full((num,), 1, dtype=torch.int32)  # chunks of one slot, all stored
    keys, e, _ = top_k_survivors(x, 0)
    tied_k = int((keys > keys.sort(descending=True).values[num // 2]).sum()) + 1
    cases = [(1, 1.0), (tied_k, 1.0), (num, 1.0)]
    if num > 1:
        cases += [
            (num, halfway_p(x, num, 0)),
            (tied_k, halfway_p(x, tied_k, 0)),
            (0, halfway_p(x, 0, min(3, int(keys.unique().numel()) - 2))),
        ]
    for k, p in cases:
        rows = {
            tiny: run_select_block(
                cand,
                count,
                float("-inf"),
                float(x.max()),
                float(e.sum()),
                k,
                p,
                vocab,
                capacity=1,
                tile=64,
                compact=512,
                small=0,
                tiny=tiny,
            )
            for tiny in (0, 256)
        }
        expected = torch.zeros(vocab, dtype=torch.bool)
        expected[index[host_cut(x, k, p)]] = True
        for _, out, (found, proven, _) in rows.values():
            assert (int(found), proven) == (num, 1.0), (k, p)
            assert torch.equal(out > 0, expected), (k, p)
        # both are exp(x - m) / norm over the same kept tokens: float32 exp of the same float32
        # argument, norm a float32 sum of <= 256 positive terms in two orders (each within
        # 255u of the exact sum, u = 2**-24): 2 * 255u ~ 3.1e-5 relative between them
        torch.testing.assert_close(rows[256][1], rows[0][1], rtol=3.1e-5, atol=0)
    for k, z in ((num + 1, float(e.sum())), (0, float(e.sum()) * 4)):  # unproven
        p = 0.5 if k == 0 else 1.0
        for tiny in (0, 256):
            _, out, (_, proven, _) = run_select_block(
                cand,
                count,
                float("-inf"),
                float(x.max()),
                z,
                k,
                p,
                vocab,
                capacity=1,
                tile=64,
                compact=512,
                small=0,
                tiny=tiny,
            )
            assert proven == 0.0 and not out.any(), (k, tiny)


def run_top_k_floor(chunk_max, floors, counts, m, spread, k, steps=0) -> float:
    from tests.fixtures.select_block_kernel import top_k_floor

    result = torch.zeros(1)
    top_k_floor[(1,)](chunk_max, floors, counts, result, chunk_max.numel(), m, spread, k, CHUNKS_PAD=64, STEPS=steps)
    return result.item()


# `_pivot` with m = 0 and spread = 1: 0 at level 0, -2**((j - 25) / 4) at level j >= 1
LEVELS = torch.arange(32, dtype=torch.float64)
UNIT_PIVOTS = torch.where(LEVELS == 0, 0.0, -(2.0 ** ((LEVELS - 25) / 4)))


def certain_count(chunk_max, floors, counts, v) -> int:
    """`_certain_count` on the host: one token per chunk whose max reaches v, a chunk's
    count if its floor does."""
    return int(torch.maximum(torch.where(floors >= v, counts, 0), (chunk_max >= v).int()).sum())


def test_top_k_floor_is_the_lowest_level_the_chunks_prove():
    """`_top_k_floor` with m = 0 and spread = 1: the pivots are 0 (level 0) and
    -2**((j - 25) / 4). A chunk proves one token at a pivot its max reaches and its count at
    a pivot its floor reaches; the floor is the pivot of the lowest level at which the 40
    chunks prove k, -inf if none does. Maxima and floors are drawn
    away from every pivot (>= 1% of the gap), so float32 pivots decide as float64 ones do."""
    g = generator(94)
    pivots = UNIT_PIVOTS

    def off_pivot(v):  # push values within 1% of a gap off the pivot
        near = (v[:, None] - pivots[None, :]).abs().argmin(1)
        gap = 0.01 * pivots[near].abs().clamp(min=0.01)
        return torch.where((v - pivots[near]).abs() < gap, pivots[near] - gap, v)

    chunk_max = off_pivot(-((torch.rand(40, generator=g, dtype=torch.float64) * 3) ** 2))
    chunk_max[7] = 0.0  # the row max
    floors = off_pivot(chunk_max - torch.rand(40, generator=g, dtype=torch.float64) * 2)
    floors[3] = float("inf")  # a chunk whose candidates did not fit: no count
    counts = torch.randint(1, 9, (40,), generator=g, dtype=torch.int32)
    counts[3] = 0

    def certain(v):
        return certain_count(chunk_max, floors, counts, v)

    total = certain(pivots[-1].item())
    for k in [1, 2, 5, 17, 60, total, total + 1]:
        proving = [j for j in range(32) if certain(pivots[j].item()) >= k]
        expected = pivots[proving[0]].item() if proving else float("-inf")
        found = run_top_k_floor(chunk_max.float(), floors.float(), counts, 0.0, 1.0, k)
        assert found == pytest.approx(expected, rel=1e-6), k
    # a NaN spread: level 0 is m itself (it proves k = 1, the max, but not k = 2), and
    # `_pivot` clamps every other level to -FLT_MAX, which bounds every finite token
    nan, flt_max = float("nan"), torch.finfo(torch.float32).max
    assert run_top_k_floor(chunk_max.float(), floors.float(), counts, 0.0, nan, 1) == 0.0
    assert run_top_k_floor(chunk_max.float(), floors.float(), counts, 0.0, nan, 2) == -flt_max


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_refined_top_k_floor_is_proved_and_within_its_resolution(steps):
    """`_top_k_floor` with `steps` refining bisections, on fresh chunk statistics (40 chunks,
    m = 0, spread = 1, as in the test above): the floor v it returns is proved (the
    statistics, read in float32 as the kernel reads them, give >= k tokens at or above v), is
    at or above the level floor, and is tight to the bisection's resolution: the statistics do
    not prove k at v + 1.01 * gap / 2**steps, gap being the distance from the level floor to
    the pivot of the level above (which does not prove k). k = 1 (level 0, the max: nothing
    to refine) and k beyond every level (-inf) are unchanged."""
    pivots = UNIT_PIVOTS
    for seed in (94, 95, 96):
        g = generator(seed)
        chunk_max = -((torch.rand(40, generator=g) * 3) ** 2)
        chunk_max[7] = 0.0
        floors = chunk_max - torch.rand(40, generator=g) * 2
        counts = torch.randint(1, 9, (40,), generator=g, dtype=torch.int32)

        certain = functools.partial(certain_count, chunk_max, floors, counts)

        total = certain(float(pivots[-1]))
        for k in [1, 2, 5, 17, 60, total, total + 1]:
            level_floor = run_top_k_floor(chunk_max, floors, counts, 0.0, 1.0, k)
            found = run_top_k_floor(chunk_max, floors, counts, 0.0, 1.0, k, steps)
            if k == 1 or level_floor == float("-inf"):
                assert found == level_floor, (seed, k)
                continue
            assert certain(torch.tensor(found, dtype=torch.float32)) >= k, (seed, k)
            assert found >= level_floor, (seed, k)
            level = int((pivots - level_floor).abs().argmin())
            gap = float(pivots[level - 1]) - level_floor  # to the level above: level >= 1
            assert gap > 0 and certain(found + 1.01 * gap / 2**steps) < k, (seed, k)


def test_the_plan_refines_the_top_k_floor_in_the_select_kernel_only():
    """`top_k_floor_steps` is the select kernel's FLOOR_STEPS (3 by default, 0 off); the single
    launch takes no such constexpr (it passes the level, 0 steps, to the row's select)."""
    k = kernel()
    for steps in (0, k.TOP_K_FLOOR_STEPS):
        config = dataclasses.replace(k.DEFAULT_CONFIG, top_k_floor_steps=steps)
        select = k.launch_plan(config, 8, 152064).launches[1]
        assert dict(select.constexprs)["FLOOR_STEPS"] == steps
        (single,) = k.launch_plan(config, 1, 700).launches
        assert "FLOOR_STEPS" not in dict(single.constexprs)
    assert k.DEFAULT_CONFIG.top_k_floor_steps == k.TOP_K_FLOOR_STEPS == 3
    with pytest.raises(ValueError, match="top_k_floor_steps=17"):
        baseline_config(top_k_floor_steps=17)
