"""The sequence protocol schema: the shipped file parses, bad layouts and drafts are named errors."""

from __future__ import annotations

import pytest

from specval.protocol import ProtocolError
from specval.sequence.protocol import MAX_SPECULATIVE_TOKENS, load_sequence_protocol, parse_sequence_protocol, resolve
from tests.fixtures.sequence_protocol import sequence_protocol_dict


def test_shipped_protocol_parses_and_profiles_keep_the_hash():
    protocol = load_sequence_protocol("protocols/seq_fp32.yaml")
    assert protocol.kind == "sequence" and protocol.sequence_length >= 64 and len(protocol.prompts) >= 2
    assert {g.draft for g in protocol.groups} == {"own", "noisy", "adversarial", "temperature"}
    smoke = resolve(protocol, "smoke")
    assert smoke.hash == protocol.hash and smoke.sequences_per_group < protocol.sequences_per_group


def test_hash_changes_with_a_draft_and_round_trips_through_json():
    protocol = parse_sequence_protocol(sequence_protocol_dict(), "x.yaml")
    again = parse_sequence_protocol(protocol.to_dict(), "protocol.json")
    assert again.hash == protocol.hash
    groups = sequence_protocol_dict()["groups"]
    groups[1]["draft"] = "noisy"
    assert parse_sequence_protocol(sequence_protocol_dict(groups=groups), "x.yaml").hash != protocol.hash


def test_companions_enter_the_hash_only_where_a_group_has_them():
    """Deterministic. A protocol without companions hashes as before the key existed (the shipped
    locks stay valid: tests/specval/protocol checks them); greedy companions parse; each companion
    sampling changes the hash and survives the JSON round trip of a bundle."""
    plain = sequence_protocol_dict()
    plain["groups"] = [g for g in plain["groups"] if "companions" not in g]
    protocol = parse_sequence_protocol(plain, "x.yaml")
    assert all("companions" not in g for g in protocol.to_dict()["groups"])
    mixed = parse_sequence_protocol(sequence_protocol_dict(), "x.yaml")
    group = mixed.group("mixed")
    assert [c.temperature for c in group.companions] == [0.0, 0.5] and mixed.hash != protocol.hash
    assert parse_sequence_protocol(mixed.to_dict(), "protocol.json").hash == mixed.hash
    raw = sequence_protocol_dict()
    raw["groups"][-1]["companions"][1]["temperature"] = 0.6
    assert parse_sequence_protocol(raw, "x.yaml").hash != mixed.hash


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"batch_size": 41, "sequences_per_group": 164}, "batch_size"),
        ({"sequences_per_group": 150}, "sequences_per_group"),
        ({"sequences_per_group": 120}, "sequences_per_group"),  # 3 batches < 2 per prompt x 2 prompts
        ({"num_speculative_tokens": MAX_SPECULATIVE_TOKENS + 1}, "num_speculative_tokens"),
        ({"groups": [{"name": "nospec", "mode": "nospec", "draft": "noisy"}]}, "groups[0].draft"),
        ({"groups": [{"name": "s", "mode": "sync", "draft": "clever"}]}, "groups[0].draft"),
        ({"tests": [{"kind": "pit", "role": "secondary"}]}, "tests"),
        ({"profiles": {"smoke": {"sequences_per_group": 100}}}, "sequences_per_group"),
        ({"groups": [{"name": "m", "mode": "sync", "companions": []}]}, "groups[0].companions"),
        (
            {"groups": [{"name": "m", "mode": "sync", "companions": [{"temperature": 1e-9}]}]},
            "groups[0].companions[0].temperature",
        ),
        (
            {"groups": [{"name": "m", "mode": "sync", "companions": [{"top_k": 3}]}]},
            "groups[0].companions[0].temperature",
        ),
        (
            {"groups": [{"name": "m", "mode": "sync", "companions": [{"temperature": 0, "seed": 3}]}]},
            "groups[0].companions[0].seed",
        ),
        (
            {"groups": [{"name": "m", "mode": "sync", "companions": [{"temperature": 0.7, "top_p": 0}]}]},
            "groups[0].companions[0].top_p",
        ),
    ],
)
def test_bad_values_name_the_key_and_the_file(overrides, key):
    with pytest.raises(ProtocolError) as err:
        parse_sequence_protocol(sequence_protocol_dict(**overrides), "bad.yaml")
    assert "bad.yaml" in str(err.value) and key in str(err.value)
