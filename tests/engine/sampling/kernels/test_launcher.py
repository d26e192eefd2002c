"""CompiledLaunches: a group goes through the JIT once per key, then through each compiled
kernel's launcher, with the positional arguments Triton's own runner passes."""

import types

import pytest
import triton
from triton import knobs
from triton.compiler.compiler import CompiledKernel

from engine.sampling.kernels import launcher
from engine.sampling.kernels.launcher import CompiledLaunches, KernelLaunch


class FakeCompiled:
    """Stands for triton's CompiledKernel: `run` is its launcher, `[grid]` its runner."""

    packed_metadata = ("packed",)
    function = 4242

    def __init__(self, calls):
        self.calls = calls

    def run(self, *args):
        self.calls.append(("launcher", args))

    def __getitem__(self, grid):
        return lambda *args, stream: self.calls.append(("runner", grid, args, stream))


class FakeJit:
    """Stands for a @triton.jit function: kernel[grid](*args, **constexprs, num_warps=w)
    records the call and returns a compiled kernel (or None, as the interpreter does)."""

    def __init__(self, arg_names, calls, returns_compiled=True):
        self.arg_names = arg_names
        self.fn = types.SimpleNamespace(__name__="fake_kernel")
        self.calls = calls
        self.returns_compiled = returns_compiled

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.calls.append(("jit", grid, args, kwargs))
            return FakeCompiled(self.calls) if self.returns_compiled else None

        return run


def two_kernel_group(calls, returns_compiled=(True, True)):
    """Two launches: f(x_ptr, n, BLOCK, EVEN) on a (3, 2, 1) grid, g(x_ptr, y_ptr, FLAG)."""
    f = FakeJit(["x_ptr", "n", "BLOCK", "EVEN"], calls, returns_compiled[0])
    g = FakeJit(["x_ptr", "y_ptr", "FLAG"], calls, returns_compiled[1])
    return (
        KernelLaunch(f, (3, 2, 1), (("BLOCK", 128), ("EVEN", True)), 4),
        KernelLaunch(g, (5, 1, 1), (("FLAG", 1),), 8),
    )


def arguments(buffers):
    x, y = buffers
    return ((x, 10), (x, y))


TENSORS = ("tensor_x", "tensor_y")
POINTERS = (0x1000, 0x2000)


def test_the_first_launch_of_a_key_goes_through_the_jit_later_ones_through_the_launcher():
    calls = []
    group = two_kernel_group(calls)
    launches = CompiledLaunches()
    launches.launch("a", group, arguments, TENSORS, POINTERS, stream=77)
    assert calls == [
        ("jit", (3, 2, 1), ("tensor_x", 10), {"BLOCK": 128, "EVEN": True, "num_warps": 4}),
        ("jit", (5, 1, 1), ("tensor_x", "tensor_y"), {"FLAG": 1, "num_warps": 8}),
    ]
    calls.clear()
    launches.launch("a", group, arguments, TENSORS, POINTERS, stream=77)
    # grid, stream, function, packed metadata, no metadata or hooks, pointers, constexprs
    assert calls == [
        ("launcher", (3, 2, 1, 77, 4242, ("packed",), None, None, None, 0x1000, 10, 128, True)),
        ("launcher", (5, 1, 1, 77, 4242, ("packed",), None, None, None, 0x1000, 0x2000, 1)),
    ]
    calls.clear()
    launches.launch("b", group, arguments, TENSORS, POINTERS, stream=77)  # a new key: the JIT
    assert [call[0] for call in calls] == ["jit", "jit"] and len(launches) == 2
    launches.clear()
    calls.clear()
    launches.launch("a", group, arguments, TENSORS, POINTERS, stream=77)
    assert [call[0] for call in calls] == ["jit", "jit"] and len(launches) == 1


def test_a_group_with_a_kernel_the_jit_returns_no_compiled_kernel_for_always_takes_the_jit():
    calls = []
    group = two_kernel_group(calls, returns_compiled=(True, False))
    launches = CompiledLaunches()
    for _ in range(2):
        launches.launch("k", group, arguments, TENSORS, POINTERS, stream=None)
    assert [call[0] for call in calls] == ["jit"] * 4 and len(launches) == 0


def test_with_a_launch_hook_installed_launches_go_through_the_runner_with_the_tensors(monkeypatch):
    """A profiler's hook must see every launch: Triton's runner calls it, `enqueue` does not."""
    calls = []
    group = two_kernel_group(calls)
    launches = CompiledLaunches()
    launches.launch("a", group, arguments, TENSORS, POINTERS, stream=77)
    calls.clear()
    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert launcher.hooks_installed()
        launches.launch("a", group, arguments, TENSORS, POINTERS, stream=77)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert not launcher.hooks_installed()
    assert calls == [
        ("runner", (3, 2, 1), ("tensor_x", 10, 128, True), 77),
        ("runner", (5, 1, 1), ("tensor_x", "tensor_y", 1), 77),
    ]


def test_constexprs_out_of_signature_order_are_refused():
    """The compiled kernel takes constexprs positionally: a wrong order would pass BLOCK's
    value as EVEN's, so it is refused before it is cached."""
    calls = []
    kernel = FakeJit(["x_ptr", "BLOCK", "EVEN"], calls)
    group = (KernelLaunch(kernel, (1, 1, 1), (("EVEN", True), ("BLOCK", 8)), 1),)
    launches = CompiledLaunches()
    with pytest.raises(ValueError, match="must be the parameters after"):
        launches.launch("k", group, lambda b: ((b[0],),), ("x",), (1,), stream=None)
    assert len(launches) == 0


def test_the_cache_starts_over_past_its_bound(monkeypatch):
    monkeypatch.setattr(launcher, "MAX_GROUPS", 2)
    calls = []
    group = two_kernel_group(calls)
    launches = CompiledLaunches()
    for key in ("a", "b"):
        launches.launch(key, group, arguments, TENSORS, POINTERS, stream=None)
    assert len(launches) == 2
    launches.launch("c", group, arguments, TENSORS, POINTERS, stream=None)
    assert len(launches) == 1  # cleared, then "c"
    calls.clear()
    launches.launch("a", group, arguments, TENSORS, POINTERS, stream=None)
    assert [call[0] for call in calls] == ["jit", "jit"]


def test_enqueue_passes_what_the_installed_tritons_runner_passes():
    """The launcher's positional protocol belongs to Triton (`CompiledKernel.__getitem__`):
    a compiled kernel of the installed Triton, its launcher replaced by a recorder, launched
    through Triton's runner and through `enqueue`, must get the same grid, stream, function,
    packed metadata and arguments; only the launch metadata and the hooks (empty chains in
    the runner, None in `enqueue`) may differ."""
    recorded = []
    compiled = compiled_with(lambda *args: recorded.append(args))
    launch = launcher.CompiledLaunch(compiled, (3, 2, 1), (128, True))
    try:
        compiled[(3, 2, 1)]("tensor_x", 10, 128, True, stream=77)
        launch.enqueue(77, ("tensor_x", 10))
    finally:
        compiled.module = None  # nothing to unload when the stand-in is collected
    runner, ours = recorded
    assert len(runner) == len(ours) == 13
    assert runner[:6] == ours[:6] == (3, 2, 1, 77, 4242, ("packed",))
    assert runner[9:] == ours[9:] == ("tensor_x", 10, 128, True)
    assert ours[6:9] == (None, None, None)
    assert runner[7] is knobs.runtime.launch_enter_hook
    assert runner[8] is knobs.runtime.launch_exit_hook


def recording_cuda_launcher(recorded, **overrides):
    """The installed Triton's `CudaLauncher`, built without compiling anything: its C launch
    function replaced by a recorder, its other state that of a kernel without scratch."""
    from triton.backends.nvidia.driver import CudaLauncher

    run = object.__new__(CudaLauncher)
    state = dict(
        launch=lambda *args: recorded.append(args),
        num_ctas=1,
        global_scratch_size=0,
        global_scratch_align=1,
        profile_scratch_size=0,
        profile_scratch_align=1,
        launch_cooperative_grid=False,
        launch_pdl=True,
        arg_annotations=("annotations",),
        kernel_signature=b"signature",
        gsan_enabled=False,
    )
    state.update(overrides)
    for name, value in state.items():
        setattr(run, name, value)
    return run


def compiled_with(run):
    """A CompiledKernel of the installed Triton, built without compiling, whose launcher is
    `run` (set `module` to None after use: nothing to unload)."""
    compiled = object.__new__(CompiledKernel)
    compiled.module, compiled.function, compiled.packed_metadata = object(), 4242, ("packed",)
    compiled.name, compiled.src, compiled.metadata = "fake", None, None
    compiled._run = run
    return compiled


def enqueued_and_tritons(monkeypatch, serials, tritons_pdl=True):
    """(launch, run, recorded): a `CompiledLaunch` of a recording launcher compiled with
    `launch_pdl`, enqueued once per entry of `serials` (its `serial` flag), then the same launch
    through the installed Triton's `CudaLauncher.__call__` with `launch_pdl` = tritons_pdl;
    `recorded` holds the C launch function's arguments of each, in that order."""
    # Triton 3.8+'s __call__ looks up the active driver first (no GPU here: a stand-in)
    monkeypatch.setattr(triton.runtime.driver, "_active", types.SimpleNamespace())
    recorded = []
    run = recording_cuda_launcher(recorded)
    compiled = compiled_with(run)
    launch = launcher.CompiledLaunch(compiled, (3, 2, 1), (128, True))
    try:
        for serial in serials:
            launch.enqueue(77, (0x1000, 10), serial=serial)
        run.launch_pdl = tritons_pdl
        type(run).__call__(run, 3, 2, 1, 77, 4242, ("packed",), None, None, None, 0x1000, 10, 128, True)
    finally:
        compiled.module = None
    return launch, run, recorded


def test_enqueue_calls_the_c_launch_function_as_the_installed_tritons_launcher_does(monkeypatch):
    """Below `CudaLauncher.__call__`: the C launch function must get exactly the arguments
    that method passes it for the same launch (no metadata, hooks or scratch), in the
    installed Triton's layout; a version outside `C_LAUNCH_LAYOUTS` keeps the launcher."""
    launch, run, (ours, tritons) = enqueued_and_tritons(monkeypatch, [False])
    assert ours == tritons
    minor = ".".join(triton.__version__.split(".")[:2])
    assert (launch.target is run.launch) == (minor in launcher.C_LAUNCH_LAYOUTS)
    assert 0x1000 in (ours[-1] if launch.packs_args else ours)


def test_a_serial_enqueue_is_the_launch_without_programmatic_dependent_launch(monkeypatch):
    """`enqueue(..., serial=True)` of a kernel compiled with `launch_pdl` passes the C launch
    function exactly what `CudaLauncher.__call__` passes for the same kernel with the option
    off; a plain enqueue keeps it on, and a kernel that keeps the launcher (no known layout)
    launches as compiled either way (`test_kernels_that_need_scratch_keep_the_launcher`)."""
    if ".".join(triton.__version__.split(".")[:2]) not in launcher.C_LAUNCH_LAYOUTS:
        pytest.skip("the installed Triton's launch layout is unknown: enqueue keeps the launcher")
    _, _, (serial, plain, tritons_serial) = enqueued_and_tritons(monkeypatch, [True, False], tritons_pdl=False)
    assert serial == tritons_serial
    assert plain[:6] + plain[7:] == serial[:6] + serial[7:]
    assert plain[6] is True and serial[6] is False


@pytest.mark.parametrize(
    "overrides", [dict(global_scratch_size=64), dict(profile_scratch_size=8), dict(gsan_enabled=True)]
)
def test_kernels_that_need_scratch_keep_the_launcher(overrides):
    """A kernel with global, profile or sanitizer scratch needs what `__call__` allocates."""
    run = recording_cuda_launcher([], **overrides)
    compiled = compiled_with(run)
    try:
        launch = launcher.CompiledLaunch(compiled, (1, 1, 1), ())
    finally:
        compiled.module = None
    assert launch.target is run and not launch.packs_args
    assert launch.bound == launch.serial_bound == (4242, ("packed",), None, None, None)


@pytest.mark.parametrize(
    "version, target_is_c", [("3.6.0", True), ("3.9.1", True), ("3.5.0", False), ("3.10.0", False)]
)
def test_the_c_launch_function_is_taken_only_for_known_layouts(monkeypatch, version, target_is_c):
    monkeypatch.setattr(triton, "__version__", version)
    run = recording_cuda_launcher([])
    compiled = compiled_with(run)
    try:
        launch = launcher.CompiledLaunch(compiled, (1, 1, 1), ())
    finally:
        compiled.module = None
    assert (launch.target is run.launch) == target_is_c
    assert launch.packs_args == (version == "3.9.1")
