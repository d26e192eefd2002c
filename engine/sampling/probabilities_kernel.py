"""Triton backend of `batched_probabilities`: sort-free, every row split over many programs.

Three launches, no host read between them (S = number of chunks of CHUNK vocabulary entries):

1. `_chunk_kernel`, one program per (row, chunk), the chunk held in registers: x = logits / T,
   the chunk's max, sum exp(x - max) and (greedy rows) first argmax. For rows with top-k or
   top-p it also keeps candidates: a 5-step binary search over 32 pivot levels (the chunk max,
   then max - spread * 2**((j - LEVEL_ZERO) / 4), spread = max - mean) finds the lowest level
   whose count fits CAPACITY slots, and EVERY x >= that level (the chunk's floor) is stored with
   its vocabulary index.
2. `_select_kernel`, one program per row: row max m and Z from the chunk statistics. For
   truncating rows, F = the largest chunk floor; every token of the row with x >= F is among
   the stored candidates. If at least k of them have x >= F (top-k), or their mass is >= p * Z
   (top-p only), every kept token has x >= F, and an exact radix search over an
   order-preserving 32-bit key of the candidates, in registers, finds the threshold (keep iff
   key >= key_lo) and the normaliser. Otherwise the row is marked for the whole-row fallback.
3. `_write_kernel`, one program per (row, chunk): greedy rows write the one-hot row; rows
   without truncation exp(x - m) / Z (one more read of the logits); truncating rows zero the
   chunk and scatter its kept candidates (no read of the logits); fallback rows run
   `probabilities_row_kernel.write_row` in the program of chunk 0.

A truncating row therefore costs one read of the logits, one write of the output and the
candidates (a few percent of the row). The decisions are exact on float32 x, as in the
whole-row kernel; only sums differ from the reference by float32 rounding.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.sampling.probabilities_row_kernel import scaled_logits, write_row


class RowMode(enum.IntEnum):
    """How `_write_kernel` writes a row (`KernelOutput.row_mode`)."""

    GREEDY = 0  # temperature 0: one-hot argmax
    DENSE = 1  # no truncation: softmax over the row
    SPARSE = 2  # truncated, threshold found on the chunk candidates
    FALLBACK = 3  # truncated, candidates insufficient: whole-row kernel


_GREEDY = tl.constexpr(int(RowMode.GREEDY))
_DENSE = tl.constexpr(int(RowMode.DENSE))
_SPARSE = tl.constexpr(int(RowMode.SPARSE))
_FALLBACK = tl.constexpr(int(RowMode.FALLBACK))
NUM_LEVELS_LOG2 = tl.constexpr(5)  # 32 pivot levels per chunk
LEVEL_ZERO = tl.constexpr(25)  # level 1 drops spread / 64 below the max, level 31 2.8 spreads
FLT_MAX = tl.constexpr(3.4028234663852886e38)
KEY_MIN = tl.constexpr(-(2**31))  # below the key of every float32 (signed int32 keys)
NUM_WARPS = 8  # write kernel (fewer make its whole-row fallback spill registers)
# planes of the packed scratch tensors
CHUNK_MAX, CHUNK_SUM, CHUNK_FLOOR = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
CHUNK_ARGMAX, CHUNK_COUNT = tl.constexpr(0), tl.constexpr(1)
ROW_MAX, ROW_NORM = tl.constexpr(0), tl.constexpr(1)
ROW_MODE, ROW_KEY, ROW_ARGMAX = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


@dataclass(frozen=True)
class KernelConfig:
    """Tuning of the kernel. Every field is a power of two; results do not depend on it except
    through which rows take the (equally exact) whole-row fallback."""

    chunk: int = 4096  # vocabulary entries per program (doubled for vocabularies > 256K)
    chunk_capacity: int = 128  # candidate slots per chunk
    max_candidates: int = 8192  # select kernel's register block: padded chunks * capacity
    chunk_warps: int = 8  # warps per program of the chunk kernel
    select_warps: int = 8  # warps per program of the select kernel
    block: int = 2048  # vocabulary step of the whole-row fallback
    candidate_capacity: int = 2048  # scratch slots per row of the whole-row fallback

    def __post_init__(self):
        for name in ("chunk", "chunk_capacity", "max_candidates", "chunk_warps", "select_warps",
                     "block", "candidate_capacity"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"KernelConfig.{name}={value!r} must be a power of two")
        if not self.chunk_capacity <= min(self.chunk, self.max_candidates):
            raise ValueError(f"KernelConfig.chunk_capacity={self.chunk_capacity} must be <= "
                             f"chunk ({self.chunk}) and max_candidates ({self.max_candidates})")

    def chunk_size(self, vocab: int) -> int:
        """The smallest chunk >= `self.chunk` whose candidates fit `max_candidates`."""
        chunk = self.chunk
        while triton.next_power_of_2(triton.cdiv(vocab, chunk)) * self.chunk_capacity \
                > self.max_candidates:
            chunk *= 2
        return chunk


DEFAULT_CONFIG = KernelConfig()


@dataclass(frozen=True)
class KernelOutput:
    """Result of `run_probabilities`: the probabilities and the path each row took."""

    probs: torch.Tensor  # [B, V] float32
    row_mode: torch.Tensor  # [B] int64, a RowMode per row (device tensor, never read here)


@triton.jit
def _key(x):
    """Signed int32 image of float32 x whose order is the order of x (-0.0 is folded to 0)."""
    bits = x.to(tl.int32, bitcast=True)
    return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)


@triton.jit
def _pivot(m, spread, level):
    """Level 0 is m; level j >= 1 is m - spread * 2**((j - LEVEL_ZERO) / 4). Nonincreasing in
    j and never below -FLT_MAX, so a -inf logit is never a candidate."""
    drop = spread * tl.exp2((level - LEVEL_ZERO).to(tl.float32) * 0.25)
    return tl.maximum(tl.where(level == 0, m, m - drop), -FLT_MAX)


@triton.jit
def _count_at_least(x, pivot):
    return tl.sum((x >= pivot).to(tl.int32), 0)


@triton.jit
def _chunk_floor(x, m, CAPACITY: tl.constexpr):
    """The lowest pivot level whose count fits CAPACITY (+inf if even the max ties do not)."""
    finite = x > float("-inf")
    num_finite = tl.sum(finite.to(tl.int32), 0)
    mean = tl.sum(tl.where(finite, x, 0.0), 0) / tl.maximum(num_finite, 1).to(tl.float32)
    spread = tl.where(num_finite > 0, m - mean, 0.0)
    level = tl.zeros([1], tl.int32).sum(0)
    fits = _count_at_least(x, _pivot(m, spread, level)) <= CAPACITY
    for bit in tl.static_range(NUM_LEVELS_LOG2 - 1, -1, -1):
        trial = level + (1 << bit)
        fits_trial = _count_at_least(x, _pivot(m, spread, trial)) <= CAPACITY
        level = tl.where(fits_trial, trial, level)
    floor = _pivot(m, spread, level)
    return tl.where(fits & (floor == floor), floor, float("inf"))  # NaN (inf logits): none


@triton.jit
def _keep_candidates(x, offs, m, val_ptr, idx_ptr, floor_ptr, count_ptr,
                     CAPACITY: tl.constexpr):
    """Store every x >= the chunk floor (value, vocabulary index), then the floor and count."""
    floor = _chunk_floor(x, m, CAPACITY)
    take = x >= floor
    num_taken = tl.sum(take.to(tl.int32), 0)
    complete = num_taken <= CAPACITY  # holds by construction; never overflow the slots
    pos = tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(val_ptr + pos, x, mask=take & (pos < CAPACITY))
    tl.store(idx_ptr + pos, offs, mask=take & (pos < CAPACITY))
    tl.store(floor_ptr, tl.where(complete, floor, float("inf")))
    tl.store(count_ptr, tl.where(complete, num_taken, 0))


@triton.jit
def _chunk_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    chunk_f32_ptr,  # [3, B * S] float32: max, sum exp(x - max), candidate floor
    chunk_i32_ptr,  # [2, B * S] int32: first argmax (greedy rows), candidate count
    cand_val_ptr,  # [B * S, CAPACITY] float32: candidate x
    cand_idx_ptr,  # [B * S, CAPACITY] int32: candidate vocabulary index
    V,
    NUM_CHUNKS,
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    num_slots = tl.num_programs(0).to(tl.int64) * NUM_CHUNKS
    slot = row * NUM_CHUNKS + chunk
    t = tl.load(temperature_ptr + row)
    is_greedy = t == 0.0
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    x = scaled_logits(logits_ptr + row * V, offs, offs < V, tl.where(is_greedy, 1.0, t))
    m = tl.max(x, 0)
    tl.store(chunk_f32_ptr + CHUNK_MAX * num_slots + slot, m)
    if is_greedy:
        arg = chunk * CHUNK + tl.argmax(x, 0, tie_break_left=True)
        tl.store(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + slot, arg)
    else:
        z = tl.sum(tl.where(x > float("-inf"), tl.exp(x - m), 0.0), 0)
        tl.store(chunk_f32_ptr + CHUNK_SUM * num_slots + slot, z)
        k = tl.load(top_k_ptr + row)
        if ((k > 0) & (k < V)) | (tl.load(top_p_ptr + row) < 1.0):
            _keep_candidates(x, offs, m, cand_val_ptr + slot * CAPACITY,
                             cand_idx_ptr + slot * CAPACITY,
                             chunk_f32_ptr + CHUNK_FLOOR * num_slots + slot,
                             chunk_i32_ptr + CHUNK_COUNT * num_slots + slot, CAPACITY)


@triton.jit
def _kth_key(key, valid, k):
    """Largest t with #(valid and key >= t) >= k: the key of the k-th largest valid x.

    Int32 bisection, most significant bit first; the first step (bit 31) tries 0, the others
    add 2**bit, so no trial overflows int32."""
    ans = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
    ans = tl.where(tl.sum((valid & (key >= 0)).to(tl.int32), 0) >= k, 0, ans)
    for bit in tl.static_range(30, -1, -1):
        trial = ans + (1 << bit)
        ans = tl.where(tl.sum((valid & (key >= trial)).to(tl.int32), 0) >= k, trial, ans)
    return ans


@triton.jit
def _top_p_key(key, mass, target):
    """Smallest key kept by top-p: keep iff the mass with a strictly larger key is < target.

    `mass` is exp(x - m) on the survivors of top-k and 0 elsewhere; above(t) = mass with
    key > t is nonincreasing, so the bisection (as in `_kth_key`) finds T = max t with
    above(t) >= target, and T < the largest key since above(largest) = 0 < target.
    """
    ans = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
    ans = tl.where(tl.sum(tl.where(key > 0, mass, 0.0), 0) >= target, 0, ans)
    for bit in tl.static_range(30, -1, -1):
        trial = ans + (1 << bit)
        ans = tl.where(tl.sum(tl.where(key > trial, mass, 0.0), 0) >= target, trial, ans)
    return ans + 1


@triton.jit
def _select(chunk_f32_ptr, chunk_i32_ptr, cand_val_ptr, num_slots, row, NUM_CHUNKS, m, z, k,
            p, use_k, use_p, CHUNKS_PAD: tl.constexpr, CAPACITY: tl.constexpr):
    """(mode, key_lo, norm) of a truncating row from its chunks' candidates."""
    chunks = tl.arange(0, CHUNKS_PAD)
    floors = tl.load(chunk_f32_ptr + CHUNK_FLOOR * num_slots + row * NUM_CHUNKS + chunks,
                     mask=chunks < NUM_CHUNKS, other=float("-inf"))
    floor = tl.max(floors, 0)
    i = tl.arange(0, CHUNKS_PAD * CAPACITY)  # candidate i: slot i % CAPACITY of chunk i // CAPACITY
    chunk = i // CAPACITY
    slot = row * NUM_CHUNKS + chunk
    live = chunk < NUM_CHUNKS
    count = tl.load(chunk_i32_ptr + CHUNK_COUNT * num_slots + slot, mask=live, other=0)
    stored = live & (i % CAPACITY < count)
    x = tl.load(cand_val_ptr + slot * CAPACITY + i % CAPACITY, mask=stored, other=float("-inf"))
    valid = stored & (x >= floor)  # exactly the row's tokens with x >= floor
    key = _key(x)
    e = tl.where(valid, tl.exp(x - m), 0.0)
    covered = tl.where(use_k, tl.sum(valid.to(tl.int32), 0) >= k, tl.sum(e, 0) >= p * z)
    key_k = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
    z_k = z
    if use_k:
        key_k = _kth_key(key, valid, k)
        z_k = tl.sum(tl.where(key >= key_k, e, 0.0), 0)
    key_lo = key_k
    if use_p:
        key_lo = tl.maximum(key_k, _top_p_key(key, tl.where(key >= key_k, e, 0.0), p * z_k))
    norm = tl.sum(tl.where(key >= key_lo, e, 0.0), 0)
    return tl.where(covered, _SPARSE, _FALLBACK), key_lo, norm


@triton.jit
def _select_kernel(
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    chunk_f32_ptr,  # [3, B * S] float32 (see _chunk_kernel)
    chunk_i32_ptr,  # [2, B * S] int32
    cand_val_ptr,  # [B * S, CAPACITY] float32
    row_f32_ptr,  # [2, B] float32 out: row max, normaliser
    row_i64_ptr,  # [3, B] int64 out: RowMode, key threshold, argmax (greedy rows)
    V,
    NUM_CHUNKS,
    CHUNKS_PAD: tl.constexpr,
    CAPACITY: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    num_rows = tl.num_programs(0).to(tl.int64)
    num_slots = num_rows * NUM_CHUNKS
    chunks = tl.arange(0, CHUNKS_PAD)
    live = chunks < NUM_CHUNKS
    chunk_max = tl.load(chunk_f32_ptr + CHUNK_MAX * num_slots + row * NUM_CHUNKS + chunks,
                        mask=live, other=float("-inf"))
    m = tl.max(chunk_max, 0)
    mode = tl.zeros([1], tl.int32).sum(0) + _GREEDY
    if tl.load(temperature_ptr + row) == 0.0:
        first = tl.min(tl.where(live & (chunk_max == m), chunks, NUM_CHUNKS - 1), 0)
        arg = tl.load(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + row * NUM_CHUNKS + first)
        tl.store(row_i64_ptr + ROW_ARGMAX * num_rows + row, arg.to(tl.int64))
    else:
        chunk_sum = tl.load(chunk_f32_ptr + CHUNK_SUM * num_slots + row * NUM_CHUNKS + chunks,
                            mask=live, other=0.0)
        z = tl.sum(tl.where(chunk_max > float("-inf"), chunk_sum * tl.exp(chunk_max - m), 0.0), 0)
        k = tl.load(top_k_ptr + row)
        p = tl.load(top_p_ptr + row)
        use_k = (k > 0) & (k < V)
        use_p = p < 1.0
        mode = tl.zeros([1], tl.int32).sum(0) + _DENSE
        key_lo = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
        norm = z
        if use_k | use_p:
            mode, key_lo, norm = _select(chunk_f32_ptr, chunk_i32_ptr, cand_val_ptr, num_slots,
                                         row, NUM_CHUNKS, m, z, k, p, use_k, use_p, CHUNKS_PAD,
                                         CAPACITY)
        tl.store(row_f32_ptr + ROW_MAX * num_rows + row, m)
        tl.store(row_f32_ptr + ROW_NORM * num_rows + row, norm)
        tl.store(row_i64_ptr + ROW_KEY * num_rows + row, key_lo.to(tl.int64))
    tl.store(row_i64_ptr + ROW_MODE * num_rows + row, mode.to(tl.int64))


@triton.jit
def _scatter_chunk(out_row, offs, mask, slot, count_ptr, cand_val_ptr, cand_idx_ptr, m, key_lo,
                   norm, CAPACITY: tl.constexpr):
    """Zero the chunk of the output row, then write its kept candidates' probabilities."""
    tl.store(out_row + offs, tl.zeros_like(offs).to(tl.float32), mask=mask)
    tl.debug_barrier()  # the zeros land before the scatter (same addresses, other threads)
    cols = tl.arange(0, CAPACITY)
    stored = cols < tl.load(count_ptr + slot)
    x = tl.load(cand_val_ptr + slot * CAPACITY + cols, mask=stored, other=float("-inf"))
    idx = tl.load(cand_idx_ptr + slot * CAPACITY + cols, mask=stored, other=0)
    tl.store(out_row + idx, tl.exp(x - m) / norm, mask=stored & (_key(x) >= key_lo))


@triton.jit
def _write_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out
    chunk_i32_ptr,  # [2, B * S] int32 (see _chunk_kernel)
    cand_val_ptr,  # [B * S, CAPACITY] float32
    cand_idx_ptr,  # [B * S, CAPACITY] int32
    row_f32_ptr,  # [2, B] float32 (see _select_kernel)
    row_i64_ptr,  # [3, B] int64
    row_val_ptr,  # [B, ROW_CAPACITY] float32 scratch of the whole-row fallback
    row_idx_ptr,  # [B, ROW_CAPACITY] int32 scratch of the whole-row fallback
    V,
    NUM_CHUNKS,
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    num_rows = tl.num_programs(0).to(tl.int64)
    mode = tl.load(row_i64_ptr + ROW_MODE * num_rows + row)
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    out_row = out_ptr + row * V
    m = tl.load(row_f32_ptr + ROW_MAX * num_rows + row)
    norm = tl.load(row_f32_ptr + ROW_NORM * num_rows + row)
    if mode == _GREEDY:
        arg = tl.load(row_i64_ptr + ROW_ARGMAX * num_rows + row)
        tl.store(out_row + offs, tl.where(offs == arg, 1.0, 0.0), mask=mask)
    elif mode == _DENSE:
        x = scaled_logits(logits_ptr + row * V, offs, mask, tl.load(temperature_ptr + row))
        tl.store(out_row + offs, tl.exp(x - m) / norm, mask=mask)
    elif mode == _SPARSE:
        key_lo = tl.load(row_i64_ptr + ROW_KEY * num_rows + row).to(tl.int32)
        _scatter_chunk(out_row, offs, mask, row * NUM_CHUNKS + chunk,
                       chunk_i32_ptr + CHUNK_COUNT * num_rows * NUM_CHUNKS, cand_val_ptr,
                       cand_idx_ptr, m, key_lo, norm, CAPACITY)
    elif chunk == 0:
        write_row(logits_ptr + row * V, out_row, V, tl.load(temperature_ptr + row),
                  tl.load(top_k_ptr + row), tl.load(top_p_ptr + row),
                  row_val_ptr + row * ROW_CAPACITY, row_idx_ptr + row * ROW_CAPACITY, BLOCK,
                  ROW_CAPACITY)


def run_probabilities(logits, temperature, top_k, top_p,
                      config: KernelConfig = DEFAULT_CONFIG) -> KernelOutput:
    """Launch the three kernels; arguments were validated by `batched_probabilities`."""
    num_rows, vocab = logits.shape
    dev = logits.device
    chunk = config.chunk_size(vocab)
    num_chunks = triton.cdiv(vocab, chunk)
    num_slots = num_rows * num_chunks
    out = torch.empty((num_rows, vocab), dtype=torch.float32, device=dev)
    chunk_f32 = torch.empty((3, num_slots), dtype=torch.float32, device=dev)
    chunk_i32 = torch.empty((2, num_slots), dtype=torch.int32, device=dev)
    cand_val = torch.empty((num_slots, config.chunk_capacity), dtype=torch.float32, device=dev)
    cand_idx = torch.empty((num_slots, config.chunk_capacity), dtype=torch.int32, device=dev)
    row_f32 = torch.empty((2, num_rows), dtype=torch.float32, device=dev)
    row_i64 = torch.empty((3, num_rows), dtype=torch.int64, device=dev)
    row_val = torch.empty((num_rows, config.candidate_capacity), dtype=torch.float32, device=dev)
    row_idx = torch.empty((num_rows, config.candidate_capacity), dtype=torch.int32, device=dev)
    if num_rows > 0:
        grid = (num_rows, num_chunks)
        _chunk_kernel[grid](
            logits, temperature, top_k, top_p, chunk_f32, chunk_i32, cand_val, cand_idx, vocab,
            num_chunks, CHUNK=chunk, CAPACITY=config.chunk_capacity, num_warps=config.chunk_warps,
        )
        _select_kernel[(num_rows,)](
            temperature, top_k, top_p, chunk_f32, chunk_i32, cand_val, row_f32, row_i64, vocab,
            num_chunks, CHUNKS_PAD=triton.next_power_of_2(num_chunks),
            CAPACITY=config.chunk_capacity, num_warps=config.select_warps,
        )
        _write_kernel[grid](
            logits, temperature, top_k, top_p, out, chunk_i32, cand_val, cand_idx, row_f32,
            row_i64, row_val, row_idx, vocab, num_chunks, CHUNK=chunk,
            CAPACITY=config.chunk_capacity, BLOCK=config.block,
            ROW_CAPACITY=config.candidate_capacity, num_warps=NUM_WARPS,
        )
    return KernelOutput(out, row_i64[ROW_MODE.value])


def probabilities_triton(logits, temperature, top_k, top_p, *,
                         config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """float32[B, V] probabilities of every row (see `run_probabilities`)."""
    return run_probabilities(logits, temperature, top_k, top_p, config).probs
