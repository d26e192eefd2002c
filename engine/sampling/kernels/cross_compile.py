"""Compile the batched_probabilities kernels for a Hopper GPU (sm_90) on any machine, no GPU
needed: each kernel as a device would compile it at its first launch (float32 logits, int64
top-k, every pointer and V specialised as divisible by 16, as Triton specialises them there),
with the constexprs, warps and compile options `launch_plan` gives a Hopper device.

Used by the compile check (`tests/engine/kernel_compile.py`) and the SASS counts
(`benchmarks/sass_lines.py`). Needs Triton's NVIDIA backend (its ptxas), not a GPU; must run
without TRITON_INTERPRET (under the interpreter `triton.jit` gives interpreted functions).
"""

from __future__ import annotations

import dataclasses
import inspect

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from engine.sampling.kernels.probabilities.plan import launch_plan

HOPPER = GPUTarget("cuda", 90, 32)
VOCAB = 152064
DIVISIBLE = 16  # Triton's specialisation of pointers (16-byte aligned) and integers
# Triton's type of every runtime argument (the dtypes the engine passes)
ARG_TYPES = {
    "logits_ptr": "*fp32",
    "temperature_ptr": "*fp32",
    "top_k_ptr": "*i64",
    "top_p_ptr": "*fp32",
    "out_ptr": "*fp32",
    "chunk_f32_ptr": "*fp32",
    "chunk_i32_ptr": "*i32",
    "cand_ptr": "*i64",
    "compact_ptr": "*i64",
    "row_f32_ptr": "*fp32",
    "row_mode_ptr": "*i64",
    "ticket_ptr": "*i32",
    "chunk_list_ptr": "*i32",
    "split_i32_ptr": "*i32",
    "split_f32_ptr": "*fp32",
    "row_val_ptr": "*fp32",
    "row_idx_ptr": "*i32",
    "V": "i32",
    "NUM_CHUNKS": "i32",
    "pivot_sigmas": "fp32",
    "wide_sigmas": "fp32",
    "wide_k": "i32",
}


def compile_cubin(kernel, constexprs: tuple, num_warps: int, vocab: int = VOCAB, options: tuple = ()) -> bytes:
    """The sm_90 cubin of `kernel` with these constexprs and compile options, specialised as
    on a device for 16-byte aligned tensors and this vocabulary V."""
    names = list(inspect.signature(kernel.fn).parameters)
    values = dict(constexprs)
    signature = {name: "constexpr" if name in values else ARG_TYPES[name] for name in names}
    attrs = {
        (i,): [["tt.divisibility", DIVISIBLE]]
        for i, name in enumerate(names)
        if name not in values and (signature[name].startswith("*") or name == "V" and vocab % DIVISIBLE == 0)
    }
    source = ASTSource(
        kernel, signature, attrs=attrs, constexprs={(names.index(name),): value for name, value in values.items()}
    )
    return triton.compile(source, target=HOPPER, options={"num_warps": num_warps, **dict(options)}).asm["cubin"]


def device_launches(config, rows: int, vocab: int) -> dict:
    """The four kernels' launches (`KernelLaunch`) by name, as `launch_plan` builds them for
    this configuration on a Hopper device: the three launches, and the single launch (the
    configuration with every batch sent to it)."""
    three = dataclasses.replace(config, single_launch_entries=0)
    every_batch = dataclasses.replace(config, single_launch_entries=rows * vocab)
    chunk, select, write = launch_plan(three, rows, vocab, overlap=True, native=True).launches
    (single,) = launch_plan(every_batch, rows, vocab, overlap=True, native=True).launches
    return {"chunk": chunk, "select": select, "write": write, "single": single}
