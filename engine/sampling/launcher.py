"""`CompiledLaunches`: enqueue a fixed group of Triton kernels through their compiled kernels.

Host cost of one Triton launch, by route (the H200 host of docs/performance.md, "Host enqueue
below Triton's runner"; an empty kernel with one argument / with 14):
- through the JIT (`kernel[grid](...)`): binds and specialises every argument, hashes a cache
  key and checks the globals the kernel read, each call: 10.5-10.9 / 21.3-25.0 us;
- through the compiled kernel's runner (`compiled[grid](...)`): per launch it still builds a
  closure, looks up the device and the stream, builds the launch metadata and calls the two
  (empty) launch-hook chains, and its C launcher calls `data_ptr()` and `cuPointerGetAttribute`
  for every tensor argument: 10.0-10.3 us with one argument;
- `CompiledLaunch.enqueue` (here): the compiled kernel's launcher with the positional arguments
  the runner passes (`CompiledKernel.__getitem__`, Triton 3.6 to 3.9), the caller's stream, no
  metadata or hooks, and pointers given as device addresses (ints), which the C launcher takes
  as they are: 6.4-6.8 / 7.0-7.4 us.

`CompiledLaunches.launch` runs a group of launches (the kernels of one call) under a group key.
The first launch of a key goes through the JIT with tensor arguments, which compiles or finds
each kernel and returns it; once every kernel of the group has a compiled kernel, later launches
of the key take `enqueue` with the pointer arguments.

What the caller guarantees:
- two launches under one key get the same specialisation from the JIT: the key holds every
  argument property Triton specialises on that can differ between them (tensor dtypes, 16-byte
  alignment of data pointers, integer values, the device), and the launches' kernels, grids,
  constexprs and warps are a function of the key;
- `pointers` hold the data pointers of `tensors`, position by position (ints where `tensors`
  has a tensor, the same value elsewhere), on the kernels' device, alive until the kernels ran.
  Nothing checks this: the check is the cost `enqueue` saves.

Where a launch hook is installed (a profiler such as proton), every launch goes through
Triton's runner with the tensors, so the hook sees it. Where the JIT returns no compiled kernel
(the CPU interpreter, a stand-in kernel in tests), every launch goes through the JIT.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Hashable, Sequence

import torch
from triton import knobs
from triton.runtime import driver

MAX_GROUPS = 4096  # group keys kept; past this the cache starts over (see CompiledLaunches)


@dataclass(frozen=True)
class KernelLaunch:
    """One launch of a group: `kernel[grid](*args, **dict(constexprs), num_warps=num_warps)`.
    `constexprs` are (name, value) pairs in signature order, after every runtime parameter."""

    kernel: Any  # a @triton.jit function
    grid: tuple[int, int, int]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int

    def through_jit(self, args: tuple) -> CompiledLaunch | None:
        """Launch through the JIT; the compiled kernel it returned, or None (interpreter)."""
        result = self.kernel[self.grid](*args, **dict(self.constexprs), num_warps=self.num_warps)
        if not hasattr(result, "packed_metadata"):
            return None
        names = tuple(self.kernel.arg_names)
        if names != (*names[:len(args)], *(name for name, _ in self.constexprs)):
            raise ValueError(f"{self.kernel.fn.__name__}: constexprs {self.constexprs} must be "
                             f"the parameters after the {len(args)} runtime ones, {names}")
        return CompiledLaunch(result, self.grid, tuple(value for _, value in self.constexprs))


@dataclass(frozen=True)
class CompiledLaunch:
    """A compiled kernel with its grid and constexpr values (see the module docstring)."""

    compiled: Any  # triton's CompiledKernel, handles initialised (it ran once)
    grid: tuple[int, int, int]
    constexpr_values: tuple

    def enqueue(self, stream: int, args: tuple) -> None:
        """The launch Triton's runner makes, without launch metadata or hooks."""
        compiled, (x, y, z) = self.compiled, self.grid
        compiled.run(x, y, z, stream, compiled.function, compiled.packed_metadata, None, None,
                     None, *args, *self.constexpr_values)

    def through_runner(self, stream: int, args: tuple) -> None:
        """The launch through Triton's runner (metadata and hooks included)."""
        self.compiled[self.grid](*args, *self.constexpr_values, stream=stream)


def current_stream(device: torch.device) -> int | None:
    """The raw handle of the device's current stream, the one Triton's own launches take (None
    off CUDA: the interpreter needs no stream)."""
    if device.type != "cuda":
        return None
    return driver.active.get_current_stream(device.index)


def hooks_installed() -> bool:
    """True when a Triton launch hook is set (a chain with calls, or a plain callable)."""
    runtime = knobs.runtime
    return _is_set(runtime.launch_enter_hook) or _is_set(runtime.launch_exit_hook)


def _is_set(hook) -> bool:
    return hook is not None and bool(getattr(hook, "calls", True))


class CompiledLaunches:
    """Compiled kernels of groups of launches, by group key; see the module docstring.

    Bounded: once MAX_GROUPS keys are held, the next new key clears the cache, and each key
    then costs one launch through the JIT again (which finds its kernels in Triton's cache)."""

    def __init__(self):
        self._groups: dict[Hashable, tuple[CompiledLaunch, ...]] = {}

    def launch(self, key: Hashable, launches: Sequence[KernelLaunch],
               arguments: Callable[[tuple], Sequence[tuple]], tensors: tuple, pointers: tuple,
               stream: int | None) -> None:
        """Enqueue every launch of the group on `stream`, in order; `arguments(buffers)` gives
        each launch's runtime arguments from `tensors` or from `pointers`. `stream` must be
        the current stream (`current_stream`), the one a launch through the JIT takes."""
        group = self._groups.get(key)
        if group is None:
            compiled = [launch.through_jit(args)
                        for launch, args in zip(launches, arguments(tensors))]
            if all(c is not None for c in compiled):
                if len(self._groups) >= MAX_GROUPS:
                    self._groups.clear()
                self._groups[key] = tuple(compiled)
        elif hooks_installed():
            for launch, args in zip(group, arguments(tensors)):
                launch.through_runner(stream, args)
        else:
            for launch, args in zip(group, arguments(pointers)):
                launch.enqueue(stream, args)

    def clear(self) -> None:
        """Forget every compiled kernel: the next launch of each key goes through the JIT."""
        self._groups.clear()

    def __len__(self) -> int:
        """Number of group keys whose launches take the compiled kernels."""
        return len(self._groups)
