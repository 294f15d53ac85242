"""The ``mxfp4_moe`` backends: how each kernel reads FC1 rows, which padded sizes it accepts, how it runs.

Written from the libraries, never from the policies under test: FlashInfer's own helpers decide
for its two backends (:mod:`adapters.flashinfer_mxfp4`), the reference AITER layouts and AITER's
issues for AITER, vLLM's Marlin MoE support check for Marlin; for the newer backends of vLLM 0.33.0's
MXFP4 oracle, the views of AITER's A16W4 shuffles, triton_kernels' Hopper scale layout
(:mod:`adapters.triton_kernels`), the scale tiling of vLLM's own CUTLASS kernel and DeepGEMM's
activation groups, b12x's and FlashInfer MoE-EP's checks. The built-in policy rounds ``(I, H)``
to each record's multiples and converts FC1 rows to its ``fc1_layout`` (vLLM's
``mxfp4_round_up_hidden_size_and_intermediate_size`` plus the reorder part of
``convert_to_mxfp4_moe_kernel_format``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from adapters import aiter_moe, matmul_ogs
from adapters import flashinfer_mxfp4 as fim
from adapters import flashinfer_sm90_moe as sm90
from adapters import triton_kernels as tk
from backends import register
from backends.moe import MoeBackendRecord
from contracts.moe import MXFP4_MOE
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.sizes import round_up

CONTRACT = MXFP4_MOE


class Mxfp4MoeBackend(enum.Enum):
    """MoE kernels consuming MXFP4 expert weights."""

    FLASHINFER_TRTLLM = "flashinfer-trtllm-mxfp4"  # trtllm_fp4_block_scale_moe, x BF16 / MXFP8 (SM100)
    FLASHINFER_CUTLASS_SM90 = "flashinfer-cutlass-sm90"  # cutlass_fused_moe W4A16, use_w4_group_scaling (SM90)
    AITER = "aiter-ck"  # aiter.fused_moe, QuantType.per_1x32 (gfx950)
    MARLIN = "marlin"  # vLLM fused_marlin_moe
    VLLM_CUTLASS = "vllm-cutlass-mxfp4"  # vLLM cutlass_moe_mxfp4 (SM100); alias: DeepGEMM MXFP4 (same rule)
    B12X = "b12x-mxfp4"  # FlashInfer b12x fused MoE, W4A16 (SM120)
    TRITON_SM90 = "triton-kernels-sm90"  # triton_kernels matmul_ogs, Hopper swizzle (vLLM TRITON)
    AITER_A16W4 = "aiter-a16w4"  # AITER CK A16W4 MoE, shuffle_weight_a16w4 (gfx950)
    FLASHINFER_MOE_EP = "flashinfer-moe-ep-mxfp4"  # FlashInfer MoE-EP DeepGEMM megakernel (SM100)


def aiter_violations(intermediate: int, hidden: int, experts: int) -> list[str]:
    """Why AITER's per_1x32 MoE (as vLLM's Quark OCP-MX path prepares it) rejects ``(I, H)`` for ``E`` experts.

    ``shuffle_weight`` (16, 16) needs ``N % 16`` and ``K % 64``; ``e8m0_shuffle`` pads the scale
    viewed as ``[E·N, K/32]`` to ``(ru(E·N, 256), ru(K/32, 8))`` and vLLM views it back as
    ``[E, N, -1]``, which holds only without padding; CK-Tile stage 2 mis-indexes scales unless
    ``I % 256`` (AITER #5233); the gfx950 stage-1 MXFP4 kernels are built with ``tile_k = 256``
    only (vLLM PR #55104), so ``H % 256``.
    """
    problems: list[str] = []
    for label, n, k in (("FC1", 2 * intermediate, hidden), ("FC2", hidden, intermediate)):
        if n % 16 or k % 64:
            problems.append(f"{label} weights [{n}, {k // 2}] bytes: shuffle_weight needs N % 16 and K % 64")
        rows, cols = experts * n, k // MXFP4_BLOCK
        padded = (round_up(rows, 256), round_up(cols, 8))
        if padded != (rows, cols):
            problems.append(
                f"{label} scales [{experts}·{n}, {cols}]: e8m0_shuffle pads to {padded}, so vLLM's "
                f".view({experts}, {n}, -1) does not give back [{experts}, {n}, {cols}]"
            )
    if intermediate % 256:
        problems.append(f"inter_dim {intermediate} % 256 != 0: CK-Tile stage 2 mis-indexes E8M0 scales (AITER #5233)")
    if hidden % 256:
        problems.append(f"hidden size {hidden} % 256 != 0: gfx950 stage-1 MXFP4 kernels use tile_k = 256")
    return problems


def marlin_violations(intermediate: int, hidden: int) -> list[str]:
    """vLLM ``check_moe_marlin_supports_layer``: "moe marlin requires n % 128 == 0 and k % 64 == 0"
    for gate-up ``(n, k) = (2I, H)`` and down ``(H, I)``, i.e. ``H % 128`` and ``I % max(64, 32)``."""
    problems: list[str] = []
    if hidden % 128:
        problems.append(f"hidden size {hidden} is not a multiple of 128 (Marlin MoE down-projection n)")
    if intermediate % 64:
        problems.append(f"intermediate size {intermediate} is not a multiple of 64 (Marlin MoE per-shard tile)")
    return problems


def vllm_cutlass_violations(intermediate: int, hidden: int) -> list[str]:
    """Why vLLM's CUTLASS MXFP4 MoE (and DeepGEMM's MXFP4 MoE) rejects ``(I, H)``.

    CUTLASS: ``_swizzle_cutlass_mxfp4_scales`` (``fused_moe/oracle/mxfp4.py``) tiles each expert's
    ``[N, K/32]`` scales into 128-row x 4-column tiles with ``swizzle_mxfp4_scales``, which zero-pads to
    whole tiles, then ``reshape(N, K/32)``: it holds only without padding, so ``N % 128`` (FC1
    ``2I``, FC2 ``H``) and ``(K/32) % 4`` (FC1 ``H``, FC2 ``I``). DeepGEMM: ``DeepGemmFP4Experts``
    quantizes both GEMMs' activations to FP8 in 128-element groups along K (``_ACT_BLOCK_K``), so
    ``H % 128`` and ``I % 128``. Together: ``I % 128`` and ``H % 128``, vLLM's rounding for both.
    """
    problems: list[str] = []
    for label, n, k in (("FC1", 2 * intermediate, hidden), ("FC2", hidden, intermediate)):
        if n % 128 or (k // MXFP4_BLOCK) % 4:
            problems.append(
                f"{label} scales [{n}, {k // MXFP4_BLOCK}]: swizzle_mxfp4_scales pads to 128-row x 4-column tiles, "
                f"so vLLM's reshape({n}, {k // MXFP4_BLOCK}) fails"
            )
        if k % 128:
            problems.append(f"{label} K {k} % 128 != 0: DeepGEMM quantizes activations in 128-element groups")
    return problems


def b12x_violations(intermediate: int, hidden: int) -> list[str]:
    """Why FlashInfer's b12x fused MoE (W4A16, ``source_format="fp4_e8m0_k32"``) rejects ``(I, H)``:
    vLLM's ``B12xExperts.is_supported_config`` needs the per-rank intermediate size % 32, and the
    byte-preserved K/32 scales need whole 32-element groups along both K; b12x plans for the model's
    exact sizes (``mxfp4_round_up_hidden_size_and_intermediate_size`` returns them unchanged) and picks
    its packed layout for ``I % 128 == 0``, its ModelOpt-style one otherwise
    (``_w4a16_weight_layout_for_source``), so nothing is padded. The W4A8 (MXFP8 activation) mode also
    needs ``H % 256``; vLLM then declines the backend instead of padding (not modelled)."""
    return [
        f"{name} size {size} is not a whole number of 32-element MXFP4 groups (B12xExperts.is_supported_config)"
        for name, size in (("intermediate", intermediate), ("hidden", hidden))
        if size % MXFP4_BLOCK
    ]


def aiter_a16w4_violations(intermediate: int, hidden: int) -> list[str]:
    """Why AITER's CK A16W4 MoE preshuffle rejects ``(I, H)`` (``aiter/ops/shuffle.py``, amd-aiter 0.1.7
    and ROCm/aiter main alike; vLLM ``AITER_MXFP4_BF16``).

    ``shuffle_weight_a16w4(w, 16, gate_up)`` views ``[E, N, K/2]`` as ``(E, [2,] N'/16, 16, K/128, 4, 16)``
    (``N' = I`` for FC1's gate/up pair, ``H`` for FC2): ``N' % 16`` and ``K % 128``;
    ``shuffle_scale_a16w4`` views ``[E·N, K/32]`` as ``(E, N/32, 2, 16, K/256, 2, 4)``: ``N % 32`` and
    ``(K/32) % 8``, i.e. ``K % 256`` for both GEMMs. So ``I % 256`` and ``H % 256``.
    """
    problems: list[str] = []
    for label, n, k in (("FC1", 2 * intermediate, hidden), ("FC2", hidden, intermediate)):
        if k % 256 or n % 32:
            problems.append(
                f"{label} scales [E·{n}, {k // MXFP4_BLOCK}]: shuffle_scale_a16w4's view needs N % 32 and "
                f"(K/32) % 8 (K % 256)"
            )
    return problems


MOE_EP_HIDDEN_MULTIPLE = 128
"""FlashInfer 0.7.4 ``moe_ep/backends/mega/kernel/sm100/fp8_fp4_bf16_deepgemm/staging.py``: the DeepGEMM
megakernel's input staging raises ``hidden_size must be a multiple of 128`` (it quantizes the hidden
states to MXFP8 through DeepGEMM's ``per_token_cast_to_fp8``)."""


def moe_ep_violations(intermediate: int, hidden: int) -> list[str]:
    """Why FlashInfer's MoE-EP DeepGEMM megakernel (vLLM ``FLASHINFER_MOE_EP_DEEP_GEMM``) rejects ``(I, H)``:
    the staging's ``H % 128``; the checkpoint's MXFP4 tensors go in as they are (vLLM's
    ``mxfp4_moe_ep_weights``), so whole 32-element groups along ``I``. The CuteDSL megakernel
    (``FLASHINFER_MOE_EP_CUTEDSL``) is not an MXFP4 consumer: vLLM dequantizes the experts to bf16 for it."""
    problems = []
    if hidden % MOE_EP_HIDDEN_MULTIPLE:
        problems.append(f"hidden size {hidden} % 128 != 0: FlashInfer MoE-EP DeepGEMM staging raises")
    if intermediate % MXFP4_BLOCK:
        problems.append(f"intermediate size {intermediate} is not a whole number of 32-element MXFP4 groups")
    return problems


# --- kernel tolerances (each with its error argument) ------------------------------------------

BF16_REL_L2 = 1e-2
"""trtllm-gen MXFP4 x BF16 vs the reference fed the same bf16 activations and bf16-rounded
intermediate: what remains is fp32 accumulation order (~K·2^-24 relative), rare one-ulp flips of
the bf16 intermediate (2^-8) and the bf16 output (2^-9 relative per element, so <= 2e-3 in
relative L2). 1e-2 keeps a 5x margin; a gate/up mispairing or a misplaced scale gives ~1."""
MXFP8_REL_L2 = 1e-1
"""With MXFP8 activations the reference gets the kernel's own MXFP8 input but keeps the
intermediate in fp32 while the kernel re-quantizes it to MXFP8: E4M3 rounding is at most 2^-4
relative per element, RMS 2^-4/sqrt(3) ~ 0.036, so the relative L2 error is ~0.04; 0.1 is ~3
sigma and still an order of magnitude below a mispairing (~1)."""
AITER_LOGITS_DIFF = 3e-2
"""AITER's own metric (``test_moe_2stage.py``: ``1 - 2·Σxy / Σ(x²+y²)``, strict threshold 1e-2).
The reference quantizes the activations with AITER's HIP quantizer and the intermediate with
MXFP4 RCEIL (AITER's default RoundUp); if the kernel keeps the intermediate in bf16 instead
(CK-Tile a16w4 stage 2), the extra E2M1 rounding (relative RMS <= ~0.15) adds <= 0.15²/2 ~ 1.1e-2.
3e-2 covers that; a mispairing or AITER #5233's scale mis-indexing gives 0.1 to 1."""
SM90_TOLERANCE = 6.0
"""Largest allowed ``|kernel - reference| / (2^-8 · M)``, ``M`` = :func:`reference.moe.moe_magnitude`.

Argument (first order in ``u = 2^-8``, bf16's unit roundoff; fp32 accumulation, ``K·2^-24 <= 2^-14``
relative, is negligible). The reference is exact in the kernel's inputs: ``x`` is rounded to bf16
before both run, E2M1 codes times UE8M0 scales (bytes 118..122, and byte 0 on zero padding) are
exact in bf16 and fp32, and the routing weights are passed in fp32. The kernel then rounds to bf16
(i) the GEMM1 outputs ``gate``, ``up`` and (ii) the activation output fed to GEMM2 (each relative
``<= u``), (iii) each expert's GEMM2 output and (iv) the final top-k sum. With
``G >= |gate|``, ``U >= |up|`` and ``|d act / d gate| <= 1.1·(|up| + beta)`` (``z·sigmoid(z)`` has
slope at most 1.1; clamps are 1-Lipschitz), (i)+(ii) move an activation by at most
``(1.1 + 1 + 1)·u·G·(U + beta)``, hence ``out`` by ``3.1·u·M``; (iii) and (iv) add ``u·M`` each
(``|y_e|``, ``|out| <= M``). Total ``5.1·u·M``; 6 leaves room for second-order terms. FlashInfer's
own ``test_moe_bf16_mxfp4`` allows ``rtol = atol = 0.1`` at I = H = 128, far looser. Kernel outputs
on padded and unpadded weights each obey the bound, so they differ by at most ``2·SM90_TOLERANCE``.
"""


TRITON_SM90_METRIC = "error / (2^-8 · magnitude)"
TRITON_SM90_TOLERANCE = 4.0
"""Largest allowed ``|kernel - reference| / (2^-8 · M)`` for triton_kernels' ``matmul_ogs`` MoE, ``M`` =
:func:`reference.moe.moe_fused_magnitude` with the expert biases.

Argument (first order in ``u = 2^-8``). The reference is exact in the kernel's inputs: ``x`` is rounded to
bf16 before both run, E2M1 codes times UE8M0 scales are exact in bf16, biases and routing weights are fp32
(the kernel's top-k softmax over fp32 logits differs from the reference's by ``~2^-23``). The kernel keeps
FC1's output and the fused SwiGLU in fp32 (``_swiglu_fn`` upcasts; fp32 accumulation is the ``γ`` term of
``M``) and rounds to bf16 (i) the activation it stores for FC2, (ii) each routed slot's FC2 output and
(iii) the top-k sum, ``u·M`` each; FC2's fp32 accumulation adds ``I·2^-24 <= 2^-12`` relative. Total
``3·u·M``; 4 leaves room for second-order terms. An odd 32-group K or a misread scale group moves an
output by tens of units (``backends/truth``: 10 to 225 on single GEMMs)."""


@dataclass(frozen=True, kw_only=True)
class Mxfp4MoeRecord(MoeBackendRecord):
    """An MXFP4 MoE backend (gated SwiGLU experts only; the common fields: :class:`backends.moe.MoeBackendRecord`).

    ``tolerances``: the kernel's bounds, by the metric the kernel property computes. ``aliases``: other
    engine backends that share this one's rounding, FC1 order and rule (each named with the source showing
    it), so one record stands for them.
    """

    tolerances: Mapping[str, float] = field(default_factory=dict)
    aliases: tuple[str, ...] = ()

    OPTIONAL: ClassVar[frozenset[str]] = MoeBackendRecord.OPTIONAL | {"tolerances", "aliases"}


RECORDS = (
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.FLASHINFER_TRTLLM,
        contract=CONTRACT,
        entry_point="flashinfer.trtllm_fp4_block_scale_routed_moe",
        requires=("flashinfer",),
        kernel_requires=("sm100", "flashinfer"),
        sources=(
            "flashinfer-python 0.7.4 flashinfer/fused_moe/core.py (get_w2_permute_indices_with_cache)",
            "https://github.com/sgl-project/sglang/pull/16824",
        ),
        # [up; gate] after FlashInfer's gated reorder: pairs (u_j, g_j); its prep then only row-shuffles.
        # trtllm-gen's 128-row FC1 tiles, hidden 256 for MXFP8 activations.
        fc1_layout=Fc1Layout.UP_GATE_INTERLEAVED,
        intermediate_multiple=fim.TRTLLM_INTERMEDIATE_MULTIPLE,
        hidden_multiple=fim.MXFP8_HIDDEN_MULTIPLE,
        violations=lambda i, h, gated, e: fim.trtllm_mxfp4_violations(i, h),
        prepare=fim.trtllm_mxfp4_weights,
        kernel=fim.trtllm_mxfp4_moe,
        tolerances={"bf16 relative L2": BF16_REL_L2, "mxfp8 relative L2": MXFP8_REL_L2},
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90,
        contract=CONTRACT,
        entry_point="flashinfer.fused_moe.cutlass_fused_moe (W4A16, use_w4_group_scaling)",
        requires=("flashinfer",),
        kernel_requires=("sm90", "flashinfer"),
        sources=(
            "flashinfer-python 0.7.4 flashinfer/fused_moe/prepare.py (interleave_moe_scales_for_sm90_mixed_gemm)",
            "https://github.com/sgl-project/sglang/issues/26250",
        ),
        # cutlass_fused_moe's w31 = [up; gate]: activation on the second half; K % 128 for the scale fold
        fc1_layout=Fc1Layout.UP_GATE,
        intermediate_multiple=sm90.SM90_ALIGNMENT,
        hidden_multiple=sm90.SM90_ALIGNMENT,
        violations=lambda i, h, gated, e: fim.sm90_violations(i, h),
        kernel=sm90.w4a16_moe,
        tolerances={"error / (2^-8 · magnitude)": SM90_TOLERANCE},
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.AITER,
        contract=CONTRACT,
        entry_point="aiter.fused_moe (QuantType.per_1x32, a4w4)",
        kernel_requires=("gfx950", "aiter"),
        sources=("https://github.com/ROCm/aiter/issues/5233", "https://github.com/vllm-project/vllm/pull/55104"),
        # aiter.fused_moe, GateMode.SEPARATED: activation on the first half; vLLM's ROCm rounding (256)
        fc1_layout=Fc1Layout.GATE_UP,
        intermediate_multiple=256,
        hidden_multiple=256,
        violations=lambda i, h, gated, e: aiter_violations(i, h, e),
        kernel=aiter_moe.fused_moe_a4w4,
        tolerances={"logits diff": AITER_LOGITS_DIFF},
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.MARLIN,
        contract=CONTRACT,
        entry_point="vllm fused_marlin_moe",
        sources=("https://github.com/vllm-project/vllm/pull/56697",),
        # fused_marlin_moe + silu_and_mul: gate = first half, each shard padded to its 64-row tile. vLLM's
        # gpt-oss Marlin path instead keeps the checkpoint's pairs for swigluoai_and_mul (x[..., ::2] is
        # gate); the contract models the SiLU path (DeepSeek-V4.1-Flash, vLLM PR #56697) for every activation.
        # ru(I, lcm(64, 32)) per shard, hidden % 128 (check_moe_marlin_supports_layer).
        fc1_layout=Fc1Layout.GATE_UP,
        intermediate_multiple=64,
        hidden_multiple=128,
        violations=lambda i, h, gated, e: marlin_violations(i, h),
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.VLLM_CUTLASS,
        contract=CONTRACT,
        entry_point="vllm cutlass_moe_mxfp4 (CutlassExpertsMxfp4, CUTLASS_MXFP4_MXFP4)",
        sources=(
            "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/oracle/mxfp4.py (_swizzle_cutlass_mxfp4_scales)",
            "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/experts/cutlass_moe.py (swizzle_mxfp4_scales)",
            "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/experts/deep_gemm_moe.py (DeepGemmFP4Experts)",
        ),
        # vLLM hands both kernels its loaded [w1; w3] unchanged (no reorder branch for either)
        fc1_layout=Fc1Layout.GATE_UP,
        intermediate_multiple=128,
        hidden_multiple=128,
        violations=lambda i, h, gated, e: vllm_cutlass_violations(i, h),
        aliases=("DEEPGEMM_MXFP4: the same 128 / 128 rounding and [w1; w3] order in vLLM 0.33.0's oracle",),
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.B12X,
        contract=CONTRACT,
        entry_point="flashinfer.experimental.b12x fused MoE (w4a16, source_format fp4_e8m0_k32, w13_layout w31)",
        sources=(
            "flashinfer-python 0.7.4 flashinfer/experimental/b12x/moe/fused_moe/_impl.py (_W13_LAYOUTS)",
            "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/b12x.py (B12xExperts.is_supported_config)",
        ),
        # b12x's "w31" means gate-first storage (its alias "gate_up"), rotated by b12x itself; vLLM
        # passes its [w1; w3] as "w31" unchanged
        fc1_layout=Fc1Layout.GATE_UP,
        intermediate_multiple=MXFP4_BLOCK,
        hidden_multiple=MXFP4_BLOCK,
        violations=lambda i, h, gated, e: b12x_violations(i, h),
        aliases=("B12X_MXFP4_MXFP8 shares the exact sizes; its extra H % 256 makes vLLM decline it, not pad",),
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.TRITON_SM90,
        contract=CONTRACT,
        entry_point="triton_kernels matmul_ogs (HopperMXValueLayout / HopperMXScaleLayout, mx_axis=1)",
        kernel_requires=("sm90", "triton_kernels"),
        sources=(
            "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/gpt_oss_triton_kernels_moe.py (triton_kernel_fused_experts)",
            "https://github.com/vllm-project/vllm/issues/47303",
            "https://github.com/vllm-project/vllm/pull/47910",
            "https://github.com/triton-lang/triton/pull/10800",
            "https://github.com/sgl-project/sglang/pull/36456",
        ),
        # swiglu reads gate = a[..., ::2], linear = a[..., 1::2]: gpt-oss's pairs
        fc1_layout=Fc1Layout.GATE_UP_INTERLEAVED,
        intermediate_multiple=tk.HOPPER_BLOCK_K,
        hidden_multiple=tk.HOPPER_BLOCK_K,
        violations=lambda i, h, gated, e: tk.hopper_violations(i, h),
        kernel=matmul_ogs.moe,
        tolerances={TRITON_SM90_METRIC: TRITON_SM90_TOLERANCE},
        aliases=("TRITON_UNFUSED: the same matmul_ogs weights and _swizzle_mxfp4 (vLLM TRITON_BACKENDS)",),
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.AITER_A16W4,
        contract=CONTRACT,
        entry_point="aiter fused_moe A16W4 (shuffle_weight_a16w4 / shuffle_scale_a16w4, gate_up=True)",
        sources=(
            "ROCm/aiter aiter/ops/shuffle.py (shuffle_weight_a16w4, shuffle_scale_a16w4)",
            "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/oracle/mxfp4.py (AITER_MXFP4_BF16)",
        ),
        # vLLM de-interleaves gpt-oss's pairs into [gate; up] before shuffle_weight_a16w4(gate_up=True)
        fc1_layout=Fc1Layout.GATE_UP,
        intermediate_multiple=256,
        hidden_multiple=256,
        violations=lambda i, h, gated, e: aiter_a16w4_violations(i, h),
    ),
    Mxfp4MoeRecord(
        member=Mxfp4MoeBackend.FLASHINFER_MOE_EP,
        contract=CONTRACT,
        entry_point="flashinfer.moe_ep MoEEpMegaLayer (DeepGemmMegaMoeConfig, preprocess_weights=True)",
        sources=(
            "flashinfer-python 0.7.4 flashinfer/moe_ep/backends/mega/kernel/sm100/fp8_fp4_bf16_deepgemm/staging.py",
            "vLLM 0.33.0 vllm/model_executor/layers/fused_moe/flashinfer_moe_ep.py (mxfp4_moe_ep_weights)",
        ),
        # vLLM hands the megakernel its loaded [w1; w3] unchanged (no reorder; FlashInfer's preprocessing
        # only repacks the scales for DeepGEMM)
        fc1_layout=Fc1Layout.GATE_UP,
        intermediate_multiple=MXFP4_BLOCK,
        hidden_multiple=MOE_EP_HIDDEN_MULTIPLE,
        violations=lambda i, h, gated, e: moe_ep_violations(i, h),
    ),
)
register(*RECORDS)
