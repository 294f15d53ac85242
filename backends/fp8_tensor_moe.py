"""The ``fp8_tensor_moe`` backends: per-tensor FP8 MoE kernels (E4M3 weights, one fp32 scale per weight), one record each.

FC1 rows arrive in the checkpoint's ``[gate; up]`` (vLLM's ``w13_weight``); FlashInfer's trtllm-gen kernels read
``[up; gate]`` and the engine swaps the halves after aligning. The rule is read from source (the record's
``sources``):

* FlashInfer 0.7.4's staged per-tensor FP8 MoE (``trtllm_moe_run_routing_fp8_per_tensor``, the routing and
  external-GEMM path): ``Fp8PerTensorStagedMoeLauncher::check_moe`` in ``csrc/trtllm_fused_moe_kernel_launcher.cu``
  checks ``hidden_size % 128 == 0`` ("Staged FP8 MoE: hidden_size must be a multiple of 128.") and
  ``intermediate_size % 128 == 0`` ("Staged FP8 MoE: intermediate_size must be a multiple of 128.").

Not written: the fused ``trtllm_fp8_per_tensor_scale_moe`` (``Fp8PerTensorLauncher``), which vLLM 0.33.0 calls:
its ``check_moe`` states no size rule (its ``prepare_moe`` allocates ``2·I/128`` rows of GEMM1 output scales, an
integer division), and vLLM pads gated experts only to 16 for it (``quantization/utils/flashinfer_utils.py``:
``min_alignment = 16 if is_gated else 128``, ``align_moe_weights_for_fi``); what its kernels accept there is not
read from source here.
"""

from __future__ import annotations

import enum

from backends import register
from backends.moe import MoeBackendRecord
from contracts.moe import FP8_TENSOR_MOE
from reference.layouts import Fc1Layout

CONTRACT = FP8_TENSOR_MOE

STAGED_MULTIPLE = 128
"""What FlashInfer 0.7.4's staged per-tensor FP8 MoE launcher needs of the intermediate and hidden sizes."""


class Fp8TensorMoeBackend(enum.Enum):
    """MoE backends consuming per-tensor FP8 weights."""

    FLASHINFER_TRTLLM_STAGED = "flashinfer-trtllm-fp8-tensor-staged"  # trtllm_moe_run_routing_fp8_per_tensor


def trtllm_staged_violations(intermediate: int, hidden: int) -> list[str]:
    """Why FlashInfer 0.7.4's staged per-tensor FP8 MoE rejects experts padded to ``(Ip, Hp)``: ``Ip % 128`` and
    ``Hp % 128`` (``Fp8PerTensorStagedMoeLauncher::check_moe``)."""
    problems = []
    if intermediate % STAGED_MULTIPLE:
        problems.append(
            f"intermediate size {intermediate} is not a multiple of {STAGED_MULTIPLE} (FlashInfer: 'Staged FP8 MoE: "
            "intermediate_size must be a multiple of 128.')"
        )
    if hidden % STAGED_MULTIPLE:
        problems.append(
            f"hidden size {hidden} is not a multiple of {STAGED_MULTIPLE} (FlashInfer: 'Staged FP8 MoE: hidden_size "
            "must be a multiple of 128.')"
        )
    return problems


RECORDS = (
    MoeBackendRecord(
        member=Fp8TensorMoeBackend.FLASHINFER_TRTLLM_STAGED,
        contract=CONTRACT,
        entry_point="flashinfer trtllm_moe_run_routing_fp8_per_tensor (staged per-tensor FP8 MoE)",
        sources=(
            "flashinfer-python 0.7.4 flashinfer/data/csrc/trtllm_fused_moe_kernel_launcher.cu "
            "(Fp8PerTensorStagedMoeLauncher::check_moe: hidden_size % 128, intermediate_size % 128)",
            "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/flashinfer_utils.py "
            "(align_moe_weights_for_fi: gated per-tensor FP8 padded to 16)",
        ),
        fc1_layout=Fc1Layout.UP_GATE,
        intermediate_multiple=STAGED_MULTIPLE,
        hidden_multiple=STAGED_MULTIPLE,
        violations=lambda i, h, gated, e: trtllm_staged_violations(i, h),
    ),
)

register(*RECORDS)
