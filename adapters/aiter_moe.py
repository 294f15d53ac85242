"""AITER's MXFP4 MoE on gfx950: ``aiter.fused_moe(..., quant_type=QuantType.per_1x32)`` (a4w4 CK path).

Preparation as vLLM's Quark OCP-MX method and AITER's ``op_tests/test_moe_2stage.py`` (fp4x2
weights, ``preshuffle``) do it, with AITER's own functions: ``shuffle_weight(w, (16, 16))`` on the
packed bytes viewed as ``fp4x2`` and ``e8m0_shuffle`` on each scale viewed as ``[E·N, K/32]``,
then viewed back as ``[E, N, K/32]`` (``docs/vllm-logic.md`` §10). FC1 rows are ``[gate; up]``
(``GateMode.SEPARATED``). AITER imports only on ROCm; see :mod:`adapters.aiter`.
"""

from __future__ import annotations

import torch

from adapters.aiter import AiterUnavailable, _import, entry, require_gfx950, require_parameters
from adapters.aiter_triton import FP4_UTILS, SHUFFLE, aiter_module
from adapters.calls import kernel_device, launch, planned, synchronize
from contracts.moe import MoeWeights


def fused_moe_a4w4(
    weights: MoeWeights,
    x: torch.Tensor,
    routing: torch.Tensor,
    ids: torch.Tensor,
    hidden_pad: int,
    intermediate_pad: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run ``aiter.fused_moe`` (SiLU-gated, per_1x32) on padded ``[gate; up]`` MXFP4 experts.

    ``x [T, H]`` is zero-padded to the weights' hidden size and passed as bf16; ``routing`` fp32
    and ``ids`` are ``[T, k]``. ``hidden_pad`` / ``intermediate_pad`` count the zero tail columns /
    rows already in the weights (AITER's contract). Returns ``(out [T, H] fp32, w13 scale bytes,
    w2 scale bytes)`` on the CPU; the scale bytes are AITER's ``e8m0_shuffle`` output viewed back as
    ``[E, N, K/32]``, for comparison with the reference layout.
    """
    require_gfx950()
    fused_moe = entry("aiter.fused_moe", "fused_moe")
    require_parameters(fused_moe, "fused_moe", ("hidden_pad", "intermediate_pad", "w1_scale", "quant_type"))
    fp4_utils = aiter_module(FP4_UTILS)
    shuffle = aiter_module(SHUFFLE)
    dev = kernel_device()
    fp4x2, e8m0 = _value("dtypes.fp4x2", torch.uint8), _value("dtypes.fp8_e8m0", torch.uint8)

    def scales(s: torch.Tensor) -> torch.Tensor:
        e, n, _ = s.shape
        return fp4_utils.e8m0_shuffle(s.to(dev).reshape(e * n, -1)).view(e, n, -1)

    w1 = shuffle.shuffle_weight(weights.w13.to(dev).view(fp4x2), layout=(16, 16))
    w2 = shuffle.shuffle_weight(weights.w2.to(dev).view(fp4x2), layout=(16, 16))
    s1, s2 = scales(weights.w13_scale), scales(weights.w2_scale)
    xp = torch.nn.functional.pad(x.float(), (0, weights.hidden_size - x.shape[1])).to(torch.bfloat16).to(dev)
    out = launch(
        "fused_moe (per_1x32 a4w4)",
        fused_moe,
        xp,
        w1,
        w2,
        routing.to(dev, torch.float32),
        ids.to(dev, torch.int32),
        w1_scale=s1.view(e8m0),
        w2_scale=s2.view(e8m0),
        quant_type=_value("QuantType.per_1x32"),
        activation=_value("ActivationType.Silu"),
        hidden_pad=hidden_pad,
        intermediate_pad=intermediate_pad,
    )
    synchronize()
    return out[:, : x.shape[1]].float().cpu(), s1.view(torch.uint8).cpu(), s2.view(torch.uint8).cpu()


def _value(path: str, in_plan: object = None) -> object:
    """``aiter.<path>`` (an enum member or dtype); in a plan without ROCm, ``in_plan`` or the path's text."""
    try:
        obj: object = _import("aiter")
        for part in path.split("."):
            obj = getattr(obj, part)
    except (AiterUnavailable, AttributeError):
        if not planned():
            raise
        return f"aiter.{path}" if in_plan is None else in_plan
    return obj
