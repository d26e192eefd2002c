"""GPU checks of the Triton kernels at full size (skipped without CUDA)."""

import dataclasses

import pytest
import torch

from engine.params import SamplingParams
from engine.sampling import batched_probabilities, categorical, uniform_blocks
from tests.fixtures.accept_law import check_ragged_law, dyadic, quadrature_law, run_ragged
from tests.fixtures.sampling_helpers import GPU_EXP, assert_row_matches_float64, baseline_config, generator

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
QWEN_VOCAB = 152064
# Rows are compared with the exact float64 distribution; the top-p band and the value bound
# come from the rounding analysis in tests/fixtures/sampling_helpers.py, with the GPU's fast exp (GPU_EXP).


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_vocab_kernel_matches_reference(dtype):
    rows = [
        (1.0, 50, 0.9),
        (0.7, -1, 0.95),
        (0.0, -1, 1.0),
        (1.0, 1000, 1.0),
        (1.3, 5000, 0.8),
        (100.0, -1, 0.5),
        (1e-3, 20, 1.0),
        (1.0, -1, 1.0),
    ]
    logits = (torch.randn(len(rows), QWEN_VOCAB, generator=generator(71)) * 4).to(dtype)
    t = torch.tensor([r[0] for r in rows], dtype=torch.float32)
    k = torch.tensor([r[1] for r in rows])
    p = torch.tensor([r[2] for r in rows], dtype=torch.float32)
    out = batched_probabilities(logits.cuda(), t.cuda(), k.cuda(), p.cuda(), backend="triton")
    assert_matches_reference_rows(out.cpu(), logits, t, k, p)


def random_rows(num_rows, seed, vocab=QWEN_VOCAB):
    """Fresh random rows (V = 152,064 by default): scales, temperatures, k and p all drawn at
    random."""
    g = generator(seed)
    scale = 0.5 + 6 * torch.rand(num_rows, 1, generator=g)
    logits = torch.randn(num_rows, vocab, generator=g) * scale
    t = 0.2 + 1.8 * torch.rand(num_rows, generator=g)
    k = torch.randint(1, 3000, (num_rows,), generator=g)
    k[::3] = -1
    p = 0.3 + 0.69 * torch.rand(num_rows, generator=g)
    p[1::4] = 1.0
    return logits, t, k, p


def assert_matches_reference_rows(out, logits, t, k, p):
    for b in range(logits.shape[0]):
        params = SamplingParams(temperature=float(t[b]), top_k=int(k[b]), top_p=float(p[b]))
        assert_row_matches_float64(out[b], logits[b], params, exp=GPU_EXP, label=f"row {b}")


def poison_allocator(shape):
    """Leave a NaN-filled block in the caching allocator, so an unwritten output element of
    the next allocation of this size shows up as NaN instead of a stale right answer."""
    torch.full(shape, float("nan"), device="cuda")


def kernel_configs():
    """Every configuration the benchmark sweeps, plus one whose truncating rows all fall back."""
    from engine.sampling.kernels.probabilities import CANDIDATE_CONFIGS

    return [*CANDIDATE_CONFIGS, baseline_config(chunk_capacity=1)]


@pytest.mark.parametrize("index", range(len(kernel_configs())))
def test_chunked_kernel_on_fresh_random_rows(index):
    """48 fresh random rows at full vocabulary for each configuration that may be the default;
    capacity 1 sends every truncating row with k > 1 through the whole-row fallback."""
    from engine.sampling.kernels.probabilities import RowMode, run_probabilities

    config = kernel_configs()[index]
    logits, t, k, p = random_rows(48, 76 + config.chunk + config.chunk_capacity + index)
    t[:6], k[:6], p[:6] = 0.8, 50, 0.9  # the benchmark's rows
    on_device = [a.cuda() for a in (logits, t, k, p)]
    poison_allocator(logits.shape)  # after the inputs, so the output gets the NaN block
    result = run_probabilities(*on_device, config)
    modes = result.row_mode.cpu()
    assert_matches_reference_rows(result.probs.cpu(), logits, t, k, p)
    expected = RowMode.SPARSE if config.chunk_capacity > 1 else RowMode.FALLBACK
    assert (modes[:6] == expected).all(), (config, modes)


@pytest.mark.parametrize("vocab", [32000, QWEN_VOCAB])
def test_chunk_kernel_options_change_no_result(vocab):
    """`ftz_sum` (the chunk sums' exp flushes terms below 2**-126), `hoist_loads` and
    `reciprocal_division` (x / T by the row's reciprocal; blocks with a 0 or a -inf and a row
    at T = 1e-9 divide as IEEE division) on and off give bitwise the same probabilities and
    row modes, also where most terms flush: the
    first rows' logits spread over hundreds of units at T = 1, so exp(x - max) < 2**-126 for
    most of their tokens, and each chunk sum (>= 1, its max's term) absorbs them in rounding.
    The flushing exp is compiled in (the plan's FTZ_SUM), and the rows match the reference."""
    from engine.sampling.backend import compiles_natively
    from engine.sampling.kernels.probabilities import DEFAULT_CONFIG, launch_plan, run_probabilities

    logits, t, k, p = mixed_rows(16, 97, vocab)
    logits[5:9] = torch.randn(4, vocab, generator=generator(98)) * 150
    t[5:9], k[5:9], p[5:9] = 1.0, torch.tensor([-1, 50, -1, 2000]), torch.tensor([1.0, 0.9, 0.95, 1.0])
    logits[9, 7], logits[10, 3000], t[11] = 0.0, float("-inf"), 1e-9  # IEEE division there
    rows = [a.cuda() for a in (logits, t, k, p)]
    results = []
    for ftz, hoist, reciprocal in (
        (False, False, False),
        (True, False, False),
        (False, True, False),
        (True, True, False),
        (True, True, True),
    ):
        config = dataclasses.replace(
            DEFAULT_CONFIG, ftz_sum=ftz, hoist_loads=hoist, reciprocal_division=reciprocal, single_launch_entries=0
        )
        plan = launch_plan(config, 16, vocab, native=compiles_natively(rows[0].device))
        assert dict(plan.launches[0].constexprs)["FTZ_SUM"] is ftz
        results.append(run_probabilities(*rows, config))
    for other in results[1:]:
        assert torch.equal(other.probs, results[0].probs)
        assert torch.equal(other.row_mode, results[0].row_mode)
    assert_matches_reference_rows(results[-1].probs.cpu(), logits, t, k, p)


def test_uniform_blocks_bitwise_equal_on_cpu_and_cuda():
    seeds = torch.randint(0, 2**62, (64,), generator=generator(72))
    pos = torch.randint(0, 2**40, (64,), generator=generator(73))
    cpu = uniform_blocks(seeds, pos, 9, backend="torch")
    for backend in ("triton", "torch"):
        assert torch.equal(uniform_blocks(seeds.cuda(), pos.cuda(), 9, backend=backend).cpu(), cpu)


def test_categorical_backends_agree_on_gpu():
    w = torch.rand(64, QWEN_VOCAB, generator=generator(74))
    w[w < 0.5] = 0
    u = torch.rand(64, generator=generator(75), dtype=torch.float64)
    got = categorical(w.cuda(), u.cuda(), backend="triton").cpu()
    assert torch.equal(got, categorical(w, u, backend="torch"))


def test_quadrature_on_gpu():
    p1, q1, p2 = dyadic(31, [1]), dyadic(32, [4]), dyadic(33, [3])
    first, bonus, _ = quadrature_law(p1.cuda(), q1.cuda(), p2.cuda(), "triton")
    torch.testing.assert_close(first.cpu(), p1.double(), atol=1e-9, rtol=0)


def test_ragged_monte_carlo_triton_gpu():
    """Same statistics and false-fail rate (1e-3) as the torch Monte Carlo test."""
    out, num_drafts, p, _, _ = run_ragged("triton", "cuda")
    check_ragged_law(out, num_drafts, p)


def test_benchmark_large_k_rows_are_proven_on_the_candidates():
    """The benchmark's top-k 1000 + top-p 0.95 rows (logits ~ N(0, 4^2), T 0.8) and rows with
    k = 1500, at full vocabulary: with the default configuration every row is SPARSE and matches
    the reference. With the narrow candidate share only (before), 929-1,556 tokens of such rows
    clear the row floor: about 1 row in 256 at k = 1000 and most rows at k = 1500 took the
    one-program fallback, so this test fails without the wide share."""
    from engine.sampling.kernels.probabilities import RowMode, run_probabilities

    num_rows = 64
    logits = torch.randn(num_rows, QWEN_VOCAB, generator=generator(81)) * 4
    t = torch.full((num_rows,), 0.8)
    k = torch.full((num_rows,), 1000)
    k[num_rows // 2 :] = 1500
    p = torch.full((num_rows,), 0.95)
    p[::2] = 1.0
    poison_allocator(logits.shape)
    result = run_probabilities(*(a.cuda() for a in (logits, t, k, p)))
    assert (result.row_mode.cpu() == RowMode.SPARSE).all(), result.row_mode
    assert_matches_reference_rows(result.probs.cpu(), logits, t, k, p)


def mixed_rows(num_rows, seed, vocab):
    """`random_rows` with every row kind among the first rows of the batch: top-k + top-p
    over -inf logits, greedy (with a tie across the vocabulary), a flat top-p 0.5 row (half the
    vocabulary kept: no split pivot proves it within the compact buffer, so WHOLE_ROW), ten
    tied tokens at a top-k 5 cut, no truncation."""
    logits, t, k, p = random_rows(num_rows, seed, vocab)
    kinds = [(0.9, 40, 0.95), (0.0, -1, 1.0), (1.0, -1, 0.5), (1.0, 5, 1.0), (1.0, -1, 1.0)]
    for b, (temperature, top_k, top_p) in enumerate(kinds[:num_rows]):
        t[b], k[b], p[b] = temperature, top_k, top_p
    logits[0, 1::5] = float("-inf")
    if num_rows > 3:
        logits[1, [7, vocab - 3]] = logits[1].max() + 1.0  # greedy tie: the lower index wins
        logits[2] *= 0.01
        logits[3, 100:110] = logits[3].max() + 5.0
    return logits, t, k, p


ANY_SIZE = 2**40  # single_launch_entries that sends every batch of these tests to one launch


def single_launch_configs():
    """Every single-launch configuration, and one whose truncating rows all fall back, each
    forced onto the single launch at every batch size."""
    from engine.sampling.kernels.probabilities import SINGLE_LAUNCH_CONFIGS

    forced = baseline_config(chunk=512, chunk_capacity=1)
    return [dataclasses.replace(c, single_launch_entries=ANY_SIZE) for c in (*SINGLE_LAUNCH_CONFIGS, forced)]


# (configuration index, B): every configuration at B 1 and 8; B 64 (the threshold) with the
# default and the all-fallback configuration (each reference row costs ~0.1-0.6 s of CPU).
SINGLE_CASES = [(index, num_rows) for index in range(len(single_launch_configs())) for num_rows in (1, 8)] + [
    (0, 64),
    (len(single_launch_configs()) - 1, 64),
]


@pytest.mark.parametrize("vocab", [32000, QWEN_VOCAB])
@pytest.mark.parametrize("index, num_rows", SINGLE_CASES)
def test_single_launch_on_fresh_random_rows(index, num_rows, vocab):
    """The single launch (B * V <= single_launch_entries) on fresh random rows of every kind
    (`mixed_rows`), into a NaN-filled output block: every row matches the float64 reference;
    with one candidate slot per chunk the top-k rows take the fallback, so the serial split
    count is exercised at every B, and the flat row runs the whole-row kernel."""
    from engine.sampling.kernels.probabilities import RowMode, launch_plan, run_probabilities

    config = single_launch_configs()[index]
    assert launch_plan(config, num_rows, vocab).single
    logits, t, k, p = mixed_rows(num_rows, 200 + 10 * index + num_rows + vocab % 7, vocab)
    poison_allocator(logits.shape)
    result = run_probabilities(*(a.cuda() for a in (logits, t, k, p)), config)
    assert_matches_reference_rows(result.probs.cpu(), logits, t, k, p)
    modes = result.row_mode.cpu()
    # row 0 (top-k 40): hundreds of candidates clear its row floor, one slot per chunk do not
    assert modes[0] == (RowMode.FALLBACK if config.chunk_capacity == 1 else RowMode.SPARSE)
    if num_rows > 3:
        assert modes[2] == RowMode.WHOLE_ROW, modes


@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("capacity", [32, 1])
def test_graph_replay_equals_eager_and_captures_own_scratch(capacity, single):
    """probabilities_triton captured in a CUDA Graph (as a decode round is) and replayed on
    fresh inputs copied into its static inputs gives bitwise the eager result on those inputs
    (same kernels, same inputs, sums in a fixed order), and the capture takes fresh scratch from
    the graph's pool, not the eager cache; capacity 1 sends the truncating rows through the
    split fallback; `single`: the single launch (its tickets must be zero at every replay)."""
    from engine.sampling.kernels.probabilities import SCRATCH, launch_plan, probabilities_triton

    config = baseline_config(
        chunk=512,
        chunk_capacity=capacity,
        chunk_warps=1,
        write_chunk=8192,
        single_launch_entries=ANY_SIZE if single else 0,
    )
    static = [a.cuda() for a in random_rows(16, 91)]
    fresh = [a.cuda() for a in random_rows(16, 92)]
    assert launch_plan(config, 16, QWEN_VOCAB).single == single
    probabilities_triton(*static, config=config)  # compiles, and fills the eager cache
    cached = len(SCRATCH)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = probabilities_triton(*static, config=config)
    assert len(SCRATCH) == cached
    for dst, src in zip(static, fresh):
        dst.copy_(src)
    graph.replay()
    eager = probabilities_triton(*fresh, config=config)
    assert torch.equal(out, eager)
    graph.replay()  # a second replay: the first left every ticket at zero
    assert torch.equal(out, eager)
    assert_matches_reference_rows(eager.cpu(), *(a.cpu() for a in fresh))


@pytest.mark.parametrize("capacity", [32, 1])
@pytest.mark.parametrize("field", ["overlap_launches", "overlap_write"])
def test_overlapped_launches_give_the_serial_result(capacity, field):
    """With programmatic dependent launch (on Hopper: `overlap_launches`, the select and write
    kernels; `overlap_write`, the write kernel in eager calls) a kernel starts while the one
    before it runs and waits on the device for its results: five calls back to back, and a
    CUDA Graph replay of one, give bitwise the output of serial launches (a kernel that read
    before its predecessor finished would not), and the reference; capacity 1 sends the
    truncating rows through the split fallback, whose write programs read the select kernel's
    row modes."""
    from engine.sampling.kernels.launch_overlap import supports_overlap
    from engine.sampling.kernels.probabilities import DEFAULT_CONFIG, probabilities_triton

    if not supports_overlap(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 and Triton >= 3.4")
    serial = dataclasses.replace(
        DEFAULT_CONFIG, chunk_capacity=capacity, single_launch_entries=0, overlap_launches=False, overlap_write=False
    )
    overlap = dataclasses.replace(serial, **{field: True})
    rows = [a.cuda() for a in random_rows(32, 94 + capacity)]
    overlapped = [probabilities_triton(*rows, config=overlap) for _ in range(5)]
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = probabilities_triton(*rows, config=overlap)
    graph.replay()
    expected = probabilities_triton(*rows, config=serial)
    for out in (*overlapped, replayed):
        assert torch.equal(out, expected)
    assert_matches_reference_rows(expected.cpu(), *(a.cpu() for a in rows))


def test_overlapped_write_launches_serially_while_captured(monkeypatch):
    """`overlap_write`: eager calls enqueue their kernels with the write kernel's programmatic
    dependent launch on, a call captured in a CUDA Graph enqueues them serially (recorded at
    `CompiledLaunch.enqueue`), and the replay gives the eager result bitwise."""
    from engine.sampling.kernels import launcher
    from engine.sampling.kernels.launch_overlap import supports_overlap
    from engine.sampling.kernels.probabilities import DEFAULT_CONFIG, probabilities_triton

    if not supports_overlap(torch.device("cuda")):
        pytest.skip("programmatic dependent launch needs compute capability 9.0 and Triton >= 3.4")
    config = dataclasses.replace(DEFAULT_CONFIG, single_launch_entries=0, overlap_write=True, overlap_launches=False)
    rows = [a.cuda() for a in random_rows(16, 211)]
    eager = probabilities_triton(*rows, config=config)  # compiles: through the JIT
    seen, enqueue = [], launcher.CompiledLaunch.enqueue

    def recording(self, stream, args, serial=False):
        seen.append((bool(torch.cuda.is_current_stream_capturing()), serial))
        enqueue(self, stream, args, serial)

    monkeypatch.setattr(launcher.CompiledLaunch, "enqueue", recording)
    again = probabilities_triton(*rows, config=config)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = probabilities_triton(*rows, config=config)
    graph.replay()
    torch.cuda.synchronize()
    assert seen == [(False, False)] * 3 + [(True, True)] * 3
    assert torch.equal(again, eager) and torch.equal(replayed, eager)


@pytest.mark.parametrize("capacity", [32, 1])
def test_reverse_write_gives_the_default_result(capacity):
    """`reverse_write` (a row's write chunks from the last to the first), eager into a
    NaN-filled output block and replayed in a CUDA Graph: bitwise the probabilities and row
    modes of the forward order, on rows of every kind (`mixed_rows`), and the reference;
    capacity 1 sends the truncating rows through the split fallback, whose counts are indexed
    by write chunk."""
    from engine.sampling.kernels.probabilities import DEFAULT_CONFIG, probabilities_triton, run_probabilities

    forward = dataclasses.replace(DEFAULT_CONFIG, chunk_capacity=capacity, single_launch_entries=0, reverse_write=False)
    reverse = dataclasses.replace(forward, reverse_write=True)
    logits, t, k, p = mixed_rows(32, 96 + capacity, QWEN_VOCAB)
    rows = [a.cuda() for a in (logits, t, k, p)]
    expected = run_probabilities(*rows, forward)
    poison_allocator(logits.shape)
    result = run_probabilities(*rows, reverse)
    assert torch.equal(result.probs, expected.probs)
    assert torch.equal(result.row_mode, expected.row_mode)
    probabilities_triton(*rows, config=reverse)  # compiles before the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        replayed = probabilities_triton(*rows, config=reverse)
    graph.replay()
    assert torch.equal(replayed, expected.probs)
    assert_matches_reference_rows(expected.probs.cpu(), logits, t, k, p)


def test_compiled_launches_respecialise_on_dtype_and_alignment():
    """The second call of a specialisation launches the compiled kernels directly
    (CompiledLaunches: pointers as integers, no launch metadata), and must give bitwise the
    output of the first, which went through the JIT; float32 / bfloat16 logits, int32 / int64
    top-k, logits whose data pointer is not 16-byte aligned and V = 152,063 (the same
    constexprs as 152,064, but not a multiple of 16) are different specialisations, so each
    must get its own compiled kernels and still match the reference."""
    from engine.sampling.kernels.probabilities import LAUNCHES, probabilities_triton

    logits, t, k, p = random_rows(8, 93)
    unaligned = torch.empty(8 * QWEN_VOCAB + 1, device="cuda")[1:].view(8, QWEN_VOCAB)
    cases = [
        (logits.cuda(), k.cuda()),
        (logits.bfloat16().cuda(), k.cuda()),
        (logits.cuda(), k.int().cuda()),
        (unaligned.copy_(logits.cuda()), k.cuda()),
        (logits[:, :-1].contiguous().cuda(), k.cuda()),
    ]
    LAUNCHES.clear()  # earlier tests compiled some of these specialisations
    for case_logits, case_k in cases:
        through_jit = probabilities_triton(case_logits, t.cuda(), case_k, p.cuda())
        compiled = probabilities_triton(case_logits, t.cuda(), case_k, p.cuda())
        assert torch.equal(through_jit, compiled)
        assert_matches_reference_rows(compiled.cpu(), case_logits.float().cpu(), t, k, p)
    assert len(LAUNCHES) == len(cases)  # one group of compiled kernels per specialisation


def test_a_warmed_call_compiles_and_loads_nothing():
    """`plan.warm_up` compiles in background threads what a call's first launch would: after it,
    the call finds every kernel in the JIT's cache, so Triton's compilation listener sees no
    compile and no cache load, and the rows are the reference's. Two configurations no other
    test runs (their warps differ from every other configuration's), so neither is in this
    process's cache before: the control, not warmed, must compile or load, which shows the
    listener sees first launches."""
    from engine.sampling.kernels import compile_clock
    from engine.sampling.kernels.probabilities import run_probabilities
    from engine.sampling.kernels.probabilities.config import DEFAULT_CONFIG
    from engine.sampling.kernels.probabilities.plan import warm_up
    from engine.sampling.kernels.warmup import WARMUPS

    if compile_clock.install() is None:
        pytest.skip("this Triton has no compilation listener")
    vocab, rows = 256, 1024  # the looped model's vocabulary; 1,024 rows take the three launches
    warmed = dataclasses.replace(DEFAULT_CONFIG, select_warps=2, single_warps=2)
    control = dataclasses.replace(DEFAULT_CONFIG, select_warps=16, single_warps=16)
    logits, t, k, p = random_rows(rows, 97, vocab)
    device = torch.device("cuda")
    for config, warm in ((warmed, True), (control, False)):
        if warm:
            assert warm_up(vocab, (4, rows), device, config=config) == 4  # single + three
            WARMUPS.wait_all()
        before = compile_clock.totals()
        for num_rows in (4, rows):
            out = run_probabilities(*(a[:num_rows].cuda() for a in (logits, t, k, p)), config=config)
            assert_matches_reference_rows(out.probs.cpu(), *(a[:num_rows] for a in (logits, t, k, p)))
        added = compile_clock.totals().since(before)
        assert (added.compiled + added.loaded == 0) == warm, (config, added)
