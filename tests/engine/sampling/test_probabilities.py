"""batched_probabilities and the row-wise reference Sampler vs the exact float64 distribution.

Inputs are drawn with fixed seeds. Both float32 implementations are compared with the float64
distribution by `assert_row_matches_float64` (tests/fixtures/sampling_helpers.py, which states the rounding
analysis): the same support except tokens whose exact top-p mass lies within the float32
rounding band of p (at V = 152,064 a few such tokens exist; at V <= 1,000 the band is ~1e-5
wide), values within the float32 bound. Greedy rows and the top-k cut must match exactly; the
tied cases are built on purpose (small integers, exact in every arithmetic).
"""

import dataclasses

import pytest
import torch

from engine.params import SamplingParams
from engine.sampling import Sampler, batched_probabilities
from tests.fixtures.sampling_helpers import (
    assert_row_matches_float64,
    assert_rows_match,
    generator,
    params,
    triton_can_run_on,
)


def assert_matches_reference(logits, temperature, top_k, top_p, backend):
    out = batched_probabilities(logits, temperature, top_k, top_p, backend=backend)
    assert out.dtype == torch.float32 and out.shape == logits.shape
    assert_rows_match(out, logits, temperature, top_k, top_p)
    return out


def test_mixed_rows(backend):
    """Greedy, truncating and non-truncating rows in one batch; V is not a power of two."""
    logits = torch.randn(8, 300, generator=generator(1)) * 4
    t, k, p = params(
        [1.0, 0.0, 0.7, 1.3, 1.0, 0.0, 2.0, 1.0],
        [-1, -1, 20, 0, 5, 3, 299, 1],
        [1.0, 1.0, 0.8, 0.5, 1.0, 0.3, 0.95, 1.0],
    )
    assert_matches_reference(logits, t, k, p, backend)


def test_tied_logits_keep_all_ties(backend):
    """Integer logits tie heavily: top-k and top-p keep every token tied at the cut."""
    logits = torch.randint(0, 6, (6, 257), generator=generator(2)).float()
    t, k, p = params([1.0] * 6, [1, 3, 10, -1, 40, 2], [1.0, 1.0, 0.5, 0.2, 0.7, 0.9])
    out = assert_matches_reference(logits, t, k, p, backend)
    top = logits[0].max()
    assert int((out[0] > 0).sum()) == int((logits[0] == top).sum())  # all ties of the max


def test_greedy_ties_pick_lowest_index(backend):
    logits = torch.zeros(3, 130)
    logits[0, [7, 90]] = 5.0
    logits[1, [0, 129]] = 1.0
    logits[2, 64:] = 2.0
    t, k, p = params([0.0, 0.0, 0.0], [-1, 3, -1], [1.0, 0.5, 1.0])
    out = batched_probabilities(logits, t, k, p, backend=backend)
    assert out.argmax(1).tolist() == [7, 0, 64]
    assert torch.equal(out.sum(1), torch.ones(3)) and int((out > 0).sum()) == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_logits(backend, dtype):
    logits = (torch.randn(4, 200, generator=generator(3)) * 3).to(dtype)
    t, k, p = params([1.0, 0.0, 0.5, 1.0], [10, -1, -1, 50], [0.9, 1.0, 0.6, 1.0])
    assert_matches_reference(logits, t, k, p, backend)


def test_extreme_temperatures_and_disabled_limits(backend):
    """Temperatures 1e-3 and 100, k >= V, p = 1 and a tiny p."""
    logits = torch.randn(6, 211, generator=generator(4)) * 2
    t, k, p = params(
        [1e-3, 100.0, 1.0, 1.0, 1.0, 100.0],
        [-1, -1, 211, 1000, -1, 7],
        [0.9, 0.9, 1.0, 1.0, 1e-6, 1.0],
    )
    out = assert_matches_reference(logits, t, k, p, backend)
    assert int((out[4] > 0).sum()) == 1  # tiny p keeps only the most probable token
    assert int((out[3] > 0).sum()) == 211  # k >= V keeps everything


def test_large_vocab_torch():
    """V = 152064 (Qwen-sized) on the torch backend; the Triton kernel at this size is a GPU test."""
    logits = torch.randn(3, 152064, generator=generator(5)) * 3
    t, k, p = params([1.0, 0.8, 1.0], [50, -1, 1000], [0.9, 0.95, 1.0])
    assert_matches_reference(logits, t, k, p, "torch")


def test_inputs_not_modified(backend):
    logits = torch.randn(4, 100, generator=generator(6)).to(torch.bfloat16)
    t, k, p = params([1.0, 0.0, 0.5, 2.0], [5, -1, 0, 3], [0.9, 1.0, 0.3, 1.0])
    copies = [x.clone() for x in (logits, t, k, p)]
    batched_probabilities(logits, t, k, p, backend=backend)
    for before, after in zip(copies, (logits, t, k, p)):
        assert torch.equal(before, after)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda a: {**a, "logits": a["logits"].long()}, "logits has dtype"),
        (lambda a: {**a, "logits": a["logits"][0]}, "logits must have 2"),
        (lambda a: {**a, "logits": a["logits"].t()}, "logits must be contiguous"),
        (lambda a: {**a, "temperature": a["temperature"].double()}, "temperature has dtype"),
        (lambda a: {**a, "top_k": a["top_k"][:1]}, "top_k has 1 elements"),
        (lambda a: {**a, "top_p": a["top_p"].half()}, "top_p has dtype"),
        (lambda a: {**a, "logits": a["logits"][:, :0]}, "empty vocabulary"),
        (lambda a: {**a, "backend": "cuda"}, "backend='cuda'"),
        (lambda a: {**a, "top_p": a["top_p"].to("meta")}, "top_p is on meta"),
        (lambda a: {**a, "temperature": a["temperature"].repeat(2)[::2]}, "temperature must be contiguous"),
        (lambda a: {**a, "top_p": a["top_p"][:, None]}, "top_p must have 1 dimension"),
        (lambda a: {**a, "top_k": a["top_k"].short()}, "top_k has dtype"),
        (lambda a: {**a, "temperature": [1.0, 1.0]}, "temperature must be a torch.Tensor"),
    ],
)
def test_bad_arguments(change, message):
    t, k, p = params([1.0, 1.0], [5, -1], [0.9, 1.0])
    args = {"logits": torch.randn(2, 8), "temperature": t, "top_k": k, "top_p": p}
    args = change(args)
    with pytest.raises(ValueError, match=message):
        batched_probabilities(
            args["logits"],
            args["temperature"],
            args["top_k"],
            args["top_p"],
            backend=args.get("backend", "torch"),
        )


def test_a_tensor_subclass_takes_the_named_checks_and_passes():
    """The quick checks take exact torch.Tensor inputs only; a subclass (here a Parameter)
    goes through the named checks, which accept it: same result."""
    t, k, p = params([1.0, 0.5], [5, -1], [0.9, 1.0])
    logits = torch.randn(2, 8, generator=generator(7))
    wrapped = torch.nn.Parameter(logits.clone(), requires_grad=False)
    assert type(wrapped) is not torch.Tensor
    assert torch.equal(
        batched_probabilities(wrapped, t, k, p, backend="torch"),
        batched_probabilities(logits, t, k, p, backend="torch"),
    )


def test_env_var_sets_auto_default(monkeypatch):
    monkeypatch.setenv("ENGINE_SAMPLING_BACKEND", "bogus")
    t, k, p = params([1.0], [5], [0.9])
    with pytest.raises(ValueError, match="ENGINE_SAMPLING_BACKEND='bogus'"):
        batched_probabilities(torch.randn(1, 8), t, k, p)


needs_interpreter = pytest.mark.skipif(not triton_can_run_on(torch.device("cpu")), reason="needs TRITON_INTERPRET=1")


@needs_interpreter
@pytest.mark.parametrize("chunk_capacity, row_capacity", [(1, 8), (1, 512), (16, 8), (64, 64)])
def test_triton_paths_small_blocks(chunk_capacity, row_capacity):
    """Several chunks per row (chunk 64 < V), the chunk candidates, and both whole-row paths
    (row scratch, whole-row radix search) of the fallback."""
    from engine.sampling.kernels.probabilities import BASELINE_CONFIG, RowMode, run_probabilities

    logits = torch.randn(6, 300, generator=generator(7)) * 3
    logits[5] = torch.randint(0, 4, (300,), generator=generator(8)).float()  # heavy ties
    t, k, p = params([1.0, 0.5, 100.0, 1.0, 1e-3, 1.0], [20, -1, -1, 3, 5, 7], [0.8, 0.9, 0.5, 1.0, 0.3, 0.6])
    config = dataclasses.replace(
        BASELINE_CONFIG, chunk=64, chunk_capacity=chunk_capacity, block=64, candidate_capacity=row_capacity
    )
    result = run_probabilities(logits, t, k, p, config)
    assert_rows_match(result.probs, logits, t, k, p)
    modes = result.row_mode.tolist()
    if chunk_capacity == 1:  # 5 chunks hold at most 5 candidates: k = 7 and k = 20 cannot fit
        assert modes[0] == modes[5] == RowMode.FALLBACK
    else:  # small k and a peaked top-p row are proven on the candidates
        assert modes[1] == modes[3] == modes[4] == RowMode.SPARSE, modes


@needs_interpreter
def test_triton_chunked_random_rows():
    """Fresh random rows over many chunks: random k, p, temperature, masked (-inf) logits."""
    from engine.sampling.kernels.probabilities import BASELINE_CONFIG, RowMode, run_probabilities

    g = generator(9)
    num_rows, vocab = 12, 1000
    logits = torch.randn(num_rows, vocab, generator=g) * (1 + 4 * torch.rand(num_rows, 1, generator=g))
    logits[3, 100:400] = float("-inf")  # a whole chunk and parts of others masked out
    logits[7, ::3] = float("-inf")
    t = 0.3 + 2 * torch.rand(num_rows, generator=g)
    k = torch.randint(1, 60, (num_rows,), generator=g)
    k[::4] = -1
    p = torch.where(
        torch.rand(num_rows, generator=g) < 0.7, 0.5 + 0.49 * torch.rand(num_rows, generator=g), torch.ones(num_rows)
    )
    result = run_probabilities(logits, t, k, p, dataclasses.replace(BASELINE_CONFIG, chunk=128, chunk_capacity=32))
    assert_rows_match(result.probs, logits, t, k, p)
    assert RowMode.SPARSE in result.row_mode.tolist()


@pytest.mark.parametrize(
    "field, value",
    [
        ("chunk", 1000),
        ("chunk_capacity", 0),
        ("chunk_warps", 3),
        ("block", 2.0),
        ("compact", 3000),
        ("select_block", 0),
        ("small_compact", 3000),
        ("small_compact", 4096),
        ("small_compact", -2),
        ("small_compact", 1.5),
    ],
)
def test_kernel_config_rejects_bad_values(field, value):
    from engine.sampling.kernels.probabilities import BASELINE_CONFIG

    with pytest.raises(ValueError, match=f"KernelConfig.{field}={value!r}"):
        dataclasses.replace(BASELINE_CONFIG, **{field: value})


def test_kernel_config_grows_chunk_for_huge_vocabularies():
    from engine.sampling.kernels.probabilities import BASELINE_CONFIG

    config = BASELINE_CONFIG
    assert config.chunk_size(152064) == config.chunk
    big = config.chunk_size(2**20 + 1)
    assert big > config.chunk
    assert triton_next_pow2(-(-(2**20 + 1) // big)) * config.chunk_capacity <= config.max_candidates
    with pytest.raises(ValueError, match="chunk_capacity=256"):
        dataclasses.replace(BASELINE_CONFIG, chunk=128, chunk_capacity=256)


def test_kernel_config_hash_is_the_hash_of_its_fields():
    """KernelConfig hashes its fields once (`device_plan` looks plans up by config on every
    call): equal configs hash alike, a changed field changes the hash, and the value is the
    hash of the fields in order, as the dataclass's generated hash would be."""
    import dataclasses

    from engine.sampling.kernels.probabilities import DEFAULT_CONFIG

    same = dataclasses.replace(DEFAULT_CONFIG)
    assert same == DEFAULT_CONFIG and same is not DEFAULT_CONFIG
    assert (
        hash(same)
        == hash(DEFAULT_CONFIG)
        == hash(tuple(getattr(DEFAULT_CONFIG, f.name) for f in dataclasses.fields(DEFAULT_CONFIG)))
    )
    changed = dataclasses.replace(DEFAULT_CONFIG, write_registers=80)
    assert changed != DEFAULT_CONFIG and hash(changed) != hash(DEFAULT_CONFIG)
    assert len({DEFAULT_CONFIG: 1, same: 2, changed: 3}) == 2


def test_kernel_config_pickles_and_copies_by_its_fields():
    """A pickled or copied KernelConfig carries its fields, not the stored hash (which a str
    field would give another value in another process), and is equal with the same hash."""
    import copy
    import dataclasses
    import pickle

    from engine.sampling.kernels.probabilities import DEFAULT_CONFIG

    config = dataclasses.replace(DEFAULT_CONFIG, write_registers=80)
    data = pickle.dumps(config)
    assert b"_hash" not in data
    for other in (pickle.loads(data), copy.copy(config), copy.deepcopy(config)):
        assert other == config and hash(other) == hash(config) and other is not config


def triton_next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def test_float64_comparison_fails_a_moved_cut_and_a_wrong_value():
    """The comparison itself can fail: at V = 300 the top-p band is ~1e-5 wide, so dropping the
    token that crosses p, or scaling one value by 1 + 1e-4 (the bound there is ~2e-6), fails."""
    logits = torch.randn(300, generator=generator(10)) * 3
    prm = SamplingParams(temperature=1.0, top_p=0.9)
    good = Sampler().probabilities(logits, prm)
    assert assert_row_matches_float64(good, logits, prm).num_disagreeing == 0
    crossing = int(torch.where(good > 0, good, 2.0).argmin())  # the smallest kept token
    dropped = good.clone()
    dropped[crossing] = 0.0
    with pytest.raises(AssertionError, match="outside the float32 band"):
        assert_row_matches_float64(dropped / dropped.sum(), logits, prm)
    scaled = good.clone()
    scaled[int(good.argmax())] *= 1 + 1e-4
    with pytest.raises(AssertionError, match="value off by more than the float32 bound"):
        assert_row_matches_float64(scaled, logits, prm)
