"""CompiledLaunches: the JIT once per key, then the compiled kernel with every argument in order."""

import types

import pytest

from engine.sampling.launcher import CompiledLaunches


class FakeCompiled:
    """Stands for triton's CompiledKernel: compiled[grid](*all_arguments)."""

    packed_metadata = object()

    def __init__(self, calls):
        self.calls = calls

    def __getitem__(self, grid):
        return lambda *args: self.calls.append(("compiled", grid, args, {}))


class FakeJit:
    """Stands for a @triton.jit function: kernel[grid](*args, **constexprs, num_warps=w)
    records the call and returns a compiled kernel (or None, as the interpreter does)."""

    def __init__(self, arg_names, returns_compiled=True):
        self.arg_names = arg_names
        self.fn = types.SimpleNamespace(__name__="fake_kernel")
        self.calls = []
        self.returns_compiled = returns_compiled

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append(("jit", grid, args, kwargs))
            return FakeCompiled(self.calls) if self.returns_compiled else None
        return run


def test_first_launch_of_a_key_goes_through_the_jit_later_ones_through_the_compiled_kernel():
    kernel = FakeJit(["x_ptr", "n", "BLOCK", "EVEN"])
    launches = CompiledLaunches()
    constexprs = (("BLOCK", 128), ("EVEN", True))
    launches.launch(kernel, (3,), "a", ("x", 10), constexprs, 4)
    launches.launch(kernel, (3, 2), "a", ("y", 11), constexprs, 4)
    launches.launch(kernel, (5,), "b", ("z", 12), constexprs, 4)  # another key: the JIT again
    launches.launch(kernel, (5,), "b", ("w", 13), constexprs, 8)  # other num_warps: again
    jit_kwargs = {"BLOCK": 128, "EVEN": True}
    assert kernel.calls == [
        ("jit", (3,), ("x", 10), {**jit_kwargs, "num_warps": 4}),
        ("compiled", (3, 2, 1), ("y", 11, 128, True), {}),  # constexprs in signature order
        ("jit", (5,), ("z", 12), {**jit_kwargs, "num_warps": 4}),
        ("jit", (5,), ("w", 13), {**jit_kwargs, "num_warps": 8}),
    ]
    assert len(launches) == 3
    launches.clear()
    launches.launch(kernel, (3,), "a", ("v", 14), constexprs, 4)  # through the JIT again
    assert kernel.calls[-1][0] == "jit" and len(launches) == 1


def test_without_a_compiled_kernel_every_launch_goes_through_the_jit():
    kernel = FakeJit(["x_ptr", "BLOCK"], returns_compiled=False)
    launches = CompiledLaunches()
    launches.launch(kernel, (1,), "k", ("x",), (("BLOCK", 8),), 1)
    launches.launch(kernel, (1,), "k", ("x",), (("BLOCK", 8),), 1)
    assert [call[0] for call in kernel.calls] == ["jit", "jit"]
    assert len(launches) == 0


def test_constexprs_out_of_signature_order_are_refused():
    """The compiled kernel takes constexprs positionally: a wrong order would pass BLOCK's
    value as EVEN's, so it is refused before it is cached."""
    launches = CompiledLaunches()
    with pytest.raises(ValueError, match="must be the parameters after"):
        launches.launch(FakeJit(["x_ptr", "BLOCK", "EVEN"]), (1,), "k", ("x",),
                        (("EVEN", True), ("BLOCK", 8)), 1)
    assert len(launches) == 0
