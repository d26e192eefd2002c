"""Engine throughput: nospec vs sync speculation, greedy vs random, at several concurrencies.

    python benchmarks/engine.py [--concurrency 1 64 5000] [--max-tokens 16] [--threads 2]
                                [--device cpu] [--draft-loops 2] [-k 3]

Every request of a run is submitted at once (one prompt, one seed per request) and the wall time
of `LLM.generate` is measured after one warm-up call; tokens/s counts generated tokens only
(prefill included in the time). Prints a markdown table with the per-draft acceptance rate.
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

if not __package__:  # run as a file: this file's folder would shadow the `engine` package
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

from engine import LLM, EngineConfig, SamplingParams  # noqa: E402

PROMPT = "Return a new list containing all items from the iterable in ascending order."


def params_for(sampling: str, count: int, max_tokens: int) -> list[SamplingParams]:
    if sampling == "greedy":
        return [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)] * count
    return [SamplingParams(temperature=1.0, top_k=20, seed=i, max_tokens=max_tokens,
                           ignore_eos=True) for i in range(count)]


def measure(llm: LLM, sampling: str, count: int, max_tokens: int) -> dict:
    llm.generate([PROMPT] * 2, params_for(sampling, 2, 2))  # warm-up
    if llm.engine.device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    outputs = llm.generate([PROMPT] * count, params_for(sampling, count, max_tokens))
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    drafts = sum(o.num_draft_tokens for o in outputs)
    accepted = sum(o.num_accepted_tokens for o in outputs)
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "acceptance": accepted / drafts if drafts else None,
            "tokens_per_round": tokens / sum(o.num_rounds for o in outputs)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 5000])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--draft-loops", type=int, default=2)
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"device={args.device} torch={torch.__version__} threads={torch.get_num_threads()} "
          f"cpu={platform.processor() or platform.machine()} max_tokens={args.max_tokens} "
          f"K={args.num_speculative_tokens} draft_loops={args.draft_loops} "
          f"prompt_tokens={len(PROMPT.encode())}")
    print("| mode | sampling | concurrency | tokens | seconds | tokens/s | acceptance | tokens/round |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode in ("nospec", "sync"):
        llm = LLM(EngineConfig(mode=mode, device=args.device, draft_loops=args.draft_loops,
                               num_speculative_tokens=args.num_speculative_tokens))
        for sampling in ("greedy", "random"):
            for count in args.concurrency:
                r = measure(llm, sampling, count, args.max_tokens)
                acceptance = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
                print(f"| {mode} | {sampling} | {count} | {r['tokens']} | {r['seconds']:.2f} | "
                      f"{r['tok_s']:.0f} | {acceptance} | {r['tokens_per_round']:.2f} |", flush=True)
        llm.close()


if __name__ == "__main__":
    main()
