"""Hypothesis strategies for the ``mxfp4_moe`` contract: one rank's MXFP4 MoE layer plus its checkpoint.

A configuration is a :class:`~strategies.moe.MoeShape` drawn with 32-element groups (gated
activations only: plain SwiGLU or gpt-oss's clamped SwiGLU with an ``(alpha, beta, limit)`` from
the libraries' tests), the checkpoint's FC1 form (stacked ``[gate; up]`` or gpt-oss's
row-interleaved pairs) and whether the experts carry fp32 biases. Shrinking lands on the stacked
form without biases.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from hypothesis import strategies as st

from reference.formats import MXFP4_BLOCK
from reference.moe import Activation, ActivationKind
from strategies.catalog import GPT_OSS, MODELS, SWIGLU, CheckpointForm
from strategies.config import Config
from strategies.moe import MoeShape, layer_shape, moe_shapes

ACTIVATIONS = (SWIGLU, GPT_OSS)
SWIGLU_OAI_PARAMS = ((1.702, 1.0, 7.0), (1.0, 1.0, None), (0.5, 0.0, 7.0))
"""``(alpha, beta, limit)``: gpt-oss; vLLM's ``test_mxfp4_moe`` (1, 1, None); FlashInfer's ``test_moe_bf16_mxfp4``."""


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
    """A model's rank at one TP degree for ``@example``, in its catalogued checkpoint form and with its
    expert biases (gpt-oss: interleaved, with biases); ``rank = -1`` is the last rank (the short one
    of a whole-block split)."""
    m = MODELS[model]
    shape = layer_shape(
        m, tp, ep, rank % tp, MXFP4_BLOCK, m.activation, experts=2, top_k=min(2, m.top_k), tokens=3, seed=0
    )
    return Mxfp4MoeConfig(shape, m.checkpoint, m.expert_biases)
