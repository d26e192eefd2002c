"""Launch of the probabilities kernels: the `LaunchPlan` of a shape (grids, constexprs,
scratch shapes; cached), the scratch, and `run_probabilities` / `probabilities_triton`, which
enqueue the plan's launches without a host read (docs/sampling.md; host costs:
docs/notes/performance-notebook.md, "Host enqueue below Triton's runner"). The plan's type and
the layout of a call's buffers are `layout`'s, which `warmup` shares.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import triton

from engine.sampling.backend import compiles_natively
from engine.sampling.kernels.launch_overlap import overlap_options, supports_overlap
from engine.sampling.kernels.launcher import CompiledLaunches, KernelLaunch, current_stream
from engine.sampling.kernels.probabilities.chunk import _chunk_kernel
from engine.sampling.kernels.probabilities.config import (
    DEFAULT_CONFIG,
    MIN_KEEP_ALL_CHUNK,
    NUM_WARPS,
    SCRATCH_ALIGN,
    SPLIT_SUB,
    KernelConfig,
    wide_k_limit,
)
from engine.sampling.kernels.probabilities.layout import LaunchPlan
from engine.sampling.kernels.probabilities.select import _select_kernel
from engine.sampling.kernels.probabilities.single_launch import _single_kernel
from engine.sampling.kernels.probabilities.write import _write_kernel
from engine.sampling.kernels.warmup import WARMUPS
from engine.sampling.scratch import Scratch, ScratchCache


@dataclass(frozen=True)
class KernelOutput:
    """Result of `run_probabilities`: the probabilities and the path each row took."""

    probs: torch.Tensor  # [B, V] float32
    row_mode: torch.Tensor  # [B] int64, a RowMode per row (device tensor, never read here)


def _scratch(dtype, device, *shapes) -> tuple[torch.Tensor, ...]:
    """Views of one uninitialised allocation, one per shape, each SCRATCH_ALIGN-aligned."""
    sizes = [math.prod(shape) for shape in shapes]
    padded = [-(-size // SCRATCH_ALIGN) * SCRATCH_ALIGN for size in sizes]
    parts = torch.empty(sum(padded), dtype=dtype, device=device).split(padded)
    return tuple(part[:size].view(shape) for part, size, shape in zip(parts, sizes, shapes))


def register_cap(config: KernelConfig) -> tuple[tuple[str, int], ...]:
    """Compile options of the write kernel's register cap (none if `write_registers` is 0)."""
    return (("maxnreg", config.write_registers),) if config.write_registers else ()


@functools.lru_cache(maxsize=256)
def launch_plan(
    config: KernelConfig, num_rows: int, vocab: int, overlap: bool = False, native: bool = False
) -> LaunchPlan:
    """The `LaunchPlan` of a [num_rows, vocab] call (cached). It depends on the shape alone (and
    on `overlap`, a property of the device: `supports_overlap`), so a call captured in a CUDA
    Graph runs the kernels its eager warm-up compiled and ran (a kernel compiled during a
    capture invalidates it), and replays give the eager result. With `overlap` the select and
    write kernels take programmatic dependent launch where `config.overlap_launches` asks for
    it, the write kernel alone where `config.overlap_write` does (in eager calls:
    `serial_in_capture`); results do not depend on it. `native` (the kernels are compiled for
    a CUDA device, not run by the interpreter) admits their inline PTX
    (`KernelConfig.ftz_sum`)."""
    chunk, capacity = config.chunk_size(vocab), config.chunk_capacity
    keep_all = vocab <= chunk and triton.next_power_of_2(vocab) <= config.compact
    if keep_all:  # one chunk is the whole row: a slot per entry, every token a candidate
        chunk = capacity = max(triton.next_power_of_2(vocab), MIN_KEEP_ALL_CHUNK)
    num_chunks = triton.cdiv(vocab, chunk)
    num_write = triton.cdiv(vocab, config.write_chunk)
    select_pdl = overlap and config.overlap_launches
    write_pdl = overlap and (config.overlap_launches or config.overlap_write)
    work_constexprs = (("CHUNK", chunk), ("CAPACITY", capacity), ("KEEP_ALL", keep_all))
    work_options = (
        ("HOIST", config.hoist_loads),
        ("FTZ_SUM", config.ftz_sum and native),
        ("EVICTION", "evict_last" if config.keep_in_l2 else ""),
    )
    chunk_constexprs = (
        *work_constexprs,
        *work_options,
        ("RECIPROCAL", config.reciprocal_division),
        ("PDL", select_pdl),
    )
    chunks_pad = triton.next_power_of_2(num_chunks)
    sub = min(SPLIT_SUB, config.write_chunk)  # divides the write chunk
    select_tile = max(config.select_block // capacity, 1)  # chunks per compaction step
    single = num_rows * vocab <= config.single_launch_entries
    select_constexprs = (
        ("CHUNKS_PAD", chunks_pad),
        ("CAPACITY", capacity),
        ("TILE", select_tile),
        ("COMPACT", config.compact),
        ("SMALL", config.small_compact),
        ("TINY", config.tiny_compact),
        ("LISTED", config.chunk_list),
        ("FLOOR_STEPS", config.top_k_floor_steps),
        ("PDL", select_pdl),
    )
    write_constexprs = (
        ("CHUNK", config.write_chunk),
        ("SUB", sub),
        ("WRITE_PAD", triton.next_power_of_2(num_write)),
        ("COMPACT", config.compact),
        ("BLOCK", config.block),
        ("ROW_CAPACITY", config.candidate_capacity),
        ("SMALL", config.small_compact),
        ("REVERSE", config.reverse_write),
        ("PDL", write_pdl),
    )
    single_constexprs = (
        *work_constexprs,
        ("CHUNKS_PAD", chunks_pad),
        ("SELECT_TILE", select_tile),
        ("COMPACT", config.compact),
        ("SUB", sub),
        ("BLOCK", config.block),
        ("ROW_CAPACITY", config.candidate_capacity),
        ("SMALL", config.small_compact),
        ("TINY", config.tiny_compact),
        ("LISTED", config.chunk_list),
        *work_options,
    )
    if single:
        launches = (KernelLaunch(_single_kernel, (num_rows, num_chunks, 1), single_constexprs, config.single_warps),)
    else:
        launches = (
            KernelLaunch(_chunk_kernel, (num_rows, num_chunks, 1), chunk_constexprs, config.chunk_warps),
            KernelLaunch(
                _select_kernel, (num_rows, 1, 1), select_constexprs, config.select_warps, overlap_options(select_pdl)
            ),
            KernelLaunch(
                _write_kernel,
                (num_rows, num_write, 1),
                write_constexprs,
                NUM_WARPS,
                overlap_options(write_pdl) + register_cap(config),
            ),
        )
    return LaunchPlan(
        num_rows=num_rows,
        vocab=vocab,
        chunk=chunk,
        capacity=capacity,
        num_chunks=num_chunks,
        num_write=num_write,
        pivot_sigmas=config.pivot_sigmas(chunk),
        wide_sigmas=config.pivot_sigmas(chunk, config.wide_share),
        wide_k=wide_k_limit(num_chunks, capacity),
        config=config,
        chunk_constexprs=chunk_constexprs,
        select_constexprs=select_constexprs,
        write_constexprs=write_constexprs,
        single=single,
        single_constexprs=single_constexprs,
        launches=launches,
        serial_in_capture=write_pdl and not select_pdl and not single,
    )


@functools.lru_cache(maxsize=256)
def device_plan(config: KernelConfig, num_rows: int, vocab: int, device: torch.device) -> LaunchPlan:
    """`launch_plan` of a call on `device`, with the device's overlap support and whether
    Triton compiles for it read once per (config, shape, device): an eager call pays one cache
    lookup. Triton itself fixes whether it interprets when the kernels are defined."""
    return launch_plan(config, num_rows, vocab, supports_overlap(device), compiles_natively(device))


def _make_scratch(plan: LaunchPlan, device) -> tuple[torch.Tensor, ...]:
    """The scratch of one call: three allocations (one per dtype), 12 views. The single
    launch's tickets start at zero (each call leaves them at zero again)."""
    scratch = (
        *_scratch(torch.float32, device, *plan.f32_shapes),
        *_scratch(torch.int32, device, *plan.i32_shapes),
        *_scratch(torch.int64, device, *plan.i64_shapes),
    )
    if plan.single:
        scratch[7].zero_()  # the tickets
    return scratch


# Scratch reused by eager calls of the same shape on the same stream (see ScratchCache).
SCRATCH = ScratchCache()
# The compiled kernels of every specialisation launched so far (see CompiledLaunches).
LAUNCHES = CompiledLaunches()


def specialisation_key(plan: LaunchPlan, logits, top_k, pointers: tuple[int, ...]) -> tuple:
    """The group key of a call's launches (`CompiledLaunches`): the plan (the shape and
    configuration, so V, the number of chunks and wide_k, whose values Triton specialises on,
    and every grid and constexpr), the device, and what Triton specialises on in the caller's
    tensors: the dtypes of logits and top_k and the 16-byte alignment of the four `pointers`
    (logits, temperature, top_k, top_p). The other tensors are allocated here (aligned, fixed
    dtypes); float arguments are not specialised."""
    logits_at, temperature_at, top_k_at, top_p_at = pointers
    return (
        plan,
        logits.device,
        logits.dtype,
        top_k.dtype,
        logits_at % 16 == 0,
        temperature_at % 16 == 0,
        top_k_at % 16 == 0,
        top_p_at % 16 == 0,
    )


def _launch(logits, temperature, top_k, top_p, plan: LaunchPlan, out, scratch: Scratch, stream: int | None) -> None:
    """Enqueue the call's kernels on `stream` (no host read, no allocation). A plan whose write
    kernel overlaps only eagerly launches it serially while the current stream is captured
    (one query of the CUDA runtime); results do not depend on how it is launched."""
    if WARMUPS:  # its kernels may still be compiling in the background (`warm_up`)
        WARMUPS.wait(plan, logits.dtype, top_k.dtype)
    inputs = (logits.data_ptr(), temperature.data_ptr(), top_k.data_ptr(), top_p.data_ptr())
    serial = plan.serial_in_capture and torch.cuda.is_current_stream_capturing()
    LAUNCHES.launch(
        specialisation_key(plan, logits, top_k, inputs),
        plan.launches,
        plan.arguments,
        (logits, temperature, top_k, top_p, out, *scratch.tensors),
        (*inputs, out.data_ptr(), *scratch.pointers),
        stream,
        serial,
    )


def warm_up(
    vocab: int,
    row_counts,
    device: torch.device,
    logits_dtype: torch.dtype = torch.float32,
    top_k_dtype: torch.dtype = torch.int64,
    config: KernelConfig = DEFAULT_CONFIG,
) -> int:
    """Compile in the background (`warmup.Warmups`) the kernels that calls of [rows, vocab]
    take, for each rows of `row_counts`; the number of kernels started, 0 off CUDA or under the
    interpreter. Row counts whose plans share their kernels (every count above the single
    launch's bound) compile them once."""
    if not compiles_natively(device):
        return 0
    return sum(
        WARMUPS.start_plan(device_plan(config, int(rows), vocab, device), logits_dtype, top_k_dtype, device)
        for rows in row_counts
    )


def run_probabilities(logits, temperature, top_k, top_p, config: KernelConfig = DEFAULT_CONFIG) -> KernelOutput:
    """Launch the kernels on fresh scratch; arguments were validated by the caller
    (`batched_probabilities`). The row modes are returned, so they are not shared."""
    plan = device_plan(config, *logits.shape, logits.device)
    out = torch.empty_like(logits, dtype=torch.float32)  # contiguous: logits are (checked)
    scratch = Scratch.of(_make_scratch(plan, logits.device))
    if plan.num_rows > 0:
        _launch(logits, temperature, top_k, top_p, plan, out, scratch, current_stream(logits.device))
    return KernelOutput(out, scratch.tensors[-1])


def probabilities_triton(logits, temperature, top_k, top_p, *, config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """float32[B, V] probabilities of every row: the launches of `run_probabilities`, with the
    scratch (row modes included) reused from the last call of this shape (`SCRATCH`); only the
    output is allocated per call."""
    device = logits.device
    plan = device_plan(config, *logits.shape, device)
    out = torch.empty_like(logits, dtype=torch.float32)  # contiguous: logits are (checked)
    if plan.num_rows > 0:
        stream = current_stream(device)
        scratch = SCRATCH.get(plan, device, lambda: _make_scratch(plan, device), stream)
        _launch(logits, temperature, top_k, top_p, plan, out, scratch, stream)
    return out
