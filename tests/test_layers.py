"""The layer table (:data:`harness.layers.LAYERS`) holds for every module: no import of a layer the table does not
allow, no import cycle between modules. Imports are read with ``ast`` (nothing is imported), lazy ones inside
functions and ``TYPE_CHECKING`` blocks included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.layers import LAYERS

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PACKAGES = ("subjects.vllm", "subjects.sglang")
"""The engine subjects' packages: none imports another's (shared tooling is ``subjects.engine_tools``)."""


def module_name(path: Path) -> str:
    """``reference/formats.py`` -> ``reference.formats``; a package's ``__init__.py`` is the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    """Every module of the layers' folders, and the top-level modules (``conftest.py``)."""
    files = [f for layer in LAYERS if (ROOT / layer).is_dir() for f in (ROOT / layer).rglob("*.py")]
    files += [f for f in ROOT.glob("*.py") if f.stem in LAYERS]
    return {module_name(f): f for f in files}


def imported(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The project modules ``path`` (module ``name``) imports anywhere in its code."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            targets = [base, *(f"{base}.{a.name}" for a in node.names)]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imported(name, path, modules) for name, path in modules.items()}


def layer(module: str) -> str:
    return module.split(".")[0]


def test_the_table_is_ordered() -> None:
    """Each layer imports only layers listed before it (so the table itself has no cycle)."""
    order = list(LAYERS)
    for name, spec in LAYERS.items():
        later = [d for d in spec.imports if d not in order[: order.index(name)]]
        assert not later, f"layer {name} may import {later}, which are not listed before it"


def test_every_module_is_in_a_layer() -> None:
    strays = sorted(m for m in project_modules() if layer(m) not in LAYERS)
    assert not strays, f"modules outside every layer of harness.layers.LAYERS: {strays}"


def test_no_import_the_table_does_not_allow() -> None:
    bad = [
        f"{a} imports {b} ({layer(a)} may import {', '.join(LAYERS[layer(a)].imports) or 'nothing of the project'})"
        for a, targets in sorted(import_graph().items())
        for b in sorted(targets)
        if layer(b) != layer(a) and layer(b) not in LAYERS[layer(a)].imports
    ]
    assert not bad, "imports against the layer table (harness/layers.py):\n" + "\n".join(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles between modules:\n" + "\n".join(" <-> ".join(c) for c in found)


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}, [["a", "b", "c"]]),
        ({"a": {"b"}, "b": set()}, []),
    ],
)
def test_cycles_finds_a_cycle(graph: dict[str, set[str]], expected: list[list[str]]) -> None:
    assert cycles(graph) == expected


@pytest.mark.parametrize("package", ENGINE_PACKAGES)
def test_engine_packages_do_not_import_each_other(package: str) -> None:
    def inside(module: str, pkg: str) -> bool:
        return module == pkg or module.startswith(f"{pkg}.")

    others = [p for p in ENGINE_PACKAGES if p != package]
    crossing = [
        f"{a} imports {b}"
        for a, targets in sorted(import_graph().items())
        if inside(a, package)
        for b in sorted(targets)
        if any(inside(b, o) for o in others)
    ]
    assert not crossing, "\n".join(crossing)
