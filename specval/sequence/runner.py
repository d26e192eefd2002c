"""Run a sequence protocol: claim seeds, collect whole sequences, replay the target, decide, seal.

    protocol -> seed range per group (ledger) -> batches of sequences (SUT) -> re-run -> target
             logits along every sequence (SUT) -> reference parts -> criteria -> Holm -> verdict
             -> report -> manifest -> SHA256SUMS

Refusals, failures and interrupts behave as in `specval.distribution.runner.run`: nothing is claimed
before the protocol, its registration, the output directory, the adapter's capabilities
(`draft_overrides` for groups that replace the draft, `mixed_sampling` for companions) and a probe
of every adapter call the run makes (`probe`) are checked; a resume is refused when the adapter
declares other filter semantics than the bundle recorded. A multi-rank run (`shards`,
`specval.distribution.sharding`) shares the collection of the missing batches with the other ranks
(each probes its own adapter before any seed is claimed; each batch is made by
`collect.sample_batch` and written by this process, as in one process); the reference replays and
the criteria run on rank 0 alone. Every batch and every replay is checked
against the adapter contract (`specval.sequence.contract`); an adapter exception or breach is
`SUTRaised` (the bundle is kept and `--resume` continues at the first missing batch or reference),
up to and including summary.json (`execution.guard_bundle`). The bundle's lock is given up on every
way out of `run`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import functools
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from specval import bundle as bundles
from specval import lifecycle, seeds
from specval.distribution import sharding
from specval.distribution.runner import check_resumed_semantics
from specval.execution import EnvironmentFailed, RunInterrupted, guard_bundle
from specval.preflight import GuardedSUT, SUTRaised, check_capabilities, check_writable_dir, open_guarded
from specval.protocol import ProtocolError, check_registered
from specval.sequence import collect, looks, reference, verdict, workers
from specval.sequence.protocol import SequenceProtocol, load_sequence_protocol, parse_sequence_protocol, resolve
from specval.sequence.report import render, render_files
from specval.stats import montecarlo
from specval.stopwatch import Stopwatch
from specval.sut import SutFactory, capabilities_of, open_sut

MC_STREAM_KEY = "monte_carlo_stream"  # summary.json: the stream of the PIT uniforms and Monte Carlo nulls
RULES_KEY = "criteria_version"  # summary.json: the criteria's rules (`verdict.RULES`); absent: the first
COLLECT_STEP, REFERENCE_STEP, ANALYSIS_STEP = "collect", "reference", "analysis"  # the manifest's `<step>_s`


def load_bundle_protocol(path: Path) -> tuple[SequenceProtocol, list[seeds.SeedRange]]:
    """The resolved protocol and seed ranges a sequence bundle was (or is being) run with."""
    protocol, plan = bundles.load_plan_protocol(path, parse_sequence_protocol, load_sequence_protocol)
    ranges = [seeds.SeedRange(plan.protocol, path.name, g, start, stop) for g, start, stop in plan.ranges]
    return resolve(protocol, plan.profile), ranges


def _open(protocol: SequenceProtocol, protocol_file: Path, sut_factory: SutFactory | None) -> GuardedSUT:
    """The adapter, checked before any seed is claimed: groups it refuses and capabilities it lacks are
    input errors (SUTError / ProtocolError); a probe catches a broken adapter (SUTRaised)."""
    sut = open_guarded(sut_factory or open_sut, protocol)
    try:
        sut.check_groups(protocol.groups)  # refuse unsupported groups before claiming any seed
        check_capabilities(protocol, sut, protocol_file)
        probe(sut, protocol, protocol_file)
    except BaseException:
        _close_quietly(sut)
        raise
    return sut


def _close_quietly(sut: GuardedSUT) -> None:
    """Close the adapter on the way out of a run that is failing already: its own error is the one told."""
    with contextlib.suppress(SUTRaised):
        sut.close()


def probe_length(protocol: SequenceProtocol) -> int:
    """Tokens per sequence of the probe: one whole round (K drafts and the bonus) and the first
    token of the next, or the protocol's length if shorter. The probe checks the calls' contract;
    a full-length probe would cost one more batch per group (a fifth of a smoke run's collection)."""
    return min(protocol.sequence_length, protocol.num_speculative_tokens + 2)


def probe(sut: GuardedSUT, protocol: SequenceProtocol, protocol_file: Path) -> None:
    """Exercise every adapter call the run makes, checked as the run checks them
    (`specval.sequence.contract`), on the reserved probe seeds (`seeds.PROBE_SEEDS`, outside every
    run's ranges): `vocab_size`, `encode` of every prompt, one batch of `probe_length` tokens per
    group after the first prompt (`sample_mixed` with its companions for a group that has them) and
    `target_logits_along` of its first sequence (and `draft_logits_along`, for a group under a
    `source` test). A fault that shows only later in a sequence is
    caught by the run's own checks of every batch (exit 3, the bundle resumable). ProtocolError
    (exit 2) for an adapter without `target_logits_along`; SUTRaised (exit 3) for anything the
    adapter raises or returns malformed."""
    if not callable(getattr(sut, "target_logits_along", None)):
        raise ProtocolError(
            f"{protocol_file}: a sequence protocol needs target_logits_along, which adapter "
            f"{protocol.sut.adapter!r} does not provide"
        )
    vocab = sut.vocab_size
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or vocab < 2:
        raise SUTRaised("vocab_size", f"is {vocab!r}, expected an integer >= 2")
    prompt_ids = [_encoded(sut, text, int(vocab)) for text in protocol.prompts]
    short = dataclasses.replace(protocol, sequence_length=probe_length(protocol))
    white_box = reference.source_groups(protocol)
    for group in protocol.groups:
        batch = collect.Batch(group.name, 0, seeds.PROBE_SEEDS, 0, probe=True)
        try:
            table = collect.sample_batch(sut, short, prompt_ids, batch)
        except ProtocolError as err:  # the adapter cannot serve a test the protocol asks for
            raise ProtocolError(f"{protocol_file}: {err}") from err
        first = table["token"].to_numpy()[: short.sequence_length]
        reference.replay(sut, prompt_ids[0], first, f"target_logits_along (probe, group {group.name!r})")
        if group.name in white_box:  # the source test's call, on the same sequence
            reference.draft_replay(sut, short, group.name, prompt_ids[0], first, int(table["seed"].iloc[0]))


def _encoded(sut: GuardedSUT, text: str, vocab: int) -> list[int]:
    ids = sut.encode(text)
    array = np.asarray(ids)
    if (
        array.ndim != 1
        or not len(array)
        or not np.issubdtype(array.dtype, np.integer)
        or array.min() < 0
        or array.max() >= vocab
    ):
        raise SUTRaised(
            "encode",
            f"returned {ids!r:.80} for prompt {text!r:.40}, expected a non-empty list of token ids in [0, {vocab})",
        )
    return [int(i) for i in array]


def _collect_and_replay(
    sut: GuardedSUT,
    protocol: SequenceProtocol,
    ranges: list,
    path: Path,
    progress: bool,
    watch: Stopwatch,
    sampler: collect.BatchSampler | None,
) -> int:
    """Collect every missing batch (through `sampler`: None, this process), then replay every group
    that lacks its reference parts; the seconds go to `watch`'s COLLECT_STEP and REFERENCE_STEP."""
    prompt_ids = [_encoded(sut, text, int(sut.vocab_size)) for text in protocol.prompts]
    with watch.step(COLLECT_STEP):
        drawn = collect.collect(sut, protocol, prompt_ids, ranges, path, progress, sampler=sampler)
    with watch.step(REFERENCE_STEP):
        _replay_groups(sut, protocol, prompt_ids, path)
    return drawn


def _replay_groups(sut: GuardedSUT, protocol: SequenceProtocol, prompt_ids: list[list[int]], path: Path) -> None:
    tables = {g.name: collect.load_tables(path, protocol, g.name) for g in protocol.groups}
    reference.build(
        sut,
        protocol,
        prompt_ids,
        path,
        {g: t[0] for g, t in tables.items()},
        capabilities_of(sut).semantics,
        {g.name: tables[g.name][1] for g in protocol.groups if g.companions},
    )


def group_data(
    path: Path, protocol: SequenceProtocol, look: looks.Look | None = None
) -> dict[str, verdict.GroupSequences]:
    """Every group's sequences and reference parts: all of them, or the batches `look` sees."""
    seen = None if look is None else range(looks.batches(protocol, look))
    out = {}
    for group in protocol.groups:
        main, _, rerun = collect.load_tables(path, protocol, group.name, seen)
        companions = looks.load_parts(path, group.name, look, companions=True) if group.companions else None
        out[group.name] = verdict.group_sequences(
            main, rerun, looks.load_parts(path, group.name, look), protocol.sequence_length, companions
        )
    return out


def _group_facts(protocol: SequenceProtocol, data: verdict.GroupSequences, seed_range: seeds.SeedRange) -> dict:
    group = protocol.group(seed_range.group)
    position, _ = verdict.round_positions(data.sources, protocol.num_speculative_tokens)
    keys, counts = np.unique(position, return_counts=True)
    accepted = int((data.sources == "accepted").sum())
    drafted_rounds = int(np.isin(data.sources, ("correction", "bonus")).sum())
    return {
        "mode": group.mode,
        "draft_loops": group.draft_loops,
        "draft": group.draft,
        "companions": [c.to_dict() for c in group.companions],
        "seed_start": seed_range.start,
        "seed_stop": seed_range.stop,
        "sequences": int(data.tokens.shape[0]),
        "tokens": int(data.tokens.size),
        "round_positions": {str(k): int(c) for k, c in zip(keys, counts)},
        "acceptance_rate": (accepted / (accepted + drafted_rounds)) if accepted + drafted_rounds else None,
    }


def summarise(
    path: Path,
    protocol: SequenceProtocol,
    ranges: list,
    stream: str = montecarlo.CURRENT_STREAM,
    rules: int = verdict.CURRENT_RULES,
    advance: Callable[[looks.Look], None] | None = None,
) -> dict:
    """The summary computed from the bundle's samples and reference parts alone, its randomized PITs
    and Monte Carlo nulls drawn from `stream` (recorded as `monte_carlo_stream`), by the criteria's
    `rules` (recorded as `criteria_version` from the second on: a bundle without it is of the first).
    A protocol with looks is decided look by look (`specval.sequence.looks`): `advance(look)` brings
    the look's batches and parts on disk first (the run's collects them; by default they must be
    there, as verify reads them), and the summary is the stopping look's, with `sequential`."""
    if protocol.sequential is None:
        return _summary(path, protocol, ranges, group_data(path, protocol), stream, rules)

    def evaluate(look: looks.Look) -> dict:
        data = group_data(path, protocol, look)
        return _summary(path, looks.look_protocol(protocol, look), ranges, data, stream, rules)

    walked = looks.walk(protocol, advance or (lambda look: None), evaluate)
    looks.check_collected(path, protocol, walked)
    summary = looks.finish(protocol, walked)
    summary["protocol"] = {**summary["protocol"], "alpha": protocol.alpha}
    return json.loads(json.dumps(summary))


def _summary(
    path: Path,
    protocol: SequenceProtocol,
    ranges: list,
    data: dict[str, verdict.GroupSequences],
    stream: str,
    rules: int,
) -> dict:
    """`summarise` of a fixed-size protocol (or of one look's), from its groups' `data`."""
    seed_ranges = {r.group: (r.start, r.stop) for r in ranges}
    decided = verdict.evaluate(protocol, data, seed_ranges, stream, rules)
    version = {} if rules == verdict.FIRST_RULES else {RULES_KEY: rules}
    registration = bundles.RunPlan.from_dict(bundles.read_json(path / bundles.RUN_FILE)).registration_block()
    groups = {r.group: _group_facts(protocol, data[r.group], r) for r in ranges}
    return json.loads(
        json.dumps(
            {
                "kind": "sequence",
                "verdict": decided["verdict"],
                "reason": decided["reason"],
                "tests": decided["tests"],
                "families": decided["families"],
                "registration": registration,
                "groups": groups,
                MC_STREAM_KEY: stream,
                **version,
                "protocol": {
                    "name": protocol.name,
                    "hash": protocol.hash,
                    "profile": protocol.profile,
                    "alpha": protocol.alpha,
                    "power": protocol.power,
                    "prompts": list(protocol.prompts),
                    "sequence_length": protocol.sequence_length,
                    "num_speculative_tokens": protocol.num_speculative_tokens,
                    "batch_size": protocol.batch_size,
                    "family_sizes": verdict.family_sizes(protocol),
                },
            }
        )
    )


def run(
    protocol_file: Path | None,
    profile: str | None,
    output: Path,
    *,
    resume: Path | None = None,
    exploratory: bool = False,
    seed_offset: int | None = None,
    progress: bool = True,
    sut_factory: SutFactory | None = None,
    command: list[str] | None = None,
    announce: Callable[[Path], None] | None = None,
    parsed: SequenceProtocol | None = None,
    shards: sharding.ShardGroup | None = None,
) -> tuple[Path, dict]:
    """Run (or resume) a sequence protocol and write a sealed bundle; returns (bundle, summary).

    Refused before any seed is claimed (nothing written): protocol errors, an unregistered protocol
    without `exploratory`, an unwritable output root, groups or capabilities the adapter lacks, a
    failed probe (`probe`); a resume whose adapter declares other filter semantics than run.json
    recorded. Once the bundle exists, everything up to summary.json runs under
    `execution.guard_bundle` (an adapter exception or breach of the contract is RunFailed, an OSError
    EnvironmentFailed, an interrupt RunInterrupted: the bundle is kept, unsealed, for `--resume`);
    after summary.json, an OSError is EnvironmentFailed and an interrupt RunInterrupted too (a resume
    completes the bundle, `lifecycle.complete`). Whichever way the run ends, this process gives up
    the bundle's lock.

    `shards`: this process is rank 0 of a multi-rank run: every other rank probes its adapter
    before any seed is claimed and samples its share of the missing batches
    (`sharding.sampler` of `collect.sample_batch`); the manifest records the number of ranks."""
    started, clock = dt.datetime.now(dt.timezone.utc).isoformat(), time.perf_counter()
    path = None if resume is None else Path(resume)
    if path is None:
        base = parsed if parsed is not None else load_sequence_protocol(protocol_file)
        state = check_registered(base, protocol_file, exploratory)
        protocol = resolve(base, profile)
    else:
        bundles.check_resumable(path)  # refuse sealed or tampered bundles; from here this process holds the lock
    try:
        if path is not None:
            protocol, ranges = load_bundle_protocol(path)
        protocol = protocol if shards is None else sharding.place(protocol, shards)
        source = Path(protocol_file or path / bundles.PROTOCOL_YAML)
        check_writable_dir(Path(output if path is None else path), "--output" if path is None else "--resume")
        sut = _open(protocol, source, sut_factory)
        try:
            semantics = capabilities_of(sut).semantics
            if shards is not None:  # every rank's adapter probed before any seed is claimed
                sharding.open_ranks(shards, protocol, functools.partial(probe, protocol_file=source))
            if path is None:
                groups, size = [g.name for g in protocol.groups], protocol.sequences_per_group
                path, ranges = lifecycle.start_bundle(
                    Path(protocol_file),
                    base,
                    protocol,
                    output,
                    groups,
                    size,
                    seed_offset,
                    state,
                    exploratory,
                    semantics,
                )
            else:
                check_resumed_semantics(path, semantics)
            if announce:
                announce(path)
            session = bundles.begin_session(path, command)
        except BaseException:
            _close_quietly(sut)
            raise
        sampler = None if shards is None else sharding.sampler(shards, collect.sample_batch)
        with guard_bundle(path, session), workers.prompt_handoff():
            summary, drawn, watch, device = _decide(sut, protocol, ranges, path, progress, sampler)
        with _after_verdict(path):
            bundles.end_session(path, session, drawn, summary["verdict"])
            timing = _timing(started, clock, watch, drawn, protocol)
            if shards is not None:
                timing["ranks"] = shards.size
            lifecycle.write_manifest(path, protocol, ranges, device, timing, command)
            finish(path)
    except BaseException:
        if path is not None:
            bundles.release_bundle(path)  # a later --resume, in this process or another, takes it
        raise
    return path, summary


def _timing(started: str, clock: float, watch: Stopwatch, drawn: int, protocol: SequenceProtocol) -> dict:
    """The manifest's timing: `collect_s` the adapter's sampling calls and their chunk files
    (`samples_per_s` tokens a second of it), `reference_s` the replays and reference parts,
    `analysis_s` every criterion (look by look with looks, less the collection and replays between
    the looks), beside the run's `wall_s`."""
    seconds = watch.seconds()
    timing = lifecycle.run_timing(started, clock, seconds.get(COLLECT_STEP, 0.0), drawn * protocol.sequence_length)
    return timing | {f"{step}_s": seconds.get(step, 0.0) for step in (REFERENCE_STEP, ANALYSIS_STEP)}


def _decide(
    sut: GuardedSUT,
    protocol: SequenceProtocol,
    ranges: list,
    path: Path,
    progress: bool,
    sampler: collect.BatchSampler | None = None,
) -> tuple[dict, int, Stopwatch, dict]:
    """Collect (through `sampler`: None, this process), replay, close the adapter, then decide and
    write summary.json: (summary, sequences drawn, the seconds of each step, device facts). A
    protocol with looks: `_decide_looks`."""
    if protocol.sequential is not None:
        return _decide_looks(sut, protocol, ranges, path, progress, sampler)
    watch = Stopwatch()
    try:
        drawn = _collect_and_replay(sut, protocol, ranges, path, progress, watch, sampler)
        device = {**bundles.device_facts(), "sut": sut.describe()}
    except BaseException:
        _close_quietly(sut)
        raise
    sut.close()
    with watch.step(ANALYSIS_STEP):
        summary = summarise(path, protocol, ranges)
    bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    return summary, drawn, watch, device


def _decide_looks(
    sut: GuardedSUT,
    protocol: SequenceProtocol,
    ranges: list,
    path: Path,
    progress: bool,
    sampler: collect.BatchSampler | None = None,
) -> tuple[dict, int, Stopwatch, dict]:
    """`_decide` look by look: before each look is evaluated, its batches of every group are
    collected and replayed (`collect.collect` up to the look, `looks.extend_reference`); the walk
    stops at the first look that FAILs. The adapter is closed after the walk."""
    watch, drawn = Stopwatch(), {"sequences": 0}
    try:
        prompt_ids = [_encoded(sut, text, int(sut.vocab_size)) for text in protocol.prompts]
        semantics = capabilities_of(sut).semantics

        def advance(look: looks.Look) -> None:
            upto = looks.batches(protocol, look)
            with watch.step(COLLECT_STEP):
                drawn["sequences"] += collect.collect(sut, protocol, prompt_ids, ranges, path, progress, upto, sampler)
            with watch.step(REFERENCE_STEP):
                looks.extend_reference(sut, protocol, prompt_ids, path, look, semantics)

        start = time.perf_counter()
        summary = summarise(path, protocol, ranges, advance=advance)
        between = sum(watch.seconds().values())  # the looks' collection and replays, within the walk
        watch.add(ANALYSIS_STEP, time.perf_counter() - start - between)
        device = {**bundles.device_facts(), "sut": sut.describe()}
    except BaseException:
        _close_quietly(sut)
        raise
    sut.close()
    bundles.write_json(path / bundles.SUMMARY_FILE, summary)
    return summary, drawn["sequences"], watch, device


@contextlib.contextmanager
def _after_verdict(path: Path) -> Iterator[None]:
    """Between summary.json and the seal: an OSError is EnvironmentFailed and an interrupt
    RunInterrupted, naming the bundle (its verdict is recorded: a resume completes it)."""
    try:
        yield
    except OSError as err:
        raise EnvironmentFailed(path, err) from err
    except KeyboardInterrupt as err:
        raise RunInterrupted(path) from err


def finish(path: Path) -> None:
    """Render report.md / report.html and seal the bundle."""
    render(path)
    lifecycle.seal(path)


def verify(path: Path) -> list[str]:
    """Every difference between the bundle and its seals, its summary recomputed from the stored
    samples and reference parts, and its reports re-rendered."""
    return bundles.verify_bundle(path, _recompute_bundle, render_files)


def _recompute_bundle(path: Path) -> dict:
    protocol, ranges = load_bundle_protocol(path)
    summary = bundles.read_json(path / bundles.SUMMARY_FILE)
    if not isinstance(summary, dict):
        return summarise(path, protocol, ranges)
    stream = summary.get(MC_STREAM_KEY, montecarlo.CURRENT_STREAM)
    return summarise(path, protocol, ranges, stream, summary.get(RULES_KEY, verdict.FIRST_RULES))
