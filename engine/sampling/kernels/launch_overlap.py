"""Programmatic dependent launch (PDL) of consecutive kernels on one stream.

A kernel launched with PDL (Triton's compile option `launch_pdl`) may be started by the device
while the kernel before it on the stream still runs: once every program of that kernel has
called `launch_dependents` (or exited). Before its first read of the earlier kernel's results,
and before any write that could race with that kernel's, it calls `wait_for_prerequisites`
(PTX `griddepcontrol.wait`), which returns once the earlier grid has completed and its memory
operations are visible. What the overlap saves is the gap between two dependent launches:
the later kernel's launch and the start of its programs happen while the earlier one finishes.
Our kernels trigger at their end, once a program's work is done: a trigger at the start lets
the later kernel's programs sit on the SMs, waiting, while the earlier kernel's last programs
run, and on the H200 that made CUDA Graph replays up to 7 us slower. Even so, replays were
2-4 us slower than serial launches at B >= 16 there, so `KernelConfig.overlap_launches` is
off by default (docs/notes/performance-notebook.md, "Programmatic dependent launch"). What the default takes
(`KernelConfig.overlap_write`) is the write kernel alone overlapping the select kernel, in
eager calls only: the select kernel is launched as before and triggers by finishing, and a
call on a stream being captured enqueues the write kernel without the overlap
(`CompiledLaunch.enqueue(..., serial=True)`), so graph replays keep serial launches
(docs/notes/performance-notebook.md, "The write kernel overlaps the select kernel in eager calls").

A kernel launched without PDL waits for the whole of the kernel before it, as usual, so a
chain chunk -> select (PDL) -> write (PDL) -> anything else stays ordered: each PDL kernel
completes only after its wait returned, that is after its predecessor completed.

Guarantees: results do not depend on whether launches overlap; `supports_overlap` is False off
CUDA, before compute capability 9.0 (Hopper) and where the installed Triton lacks either the
compile option or the two instructions, and the kernels then take no PDL branch (their `PDL`
constexpr is False, which also keeps these functions out of the CPU interpreter).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton

try:  # Triton >= 3.4 (the engine needs 3.6: pyproject.toml)
    from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait
except ImportError:  # pragma: no cover - old Triton: supports_overlap() is False
    gdc_launch_dependents = gdc_wait = None

MIN_CAPABILITY = (9, 0)  # griddepcontrol needs sm_90


@triton.jit
def wait_for_prerequisites():
    """Wait until the kernel before this one on the stream has completed (PDL launches)."""
    gdc_wait()


@triton.jit
def launch_dependents():
    """Let the kernel after this one on the stream start (it waits for this one's results)."""
    gdc_launch_dependents()


def overlap_options(pdl: bool) -> tuple[tuple[str, bool], ...]:
    """The compile options of a launch that overlaps the one before it (`KernelLaunch`)."""
    return (("launch_pdl", True),) if pdl else ()


@functools.cache
def _triton_supports_pdl() -> bool:
    try:
        from triton.backends.nvidia.compiler import CUDAOptions
    except ImportError:  # pragma: no cover - Triton without its NVIDIA backend
        return False
    fields = {f.name for f in dataclasses.fields(CUDAOptions)}
    return gdc_wait is not None and "launch_pdl" in fields


@functools.cache
def _device_supports_pdl(index: int) -> bool:
    return torch.cuda.get_device_capability(index) >= MIN_CAPABILITY


def supports_overlap(device: torch.device) -> bool:
    """True where launches on `device` can take programmatic dependent launch."""
    if device.type != "cuda" or not _triton_supports_pdl():
        return False
    return _device_supports_pdl(device.index if device.index is not None else torch.cuda.current_device())
