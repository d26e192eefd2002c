"""Triton backend of `batched_probabilities`: sort-free, every row split over many programs.

One module per stage: `config` (KernelConfig, RowMode, shared constants), `chunk`, `select`
(with `prove`, the cut on compacted candidates), `write`, `single_launch`, `whole_row` (the
exact fallback), `division` (x = logits / T), `common` (jit helpers of several stages),
`layout` (the `LaunchPlan` type and the order and dtypes of a call's buffers, below both `plan`
and `kernels/warmup.py`) and `plan` (launch plan, scratch and launch). docs/sampling.md
describes the algorithm, docs/notes/performance-notebook.md the measurements.

Three launches (one for small batches, below), no host read between them (S = number of chunks
of CHUNK vocabulary entries):

1. `_chunk_kernel`, one program per (row, chunk), the chunk held in registers (512 entries
   and one warp by default, which needs no barrier at all): x = logits / T, the chunk's
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
   scatters; a row no pivot proves runs `whole_row.write_row` (one program,
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
(docs/notes/performance-notebook.md). The tickets start at zero (zeroed when the scratch is allocated) and
the last program zeroes its row's ticket again.

Every output element is written by exactly one program of one launch (or rewritten whole by
the whole-row kernel once every other program of its row is done), so no program needs a
barrier between its zeros and its values. A truncating row costs one read of the logits, one write of the output and the
candidates (a few percent of the row). The decisions are exact on float32 x, as in the
whole-row kernel; only sums differ from the reference by float32 rounding.
"""

from engine.sampling.kernels.probabilities.config import (
    BASELINE_CONFIG,
    CANDIDATE_CONFIGS,
    DEFAULT_CONFIG,
    QUICK_FLOOR_SHARE,
    SINGLE_LAUNCH_CONFIGS,
    SINGLE_LAUNCH_ENTRIES,
    TOP_K_FLOOR_STEPS,
    KernelConfig,
    RowMode,
    wide_k_limit,
)
from engine.sampling.kernels.probabilities.layout import BUFFERS, LaunchPlan
from engine.sampling.kernels.probabilities.plan import (
    LAUNCHES,
    SCRATCH,
    KernelOutput,
    device_plan,
    launch_plan,
    probabilities_triton,
    run_probabilities,
    specialisation_key,
)

__all__ = [
    "BASELINE_CONFIG",
    "BUFFERS",
    "CANDIDATE_CONFIGS",
    "DEFAULT_CONFIG",
    "KernelConfig",
    "KernelOutput",
    "LAUNCHES",
    "LaunchPlan",
    "QUICK_FLOOR_SHARE",
    "RowMode",
    "SCRATCH",
    "SINGLE_LAUNCH_CONFIGS",
    "SINGLE_LAUNCH_ENTRIES",
    "TOP_K_FLOOR_STEPS",
    "device_plan",
    "launch_plan",
    "probabilities_triton",
    "run_probabilities",
    "specialisation_key",
    "wide_k_limit",
]
