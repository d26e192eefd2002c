"""Preflight: everything that can be checked before a run claims a seed.

A run claims seeds only after all of these hold; otherwise nothing is written (no bundle, no ledger
entry) and the command exits 2 (input) or 3 (the system under test raised or broke its contract):

- the output root and the `--junit` file can be written (exit 2, naming the path);
- the protocol asks only for what the adapter declares in `SUT.capabilities` (exit 2, naming the
  capability and the protocol's file and line), filter semantics pinned under
  `sampling.semantics` included;
- the adapter answers a probe: `plan_batches` (told the protocol's batch size), `vocab_size`,
  `encode`, `target_logits` and, for every group, a
  `sample` call on the reserved probe seeds (`seeds.PROBE_SEEDS`, outside every run's ranges) with
  the protocol's sampling parameters, and `accept_single` when the protocol has a quadrature test.
  Shapes and dtypes are checked; values are not (a token outside [0, V) is the verdict's business:
  it FAILs the run with a named criterion). Anything the adapter raises is `SUTRaised` (exit 3).

`GuardedSUT` wraps an adapter for the whole run, so that an exception from the adapter is told
apart from one of the harness: every adapter call that raises becomes `SUTRaised`, naming the call.
`SystemExit` raised by adapter code (`sys.exit` in a method, in the constructor or while its module
is imported) is a failure of the system under test too, never the harness's exit status. Every
guarded call (and the import and construction in `open_guarded`) is also recorded on the
supervisor's channel (`specval.channel.adapter_call`) as it starts and as it ends, so that a worker
that dies inside the adapter (`os._exit`, a signal) is reported with the call it was in.
"""

from __future__ import annotations

import os
import tempfile
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specval import channel
from specval.protocol import Protocol, ProtocolError, line_of, read_yaml
from specval.seeds import PROBE_SEEDS
from specval.sut import OWN_DRAFT, SOURCES, SUT, SampleBatch, SUTError, capabilities_of

PROBE_ROWS = 2  # rows of the accept_single probe
IMPORT_CALL = "the adapter's import or constructor"  # the call named while `open_guarded` builds the adapter
BOOLEAN_CAPABILITIES = ("accept_single", "mixed_sampling", "group_options")  # declared True or False
PASS_THROUGH = ("check_groups",)  # calls whose SUTError is a refusal of the configuration (exit 2)
# what adapter code may raise that is its own failure (exit 3): any Exception, and SystemExit (an
# adapter calling sys.exit must not end specval with the adapter's status); KeyboardInterrupt is the user's
ADAPTER_FAULTS = (Exception, SystemExit)


class SUTRaised(Exception):
    """The system under test raised, or broke the adapter contract, in `call`."""

    def __init__(self, call: str, message: str, details: str = ""):
        super().__init__(f"the system under test failed in {call}: {message}")
        self.call = call
        self.message = message
        self.details = details or message  # full traceback text, for the log file


def sut_raised(call: str, err: BaseException) -> SUTRaised:
    """`err`, raised by the system under test in `call`, as SUTRaised carrying its traceback text."""
    text = "".join(traceback.format_exception(type(err), err, err.__traceback__))
    return SUTRaised(call, f"{type(err).__name__}: {err}", text)


class GuardedSUT:
    """Delegates to an adapter; an exception raised by any adapter call becomes SUTRaised.

    SUTError from `check_groups` passes through unchanged: it is the adapter refusing the
    protocol's configuration, an input error. SystemExit becomes SUTRaised too; KeyboardInterrupt
    passes through."""

    def __init__(self, sut: SUT):
        self._sut = sut

    @property
    def adapter_class(self) -> type:
        """The wrapped adapter's class (reading it calls no adapter code): what an error message
        names, e.g. whether the adapter implements an optional method itself."""
        return type(self._sut)

    def __getattr__(self, name: str) -> Any:
        try:
            with channel.adapter_call(name):
                value = getattr(self._sut, name)
        except AttributeError:
            raise  # the adapter has no such attribute: hasattr() must keep working
        except ADAPTER_FAULTS as err:  # a property of the adapter raised (e.g. vocab_size)
            raise sut_raised(name, err) from err
        if not callable(value) or isinstance(value, type):
            return value
        return _guard_call(name, value)


def _guard_call(name: str, method: Callable) -> Callable:
    def call(*args, **kwargs):
        try:
            with channel.adapter_call(name):
                return method(*args, **kwargs)
        except ADAPTER_FAULTS as err:
            if isinstance(err, SUTError) and name in PASS_THROUGH:
                raise
            raise sut_raised(name, err) from err

    return call


def open_guarded(factory: Callable[..., SUT], protocol: Protocol) -> GuardedSUT:
    """Import and construct the adapter; SUTError (a refused configuration, an adapter that cannot
    be imported) passes, anything else (SystemExit included) is SUTRaised."""
    try:
        with channel.adapter_call(IMPORT_CALL):
            return GuardedSUT(factory(protocol.sut, protocol.num_speculative_tokens))
    except SUTError:
        raise
    except ADAPTER_FAULTS as err:
        raise sut_raised(IMPORT_CALL, err) from err


# ---------------------------------------------------------------- writable paths


def check_writable_dir(path: Path, what: str) -> None:
    """ProtocolError unless `path` is a directory this process can write in, or can be created as
    one (its nearest existing ancestor is a writable directory). Nothing is created."""
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise ProtocolError(f"{what} {path}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ProtocolError(f"{what} {path}: {existing} is not writable")
    if existing == path:
        try:
            fd, name = tempfile.mkstemp(dir=path, prefix=".specval-write-check-")
            os.close(fd)
            os.unlink(name)
        except OSError as err:
            raise ProtocolError(f"{what} {path}: not writable ({err.strerror or err})") from err


# ---------------------------------------------------------------- capabilities


@dataclass(frozen=True)
class Need:
    """One thing a protocol needs from the adapter, and where the protocol asks for it."""

    capability: str
    value: str
    key_path: tuple[Any, ...]


def needs(protocol: Protocol) -> list[Need]:
    """What the protocol asks of the adapter, with the key path of each ask in the YAML."""
    out = [Need("modes", g.mode, ("groups", i, "mode")) for i, g in enumerate(protocol.groups)]
    sampling = protocol.sampling
    if sampling.temperature != 1.0:
        out.append(Need("sampling", "temperature", ("sampling", "temperature")))
    if sampling.top_k not in (0, -1):
        out.append(Need("sampling", "top_k", ("sampling", "top_k")))
    if sampling.top_p < 1.0:
        out.append(Need("sampling", "top_p", ("sampling", "top_p")))
    out += [
        Need("semantics", f"{field}={value}", ("sampling", "semantics", field))
        for field, value in protocol.sampling.semantics
    ]
    out += [
        Need("draft_overrides", g.draft, ("groups", i, "draft"))
        for i, g in enumerate(protocol.groups)
        if getattr(g, "draft", OWN_DRAFT) != OWN_DRAFT
    ]
    out += [
        Need("mixed_sampling", "companions", ("groups", i, "companions"))
        for i, g in enumerate(protocol.groups)
        if getattr(g, "companions", ())
    ]
    mutant = dict(protocol.sut.options).get("mutant")
    if mutant is not None:
        out.append(Need("mutants", str(mutant), ("sut", "options", "mutant")))
    out += group_option_needs(protocol.groups)
    out += [
        Need("accept_single", "quadrature", ("tests", i, "kind"))
        for i, t in enumerate(getattr(protocol, "tests", ()))
        if getattr(t, "kind", None) == "quadrature"
    ]
    return out


def group_option_needs(groups: Any) -> list[Need]:
    """What groups that override adapter options ask: `group_options`, and each mutant they name."""
    out = []
    for i, group in enumerate(groups):
        options = dict(getattr(group, "options", ()))
        if options:
            out.append(Need("group_options", "options", ("groups", i, "options")))
        if options.get("mutant") is not None:
            out.append(Need("mutants", str(options["mutant"]), ("groups", i, "options", "mutant")))
    return out


def _has(capabilities, need: Need) -> bool:
    if need.capability in BOOLEAN_CAPABILITIES:
        return bool(getattr(capabilities, need.capability, False))
    if need.capability == "semantics":
        field, _, value = need.value.partition("=")
        return getattr(capabilities.semantics, field) == value
    if need.capability == "mutants":
        return need.value in capabilities.mutant_names
    return need.value in getattr(capabilities, need.capability)


def _declared(capabilities, need: Need) -> Any:
    """What the adapter declares for the capability `need` asks about (for the error message)."""
    if need.capability in BOOLEAN_CAPABILITIES:
        return "False"
    if need.capability == "semantics":
        field = need.value.partition("=")[0]
        return f"{field}={getattr(capabilities.semantics, field)}"
    if need.capability == "mutants":
        return list(capabilities.mutant_names)
    return list(getattr(capabilities, need.capability))


def check_capabilities(protocol: Protocol, sut: Any, protocol_file: Path) -> None:
    """ProtocolError naming the first ask the adapter's `capabilities` do not cover, with the line."""
    capabilities = capabilities_of(sut)
    raw = None
    for need in needs(protocol):
        if _has(capabilities, need):
            continue
        raw = raw if raw is not None else _raw(protocol_file)
        line = line_of(raw, need.key_path)
        where = f"{protocol_file}" + (f":{line}" if line else "")
        key = ".".join(str(k) if not isinstance(k, int) else f"[{k}]" for k in need.key_path).replace(".[", "[")
        raise ProtocolError(
            f"{where}: {key}: the protocol needs capability {need.capability}={need.value!r}, which "
            f"adapter {protocol.sut.adapter!r} does not declare (it declares {need.capability}="
            f"{_declared(capabilities, need)})"
        )


def _raw(protocol_file: Path) -> Any:
    try:
        return read_yaml(protocol_file)
    except ProtocolError:
        return None


# ---------------------------------------------------------------- probe


def _check_batch(batch: Any, group: str, num_tokens: int) -> None:
    call = f"sample (probe, group {group!r})"
    if not isinstance(batch, SampleBatch):
        raise SUTRaised(call, f"returned {type(batch).__name__}, expected specval.sut.SampleBatch")
    rows = len(PROBE_SEEDS)
    for name, shape in (
        ("tokens", (rows, num_tokens)),
        ("sources", (rows, num_tokens)),
        ("num_rounds", (rows,)),
        ("num_draft_tokens", (rows,)),
        ("num_accepted_tokens", (rows,)),
    ):
        array = np.asarray(getattr(batch, name))
        if array.shape != shape:
            raise SUTRaised(call, f"{name} has shape {array.shape}, expected {shape}")
        if name != "sources" and not np.issubdtype(array.dtype, np.integer):
            raise SUTRaised(call, f"{name} has dtype {array.dtype}, expected an integer dtype")
    unknown = set(np.unique(np.asarray(batch.sources).astype(str)).tolist()) - set(SOURCES)
    if unknown:
        raise SUTRaised(call, f"unknown token sources {sorted(unknown)}; expected {SOURCES}")


def _check_logits(logits: Any, vocab: int, call: str) -> np.ndarray:
    array = np.asarray(logits)
    if array.shape != (vocab,) or not np.issubdtype(array.dtype, np.floating):
        raise SUTRaised(call, f"returned {array.dtype}{list(array.shape)}, expected float[{vocab}]")
    if np.isnan(array).any():
        raise SUTRaised(call, "returned NaN logits")
    return array


def probe(sut: GuardedSUT, protocol: Protocol) -> None:
    """Exercise every adapter call the run will make, on a tiny batch of reserved seeds (see module doc)."""
    sut.plan_batches(protocol.batch_size)
    vocab = sut.vocab_size
    if isinstance(vocab, bool) or not isinstance(vocab, (int, np.integer)) or vocab < 2:
        raise SUTRaised("vocab_size", f"is {vocab!r}, expected an integer >= 2")
    prompt_ids = sut.encode(protocol.prompt)
    ids = np.asarray(prompt_ids)
    if ids.ndim != 1 or not len(ids) or not np.issubdtype(ids.dtype, np.integer) or ids.min() < 0 or ids.max() >= vocab:
        raise SUTRaised(
            "encode", f"returned {prompt_ids!r:.80}, expected a non-empty list of token ids in [0, {vocab})"
        )
    _check_logits(sut.target_logits(list(prompt_ids)), int(vocab), "target_logits")
    seeds = np.asarray(PROBE_SEEDS, dtype=np.int64)
    for group in protocol.groups:
        batch = sut.sample(
            group, list(prompt_ids), protocol.sampling, seeds, protocol.positions, protocol.max_tokens(group)
        )
        _check_batch(batch, group.name, protocol.positions)
    if any(t.kind == "quadrature" for t in protocol.tests):
        _probe_accept(sut, protocol, list(prompt_ids), int(vocab))


def _probe_accept(sut: GuardedSUT, protocol: Protocol, prompt_ids: list[int], vocab: int) -> None:
    speculative = [g for g in protocol.groups if g.is_speculative]
    for group in speculative[:1]:
        _check_logits(sut.draft_logits(group, prompt_ids), vocab, "draft_logits")
    p = np.full((PROBE_ROWS, vocab), 1.0 / vocab, dtype=sut.prob_dtype)
    tokens = np.zeros(PROBE_ROWS, dtype=np.int64)
    uniforms = np.full((PROBE_ROWS, 3), 0.5, dtype=np.float64)
    out = np.asarray(sut.accept_single(tokens, p, p.copy(), uniforms))
    if out.shape != (PROBE_ROWS,) or not np.issubdtype(out.dtype, np.integer):
        raise SUTRaised("accept_single", f"returned {out.dtype}{list(out.shape)}, expected int[{PROBE_ROWS}]")
