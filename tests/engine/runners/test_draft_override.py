"""Draft overrides (engine.runners.draft_override): the committed law stays the target's.

The speculative-sampling guarantee says the committed tokens follow p whatever the draft q is.
Each override runs N = 2000 requests (seeds 0..1999, batched collection, K = 2, three tokens so
that round 1 drafts two) on the tiny random model at temperature 0.1, and the counts of t1 and t2
are tested against their exact laws: t1 ~ p(. | prompt), t2 ~ sum_a p(a | prompt) p(. | prompt, a)
(the target's logits from serial replay, 64 + 1 of them).
Test: Pearson chi-square, bins of expected count < 5 pooled into one; reject at p < ALPHA = 1e-3.
False-fail rate: 8 tests (4 drafts x 2 positions) at 1e-3 each, <= 0.8 % for a fresh set of seeds;
the seeds are fixed, so the outcome is deterministic. Power: the same test rejects the planted
residual_from_p under the adversarial draft (p ~ 1e-75 at N = 4000 when this was written).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from engine import LLM, EngineConfig, SamplingParams
from engine.runners.collection import BatchCollector
from engine.runners.draft_override import NOISE_STREAM_KEY, gaussian_noise
from tests.fixtures.engine_helpers import TINY_MODEL

PROMPT = [5, 9, 17, 2, 33, 40, 1, 8, 12, 60, 7, 3]
TEMPERATURE = 0.1  # the tiny model's logits have std ~0.1: T = 0.1 gives p a few dominant tokens
NUM_SAMPLES, BATCH = 2000, 1000
MAX_TOKENS, K = 3, 2
ALPHA = 1e-3
MIN_EXPECTED = 5.0
NOISE_SCALE = 0.1  # in logits before the temperature: noise of std 1 after it


def _llm(draft_override: str = "own", mutant: str | None = None) -> LLM:
    return LLM(
        EngineConfig(
            model_config=TINY_MODEL,
            mode="sync",
            num_speculative_tokens=K,
            draft_loops=1,
            num_kv_blocks=6200,
            draft_override=draft_override,
            draft_noise_scale=NOISE_SCALE,
            mutant=mutant,
        )
    )


def _collect(llm: LLM):
    collector = BatchCollector(llm.engine)
    params = SamplingParams(temperature=TEMPERATURE, max_tokens=MAX_TOKENS, ignore_eos=True)
    batches = [
        collector.collect(PROMPT, params, list(range(start, start + BATCH)), MAX_TOKENS)
        for start in range(0, NUM_SAMPLES, BATCH)
    ]
    tokens = np.concatenate([b.tokens for b in batches])
    acceptance = sum(b.num_accepted_tokens.sum() for b in batches) / sum(b.num_draft_tokens.sum() for b in batches)
    return tokens, float(acceptance)


@pytest.fixture(scope="module")
def exact_laws() -> tuple[np.ndarray, np.ndarray]:
    llm = _llm()
    p1 = torch.softmax(llm.full_depth_logits(PROMPT).double() / TEMPERATURE, 0)
    after = torch.stack([llm.target_logits_along(PROMPT, [a, 0])[1] for a in range(TINY_MODEL.vocab_size)])
    p2 = p1 @ torch.softmax(after.double() / TEMPERATURE, 1)
    return p1.numpy(), p2.numpy()


def chi_square_pvalue(tokens: np.ndarray, law: np.ndarray) -> float:
    """Pearson chi-square of the token counts against `law`, bins expected < MIN_EXPECTED pooled."""
    counts = np.bincount(tokens, minlength=law.shape[0])
    expected = law * counts.sum()
    small = expected < MIN_EXPECTED
    observed, wanted = counts[~small], expected[~small]
    if small.any():
        observed, wanted = np.append(observed, counts[small].sum()), np.append(wanted, expected[small].sum())
    return float(stats.chisquare(observed, wanted * observed.sum() / wanted.sum()).pvalue)


@pytest.fixture(scope="module")
def samples() -> dict:
    """override -> (tokens, acceptance), each collected once per module."""
    return {}


def _samples(cache: dict, override: str):
    if override not in cache:
        cache[override] = _collect(_llm(override))
    return cache[override]


@pytest.mark.parametrize("override", ["own", "noisy", "adversarial", "temperature"])
def test_every_draft_keeps_the_target_law_of_t1_and_t2(exact_laws, samples, override):
    tokens, acceptance = _samples(samples, override)
    own_acceptance = _samples(samples, "own")[1]
    for position, law in enumerate(exact_laws):
        assert chi_square_pvalue(tokens[:, position], law) >= ALPHA, (override, position + 1)
    if override == "adversarial":
        assert acceptance < own_acceptance / 2, (acceptance, own_acceptance)
    if override == "noisy":
        assert acceptance < own_acceptance, (acceptance, own_acceptance)


def test_the_law_test_catches_a_planted_bug_under_the_adversarial_draft(exact_laws):
    tokens, _ = _collect(_llm("adversarial", mutant="residual_from_p"))
    assert chi_square_pvalue(tokens[:, 0], exact_laws[0]) < ALPHA


def test_noise_is_standard_normal_and_keyed_by_seed_and_position():
    seeds, positions = torch.tensor([1, 1, 2]), torch.tensor([10, 11, 10])
    noise = gaussian_noise(seeds, positions, 4096)
    assert torch.equal(noise[:1], gaussian_noise(seeds[:1], positions[:1], 4096))  # batch-invariant
    assert not torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    # mean and variance of 3 x 4096 normals: |mean| < 5 sigma = 5 / sqrt(12288) ~ 0.045 and
    # |var - 1| < 5 * sqrt(2 / 12288) ~ 0.064 (fixed seeds: deterministic)
    assert abs(float(noise.mean())) < 0.045 and abs(float(noise.var()) - 1) < 0.064
    assert NOISE_STREAM_KEY != 0


def test_the_own_draft_is_the_default_and_changes_nothing():
    llm = _llm()
    assert llm.engine.runner.draft_override is None
    assert _llm("temperature").engine.runner.draft_override.needs_target
