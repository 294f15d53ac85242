"""One record per kernel backend, in the spirit of PyTorch's OpInfo: everything the suite knows about it.

A backend is a member of its contract's enum (``backends.nvfp4_moe.Nvfp4MoeBackend``,
``backends.mxfp4_moe.Mxfp4MoeBackend``, ``backends.mxfp4_linear.AiterLinearPath``), declared next to
its :class:`BackendRecord` in the contract's module here. The record holds the facts that used to be
spread over subjects, oracles, test modules and the plugin: the pytest markers its properties need,
the FC1 row order its kernel reads, its acceptance rules, its weight preparation, its kernel runner and
tolerance, and the sources of those rules. The plugin parametrizes ``backend`` from the records (with
their markers) and ``--backend`` selects among them; properties and the built-in policies look facts up
in the record instead of branching on the member.

Adding a backend: an enum member and its record in the contract's module here, its library adapter in
:mod:`adapters`, and its engine mapping (for example :mod:`subjects.vllm.bridge`); ``tests/test_backends.py``
checks that every member has a complete record.
"""

from __future__ import annotations

import enum
import importlib
from dataclasses import dataclass, fields
from typing import ClassVar

RECORD_MODULES = (
    "backends.nvfp4_moe",
    "backends.mxfp4_moe",
    "backends.mxfp4_linear",
    "backends.fp8_moe",
    "backends.fp8_tensor_moe",
    "backends.mxfp8_linear",
)
"""The modules declaring backend enums and their records (imported on first lookup)."""


@dataclass(frozen=True, kw_only=True)
class BackendRecord:
    """What every backend declares.

    ``member``: the enum member (its value is the ``--backend`` name and the test id);
    ``contract``: the contract whose properties run against it; ``entry_point``: the library function
    its weights are prepared for; ``requires``: markers every property of the backend needs (libraries
    whose helpers decide acceptance); ``kernel_requires``: markers its kernel properties need (the
    hardware and library that run the kernel; empty when the suite runs no kernel for it);
    ``sources``: where its rules come from (upstream files, issues, PRs), named in skip reasons.
    """

    member: enum.Enum
    contract: str
    entry_point: str
    requires: tuple[str, ...] = ()
    kernel_requires: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()

    OPTIONAL: ClassVar[frozenset[str]] = frozenset({"requires", "kernel_requires"})
    """Fields a complete record may leave empty (subclasses extend it)."""

    @property
    def name(self) -> str:
        return self.member.value

    def missing_fields(self) -> list[str]:
        """Fields left empty (``None``, ``""`` or ``()``), except those a record may leave empty by design."""
        return [f.name for f in fields(self) if f.name not in self.OPTIONAL and getattr(self, f.name) in (None, "", ())]


_RECORDS: dict[enum.Enum, BackendRecord] = {}


def register(*records: BackendRecord) -> None:
    """Add ``records`` (called by each record module at import time)."""
    for r in records:
        _RECORDS[r.member] = r


def _load() -> None:
    for module in RECORD_MODULES:
        importlib.import_module(module)


def record(member: enum.Enum) -> BackendRecord:
    """The record of ``member``; ``KeyError`` naming the member if it has none."""
    _load()
    try:
        return _RECORDS[member]
    except KeyError:
        raise KeyError(f"backend {member!r} has no record in {RECORD_MODULES}") from None


def records(contract: str | None = None) -> tuple[BackendRecord, ...]:
    """Every record (of ``contract``), in declaration order."""
    _load()
    return tuple(r for r in _RECORDS.values() if contract is None or r.contract == contract)


def enums() -> tuple[type[enum.Enum], ...]:
    """The backend enums the record modules define (found independently of the records)."""
    found = []
    for name in RECORD_MODULES:
        module = importlib.import_module(name)
        found += [
            v
            for v in vars(module).values()
            if isinstance(v, type) and issubclass(v, enum.Enum) and v.__module__ == name
        ]
    return tuple(found)
