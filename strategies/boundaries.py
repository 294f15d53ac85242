"""Sizes aimed at the residues that alignment and guard rules read, from both sides of each boundary.

Every rule the suite checks reads a size modulo a few numbers: FlashInfer's NVFP4 MoE preparation
wants a gated intermediate size % 64 (non-gated % 128) and a hidden size % 256 (TRT-LLM) or % 16
(CUTLASS); the MXFP4 MoE backends round to 64, 128 or 256 (both from the backend records,
:mod:`backends`); AITER's unpadded ASM scale swizzle needs scale rows % 32 and columns % 8, and
vLLM sends 96-row scales to Triton (``backends.mxfp4_linear``); a shared
expert's even split keeps whole 32-element groups only when ``I % (32·tp) == 0``. A size drawn
uniformly lands in the residue class where a wrong rule differs from the right one rarely (a
guard reading ``cols % 4`` instead of ``cols % 8`` differs on ``cols ≡ 4 (mod 8)`` only), so the
strategies here draw sizes *at* a multiple of a rule's modulus, one step *below* and *above* it,
and *half* a modulus away.

:data:`RULE_MODULI` is the one table of moduli per rule the strategies aim at (the generic
powers of two 8..256 and each rule's own).
"""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

from backends import records
from backends.mxfp4_linear import ASM_FORCE_TRITON_SCALE_ROWS
from reference.formats import MXFP4_BLOCK

GENERIC_MODULI = (8, 16, 32, 64, 128, 256)
"""Powers of two that alignment rules of FP4 kernels read (tile, swizzle and vector widths)."""


def _record_multiples(contract: str, *fields: str) -> tuple[int, ...]:
    values = {getattr(r, f, None) for r in records(contract) for f in fields}
    return tuple(sorted(v for v in values if v is not None))


RULE_MODULI: dict[str, tuple[int, ...]] = {
    "nvfp4_moe.intermediate": _record_multiples(
        "nvfp4_moe", "intermediate_multiple", "intermediate_multiple_non_gated"
    ),
    "nvfp4_moe.hidden": _record_multiples("nvfp4_moe", "hidden_multiple", "hidden_multiple_non_gated"),
    "mxfp4_moe.intermediate": _record_multiples("mxfp4_moe", "intermediate_multiple"),
    "mxfp4_moe.hidden": _record_multiples("mxfp4_moe", "hidden_multiple"),
    "fp8_moe.intermediate": _record_multiples("fp8_moe", "intermediate_multiple"),
    "fp8_moe.hidden": _record_multiples("fp8_moe", "hidden_multiple"),
    "fp8_tensor_moe.intermediate": _record_multiples("fp8_tensor_moe", "intermediate_multiple"),
    "fp8_tensor_moe.hidden": _record_multiples("fp8_tensor_moe", "hidden_multiple"),
    # reference.layouts.asm_scale_swizzle_ok: the unpadded ASM scale view needs rows % 32, cols % 8
    "mxfp4_linear.scale_rows": (32,),
    "mxfp4_linear.scale_cols": (8,),
    # a shared expert's split keeps whole OCP-MX groups when I % (32·tp) == 0 (times tp at draw time)
    "shared_expert.intermediate": (MXFP4_BLOCK,),
}
"""Each rule's own moduli, keyed ``contract.size``: the MoE backends' multiples from their records
(:mod:`backends`), the ASM swizzle's and the shared-expert split's; strategies add :data:`GENERIC_MODULI`."""

SPECIAL_SIZES: dict[str, tuple[int, ...]] = {
    "mxfp4_linear.scale_rows": tuple(sorted(ASM_FORCE_TRITON_SCALE_ROWS)),
}
"""Sizes a rule singles out (not residues): drawn as they are."""

WHERE = ("at", "below", "above", "half")
"""Where a drawn size lies relative to ``k·m``: on it, one unit below or above, or ``m/2`` past it."""

SIDES = ("at", "half", "below", "half", "above")
""":data:`WHERE` as drawn: half-way twice as often as each other side. ``k·m + m/2`` is the residue
class where a rule reading ``m`` and one reading ``m/2`` disagree (a guard checking ``cols % 4``
for ``% 8``, a padding to 64 for 128: the commonest wrong rule among the known-bad subjects), while
on / one off the boundary only separate ``m`` from its multiples and from any rule at all."""

GUARD_SIDES = ("at", "half", "below", "half", "above", "half")
""":data:`WHERE` as a divisibility guard's own divisor is drawn: half-way one time in two. A guard
``x % m == 0`` and a weaker one ``x % d == 0`` (``d`` a proper divisor of ``m``) disagree on the multiples of
``d`` that ``m`` does not divide; the half-way class ``k·m + m/2`` is one of them for every ``d``, one off
a multiple (``k·m ± 1``) only for ``d = 1`` (no check at all)."""


def moduli_for(rule: str, *, unit: int = 1, scale: int = 1) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(rule's own moduli times scale, generic moduli)`` that are multiples of ``unit``."""
    own = tuple(sorted({m * scale for m in RULE_MODULI[rule] if m * scale % unit == 0}))
    generic = tuple(m for m in GENERIC_MODULI if m % unit == 0 and m not in own)
    return own, generic


def straddle(unit: int, m: int, k: int, where: str) -> int:
    """``k·m`` moved ``where`` (:data:`WHERE`) by whole ``unit`` s, never below ``unit``."""
    offset = {"at": 0, "below": -unit, "above": unit, "half": m // 2 // unit * unit}[where]
    return max(unit, k * m + offset)


def boundary_sizes(
    *,
    unit: int,
    moduli: tuple[Sequence[int], Sequence[int]],
    max_multiple: int = 4,
    special: Sequence[int] = (),
    sides: Sequence[str] = SIDES,
) -> st.SearchStrategy[int]:
    """Positive multiples of ``unit`` on, next to and half-way between multiples of a modulus.

    ``moduli`` is ``(rule's own, generic)`` (:func:`moduli_for`); a modulus ``m`` is drawn from
    the rule's own half of the time, so each rule's boundary is hit often. With a multiple ``k``
    in ``[1, max_multiple]`` and a side in :data:`WHERE` (drawn from ``sides``, by default :data:`SIDES`:
    half-way two times in five) the size is :func:`straddle` of them;
    ``special`` sizes are drawn as they are. Shrinks to the rule's smallest modulus, ``k = 1``
    and the size on the boundary (``m`` itself), then to the nearest side that still fails: a
    counterexample reads as "one unit below 2·128".
    """
    own, generic = (tuple(sorted(ms)) for ms in moduli)
    if unit < 1 or max_multiple < 1 or not (own or generic) or any(m % unit for m in own + generic):
        raise ValueError(f"boundary_sizes: unit {unit}, moduli {own + generic} must be positive multiples of unit")
    modulus = st.one_of(*(st.sampled_from(ms) for ms in (own, generic) if ms))
    sizes = st.builds(straddle, st.just(unit), modulus, st.integers(1, max_multiple), st.sampled_from(tuple(sides)))
    return st.one_of(sizes, st.sampled_from(tuple(special))) if special else sizes
