"""Subjects of the ``fp8_tensor_moe`` contract: padding per-tensor FP8 MoE expert weights for a kernel.

The protocol is :class:`contracts.moe.MoeAlignment` with ``block =`` :data:`~reference.fp8.FP8_TENSOR_BLOCK`
weights (E4M3 bytes, one fp32 scale per weight and gated FC1 half) whose FC1 rows are in the checkpoint's
``[gate; up]``; the backends and their rules are the records of :mod:`backends.fp8_tensor_moe`. Subjects shipped
here: the correct built-in policy and one known-bad one reproducing vLLM 0.33.0's padding.
"""

from __future__ import annotations

from backends import record
from backends.fp8_tensor_moe import CONTRACT, Fp8TensorMoeBackend
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights, pad_moe
from reference.errors import ShapeContractError
from reference.fp8 import FP8_TENSOR_BLOCK
from reference.sizes import round_up
from subjects.registry import Subject, register_contract, register_subject

VLLM_GATED_ALIGNMENT = 16
"""vLLM 0.33.0's padding of a gated per-tensor FP8 rank for FlashInfer (``min_alignment = 16 if is_gated else
128`` before ``align_moe_weights_for_fi``, ``quantization/utils/flashinfer_utils.py``)."""
VLLM_UNGATED_ALIGNMENT = 128
"""The same for non-gated experts."""


def _per_tensor(weights: MoeWeights) -> MoeWeights:
    if weights.block != FP8_TENSOR_BLOCK:
        raise ShapeContractError(f"fp8_tensor_moe takes per-tensor FP8 weights, got block {weights.block}")
    return weights


class BuiltinFp8TensorMoeAlignment:
    """Correct policy: per-half zero padding of the weights to the backend record's multiples (the per-weight
    scales stay as they are)."""

    def align_moe(self, backend: Fp8TensorMoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        r = record(backend)
        ip = round_up(weights.intermediate_size, r.intermediate_multiple)
        hp = round_up(weights.hidden_size, r.hidden_multiple)
        return pad_moe(_per_tensor(weights), gated, ip, hp)


class Pad16Alignment:
    """vLLM 0.33.0's FlashInfer per-tensor FP8 MoE padding: a gated rank's intermediate size to a multiple of 16
    (non-gated: 128), the hidden size unpadded, whatever the kernel (Qwen3.8-Flash-Next at TP=8: 80 per rank
    stays 80, which FlashInfer's staged per-tensor launcher rejects)."""

    def align_moe(self, backend: Fp8TensorMoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        multiple = VLLM_GATED_ALIGNMENT if gated else VLLM_UNGATED_ALIGNMENT
        ip = round_up(weights.intermediate_size, multiple)
        return pad_moe(_per_tensor(weights), gated, ip, weights.hidden_size)


register_contract(CONTRACT, MoeAlignment, BuiltinFp8TensorMoeAlignment(), tuple(Fp8TensorMoeBackend))
register_subject(
    Subject(
        "bad-fp8-per-tensor-pad16",
        "per-tensor FP8 MoE: a gated rank's intermediate size padded to 16 (128 non-gated), the hidden size unpadded",
        {CONTRACT: Pad16Alignment()},
        reproduces="vLLM 0.33.0 align_moe_weights_for_fi (min_alignment 16 if gated) against FlashInfer 0.7.4's "
        "staged per-tensor FP8 MoE (intermediate_size % 128)",
    )
)
