"""Logit match of the engine's Llama model against transformers' GGUF loader, same SmolLM2 file.

Prints, per prompt, max |ours - transformers| over all positions and vocabulary entries, the
largest |logit| (the scale) and their ratio, for our fp32 and bf16 weights against transformers'
fp32. Needs the real-model packages plus `transformers` and `accelerate`.

    .venv/bin/python benchmarks/logit_match.py
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:  # run as a file: benchmarks/engine.py would shadow the `engine` package
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

from engine.models.gguf import load_llama, smollm2_path  # noqa: E402
from engine.models.llama import LlamaModel  # noqa: E402
from engine.tokenizer_gguf import GGUFTokenizer  # noqa: E402

PROMPTS = (
    "The capital of France is Paris, and the capital of Germany is",
    "Question: Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?\nAnswer:",
    "def fibonacci(n):\n    if n < 2:\n        return n\n    return",
)


def main() -> None:
    torch.set_num_threads(1)
    path = smollm2_path()
    from transformers import AutoModelForCausalLM

    reference = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    config, weights = load_llama(path)
    models = {"fp32": LlamaModel(config, weights), "bf16": LlamaModel(config, weights.to(torch.bfloat16))}
    tokenizer = GGUFTokenizer.from_gguf(path)
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "What is 17 + 25?"}])
    print("| prompt | tokens | dtype | max abs diff | max abs logit | relative | argmax agreement |")
    print("|---|---|---|---|---|---|---|")
    for index, text in enumerate((*PROMPTS, chat)):
        ids = torch.tensor(tokenizer.encode(text))
        with torch.no_grad():
            expected = reference(ids[None]).logits[0].float()
            for name, model in models.items():
                actual = model.forward(ids)
                diff, scale = float((actual - expected).abs().max()), float(expected.abs().max())
                agree = float((actual.argmax(-1) == expected.argmax(-1)).float().mean())
                print(
                    f"| {index} | {len(ids)} | {name} | {diff:.2e} | {scale:.1f} | {diff / scale:.1e} | {agree:.3f} |"
                )


if __name__ == "__main__":
    main()
