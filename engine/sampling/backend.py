"""Choice of the implementation behind the sampling functions.

Every public sampling function takes `backend="auto" | "triton" | "torch"`. The argument is
the switch; there is no module-level state. "auto" resolves, at call time, to the value of
the environment variable ENGINE_SAMPLING_BACKEND when it is set, else to "triton" for CUDA
tensors and "torch" for CPU tensors. Both backends implement the same semantics.
"""

from __future__ import annotations

import os

import torch

AUTO = "auto"
TRITON = "triton"
TORCH = "torch"
BACKENDS = (AUTO, TRITON, TORCH)
BACKEND_ENV_VAR = "ENGINE_SAMPLING_BACKEND"
INTERPRET_ENV_VAR = "TRITON_INTERPRET"


def _check_name(backend: object, source: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"{source}={backend!r} is invalid: choose one of {BACKENDS}")
    return backend  # type: ignore[return-value]


def interpreting() -> bool:
    """True when TRITON_INTERPRET asks Triton to interpret its kernels (any value but "" or "0")."""
    return os.environ.get(INTERPRET_ENV_VAR, "0") not in ("", "0")


def triton_can_run_on(device: torch.device) -> bool:
    """True when Triton kernels can run on tensors of `device` (CUDA, or the CPU interpreter)."""
    return device.type == "cuda" or interpreting()


def compiles_natively(device: torch.device) -> bool:
    """True where Triton compiles its kernels for the device (CUDA, not the interpreter)."""
    return device.type == "cuda" and not interpreting()


def resolve_backend(backend: str, device: torch.device) -> str:
    """Return "triton" or "torch" for tensors on `device`.

    Raises ValueError for an unknown name, or for "triton" on a CPU tensor when the Triton
    interpreter is off (set TRITON_INTERPRET=1 before the first import of the kernels).
    """
    backend = _check_name(backend, "backend")
    if backend == AUTO:
        backend = _check_name(os.environ.get(BACKEND_ENV_VAR, AUTO), BACKEND_ENV_VAR)
    if backend == AUTO:
        return TRITON if device.type == "cuda" else TORCH
    if backend == TRITON and not triton_can_run_on(device):
        raise ValueError(
            f"backend='triton' cannot run on {device} tensors: use CUDA tensors, "
            f"backend='torch', or set {INTERPRET_ENV_VAR}=1 to use the Triton interpreter"
        )
    return backend
