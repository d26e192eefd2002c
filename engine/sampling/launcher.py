"""`CompiledLaunches`: launch Triton kernels through the compiled kernel the JIT returned.

A launch through the JIT (`kernel[grid](...)`) binds and specialises every argument, hashes a
cache key and checks the globals the kernel read, each call: 20-40 us of host time per launch
on the H200 host of docs/performance.md, against ~9 us for the compiled kernel's own launcher.
Callers that know what can vary between their calls give that as `key`: the first launch of a
(kernel, constexprs, num_warps, key) goes through the JIT (which compiles or finds the kernel
and returns it), later ones launch the kernel it returned, with every argument in signature
order.

Assumption the caller guarantees: two launches with equal (kernel, constexprs, num_warps, key)
get the same specialisation from the JIT, i.e. `key` holds every argument property Triton
specialises on that can differ between them (tensor dtypes, 16-byte alignment of data
pointers, integer values, the device). Where the JIT returns no compiled kernel (the CPU
interpreter, a stand-in kernel in tests), every launch goes through the JIT.
"""

from __future__ import annotations

from typing import Any, Hashable


class CompiledLaunches:
    """Compiled kernels by (kernel, constexprs, num_warps, key); see the module docstring."""

    def __init__(self):
        self._compiled: dict[Hashable, Any] = {}

    def launch(self, kernel, grid: tuple[int, ...], key: Hashable, args: tuple,
               constexprs: tuple[tuple[str, Any], ...], num_warps: int) -> None:
        """Enqueue kernel[grid](*args, **dict(constexprs), num_warps=num_warps) on the current
        stream. `constexprs` are (name, value) pairs in signature order, after every runtime
        parameter."""
        full_key = (kernel, constexprs, num_warps, key)
        compiled = self._compiled.get(full_key)
        if compiled is not None:
            compiled[(*grid, 1, 1)[:3]](*args, *(value for _, value in constexprs))
            return
        result = kernel[grid](*args, **dict(constexprs), num_warps=num_warps)
        if hasattr(result, "packed_metadata"):  # a compiled kernel (not the interpreter's None)
            names = tuple(kernel.arg_names)
            if names != (*names[:len(args)], *(name for name, _ in constexprs)):
                raise ValueError(f"{kernel.fn.__name__}: constexprs {constexprs} must be the "
                                 f"parameters after the {len(args)} runtime ones, {names}")
            self._compiled[full_key] = result

    def clear(self) -> None:
        """Forget every compiled kernel: the next launch of each goes through the JIT again."""
        self._compiled.clear()

    def __len__(self) -> int:
        return len(self._compiled)
