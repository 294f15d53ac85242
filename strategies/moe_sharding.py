"""Hypothesis strategies for the ``moe_sharding`` contract: a checkpoint's global MoE layer and a TP x EP degree.

The intermediate size is the model's global one (catalogued models at TP ∈ {1, 2, 4, 8, 16}) or
adversarial: a whole number of groups, drawn so that even splits cut groups, ranks hold less
than one group, and the last ranks of a whole-block split are short or empty (2-4 groups per rank
make a short last non-empty rank likely; :func:`short_last_rank_groups` makes it certain, one draw of
the adversarial group counts in four). The hidden size (which the split does not touch) and the
expert count follow the example's :class:`~strategies.moe.Scale`, drawn first:

* ``REDUCED`` (half the examples): the hidden size reduced as in :mod:`strategies.moe` (adversarial:
  1-16 blocks of 32); ``E`` is 1-2 without EP and ``1 … min(2·ep_size, 12)`` with it, so ``E % ep != 0``
  (uneven blocks) and ``E < ep`` (EP ranks holding no expert) are both common.
* ``FULL_WIDTH`` (a quarter): the model's real hidden size (adversarial: a catalogued one), the same
  expert counts, where ``E·2·I·H`` fits :data:`~strategies.moe.WEIGHT_BUDGET` (else reduced).
* ``MANY_EXPERTS`` (a quarter): the model's real expert count (adversarial: a catalogued one), at
  least ``4·ep_size + 1`` where it has that many, so EP ranks hold more than 4 experts, capped by the
  budget; the hidden size is one 32-element block.

Expert parallelism: ``ep_size`` ∈ {1, 2, 4, 8, 16} with ``tp·ep_size <=`` :data:`MAX_RANKS`. Biases
(gpt-oss-style ``w13_bias`` / ``w2_bias``) are drawn on or off for MXFP4 (NVFP4 ModelOpt expert
checkpoints carry none: vLLM 0.33.0's ``ModelOptNvFp4FusedMoE.create_weights`` allocates no bias; block-FP8
ones neither: vLLM 0.33.0's ``pad_tp_shard_to_weight_blocks`` refuses expert biases). The group size is the
strategy's argument (128: block-FP8's 128x128 tiles, catalogued models whose intermediate size is whole tiles,
as that function requires) and the kernel backend whose layer loads the shard is the test's parameter (a
backend of the format: ``Nvfp4MoeBackend`` / ``Mxfp4MoeBackend`` / ``Fp8MoeBackend``, the ``nvfp4_moe`` /
``mxfp4_moe`` / ``fp8_moe`` contracts' backends), recorded in the configuration by
:meth:`ShardingConfig.for_backend`.

Shrinking: the scale goes to ``REDUCED``, TP and EP to 1, the layer to a catalogued model (the first by
name) or to one group, then the layout to stacked, ``E`` to 1 (5 with many experts), biases off,
``top_k`` to 1, tokens to 1 and the seed to 0: a failure that needs EP keeps the smallest ``ep_size`` and
``E`` that show it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from hypothesis import reject
from hypothesis import strategies as st

from backends.fp8_moe import Fp8MoeBackend
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from reference.fp8 import FP8_BLOCK
from reference.layouts import Fc1Layout
from reference.moe import Activation
from strategies.catalog import MODELS, TP_DEGREES
from strategies.config import Config
from strategies.moe import (
    ACTIVATIONS,
    EXPERT_COUNTS,
    REDUCED_EXPERTS,
    SCALES,
    WEIGHT_BUDGET,
    Scale,
    reduce_size,
    weight_elements,
)
from strategies.pins import current_pin

CHECKPOINT_LAYOUTS = (Fc1Layout.GATE_UP, Fc1Layout.GATE_UP_INTERLEAVED)
EP_DEGREES = (1, 2, 4, 8, 16)
MAX_RANKS = 16
"""Largest ``tp·ep`` drawn (two 8-GPU nodes): every rank's shard is built and its partial output computed."""
MAX_TOP_K = 4
MAX_EXPERTS = 12
"""Largest expert count of a ``REDUCED`` or ``FULL_WIDTH`` example: the checkpoint's bytes are generated for
every expert (``E·3·I·H/2``)."""
HIDDEN_SIZES = tuple(sorted({m.hidden for m in MODELS.values()}))
"""The catalogue's hidden sizes: those of an adversarial ``FULL_WIDTH`` layer."""


FORMAT_NAMES = {NVFP4_BLOCK: "NVFP4", MXFP4_BLOCK: "MXFP4", FP8_BLOCK: "block-FP8"}
"""The checkpoint format of each scale-group size (FP8: ``FP8_BLOCK x FP8_BLOCK`` tiles)."""


def format_backends(block: int) -> tuple[enum.Enum, ...]:
    """The kernel backends of the format with ``block``-element groups (the ``nvfp4_moe`` / ``mxfp4_moe`` /
    ``fp8_moe`` contracts' ``backends``)."""
    return {NVFP4_BLOCK: tuple(Nvfp4MoeBackend), MXFP4_BLOCK: tuple(Mxfp4MoeBackend), FP8_BLOCK: tuple(Fp8MoeBackend)}[
        block
    ]


@dataclass(frozen=True)
class ShardingConfig(Config):
    """A global MoE layer of ``model`` (``intermediate`` channels, all of them, ``experts`` experts) split
    over ``tp`` x ``ep_size`` ranks, loaded for kernel ``backend`` (an enum value of the block's format, the
    test's parameter: :meth:`for_backend`; None: the policy's default), with biases when ``bias``."""

    model: str
    tp: int
    intermediate: int
    hidden: int
    block: int
    layout: Fc1Layout
    activation: Activation
    experts: int
    top_k: int
    tokens: int
    seed: int
    ep_size: int = 1
    backend: str | None = None
    bias: bool = False

    @property
    def gated(self) -> bool:
        return self.activation.gated

    @property
    def expert_parallel(self) -> bool:
        """Whether experts are split over more than one EP rank (what ``--ep`` pins)."""
        return self.ep_size > 1

    @property
    def ranks(self) -> int:
        return self.tp * self.ep_size

    def for_backend(self, backend: enum.Enum) -> ShardingConfig:
        """The layer loaded for ``backend`` (a member of the block's format's enum)."""
        return replace(self, backend=backend.value)

    @property
    def layer_key(self) -> str:
        """The JSON of the drawn layer alone (``backend`` left out): every backend's test draws the same
        configurations, so values computed from the layer are shared by key across backends."""
        return replace(self, backend=None).to_json()

    @property
    def kernel_backend(self) -> enum.Enum | None:
        """``backend`` as its format's enum member."""
        return None if self.backend is None else type(format_backends(self.block)[0])(self.backend)

    def describe(self) -> str:
        return (
            f"{self.model} TP={self.tp} EP={self.ep_size}: global I={self.intermediate}, H={self.hidden}, "
            f"{FORMAT_NAMES[self.block]} ({self.block}-groups), "
            f"FC1 {self.layout.value}, {self.activation}, E={self.experts} top-{self.top_k} T={self.tokens}, "
            f"{'biases' if self.bias else 'no biases'}, backend {self.backend} seed={self.seed}"
        )


def short_last_rank_groups(tp: int) -> st.SearchStrategy[int]:
    """Group counts ``G`` whose whole-block split over ``tp`` ranks leaves the last rank short but not empty:
    ``G = (tp - 1)·q + s`` with ``q`` groups per full rank (2 ≤ ``q`` ≤ min(4, tp)) and ``s`` in
    ``[1, q - 1]``, so ``cdiv(G, tp) = q`` and the last rank holds ``s < q`` groups (the ranks where a
    loader's padding of a fused ``[gate; up]`` block lands at its end, vLLM #55649). ``tp = 1`` has no
    split: any of 1-4 groups. Shrinks to ``q = 2``, ``s = 1``."""
    if tp == 1:
        return st.integers(1, 4)
    return st.integers(2, min(4, tp)).flatmap(lambda q: st.integers(1, q - 1).map(lambda s: (tp - 1) * q + s))


@st.composite
def sharding_configs(draw: st.DrawFn, block: int) -> ShardingConfig:
    """A :class:`ShardingConfig` of ``block``-element groups, no backend yet (honours ``--model`` / ``--tp`` /
    ``--ep``; a pinned model whose intermediate size is not whole groups has no such checkpoint: rejected)."""
    pin = current_pin()
    scale = draw(st.sampled_from(SCALES))
    tp = pin.tp if pin.tp is not None else draw(st.sampled_from(TP_DEGREES))
    eps = [d for d in EP_DEGREES if tp * d <= MAX_RANKS and pin.ep in (None, d > 1)] or [1]
    ep = draw(st.sampled_from(eps))
    if pin.model is None and draw(st.booleans()):
        name, hidden = "adversarial", 32 * draw(st.integers(1, 16))
        # groups: up to two per rank (ranks smaller than a group, empty last ranks), 2-4 per rank (a
        # whole-block split whose last non-empty rank is often short), a short last rank for certain
        # (short_last_rank_groups), or any count up to 64
        groups = st.one_of(
            st.integers(1, 2 * tp), st.integers(tp + 1, 4 * tp), short_last_rank_groups(tp), st.integers(1, 64)
        )
        intermediate = block * draw(groups)
        activation = draw(st.sampled_from(ACTIVATIONS))
        real_hidden = draw(st.sampled_from(HIDDEN_SIZES)) if scale is Scale.FULL_WIDTH else hidden
        real_experts = draw(st.sampled_from(EXPERT_COUNTS)) if scale is Scale.MANY_EXPERTS else MAX_EXPERTS
    else:
        whole = sorted(n for n, m in MODELS.items() if m.moe_intermediate % block == 0)
        m = MODELS[pin.model or draw(st.sampled_from(whole))]
        if m.moe_intermediate % block:
            reject()
        name, hidden, intermediate, activation = m.name, reduce_size(m.hidden), m.moe_intermediate, m.activation
        real_hidden, real_experts = m.hidden, m.experts
    if scale is Scale.FULL_WIDTH and weight_elements(1, intermediate, real_hidden) <= WEIGHT_BUDGET:
        hidden = real_hidden
    elif scale is Scale.MANY_EXPERTS:
        hidden = 32
    fit = max(1, WEIGHT_BUDGET // weight_elements(1, intermediate, hidden))
    stacked_only = not activation.gated or block == FP8_BLOCK  # block-FP8 checkpoints store w1 and w3 apart
    layout = Fc1Layout.GATE_UP if stacked_only else draw(st.sampled_from(CHECKPOINT_LAYOUTS))
    if scale is Scale.MANY_EXPERTS:
        most = max(1, min(real_experts, fit))
        experts = draw(st.integers(min(REDUCED_EXPERTS * ep + 1, most), most))
    else:
        experts = draw(st.integers(1, min(2 * ep, MAX_EXPERTS, fit)))
    bias = block == MXFP4_BLOCK and draw(st.booleans())
    return ShardingConfig(
        model=name,
        tp=tp,
        intermediate=intermediate,
        hidden=hidden,
        block=block,
        layout=layout,
        activation=activation,
        experts=experts,
        top_k=draw(st.integers(1, min(experts, MAX_TOP_K))),
        tokens=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**16)),
        ep_size=ep,
        bias=bias,
    )


def pinned_sharding(
    model: str, tp: int, block: int = NVFP4_BLOCK, *, ep: int = 1, experts: int = 2, bias: bool = False
) -> ShardingConfig:
    """A catalogued model's layer at one TP x EP degree (for ``@example`` pins): stacked FC1 rows, top-2 of
    ``experts``, 3 tokens, seed 0, no backend yet (the test's parameter)."""
    m = MODELS[model]
    return ShardingConfig(
        m.name, tp, m.moe_intermediate, reduce_size(m.hidden), block, Fc1Layout.GATE_UP, m.activation, experts,
        2, 3, 0, ep_size=ep, bias=bias,
    )  # fmt: skip
