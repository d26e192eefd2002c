"""The dependency rules of docs/architecture.md, checked on the source tree (the test is the rule).

Every `import` and `from ... import` statement of the two import packages is read with `ast`,
including lazy imports inside functions; imports under `if TYPE_CHECKING:` are skipped (they never
run). Dynamic imports by string (`importlib.import_module`, entry points) are the sanctioned way to
reach a module by name and are not edges. The rules:

1. `engine` never imports `specval` (the system under test knows nothing of its harness);
2. only the kernels wings, `engine/sampling/kernels/` and `engine/models/kernels/`, import
   `triton` (tests and benchmarks, which launch kernels,
   are outside the two packages and not checked);
3. `specval` imports `engine` only inside `specval/adapters/` (the adapter is the only door);
4. no import circle among the modules of both packages.

The scanner itself is tested on a small planted tree, so a rule that silently checks nothing fails.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "specval")
KERNELS_WINGS = ("engine.sampling.kernels", "engine.models.kernels")
ADAPTERS = "specval.adapters"


@dataclass(frozen=True)
class Edge:
    """One import statement: `importer` imports `target` at `line` (`target` is the dotted name)."""

    importer: str
    target: str
    line: int


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
    """Every Import / ImportFrom node, at any depth, except those under `if TYPE_CHECKING:`."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(node.orelse)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        stack.extend(ast.iter_child_nodes(node))


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
    for node in _import_nodes(tree):
        if isinstance(node, ast.Import):
            edges += [Edge(module, alias.name, node.lineno) for alias in node.names]
            continue
        source = _absolute(module, is_package, node)
        for alias in node.names:
            child = f"{source}.{alias.name}"
            edges.append(Edge(module, child if child in modules else source, node.lineno))
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
        where = f"{modules[edge.importer].relative_to(root)}:{edge.line} imports {edge.target}"
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
    """The strongly connected components of more than one module (or a module importing itself)."""
    modules, edges = all_edges(root)
    graph = {name: sorted({e.target for e in edges if e.importer == name and e.target in modules}) for name in modules}
    index, low, on_stack, stack, components = {}, {}, set(), [], []

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


def test_the_packages_keep_the_layering_rules():
    assert violations(ROOT) == []


def test_the_packages_have_no_import_circle():
    assert circles(ROOT) == []


def test_every_module_of_both_packages_is_scanned():
    modules, edges = all_edges(ROOT)
    assert {"engine", "specval", "specval.cli", "specval.sut"} <= modules.keys()
    for wing in KERNELS_WINGS:
        assert any(name.startswith(wing + ".") for name in modules), wing
    assert any(_within(edge.target, "triton") for edge in edges)  # the kernels' imports are seen


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
    _write(tmp_path, "specval/__init__.py", "")
    _write(tmp_path, "specval/cli.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import engine\n")
    _write(tmp_path, "specval/sut.py", "")
    _write(tmp_path, "specval/bench.py", "def h():\n    from engine import a\n")
    _write(tmp_path, "specval/adapters/__init__.py", "")
    _write(tmp_path, "specval/adapters/engine.py", "import engine.sampling\n")
    return tmp_path


def test_the_scanner_finds_each_planted_violation(planted):
    found = violations(planted)
    assert len(found) == 3, found
    assert any("engine/sampling/front.py:2 imports triton.language" in v for v in found)  # lazy
    assert any("engine/report.py:1 imports specval.cli" in v for v in found)
    assert any("specval/bench.py:2 imports engine.a" in v for v in found)  # lazy, outside the adapters


def test_the_scanner_finds_a_planted_circle_through_a_lazy_relative_import(planted):
    assert circles(planted) == [["engine.a", "engine.b"]]
