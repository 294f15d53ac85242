"""The ``fp8_moe`` backends: block-scaled FP8 MoE kernels (DeepSeek-V3 style 128x128 fp32 scales), one record each.

FC1 rows arrive in the checkpoint's ``[gate; up]`` (vLLM's ``w13_weight``); FlashInfer's trtllm-gen kernel
reads ``[up; gate]`` and the engine swaps the halves after aligning, vLLM's Triton kernel reads them as they
are. Both rules are read from source (the ``sources`` of each record):

* FlashInfer 0.7.4 ``trtllm_fp8_block_scale_moe`` (``DeepSeekFp8``): ``Fp8BlockScaleLauncher::check_moe`` in
  ``csrc/trtllm_fused_moe_kernel_launcher.cu`` checks ``intermediate_size % 128 == 0`` ("intermediate_size must
  be a multiple of 128.") and ``hidden_states_scale.size(0) == hidden_size / 128``; the staged launcher checks
  ``hidden_size % 128 == 0`` as well ("Staged FP8 block-scale MoE: hidden_size must be a multiple of 128.").
  The Python docstring (``flashinfer/fused_moe/core.py``, ``valid_intermediate_size``) says the same: "a model
  dimension that is not (1856, 928) is supported by padding and declaring, not by passing it directly".
* vLLM 0.33.0's Triton fused MoE with ``block_shape = [128, 128]``: ``Fp8MoEMethod.create_weights`` calls
  ``validate_fp8_block_shape_moe``, which raises "The output_size of gate's and up's weight = I is not
  divisible by weight quantization block_n = 128" (and, at TP > 1, the same for ``block_k``); the kernel
  asserts only ``cdiv(K, block_k) == scale columns`` (``invoke_fused_moe_kernel``), and the scales are
  allocated ``ceil(H/128)`` wide, so no hidden-size rule.

Not written: an AITER CK 2-stage FP8 record (its N % 128 / K % 128 rule is AITER #5413's subject, known only
from the issue, not read in AITER's source here) and vLLM's DeepGEMM / CUTLASS block-FP8 paths.
"""

from __future__ import annotations

import enum

import torch

from backends import register
from backends.moe import MoeBackendRecord
from contracts.moe import FP8_MOE
from reference.fp8 import FP8_BLOCK
from reference.layouts import Fc1Layout

CONTRACT = FP8_MOE


class Fp8MoeBackend(enum.Enum):
    """MoE backends consuming block-scaled FP8 weights."""

    FLASHINFER_TRTLLM = "flashinfer-trtllm-fp8-block"  # trtllm_fp8_block_scale_moe, DeepSeekFp8 (SM100)
    TRITON = "triton-fp8-block"  # vLLM's fused_moe Triton kernel, block_shape [128, 128]


def trtllm_fp8_block_violations(intermediate: int, hidden: int) -> list[str]:
    """Why FlashInfer 0.7.4's ``trtllm_fp8_block_scale_moe`` rejects FP8 experts padded to ``(Ip, Hp)``:
    ``Ip % 128`` and ``Hp % 128`` (its launcher's ``check_moe``)."""
    problems = []
    if intermediate % FP8_BLOCK:
        problems.append(
            f"intermediate size {intermediate} is not a multiple of {FP8_BLOCK} (FlashInfer: "
            "'intermediate_size must be a multiple of 128.'; pad and declare valid_intermediate_size)"
        )
    if hidden % FP8_BLOCK:
        problems.append(
            f"hidden size {hidden} is not a multiple of {FP8_BLOCK} (FlashInfer: 'hidden_size must be a multiple of "
            "128.'; hidden_states_scale is [hidden_size / 128, T])"
        )
    return problems


def triton_fp8_block_violations(intermediate: int, hidden: int) -> list[str]:
    """Why vLLM 0.33.0's block-FP8 MoE (Triton kernel) rejects experts padded to ``(Ip, Hp)``: ``Ip % 128``
    (``validate_fp8_block_shape_moe``: gate/up output size by ``block_n``, down's input size by ``block_k``);
    the hidden size is free (``ceil(H/128)`` scale columns, which the kernel's assert asks)."""
    if intermediate % FP8_BLOCK:
        return [
            f"The output_size of gate's and up's weight = {intermediate} is not divisible by weight quantization "
            f"block_n = {FP8_BLOCK} (vLLM validate_fp8_block_shape_moe)"
        ]
    return []


TRITON_FP8_ON_CUDA = ("aiter_triton",)
"""Markers of the Triton block-FP8 kernel property (``conformance/test_fp8_moe_triton_kernel.py``): an NVIDIA GPU
and amd-aiter, whose Triton ``fused_moe`` is a port of vLLM's ``fused_moe_kernel`` with the same block-scale
indexing (:func:`adapters.aiter_triton.fused_moe_fp8_block`)."""

HOPPER_FP8_MMA_ERROR = 2.0**-10
"""Per 128-wide K tile, the error of the FP8 ``tl.dot`` relative to the tile's ``Σ |a·b|``. E4M3 x E4M3 products
are exact (4-bit significands), but Hopper's FP8 tensor cores keep only about 14 bits of the running sum
(DeepSeek-V3 Technical Report, arXiv:2412.19437, §3.3.2, "Increasing Accumulation Precision"): each of the
tile's 128 / 32 = 4 MMA k-steps may truncate at most ``2^-12`` of the magnitude added so far, ``4 · 2^-12``. The
kernel then leaves the tensor core every tile, as DeepSeek's promotion does: the tile's sum is scaled in fp32
and added to an fp32 accumulator."""


def triton_fp8_block_tolerance(exact: torch.Tensor, magnitude: torch.Tensor, k: int) -> torch.Tensor:
    """Per-element bound of one block-FP8 GEMM of the Triton kernel against the exact product of its dequantized
    inputs (``exact``, ``magnitude = Σ |a·b|``, reduction length ``k``):
    ``2^-8 |exact|`` (the bf16 output, round to nearest) ``+ (HOPPER_FP8_MMA_ERROR + 3 · ceil(k/128) · 2^-24) ·
    magnitude`` (the tensor core per tile; per tile two fp32 scale multiplies and one fp32 add)."""
    tiles = -(-k // FP8_BLOCK)
    return 2.0**-8 * exact.abs() + (HOPPER_FP8_MMA_ERROR + 3 * tiles * 2.0**-24) * magnitude


RECORDS = (
    MoeBackendRecord(
        member=Fp8MoeBackend.FLASHINFER_TRTLLM,
        contract=CONTRACT,
        entry_point="flashinfer.fused_moe.trtllm_fp8_block_scale_moe (Fp8QuantizationType.DeepSeekFp8)",
        sources=(
            "flashinfer-python 0.7.4 flashinfer/data/csrc/trtllm_fused_moe_kernel_launcher.cu "
            "(Fp8BlockScaleLauncher::check_moe, "
            "Fp8BlockScaleStagedMoeLauncher: intermediate_size % 128, hidden_size % 128)",
            "flashinfer-python 0.7.4 flashinfer/fused_moe/core.py (trtllm_fp8_block_scale_moe docstring: "
            "valid_intermediate_size)",
            "https://github.com/vllm-project/vllm/issues/54178",
        ),
        fc1_layout=Fc1Layout.UP_GATE,
        intermediate_multiple=FP8_BLOCK,
        hidden_multiple=FP8_BLOCK,
        violations=lambda i, h, gated, e: trtllm_fp8_block_violations(i, h),
    ),
    MoeBackendRecord(
        member=Fp8MoeBackend.TRITON,
        contract=CONTRACT,
        entry_point="vllm.model_executor.layers.fused_moe.fused_moe.invoke_fused_moe_kernel (block_shape [128, 128])",
        sources=(
            "vllm 0.33.0 vllm/model_executor/layers/quantization/fp8.py (Fp8MoEMethod.create_weights)",
            "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/fp8_utils.py (validate_fp8_block_shape_moe)",
            "vllm 0.33.0 vllm/model_executor/layers/fused_moe/fused_moe.py (invoke_fused_moe_kernel block_shape asserts)",
            "https://github.com/vllm-project/vllm/pull/55867",
        ),
        fc1_layout=Fc1Layout.GATE_UP,
        intermediate_multiple=FP8_BLOCK,
        hidden_multiple=1,
        violations=lambda i, h, gated, e: triton_fp8_block_violations(i, h),
    ),
)

register(*RECORDS)
