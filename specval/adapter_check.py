"""Adapter check: an adapter's contract exercised without a protocol run (`specval check-adapter`).

Every call the harness makes (docs/harness.md section 8) is made on a few seeds, and each check
ends in a Finding: OK, FIX (the harness would refuse the adapter, or measure something other than
the sampler: fix it before any run) or ADVICE (works, but costs time or evidence). The checks:

- contract: the run's own probe (`preflight.probe`): shapes and dtypes of vocab_size, encode,
  target_logits, sample per declared mode, draft_logits and accept_single;
- tokens: tokens in [0, V), token sources and counts that can happen (plain only without speculation,
  accepted <= drafted); advice when a speculative group reports only `plain` sources;
- reproducible: the same seeds give the same rows; batch_independent: a seed's row does not depend on
  the other seeds of its batch, nor on their order; distinct_seeds: distinct seeds give distinct rows;
- target_logits: deterministic and cache-free (unchanged after a call on another context);
- quadrature (with accept_single): a coarse exact sweep of one speculative step at the prompt
  (grid QUADRATURE_GRID) matches the law p; vectorised: the time per row of one call on many rows
  against a call on one row, with the cost of a run's quadrature when it loops per row;
- speed: samples per second of one `sample` call; describe: a JSON-able dict with facts; close.

A sequence protocol (`--protocol`, `kind: sequence`) gets the calls a sequence run makes: its
capabilities (draft overrides, companions), its probe as contract (`sample` / `sample_mixed`,
`target_logits_along`, `draft_logits_along` under a `source` test), the sampling checks above on two
whole rounds, then target_logits_along (each row is `target_logits` of its prefix), draft_logits_along
(deterministic, `draft_logits` of its prefix for an own draft where the adapter has it, every
accepted or corrected token possible under its source's law) and mixed (a `sample_mixed` call's
tested rows are `sample`'s; each companion follows its own sampling, greedy the argmax).

Guarantees: deterministic except the two timing checks (speed, vectorised), which only ever advise;
the adapter is closed at the end; nothing is written. An adapter call that raises is a FIX naming the
call and the exception, never a traceback.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from specval.distribution.reference import draft_law, transform
from specval.kinds import DISTRIBUTION_KIND, read_protocol_file
from specval.preflight import GuardedSUT, SUTRaised, check_capabilities, probe
from specval.protocol import Protocol, ProtocolError, SutSpec, parse_protocol
from specval.sequence import reference as sequences
from specval.sequence.collect import companion_seeds
from specval.sequence.contract import check_batch
from specval.sequence.protocol import SEQUENCE_KIND, SequenceProtocol
from specval.sequence.runner import probe as sequence_probe
from specval.stats import quadrature
from specval.sut import OWN_DRAFT, SUTError, capabilities_of, load_adapter

OK, FIX, ADVICE = "OK", "FIX", "ADVICE"
CHECK_PROMPT = "The speculative sampler must be lossless."
CHECK_POSITIONS = 2  # tokens per request, as a t2 protocol tests
DEFAULT_SPECULATIVE_TOKENS = 2
CHECK_SEEDS = np.arange(1_000, 1_032, dtype=np.int64)  # 32 ordinary seeds, below every probe seed
SINGLE_SEED_INDEX = 5  # the seed sampled alone in the batch-independence check
SPEED_SEEDS = np.arange(2_000, 2_064, dtype=np.int64)  # one timed call of 64 requests
SLOW_SAMPLES_PER_S = 50.0  # below: a ci profile (3,000 per group) takes over a minute per group
CI_SAMPLES_PER_GROUP = 3_000  # the shipped protocols' ci size, for the time estimate
QUADRATURE_GRID = 1 << 10  # coarse sweep: resolution 1e-3 per token (a run sweeps at 2^16)
QUADRATURE_TOL = 1e-9
ACCEPT_ROWS = 4_096  # rows of the timed many-row accept_single call
TIMING_REPEATS = 3  # each timing is the least of this many calls (load on a shared machine only adds)
VECTORISED_RATIO = 0.1  # time per row at ACCEPT_ROWS / time of a one-row call: below, vectorised
RUN_QUADRATURE_SWEEPS = 14  # a t2 protocol's sweeps: 1 per speculative group (typically 1-2) + 12 pairs
RUN_QUADRATURE_ROWS = 2 * quadrature.GRID_SIZE * RUN_QUADRATURE_SWEEPS  # rows per sweep <= 2 G
DEFAULT_DESCRIBE_KEYS = {"adapter", "python"}  # what SUT.describe returns when not overridden
CHECK_FILE = Path("<check-adapter>")  # the protocol's name in messages when it came from no file
CHECK_ROUNDS = 2  # a sequence protocol's checks sample two whole rounds: 2 (K + 1) tokens, at most its length
SEQUENCE_SEEDS = 4  # sequences per group of the along and mixed checks (each one replay per sequence)
# TV between a row of target_logits_along (or draft_logits_along) and the law of target_logits (or
# draft_logits) of its prefix: float rounding of two forwards moves it by ~1e-5 at most (TV <=
# exp(2 d) - 1 for logits within d); a row of another prefix moves it by a whole law.
ALONG_TV_TOL = 1e-3
AnyProtocol = Protocol | SequenceProtocol


class CannotLoad(Exception):
    """The adapter cannot be imported or constructed (exit 2)."""


@dataclass(frozen=True)
class Finding:
    """One check's outcome: OK, FIX or ADVICE, with what was seen and what to do."""

    check: str
    level: str
    message: str

    def line(self) -> str:
        return f"{self.level:<7} {self.check}: {self.message}"


@dataclass(frozen=True)
class CheckContext:
    """What every check reads: the guarded adapter, the check protocol, the prompt's ids and V."""

    sut: GuardedSUT
    protocol: AnyProtocol
    prompt_ids: list[int]
    vocab: int


def check_protocol(adapter: str, options: dict[str, Any], num_speculative_tokens: int) -> Protocol:
    """The protocol the checks run under when none is given: the check prompt, temperature 1, one
    group per mode the adapter declares, a quadrature test iff it declares accept_single."""
    capabilities = capabilities_of(load_adapter(adapter))
    groups = [{"name": mode, "mode": mode} for mode in capabilities.modes]
    tests = (
        [{"kind": "quadrature", "role": "control"}]
        if capabilities.accept_single
        else [{"kind": "gof", "position": 1, "role": "control"}]
    )
    raw = {
        "name": "check_adapter",
        "sut": {"adapter": adapter, "options": dict(options)},
        "prompt": CHECK_PROMPT,
        "sampling": {"temperature": 1.0},
        "num_speculative_tokens": num_speculative_tokens,
        "positions": CHECK_POSITIONS,
        "groups": groups,
        "samples_per_group": int(CHECK_SEEDS.size),
        "tests": tests,
    }  # samples_per_group: nominal (nothing is collected), large enough to parse
    return parse_protocol(raw, "<check-adapter>")


def load_protocol(path: str | Path) -> AnyProtocol:
    """The protocol file at `path` for `--protocol`: a distribution or a sequence protocol
    (ProtocolError naming the file for any other kind, or a protocol that does not parse)."""
    source = read_protocol_file(Path(path))
    if source.kind.name not in (DISTRIBUTION_KIND, SEQUENCE_KIND):
        raise ProtocolError(
            f"{path}: check-adapter takes a distribution or sequence protocol, not kind {source.kind.name!r}"
        )
    return source.load()


def with_adapter(protocol: AnyProtocol, adapter: str, options: dict[str, Any]) -> AnyProtocol:
    """`protocol` with its sut.adapter replaced by `adapter` and `options` added to sut.options."""
    merged = {**dict(protocol.sut.options), **options}
    return replace(protocol, sut=replace(protocol.sut, adapter=adapter, options=tuple(sorted(merged.items()))))


def open_adapter(protocol: AnyProtocol) -> GuardedSUT:
    """The adapter `protocol.sut` names, constructed; CannotLoad naming it and the error otherwise."""
    spec: SutSpec = protocol.sut
    try:
        cls = load_adapter(spec.adapter)
        return GuardedSUT(cls(spec, protocol.num_speculative_tokens))
    except SUTError as err:
        raise CannotLoad(str(err)) from err
    except Exception as err:  # the adapter's constructor: anything it raises means it cannot be used
        raise CannotLoad(f"{spec.adapter}: the constructor raised {type(err).__name__}: {err}") from err


def run_checks(protocol: AnyProtocol, protocol_file: Path = CHECK_FILE) -> list[Finding]:
    """Every finding for the adapter of `protocol` (CannotLoad if it cannot be constructed); the
    adapter is closed at the end. Capabilities the protocol needs and the adapter lacks, or a failed
    contract probe, stop the checks that depend on them. `protocol_file` names the protocol (and
    gives line numbers) in the capabilities' message."""
    sequence = isinstance(protocol, SequenceProtocol)
    if sequence:  # two whole rounds per request: enough for the calls' contract, cheap for real models
        length = min(protocol.sequence_length, CHECK_ROUNDS * (protocol.num_speculative_tokens + 1))
        protocol = replace(protocol, sequence_length=length)
    sut = open_adapter(protocol)
    findings: list[Finding] = []
    try:
        protocol = _accepted_groups(sut, protocol, findings)
        context = None
        if protocol.groups and _capabilities(sut, protocol, protocol_file, findings):
            context = _contract(sut, protocol, findings)
        if context is not None:
            for check in SEQUENCE_CHECKS if sequence else CHECKS:
                findings += _guarded(check.__name__.removeprefix("_check_"), check, context)
    finally:
        findings += _close(sut)
    return findings


def _capabilities(sut: GuardedSUT, protocol: AnyProtocol, protocol_file: Path, findings: list[Finding]) -> bool:
    """True iff the adapter declares every capability the protocol needs (else a run refuses it: FIX)."""
    try:
        check_capabilities(protocol, sut, protocol_file)
    except ProtocolError as err:
        findings.append(Finding("capabilities", FIX, f"{err}: declare it (and implement it) or leave it out"))
        return False
    findings.append(Finding("capabilities", OK, "the adapter declares every capability the protocol needs"))
    return True


def _accepted_groups(sut: GuardedSUT, protocol: AnyProtocol, findings: list[Finding]) -> AnyProtocol:
    """`protocol` with the groups `check_groups` accepts; a refused group is a FIX (a run of it would be
    refused, and a mode in `capabilities.modes` must be one the adapter runs)."""
    accepted = []
    for group in protocol.groups:
        try:
            sut.check_groups((group,))
            accepted.append(group)
        except SUTError as err:
            findings.append(
                Finding(
                    "modes",
                    FIX,
                    f"check_groups refuses group {group.name!r} (mode {group.mode!r}: "
                    f"{err}); declare only the modes it runs in Capabilities.modes",
                )
            )
        except SUTRaised as err:
            findings.append(Finding("modes", FIX, str(err)))
    if len(accepted) == len(protocol.groups):
        findings.append(Finding("modes", OK, f"check_groups accepts {[g.mode for g in accepted]}"))
    return replace(protocol, groups=tuple(accepted))


def _contract(sut: GuardedSUT, protocol: AnyProtocol, findings: list[Finding]) -> CheckContext | None:
    try:
        if isinstance(protocol, SequenceProtocol):
            sequence_probe(sut, protocol, CHECK_FILE)
        else:
            probe(sut, protocol)
    except (SUTRaised, ProtocolError) as err:
        findings.append(Finding("contract", FIX, str(err)))
        return None
    if isinstance(protocol, SequenceProtocol):
        sample = "sample / sample_mixed" if any(g.companions for g in protocol.groups) else "sample"
        calls = ["vocab_size", "encode", f"{sample} ({len(protocol.groups)} group(s))", "target_logits_along"]
        calls, prompt = calls + ["draft_logits_along"] * bool(sequences.source_groups(protocol)), protocol.prompts[0]
    else:
        calls = ["vocab_size", "encode", "target_logits", f"sample ({len(protocol.groups)} group(s))"]
        if any(t.kind == "quadrature" for t in protocol.tests):
            calls += ["draft_logits", "accept_single"]
        prompt = protocol.prompt
    findings.append(Finding("contract", OK, f"{', '.join(calls)} answer with the shapes and dtypes the harness reads"))
    return CheckContext(sut, protocol, list(sut.encode(prompt)), int(sut.vocab_size))


def _guarded(name: str, check: Callable[[CheckContext], list[Finding]], context: CheckContext) -> list[Finding]:
    try:
        return check(context)
    except SUTRaised as err:
        return [Finding(name, FIX, str(err))]


def _sample(context: CheckContext, group, seeds: np.ndarray):
    protocol = context.protocol
    return context.sut.sample(
        group,
        context.prompt_ids,
        protocol.sampling,
        np.asarray(seeds, dtype=np.int64),
        protocol.positions,
        protocol.max_tokens(group),
    )


def _rows(batch) -> list[tuple]:
    """One hashable row per request: its tokens, sources and counts."""
    tokens, sources = np.asarray(batch.tokens), np.asarray(batch.sources).astype(str)
    counts = [np.asarray(c) for c in (batch.num_rounds, batch.num_draft_tokens, batch.num_accepted_tokens)]
    return [
        (tuple(tokens[i].tolist()), tuple(sources[i].tolist()), tuple(int(c[i]) for c in counts))
        for i in range(tokens.shape[0])
    ]


def _check_tokens(context: CheckContext) -> list[Finding]:
    found = []
    for group in context.protocol.groups:
        batch = _sample(context, group, CHECK_SEEDS)
        tokens, sources = np.asarray(batch.tokens), np.asarray(batch.sources).astype(str)
        drafted, accepted = np.asarray(batch.num_draft_tokens), np.asarray(batch.num_accepted_tokens)
        if tokens.min() < 0 or tokens.max() >= context.vocab:
            found.append(
                Finding(
                    "tokens",
                    FIX,
                    f"group {group.name!r}: tokens outside [0, {context.vocab}) "
                    f"(min {tokens.min()}, max {tokens.max()}); every run would FAIL out_of_range",
                )
            )
        if (drafted < 0).any() or (accepted < 0).any() or (accepted > drafted).any():
            found.append(
                Finding(
                    "tokens",
                    FIX,
                    f"group {group.name!r}: negative counts or more accepted than "
                    "drafted tokens; every run would FAIL impossible_counts",
                )
            )
        plain_only = bool((sources == "plain").all())
        if not group.is_speculative and not plain_only:
            found.append(
                Finding(
                    "tokens",
                    FIX,
                    f"group {group.name!r} (nospec) reports sources "
                    f"{sorted(set(sources.ravel()) - {'plain'})}; without speculation every token is 'plain'",
                )
            )
        if group.is_speculative and plain_only:
            found.append(
                Finding(
                    "tokens",
                    ADVICE,
                    f"group {group.name!r} reports only 'plain' sources: report "
                    "accepted / correction / bonus per token, or path-aware criteria (by_path) and the "
                    "report's source counts say nothing",
                )
            )
    return found or [
        Finding(
            "tokens",
            OK,
            f"tokens in [0, {context.vocab}), sources and counts consistent in "
            f"{len(context.protocol.groups)} group(s) x {CHECK_SEEDS.size} seeds",
        )
    ]


def _check_reproducible(context: CheckContext) -> list[Finding]:
    found = []
    for group in context.protocol.groups:
        if _rows(_sample(context, group, CHECK_SEEDS)) != _rows(_sample(context, group, CHECK_SEEDS)):
            found.append(
                Finding(
                    "reproducible",
                    FIX,
                    f"group {group.name!r}: the same seeds gave other tokens on a "
                    "second call: give each request its own generator seeded by its seed "
                    "(docs/harness.md section 8, step 4)",
                )
            )
    return found or [Finding("reproducible", OK, "the same seeds give the same rows, call after call")]


def _check_batch_independent(context: CheckContext) -> list[Finding]:
    found = []
    for group in context.protocol.groups:
        rows = _rows(_sample(context, group, CHECK_SEEDS))
        reversed_rows = _rows(_sample(context, group, CHECK_SEEDS[::-1]))[::-1]
        alone = _rows(_sample(context, group, CHECK_SEEDS[SINGLE_SEED_INDEX : SINGLE_SEED_INDEX + 1]))[0]
        if rows != reversed_rows or rows[SINGLE_SEED_INDEX] != alone:
            found.append(
                Finding(
                    "batch_independent",
                    FIX,
                    f"group {group.name!r}: a seed's tokens change with the "
                    "other seeds of its batch or their order: `sample` must be a pure function of each "
                    "request's seed (one generator per request, not one per batch)",
                )
            )
    return found or [
        Finding("batch_independent", OK, "a seed's row is the same alone, in a batch and in reverse order")
    ]


def _check_distinct_seeds(context: CheckContext) -> list[Finding]:
    """FIX when every seed gives one row, unless the target itself is (nearly) a point mass at the
    prompt, which no seed can vary: then ADVICE to test another prompt."""
    p = transform(
        context.sut.target_logits(context.prompt_ids), context.protocol.sampling, capabilities_of(context.sut).semantics
    )
    found, counts = [], []
    for group in context.protocol.groups:
        distinct = len(set(_rows(_sample(context, group, CHECK_SEEDS))))
        counts.append(f"{group.name} {distinct}")
        if distinct > 1:
            continue
        if float(np.max(p)) > 1.0 - 1.0 / CHECK_SEEDS.size:
            found.append(
                Finding(
                    "distinct_seeds",
                    ADVICE,
                    f"group {group.name!r}: one row for {CHECK_SEEDS.size} "
                    f"seeds, but t1 has probability {np.max(p):.4f} at this prompt: a protocol needs a "
                    "prompt whose next token is uncertain",
                )
            )
        else:
            found.append(
                Finding(
                    "distinct_seeds",
                    FIX,
                    f"group {group.name!r}: {CHECK_SEEDS.size} distinct seeds "
                    "gave one and the same row: the request seed does not reach the sampler",
                )
            )
    return found or [
        Finding(
            "distinct_seeds",
            OK,
            f"{CHECK_SEEDS.size} distinct seeds give more than one row (distinct rows: {', '.join(counts)})",
        )
    ]


def _check_target_logits(context: CheckContext) -> list[Finding]:
    sut, ids = context.sut, context.prompt_ids
    first = np.asarray(sut.target_logits(ids), dtype=np.float64)
    sut.target_logits(ids + [int(np.argmax(first))])  # another context in between
    again = np.asarray(sut.target_logits(ids), dtype=np.float64)
    if np.isposinf(first).any():
        return [Finding("target_logits", FIX, "+inf logits: the reference law is undefined")]
    if not np.array_equal(first, again):
        return [
            Finding(
                "target_logits",
                FIX,
                "two calls on the same tokens differ (max |diff| "
                f"{np.nanmax(np.abs(first - again)):.3g}) after a call on another context: target_logits must "
                "be deterministic and cache-free (the reference is built from it)",
            )
        ]
    return [Finding("target_logits", OK, "deterministic and unchanged by a call on another context")]


def _check_quadrature(context: CheckContext) -> list[Finding]:
    sut, protocol = context.sut, context.protocol
    capabilities = capabilities_of(sut)
    if not capabilities.accept_single:
        return [
            Finding(
                "quadrature",
                ADVICE,
                "accept_single=False: protocols cannot include the exact quadrature, "
                "the only check free of sampling error (docs/harness.md section 8, step 3)",
            )
        ]
    speculative = [g for g in protocol.groups if g.is_speculative]
    if not speculative:
        return [Finding("quadrature", ADVICE, "accept_single is declared but no speculative mode is")]
    p = transform(sut.target_logits(context.prompt_ids), protocol.sampling, capabilities.semantics)
    q = draft_law(
        sut.draft_logits(speculative[0], context.prompt_ids),
        protocol.sampling,
        capabilities.semantics,
        capabilities.draft_kind,
    )
    p_cut, q_cut, _ = quadrature.restrict_to_support(p.astype(sut.prob_dtype), q.astype(sut.prob_dtype), 2)
    try:
        result = quadrature.quadrature_check(p_cut, q_cut, sut.accept_single, QUADRATURE_TOL, grid_size=QUADRATURE_GRID)
    except ValueError as err:  # the output could not be read as tokens
        return [Finding("quadrature", FIX, f"accept_single: {err}")]
    findings = [_quadrature_finding(result)]
    return findings + _check_vectorised(sut, p_cut, q_cut)


def _quadrature_finding(result) -> Finding:
    if result.passed:
        return Finding(
            "quadrature",
            OK,
            f"one speculative step at the prompt emits p within the resolution "
            f"1/{QUADRATURE_GRID} ({result.num_rows} rows)",
        )
    return Finding(
        "quadrature",
        FIX,
        f"the law of one speculative step differs from p by up to "
        f"{result.max_abs_error:.3g} (resolution {1 / QUADRATURE_GRID:.3g}): accept iff u * q(x) < p(x), "
        "else draw from max(p - q, 0); uniforms are (draft, accept, correction/bonus)",
    )


def _least_time(call: Callable[[], Any]) -> float:
    times = []
    for _ in range(TIMING_REPEATS):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def _accept_rows(p: np.ndarray, q: np.ndarray, rows: int) -> tuple:
    rng = np.random.default_rng(0)
    tokens = np.zeros(rows, dtype=np.int64) + int(np.argmax(q))
    return (tokens, np.broadcast_to(q, (rows, q.size)), np.broadcast_to(p, (rows, p.size)), rng.random((rows, 3)))


def _check_vectorised(sut: GuardedSUT, p: np.ndarray, q: np.ndarray) -> list[Finding]:
    one, many = _accept_rows(p, q, 1), _accept_rows(p, q, ACCEPT_ROWS)
    per_row = _least_time(lambda: sut.accept_single(*many)) / ACCEPT_ROWS
    single = _least_time(lambda: sut.accept_single(*one))
    estimate = per_row * RUN_QUADRATURE_ROWS
    if per_row < VECTORISED_RATIO * single:
        return [
            Finding(
                "vectorised",
                OK,
                f"accept_single is vectorised: {per_row * 1e6:.2g} us per row in a call "
                f"of {ACCEPT_ROWS} rows (a run's quadrature: ~{estimate:.2g} s)",
            )
        ]
    return [
        Finding(
            "vectorised",
            ADVICE,
            f"accept_single costs {per_row * 1e6:.2g} us per row in a call of "
            f"{ACCEPT_ROWS} rows, as much as a call of one row: it loops per row. A run's quadrature sweeps "
            f"~{RUN_QUADRATURE_ROWS:,} rows (~{estimate:.0f} s): vectorise it over rows "
            "(docs/harness.md section 8, examples/adapter_minimal/toy_adapter.py)",
        )
    ]


def _check_speed(context: CheckContext) -> list[Finding]:
    found, protocol = [], context.protocol
    sequence = isinstance(protocol, SequenceProtocol)
    per_group = getattr(protocol, "sequences_per_group", CI_SAMPLES_PER_GROUP)
    unit = f"sequences of {protocol.positions} tokens" if sequence else "samples"
    for group in protocol.groups:
        seconds = _least_time(functools.partial(_sample, context, group, SPEED_SEEDS))
        rate = SPEED_SEEDS.size / seconds
        level = ADVICE if rate < SLOW_SAMPLES_PER_S and not sequence else OK
        found.append(
            Finding(
                "speed",
                level,
                f"group {group.name!r}: {rate:,.0f} {unit}/s in one call of "
                f"{SPEED_SEEDS.size} requests; {per_group:,}{' such' * sequence} per group: ~{per_group / rate:.0f} s"
                + ("; batch the requests of one call (many seeds per engine call)" if level == ADVICE else ""),
            )
        )
    return found


def _check_describe(context: CheckContext) -> list[Finding]:
    facts = context.sut.describe()
    if not isinstance(facts, dict):
        return [Finding("describe", FIX, f"returned {type(facts).__name__}, expected a dict (the manifest records it)")]
    try:
        json.dumps(facts)
    except (TypeError, ValueError) as err:
        return [Finding("describe", FIX, f"is not JSON-able ({err}): the manifest cannot record it")]
    if set(facts) <= DEFAULT_DESCRIBE_KEYS:
        return [
            Finding(
                "describe",
                ADVICE,
                "returns only the defaults: add the engine's name and version, the "
                "model, dtype and device, so a bundle says what was tested",
            )
        ]
    return [Finding("describe", OK, f"records {sorted(facts)}")]


# ---------------------------------------------------------------- sequence protocols


def _laws(context: CheckContext, logits: np.ndarray) -> np.ndarray:
    return transform(logits, context.protocol.sampling, capabilities_of(context.sut).semantics)


def _sequences(context: CheckContext, group, seeds: np.ndarray) -> list[tuple[int, np.ndarray, np.ndarray]]:
    """(seed, tokens, sources) of one `sample` call of `group` on `seeds`."""
    batch = _sample(context, group, seeds)
    return list(zip(seeds.tolist(), np.asarray(batch.tokens), np.asarray(batch.sources).astype(str)))


def _off_prefix(context: CheckContext, rows: np.ndarray, single, tokens: np.ndarray) -> str:
    """What the first row whose law is not within ALONG_TV_TOL of `single(its prefix)`'s shows; "" if none."""
    prompt, laws = context.prompt_ids, _laws(context, rows)
    for i in range(len(tokens)):
        tv = 0.5 * float(np.abs(laws[i] - _laws(context, single(prompt + tokens[:i].tolist()))).sum())
        if tv > ALONG_TV_TOL:
            return f"row {i} is {tv:.3g} in TV from the law after prompt + tokens[:{i}] (a row of another prefix?)"
    return ""


def _check_target_logits_along(context: CheckContext) -> list[Finding]:
    _, tokens, _ = _sequences(context, context.protocol.groups[-1], CHECK_SEEDS[:1])[0]
    rows = sequences.replay(context.sut, context.prompt_ids, tokens, "target_logits_along")
    wrong = _off_prefix(context, rows, context.sut.target_logits, tokens)
    if wrong:
        return [Finding("target_logits_along", FIX, f"{wrong}: row i must be target_logits(prompt + tokens[:i])")]
    return [Finding("target_logits_along", OK, f"each of {len(tokens)} rows is the law after its own prefix")]


def _check_draft_logits_along(context: CheckContext) -> list[Finding]:
    """Groups under a source test: rows deterministic, equal to draft_logits of their prefix (an own
    draft, where the adapter has draft_logits), and every accepted or corrected token possible."""
    sut, protocol, prompt, found = context.sut, context.protocol, context.prompt_ids, []
    assert isinstance(protocol, SequenceProtocol)
    for group in (g for g in protocol.groups if g.name in sequences.source_groups(protocol)):
        single = _draft_logits(sut, group, prompt) if group.draft == OWN_DRAFT else None
        impossible, fault = [], ""
        for seed, tokens, sources in _sequences(context, group, CHECK_SEEDS[:SEQUENCE_SEEDS]):
            draft = sequences.draft_replay(sut, protocol, group.name, prompt, tokens, seed)
            if not np.array_equal(draft, sequences.draft_replay(sut, protocol, group.name, prompt, tokens, seed)):
                fault = f"two calls on seed {seed} differ: the rows must be a function of the call's arguments"
            elif single is not None:
                fault = _off_prefix(context, draft, single, tokens)
                fault = fault and f"seed {seed}: {fault}: row i must be the draft after prompt + tokens[:i]"
            if fault:
                break
            p = _laws(context, sequences.replay(sut, prompt, tokens, "target_logits_along"))
            mass = sequences.source_parts(p, _laws(context, draft), tokens, sources)["source_mass"]
            bad = np.flatnonzero(np.isin(sources, (sequences.ACCEPTED, sequences.CORRECTION)) & (mass <= 0))
            impossible += [f"seed {seed}, position {i}: {sources[i]} {int(tokens[i])}" for i in bad]
        if impossible and not fault:
            fault = (
                f"{len(impossible)} token(s) impossible under their source's law with q from these rows "
                f"({impossible[0]}): the rows are not the q the rounds drafted from, or the sources are wrong"
            )
        if fault:
            found.append(Finding("draft_logits_along", FIX, f"group {group.name!r}: {fault}"))
    return found or [Finding("draft_logits_along", OK, "deterministic, and every source label is possible under q")]


def _draft_logits(sut: GuardedSUT, group, prompt_ids: list[int]):
    """`draft_logits` of `group` as a function of a prefix; None without one (sequence runs never call it)."""
    try:
        sut.draft_logits(group, list(prompt_ids))
    except SUTRaised:
        return None
    return functools.partial(sut.draft_logits, group)


def _check_mixed(context: CheckContext) -> list[Finding]:
    """Groups with companions: the tested rows of one sample_mixed call equal sample's rows of the same
    seeds (a run's re-run compares them bit for bit), and each companion follows its own sampling."""
    sut, protocol, prompt, found = context.sut, context.protocol, context.prompt_ids, []
    assert isinstance(protocol, SequenceProtocol)
    seeds, semantics = CHECK_SEEDS[:SEQUENCE_SEEDS], capabilities_of(sut).semantics
    for group in (g for g in protocol.groups if g.companions):
        companions = [group.companions[j % len(group.companions)] for j in range(seeds.size)]
        samplings, ids = [protocol.sampling] * seeds.size + companions, np.concatenate([seeds, companion_seeds(seeds)])
        batch = sut.sample_mixed(group, prompt, samplings, ids, protocol.positions, protocol.max_tokens(group))
        batch = check_batch("sample_mixed", batch, ids.size, protocol.positions, context.vocab)
        fault = ""
        if _rows(batch)[: seeds.size] != _rows(_sample(context, group, seeds)):
            fault = "its tested rows differ from sample's for the same seeds (a row must not depend on its neighbours)"
        for j, (tokens, companion) in enumerate(zip(np.asarray(batch.tokens)[seeds.size :], companions)):
            logits = sequences.replay(sut, prompt, tokens, "target_logits_along")
            status = sequences.companion_status(logits, tokens, companion, protocol.support_tolerance, semantics)
            outside = np.flatnonzero(status == sequences.OUT_OF_SUPPORT)
            if outside.size and not fault:
                fault = (
                    f"companion {j} (temperature {companion.temperature:g}) emitted a token its own sampling "
                    f"cannot at position {outside[0]} (greedy: not the argmax): apply each row's own sampling"
                )
        if fault:
            found.append(Finding("mixed", FIX, f"group {group.name!r}, sample_mixed: {fault}"))
    return found or [Finding("mixed", OK, "sample_mixed rows equal sample's, companions follow their own sampling")]


def _close(sut: GuardedSUT) -> list[Finding]:
    try:
        sut.close()
    except SUTRaised as err:
        return [Finding("close", FIX, str(err))]
    return []


CHECKS = (
    _check_tokens,
    _check_reproducible,
    _check_batch_independent,
    _check_distinct_seeds,
    _check_target_logits,
    _check_quadrature,
    _check_speed,
    _check_describe,
)
SEQUENCE_CHECKS = (
    _check_tokens,
    _check_reproducible,
    _check_batch_independent,
    _check_distinct_seeds,
    _check_target_logits,
    _check_target_logits_along,
    _check_draft_logits_along,
    _check_mixed,
    _check_speed,
    _check_describe,
)


__all__ = [
    "ADVICE",
    "CannotLoad",
    "CheckContext",
    "FIX",
    "Finding",
    "OK",
    "check_protocol",
    "load_protocol",
    "open_adapter",
    "run_checks",
    "with_adapter",
]
