"""Triton backend of `batched_probabilities`: sort-free, every row split over many programs.

Three launches (one for small batches, below), no host read between them (S = number of chunks of CHUNK vocabulary entries):

1. `_chunk_kernel`, one program per (row, chunk), the chunk held in registers (2,048 entries
   and 4 warps by default; one warp per 512 entries needs no barrier at all): x = logits / T, the chunk's
   max, sum exp(x - max) (`_exp_sum`) and (greedy rows) first argmax; the row's T, k and p
   are loaded with the logits (`hoist_loads`). Greedy and truncating rows zero their
   chunk of the output here. Truncating rows also keep candidates: a quick floor
   (mean + z standard deviations of the finite x, aimed at CAPACITY / 4 tokens, or at
   CAPACITY / 2 for rows with k > `wide_k_limit`, so that k of them clear the row floor F
   below) is counted once; only if more than CAPACITY tokens reach it, a 6-step search over
   32 pivot levels (max - spread * 2**((j - LEVEL_ZERO) / 4)) finds the lowest level that fits. EVERY
   x >= the chunk's floor is stored (x and vocabulary index packed in one int64). A
   vocabulary that fits one chunk (small models) is one chunk of next_power_of_2(V) entries
   with a slot for each: every finite x is stored, so such rows never need the fallback.
2. `_select_kernel`, one program per row: row max m and Z from the chunk statistics. Greedy
   rows write their 1.0 at the argmax. For truncating rows, F = the largest chunk floor; every
   token of the row with x >= F is among the stored candidates. A top-k row with k <= TINY
   raises F to its top-k floor (`_top_k_floor`: a pivot level that the chunk statistics prove
   k tokens reach, so the k-th largest x is not below it, raised by `top_k_floor_steps`
   halvings of the gap to the level above to the highest midpoint they prove). The
   candidates >= F are compacted into a per-row buffer of COMPACT slots, in (chunk, slot)
   order (at the top-k floor, with `chunk_list`, reading only the chunks whose max reaches F:
   `_compact_listed`). If they fit and at least k of them have x >= F (top-k), or their mass
   is >= p * Z (top-p only), every kept token is among them: a bisection over an
   order-preserving 32-bit key of x, in registers, between the smallest and the largest key
   that can hold the answer (`_kth_key`,
   `_top_p_key`), finds the threshold (keep iff key >= key_lo) and the normaliser, and the
   kept probabilities are scattered into the zeroed row. Rows with at most SMALL candidates
   (`small_compact`) run the bisection on a SMALL block, whose block reductions cost less;
   rows with at most TINY (`tiny_compact`) find the same cut without a search (`_prove_tiny`:
   one pass, each candidate against all). Otherwise the row is marked FALLBACK.
3. `_write_kernel`, one program per (row, write chunk): rows without truncation write
   exp(x - m) / Z (one more read of the logits); FALLBACK rows count, per program, the tokens
   (and their mass) at 32 split pivots m - spread * 2**((j - 20) / 4) (spread = m - the mean
   of the chunk means), and the row's last program to finish (atomic ticket) sums the counts
   in a fixed order, picks the highest pivot holding every kept token (count >= k, or top-p
   only: mass >= (p + 1e-3) * Z), gathers the row's candidates at it in vocabulary order (so
   the result does not depend on timing) and, if they fit COMPACT, finds the cut on them and
   scatters; a row no pivot proves runs `probabilities_row_kernel.write_row` (one program,
   exact, slow) there and is marked WHOLE_ROW. Other rows' programs exit after one load,
   so the kernel's register cap (`write_registers`: more programs per SM) sets much of its
   time.

Small batches (B * V <= `KernelConfig.single_launch_entries`, 131,072 by default: B <= 4 at
V = 32,000) take ONE launch instead, eager or captured in a CUDA Graph alike,
`_single_kernel` over (row, chunk) programs: each does step 1 for its chunk, and the row's last
program to finish (atomic ticket, acquire-release, as in step 3) runs step 2 for the row and
then step 3 alone: a DENSE row's V values, a FALLBACK row's split counts over the whole row
(one pass), its pick, gather and proof. Three launches cost the host ~10-15 us more than the
single launch's enqueue, about the device work of a small batch; the row's select and a
DENSE row's V values then run in one program, cheap only while B * V is small
(docs/performance.md). The tickets start at zero (zeroed when the scratch is allocated) and
the last program zeroes its row's ticket again.

Every output element is written by exactly one program of one launch (or rewritten whole by
the whole-row kernel once every other program of its row is done), so no program needs a
barrier between its zeros and its values. A truncating row costs one read of the logits, one write of the output and the
candidates (a few percent of the row). The decisions are exact on float32 x, as in the
whole-row kernel; only sums differ from the reference by float32 rounding.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from dataclasses import dataclass
from statistics import NormalDist

import torch
import triton
import triton.language as tl

from engine.sampling.backend import compiles_natively
from engine.sampling.probabilities_row_kernel import scaled_logits, take_at_least, write_row
from engine.sampling.launch_overlap import (launch_dependents, overlap_options,
                                            supports_overlap, wait_for_prerequisites)
from engine.sampling.launcher import CompiledLaunches, KernelLaunch, current_stream
from engine.sampling.scratch import Scratch, ScratchCache


class RowMode(enum.IntEnum):
    """How a row was written (`KernelOutput.row_mode`)."""

    GREEDY = 0  # temperature 0: one-hot argmax
    DENSE = 1  # no truncation: softmax over the row
    SPARSE = 2  # truncated, threshold found on the chunk candidates
    FALLBACK = 3  # truncated, chunk candidates insufficient: proven on a lower split pivot
    WHOLE_ROW = 4  # truncated, the split pivots could not prove it either: whole-row kernel


_GREEDY = tl.constexpr(int(RowMode.GREEDY))
_DENSE = tl.constexpr(int(RowMode.DENSE))
_SPARSE = tl.constexpr(int(RowMode.SPARSE))
_FALLBACK = tl.constexpr(int(RowMode.FALLBACK))
_WHOLE_ROW = tl.constexpr(int(RowMode.WHOLE_ROW))
NUM_SPLIT_PIVOTS = tl.constexpr(32)  # pivots of the split fallback, 2**(1/4) apart in distance
SPLIT_PIVOT_ZERO = tl.constexpr(20)  # split pivot 20 is the row mean, 0 is m - spread / 32
SPLIT_SUB = 512  # vocabulary entries per step of the split count and gather (at most CHUNK)
MASS_MARGIN = tl.constexpr(1e-3)  # top-p coverage of a split pivot needs this mass beyond p
NUM_LEVELS_LOG2 = tl.constexpr(5)  # 32 pivot levels per chunk (overflow search)
NUM_LEVELS = tl.constexpr(2**NUM_LEVELS_LOG2.value)
LEVEL_ZERO = tl.constexpr(25)  # level 1 drops spread / 64 below the max, level 31 2.8 spreads
FLT_MAX = tl.constexpr(3.4028234663852886e38)
LOG2_E = tl.constexpr(1.4426950408889634)  # exp(d) = 2**(d * LOG2_E)
KEY_MIN = tl.constexpr(-(2**31))  # below the key of every float32 (signed int32 keys)
KEY_MAX = tl.constexpr(2**31 - 1)  # at least the key of every float32
QUICK_FLOOR_SHARE = 4  # the quick floor aims at CAPACITY / QUICK_FLOOR_SHARE tokens per chunk
# Rows with a large k aim at CAPACITY / KernelConfig.wide_share tokens per chunk instead. The row
# floor F is the largest of the chunk floors, so fewer tokens clear it than the chunks store: on
# N(0, 5^2) logits at V = 152,064 (297 chunks of 512, 32 slots, 256 rows) 929-1,556 of the
# expected 2,376 with share 4 (39-65%), 2,315-3,430 with share 2 (both below the 4,096 compact
# slots). A row is wide when k * WIDE_K_MARGIN > num_chunks * capacity / QUICK_FLOOR_SHARE.
WIDE_K_MARGIN = 4
NUM_WARPS = 8  # write kernel (fewer make its whole-row fallback spill registers)
SCRATCH_ALIGN = 16  # elements: every scratch view starts 16-byte aligned (Triton specialises on it)
SCAN_ROW = tl.constexpr(4)  # entries per row of the candidate scan (a 16-byte vector of x)
PAIR_STEP = tl.constexpr(8)  # candidates read per step of the tiny block's pairwise pass
MIN_REGISTERS, MAX_REGISTERS = 24, 255  # what ptxas accepts as a per-thread register cap
MIN_KEEP_ALL_CHUNK = 16  # smallest chunk of a one-chunk row (tl.arange needs a power of two)
MAX_TOP_K_FLOOR_STEPS = 16  # bound of top_k_floor_steps (each step is one more block reduction)
# planes of the packed scratch tensors
CHUNK_MAX, CHUNK_SUM, CHUNK_FLOOR, CHUNK_MEAN = (tl.constexpr(0), tl.constexpr(1),
                                                 tl.constexpr(2), tl.constexpr(3))
CHUNK_ARGMAX, CHUNK_COUNT = tl.constexpr(0), tl.constexpr(1)
ROW_MAX, ROW_NORM, ROW_SPREAD = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)


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
    # (at least one chunk's)
    select_warps: int = 8  # warps per program of the select kernel
    write_chunk: int = 2048  # vocabulary entries per program of the write kernel
    block: int = 2048  # vocabulary step of the whole-row fallback
    candidate_capacity: int = 2048  # scratch slots per row of the whole-row fallback
    wide_share: int = 2  # rows with k > wide_k_limit aim at chunk_capacity / wide_share tokens
    single_launch_entries: int = 0  # batches of at most this many logits (B * V): one launch
    # warps per program of the single launch: its last program per row runs the select
    # kernel's work (select_warps: a COMPACT block in registers) and the whole-row kernel
    # (the write kernel's NUM_WARPS); fewer make them spill registers
    single_warps: int = 8
    # rows with at most this many candidates >= F search a block of this size instead of
    # `compact` (0: never); a power of two below `compact`
    small_compact: int = 0
    # rows with at most this many candidates >= the row floor find the cut without a search
    # (`_prove_tiny`: one pass, each candidate against all); 0: never. A power of two below
    # `small_compact` (or `compact`); fastest at one candidate per thread (select_warps * 32)
    tiny_compact: int = 0
    # programmatic dependent launch of the select and write kernels, where the device and
    # Triton support it (`launch_overlap.supports_overlap`): each is enqueued while the kernel
    # before it still runs and waits on the device for that kernel's results. Off by default:
    # on the H200 it made CUDA Graph replays 2-4 us slower at B >= 16 (docs/performance.md)
    overlap_launches: bool = False
    # programmatic dependent launch of the write kernel alone, in eager calls (where the device
    # supports it): it is enqueued while the select kernel runs, its programs start as the
    # select kernel's finish, and it waits on the device for the select kernel's results. A call
    # being captured in a CUDA Graph launches it serially (`serial_in_capture`): on the H200 the
    # overlap cut back-to-back eager calls by ~1 us at B = 64, V = 152,064 and made graph
    # replays 0.2-2.4 us slower (docs/performance.md)
    overlap_write: bool = False
    # top-k rows whose floor is the top-k floor (k <= tiny_compact) compact the candidates of
    # only the chunks whose max reaches it (`_compact_listed`), listed first in a per-row
    # scratch: the same candidates in fewer steps. On the H200 it cut the select kernel for
    # top-k 50 but made it slower for rows with top-p alone (docs/performance.md)
    chunk_list: bool = False
    # register cap per thread of the write kernel (ptxas `maxnreg`; 0: the compiler's choice).
    # Its rare whole-row and split-fallback paths set its register count, and with it how many
    # of its programs an SM holds at once, while most of its programs only read a row mode
    write_registers: int = 0
    # the chunk kernel loads a row's k and p with its T and logits, so their latencies overlap,
    # instead of after the chunk sum (`_chunk_work`); results do not depend on it
    hoist_loads: bool = False
    # on CUDA the chunk sums take exp as one ex2.approx.ftz per entry (`_exp_sum`): terms below
    # 2**-126 count as 0, which a sum >= 1 absorbs in rounding; the interpreter keeps tl.exp
    ftz_sum: bool = False
    # the chunk kernel stores its statistics and candidates with the evict-last L2 policy, so
    # that the logits and zeros it streams evict them last (the select kernel reads them next)
    keep_in_l2: bool = False
    # the chunk kernel computes x = logits / T as RN(x * RN(1 / T)) with one FMA correction
    # (`scaled_logits`): the IEEE quotient, bit for bit, in three instructions per entry instead
    # of about ten; blocks of x it is not proved for divide as before. The write kernel keeps
    # IEEE division (its 8-warp blocks' range check cost more than it saved on the H200), and
    # so does the single launch (with it, graph replays at B = 1, V = 32,000 took 2.5-5.8 us more)
    reciprocal_division: bool = False
    # the write kernel takes a row's write chunks from the last to the first, the order that
    # meets first the logits the chunk kernel read last (a DENSE row re-reads them); results do
    # not depend on it
    reverse_write: bool = False
    # bisection steps that raise the select kernel's top-k floor (`_top_k_floor`) from its
    # pivot level towards the highest value the chunk statistics prove k tokens reach (0: the
    # level itself): fewer candidates, and fewer chunks to compact, at the floor. The single
    # launch keeps the level (its time with the refinement was not measured)
    top_k_floor_steps: int = 0

    def __post_init__(self):
        for name in ("chunk", "chunk_capacity", "max_candidates", "chunk_warps", "compact",
                     "select_block", "select_warps", "write_chunk", "block",
                     "candidate_capacity", "wide_share", "single_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"KernelConfig.{name}={value!r} must be a power of two")
        steps = self.top_k_floor_steps
        if not isinstance(steps, int) or not 0 <= steps <= MAX_TOP_K_FLOOR_STEPS:
            raise ValueError(f"KernelConfig.top_k_floor_steps={steps!r} must be an integer in "
                             f"[0, {MAX_TOP_K_FLOOR_STEPS}]")
        if not isinstance(self.single_launch_entries, int) or self.single_launch_entries < 0:
            raise ValueError(f"KernelConfig.single_launch_entries={self.single_launch_entries!r} "
                             "must be an integer >= 0")
        for name in ("overlap_launches", "overlap_write", "chunk_list", "hoist_loads", "ftz_sum",
                     "keep_in_l2", "reciprocal_division", "reverse_write"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"KernelConfig.{name}={getattr(self, name)!r} must be True or "
                                 "False")
        small = self.small_compact
        if not isinstance(small, int) or small < 0 or small and (
                small & (small - 1) or small >= self.compact):
            raise ValueError(f"KernelConfig.small_compact={self.small_compact!r} must be 0 or a "
                             f"power of two below compact ({self.compact})")
        if not isinstance(self.write_registers, int) or self.write_registers and not (
                MIN_REGISTERS <= self.write_registers <= MAX_REGISTERS):
            raise ValueError(f"KernelConfig.write_registers={self.write_registers!r} must be 0 "
                             f"or an integer in [{MIN_REGISTERS}, {MAX_REGISTERS}]")
        tiny = self.tiny_compact
        if not isinstance(tiny, int) or tiny < 0 or tiny and (
                tiny & (tiny - 1) or tiny >= (small or self.compact)):
            raise ValueError(f"KernelConfig.tiny_compact={self.tiny_compact!r} must be 0 or a "
                             f"power of two below small_compact, or compact if that is 0 "
                             f"({small or self.compact})")
        if not self.chunk_capacity <= min(self.chunk, self.max_candidates):
            raise ValueError(f"KernelConfig.chunk_capacity={self.chunk_capacity} must be <= "
                             f"chunk ({self.chunk}) and max_candidates ({self.max_candidates})")
        # hashed once: every eager call looks its plan up by config (`device_plan`), and the
        # generated hash rebuilds a tuple of all the fields each time (3.4 us against 0.1 on
        # the host of docs/performance.md's H200 measurement)
        object.__setattr__(self, "_hash", hash(self._fields()))

    def _fields(self) -> tuple:
        return tuple(getattr(self, f.name) for f in dataclasses.fields(self))

    def __hash__(self) -> int:  # the fields' hash, as the dataclass's own (they are immutable)
        return self._hash

    def __reduce__(self):
        """Pickle and copy by the fields alone: the copy hashes them again in its own process
        (a stored hash of a str field would differ there) and is validated again."""
        return type(self), self._fields()

    def chunk_size(self, vocab: int) -> int:
        """The smallest chunk >= `self.chunk` whose candidates fit `max_candidates`."""
        chunk = self.chunk
        while triton.next_power_of_2(triton.cdiv(vocab, chunk)) * self.chunk_capacity \
                > self.max_candidates:
            chunk *= 2
        return chunk

    def pivot_sigmas(self, chunk: int, share: int = QUICK_FLOOR_SHARE) -> float:
        """z of the quick floor mean + z * std: a normal chunk has CAPACITY / share tokens above."""
        return NormalDist().inv_cdf(1.0 - self.chunk_capacity / (share * chunk))


# Batches of at most SINGLE_LAUNCH_ENTRIES logits (B * V) take one launch (`_single_kernel`).
# On the H200 (benchmarks/sampling_small.py, docs/performance.md) its host enqueue is ~15-28 us
# against ~25-49 us for the three launches (`CompiledLaunch.enqueue`; 55-100 us through
# Triton's runner), but its device time grows with B * V (the row's select and a DENSE row's
# V values run in one program). Captured in a CUDA Graph (as decode
# rounds are) only the device time counts: there it is within 2 us of the three launches for
# truncating rows at V = 32,000 up to B = 4, but 5.5 us slower for a DENSE row at B = 1 and
# 39 us slower at V = 152,064. 2**17 (B <= 4 at V = 32,000, B <= 2 at 49,152, never at
# 152,064) keeps the eager gain where a captured round loses at most a few microseconds.
SINGLE_LAUNCH_ENTRIES = 2**17
# The default: one-warp 512-entry chunk programs with 8,192-entry write programs. On the H200 its
# three kernels took 197 us of device time at B=256, V=152,064, top-k 50 + top-p 0.9 (2.7x the
# floor; KernelConfig(), the previous default, took 304 us), and 171 us (2.33x) with the tiled
# compaction and small block. See docs/performance.md.
#
# small_compact=2048: rows with at most 2,048 candidates >= F bisect a 2,048-slot block. On the
# H200 (docs/performance.md, "The select kernel") that cut the select kernel by 3.7 us at B = 1
# and 10.9 us at B = 64 (top-k 50 + top-p 0.9, V = 152,064), but rows with more candidates
# (top-k 1000) then took up to 11 us longer at B >= 64 than with no small block.
#
# tiny_compact=256: rows with at most 256 candidates at or above the row floor (a top-k row's
# floor includes `_top_k_floor`) find the cut in one pairwise pass (`_prove_tiny`), one
# candidate per thread of the select kernel's 8 warps.
#
# write_registers=64: the write kernel (8 warps) compiled for 192 registers per thread, so an SM
# held one of its programs at a time; capped at 80 it holds three, at 64 four. Most of its
# programs only read a row mode and exit, so their launches set its time: on the H200 at
# V = 152,064 the cap of 80 took it 15.6 -> 6.3 us at B = 256 (top-k 50 + top-p 0.9) and
# 128.2 -> 81.3 us without truncation, where it writes the rows; 64 against 80 took it
# 6.2 -> 5.0 and 79.0 -> 78.1 us there, 18.3 -> 17.7 us at B = 64 without truncation (its
# rare fallback paths spill more; docs/performance.md, "The write kernel at 64 registers").
#
# chunk_list=True: a top-k row at its top-k floor compacts only the chunks whose max reaches it
# (50-111 of 297, median 67, at k = 50 in `python3 -m benchmarks.top_k_floor_model`). On the
# H200 at V = 152,064 (top-k 50 + top-p 0.9) the select kernel went 11.5 -> 7.1 us at B = 1,
# 12.2 -> 9.8 at B = 16 and 20.5 -> 16.8 at B = 256, but rows with top-p alone, which never
# take the list, went 16.7 -> 17.8 us at B = 1 and 21.4 -> 24.3 at B = 64: the kernel with
# both compactions is slower on them (docs/performance.md).
#
# hoist_loads=True: the chunk kernel loaded a row's k and p only after its chunk sum, one more
# round trip at the end of every program. Loaded with T and the logits, on the H200 at
# V = 152,064, B = 64 the chunk kernel went 16.8 -> 15.9 us without truncation and
# 26.0 -> 25.5 with top-k 50 + top-p 0.9.
#
# ftz_sum=True: one ex2.approx.ftz per entry in the chunk sums instead of tl.exp's ex2 with its
# denormal fix-up (three instructions fewer per entry); with hoist_loads the chunk kernel went
# 26.0 -> 24.9 us at B = 64 (top-k 50 + top-p 0.9), 96.0 -> 94.4 at B = 256.
#
# keep_in_l2=True: the chunk statistics and candidates are stored evict-last (STG.E.EL), so the
# 78 MB of logits and zeros a B = 64 call streams through the 50 MB L2 evict them last. On the
# H200 the whole call's graph time went 42.0 -> 40.6 us at B = 64 and 117.9 -> 109.0 at
# B = 256 (top-k 50 + top-p 0.9), mostly in the chunk kernel itself (94.5 -> 87.4 at B = 256);
# without truncation (no candidates) within 0.5 us (docs/performance.md).
#
# reciprocal_division=True: the chunk kernel's x / T by the row's reciprocal and one FMA
# correction, the IEEE quotient bit for bit; on the H200 at V = 152,064, B = 64 the chunk kernel
# went 23.8 -> 23.5 us (top-k 50 + top-p 0.9) and 15.4 -> 14.7 (no truncation).
#
# reverse_write=True: a DENSE row's write programs re-read its logits; in the forward order they
# start with the chunks the chunk kernel read first, the ones the L2 evicted first. On the H200
# at V = 152,064 the write kernel went 21.7 -> 18.5 us at B = 64 without truncation (graph time
# 41.5 -> 37.1), 8.1 -> 6.7 at B = 16 and 81.1 -> 78.9 at B = 256; truncating rows, whose write
# programs only read a row mode, within 0.3 us (docs/performance.md).
#
# top_k_floor_steps=3: at B = 1 the select kernel took 7.0-11.7 us over 64 rows of top-k 50 +
# top-p 0.9 (median 8.9; the same rows were the slowest with every select variant tried), and a
# batch waits for its slowest row: 64 copies of the fastest row took 8.8 us, of the slowest
# 13.7. In the numpy model (`python3 -m benchmarks.top_k_floor_model`, 200 rows at k = 50) the
# level floor (levels 2**(1/4) apart) lets 51-139 candidates and 50-111 chunks through
# (median 67: two 64-chunk compaction steps on many rows), three halvings 51-68 and 50-60;
# which of the two set the slow rows' time was not measured. Three halvings of the gap to the
# level above: on the H200 at V = 152,064 the select kernel went 13.0 -> 8.8 us at B = 64,
# 9.7 -> 7.7 at B = 16, 16.4 -> 11.9 at B = 256 (graph time 39.7 -> 35.5 at B = 64), within
# 0.2 us at B = 1; six halvings gained less (9.2 at B = 64); top-k 1000 rows (no top-k floor)
# unchanged (docs/performance.md).
TOP_K_FLOOR_STEPS = 3
# overlap_write=True: in eager calls the write kernel is enqueued with programmatic dependent
# launch, so its launch and the start of its programs overlap the select kernel's end (the
# select kernel triggers it by finishing: it is launched as before). On the H200 at V = 152,064,
# B = 64, back-to-back eager calls went 40.4-40.6 -> 39.2-39.5 us without truncation and
# 39.2-39.4 -> 37.5-38.3 with top-k 50 + top-p 0.9 (medians of four calls); a call captured in a
# CUDA Graph launches it serially (replays within 0.2 us of serial launches at B = 16-64), since
# replays with the overlap captured were 0.2-2.4 us slower (docs/performance.md)
DEFAULT_CONFIG = KernelConfig(chunk=512, chunk_capacity=32, chunk_warps=1, write_chunk=8192,
                              single_launch_entries=SINGLE_LAUNCH_ENTRIES, small_compact=2048,
                              tiny_compact=256, write_registers=64, chunk_list=True,
                              hoist_loads=True, ftz_sum=True, keep_in_l2=True,
                              reciprocal_division=True, reverse_write=True,
                              top_k_floor_steps=TOP_K_FLOOR_STEPS, overlap_write=True)
# Configurations the benchmark sweeps and the GPU tests check (the default first; new ones go
# last, since `benchmarks.sampling --config N` and docs/performance.md name them by index).
CANDIDATE_CONFIGS = (
    DEFAULT_CONFIG,
    KernelConfig(chunk=512, chunk_capacity=32, chunk_warps=1, compact=2048, write_chunk=8192),
    KernelConfig(),
    KernelConfig(chunk=1024, chunk_capacity=64, chunk_warps=2, write_chunk=8192),
    KernelConfig(write_chunk=8192),
    KernelConfig(compact=2048),
    dataclasses.replace(DEFAULT_CONFIG, small_compact=0, tiny_compact=0),  # appended: indices
    dataclasses.replace(DEFAULT_CONFIG, tiny_compact=0),  # name configs
    dataclasses.replace(DEFAULT_CONFIG, write_registers=0),
)
# Single-launch configurations the small-batch benchmark compares and the GPU tests check.
SINGLE_LAUNCH_CONFIGS = (
    DEFAULT_CONFIG,
    KernelConfig(chunk=2048, chunk_capacity=128, single_launch_entries=SINGLE_LAUNCH_ENTRIES),
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
    """(floor, mean): mean + sigmas * std of the finite x, clamped to [-FLT_MAX, m] (+inf if
    NaN), and their mean.

    Moments are taken of d = m - x >= 0, which keeps the variance free of cancellation."""
    finite = x > float("-inf")
    n = tl.maximum(tl.sum(finite.to(tl.int32), 0), 1).to(tl.float32)
    d = tl.where(finite, m - x, 0.0)
    mean_d = tl.sum(d, 0) / n
    var_d = tl.maximum(tl.sum(d * d, 0) / n - mean_d * mean_d, 0.0)
    floor = tl.maximum(m - tl.maximum(mean_d - sigmas * tl.sqrt(var_d), 0.0), -FLT_MAX)
    return tl.where(floor == floor, floor, float("inf")), m - mean_d


@triton.jit
def _store_taken(x, offs, take, cand_ptr, CAPACITY: tl.constexpr, EVICTION: tl.constexpr):
    """Store the taken x (packed with their index) at cand_ptr[0:CAPACITY], in index order.

    A taken entry's slot is the number of taken entries before it. The [N] block is scanned as
    [N / SCAN_ROW, SCAN_ROW] (a free reshape: a thread's consecutive entries form a row): a scan
    along each row in registers plus one scan of the row totals. One 1-D scan over N costs about
    6x the instructions (benchmarks/sass_lines.py, docs/performance.md); the slots are the same."""
    n: tl.constexpr = x.shape[0]
    shape: tl.constexpr = (n // SCAN_ROW, SCAN_ROW)
    take = tl.reshape(take.to(tl.int32), shape)
    rows = tl.sum(take, 1)
    pos = (tl.cumsum(rows, 0) - rows)[:, None] + tl.cumsum(take, 1) - 1
    packed = _pack(tl.reshape(x, shape), tl.reshape(offs, shape))
    tl.store(cand_ptr + pos, packed, mask=(take != 0) & (pos < CAPACITY),
             eviction_policy=EVICTION)


@triton.jit
def _keep_candidates(x, offs, m, sigmas, cand_ptr, floor_ptr, mean_ptr, count_ptr,
                     CAPACITY: tl.constexpr, KEEP_ALL: tl.constexpr, EVICTION: tl.constexpr):
    """Store every x >= the chunk floor (packed with its index), then the floor, the mean of
    the finite x (m for KEEP_ALL: its rows need no split fallback) and the count.
    KEEP_ALL (the chunk is the whole row and has a slot per entry): the floor is -FLT_MAX, so
    every finite x is a candidate and no top-k or top-p row needs the fallback, unless the
    chunk holds NaN or +inf (floor +inf: no candidates, the exact fallback decides)."""
    if KEEP_ALL:
        bad = tl.sum(((x != x) | (x == float("inf"))).to(tl.int32), 0) > 0
        floor = tl.where(bad, float("inf"), -FLT_MAX)
        num_taken = _count_at_least(x, floor)
        mean = m
    else:
        floor, mean = _quick_floor(x, m, sigmas)
        num_taken = _count_at_least(x, floor)
        if num_taken > CAPACITY:  # a heavy upper tail: search the pivot levels
            floor = _searched_floor(x, m, CAPACITY)
            num_taken = _count_at_least(x, floor)
    complete = num_taken <= CAPACITY  # holds by construction; never overflow the slots
    _store_taken(x, offs, x >= floor, cand_ptr, CAPACITY, EVICTION)
    tl.store(floor_ptr, tl.where(complete, floor, float("inf")), eviction_policy=EVICTION)
    tl.store(mean_ptr, mean, eviction_policy=EVICTION)
    tl.store(count_ptr, tl.where(complete, num_taken, 0), eviction_policy=EVICTION)


@triton.jit
def _chunk_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out: zeros in greedy and truncating rows
    chunk_f32_ptr,  # [4, B * S] float32: max, sum exp(x - max), candidate floor, finite mean
    chunk_i32_ptr,  # [2, B * S] int32: first argmax (greedy rows), candidate count
    cand_ptr,  # [B * S, CAPACITY] int64: packed candidates (x, vocabulary index)
    V,
    NUM_CHUNKS,
    pivot_sigmas,  # float32: z of the quick floor
    wide_sigmas,  # float32: z of the quick floor of rows with k > wide_k (a lower floor)
    wide_k,  # int: rows with a larger top-k aim at the wide share of candidates
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
    KEEP_ALL: tl.constexpr,
    HOIST: tl.constexpr,  # see _chunk_work
    FTZ_SUM: tl.constexpr,  # the chunk sums' exp flushes to zero (_exp_sum; CUDA only)
    EVICTION: tl.constexpr,  # L2 policy of the statistics and candidates ("" or "evict_last")
    RECIPROCAL: tl.constexpr,  # x / T by the row's reciprocal (scaled_logits)
    PDL: tl.constexpr,  # let the select kernel start once every program is done
):
    _chunk_work(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, out_ptr, chunk_f32_ptr,
                chunk_i32_ptr, cand_ptr, V, NUM_CHUNKS, pivot_sigmas, wide_sigmas, wide_k,
                tl.program_id(0).to(tl.int64), tl.program_id(1), CHUNK, CAPACITY, KEEP_ALL,
                HOIST, FTZ_SUM, EVICTION, RECIPROCAL)
    if PDL:
        launch_dependents()


@triton.jit
def _chunk_work(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, out_ptr, chunk_f32_ptr,
                chunk_i32_ptr, cand_ptr, V, NUM_CHUNKS, pivot_sigmas, wide_sigmas, wide_k, row,
                chunk, CHUNK: tl.constexpr, CAPACITY: tl.constexpr, KEEP_ALL: tl.constexpr,
                HOIST: tl.constexpr, FTZ_SUM: tl.constexpr, EVICTION: tl.constexpr,
                RECIPROCAL: tl.constexpr):
    """The work of one (row, chunk) program of `_chunk_kernel` (also run by `_single_kernel`).
    HOIST: the row's k and p are loaded with T and the logits, before any of them is used, so
    their latencies overlap (else where they are first needed, after the chunk sum)."""
    num_slots = tl.num_programs(0).to(tl.int64) * NUM_CHUNKS
    slot = row * NUM_CHUNKS + chunk
    t = tl.load(temperature_ptr + row)
    if HOIST:
        k = tl.load(top_k_ptr + row)
        p = tl.load(top_p_ptr + row)
    is_greedy = t == 0.0
    offs = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offs < V
    x = scaled_logits(logits_ptr + row * V, offs, mask, tl.where(is_greedy, 1.0, t),
                      RECIPROCAL)
    m = tl.max(x, 0)
    tl.store(chunk_f32_ptr + CHUNK_MAX * num_slots + slot, m, eviction_policy=EVICTION)
    zeros = tl.zeros([CHUNK], tl.float32)
    if is_greedy:
        arg = chunk * CHUNK + tl.argmax(x, 0, tie_break_left=True)
        tl.store(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + slot, arg)
        tl.store(out_ptr + row * V + offs, zeros, mask=mask)
    else:
        z = _exp_sum(x, m, FTZ_SUM)
        tl.store(chunk_f32_ptr + CHUNK_SUM * num_slots + slot, z, eviction_policy=EVICTION)
        if not HOIST:
            k = tl.load(top_k_ptr + row)
        use_k = (k > 0) & (k < V)
        if not HOIST:
            p = tl.load(top_p_ptr + row)
        if use_k | (p < 1.0):
            tl.store(out_ptr + row * V + offs, zeros, mask=mask)
            sigmas = tl.where(use_k & (k > wide_k), wide_sigmas, pivot_sigmas)
            _keep_candidates(x, offs, m, sigmas, cand_ptr + slot * CAPACITY,
                             chunk_f32_ptr + CHUNK_FLOOR * num_slots + slot,
                             chunk_f32_ptr + CHUNK_MEAN * num_slots + slot,
                             chunk_i32_ptr + CHUNK_COUNT * num_slots + slot, CAPACITY, KEEP_ALL,
                             EVICTION)


@triton.jit
def _exp_sum(x, m, FTZ: tl.constexpr):
    """sum exp(x - m) over the finite x. FTZ (CUDA only): each exp is one ex2.approx.ftz, so
    terms below 2**-126 count as 0 where tl.exp's ex2 keeps them (three more instructions per
    entry); a sum holding exp(0) = 1 absorbs such terms in rounding either way."""
    d = x - m
    if FTZ:
        e = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r",
                                      [d * LOG2_E], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        e = tl.exp(d)
    return tl.sum(tl.where(x > float("-inf"), e, 0.0), 0)


@triton.jit
def _kth_key(key, valid, k):
    """Largest t with #(valid and key >= t) >= k: the key of the k-th largest valid x
    (defined when at least k keys are valid; callers check that before using it).

    The answer lies in [lo, hi], the smallest and the largest valid key. Bisection from lo,
    most significant bit first: a trial above hi cannot hold (no key reaches it) and is
    skipped without a block reduction, so keys spanning less than 2**n cost n reductions
    instead of 32. The invariant: ans holds, and answer - ans < 2**(bit + 1) before `bit`.
    Scalars are int64, so no trial overflows; a trial that is tried is <= hi, an int32."""
    lo = tl.min(tl.where(valid, key, KEY_MAX), 0).to(tl.int64)
    hi = tl.max(tl.where(valid, key, KEY_MIN), 0).to(tl.int64)
    ans = lo
    for bit in tl.static_range(31, -1, -1):
        trial = ans + (1 << bit)
        if trial <= hi:
            count = tl.sum((valid & (key >= trial.to(tl.int32))).to(tl.int32), 0)
            ans = tl.where(count >= k, trial, ans)
    return ans.to(tl.int32)


@triton.jit
def _top_p_key(key, mass, target):
    """Smallest key kept by top-p: keep iff the mass with a strictly larger key is < target.

    `mass` is exp(x - m) on the survivors of top-k and 0 elsewhere, and target > 0 is at most
    their total; above(t) = mass with key > t is nonincreasing, so T = max t with
    above(t) >= target exists. With lo and hi the smallest and largest key of positive mass,
    above(lo - 1) is the total (>= target) and above(hi) = 0, so T is in [lo - 1, hi - 1]:
    the bisection of `_kth_key` from lo - 1, skipping trials >= hi. Returns T + 1."""
    lo = tl.min(tl.where(mass > 0.0, key, KEY_MAX), 0).to(tl.int64)
    hi = tl.max(tl.where(mass > 0.0, key, KEY_MIN), 0).to(tl.int64)
    ans = lo - 1
    for bit in tl.static_range(31, -1, -1):
        trial = ans + (1 << bit)
        if trial < hi:
            above = tl.sum(tl.where(key > trial.to(tl.int32), mass, 0.0), 0)
            ans = tl.where(above >= target, trial, ans)
    return (ans + 1).to(tl.int32)


@triton.jit
def _certain_count(chunk_max, floors, counts, v):
    """Tokens >= v that the chunk statistics prove: at least one in a chunk whose max reaches
    v, and a chunk's `counts` stored candidates if its floor reaches v (each is >= the floor)."""
    at_floor = tl.where(floors >= v, counts, 0)
    return tl.sum(tl.maximum(at_floor, (chunk_max >= v).to(tl.int32)), 0)


@triton.jit
def _top_k_floor(chunk_max, floors, counts, m, spread, k, STEPS: tl.constexpr):
    """v = `_pivot`(m, spread, j) at the lowest level j whose pivot the chunk statistics prove
    k tokens reach (`_certain_count`); -inf if not even the last level's does. The k-th
    largest x is then >= v, so every token top-k keeps is >= v: a row floor for top-k
    that needs no candidate. A bisection for the highest level that does not prove k, over
    [-1, NUM_LEVELS - 1]: at most 6 block reductions over the row's chunks. Then STEPS
    halvings of the gap between that level's pivot (which does not prove k) and v (which
    does) raise v to the highest midpoint proved (`_refined_floor`): the levels are 2**(1/4)
    apart in distance from m, and one level can hold twice k tokens or more."""
    short = tl.zeros([1], tl.int32).sum(0) - 1  # level 0 proves k (or a level that does not)
    for bit in tl.static_range(NUM_LEVELS_LOG2, -1, -1):
        trial = short + (1 << bit)
        if trial < NUM_LEVELS:
            if _certain_count(chunk_max, floors, counts, _pivot(m, spread, trial)) < k:
                short = trial
    level = short + 1
    v = _pivot(m, spread, tl.minimum(level, NUM_LEVELS - 1))
    if STEPS > 0:
        if (level > 0) & (level < NUM_LEVELS):
            v = _refined_floor(chunk_max, floors, counts, k, v, _pivot(m, spread, short),
                               STEPS)
    return tl.where((level < NUM_LEVELS) & (v == v), v, float("-inf"))


@triton.jit
def _refined_floor(chunk_max, floors, counts, k, proved, unproved, STEPS: tl.constexpr):
    """The highest of STEPS bisection midpoints between `proved` (the chunk statistics prove
    k tokens at or above it) and `unproved` > proved (they do not) that they prove, or `proved`:
    each step halves the gap, so the result is within (unproved - proved) / 2**STEPS of the
    highest value they prove. Midpoints are lo / 2 + hi / 2 (no overflow); a NaN bound leaves
    `proved` (every comparison with NaN is false)."""
    lo = proved
    hi = unproved
    for _ in tl.static_range(STEPS):
        mid = lo * 0.5 + hi * 0.5
        holds = _certain_count(chunk_max, floors, counts, mid) >= k
        lo = tl.where(holds, mid, lo)
        hi = tl.where(holds, hi, mid)
    return lo


@triton.jit
def _compact(cand_ptr, count_ptr, compact_ptr, NUM_CHUNKS, floor, CAPACITY: tl.constexpr,
             TILE: tl.constexpr, COMPACT: tl.constexpr):
    """Copy the row's stored candidates with x >= floor to compact_ptr[0:COMPACT], in
    (chunk, slot) order; return how many there are (they fit iff the count is <= COMPACT).

    `cand_ptr` / `count_ptr` point to the row's first chunk: slot j of chunk c is at
    cand_ptr + c * CAPACITY + j. A step takes a [TILE chunks, CAPACITY slots] tile
    (`_compact_step`). Each step's loads are issued one step ahead (`_candidate_tile`), so
    their latency overlaps the step before."""
    num = tl.zeros([1], tl.int32).sum(0)
    chunks = tl.arange(0, TILE)
    count, packed = _candidate_tile(cand_ptr, count_ptr, chunks, chunks < NUM_CHUNKS, CAPACITY)
    for first in range(0, NUM_CHUNKS, TILE):
        chunks = first + TILE + tl.arange(0, TILE)
        next_count, next_packed = _candidate_tile(cand_ptr, count_ptr, chunks,
                                                  chunks < NUM_CHUNKS, CAPACITY)
        num = _compact_step(count, packed, floor, num, compact_ptr, CAPACITY, COMPACT)
        count, packed = next_count, next_packed
    return num


@triton.jit
def _list_hot_chunks(chunk_max, NUM_CHUNKS, floor, list_ptr, CHUNKS_PAD: tl.constexpr):
    """Store, in chunk order, the row's chunks whose max is not below floor at
    list_ptr[0:CHUNKS_PAD] and return how many there are. A chunk whose max is below the floor
    stores no candidate >= it (every stored candidate is <= its chunk's max); a NaN max counts
    as hot, so the list holds every chunk `_compact` would take a candidate from."""
    chunks = tl.arange(0, CHUNKS_PAD)
    hot = ((chunk_max < floor) == 0) & (chunks < NUM_CHUNKS)
    ones = hot.to(tl.int32)
    tl.store(list_ptr + tl.cumsum(ones, 0) - 1, chunks, mask=hot)
    tl.debug_barrier()  # the list lands before any thread reads it
    return tl.sum(ones, 0)


@triton.jit
def _compact_listed(cand_ptr, count_ptr, list_ptr, compact_ptr, num_listed, floor,
                    CAPACITY: tl.constexpr, TILE: tl.constexpr, COMPACT: tl.constexpr):
    """`_compact` over only the `num_listed` chunks at list_ptr (`_list_hot_chunks`): the same
    candidates in the same order, in ceil(num_listed / TILE) steps instead of
    ceil(NUM_CHUNKS / TILE). Each step's chunk numbers and loads are issued one step ahead."""
    num = tl.zeros([1], tl.int32).sum(0)
    count, packed = _listed_tile(cand_ptr, count_ptr, list_ptr, num_listed, 0, CAPACITY, TILE)
    for first in range(0, num_listed, TILE):
        next_count, next_packed = _listed_tile(cand_ptr, count_ptr, list_ptr, num_listed,
                                               first + TILE, CAPACITY, TILE)
        num = _compact_step(count, packed, floor, num, compact_ptr, CAPACITY, COMPACT)
        count, packed = next_count, next_packed
    return num


@triton.jit
def _listed_tile(cand_ptr, count_ptr, list_ptr, num_listed, first, CAPACITY: tl.constexpr,
                 TILE: tl.constexpr):
    """`_candidate_tile` of the listed chunks [first, first + TILE)."""
    entries = first + tl.arange(0, TILE)
    listed = entries < num_listed
    chunks = tl.load(list_ptr + entries, mask=listed, other=0)
    return _candidate_tile(cand_ptr, count_ptr, chunks, listed, CAPACITY)


@triton.jit
def _compact_step(count, packed, floor, num, compact_ptr, CAPACITY: tl.constexpr,
                  COMPACT: tl.constexpr):
    """Append a [TILE chunks, CAPACITY slots] tile's candidates with x >= floor (slot < the
    chunk's count) at compact_ptr[num:], in (chunk, slot) order; return the new num. A
    chunk's offset is a scan over its TILE counts, a slot's a scan along its chunk's CAPACITY
    slots (on the H200 2.4 us faster per row than one scan over the flattened tile:
    docs/performance.md)."""
    slots = tl.arange(0, CAPACITY)
    valid = ((slots[None, :] < count[:, None]) & (_unpack_x(packed) >= floor)).to(tl.int32)
    per_chunk = tl.sum(valid, 1)
    before = tl.cumsum(per_chunk, 0) - per_chunk
    pos = num + before[:, None] + tl.cumsum(valid, 1) - 1
    tl.store(compact_ptr + pos, packed, mask=(valid != 0) & (pos < COMPACT))
    return num + tl.sum(per_chunk, 0)


@triton.jit
def _candidate_tile(cand_ptr, count_ptr, chunks, live, CAPACITY: tl.constexpr):
    """(count, packed) of the [TILE] `chunks`: each chunk's candidate count (0 where not
    `live`) and all its CAPACITY slots, stored or not. Slots past a chunk's count hold
    whatever was there (the caller masks them with the count), so the two loads are
    independent: neither waits for the other's latency."""
    count = tl.load(count_ptr + chunks, mask=live, other=0)
    slots = chunks[:, None] * CAPACITY + tl.arange(0, CAPACITY)[None, :]
    packed = tl.load(cand_ptr + slots, mask=live[:, None], other=0)
    return count, packed


@triton.jit
def _covers_kept(num, mass, z, k, p, use_k):
    """Whether `num` candidates of total `mass` (exp(x - m)), which hold every token at or above
    the row floor, hold every kept token: at least k of them for top-k, else mass >= p * Z."""
    return ((num >= k) & use_k) | ((mass >= p * z) & (use_k == 0))


@triton.jit
def _threshold(x, valid, m, z, k, p, use_k, use_p):
    """(key_lo, norm, covered) on the candidates x[valid], which hold every token x >= F.

    covered: every kept token is among them (>= k of them for top-k, else mass >= p * Z)."""
    key = _key(x)
    e = tl.where(valid, tl.exp(x - m), 0.0)
    covered = _covers_kept(tl.sum(valid.to(tl.int32), 0), tl.sum(e, 0), z, k, p, use_k)
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
def _select_sparse(chunk_i32_ptr, cand_ptr, compact_ptr, list_ptr, out_row, num_slots,
                   first_slot, NUM_CHUNKS, chunk_max, floor, listed, m, z, k, p, use_k, use_p,
                   CHUNKS_PAD: tl.constexpr, CAPACITY: tl.constexpr, TILE: tl.constexpr,
                   COMPACT: tl.constexpr, SMALL: tl.constexpr, TINY: tl.constexpr,
                   LISTED: tl.constexpr):
    """RowMode and normaliser of a truncating row, from its stored candidates >= `floor` (at
    least the largest chunk floor, so every token >= it is stored); SPARSE rows get their kept
    values here. With LISTED and `listed` (a floor high enough that few chunks reach it: the
    top-k floor) the compaction reads only the chunks whose max reaches the floor
    (`_compact_listed`), with the same result."""
    row_cands = cand_ptr + first_slot * CAPACITY
    row_counts = chunk_i32_ptr + CHUNK_COUNT * num_slots + first_slot
    # `listed` is known only at run time; LISTED off leaves the list out of the compiled kernel
    # (the select kernel as it was before it), hence the full compaction in two branches
    if LISTED:
        if listed:
            num_hot = _list_hot_chunks(chunk_max, NUM_CHUNKS, floor, list_ptr, CHUNKS_PAD)
            num = _compact_listed(row_cands, row_counts, list_ptr, compact_ptr, num_hot, floor,
                                  CAPACITY, TILE, COMPACT)
        else:
            num = _compact(row_cands, row_counts, compact_ptr, NUM_CHUNKS, floor, CAPACITY,
                           TILE, COMPACT)
    else:
        num = _compact(row_cands, row_counts, compact_ptr, NUM_CHUNKS, floor, CAPACITY, TILE,
                       COMPACT)
    tl.debug_barrier()  # the compacted candidates land before other threads read them
    is_sparse, norm = _prove_and_scatter(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                                         COMPACT, SMALL, TINY)
    return tl.where(is_sparse, _SPARSE, _FALLBACK), tl.where(is_sparse, norm, z)


@triton.jit
def _prove_and_scatter(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                       COMPACT: tl.constexpr, SMALL: tl.constexpr, TINY: tl.constexpr):
    """(proven, norm): if the `num` packed candidates at compact_ptr fit COMPACT and hold every
    kept token, find the cut on them and scatter the kept probabilities into the zeroed row.
    Rows with at most TINY candidates (TINY > 0) find it without a search (`_prove_tiny`);
    rows with at most SMALL (SMALL > 0) search a SMALL block instead of COMPACT: each block
    reduction of the search then covers fewer slots."""
    if TINY > 0:
        if num <= TINY:
            proven, norm = _prove_tiny(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, TINY)
        else:
            proven, norm = _prove_searched(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                                           COMPACT, SMALL)
    else:
        proven, norm = _prove_searched(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                                       COMPACT, SMALL)
    return proven, norm


@triton.jit
def _prove_searched(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                    COMPACT: tl.constexpr, SMALL: tl.constexpr):
    """`_prove_and_scatter` by the key searches, on a SMALL block if SMALL > 0 and num fits it,
    else on the COMPACT block."""
    if SMALL > 0:
        if num <= SMALL:
            proven, norm = _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                                        SMALL)
        else:
            proven, norm = _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                                        COMPACT)
    else:
        proven, norm = _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p,
                                    COMPACT)
    return proven, norm


@triton.jit
def _prove_tiny(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, TINY: tl.constexpr):
    """`_prove_and_scatter` on num <= TINY candidates, with the cut of `_threshold` but no
    search. Each thread takes a candidate i and writes its (key, exp(x - m)) to the slots
    after the block (a slot past num gets the key of -inf and no mass, below every
    candidate). One pass over those pairs then gives each candidate the number of candidates
    with a key >= its key (count_i) and the mass with a key > its key (above_i), read PAIR_STEP
    pairs a step as scalars, so every thread adds them in slot order. The k-th largest key is
    the largest key with count_i >= k; a candidate at or above it is kept by top-p iff above_i
    < p * Z_k (the bisection's rule: the masses above a candidate at or above the k-th key are
    all at or above it too). above_i only shrinks as key_i grows (the same terms in the same
    order, some zeroed, and rounding is monotone), so the kept set is every key at or above
    the smallest kept one. Three or four block reductions, against the ~50 dependent ones of
    the searches; the pass costs a few instructions per thread per candidate."""
    i = tl.arange(0, TINY)
    valid = i < num
    packed = tl.load(compact_ptr + i, mask=valid, other=0)
    x = tl.where(valid, _unpack_x(packed), float("-inf"))
    key = _key(x)
    e = tl.where(valid, tl.exp(x - m), 0.0)
    pairs = compact_ptr + TINY  # slots [TINY, 2 * TINY) of the row's COMPACT >= 2 * TINY
    tl.store(pairs + i, (key.to(tl.int64) << 32) | e.to(tl.int32, bitcast=True).to(tl.int64)
             & 0xFFFFFFFF)
    tl.debug_barrier()  # every pair lands before any thread reads it
    count = tl.zeros([TINY], tl.int32)
    above = tl.zeros([TINY], tl.float32)
    for first in range(0, num, PAIR_STEP):  # pairs up to num rounded up: all written
        for step in tl.static_range(PAIR_STEP):
            pair = tl.load(pairs + first + step)
            key_j = (pair >> 32).to(tl.int32)
            count += (key_j >= key).to(tl.int32)
            above += tl.where(key_j > key, pair.to(tl.int32).to(tl.float32, bitcast=True), 0.0)
    key_k = tl.zeros([1], tl.int32).sum(0) + KEY_MIN
    z_k = z
    if use_k:
        key_k = tl.max(tl.where(valid & (count >= k), key, KEY_MIN), 0)
        z_k = tl.sum(tl.where(key >= key_k, e, 0.0), 0)
    keep = valid & (key >= key_k)
    if use_p:
        keep = keep & (above < p * z_k)
    norm = tl.sum(tl.where(keep, e, 0.0), 0)
    covered = _covers_kept(num, tl.sum(e, 0), z, k, p, use_k)
    if covered:
        tl.store(out_row + _unpack_index(packed), tl.exp(x - m) / norm, mask=keep)
    return covered, norm


@triton.jit
def _prove_block(compact_ptr, num, out_row, m, z, k, p, use_k, use_p, COMPACT: tl.constexpr):
    """`_prove_and_scatter` on a block of COMPACT slots."""
    i = tl.arange(0, COMPACT)
    valid = i < num
    packed = tl.load(compact_ptr + i, mask=valid, other=0)
    x = tl.where(valid, _unpack_x(packed), float("-inf"))
    key_lo, norm, covered = _threshold(x, valid, m, z, k, p, use_k, use_p)
    proven = covered & (num <= COMPACT)
    if proven:
        keep = valid & (_key(x) >= key_lo)
        tl.store(out_row + _unpack_index(packed), tl.exp(x - m) / norm, mask=keep)
    return proven, norm


@triton.jit
def _select_kernel(
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out: 1.0 of greedy rows, kept values of SPARSE rows
    chunk_f32_ptr,  # [4, B * S] float32 (see _chunk_kernel)
    chunk_i32_ptr,  # [2, B * S] int32
    cand_ptr,  # [B * S, CAPACITY] int64
    compact_ptr,  # [B, COMPACT] int64 scratch
    row_f32_ptr,  # [3, B] float32 out: row max, normaliser (Z of FALLBACK rows), spread
    row_mode_ptr,  # [B] int64 out: RowMode
    ticket_ptr,  # [B] int32 out: zeroed, counts the split fallback's finished programs
    chunk_list_ptr,  # [B, CHUNKS_PAD] int32 scratch: a row's chunks that reach its floor
    V,
    NUM_CHUNKS,
    CHUNKS_PAD: tl.constexpr,
    CAPACITY: tl.constexpr,
    TILE: tl.constexpr,
    COMPACT: tl.constexpr,
    SMALL: tl.constexpr,
    TINY: tl.constexpr,
    LISTED: tl.constexpr,  # top-k floor rows compact only the chunks that reach it
    FLOOR_STEPS: tl.constexpr,  # bisection steps that refine the top-k floor
    PDL: tl.constexpr,  # launched overlapping the chunk kernel: wait for its results first
):
    if PDL:
        wait_for_prerequisites()
    _select_row(temperature_ptr, top_k_ptr, top_p_ptr, out_ptr, chunk_f32_ptr, chunk_i32_ptr,
                cand_ptr, compact_ptr, row_f32_ptr, row_mode_ptr, ticket_ptr, chunk_list_ptr,
                V, NUM_CHUNKS,
                tl.program_id(0).to(tl.int64), CHUNKS_PAD, CAPACITY, TILE, COMPACT, SMALL,
                TINY, LISTED, FLOOR_STEPS)
    if PDL:
        launch_dependents()  # once every row is done: the write kernel may start


@triton.jit
def _select_row(temperature_ptr, top_k_ptr, top_p_ptr, out_ptr, chunk_f32_ptr, chunk_i32_ptr,
                cand_ptr, compact_ptr, row_f32_ptr, row_mode_ptr, ticket_ptr, chunk_list_ptr,
                V, NUM_CHUNKS, row,
                CHUNKS_PAD: tl.constexpr, CAPACITY: tl.constexpr, TILE: tl.constexpr,
                COMPACT: tl.constexpr, SMALL: tl.constexpr, TINY: tl.constexpr,
                LISTED: tl.constexpr, FLOOR_STEPS: tl.constexpr):
    """The work of one row's program of `_select_kernel` (also run by `_single_kernel`):
    stores the row's RowMode, max, normaliser and spread, zeroes its ticket; returns the mode,
    the max and the normaliser."""
    num_rows = tl.num_programs(0).to(tl.int64)
    num_slots = num_rows * NUM_CHUNKS
    first_slot = row * NUM_CHUNKS
    chunks = tl.arange(0, CHUNKS_PAD)
    live = chunks < NUM_CHUNKS
    stats = chunk_f32_ptr + first_slot + chunks  # every load first: their latencies overlap
    chunk_max = tl.load(stats + CHUNK_MAX * num_slots, mask=live, other=float("-inf"))
    chunk_sum = tl.load(stats + CHUNK_SUM * num_slots, mask=live, other=0.0)
    means = tl.load(stats + CHUNK_MEAN * num_slots, mask=live, other=float("-inf"))
    floors = tl.load(stats + CHUNK_FLOOR * num_slots, mask=live, other=float("-inf"))
    counts = tl.load(chunk_i32_ptr + CHUNK_COUNT * num_slots + first_slot + chunks, mask=live,
                     other=0)
    t = tl.load(temperature_ptr + row)
    k = tl.load(top_k_ptr + row)
    p = tl.load(top_p_ptr + row)
    m = tl.max(chunk_max, 0)
    mode = tl.zeros([1], tl.int32).sum(0) + _GREEDY
    norm = tl.zeros([1], tl.float32).sum(0) + 1.0
    tl.store(ticket_ptr + row, 0)
    if t == 0.0:
        first = tl.min(tl.where(live & (chunk_max == m), chunks, NUM_CHUNKS - 1), 0)
        arg = tl.load(chunk_i32_ptr + CHUNK_ARGMAX * num_slots + first_slot + first)
        tl.store(out_ptr + row * V + arg, 1.0)
    else:
        z = tl.sum(tl.where(chunk_max > float("-inf"), chunk_sum * tl.exp(chunk_max - m), 0.0), 0)
        use_k = (k > 0) & (k < V)
        use_p = p < 1.0
        mode = tl.zeros([1], tl.int32).sum(0) + _DENSE
        norm = z
        has_mean = live & (means > float("-inf"))
        spread = m - tl.sum(tl.where(has_mean, means, 0.0), 0) / tl.maximum(
            tl.sum(has_mean.to(tl.float32), 0), 1.0)
        if use_k | use_p:
            floor = tl.max(floors, 0)  # every token >= it is stored
            top_k_floor = use_k & (k <= TINY)
            if top_k_floor:  # every token top-k keeps is >= the top-k floor too
                floor = tl.maximum(floor, _top_k_floor(chunk_max, floors, counts, m, spread, k,
                                                       FLOOR_STEPS))
            mode, norm = _select_sparse(chunk_i32_ptr, cand_ptr, compact_ptr + row * COMPACT,
                                        chunk_list_ptr + row * CHUNKS_PAD, out_ptr + row * V,
                                        num_slots, first_slot, NUM_CHUNKS, chunk_max, floor,
                                        top_k_floor, m, z, k, p, use_k, use_p, CHUNKS_PAD,
                                        CAPACITY, TILE, COMPACT, SMALL, TINY, LISTED)
        tl.store(row_f32_ptr + ROW_MAX * num_rows + row, m)
        tl.store(row_f32_ptr + ROW_NORM * num_rows + row, norm)
        tl.store(row_f32_ptr + ROW_SPREAD * num_rows + row, spread)
    tl.store(row_mode_ptr + row, mode.to(tl.int64))
    return mode, m, norm


@triton.jit
def _write_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out
    row_f32_ptr,  # [3, B] float32 (see _select_kernel)
    row_mode_ptr,  # [B] int64 in/out: FALLBACK rows no split pivot proves -> WHOLE_ROW
    split_i32_ptr,  # [B, W, NUM_SPLIT_PIVOTS] int32 scratch: counts at the split pivots
    split_f32_ptr,  # [B, W, NUM_SPLIT_PIVOTS] float32 scratch: masses at the split pivots
    compact_ptr,  # [B, COMPACT] int64 scratch: a FALLBACK row's candidates at its split pivot
    ticket_ptr,  # [B] int32: programs of the row done counting (zeroed by _select_kernel)
    row_val_ptr,  # [B, ROW_CAPACITY] float32 scratch of the whole-row kernel
    row_idx_ptr,  # [B, ROW_CAPACITY] int32 scratch of the whole-row kernel
    V,
    CHUNK: tl.constexpr,
    SUB: tl.constexpr,  # entries per step of the split count and gather, a divisor of CHUNK
    WRITE_PAD: tl.constexpr,
    COMPACT: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
    SMALL: tl.constexpr,
    REVERSE: tl.constexpr,  # a row's write chunks from the last to the first (reverse_write)
    PDL: tl.constexpr,  # launched overlapping the select kernel: wait for its results first
):
    """DENSE rows: exp(x - m) / Z over this program's CHUNK entries. FALLBACK rows: this
    program's counts at the split pivots; the row's last program to finish counting (atomic
    ticket, acquire-release) proves the row on a split pivot (`_split_finish`). Other rows
    were written by the chunk and select kernels: the program exits after one load. With
    REVERSE, program (row, j) takes write chunk W - 1 - j: the same work in another order,
    the one that re-reads first the logits the chunk kernel read last (programs start in the
    order of their ids, row fastest, in both kernels), the likeliest to be still in L2."""
    if PDL:
        wait_for_prerequisites()
    row = tl.program_id(0).to(tl.int64)
    chunk = tl.program_id(1)
    if REVERSE:
        chunk = tl.num_programs(1) - 1 - chunk
    num_rows = tl.num_programs(0).to(tl.int64)
    mode = tl.load(row_mode_ptr + row)
    if mode == _DENSE:
        _write_dense(logits_ptr + row * V, out_ptr + row * V, V, tl.load(temperature_ptr + row),
                     tl.load(row_f32_ptr + ROW_MAX * num_rows + row),
                     tl.load(row_f32_ptr + ROW_NORM * num_rows + row), chunk * CHUNK, CHUNK,
                     CHUNK)
    elif mode == _FALLBACK:
        t = tl.load(temperature_ptr + row)
        _split_count(logits_ptr + row * V, V, t, row_f32_ptr, num_rows, row, chunk,
                     split_i32_ptr, split_f32_ptr, CHUNK, SUB)
        tl.debug_barrier()  # every thread's counts precede the release below
        num_write = tl.num_programs(1)
        if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == num_write - 1:
            _split_finish(logits_ptr + row * V, out_ptr + row * V, V, t,
                          tl.load(top_k_ptr + row), tl.load(top_p_ptr + row), row_f32_ptr,
                          num_rows, row, row_mode_ptr, split_i32_ptr, split_f32_ptr,
                          compact_ptr + row * COMPACT, num_write,
                          row_val_ptr + row * ROW_CAPACITY, row_idx_ptr + row * ROW_CAPACITY,
                          SUB, WRITE_PAD, COMPACT, BLOCK, ROW_CAPACITY, SMALL)


@triton.jit
def _write_dense(row_ptr, out_row, V, t, m, norm, first, length, BLOCK: tl.constexpr):
    """exp(x - m) / norm over the row's entries [first, first + length), BLOCK at a time."""
    for start in range(first, first + length, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < V
        x = scaled_logits(row_ptr, offs, mask, t)
        tl.store(out_row + offs, tl.exp(x - m) / norm, mask=mask)


@triton.jit
def _single_kernel(
    logits_ptr,  # [B, V] float32 / bfloat16 / float16
    temperature_ptr,  # [B] float32
    top_k_ptr,  # [B] int32 / int64
    top_p_ptr,  # [B] float32
    out_ptr,  # [B, V] float32 out
    chunk_f32_ptr,  # [4, B * S] float32 (see _chunk_kernel)
    chunk_i32_ptr,  # [2, B * S] int32
    cand_ptr,  # [B * S, CAPACITY] int64
    compact_ptr,  # [B, COMPACT] int64 scratch
    row_f32_ptr,  # [3, B] float32 scratch (see _select_kernel)
    row_mode_ptr,  # [B] int64 out: RowMode
    ticket_ptr,  # [B] int32: zero before the launch; the row's last program zeroes it again
    chunk_list_ptr,  # [B, CHUNKS_PAD] int32 scratch (see _select_kernel)
    row_val_ptr,  # [B, ROW_CAPACITY] float32 scratch of the whole-row kernel
    row_idx_ptr,  # [B, ROW_CAPACITY] int32 scratch of the whole-row kernel
    V,
    NUM_CHUNKS,
    pivot_sigmas,
    wide_sigmas,
    wide_k,
    CHUNK: tl.constexpr,
    CAPACITY: tl.constexpr,
    KEEP_ALL: tl.constexpr,
    CHUNKS_PAD: tl.constexpr,
    SELECT_TILE: tl.constexpr,
    COMPACT: tl.constexpr,
    SUB: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_CAPACITY: tl.constexpr,
    SMALL: tl.constexpr,
    TINY: tl.constexpr,
    LISTED: tl.constexpr,
    HOIST: tl.constexpr,
    FTZ_SUM: tl.constexpr,
    EVICTION: tl.constexpr,
):
    """All three steps in one launch of (row, chunk) programs (small batches): the chunk work,
    then the row's last program to finish it (atomic ticket, acquire-release) selects the row
    (`_select_row`) and writes what the write kernel would: a DENSE row over all V entries,
    a FALLBACK row counted at the split pivots over the whole row (`_serial_finish`)."""
    row = tl.program_id(0).to(tl.int64)
    _chunk_work(logits_ptr, temperature_ptr, top_k_ptr, top_p_ptr, out_ptr, chunk_f32_ptr,
                chunk_i32_ptr, cand_ptr, V, NUM_CHUNKS, pivot_sigmas, wide_sigmas, wide_k, row,
                tl.program_id(1), CHUNK, CAPACITY, KEEP_ALL, HOIST, FTZ_SUM, EVICTION,
                False)  # IEEE division: the reciprocal made B = 1 slower on the H200
    tl.debug_barrier()  # every thread's stores precede the release below
    if tl.atomic_add(ticket_ptr + row, 1, sem="acq_rel") == NUM_CHUNKS - 1:
        mode, m, norm = _select_row(temperature_ptr, top_k_ptr, top_p_ptr, out_ptr,
                                    chunk_f32_ptr, chunk_i32_ptr, cand_ptr,
                                    compact_ptr, row_f32_ptr, row_mode_ptr,
                                    ticket_ptr, chunk_list_ptr, V, NUM_CHUNKS, row,
                                    CHUNKS_PAD, CAPACITY,
                                    SELECT_TILE, COMPACT, SMALL, TINY, LISTED,
                                    0)  # the top-k floor at its level: not measured refined
        t = tl.load(temperature_ptr + row)
        if mode == _DENSE:
            _write_dense(logits_ptr + row * V, out_ptr + row * V, V, t, m, norm, 0, V, BLOCK)
        elif mode == _FALLBACK:
            tl.debug_barrier()  # the row statistics land before other threads read them
            _serial_finish(logits_ptr + row * V, out_ptr + row * V, V, t,
                           tl.load(top_k_ptr + row), tl.load(top_p_ptr + row), row_f32_ptr,
                           tl.num_programs(0).to(tl.int64), row, row_mode_ptr,
                           compact_ptr + row * COMPACT, row_val_ptr + row * ROW_CAPACITY,
                           row_idx_ptr + row * ROW_CAPACITY, SUB, COMPACT, BLOCK, ROW_CAPACITY,
                           SMALL)


@triton.jit
def _split_pivots(row_f32_ptr, num_rows, row):
    """[NUM_SPLIT_PIVOTS] pivots m - spread * 2**((j - SPLIT_PIVOT_ZERO) / 4), spread = m - the
    mean of the chunks' finite means: nonincreasing in j, never below -FLT_MAX (-inf logits
    never count); NaN (nothing counts, the whole-row kernel decides) if m is not finite."""
    m = tl.load(row_f32_ptr + ROW_MAX * num_rows + row)
    spread = tl.load(row_f32_ptr + ROW_SPREAD * num_rows + row)
    j = tl.arange(0, NUM_SPLIT_PIVOTS)
    drop = spread * tl.exp2((j - SPLIT_PIVOT_ZERO).to(tl.float32) * 0.25)
    return tl.maximum(m - drop, -FLT_MAX), m


@triton.jit
def _pivot_counts(row_ptr, V, t, pivots, m, first, length, SUB: tl.constexpr):
    """([P] counts, [P] masses exp(x - m)) of the x >= each pivot among the row's entries
    [first, first + length), SUB at a time."""
    counts = tl.zeros([NUM_SPLIT_PIVOTS], tl.int32)
    masses = tl.zeros([NUM_SPLIT_PIVOTS], tl.float32)
    for start in range(first, first + length, SUB):
        offs = start + tl.arange(0, SUB)
        in_row = offs < V
        x = scaled_logits(row_ptr, offs, in_row, t)
        at_least = (x[:, None] >= pivots[None, :]) & in_row[:, None]  # [SUB, P]
        counts += tl.sum(at_least.to(tl.int32), 0)
        masses += tl.sum(tl.where(at_least, tl.exp(x - m)[:, None], 0.0), 0)
    return counts, masses


@triton.jit
def _split_count(row_ptr, V, t, row_f32_ptr, num_rows, row, chunk, split_i32_ptr,
                 split_f32_ptr, CHUNK: tl.constexpr, SUB: tl.constexpr):
    """Counts and masses exp(x - m) of this program's x >= each split pivot, stored per
    (row, program): summed later in a fixed order, so the pick does not depend on timing."""
    pivots, m = _split_pivots(row_f32_ptr, num_rows, row)
    counts, masses = _pivot_counts(row_ptr, V, t, pivots, m, chunk * CHUNK, CHUNK, SUB)
    slot = (row * tl.num_programs(1) + chunk) * NUM_SPLIT_PIVOTS + tl.arange(0, NUM_SPLIT_PIVOTS)
    tl.store(split_i32_ptr + slot, counts)
    tl.store(split_f32_ptr + slot, masses)


@triton.jit
def _best_pivot(row_counts, row_masses, z, k, p, use_k):
    """(best pivot index, candidates at it in the row): the highest split pivot holding every
    kept token (count >= k; top-p only: mass >= (p + MASS_MARGIN) * Z); best =
    NUM_SPLIT_PIVOTS if none does."""
    j = tl.arange(0, NUM_SPLIT_PIVOTS)
    covers = tl.where(use_k, row_counts >= k, row_masses >= (p + MASS_MARGIN) * z)
    best = tl.min(tl.where(covers, j, NUM_SPLIT_PIVOTS), 0)
    return best, tl.sum(tl.where(j == best, row_counts, 0), 0)


@triton.jit
def _split_pick(split_i32_ptr, split_f32_ptr, row, NUM_WRITE, z, k, p, use_k,
                WRITE_PAD: tl.constexpr):
    """`_best_pivot` of the W programs' counts, summed in one fixed order."""
    w = tl.arange(0, WRITE_PAD)
    j = tl.arange(0, NUM_SPLIT_PIVOTS)
    slot = (row * NUM_WRITE + w[:, None]) * NUM_SPLIT_PIVOTS + j[None, :]
    live = (w < NUM_WRITE)[:, None] & (j < NUM_SPLIT_PIVOTS)[None, :]
    counts = tl.load(split_i32_ptr + slot, mask=live, other=0)  # [W, P]
    masses = tl.load(split_f32_ptr + slot, mask=live, other=0.0)
    return _best_pivot(tl.sum(counts, 0), tl.sum(masses, 0), z, k, p, use_k)


@triton.jit
def _split_gather(row_ptr, V, t, pivot, dst_ptr, SUB: tl.constexpr, COMPACT: tl.constexpr):
    """Store the row's x >= pivot (packed with the index) at dst_ptr[0:COMPACT], vocabulary
    order (the caller has counted that they fit)."""
    base = tl.zeros([1], tl.int32).sum(0)
    for start in range(0, V, SUB):
        x, offs, take, pos, base = take_at_least(row_ptr, V, t, start, pivot, base, SUB)
        tl.store(dst_ptr + pos, _pack(x, offs), mask=take & (pos < COMPACT))


@triton.jit
def _split_finish(row_ptr, out_row, V, t, k, p, row_f32_ptr, num_rows, row, row_mode_ptr,
                  split_i32_ptr, split_f32_ptr, compact_row, num_write, row_val, row_idx,
                  SUB: tl.constexpr, WRITE_PAD: tl.constexpr, COMPACT: tl.constexpr,
                  BLOCK: tl.constexpr, ROW_CAPACITY: tl.constexpr, SMALL: tl.constexpr):
    """A FALLBACK row, in one program once every program of the row has counted: pick the
    split pivot on the stored counts and prove the row on it (`_split_prove`)."""
    z = tl.load(row_f32_ptr + ROW_NORM * num_rows + row)
    pivots, m = _split_pivots(row_f32_ptr, num_rows, row)
    best, total = _split_pick(split_i32_ptr, split_f32_ptr, row, num_write, z, k, p,
                              (k > 0) & (k < V), WRITE_PAD)
    _split_prove(row_ptr, out_row, V, t, k, p, z, pivots, m, best, total, row_mode_ptr, row,
                 compact_row, row_val, row_idx, SUB, COMPACT, BLOCK, ROW_CAPACITY, SMALL)


@triton.jit
def _serial_finish(row_ptr, out_row, V, t, k, p, row_f32_ptr, num_rows, row, row_mode_ptr,
                   compact_row, row_val, row_idx, SUB: tl.constexpr, COMPACT: tl.constexpr,
                   BLOCK: tl.constexpr, ROW_CAPACITY: tl.constexpr, SMALL: tl.constexpr):
    """A FALLBACK row of the single launch, in one program: count the whole row at the split
    pivots (one pass), then pick and prove as `_split_finish` does."""
    z = tl.load(row_f32_ptr + ROW_NORM * num_rows + row)
    pivots, m = _split_pivots(row_f32_ptr, num_rows, row)
    counts, masses = _pivot_counts(row_ptr, V, t, pivots, m, 0, V, SUB)
    best, total = _best_pivot(counts, masses, z, k, p, (k > 0) & (k < V))
    _split_prove(row_ptr, out_row, V, t, k, p, z, pivots, m, best, total, row_mode_ptr, row,
                 compact_row, row_val, row_idx, SUB, COMPACT, BLOCK, ROW_CAPACITY, SMALL)


@triton.jit
def _split_prove(row_ptr, out_row, V, t, k, p, z, pivots, m, best, total, row_mode_ptr, row,
                 compact_row, row_val, row_idx, SUB: tl.constexpr, COMPACT: tl.constexpr,
                 BLOCK: tl.constexpr, ROW_CAPACITY: tl.constexpr, SMALL: tl.constexpr):
    """Gather the row's candidates at split pivot `best` (`total` of them), prove the cut on
    them and scatter; a row no pivot proves within COMPACT candidates runs the whole-row
    kernel (WHOLE_ROW)."""
    use_k = (k > 0) & (k < V)
    proven = (best < NUM_SPLIT_PIVOTS) & (total <= COMPACT)
    if proven:
        pivot = tl.sum(tl.where(tl.arange(0, NUM_SPLIT_PIVOTS) == best, pivots, 0.0), 0)
        _split_gather(row_ptr, V, t, pivot, compact_row, SUB, COMPACT)
        tl.debug_barrier()  # the gathered candidates land before other threads read them
        proven, norm = _prove_and_scatter(compact_row, total, out_row, m, z, k, p, use_k,
                                          p < 1.0, COMPACT, SMALL, 0)
    if proven == 0:
        write_row(row_ptr, out_row, V, t, k, p, row_val, row_idx, BLOCK, ROW_CAPACITY)
        tl.store(row_mode_ptr + row, tl.zeros([1], tl.int64).sum(0) + _WHOLE_ROW)


def _scratch(dtype, device, *shapes) -> tuple[torch.Tensor, ...]:
    """Views of one uninitialised allocation, one per shape, each SCRATCH_ALIGN-aligned."""
    sizes = [math.prod(shape) for shape in shapes]
    padded = [-(-size // SCRATCH_ALIGN) * SCRATCH_ALIGN for size in sizes]
    parts = torch.empty(sum(padded), dtype=dtype, device=device).split(padded)
    return tuple(part[:size].view(shape) for part, size, shape in zip(parts, sizes, shapes))


def wide_k_limit(num_chunks: int, capacity: int) -> int:
    """Rows with top-k above this aim at the wide candidate share (see WIDE_K_MARGIN)."""
    return num_chunks * capacity // (QUICK_FLOOR_SHARE * WIDE_K_MARGIN)


@dataclass(frozen=True, eq=False)  # one object per shape (launch_plan): identity is equality
class LaunchPlan:
    """Everything about a call that depends only on (config, B, V): grids, scratch shapes and
    the three kernels' constexprs. Computed once per shape (`launch_plan`), so an eager call
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
        (logits, temperature, top_k, top_p, out, chunk_f32, row_f32, row_val, split_f32,
         chunk_i32, row_idx, split_i32, ticket, chunk_list, cand, compact, row_mode) = buffers
        vocab, num_chunks = self.vocab, self.num_chunks
        if self.single:
            return ((logits, temperature, top_k, top_p, out, chunk_f32, chunk_i32, cand, compact,
                     row_f32, row_mode, ticket, chunk_list, row_val, row_idx, vocab, num_chunks,
                     self.pivot_sigmas, self.wide_sigmas, self.wide_k),)
        return ((logits, temperature, top_k, top_p, out, chunk_f32, chunk_i32, cand, vocab,
                 num_chunks, self.pivot_sigmas, self.wide_sigmas, self.wide_k),
                (temperature, top_k, top_p, out, chunk_f32, chunk_i32, cand, compact, row_f32,
                 row_mode, ticket, chunk_list, vocab, num_chunks),
                (logits, temperature, top_k, top_p, out, row_f32, row_mode, split_i32, split_f32,
                 compact, ticket, row_val, row_idx, vocab))

    @property
    def f32_shapes(self):  # chunk stats, row stats, whole-row values, split masses
        return ((4, self.num_rows * self.num_chunks), (3, self.num_rows),
                (self.num_rows, self.config.candidate_capacity), self.split_shape)

    @property
    def i32_shapes(self):  # chunk argmax / count, whole-row indices, split counts, tickets,
        # each row's chunks that reach its floor (the select kernel's list)
        return ((2, self.num_rows * self.num_chunks),
                (self.num_rows, self.config.candidate_capacity), self.split_shape,
                (self.num_rows,), (self.num_rows, triton.next_power_of_2(self.num_chunks)))

    @property
    def i64_shapes(self):  # chunk candidates, per-row compact buffer, row modes
        return ((self.num_rows * self.num_chunks, self.capacity),
                (self.num_rows, self.config.compact), (self.num_rows,))

    @property
    def split_shape(self):
        return (self.num_rows, self.num_write, NUM_SPLIT_PIVOTS.value)


def register_cap(config: KernelConfig) -> tuple[tuple[str, int], ...]:
    """Compile options of the write kernel's register cap (none if `write_registers` is 0)."""
    return (("maxnreg", config.write_registers),) if config.write_registers else ()


@functools.lru_cache(maxsize=256)
def launch_plan(config: KernelConfig, num_rows: int, vocab: int,
                overlap: bool = False, native: bool = False) -> LaunchPlan:
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
    work_options = (("HOIST", config.hoist_loads), ("FTZ_SUM", config.ftz_sum and native),
                    ("EVICTION", "evict_last" if config.keep_in_l2 else ""))
    chunk_constexprs = (*work_constexprs, *work_options,
                        ("RECIPROCAL", config.reciprocal_division), ("PDL", select_pdl))
    chunks_pad = triton.next_power_of_2(num_chunks)
    sub = min(SPLIT_SUB, config.write_chunk)  # divides the write chunk
    select_tile = max(config.select_block // capacity, 1)  # chunks per compaction step
    single = num_rows * vocab <= config.single_launch_entries
    select_constexprs = (("CHUNKS_PAD", chunks_pad), ("CAPACITY", capacity),
                         ("TILE", select_tile), ("COMPACT", config.compact),
                         ("SMALL", config.small_compact), ("TINY", config.tiny_compact),
                         ("LISTED", config.chunk_list),
                         ("FLOOR_STEPS", config.top_k_floor_steps), ("PDL", select_pdl))
    write_constexprs = (("CHUNK", config.write_chunk), ("SUB", sub),
                        ("WRITE_PAD", triton.next_power_of_2(num_write)),
                        ("COMPACT", config.compact), ("BLOCK", config.block),
                        ("ROW_CAPACITY", config.candidate_capacity),
                        ("SMALL", config.small_compact), ("REVERSE", config.reverse_write),
                        ("PDL", write_pdl))
    single_constexprs = (*work_constexprs, ("CHUNKS_PAD", chunks_pad),
                         ("SELECT_TILE", select_tile), ("COMPACT", config.compact),
                         ("SUB", sub), ("BLOCK", config.block),
                         ("ROW_CAPACITY", config.candidate_capacity),
                         ("SMALL", config.small_compact), ("TINY", config.tiny_compact),
                         ("LISTED", config.chunk_list), *work_options)
    if single:
        launches = (KernelLaunch(_single_kernel, (num_rows, num_chunks, 1), single_constexprs,
                                 config.single_warps),)
    else:
        launches = (KernelLaunch(_chunk_kernel, (num_rows, num_chunks, 1), chunk_constexprs,
                                 config.chunk_warps),
                    KernelLaunch(_select_kernel, (num_rows, 1, 1), select_constexprs,
                                 config.select_warps, overlap_options(select_pdl)),
                    KernelLaunch(_write_kernel, (num_rows, num_write, 1), write_constexprs,
                                 NUM_WARPS, overlap_options(write_pdl) + register_cap(config)))
    return LaunchPlan(
        num_rows=num_rows, vocab=vocab, chunk=chunk, capacity=capacity, num_chunks=num_chunks,
        num_write=num_write, pivot_sigmas=config.pivot_sigmas(chunk),
        wide_sigmas=config.pivot_sigmas(chunk, config.wide_share),
        wide_k=wide_k_limit(num_chunks, capacity), config=config,
        chunk_constexprs=chunk_constexprs, select_constexprs=select_constexprs,
        write_constexprs=write_constexprs, single=single, single_constexprs=single_constexprs,
        launches=launches, serial_in_capture=write_pdl and not select_pdl and not single)


@functools.lru_cache(maxsize=256)
def device_plan(config: KernelConfig, num_rows: int, vocab: int,
                device: torch.device) -> LaunchPlan:
    """`launch_plan` of a call on `device`, with the device's overlap support and whether
    Triton compiles for it read once per (config, shape, device): an eager call pays one cache
    lookup. Triton itself fixes whether it interprets when the kernels are defined."""
    return launch_plan(config, num_rows, vocab, supports_overlap(device),
                       compiles_natively(device))


# A call's buffers in the order `LaunchPlan.arguments` takes them: the caller's four inputs,
# the output, then the scratch of `_make_scratch` (float32, int32 and int64 views in turn).
BUFFERS = ("logits", "temperature", "top_k", "top_p", "out", "chunk_f32", "row_f32", "row_val",
           "split_f32", "chunk_i32", "row_idx", "split_i32", "ticket", "chunk_list", "cand",
           "compact", "row_mode")


def _make_scratch(plan: LaunchPlan, device) -> tuple[torch.Tensor, ...]:
    """The scratch of one call: three allocations (one per dtype), 12 views. The single
    launch's tickets start at zero (each call leaves them at zero again)."""
    scratch = (*_scratch(torch.float32, device, *plan.f32_shapes),
               *_scratch(torch.int32, device, *plan.i32_shapes),
               *_scratch(torch.int64, device, *plan.i64_shapes))
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
    return (plan, logits.device, logits.dtype, top_k.dtype, logits_at % 16 == 0,
            temperature_at % 16 == 0, top_k_at % 16 == 0, top_p_at % 16 == 0)


def _launch(logits, temperature, top_k, top_p, plan: LaunchPlan, out, scratch: Scratch,
            stream: int | None) -> None:
    """Enqueue the call's kernels on `stream` (no host read, no allocation). A plan whose write
    kernel overlaps only eagerly launches it serially while the current stream is captured
    (one query of the CUDA runtime); results do not depend on how it is launched."""
    inputs = (logits.data_ptr(), temperature.data_ptr(), top_k.data_ptr(), top_p.data_ptr())
    serial = plan.serial_in_capture and torch.cuda.is_current_stream_capturing()
    LAUNCHES.launch(specialisation_key(plan, logits, top_k, inputs), plan.launches,
                    plan.arguments, (logits, temperature, top_k, top_p, out, *scratch.tensors),
                    (*inputs, out.data_ptr(), *scratch.pointers), stream, serial)


def run_probabilities(logits, temperature, top_k, top_p,
                      config: KernelConfig = DEFAULT_CONFIG) -> KernelOutput:
    """Launch the kernels on fresh scratch; arguments were validated by the caller
    (`batched_probabilities`). The row modes are returned, so they are not shared."""
    plan = device_plan(config, *logits.shape, logits.device)
    out = torch.empty_like(logits, dtype=torch.float32)  # contiguous: logits are (checked)
    scratch = Scratch.of(_make_scratch(plan, logits.device))
    if plan.num_rows > 0:
        _launch(logits, temperature, top_k, top_p, plan, out, scratch,
                current_stream(logits.device))
    return KernelOutput(out, scratch.tensors[-1])


def probabilities_triton(logits, temperature, top_k, top_p, *,
                         config: KernelConfig = DEFAULT_CONFIG) -> torch.Tensor:
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
