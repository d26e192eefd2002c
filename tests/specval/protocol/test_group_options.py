"""Per-group adapter options (`groups[].options`, issue 56): parsed for the distribution and the
sequence kind, merged over `sut.options` for that group only, in the canonical form only when
present, refused with a one-line error naming the key, the value and the file, compared by
homogeneity between option cells (nospec ones included), and refused (exit 2, before any seed) by
an adapter that does not declare `Capabilities.group_options`. Deterministic: nothing is sampled.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from click.testing import CliRunner

from specval import seeds
from specval.cli import main
from specval.preflight import check_capabilities
from specval.protocol import ProtocolError, SutSpec, load_protocol, parse_protocol
from specval.protocol.sections import GroupSpec, settings_covered
from specval.sequence.protocol import parse_sequence_protocol
from specval.sut import Capabilities
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol
from tests.fixtures.fake_sut import FakeSUT
from tests.fixtures.sequence_protocol import sequence_protocol_dict

CAP = {"max_num_batched_tokens": 256}
CELLS = [
    {"name": "nospec", "mode": "nospec"},
    {"name": "sync", "mode": "sync", "draft_loops": 2},
    {"name": "nospec_cap", "mode": "nospec", "options": CAP},
    {"name": "sync_cap", "mode": "sync", "draft_loops": 2, "options": CAP},
]
CELL_TESTS = [
    {"kind": "gof", "position": 1, "role": "primary"},
    {"kind": "homogeneity", "position": 1, "role": "primary", "baseline": "nospec", "groups": ["nospec_cap"]},
    {"kind": "homogeneity", "position": 2, "role": "primary", "baseline": "sync", "groups": ["sync_cap"]},
]


def _cells(**overrides) -> dict:
    return fake_protocol_dict(**copy.deepcopy({"groups": CELLS, "tests": CELL_TESTS, **overrides}))


def test_a_group_runs_sut_options_with_its_own_merged_over_them():
    protocol = parse_protocol(_cells(sut={"adapter": "engine", "options": {"max_num_batched_tokens": 65536, "x": 1}}))
    groups = {g.name: g for g in protocol.groups}
    assert groups["sync_cap"].options == (("max_num_batched_tokens", 256),)
    assert protocol.sut.options_for(groups["sync_cap"]) == (("max_num_batched_tokens", 256), ("x", 1))
    assert protocol.sut.options_for(groups["sync"]) == (("max_num_batched_tokens", 65536), ("x", 1))
    assert settings_covered(protocol) == {
        "nospec": {"max_num_batched_tokens": 65536, "x": 1},
        "sync": {"max_num_batched_tokens": 65536, "x": 1},
        "nospec_cap": {"max_num_batched_tokens": 256, "x": 1},
        "sync_cap": {"max_num_batched_tokens": 256, "x": 1},
    }
    assert settings_covered(parse_protocol(fake_protocol_dict())) == {}  # no group overrides: nothing listed


def test_options_enter_the_canonical_form_only_where_a_group_sets_them():
    plain = parse_protocol(fake_protocol_dict())
    assert all("options" not in g for g in plain.to_dict()["groups"])  # the form (and hash) of before the key
    raw = fake_protocol_dict()
    raw["groups"][1]["options"] = {"max_num_batched_tokens": 64}
    with_options = parse_protocol(raw)
    assert with_options.to_dict()["groups"][1]["options"] == {"max_num_batched_tokens": 64}
    assert with_options.hash != plain.hash
    raw["groups"][1]["options"] = {"max_num_batched_tokens": 65}
    assert parse_protocol(raw).hash != with_options.hash  # any value changes it


def test_a_sequence_group_carries_options_and_its_hash_changes_only_with_them():
    plain = parse_sequence_protocol(sequence_protocol_dict())
    raw = sequence_protocol_dict()
    raw["groups"][1]["options"] = CAP
    protocol = parse_sequence_protocol(raw)
    assert protocol.group("sync").options == (("max_num_batched_tokens", 256),)
    assert protocol.to_dict()["groups"][1]["options"] == CAP
    assert all("options" not in g for g in plain.to_dict()["groups"]) and protocol.hash != plain.hash
    assert list(settings_covered(protocol)) == [g["name"] for g in raw["groups"]]


@pytest.mark.parametrize(
    ("options", "words"),
    [
        ("small", "groups[1].options: expected a mapping (got 'small')"),
        ({}, "groups[1].options: expected a non-empty mapping (leave the key out to override nothing) (got {})"),
        ({"Max": 1}, "groups[1].options: must match [a-z][a-z0-9_]* (got 'Max')"),
    ],
)
def test_bad_group_options_name_the_key_the_value_and_the_file(tmp_path, options, words):
    raw = fake_protocol_dict()
    raw["groups"][1]["options"] = options
    path = write_protocol(tmp_path, raw, frozen=False)
    with pytest.raises(ProtocolError) as err:
        load_protocol(path)
    assert str(err.value) == f"{path}: {words}"


def test_homogeneity_compares_option_cells_nospec_included_and_nothing_else():
    protocol = parse_protocol(_cells())
    assert [t.groups for t in protocol.tests if t.kind == "homogeneity"] == [("nospec_cap",), ("sync_cap",)]
    not_a_cell = {"kind": "homogeneity", "position": 1, "role": "primary", "baseline": "sync", "groups": ["nospec_cap"]}
    with pytest.raises(ProtocolError, match=r"tests\[1\].groups: homogeneity applies to speculative groups other "):
        parse_protocol(_cells(tests=[CELL_TESTS[0], not_a_cell]))
    same_options = [*CELLS[:2], {"name": "nospec_twin", "mode": "nospec"}]
    twin = {**not_a_cell, "baseline": "nospec", "groups": ["nospec_twin"]}
    with pytest.raises(ProtocolError, match="only by options"):  # a replicate, not another setting
        parse_protocol(fake_protocol_dict(groups=same_options, tests=[CELL_TESTS[0], twin]))


def test_an_adapter_without_the_capability_refuses_group_options_before_any_seed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = write_protocol(tmp_path, _cells(), frozen=False)
    line = next(i + 1 for i, text in enumerate(path.read_text().splitlines()) if "options:" in text)
    result = CliRunner().invoke(main, ["run", str(path), "--exploratory", "--quiet"])
    assert result.exit_code == 2, result.output
    (message,) = result.output.strip().splitlines()
    assert message.endswith(
        f"{path}:{line}: groups[2].options: the protocol needs capability group_options='options', which "
        "adapter 'tests.fixtures.fake_sut:FakeSUT' does not declare (it declares group_options=False)"
    )
    assert not seeds.read_ledger(tmp_path / "results")


class DeclaringFakeSUT(FakeSUT):
    """FakeSUT declaring per-group options (it has none to honour: only its declaration is read here)."""

    capabilities = Capabilities(group_options=True)


def test_a_mutant_named_in_group_options_is_a_need_of_its_own():
    raw = _cells()
    raw["groups"][3]["options"] = {**CAP, "mutant": "no_such_bug"}
    file = Path("protocol.yaml")
    with pytest.raises(ProtocolError, match=r"groups\[3\].options.mutant: the protocol needs capability mutants="):
        check_capabilities(parse_protocol(raw), DeclaringFakeSUT, file)
    check_capabilities(parse_protocol(_cells()), DeclaringFakeSUT, file)  # declared, no mutant: accepted


def test_a_duck_typed_group_without_options_runs_sut_options():
    class Bare:
        name, mode, draft_loops = "g", "nospec", None

    spec = SutSpec(options=(("a", 1),))
    assert spec.options_for(Bare()) == spec.options == spec.options_for(GroupSpec("g", "nospec"))
