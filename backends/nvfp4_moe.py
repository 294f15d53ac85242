"""The ``nvfp4_moe`` backends: FlashInfer's two NVFP4 MoE kernels, one record each.

FC1 rows arrive in FlashInfer's ``[up; gate]`` (vLLM swaps ``[w1; w3]`` before aligning) and both
kernels read them so. The built-in policy pads each half of a gated layer's intermediate to a
multiple of 64 and a non-gated one to 128: trtllm-gen's FC1 scale rows ``F·Ip`` must be a multiple of
128 (scale row shuffle) and ``Ip/16`` a multiple of 4 (the swizzled scale is viewed back as
``[rows, Ip/16]``); CUTLASS's 128x4 swizzle must add no FC1 rows, which gives the same ``Ip``. The
hidden size goes to 256 for trtllm-gen (FlashInfer 0.7.4: NVFP4 hidden must be a multiple of 256) and
to 16 for CUTLASS (TMA alignment of FP4 activations; FlashInfer's own tests run H = 160 and 288; its
``prepare_cutlass_nvfp4_weights`` helper asks ``H % 64``, but vLLM does not use that helper).
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from adapters import b12x, vllm_cutlass_moe
from adapters import flashinfer as fi
from adapters import flashinfer_cutedsl as cutedsl
from adapters import flashinfer_moe_kernels as kernels
from backends import register
from backends.moe import MoeBackendRecord
from contracts.moe import NVFP4_MOE
from reference.layouts import Fc1Layout
from reference.moe import ActivationKind

CONTRACT = NVFP4_MOE


class Nvfp4MoeBackend(enum.Enum):
    """FlashInfer MoE backends consuming NVFP4 weights."""

    FLASHINFER_TRTLLM = "flashinfer-trtllm"  # trtllm_fp4_block_scale_moe (SM100)
    FLASHINFER_CUTLASS = "flashinfer-cutlass"  # cutlass_fused_moe NVFP4 (SM100+)
    FLASHINFER_TRTLLM_PER_TOKEN = "flashinfer-trtllm-per-token"  # trtllm-gen, dynamic per-token activation scale
    FLASHINFER_CUTEDSL = "flashinfer-cutedsl"  # cute_dsl_fused_moe w4a4 (SM100/SM103)
    B12X = "b12x"  # the b12x library's fused MoE, W4A4 (SM120/SM121)
    VLLM_CUTLASS = "vllm-cutlass"  # vLLM's own cutlass_moe_fp4 (SM100)


@dataclass(frozen=True)
class Fp4OutputBound:
    """Kernel vs reference, per output element: ``|d| <= atol_fraction·‖ref‖∞ + rtol·|ref|`` for all but
    a ``max_outliers`` fraction of elements, and ``|d| <= gross·‖ref‖∞`` for every element.

    Tolerance (|kernel - reference| per output element, ref = reference output [T, H]):

    * inputs and weights are exact: activations sit on the NVFP4 grid (re-quantizing them is the
      identity, checked below), the weights are the very bytes the kernel reads, and the routing
      logits are separated so the kernel's top-k (which may compare bf16 scores) picks the
      reference's experts;
    * the reference rounds the activated intermediate to bf16 and NVFP4-quantizes it with the
      kernel's global scale, as FlashInfer's own references do, so the re-quantization itself is
      shared. What differs is its input: fp32 accumulation order, CUTLASS's bf16 GEMM1 output,
      fast-math activations (trtllm-gen's GeGLU phi may be erf where Gemma uses tanh, |diff| < 1e-3)
      and the kernel's approximate reciprocal ``rcp(sf · rcp(gs))``. These move an element by
      ~2^-8 relative, which changes its E2M1 code only next to a rounding midpoint (half a step,
      <= sf/gs) and a block's E4M3 scale only next to an E4M3 midpoint (2^-4 relative). Such a flip
      moves one intermediate element by at most one E2M1 step times its block scale (<= 1/3 of the
      block amax), i.e. one FC2 output row by that step times W2's column: isolated in count, not
      in size;
    * bf16 output and bf16 routing weights add 2^-8 relative each; fp32 FC2 accumulation ~1e-6.

    So the bound is norm-relative, as in FlashInfer's unified MoE fuzzer (``atol_frac`` 0.15 and
    rtol 0.1 for NVFP4, "calibrated: obs ratio <= 0.077" on B200, 75 %-sparse snapped inputs):
    ``|d| <= 0.15·‖ref‖∞ + 0.1·|ref|``. Because a flip lands on whole rows and our weights are dense
    with block scales spanning 2^8, a small fraction of elements may exceed it (MAX_OUTLIERS; below
    100 elements that is none); no element may exceed GROSS·‖ref‖∞. A CPU emulation of both
    kernels' documented arithmetic (bf16 GEMM1 output and intermediate, bf16 routing weights and
    output, erf GeGLU) on ~150 drawn shapes stayed at <= 0.093·‖ref‖∞ with no element over the
    bound, while end-padded FC1 (vLLM #55649) gave 0.86-1.44·‖ref‖∞ and 20-33 % of elements over it.
    The worst ratio is fed to ``hypothesis.target`` so generation hunts for the edge.
    """

    atol_fraction: float
    rtol: float
    max_outliers: float
    gross: float


FLASHINFER_FP4_BOUND = Fp4OutputBound(atol_fraction=0.15, rtol=0.1, max_outliers=0.01, gross=0.5)


@dataclass(frozen=True, kw_only=True)
class Nvfp4MoeRecord(MoeBackendRecord):
    """An NVFP4 MoE backend (the common fields: :class:`backends.moe.MoeBackendRecord`).

    ``intermediate_multiple_non_gated`` and ``hidden_multiple_non_gated`` (where a non-gated layer needs
    more than ``hidden_multiple``; ``None``: the same): what the built-in policy rounds a non-gated layer to.
    ``prepare(aligned, gated)``: the library's weight preparation the suite can undo (``None``: the
    kernel reads the padded tensors as they are). ``kernel(aligned, x, logits, top_k, activation,
    scales, **valid_sizes)``: the kernel runner, output ``[T, Hp]``; ``kernel_activations``: the
    activations it runs (the adapter's table); ``tolerance``: its bound.
    ``padding_reference``: FlashInfer's ``pad_trtllm_moe_weights`` hidden alignment the kernel is
    compared with where the unpadded layer cannot run, and ``declares_valid_sizes``: whether that run
    passes ``valid_intermediate_size`` / ``valid_hidden_size``. ``kernel_hint(Ip)``: a triage note
    attached to kernel failures (empty when none applies).
    """

    intermediate_multiple_non_gated: int
    kernel_activations: tuple[ActivationKind, ...] = ()
    tolerance: Fp4OutputBound | None = None
    padding_reference: int | None = None
    declares_valid_sizes: bool = False
    kernel_hint: Callable[[int], str] | None = None
    hidden_multiple_non_gated: int | None = None

    OPTIONAL: ClassVar[frozenset[str]] = MoeBackendRecord.OPTIONAL | {
        "declares_valid_sizes",
        "kernel_hint",
        "hidden_multiple_non_gated",
        # A record without a kernel runner (no kernel_requires; tests/test_backends.py checks the pairing).
        "kernel_activations",
        "tolerance",
        "padding_reference",
    }

    def hidden_multiple_for(self, gated: bool) -> int:
        """The multiple the built-in policy rounds the hidden size of a (non-)gated layer to."""
        if gated or self.hidden_multiple_non_gated is None:
            return self.hidden_multiple
        return self.hidden_multiple_non_gated


def _trtllm_intermediate_hint(intermediate: int) -> str:
    """The open question of trtllm-gen runs whose intermediate size is not a multiple of 128."""
    if intermediate % 128 == 0:
        return ""
    return (
        f"Ip = {intermediate} ≡ {intermediate % 128} (mod 128): FlashInfer 0.7.4 documents "
        "intermediate_size % 128 == 0 (valid_intermediate_size); if only such shapes fail, the gated 64 rule "
        "(vLLM #46880) is insufficient for trtllm-gen"
    )


RECORDS = (
    Nvfp4MoeRecord(
        member=Nvfp4MoeBackend.FLASHINFER_TRTLLM,
        contract=CONTRACT,
        entry_point="flashinfer.fused_moe.trtllm_fp4_block_scale_moe",
        requires=("flashinfer",),
        kernel_requires=("sm100", "flashinfer"),
        sources=(
            "flashinfer-python 0.7.4 flashinfer/fused_moe/core.py (row-index helpers, pad_trtllm_moe_weights)",
            "https://github.com/vllm-project/vllm/issues/46879",
        ),
        fc1_layout=Fc1Layout.UP_GATE,
        intermediate_multiple=64,
        intermediate_multiple_non_gated=128,
        hidden_multiple=256,
        violations=lambda i, h, gated, e: fi.trtllm_nvfp4_violations(i, h, gated),
        prepare=kernels.trtllm_fp4_weights,
        kernel=kernels.run_trtllm_fp4_moe,
        kernel_activations=tuple(kernels.TRTLLM_ACTIVATIONS),
        tolerance=FLASHINFER_FP4_BOUND,
        padding_reference=256,
        declares_valid_sizes=True,
        kernel_hint=_trtllm_intermediate_hint,
    ),
    Nvfp4MoeRecord(
        member=Nvfp4MoeBackend.FLASHINFER_CUTLASS,
        contract=CONTRACT,
        entry_point="flashinfer.fused_moe.cutlass_fused_moe",
        kernel_requires=("sm100", "flashinfer"),
        sources=(
            "flashinfer-ai/flashinfer tests/moe/test_trtllm_cutlass_fused_moe.py (test_moe_nvfp4)",
            "https://github.com/vllm-project/vllm/issues/57125",
        ),
        fc1_layout=Fc1Layout.UP_GATE,
        intermediate_multiple=64,
        intermediate_multiple_non_gated=128,
        hidden_multiple=16,
        violations=lambda i, h, gated, e: fi.cutlass_nvfp4_violations(i, h, gated),
        kernel=kernels.run_cutlass_fp4_moe,
        kernel_activations=tuple(kernels.CUTLASS_ACTIVATIONS),
        tolerance=FLASHINFER_FP4_BOUND,
        padding_reference=128,  # FC1's K then equals FC2's rows, the shape cutlass_fused_moe needs
    ),
)
PER_TOKEN_RECORD = Nvfp4MoeRecord(
    member=Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN,
    contract=CONTRACT,
    entry_point="flashinfer.fused_moe.trtllm_fp4_block_scale_moe (per_token_scale)",
    requires=("flashinfer",),
    sources=(
        "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/flashinfer_utils.py",
        "vllm 0.33.0 vllm/model_executor/layers/quantization/modelopt.py",
        "https://github.com/vllm-project/vllm/pull/39510",
    ),
    fc1_layout=Fc1Layout.UP_GATE,
    intermediate_multiple=64,
    intermediate_multiple_non_gated=128,
    hidden_multiple=256,
    hidden_multiple_non_gated=512,
    violations=lambda i, h, gated, e: fi.trtllm_per_token_nvfp4_violations(i, h, gated),
    prepare=kernels.trtllm_fp4_weights,
)
"""trtllm-gen with a dynamic per-token activation scale (ModelOpt ``kNvfp4DynamicToken`` checkpoints).

Weights, FC1 order and preparation are those of ``flashinfer-trtllm``; a non-gated layer's hidden size
goes to 512 instead of 256 (vLLM 0.33.0 ``trtllm_nvfp4_hidden_alignment``). That 512 is a tactic rule,
not a correctness rule: vLLM's docstring says the per-token non-gated cubins have "far fewer tile
configs for 256-aligned K" and the heuristic default tactic fails with "No valid config found"
(Nemotron H 2688 -> 2816). The failure is a hard launch error, never silently wrong output, and only
the default (untuned) tactic is concerned; since that is how vLLM runs the layer, the suite treats
``Hp % 512`` as an acceptance rule, so the minimal-padding property does not call 512 over-padding.
No kernel runner: the suite's trtllm-gen runner passes per-tensor activation scales, so this record's
kernel property is not written (its kernel would need ``sm100``)."""

CUTEDSL_RECORD = Nvfp4MoeRecord(
    member=Nvfp4MoeBackend.FLASHINFER_CUTEDSL,
    contract=CONTRACT,
    entry_point="flashinfer.fused_moe.cute_dsl_fused_moe (quant_mode='w4a4', swap_ab=False)",
    sources=(
        "flashinfer-python 0.7.4 flashinfer/fused_moe/cute_dsl/fused_moe.py",
        "flashinfer-python 0.7.4 flashinfer/fused_moe/cute_dsl/blockscaled_contiguous_gather_grouped_gemm_act_fusion.py",
        "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/flashinfer_fp4_moe.py",
        "https://github.com/NVIDIA/TensorRT-LLM/pull/18520",
    ),
    fc1_layout=Fc1Layout.UP_GATE,
    intermediate_multiple=64,
    intermediate_multiple_non_gated=128,
    hidden_multiple=256,
    violations=lambda i, h, gated, e: cutedsl.cutedsl_nvfp4_violations(i, h, gated),
    prepare=cutedsl.cutedsl_fp4_weights,
    kernel_requires=("sm100", "flashinfer"),
    kernel=cutedsl.run_cutedsl_fp4_moe,
    kernel_activations=tuple(cutedsl.CUTEDSL_ACTIVATIONS),
    tolerance=FLASHINFER_FP4_BOUND,
    padding_reference=256,  # FlashInfer's pad_trtllm_moe_weights, H to the CuteDSL K tile; no valid sizes
)
"""FlashInfer's CuteDSL NVFP4 MoE (vLLM 0.33.0 ``FLASHINFER_CUTEDSL``).

The contract's ``[up; gate]`` halves, padded per half, are what it starts from; its preparation
(``prepare``: :func:`adapters.flashinfer_cutedsl.cutedsl_fp4_weights`) regroups gated FC1 rows into 64-row
up/gate groups and 128x4-swizzles the scales. GEMM1's ``F·Ip % 128`` gives the same ``Ip`` multiples as
trtllm-gen (64 gated, 128 non-gated), and its K tile the hidden 256. A padding that ends the fused block
(the TensorRT-LLM #18520 loader: CuteDSL raised "rows of Interleaved block scales should be multiple of
128", CUTLASS mispaired silently) is ``bad-end-padding``'s bug. Its kernel properties
(:func:`adapters.flashinfer_cutedsl.run_cutedsl_fp4_moe`, ``sm100`` plus nvidia-cutlass-dsl) use the
FlashInfer FP4 bound: the CuteDSL kernels re-quantize the intermediate with the same encode scale and
accumulate in fp32 like the CUTLASS one, so the error argument carries over; it has not been measured on
this backend (no SM100 GPU has run it)."""

B12X_RECORD = Nvfp4MoeRecord(
    member=Nvfp4MoeBackend.B12X,
    contract=CONTRACT,
    entry_point="b12x.moe.fused_moe.prepare_weights (vLLM B12xExperts, quant mode 'nvfp4')",
    sources=(
        "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/b12x_moe.py",
        "vllm 0.33.0 vllm/model_executor/layers/fused_moe/b12x.py",
    ),
    fc1_layout=Fc1Layout.GATE_UP,
    intermediate_multiple=64,
    intermediate_multiple_non_gated=128,
    hidden_multiple=16,
    violations=lambda i, h, gated, e: b12x.b12x_nvfp4_violations(i, h, gated),
)
"""The ``b12x`` library's NVFP4 MoE (vLLM 0.33.0 ``B12X``, SM120/SM121).

Its kernel reads W4A4 FC1 as ``[gate; up]`` (b12x's ``"w31"``): the contract's ``[up; gate]`` is swapped
by the engine. Each gated half goes to 64 so the 128x4 scale swizzle adds no FC1 rows; a non-gated layer
to 128; the hidden size only to whole NVFP4 blocks (:func:`adapters.b12x.b12x_nvfp4_violations`). No
preparation the suite can undo on CPU and no kernel runner (the kernel needs an SM120 GPU, which the
suite's hardware markers do not name)."""

VLLM_CUTLASS_RECORD = Nvfp4MoeRecord(
    member=Nvfp4MoeBackend.VLLM_CUTLASS,
    contract=CONTRACT,
    entry_point="vllm._custom_ops.cutlass_fp4_moe_mm (vLLM run_cutlass_moe_fp4)",
    sources=(
        "vllm 0.33.0 vllm/model_executor/layers/fused_moe/experts/cutlass_moe.py",
        "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/flashinfer_fp4_moe.py",
        "https://github.com/vllm-project/vllm/pull/35497",
    ),
    fc1_layout=Fc1Layout.GATE_UP,
    intermediate_multiple=64,
    intermediate_multiple_non_gated=128,
    hidden_multiple=128,
    violations=lambda i, h, gated, e: vllm_cutlass_moe.vllm_cutlass_nvfp4_violations(i, h, gated),
)
"""vLLM's own CUTLASS NVFP4 MoE (vLLM 0.33.0 ``VLLM_CUTLASS``, SM100).

It differs from ``flashinfer-cutlass`` in FC1 order (``[gate; up]``: vLLM does not swap for it) and in the
hidden size: its grouped GEMM strides experts' 128x4-swizzled scales by the logical ``N · K/16``, so
``Hp`` must be a multiple of 128 (FC2's rows) as well as the FC1 rows (vLLM PR #35497, closed unmerged;
:func:`adapters.vllm_cutlass_moe.vllm_cutlass_nvfp4_violations`). No kernel runner: the kernel is in
vLLM's CUDA build (``sm100``)."""

register(*RECORDS, PER_TOKEN_RECORD, CUTEDSL_RECORD, B12X_RECORD, VLLM_CUTLASS_RECORD)
