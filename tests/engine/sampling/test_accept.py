"""speculative_accept: hand-checked stop points, ragged rows, greedy rows and error codes.

Distributions: q = [0.8, 0.2, 0, 0], p = [0.4, 0.6, 0, 0] at draft positions, so drafting
token 0 is accepted iff u_accept < 0.5 and the recovered token max(p - q, 0) is always 1;
the bonus row is one-hot at token 3.
"""

import pytest
import torch

from engine.sampling import (
    ERR_BAD_DRAFT_TOKEN,
    ERR_BAD_OFFSETS,
    ERR_EMPTY_RESIDUAL,
    ERR_INVALID_DRAFT,
    ERR_INVALID_TARGET,
    ERR_NONE,
    PLACEHOLDER_TOKEN,
    speculative_accept,
)

K, V = 3, 4
Q = [0.8, 0.2, 0.0, 0.0]
P = [0.4, 0.6, 0.0, 0.0]
BONUS = [0.0, 0.0, 0.0, 1.0]
ACCEPT, REJECT = 0.1, 0.9


def request(drafts, u_accept, *, greedy=False, q=None, p=None, bonus=BONUS, u_final=0.5):
    """One request: K_r = len(drafts) positions, target rows p then the bonus row."""
    return {
        "drafts": drafts,
        "q": q or [Q] * len(drafts),
        "p": (p or [P] * len(drafts)) + [bonus],
        "u": u_accept + [0.5] * (K - len(u_accept)),
        "u_final": u_final,
        "greedy": greedy,
    }


def run(requests, backend):
    drafts, q, p, u, greedy, cu = [], [], [], [], [], [0]
    for r in requests:
        drafts += r["drafts"]
        q += r["q"]
        p += r["p"]
        u.append([0.5] * K + r["u"] + [r["u_final"]])
        greedy.append(r["greedy"])
        cu.append(cu[-1] + len(r["drafts"]))
    return speculative_accept(
        torch.tensor(drafts, dtype=torch.int64),
        torch.tensor(cu, dtype=torch.int32),
        torch.tensor(q, dtype=torch.float32).reshape(-1, V),
        torch.tensor(p, dtype=torch.float32),
        torch.tensor(u, dtype=torch.float64),
        torch.tensor(greedy),
        backend=backend,
    )


def pad(tokens):
    return tokens + [PLACEHOLDER_TOKEN] * (K + 1 - len(tokens))


def test_stop_point_at_every_position_and_bonus(backend):
    reqs = [request([0, 0, 0], [ACCEPT] * j + [REJECT] + [ACCEPT] * (2 - j)) for j in range(3)]
    reqs.append(request([0, 0, 0], [ACCEPT] * 3))
    out = run(reqs, backend)
    assert out.tokens.tolist() == [pad([0] * j + [1]) for j in range(3)] + [[0, 0, 0, 3]]
    assert out.num_accepted.tolist() == [0, 1, 2, 3]
    assert out.error.tolist() == [0] * 4
    assert out.num_emitted.tolist() == [1, 2, 3, 4]


def test_ragged_greedy_and_random_rows_in_one_batch(backend):
    argmax_rows = [[0.1, 0.2, 0.6, 0.1], [0.5, 0.1, 0.1, 0.3], [0.2, 0.5, 0.2, 0.1]]
    reqs = [
        request([], [], bonus=[0.0, 1.0, 0.0, 0.0]),  # K_r = 0: bonus from the only row
        request([2, 0, 3], [0.0] * 3, greedy=True, p=argmax_rows),  # mismatch at position 2
        request([2, 0], [0.0] * 2, greedy=True, p=argmax_rows[:2]),  # all match: bonus argmax
        request([0], [REJECT]),
        request([], [], greedy=True, bonus=[0.3, 0.3, 0.4, 0.0]),
    ]
    out = run(reqs, backend)
    assert out.tokens.tolist() == [pad([1]), [2, 0, 1, -1], pad([2, 0, 3]), pad([1]), pad([2])]
    assert out.num_accepted.tolist() == [0, 2, 2, 0, 0]


def test_zero_target_probability_never_accepted_and_zero_draft_probability(backend):
    reqs = [
        request([0], [0.0], p=[[0.0, 1.0, 0.0, 0.0]], q=[[0.5, 0.5, 0.0, 0.0]]),  # p(x)=0, u=0
        request([2], [0.999], p=[[0.25, 0.25, 0.5, 0.0]], q=[[0.5, 0.5, 0.0, 0.0]]),  # q(x)=0
    ]
    out = run(reqs, backend)
    assert out.tokens.tolist() == [pad([1]), pad([2, 3])]


def test_invalid_distribution_at_stop_point_sets_error(backend):
    nan_p = [float("nan"), 0.5, 0.5, 0.0]
    reqs = [
        request([0, 0], [ACCEPT, REJECT], p=[P, nan_p]),  # p invalid at the rejection
        request([0], [REJECT], q=[[0.8, 0.4, -0.2, 0.0]]),  # q invalid at the rejection
        request([3], [0.2], q=[[0.0, 0.0, 0.5, 0.5]], p=[[0.0, 0.0, 0.5, 0.5]]),  # p == q: ok
        request([3], [0.2], q=[[0.5, 0.5, 0.0, 0.0]], p=[[0.5, 0.5, 0.0, 0.0]]),  # empty residual
        request([0], [ACCEPT], bonus=[0.0, 0.0, 0.0, 0.0]),  # bonus row sums to zero
        request([0, 9], [ACCEPT, ACCEPT]),  # draft token outside the vocabulary at the stop
    ]
    out = run(reqs, backend)
    assert out.error.tolist() == [
        ERR_INVALID_TARGET,
        ERR_INVALID_DRAFT,
        0,
        ERR_EMPTY_RESIDUAL,
        ERR_INVALID_TARGET,
        ERR_BAD_DRAFT_TOKEN,
    ]
    assert out.tokens[[0, 1, 3, 4, 5]].eq(PLACEHOLDER_TOKEN).all()
    assert out.num_accepted[[0, 1, 3, 4, 5]].eq(0).all()


def test_invalid_inputs_after_stop_point_are_ignored(backend):
    nan_row = [float("nan")] * V
    reqs = [
        request([0, 9, 0], [REJECT, ACCEPT, ACCEPT], q=[Q, nan_row, nan_row], p=[P, nan_row, nan_row], bonus=nan_row),
        request([0, 2], [0.0, 0.0], greedy=True, p=[[0.9, 0.1, 0.0, 0.0], nan_row], bonus=nan_row),
    ]
    out = run(reqs, backend)
    # the random row stops at 0 and never reads the NaN rows or the bad token behind it; the
    # greedy row accepts position 0 and stops at the NaN row it must read for the argmax
    assert out.error.tolist() == [ERR_NONE, ERR_INVALID_TARGET]
    assert out.tokens[0].tolist() == pad([1])


def test_bad_offsets_flagged_per_request(backend):
    drafts = torch.zeros(5, dtype=torch.int64)
    probs = torch.tensor([Q] * 5)
    target = torch.tensor([P] * 7)
    u = torch.full((2, 2 * K + 1), 0.5, dtype=torch.float64)
    cu = torch.tensor([0, 1, 5])  # second request has K_r = 4 > K
    out = speculative_accept(drafts, cu, probs, target, u, torch.tensor([False, False]), backend=backend)
    assert out.error.tolist() == [0, ERR_BAD_OFFSETS]
    assert out.tokens[1].eq(PLACEHOLDER_TOKEN).all()


def test_inputs_not_modified_and_bad_arguments(backend):
    args = [
        torch.tensor([0, 0]),
        torch.tensor([0, 2]),
        torch.tensor([Q, Q]),
        torch.tensor([P, P, BONUS]),
        torch.full((1, 2 * K + 1), 0.3, dtype=torch.float64),
        torch.tensor([False]),
    ]
    before = [a.clone() for a in args]
    speculative_accept(*args, backend=backend)
    assert all(torch.equal(a, b) for a, b in zip(args, before))
    bad = list(args)
    bad[4] = args[4][:, :-1]
    with pytest.raises(ValueError, match="2K\\+1"):
        speculative_accept(*bad, backend=backend)
    bad = list(args)
    bad[3] = args[3][:2]
    with pytest.raises(ValueError, match="target_probs has 2 elements"):
        speculative_accept(*bad, backend=backend)
    bad = list(args)
    bad[2] = args[2].double()
    with pytest.raises(ValueError, match="draft_probs has dtype"):
        speculative_accept(*bad, backend=backend)


def test_draft_limit_on_a_uniform_layout_equals_the_packed_ragged_call(backend):
    """A uniform layout (every request K rows) cut back by `draft_limit` gives the result of the
    packed ragged call, and never reads the rows past each limit (they hold NaN here)."""
    gen = torch.Generator().manual_seed(11)
    num_requests, vocab, k = 7, 16, 4
    limit = torch.tensor([0, 1, 4, 2, 3, 0, 4])
    greedy = torch.tensor([False, True, False, False, True, False, False])
    q = torch.softmax(3 * torch.randn(num_requests, k, vocab, generator=gen), -1)
    p = torch.softmax(3 * torch.randn(num_requests, k + 1, vocab, generator=gen), -1)
    x = torch.multinomial(q.reshape(-1, vocab), 1, generator=gen).reshape(num_requests, k)
    u = torch.rand(num_requests, 2 * k + 1, generator=gen, dtype=torch.float64)
    packed_cu = torch.cat([torch.zeros(1, dtype=torch.int64), limit.cumsum(0)])
    keep = torch.arange(k)[None, :] < limit[:, None]  # [R, K]
    keep_p = torch.arange(k + 1)[None, :] <= limit[:, None]  # [R, K+1]
    packed = speculative_accept(x[keep], packed_cu, q[keep], p[keep_p], u, greedy, backend=backend)
    q_garbage = torch.where(keep[..., None], q, float("nan"))
    p_garbage = torch.where(keep_p[..., None], p, float("nan"))
    uniform = speculative_accept(
        torch.where(keep, x, -7).reshape(-1),
        torch.arange(num_requests + 1) * k,
        q_garbage.reshape(-1, vocab),
        p_garbage.reshape(-1, vocab),
        u,
        greedy,
        draft_limit=limit,
        backend=backend,
    )
    assert torch.equal(uniform.tokens, packed.tokens)
    assert torch.equal(uniform.num_accepted, packed.num_accepted)
    assert torch.equal(uniform.error, packed.error) and not packed.error.any()
    assert packed.num_accepted.sum() > 0  # some drafts accepted, so the limit is exercised
    negative = speculative_accept(
        x.reshape(-1),
        torch.arange(num_requests + 1) * k,
        q.reshape(-1, vocab),
        p.reshape(-1, vocab),
        u,
        greedy,
        draft_limit=torch.full((num_requests,), -1),
        backend=backend,
    )
    assert (negative.error == ERR_BAD_OFFSETS).all()
    with pytest.raises(ValueError, match="draft_limit"):
        speculative_accept(
            x.reshape(-1),
            torch.arange(num_requests + 1) * k,
            q.reshape(-1, vocab),
            p.reshape(-1, vocab),
            u,
            greedy,
            draft_limit=limit[:3],
            backend=backend,
        )
