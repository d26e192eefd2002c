"""Strict YAML: bounded work on hostile files (size, depth, alias expansion, alias cycles, files
that are not regular), each refused with a ProtocolError naming the file, well within a second.

Deterministic: fixed inputs. The time bound (REFUSAL_S) is a guard against unbounded work, not a
speed claim: each refusal takes milliseconds; the alias bomb below took more than 60 s to expand
before the bounds existed.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import yaml

from specval.protocol import ProtocolError, read_yaml
from specval.protocol.strict_yaml import MAX_DEPTH, MAX_NODES, MAX_PROTOCOL_BYTES

REPO = Path(__file__).resolve().parents[3]
REFUSAL_S = 1.0  # a refused file costs at most MAX_NODES nodes of parsing (~0.05 s on one core)
# Measured as this process's CPU time, not wall time: a loaded CI machine (seen: load 7 on 2 cores)
# stretches wall time by the other processes' share, while the work bounded here, parsing, is CPU.


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    """`levels` anchors, each a list of `width` aliases of the previous: width**levels leaves in
    under 400 bytes (the "billion laughs")."""
    lines = ["description:", f"  - &a0 [{', '.join(['lol'] * width)}]"]
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * width)}]" for i in range(1, levels + 1)]
    return "\n".join(lines) + "\n"


HOSTILE = {
    "alias_bomb": (_alias_bomb(), "YAML nodes once its aliases are expanded"),
    "deep_flow": ("name: " + "[" * 5000 + "]" * 5000 + "\n", f"nested deeper than {MAX_DEPTH} levels"),
    "deep_block": ("a:\n" + "".join("  " * i + "- \n" for i in range(1, 200)), f"deeper than {MAX_DEPTH}"),
    "aliases_deepen": (
        "a0: &a0 "
        + "[" * 20
        + "1"
        + "]" * 20
        + "\n"
        + "".join(f"a{i}: &a{i} " + "[" * 20 + f"*a{i - 1}" + "]" * 20 + "\n" for i in range(1, 4)),
        "deeper than 32 levels once its aliases are expanded",
    ),
    "alias_cycle": ("a: &x [1, *x]\n", "an alias refers to a node that contains it"),
    "too_many_nodes": ("a: [" + "1, " * MAX_NODES + "1]\n", f"more than {MAX_NODES} YAML nodes"),
    "too_large": ("prompt: " + "x" * MAX_PROTOCOL_BYTES + "\n", f"larger than {MAX_PROTOCOL_BYTES} bytes"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_yaml_is_refused_quickly_naming_the_file(tmp_path, name):
    text, words = HOSTILE[name]
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    start = time.process_time()
    with pytest.raises(ProtocolError) as err:
        read_yaml(path)
    assert time.process_time() - start < REFUSAL_S
    assert str(err.value).startswith(f"{path}: ") and words in str(err.value), str(err.value)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "protocol.yaml"
    os.mkfifo(fifo)  # reading it would block until a writer comes
    with pytest.raises(ProtocolError, match="not a regular file"):
        read_yaml(fifo)


def test_shared_aliases_within_the_bounds_still_parse(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("common: &c {a: 1, b: [1, 2]}\nx: *c\ny: {<<: *c, d: 3}\n")
    common = {"a": 1, "b": [1, 2]}
    assert read_yaml(path) == {"common": common, "x": common, "y": {**common, "d": 3}}


@pytest.mark.parametrize(
    "path",
    sorted((REPO / "protocols").rglob("*.yaml")) + sorted((REPO / "examples").rglob("*.yaml")),
    ids=lambda p: p.relative_to(REPO).as_posix(),
)
def test_every_shipped_protocol_is_well_within_the_bounds(path):
    assert path.stat().st_size < MAX_PROTOCOL_BYTES // 16
    assert read_yaml(path) == yaml.safe_load(path.read_text())
