"""Hypothesis strategies for MoE layer shapes of one tensor-parallel rank.

Shapes come from the model catalogue at every TP degree (with or without expert parallelism)
or are adversarial: rank-local sizes that are multiples of the quantization group but not of
64/128/256. Loaders' sharding is followed: an even split where it keeps whole groups, otherwise
a whole-block split where the last ranks hold fewer real channels than their buffer.

Each example is drawn at one :class:`Scale` (drawn first, so shrinking lands on ``REDUCED``):

* ``REDUCED`` (half the examples): every size above 512 loses a multiple of 256, which keeps its
  residue modulo 256 (the largest alignment any backend asks for) and the length of a short
  rank's zero tail, so a CPU example runs in milliseconds; 1-4 experts.
* ``FULL_WIDTH`` (a quarter): the rank's real hidden and intermediate sizes, 1-2 experts; a rank
  whose layer exceeds :data:`WEIGHT_BUDGET` (DeepSeek-V3 at TP=1, say) keeps its real hidden size
  and a reduced intermediate size (:func:`rank_widths`).
* ``MANY_EXPERTS`` (a quarter): the rank's real local expert count (the model's ``E``, or
  ``cdiv(E, tp)`` under expert parallelism) at small width: sizes reduced to at most 256 (the
  residue modulo 256 kept), the count capped by :data:`WEIGHT_BUDGET`; it shrinks to 5 experts.

A policy therefore sees real model sizes (H, I > 512) and more than 4 local experts, while the
tensors of every example stay within :data:`WEIGHT_BUDGET` FP4 elements.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from hypothesis import strategies as st

from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from reference.moe import Activation
from reference.sizes import whole_block_split
from strategies.boundaries import boundary_sizes, moduli_for
from strategies.catalog import GEGLU, GPT_OSS, MODELS, RELU2, SWIGLU, TP_DEGREES, Loader, ModelShape
from strategies.config import Config
from strategies.pins import current_pin

ACTIVATIONS = (SWIGLU, GEGLU, GPT_OSS, RELU2)
REDUCE_ABOVE = 512
REDUCE_STEP = 256
SMALL_WIDTH = 256
"""Sizes of a ``MANY_EXPERTS`` example are reduced to at most this (their residue modulo 256 kept)."""
REDUCED_EXPERTS = 4
"""Most experts of a ``REDUCED`` example; a ``MANY_EXPERTS`` one holds more."""
WEIGHT_BUDGET = 2**23
"""Most FC1 weight elements ``E·F·I·H`` an example builds (8 Mi: 4 MiB of packed FP4 codes, FC2 as many
again for ``F = 1``, half when gated); dequantized, 32 MiB of fp32 per tensor, a fraction of a second."""


class Scale(enum.Enum):
    """Which sizes an example hands the policy (module docstring)."""

    REDUCED = "reduced"
    FULL_WIDTH = "full-width"
    MANY_EXPERTS = "many-experts"


SCALES = (Scale.REDUCED, Scale.REDUCED, Scale.FULL_WIDTH, Scale.MANY_EXPERTS)
"""Drawn with ``sampled_from``: half the examples reduced, a quarter each at full width and with many experts."""


class Sharding(enum.Enum):
    EVEN = "even"  # size / tp per rank (NVFP4 ModelOpt loaders)
    WHOLE_BLOCK = "whole-block"  # cdiv(blocks, tp) whole blocks per rank (gpt-oss loader)
    NONE = "none"  # expert parallelism: every rank holds whole experts


@dataclass(frozen=True)
class MoeShape(Config):
    """One rank's MoE layer: ``intermediate`` is its buffer, ``real_intermediate`` its real channels."""

    model: str
    tp: int
    ep: bool
    rank: int
    sharding: Sharding
    intermediate: int
    real_intermediate: int
    hidden: int
    model_hidden: int
    activation: Activation
    experts: int
    top_k: int
    tokens: int
    seed: int

    @property
    def gated(self) -> bool:
        return self.activation.gated

    def describe(self) -> str:
        tail = "" if self.real_intermediate == self.intermediate else f" (real {self.real_intermediate})"
        return (
            f"{self.model} TP={self.tp}{' EP' if self.ep else ''} rank {self.rank} [{self.sharding.value}]: "
            f"I={self.intermediate}{tail}, H={self.hidden} (model {self.model_hidden}), {self.activation}, "
            f"E={self.experts} top-{self.top_k} T={self.tokens} seed={self.seed}"
        )


def reduce_size(size: int, above: int = REDUCE_ABOVE) -> int:
    """Subtract the multiple of 256 that brings ``size`` to at most ``above`` (residue mod 256 kept)."""
    return size - max(0, -(-(size - above) // REDUCE_STEP)) * REDUCE_STEP


def local_experts(m: ModelShape, tp: int, ep: bool) -> int:
    """Experts one rank of model ``m`` holds: all ``E`` of them, or ``cdiv(E, tp)`` under expert parallelism
    (the EP group is the TP group: vLLM's ``ep_size = tp_size·dp_size`` at ``dp_size = 1``)."""
    return -(-m.experts // tp) if ep else m.experts


def weight_elements(experts: int, intermediate: int, hidden: int) -> int:
    """FC1 weight elements ``E·2·I·H`` of a gated layer (an upper bound for a non-gated one)."""
    return experts * 2 * intermediate * hidden


def rank_local(global_size: int, tp: int, ep: bool, group: int, whole_block: bool) -> tuple[Sharding, tuple[int, ...]]:
    """Per-rank real channel counts and the sharding that produced them.

    Expert parallelism keeps whole experts; otherwise an even split when it keeps whole
    ``group``-element blocks (and the loader is not a whole-block one), else a whole-block split.
    """
    if ep or tp == 1:
        return Sharding.NONE, (global_size,) * tp
    part, rem = divmod(global_size, tp)
    if not whole_block and rem == 0 and part % group == 0:
        return Sharding.EVEN, (part,) * tp
    return Sharding.WHOLE_BLOCK, whole_block_split(global_size, tp, group)


@st.composite
def _catalog_layer(draw: st.DrawFn) -> tuple[ModelShape, int, bool]:
    pin = current_pin()
    names = [pin.model] if pin.model else sorted(MODELS)
    m = MODELS[draw(st.sampled_from(names))]
    tp = pin.tp if pin.tp is not None else draw(st.sampled_from(TP_DEGREES))
    ep = pin.ep if pin.ep is not None else draw(st.booleans())
    return m, tp, ep


HIDDEN_UNIT = 32
"""Adversarial hidden sizes are whole 32-element MXFP4 blocks (and so whole NVFP4 blocks)."""
CONTRACT_OF_GROUP = {NVFP4_BLOCK: "nvfp4_moe", MXFP4_BLOCK: "mxfp4_moe"}


@functools.cache
def adversarial_sizes(group: int, contract: str | None = None) -> st.SearchStrategy[tuple[int, int]]:
    """``(local intermediate, hidden)`` of an adversarial rank, aimed at the backends' rules.

    Each size is either on / next to / half-way between multiples of the rules' moduli
    (:func:`strategies.boundaries.boundary_sizes`, whole ``group``-element blocks for the
    intermediate size, whole 32-element blocks for the hidden size) or any whole number of blocks.
    Shrinks to ``(group, 32)``'s neighbourhood: the smallest modulus, on its boundary.
    """
    contract = contract or CONTRACT_OF_GROUP[group]
    intermediate = st.one_of(
        boundary_sizes(unit=group, moduli=moduli_for(f"{contract}.intermediate", unit=group)),
        st.integers(1, 32).map(lambda a: group * a),
    )
    hidden = st.one_of(
        boundary_sizes(unit=HIDDEN_UNIT, moduli=moduli_for(f"{contract}.hidden", unit=HIDDEN_UNIT)),
        st.integers(1, 96).map(lambda a: HIDDEN_UNIT * a),
    )
    return st.tuples(intermediate, hidden)


EXPERT_COUNTS = tuple(sorted({m.experts for m in MODELS.values()}))
"""The catalogue's routed-expert counts: those of an adversarial ``MANY_EXPERTS`` layer."""


def scaled(size: int, scale: Scale) -> int:
    """``size`` as an example of ``scale`` holds it: reduced to at most 512 or 256 (:func:`reduce_size`), or whole."""
    if scale is Scale.FULL_WIDTH:
        return size
    return reduce_size(size, SMALL_WIDTH if scale is Scale.MANY_EXPERTS else REDUCE_ABOVE)


def rank_widths(intermediate: int, hidden: int, scale: Scale) -> tuple[int, int]:
    """``(I, H)`` of an example of ``scale`` for a rank's real ``(intermediate, hidden)`` (:func:`scaled`); at
    ``FULL_WIDTH``, a rank whose ``2·I·H`` exceeds :data:`WEIGHT_BUDGET` (DeepSeek-V3 at TP=1, say) keeps its
    real hidden size and a reduced intermediate size (every catalogued hidden size fits with ``I <= 512``)."""
    if scale is Scale.FULL_WIDTH and weight_elements(1, intermediate, hidden) > WEIGHT_BUDGET:
        return reduce_size(intermediate), hidden
    return scaled(intermediate, scale), scaled(hidden, scale)


@st.composite
def moe_shapes(
    draw: st.DrawFn,
    group: int = 16,
    activations: tuple[Activation, ...] = ACTIVATIONS,
    contract: str | None = None,
) -> MoeShape:
    """A :class:`MoeShape` for quantization group ``group`` (16 NVFP4, 32 MXFP4; the unit ranks are split and
    adversarial sizes drawn in), aimed at ``contract``'s rules (default: the group's FP4 contract): a
    catalogued model's rank or an adversarial one (:func:`adversarial_sizes`), at a drawn :class:`Scale`. Shrinks to the
    reduced adversarial TP=1 rank; a failure that needs real sizes keeps them, one that needs many
    experts shrinks to 5."""
    pin = current_pin()
    scale = draw(st.sampled_from(SCALES))
    adversarial = pin.model is None and draw(st.booleans())
    if adversarial:
        tp = pin.tp if pin.tp is not None else draw(st.sampled_from(TP_DEGREES))
        ep = bool(pin.ep)
        local, hidden = draw(adversarial_sizes(group, contract))
        experts = draw(st.sampled_from(EXPERT_COUNTS)) if scale is Scale.MANY_EXPERTS else 8
        m = ModelShape("adversarial", hidden, local * tp, 0, experts, 8, SWIGLU)
        activation = draw(st.sampled_from(activations))
    else:
        m, tp, ep = draw(_catalog_layer())
        activation = m.activation if m.activation in activations else draw(st.sampled_from(activations))
    _, per_rank = rank_local(m.moe_intermediate, tp, ep, group, whole_block=m.loader is Loader.WHOLE_BLOCK)
    rank = draw(st.sampled_from([r for r, n in enumerate(per_rank) if n > 0]))
    fit = max(1, WEIGHT_BUDGET // weight_elements(1, *rank_widths(per_rank[0], m.hidden, scale)))
    if scale is Scale.MANY_EXPERTS:
        most = max(1, min(local_experts(m, tp, ep), fit))
        experts = draw(st.integers(min(REDUCED_EXPERTS + 1, most), most))
    else:
        experts = draw(st.integers(1, min(REDUCED_EXPERTS if scale is Scale.REDUCED else 2, fit)))
    return layer_shape(
        m,
        tp,
        ep,
        rank,
        group,
        activation,
        experts=experts,
        top_k=draw(st.integers(1, min(experts, m.top_k, 2))),
        tokens=draw(st.integers(1, 6)),
        seed=draw(st.integers(0, 2**16)),
        scale=scale,
    )


def layer_shape(
    m: ModelShape,
    tp: int,
    ep: bool,
    rank: int,
    group: int,
    activation: Activation,
    experts: int,
    top_k: int,
    tokens: int,
    seed: int,
    scale: Scale = Scale.REDUCED,
) -> MoeShape:
    """Rank ``rank``'s :class:`MoeShape` of model ``m``, sizes as ``scale`` holds them (:func:`rank_widths`)."""
    sharding, per_rank = rank_local(m.moe_intermediate, tp, ep, group, whole_block=m.loader is Loader.WHOLE_BLOCK)
    buffer, real = per_rank[0], per_rank[rank]
    reduced, hidden = rank_widths(buffer, m.hidden, scale)
    return MoeShape(
        model=m.name,
        tp=tp,
        ep=ep,
        rank=rank,
        sharding=sharding,
        intermediate=reduced,
        real_intermediate=max(group, reduced - (buffer - real)) if real < buffer else reduced,
        hidden=hidden,
        model_hidden=m.hidden,
        activation=activation,
        experts=experts,
        top_k=top_k,
        tokens=tokens,
        seed=seed,
    )


def pinned_shape(model: str, tp: int, *, ep: bool = False, rank: int = 0, group: int = 16, seed: int = 0) -> MoeShape:
    """The :class:`MoeShape` of a catalogued model at one TP degree (for ``@example`` pins)."""
    m = MODELS[model]
    return layer_shape(m, tp, ep, rank, group, m.activation, experts=2, top_k=min(2, m.top_k), tokens=3, seed=seed)
