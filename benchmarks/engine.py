"""Engine throughput: nospec vs sync vs async speculation, greedy vs random, several concurrencies.

    python -m benchmarks.engine [--concurrency 1 64 5000] [--max-tokens 16] [--threads 2]
                                [--device cpu] [--draft-loops 2] [-k 3] [--repeats 1]
                                [--modes nospec sync async]
                                [--async-variants eager graphs eager-serial graphs-serial]

Every request of a run is submitted at once (one prompt, one seed per request) and the wall time
of `LLM.generate` is measured after a warm-up call of the same length (on CUDA it captures the
graphs the measured call uses); tokens/s counts generated tokens only (prefill included in the
time). TPOT = wall time / mean generated tokens per request (all requests start together).
ms/round = wall time / mean rounds per request, and ms/step = wall time / engine steps: the cost
of one round. Within one engine, ms/step compares runs whose acceptance differs (random requests
drift apart, so a batch lasts as long as its slowest request: more steps than mean rounds); across
modes ms/round does (the asynchronous pipeline takes one more step to drain). Peak memory =
torch.cuda.max_memory_allocated during the measured call (CUDA only). Async runs once per variant:
"eager" (enforce_eager), "graphs" (CUDA Graphs; CUDA only), and their "-serial" forms with
rounds_in_flight=1: the same runner on the synchronous timeline, which isolates what the overlap
of rounds is worth (the sync runner itself has no CUDA Graphs).

With --repeats N every (sampling, concurrency) cell is measured N times, the engines taking turns
in ABBA order (A B C, C B A, A B C, ...) so that drift of the machine hits every engine alike;
the table shows medians, and the ratios below it are medians over the N paired repeats, with
their range.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

if not __package__:  # run as a file: this file's folder would shadow the `engine` package
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import torch  # noqa: E402

from engine import LLM, EngineConfig, SamplingParams  # noqa: E402

PROMPT = "Return a new list containing all items from the iterable in ascending order."
SAMPLINGS = ("greedy", "random")
# (numerator, denominator, meaning) pairs of (mode, variant, sampling) printed as ratios
RATIOS = (
    (("async", "graphs", "random"), ("async", "graphs", "greedy"), "random / greedy, async graphs"),
    (("async", "eager", "random"), ("async", "eager", "greedy"), "random / greedy, async eager"),
    (("async", "eager", "greedy"), ("sync", "eager", "greedy"), "async / sync eager, greedy"),
    (("async", "eager", "random"), ("sync", "eager", "random"), "async / sync eager, random"),
    (("async", "eager", "greedy"), ("async", "eager-serial", "greedy"), "async / serial, eager, greedy"),
    (("async", "eager", "random"), ("async", "eager-serial", "random"), "async / serial, eager, random"),
    (("async", "graphs", "greedy"), ("async", "graphs-serial", "greedy"), "async / serial, graphs, greedy"),
    (("async", "graphs", "random"), ("async", "graphs-serial", "random"), "async / serial, graphs, random"),
    (("async", "graphs", "greedy"), ("sync", "eager", "greedy"), "async graphs / sync eager, greedy"),
    (("async", "graphs", "random"), ("sync", "eager", "random"), "async graphs / sync eager, random"),
)
ASYNC_VARIANTS = {  # name -> (enforce_eager, rounds_in_flight)
    "eager": (True, 2),
    "graphs": (False, 2),
    "eager-serial": (True, 1),
    "graphs-serial": (False, 1),
}


@dataclass(frozen=True)
class Run:
    tokens: int
    seconds: float
    count: int  # requests
    steps: int  # engine steps of the measured call
    rounds: int  # summed over requests
    drafts: int
    accepted: int
    peak_mib: float | None

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds

    @property
    def round_seconds(self) -> float:
        """Wall time per round of one request (rounds averaged over the requests)."""
        return self.seconds * self.count / self.rounds


def params_for(sampling: str, count: int, max_tokens: int) -> list[SamplingParams]:
    if sampling == "greedy":
        return [SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)] * count
    return [
        SamplingParams(temperature=1.0, top_k=20, seed=i, max_tokens=max_tokens, ignore_eos=True) for i in range(count)
    ]


def measure(llm: LLM, sampling: str, count: int, max_tokens: int) -> Run:
    warmup = min(count, 8)
    llm.generate([PROMPT] * warmup, params_for(sampling, warmup, max_tokens))
    is_cuda = llm.engine.device.type == "cuda"
    if is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    engine, steps = llm.engine, [0]
    step = engine.step

    def counted():
        steps[0] += 1
        return step()

    engine.step = counted  # an instance attribute shadows the method for this call only
    try:
        start = time.perf_counter()
        outputs = llm.generate([PROMPT] * count, params_for(sampling, count, max_tokens))
        seconds = time.perf_counter() - start
    finally:
        del engine.step
    return Run(
        sum(len(o.token_ids) for o in outputs),
        seconds,
        count,
        steps[0],
        sum(o.num_rounds for o in outputs),
        sum(o.num_draft_tokens for o in outputs),
        sum(o.num_accepted_tokens for o in outputs),
        torch.cuda.max_memory_allocated() / 2**20 if is_cuda else None,
    )


def variants(modes: list[str], async_variants: list[str], device: str) -> list[tuple[str, str]]:
    """(mode, variant) pairs; graphs only where CUDA Graphs can be captured."""
    pairs = []
    for mode in modes:
        if mode != "async":
            pairs.append((mode, "eager"))
            continue
        pairs += [(mode, v) for v in async_variants if not v.startswith("graphs") or device.startswith("cuda")]
    return pairs


def graphs_status(llm: LLM, variant: str) -> str:
    graphs = getattr(llm.engine.runner, "graphs", None)
    if not variant.startswith("graphs") or graphs is None:
        return ""
    return graphs.disabled_reason or f"captured {len(graphs._rounds)} shapes"


def engine_config(mode: str, variant: str, args: argparse.Namespace) -> EngineConfig:
    eager, in_flight = ASYNC_VARIANTS[variant] if mode == "async" else (True, 2)
    return EngineConfig(
        mode=mode,
        device=args.device,
        draft_loops=args.draft_loops,
        num_speculative_tokens=args.num_speculative_tokens,
        enforce_eager=eager,
        rounds_in_flight=in_flight,
    )


def abba(count: int, repeats: int):
    """Engine order of each repeat: forwards, backwards, forwards, ..."""
    order = list(range(count))
    return [order if r % 2 == 0 else order[::-1] for r in range(repeats)]


def row(key: tuple[str, str, str], count: int, runs: list[Run]) -> str:
    mode, variant, sampling = key
    med = lambda values: statistics.median(values)  # noqa: E731
    seconds = med([r.seconds for r in runs])
    tok_s = [r.tok_s for r in runs]
    first = runs[0]
    acceptance = "-" if not first.drafts else f"{first.accepted / first.drafts:.3f}"
    peak = "-" if first.peak_mib is None else f"{max(r.peak_mib for r in runs):.0f}"
    spread = f"{min(tok_s):.0f}-{max(tok_s):.0f}" if len(runs) > 1 else "-"
    return (
        f"| {mode} | {variant} | {sampling} | {count} | {first.tokens} | {seconds:.3f} | "
        f"{med(tok_s):.0f} | {spread} | {1000 * seconds * count / first.tokens:.2f} | "
        f"{1000 * med([r.round_seconds for r in runs]):.2f} | "
        f"{1000 * med([r.seconds / r.steps for r in runs]):.2f} | {first.steps} | {peak} | {acceptance} | "
        f"{first.tokens / first.rounds:.2f} |"
    )


def _span(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} ({min(values):.3f}-{max(values):.3f})"


def ratio_lines(results: dict, concurrency: list[int]) -> list[str]:
    lines = []
    for top, bottom, meaning in RATIOS:
        for count in concurrency:
            a, b = results.get((*top, count)), results.get((*bottom, count))
            if not a or not b:
                continue
            tok = [x.tok_s / y.tok_s for x, y in zip(a, b)]
            per_round = [y.round_seconds / x.round_seconds for x, y in zip(a, b)]
            per_step = [(y.seconds / y.steps) / (x.seconds / x.steps) for x, y in zip(a, b)]
            lines.append(f"| {meaning} | {count} | {_span(tok)} | {_span(per_round)} | {_span(per_step)} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 5000])
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--draft-loops", type=int, default=2)
    parser.add_argument("-k", "--num-speculative-tokens", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=1, help="paired repeats per cell (ABBA)")
    parser.add_argument("--modes", nargs="+", default=["nospec", "sync", "async"], choices=["nospec", "sync", "async"])
    parser.add_argument("--async-variants", nargs="+", default=["eager", "graphs"], choices=list(ASYNC_VARIANTS))
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(
        f"device={args.device} torch={torch.__version__} threads={torch.get_num_threads()} "
        f"cpu={platform.processor() or platform.machine()} max_tokens={args.max_tokens} "
        f"K={args.num_speculative_tokens} draft_loops={args.draft_loops} repeats={args.repeats} "
        f"prompt_tokens={len(PROMPT.encode())}"
    )
    pairs = variants(args.modes, args.async_variants, args.device)
    engines = [LLM(engine_config(mode, variant, args)) for mode, variant in pairs]
    results: dict[tuple, list[Run]] = {}
    for sampling in SAMPLINGS:
        for count in args.concurrency:
            for order in abba(len(pairs), args.repeats):
                for index in order:
                    key = (*pairs[index], sampling, count)
                    results.setdefault(key, []).append(measure(engines[index], sampling, count, args.max_tokens))
    print(
        "| mode | variant | sampling | concurrency | tokens | seconds | tokens/s | tokens/s range | "
        "TPOT ms | ms/round | ms/step | steps | peak MiB | acceptance | tokens/round |"
    )
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for mode, variant in pairs:
        for sampling in SAMPLINGS:
            for count in args.concurrency:
                print(row((mode, variant, sampling), count, results[(mode, variant, sampling, count)]))
    lines = ratio_lines(results, args.concurrency)
    if lines:
        print("\n| ratio (median, range) | concurrency | tokens/s | speed per round | speed per step |")
        print("| --- | ---: | ---: | ---: | ---: |")
        print("\n".join(lines))
    for (mode, variant), llm in zip(pairs, engines):
        status = graphs_status(llm, variant)
        if status:
            print(f"<!-- {mode} {variant}: {status} -->")
        llm.close()


if __name__ == "__main__":
    main()
