"""Compile the batched_probabilities kernels to a Hopper (sm_90) cubin on a machine without a
GPU, as a CUDA device would at its first launch, and print one line per kernel compiled.

Run by test_engine_kernels_compile.py in a process without TRITON_INTERPRET (under the
interpreter `triton.jit` gives interpreted functions, which cannot be compiled). The Triton
interpreter runs a kernel's Python, not Triton's compiler, so a kernel that passes every CPU
test can still fail to compile (a constexpr reassigned in an unrolled loop, a type the code
generator rejects); this catches those without a GPU. Only the compilation is checked.

Usage: python tests/engine/kernel_compile.py
"""

from __future__ import annotations

import inspect

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.sampling import probabilities_kernel as kernels

HOPPER = GPUTarget("cuda", 90, 32)
# Triton's type of every runtime argument of the four kernels: float32 logits, int64 top-k (the
# dtypes the engine passes); integer arguments as int32, as Triton specialises them.
ARG_TYPES = {
    "logits_ptr": "*fp32", "temperature_ptr": "*fp32", "top_k_ptr": "*i64", "top_p_ptr": "*fp32",
    "out_ptr": "*fp32", "chunk_f32_ptr": "*fp32", "chunk_i32_ptr": "*i32", "cand_ptr": "*i64",
    "compact_ptr": "*i64", "row_f32_ptr": "*fp32", "row_mode_ptr": "*i64", "ticket_ptr": "*i32",
    "split_i32_ptr": "*i32", "split_f32_ptr": "*fp32", "row_val_ptr": "*fp32",
    "row_idx_ptr": "*i32", "V": "i32", "NUM_CHUNKS": "i32", "pivot_sigmas": "fp32",
    "wide_sigmas": "fp32", "wide_k": "i32"}
# (rows, vocabulary): a Qwen-size vocabulary over many chunks, and one chunk (KEEP_ALL)
SHAPES = ((8, 152064), (4, 200))


def compile_kernel(kernel, constexprs, num_warps: int) -> None:
    names = list(inspect.signature(kernel.fn).parameters)
    values = dict(constexprs)
    signature = {name: "constexpr" if name in values else ARG_TYPES[name] for name in names}
    source = ASTSource(kernel, signature,
                       constexprs={(names.index(name),): value for name, value in values.items()})
    compiled = triton.compile(source, target=HOPPER, options={"num_warps": num_warps})
    assert compiled.asm.get("cubin"), f"{kernel.__name__}: no cubin"


def main() -> None:
    config = kernels.DEFAULT_CONFIG
    for num_rows, vocab in SHAPES:
        plan = kernels.launch_plan(config, num_rows, vocab)
        for kernel, constexprs, warps in (
                (kernels._chunk_kernel, plan.chunk_constexprs, config.chunk_warps),
                (kernels._select_kernel, plan.select_constexprs, config.select_warps),
                (kernels._write_kernel, plan.write_constexprs, kernels.NUM_WARPS),
                (kernels._single_kernel, plan.single_constexprs, config.single_warps)):
            compile_kernel(kernel, constexprs, warps)
            print(f"compiled {kernel.__name__} V={vocab}", flush=True)


if __name__ == "__main__":
    main()
