"""The batched_probabilities kernels compile for a Hopper GPU on the CPU (kernel_compile.py):
the interpreter, which every other CPU test of the kernels uses, never runs Triton's compiler."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).with_name("kernel_compile.py")
REPO = Path(__file__).resolve().parents[2]
KERNELS = ("_chunk_kernel", "_select_kernel", "_write_kernel", "_single_kernel")


def _cuda_backend_missing() -> str | None:
    try:
        from triton.backends.nvidia.compiler import CUDABackend  # noqa: F401
    except ImportError as err:
        return f"Triton's CUDA backend is not installed ({err})"
    return None


@pytest.mark.skipif(_cuda_backend_missing() is not None, reason=str(_cuda_backend_missing()))
def test_probabilities_kernels_compile_for_sm90_without_a_gpu():
    env = {name: value for name, value in os.environ.items() if name != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(REPO)
    done = subprocess.run([sys.executable, str(SCRIPT)], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    compiled = set(done.stdout.splitlines())
    for vocab in (152064, 200):
        for name in KERNELS:
            assert f"compiled {name} V={vocab}" in compiled, done.stdout
