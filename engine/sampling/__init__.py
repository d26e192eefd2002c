"""engine.sampling: the four sampling primitives of the engine and their reference.

- `Sampler` (reference.py): row-wise sorted reference of the sampling distribution.
- `batched_probabilities` (probabilities.py): per-row temperature / top-k / top-p, all rows.
- `categorical` (categorical.py): float64 inverse-CDF draw per row.
- `speculative_accept`, `AcceptResult`, `PLACEHOLDER_TOKEN` (accept.py): rejection sampling.
- `uniform_blocks` (rng.py): counter-based Philox uniforms, one block per request and round.
Each function takes `backend="auto" | "triton" | "torch"` (see backend.py). Only the
`*_kernel.py` modules import triton, and only when the Triton backend is used.
"""

from engine.sampling.accept import (
    ERR_BAD_DRAFT_TOKEN,
    ERR_BAD_OFFSETS,
    ERR_EMPTY_RESIDUAL,
    ERR_INVALID_DRAFT,
    ERR_INVALID_TARGET,
    ERR_NONE,
    ERROR_NAMES,
    PLACEHOLDER_TOKEN,
    AcceptResult,
    speculative_accept,
)
from engine.sampling.backend import BACKEND_ENV_VAR, BACKENDS
from engine.sampling.categorical import INVALID_ROW, categorical
from engine.sampling.probabilities import batched_probabilities
from engine.sampling.reference import Sampler
from engine.sampling.rng import uniform_blocks

__all__ = [
    "AcceptResult",
    "BACKEND_ENV_VAR",
    "BACKENDS",
    "ERR_BAD_DRAFT_TOKEN",
    "ERR_BAD_OFFSETS",
    "ERR_EMPTY_RESIDUAL",
    "ERR_INVALID_DRAFT",
    "ERR_INVALID_TARGET",
    "ERR_NONE",
    "ERROR_NAMES",
    "INVALID_ROW",
    "PLACEHOLDER_TOKEN",
    "Sampler",
    "batched_probabilities",
    "categorical",
    "speculative_accept",
    "uniform_blocks",
]
