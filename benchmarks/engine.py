"""Engine throughput: nospec vs sync vs async speculation, greedy vs random, several concurrencies.

    python benchmarks/engine.py [--concurrency 1 64 5000] [--max-tokens 16] [--threads 2]
                                [--device cpu] [--draft-loops 2] [-k 3]
                                [--modes nospec sync async] [--async-variants eager graphs]

Every request of a run is submitted at once (one prompt, one seed per request) and the wall time
of `LLM.generate` is measured after a warm-up call of the same length (on CUDA it captures the
graphs the measured call uses); tokens/s counts generated tokens only (prefill included in the
time). TPOT = wall time / mean generated tokens per request (all requests start together).
Peak memory = torch.cuda.max_memory_allocated during the measured call (CUDA only). Async runs
once per variant: "eager" (enforce_eager) and "graphs" (CUDA Graphs; CUDA only). Prints a
markdown table with the per-draft acceptance rate.
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
    warmup = min(count, 8)
    llm.generate([PROMPT] * warmup, params_for(sampling, warmup, max_tokens))
    is_cuda = llm.engine.device.type == "cuda"
    if is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    outputs = llm.generate([PROMPT] * count, params_for(sampling, count, max_tokens))
    seconds = time.perf_counter() - start
    tokens = sum(len(o.token_ids) for o in outputs)
    drafts = sum(o.num_draft_tokens for o in outputs)
    accepted = sum(o.num_accepted_tokens for o in outputs)
    return {"tokens": tokens, "seconds": seconds, "tok_s": tokens / seconds,
            "tpot_ms": 1000 * seconds * count / tokens,
            "peak_mib": torch.cuda.max_memory_allocated() / 2**20 if is_cuda else None,
            "acceptance": accepted / drafts if drafts else None,
            "tokens_per_round": tokens / sum(o.num_rounds for o in outputs)}


def variants(modes: list[str], async_variants: list[str], device: str) -> list[tuple[str, str]]:
    """(mode, variant) pairs; graphs only where CUDA Graphs can be captured."""
    pairs = []
    for mode in modes:
        if mode != "async":
            pairs.append((mode, "eager"))
            continue
        pairs += [(mode, v) for v in async_variants if v == "eager" or device.startswith("cuda")]
    return pairs


def graphs_status(llm: LLM, variant: str) -> str:
    graphs = getattr(llm.engine.runner, "graphs", None)
    if variant != "graphs" or graphs is None:
        return ""
    return graphs.disabled_reason or f"captured {len(graphs._rounds)} shapes"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 5000])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--draft-loops", type=int, default=2)
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["nospec", "sync", "async"],
                        choices=["nospec", "sync", "async"])
    parser.add_argument("--async-variants", nargs="+", default=["eager", "graphs"],
                        choices=["eager", "graphs"])
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"device={args.device} torch={torch.__version__} threads={torch.get_num_threads()} "
          f"cpu={platform.processor() or platform.machine()} max_tokens={args.max_tokens} "
          f"K={args.num_speculative_tokens} draft_loops={args.draft_loops} "
          f"prompt_tokens={len(PROMPT.encode())}")
    print("| mode | variant | sampling | concurrency | tokens | seconds | tokens/s | TPOT ms | "
          "peak MiB | acceptance | tokens/round |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, variant in variants(args.modes, args.async_variants, args.device):
        llm = LLM(EngineConfig(mode=mode, device=args.device, draft_loops=args.draft_loops,
                               num_speculative_tokens=args.num_speculative_tokens,
                               enforce_eager=variant == "eager"))
        for sampling in ("greedy", "random"):
            for count in args.concurrency:
                r = measure(llm, sampling, count, args.max_tokens)
                acceptance = "-" if r["acceptance"] is None else f"{r['acceptance']:.3f}"
                peak = "-" if r["peak_mib"] is None else f"{r['peak_mib']:.0f}"
                print(f"| {mode} | {variant} | {sampling} | {count} | {r['tokens']} | "
                      f"{r['seconds']:.3f} | {r['tok_s']:.0f} | {r['tpot_ms']:.2f} | {peak} | "
                      f"{acceptance} | {r['tokens_per_round']:.2f} |", flush=True)
        status = graphs_status(llm, variant)
        if status:
            print(f"<!-- {mode} {variant}: {status} -->", flush=True)
        llm.close()

if __name__ == "__main__":
    main()
