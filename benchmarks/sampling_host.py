"""Host cost of one eager batched_probabilities call on a CUDA device, step by step.

Prints, for B in {1, 8, 64, 256} at V = 152,064 (temperature 0.8, top-k 50, top-p 0.9):
- "call": host time per call to enqueue (median over REPEATS loops of CALLS calls, no
  synchronisation inside a loop, after a warm-up: the median keeps other processes' bursts on
  the host out);
- "validate": the argument checks alone (`probabilities._check_inputs`);
- one column per Triton kernel: the host time of its launch, timed by wrappers around the two
  methods a launch goes through (`KernelLaunch.through_jit` for the first call of a
  specialisation, `CompiledLaunch.enqueue` for every later one: the compiled kernel's
  launcher, pointers passed as integers);
- "other": the rest (allocation, Python between the steps).
Then the cost of one launch by itself: an empty Triton kernel with 1 and with 14 arguments,
launched through the JIT (`kernel[grid](...)`), through the compiled kernel's runner
(`compiled[grid](...)`, no binding or specialisation), through its launcher as the runner
calls it (`CudaLauncher.__call__`, without metadata or hooks, pointers as integers) and
through `CompiledLaunch.enqueue` (the C launch function below that), next to a torch
launch (`x.add_(1)`) and a torch.empty. Last, a cProfile of CALLS calls at B = 1 (functions by
own time).

Usage, from the repository root: python3 -m benchmarks.sampling_host [--out host.md]
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import io
import pstats
import statistics
import time

import torch
import triton
import triton.language as tl

from engine.sampling import batched_probabilities
from engine.sampling.kernels.launcher import CompiledLaunch, KernelLaunch, current_stream
from engine.sampling.probabilities import _check_inputs

BATCHES = (1, 8, 64, 256)
VOCAB = 152064
CALLS = 100
REPEATS = 7
WARMUP_CALLS = 20
PROFILE_LINES = 25


def inputs(batch: int, vocab: int = VOCAB):
    g = torch.Generator(device="cuda").manual_seed(batch)
    logits = torch.randn(batch, vocab, device="cuda", generator=g) * 4.0
    full = lambda value, dtype: torch.full((batch,), value, dtype=dtype, device="cuda")  # noqa
    return (logits, full(0.8, torch.float32), full(50, torch.int64), full(0.9, torch.float32))


def per_call_us(fn, calls: int = CALLS, repeats: int = REPEATS) -> float:
    """Host microseconds per call of fn(): the median over `repeats` timed loops of `calls`
    calls (no synchronisation inside a loop)."""
    for _ in range(WARMUP_CALLS):
        fn()
    loops = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter_ns()
        for _ in range(calls):
            fn()
        loops.append((time.perf_counter_ns() - start) / calls / 1e3)
    torch.cuda.synchronize()
    return statistics.median(loops)


class LaunchTimer:
    """Wraps the two ways a kernel launch of this engine goes (`KernelLaunch.through_jit`, the
    first call of a specialisation, and `CompiledLaunch.enqueue`, every later one): host
    nanoseconds spent in each kernel's launches, by kernel name."""

    METHODS = (
        (KernelLaunch, "through_jit", lambda launch: launch.kernel.fn.__name__),
        (CompiledLaunch, "enqueue", lambda launch: launch.compiled.name),
    )

    def __init__(self):
        self.ns = collections.Counter()
        self.originals = [(cls, name, getattr(cls, name), kernel_name) for cls, name, kernel_name in self.METHODS]

    def __enter__(self):
        ns = self.ns
        for cls, name, original, kernel_name in self.originals:

            def timed(obj, *args, _original=original, _kernel_name=kernel_name):
                start = time.perf_counter_ns()
                result = _original(obj, *args)
                ns[_kernel_name(obj)] += time.perf_counter_ns() - start
                return result

            setattr(cls, name, timed)
        return self

    def __exit__(self, *exc):
        for cls, name, original, _ in self.originals:
            setattr(cls, name, original)


def steps(batch: int) -> tuple[float, float, dict]:
    """(call us, validate us, {kernel: launch us}) per call at this batch size."""
    args = inputs(batch)
    call = per_call_us(lambda: batched_probabilities(*args, backend="triton"))
    validate = per_call_us(lambda: _check_inputs(*args))
    with LaunchTimer() as timer:  # mean over every call, warm-up included
        per_call_us(lambda: batched_probabilities(*args, backend="triton"))
    total_calls = CALLS * REPEATS + WARMUP_CALLS
    launches = {name: ns / total_calls / 1e3 for name, ns in timer.ns.items()}
    return call, validate, launches


@triton.jit
def _empty_1(x_ptr):
    pass


@triton.jit
def _empty_14(a, b, c, d, e, f, g, h, n1, n2, n3, C1: tl.constexpr, C2: tl.constexpr, C3: tl.constexpr):
    pass


def launch_costs() -> list[str]:
    """Host us per launch: empty Triton kernels (JIT and compiled runner), torch ops."""
    x = torch.zeros(16, device="cuda")
    ptrs = [torch.zeros(16, device="cuda") for _ in range(8)]

    def jit_1():
        return _empty_1[(1,)](x)

    def jit_14():
        return _empty_14[(1, 1)](*ptrs, 100, 200, 300, C1=4, C2=8, C3=16)

    rows = [
        ("Triton JIT launch, 1 argument", per_call_us(jit_1)),
        ("Triton JIT launch, 14 arguments (3 constexpr)", per_call_us(jit_14)),
    ]
    compiled_1, compiled_14 = _empty_1[(1,)](x), _empty_14[(1, 1)](*ptrs, 100, 200, 300, C1=4, C2=8, C3=16)
    runner = compiled_1[(1, 1, 1)]
    stream = current_stream(x.device)
    direct_1 = CompiledLaunch(compiled_1, (1, 1, 1), ())
    direct_14 = CompiledLaunch(compiled_14, (1, 1, 1), (4, 8, 16))
    pointers = (x.data_ptr(),)
    route = "launcher" if direct_1.target is compiled_1.run else "C launch function"
    pointers_14 = (*(t.data_ptr() for t in ptrs), 100, 200, 300)

    def launcher_1():
        return compiled_1.run(
            1, 1, 1, stream, compiled_1.function, compiled_1.packed_metadata, None, None, None, *pointers
        )

    rows += [
        ("compiled kernel runner, 1 argument", per_call_us(lambda: runner(x))),
        ("compiled kernel's launcher (CudaLauncher.__call__), 1 argument", per_call_us(launcher_1)),
        (f"CompiledLaunch.enqueue ({route}), 1 argument", per_call_us(lambda: direct_1.enqueue(stream, pointers))),
        (
            f"CompiledLaunch.enqueue ({route}), 14 arguments (3 constexpr)",
            per_call_us(lambda: direct_14.enqueue(stream, pointers_14)),
        ),
    ]
    rows += [
        ("torch x.add_(1)", per_call_us(lambda: x.add_(1))),
        ("torch.empty(16)", per_call_us(lambda: torch.empty(16, device="cuda"))),
    ]
    return [f"| {name} | {us:.1f} |" for name, us in rows]


def profile(batch: int = 1) -> str:
    args = inputs(batch)
    for _ in range(WARMUP_CALLS):
        batched_probabilities(*args, backend="triton")
    torch.cuda.synchronize()
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(CALLS):
        batched_probabilities(*args, backend="triton")
    prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(PROFILE_LINES)
    return text.getvalue()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="also write the tables to this file")
    args = parser.parse_args()
    lines = [
        f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}, "
        f"triton {triton.__version__}; host us per call (call, validate: median of "
        f"{REPEATS} loops of {CALLS}; launches: mean)",
        "",
    ]
    results = [(batch, *steps(batch)) for batch in BATCHES]
    kernels = sorted({name for *_, launches in results for name in launches})
    lines += [
        "| B | call | validate | " + " | ".join(kernels) + " | other |",
        "|---:|---:|---:|" + "---:|" * (len(kernels) + 1),
    ]
    for batch, call, validate, launches in results:
        other = call - validate - sum(launches.values())
        cells = " | ".join(f"{launches.get(name, 0.0):.1f}" for name in kernels)
        lines.append(f"| {batch} | {call:.1f} | {validate:.1f} | {cells} | {other:.1f} |")
    lines += [
        "",
        "| one launch | host us |",
        "|---|---:|",
        *launch_costs(),
        "",
        f"cProfile, {CALLS} calls at B = 1 (seconds):",
        "",
        profile(),
    ]
    text = "\n".join(lines)
    print(text, flush=True)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
