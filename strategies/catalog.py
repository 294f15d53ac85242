"""Catalogue of real model shapes (``../shared/docs/models.md``) that strategies draw from.

Only what the contracts need is kept: hidden size, routed-expert intermediate size, shared-expert
intermediate size, expert count, top-k and the MoE activation.
"""

from __future__ import annotations

from dataclasses import dataclass

from reference.moe import Activation, ActivationKind

SWIGLU = Activation(ActivationKind.SWIGLU)
GEGLU = Activation(ActivationKind.GEGLU)
RELU2 = Activation(ActivationKind.RELU2)
GPT_OSS = Activation(ActivationKind.SWIGLU_OAI, alpha=1.702, beta=1.0, limit=7.0)


@dataclass(frozen=True)
class ModelShape:
    """MoE shapes of one model (global, before tensor parallelism)."""

    name: str
    hidden: int
    moe_intermediate: int
    shared_intermediate: int
    experts: int
    top_k: int
    activation: Activation


MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        ModelShape("gemma-4-26b-a4b", 2816, 704, 0, 128, 8, GEGLU),
        ModelShape("gpt-oss-20b", 2880, 2880, 0, 32, 4, GPT_OSS),
        ModelShape("gpt-oss-120b", 2880, 2880, 0, 128, 4, GPT_OSS),
        ModelShape("deepseek-v3", 7168, 2048, 2048, 256, 8, SWIGLU),
        ModelShape("deepseek-v4", 7168, 3072, 3072, 384, 6, SWIGLU),
        ModelShape("kimi-k2", 7168, 2048, 2048, 384, 8, SWIGLU),
        ModelShape("qwen3-30b-a3b", 2048, 768, 0, 128, 8, SWIGLU),
        ModelShape("qwen3-235b-a22b", 4096, 1536, 0, 128, 8, SWIGLU),
        ModelShape("qwen3-next-80b-a3b", 2048, 512, 512, 512, 10, SWIGLU),
        ModelShape("qwen3.5-35b-a3b", 2048, 512, 512, 256, 8, SWIGLU),
        ModelShape("qwen3.8-flash-next", 2560, 640, 640, 512, 10, SWIGLU),
        ModelShape("llama-4-scout", 5120, 8192, 8192, 16, 1, SWIGLU),
        ModelShape("glm-4.5", 5120, 1536, 1536, 160, 8, SWIGLU),
        ModelShape("glm-4.5-air", 4096, 1408, 1408, 128, 8, SWIGLU),
        ModelShape("minimax-m2", 3072, 1536, 0, 256, 8, SWIGLU),
        ModelShape("nemotron-3-nano-30b-a3b", 2688, 1856, 0, 128, 6, RELU2),
        ModelShape("mellum2-12b-a2.5b", 2048, 896, 0, 64, 8, SWIGLU),
    )
}
"""Mellum2's hidden size and expert count are not in the sources; 2048 / 64 are placeholders
that keep its intermediate-size residues, which are what its regression (EuroEval #2079) is about."""

TP_DEGREES = (1, 2, 4, 8, 16)


def model(name: str) -> ModelShape:
    """Look up a catalogued model; raises ``KeyError`` listing the known names."""
    try:
        return MODELS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; catalogued models: {', '.join(sorted(MODELS))}") from None
