"""The tree rules of docs/architecture.md ("Dependency rules"), checked on the source tree (the test
is the rule).

Every `import` and `from ... import` statement of the two import packages is read with `ast`, at
any depth: lazy imports inside functions and type-only imports under `if TYPE_CHECKING:` count
like the others, for every import rule (1-4 and 6). A name imported only for annotations ties the
module to the one it names: a type checker, an editor and a reader follow that import, and the
`if` is one edit away from running it. Dynamic imports by string (`importlib.import_module`, entry
points) are the sanctioned way to reach a module by name and are not edges; neither are the
`__init__`s of the packages above a module, which Python runs before it (a package facade that
re-exports its submodules would otherwise close a circle with each of them). The rules:

1. `engine` never imports `specval` (the system under test knows nothing of its harness);
2. only the kernels wings, `engine/sampling/kernels/` and `engine/models/kernels/`, import
   `triton` (tests and benchmarks, which launch kernels, are outside the two packages and not
   checked);
3. `specval` imports `engine` only inside `specval/adapters/` (the adapter is the only door);
4. no import circle among the modules of both packages, lazy imports included;
5. no module of either package over MAX_MODULE_LINES (700) lines, but those of LONG_MODULES, an
   allow-list that stays empty unless a module must stay whole, each entry with its reason;
6. type-only imports close circles too: rule 4 counts them (a circle that only type checkers
   follow is broken by moving the shared type below both modules, as for any other circle);
7. no top-level module of `specval` (`specval/*.py`) only re-exports: its body after the docstring
   is not only imports (type-only ones included), `__all__` and a module `__getattr__` / `__dir__`
   that forwards names. Packages' `__init__.py` are their facades and are not checked, and
   `specval/__init__.py` is the public API (lazy re-exports of `specval.api`), exempt by design;
8. docs/performance.md has at most 300 lines (DOCUMENT_LINES): the current figures only, their
   history lives in docs/notes/;
9. no module of `specval` outside `specval/adapters/` imports `torch` or `triton` at module level
   (the harness installs and imports without them: `pip install specval`, the `engine` extra adds
   them); a lazy (function-level) or type-only import of either only in the modules of TORCH_LAZY,
   an allow-list with each entry's reason, each of which still has one.

Each rule's scanner is also run on a small planted tree, so a rule that silently checks nothing
fails.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "specval")
KERNELS_WINGS = ("engine.sampling.kernels", "engine.models.kernels")
ADAPTERS = "specval.adapters"
MAX_MODULE_LINES = 700
# Modules of either package allowed over MAX_MODULE_LINES: path relative to the root -> why it must
# stay whole. Empty: a module that outgrows the limit becomes a package of modules by what its
# parts are, behind a facade `__init__.py`. An entry whose module shrank below the limit, or left,
# fails (test_every_allowed_long_module_is_still_long).
LONG_MODULES: dict[str, str] = {}
# Documents with a line budget: path relative to the root -> most lines.
DOCUMENT_LINES = {"docs/performance.md": 300}  # current figures only; their history is docs/notes/
FORWARDING_FUNCTIONS = ("__getattr__", "__dir__")  # a module's PEP 562 hooks
HEAVY = ("torch", "triton")  # the `engine` extra: never imported when a harness module is
# Harness modules (specval outside specval/adapters/) that may import torch inside a function, path
# relative to the root -> why, and what happens without torch. Nothing else may (rule 9), and no
# module imports it at module level, so `pip install specval` imports every harness module.
TORCH_LAZY = {
    # device facts of the manifest: CUDA is read through torch; without it they say
    # `torch: "not installed"` (guarded)
    "specval/bundle/facts.py": "device facts read CUDA through torch (guarded: absent -> said so)",
    # multi-process runs join through torch.distributed; without it exit 2 naming the extra (guarded)
    "specval/distribution/sharding.py": "torch.distributed joins the ranks (guarded: TorchMissing, exit 2)",
    # `run --devices N` of a CUDA protocol counts the GPUs; a CUDA protocol runs an adapter that
    # brings torch
    "specval/cli/common.py": "--devices of a CUDA protocol counts GPUs with torch.cuda",
    # a bench of the bundled engine on CUDA synchronises the device; the engine arms need the
    # `engine` extra anyway
    "specval/performance/bench.py": "timing the engine on CUDA synchronises it (torch.cuda)",
}


@dataclass(frozen=True)
class Edge:
    """One import statement: `importer` imports `target` at `line` (`target` is the dotted name)."""

    importer: str
    target: str
    line: int
    type_only: bool = False  # under `if TYPE_CHECKING:`

    def where(self, modules: dict[str, Path], root: Path) -> str:
        kind = " (type-only)" if self.type_only else ""
        return f"{modules[self.importer].relative_to(root)}:{self.line} imports {self.target}{kind}"


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file of PACKAGES under `root`."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST):
    """Every Import / ImportFrom node, at any depth, with whether it is under `if TYPE_CHECKING:`."""
    stack = [(tree, False)]
    while stack:
        node, type_only = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, True) for child in node.body)
            stack.extend((child, type_only) for child in node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, type_only
        stack.extend((child, type_only) for child in ast.iter_child_nodes(node))


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    """The absolute dotted name a (possibly relative) `from X import` refers to."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def edges_of(module: str, path: Path, modules: dict[str, Path]) -> list[Edge]:
    """The import edges of one module; `from a.b import c` points at a.b.c when that is a module."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    edges = []
    for node, type_only in _import_nodes(tree):
        if isinstance(node, ast.Import):
            edges += [Edge(module, alias.name, node.lineno, type_only) for alias in node.names]
            continue
        source = _absolute(module, is_package, node)
        for alias in node.names:
            child = f"{source}.{alias.name}"
            edges.append(Edge(module, child if child in modules else source, node.lineno, type_only))
    return edges


def all_edges(root: Path) -> tuple[dict[str, Path], list[Edge]]:
    modules = module_files(root)
    return modules, [edge for name, path in modules.items() for edge in edges_of(name, path, modules)]


def _within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def violations(root: Path) -> list[str]:
    """Every broken rule 1-3, as 'importer:line imports target (rule)'."""
    modules, edges = all_edges(root)
    found = []
    for edge in edges:
        where = edge.where(modules, root)
        if _within(edge.importer, "engine") and _within(edge.target, "specval"):
            found.append(f"{where} (the engine never imports specval)")
        if _within(edge.target, "triton") and not any(_within(edge.importer, wing) for wing in KERNELS_WINGS):
            found.append(f"{where} (only the kernels wings {KERNELS_WINGS} import triton)")
        if (
            _within(edge.importer, "specval")
            and _within(edge.target, "engine")
            and not _within(edge.importer, ADAPTERS)
        ):
            found.append(f"{where} (specval reaches the engine only through {ADAPTERS})")
    return list(dict.fromkeys(found))  # one line per statement, also when it imports several names


def circles(root: Path) -> list[list[str]]:
    """The strongly connected components of more than one module (or a module importing itself),
    over every import edge, lazy and type-only ones included (rules 4 and 6)."""
    modules, edges = all_edges(root)
    graph = {name: sorted({e.target for e in edges if e.importer == name and e.target in modules}) for name in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    components: list[list[str]] = []

    def visit(node: str) -> None:  # Tarjan's algorithm; the module graph is far below the recursion limit
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for name in graph:
        if name not in index:
            visit(name)
    return components


def shortest_circle(root: Path, component: list[str]) -> list[str]:
    """One shortest loop through the modules of a circle, as the import statements that close it
    ('importer:line imports target', in order), for the failure message."""
    modules, edges = all_edges(root)
    members = set(component)
    statement: dict[tuple[str, str], Edge] = {}  # (importer, target) -> its first statement
    for edge in edges:
        if edge.importer in members and edge.target in members:
            statement.setdefault((edge.importer, edge.target), edge)
    best: list[Edge] = []
    for start in component:  # breadth first from each member, until an import leads back to it
        came_from, queue = {start: start}, deque([start])
        while queue:
            node = queue.popleft()
            if (node, start) in statement:
                loop = [node]
                while loop[-1] != start:
                    loop.append(came_from[loop[-1]])
                loop = [*reversed(loop), start]
                if not best or len(loop) - 1 < len(best):
                    best = [statement[step] for step in zip(loop, loop[1:])]
                break
            for importer, target in sorted(statement):
                if importer == node and target not in came_from:
                    came_from[target] = node
                    queue.append(target)
    return [edge.where(modules, root) for edge in best]


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def long_modules(root: Path, allowed: dict[str, str] = LONG_MODULES) -> dict[str, int]:
    """Rule 5: every module of both packages over MAX_MODULE_LINES and not in `allowed`, as path
    relative to `root` -> lines."""
    found = {}
    for path in module_files(root).values():
        relative = path.relative_to(root).as_posix()
        lines = _lines(path)
        if lines > MAX_MODULE_LINES and relative not in allowed:
            found[relative] = lines
    return dict(sorted(found.items()))


def _forwards_only(statement: ast.stmt) -> bool:
    """Whether a top-level statement only imports or forwards names (rule 7)."""
    if isinstance(statement, (ast.Import, ast.ImportFrom)):
        return True
    if isinstance(statement, ast.Assign):
        return all(isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets)
    if isinstance(statement, (ast.AnnAssign, ast.AugAssign)):
        return isinstance(statement.target, ast.Name) and statement.target.id == "__all__"
    if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return statement.name in FORWARDING_FUNCTIONS
    if isinstance(statement, ast.If) and _is_type_checking(statement.test):
        return all(_forwards_only(child) for child in statement.body + statement.orelse)
    return False


def reexport_modules(root: Path) -> list[str]:
    """Rule 7: the top-level modules of `specval` (`specval/*.py`; not `specval/__init__.py`, the
    public API, nor any package's `__init__.py`) whose body after the docstring is not empty and
    only imports, sets `__all__` or defines FORWARDING_FUNCTIONS, as paths relative to `root`."""
    found = []
    for path in sorted((root / "specval").glob("*.py")):
        if path.name == "__init__.py":  # the public API's lazy re-exports of specval.api
            continue
        body = ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body
        if (
            body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body = body[1:]  # the docstring
        if body and all(_forwards_only(statement) for statement in body):
            found.append(path.relative_to(root).as_posix())
    return found


def long_documents(root: Path, limits: dict[str, int] = DOCUMENT_LINES) -> dict[str, int]:
    """Rule 8: every document of `limits` over its budget, as path -> lines."""
    return {name: _lines(root / name) for name, most in limits.items() if _lines(root / name) > most}


def _lazy_imports(tree: ast.AST):
    """Every Import / ImportFrom node, with whether it runs only later or never when the module is
    imported (inside a function or lambda, or under `if TYPE_CHECKING:`)."""
    stack = [(tree, False)]
    while stack:
        node, lazy = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend((child, True) for child in node.body)
            stack.extend((child, lazy) for child in node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node, lazy
        inner = lazy or isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        stack.extend((child, inner) for child in ast.iter_child_nodes(node))


def heavy_imports(root: Path, allowed: dict[str, str] = TORCH_LAZY) -> tuple[list[str], set[str]]:
    """Rule 9: the imports of HEAVY in specval outside ADAPTERS that break it, as 'path:line imports
    X (why)', and the modules that import HEAVY lazily (what `allowed` must still hold)."""
    found, lazy_modules = [], set()
    for name, path in module_files(root).items():
        if not _within(name, "specval") or _within(name, ADAPTERS):
            continue
        relative = path.relative_to(root).as_posix()
        for node, lazy in _lazy_imports(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                targets = [node.module or ""] if node.level == 0 else []
            for target in (t for t in targets if any(_within(t, heavy) for heavy in HEAVY)):
                where = f"{relative}:{node.lineno} imports {target}"
                if not lazy:
                    found.append(f"{where} at module level (the harness imports without torch and triton)")
                elif relative not in allowed:
                    found.append(f"{where} lazily, outside the allow-list TORCH_LAZY")
                else:
                    lazy_modules.add(relative)
    return found, lazy_modules


def test_the_packages_keep_the_layering_rules():
    assert violations(ROOT) == []


def test_the_packages_have_no_import_circle_type_only_imports_included():
    found = circles(ROOT)
    assert found == [], "\n".join(
        f"circle of {len(component)} modules ({', '.join(component)}), one of its loops: "
        + "; ".join(shortest_circle(ROOT, component))
        for component in found
    )


def test_no_module_is_over_the_line_limit():
    found = long_modules(ROOT)
    assert found == {}, f"modules over {MAX_MODULE_LINES} lines (split them by what their parts are): " + ", ".join(
        f"{path} ({lines})" for path, lines in found.items()
    )


def test_every_allowed_long_module_is_still_long():
    for path in LONG_MODULES:
        assert (ROOT / path).is_file(), f"LONG_MODULES names {path}, which is gone"
        assert _lines(ROOT / path) > MAX_MODULE_LINES, f"{path} is within the limit: drop it from LONG_MODULES"


def test_no_top_level_specval_module_only_reexports():
    assert reexport_modules(ROOT) == []


def test_the_documents_keep_their_line_budget():
    for name in DOCUMENT_LINES:
        assert (ROOT / name).is_file(), name
    found = long_documents(ROOT)
    assert found == {}, ", ".join(
        f"{name}: {lines} lines, at most {DOCUMENT_LINES[name]}" for name, lines in found.items()
    )


def test_the_harness_imports_torch_and_triton_only_lazily_and_where_allowed():
    found, lazy_modules = heavy_imports(ROOT)
    assert found == [], "\n".join(found)
    assert lazy_modules == set(TORCH_LAZY), (
        f"TORCH_LAZY names modules without a lazy import: {set(TORCH_LAZY) - lazy_modules}"
    )


def test_every_module_of_both_packages_is_scanned():
    modules, edges = all_edges(ROOT)
    assert {"engine", "specval", "specval.cli", "specval.sut"} <= modules.keys()
    for wing in KERNELS_WINGS:
        assert any(name.startswith(wing + ".") for name in modules), wing
    assert any(_within(edge.target, "triton") for edge in edges)  # the kernels' imports are seen
    assert any(edge.type_only for edge in edges)  # and the type-only ones


# ---------------------------------------------------------------- the scanner on a planted tree


def _write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def planted(tmp_path) -> Path:
    """A tree that breaks every rule once, each through a different import form."""
    _write(tmp_path, "engine/__init__.py", "")
    _write(tmp_path, "engine/sampling/__init__.py", "")
    _write(tmp_path, "engine/sampling/kernels/__init__.py", "import triton\n")
    _write(tmp_path, "engine/sampling/front.py", "def f():\n    import triton.language as tl\n")
    _write(tmp_path, "engine/report.py", "from specval import cli\n")
    _write(tmp_path, "engine/a.py", "from . import b\n")
    _write(tmp_path, "engine/b.py", "def g():\n    from engine.a import x\n")
    _write(tmp_path, "engine/c.py", "from engine import d\n")
    _write(tmp_path, "engine/d.py", "import typing\nif typing.TYPE_CHECKING:\n    from engine.c import C\n")
    _write(tmp_path, "specval/__init__.py", "")
    _write(tmp_path, "specval/cli.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import engine\n")
    _write(tmp_path, "specval/sut.py", "")
    _write(tmp_path, "specval/bench.py", "def h():\n    from engine import a\n")
    _write(tmp_path, "specval/adapters/__init__.py", "")
    _write(tmp_path, "specval/adapters/engine.py", "import engine.sampling\n")
    return tmp_path


def test_the_scanner_finds_each_planted_violation(planted):
    found = violations(planted)
    assert len(found) == 4, found
    assert any("engine/sampling/front.py:2 imports triton.language" in v for v in found)  # lazy
    assert any("engine/report.py:1 imports specval.cli" in v for v in found)
    assert any("specval/bench.py:2 imports engine.a" in v for v in found)  # lazy, outside the adapters
    assert any("specval/cli.py:3 imports engine (type-only)" in v for v in found)


def test_the_scanner_finds_a_planted_circle_through_a_lazy_relative_import(planted):
    assert ["engine.a", "engine.b"] in circles(planted)


def test_the_scanner_finds_a_planted_circle_closed_by_a_type_only_import(planted):
    assert ["engine.c", "engine.d"] in circles(planted)
    assert len(circles(planted)) == 2
    assert shortest_circle(planted, ["engine.c", "engine.d"]) == [
        "engine/c.py:1 imports engine.d",
        "engine/d.py:3 imports engine.c (type-only)",
    ]


def test_the_scanner_finds_each_planted_heavy_import(tmp_path):
    _write(tmp_path, "engine/__init__.py", "import torch\n")  # the engine: not the harness
    _write(tmp_path, "specval/__init__.py", "")
    _write(tmp_path, "specval/stats.py", "import numpy\nimport torch.nn as nn\n")  # module level
    _write(tmp_path, "specval/guarded.py", "try:\n    import torch\nexcept ImportError:\n    torch = None\n")
    _write(tmp_path, "specval/report/kernel.py", "class K:\n    from triton import language\n")  # a class body runs
    _write(tmp_path, "specval/lazy.py", "def f():\n    import torch.distributed as dist\n")  # not allowed
    _write(
        tmp_path,
        "specval/typed.py",
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torch import Tensor\n",
    )
    _write(tmp_path, "specval/facts.py", "def g():\n    import torch\n\n\nh = lambda: __import__('x')\n")  # allowed
    _write(tmp_path, "specval/sharding.py", "import torch\n\n\ndef g():\n    import torch.distributed\n")
    _write(tmp_path, "specval/adapters/__init__.py", "")
    _write(tmp_path, "specval/adapters/engine.py", "import torch\nimport triton\n")  # the adapters may
    _write(tmp_path, "specval/torchvision_like.py", "import torchvision\nfrom torch_geometric import x\n")  # others
    allowed = {"specval/facts.py": "planted", "specval/sharding.py": "planted"}
    found, lazy_modules = heavy_imports(tmp_path, allowed)
    assert sorted(found) == [
        "specval/guarded.py:2 imports torch at module level (the harness imports without torch and triton)",
        "specval/lazy.py:2 imports torch.distributed lazily, outside the allow-list TORCH_LAZY",
        "specval/report/kernel.py:2 imports triton at module level (the harness imports without torch and triton)",
        "specval/sharding.py:1 imports torch at module level (the harness imports without torch and triton)",
        "specval/stats.py:2 imports torch.nn at module level (the harness imports without torch and triton)",
        "specval/typed.py:3 imports torch lazily, outside the allow-list TORCH_LAZY",
    ]
    assert lazy_modules == {"specval/facts.py", "specval/sharding.py"}


def _lines_of(count: int) -> str:
    return "".join(f"x{i} = {i}\n" for i in range(count))


def test_the_scanner_finds_a_planted_long_module(tmp_path):
    _write(tmp_path, "engine/__init__.py", "")
    _write(tmp_path, "engine/at_limit.py", _lines_of(MAX_MODULE_LINES))
    _write(tmp_path, "engine/long.py", _lines_of(MAX_MODULE_LINES + 1))
    _write(tmp_path, "specval/__init__.py", "")
    _write(tmp_path, "specval/deep/part/long.py", _lines_of(900))
    _write(tmp_path, "specval/allowed.py", _lines_of(800))
    _write(tmp_path, "tests/long.py", _lines_of(900))  # outside the two packages
    found = long_modules(tmp_path, allowed={"specval/allowed.py": "planted"})
    assert found == {"engine/long.py": MAX_MODULE_LINES + 1, "specval/deep/part/long.py": 900}


def test_the_scanner_finds_each_planted_reexport_module(tmp_path):
    forwarding = (
        "import importlib\n\n\ndef __getattr__(name):\n    return getattr(importlib.import_module('x'), name)\n"
    )
    _write(tmp_path, "specval/__init__.py", '"""The public API."""\n' + forwarding)  # exempt
    _write(tmp_path, "specval/facade.py", '"""Names of sut."""\nfrom specval.sut import SUT\n\n__all__ = ["SUT"]\n')
    _write(tmp_path, "specval/lazy.py", forwarding + "\n\ndef __dir__():\n    return []\n")
    _write(
        tmp_path,
        "specval/typed.py",
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from specval.sut import SUT\n__all__: list = []\n",
    )
    _write(tmp_path, "specval/sut.py", "from dataclasses import dataclass\n\nLIMIT = 1\n")  # holds code
    _write(tmp_path, "specval/__main__.py", '"""Run."""\nfrom specval.cli import main\n\nmain()\n')  # a call
    _write(tmp_path, "specval/empty.py", '"""Nothing yet."""\n')  # forwards nothing
    _write(tmp_path, "specval/pkg/__init__.py", "from specval.pkg.part import X\n\n__all__ = ['X']\n")  # facade
    _write(tmp_path, "specval/pkg/alias.py", "from specval.pkg.part import X\n")  # not top-level
    _write(tmp_path, "engine/alias.py", "from engine.part import X\n")  # not specval
    assert reexport_modules(tmp_path) == ["specval/facade.py", "specval/lazy.py", "specval/typed.py"]


def test_the_scanner_finds_a_planted_long_document(tmp_path):
    _write(tmp_path, "docs/performance.md", "a line\n" * 301)
    _write(tmp_path, "docs/other.md", "a line\n" * 301)
    assert long_documents(tmp_path) == {"docs/performance.md": 301}
    _write(tmp_path, "docs/performance.md", "a line\n" * 300)
    assert long_documents(tmp_path) == {}


# ---------------------------------------------------------------- the package map


MAP_DOC = "docs/architecture.md"
MAP_EXEMPT = {"__init__.py", "__main__.py"}  # the package itself, not an entry of its map


def map_entries(root: Path, package: str) -> set[str]:
    """The entries the map of `package` in docs/architecture.md names in its first column: the
    backticked names of the table under the `### `package/`` heading, e.g. `cli/`, `api.py`."""
    text = (root / MAP_DOC).read_text()
    section = text.split(f"### `{package}/`", 1)[1].split("\n#", 1)[0]
    first_cells = [line.split("|")[1] for line in section.splitlines() if line.startswith("| `")]
    names = set()
    for cell in first_cells:
        names |= {name.split("/")[0] + ("/" if "/" in name else "") for name in re.findall(r"`([^`]+)`", cell)}
    return names


def tree_entries(root: Path, package: str) -> set[str]:
    """The modules and sub-packages directly in `package`, as the map names them (`x.py`, `x/`)."""
    out = set()
    for path in (root / package).iterdir():
        if path.suffix == ".py" and path.name not in MAP_EXEMPT:
            out.add(path.name)
        elif path.is_dir() and (path / "__init__.py").exists():
            out.add(path.name + "/")
        elif path.is_dir() and any(path.iterdir()) and path.name != "__pycache__":
            out.add(path.name + "/")  # a data folder (engine/weights/)
    return out


@pytest.mark.parametrize("package", PACKAGES)
def test_the_package_map_matches_the_tree(package):
    mapped, present = map_entries(ROOT, package), tree_entries(ROOT, package)
    assert not present - mapped, f"{MAP_DOC} does not map {sorted(present - mapped)} of {package}/"
    assert not mapped - present, f"{MAP_DOC} maps {sorted(mapped - present)}, which {package}/ does not hold"


def test_the_map_check_sees_a_planted_difference(tmp_path):
    table = "| module | what |\n| --- | --- |\n| `api.py`, `gone/` | x |\n"
    _write(tmp_path, MAP_DOC, f"### `specval/`\n\n{table}\n## Next\n")
    _write(tmp_path, "specval/__init__.py", "")
    _write(tmp_path, "specval/api.py", "")
    _write(tmp_path, "specval/new.py", "")
    assert map_entries(tmp_path, "specval") == {"api.py", "gone/"}
    assert tree_entries(tmp_path, "specval") == {"api.py", "new.py"}
