"""The patch_cpu_expand replacement of vLLM's expand_batch_to_tokens (torch only; deterministic)."""

import sys
import types

import pytest
import torch

from specval.adapters import vllm_patch


def _reference(x, cu, num_tokens, replace_from=0, replace_to=0):
    """Element by element, as vLLM's docstring and Triton kernel define it."""
    out, start = [], 0
    for value, stop in zip(x.tolist(), cu.tolist()):
        out += [replace_to if value == replace_from else value] * (stop - start)
        start = stop
    return out + [0] * (num_tokens - len(out))


def test_docstring_example():
    x = torch.tensor([10, 20, 30])
    got = vllm_patch.expand_batch_to_tokens(x, torch.tensor([2, 5, 6], dtype=torch.int32), 6)
    assert got.tolist() == [10, 10, 20, 20, 20, 30]


@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_matches_the_kernel_contract_on_random_batches(dtype):
    generator = torch.Generator().manual_seed(0)
    for _ in range(50):
        batch = int(torch.randint(1, 9, (1,), generator=generator))
        counts = torch.randint(0, 6, (batch,), generator=generator)
        cu = torch.cumsum(counts, 0).to(torch.int32)
        x = torch.randint(0, 4, (batch,), generator=generator).to(dtype)
        got = vllm_patch.expand_batch_to_tokens(x, cu, int(cu[-1]), replace_from=0, replace_to=1)
        assert got.dtype == dtype
        assert got.tolist() == _reference(x, cu, int(cu[-1]), 0, 1)


def test_temperature_zero_becomes_one_as_in_the_rejection_sampler():
    temperature = torch.tensor([0.0, 0.7])  # greedy request, sampled request
    got = vllm_patch.expand_batch_to_tokens(temperature, torch.tensor([2, 4]), 4, replace_from=0, replace_to=1)
    assert got.tolist() == pytest.approx([1.0, 1.0, 0.7, 0.7])


def test_every_element_is_written_even_past_the_counts():
    got = vllm_patch.expand_batch_to_tokens(torch.tensor([5.0]), torch.tensor([2]), 4)
    assert got.tolist() == [5.0, 5.0, 0.0, 0.0]


def test_refuses_mismatched_batch():
    with pytest.raises(ValueError, match="cu_num_tokens"):
        vllm_patch.expand_batch_to_tokens(torch.ones(3), torch.tensor([1, 2]), 2)


@pytest.fixture
def fake_vllm(monkeypatch):
    module = types.ModuleType(vllm_patch.TARGET_MODULE)
    module.expand_batch_to_tokens = original = object()
    monkeypatch.setitem(sys.modules, vllm_patch.TARGET_MODULE, module)
    return module, original


def test_register_patches_only_when_the_adapter_asked(fake_vllm, monkeypatch):
    module, original = fake_vllm
    monkeypatch.delenv(vllm_patch.ENV_FLAG, raising=False)
    vllm_patch.register()
    assert module.expand_batch_to_tokens is original and not vllm_patch.is_applied()
    monkeypatch.setenv(vllm_patch.ENV_FLAG, "1")
    vllm_patch.register()
    assert vllm_patch.is_applied()


def test_apply_names_the_function_it_replaced(fake_vllm):
    description = vllm_patch.apply()
    assert "vllm.v1.sample.rejection_sampler.expand_batch_to_tokens" in description
    assert vllm_patch.is_applied()
