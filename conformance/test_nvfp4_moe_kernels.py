"""Contract ``nvfp4_moe`` on hardware: FlashInfer's real NVFP4 MoE kernels on the policy's padding.

SM100 (B200) only; elsewhere every test is skipped by its backend record's ``sm100`` marker. Two properties, each
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

Assumption (``docs/kernels.md`` §2.5 item 6, open): the policy's ``Ip`` is passed to trtllm-gen as
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
from hypothesis import settings
from hypothesis.strategies import SearchStrategy

from adapters import flashinfer_moe_kernels as kernels
from backends import record
from backends.nvfp4_moe import CONTRACT, Fp4OutputBound, Nvfp4MoeBackend
from conformance.layers import MoeLayer, align_nvfp4
from contracts.errors import LibraryUnavailable
from contracts.moe import AlignedMoe, MoeAlignment
from harness.properties import check, property_test, record_error, record_event
from reference.formats import E2M1_MAX, E4M3_MAX, NVFP4_BLOCK, GlobalScale, nvfp4_dequantize, nvfp4_quantize
from reference.moe import GateUpOrder, moe_reference, route
from strategies.moe import ACTIVATIONS, MoeShape, moe_shapes, pinned_shape
from strategies.tensors import dequantize_moe

pytestmark = [pytest.mark.contract(CONTRACT)]


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


def kernel_shapes(backend: Nvfp4MoeBackend) -> SearchStrategy[MoeShape]:
    """MoE shapes whose activation the backend's kernel runs (its record's ``kernel_activations``)."""
    kinds = record(backend).kernel_activations
    return moe_shapes(group=NVFP4_BLOCK, activations=tuple(a for a in ACTIVATIONS if a.kind in kinds))


REGRESSIONS = (
    pinned_shape("gemma-4-26b-a4b", 4),  # vLLM #46879: I 176 -> 192 (≡ 64 mod 128), GeGLU
    pinned_shape("gemma-4-26b-a4b", 2),  # vLLM #55649: I 352 -> 384, per-half padding
    pinned_shape("nemotron-3-nano-30b-a3b", 1),  # vLLM #52308: hidden padding on trtllm-gen, relu2
)


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
    case: MoeLayer,
    x: torch.Tensor,
    logits: torch.Tensor,
    requantize: Callable[[torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """Reference MoE output ``[T, H]`` (fp32) on the rank's real channels, FC1 rows ``[up; gate]``,
    with ``requantize`` applied to each expert's activated intermediate before FC2."""
    w13, w2 = dequantize_moe(case.real, case.w13_decode, case.w2_decode)
    weights, ids = route(logits, shape.top_k)
    return moe_reference(x, w13, w2, weights, ids, shape.activation, GateUpOrder.UP_GATE, requantize=requantize)


def kernel_requantize(decode: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """What the kernels feed FC2: the intermediate rounded to bf16, then NVFP4 quantize-dequantized
    with the decode global scale ``decode`` (FlashInfer's references do the same)."""

    def requantize(a: torch.Tensor) -> torch.Tensor:
        q = nvfp4_quantize(a.bfloat16().float(), decode, GlobalScale.DECODE)
        return nvfp4_dequantize(q, decode, GlobalScale.DECODE)

    return requantize


def intermediate_amax(shape: MoeShape, case: MoeLayer, x: torch.Tensor, logits: torch.Tensor) -> float:
    """Largest activated intermediate value over the routed tokens (FlashInfer's tests calibrate
    the intermediate's global scale from it)."""
    seen = [torch.zeros(())]

    def observe(a: torch.Tensor) -> torch.Tensor:
        seen.append(a.abs().max())
        return a

    reference_output(shape, case, x, logits, observe)
    return max(float(torch.stack(seen).max()), 1e-30)


def kernel_inputs(shape: MoeShape, case: MoeLayer) -> KernelInputs:
    """Snap the seed's activations to the NVFP4 grid, separate the logits, calibrate the scales."""
    activation = power_of_two_decode(float(case.x.abs().max()))
    x = snap(case.x, activation)
    ranks = case.logits.argsort(-1).argsort(-1).float()
    logits = case.logits + LOGIT_SEPARATION * ranks
    intermediate = power_of_two_decode(intermediate_amax(shape, case, x, logits))
    return KernelInputs(x, logits, kernels.Nvfp4MoeScales(case.w13_decode, case.w2_decode, activation, intermediate))


def run_kernel(
    backend: Nvfp4MoeBackend, shape: MoeShape, aligned: AlignedMoe, inputs: KernelInputs, **valid_sizes: int
) -> torch.Tensor:
    """The backend record's kernel output on ``aligned``, cropped to the model's hidden size, fp32 on CPU.

    A failing kernel call carries the record's triage hint as an exception note.
    """
    r = record(backend)
    try:
        out = r.kernel(aligned, inputs.x, inputs.logits, shape.top_k, shape.activation, inputs.scales, **valid_sizes)
    except LibraryUnavailable:
        raise
    except Exception as exc:
        hint = open_question(backend, aligned)
        if hint and hasattr(exc, "add_note"):
            exc.add_note(hint.strip(" []"))
        raise
    return out[:, : shape.hidden].cpu()


def assert_fp4_close(got: torch.Tensor, want: torch.Tensor, bound: Fp4OutputBound, context: str) -> float:
    """Assert ``bound`` (its error argument: :class:`backends.nvfp4_moe.Fp4OutputBound`); returns the
    worst ``|got - want| / ‖want‖∞``."""
    assert got.shape == want.shape, f"{context}: output is {tuple(got.shape)}, expected {tuple(want.shape)}"
    assert torch.isfinite(got).all(), f"{context}: {int((~torch.isfinite(got)).sum())} non-finite outputs"
    scale = float(want.abs().max())
    err = (got - want).abs()
    if scale == 0.0:
        assert not err.any(), (
            f"{context}: reference is all zero but the kernel gives max |out| = {float(err.max()):.4g}"
        )
        return 0.0
    over = err > bound.atol_fraction * scale + bound.rtol * want.abs()
    worst, outliers = float(err.max()) / scale, float(over.float().mean())
    where = divmod(int(err.argmax()), want.shape[1])
    assert outliers <= bound.max_outliers and worst <= bound.gross, (
        f"{context}: {int(over.sum())}/{over.numel()} elements ({outliers:.1%}, allowed {bound.max_outliers:.0%}) "
        f"exceed {bound.atol_fraction}·‖ref‖∞ + {bound.rtol}·|ref|; worst |diff| = {worst:.3f}·‖ref‖∞ "
        f"(allowed {bound.gross}) at "
        f"[token {where[0]}, column {where[1]}]: got {float(got[where]):.5g}, want {float(want[where]):.5g}; "
        f"‖ref‖∞ = {scale:.4g}"
    )
    return worst


def sizes(shape: MoeShape, aligned: AlignedMoe) -> str:
    return f"I {shape.intermediate} -> {aligned.intermediate_size}, H {shape.hidden} -> {aligned.hidden_size}"


def open_question(backend: Nvfp4MoeBackend, aligned: AlignedMoe) -> str:
    """The record's triage hint for this padded intermediate size, as a bracketed suffix (or empty)."""
    hint = record(backend).kernel_hint
    note = hint(aligned.intermediate_size) if hint else ""
    return f" [{note}]" if note else ""


@check(CONTRACT, MoeShape)
def check_kernel_matches_reference(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """The real kernel on the policy's padded weights reproduces the dequantized reference MoE."""
    aligned, case = align_nvfp4(shape, backend, policy)
    inputs = kernel_inputs(shape, case)
    want = reference_output(shape, case, inputs.x, inputs.logits, kernel_requantize(inputs.scales.intermediate))
    context = f"{backend.value} vs reference ({sizes(shape, aligned)}){open_question(backend, aligned)}"
    got = run_kernel(backend, shape, aligned, inputs)
    bound = record(backend).tolerance
    record_error(
        assert_fp4_close(got, want, bound, context) / bound.gross,
        label=f"{backend.value}: max|kernel - ref| / max|ref| / gross",
    )


@check(CONTRACT, MoeShape)
def check_kernel_padding_invariance(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """The kernel gives the same output on the policy's padded weights as on the unpadded ones;
    where the backend cannot run those, as on FlashInfer's own padding (``pad_trtllm_moe_weights``:
    I to a multiple of 128 per FC1 half; trtllm-gen also gets the valid sizes declared)."""
    aligned, case = align_nvfp4(shape, backend, policy)
    inputs = kernel_inputs(shape, case)
    gated, i, h, r = shape.gated, shape.intermediate, shape.hidden, record(backend)
    if not r.violations(i, h, gated, shape.experts):
        name, other, valid = "unpadded", AlignedMoe(case.checkpoint, i, h), {}
        label = f"unpadded (I {i}, H {h})"
    else:
        other, vi, vh = kernels.flashinfer_padded(case.checkpoint, gated, hidden_alignment=r.padding_reference)
        name = "pad_trtllm_moe_weights"
        valid = {"valid_intermediate_size": vi, "valid_hidden_size": vh} if r.declares_valid_sizes else {}
        declared = f", valid {vi}/{vh}" if valid else f", {r.entry_point} gets no valid sizes"
        label = f"{name} (Ip {other.intermediate_size}, Hp {other.hidden_size}{declared})"
    record_event(f"{backend.value}: policy vs {name}")
    want = run_kernel(backend, shape, other, inputs, **valid)
    got = run_kernel(backend, shape, aligned, inputs)
    context = f"{backend.value}: policy ({sizes(shape, aligned)}) vs {label}{open_question(backend, aligned)}"
    worst = assert_fp4_close(got, want, r.tolerance, context)
    record_error(worst / r.tolerance.gross, label=f"{backend.value}: max|policy - {name}| / max|{name}| / gross")


for _check in (check_kernel_matches_reference, check_kernel_padding_invariance):
    for _backend in (b for b in Nvfp4MoeBackend if record(b).kernel is not None):
        property_test(
            _check,
            name=f"test_{_backend.name.removeprefix('FLASHINFER_').lower()}_{_check.__name__.removeprefix('check_')}",
            strategy=kernel_shapes(_backend).map(on_kernel),
            pins=[on_kernel(shape) for shape in REGRESSIONS],
            backends=[_backend],
            kernel=True,
            settings=KERNEL_SETTINGS,
        )

del _check, _backend
