"""`CompiledLaunches`: enqueue a fixed group of Triton kernels through their compiled kernels.

Host cost of one Triton launch, by route (the H200 host of docs/notes/performance-notebook.md, "Host enqueue
below Triton's runner"; an empty kernel with one argument / with 14):
- through the JIT (`kernel[grid](...)`): binds and specialises every argument, hashes a cache
  key and checks the globals the kernel read, each call: 10.5-10.9 / 21.3-25.0 us;
- through the compiled kernel's runner (`compiled[grid](...)`): per launch it still builds a
  closure, looks up the device and the stream, builds the launch metadata and calls the two
  (empty) launch-hook chains, and its C launcher calls `data_ptr()` and `cuPointerGetAttribute`
  for every tensor argument: 10.0-10.3 us with one argument;
- the compiled kernel's launcher (`compiled.run`, Triton's `CudaLauncher`) with the positional
  arguments the runner passes (`CompiledKernel.__getitem__`, Triton 3.6 to 3.9), the caller's
  stream, no metadata or hooks, and pointers given as device addresses (ints), which the C
  launcher takes as they are: 6.4-6.8 / 7.0-7.4 us;
- `CompiledLaunch.enqueue` (here): the C function that `CudaLauncher.__call__` calls, with the
  arguments that method would pass it, fixed ones bound once. `__call__` builds two closures
  and asks two allocators per launch for global and profile scratch, which a kernel that needs
  none (the usual case) never uses. Its argument layout is Triton's and changed in 3.7
  (`C_LAUNCH_LAYOUTS`); other versions, kernels that need scratch and other launchers keep the
  route above. On the H200 host, in one run: 5.2 / 5.7 us, against 6.5 us for the route above
  (docs/notes/performance-notebook.md, "Below `CudaLauncher.__call__`").

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

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
from triton import knobs
from triton.runtime import driver

MAX_GROUPS = 4096  # group keys kept; past this the cache starts over (see CompiledLaunches)
# How `CudaLauncher.__call__` calls its C launch function, by Triton minor version (read from
# triton/backends/nvidia/driver.py of each release; the launcher test checks the installed one):
# SPLAT (3.6): launch(x, y, z, stream, function, cooperative, pdl, global_scratch,
#   profile_scratch, kernel_metadata, launch_metadata, enter_hook, exit_hook, *kernel_args);
# PACKED (3.7-3.9): launch(x, y, z, stream, function, cooperative, pdl, kernel_metadata,
#   launch_metadata, enter_hook, exit_hook, global_scratch, profile_scratch, annotations,
#   kernel_signature, kernel_args).
SPLAT, PACKED = "splat", "packed"
C_LAUNCH_LAYOUTS = {"3.6": SPLAT, "3.7": PACKED, "3.8": PACKED, "3.9": PACKED}


@dataclass(frozen=True)
class KernelLaunch:
    """One launch of a group: `kernel[grid](*args, **dict(constexprs), num_warps=num_warps,
    **dict(options))`. `constexprs` are (name, value) pairs in signature order, after every
    runtime parameter; `options` are compile options (such as `launch_pdl`), which the
    compiled kernel keeps for every later launch."""

    kernel: Any  # a @triton.jit function
    grid: tuple[int, int, int]
    constexprs: tuple[tuple[str, Any], ...]
    num_warps: int
    options: tuple[tuple[str, Any], ...] = ()

    def through_jit(self, args: tuple) -> CompiledLaunch | None:
        """Launch through the JIT; the compiled kernel it returned, or None (interpreter)."""
        result = self.kernel[self.grid](*args, **dict(self.constexprs), num_warps=self.num_warps, **dict(self.options))
        if not hasattr(result, "packed_metadata"):
            return None
        names = tuple(self.kernel.arg_names)
        if names != (*names[: len(args)], *(name for name, _ in self.constexprs)):
            raise ValueError(
                f"{self.kernel.fn.__name__}: constexprs {self.constexprs} must be "
                f"the parameters after the {len(args)} runtime ones, {names}"
            )
        return CompiledLaunch(result, self.grid, tuple(value for _, value in self.constexprs))


@dataclass(frozen=True)
class CompiledLaunch:
    """A compiled kernel with its grid and constexpr values (see the module docstring).

    `enqueue` calls `target(x, y, z, stream, *bound, *args)`, or with the arguments packed in
    one tuple (`packs_args`): the C launch function where `c_launch_call` recognises the
    launcher, else the launcher itself. `enqueue(..., serial=True)` takes `serial_bound`
    instead: the same launch without programmatic dependent launch (a kernel compiled with
    `launch_pdl` whose `griddepcontrol.wait` then returns at once, its predecessor done)."""

    compiled: Any  # triton's CompiledKernel, handles initialised (it ran once)
    grid: tuple[int, int, int]
    constexpr_values: tuple
    target: Callable = field(init=False, repr=False, compare=False)
    bound: tuple = field(init=False, repr=False, compare=False)
    serial_bound: tuple = field(init=False, repr=False, compare=False)
    packs_args: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        for name, value in zip(("target", "bound", "serial_bound", "packs_args"), c_launch_call(self.compiled)):
            object.__setattr__(self, name, value)  # derived once: the dataclass is frozen

    def enqueue(self, stream: int, args: tuple, serial: bool = False) -> None:
        """The launch Triton's runner makes, without launch metadata, hooks or scratch; with
        `serial`, without programmatic dependent launch too."""
        bound = self.serial_bound if serial else self.bound
        if self.packs_args:
            self.target(*self.grid, stream, *bound, (*args, *self.constexpr_values))
        else:
            self.target(*self.grid, stream, *bound, *args, *self.constexpr_values)

    def through_runner(self, stream: int, args: tuple) -> None:
        """The launch through Triton's runner (metadata and hooks included)."""
        self.compiled[self.grid](*args, *self.constexpr_values, stream=stream)


def c_launch_call(compiled) -> tuple[Callable, tuple, tuple, bool]:
    """(target, bound, serial_bound, packs_args) of `CompiledLaunch.enqueue`: the C launch
    function and the arguments `CudaLauncher.__call__` would add to the grid, stream and
    kernel arguments (no launch metadata, no hooks, no scratch), where the installed Triton's
    layout is known (`C_LAUNCH_LAYOUTS`) and the kernel needs no global, profile or sanitizer
    scratch; otherwise the launcher itself, called as Triton's runner calls it. serial_bound:
    the same with the programmatic-dependent-launch flag off (the launcher itself has no such
    argument: there it is `bound`, and the compiled kernel's setting holds)."""
    run = compiled.run
    layout = C_LAUNCH_LAYOUTS.get(".".join(triton.__version__.split(".")[:2]))
    needs_scratch = (
        getattr(run, "global_scratch_size", 1)
        or getattr(run, "profile_scratch_size", 1)
        or getattr(run, "gsan_enabled", False)
    )
    if type(run).__name__ != "CudaLauncher" or layout is None or needs_scratch:
        bound = (compiled.function, compiled.packed_metadata, None, None, None)
        return run, bound, bound, False
    head = (compiled.function, run.launch_cooperative_grid)  # then the PDL flag
    if layout == PACKED:
        tail = (compiled.packed_metadata, None, None, None, None, None, run.arg_annotations, run.kernel_signature)
    else:
        tail = (None, None, compiled.packed_metadata, None, None, None)
    return (run.launch, (*head, run.launch_pdl, *tail), (*head, False, *tail), layout == PACKED)


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

    def launch(
        self,
        key: Hashable,
        launches: Sequence[KernelLaunch],
        arguments: Callable[[tuple], Sequence[tuple]],
        tensors: tuple,
        pointers: tuple,
        stream: int | None,
        serial: bool = False,
    ) -> None:
        """Enqueue every launch of the group on `stream`, in order; `arguments(buffers)` gives
        each launch's runtime arguments from `tensors` or from `pointers`. `stream` must be
        the current stream (`current_stream`), the one a launch through the JIT takes.
        `serial`: launches compiled with programmatic dependent launch go without it, where
        they take `enqueue` (not the first launch of a key, which compiles, nor launches
        through the runner for a hook)."""
        group = self._groups.get(key)
        if group is None:
            compiled = [launch.through_jit(args) for launch, args in zip(launches, arguments(tensors))]
            if all(c is not None for c in compiled):
                if len(self._groups) >= MAX_GROUPS:
                    self._groups.clear()
                self._groups[key] = tuple(compiled)
        elif hooks_installed():
            for launch, args in zip(group, arguments(tensors)):
                launch.through_runner(stream, args)
        else:
            for launch, args in zip(group, arguments(pointers)):
                launch.enqueue(stream, args, serial)

    def clear(self) -> None:
        """Forget every compiled kernel: the next launch of each key goes through the JIT."""
        self._groups.clear()

    def __len__(self) -> int:
        """Number of group keys whose launches take the compiled kernels."""
        return len(self._groups)
