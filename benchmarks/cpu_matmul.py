"""Time the CPU projection of a served step: x[M, in] @ W[out, in]^T for a few rows M, as
`x @ W.T` (torch's default, what `F.linear` does) against `(W @ x.T).T` (engine.models.llama.project).

    python -m benchmarks.cpu_matmul [--threads 2] [--repeats 5]

The weights are MATRICES matrices of SmolLM2's MLP shape (1,536 x 576 fp32, 3.5 MB each, 212 MB
in all), swept in turn so that every product reads its matrix from DRAM, as a forward pass over
the model's 540 MB does. Prints one markdown row per M: the median milliseconds of one sweep per
form, the bytes of weights streamed per second, and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import timeit

import torch

from engine.models.llama import project

MATRICES = 60
SHAPE = (1536, 576)  # SmolLM2-135M: intermediate x hidden
ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 16, 20, 64)


def _median_ms(call, repeats: int) -> float:
    call()  # warm-up: first-touch allocation, BLAS initialisation
    return 1e3 * statistics.median(timeit.repeat(call, number=1, repeat=repeats))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    weights = [torch.randn(SHAPE, generator=generator) for _ in range(MATRICES)]
    rows = torch.randn(max(ROWS), SHAPE[1], generator=generator)
    gigabytes = MATRICES * SHAPE[0] * SHAPE[1] * 4 / 1e9
    print(f"torch {torch.__version__}, {args.threads} thread(s), {MATRICES} matrices of {SHAPE[0]} x {SHAPE[1]} fp32")
    print("| M | x @ W.T (ms) | GB/s | project (ms) | GB/s | ratio |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in ROWS:
        x = rows[:m]
        default = _median_ms(lambda x=x: [x @ w.T for w in weights], args.repeats)
        ours = _median_ms(lambda x=x: [project(x, w) for w in weights], args.repeats)
        print(
            f"| {m} | {default:.1f} | {gigabytes / default * 1e3:.1f} | {ours:.1f} | "
            f"{gigabytes / ours * 1e3:.1f} | {default / ours:.2f} |"
        )


if __name__ == "__main__":
    main()
