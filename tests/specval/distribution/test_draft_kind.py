"""The quadrature builds q the way the SUT drafts (`Capabilities.draft_kind`): filtered, temperature
only, or greedy (a point mass at the argmax). For each kind, a kernel that is right for that kind
PASSes and a kernel that is right only for another kind FAILs. The quadrature is deterministic
(a sweep, no sampling): no false-fail rate; the grid is cut to 2^10 (resolution 1e-3), far below
the deviations the wrong kernels make (each asserted >= 4 resolutions below)."""

from __future__ import annotations

import numpy as np
import pytest

from specval.distribution.checks import quadrature_criterion
from specval.distribution.decision import FAIL, PASS
from specval.distribution.laws import quadrature_laws
from specval.distribution.reference import draft_law, transform
from specval.protocol import SamplingSpec, parse_protocol
from specval.semantics import DEFAULT_SEMANTICS
from specval.sut import DRAFT_FILTERED, DRAFT_GREEDY, DRAFT_TEMPERATURE, Capabilities
from tests.fixtures.fake_protocol import fake_protocol_dict
from tests.fixtures.fake_sut import FakeSUT

GRID = 1 << 10
TOP_K = 4
SAMPLING = {"temperature": 0.8, "top_k": TOP_K, "top_p": 1.0}
MIN_DEVIATION = 4.0 / GRID  # each wrong kernel's worst error is >= 4 resolutions (asserted): no FAIL by the grid


def _rows(draft_probs, target_probs):
    return np.asarray(draft_probs, np.float64), np.asarray(target_probs, np.float64)


def _first_positive(weights: np.ndarray, u: np.ndarray) -> np.ndarray:
    cdf = np.cumsum(weights, axis=1)
    index = (cdf <= (u * cdf[:, -1])[:, None]).sum(axis=1)
    last = weights.shape[1] - 1 - np.argmax(weights[:, ::-1] > 0, axis=1)
    return np.minimum(index, last)


def point_mass_kernel(draft_tokens, draft_probs, target_probs, uniforms):
    """Right for greedy drafts only: ignores q, treats the draft as certain (q = point mass at x)."""
    _, p = _rows(draft_probs, target_probs)
    rows = np.arange(len(draft_tokens))
    residual = p.copy()
    residual[rows, draft_tokens] = 0.0
    accepted = uniforms[:, 1] < p[rows, draft_tokens]
    return np.where(accepted, draft_tokens, _first_positive(residual, uniforms[:, 2])).astype(np.int64)


def truncating_kernel(draft_tokens, draft_probs, target_probs, uniforms):
    """Assumes filtered drafts: re-applies the protocol's top-k to the q it is given, so it is wrong
    for a SUT whose drafts are temperature-only (its q is untruncated)."""
    q, p = _rows(draft_probs, target_probs)
    kth = -np.sort(-q, axis=1)[:, TOP_K - 1 : TOP_K]
    q = np.where(q >= kth, q, 0.0)
    q = q / q.sum(axis=1, keepdims=True)
    rows = np.arange(len(draft_tokens))
    accepted = uniforms[:, 1] * q[rows, draft_tokens] < p[rows, draft_tokens]
    return np.where(accepted, draft_tokens, _first_positive(np.maximum(p - q, 0.0), uniforms[:, 2])).astype(np.int64)


def target_argmax_kernel(draft_tokens, draft_probs, target_probs, uniforms):
    """Wrong for every kind: accepts iff the draft is the target's argmax, else draws from p."""
    _, p = _rows(draft_probs, target_probs)
    accepted = draft_tokens == np.argmax(p, axis=1)
    return np.where(accepted, draft_tokens, _first_positive(p, uniforms[:, 2])).astype(np.int64)


def _sut(kind: str, kernel=None):
    sut = FakeSUT(parse_protocol(fake_protocol_dict()).sut, 1)
    sut.capabilities = Capabilities(draft_kind=kind)
    if kernel is not None:
        sut.accept_single = kernel
    return sut


def _verdict(sut, monkeypatch) -> tuple[str, float, dict]:
    """(verdict, the largest |swept law - exact law| over the swept pairs, the laws)."""
    monkeypatch.setattr("specval.distribution.laws.QUADRATURE_GRID_SIZE", GRID)
    protocol = parse_protocol(fake_protocol_dict(sampling=SAMPLING))
    laws = quadrature_laws(sut, protocol, sut.encode(protocol.prompt))
    test = next(t for t in protocol.tests if t.kind == "quadrature")
    pairs = laws["sync"] + laws["adversarial"] + laws["stop_point"]
    result = quadrature_criterion(test, "sync", pairs)
    worst = max(c["max_abs_error"] for c in result["pairs"].values() if "max_abs_error" in c)
    return result["verdict"], worst, laws


CASES = [  # (kind, right kernel (None: the generic one), wrong kernel)
    (DRAFT_FILTERED, None, point_mass_kernel),
    (DRAFT_TEMPERATURE, None, truncating_kernel),
    (DRAFT_GREEDY, point_mass_kernel, target_argmax_kernel),
    (DRAFT_GREEDY, None, target_argmax_kernel),
]


@pytest.mark.parametrize("kind, right, wrong", CASES, ids=lambda c: getattr(c, "__name__", str(c)))
def test_each_draft_kind_passes_its_kernel_and_fails_a_wrong_one(kind, right, wrong, monkeypatch):
    verdict, worst, _ = _verdict(_sut(kind, right), monkeypatch)
    assert verdict == PASS and worst <= 1.0 / GRID, worst
    verdict, worst, _ = _verdict(_sut(kind, wrong), monkeypatch)
    assert verdict == FAIL and worst > MIN_DEVIATION, worst


def test_the_quadrature_q_is_the_law_the_sut_drafts_from(monkeypatch):
    protocol = parse_protocol(fake_protocol_dict(sampling=SAMPLING))
    sut = _sut(DRAFT_FILTERED)
    logits = sut.draft_logits(protocol.group("sync"), sut.encode(protocol.prompt)).astype(np.float64)
    expected = {
        DRAFT_FILTERED: transform(logits, protocol.sampling),
        DRAFT_TEMPERATURE: transform(logits, SamplingSpec(0.8)),
        DRAFT_GREEDY: np.eye(logits.size)[int(np.argmax(logits))],
    }
    assert np.count_nonzero(expected[DRAFT_FILTERED]) == TOP_K < np.count_nonzero(expected[DRAFT_TEMPERATURE])
    for kind, q in expected.items():
        np.testing.assert_array_equal(draft_law(logits, protocol.sampling, DEFAULT_SEMANTICS, kind), q)
        _, _, laws = _verdict(_sut(kind), monkeypatch)
        stored = np.zeros(logits.size)
        stored[laws["sync"][0]["tokens"]] = laws["sync"][0]["q"]
        np.testing.assert_allclose(stored, q, rtol=0, atol=0)
        if kind == DRAFT_GREEDY:  # synthetic pairs too are drafted greedily: point masses
            assert all(np.count_nonzero(pair["q"]) == 1 for pair in laws["adversarial"])
