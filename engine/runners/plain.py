"""nospec: one token per request per step, sampled from the full-depth readout.

RNG: a random request draws `uniform_blocks(seed, n, 1)` per token, where n is its number of
committed tokens (prompt + generated) before the token; greedy requests draw nothing.
"""

from __future__ import annotations

import torch

from engine.request import Request
from engine.runners.base import ModelRunner, RoundOutcome, SamplingRows
from engine.sampling import PLACEHOLDER_TOKEN

PLAIN_SOURCE = "plain"


class PlainRunner(ModelRunner):
    """Runs one plain decode step for a batch of requests."""

    def run(self, requests: tuple[Request, ...], num_drafts: tuple[int, ...]) -> list[RoundOutcome]:
        del num_drafts  # always 0 here: the scheduler is built with K = 0 for nospec
        with torch.inference_mode():
            rows = SamplingRows.from_requests(requests, self.device, with_prompt=self.ops.reads_prompt_length)
            return collect(self.decode(requests, rows))

    def decode(self, requests: tuple[Request, ...], rows: SamplingRows) -> torch.Tensor:
        """int64[R]: the next token of each request (PLACEHOLDER_TOKEN for an invalid row)."""
        layout = self.layout([r.num_computed for r in requests], [1] * len(requests))
        hidden = self.model.embed(self.last_tokens(requests))
        hidden = self.run_depths(hidden, layout, requests, 1, self.model.num_depths)
        probs = self.ops.probabilities(self.model.readout(hidden), rows, self.sampling_backend)
        return self.ops.draw_plain(probs, self.uniforms(rows, 1)[:, 0].contiguous(), self.sampling_backend)


def collect(tokens: torch.Tensor) -> list[RoundOutcome]:
    """The step's single host read."""
    return [
        RoundOutcome((token,), (PLAIN_SOURCE,), 0, 0, False)
        if token != PLACEHOLDER_TOKEN
        else RoundOutcome((), (), 0, 0, True)
        for token in tokens.tolist()
    ]
