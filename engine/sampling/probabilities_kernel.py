"""Triton backend of `batched_probabilities`: sort-free, every row split over many programs.

Three launches, no host read between them (S = number of chunks of CHUNK vocabulary entries):

1. `_chunk_kernel`, one program per (row, chunk), the chunk held in registers (2,048 entries
   and 4 warps by default; one warp per 512 entries needs no barrier at all): x = logits / T, the chunk's
   max, sum exp(x - max) and (greedy rows) first argmax. Greedy and truncating rows zero their
   chunk of the output here. Truncating rows also keep candidates: a quick floor
   (mean + PIVOT_SIGMAS standard deviations of the finite x, aimed at CAPACITY / 4 tokens) is
   counted once; only if more than CAPACITY tokens reach it, a 6-step search over 32 pivot
   levels (max - spread * 2**((j - LEVEL_ZERO) / 4)) finds the lowest level that fits. EVERY
   x >= the chunk's floor is stored (x and vocabulary index packed in one int64). A
   vocabulary that fits one chunk (small models) is one chunk of next_power_of_2(V) entries
   with a slot for each: every finite x is stored, so such rows never need the fallback.
2. `_select_kernel`, one program per row: row max m and Z from the chunk statistics. Greedy
   rows write their 1.0 at the argmax. For truncating rows, F = the largest chunk floor; every
   token of the row with x >= F is among the stored candidates, and these are compacted into a
   per-row buffer of COMPACT slots. If they fit and at least k of them have x >= F (top-k), or
   their mass is >= p * Z (top-p only), every kept token is among them: a bisection over an
   order-preserving 32-bit key of x, in registers, finds the threshold (keep iff key >= key_lo)
   and the normaliser, and the kept probabilities are scattered into the zeroed row. Otherwise
   the row is marked for the whole-row fallback.
3. `_write_kernel`, one program per (row, write chunk): rows without truncation write
   exp(x - m) / Z (one more read of the logits); fallback rows run
   `probabilities_row_kernel.write_row` in the program of chunk 0; other rows are done.

Every output element is written by exactly one program of one launch (or rewritten whole by
the fallback in a later launch), so no program needs a barrier between its zeros and its
values. A truncating row costs one read of the logits, one write of the output and the
candidates (a few percent of the row). The decisions are exact on float32 x, as in the
whole-row kernel; only sums differ from the reference by float32 rounding.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from statistics import NormalDist

import torch
import triton
import triton.language as tl

from engine.sampling.probabilities_row_kernel import scaled_logits, write_row


class RowMode(enum.IntEnum):
    """How a row was written (`KernelOutput.row_mode`)."""

    GREEDY = 0  # temperature 0: one-hot argmax
    DENSE = 1  # no truncation: softmax over the row
    SPARSE = 2  # truncated, threshold found on the chunk candidates
    FALLBACK = 3  # truncated, candidates insufficient: whole-row kernel


_GREEDY = tl.constexpr(int(RowMode.GREEDY))
_DENSE = tl.constexpr(int(RowMode.DENSE))
_SPARSE = tl.constexpr(int(RowMode.SPARSE))
_FALLBACK = tl.constexpr(int(RowMode.FALLBACK))
NUM_LEVELS_LOG2 = tl.constexpr(5)  # 32 pivot levels per chunk (overflow search)
LEVEL_ZERO = tl.constexpr(25)  # level 1 drops spread / 64 below the max, level 31 2.8 spreads
FLT_MAX = tl.constexpr(3.4028234663852886e38)
KEY_MIN = tl.constexpr(-(2**31))  # below the key of every float32 (signed int32 keys)
QUICK_FLOOR_SHARE = 4  # the quick floor aims at CAPACITY / QUICK_FLOOR_SHARE tokens per chunk
NUM_WARPS = 8  # write kernel (fewer make its whole-row fallback spill registers)
MIN_KEEP_ALL_CHUNK = 16  # smallest chunk of a one-chunk row (tl.arange needs a power of two)
# planes of the packed scratch tensors
CHUNK_MAX, CHUNK_SUM, CHUNK_FLOOR = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
CHUNK_ARGMAX, CHUNK_COUNT = tl.constexpr(0), tl.constexpr(1)
ROW_MAX, ROW_NORM = tl.constexpr(0), tl.constexpr(1)


@dataclass(frozen=True)
class KernelConfig:
    """Tuning of the kernel. Every field is a power of two; results do not depend on it except
    through which rows take the (equally exact) whole-row fallback."""

    chunk: int = 2048  # vocabulary entries per program (doubled for very large vocabularies)
    chunk_capacity: int = 128  # candidate slots per chunk
    max_candidates: int = 16384  # candidate slots per row: padded chunks * capacity
    chunk_warps: int = 4  # warps per program of the chunk kernel
    compact: int = 4096  # select kernel's register block: a row's candidates with x >= F
    select_block: int = 2048  # candidate slots per step of the select kernel's compaction
    select_warps: int = 8  # warps per program of the select kernel
    write_chunk: int = 2048  # vocabulary entries per program of the write kernel
    block: int = 2048  # vocabulary step of the whole-row fallback
    candidate_capacity: int = 2048  # scratch slots per row of the whole-row fallback

    def __post_init__(self):
        for name in ("chunk", "chunk_capacity", "max_candidates", "chunk_warps", "compact",
                     "select_block", "select_warps", "write_chunk", "block",
                     "candidate_capacity"):
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

    def pivot_sigmas(self, chunk: int) -> float:
        """z of the quick floor mean + z * std: a normal chunk has CAPACITY / 4 tokens above."""
        share = self.chunk_capacity / (QUICK_FLOOR_SHARE * chunk)
        return NormalDist().inv_cdf(1.0 - share)


# The default: one-warp 512-entry chunk programs with 8,192-entry write programs. On the H200 its
# three kernels take 197 us of device time at B=256, V=152,064, top-k 50 + top-p 0.9 (2.7x the
# floor); KernelConfig() (the previous default) took 304 us. See docs/performance.md.
DEFAULT_CONFIG = KernelConfig(chunk=512, chunk_capacity=32, chunk_warps=1, write_chunk=8192)
# Configurations the benchmark sweeps and the GPU tests check (the default first).
CANDIDATE_CONFIGS = (
    DEFAULT_CONFIG,
    KernelConfig(chunk=512, chunk_capacity=32, chunk_warps=1, compact=2048, write_chunk=8192),
    KernelConfig(),
    KernelConfig(chunk=1024, chunk_capacity=64, chunk_warps=2, write_chunk=8192),
    KernelConfig(write_chunk=8192),
    KernelConfig(compact=2048),
)


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
def _pack(x, index):
    """int64 candidate: the bits of float32 x in the high word, the vocabulary index below."""
    return (x.to(tl.int32, bitcast=True).to(tl.int64) << 32) | index.to(tl.int64)


@triton.jit
def _unpack_x(packed):
    return (packed >> 32).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _unpack_index(packed):
    return packed.to(tl.int32)  # the low word


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
def _searched_floor(x, m, CAPACITY: tl.constexpr):
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
def _quick_floor(x, m, sigmas):
    """mean + sigmas * std of the finite x, clamped to [-FLT_MAX, m]; +inf if NaN.

    Moments are taken of d = m - x >= 0, which keeps the variance free of cancellation."""
    finite = x > float("-inf")
    n = tl.maximum(tl.sum(finite.to(tl.int32), 0), 1).to(tl.float32)
    d = tl.where(finite, m - x, 0.0)
    mean_d = tl.sum(d, 0) / n
    var_d = tl.maximum(tl.sum(d * d, 0) / n - mean_d * mean_d, 0.0)
    floor = tl.maximum(m - tl.maximum(mean_d - sigmas * tl.sqrt(var_d), 0.0), -FLT_MAX)
    return tl.where(floor == floor, floor, float("inf"))


@triton.jit
def _keep_candidates(x, offs, m, sigmas, cand_ptr, floor_ptr, count_ptr,
                     CAPACITY: tl.constexpr, KEEP_ALL: tl.constexpr):
    """Store every x >= the chunk floor (packed with its index), then the floor and count.
    KEEP_ALL (the chunk is the whole row and has a slot per entry): the floor is -FLT_MAX, so
    every finite x is a candidate and no top-k or top-p row needs the fallback, unless the
    chunk holds NaN or +inf (floor +inf: no candidates, the exact fallback decides)."""
    if KEEP_ALL:
        bad = tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 0) > 0
        floor = tl.where(bad, float("inf"), -FLT_MAX)
        num_taken = _count_at_least(x, floor)
    else:
        floor = _quick_floor(x, m, sigmas)
        num_taken = _count_at_least(x, floor)
        if num_taken > CAPACITY:  # a heavy upper tail: search the pivot levels
            floor = _searched_floor(x, m, CAPACITY)
            num_taken = _count_at_least(x, floor)
    take = x >= floor
    complete = num_taken <= CAPACITY  # holds by construction; never overflow the slots
    pos = tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(cand_ptr + pos, _pack(x, offs), mask=take & (pos < CAPACITY))
    tl.store(floor_ptr, tl.where(complete, floor, float("inf")))
    tl.store(count_ptr, tl.where(complete, num_taken, 0))


@triton.jit
def _chunk_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out: zeros in greedy and truncating rows
    chunk_f32_ptr,  # [3, B * S] float32: max, sum exp(x - max), candidate floor
    chunk_i32_ptr,  # [2, B * S] int32: first argmax (greedy rows), candidate count
    cand_ptr,  # [B * S, CAPACITY] int64: packed candidates (x, vocabulary index)
    V,
    NUM_CHUNKS,
    pivot_sigmas,  # float32: z of the quick floor
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
    KEEP_ALL: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    num_slots = tl.num_programs(0).to(tl.int64) * NUM_CHUNKS
    slot = row * NUM_CHUNKS + chunk
    t = tl.load(temperature_ptr + row)
    is_greedy = t == 0.0
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    x = scaled_logits(logits_ptr + row * V, offs, mask, tl.where(is_greedy, 1.0, t))
    m = tl.max(x, 0)
    tl.store(chunk_f32_ptr + CHUNK_MAX * num_slots + slot, m)
    zeros = tl.zeros([CHUNK], tl.float32)
    if is_greedy:
        arg = chunk * CHUNK + tl.argmax(x, 0, tie_break_left=True)
        tl.store(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + slot, arg)
        tl.store(out_ptr + row * V + offs, zeros, mask=mask)
    else:
        z = tl.sum(tl.where(x > float("-inf"), tl.exp(x - m), 0.0), 0)
        tl.store(chunk_f32_ptr + CHUNK_SUM * num_slots + slot, z)
        k = tl.load(top_k_ptr + row)
        if ((k > 0) & (k < V)) | (tl.load(top_p_ptr + row) < 1.0):
            tl.store(out_ptr + row * V + offs, zeros, mask=mask)
            _keep_candidates(x, offs, m, pivot_sigmas, cand_ptr + slot * CAPACITY,
                             chunk_f32_ptr + CHUNK_FLOOR * num_slots + slot,
                             chunk_i32_ptr + CHUNK_COUNT * num_slots + slot, CAPACITY, KEEP_ALL)


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
def _compact(cand_ptr, count_ptr, compact_ptr, NUM_CHUNKS, floor, CAPACITY: tl.constexpr,
             BLOCK: tl.constexpr, COMPACT: tl.constexpr):
    """Copy the row's stored candidates with x >= floor to compact_ptr[0:COMPACT] (any order);
    return how many there are (they fit iff the count is <= COMPACT).

    `cand_ptr` / `count_ptr` point to the row's first chunk: candidate slot i is slot
    i % CAPACITY of chunk i // CAPACITY, at cand_ptr + i."""
    num = tl.zeros([1], tl.int32).sum(0)
    for start in range(0, NUM_CHUNKS * CAPACITY, BLOCK):
        i = start + tl.arange(0, BLOCK)
        chunk = i // CAPACITY
        live = chunk < NUM_CHUNKS
        stored = live & (i % CAPACITY < tl.load(count_ptr + chunk, mask=live, other=0))
        packed = tl.load(cand_ptr + i, mask=stored, other=0)
        valid = stored & (_unpack_x(packed) >= floor)
        pos = num + tl.cumsum(valid.to(tl.int32), 0) - 1
        tl.store(compact_ptr + pos, packed, mask=valid & (pos < COMPACT))
        num += tl.sum(valid.to(tl.int32), 0)
    return num


@triton.jit
def _threshold(x, valid, m, z, k, p, use_k, use_p):
    """(key_lo, norm, covered) on the candidates x[valid], which hold every token x >= F.

    covered: every kept token is among them (>= k of them for top-k, else mass >= p * Z)."""
    key = _key(x)
    e = tl.where(valid, tl.exp(x - m), 0.0)
    covers_k = (tl.sum(valid.to(tl.int32), 0) >= k) & use_k
    covered = covers_k | ((tl.sum(e, 0) >= p * z) & (use_k == 0))
    key_k = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
    z_k = z
    if use_k:
        key_k = _kth_key(key, valid, k)
        z_k = tl.sum(tl.where(key >= key_k, e, 0.0), 0)
    key_lo = key_k
    if use_p:
        key_lo = tl.maximum(key_k, _top_p_key(key, tl.where(key >= key_k, e, 0.0), p * z_k))
    norm = tl.sum(tl.where(key >= key_lo, e, 0.0), 0)
    return key_lo, norm, covered


@triton.jit
def _select_sparse(chunk_f32_ptr, chunk_i32_ptr, cand_ptr, compact_ptr, out_row, num_slots,
                   first_slot, NUM_CHUNKS, m, z, k, p, use_k, use_p, CHUNKS_PAD: tl.constexpr,
                   CAPACITY: tl.constexpr, BLOCK: tl.constexpr, COMPACT: tl.constexpr):
    """RowMode and normaliser of a truncating row; SPARSE rows get their kept values here."""
    chunks = tl.arange(0, CHUNKS_PAD)
    floors = tl.load(chunk_f32_ptr + CHUNK_FLOOR * num_slots + first_slot + chunks,
                     mask=chunks < NUM_CHUNKS, other=float("-inf"))
    num = _compact(cand_ptr + first_slot * CAPACITY,
                   chunk_i32_ptr + CHUNK_COUNT * num_slots + first_slot, compact_ptr,
                   NUM_CHUNKS, tl.max(floors, 0), CAPACITY, BLOCK, COMPACT)
    tl.debug_barrier()  # the compacted candidates land before other threads read them
    i = tl.arange(0, COMPACT)
    valid = i < num
    packed = tl.load(compact_ptr + i, mask=valid, other=0)
    x = tl.where(valid, _unpack_x(packed), float("-inf"))
    key_lo, norm, covered = _threshold(x, valid, m, z, k, p, use_k, use_p)
    is_sparse = covered & (num <= COMPACT)
    if is_sparse:
        keep = valid & (_key(x) >= key_lo)
        tl.store(out_row + _unpack_index(packed), tl.exp(x - m) / norm, mask=keep)
    return tl.where(is_sparse, _SPARSE, _FALLBACK), norm


@triton.jit
def _select_kernel(
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out: 1.0 of greedy rows, kept values of SPARSE rows
    chunk_f32_ptr,  # [3, B * S] float32 (see _chunk_kernel)
    chunk_i32_ptr,  # [2, B * S] int32
    cand_ptr,  # [B * S, CAPACITY] int64
    compact_ptr,  # [B, COMPACT] int64 scratch
    row_f32_ptr,  # [2, B] float32 out: row max, normaliser
    row_mode_ptr,  # [B] int64 out: RowMode
    V,
    NUM_CHUNKS,
    CHUNKS_PAD: tl.constexpr,
    CAPACITY: tl.constexpr,
    BLOCK: tl.constexpr,
    COMPACT: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    num_rows = tl.num_programs(0).to(tl.int64)
    num_slots = num_rows * NUM_CHUNKS
    first_slot = row * NUM_CHUNKS
    chunks = tl.arange(0, CHUNKS_PAD)
    live = chunks < NUM_CHUNKS
    chunk_max = tl.load(chunk_f32_ptr + CHUNK_MAX * num_slots + first_slot + chunks,
                        mask=live, other=float("-inf"))
    m = tl.max(chunk_max, 0)
    mode = tl.zeros([1], tl.int32).sum(0) + _GREEDY
    if tl.load(temperature_ptr + row) == 0.0:
        first = tl.min(tl.where(live & (chunk_max == m), chunks, NUM_CHUNKS - 1), 0)
        arg = tl.load(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + first_slot + first)
        tl.store(out_ptr + row * V + arg, 1.0)
    else:
        chunk_sum = tl.load(chunk_f32_ptr + CHUNK_SUM * num_slots + first_slot + chunks,
                            mask=live, other=0.0)
        z = tl.sum(tl.where(chunk_max > float("-inf"), chunk_sum * tl.exp(chunk_max - m), 0.0), 0)
        k = tl.load(top_k_ptr + row)
        p = tl.load(top_p_ptr + row)
        use_k = (k > 0) & (k < V)
        use_p = p < 1.0
        mode = tl.zeros([1], tl.int32).sum(0) + _DENSE
        norm = z
        if use_k | use_p:
            mode, norm = _select_sparse(chunk_f32_ptr, chunk_i32_ptr, cand_ptr,
                                        compact_ptr + row * COMPACT, out_ptr + row * V,
                                        num_slots, first_slot, NUM_CHUNKS, m, z, k, p, use_k,
                                        use_p, CHUNKS_PAD, CAPACITY, BLOCK, COMPACT)
        tl.store(row_f32_ptr + ROW_MAX * num_rows + row, m)
        tl.store(row_f32_ptr + ROW_NORM * num_rows + row, norm)
    tl.store(row_mode_ptr + row, mode.to(tl.int64))


@triton.jit
def _write_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out
    row_f32_ptr,  # [2, B] float32 (see _select_kernel)
    row_mode_ptr,  # [B] int64
    row_val_ptr,  # [B, ROW_CAPACITY] float32 scratch of the whole-row fallback
    row_idx_ptr,  # [B, ROW_CAPACITY] int32 scratch of the whole-row fallback
    V,
    CHUNK: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    num_rows = tl.num_programs(0).to(tl.int64)
    mode = tl.load(row_mode_ptr + row)
    if mode == _DENSE:
        offs = chunk * CHUNK + tl.arange(0, CHUNK)
        mask = offs < V
        x = scaled_logits(logits_ptr + row * V, offs, mask, tl.load(temperature_ptr + row))
        m = tl.load(row_f32_ptr + ROW_MAX * num_rows + row)
        norm = tl.load(row_f32_ptr + ROW_NORM * num_rows + row)
        tl.store(out_ptr + row * V + offs, tl.exp(x - m) / norm, mask=mask)
    elif (mode == _FALLBACK) & (chunk == 0):
        write_row(logits_ptr + row * V, out_ptr + row * V, V, tl.load(temperature_ptr + row),
                  tl.load(top_k_ptr + row), tl.load(top_p_ptr + row),
                  row_val_ptr + row * ROW_CAPACITY, row_idx_ptr + row * ROW_CAPACITY, BLOCK,
                  ROW_CAPACITY)


def run_probabilities(logits, temperature, top_k, top_p,
                      config: KernelConfig = DEFAULT_CONFIG) -> KernelOutput:
    """Launch the three kernels; arguments were validated by `batched_probabilities`."""
    num_rows, vocab = logits.shape
    dev = logits.device
    chunk, capacity = config.chunk_size(vocab), config.chunk_capacity
    keep_all = vocab <= chunk and triton.next_power_of_2(vocab) <= config.compact
    if keep_all:  # one chunk is the whole row: a slot per entry, every token a candidate
        chunk = capacity = max(triton.next_power_of_2(vocab), MIN_KEEP_ALL_CHUNK)
    num_chunks = triton.cdiv(vocab, chunk)
    num_slots = num_rows * num_chunks
    out = torch.empty((num_rows, vocab), dtype=torch.float32, device=dev)
    chunk_f32 = torch.empty((3, num_slots), dtype=torch.float32, device=dev)
    chunk_i32 = torch.empty((2, num_slots), dtype=torch.int32, device=dev)
    cand = torch.empty((num_slots, capacity), dtype=torch.int64, device=dev)
    compact = torch.empty((num_rows, config.compact), dtype=torch.int64, device=dev)
    row_f32 = torch.empty((2, num_rows), dtype=torch.float32, device=dev)
    row_mode = torch.empty((num_rows,), dtype=torch.int64, device=dev)
    row_val = torch.empty((num_rows, config.candidate_capacity), dtype=torch.float32, device=dev)
    row_idx = torch.empty((num_rows, config.candidate_capacity), dtype=torch.int32, device=dev)
    if num_rows > 0:
        grid = (num_rows, num_chunks)
        _chunk_kernel[grid](
            logits, temperature, top_k, top_p, out, chunk_f32, chunk_i32, cand, vocab,
            num_chunks, config.pivot_sigmas(chunk), CHUNK=chunk,
            CAPACITY=capacity, KEEP_ALL=keep_all, num_warps=config.chunk_warps,
        )
        _select_kernel[(num_rows,)](
            temperature, top_k, top_p, out, chunk_f32, chunk_i32, cand, compact, row_f32,
            row_mode, vocab, num_chunks, CHUNKS_PAD=triton.next_power_of_2(num_chunks),
            CAPACITY=capacity, BLOCK=config.select_block, COMPACT=config.compact,
            num_warps=config.select_warps,
        )
        _write_kernel[(num_rows, triton.cdiv(vocab, config.write_chunk))](
            logits, temperature, top_k, top_p, out, row_f32, row_mode, row_val, row_idx,
            vocab, CHUNK=config.write_chunk, BLOCK=config.block,
            ROW_CAPACITY=config.candidate_capacity,
            num_warps=NUM_WARPS,
        )
    return KernelOutput(out, row_mode)


def probabilities_triton(logits, temperature, top_k, top_p, *,
                         config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """float32[B, V] probabilities of every row (see `run_probabilities`)."""
    return run_probabilities(logits, temperature, top_k, top_p, config).probs
