"""Contract ``nvfp4_moe`` on hardware: FlashInfer's real NVFP4 MoE kernels on the policy's padding.

SM100 (B200) only; elsewhere every test is skipped by its ``sm100`` marker. Two properties, each
for ``trtllm_fp4_block_scale_moe`` (FLASHINFER_TRTLLM) and ``cutlass_fused_moe``
(FLASHINFER_CUTLASS), run through :mod:`adapters.flashinfer_moe_kernels`:

1. the kernel's output on the policy's padded weights matches the dequantized reference MoE
   (intermediate re-quantized to NVFP4 as the kernels do) within an FP4 error bound;
2. padding does not change the kernel's output: the padded run agrees with the unpadded run where
   the unpadded sizes are runnable, and otherwise with FlashInfer's own padding helper
   ``pad_trtllm_moe_weights`` (on trtllm-gen with ``valid_intermediate_size`` /
   ``valid_hidden_size`` declared, FlashInfer 0.7.4's documented route).

Inputs follow FlashInfer's unified MoE fuzzer: activations are snapped to the NVFP4 grid (input
quantization is then lossless) and the intermediate's global scale is calibrated from the
reference, as ``trtllm_gen_fused_moe_utils.py`` does. Weights are the seed's random FP4 bytes.

Assumption (``kernels.md`` §2.5 item 6, open): the policy's ``Ip`` is passed to trtllm-gen as
``intermediate_size`` unchanged, also when ``Ip ≡ 64 (mod 128)`` (vLLM's gated rule, e.g.
Gemma-4 TP4: 176 -> 192). FlashInfer 0.7.4's ``valid_intermediate_size`` docstring says the
kernels need a multiple of 128, yet the monolithic FP4 launcher has no such check (only the staged
and BF16 launchers do) and the answer lies in the downloaded cubin configs. The properties do
not paper over that by re-padding to 128: the policy is what vLLM ships, and an Ip ≡ 64 failure
on B200 is the evidence that the 64 rule is wrong for trtllm-gen. Property 2 then compares the
64-rule run against FlashInfer's documented 128 + ``valid_intermediate_size`` run directly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
from hypothesis import given, settings

from adapters import flashinfer as fi
from adapters import flashinfer_moe_kernels as kernels
from conformance.test_nvfp4_moe import align
from harness.repro import check, record_event, record_target, run_check
from reference.formats import E2M1_MAX, E4M3_MAX, NVFP4_BLOCK, GlobalScale, nvfp4_dequantize, nvfp4_quantize
from reference.moe import GateUpOrder, moe_reference, route
from strategies.catalog import GEGLU, RELU2, SWIGLU
from strategies.moe import MoeShape, moe_shapes, pinned_shape
from strategies.pins import pinned_examples
from strategies.tensors import MoeCase, dequantize_moe, real_channels
from subjects.moe import AlignedMoe, MoeAlignment
from subjects.nvfp4_moe import CONTRACT, MoeBackend

pytestmark = [pytest.mark.contract(CONTRACT), pytest.mark.sm100, pytest.mark.flashinfer]

TRTLLM = pytest.mark.parametrize("backend", [MoeBackend.FLASHINFER_TRTLLM], ids=["flashinfer-trtllm"])
CUTLASS = pytest.mark.parametrize("backend", [MoeBackend.FLASHINFER_CUTLASS], ids=["flashinfer-cutlass"])

# Tolerance (|kernel - reference| per output element, ref = reference output [T, H]):
#
# * inputs and weights are exact: activations sit on the NVFP4 grid (re-quantizing them is the
#   identity, checked below), the weights are the very bytes the kernel reads, and the routing
#   logits are separated so the kernel's top-k (which may compare bf16 scores) picks the
#   reference's experts;
# * the reference rounds the activated intermediate to bf16 and NVFP4-quantizes it with the
#   kernel's global scale, as FlashInfer's own references do, so the re-quantization itself is
#   shared. What differs is its input: fp32 accumulation order, CUTLASS's bf16 GEMM1 output,
#   fast-math activations (trtllm-gen's GeGLU phi may be erf where Gemma uses tanh, |diff| < 1e-3)
#   and the kernel's approximate reciprocal ``rcp(sf · rcp(gs))``. These move an element by
#   ~2^-8 relative, which changes its E2M1 code only next to a rounding midpoint (half a step,
#   <= sf/gs) and a block's E4M3 scale only next to an E4M3 midpoint (2^-4 relative). Such a flip
#   moves one intermediate element by at most one E2M1 step times its block scale (<= 1/3 of the
#   block amax), i.e. one FC2 output row by that step times W2's column: isolated in count, not
#   in size;
# * bf16 output and bf16 routing weights add 2^-8 relative each; fp32 FC2 accumulation ~1e-6.
#
# So the bound is norm-relative, as in FlashInfer's unified MoE fuzzer (``atol_frac`` 0.15 and
# rtol 0.1 for NVFP4, "calibrated: obs ratio <= 0.077" on B200, 75 %-sparse snapped inputs):
# ``|d| <= 0.15·‖ref‖∞ + 0.1·|ref|``. Because a flip lands on whole rows and our weights are dense
# with block scales spanning 2^8, a small fraction of elements may exceed it (MAX_OUTLIERS; below
# 100 elements that is none); no element may exceed GROSS·‖ref‖∞. A CPU emulation of both
# kernels' documented arithmetic (bf16 GEMM1 output and intermediate, bf16 routing weights and
# output, erf GeGLU) on ~150 drawn shapes stayed at <= 0.093·‖ref‖∞ with no element over the
# bound, while end-padded FC1 (vLLM #55649) gave 0.86-1.44·‖ref‖∞ and 20-33 % of elements over it.
# The worst ratio is fed to ``hypothesis.target`` so generation hunts for the edge.
ATOL_FRACTION = 0.15
RTOL = 0.1
MAX_OUTLIERS = 0.01
GROSS = 0.5

KERNEL_EXPERTS = 8
"""Multiplier of the drawn expert count: FlashInfer's trtllm-gen tests and fuzzer run >= 8 experts."""
LOGIT_SEPARATION = 0.25
"""Added per rank to the routing logits: top-k is unambiguous even on bf16-rounded scores."""
ENCODE_RANGE = E4M3_MAX * E2M1_MAX
KERNEL_EXAMPLES = 10
"""Generated examples per kernel test (fewer if the profile asks for fewer); pins come on top."""
KERNEL_SETTINGS = settings(max_examples=min(settings.default.max_examples, KERNEL_EXAMPLES), deadline=None)


def on_kernel(shape: MoeShape) -> MoeShape:
    """The drawn shape with ``KERNEL_EXPERTS`` times its experts (top-k unchanged)."""
    return dataclasses.replace(shape, experts=KERNEL_EXPERTS * shape.experts)


TRTLLM_SHAPES = moe_shapes(group=NVFP4_BLOCK, activations=(SWIGLU, GEGLU, RELU2))
"""trtllm-gen shapes: gpt-oss's clamped SwiGLU is left out (see ``TRTLLM_ACTIVATIONS``)."""
CUTLASS_SHAPES = moe_shapes(group=NVFP4_BLOCK)
REGRESSIONS = (
    pinned_shape("gemma-4-26b-a4b", 4),  # vLLM #46879: I 176 -> 192 (≡ 64 mod 128), GeGLU
    pinned_shape("gemma-4-26b-a4b", 2),  # vLLM #55649: I 352 -> 384, per-half padding
    pinned_shape("nemotron-3-nano-30b-a3b", 1),  # vLLM #52308: hidden padding on trtllm-gen, relu2
)


pinned = pinned_examples("shape", [on_kernel(shape) for shape in REGRESSIONS])


@dataclasses.dataclass(frozen=True)
class KernelInputs:
    """What both kernels and the reference read: ``x [T, H]`` on the NVFP4 grid, separated
    ``logits [T, E]`` and the decode global scales."""

    x: torch.Tensor
    logits: torch.Tensor
    scales: kernels.Nvfp4MoeScales


def power_of_two_decode(amax: float) -> float:
    """The smallest power-of-two decode scale ``d`` with ``amax / d <= 448·6`` (exact products)."""
    return float(torch.ldexp(torch.tensor(1.0), torch.tensor(amax / ENCODE_RANGE).log2().ceil().int()))


def snap(x: torch.Tensor, decode: float) -> torch.Tensor:
    """NVFP4 quantize-dequantize ``x``; the result is a fixed point of the quantizer (checked)."""
    snapped = nvfp4_dequantize(nvfp4_quantize(x, decode, GlobalScale.DECODE), decode, GlobalScale.DECODE)
    again = nvfp4_quantize(snapped, decode, GlobalScale.DECODE)
    assert torch.equal(nvfp4_dequantize(again, decode, GlobalScale.DECODE), snapped), (
        "snapped activations are not a fixed point of the NVFP4 quantizer: input quantization would be lossy"
    )
    return snapped


def reference_output(
    shape: MoeShape,
    case: MoeCase,
    x: torch.Tensor,
    logits: torch.Tensor,
    requantize: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Reference MoE output ``[T, H]`` (fp32) on the rank's real channels, FC1 rows ``[up; gate]``,
    with ``requantize`` applied to each expert's activated intermediate before FC2."""
    real = real_channels(case.weights, shape.gated, shape.real_intermediate)
    w13, w2 = dequantize_moe(real, case.w13_decode, case.w2_decode)
    weights, ids = route(logits, shape.top_k)
    return moe_reference(x, w13, w2, weights, ids, shape.activation, GateUpOrder.UP_GATE, requantize=requantize)


def kernel_requantize(decode: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the kernels feed FC2: the intermediate rounded to bf16, then NVFP4 quantize-dequantized
    with the decode global scale ``decode`` (FlashInfer's references do the same)."""

    def requantize(a: torch.Tensor) -> torch.Tensor:
        q = nvfp4_quantize(a.bfloat16().float(), decode, GlobalScale.DECODE)
        return nvfp4_dequantize(q, decode, GlobalScale.DECODE)

    return requantize


def intermediate_amax(shape: MoeShape, case: MoeCase, x: torch.Tensor, logits: torch.Tensor) -> float:
    """Largest activated intermediate value over the routed tokens (FlashInfer's tests calibrate
    the intermediate's global scale from it)."""
    seen = [torch.zeros(())]

    def record(a: torch.Tensor) -> torch.Tensor:
        seen.append(a.abs().max())
        return a

    reference_output(shape, case, x, logits, record)
    return max(float(torch.stack(seen).max()), 1e-30)


def kernel_inputs(shape: MoeShape, case: MoeCase) -> KernelInputs:
    """Snap the seed's activations to the NVFP4 grid, separate the logits, calibrate the scales."""
    activation = power_of_two_decode(float(case.x.abs().max()))
    x = snap(case.x, activation)
    ranks = case.logits.argsort(-1).argsort(-1).float()
    logits = case.logits + LOGIT_SEPARATION * ranks
    intermediate = power_of_two_decode(intermediate_amax(shape, case, x, logits))
    return KernelInputs(x, logits, kernels.Nvfp4MoeScales(case.w13_decode, case.w2_decode, activation, intermediate))


def run_kernel(
    backend: MoeBackend,
    shape: MoeShape,
    aligned: AlignedMoe,
    inputs: KernelInputs,
    valid_intermediate_size: int | None = None,
    valid_hidden_size: int | None = None,
) -> torch.Tensor:
    """The backend's kernel output on ``aligned``, cropped to the model's hidden size, fp32 on CPU.

    A failing kernel call carries the Ip (mod 128) triage hint as an exception note.
    """
    try:
        if backend is MoeBackend.FLASHINFER_TRTLLM:
            out = kernels.run_trtllm_fp4_moe(
                aligned,
                inputs.x,
                inputs.logits,
                shape.top_k,
                shape.activation,
                inputs.scales,
                valid_intermediate_size=valid_intermediate_size,
                valid_hidden_size=valid_hidden_size,
            )
        else:
            weights, ids = route(inputs.logits, shape.top_k)
            out = kernels.run_cutlass_fused_moe_nvfp4(aligned, inputs.x, ids, weights, shape.activation, inputs.scales)
    except fi.LibraryUnavailable:
        raise
    except Exception as exc:
        hint = open_question(backend, aligned)
        if hint and hasattr(exc, "add_note"):
            exc.add_note(hint.strip(" []"))
        raise
    return out[:, : shape.hidden].cpu()


def assert_fp4_close(got: torch.Tensor, want: torch.Tensor, context: str) -> float:
    """Assert the FP4 bound above; returns the worst ``|got - want| / ‖want‖∞``."""
    assert got.shape == want.shape, f"{context}: output is {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{context}: {int((~torch.isfinite(got)).sum())} non-finite outputs"
    scale = float(want.abs().max())
    err = (got - want).abs()
    if scale == 0.0:
        assert not err.any(), (
            f"{context}: reference is all zero but the kernel gives max |out| = {float(err.max()):.4g}"
        )
        return 0.0
    over = err > ATOL_FRACTION * scale + RTOL * want.abs()
    worst, outliers = float(err.max()) / scale, float(over.float().mean())
    where = divmod(int(err.argmax()), want.shape[1])
    assert outliers <= MAX_OUTLIERS and worst <= GROSS, (
        f"{context}: {int(over.sum())}/{over.numel()} elements ({outliers:.1%}, allowed {MAX_OUTLIERS:.0%}) exceed "
        f"{ATOL_FRACTION}·‖ref‖∞ + {RTOL}·|ref|; worst |diff| = {worst:.3f}·‖ref‖∞ (allowed {GROSS}) at "
        f"[token {where[0]}, column {where[1]}]: got {float(got[where]):.5g}, want {float(want[where]):.5g}; "
        f"‖ref‖∞ = {scale:.4g}"
    )
    return worst


def sizes(shape: MoeShape, aligned: AlignedMoe) -> str:
    return f"I {shape.intermediate} -> {aligned.intermediate_size}, H {shape.hidden} -> {aligned.hidden_size}"


def open_question(backend: MoeBackend, aligned: AlignedMoe) -> str:
    """The triage hint for trtllm-gen runs whose intermediate size is not a multiple of 128."""
    if backend is MoeBackend.FLASHINFER_TRTLLM and aligned.intermediate_size % 128:
        return (
            f" [Ip = {aligned.intermediate_size} ≡ {aligned.intermediate_size % 128} (mod 128): FlashInfer 0.7.4 "
            "documents intermediate_size % 128 == 0 (valid_intermediate_size); if only such shapes fail, the "
            "gated 64 rule (vLLM #46880) is insufficient for trtllm-gen (kernels.md §2.5 item 6)]"
        )
    return ""


@check(CONTRACT, MoeShape)
def check_kernel_matches_reference(shape: MoeShape, backend: MoeBackend, policy: MoeAlignment) -> None:
    """The real kernel on the policy's padded weights reproduces the dequantized reference MoE."""
    aligned, case = align(shape, backend, policy)
    inputs = kernel_inputs(shape, case)
    want = reference_output(shape, case, inputs.x, inputs.logits, kernel_requantize(inputs.scales.intermediate))
    context = f"{backend.value} vs reference ({sizes(shape, aligned)}){open_question(backend, aligned)}"
    got = run_kernel(backend, shape, aligned, inputs)
    record_target(assert_fp4_close(got, want, context), label=f"{backend.value}: max|kernel - ref| / max|ref|")


@check(CONTRACT, MoeShape)
def check_kernel_padding_invariance(shape: MoeShape, backend: MoeBackend, policy: MoeAlignment) -> None:
    """The kernel gives the same output on the policy's padded weights as on the unpadded ones;
    where the backend cannot run those, as on FlashInfer's own padding (``pad_trtllm_moe_weights``:
    I to a multiple of 128 per FC1 half; trtllm-gen also gets the valid sizes declared)."""
    aligned, case = align(shape, backend, policy)
    inputs = kernel_inputs(shape, case)
    gated, i, h = shape.gated, shape.intermediate, shape.hidden
    trtllm = backend is MoeBackend.FLASHINFER_TRTLLM
    if not fi.nvfp4_moe_violations(backend.value, i, h, gated):
        name, other, valid = "unpadded", AlignedMoe(case.weights, i, h), {}
        label = f"unpadded (I {i}, H {h})"
    else:
        other, vi, vh = kernels.flashinfer_padded(case.weights, gated, hidden_alignment=256 if trtllm else 128)
        name = "pad_trtllm_moe_weights"
        valid = {"valid_intermediate_size": vi, "valid_hidden_size": vh} if trtllm else {}
        declared = f", valid {vi}/{vh}" if trtllm else ", cutlass_fused_moe has no valid sizes"
        label = f"{name} (Ip {other.intermediate_size}, Hp {other.hidden_size}{declared})"
    record_event(f"{backend.value}: policy vs {name}")
    want = run_kernel(backend, shape, other, inputs, **valid)
    got = run_kernel(backend, shape, aligned, inputs)
    context = f"{backend.value}: policy ({sizes(shape, aligned)}) vs {label}{open_question(backend, aligned)}"
    record_target(assert_fp4_close(got, want, context), label=f"{backend.value}: max|policy - {name}| / max|{name}|")


@TRTLLM
@KERNEL_SETTINGS
@given(shape=TRTLLM_SHAPES.map(on_kernel))
@pinned
def test_trtllm_kernel_matches_reference(shape: MoeShape, backend: MoeBackend, policy: MoeAlignment) -> None:
    run_check(check_kernel_matches_reference, shape, backend, policy, kernel=True)


@CUTLASS
@KERNEL_SETTINGS
@given(shape=CUTLASS_SHAPES.map(on_kernel))
@pinned
def test_cutlass_kernel_matches_reference(shape: MoeShape, backend: MoeBackend, policy: MoeAlignment) -> None:
    run_check(check_kernel_matches_reference, shape, backend, policy, kernel=True)


@TRTLLM
@KERNEL_SETTINGS
@given(shape=TRTLLM_SHAPES.map(on_kernel))
@pinned
def test_trtllm_kernel_padding_invariance(shape: MoeShape, backend: MoeBackend, policy: MoeAlignment) -> None:
    run_check(check_kernel_padding_invariance, shape, backend, policy, kernel=True)


@CUTLASS
@KERNEL_SETTINGS
@given(shape=CUTLASS_SHAPES.map(on_kernel))
@pinned
def test_cutlass_kernel_padding_invariance(shape: MoeShape, backend: MoeBackend, policy: MoeAlignment) -> None:
    run_check(check_kernel_padding_invariance, shape, backend, policy, kernel=True)
