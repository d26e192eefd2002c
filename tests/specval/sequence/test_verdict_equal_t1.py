"""`equal_t1_adjacent`: two-sided, so streams that push paired first tokens apart FAIL it; what it
cannot see of antithetic streams (and the association criterion does); its printed effect, signed.

Data: 200 requests in batches of 50 (seq_fp32's smoke layout), first token only, drawn by inverse
CDF in token-id order from one law p, slot 2i + 1 with the uniform 1 - u of slot 2i (antithetic
streams) or its own (independent). Decided at seq_fp32's first Holm step, 0.01 / 50.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specval.sequence import verdict
from specval.sequence.protocol import load_sequence_protocol, resolve
from specval.stats.montecarlo import criterion_rng
from specval.stats.sequence import pit_parts

REPO = Path(__file__).resolve().parents[3]
PROTOCOL = resolve(load_sequence_protocol(REPO / "protocols" / "seq_fp32.yaml"), "smoke")
LEVEL = PROTOCOL.alpha / verdict.family_sizes(PROTOCOL)["primary"]
REQUESTS = PROTOCOL.sequences_per_group


def _context(law: np.ndarray, antithetic: bool, seed: int, rules: int = verdict.CURRENT_RULES) -> verdict.Context:
    rng = np.random.default_rng(seed)
    u = rng.random(REQUESTS)
    if antithetic:
        u[1::2] = 1.0 - u[0::2]
    tokens = np.minimum(np.searchsorted(np.cumsum(law), u, side="right"), law.size - 1)[:, None]
    laws = np.repeat(law[None], REQUESTS, axis=0)
    lower, mass = pit_parts(laws, tokens[:, 0], "index")
    parts = {"self_match": np.full((REQUESTS, 1), float((law * law).sum())), "mass": mass[:, None]}
    rows = np.arange(REQUESTS)
    batch, slot = rows // PROTOCOL.batch_size, rows % PROTOCOL.batch_size
    data = verdict.GroupSequences(
        tokens, np.full(tokens.shape, "plain", dtype=object), batch, slot, parts, *[tokens[:0]] * 2
    )
    u_index = np.minimum(lower + rng.random(REQUESTS) * mass, 1 - 1e-16)[:, None]
    position = np.ones(tokens.shape, dtype=np.int64)

    def streams(name: str):
        return criterion_rng("equal_t1-test", name, str(seed))

    return verdict.Context(PROTOCOL, "nospec", data, u_index, u_index, position, position - 1, LEVEL, streams, rules)


def test_equal_t1_rejects_antithetic_streams_that_make_paired_first_tokens_differ():
    # Deterministic: with p uniform over 4 tokens in id order, u and 1 - u never fall in the same
    # quarter, so no adjacent pair matches (expected 25 of 100 under independence): the two-sided
    # exact p-value is 4.5e-13, far below 0.01 / 50. The printed effect is a decrease, signed
    # (-1: no match), and so is the MDE of a decrease (-0.706; an increase +0.868).
    count, p_value, pairs, mde, label, details = verdict.equal_t1_adjacent(_context(np.full(4, 0.25), True, 1))
    assert (count, pairs, details["expected"]) == (0, 100, 25.0)
    assert p_value < 1e-10 and details["alternative"] == "two-sided" and details["change"] == -1.0
    assert details["mde_decrease"] < 0 < details["mde_increase"]
    assert mde == max(details["mde_increase"], -details["mde_decrease"])
    assert f"-{-details['mde_decrease']:.3g}" in label and f"+{details['mde_increase']:.3g}" in label


def test_equal_t1_cannot_see_antithetic_streams_that_keep_the_match_rate_and_association_does():
    # p uniform over 3 tokens: u and 1 - u fall in the same third iff u is in the middle one,
    # probability 1/3 = sum p^2, pair by pair independently, so the equal count has EXACTLY its null
    # law: equal_t1 rejects it at its level, 2e-4, no more often (this seed: 33 equal pairs of 33.3
    # expected, p = 1, a PASS; the docs say so). The paired PITs in id order are negatively
    # correlated (rho = -8/9 in the limit; observed -0.88, ~9 standard deviations from 0 with 100
    # pairs), so association_adjacent rejects at its early look: p = 1e-4 (twice rho's early
    # p = level / 4, Bonferroni over its two statistics); it would pass only w.p. < 1e-15.
    law = np.full(3, 1 / 3)
    assert float((law * law).sum()) == pytest.approx(1 / 3)
    ctx = _context(law, True, 2)
    _, p_value, _, _, _, details = verdict.equal_t1_adjacent(ctx)
    assert p_value > LEVEL and abs(details["change"]) < 0.3
    statistic, association_p, *_ = verdict.association_adjacent(ctx)
    assert statistic > 0.6 and association_p <= LEVEL


def test_equal_t1_keeps_the_first_rules_text_for_sealed_bundles():
    # Deterministic: bundles of criteria version 1 and 2 recompute the row they were sealed with
    # (one unsigned MDE, the first label, no new keys), so `specval verify` still agrees with them.
    for rules in (verdict.FIRST_RULES, verdict.MAX_TYPE_RULES):
        row = verdict.equal_t1_adjacent(_context(np.full(4, 0.25), False, 3, rules))
        assert row[4] == verdict.EQUAL_T1_LABEL and set(row[5]) == {"expected", "ratio"}
    current = verdict.equal_t1_adjacent(_context(np.full(4, 0.25), False, 3))
    assert current[3] == row[3] and current[1] == row[1] and current[4] != row[4]
