"""The launch plan of the probabilities kernels and the layout of a call's buffers: the
`LaunchPlan` type (grids, constexprs, scratch shapes of a shape), `BUFFERS` (the order its
launches take a call's tensors) and their dtypes. It sits below both of its users: `plan`, which
builds the plans and launches them, and `warmup` (engine/sampling/kernels/warmup.py), which
compiles a plan's kernels ahead from its launches and the buffers' dtypes (it imports the type
for its annotations only), so that `warmup` needs nothing of `plan`, which imports it. Nothing
here launches or allocates.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from engine.sampling.kernels.launcher import KernelLaunch
from engine.sampling.kernels.probabilities.config import NUM_SPLIT_PIVOTS, KernelConfig

# A call's buffers in the order `LaunchPlan.arguments` takes them: the caller's four inputs,
# the output, then the scratch of `plan._make_scratch` (float32, int32 and int64 views in turn).
BUFFERS = (
    "logits",
    "temperature",
    "top_k",
    "top_p",
    "out",
    "chunk_f32",
    "row_f32",
    "row_val",
    "split_f32",
    "chunk_i32",
    "row_idx",
    "split_i32",
    "ticket",
    "chunk_list",
    "cand",
    "compact",
    "row_mode",
)

# The dtype of each of BUFFERS after the caller's four inputs and the output: the float32, int32
# and int64 views of the scratch (`LaunchPlan.f32_shapes`, `i32_shapes`, `i64_shapes`).
SCRATCH_DTYPES = (torch.float32,) * 4 + (torch.int32,) * 5 + (torch.int64,) * 3


@dataclass(frozen=True, eq=False)  # one object per shape (launch_plan): identity is equality
class LaunchPlan:
    """Everything about a call that depends only on (config, B, V): grids, scratch shapes and
    the three kernels' constexprs. Computed once per shape (`plan.launch_plan`), so an eager call
    does no such arithmetic."""

    num_rows: int
    vocab: int
    chunk: int  # vocabulary entries per chunk program
    capacity: int  # candidate slots per chunk
    num_chunks: int
    num_write: int  # write programs per row
    pivot_sigmas: float  # z of the quick floor
    wide_sigmas: float  # z of the quick floor of rows with k > wide_k
    wide_k: int
    config: KernelConfig
    chunk_constexprs: tuple[tuple[str, int], ...]  # (name, value), signature order
    select_constexprs: tuple[tuple[str, int], ...]
    write_constexprs: tuple[tuple[str, int], ...]
    single: bool  # one launch of `_single_kernel` (B * V <= config.single_launch_entries)
    single_constexprs: tuple[tuple[str, int], ...]
    launches: tuple[KernelLaunch, ...]  # the single launch, or the chunk, select and write ones
    # the write kernel takes programmatic dependent launch in eager calls alone
    # (`KernelConfig.overlap_write`): a call on a stream being captured launches it serially
    serial_in_capture: bool

    def arguments(self, buffers: tuple) -> tuple[tuple, ...]:
        """Each launch's runtime arguments. `buffers` = (logits, temperature, top_k, top_p,
        out, *scratch), named as in BUFFERS: the tensors, or their data pointers
        (`CompiledLaunches.launch`). A kernel parameter `<name>_ptr` gets buffer `<name>`."""
        (
            logits,
            temperature,
            top_k,
            top_p,
            out,
            chunk_f32,
            row_f32,
            row_val,
            split_f32,
            chunk_i32,
            row_idx,
            split_i32,
            ticket,
            chunk_list,
            cand,
            compact,
            row_mode,
        ) = buffers
        vocab, num_chunks = self.vocab, self.num_chunks
        if self.single:
            return (
                (
                    logits,
                    temperature,
                    top_k,
                    top_p,
                    out,
                    chunk_f32,
                    chunk_i32,
                    cand,
                    compact,
                    row_f32,
                    row_mode,
                    ticket,
                    chunk_list,
                    row_val,
                    row_idx,
                    vocab,
                    num_chunks,
                    self.pivot_sigmas,
                    self.wide_sigmas,
                    self.wide_k,
                ),
            )
        return (
            (
                logits,
                temperature,
                top_k,
                top_p,
                out,
                chunk_f32,
                chunk_i32,
                cand,
                vocab,
                num_chunks,
                self.pivot_sigmas,
                self.wide_sigmas,
                self.wide_k,
            ),
            (
                temperature,
                top_k,
                top_p,
                out,
                chunk_f32,
                chunk_i32,
                cand,
                compact,
                row_f32,
                row_mode,
                ticket,
                chunk_list,
                vocab,
                num_chunks,
            ),
            (
                logits,
                temperature,
                top_k,
                top_p,
                out,
                row_f32,
                row_mode,
                split_i32,
                split_f32,
                compact,
                ticket,
                row_val,
                row_idx,
                vocab,
            ),
        )

    def buffer_dtypes(self, logits_dtype: torch.dtype, top_k_dtype: torch.dtype) -> tuple[torch.dtype, ...]:
        """The dtype of each of BUFFERS in a call with these caller dtypes: temperature, top_p
        and the output are float32, the scratch SCRATCH_DTYPES (what `warmup` compiles for)."""
        return (logits_dtype, torch.float32, top_k_dtype, torch.float32, torch.float32, *SCRATCH_DTYPES)

    @property
    def f32_shapes(self):  # chunk stats, row stats, whole-row values, split masses
        return (
            (4, self.num_rows * self.num_chunks),
            (3, self.num_rows),
            (self.num_rows, self.config.candidate_capacity),
            self.split_shape,
        )

    @property
    def i32_shapes(self):  # chunk argmax / count, whole-row indices, split counts, tickets,
        # each row's chunks that reach its floor (the select kernel's list)
        return (
            (2, self.num_rows * self.num_chunks),
            (self.num_rows, self.config.candidate_capacity),
            self.split_shape,
            (self.num_rows,),
            (self.num_rows, triton.next_power_of_2(self.num_chunks)),
        )

    @property
    def i64_shapes(self):  # chunk candidates, per-row compact buffer, row modes
        return (
            (self.num_rows * self.num_chunks, self.capacity),
            (self.num_rows, self.config.compact),
            (self.num_rows,),
        )

    @property
    def split_shape(self):
        return (self.num_rows, self.num_write, NUM_SPLIT_PIVOTS.value)
