"""Mutant subjects for measuring search power: plausible wrong rules that no ``@example`` pins.

Each is an external subject (``python -m bench --subject bench.mutants:NAME``) in the style of
the shipped known-bad ones, differing from the built-in policy on one thin residue class, so the
bench shows whether generation finds bugs nobody pinned.
"""

from __future__ import annotations

from backends.mxfp4_linear import ASM_FORCE_TRITON_SCALE_ROWS
from contracts.mxfp4_linear import CONTRACT as LINEAR
from contracts.shared_expert import CONTRACT as SHARED
from contracts.shared_expert import SharedExpertPlacement, SharedExpertSetup
from subjects.mxfp4_linear import BuiltinMxfp4Linear
from subjects.registry import Subject
from subjects.shared_expert import BuiltinSharedExpert, fse_resolved


class ColsMod4Guard(BuiltinMxfp4Linear):
    """The ASM guard reads ``cols % 4`` instead of ``cols % 8``: wrong on ``cols ≡ 4 (mod 8)`` only."""

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        if len(scale_shape) != 2:
            return False
        rows, cols = scale_shape
        return rows >= 32 and rows % 32 == 0 and cols % 4 == 0 and rows not in ASM_FORCE_TRITON_SCALE_ROWS


class SplitIgnoresGroups(BuiltinSharedExpert):
    """Shards a shared expert whenever ``tp`` divides ``I``, even when ``I/tp`` cuts a 32-element group."""

    def shared_expert_placement(self, setup: SharedExpertSetup) -> SharedExpertPlacement:
        if setup.intermediate > 0 and not fse_resolved(setup) and setup.intermediate % setup.tp == 0:
            return SharedExpertPlacement.SHARDED
        return super().shared_expert_placement(setup)


GUARD_COLS_MOD4 = Subject(
    "mutant-guard-cols-mod4", "ASM guard checks cols % 4 instead of cols % 8", {LINEAR: ColsMod4Guard()}
)
SPLIT_CUTS_GROUP = Subject(
    "mutant-split-cuts-group", "shared expert sharded although I/tp cuts a scale group", {SHARED: SplitIgnoresGroups()}
)
