"""The project's layers and what each may import: the table CONTRIBUTING.md shows, as data.

A module belongs to the layer named by its first path component (``reference/formats.py``: ``reference``;
the top-level ``conftest.py``: ``conftest``). A module may import modules of its own layer and of the layers
listed for it, never others; imports between modules form no cycle. ``tests/test_layers.py`` parses every
module's imports (``ast``, nothing is imported) and fails on a violation of either rule.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Layer:
    """A folder of the project: ``holds`` says what is in it, ``imports`` the layers its modules may import."""

    holds: str
    imports: tuple[str, ...]


_CODE = ("reference", "contracts", "adapters", "backends", "strategies", "subjects", "harness")

LAYERS: dict[str, Layer] = {
    "reference": Layer("pure torch from the format specs (imports nothing of the project)", ()),
    "contracts": Layer("vocabulary: weights, protocols, errors", ("reference",)),
    "adapters": Layer("calls into FlashInfer, AITER, vLLM, triton_kernels", ("reference", "contracts")),
    "backends": Layer("one record per kernel backend", ("reference", "contracts", "adapters")),
    "strategies": Layer("Hypothesis strategies, model catalogue", ("reference", "contracts", "backends")),
    "subjects": Layer(
        "policies: built-in, known-bad, engines", ("reference", "contracts", "adapters", "backends", "strategies")
    ),
    "harness": Layer(
        "pytest plugin, runner, reproductions",
        ("reference", "contracts", "adapters", "backends", "strategies", "subjects"),
    ),
    "conformance": Layer("the properties", _CODE),
    "bench": Layer("detection power, scaling, kernel truth tables", (*_CODE, "conformance")),
    "tests": Layer("the project's own tests", (*_CODE, "conformance", "bench")),
    "scripts": Layer("standalone reproductions and build helpers", (*_CODE, "conformance")),
    "conftest": Layer("the root pytest configuration (loads the harness plugins)", ("harness",)),
}
"""Every layer, lowest first; a layer imports only layers above it in this table."""
