"""Mutant subjects for measuring search power: plausible wrong rules that no ``@example`` pins.

Each is an external subject (``python -m bench --subject bench.mutants:NAME``) in the style of
the shipped known-bad ones, differing from the built-in policy on one thin residue class or on the
layers of real size only, so the bench shows whether generation finds bugs nobody pinned. The ones in
:data:`CI_MUTANTS` are measured by every ``python -m bench`` run, and ``--quick`` fails unless
generation alone catches them.
"""

from __future__ import annotations

from collections.abc import Callable

from backends.mxfp4_linear import ASM_FORCE_TRITON_SCALE_ROWS
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.moe import MXFP4_MOE, NVFP4_MOE, AlignedMoe, MoeWeights, pad_moe
from contracts.moe_sharding import CONTRACT as SHARDING
from contracts.moe_sharding import RankShard
from contracts.mxfp4_linear import CONTRACT as LINEAR
from contracts.shared_expert import CONTRACT as SHARED
from contracts.shared_expert import SharedExpertPlacement, SharedExpertSetup
from subjects.moe_sharding import BuiltinMoeSharding, split_sizes, take_channels
from subjects.mxfp4_linear import BuiltinMxfp4Linear
from subjects.mxfp4_moe import BuiltinMxfp4MoeAlignment
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment
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


LARGE = 512
"""Above this hidden or intermediate size a layer is "large": every catalogued model's hidden size is."""
FEW_EXPERTS = 4
"""A rank holding more experts than this holds "many"."""
Skip = Callable[[MoeWeights], bool]


def large(weights: MoeWeights) -> bool:
    """Whether the hidden or the intermediate size of ``weights`` is above :data:`LARGE`."""
    return weights.hidden_size > LARGE or weights.intermediate_size > LARGE


def many_experts(weights: MoeWeights) -> bool:
    """Whether ``weights`` hold more than :data:`FEW_EXPERTS` experts."""
    return weights.w13.shape[0] > FEW_EXPERTS


class Nvfp4SkipsPadding(BuiltinNvfp4MoeAlignment):
    """The built-in NVFP4 policy, except that a layer ``skip`` names is handed over at its own sizes, unpadded."""

    def __init__(self, skip: Skip) -> None:
        self.skip = skip

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if self.skip(weights):
            return pad_moe(weights, gated, weights.intermediate_size, weights.hidden_size)
        return super().align_moe(backend, weights, gated)


class Mxfp4SkipsPadding(BuiltinMxfp4MoeAlignment):
    """The built-in MXFP4 policy (FC1 rows still reordered), except that a layer ``skip`` names keeps its sizes."""

    def __init__(self, skip: Skip) -> None:
        self.skip = skip

    def sizes(self, backend: Mxfp4MoeBackend, weights: MoeWeights) -> tuple[int, int]:
        if self.skip(weights):
            return weights.intermediate_size, weights.hidden_size
        return super().sizes(backend, weights)


class ShardingSkipsPadding(BuiltinMoeSharding):
    """The built-in sharding, except that on an EP rank whose experts ``skip`` names each TP rank's buffer is
    its own real channels: a short rank of a whole-block split is not padded to the shared buffer."""

    def __init__(self, skip: Skip) -> None:
        self.skip = skip

    def split_channels(
        self, weights: MoeWeights, gated: bool, tp: int, experts: tuple[int, ...]
    ) -> tuple[RankShard, ...]:
        if not self.skip(weights):
            return super().split_channels(weights, gated, tp, experts)
        sizes = split_sizes(weights.intermediate_size, tp, weights.block)
        offsets = [sum(sizes[:r]) for r in range(tp)]
        return tuple(
            RankShard(take_channels(weights, gated, o, n, n, r), o, n, experts)
            for r, (o, n) in enumerate(zip(offsets, sizes, strict=True))
        )


def skips_padding(skip: Skip) -> dict[str, object]:
    """The three MoE contracts' policies that skip padding where ``skip`` says."""
    return {
        NVFP4_MOE: Nvfp4SkipsPadding(skip),
        MXFP4_MOE: Mxfp4SkipsPadding(skip),
        SHARDING: ShardingSkipsPadding(skip),
    }


LARGE_ONLY = Subject(
    "mutant-large-only",
    f"MoE padding skipped when H or I > {LARGE} (every real model's size), kept for small test layers",
    skips_padding(large),
)
MANY_EXPERTS = Subject(
    "mutant-many-experts",
    f"MoE padding skipped when a rank holds more than {FEW_EXPERTS} experts (every real model's rank)",
    skips_padding(many_experts),
)
CI_MUTANTS = (LARGE_ONLY, MANY_EXPERTS)
"""Mutants every bench run measures and ``--quick`` requires generation alone to catch."""
