"""The Python API of specval: run a protocol and verify a bundle from code (public, semver'd).

    import specval

    result = specval.run("protocols/t2_fp32.yaml", profile="ci")          # -> specval.Result
    print(result.verdict, result.bundle)                                   # PASS / FAIL / INCONCLUSIVE
    for criterion in result.failing:                                       # what kept the run from PASS
        print(criterion.name, criterion.verdict, criterion.reason)
    assert specval.verify(result.bundle).ok                                # re-hash and recompute

`specval run` and `specval run --resume` are thin layers over `run_protocol_file`, the function
behind `run` and `resume`, so the API and the command give the same bundles and verdicts.

`run` and `resume` are supervised as `specval run` is: the adapter is imported, built and called in
a worker process (specval.worker: a fresh Python for an adapter with an importable name, a forked
child for one without), and the call returns only a bundle whose seal (SHA256SUMS, written by this
call) covers its summary.json. An adapter that ends the worker (`os._exit` with any status, a
signal, a crash) or hangs past SPECVAL_TIMEOUT_S raises `WorkerDied` (a `SUTRaised`: the CLI's
exit 3) naming what happened and the kept bundle; never a Result, never a PASS.

Guarantees (those of `specval run`, docs/harness.md section 1):
- Refused before any seed is claimed, nothing written: a protocol that does not parse or is not
  frozen as written (unless `exploratory`), one over the Monte Carlo budget (specval.budget: a
  criterion planning more null draws than MC_DRAW_BUDGET), overlapping seeds, an unwritable
  output root, a group or capability the adapter lacks (one of `INPUT_ERRORS`: the CLI's exit 2);
  an adapter that raises or breaks its contract in the probe (`SUTRaised`: exit 3).
- Once the bundle exists: an exception of the adapter is `RunFailed` (the bundle is kept,
  unsealed, for `resume`), an interrupt `RunInterrupted`.
- At any point, a worker that ended without an answer the disk bears out: `WorkerDied`.
- At any point, the operating system or the output root refusing the harness (disk full, file size
  limit, permissions, an unreadable seed ledger) is one of `ENVIRONMENT_ERRORS` (exit 5).
- Otherwise the bundle is sealed and the `Result` holds the verdict of its summary.json, the same
  that `Result.from_bundle` reads back and `verify` recomputes.
No signal handler is installed in the caller's process and nothing is printed unless `progress` is
set (a library call); the worker prints what a run prints (the progress bar) on the caller's stdout
and stderr.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specval import budget, lifecycle, signing, worker
from specval import bundle as bundles
from specval import protocol as protocols
from specval.bundle import BundleError
from specval.distribution.decision import DETERMINISTIC_KINDS
from specval.distribution.effects import SIZES_KEY
from specval.execution import EnvironmentFailed, RunFailed, RunInterrupted, WorkerDied
from specval.kinds import DISTRIBUTION_KIND, KINDS, Kind, ProtocolFile, bundle_kind, read_protocol_file
from specval.performance.protocol import PERFORMANCE_KIND
from specval.preflight import SUTRaised
from specval.protocol import GATING_ROLES, ProtocolError
from specval.report import junit as junits
from specval.seeds import LedgerError, SeedOverlapError
from specval.sut import SUT, SUTError, SutFactory, load_adapter

DEFAULT_OUTPUT = Path("results")  # as `specval run --output`
PASS = "PASS"
INPUT_ERRORS = (ProtocolError, SeedOverlapError, BundleError, SUTError)  # refused before any seed: exit 2
# The operating system or the output root refused the harness (disk full, permissions, an unreadable
# seed ledger): the CLI's exit 5; EnvironmentFailed names the kept bundle (it resumes).
ENVIRONMENT_ERRORS = (EnvironmentFailed, LedgerError, OSError)
SutArg = None | str | type | SutFactory  # see `run`
DISTRIBUTION = KINDS[DISTRIBUTION_KIND]  # the kind of a protocol file that could not be read (its runner says why)
API_COMMAND = "specval.run"  # first word of the session command a bundle records for an API run


@dataclass(frozen=True)
class Criterion:
    """One criterion of a run, as its summary.json records it (docs/harness.md sections 3 and 7).

    `verdict` is the criterion's final verdict: for a two-stage protocol whose second stage ran,
    that of the stage that decided it (the stage-1 FAIL of a gating criterion takes its stage-2
    verdict). `mde` is the total-variation distance the criterion detects with the protocol's
    power (`mde_label` says which TV); None where the criterion has none (deterministic checks,
    quality criteria). `sample_size`: samples the criterion tested (None where it counts none)."""

    name: str
    role: str  # control / primary (gating) or secondary
    verdict: str  # PASS / FAIL / INCONCLUSIVE
    reason: str
    statistic: float | None
    p_value: float | None
    p_adjusted: float | None  # Holm-adjusted within its family
    mde: float | None
    mde_label: str | None
    sample_size: int | None

    @property
    def gating(self) -> bool:
        """True iff the run's verdict depends on this criterion (control and primary roles)."""
        return self.role in GATING_ROLES

    def line(self) -> str:
        """One line: verdict, role, name, reason (the CLI's criterion line)."""
        return f"{self.verdict:<12} {self.role:<9} {self.name}: {self.reason}"


@dataclass(frozen=True)
class Result:
    """The outcome of one run: verdict, criteria and the bundle that holds the evidence.

    `verdict` PASS iff every gating criterion PASSed (the bundle's verdict, never recomputed here);
    `exploratory` True when the protocol ran unfrozen (`--exploratory`), which the verdict must be
    read with; `summary` is summary.json as read, for anything not lifted into fields."""

    verdict: str
    reason: str
    bundle: Path
    protocol: str  # the protocol's name
    kind: str  # distribution, quality or performance
    profile: str | None
    exploratory: bool
    criteria: tuple[Criterion, ...]
    summary: Mapping[str, Any] = field(repr=False, compare=False)

    @property
    def passed(self) -> bool:
        return self.verdict == PASS

    @property
    def failing(self) -> tuple[Criterion, ...]:
        """The gating criteria that did not PASS (FAIL first, then INCONCLUSIVE): what kept the run
        from PASS. Empty iff the run PASSed."""
        gating = [c for c in self.criteria if c.gating and c.verdict != PASS]
        return tuple(sorted(gating, key=lambda c: (c.verdict != "FAIL", c.name)))

    @property
    def mdes(self) -> dict[str, float]:
        """Criterion name -> MDE (TV), for every criterion that has one."""
        return {c.name: c.mde for c in self.criteria if c.mde is not None}

    def criterion(self, name: str) -> Criterion:
        """The criterion called `name`; KeyError listing the names otherwise."""
        for criterion in self.criteria:
            if criterion.name == name:
                return criterion
        raise KeyError(f"no criterion {name!r}; the run has {[c.name for c in self.criteria]}")

    def explain(self) -> str:
        """Several lines for a test failure or a log: the verdict, every criterion that kept the run
        from PASS with its reason (its size, when the summary records sizes) and, where it tells what
        the criterion could have missed, its MDE; and the bundle's path."""
        marker = "EXPLORATORY " if self.exploratory else ""
        lines = [f"{self.protocol} ({self.profile or 'default'}): {marker}{self.verdict}: {self.reason}"]
        lines += [f"  {c.line()}{self._mde_note(c)}" for c in self.failing]
        return "\n".join(lines + [f"bundle: {self.bundle}"])

    def _mde_note(self, criterion: Criterion) -> str:
        """The `[MDE x]` note after a criterion's line, where the MDE tells what it could have missed: never
        for a deterministic failure (a sample out of support, a quadrature or validity check: proof
        of a bug, whatever the MDE), nor for a FAIL whose reason already gives its size beside the MDE
        (a summary with sized rows)."""
        row = (self.summary.get("tests") or {}).get(criterion.name) or {}
        if criterion.mde is None or row.get("out_of_support") or row.get("kind") in DETERMINISTIC_KINDS:
            return ""
        if criterion.verdict == "FAIL" and SIZES_KEY in self.summary:
            return ""
        return f" [MDE {criterion.mde:.4g}]"

    @classmethod
    def from_summary(cls, bundle: Path, summary: Mapping[str, Any]) -> Result:
        """The result a bundle's summary.json (`summary`) records."""
        proto, registration = summary.get("protocol") or {}, summary.get("registration") or {}
        return cls(
            verdict=summary["verdict"],
            reason=summary.get("reason", ""),
            bundle=Path(bundle),
            protocol=proto.get("name", ""),
            kind=summary.get("kind") or "distribution",
            profile=proto.get("profile"),
            exploratory=bool(registration.get("exploratory")),
            criteria=criteria_of(summary),
            summary=summary,
        )

    @classmethod
    def from_bundle(cls, bundle: str | os.PathLike[str]) -> Result:
        """The result recorded in a finished bundle (BundleError naming the file if it has no
        readable summary.json). Read only: `verify` checks that the record is sound."""
        path = Path(bundle)
        return cls.from_summary(path, bundles.read_json(path / bundles.SUMMARY_FILE))


def criteria_of(summary: Mapping[str, Any]) -> tuple[Criterion, ...]:
    """Every criterion of a summary (none for a performance summary, which has one verdict)."""
    if not summary.get("tests"):
        return ()
    failing = junits.failing(summary)
    return tuple(_criterion(summary, name, test, failing) for name, test in sorted(summary["tests"].items()))


def _criterion(summary: Mapping[str, Any], name: str, test: Mapping[str, Any], failing: set[str]) -> Criterion:
    return Criterion(
        name=name,
        role=test["role"],
        verdict=_final_verdict(summary, name, failing),
        reason=junits.reason(summary, name),
        statistic=_number(test.get("statistic")),
        p_value=_number(test.get("p_value")),
        p_adjusted=_number(test.get("p_adjusted")),
        mde=_number(test.get("mde_tv")),
        mde_label=test.get("mde_label"),
        sample_size=_count(test.get("effective_n", test.get("n"))),
    )


def _final_verdict(summary: Mapping[str, Any], name: str, failing: set[str]) -> str:
    """FAIL when it fails the run; a gating stage-1 FAIL that stage 2 re-tested takes stage 2's."""
    if name in failing:
        return "FAIL"
    verdict: str = summary["tests"][name]["verdict"]
    second = (summary.get("confirmation") or {}).get("stage2")
    if second and verdict == "FAIL" and summary["tests"][name]["role"] in GATING_ROLES:
        confirmed: str = second["tests"].get(name, {}).get("verdict", verdict)
        return confirmed
    return verdict


def _number(value: Any) -> float | None:
    return (
        float(value)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        else None
    )


def _count(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Verification:
    """What `verify` found: `differences` (empty iff the bundle verifies: checksums, recomputed
    verdicts, the signature and the pinned protocol), the code note (the bundle was made by
    another code version than the one verifying it; None when the same), `signature`, the line
    that says who signed it or that nobody did ("unsigned: internal consistency only"), `pinned`,
    the frozen protocol hash it was checked against (None: none pinned), and `notes`, every
    informational line (code version, an older bundle format)."""

    bundle: Path
    differences: tuple[str, ...]
    note: str | None
    signature: str = signing.UNSIGNED_LINE
    pinned: str | None = None
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.differences


# ---------------------------------------------------------------- the calls


def sut_factory(sut: SutArg) -> SutFactory | None:
    """The adapter factory for `sut`: None (the protocol's own `sut.adapter`), a name as
    `sut.adapter` takes it ("package.module:Class" or an entry point of group `specval.sut`), a
    `specval.sut.SUT` subclass, or any callable (SutSpec, num_speculative_tokens) -> SUT.
    SUTError naming the value if a name does not load; TypeError for anything else."""
    if sut is None:
        return None
    if isinstance(sut, str):
        cls = load_adapter(sut)
        return lambda spec, k: cls(spec, k)
    if isinstance(sut, type) and not issubclass(sut, SUT):
        raise TypeError(f"sut: {sut!r} is not a subclass of specval.sut.SUT")
    if not callable(sut):
        raise TypeError(f"sut: expected None, 'module:Class', a SUT subclass or a factory, got {sut!r}")
    return sut


def _sut_name(sut: SutArg) -> str:
    if isinstance(sut, str):
        return sut
    return f"{getattr(sut, '__module__', '?')}:{getattr(sut, '__qualname__', type(sut).__qualname__)}"


def run(
    protocol: str | os.PathLike[str],
    *,
    profile: str | None = None,
    sut: SutArg = None,
    output: str | os.PathLike[str] = DEFAULT_OUTPUT,
    exploratory: bool = False,
    seed_offset: int | None = None,
    junit: str | os.PathLike[str] | None = None,
    progress: bool = False,
    announce: Callable[[Path], None] | None = None,
) -> Result:
    """Run the protocol file `protocol` (any kind) at `profile` and return its Result; the bundle is
    written under `output` (with the seed ledger), as `specval run PROTOCOL --profile P --output O`.

    `sut`: the adapter to test instead of the one the protocol names (see `sut_factory`); the
    bundle's manifest records the adapter that ran (`SUT.describe()`). A name, or a class or
    function importable as `module:qualname`, runs in a fresh Python; any other callable (a lambda,
    a closure, a class defined in a function) in a worker forked from this process, which cannot
    use a CUDA context this process holds (specval.worker); without fork it is a TypeError. A
    performance protocol times the bundled engine and takes no `sut` or `seed_offset` (ValueError).
    `junit`: also write JUnit XML there (checked writable before any seed is claimed).
    `announce(bundle)`: called in this process once the bundle exists, before any sample is drawn.
    Raises as the module docstring says; returns only with a bundle sealed by this call."""
    source = read_protocol_file(Path(protocol))
    if source.kind.name == PERFORMANCE_KIND and (sut is not None or seed_offset is not None):
        raise ValueError(
            f"{protocol}: a performance protocol times the bundled engine; it takes no "
            f"{'sut' if sut is not None else 'seed_offset'}"
        )
    budget.check_profile(source.load(), profile, Path(protocol))  # here too: this refusal needs no worker
    command = [API_COMMAND, str(protocol), f"profile={profile}"] + ([f"sut={_sut_name(sut)}"] if sut else [])
    request = worker.Request(
        str(output),
        tuple(command),
        protocol=str(protocol),
        profile=profile,
        exploratory=exploratory,
        seed_offset=seed_offset,
        junit=None if junit is None else str(junit),
        progress=progress,
    )
    return _supervised(request, sut, announce)


def resume(
    bundle: str | os.PathLike[str],
    *,
    sut: SutArg = None,
    junit: str | os.PathLike[str] | None = None,
    progress: bool = False,
    announce: Callable[[Path], None] | None = None,
) -> Result:
    """Continue a killed, interrupted or failed run in its own bundle (`specval run --resume`),
    with the protocol, profile, seed ranges and registration recorded in it, in a worker process
    as `run` does. A bundle whose run recorded its verdict before an environment fault is only
    completed (report, manifest, seal: `lifecycle.complete`), without the system under test, and
    only if its verdict recomputes from its raw samples unchanged."""
    path = Path(bundle)
    kind = bundle_kind(path)
    if not kind.resumable:
        raise BundleError(f"{path}: a {kind.name} bundle is not resumable; start a new run")
    command = [API_COMMAND, f"resume={path}"] + ([f"sut={_sut_name(sut)}"] if sut else [])
    junit_file = None if junit is None else str(junit)
    request = worker.Request(str(path.parent), tuple(command), resume=str(path), junit=junit_file, progress=progress)
    return _supervised(request, sut, announce)


def _supervised(request: worker.Request, sut: SutArg, announce: Callable[[Path], None] | None) -> Result:
    """The Result of `request`, run in a worker (specval.worker), or here when this process is
    itself a supervised worker (its supervisor stands for the call)."""
    if worker.supervised():
        return _run_request(request, sut_factory(sut), announce)
    name, factory = _worker_sut(sut)
    request = dataclasses.replace(
        request,
        sut=name,
        sut_object=name is not None and not isinstance(sut, str),
        announce=announce is not None,
        sys_path=tuple(sys.path),
    )
    forked = None
    if factory is not None:

        def forked(root: Path) -> None:  # in the forked child: the object itself, no import
            worker.answer_call(root, request.announce, lambda told: _run_request(request, factory, told).bundle)

    path, summary = worker.delegate(request, announce, forked)
    return Result.from_summary(path, summary)


def _worker_sut(sut: SutArg) -> tuple[str | None, SutFactory | None]:
    """(the name the worker imports the adapter by, None), or (None, the factory a forked worker
    calls) for an object without an importable name; (None, None): the protocol's own adapter.
    A name is not loaded here (the worker's SUTError names it); TypeError for a bad object, or for
    one without a name where this platform cannot fork."""
    if sut is None or isinstance(sut, str):
        return sut, None
    factory = sut_factory(sut)
    name = worker.importable_name(sut)
    if name is None and not worker.CAN_FORK:
        raise TypeError(f"sut: {sut!r} has no importable name (module:qualname) and this platform cannot fork")
    return name, None if name is not None else factory


def serve(directory: str) -> None:
    """The fresh worker's side of `run` and `resume` (specval.worker.BOOT): run the request in the
    channel directory and write the answer. Not part of the semver'd API."""
    root = Path(directory)
    request = worker.read_request(root)

    def call(told: Callable[[Path], None]) -> Path:
        named = worker.import_object(request.sut) if request.sut and request.sut_object else request.sut
        return _run_request(request, sut_factory(named), told).bundle

    worker.answer_call(root, request.announce, call)


def _run_request(
    request: worker.Request, factory: SutFactory | None, announce: Callable[[Path], None] | None
) -> Result:
    """`request` run in this process (`run_protocol_file`)."""
    junit = request.junit
    if request.resume is not None:
        path = Path(request.resume)
        return run_protocol_file(
            None,
            None,
            None,
            path.parent,
            resume=path,
            junit=junit,
            progress=request.progress,
            announce=announce,
            sut_factory=factory,
            command=list(request.command),
            kind=bundle_kind(path),
        )
    protocol = Path(str(request.protocol))
    return run_protocol_file(
        read_protocol_file(protocol),
        protocol,
        request.profile,
        Path(request.output),
        exploratory=request.exploratory,
        seed_offset=request.seed_offset,
        junit=junit,
        progress=request.progress,
        announce=announce,
        sut_factory=factory,
        command=list(request.command),
    )


def run_protocol_file(
    source: ProtocolFile | None,
    protocol_file: Path | None,
    profile: str | None,
    output: Path,
    *,
    resume: Path | None = None,
    exploratory: bool = False,
    seed_offset: int | None = None,
    junit: str | os.PathLike[str] | None = None,
    progress: bool = False,
    announce: Callable[[Path], None] | None = None,
    sut_factory: SutFactory | None = None,
    command: list[str] | None = None,
    kind: Kind | None = None,
    **extra: Any,
) -> Result:
    """The run behind `run`, `resume` and `specval run`, in THIS process (the adapter shares it: the
    supervised workers of the CLI and of `run` call it): `source` is `protocol_file` as read once
    (None with `resume`, whose bundle names its kind: `kind`); `extra` goes to the kind's runner
    (`shards` of a multi-rank run). Not itself part of the semver'd API."""
    if junit is not None:
        junits.check_target(Path(junit), "junit")
    if kind is None:
        kind = source.kind if source is not None else bundle_kind(resume) if resume is not None else DISTRIBUTION
    options = dict(resume=resume, seed_offset=seed_offset, sut_factory=sut_factory, **extra)
    if kind.name == PERFORMANCE_KIND:
        options = {}
    parsed = None if source is None else source.load()
    if source is not None and parsed is not None:  # a new run: over the budget is refused before the ledger
        budget.check_profile(parsed, profile, protocol_file or source.path)
    if resume is not None and bundles.recorded_verdict(resume):  # finish what a fault left: never collect
        path, summary = resume, lifecycle.complete(resume, kind.recompute, kind.finish, command, announce)
    else:
        path, summary = kind.runner()(
            protocol_file,
            profile,
            output,
            exploratory=exploratory,
            progress=progress,
            announce=announce,
            command=command,
            parsed=parsed,
            **options,
        )
    if junit is not None:
        junits.write_junit(summary, Path(junit), path)
    return Result.from_summary(path, summary)


def verify(
    bundle: str | os.PathLike[str],
    *,
    key: str | os.PathLike[str] | None = None,
    protocol: str | os.PathLike[str] | None = None,
    protocol_hash: str | None = None,
) -> Verification:
    """Re-hash every file of the bundle, recompute every verdict from its raw files, check its
    signature and, when asked, the protocol it ran: what `specval verify` checks and prints.

    `key`: the signer's ed25519 public key file (PEM): a difference unless the bundle is signed by
    it and unchanged since; None: a signed bundle is checked against the key it embeds (proving
    integrity since signing, not whose key it is) and an unsigned one verifies with the line
    "unsigned: internal consistency only". `protocol` (a protocol file, frozen in the lock beside
    it) or `protocol_hash` (a SHA-256 in hex): a difference unless the bundle ran exactly that
    frozen protocol. With `key`, the signature is checked first (the envelope, sessions.json and
    every file's hash): a bundle it does not cover returns those differences alone, and no other
    file is parsed (as `specval verify --key`). Bad input raises before the bundle is read, in this order:
    signing.SigningError for a key file that is not an ed25519 public key, ValueError for both
    `protocol` and `protocol_hash`, ProtocolError for a protocol that cannot be pinned,
    BundleError unless `bundle` is a bundle."""
    path = Path(bundle)
    public_key = None if key is None else signing.load_public_key(Path(key))
    pinned = pinned_hash(protocol, protocol_hash)
    if not (path / bundles.RUN_FILE).is_file():
        raise bundles.BundleError(f"{path}: not a bundle ({bundles.RUN_FILE} missing)")
    if public_key is not None:  # signature first: a bundle it does not cover is not parsed any further
        signature = signing.check_signature(path, public_key)
        if signature.problems:
            return Verification(path, tuple(signature.problems), None, signature.line, pinned, ())
    differences = bundle_kind(path).verify(path)
    signature = signing.check_signature(path, public_key)
    differences += [*signature.problems, *(bundles.check_pinned(path, pinned) if pinned else [])]
    code_note = bundles.code_note(path)
    notes = tuple(note for note in (code_note, bundles.format_note(path)) if note)
    return Verification(path, tuple(differences), code_note or None, signature.line, pinned, notes)


SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def pinned_hash(
    protocol: str | os.PathLike[str] | None,
    protocol_hash: str | None,
    flags: tuple[str, str] = ("--protocol", "--protocol-hash"),
) -> str | None:
    """The protocol hash a verification pins (None: none): `protocol_hash` (lower-cased), or the
    hash of `protocol`, which must be frozen in the lock beside it. ProtocolError naming the
    value (by `flags`, the names the caller gave them) otherwise."""
    if protocol is not None and protocol_hash is not None:
        raise ValueError(f"give {flags[0]} or {flags[1]}, not both")
    if protocol_hash is not None:
        if not SHA256_HEX.fullmatch(protocol_hash.lower()):
            raise ProtocolError(f"{flags[1]} {protocol_hash!r}: not a SHA-256 in hex (64 digits)")
        return protocol_hash.lower()
    if protocol is None:
        return None
    file = Path(protocol)
    loaded = read_protocol_file(file).load()
    state = protocols.registration(loaded, file)
    if state != protocols.FROZEN:
        raise ProtocolError(
            f"{flags[0]} {file}: protocol {loaded.name!r} is {state} in "
            f"{protocols.lock_path(file)}; only a frozen protocol can be pinned"
        )
    digest: str = loaded.hash
    return digest


__all__ = [
    "Criterion",
    "DEFAULT_OUTPUT",
    "ENVIRONMENT_ERRORS",
    "EnvironmentFailed",
    "INPUT_ERRORS",
    "LedgerError",
    "BundleError",
    "ProtocolError",
    "Result",
    "RunFailed",
    "RunInterrupted",
    "SUTError",
    "SUTRaised",
    "SeedOverlapError",
    "Verification",
    "WorkerDied",
    "criteria_of",
    "pinned_hash",
    "resume",
    "run",
    "run_protocol_file",
    "sut_factory",
    "verify",
]
