"""The quality protocol schema: a profile's `margin` (parsed, refused when bad, hashed, resolved).

Deterministic: parsing only, no sampling.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from specval.protocol import ProtocolError, load_protocol
from specval.quality.protocol import load_quality_protocol, parse_quality_protocol, resolve
from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol

PROTOCOLS = Path(__file__).resolve().parents[3] / "protocols"


def quality_dict(profiles: dict) -> dict:
    return {
        "kind": "quality",
        "name": "quality_fake",
        "sut": {"adapter": "engine"},
        "task": {"name": "arith", "metric": "exact", "options": {"seed": 0}},
        "sampling": {"temperature": 0.7, "top_p": 0.95},
        "num_speculative_tokens": 2,
        "max_tokens": 4,
        "groups": [{"name": "nospec", "mode": "nospec"}, {"name": "sync", "mode": "sync", "draft_loops": 1}],
        "baseline": "nospec",
        "num_items": 20,
        "seeds_per_item": 2,
        "margin": 0.05,
        "alpha": 0.05,
        "profiles": profiles,
    }


def load(tmp_path: Path, raw: dict):
    path = tmp_path / "quality_fake.yaml"
    path.write_text(yaml.safe_dump(raw))
    return load_quality_protocol(path), path


def test_a_profile_margin_is_parsed_and_replaces_the_protocols_margin_once_resolved(tmp_path):
    protocol, _ = load(tmp_path, quality_dict({"smoke": {"num_items": 5, "margin": 0.15}, "full": {"num_items": 20}}))
    assert protocol.margin == 0.05 and dict(protocol.profiles)["smoke"] == (("margin", 0.15), ("num_items", 5))
    smoke, full = resolve(protocol, "smoke"), resolve(protocol, "full")
    assert (smoke.margin, smoke.num_items, smoke.profile) == (0.15, 5, "smoke")
    assert isinstance(smoke.margin, float)
    assert (full.margin, full.num_items) == (0.05, 20)  # a profile without margin keeps the registered one
    assert smoke.hash == full.hash == protocol.hash  # applying a profile does not change the hash


def test_a_profile_margin_enters_the_registration_hash(tmp_path):
    plain, _ = load(tmp_path, quality_dict({"smoke": {"num_items": 5}}))
    wider, _ = load(tmp_path, quality_dict({"smoke": {"num_items": 5, "margin": 0.15}}))
    other, _ = load(tmp_path, quality_dict({"smoke": {"num_items": 5, "margin": 0.2}}))
    assert len({plain.hash, wider.hash, other.hash}) == 3


@pytest.mark.parametrize(
    "value, message",
    [
        (0, "must lie in (0, 1) (got 0)"),
        (1, "must lie in (0, 1) (got 1)"),
        (1.5, "must lie in (0, 1) (got 1.5)"),
        (-0.1, "must lie in (0, 1) (got -0.1)"),
        (0.0, "must lie in (0, 1) (got 0.0)"),
        ("0.1", "expected a number (got '0.1')"),
        (True, "expected a number (got True)"),
        (float("nan"), "expected a finite number"),
        ([0.1], "expected a number (got [0.1])"),
    ],
)
def test_a_bad_profile_margin_is_refused_naming_file_key_and_value(tmp_path, value, message):
    with pytest.raises(ProtocolError) as err:
        load(tmp_path, quality_dict({"smoke": {"num_items": 5, "margin": value}}))
    text = str(err.value)
    assert text.startswith(f"{tmp_path / 'quality_fake.yaml'}: profiles.smoke.margin: "), text
    assert message in text, text


def test_a_profile_key_still_refused_names_margin_among_those_allowed(tmp_path):
    with pytest.raises(
        ProtocolError,
        match=re.escape(
            "profiles.smoke.margn: a profile may only set ['num_items', "
            "'seeds_per_item', 'max_tokens', 'batch_size', 'margin']"
        )
        + ".*did you mean 'margin'",
    ):
        load(tmp_path, quality_dict({"smoke": {"margn": 0.1}}))
    with pytest.raises(ProtocolError, match=re.escape("profiles.smoke.num_items: expected an integer (got 0.5)")):
        load(tmp_path, quality_dict({"smoke": {"num_items": 0.5}}))  # the integer keys stay integers


def test_distribution_profiles_still_take_no_margin_and_keep_integer_values(tmp_path):
    """The shared parser's new float kind is opt-in: a distribution protocol refuses a profile margin."""
    raw = fake_protocol_dict(profiles={"ci": {"samples_per_group": 800, "margin": 0.1}})
    with pytest.raises(ProtocolError, match=re.escape("profiles.ci.margin: a profile may only set")):
        load_protocol(write_protocol(tmp_path, raw, frozen=False))
    protocol = load_protocol(write_protocol(tmp_path, fake_protocol_dict(), "plain.yaml", frozen=False))
    assert dict(protocol.profiles)["ci"] == (("samples_per_group", 800),)


def test_parse_without_a_file_names_the_placeholder():
    with pytest.raises(ProtocolError, match=re.escape("<protocol>: profiles.smoke.margin: must lie in (0, 1)")):
        parse_quality_protocol(quality_dict({"smoke": {"margin": 2.0}}))


def test_shipped_smoke_profiles_set_their_own_margin_and_full_keeps_the_registered_one():
    """The smoke margins are sized in tests/specval/quality/test_runner.py (Monte Carlo) and
    docs/real-model.md ("Quality protocols"); full runs are judged at the registered margin."""
    for name, registered in (("quality_arith", 0.05), ("quality_gsm8k", 0.03)):
        protocol = load_quality_protocol(PROTOCOLS / f"{name}.yaml")
        assert protocol.margin == registered and resolve(protocol, "full").margin == registered
        assert resolve(protocol, "smoke").margin > registered
