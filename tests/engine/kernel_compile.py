"""Compile the batched_probabilities kernels to a Hopper (sm_90) cubin on a machine without a
GPU, as a CUDA device would at its first launch, and print one line per kernel compiled.

Run by test_kernels_compile.py in a process without TRITON_INTERPRET (under the
interpreter `triton.jit` gives interpreted functions, which cannot be compiled). The Triton
interpreter runs a kernel's Python, not Triton's compiler, so a kernel that passes every CPU
test can still fail to compile (a constexpr reassigned in an unrolled loop, a type the code
generator rejects); this catches those without a GPU. Only the compilation is checked.

Usage: python tests/engine/kernel_compile.py
"""

from __future__ import annotations

import dataclasses

from engine.sampling.kernels.cross_compile import compile_cubin, device_launches
from engine.sampling.kernels.probabilities import DEFAULT_CONFIG

# (rows, vocabulary): a Qwen-size vocabulary over many chunks, and one chunk (KEEP_ALL)
SHAPES = ((8, 152064), (4, 200))


def main() -> None:
    """Every kernel of both paths at each shape, as a Hopper device launches them (programmatic
    dependent launch on)."""
    config = dataclasses.replace(DEFAULT_CONFIG, overlap_launches=True)
    for num_rows, vocab in SHAPES:
        for launch in device_launches(config, num_rows, vocab).values():
            assert compile_cubin(launch.kernel, launch.constexprs, launch.num_warps, vocab, launch.options), (
                f"{launch.kernel.__name__}: no cubin"
            )
            print(f"compiled {launch.kernel.__name__} V={vocab}", flush=True)


if __name__ == "__main__":
    main()
