"""Reference transform: the section-2 contract in float64, checked by brute force and against the
engine's row-wise Sampler on random logits (with ties and truncation on both rules)."""

from __future__ import annotations

import base64
import json

import numpy as np
import pandas as pd
import pytest
import torch

from specval.distribution.reference import Reference, needed_prefixes, transform
from specval.protocol import SamplingSpec

ENGINE_TOL = 2e-6  # float32 (engine) vs float64 (here) softmax on V <= 256


def _brute_force(logits: np.ndarray, spec: SamplingSpec) -> np.ndarray:
    """Literal reading of the contract, O(V^2), no sorting."""
    x = logits.astype(np.float64) / spec.temperature
    keep = np.ones(x.size, bool)
    if 0 < spec.top_k < x.size:
        keep = np.array([(x > v).sum() < spec.top_k for v in x])
    w = np.where(keep, np.exp(x - x[keep].max()), 0.0)
    probs = w / w.sum()
    if spec.top_p < 1.0:
        keep &= np.array([probs[probs > v].sum() < spec.top_p for v in probs])
    w = np.where(keep, np.exp(x - x[keep].max()), 0.0)
    return w / w.sum()


SPECS = [
    SamplingSpec(1.0, -1, 1.0),
    SamplingSpec(0.7, 5, 1.0),
    SamplingSpec(1.3, -1, 0.8),
    SamplingSpec(1.0, 20, 0.9),
    SamplingSpec(2.0, 1, 0.5),
    SamplingSpec(0.5, 0, 0.3),
]


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_transform_matches_brute_force_with_ties(spec):
    rng = np.random.default_rng(7)
    for _ in range(20):
        logits = np.round(rng.standard_normal(40) * 2, 1)  # rounding creates many ties
        np.testing.assert_allclose(transform(logits, spec), _brute_force(logits, spec), rtol=0, atol=1e-15)


def test_top_k_keeps_all_ties_and_top_p_keeps_the_crossing_token():
    logits = np.log(np.array([0.4, 0.2, 0.2, 0.1, 0.1]))
    assert np.count_nonzero(transform(logits, SamplingSpec(1.0, 2, 1.0))) == 3  # tie at the 2nd value
    assert np.count_nonzero(transform(logits, SamplingSpec(1.0, -1, 0.5))) == 3  # 0.4 < 0.5; ties at 0.2 kept
    assert np.count_nonzero(transform(logits, SamplingSpec(1.0, -1, 0.4))) == 1  # mass before 0.4 is 0


@pytest.mark.parametrize("spec", SPECS, ids=str)
def test_transform_equals_engine_sampler(spec):
    from engine import SamplingParams
    from engine.sampling import Sampler

    params = SamplingParams(temperature=spec.temperature, top_k=spec.top_k, top_p=spec.top_p)
    gen = torch.Generator().manual_seed(3)
    for _ in range(10):
        logits = torch.randn(256, generator=gen) * 3
        logits[:8] = logits[8]  # a block of ties
        engine_probs = Sampler().probabilities(logits, params).double().numpy()
        ours = transform(logits.numpy(), spec)
        assert np.array_equal(engine_probs > 0, ours > 0)
        np.testing.assert_allclose(engine_probs, ours, rtol=0, atol=ENGINE_TOL)


@pytest.mark.parametrize("vocab, width", [(256, 3), (50_000, 4), (2**31, 3)])
def test_needed_prefixes_are_every_distinct_row_prefix(vocab, width):
    """Against the definition (a set of tuples of each row's first k tokens), on fresh random
    rows with out-of-range tokens mixed in; (2**31, 3) takes the `np.unique(axis=0)` path (the
    rows as base-V numbers would overflow an int64), the others the 1-D keys."""
    rng = np.random.default_rng(vocab + width)
    tokens = rng.integers(0, min(vocab, 40), (5000, width))  # few symbols: prefixes repeat
    tokens[:, 0] = np.where(rng.random(5000) < 0.01, vocab - 1, tokens[:, 0])  # the largest id
    tokens[rng.random((5000, width)) < 0.001] = vocab  # out of range: the row is never tested
    tokens[rng.random((5000, width)) < 0.001] = -1
    valid = [row for row in tokens.tolist() if all(0 <= t < vocab for t in row)]
    expected = {tuple(row[:k]) for row in valid for k in range(width)}
    assert needed_prefixes(tokens, vocab) == sorted(expected, key=lambda p: (len(p), p))


def test_reference_round_trips_exactly_and_prefixes_cover_every_stratum():
    tokens = np.array([[1, 2, 3], [1, 2, 4], [5, 6, 7]])
    assert needed_prefixes(tokens) == [(), (1,), (5,), (1, 2), (5, 6)]
    rng = np.random.default_rng(0)
    dists = {p: transform(rng.standard_normal(16), SamplingSpec(1.0, 4, 1.0)) for p in needed_prefixes(tokens)}
    dists[(1, 2)] = transform(rng.standard_normal(16), SamplingSpec(1.0))  # support = whole vocabulary
    ref = Reference(16, (9, 9), dists)
    data = json.loads(json.dumps(ref.to_dict()))
    back = Reference.from_dict(data)
    assert back.prompt_token_ids == (9, 9)
    for prefix, probs in dists.items():
        assert np.array_equal(back.probs(prefix), probs)
    entries = {tuple(entry["prefix"]): entry for entry in data["dists"]}
    assert "tokens" not in entries[(1, 2)] and isinstance(entries[(1, 2)]["probs"], str)
    assert len(base64.b64decode(entries[()]["tokens"])) == 4 * 4  # top-k 4: four int32 ids


def test_reference_reads_format_2_lists_and_names_a_malformed_entry():
    """Bundles of format 2 list tokens and probs as JSON numbers; they still read, exactly.
    A corrupt entry raises ValueError naming its prefix (verify reports it, no traceback)."""
    probs = transform(np.random.default_rng(1).standard_normal(8), SamplingSpec(1.0, 3, 1.0))
    support = np.flatnonzero(probs > 0)
    legacy = {
        "vocab_size": 8,
        "prompt_token_ids": [1],
        "dists": [{"prefix": [], "tokens": support.tolist(), "probs": probs[support].tolist()}],
    }
    assert np.array_equal(Reference.from_dict(json.loads(json.dumps(legacy))).probs(()), probs)
    good = Reference(8, (1,), {(4,): probs}).to_dict()
    for field, value, message in [
        ("probs", "not base64!", "probs is not base64"),
        ("probs", base64.b64encode(b"1234567").decode(), "7 bytes"),
        ("tokens", base64.b64encode(b"\0" * 8).decode(), "3 probs for 2 tokens"),
        ("tokens", base64.b64encode(np.array([0, 1, 99], "<i4").tobytes()).decode(), "outside"),
    ]:
        bad = json.loads(json.dumps(good))
        bad["dists"][0][field] = value
        with pytest.raises(ValueError, match=rf"prefix \[4\].*{message}"):
            Reference.from_dict(bad)


def test_path_strata_refine_the_token_strata():
    from specval.distribution.strata import path_strata, strata

    tokens = np.array([[1, 5], [1, 6], [1, 7], [2, 5], [1, 5]])
    paths = np.array([[1, 1], [2, 1], [1, 2], [1, 1], [2, 3]])  # codes of SOURCES
    by_path = {(prefix, path): sorted(t.tolist()) for prefix, path, t in path_strata(tokens, paths, 2)}
    assert by_path == {((1,), (1,)): [5, 7], ((1,), (2,)): [5, 6], ((2,), (1,)): [5]}
    plain = {prefix: sorted(t.tolist()) for prefix, t in strata(tokens, 2)}
    assert plain == {(1,): [5, 5, 6, 7], (2,): [5]}


def test_source_codes_index_sources_and_mark_anything_else_minus_one():
    from specval.distribution.strata import source_codes
    from specval.sut import SOURCES

    column = pd.Series([SOURCES[2], "mystery", None, SOURCES[0], SOURCES[3], SOURCES[2]], dtype="str")
    assert source_codes(column).tolist() == [2, -1, -1, 0, 3, 2]
    assert source_codes(column).dtype == np.int64
