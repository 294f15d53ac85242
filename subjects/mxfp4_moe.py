"""Subjects of the ``mxfp4_moe`` contract: rounding, padding and FC1 row layout of MXFP4 MoE experts per backend.

The protocol is :class:`contracts.moe.MoeAlignment` with ``block = 32`` weights in the checkpoint's
FC1 layout (``weights.fc1_layout``): stacked ``[gate; up]`` (Quark OCP-MX, DeepSeek-V4, MiniMax) or
row-interleaved ``[g0, u0, g1, u1, ...]`` (gpt-oss), at the loader's shard size (the last rank of
a whole-block split holds zeros past its real channels). A policy rounds ``(I, H)`` for the backend,
pads with zeros and converts FC1 rows to the order the backend's kernel reads (vLLM's
``mxfp4_round_up_hidden_size_and_intermediate_size`` plus the reorder part of
``convert_to_mxfp4_moe_kernel_format``); the multiples and the FC1 order are the backend records'
(:mod:`backends.mxfp4_moe`). The libraries' own shuffles and scale swizzles stay with the
properties, which apply them and check they accept the result.

Subjects shipped here: the correct built-in policy and seven known-bad ones reproducing real bugs.
"""

from __future__ import annotations

from dataclasses import replace

from backends import record
from backends.mxfp4_moe import CONTRACT, Mxfp4MoeBackend
from contracts.errors import UnsupportedConfig
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights, pad_moe, relayout_moe
from reference.errors import ShapeContractError
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.sizes import round_up
from subjects.moe_bugs import pad_fused_block_at_end
from subjects.registry import Subject, register_contract, register_subject


def _check_input(weights: MoeWeights, gated: bool) -> None:
    if weights.block != MXFP4_BLOCK:
        raise ShapeContractError(f"mxfp4_moe takes MXFP4 weights (32-element groups), got block {weights.block}")
    if not gated:
        raise UnsupportedConfig("the MXFP4 MoE backends here run gated SwiGLU experts only")
    for name, size in (("intermediate", weights.intermediate_size), ("hidden", weights.hidden_size)):
        if size % MXFP4_BLOCK:
            raise ShapeContractError(f"{name} size {size} is not a whole number of 32-element MXFP4 blocks")


class BuiltinMxfp4MoeAlignment:
    """Correct policy: round to the backend record's multiples, zero-pad in the checkpoint layout,
    reorder FC1 rows to the order the backend's kernel reads."""

    def sizes(self, backend: Mxfp4MoeBackend, weights: MoeWeights) -> tuple[int, int]:
        """The padded ``(Ip, Hp)`` for ``backend``."""
        r = record(backend)
        return round_up(weights.intermediate_size, r.intermediate_multiple), round_up(
            weights.hidden_size, r.hidden_multiple
        )

    def align_moe(self, backend: Mxfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        _check_input(weights, gated)
        ip, hp = self.sizes(backend, weights)
        padded = pad_moe(weights, gated, ip, hp)
        return AlignedMoe(relayout_moe(padded.weights, record(backend).fc1_layout), ip, hp)


class RoundingAlignment(BuiltinMxfp4MoeAlignment):
    """The built-in policy, except that ``backend`` rounds ``(I, H)`` to other multiples."""

    def __init__(self, backend: Mxfp4MoeBackend, intermediate_multiple: int, hidden_multiple: int) -> None:
        self.backend, self.multiples = backend, (intermediate_multiple, hidden_multiple)

    def sizes(self, backend: Mxfp4MoeBackend, weights: MoeWeights) -> tuple[int, int]:
        if backend is not self.backend:
            return super().sizes(backend, weights)
        im, hm = self.multiples
        return round_up(weights.intermediate_size, im), round_up(weights.hidden_size, hm)


class MarlinConcatPaddingAlignment(BuiltinMxfp4MoeAlignment):
    """Marlin's older MoE prep: the concatenated ``[w1; w3]`` block padded at its end (M4)."""

    def align_moe(self, backend: Mxfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if backend is not Mxfp4MoeBackend.MARLIN:
            return super().align_moe(backend, weights, gated)
        _check_input(weights, gated)
        ip, hp = self.sizes(backend, weights)
        return pad_fused_block_at_end(relayout_moe(weights, Fc1Layout.GATE_UP), gated, ip, hp)


class AssumeInterleavedAlignment(BuiltinMxfp4MoeAlignment):
    """Converts every checkpoint as if it were gpt-oss's row-interleaved one (vLLM's
    ``convert_to_mxfp4_moe_kernel_format`` de-interleaves / swaps pairs unconditionally)."""

    def align_moe(self, backend: Mxfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        return super().align_moe(backend, replace(weights, fc1_layout=Fc1Layout.GATE_UP_INTERLEAVED), gated)


register_contract(CONTRACT, MoeAlignment, BuiltinMxfp4MoeAlignment(), tuple(Mxfp4MoeBackend))

TRITON_ODD_GROUP_FAILURES = (
    ("check_backend_accepts", r"FC1: K \d+ has an odd number of 32-element groups"),
    ("check_triton_hopper_scale_layout", r"w13_scale \[.*\] through HopperMXScaleLayout: K \d+ has an odd number"),
)
"""``(check, message)`` of what an engine that hands ``triton-kernels-sm90`` an FC1 K with an odd number of
32-element groups fails (:func:`adapters.triton_kernels.gemm_violations`), for the engines' ledger entries."""

KNOWN_BAD = (
    Subject(
        "bad-trtllm-round64",
        "FlashInfer TRT-LLM MXFP4 intermediate rounded to 64 (the NVFP4 gated rule), not 128",
        {CONTRACT: RoundingAlignment(Mxfp4MoeBackend.FLASHINFER_TRTLLM, 64, 256)},
        reproduces="EuroEval PR #2079 / SGLang PR #16824 (trtllm-gen 'intermediate_size % 128' with I = 448 / 64)",
    ),
    Subject(
        "bad-sm90-unpadded",
        "FlashInfer CUTLASS SM90 MXFP4 sizes left at the shard size (whole 32-blocks only)",
        {CONTRACT: RoundingAlignment(Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, MXFP4_BLOCK, MXFP4_BLOCK)},
        reproduces="SGLang #26250 (DeepSeek-V4-Pro TP16 on SM90 flashinfer_mxfp4: I = 192 not a multiple of 128)",
    ),
    Subject(
        "bad-aiter-round128",
        "AITER MXFP4 MoE intermediate rounded to 128 instead of 256",
        {CONTRACT: RoundingAlignment(Mxfp4MoeBackend.AITER, 128, 256)},
        reproduces="vLLM PR #55104 (blocked by AITER #5233: CK-Tile stage 2 mis-indexes scales, MiniMax-M3 TP8)",
    ),
    Subject(
        "bad-marlin-round128",
        "Marlin MXFP4 MoE rounded like vLLM's oracle (I to 128, H to 256) instead of minimally",
        {CONTRACT: RoundingAlignment(Mxfp4MoeBackend.MARLIN, 128, 256)},
        reproduces="vLLM PR #56697 (DeepSeek-V4.1-Flash TP8: 288 -> 384 instead of 320, 7.8 GiB)",
    ),
    Subject(
        "bad-marlin-concat-padding",
        "Marlin MXFP4 MoE: the concatenated [w1; w3] block zero-padded at its end instead of per shard",
        {CONTRACT: MarlinConcatPaddingAlignment()},
        reproduces="vLLM prepare_nvfp4_moe_layer_for_marlin before per-shard padding (docs/regressions.md M4)",
    ),
    Subject(
        "bad-assume-interleaved",
        "every MXFP4 checkpoint converted as gpt-oss's row-interleaved one, stacked [gate; up] included",
        {CONTRACT: AssumeInterleavedAlignment()},
        reproduces="ROCm/ATOM PR #885 and vLLM PR #29273 (gate/up form mismatch: gpt-oss gsm8k ~0)",
    ),
    Subject(
        "bad-triton-hopper-scale-k",
        "triton_kernels on Hopper: vLLM's sizes (I to 64, H unchanged) without padding the scale groups along K "
        "to whole 128-element tiles",
        {CONTRACT: RoundingAlignment(Mxfp4MoeBackend.TRITON_SM90, 64, MXFP4_BLOCK)},
        reproduces="vLLM #47303 (gpt-oss on H100/H200, K 2880: 90 scale groups stored, 92 read, GSM8K 0 %); "
        "fixed by vLLM PR #47910",
    ),
    Subject(
        "bad-triton-odd-groups",
        "triton_kernels on Hopper: I rounded to 32 (H to 128), so FC2's K may hold an odd number of 32-element "
        "groups, which matmul_ogs computes wrongly without an error",
        {CONTRACT: RoundingAlignment(Mxfp4MoeBackend.TRITON_SM90, MXFP4_BLOCK, 128)},
        reproduces="the odd-group defect measured on the H200 (backends/truth/triton-kernels-sm90.sm90.json; "
        "backends.kernel_defects.TRITON_KERNELS_MOE_DEFECTS)",
    ),
)
for _subject in KNOWN_BAD:
    register_subject(_subject)
