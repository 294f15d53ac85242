"""Hypothesis strategies for the ``mxfp4_moe`` contract: one rank's MXFP4 MoE layer plus its checkpoint.

A configuration is a :class:`~strategies.moe.MoeShape` drawn with 32-element groups (gated
activations only: plain SwiGLU or gpt-oss's clamped SwiGLU with an ``(alpha, beta, limit)`` from
the libraries' tests), the checkpoint's FC1 form (stacked ``[gate; up]`` or gpt-oss's
row-interleaved pairs) and whether the experts carry fp32 biases. Shrinking lands on the stacked
form without biases.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from hypothesis import strategies as st

from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.moe import Activation, ActivationKind
from strategies.catalog import GPT_OSS, MODELS, SWIGLU, ModelShape
from strategies.config import Config
from strategies.moe import MoeShape, layer_shape, moe_shapes

ACTIVATIONS = (SWIGLU, GPT_OSS)
SWIGLU_OAI_PARAMS = ((1.702, 1.0, 7.0), (1.0, 1.0, None), (0.5, 0.0, 7.0))
"""``(alpha, beta, limit)``: gpt-oss; vLLM's ``test_mxfp4_moe`` (1, 1, None); FlashInfer's ``test_moe_bf16_mxfp4``."""

UNCATALOGUED = {
    m.name: m
    for m in (
        # vLLM PR #56697 (I 2304); hidden 5120, 384 experts, top-6 from lightseekorg/tokenspeed PR #1664
        ModelShape("deepseek-v4.1-flash", 5120, 2304, 0, 384, 6, SWIGLU),
    )
}
"""Models pinned as ``@example`` but not (yet) in :data:`strategies.catalog.MODELS`."""


class CheckpointForm(enum.Enum):
    """How the checkpoint stores the fused FC1 rows the loader hands to the policy."""

    STACKED = "stacked"  # [gate; up]: Quark OCP-MX, DeepSeek-V4, MiniMax (vLLM's canonical w13)
    INTERLEAVED = "interleaved"  # [g0, u0, g1, u1, ...]: gpt-oss

    @property
    def layout(self) -> Fc1Layout:
        return Fc1Layout.GATE_UP if self is CheckpointForm.STACKED else Fc1Layout.GATE_UP_INTERLEAVED


@dataclass(frozen=True)
class Mxfp4MoeConfig(Config):
    """One rank's MXFP4 MoE layer (``shape``), its checkpoint's FC1 ``form`` and whether it has biases."""

    shape: MoeShape
    form: CheckpointForm
    bias: bool

    def describe(self) -> str:
        return f"{self.shape.describe()}; checkpoint {self.form.value}, {'with' if self.bias else 'no'} biases"


@st.composite
def mxfp4_moe_configs(draw: st.DrawFn) -> Mxfp4MoeConfig:
    """A :class:`Mxfp4MoeConfig` over catalogued (and adversarial) shapes at every TP degree."""
    shape = draw(moe_shapes(group=MXFP4_BLOCK, activations=ACTIVATIONS))
    if shape.activation.kind is ActivationKind.SWIGLU_OAI:
        alpha, beta, limit = draw(st.sampled_from(SWIGLU_OAI_PARAMS))
        shape = replace(shape, activation=Activation(ActivationKind.SWIGLU_OAI, alpha, beta, limit))
    return Mxfp4MoeConfig(shape, draw(st.sampled_from(CheckpointForm)), draw(st.booleans()))


def pinned_config(model: str, tp: int, *, rank: int = 0, ep: bool = False) -> Mxfp4MoeConfig:
    """A model's rank at one TP degree for ``@example``: gpt-oss with its interleaved checkpoint and
    biases, others stacked without biases; ``rank = -1`` is the last rank (the short one of a
    whole-block split)."""
    m = MODELS.get(model) or UNCATALOGUED[model]
    shape = layer_shape(
        m, tp, ep, rank % tp, MXFP4_BLOCK, m.activation, experts=2, top_k=min(2, m.top_k), tokens=3, seed=0
    )
    gpt_oss = model.startswith("gpt-oss")
    return Mxfp4MoeConfig(shape, CheckpointForm.INTERLEAVED if gpt_oss else CheckpointForm.STACKED, gpt_oss)
