"""Config validation and refusals at engine construction: ValueError naming the field."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, EngineConfig, ModelConfig, SpeculativeConfig
from tests.fixtures.engine_helpers import TINY_MODEL


@pytest.mark.parametrize(
    "field, value",
    [
        ("num_speculative_tokens", -1),
        ("draft_loops", 0),
        ("dtype", "float16"),
        ("dtype", "fp32"),
        ("mode", "pipeline"),
        ("model", "gpt2"),
        ("block_size", 0),
        ("max_num_seqs", 0),
        ("seed", -3),
        ("num_kv_blocks", 1.5),
        ("device", "gpu0"),
        ("device", ""),
        ("sampling_backend", "cuda"),
        ("draft_override", "oracle"),
        ("draft_noise_scale", -0.5),
        ("draft_noise_scale", float("nan")),
        ("draft_noise_scale", True),
        ("draft_temperature_factor", 0.0),
        ("draft_temperature_factor", "2"),
    ],
)
def test_bad_engine_config_names_field(field, value):
    with pytest.raises(ValueError, match=field):
        EngineConfig(**{field: value})


def test_unknown_option_is_an_error():
    with pytest.raises(TypeError):
        EngineConfig(num_speculative_token=3)


@pytest.mark.parametrize(
    "field, value", [("hidden_size", 33), ("num_loops", 0), ("eos_token_id", 64), ("vocab_size", True)]
)
def test_bad_model_config_names_field(field, value):
    options = dict(vocab_size=64, hidden_size=32, num_heads=2)
    options[field] = value
    with pytest.raises(ValueError, match=field):
        ModelConfig(**options)


def test_speculative_config_view():
    config = EngineConfig(num_speculative_tokens=5, draft_loops=1)
    assert config.speculative == SpeculativeConfig(5, 1)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        SpeculativeConfig(-2, 1)


@pytest.mark.parametrize("draft_loops", [3, 4])
def test_draft_loops_must_be_below_loops(draft_loops):
    with pytest.raises(ValueError, match="draft_loops"):
        Engine(EngineConfig(model_config=TINY_MODEL, mode="sync", draft_loops=draft_loops))


def test_draft_loops_is_irrelevant_for_nospec():
    Engine(EngineConfig(model_config=TINY_MODEL, mode="nospec", draft_loops=3)).close()


def test_enforce_eager_must_be_a_bool():
    with pytest.raises(ValueError, match="enforce_eager='yes'"):
        EngineConfig(mode="async", enforce_eager="yes")


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal without a GPU")
def test_cuda_device_without_a_gpu_is_refused():
    with pytest.raises(ValueError, match="device='cuda' is invalid: no CUDA device"):
        EngineConfig(device="cuda")


def test_rounds_in_flight_is_one_or_two_and_async_only():
    with pytest.raises(ValueError, match="rounds_in_flight=3"):
        EngineConfig(mode="async", rounds_in_flight=3)
    with pytest.raises(ValueError, match="rounds_in_flight=1 .*mode='async' only"):
        EngineConfig(mode="sync", rounds_in_flight=1)
    assert EngineConfig(mode="async", rounds_in_flight=1).rounds_in_flight == 1


def test_batch_budget_must_cover_one_round():
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        EngineConfig(num_speculative_tokens=4, max_num_batched_tokens=4)


def test_draft_override_is_speculative_only_and_own_by_default():
    assert EngineConfig().draft_override == "own"
    assert EngineConfig(mode="sync", draft_override="noisy", draft_noise_scale=0.0).draft_noise_scale == 0.0
    with pytest.raises(ValueError, match="draft_override='adversarial'.*mode='nospec'"):
        EngineConfig(mode="nospec", draft_override="adversarial")
