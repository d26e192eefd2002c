"""engine.sampling: the four sampling primitives of the engine and their reference.

- `Sampler` (reference.py): row-wise sorted reference of the sampling distribution.
- `batched_probabilities` (probabilities.py): per-row temperature / top-k / top-p, all rows.
- `categorical` (categorical.py): float64 inverse-CDF draw per row.
- `speculative_accept` (accept.py): rejection sampling; its result layout `AcceptResult`,
  `PLACEHOLDER_TOKEN` and error codes live in accept_result.py.
- `uniform_blocks` (rng.py): counter-based Philox uniforms, one block per request and round
  (constants: philox.py).
- `warm_probabilities`, `warm_round` (warm.py): compile the Triton kernels of given calls ahead,
  in background threads.
Each function takes `backend="auto" | "triton" | "torch"` (see backend.py). The kernels wing:
every module that imports triton lives under kernels/ (the Triton backends, their launcher
and compile tools). The modules here never import triton; each front imports its kernels/
backend lazily, inside a function, when the Triton backend is used, and no module of kernels/
imports a front (the layouts both share, accept_result.py and philox.py, sit below both).
"""

from engine.sampling.accept import speculative_accept
from engine.sampling.accept_result import (
    ERR_BAD_DRAFT_TOKEN,
    ERR_BAD_OFFSETS,
    ERR_EMPTY_RESIDUAL,
    ERR_INVALID_DRAFT,
    ERR_INVALID_TARGET,
    ERR_NONE,
    ERROR_NAMES,
    PLACEHOLDER_TOKEN,
    AcceptResult,
)
from engine.sampling.backend import BACKEND_ENV_VAR, BACKENDS
from engine.sampling.categorical import INVALID_ROW, categorical
from engine.sampling.probabilities import batched_probabilities
from engine.sampling.reference import Sampler
from engine.sampling.rng import uniform_blocks
from engine.sampling.warm import cancel_warmups, warm_probabilities, warm_round

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
    "cancel_warmups",
    "categorical",
    "speculative_accept",
    "uniform_blocks",
    "warm_probabilities",
    "warm_round",
]
