"""Planted bugs: never active by default, selected by name, and each accept-rule mutant's exact
single-draft law (quadrature, no sampling error) differs from p exactly when it should.

All checks are deterministic (no sampling), so the false-fail rate is 0. Caveat: a mutant that
breaks the piecewise-constant cell structure (residual_from_p) is not seen by quadrature on every
pair; on the pair below it is, and the kill table records what the model's own pairs show.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine import EngineConfig, mutants
from engine.runners.base import DEFAULT_OPS
from specval.engine_sut import EngineSUT
from specval.protocol import SutSpec
from specval.stats.quadrature import quadrature_check

CHANGES_T1_LAW = ("residual_from_p", "residual_unnormalised", "residual_abs", "ratio_inverted")
KEEPS_T1_LAW = ("accept_le", "uniform_reused", "bonus_wrong_position", "bonus_from_q", "accept_by_division")


def _accept_fn(name: str | None):
    spec = SutSpec(options=(() if name is None else (("mutant", name),)))
    return EngineSUT(spec, 1).accept_single  # needs no model: it calls the (mutant) accept rule only


def _pair() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(2)  # on some pairs residual_from_p hides between cell midpoints (seed 3)
    p, q = rng.dirichlet(np.ones(8)), rng.dirichlet(np.ones(8))
    p[2] = 0.0  # a token the draft proposes but the target forbids
    return (p / p.sum()).astype(np.float32), q.astype(np.float32)


def test_default_config_runs_the_engines_own_operations():
    assert EngineConfig().mutant is None and mutants.sampling_ops(None) is DEFAULT_OPS
    assert all(m.ops is not DEFAULT_OPS for m in mutants.MUTANTS if m.layer == mutants.ENGINE_LAYER)
    assert len(set(mutants.MUTANT_NAMES)) == len(mutants.MUTANTS) >= 17
    assert any(m.equivalent for m in mutants.MUTANTS)


def test_unknown_mutant_is_a_value_error_naming_the_field():
    with pytest.raises(ValueError, match="mutant='nope'"):
        EngineConfig(mutant="nope")


@pytest.mark.parametrize("name", CHANGES_T1_LAW)
def test_quadrature_kills_accept_rule_mutants(name):
    p, q = _pair()
    assert quadrature_check(p, q, _accept_fn(None), 1e-6).passed
    assert not quadrature_check(p, q, _accept_fn(name), 1e-6).passed


@pytest.mark.parametrize("name", KEEPS_T1_LAW)
def test_mutants_outside_the_single_draft_law_keep_it(name):
    p, q = _pair()
    assert quadrature_check(p, q, _accept_fn(name), 1e-6).passed


def test_stop_point_accepts_a_forbidden_token_only_under_accept_le():
    p, q = _pair()
    u = np.array([[0.0, 0.0, 0.5]])
    for name, accepts in ((None, False), ("accept_le", True), ("accept_by_division", False)):
        first = _accept_fn(name)(np.array([2]), q[None], p[None], u)
        assert (int(first[0]) == 2) == accepts, name
