"""Collect: whole sequences from the SUT, one parquet chunk per batch, and the reproducibility re-run.

Layout (`specval.sequence.protocol`): group g's seeds [start, start + N) run in batches of B
requests; batch b holds seeds start + bB .. start + (b + 1)B - 1 in slots 0..B-1, after prompt
b mod P. Each batch is one `sample` call, written as `samples/<group>-b<b>.parquet` in long form
(one row per committed token: batch, slot, seed, prompt, index, token, source, companion) through
`bundle.write_chunk`, so a killed run resumes at the first missing batch. Batches are collected
group after group; a protocol with looks collects segment by segment (`plan_batches`: every
group's batches of look k before any batch of look k + 1). A group with companions runs each
batch as one `sample_mixed` call of 2B requests: the tested ones in slots 0..B-1, then one
companion per tested request (`companion` True; `specval.sequence.protocol` gives their sampling
and seeds). A group under a `drafts` test also stores the drafted token of every token (`draft`:
`SampleBatch.drafts`, checked by `contract.check_drafts`); other groups' tables have no such column.

The re-run (`samples/<group>-rerun.parquet`) samples the first `RERUN_SEEDS` seeds of batch 0 again,
in reverse order, as a batch of their own (without companions): every seed sits in another slot,
next to other neighbours, in a smaller batch. Under the adapter contract (`sample` is a pure function of the
request, whatever the batch) its tokens equal the first run's, bit for bit.

Who samples the missing batches is `collect`'s `sampler`: this process (`sample_here`), or the
ranks of a multi-process run (`specval.distribution.sharding.sampler` with `sample_batch`), which
hands every batch's table back to this process to be written; the files are the same either way.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from specval import bundle as bundles
from specval.preflight import SUTRaised
from specval.protocol import ProtocolError
from specval.seeds import SeedRange
from specval.sequence.contract import check_batch
from specval.sequence.protocol import COMPANION_SEED_BIT, DRAFTS_KIND, SequenceProtocol
from specval.sut import SUT, SampleBatch

SAMPLES_DIR = bundles.SAMPLES_DIR
RERUN_SEEDS = 8  # seeds of batch 0 sampled again in another arrangement
RERUN = "rerun"
COLUMNS = ("batch", "slot", "seed", "prompt", "index", "token", "source", "companion")
DRAFT_COLUMN = "draft"  # groups under a `drafts` test: SampleBatch.drafts (older bundles have none)


@dataclass(frozen=True)
class Batch:
    """One `sample` call of one group: batch `index` (-1: the re-run) of seeds in slot order."""

    group: str
    index: int
    seeds: tuple[int, ...]
    prompt: int
    probe: bool = False  # the adapter probe's batch (`specval.sequence.runner.probe`): never written

    @property
    def file_name(self) -> str:
        label = RERUN if self.index < 0 else f"b{self.index:05d}"
        return f"{self.group}-{label}.parquet"

    def call(self, method: str) -> str:
        """How an error names the adapter call that sampled this batch."""
        which = "probe" if self.probe else "re-run" if self.index < 0 else f"batch {self.index}"
        return f"{method} ({which}, group {self.group!r})"


def plan_batches(protocol: SequenceProtocol, ranges: Sequence[SeedRange]) -> list[Batch]:
    """Every batch of every group in collection order: look segment by look segment (batches
    [b_{k-1}, b_k) of `protocol.look_batches`; one segment without looks), within a segment group by
    group, each group's re-run after its first segment. So a look's batches of every group are
    collected before any batch of a later look, and a protocol without looks collects each group's
    batches, then its re-run, one group after another."""
    out, size, bounds = [], protocol.batch_size, protocol.look_batches
    for segment, (low, high) in enumerate(zip((0, *bounds), bounds)):
        for seed_range in ranges:
            for b in range(low, high):
                seeds = tuple(range(seed_range.start + b * size, seed_range.start + (b + 1) * size))
                out.append(Batch(seed_range.group, b, seeds, b % len(protocol.prompts)))
            if segment == 0:
                first = range(seed_range.start, seed_range.start + min(RERUN_SEEDS, size))
                out.append(Batch(seed_range.group, -1, tuple(reversed(first)), 0))
    return out


def frame(batch: Batch, result: SampleBatch, seeds: np.ndarray | None = None, drafts: bool = False) -> pd.DataFrame:
    """The long-form table of one batch's tokens (`seeds`: every row's seed, companions included;
    default the batch's own seeds). Rows past the batch's own seeds are companions. `drafts`: with
    the DRAFT_COLUMN of `result.drafts` last."""
    rows, length = result.tokens.shape
    seeds = np.asarray(batch.seeds if seeds is None else seeds, dtype=np.int64)
    table = pd.DataFrame(
        {
            "batch": np.full(rows * length, batch.index, dtype=np.int64),
            "slot": np.repeat(np.arange(rows, dtype=np.int64), length),
            "seed": np.repeat(seeds, length),
            "prompt": np.full(rows * length, batch.prompt, dtype=np.int64),
            "index": np.tile(np.arange(length, dtype=np.int64), rows),
            "token": result.tokens.reshape(-1).astype(np.int64),
            "source": result.sources.reshape(-1).astype(str),
            "companion": np.repeat(np.arange(rows) >= len(batch.seeds), length),
        }
    )
    if drafts:
        table[DRAFT_COLUMN] = np.asarray(result.drafts).reshape(-1).astype(np.int64)
    return table


def draft_groups(protocol: SequenceProtocol) -> set[str]:
    """The groups a `drafts` test applies to: their batches must report `SampleBatch.drafts`."""
    return {g for t in protocol.tests if t.kind == DRAFTS_KIND for g in protocol.groups_of(t)}


def _require_drafts(protocol: SequenceProtocol, batch: Batch, result: SampleBatch, method: str) -> None:
    """A batch of a group under a `drafts` test without drafts: ProtocolError (exit 2) at the probe,
    before any seed is claimed (the adapter cannot serve the test), SUTRaised (exit 3) later."""
    if result.drafts is not None:
        return
    if batch.probe:
        index = next(i for i, t in enumerate(protocol.tests) if t.kind == DRAFTS_KIND)
        raise ProtocolError(
            f"protocol {protocol.name!r}: tests[{index}].kind: {DRAFTS_KIND!r} needs the drafted tokens "
            f"(SampleBatch.drafts), which adapter {protocol.sut.adapter!r} did not report in its probe "
            f"batch of group {batch.group!r} (the bundled engine reports them with collection: batched)"
        )
    raise SUTRaised(batch.call(method), "returned no drafts (SampleBatch.drafts is None), which a drafts test reads")


def companion_seeds(seeds: Sequence[int]) -> np.ndarray:
    """The companions' seeds: each tested seed with COMPANION_SEED_BIT set (outside every claimed range)."""
    return np.asarray(seeds, dtype=np.int64) | COMPANION_SEED_BIT


def sample_batch(sut: SUT, protocol: SequenceProtocol, prompt_ids: list[list[int]], batch: Batch) -> pd.DataFrame:
    """One batch: a `sample` call, or a `sample_mixed` call with the companions after the tested
    requests when the group has companions (never for the re-run). What the adapter returns is
    checked (`contract.check_batch`): SUTRaised naming the call otherwise."""
    group = protocol.group(batch.group)
    seeds = np.asarray(batch.seeds, dtype=np.int64)
    length, max_tokens, vocab = protocol.sequence_length, protocol.max_tokens(group), int(sut.vocab_size)
    if not group.companions or batch.index < 0:
        method = "sample"
        result = sut.sample(group, prompt_ids[batch.prompt], protocol.sampling, seeds, length, max_tokens)
    else:
        method = "sample_mixed"
        seeds = np.concatenate([seeds, companion_seeds(seeds)])
        samplings = [protocol.sampling] * len(batch.seeds) + [
            group.companions[j % len(group.companions)] for j in range(len(batch.seeds))
        ]
        result = sut.sample_mixed(group, prompt_ids[batch.prompt], samplings, seeds, length, max_tokens)
    drafts = batch.group in draft_groups(protocol)
    if drafts and isinstance(result, SampleBatch):
        _require_drafts(protocol, batch, result, method)
    elif isinstance(result, SampleBatch) and result.drafts is not None:
        result = dataclasses.replace(result, drafts=None)  # checked and kept only where a test reads them
    result = check_batch(batch.call(method), result, len(seeds), length, vocab)
    return frame(batch, result, seeds, drafts)


Keep = Callable[[Batch, pd.DataFrame], None]  # writes one sampled batch
BatchSampler = Callable[[SUT, SequenceProtocol, list[list[int]], list[Batch], Keep], None]


def sample_here(
    sut: SUT, protocol: SequenceProtocol, prompt_ids: list[list[int]], batches: list[Batch], keep: Keep
) -> None:
    """The one-process `BatchSampler`: sample each batch in order in this process and keep it."""
    for batch in batches:
        keep(batch, sample_batch(sut, protocol, prompt_ids, batch))


def missing_batches(
    protocol: SequenceProtocol, ranges: Sequence[SeedRange], bundle: Path, upto: int | None
) -> list[Batch]:
    """The batches of `plan_batches` not yet on disk, in plan order (`upto`: only batches below
    that index, and the re-runs: a look's)."""
    out, below = bundle / SAMPLES_DIR, protocol.num_batches if upto is None else upto
    return [b for b in plan_batches(protocol, ranges) if b.index < below and not (out / b.file_name).exists()]


def collect(
    sut: SUT,
    protocol: SequenceProtocol,
    prompt_ids: list[list[int]],
    ranges: Sequence[SeedRange],
    bundle: Path,
    progress: bool = True,
    upto: int | None = None,
    sampler: BatchSampler | None = None,
) -> int:
    """Sample every batch not yet on disk (`missing_batches`, up to `upto`) and write each as its
    chunk file; returns the sequences drawn now. `sampler` (default `sample_here`) samples the
    missing batches, in any order, and hands each to the writer; `specval.distribution.sharding`
    spreads them over the processes of a multi-rank run."""
    out = bundle / SAMPLES_DIR
    out.mkdir(parents=True, exist_ok=True)
    todo = missing_batches(protocol, ranges, bundle, upto)
    with tqdm(
        total=sum(len(b.seeds) for b in todo),
        unit="sequence",
        disable=not progress,
        desc=protocol.name,
        dynamic_ncols=True,
    ) as bar:

        def keep(batch: Batch, table: pd.DataFrame) -> None:
            bundles.write_chunk(bundle, out / batch.file_name, functools.partial(table.to_parquet, index=False))
            bar.set_postfix_str(batch.group)
            bar.update(len(batch.seeds))

        (sampler or sample_here)(sut, protocol, prompt_ids, todo, keep)
    return sum(len(b.seeds) for b in todo)


def _tested(table: pd.DataFrame) -> pd.Series:
    """Rows of tested requests (bundles written before companions existed have no such column)."""
    return ~table["companion"] if "companion" in table else pd.Series(True, index=table.index)


def batch_files(bundle: Path, group: str) -> list[Path]:
    """The group's batch files on disk (the re-run's excluded), in batch order."""
    return sorted((bundle / SAMPLES_DIR).glob(f"{group}-b*.parquet"))


def _files_of(bundle: Path, protocol: SequenceProtocol, group: str, batches: range | None) -> list[Path]:
    """The files of `batches` (None: every planned batch, and no other batch file on disk)."""
    if batches is None:
        files = batch_files(bundle, group)
        if len(files) != protocol.num_batches:
            raise ValueError(f"samples of group {group!r}: {len(files)} batch files, expected {protocol.num_batches}")
        return files
    files = [bundle / SAMPLES_DIR / Batch(group, b, (), 0).file_name for b in batches]
    missing = [f.name for f in files if not f.is_file()]
    if missing:
        raise ValueError(f"samples of group {group!r}: batch file {missing[0]} is missing ({len(missing)} in all)")
    return files


def load_tables(
    bundle: Path, protocol: SequenceProtocol, group: str, batches: range | None = None
) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """(main batches, companions, re-run) of one group, each sorted by (batch, slot, index);
    `batches`: only those (a look's), else every planned batch. ValueError when a batch is missing
    or holds other than the planned tokens."""
    files = _files_of(bundle, protocol, group, batches)
    table = pa.concat_tables([pq.read_table(f) for f in files]).to_pandas()
    tested = _tested(table)
    main, companions = table[tested], table[~tested]
    expected = len(files) * protocol.batch_size * protocol.sequence_length
    has_companions = bool(protocol.group(group).companions)
    if len(main) != expected or len(companions) != (expected if has_companions else 0):
        raise ValueError(
            f"samples of group {group!r}: {len(main)} tested and {len(companions)} companion tokens, "
            f"expected {expected} and {expected if has_companions else 0}"
        )
    rerun = pd.read_parquet(bundle / SAMPLES_DIR / f"{group}-{RERUN}.parquet")
    order = ["batch", "slot", "index"]
    return tuple(t.sort_values(order, kind="stable").reset_index(drop=True) for t in (main, companions, rerun))


def load_group(bundle: Path, protocol: SequenceProtocol, group: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(main batches, re-run) of one group, sorted by (batch, slot, index) (see `load_tables`)."""
    main, _, rerun = load_tables(bundle, protocol, group)
    return main, rerun
