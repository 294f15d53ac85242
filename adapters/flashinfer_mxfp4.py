"""FlashInfer (0.7.4) for MXFP4 MoE experts: what its helpers accept, its own padding, the trtllm-gen kernel.

CPU (pure torch, FlashInfer's own functions): the trtllm-gen row-index helpers
(``get_w2_permute_indices_with_cache``, which vLLM applies to *every* MXFP4 tensor, scales with
``num_elts_per_sf=16``), the SM90 mixed-GEMM scale fold and ``pad_trtllm_moe_weights``.
GPU (SM100): ``trtllm_fp4_block_scale_routed_moe`` with MXFP4 weights and BF16 or MXFP8
activations. Shapes follow :mod:`contracts.moe`: ``I``/``H`` are padded sizes, scales ``[rows, K/32]``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from adapters import flashinfer as fi
from adapters.calls import kernel_device, launch, planned, synchronize
from contracts.errors import LibraryUnavailable
from contracts.moe import AlignedMoe
from reference.errors import require
from reference.formats import MXFP4_BLOCK, e4m3_decode, ue8m0_decode
from reference.moe import Activation, ActivationKind
from reference.padding import pad_dim
from reference.sizes import round_up

MXFP8_HIDDEN_MULTIPLE = 256
"""``pad_trtllm_moe_weights``: GEMM1's K "must be a multiple of 256 for MxFP8 and NVFP4 (128 is
rejected or gives wrong results)"; vLLM's TRTLLM MXFP4 weights serve the MXFP8-activation backend too."""
KERNEL_EXPERT_MULTIPLE = 8
"""The kernel runs get zero experts appended (never routed, so the output is unchanged) up to a
multiple of 8: FlashInfer's own tests never go below 8 experts and some routing paths need ``E % 4``."""
TRTLLM_INTERMEDIATE_MULTIPLE = 128
"""FlashInfer 0.7.4: trtllm-gen tiles FC1 in 128-row blocks (``valid_intermediate_size`` docstring,
``prepare_trtllm_fp4_weights``), and ``pad_trtllm_moe_weights`` pads the intermediate to 128 by
default. vLLM 0.33.0 rounds to 128 as well (an older vLLM used 256, ``docs/vllm-logic.md`` §8)."""


def trtllm_mxfp4_violations(intermediate: int, hidden: int) -> list[str]:
    """Why trtllm-gen MXFP4 MoE would reject gated experts of padded sizes ``(I, H)``; empty if none.

    FlashInfer's row-index helper must accept FC1 (``2I`` rows) and FC2 (``H`` rows), weights and
    scales (the scale variant asserts ``rows % 128``); the 128x4-swizzled scales are reshaped back
    to ``[rows, K/32]``, so their byte count must not grow (``K % 128``);
    :data:`TRTLLM_INTERMEDIATE_MULTIPLE`; and the hidden rule of :data:`MXFP8_HIDDEN_MULTIPLE`.
    """
    rows = 2 * intermediate
    problems: list[str] = []
    for label, m, scales in (
        ("FC1 weights", rows, False),
        ("FC1 scales", rows, True),
        ("FC2 weights", hidden, False),
        ("FC2 scales", hidden, True),
    ):
        try:
            fi.fc2_permutation(m, scales)
        except AssertionError as exc:
            problems.append(f"{label}: {exc}")
    for label, m, kc in (("FC1", rows, hidden // MXFP4_BLOCK), ("FC2", hidden, intermediate // MXFP4_BLOCK)):
        swizzled = round_up(m, 128) * round_up(kc, 4)
        if swizzled != m * kc:
            problems.append(
                f"{label} scales: the 128x4-swizzled buffer holds {swizzled} bytes but vLLM / FlashInfer reshape it "
                f"back to [{m}, {kc}] = {m * kc} bytes (needs rows % 128 and K % 128)"
            )
    if intermediate % TRTLLM_INTERMEDIATE_MULTIPLE:
        problems.append(f"intermediate size {intermediate} is not a multiple of 128 (trtllm-gen tiles FC1 in 128 rows)")
    if hidden % MXFP8_HIDDEN_MULTIPLE:
        problems.append(f"hidden size {hidden} is not a multiple of 256 (GEMM1 K with MxFP8 activations)")
    return problems


def sm90_violations(intermediate: int, hidden: int) -> list[str]:
    """Why FlashInfer's SM90 W4A16 MoE would reject gated experts of padded sizes ``(I, H)``.

    FlashInfer's ``interleave_moe_scales_for_sm90_mixed_gemm`` must accept both scale tensors
    (``rows % 64`` and ``K % 128``), and the binding / ``prepare_cutlass_w4a16_weights`` need
    ``H % 128`` and ``I % 128``.
    """
    problems: list[str] = []
    for label, m, k in (("FC1", 2 * intermediate, hidden), ("FC2", hidden, intermediate)):
        try:
            fi.sm90_scale_interleave(torch.zeros(1, m, k // MXFP4_BLOCK, dtype=torch.uint8))
        except ValueError as exc:
            problems.append(
                f"{label} scales [{m}, {k // MXFP4_BLOCK}]: interleave_moe_scales_for_sm90_mixed_gemm: {exc}"
            )
    for label, size in (("hidden", hidden), ("intermediate", intermediate)):
        if size % 128:
            problems.append(f"{label} size {size} is not a multiple of 128 (MXFP4 weights must be 128-aligned)")
    return problems


def pad_trtllm_moe_weights(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    *,
    hidden: int,
    intermediate: int,
    hidden_alignment: int,
    intermediate_alignment: int,
) -> Any:
    """FlashInfer's ``pad_trtllm_moe_weights`` on stacked gated MXFP4 experts (returns its NamedTuple).

    It pads each FC1 half to ``ru(I, intermediate_alignment)`` rows, FC1's K to
    ``ru(H, hidden_alignment)``, FC2 rows to ``ru(H, 128)``; weights with 0, scales with 127 (1.0).
    """
    return fi.function("flashinfer.fused_moe.core", "pad_trtllm_moe_weights")(
        w13,
        w13_scale,
        w2,
        w2_scale,
        hidden,
        intermediate,
        is_gated_act=True,
        hidden_alignment=hidden_alignment,
        intermediate_alignment=intermediate_alignment,
    )


@dataclass(frozen=True)
class TrtllmWeights:
    """trtllm-gen MXFP4 experts after FlashInfer's prep: shuffled bytes, 128x4-swizzled scale bytes
    reshaped to ``[E, rows, K/32]``, shuffled fp32 biases (or ``None``), padded ``(I, H)``."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w13_bias: torch.Tensor | None
    w2: torch.Tensor
    w2_scale: torch.Tensor
    w2_bias: torch.Tensor | None
    intermediate: int
    hidden: int


def _reshape_back(swizzled: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    require(
        swizzled.numel() == rows * cols,
        f"the 128x4-swizzled scales hold {swizzled.numel()} bytes; vLLM / FlashInfer reshape them to "
        f"[{rows}, {cols}] = {rows * cols} bytes (needs rows % 128 and K % 128)",
    )
    return swizzled.reshape(rows, cols)


def trtllm_mxfp4_weights(aligned: AlignedMoe, swizzle: Callable[[torch.Tensor], torch.Tensor]) -> TrtllmWeights:
    """vLLM's TRTLLM MXFP4 prep after the reorder: FlashInfer's ``get_w2_permute_indices_with_cache``
    rows for every tensor (scales: the ``num_elts_per_sf=16`` variant, then ``swizzle``, 128x4)."""
    w, ip, hp = aligned.weights, aligned.intermediate_size, aligned.hidden_size
    rows = 2 * ip
    p13, s13, p2, s2 = (fi.fc2_permutation(m, sf) for m, sf in ((rows, False), (rows, True), (hp, False), (hp, True)))

    def scales(s: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        return torch.stack([_reshape_back(swizzle(e[perm].contiguous()), e.shape[0], e.shape[1]) for e in s])

    return TrtllmWeights(
        w13=w.w13[:, p13],
        w13_scale=scales(w.w13_scale, s13),
        w13_bias=None if w.w13_bias is None else w.w13_bias[:, p13],
        w2=w.w2[:, p2],
        w2_scale=scales(w.w2_scale, s2),
        w2_bias=None if w.w2_bias is None else w.w2_bias[:, p2],
        intermediate=ip,
        hidden=hp,
    )


def _require_sm100() -> None:
    if planned():
        return
    cc = fi.cuda_capability()
    if cc is None or cc[0] != 10:
        raise LibraryUnavailable(
            "trtllm_fp4_block_scale_moe with MXFP4 weights runs on SM100 (B200/GB200); this machine: "
            + ("no CUDA GPU" if cc is None else f"sm{cc[0]}{cc[1]}")
        )


def trtllm_mxfp4_moe(
    w: TrtllmWeights, x: torch.Tensor, routing: torch.Tensor, ids: torch.Tensor, act: Activation, mxfp8: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Run ``trtllm_fp4_block_scale_routed_moe`` on prepared MXFP4 experts with pre-computed routing.

    ``x [T, H]`` (``H <= w.hidden``) is zero-padded to ``w.hidden`` and fed as BF16, or (``mxfp8``)
    quantized by FlashInfer's ``mxfp8_quantize`` with linear scales. ``routing`` fp32 and ``ids``
    are ``[T, k]``. SWIGLU_OAI passes ``gemm1_alpha/beta/clamp_limit`` per expert (SwigluBias).
    Returns ``(out [T, H] fp32, activation [T, H] fp32)``: the bf16 output and the activation
    the kernel consumed (BF16-rounded, or MXFP8 decoded by the reference codecs), both on the CPU.
    """
    _require_sm100()
    flashinfer = fi._import("flashinfer")
    dev = kernel_device()
    experts, t = round_up(w.w13.shape[0], KERNEL_EXPERT_MULTIPLE), x.shape[0]

    def experts_on_device(a: torch.Tensor | None) -> torch.Tensor | None:
        return None if a is None else pad_dim(a, 0, experts).to(dev)

    xp = torch.nn.functional.pad(x.float(), (0, w.hidden - x.shape[1])).to(torch.bfloat16).to(dev)
    if mxfp8:
        x_q, x_s = launch(
            "mxfp8_quantize",
            flashinfer.mxfp8_quantize,
            xp,
            is_sf_swizzled_layout=False,
            planned_output=lambda: (
                torch.zeros(t, w.hidden, dtype=torch.float8_e4m3fn),
                torch.zeros(t * w.hidden // MXFP4_BLOCK, dtype=torch.uint8),
            ),
        )
        codes, scales = x_q.view(torch.uint8).cpu(), x_s.view(torch.uint8).cpu().reshape(t, -1)
        fed = e4m3_decode(codes) * ue8m0_decode(scales).repeat_interleave(MXFP4_BLOCK, dim=-1)
        hidden_states, hidden_scale = x_q.to(dev), x_s.view(torch.float8_e4m3fn).reshape(t, -1).to(dev)
        layout = {"hidden_states_scale_layout": flashinfer.SfLayout.layout_linear}
    else:
        hidden_states, hidden_scale, fed, layout = xp, None, xp.float().cpu(), {}

    def per_expert(v: float | None) -> torch.Tensor | None:
        return None if v is None else torch.full((experts,), v, dtype=torch.float32, device=dev)

    oai = act.kind is ActivationKind.SWIGLU_OAI
    ones = torch.ones(experts, dtype=torch.float32, device=dev)
    out = launch(
        "trtllm_fp4_block_scale_routed_moe",
        flashinfer.trtllm_fp4_block_scale_routed_moe,
        (ids.to(dev, torch.int32), routing.to(dev, torch.float32)),
        None,
        hidden_states,
        hidden_scale,
        experts_on_device(w.w13),
        experts_on_device(w.w13_scale).view(torch.float8_e4m3fn),
        experts_on_device(w.w13_bias),
        per_expert(act.alpha) if oai else None,
        per_expert(act.beta) if oai else None,
        per_expert(act.limit) if oai else None,
        experts_on_device(w.w2),
        experts_on_device(w.w2_scale).view(torch.float8_e4m3fn),
        experts_on_device(w.w2_bias),
        ones,
        ones,
        ones,
        num_experts=experts,
        top_k=ids.shape[1],
        n_group=None,
        topk_group=None,
        intermediate_size=w.intermediate,
        local_expert_offset=0,
        local_num_experts=experts,
        routed_scaling_factor=None,
        planned_output=lambda: [torch.zeros(t, w.hidden, dtype=torch.bfloat16)],
        **layout,
    )
    synchronize()
    return out[0][:, : x.shape[1]].float().cpu(), fed[:, : x.shape[1]]
