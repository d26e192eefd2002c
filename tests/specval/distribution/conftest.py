"""Shared fixtures of the multi-rank tests (test_sharding.py, test_nodes.py)."""

from __future__ import annotations

import pandas as pd
import pytest

from tests.fixtures.sharded_runs import one_process_samples


@pytest.fixture(scope="session")
def one_process(tmp_path_factory) -> pd.DataFrame:
    """The sample table of a one-process run of the small protocol (tests/fixtures/sharded_runs.py):
    what every multi-rank run of the same seeds must equal."""
    return one_process_samples(tmp_path_factory.mktemp("one"))
