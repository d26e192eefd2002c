"""The output law of speculative_accept: exact quadrature (one draft) and ragged Monte Carlo.

Quadrature: with one draft, the round's output is a piecewise-constant function of its
uniforms (u_draft, u_accept, u_final). The breakpoints are the CDF of q (u_draft), p(x)/q(x)
(u_accept) and the CDFs of the residual and of the bonus row (u_final). Evaluating the SUT
(categorical for the draft, speculative_accept for the rest) at one point inside every cell
and weighting by cell size gives the implementation's exact output law, which must equal p
(and, after an accept, the bonus law p_2) to float64 precision. Distributions are dyadic
(multiples of 2**-10), so every float32 subtraction in the kernel is exact.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from tests.fixtures.sampling_helpers import generator
from engine.sampling import categorical, speculative_accept, uniform_blocks

V = 6
QUADRATURE_ATOL = 1e-9


def dyadic(seed: int, zeros: list[int]) -> torch.Tensor:
    """A distribution over V tokens with entries in multiples of 2**-10 and given zeros."""
    w = torch.rand(V, generator=generator(seed)) + 0.2
    w[zeros] = 0.0
    counts = torch.floor(w / w.sum() * 1024)
    counts[int(torch.argmax(counts))] += 1024 - counts.sum()
    return (counts / 1024).float()


def cells(breaks: list[float]) -> list[tuple[float, float]]:
    """(midpoint, width) of the cells of [0, 1) cut at the given breakpoints."""
    edges = sorted({0.0, 1.0, *[b for b in breaks if 0.0 < b < 1.0]})
    return [((a + b) / 2, b - a) for a, b in zip(edges, edges[1:]) if b > a]


def cdf_breaks(w: torch.Tensor) -> list[float]:
    w = w.double()
    return (torch.cumsum(w, 0) / w.sum()).tolist() if float(w.sum()) > 0 else []


def quadrature_law(p1, q1, p2, backend):
    """Exact law of (first token, accepted?, bonus token) by evaluating every cell."""
    points, weights, dev = [], [], p1.device
    for u_d, w_d in cells(cdf_breaks(q1)):
        u_draft = torch.tensor([u_d], dtype=torch.float64, device=dev)
        x = int(categorical(q1.unsqueeze(0).double(), u_draft, backend=backend))
        ratio = float(p1[x]) / float(q1[x])
        for u_a, w_a in cells([ratio]):
            for u_f, w_f in cells(cdf_breaks((p1 - q1).clamp_min(0)) + cdf_breaks(p2)):
                points.append((x, u_a, u_f))
                weights.append(w_d * w_a * w_f)
    num = len(points)
    out = speculative_accept(
        torch.tensor([x for x, _, _ in points], device=dev),
        torch.arange(num + 1, device=dev),
        q1.repeat(num, 1),
        torch.stack([p1, p2]).repeat(num, 1),
        torch.tensor([[0.5, ua, uf] for _, ua, uf in points], dtype=torch.float64, device=dev),
        torch.zeros(num, dtype=torch.bool, device=dev),
        backend=backend,
    )
    out = type(out)(tokens=out.tokens.cpu(), num_accepted=out.num_accepted.cpu(),
                    error=out.error.cpu())
    assert out.error.eq(0).all()
    w = torch.tensor(weights, dtype=torch.float64)
    first = torch.zeros(V, dtype=torch.float64).index_add_(0, out.tokens[:, 0], w)
    accepted = out.num_accepted == 1
    bonus = torch.zeros(V, dtype=torch.float64).index_add_(
        0, out.tokens[accepted, 1], w[accepted]
    )
    return first, bonus, float(w.sum())


@pytest.mark.parametrize("zeros_p, zeros_q", [([], []), ([1], [4]), ([0, 5], [2])])
def test_single_draft_quadrature_is_exact(backend, zeros_p, zeros_q):
    p1, q1, p2 = dyadic(31, zeros_p), dyadic(32, zeros_q), dyadic(33, [3])
    first, bonus, total = quadrature_law(p1, q1, p2, backend)
    assert abs(total - 1.0) < QUADRATURE_ATOL
    torch.testing.assert_close(first, p1.double(), atol=QUADRATURE_ATOL, rtol=0)
    accept_prob = float(torch.minimum(p1, q1).double().sum())
    torch.testing.assert_close(bonus, accept_prob * p2.double(), atol=QUADRATURE_ATOL, rtol=0)


def test_quadrature_detects_a_wrong_rule():
    """The quadrature is sharp: accepting with u * p < q instead of u * q < p changes the law."""
    p1, q1, p2 = dyadic(31, []), dyadic(32, []), dyadic(33, [3])
    first, _, _ = quadrature_law(q1, p1, p2, "torch")  # roles swapped: law is q, not p
    assert (first - p1.double()).abs().max() > 1e-3


# Ragged Monte Carlo: 4 draft counts x positions = 10 chi-square tests at alpha 1e-4 each, so
# correct code fails with probability <= 1e-3 over the choice of seeds (Bonferroni). With
# >= 2,500 emitted tokens per position over 8 tokens, a total-variation error of ~0.06 is
# detected with power > 0.9.
MC_REQUESTS = 40_000
MC_ALPHA = 1e-4
MC_K = 3


def mc_distributions():
    p = [dyadic(40 + j, [j % V]) for j in range(MC_K + 1)]
    q = [dyadic(50 + j, []) for j in range(MC_K)]
    return p, q


def run_ragged(backend, device="cpu"):
    p, q = mc_distributions()
    num_drafts = torch.arange(MC_REQUESTS) % (MC_K + 1)  # K_r cycles 0..3
    seeds = torch.arange(MC_REQUESTS, dtype=torch.int64) + 10_000
    u = uniform_blocks(seeds.to(device), torch.zeros_like(seeds).to(device), 2 * MC_K + 1)
    q_all = torch.stack(q).to(device)
    p_all = torch.stack(p).to(device)
    pos = torch.cat([torch.arange(int(k)) for k in num_drafts]).to(device)  # draft position
    owner = torch.repeat_interleave(torch.arange(MC_REQUESTS), num_drafts).to(device)
    draft_probs = q_all[pos]
    drafts = categorical(draft_probs.double(), u[owner, pos])
    target_pos = torch.cat([torch.arange(int(k) + 1) for k in num_drafts]).to(device)
    cu = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(num_drafts, 0)]).to(device)
    out = speculative_accept(drafts, cu, draft_probs.contiguous(), p_all[target_pos].contiguous(),
                             u, torch.zeros(MC_REQUESTS, dtype=torch.bool, device=device),
                             backend=backend)
    return out, num_drafts, p, drafts.cpu(), cu.cpu()


def chi_square_p(tokens: torch.Tensor, probs: torch.Tensor) -> float:
    observed = np.bincount(tokens.numpy(), minlength=V)
    support = probs.numpy() > 0
    assert observed[~support].sum() == 0, "a token with target probability 0 was emitted"
    expected = probs.numpy()[support].astype(np.float64) * observed.sum()
    return float(stats.chisquare(observed[support], expected).pvalue)


def check_ragged_law(out, num_drafts, p):
    tokens, emitted = out.tokens.cpu(), out.num_emitted.cpu()
    assert out.error.eq(0).all()
    for k in range(MC_K + 1):
        for i in range(k + 1):
            rows = (num_drafts == k) & (emitted > i)
            assert int(rows.sum()) >= 2_000
            assert chi_square_p(tokens[rows, i], p[i]) > MC_ALPHA, f"K_r={k}, position {i}"


def test_ragged_multi_draft_monte_carlo_torch():
    out, num_drafts, p, _, _ = run_ragged("torch")
    check_ragged_law(out, num_drafts, p)


def test_monte_carlo_detects_unchecked_drafts():
    """Power check: the drafts themselves follow q, not p, and the same test rejects them."""
    out, num_drafts, p, drafts, cu = run_ragged("torch")
    first_drafts = drafts[cu[:-1][num_drafts > 0]]
    assert chi_square_p(first_drafts, mc_distributions()[1][0]) > MC_ALPHA  # they follow q
    observed = np.bincount(first_drafts.numpy(), minlength=V)
    expected = p[0].double().numpy() * observed.sum()
    support = expected > 0
    rejects = observed[~support].sum() > 0 or stats.chisquare(
        observed[support], expected[support] * observed[support].sum() / expected[support].sum()
    ).pvalue < MC_ALPHA
    assert rejects
