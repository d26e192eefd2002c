"""A small protocol for the fake SUT (tests/specval/fake_sut.py), as a dict and as a YAML file."""

from __future__ import annotations

import copy
from pathlib import Path

import yaml

from specval import protocol as protocols

FAKE_PROTOCOL = {
    "name": "fake_t2",
    "sut": {"adapter": "fake_sut:FakeSUT"},
    "prompt": "abc",
    "sampling": {"temperature": 1.0, "top_k": 8, "top_p": 0.95},
    "num_speculative_tokens": 3,
    "positions": 2,
    "groups": [{"name": "nospec", "mode": "nospec"}, {"name": "sync", "mode": "sync", "draft_loops": 2}],
    "samples_per_group": 1200,
    "chunk_size": 400,
    "batch_size": 200,
    "stratum_min": 200,
    "tests": [
        {"kind": "quadrature", "role": "control"},
        {"kind": "gof", "position": 1, "role": "control"},
        {"kind": "gof", "position": 2, "role": "primary"},
        {"kind": "homogeneity", "position": 2, "role": "primary", "baseline": "nospec"},
        {"kind": "gof", "position": 2, "role": "secondary", "groups": ["sync"], "by_path": True},
    ],
    "profiles": {"ci": {"samples_per_group": 800}, "full": {"samples_per_group": 20000}},
}


def fake_protocol_dict(**overrides) -> dict:
    raw = copy.deepcopy(FAKE_PROTOCOL)
    raw.update(overrides)
    return raw


def write_protocol(directory: Path, raw: dict, name: str = "protocol.yaml", frozen: bool = True) -> Path:
    """Write the protocol; `frozen` also records its hash in the directory's frozen.lock (as a
    pre-registered protocol would be) when it parses; invalid protocols are written unfrozen."""
    path = Path(directory) / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    if frozen:
        try:
            protocols.freeze(path, _loader(raw))
        except protocols.ProtocolError:
            pass  # the test feeds an invalid protocol on purpose: the run must refuse it for that reason
    return path


def _loader(raw: dict):
    from specval.quality_protocol import QUALITY_KIND, load_quality_protocol

    return load_quality_protocol if raw.get("kind") == QUALITY_KIND else protocols.load_protocol
