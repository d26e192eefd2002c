"""Compile the Triton sampling kernels a caller will launch before its first call, in background
threads (engine/sampling/kernels/warmup.py), so that a fresh machine's compiles overlap each
other and the caller's own set-up instead of running one after the other at the first round.

- `warm_probabilities`: the `batched_probabilities` kernels of given row counts (a call of a
  plan still compiling waits for it);
- `cancel_warmups`: drop the warm-ups not yet started (a caller closing early);
- `warm_round`: every sampling kernel of a round of B requests with K drafts each, as the
  batched collection runs it: the probabilities of the B draft rows and the B x (K + 1) verify
  rows, the Philox uniforms of a plain round (1 per request) and of a speculative one (2K + 1),
  the categorical draw over V, and the accept kernel for B x K drafts with and without a draft
  limit.
The two warm functions return the number of kernels started: 0 where the backend is torch or
Triton does not compile (the CPU interpreter). Results never depend on them: the kernels are
the ones the calls would compile.
"""

from __future__ import annotations

import sys

import torch

from engine.sampling.backend import TORCH, compiles_natively, resolve_backend


def warm_probabilities(vocab: int, row_counts, device: torch.device, *, backend: str = "auto") -> int:
    """Start compiling the Triton kernels that `batched_probabilities` calls of float32 logits
    [rows, vocab] (int64 top-k) take, for every rows of `row_counts`."""
    if resolve_backend(backend, device) == TORCH:
        return 0
    from engine.sampling.kernels.probabilities.plan import warm_up

    return warm_up(vocab, row_counts, device)


def warm_round(
    vocab: int, batch_rows: int, num_speculative_tokens: int, device: torch.device, *, backend: str = "auto"
) -> int:
    """Start compiling every sampling kernel of a round of `batch_rows` requests over `vocab`
    entries with `num_speculative_tokens` (K) drafts each (K = 0: a plain round)."""
    if resolve_backend(backend, device) == TORCH or not compiles_natively(device):
        return 0
    k = num_speculative_tokens
    started = warm_probabilities(vocab, (batch_rows, batch_rows * (k + 1)), device, backend=backend)
    from engine.sampling.kernels.accept import accept_warmup
    from engine.sampling.kernels.categorical import categorical_warmup
    from engine.sampling.kernels.rng import uniform_blocks_warmup
    from engine.sampling.kernels.warmup import WARMUPS

    requests = [uniform_blocks_warmup(1), categorical_warmup(vocab)]
    if k > 0:
        requests += [
            uniform_blocks_warmup(2 * k + 1),
            *(accept_warmup(batch_rows * k, vocab, k, has_limit) for has_limit in (False, True)),
        ]
    return started + sum(
        WARMUPS.start(
            ("round", request[0], request[1], tuple(sorted(request[3].items()))), [request], device, waited=False
        )
        for request in requests
    )


def cancel_warmups() -> int:
    """Drop the warm-ups that have not started (see `Warmups.cancel`): for a caller that closes
    before it needs them. 0 where none was ever started (Triton is then not imported here)."""
    module = sys.modules.get("engine.sampling.kernels.warmup")
    return module.WARMUPS.cancel() if module is not None else 0
