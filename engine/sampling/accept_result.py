"""The result layout of `speculative_accept`, shared by its front (accept.py) and its Triton
kernel (kernels/accept.py): `AcceptResult`, the `PLACEHOLDER_TOKEN` that pads it, and the
per-request error codes. Triton-free. Semantics: accept.py and docs/sampling.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

PLACEHOLDER_TOKEN = -1  # pads AcceptResult.tokens after the emitted tokens

# AcceptResult.error codes; when several apply, the first in this list is reported.
ERR_NONE = 0
ERR_BAD_OFFSETS = 1  # cu_num_drafts gives K_r < 0, K_r > K, or rows outside draft_tokens
ERR_BAD_DRAFT_TOKEN = 2  # the draft token at the stop point is outside [0, V)
ERR_INVALID_TARGET = 3  # p at the stop point has NaN/inf/negative entries or a zero total
ERR_INVALID_DRAFT = 4  # q at a rejection has NaN/inf/negative entries or a zero total
ERR_EMPTY_RESIDUAL = 5  # max(p - q, 0) at a rejection sums to zero
ERROR_NAMES = {
    ERR_NONE: "ok",
    ERR_BAD_OFFSETS: "bad_offsets",
    ERR_BAD_DRAFT_TOKEN: "bad_draft_token",
    ERR_INVALID_TARGET: "invalid_target",
    ERR_INVALID_DRAFT: "invalid_draft",
    ERR_EMPTY_RESIDUAL: "empty_residual",
}


@dataclass(frozen=True)
class AcceptResult:
    """Outcome of one speculative round for R requests with at most K drafts each.

    Row r emits tokens[r, :num_accepted[r] + 1] (the accepted drafts, then the recovered or
    bonus token); the rest of the row is PLACEHOLDER_TOKEN. A row with error[r] != 0 emits
    nothing: its tokens are all PLACEHOLDER_TOKEN and num_accepted[r] is 0.
    """

    tokens: torch.Tensor  # [R, K+1] int64, padded with PLACEHOLDER_TOKEN
    num_accepted: torch.Tensor  # [R] int64, accepted drafts (0 on error)
    error: torch.Tensor  # [R] int32, ERR_* code, 0 = ok

    @property
    def num_emitted(self) -> torch.Tensor:  # [R] int64
        """Tokens emitted per request: num_accepted + 1, or 0 for a row with an error."""
        return torch.where(self.error == ERR_NONE, self.num_accepted + 1, 0)
