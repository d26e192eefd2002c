"""Reference: every committed token's place in the target's law given its actual prefix.

For each sequence, one call `SUT.target_logits_along(prompt, tokens)` gives the target logits of
every position; the float64 transform of the distribution kind (`specval.distribution.reference`,
with the SUT's declared filter semantics) turns them into the law p_i of token i given the prompt
and tokens 1..i-1. What the tests need of p_i is kept per token (`samples/<group>-reference.parquet`):

- `mass` p_i(x_i), `lower_rank` and `lower_index` F_i(x_i^-) in rank and in token-id order
  (`specval.stats.sequence.pit_parts`): the randomized PIT of the token in either order;
- `self_match` sum_x p_i(x)^2: the chance that an independent request with the same prefix draws
  the same token (the t1 equal-rate test of paired requests, which share the prompt);
- `status`: IN_SUPPORT, BOUNDARY (p_i(x_i) = 0, but a boost of `support_tolerance` to the token's
  logit would keep it: float rounding between the SUT's logits and this replay, not evidence) or
  OUT_OF_SUPPORT (outside the support even so: a bug, failed at once).

A group under a `source` test also gets, from `SUT.draft_logits_along` (the draft's q_i along the
same prefixes, filtered by the same sampling and semantics), the token's place in the law of its
SOURCE (`SOURCE_COLUMNS`): an accepted draft follows min(p_i, q_i) / beta_i, a correction
(p_i - q_i)+ / (1 - beta_i), a bonus or plain token p_i, with beta_i = sum min(p_i, q_i), the
probability that a draft at that position is accepted (`beta`). `source_lower` / `source_mass` are
the rank-order PIT parts under that law; a token the law cannot emit (mass 0: a correction where p
<= q, an accepted token outside min(p, q)) gets lower 1 and mass 0, its PIT at the top of the unit.

A group under a `drafts` test (its samples hold the drafted token of every accepted or correction
token, `specval.sequence.collect.DRAFT_COLUMN`) also gets the draft's place in q_i (`DRAFT_COLUMNS`):
`draft_lower` / `draft_mass`, the rank-order PIT parts of the drafted token under q_i, the law it was
drawn from whatever happened to it (position i of a round is reached before its draft is drawn, and
accepting or correcting there depends on the draft only after it is drawn); lower 1 and mass 0 for a
draft q_i cannot emit, lower 0 and mass 0 where no draft stood (a bonus or plain token).

A group with companions (`specval.sequence.collect`) also gets `samples/<group>-companions.parquet`:
the `status` of every companion token under the companion's own sampling (a greedy companion's
token is IN_SUPPORT iff its logit is the row's maximum, BOUNDARY iff within `support_tolerance` of
it): the neighbours a request shares its batch with must themselves be served right.

Guarantee: the parts are a deterministic function of the logits the SUT returned, the tokens, the
sampling parameters and the semantics; `specval verify` recomputes every statistic from them.
They are written like sample chunks (`samples/<group>-reference.parquet`, sha256 recorded in
chunks.json as written), so a resumed run keeps the groups already replayed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from specval import bundle as bundles
from specval.distribution.reference import transform
from specval.preflight import GuardedSUT
from specval.protocol.sections import SamplingSpec
from specval.semantics import FilterSemantics
from specval.sequence import workers
from specval.sequence.collect import DRAFT_COLUMN
from specval.sequence.contract import check_logits_along, check_logits_rows
from specval.sequence.protocol import DRAFT_KINDS, SequenceProtocol
from specval.stats.sequence import pit_parts
from specval.sut import SUT

REFERENCE_SUFFIX = "-reference.parquet"
IN_SUPPORT, BOUNDARY, OUT_OF_SUPPORT = 0, 1, 2
COMPANIONS_SUFFIX = "-companions.parquet"
PART_COLUMNS = ("mass", "lower_rank", "lower_index", "self_match", "status")
SOURCE_COLUMNS = ("source_mass", "source_lower", "beta")  # groups under a source test only
DRAFT_COLUMNS = ("draft_mass", "draft_lower")  # groups under a drafts test only
ACCEPTED, CORRECTION = "accepted", "correction"  # the sources whose law involves q
REPLAY_VALUES = 1 << 25  # logits one batched replay call answers at most (128 MiB of float32)


def support_status(
    logits: np.ndarray,
    tokens: np.ndarray,
    mass: np.ndarray,
    sampling: SamplingSpec,
    tolerance: float,
    semantics: FilterSemantics,
) -> np.ndarray:
    """int8[L]: IN_SUPPORT where mass > 0; for a token of mass 0, BOUNDARY iff the law of its row
    with the token's logit raised by `tolerance` gives it mass > 0, else OUT_OF_SUPPORT.
    Raising one token's logit only helps it survive top-k (its rank improves) and top-p (its
    probability grows), under every semantics, so BOUNDARY means "kept by a logit within the
    tolerance", the float32 rounding a replay may differ by."""
    status = np.where(mass > 0, IN_SUPPORT, OUT_OF_SUPPORT).astype(np.int8)
    for row in np.flatnonzero(mass <= 0):
        boosted = np.asarray(logits[row], dtype=np.float64).copy()
        boosted[tokens[row]] += tolerance
        if transform(boosted, sampling, semantics)[tokens[row]] > 0:
            status[row] = BOUNDARY
    return status


def greedy_status(logits: np.ndarray, tokens: np.ndarray, tolerance: float) -> np.ndarray:
    """int8[L]: IN_SUPPORT where the token's logit is its row's maximum (a tie counts: which of
    tied logits is the argmax is the engine's choice), BOUNDARY where it is within `tolerance` of
    it, else OUT_OF_SUPPORT."""
    wide = np.asarray(logits, dtype=np.float64)
    gap = wide.max(axis=1) - np.take_along_axis(wide, tokens[:, None], axis=1)[:, 0]
    return np.where(gap <= 0, IN_SUPPORT, np.where(gap <= tolerance, BOUNDARY, OUT_OF_SUPPORT)).astype(np.int8)


def companion_status(
    logits: np.ndarray, tokens: np.ndarray, sampling: SamplingSpec, tolerance: float, semantics: FilterSemantics
) -> np.ndarray:
    """The status of a companion's tokens under its own sampling (greedy when temperature is 0)."""
    if sampling.temperature == 0.0:
        return greedy_status(logits, tokens, tolerance)
    mass = np.take_along_axis(transform(logits, sampling, semantics), tokens[:, None], axis=1)[:, 0]
    return support_status(logits, tokens, mass, sampling, tolerance, semantics)


def source_parts(
    probs: np.ndarray, draft_probs: np.ndarray, tokens: np.ndarray, sources: np.ndarray
) -> dict[str, np.ndarray]:
    """SOURCE_COLUMNS of one sequence: p f64[L, V], q f64[L, V], tokens int64[L], sources str[L]
    (module docstring). Deterministic in its inputs."""
    overlap = np.minimum(probs, draft_probs)
    beta = overlap.sum(axis=1)
    law = np.where(
        (sources == ACCEPTED)[:, None],
        overlap,
        np.where((sources == CORRECTION)[:, None], np.clip(probs - draft_probs, 0.0, None), probs),
    )
    possible = law.sum(axis=1) > 0
    lower, mass = np.ones(len(tokens)), np.zeros(len(tokens))
    if possible.any():
        lower[possible], mass[possible] = pit_parts(law[possible], tokens[possible], "rank")
    return {"source_mass": mass, "source_lower": lower, "beta": beta}


def draft_parts(draft_probs: np.ndarray, drafts: np.ndarray) -> dict[str, np.ndarray]:
    """DRAFT_COLUMNS of one sequence: q f64[L, V], the drafted tokens int64[L] (< 0: no draft there)
    (module docstring). Deterministic in its inputs."""
    lower, mass = np.zeros(len(drafts)), np.zeros(len(drafts))
    drafted = drafts >= 0
    if drafted.any():
        lower[drafted], mass[drafted] = pit_parts(draft_probs[drafted], drafts[drafted], "rank")
    return {"draft_mass": mass, "draft_lower": lower}


def sequence_parts(
    logits: np.ndarray,
    tokens: np.ndarray,
    protocol: SequenceProtocol,
    semantics: FilterSemantics,
    draft: tuple[np.ndarray, ...] | None = None,
) -> dict[str, np.ndarray]:
    """The reference parts (PART_COLUMNS) of one sequence's tokens int64[L] from its logits f32[L, V];
    with `draft` = (the draft's logits f32[L, V], the tokens' sources str[L]) SOURCE_COLUMNS too, and
    with a third entry, the drafted tokens int64[L] (-1: none), DRAFT_COLUMNS."""
    probs = transform(logits, protocol.sampling, semantics)
    extra = {}
    if draft is not None:
        draft_probs = transform(draft[0], protocol.sampling, semantics)
        extra = source_parts(probs, draft_probs, tokens, draft[1])
        if len(draft) > 2:
            extra |= draft_parts(draft_probs, draft[2])
    lower_rank, mass = pit_parts(probs, tokens, "rank")
    lower_index, _ = pit_parts(probs, tokens, "index")
    return {
        "mass": mass,
        "lower_rank": lower_rank,
        "lower_index": lower_index,
        "self_match": (probs * probs).sum(axis=1),
        "status": support_status(logits, tokens, mass, protocol.sampling, protocol.support_tolerance, semantics),
        **extra,
    }


def _file(bundle: Path, group: str, suffix: str = REFERENCE_SUFFIX) -> Path:
    return bundle / bundles.SAMPLES_DIR / f"{group}{suffix}"


def replay(sut: SUT, prompt_ids: list[int], tokens: np.ndarray, call: str) -> np.ndarray:
    """The target's logits f32[L, V] along one sequence's tokens int64[L] (one `target_logits_along`
    call), checked (`contract.check_logits_along`: SUTRaised naming `call` otherwise)."""
    return check_logits_along(
        call, sut.target_logits_along(list(prompt_ids), tokens.tolist()), len(tokens), int(sut.vocab_size)
    )


@dataclass(frozen=True)
class Chunk:
    """Sequences `rows` (indices into a group's sorted sequences) of one collected batch: one prompt."""

    rows: np.ndarray  # int64[n]
    prompt: int


def chunks(samples: pd.DataFrame, length: int, vocab: int) -> list[Chunk]:
    """The sequences of `samples` (sorted by batch, slot, index) in replay calls: each batch's rows in
    order, split so that one call answers at most REPLAY_VALUES logits (at least one row a call)."""
    per_call = max(1, REPLAY_VALUES // (length * vocab))
    batches, prompts = samples["batch"].to_numpy()[::length], samples["prompt"].to_numpy()[::length]
    starts = np.flatnonzero(np.r_[True, batches[1:] != batches[:-1]]) if len(batches) else np.zeros(0, np.int64)
    out = []
    for first, stop in zip(starts, np.r_[starts[1:], len(batches)]):
        for begin in range(int(first), int(stop), per_call):
            out.append(Chunk(np.arange(begin, min(begin + per_call, int(stop))), int(prompts[first])))
    return out


def _clipped(row: np.ndarray, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """A sequence holding a token outside [0, V) (collected before the contract checked batches) is
    not replayed: its tokens are clipped and its logits are 0 but -inf at the clipped token of each
    such position, so exactly those tokens are OUT_OF_SUPPORT."""
    outside = (row < 0) | (row >= vocab)
    clipped, logits = np.clip(row, 0, vocab - 1), np.zeros((len(row), vocab), dtype=np.float32)
    logits[np.flatnonzero(outside), clipped[outside]] = -np.inf
    return clipped, logits


def _replays(sut: SUT, protocol: SequenceProtocol, prompt_ids: list[list[int]], samples: pd.DataFrame, label: str):
    """(chunk, tokens int64[n, L], logits f32[n, L, V]) of every chunk of `samples` (sorted by batch,
    slot, index), one `target_logits_along_batch` call per chunk, checked; `label` names the
    sequences in an error ("group 'g'"). Sequences with a token outside [0, V) are `_clipped`."""
    length, vocab = protocol.sequence_length, int(sut.vocab_size)
    tokens = samples["token"].to_numpy().reshape(-1, length)
    for chunk in chunks(samples, length, vocab):
        rows = tokens[chunk.rows].copy()
        logits = np.empty((len(rows), length, vocab), dtype=np.float32)
        outside = ((rows < 0) | (rows >= vocab)).any(axis=1)
        for r in np.flatnonzero(outside):
            rows[r], logits[r] = _clipped(rows[r], vocab)
        inside = np.flatnonzero(~outside)
        if len(inside):
            answer = sut.target_logits_along_batch(list(prompt_ids[chunk.prompt]), rows[inside])
            logits[inside] = _checked(sut, "target_logits_along", label, answer, chunk.rows[inside], length)
        yield chunk, rows, logits


def source_groups(protocol: SequenceProtocol) -> set[str]:
    """The groups a `source` or `drafts` test applies to: the draft's q is replayed for them (their
    reference holds SOURCE_COLUMNS, and DRAFT_COLUMNS where the samples hold drafts)."""
    return {g for t in protocol.tests if t.kind in DRAFT_KINDS for g in protocol.groups_of(t)}


def draft_replay(sut: SUT, protocol: SequenceProtocol, group: str, prompt: list[int], row: np.ndarray, seed: int):
    """The draft's logits f32[L, V] along one sequence (`draft_logits_along`), checked as a replay."""
    call = f"draft_logits_along (group {group!r}, seed {seed})"
    along = sut.draft_logits_along(protocol.group(group), list(prompt), row.tolist(), int(seed))
    return check_logits_along(call, along, len(row), int(sut.vocab_size))


def draft_replays(
    sut: SUT, protocol: SequenceProtocol, group: str, prompt: list[int], rows: np.ndarray, seeds: np.ndarray
) -> np.ndarray:
    """The draft's logits f32[n, L, V] along sequences of one chunk (`draft_logits_along_batch`), checked."""
    along = sut.draft_logits_along_batch(protocol.group(group), list(prompt), rows, np.asarray(seeds, dtype=np.int64))
    return _checked(sut, "draft_logits_along", f"group {group!r}", along, np.arange(len(rows)), rows.shape[1], seeds)


def _checked(sut: SUT, method: str, label: str, answer, numbers: np.ndarray, length: int, seeds=None) -> np.ndarray:
    """A batched replay's answer, checked (`contract.check_logits_rows`). An error names the
    sequence (`numbers`: its index in the group, or its seed) and the method the adapter
    implements: `method` itself when it keeps SUT's per-row default of `method`_batch."""
    adapter = sut.adapter_class if isinstance(sut, GuardedSUT) else type(sut)
    batched = getattr(adapter, f"{method}_batch", None) is not getattr(SUT, f"{method}_batch")
    name = f"{method}_batch" if batched else method

    def row_call(r: int) -> str:
        which = f"seed {int(seeds[r])}" if seeds is not None else f"sequence {int(numbers[r])}"
        return f"{name} ({label}, {which})"

    whole = f"{name} ({label}, {len(numbers)} sequences)"
    return check_logits_rows(whole, row_call, answer, len(numbers), length, int(sut.vocab_size))


def build_group(
    sut: SUT,
    protocol: SequenceProtocol,
    prompt_ids: list[list[int]],
    samples: pd.DataFrame,
    semantics: FilterSemantics,
    group: str = "",
    with_sources: bool = False,
) -> pd.DataFrame:
    """The parts of every token of one group's main batches (samples sorted by batch, slot, index),
    one replay call per chunk (`chunks`); `with_sources`: SOURCE_COLUMNS too, from the draft's
    replay of the same chunk. Every part is a function of its own row of logits, so the parts do
    not depend on how sequences are chunked, nor on the threads that compute them
    (`workers.pipelined`: each chunk's parts overlap the next chunk's replay)."""
    length = protocol.sequence_length
    seeds = samples["seed"].to_numpy()[::length]
    sources = samples["source"].to_numpy().reshape(-1, length)
    drafted = samples[DRAFT_COLUMN].to_numpy().reshape(-1, length) if DRAFT_COLUMN in samples else None

    def jobs():
        for chunk, rows, logits in _replays(sut, protocol, prompt_ids, samples, f"group {group!r}"):
            vocab = logits.shape[-1]
            draft = None
            if with_sources:
                along = draft_replays(sut, protocol, group, prompt_ids[chunk.prompt], rows, seeds[chunk.rows])
                draft = (along.reshape(-1, vocab), sources[chunk.rows].reshape(-1))
                draft += () if drafted is None else (drafted[chunk.rows].reshape(-1),)
            yield functools.partial(
                sequence_parts, logits.reshape(-1, vocab), rows.reshape(-1), protocol, semantics, draft
            )

    parts = workers.pipelined(jobs(), workers.count())
    table = samples[["batch", "slot", "index"]].copy()
    columns = PART_COLUMNS + (SOURCE_COLUMNS if with_sources else ())
    for name in columns + (DRAFT_COLUMNS if with_sources and drafted is not None else ()):
        table[name] = np.concatenate([flat[name] for flat in parts]) if parts else np.zeros(0)
    return table


def build_companions(
    sut: SUT,
    protocol: SequenceProtocol,
    prompt_ids: list[list[int]],
    companions: pd.DataFrame,
    group: str,
    semantics: FilterSemantics,
) -> pd.DataFrame:
    """The `status` of every companion token (companions sorted by batch, slot, index): companion
    slot B + j uses `companions[j mod C]` of its group. Each chunk's rows are taken a sampling at
    a time (`chunk_companion_status`), on the parts' threads (`workers.pipelined`)."""
    spec, length = protocol.group(group), protocol.sequence_length
    which = (companions["slot"].to_numpy()[::length] - protocol.batch_size) % len(spec.companions)

    def jobs():
        for chunk, rows, logits in _replays(sut, protocol, prompt_ids, companions, f"group {group!r} companions"):
            yield functools.partial(
                chunk_companion_status, logits, rows, which[chunk.rows], spec.companions, protocol, semantics
            )

    status = [out["status"] for out in workers.pipelined(jobs(), workers.count())]
    table = companions[["batch", "slot", "index"]].copy()
    table["status"] = np.concatenate(status) if status else np.zeros(0, dtype=np.int8)
    return table


def chunk_companion_status(
    logits: np.ndarray,
    rows: np.ndarray,
    which: np.ndarray,
    samplings: tuple[SamplingSpec, ...],
    protocol: SequenceProtocol,
    semantics: FilterSemantics,
) -> dict[str, np.ndarray]:
    """{"status": int8[n * L]} of one chunk's companions: logits f32[n, L, V], tokens int64[n, L],
    `which[r]` the index into `samplings` of row r's sampling. `companion_status` is a function of
    each position's own row, so taking the rows of one sampling together changes no value."""
    count, length, vocab = logits.shape
    out = np.empty((count, length), dtype=np.int8)
    for j, sampling in enumerate(samplings):
        picked = np.flatnonzero(which == j)
        if picked.size:
            status = companion_status(
                logits[picked].reshape(-1, vocab),
                rows[picked].reshape(-1),
                sampling,
                protocol.support_tolerance,
                semantics,
            )
            out[picked] = status.reshape(picked.size, length)
    return {"status": out.reshape(-1)}


def build(
    sut: SUT,
    protocol: SequenceProtocol,
    prompt_ids: list[list[int]],
    bundle: Path,
    samples: dict[str, pd.DataFrame],
    semantics: FilterSemantics,
    companions: dict[str, pd.DataFrame] | None = None,
) -> None:
    """Write samples/<group>-reference.parquet for every group that lacks it, and
    samples/<group>-companions.parquet for every group in `companions` that lacks it (resumable,
    hashes recorded)."""
    white_box = source_groups(protocol)
    for group, frame in samples.items():
        path = _file(bundle, group)
        if not path.exists():
            table = build_group(sut, protocol, prompt_ids, frame, semantics, group, group in white_box)
            bundles.write_chunk(bundle, path, functools.partial(table.to_parquet, index=False))
    for group, frame in (companions or {}).items():
        path = _file(bundle, group, COMPANIONS_SUFFIX)
        if not path.exists():
            table = build_companions(sut, protocol, prompt_ids, frame, group, semantics)
            bundles.write_chunk(bundle, path, functools.partial(table.to_parquet, index=False))


def load(bundle: Path, group: str, suffix: str = REFERENCE_SUFFIX) -> pd.DataFrame:
    return (
        pd.read_parquet(_file(bundle, group, suffix))
        .sort_values(["batch", "slot", "index"], kind="stable")
        .reset_index(drop=True)
    )
