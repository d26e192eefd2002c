"""Planted bugs: never active by default, selected by name, and each accept-rule mutant's exact
single-draft law (quadrature, no sampling error) differs from p exactly when it should.

All checks are deterministic (no sampling), so the false-fail rate is 0. Caveat: a mutant that
breaks the piecewise-constant cell structure (residual_from_p) is not seen by quadrature on every
pair; on the pair below it is, and the kill table records what the model's own pairs show.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from engine import EngineConfig, mutants
from engine.runners.base import DEFAULT_OPS
from specval.engine_sut import EngineSUT
from specval.protocol import GroupSpec, SamplingSpec, SutSpec
from specval.reference import transform
from specval.stats.quadrature import quadrature_check, restrict_to_support

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


PROMPT = "The speculative sampler must be lossless."  # t1_quadrature's prompt
SAMPLING = SamplingSpec(temperature=1.0, top_k=20, top_p=1.0)  # t1_quadrature's sampling


def _prompt_pair(draft_loops: int) -> tuple[np.ndarray, np.ndarray]:
    """p and q of the default looped model at t1_quadrature's prompt, cut to their supports."""
    sut = EngineSUT(SutSpec(), 1)
    try:
        ids = sut.encode(PROMPT)
        p = transform(sut.target_logits(ids), SAMPLING).astype(np.float32)
        q = transform(sut.draft_logits(GroupSpec("sync", "sync", draft_loops), ids), SAMPLING).astype(np.float32)
    finally:
        sut.close()
    p_cut, q_cut, _ = restrict_to_support(p, q)
    return p_cut, q_cut


def _ratio_off(offset: float):
    """The engine's accept rule (torch) with the ratio moved: accept iff u < p(x)/q(x) + offset."""
    accept = mutants.accept_op(mutants.AcceptMutation(accept_rule=lambda u, q_x, p_x: u < p_x / q_x + offset))

    def first_token(draft_tokens, draft_probs, target_probs, uniforms):
        rows = len(draft_tokens)
        result = accept(torch.from_numpy(np.ascontiguousarray(draft_tokens)), torch.arange(rows + 1),
                        torch.from_numpy(np.ascontiguousarray(draft_probs)),
                        torch.from_numpy(np.repeat(target_probs, 2, axis=0)),
                        torch.from_numpy(np.ascontiguousarray(uniforms)), torch.zeros(rows, dtype=torch.bool))
        return result.tokens[:, 0].numpy()

    return first_token


@pytest.mark.parametrize("draft_loops", [1, 2])
def test_an_accept_ratio_off_by_a_thousandth_fails_on_the_prompt_pair(draft_loops):
    # The sweep's resolution is 1/2^16 = 1.5e-5; an additive 1e-3 on the ratio moves
    # q(x)/T_q * 1e-3 of mass at every x with p(x) < q(x), ~1e-4 on this model's pairs.
    p, q = _prompt_pair(draft_loops)
    assert quadrature_check(p, q, _accept_fn(None)).passed
    result = quadrature_check(p, q, _ratio_off(1e-3))
    assert not result.passed and result.max_abs_error > 2 * result.resolution, result.to_dict()


def test_accept_single_uses_the_protocols_backend():
    # sampling_backend reaches speculative_accept: 'triton' on CPU tensors without the
    # interpreter is refused by the engine, so a dropped option would pass silently here.
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        pytest.skip("TRITON_INTERPRET is set: Triton runs on the CPU")
    p, q = _pair()
    sut = EngineSUT(SutSpec(options=(("sampling_backend", "triton"),)), 1)
    with pytest.raises(ValueError, match="backend='triton'"):
        sut.accept_single(np.array([0]), q[None], p[None], np.array([[0.5, 0.5, 0.5]]))


@pytest.mark.gpu
@pytest.mark.parametrize("mutant", [None, "residual_from_p"])
def test_on_cuda_the_quadrature_runs_the_triton_accept_kernel(monkeypatch, mutant):
    # A cuda protocol's EngineSUT puts the rows on the GPU, where 'auto' resolves to the Triton
    # kernel; the spy proves the kernel ran (not torch on CPU tensors) and the sweep passes it
    # (and still kills a mutant, whose rule wraps the same kernel).
    if not torch.cuda.is_available():
        pytest.skip("CUDA is not available")
    from engine.sampling.kernels import accept as accept_kernel

    calls = []
    real = accept_kernel.accept_triton
    monkeypatch.setattr(accept_kernel, "accept_triton", lambda *a, **k: calls.append(a[0].device) or real(*a, **k))
    options = () if mutant is None else (("mutant", mutant),)
    sut = EngineSUT(SutSpec(device="cuda", options=options), 1)
    p, q = _pair()
    result = quadrature_check(p, q, sut.accept_single)
    assert calls and all(device.type == "cuda" for device in calls)
    assert result.passed == (mutant is None), result.to_dict()
