"""Shared fixtures of the harness tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.fake_protocol import fake_protocol_dict, write_protocol


@pytest.fixture
def fake_protocol_file(tmp_path) -> Path:
    return write_protocol(tmp_path, fake_protocol_dict())
