"""Hypothesis strategies for the ``moe_sharding`` contract: a checkpoint's global MoE layer and a TP degree.

The intermediate size is the model's global one (catalogued models at TP ∈ {1, 2, 4, 8, 16}) or
adversarial: a whole number of groups, drawn so that even splits cut groups, ranks hold less
than one group, and the last ranks of a whole-block split are short or empty (2-4 groups per rank
make a short last non-empty rank likely). The hidden size
is reduced as in :mod:`strategies.moe` (the split does not touch it). The scale group is 16
(NVFP4) or 32 (MXFP4); the checkpoint's FC1 rows are stacked ``[gate; up]`` or row-interleaved.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.moe import Activation
from strategies.catalog import MODELS, TP_DEGREES
from strategies.config import Config
from strategies.moe import ACTIVATIONS, reduce_size
from strategies.pins import current_pin

CHECKPOINT_LAYOUTS = (Fc1Layout.GATE_UP, Fc1Layout.GATE_UP_INTERLEAVED)


@dataclass(frozen=True)
class ShardingConfig(Config):
    """A global MoE layer of ``model`` (``intermediate`` channels, all of them) split ``tp`` ways."""

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

    @property
    def gated(self) -> bool:
        return self.activation.gated

    def describe(self) -> str:
        fmt = "NVFP4" if self.block == NVFP4_BLOCK else "MXFP4"
        return (
            f"{self.model} TP={self.tp}: global I={self.intermediate}, H={self.hidden}, {fmt} ({self.block}-groups), "
            f"FC1 {self.layout.value}, {self.activation}, E={self.experts} top-{self.top_k} T={self.tokens} "
            f"seed={self.seed}"
        )


@st.composite
def sharding_configs(draw: st.DrawFn) -> ShardingConfig:
    """A :class:`ShardingConfig` (honours ``--model`` / ``--tp``)."""
    pin = current_pin()
    block = draw(st.sampled_from((NVFP4_BLOCK, MXFP4_BLOCK)))
    tp = pin.tp if pin.tp is not None else draw(st.sampled_from(TP_DEGREES))
    if pin.model is None and draw(st.booleans()):
        name, hidden = "adversarial", 32 * draw(st.integers(1, 16))
        # groups: up to two per rank (ranks smaller than a group, empty last ranks), 2-4 per rank (a
        # whole-block split whose last non-empty rank is short), or any count up to 64
        groups = st.one_of(st.integers(1, 2 * tp), st.integers(tp + 1, 4 * tp), st.integers(1, 64))
        intermediate = block * draw(groups)
        activation = draw(st.sampled_from(ACTIVATIONS))
    else:
        m = MODELS[pin.model or draw(st.sampled_from(sorted(MODELS)))]
        name, hidden, intermediate, activation = m.name, reduce_size(m.hidden), m.moe_intermediate, m.activation
        if intermediate % block:
            block = NVFP4_BLOCK
    layout = draw(st.sampled_from(CHECKPOINT_LAYOUTS)) if activation.gated else Fc1Layout.GATE_UP
    experts = draw(st.integers(1, 2))
    return ShardingConfig(
        model=name,
        tp=tp,
        intermediate=intermediate,
        hidden=hidden,
        block=block,
        layout=layout,
        activation=activation,
        experts=experts,
        top_k=draw(st.integers(1, experts)),
        tokens=draw(st.integers(1, 4)),
        seed=draw(st.integers(0, 2**16)),
    )


def pinned_sharding(model: str, tp: int, block: int = NVFP4_BLOCK) -> ShardingConfig:
    """A catalogued model's layer at one TP degree (for ``@example`` pins)."""
    m = MODELS[model]
    return ShardingConfig(
        m.name, tp, m.moe_intermediate, reduce_size(m.hidden), block, Fc1Layout.GATE_UP, m.activation, 2, 2, 3, 0
    )
