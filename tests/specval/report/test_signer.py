"""The signer line (specval/report/signer.py): the key id a signer gives, else the one the
envelope names, else unsigned; an envelope that names no key id is said so in one line, never a
traceback; bundles made before identities get no line. Deterministic, no signature made."""

from __future__ import annotations

import json

import pytest

from specval import bundle as bundles
from specval.report import signer

KEY_ID = "ab" * 32
IDENTITY = {"sut_identity": None}  # a manifest that records the key (null: the protocol names no adapter)


def _envelope(path, signatures) -> None:
    (path / bundles.SIGNATURE_FILE).write_text(json.dumps({"payload": "", "signatures": signatures}))


def test_the_line_names_the_signer_given_else_the_envelopes_key_else_unsigned(tmp_path):
    assert signer.signer_text(tmp_path) == signer.UNSIGNED_TEXT
    assert signer.signer_text(tmp_path, KEY_ID) == signer.signed_text(KEY_ID)
    _envelope(tmp_path, [{"keyid": KEY_ID, "sig": ""}])
    assert signer.envelope_key_id(tmp_path) == KEY_ID
    assert signer.signer_text(tmp_path).startswith(f"signed by key {KEY_ID} (ed25519")
    assert signer.signer_text(tmp_path, "cd" * 32) == signer.signed_text("cd" * 32)  # about to re-sign


@pytest.mark.parametrize(
    "content",
    [
        "not json",
        json.dumps({"signatures": []}),
        json.dumps({"signatures": [{"keyid": KEY_ID}, {"keyid": KEY_ID}]}),
        json.dumps({"signatures": [{"keyid": "AB" * 32}]}),  # not lowercase hex
        json.dumps({"signatures": [{"keyid": "<b>" + "a" * 61}]}),
        json.dumps([1, 2]),
    ],
)
def test_an_envelope_naming_no_key_id_is_said_so(tmp_path, content):
    (tmp_path / bundles.SIGNATURE_FILE).write_text(content)
    with pytest.raises(ValueError, match=bundles.SIGNATURE_FILE):
        signer.envelope_key_id(tmp_path)
    assert signer.signer_text(tmp_path) == signer.UNREADABLE_TEXT


def test_a_link_for_an_envelope_is_not_followed(tmp_path):
    target = tmp_path / "elsewhere.json"
    target.write_text(json.dumps({"signatures": [{"keyid": KEY_ID}]}))
    (tmp_path / bundles.SIGNATURE_FILE).symlink_to(target)
    assert signer.signer_text(tmp_path) == signer.UNREADABLE_TEXT


def test_only_bundles_that_record_an_identity_get_the_line(tmp_path):
    assert signer.signer_lines(tmp_path, IDENTITY) == [signer.UNSIGNED_TEXT]
    assert signer.signer_lines(tmp_path, IDENTITY, KEY_ID) == [signer.signed_text(KEY_ID)]
    assert signer.signer_lines(tmp_path, {}, KEY_ID) == []  # made before identities: renders as sealed
