"""What every MoE backend record declares, whatever the weight format (``nvfp4_moe``, ``mxfp4_moe``).

The generic MoE properties (:mod:`conformance.moe_properties`) read only these fields, so a new format's
records subclass :class:`MoeBackendRecord` and add what is particular to them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

from backends import BackendRecord
from reference.layouts import Fc1Layout

Violations = Callable[[int, int, bool, int], list[str]]
"""``violations(Ip, Hp, gated, experts)``: why a backend rejects experts padded to ``(Ip, Hp)`` (empty: accepted)."""


@dataclass(frozen=True, kw_only=True)
class MoeBackendRecord(BackendRecord):
    """A MoE backend.

    ``fc1_layout``: how the kernel reads fused FC1 rows. ``intermediate_multiple`` (gated; per half) and
    ``hidden_multiple``: what the built-in policy rounds ``(I, H)`` to. ``violations``: the acceptance rules,
    one signature for every format (:data:`Violations`; a rule that needs neither ``gated`` nor ``experts``
    ignores them). ``prepare``: the library's weight preparation after the policy (``None`` where none is
    modelled); ``kernel``: the runner of the real kernel (``None``: no kernel property).

    The multiples (what the built-in policy pads to) and ``violations`` (the oracle) are deliberately two
    statements of the backend's rule: ``check_minimal_and_idempotent`` fails if they disagree.
    """

    fc1_layout: Fc1Layout
    intermediate_multiple: int
    hidden_multiple: int
    violations: Violations
    prepare: Callable[..., Any] | None = None
    kernel: Callable[..., Any] | None = None

    OPTIONAL: ClassVar[frozenset[str]] = BackendRecord.OPTIONAL | {"prepare", "kernel"}
