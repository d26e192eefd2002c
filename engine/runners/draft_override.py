"""Draft override: replace the draft distribution q while the target p stays the model's own.

The speculative-sampling guarantee says the committed tokens follow p whatever q is, as long as
each draft is sampled from the q that the accept ratio and the residual use, with uniforms
independent of the accept tests. A draft override is a way to test that guarantee with drafts of
very different quality; the engine's own draft is `own` (no override, nothing here runs).

Kinds (`EngineConfig.draft_override`), as draft logits of the round's draft step j (input t_{j-1}
at position n - 1 + j - 1, n the committed tokens at the round's start):
- `noisy`: the draft logits plus `draft_noise_scale` * z, z ~ N(0, 1) per token, from a Philox
  stream of its own (key seed XOR NOISE_STREAM_KEY, counter position * V + token) through
  Box-Muller.
  So the noise depends only on (seed, position), never on the batch, and never shares a uniform
  with the request's round blocks (those are keyed by the seed itself).
- `adversarial`: minus the target logits at the same position (q ranks tokens against p).
- `temperature`: the target logits divided by `draft_temperature_factor`; the request's sampling
  temperature T then gives q = the target's law at temperature factor * T (top-k / top-p apply
  to q as to any draft).
The two target-based kinds run the target depths once more per draft step (draft_depth+1..D on
the draft's own row). Those depths' KV at the draft positions is written again by the verify
pass of the same round before anything reads it as context, so the round's target is unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from engine.sampling import uniform_blocks

OWN, NOISY, ADVERSARIAL, TEMPERATURE = "own", "noisy", "adversarial", "temperature"
DRAFT_OVERRIDES = (OWN, NOISY, ADVERSARIAL, TEMPERATURE)
TARGET_BASED = (ADVERSARIAL, TEMPERATURE)
NOISE_STREAM_KEY = 0x5DEECE66D  # XOR-ed into the seed: the noise stream differs from the rounds'


@dataclass(frozen=True)
class DraftOverride:
    """One draft replacement (never `own`: the runner then has no override at all)."""

    kind: str
    noise_scale: float = 1.0
    temperature_factor: float = 2.0

    @property
    def needs_target(self) -> bool:
        """Whether the override reads the target logits at the draft position."""
        return self.kind in TARGET_BASED

    def logits(
        self, draft: torch.Tensor, target: torch.Tensor | None, seeds: torch.Tensor, positions: torch.Tensor
    ) -> torch.Tensor:
        """float32[A, V] replacement draft logits of A rows (`target` only when needs_target)."""
        if self.kind == NOISY:
            return draft + self.noise_scale * gaussian_noise(seeds, positions, draft.shape[1]).to(draft.dtype)
        if self.kind == ADVERSARIAL:
            return -target
        return target / self.temperature_factor


def gaussian_noise(seeds: torch.Tensor, positions: torch.Tensor, width: int) -> torch.Tensor:
    """float64[A, width] standard normal values, a pure function of (seed, position): token v of
    row a takes the two uniforms of the noise stream's block keyed at position * width + v
    (one vectorised Philox call) through Box-Muller (1 - u lies in (0, 1], so log is finite)."""
    vocab = torch.arange(width, device=seeds.device)
    keys = (seeds ^ NOISE_STREAM_KEY).repeat_interleave(width)
    counters = (positions[:, None] * width + vocab[None, :]).reshape(-1)
    u = uniform_blocks(keys, counters, 2).view(-1, width, 2)
    radius = torch.sqrt(-2.0 * torch.log1p(-u[..., 0]))
    return radius * torch.cos(2.0 * math.pi * u[..., 1])
