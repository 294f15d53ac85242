"""The one point where an adapter hands a built call to a library: :func:`launch`.

Every kernel runner in :mod:`adapters` builds its arguments (weights prepared, activations quantized,
tensors moved to :func:`kernel_device`) and then calls ``launch(name, fn, *args, **kwargs)`` instead of
``fn(*args, **kwargs)``. Normally that is the call itself. Inside :func:`planning` (the preflight,
:mod:`harness.preflight`) the hardware gates pass, :func:`kernel_device` is the CPU and :func:`launch`
hands the call to the planner instead of running it: the planner checks it against the installed library
without launching anything. A launch whose output later calls consume passes ``planned_output=`` (zeros of
the output's shape, what the plan continues with); any other launch ends the property's plan
(:class:`PlanComplete`). So the property and the preflight build the call from the same code.
"""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch


@dataclass(frozen=True)
class KernelCall:
    """One library call as an adapter would make it: ``fn(*args, **kwargs)``, named ``name`` in reports."""

    name: str
    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SourceOnly:
    """A library function that does not import here (AITER's HIP modules need ROCm), known by its source.

    ``module``/``name``: where it is defined; ``reason``: why the import failed. Its signature is read from
    the installed file's syntax tree (defaults as source text), so a plan can still bind a call to it.
    """

    module: str
    name: str
    reason: str

    @property
    def __signature__(self) -> inspect.Signature:  # read by inspect.signature
        return source_signature(self.module, self.name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise ImportError(f"{self.module}.{self.name} does not import here: {self.reason}")


def module_file(module: str) -> Path:
    """The installed file of ``module`` (a dotted name), found without importing any of it."""
    top, *rest = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"package {top} is not installed")
    base = Path(next(iter(spec.submodule_search_locations))).joinpath(*rest)
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    raise ImportError(f"{module} has no source file under {base.parent}")


def source_signature(module: str, name: str) -> inspect.Signature:
    """The signature of the top-level function ``name`` in ``module``'s source (defaults as source text)."""
    tree = ast.parse(module_file(module).read_text())
    node = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == name), None
    )
    if node is None:
        raise ImportError(f"{module} defines no function {name}")
    a = node.args
    kind = inspect.Parameter
    positional = [*a.posonlyargs, *a.args]
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [
        kind(p.arg, kind.POSITIONAL_ONLY if p in a.posonlyargs else kind.POSITIONAL_OR_KEYWORD,
             default=kind.empty if d is None else ast.unparse(d))
        for p, d in zip(positional, defaults, strict=True)
    ]  # fmt: skip
    if a.vararg:
        params.append(kind(a.vararg.arg, kind.VAR_POSITIONAL))
    for p, d in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append(kind(p.arg, kind.KEYWORD_ONLY, default=kind.empty if d is None else ast.unparse(d)))
    if a.kwarg:
        params.append(kind(a.kwarg.arg, kind.VAR_KEYWORD))
    return inspect.Signature(params)


class PlanComplete(Exception):
    """Raised by :func:`launch` in a plan at a launch whose output is not needed further: the plan ends there."""


NOT_RUN = object()
"""What a planner returns for a call whose library code stopped before producing an output."""

Planner = Callable[[KernelCall], Any]

_planner: list[Planner] = []


@contextlib.contextmanager
def planning(planner: Planner) -> Iterator[None]:
    """Within the block, :func:`launch` gives each call to ``planner`` instead of running it."""
    _planner.append(planner)
    try:
        yield
    finally:
        _planner.pop()


def planned() -> bool:
    """Whether calls are being planned (hardware gates pass, nothing launches)."""
    return bool(_planner)


def kernel_device() -> torch.device:
    """Where kernel inputs go: the accelerator (``cuda``, also on ROCm); the CPU in a plan, so that the
    libraries' wrappers allocate real outputs and the adapters' code between two launches runs."""
    return torch.device("cpu") if planned() else torch.device("cuda")


def synchronize() -> None:
    """``torch.cuda.synchronize()`` after a launch (nothing in a plan)."""
    if not planned():
        torch.cuda.synchronize()


def launch(
    name: str, fn: Callable[..., Any], *args: Any, planned_output: Callable[[], Any] | None = None, **kwargs: Any
) -> Any:
    """``fn(*args, **kwargs)``; in a plan, the planner's check of that call, which returns the library's own
    output where its code ran to the end (launches intercepted), else ``planned_output()`` (zeros of the output a
    later call consumes) or :class:`PlanComplete` when no later call needs the output."""
    if not _planner:
        return fn(*args, **kwargs)
    out = _planner[-1](KernelCall(name, fn, args, kwargs))
    if out is not NOT_RUN:
        return out
    if planned_output is None:
        raise PlanComplete(name)
    return planned_output()
