"""Offline early-exit quality of SmolLM2-135M-Instruct: how good a draft is the readout after d layers?

For every position of real text (GSM8K test questions with their reference solutions, in the
model's chat format; the assistant's tokens are scored) and each draft depth d, with p the
full-depth (30-layer) distribution and q the readout after d layers, both under the same sampling
parameters (engine.sampling.reference.Sampler, the engine's contract):

* greedy agreement: fraction of positions with argmax q == argmax p;
* expected acceptance alpha = mean over positions of sum_x min(p(x), q(x)): the probability that
  one speculative step accepts its draft token when the draft is sampled from q;
* tokens per round for K drafts, (1 - alpha^(K+1)) / (1 - alpha): the expected tokens emitted per
  round if acceptances were independent with the mean rate (an approximation: they are not).

This measures the draft quality offline, on teacher-forced text. With --engine it also runs the
engine's sync speculative mode (K drafts per round) on GSM8K chat prompts, with the model's own
samples, and reports the measured per-draft acceptance rate accepted / drafted.

    .venv/bin/python benchmarks/early_exit.py --positions 400 [--engine]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

if not __package__:  # run as a file: benchmarks/engine.py would shadow the `engine` package
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

from engine.models.gguf import load_llama, smollm2_path  # noqa: E402
from engine.models.llama import LlamaDepthModel, LlamaModel  # noqa: E402
from engine.params import SamplingParams  # noqa: E402
from engine.sampling.reference import Sampler  # noqa: E402
from engine.tokenizer_gguf import GGUFTokenizer  # noqa: E402
from specval.tasks.gsm8k import load_gsm8k  # noqa: E402

DEPTHS = (4, 8, 12, 16, 20, 24)
LAYERS_PER_DEPTH = 2  # engine depth = 2 layers, so every draft depth above is a whole number of depths
SETTINGS = {
    "t0.7_p0.95": SamplingParams(temperature=0.7, top_p=0.95),
    "t1_k20": SamplingParams(temperature=1.0, top_k=20),
}
CALCULATOR_ANNOTATION = re.compile(r"<<[^>]*>>")


def texts(tokenizer: GGUFTokenizer, num_positions: int) -> list[tuple[torch.Tensor, int]]:
    """(token ids, index of the first assistant token) per GSM8K item until enough positions."""
    out, total = [], 0
    for item in load_gsm8k(limit=200):
        messages = [{"role": "user", "content": item.question}]
        prompt = tokenizer.apply_chat_template(messages)
        solution = CALCULATOR_ANNOTATION.sub("", item.solution) + "<|im_end|>"
        ids = tokenizer.encode(prompt + solution)
        start = len(tokenizer.encode(prompt))
        out.append((torch.tensor(ids), start))
        total += len(ids) - start
        if total >= num_positions:
            break
    return out


def measure(model: LlamaModel, samples: list[tuple[torch.Tensor, int]]) -> dict:
    sampler, depths = Sampler(), DEPTHS + (model.config.num_layers,)
    agree = dict.fromkeys(DEPTHS, 0)
    alpha = {name: dict.fromkeys(DEPTHS, 0.0) for name in SETTINGS}
    count = 0
    for ids, start in samples:
        with torch.no_grad():
            logits = model.early_exit(ids, depths)
        full = logits[-1]
        for pos in range(start - 1, ids.shape[0] - 1):  # logits at pos predict token pos + 1
            count += 1
            for name, params in SETTINGS.items():
                p = sampler.probabilities(full[pos], params)
                for d, shallow in zip(DEPTHS, logits):
                    alpha[name][d] += float(torch.minimum(p, sampler.probabilities(shallow[pos], params)).sum())
            for d, shallow in zip(DEPTHS, logits):
                agree[d] += int(shallow[pos].argmax() == full[pos].argmax())
    return {
        "positions": count,
        "greedy_agreement": {d: agree[d] / count for d in DEPTHS},
        "expected_acceptance": {n: {d: a / count for d, a in v.items()} for n, v in alpha.items()},
    }


def engine_acceptance(model: LlamaModel, tokenizer: GGUFTokenizer, num_prompts: int, max_tokens: int, k: int) -> dict:
    """Per-draft acceptance accepted / drafted through the engine, per setting and draft depth."""
    from engine import LLM, EngineConfig

    prompts = [
        tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": item.question}]))
        for item in load_gsm8k(limit=num_prompts)
    ]
    result = {}
    for name, params in SETTINGS.items():
        result[name] = {}
        for depth in DEPTHS:
            config = EngineConfig(
                mode="sync",
                draft_loops=depth // LAYERS_PER_DEPTH,
                num_speculative_tokens=k,
                num_kv_blocks=1024,
                block_size=16,
            )
            llm = LLM(config, model=LlamaDepthModel(model, LAYERS_PER_DEPTH))
            per_request = [replace(params, seed=1000 + i, max_tokens=max_tokens) for i in range(len(prompts))]
            outputs = llm.generate(prompts, per_request)
            llm.close()
            drafted = sum(o.num_draft_tokens for o in outputs)
            result[name][depth] = sum(o.num_accepted_tokens for o in outputs) / max(drafted, 1)
    return result


def tokens_per_round(alpha: float, k: int) -> float:
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def table(result: dict, k: int) -> str:
    names = list(SETTINGS)
    head = (
        ["draft layers", "greedy agreement"]
        + [f"alpha {n}" for n in names]
        + [f"tokens/round K={k} {n}" for n in names]
    )
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for d in DEPTHS:
        alphas = [result["expected_acceptance"][n][d] for n in names]
        cells = [str(d), f"{result['greedy_agreement'][d]:.3f}"] + [f"{a:.3f}" for a in alphas]
        cells += [f"{tokens_per_round(a, k):.2f}" for a in alphas]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=400, help="minimum scored positions")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per round for the tokens/round column")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="also write the raw numbers here")
    parser.add_argument("--engine", action="store_true", help="also measure acceptance through the engine")
    parser.add_argument("--prompts", type=int, default=8, help="GSM8K prompts for --engine")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per request for --engine")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    path = smollm2_path()
    model, tokenizer = LlamaModel(*load_llama(path)), GGUFTokenizer.from_gguf(path)
    started = time.perf_counter()
    result = measure(model, texts(tokenizer, args.positions))
    print(f"{result['positions']} positions, {time.perf_counter() - started:.0f} s, fp32, CPU")
    print(table(result, args.k))
    if args.engine:
        started = time.perf_counter()
        result["engine_acceptance"] = engine_acceptance(model, tokenizer, args.prompts, args.max_tokens, args.k)
        print(
            f"engine, sync, K={args.k}, {args.prompts} prompts x {args.max_tokens} tokens, "
            f"{time.perf_counter() - started:.0f} s: per-draft acceptance"
        )
        for name, by_depth in result["engine_acceptance"].items():
            print(name, " ".join(f"d{d}={a:.3f}" for d, a in by_depth.items()))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(result, out, indent=2)


if __name__ == "__main__":
    main()
