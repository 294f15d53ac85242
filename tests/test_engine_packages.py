"""The engine subjects' package structure: no engine package imports another's, and no module of ``subjects/``
imports, directly or through others, a module that imports it (function-level imports included)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE_PACKAGES = ("subjects.vllm", "subjects.sglang")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module of ``subjects/`` -> the modules of ``subjects/`` it imports anywhere in its source."""
    modules = {_module_name(p): p for p in (ROOT / "subjects").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module in modules:
                deps.add(node.module)
                deps |= {f"{node.module}.{a.name}" for a in node.names} & set(modules)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & set(modules)
        graph[name] = deps - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order), or None."""
    state: dict[str, int] = {}

    def visit(module: str, path: list[str]) -> list[str] | None:
        state[module] = 1
        for dep in sorted(graph[module]):
            if state.get(dep) == 1:
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[module] = 2
        return None

    return next((c for m in sorted(graph) if m not in state and (c := visit(m, [m]))), None)


def test_no_import_cycles_in_subjects() -> None:
    assert _cycle(_imports()) is None, " -> ".join(_cycle(_imports()) or [])


def test_cycle_finder_finds_one() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("package", ENGINE_PACKAGES)
def test_engine_packages_do_not_import_each_other(package: str) -> None:
    others = [p for p in ENGINE_PACKAGES if p != package]
    for module, deps in _imports().items():
        if module == package or module.startswith(f"{package}."):
            crossing = sorted(d for d in deps for o in others if d == o or d.startswith(f"{o}."))
            assert not crossing, f"{module} imports {crossing}"
