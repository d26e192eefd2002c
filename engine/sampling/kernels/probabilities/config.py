"""The probabilities kernels' tuning and layout: `KernelConfig` (whose defaults are the shipped
configuration, `DEFAULT_CONFIG`), the named configurations the benchmarks and GPU tests use,
`RowMode`, and the constants the stages share (scratch planes, pivot levels, key bounds).

What each field does: docs/sampling.md, "The Triton kernel of batched_probabilities"; the
measurements behind each default: docs/notes/performance-notebook.md.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from statistics import NormalDist

import triton
import triton.language as tl


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
CHUNK_MAX, CHUNK_SUM, CHUNK_FLOOR, CHUNK_MEAN = (tl.constexpr(0), tl.constexpr(1), tl.constexpr(2), tl.constexpr(3))
CHUNK_ARGMAX, CHUNK_COUNT = tl.constexpr(0), tl.constexpr(1)
ROW_MAX, ROW_NORM, ROW_SPREAD = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)

# Batches of at most SINGLE_LAUNCH_ENTRIES logits (B * V) take one launch (`_single_kernel`).
# On the H200 (benchmarks/sampling_small.py, docs/notes/performance-notebook.md) its host enqueue is ~15-28 us
# against ~25-49 us for the three launches (`CompiledLaunch.enqueue`; 55-100 us through
# Triton's runner), but its device time grows with B * V (the row's select and a DENSE row's
# V values run in one program). Captured in a CUDA Graph (as decode
# rounds are) only the device time counts: there it is within 2 us of the three launches for
# truncating rows at V = 32,000 up to B = 4, but 5.5 us slower for a DENSE row at B = 1 and
# 39 us slower at V = 152,064. 2**17 (B <= 4 at V = 32,000, B <= 2 at 49,152, never at
# 152,064) keeps the eager gain where a captured round loses at most a few microseconds.
SINGLE_LAUNCH_ENTRIES = 2**17
TOP_K_FLOOR_STEPS = 3  # bisection steps of the top-k floor (see the notes after the class)


@dataclass(frozen=True)
class KernelConfig:
    """Tuning of the kernel. Every field is a power of two; results do not depend on it except
    through which rows take the (equally exact) whole-row fallback. The defaults are the shipped
    configuration (`DEFAULT_CONFIG`; why each: the notes above it); `BASELINE_CONFIG` is the one
    they replaced."""

    chunk: int = 512  # vocabulary entries per program (doubled for very large vocabularies)
    chunk_capacity: int = 32  # candidate slots per chunk
    max_candidates: int = 16384  # candidate slots per row: padded chunks * capacity
    chunk_warps: int = 1  # warps per program of the chunk kernel
    compact: int = 4096  # select kernel's register block: a row's candidates with x >= F
    select_block: int = 2048  # candidate slots per step of the select kernel's compaction
    # (at least one chunk's)
    select_warps: int = 8  # warps per program of the select kernel
    write_chunk: int = 8192  # vocabulary entries per program of the write kernel
    block: int = 2048  # vocabulary step of the whole-row fallback
    candidate_capacity: int = 2048  # scratch slots per row of the whole-row fallback
    wide_share: int = 2  # rows with k > wide_k_limit aim at chunk_capacity / wide_share tokens
    # batches of at most this many logits (B * V) take one launch (0: never)
    single_launch_entries: int = SINGLE_LAUNCH_ENTRIES
    # warps per program of the single launch: its last program per row runs the select
    # kernel's work (select_warps: a COMPACT block in registers) and the whole-row kernel
    # (the write kernel's NUM_WARPS); fewer make them spill registers
    single_warps: int = 8
    # rows with at most this many candidates >= F search a block of this size instead of
    # `compact` (0: never); a power of two below `compact`
    small_compact: int = 2048
    # rows with at most this many candidates >= the row floor find the cut without a search
    # (`_prove_tiny`: one pass, each candidate against all); 0: never. A power of two below
    # `small_compact` (or `compact`); fastest at one candidate per thread (select_warps * 32)
    tiny_compact: int = 256
    # programmatic dependent launch of the select and write kernels, where the device and
    # Triton support it (`launch_overlap.supports_overlap`): each is enqueued while the kernel
    # before it still runs and waits on the device for that kernel's results. Off by default:
    # on the H200 it made CUDA Graph replays 2-4 us slower at B >= 16 (docs/notes/performance-notebook.md)
    overlap_launches: bool = False
    # programmatic dependent launch of the write kernel alone, in eager calls (where the device
    # supports it): it is enqueued while the select kernel runs, its programs start as the
    # select kernel's finish, and it waits on the device for the select kernel's results. A call
    # being captured in a CUDA Graph launches it serially (`serial_in_capture`): on the H200 the
    # overlap cut back-to-back eager calls by ~1 us at B = 64, V = 152,064 and made graph
    # replays 0.2-2.4 us slower (docs/notes/performance-notebook.md)
    overlap_write: bool = True
    # top-k rows whose floor is the top-k floor (k <= tiny_compact) compact the candidates of
    # only the chunks whose max reaches it (`_compact_listed`), listed first in a per-row
    # scratch: the same candidates in fewer steps. On the H200 it cut the select kernel for
    # top-k 50 but made it slower for rows with top-p alone (docs/notes/performance-notebook.md)
    chunk_list: bool = True
    # register cap per thread of the write kernel (ptxas `maxnreg`; 0: the compiler's choice).
    # Its rare whole-row and split-fallback paths set its register count, and with it how many
    # of its programs an SM holds at once, while most of its programs only read a row mode
    write_registers: int = 64
    # the chunk kernel loads a row's k and p with its T and logits, so their latencies overlap,
    # instead of after the chunk sum (`_chunk_work`); results do not depend on it
    hoist_loads: bool = True
    # on CUDA the chunk sums take exp as one ex2.approx.ftz per entry (`_exp_sum`): terms below
    # 2**-126 count as 0, which a sum >= 1 absorbs in rounding; the interpreter keeps tl.exp
    ftz_sum: bool = True
    # the chunk kernel stores its statistics and candidates with the evict-last L2 policy, so
    # that the logits and zeros it streams evict them last (the select kernel reads them next)
    keep_in_l2: bool = True
    # the chunk kernel computes x = logits / T as RN(x * RN(1 / T)) with one FMA correction
    # (`scaled_logits`): the IEEE quotient, bit for bit, in three instructions per entry instead
    # of about ten; blocks of x it is not proved for divide as before. The write kernel keeps
    # IEEE division (its 8-warp blocks' range check cost more than it saved on the H200), and
    # so does the single launch (with it, graph replays at B = 1, V = 32,000 took 2.5-5.8 us more)
    reciprocal_division: bool = True
    # the write kernel takes a row's write chunks from the last to the first, the order that
    # meets first the logits the chunk kernel read last (a DENSE row re-reads them); results do
    # not depend on it
    reverse_write: bool = True
    # bisection steps that raise the select kernel's top-k floor (`_top_k_floor`) from its
    # pivot level towards the highest value the chunk statistics prove k tokens reach (0: the
    # level itself): fewer candidates, and fewer chunks to compact, at the floor. The single
    # launch keeps the level (its time with the refinement was not measured)
    top_k_floor_steps: int = TOP_K_FLOOR_STEPS

    def __post_init__(self):
        for name in (
            "chunk",
            "chunk_capacity",
            "max_candidates",
            "chunk_warps",
            "compact",
            "select_block",
            "select_warps",
            "write_chunk",
            "block",
            "candidate_capacity",
            "wide_share",
            "single_warps",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"KernelConfig.{name}={value!r} must be a power of two")
        steps = self.top_k_floor_steps
        if not isinstance(steps, int) or not 0 <= steps <= MAX_TOP_K_FLOOR_STEPS:
            raise ValueError(
                f"KernelConfig.top_k_floor_steps={steps!r} must be an integer in [0, {MAX_TOP_K_FLOOR_STEPS}]"
            )
        if not isinstance(self.single_launch_entries, int) or self.single_launch_entries < 0:
            raise ValueError(
                f"KernelConfig.single_launch_entries={self.single_launch_entries!r} must be an integer >= 0"
            )
        for name in (
            "overlap_launches",
            "overlap_write",
            "chunk_list",
            "hoist_loads",
            "ftz_sum",
            "keep_in_l2",
            "reciprocal_division",
            "reverse_write",
        ):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"KernelConfig.{name}={getattr(self, name)!r} must be True or False")
        small = self.small_compact
        if not isinstance(small, int) or small < 0 or small and (small & (small - 1) or small >= self.compact):
            raise ValueError(
                f"KernelConfig.small_compact={self.small_compact!r} must be 0 or a "
                f"power of two below compact ({self.compact})"
            )
        if (
            not isinstance(self.write_registers, int)
            or self.write_registers
            and not (MIN_REGISTERS <= self.write_registers <= MAX_REGISTERS)
        ):
            raise ValueError(
                f"KernelConfig.write_registers={self.write_registers!r} must be 0 "
                f"or an integer in [{MIN_REGISTERS}, {MAX_REGISTERS}]"
            )
        tiny = self.tiny_compact
        if not isinstance(tiny, int) or tiny < 0 or tiny and (tiny & (tiny - 1) or tiny >= (small or self.compact)):
            raise ValueError(
                f"KernelConfig.tiny_compact={self.tiny_compact!r} must be 0 or a "
                f"power of two below small_compact, or compact if that is 0 "
                f"({small or self.compact})"
            )
        if not self.chunk_capacity <= min(self.chunk, self.max_candidates):
            raise ValueError(
                f"KernelConfig.chunk_capacity={self.chunk_capacity} must be <= "
                f"chunk ({self.chunk}) and max_candidates ({self.max_candidates})"
            )
        # hashed once: every eager call looks its plan up by config (`device_plan`), and the
        # generated hash rebuilds a tuple of all the fields each time (3.4 us against 0.1 on
        # the host of docs/notes/performance-notebook.md's H200 measurement)
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
        while triton.next_power_of_2(triton.cdiv(vocab, chunk)) * self.chunk_capacity > self.max_candidates:
            chunk *= 2
        return chunk

    def pivot_sigmas(self, chunk: int, share: int = QUICK_FLOOR_SHARE) -> float:
        """z of the quick floor mean + z * std: a normal chunk has CAPACITY / share tokens above."""
        return NormalDist().inv_cdf(1.0 - self.chunk_capacity / (share * chunk))


# The shipped configuration is `KernelConfig()`: the class defaults, each measured against
# BASELINE_CONFIG (the earlier defaults) as noted here.
#
# chunk=512, chunk_capacity=32, chunk_warps=1, write_chunk=8192: one-warp 512-entry chunk
# programs with 8,192-entry write programs. On the H200 their
# three kernels took 197 us of device time at B=256, V=152,064, top-k 50 + top-p 0.9 (2.7x the
# floor; BASELINE_CONFIG took 304 us), and 171 us (2.33x) with the tiled
# compaction and small block. See docs/notes/performance-notebook.md.
#
# small_compact=2048: rows with at most 2,048 candidates >= F bisect a 2,048-slot block. On the
# H200 (docs/notes/performance-notebook.md, "The select kernel") that cut the select kernel by 3.7 us at B = 1
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
# rare fallback paths spill more; docs/notes/performance-notebook.md, "The write kernel at 64 registers").
#
# chunk_list=True: a top-k row at its top-k floor compacts only the chunks whose max reaches it
# (50-111 of 297, median 67, at k = 50 in `python3 -m benchmarks.top_k_floor_model`). On the
# H200 at V = 152,064 (top-k 50 + top-p 0.9) the select kernel went 11.5 -> 7.1 us at B = 1,
# 12.2 -> 9.8 at B = 16 and 20.5 -> 16.8 at B = 256, but rows with top-p alone, which never
# take the list, went 16.7 -> 17.8 us at B = 1 and 21.4 -> 24.3 at B = 64: the kernel with
# both compactions is slower on them (docs/notes/performance-notebook.md).
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
# without truncation (no candidates) within 0.5 us (docs/notes/performance-notebook.md).
#
# reciprocal_division=True: the chunk kernel's x / T by the row's reciprocal and one FMA
# correction, the IEEE quotient bit for bit; on the H200 at V = 152,064, B = 64 the chunk kernel
# went 23.8 -> 23.5 us (top-k 50 + top-p 0.9) and 15.4 -> 14.7 (no truncation).
#
# reverse_write=True: a DENSE row's write programs re-read its logits; in the forward order they
# start with the chunks the chunk kernel read first, the ones the L2 evicted first. On the H200
# at V = 152,064 the write kernel went 21.7 -> 18.5 us at B = 64 without truncation (graph time
# 41.5 -> 37.1), 8.1 -> 6.7 at B = 16 and 81.1 -> 78.9 at B = 256; truncating rows, whose write
# programs only read a row mode, within 0.3 us (docs/notes/performance-notebook.md).
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
# unchanged (docs/notes/performance-notebook.md).
#
# overlap_write=True: in eager calls the write kernel is enqueued with programmatic dependent
# launch, so its launch and the start of its programs overlap the select kernel's end (the
# select kernel triggers it by finishing: it is launched as before). On the H200 at V = 152,064,
# B = 64, back-to-back eager calls went 40.4-40.6 -> 39.2-39.5 us without truncation and
# 39.2-39.4 -> 37.5-38.3 with top-k 50 + top-p 0.9 (medians of four calls); a call captured in a
# CUDA Graph launches it serially (replays within 0.2 us of serial launches at B = 16-64), since
# replays with the overlap captured were 0.2-2.4 us slower (docs/notes/performance-notebook.md).
#
# single_launch_entries=SINGLE_LAUNCH_ENTRIES: small batches take one launch (see the
# constant, above the class).
DEFAULT_CONFIG = KernelConfig()
# The defaults before the shipped ones (four-warp 2,048-entry chunk programs, nothing of the
# notes above): the configuration that the CPU tests built their small configurations on, and
# the third of CANDIDATE_CONFIGS.
BASELINE_CONFIG = KernelConfig(
    chunk=2048,
    chunk_capacity=128,
    chunk_warps=4,
    write_chunk=2048,
    single_launch_entries=0,
    small_compact=0,
    tiny_compact=0,
    write_registers=0,
    chunk_list=False,
    hoist_loads=False,
    ftz_sum=False,
    keep_in_l2=False,
    reciprocal_division=False,
    reverse_write=False,
    top_k_floor_steps=0,
    overlap_write=False,
)
# Configurations the benchmark sweeps and the GPU tests check (the default first; new ones go
# last, since `benchmarks.sampling --config N` and docs/notes/performance-notebook.md name them by index).
CANDIDATE_CONFIGS = (
    DEFAULT_CONFIG,
    dataclasses.replace(BASELINE_CONFIG, chunk=512, chunk_capacity=32, chunk_warps=1, compact=2048, write_chunk=8192),
    BASELINE_CONFIG,
    dataclasses.replace(BASELINE_CONFIG, chunk=1024, chunk_capacity=64, chunk_warps=2, write_chunk=8192),
    dataclasses.replace(BASELINE_CONFIG, write_chunk=8192),
    dataclasses.replace(BASELINE_CONFIG, compact=2048),
    dataclasses.replace(DEFAULT_CONFIG, small_compact=0, tiny_compact=0),  # appended: indices
    dataclasses.replace(DEFAULT_CONFIG, tiny_compact=0),  # name configs
    dataclasses.replace(DEFAULT_CONFIG, write_registers=0),
)
# Single-launch configurations the small-batch benchmark compares and the GPU tests check.
SINGLE_LAUNCH_CONFIGS = (
    DEFAULT_CONFIG,
    dataclasses.replace(BASELINE_CONFIG, single_launch_entries=SINGLE_LAUNCH_ENTRIES),
)


def wide_k_limit(num_chunks: int, capacity: int) -> int:
    """Rows with top-k above this aim at the wide candidate share (see WIDE_K_MARGIN)."""
    return num_chunks * capacity // (QUICK_FLOOR_SHARE * WIDE_K_MARGIN)
