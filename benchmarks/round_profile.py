"""Where a decode round spends device time: kernels of greedy vs random async rounds (CUDA).

    python -m benchmarks.round_profile [--concurrency 64] [--max-tokens 48] [--top 15]

Runs eager async rounds (enforce_eager, so each kernel is its own launch) under torch.profiler
and prints, per sampling mode, the device time per round of the kernels that cost most (summed
over the measured call, divided by the mean rounds per request). The graphs replay the same
kernels, so the difference between the two columns is what random sampling adds to a round.
"""

from __future__ import annotations

import argparse
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.engine import PROMPT, params_for
from engine import LLM, EngineConfig


def kernel_times(llm: LLM, sampling: str, count: int, max_tokens: int) -> tuple[dict, float]:
    """{kernel name: device microseconds per round}, rounds per request."""
    llm.generate([PROMPT] * count, params_for(sampling, count, max_tokens))  # warm-up, compiles
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        outputs = llm.generate([PROMPT] * count, params_for(sampling, count, max_tokens))
        torch.cuda.synchronize()
    rounds = sum(o.num_rounds for o in outputs) / count
    totals: dict[str, float] = defaultdict(float)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            totals[event.name[:60]] += event.device_time / rounds
    return totals, rounds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    llm = LLM(EngineConfig(mode="async", device="cuda", enforce_eager=True))
    greedy, g_rounds = kernel_times(llm, "greedy", args.concurrency, args.max_tokens)
    random, r_rounds = kernel_times(llm, "random", args.concurrency, args.max_tokens)
    print(f"concurrency={args.concurrency} rounds/request greedy={g_rounds:.2f} random={r_rounds:.2f}")
    print("| kernel | greedy us/round | random us/round | difference |")
    print("| --- | ---: | ---: | ---: |")
    names = sorted(set(greedy) | set(random), key=lambda n: -max(greedy.get(n, 0), random.get(n, 0)))
    for name in names[: args.top]:
        g, r = greedy.get(name, 0.0), random.get(name, 0.0)
        print(f"| {name} | {g:.1f} | {r:.1f} | {r - g:+.1f} |")
    print(
        f"| total | {sum(greedy.values()):.1f} | {sum(random.values()):.1f} | "
        f"{sum(random.values()) - sum(greedy.values()):+.1f} |"
    )


if __name__ == "__main__":
    main()
