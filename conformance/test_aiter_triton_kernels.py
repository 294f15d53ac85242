"""AITER's own Triton kernels on an NVIDIA GPU ("AITER Triton on CUDA") against the reference.

Three properties run AITER's real kernels (:mod:`adapters.aiter_triton`, no copies of their code)
wherever an NVIDIA GPU and amd-aiter are present; elsewhere they skip naming what is missing. The
gfx950 kernels (ASM ``gemm_a4w4``, CK ``fused_moe``) stay in ``test_mxfp4_linear`` /
``test_mxfp4_moe``, gated on gfx950.

* ``dynamic_mxfp4_quant``: codes and scales equal the reference quantizer in the rounding the
  policy models for the Triton path, except for two exactly described differences: the E2M1
  midpoints whose lower neighbour is even, which AITER rounds away from zero, and, on CUDA, the
  scale byte of every block with a negative exponent, which reads 127
  (:func:`expected_aiter_quantization`). Because of the latter, the GEMM and MoE properties feed
  AITER's kernels activations quantized by the reference (:func:`reference_activation`).
* ``mxfp4_linear`` fallback: each drawn layer goes through the policy's weight processing; what
  it routes to Triton (and, with the ASM switch off, every layer) runs ``gemm_afp4wfp4`` on the
  prepared tensors, compared per element with the reference GEMM (the bound of the Triton path's record,
  ``backends.mxfp4_linear.sm90_dot_scaled_tolerance``).
* ``mxfp4_moe``: a SiLU-gated MoE through ``moe_align_block_size_triton`` and ``fused_moe_mxfp4``
  (:func:`adapters.aiter_triton.mxfp4_moe`) on the policy's padded weights equals, bit for bit,
  the same kernels on the rank's real channels; each stage meets the per-element GEMM bound on
  its own inputs, and the output matches the reference MoE (:data:`MOE_REL_L2`).
"""

from __future__ import annotations

import pytest
import torch

from adapters import aiter_triton as at
from adapters.calls import kernel_device
from backends import record
from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import Mxfp4MoeBackend
from conformance.layers import align_mxfp4, reference_output, silu_no_bias
from conformance.moe_checks import assert_within, routed_experts, slot_products
from conformance.regressions import MXFP4_LINEAR_REGRESSIONS as LINEAR_REGRESSIONS
from conformance.regressions import MXFP4_MOE_REGRESSIONS as MOE_REGRESSIONS
from contracts.moe import MXFP4_MOE as MOE
from contracts.moe import MoeAlignment, MoeWeights
from contracts.mxfp4_linear import CONTRACT as LINEAR
from contracts.mxfp4_linear import Mxfp4LinearKernelSelection
from harness.properties import check, record_error, record_event
from reference.formats import (
    MXFP4_BLOCK,
    MxScaleRounding,
    Quantized,
    mx_scale_exponent,
    mxfp4_dequantize,
    mxfp4_quantize,
    unpack_fp4,
)
from reference.layouts import Fc1Layout
from reference.moe import route
from reference.padding import pad_dim
from strategies.linear import Mxfp4LinearShape, linear_shapes, mxfp4_linear_case
from strategies.mx_activations import ActivationTiles, activation_tile, activation_tiles
from strategies.mxfp4_moe import Mxfp4MoeConfig, mxfp4_moe_configs

TRITON = AiterLinearPath.TRITON

# --- error bounds -----------------------------------------------------------------------------------

ON_CUDA = record(AiterLinearPath.TRITON).on_cuda
"""The Triton path's kernel as it runs on an NVIDIA GPU: requirements, runner and per-element bound
(its record, ``backends.mxfp4_linear``)."""
gemm_tolerance = ON_CUDA.tolerance
pytestmark = [getattr(pytest.mark, m) for m in ON_CUDA.requires]


# --- dynamic_mxfp4_quant ----------------------------------------------------------------------------

TIES_AWAY = torch.tensor([0.25, 1.25, 2.5, 5.0])
"""Midpoints whose lower E2M1 neighbour has the even code (0, 1.0, 2.0, 4.0): round-to-nearest-even
(the reference, OCP MX) keeps it, AITER's ``_mxfp4_quant_op`` adds one to the guard bit and so
rounds up. At the other midpoints (0.75, 1.75, 3.5) both round up."""


def aiter_scale_bytes_on_cuda(e: torch.Tensor) -> torch.Tensor:
    """The scale byte AITER's ``_mxfp4_quant_op`` writes on an NVIDIA GPU for unbiased exponent ``e``.

    It computes ``scale_e8m0_unbiased.to(tl.uint8) + 127`` from a float exponent in [-127, 127]:
    the float -> uint8 conversion of a negative value wraps on AMD (-1 -> 255, + 127 = 126 mod 256,
    the right byte) but saturates to 0 in NVIDIA's ``cvt`` (-1 -> 0, + 127 = 127). So on CUDA every
    block whose exponent is negative (amax below 4, all-zero blocks included) gets byte 127, 2^0,
    while its codes are still scaled by the true ``2^-e``: the dequantized block is off by ``2^-e``.
    Present in amd-aiter 0.1.7.post2.dev18 and ROCm/aiter main (``aiter/ops/triton/_triton_kernels/
    quant/quant.py``); measured on the H200 (2026-12-01, torch 2.11, Triton 3.6).
    """
    return (e.clamp_min(0) + 127).to(torch.uint8)


def expected_aiter_quantization(x: torch.Tensor, rounding: MxScaleRounding) -> tuple[Quantized, torch.Tensor]:
    """What AITER's Triton quantizer writes for ``x [M, K]`` on CUDA if its scales follow ``rounding``:
    ``(Quantized(reference codes, bytes of aiter_scale_bytes_on_cuda), codes)`` where ``codes`` are the
    reference's nearest-even E2M1 codes one magnitude step up at :data:`TIES_AWAY`
    (``(((e << 2) | (m >> 21)) + 1) >> 1`` rounds half away from zero)."""
    q = mxfp4_quantize(x, rounding)
    blocks = x.float().reshape(x.shape[0], -1, MXFP4_BLOCK)
    e = mx_scale_exponent(blocks.abs().amax(-1), rounding)
    scaled = (blocks / torch.ldexp(torch.ones_like(e, dtype=torch.float32), e)[..., None]).abs()
    tie = torch.isin(scaled, TIES_AWAY).reshape(x.shape)
    codes = torch.where(tie, unpack_fp4(q.packed) + 1, unpack_fp4(q.packed))
    return Quantized(q.packed, aiter_scale_bytes_on_cuda(e)), codes


@check(
    LINEAR,
    ActivationTiles,
    strategy=activation_tiles(),
    backends=[TRITON],
    kernel=True,
    kernel_backends=False,
    marks=[pytest.mark.contract(LINEAR)],
)
def check_dynamic_mxfp4_quant(
    case: ActivationTiles, backend: AiterLinearPath, policy: Mxfp4LinearKernelSelection
) -> None:
    """AITER's ``dynamic_mxfp4_quant`` on an NVIDIA GPU, against the reference quantizer in the rounding
    the policy models for the Triton path (AITER: "even", hard-coded in ``_mxfp4_quant_op``): scale
    bytes equal the reference's for non-negative exponents and 127 for negative ones
    (:func:`aiter_scale_bytes_on_cuda`), codes equal the reference's nearest-even codes except at the
    ties AITER rounds away (:data:`TIES_AWAY`). Nothing else may differ."""
    at.require_cuda()
    x = activation_tile(case)
    q = at.dynamic_mxfp4_quant(x.to(kernel_device()))
    rounding = policy.linear_activation_rounding(backend)
    want, codes = expected_aiter_quantization(x.float(), rounding)
    scales = q.scales.contiguous().cpu()
    differ = scales != want.scales
    assert not differ.any(), (
        f"dynamic_mxfp4_quant: {int(differ.sum())} of {differ.numel()} block scales differ from {rounding.value} "
        f"rounding (bytes of negative exponents read 127 on CUDA), first at (row, block) "
        f"{tuple(int(i) for i in differ.nonzero()[0])}: AITER {int(scales[differ][0])}, expected {int(want.scales[differ][0])}"
    )
    got = unpack_fp4(q.packed.cpu())
    bad = got != codes
    assert not bad.any(), (
        f"dynamic_mxfp4_quant: {int(bad.sum())} E2M1 codes differ from nearest-even with AITER's ties-away "
        f"midpoints, first at {tuple(int(i) for i in bad.nonzero()[0])}: AITER {int(got[bad][0])}, "
        f"expected {int(codes[bad][0])}"
    )
    ties = int((codes != unpack_fp4(want.packed)).sum())
    saturated = int((want.scales == 127).sum())
    record_event(f"{'some' if ties else 'no'} ties rounded away; {'some' if saturated else 'no'} scale bytes at 127")
    record_error(0.0, "exact: scale bytes and codes")


def reference_activation(x: torch.Tensor) -> at.Mxfp4Device:
    """The MXFP4 activation the GEMM and MoE properties feed AITER's kernels on CUDA: the reference
    quantizer with "even" scales (AITER's Triton mode) on the GPU. AITER's own ``dynamic_mxfp4_quant``
    writes wrong scale bytes there (:func:`aiter_scale_bytes_on_cuda`), which its own property pins."""
    q = mxfp4_quantize(x.float().cpu(), MxScaleRounding.EVEN)
    return at.Mxfp4Device(q.packed.to(kernel_device()), q.scales.to(kernel_device()))


# --- the MXFP4 linear fallback: gemm_afp4wfp4 ------------------------------------------------------

KERNEL_ELEMENTS_MAX = 1 << 26
"""Kernel checks run the real rank-local size when ``N·K`` fits this, else the reduced size."""


@check(
    LINEAR,
    Mxfp4LinearShape,
    strategy=linear_shapes(),
    pins=LINEAR_REGRESSIONS,
    backends=[TRITON],
    kernel=True,
    kernel_backends=False,
    marks=[pytest.mark.contract(LINEAR)],
)
def check_triton_fallback_gemm(
    shape: Mxfp4LinearShape, backend: AiterLinearPath, policy: Mxfp4LinearKernelSelection
) -> None:
    """The policy's weight processing (ASM switch on; for layers it keeps on ASM, a gfx950-only kernel,
    also with the switch off as ``VLLM_ROCM_USE_AITER_FP4_ASM_GEMM=0`` runs them) yields a Triton layer
    whose ``gemm_afp4wfp4`` output is within :func:`gemm_tolerance` of the reference GEMM: the exact
    product of the "even"-quantized activation (:func:`reference_activation`) and the original weight."""
    at.require_cuda()
    real = shape.real_n * shape.real_k <= KERNEL_ELEMENTS_MAX
    n, k = (shape.real_n, shape.real_k) if real else (shape.n, shape.k)
    case = mxfp4_linear_case(shape, n, k)
    asm_enabled = True
    try:
        prepared = policy.process_mxfp4_linear_weights(case.weight.clone(), case.scale.clone(), asm_enabled)
        if prepared.path is not TRITON:
            record_event("ASM layer (gfx950 kernel), run with the ASM switch off")
            asm_enabled = False
            prepared = policy.process_mxfp4_linear_weights(case.weight.clone(), case.scale.clone(), asm_enabled)
    except Exception as exc:
        raise AssertionError(
            f"weight processing raised for weight [{n}, {k // 2}], scale ({n}, {k // MXFP4_BLOCK}) "
            f"(asm_enabled={asm_enabled}): {type(exc).__name__}: {exc}"
        ) from exc
    assert prepared.path is TRITON, f"processing with the ASM switch off took {prepared.path.value}"
    assert tuple(prepared.weight.shape) == (n, k // 2) and tuple(prepared.scale.shape) == (k // MXFP4_BLOCK, n), (
        f"Triton layer: weight {tuple(prepared.weight.shape)}, scale {tuple(prepared.scale.shape)}; "
        f"gemm_afp4wfp4 reads [{n}, {k // 2}] and a stored ({k // MXFP4_BLOCK}, {n}) scale"
    )
    act = reference_activation(case.x.to(torch.bfloat16))
    y = ON_CUDA.gemm(act, prepared.weight, prepared.scale).cpu()
    a = mxfp4_dequantize(Quantized(act.packed, act.scales))
    b = mxfp4_dequantize(Quantized(case.weight.to(a.device), case.scale.to(a.device)))
    exact, magnitude = slot_products(a, b[None], torch.zeros(len(a), dtype=torch.int64))  # one expert: a · b^T
    tol = gemm_tolerance(exact, magnitude, k, ON_CUDA.splits(shape.tokens))
    worst = assert_within(y, exact, tol, f"gemm_afp4wfp4 [{shape.tokens} x {n} x {k}]", "gemm_afp4wfp4")
    record_event(f"{'real' if real else 'reduced'} size, worst |err|/tol {'<= 0.5' if worst <= 0.5 else '> 0.5'}")


# --- MXFP4 MoE: moe_align_block_size_triton + fused_moe_mxfp4 ---------------------------------------

MOE_REL_L2 = 0.5
"""End-to-end relative L2 error against the reference MoE of the real channels, fed the same
quantized input: a coarse check of the composition (routing, slot order, gate/up halves, the
weighted sum), which the stage checks and padding invariance already pin per element. It cannot
be tight: the reference keeps FC1 exact where the kernel rounds it to bf16 (2^-9 relative), and
where that moves SiLU(g)·u across an E2M1 midpoint or a block amax across a binade, the re-quantized
intermediate moves by one E2M1 step or one scale binade. Over many tokens that averages to a few
percent; for one token and top-1 a few such flips gave 0.175 on the H200. A gate/up mispairing, a
wrong expert or a misplaced scale block gives 0.7 to 1.4."""


def run_moe(w: MoeWeights, x: torch.Tensor, routing: torch.Tensor, ids: torch.Tensor) -> at.TritonMoeRun:
    """AITER's Triton MoE on ``w`` (FC1 ``[gate; up]``) with ``x`` zero-padded to its hidden size."""
    xp = pad_dim(x, -1, w.hidden_size).to(kernel_device(), torch.bfloat16)
    return at.mxfp4_moe(w.w13, w.w13_scale, w.w2, w.w2_scale, xp, routing, ids, reference_activation)


def assert_moe_stages(run: at.TritonMoeRun, w: MoeWeights, x: torch.Tensor, routing, ids) -> float:
    """Each stage of ``run`` against the exact product of its own dequantized inputs (slot ``t·k + j``
    reads token ``t`` and expert ``ids[t, j]``); returns the worst ``|err| / tol``."""
    w13, w2, slots = routed_experts(w, ids, kernel_device())
    xa = mxfp4_dequantize(Quantized(*run.x_q)).repeat_interleave(ids.shape[1], 0)
    exact1, mag1 = slot_products(xa, w13, slots)
    worst = assert_within(run.fc1, exact1, gemm_tolerance(exact1, mag1, xa.shape[-1]), "fused_moe_mxfp4 FC1", "FC1")
    aa = mxfp4_dequantize(Quantized(*run.act_q))
    weight = routing.double().reshape(-1, 1)
    exact2, mag2 = (p * weight for p in slot_products(aa, w2, slots))
    tol2 = gemm_tolerance(exact2, mag2, aa.shape[-1]) + 2.0**-23 * exact2.abs()  # one fp32 multiply by the weight
    return max(worst, assert_within(run.fc2, exact2, tol2, "fused_moe_mxfp4 FC2 (times the routing weight)", "FC2"))


def _mxfp4_even_round_trip(a: torch.Tensor) -> torch.Tensor:
    """What FC2 reads of the intermediate: bf16, then MXFP4 with "even" scales (AITER's quantizer)."""
    return mxfp4_dequantize(mxfp4_quantize(a.to(torch.bfloat16).float(), MxScaleRounding.EVEN))


GATE_UP_BACKENDS = [b for b in Mxfp4MoeBackend if record(b).fc1_layout is Fc1Layout.GATE_UP]
"""Backends whose kernels read FC1 as ``[gate; up]`` (AITER CK, Marlin): the policy's weights for them
are what AITER's Triton MoE reads as they are."""


@check(
    MOE,
    Mxfp4MoeConfig,
    strategy=mxfp4_moe_configs().map(silu_no_bias),
    pins=[silu_no_bias(c) for c in MOE_REGRESSIONS],
    backends=GATE_UP_BACKENDS,
    kernel=True,
    kernel_backends=False,
    marks=[pytest.mark.contract(MOE)],
)
def check_triton_moe(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> None:
    """AITER's Triton MoE on the policy's padded weights (FC1 read ``[gate; up]`` as AITER's and vLLM's
    Triton MoE read it) equals the same kernels on the rank's real channels bit for bit (zero
    padding adds exact zeros to every fp32 accumulator; the tiles depend on M only), each stage
    meets :func:`gemm_tolerance` on its own inputs, and the output is within :data:`MOE_REL_L2` of
    the reference MoE of the real channels."""
    at.require_cuda()
    aligned, case = align_mxfp4(config, backend, policy)
    w, s = aligned.weights, config.shape
    assert w.fc1_layout is Fc1Layout.GATE_UP, (
        f"the policy labels FC1 rows {w.fc1_layout.value} for {backend.value}; the kernel reads [gate; up]"
    )
    routing, ids = route(case.logits, s.top_k)
    padded = run_moe(w, case.x, routing, ids)
    unpadded = run_moe(case.real, case.x, routing, ids)
    got, want = padded.out[:, : s.hidden], unpadded.out
    if not torch.equal(got, want) or padded.out[:, s.hidden :].any():
        diff = (got - want).abs().max().item()
        raise AssertionError(
            f"AITER fused_moe_mxfp4 on the padded weights (I {s.intermediate} -> {aligned.intermediate_size}, "
            f"H {s.hidden} -> {aligned.hidden_size}) differs from the same kernels on the {s.real_intermediate} real "
            f"channels: max |diff| = {diff:.4g} (max |out| = {want.abs().max().item():.4g}); padded hidden columns "
            f"non-zero: {bool(padded.out[:, s.hidden :].any())}"
        )
    worst = assert_moe_stages(padded, w, case.x, routing, ids)
    fed = mxfp4_dequantize(Quantized(*padded.x_q))[:, : s.hidden]
    ref = reference_output(case.real, Fc1Layout.GATE_UP, case, config.shape, x=fed, requantize=_mxfp4_even_round_trip)
    err = ((padded.out[:, : s.hidden] - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err <= MOE_REL_L2, f"AITER Triton MoE vs the reference MoE: relative L2 error {err:.3g} > {MOE_REL_L2}"
    record_error(err / MOE_REL_L2, "relative L2 / bound")
    record_event(f"stages worst |err|/tol {'<= 0.5' if worst <= 0.5 else '> 0.5'}")
