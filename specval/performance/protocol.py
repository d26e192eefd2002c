"""Performance protocol: the pre-registered YAML of a paired speed comparison (top-level `kind: performance`).

Two configurations of one system under test, arm `a` (the reference) and arm `b` (the candidate),
run the same workload (`concurrency` requests of `max_tokens` tokens each, EOS ignored, the same
request seeds in both arms of a pair) in ABBA order; the statistic of one pair is the ratio b / a of

- `throughput`: generated tokens per second of wall time (higher is better),
- `latency`: wall seconds of the whole workload, submission to last completion (lower is better), or
- `time_per_token`: wall seconds of the workload per generated token (lower is better; every run
  generates the same number of tokens, so its ratio equals latency's, reported per token).

`sut.adapter` names the system under test. `engine` (the default) is this package's engine: an arm
is an `engine.EngineConfig` (mode, draft_loops, enforce_eager, rounds_in_flight, sampling) and a
run submits the `concurrency` requests at once to its `LLM.generate`. Any other adapter (an entry
point such as `transformers`, or `module:Class`) is a `specval.sut.SUT`: an arm is a group of the
adapter (name, mode, draft_loops, sampling), both arms share one adapter, and a run is `SUT.sample`
of the run's seeds (one call per prompt); `enforce_eager` and `rounds_in_flight` are the engine's
only and refused elsewhere, as is greedy sampling (temperature 0), which `SUT.sample` does not offer.

`hypothesis` and `margin` fix the threshold the median ratio is judged against before any timing:

    statistic   noninferiority      superiority
    throughput  ratio > 1 - margin  ratio > 1 + margin
    latency     ratio < 1 + margin  ratio < 1 - margin

Guarantees (as for the other protocol kinds, `specval.protocol`): unknown keys and bad values raise
ProtocolError naming the file, the key and the value; `hash` is the canonical sha256 of the parsed
file and profiles do not change it; every profile is checked when the file is loaded (enough pairs
for the confidence, a warm-up round on CUDA).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specval.protocol import ProtocolError, line_of, read_yaml
from specval.protocol.canonical import canonical_hash, plain_form
from specval.protocol.readers import (
    check_keys,
    fail,
    read_bool,
    read_draft_loops,
    read_float,
    read_int,
    read_mapping,
    read_name,
    read_str,
    read_unit,
)
from specval.protocol.sections import MIN_TEMPERATURE, GroupSpec, SamplingSpec, SutSpec, parse_profiles, parse_sut
from specval.protocol.sections import resolve as protocol_resolve
from specval.stats.median import min_count

PERFORMANCE_KIND = "performance"
STATISTICS = ("throughput", "latency", "time_per_token")
HYPOTHESES = ("noninferiority", "superiority")
ARM_KEYS = ("a", "b")
ENGINE_ADAPTER = "engine"  # this package's engine, timed through engine.LLM.generate
ENGINE_ONLY_ARM_KEYS = ("enforce_eager", "rounds_in_flight")  # engine options no other adapter has
MODES = ("nospec", "sync", "async")
ROUNDS_IN_FLIGHT = (1, 2)
PROFILE_INT_KEYS = ("pairs", "warmup_rounds", "concurrency", "max_tokens")
PROFILE_KEYS = (*PROFILE_INT_KEYS, "device")
CUDA = "cuda"


@dataclass(frozen=True)
class ArmSpec:
    """One engine configuration; `sampling` None runs the protocol's sampling."""

    name: str
    mode: str
    draft_loops: int | None = None
    enforce_eager: bool = False
    rounds_in_flight: int = 2
    sampling: SamplingSpec | None = None

    @property
    def group(self) -> GroupSpec:
        """The arm as a group of an adapter (`SUT.sample`'s first argument)."""
        return GroupSpec(name=self.name, mode=self.mode, draft_loops=self.draft_loops)


@dataclass(frozen=True)
class PerformanceProtocol:
    """A parsed performance protocol; `profile` is set once `resolve` applied one."""

    kind: str
    name: str
    device: str
    prompts: tuple[str, ...]
    concurrency: int
    max_tokens: int
    sampling: SamplingSpec
    num_speculative_tokens: int
    a: ArmSpec
    b: ArmSpec
    statistic: str
    hypothesis: str
    margin: float
    pairs: int
    warmup_rounds: int
    description: str = ""
    sut: SutSpec = SutSpec()
    confidence: float = 0.95
    seed_base: int = 0
    confirmatory: bool = False
    profiles: tuple[tuple[str, tuple[tuple[str, Any], ...]], ...] = ()
    profile: str | None = field(default=None, compare=False)
    file_hash: str | None = field(default=None, compare=False, repr=False)

    @property
    def on_engine(self) -> bool:
        """True when the arms are configurations of this package's engine (`sut.adapter: engine`)."""
        return self.sut.adapter == ENGINE_ADAPTER

    @property
    def higher_is_better(self) -> bool:
        """Throughput ratios pass above the threshold, latency and time-per-token ratios below it."""
        return self.statistic == "throughput"

    @property
    def threshold(self) -> float:
        """The ratio b / a the interval must clear (see the module docstring's table)."""
        shift = self.margin if self.hypothesis == "superiority" else -self.margin
        return 1.0 + shift if self.higher_is_better else 1.0 - shift

    def arm(self, key: str) -> ArmSpec:
        return self.a if key == "a" else self.b

    def arm_sampling(self, key: str) -> SamplingSpec:
        return self.arm(key).sampling or self.sampling

    def to_dict(self) -> dict[str, Any]:
        out = plain_form(self)
        out["sut"].pop("device")  # unused: the top-level `device` is the one a bench runs on
        for key in ARM_KEYS:
            sampling = self.arm(key).sampling
            out[key]["sampling"] = None if sampling is None else sampling.to_dict()
            if not self.on_engine:  # engine options, refused for other adapters: not part of their form
                for name in ENGINE_ONLY_ARM_KEYS:
                    out[key].pop(name)
        return out

    @property
    def hash(self) -> str:
        return self.file_hash or canonical_hash(self.to_dict())


# ---------------------------------------------------------------- sections


def _parse_sampling(raw: Any, file: str, where: str) -> SamplingSpec:
    """Sampling of a timed workload: temperature 0 (greedy) is allowed here, unlike in the
    distribution protocols, since nothing is tested about the distribution."""
    raw = read_mapping(raw, file, where)
    check_keys(raw, SamplingSpec, file, where)
    if "semantics" in raw:
        fail(
            file,
            f"{where}.semantics",
            "a performance protocol pins no filter semantics (nothing is tested about the distribution)",
            dict(raw["semantics"] or {}),
        )
    temperature = read_float(raw["temperature"], file, f"{where}.temperature")
    if temperature < 0.0:
        fail(file, f"{where}.temperature", "must be >= 0 (0 is greedy)", raw["temperature"])
    return SamplingSpec(
        temperature=temperature,
        top_k=read_int(raw.get("top_k", -1), file, f"{where}.top_k", minimum=-1),
        top_p=read_unit(raw.get("top_p", 1.0), file, f"{where}.top_p", upper_closed=True),
    )


def _parse_arm(raw: Any, file: str, where: str, adapter: str) -> ArmSpec:
    raw = read_mapping(raw, file, where)
    check_keys(raw, ArmSpec, file, where)
    draft_loops = read_draft_loops(raw, file, where)
    mode = read_str(raw["mode"], file, f"{where}.mode", MODES)
    if adapter != ENGINE_ADAPTER:
        for key in ENGINE_ONLY_ARM_KEYS:
            if key in raw:
                fail(
                    file,
                    f"{where}.{key}",
                    f"an option of the engine adapter only (this protocol times "
                    f"adapter {adapter!r}; put adapter options under sut.options)",
                    raw[key],
                )
    rounds = read_int(raw.get("rounds_in_flight", 2), file, f"{where}.rounds_in_flight", minimum=1)
    if rounds not in ROUNDS_IN_FLIGHT:
        fail(file, f"{where}.rounds_in_flight", f"must be one of {list(ROUNDS_IN_FLIGHT)}", rounds)
    if rounds != 2 and mode != "async":
        fail(file, f"{where}.rounds_in_flight", "applies to mode async only", rounds)
    sampling = raw.get("sampling")
    if sampling is not None:
        sampling = _parse_sampling(sampling, file, f"{where}.sampling")
        _check_adapter_sampling(sampling, adapter, file, f"{where}.sampling")
    return ArmSpec(
        name=read_name(raw["name"], file, f"{where}.name"),
        mode=mode,
        draft_loops=draft_loops,
        enforce_eager=read_bool(raw.get("enforce_eager", False), file, f"{where}.enforce_eager"),
        rounds_in_flight=rounds,
        sampling=sampling,
    )


def _check_adapter_sampling(sampling: SamplingSpec, adapter: str, file: str, where: str) -> None:
    """Greedy decoding (temperature 0) is the engine adapter's only: `SUT.sample` always draws."""
    if adapter != ENGINE_ADAPTER and sampling.temperature < MIN_TEMPERATURE:
        fail(
            file,
            f"{where}.temperature",
            f"must be >= {MIN_TEMPERATURE:g} for adapter {adapter!r} (SUT.sample "
            "draws; greedy decoding is timed on the engine adapter only)",
            sampling.temperature,
        )


def _parse_prompts(raw: Any, file: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not raw:
        fail(file, "prompts", "expected a non-empty list of prompts (request j gets prompt j mod len)", raw)
    return tuple(read_str(p, file, f"prompts[{i}]") for i, p in enumerate(raw))


def _parse_sut(raw: Any, file: str) -> SutSpec:
    raw = read_mapping(raw, file, "sut")
    if "device" in raw:
        fail(
            file,
            "sut.device",
            "a performance protocol names its device at the top level (`device`), where a profile can change it",
            raw["device"],
        )
    spec = parse_sut(raw, file)
    if not spec.adapter.strip():
        fail(
            file,
            "sut.adapter",
            "expected 'engine', an entry point name of group specval.sut or 'module:Class'",
            spec.adapter,
        )
    return spec


def _parse_profiles(raw: Any, file: str) -> tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]:
    """name -> overrides of PROFILE_KEYS: integers >= 1 (warmup_rounds >= 0) or a device string."""
    return parse_profiles(raw, file, PROFILE_KEYS, zero_ok=("warmup_rounds",), text_keys=("device",))


def _check_scale(protocol: PerformanceProtocol, file: str, where: str) -> None:
    """Enough pairs for the confidence; on CUDA at least one warm-up round (graphs captured before timing)."""
    fewest = min_count(protocol.confidence)
    if protocol.pairs < fewest:
        fail(
            file,
            f"{where}pairs",
            f"{protocol.pairs} pairs cannot give a {protocol.confidence:g} interval for "
            f"the median (at least {fewest} are needed)",
            protocol.pairs,
        )
    if protocol.device.startswith(CUDA) and protocol.warmup_rounds < 1:
        fail(
            file,
            f"{where}warmup_rounds",
            "a CUDA run needs >= 1 warm-up round (CUDA Graphs are captured there, before timing)",
            protocol.warmup_rounds,
        )


# ---------------------------------------------------------------- top level


def parse_performance_protocol(raw: Any, file: str = "<protocol>") -> PerformanceProtocol:
    """Parse a YAML mapping into a PerformanceProtocol; ProtocolError names file, key and value."""
    raw = read_mapping(raw, file, "")
    check_keys(raw, PerformanceProtocol, file, "")
    read_str(raw["kind"], file, "kind", (PERFORMANCE_KIND,))
    hypothesis = read_str(raw["hypothesis"], file, "hypothesis", HYPOTHESES)
    margin = read_float(raw["margin"], file, "margin")
    if not (0.0 <= margin < 1.0 if hypothesis == "superiority" else 0.0 < margin < 1.0):
        fail(file, "margin", "must lie in (0, 1) for noninferiority, [0, 1) for superiority", raw["margin"])
    sut = _parse_sut(raw.get("sut", {}), file)
    sampling = _parse_sampling(raw["sampling"], file, "sampling")
    _check_adapter_sampling(sampling, sut.adapter, file, "sampling")
    protocol = PerformanceProtocol(
        kind=PERFORMANCE_KIND,
        name=read_name(raw["name"], file, "name"),
        description=str(raw.get("description", "")),
        device=read_str(raw["device"], file, "device"),
        sut=sut,
        prompts=_parse_prompts(raw["prompts"], file),
        concurrency=read_int(raw["concurrency"], file, "concurrency", minimum=1),
        max_tokens=read_int(raw["max_tokens"], file, "max_tokens", minimum=1),
        sampling=sampling,
        num_speculative_tokens=read_int(raw["num_speculative_tokens"], file, "num_speculative_tokens", minimum=1),
        a=_parse_arm(raw["a"], file, "a", sut.adapter),
        b=_parse_arm(raw["b"], file, "b", sut.adapter),
        statistic=read_str(raw["statistic"], file, "statistic", STATISTICS),
        hypothesis=hypothesis,
        margin=margin,
        confidence=read_unit(raw.get("confidence", 0.95), file, "confidence"),
        pairs=read_int(raw["pairs"], file, "pairs", minimum=1),
        warmup_rounds=read_int(raw["warmup_rounds"], file, "warmup_rounds", minimum=0),
        seed_base=read_int(raw.get("seed_base", 0), file, "seed_base", minimum=0),
        confirmatory=read_bool(raw.get("confirmatory", False), file, "confirmatory"),
        profiles=_parse_profiles(raw.get("profiles", {}), file),
    )
    if protocol.a.name == protocol.b.name:
        fail(file, "b.name", "the two arms need different names", protocol.b.name)
    _check_scale(protocol, file, "")
    for name, _ in protocol.profiles:
        _check_scale(resolve(protocol, name), file, f"profiles.{name}.")
    return protocol


def load_performance_protocol(path: str | Path) -> PerformanceProtocol:
    """Read and parse a performance protocol file; YAML syntax errors become ProtocolError too, and
    an error about a key names the key's line in the file (`file: line N: key: message`)."""
    return parse_performance_file(read_yaml(path), str(path))


def parse_performance_file(raw: Any, file: str) -> PerformanceProtocol:
    """`parse_performance_protocol` of a file's parsed YAML (`read_yaml`), an error about a key
    naming the key's line in the file."""
    try:
        return parse_performance_protocol(raw, file)
    except ProtocolError as err:
        raise ProtocolError(_with_line(str(err), file, raw)) from err


KEY_STEP = re.compile(r"([^.\[\]]+)|\[(\d+)\]")  # "a.sampling.top_k", "prompts[2]"


def _with_line(message: str, file: str, raw: Any) -> str:
    """`message` ("file: key: text") with the line of `key` in the file inserted after the file."""
    prefix = f"{file}: "
    if not message.startswith(prefix):
        return message
    key = message[len(prefix) :].split(": ", 1)[0]
    steps = tuple(name if name else int(index) for name, index in KEY_STEP.findall(key))
    line = line_of(raw, steps) if steps else None
    return message if line is None else f"{prefix}line {line}: {message[len(prefix) :]}"


resolve = protocol_resolve  # one profile rule for every protocol kind (`device` is a top-level field)


def is_performance(raw: Any) -> bool:
    """True for the parsed YAML of a performance protocol."""
    return isinstance(raw, dict) and raw.get("kind") == PERFORMANCE_KIND
