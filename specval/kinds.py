"""Kinds: the one table of protocol kinds the CLI dispatches through.

A protocol file's top-level `kind` selects its kind (none: a distribution protocol). Each kind
names how its file is parsed (`parse`, from the YAML read once) and the module whose
`verify(bundle)`, `finish(bundle)` and `_recompute_bundle(bundle)` handle its bundles, whose
`run_function` runs it, and the report module whose `render_files(bundle, signer)` renders them
(imported on first use, so reading this table imports no run module). A
bundle's kind is that of the protocol.json it recorded.

Guarantee: an unknown or missing `kind` reads as the distribution kind, whose parser then
refuses a `kind` key naming the file; nothing else in specval branches on a protocol's kind.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from specval import bundle as bundles
from specval.performance.protocol import PERFORMANCE_KIND, parse_performance_file
from specval.protocol import parse_protocol, read_yaml
from specval.quality.protocol import QUALITY_KIND, parse_quality_protocol
from specval.sequence.protocol import SEQUENCE_KIND, parse_sequence_protocol
from specval.suite import SUITE_KIND, parse_suite

DISTRIBUTION_KIND = "distribution"  # the default schema: no top-level `kind`


@dataclass(frozen=True)
class Kind:
    """One protocol kind: its parser and the module that runs, verifies and renders its bundles."""

    name: str
    parse: Callable[[Any, str], Any]  # (parsed YAML, file name) -> protocol dataclass
    module_name: str  # has verify(bundle), finish(bundle), _recompute_bundle(bundle) and `run_function`
    run_function: str  # the module's function that runs a protocol file of this kind
    resumable: bool = True  # `specval run --resume` continues its bundles
    report_module: str = ""  # has render_files(bundle, signer=None); "": its runs make no report

    def module(self) -> ModuleType:
        return importlib.import_module(self.module_name)

    def runner(self) -> Callable[..., tuple[Path, dict]]:
        return getattr(self.module(), self.run_function)

    def verify(self, bundle: Path) -> list[str]:
        return self.module().verify(bundle)

    def finish(self, bundle: Path) -> None:
        """Re-render the bundle's report and re-seal it."""
        self.module().finish(bundle)

    def render(self, bundle: Path, signer: str | None = None) -> dict[str, bytes]:
        """The bundle's report files, rendered from its files; `signer`: the key id of the
        signature about to be written (`specval.report.signer`), None: the envelope's, if any."""
        return importlib.import_module(self.report_module).render_files(bundle, signer=signer)

    def recompute(self, bundle: Path) -> dict:
        """The bundle's summary recomputed from its raw files alone (what verify compares with
        summary.json; a resume that completes a bundle checks the same)."""
        return self.module()._recompute_bundle(bundle)


KINDS = {
    DISTRIBUTION_KIND: Kind(
        DISTRIBUTION_KIND, parse_protocol, "specval.distribution.runner", "run", report_module="specval.report"
    ),
    QUALITY_KIND: Kind(
        QUALITY_KIND, parse_quality_protocol, "specval.quality.runner", "run", report_module="specval.quality.report"
    ),
    SEQUENCE_KIND: Kind(
        SEQUENCE_KIND,
        parse_sequence_protocol,
        "specval.sequence.runner",
        "run",
        report_module="specval.sequence.report",
    ),
    PERFORMANCE_KIND: Kind(
        PERFORMANCE_KIND,
        parse_performance_file,
        "specval.performance.bench",
        "bench",
        resumable=False,
        report_module="specval.performance.report",
    ),
    # a list of member protocols, each run into its own bundle; the CLI runs it (specval.suite)
    SUITE_KIND: Kind(SUITE_KIND, parse_suite, "specval.suite", "run", resumable=False),
}
RUN_KINDS = (DISTRIBUTION_KIND, QUALITY_KIND, SEQUENCE_KIND)  # kinds a suite may list (one verdict bundle each)
OTHER_KINDS = tuple(name for name in KINDS if name != DISTRIBUTION_KIND)


def kind_named(raw: Any) -> Kind:
    """The kind of a parsed protocol (YAML or protocol.json): its `kind` when one of OTHER_KINDS."""
    name = raw.get("kind") if isinstance(raw, dict) else None
    return KINDS[name if name in OTHER_KINDS else DISTRIBUTION_KIND]


@dataclass(frozen=True)
class ProtocolFile:
    """A protocol file read once: its path, parsed YAML and kind."""

    path: Path
    raw: Any
    kind: Kind

    def load(self) -> Any:
        """The protocol, parsed by its kind's parser (ProtocolError naming the file)."""
        return self.kind.parse(self.raw, str(self.path))


def read_protocol_file(path: Path) -> ProtocolFile:
    """Read PATH once (ProtocolError naming the file if it cannot be read or is not YAML)."""
    raw = read_yaml(path)
    return ProtocolFile(Path(path), raw, kind_named(raw))


def bundle_kind(bundle: Path) -> Kind:
    """The kind of the protocol a bundle ran; an unreadable protocol.json reads as the distribution
    kind (verify then reports it as a difference). BundleError unless BUNDLE is a bundle."""
    if not (bundle / bundles.RUN_FILE).is_file():
        raise bundles.BundleError(f"{bundle}: not a bundle ({bundles.RUN_FILE} missing)")
    try:
        raw = bundles.read_json(bundle / bundles.PROTOCOL_JSON)
    except bundles.BundleError:
        return KINDS[DISTRIBUTION_KIND]
    return kind_named(raw)


__all__ = [
    "DISTRIBUTION_KIND",
    "KINDS",
    "RUN_KINDS",
    "SUITE_KIND",
    "Kind",
    "OTHER_KINDS",
    "ProtocolFile",
    "bundle_kind",
    "kind_named",
    "read_protocol_file",
]
