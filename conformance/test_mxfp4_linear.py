"""Contract ``mxfp4_linear``: AITER ASM-GEMM guard, Triton fallback and their numerical conformance.

For every MXFP4 linear layer a catalogued model holds on a rank (and adversarial ones), the
policy under test sends the layer to AITER's ASM FP4 GEMM only when its weight-scale shape can be
swizzled without padding (and the ASM kernel is not known to be wrong there), otherwise prepares
the Triton layout, and both layouts compute the dequantized reference. Pinned regressions
(``@example``): the Qwen3.8-Flash-Next shared-expert ``down_proj`` scales (2560, 20) and
(2560, 10) and the GDN ``in_proj_ba`` scales (96 | 48 | 24 | 12, 160) of vLLM PR #55213 / #58139,
plus vLLM's own guard truth table (``tests/kernels/quantization/test_rocm_mxfp4.py``).

Kernel checks (gfx950 + aiter) run the real ``gemm_a4w4`` and ``gemm_afp4wfp4`` on the prepared
tensors; everything else is pure torch on CPU.
"""

from __future__ import annotations

import math

import pytest
import torch

from adapters import aiter as aiter_kernels
from adapters.calls import kernel_device
from backends import record
from backends.mxfp4_linear import VLLM_GUARD_TABLE, AiterLinearPath
from conformance.linear_oracle import asm_defects, fallback_needless, process, swizzle_error
from conformance.regressions import GDN_SCALES, MXFP4_LINEAR_REGRESSIONS
from contracts.mxfp4_linear import CONTRACT, Mxfp4LinearKernelSelection, PreparedMxfp4Linear
from harness.properties import ALL_BACKENDS, check, record_error, record_event
from reference.formats import (
    MXFP4_BLOCK,
    Quantized,
    mxfp4_dequantize,
    mxfp4_quantize,
)
from reference.layouts import aiter_e8m0_unshuffle, aiter_unshuffle_weight, asm_scale_swizzle_ok
from reference.linear import exact_matmul, mxfp4_linear
from strategies.linear import (
    RCEIL_EVEN_BAND,
    ActivationBlocks,
    Mxfp4LinearShape,
    ScaleShapeCase,
    activation_blocks,
    activation_row,
    linear_shapes,
    mxfp4_linear_case,
    scale_shapes,
)

pytestmark = [pytest.mark.contract(CONTRACT)]

ASM, TRITON = AiterLinearPath.ASM, AiterLinearPath.TRITON


GUARD_CASES = [ScaleShapeCase(s, "vLLM guard unit test") for s, _ in VLLM_GUARD_TABLE] + [
    ScaleShapeCase(s, "Qwen3.8 GDN in_proj_ba at TP 2/4/8") for s in GDN_SCALES
]
"""vLLM's guard truth table and the regression scale shapes, pinned (run in the listed order)."""


@check(CONTRACT, ScaleShapeCase, strategy=scale_shapes(), pins=GUARD_CASES)
def check_asm_guard_truth_table(case: ScaleShapeCase, backend: None, policy: Mxfp4LinearKernelSelection) -> None:
    """The guard sends a scale shape to the ASM GEMM only where the unpadded ASM swizzle takes it and no
    documented ASM defect that must be avoided covers it, and falls back to Triton only where one of those
    holds or a documented defect (:data:`~backends.kernel_defects.AITER_LINEAR_DEFECTS`, with its report)
    gives a reason to: a fallback with no documented reason is a needless slow path."""
    shape = tuple(case.shape)
    error = swizzle_error(shape)
    assert (error is None) == (len(shape) == 2 and asm_scale_swizzle_ok(*shape)), (
        f"reference inconsistency: asm_scale_swizzle_ok and vllm_asm_scale_swizzle disagree on {shape}"
    )
    got = bool(policy.use_asm_gemm(shape))
    record_event(f"guard {'ASM' if got else 'Triton'}")
    if got and error is not None:
        raise AssertionError(f"guard sends scale {shape} to the ASM GEMM, whose unpadded swizzle fails: {error}")
    for defect in asm_defects(shape) if got else ():
        if defect.required:
            raise AssertionError(
                f"guard sends scale {shape} to the ASM GEMM, which a documented defect covers: {defect.reason} "
                f"({defect.link}): it must fall back to Triton"
            )
    assert got or not fallback_needless(shape), (
        f"guard falls back to Triton for scale {shape}, which the ASM path handles, and no documented ASM defect "
        "covers it (needless slow path; a defect a guard routes around belongs in backends.kernel_defects with "
        "its upstream report)"
    )
    if not got and asm_defects(shape):
        record_event("Triton: avoids a documented ASM defect")


@check(CONTRACT, Mxfp4LinearShape, strategy=linear_shapes(), pins=MXFP4_LINEAR_REGRESSIONS)
def check_preparation_never_raises(shape: Mxfp4LinearShape, backend: None, policy: Mxfp4LinearKernelSelection) -> None:
    """Weight processing succeeds for every layer a rank holds, with ASM enabled or not; it takes the
    ASM path exactly when enabled and its own guard accepts the scale, Triton otherwise."""
    n, k = shape.real_n, shape.real_k
    for enabled in (False, True):
        prepared = process(policy, n, k, enabled)
        guard = enabled and bool(policy.use_asm_gemm((n, k // MXFP4_BLOCK)))
        want = ASM if guard else TRITON
        assert prepared.path is want, (
            f"processing took {prepared.path.value} for scale ({n}, {k // MXFP4_BLOCK}) with asm_enabled={enabled}, "
            f"but its guard says {want.value}"
        )
    record_event(f"ASM enabled -> {prepared.path.value}")


@check(CONTRACT, Mxfp4LinearShape, strategy=linear_shapes(), pins=MXFP4_LINEAR_REGRESSIONS)
def check_asm_taken_where_supported(shape: Mxfp4LinearShape, backend: None, policy: Mxfp4LinearKernelSelection) -> None:
    """Every layer whose real scale shape the ASM path handles, and no documented ASM defect covers, goes
    to ASM (no needless fallback)."""
    real = tuple(shape.scale_shape)
    if not fallback_needless(real):
        record_event("scale not ASM-capable, or a documented ASM defect covers it")
        return
    assert policy.use_asm_gemm(real), (
        f"guard falls back to Triton for scale {real} ({shape.layer}), which the ASM FP4 GEMM handles: "
        "a slower GEMM for no reason"
    )
    n, k = shape.real_n, shape.real_k
    prepared = process(policy, n, k, True)
    assert prepared.path is ASM, (
        f"processing took {prepared.path.value} for ASM-capable scale ({n}, {k // MXFP4_BLOCK})"
    )


def prepare(
    policy: Mxfp4LinearKernelSelection, path: AiterLinearPath, weight: torch.Tensor, scale: torch.Tensor
) -> PreparedMxfp4Linear:
    prep = policy.prepare_asm_linear if path is ASM else policy.prepare_triton_linear
    prepared = prep(weight.clone(), scale.clone())
    assert prepared.path is path, f"prepare for {path.value} returned a {prepared.path.value} layer"
    return prepared


def undo_layout(prepared: PreparedMxfp4Linear, n: int, k: int) -> Quantized:
    """Back to linear ``[N, K/2]`` / ``[N, K/32]``: unshuffle + unswizzle (ASM), transpose (Triton)."""
    kc = k // MXFP4_BLOCK
    if prepared.path is ASM:
        assert tuple(prepared.weight.shape) == (n, k // 2), (
            f"ASM weight {tuple(prepared.weight.shape)}, want {(n, k // 2)}"
        )
        assert tuple(prepared.scale.shape) == (n, kc), f"ASM scale {tuple(prepared.scale.shape)}, want {(n, kc)}"
        return Quantized(aiter_unshuffle_weight(prepared.weight), aiter_e8m0_unshuffle(prepared.scale, n, kc))
    assert tuple(prepared.scale.shape) == (kc, n) and prepared.scale.is_contiguous(), (
        f"Triton scale must be stored transposed and contiguous ({kc}, {n}); got {tuple(prepared.scale.shape)} "
        f"with strides {prepared.scale.stride()}"
    )
    return Quantized(prepared.weight, prepared.scale.T)


@check(CONTRACT, Mxfp4LinearShape, strategy=linear_shapes(), pins=MXFP4_LINEAR_REGRESSIONS, backends=ALL_BACKENDS)
def check_layouts_compute_the_reference(
    shape: Mxfp4LinearShape, backend: AiterLinearPath, policy: Mxfp4LinearKernelSelection
) -> None:
    """The path's prepared weight and scale undo back to the originals bit for bit, and the reference GEMM
    through that layout (activation quantized in the path's mode) equals ``mxfp4_linear`` with AITER's mode
    for that path. On the ASM path the Triton layout dequantizes to the same weights, so both layouts give
    bit-identical GEMMs for the same activation (``exact_matmul`` is deterministic in its operands)."""
    if backend is ASM and not policy.use_asm_gemm(tuple(shape.scale_shape)):
        record_event("guard: Triton (ASM layout not used)")
        return
    case = mxfp4_linear_case(shape)
    restored = undo_layout(prepare(policy, backend, case.weight, case.scale), shape.n, shape.k)
    assert torch.equal(restored.packed, case.weight), f"{backend.value} weight bytes do not undo to the original"
    assert torch.equal(restored.scales, case.scale), f"{backend.value} scale bytes do not undo to the original"
    w = mxfp4_dequantize(restored)
    if backend is ASM:
        other = undo_layout(prepare(policy, TRITON, case.weight, case.scale), shape.n, shape.k)
        assert torch.equal(mxfp4_dequantize(other), w), "Triton and ASM layouts dequantize to different weights"
    mode, aiter_mode = policy.linear_activation_rounding(backend), record(backend).activation_rounding
    xq = mxfp4_quantize(case.x, mode)
    got = exact_matmul(mxfp4_dequantize(xq), w)
    want = mxfp4_linear(case.x, Quantized(case.weight, case.scale), aiter_mode)
    if not torch.equal(got, want):
        blocks = int((xq.scales != mxfp4_quantize(case.x, aiter_mode).scales).sum())
        diff = (got - want).abs().max().item()
        raise AssertionError(
            f"{backend.value} GEMM through its layout differs from the dequantized reference: max |diff| = {diff:.4g}; "
            f"activation rounding {mode.value} vs AITER's {aiter_mode.value} changes {blocks} block scale(s)"
        )


@check(
    CONTRACT,
    ActivationBlocks,
    strategy=activation_blocks(),
    examples=[ActivationBlocks((1.5, 1.7, 1.75, 1.0), (0, 3, -2, 5), 0)],  # AITER's checked amax values
)
def check_activation_rounding(blocks: ActivationBlocks, backend: None, policy: Mxfp4LinearKernelSelection) -> None:
    """ASM quantizes activations RoundUp (RCEIL), Triton Even; their block scales differ exactly on
    blocks whose amax mantissa lies in (1.5, 1.75), where RoundUp's is one binade larger."""
    modes = {path: policy.linear_activation_rounding(path) for path in AiterLinearPath}
    for path, mode in modes.items():
        want = record(path).activation_rounding
        assert mode is want, (
            f"{path.value} activation rounding modelled as {mode.value}; AITER's quantizer on that path rounds "
            f"{want.value}"
        )
    x = activation_row(blocks)
    amax = x.view(-1, MXFP4_BLOCK).abs().amax(-1)
    pairs = zip(blocks.mantissas, blocks.exponents, strict=True)
    want_amax = torch.tensor([math.ldexp(m, e) for m, e in pairs], dtype=torch.float32)
    assert torch.equal(amax, want_amax), "test input: block amax not built exactly"
    lo, hi = RCEIL_EVEN_BAND
    in_band = torch.tensor([lo < m < hi for m in blocks.mantissas])
    s_asm, s_tri = (mxfp4_quantize(x, modes[p]).scales[0].to(torch.int64) for p in (ASM, TRITON))
    differ = s_asm != s_tri
    assert torch.equal(differ, in_band), (
        f"ASM ({modes[ASM].value}) and Triton ({modes[TRITON].value}) block scales differ on blocks "
        f"{differ.nonzero().flatten().tolist()}, the (1.5, 1.75) band holds blocks {in_band.nonzero().flatten().tolist()}"
    )
    assert torch.equal(s_asm[differ], s_tri[differ] + 1), "RoundUp must pick the next binade where the modes differ"
    record_event(f"{int(in_band.sum())} of {len(in_band)} blocks in the band")


# --- gfx950 kernels ---------------------------------------------------------------------------

KERNEL_ELEMENTS_MAX = 1 << 26
"""Kernel checks run the real rank-local size when ``N·K`` fits this, else the reduced size."""


@check(
    CONTRACT,
    Mxfp4LinearShape,
    strategy=linear_shapes(),
    pins=MXFP4_LINEAR_REGRESSIONS,
    backends=ALL_BACKENDS,
    kernel=True,
)
def check_aiter_gemm_kernel(
    shape: Mxfp4LinearShape, backend: AiterLinearPath, policy: Mxfp4LinearKernelSelection
) -> None:
    """AITER's real GEMM of ``backend`` on the policy's prepared tensors matches the exact product of the
    dequantized operands (the kernel's own quantized activation, the original weight).

    Written from AITER ``op_tests/test_gemm_a4w4.py`` (ASM ``gemm_a4w4``, bpreshuffle, scales from
    ``per_1x32`` quant with ``shuffle=True``) and ``op_tests/triton_tests/gemm/basic/test_gemm_afp4wfp4.py``
    (``gemm_afp4wfp4`` with ``(K/32, N)``-stored scales passed as ``.T``), and vLLM
    ``test_rocm_mxfp4.py`` (``gemm_with_dynamic_quant``'s quantizer pairing). vLLM's ASM branch uses
    ``gemm_afp4wfp4_preshuffle`` instead for ``M <= 64`` on tuned (N, K); that kernel is not run here.

    Tolerance: the record's :func:`backends.mxfp4_linear.gemm_tolerance` (its error argument is there).
    The activation scales must equal the reference quantizer in the path's
    mode byte for byte (AITER's own quant test is exact); an AITER older than PR #3212 rounds the HIP
    quantizer Even and fails that check on the ASM path.
    """
    aiter_kernels.require_gfx950()  # LibraryUnavailable (not a failure) anywhere else
    r = record(backend)
    if backend is ASM and not policy.use_asm_gemm(tuple(shape.scale_shape)):
        record_event("guard: Triton (ASM kernel not used)")
        return
    real = shape.real_n * shape.real_k <= KERNEL_ELEMENTS_MAX
    n, k = (shape.real_n, shape.real_k) if real else (shape.n, shape.k)
    case = mxfp4_linear_case(shape, n, k)
    prepared = prepare(policy, backend, case.weight, case.scale)
    x = case.x.to(kernel_device(), torch.bfloat16)
    act = r.quantize(x)
    y = r.gemm(act, prepared.weight, prepared.scale)  # both kernels run before either is judged
    want_scales = mxfp4_quantize(x.float().cpu(), r.activation_rounding).scales
    mismatched = int((act.scales != want_scales).sum())
    assert mismatched == 0, (
        f"{backend.value} activation quantizer: {mismatched} block scale(s) differ from "
        f"{r.activation_rounding.value} rounding"
    )
    a = mxfp4_dequantize(Quantized(act.packed, act.scales)).double().to(y.device)
    b = mxfp4_dequantize(Quantized(case.weight, case.scale)).double().to(y.device)
    exact, magnitude = a @ b.T, a.abs() @ b.abs().T
    tol = r.tolerance(exact, magnitude, k)
    err = (y.double() - exact).abs()
    bad = ~(err <= tol)
    assert torch.isfinite(y).all() and not bad.any(), (
        f"{backend.value} GEMM [{shape.tokens} x {n} x {k}]: {int(bad.sum())} of {err.numel()} elements outside "
        f"ulp_bf16 + 2·(K/32)·2^-24·Σ|ab|; worst |err|/tol = {(err / tol.clamp_min(1e-300)).max().item():.3g}, "
        f"non-finite outputs: {int((~torch.isfinite(y)).sum())}"
    )
    record_error((err / tol.clamp_min(1e-300)).max().item() if err.numel() else 0.0, "|err|/tol")
