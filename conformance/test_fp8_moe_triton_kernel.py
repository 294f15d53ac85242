"""Contract ``fp8_moe`` on a real Hopper kernel: the Triton block-FP8 fused MoE on the policy's experts.

Property: for every drawn block-FP8 MoE layer (the ``fp8_moe`` strategy with SiLU-gated experts, the
activation the composition fuses), the policy's experts for ``triton-fp8-block``, zero-padded by a further 0
or 128 of ``I`` and of ``H``, run through AITER's Triton ``fused_moe`` (``use_fp8_w8a8``, ``block_shape =
[128, 128]``), composed as vLLM's ``fused_experts`` composes its Triton kernel
(:func:`adapters.aiter_triton.fp8_block_moe`; activations quantized per token in 1x128 groups by the
reference, :func:`reference.fp8.fp8_token_group_quantize`):

* the further padding leaves the output bit-identical (every accumulator gains exact zeros; the tiles
  depend on the token count only);
* each GEMM is within :func:`backends.fp8_moe.triton_fp8_block_tolerance`, per element, of the exact product of
  its own dequantized activations and the rank's real experts zero-padded to the policy's sizes
  (:func:`conformance.moe_checks.fp8_block_moe_stages`): the bound is zero on padded channels, so padding that
  is not zeros, or a real channel moved, fails here;
* the output is within :data:`FP8_MOE_REL_L2` of the reference MoE of the unpadded layer fed the same
  quantized input.

Which kernel runs: AITER's ``_fused_moe_kernel`` is its port of vLLM's ``fused_moe_kernel`` ("MoE Kernel
adapted from VLLM", amd-aiter ``aiter/ops/triton/moe_op.py``) and indexes the block scales as vLLM 0.33.0 does
(:func:`adapters.aiter_triton.fused_moe_fp8_block` cites the lines): the property executes the weight layout and
scale indexing the ``triton-fp8-block`` record describes, through AITER's launcher, not vLLM's (vLLM's needs its
compiled ``_moe_C`` for the token alignment). What the kernel does at sizes the record's rule refuses is
measured by ``python -m bench.kernel_truth --kernel triton-fp8-block`` (``backends/truth/``).

Known-bad subjects: ``bad-fp8-partial-block`` and ``bad-fp8-unpadded`` are refused by the record's rule
before any launch (:func:`conformance.moe_checks.align_checked`); ``bad-fp8-empty-padding`` runs and fails
the FC1 step (its padded channels read non-zero weight bytes within real tiles). Runs where an NVIDIA GPU and amd-aiter are present; skips otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest
import torch
from hypothesis import strategies as st

from adapters import aiter_triton as at
from adapters.calls import kernel_device
from backends.fp8_moe import CONTRACT, TRITON_FP8_ON_CUDA, Fp8MoeBackend
from conformance import moe_formats
from conformance.layers import align_fp8, reference_output
from conformance.moe_checks import assert_within, fp8_block_moe_stages
from contracts.moe import MoeAlignment, MoeWeights, pad_moe
from harness.properties import check, record_event
from reference.fp8 import FP8_BLOCK, Fp8Quantized, fp8_token_group_dequantize
from reference.fp8 import fp8_token_group_quantize as quantize_tokens
from reference.layouts import Fc1Layout
from reference.moe import route
from reference.padding import pad_dim
from strategies.catalog import SWIGLU
from strategies.config import Config
from strategies.moe import MoeShape

pytestmark = [pytest.mark.contract(CONTRACT), *(getattr(pytest.mark, m) for m in TRITON_FP8_ON_CUDA)]

EXTRA = FP8_BLOCK
"""Further padding drawn on top of the policy's, per size (0 or this): one more 128-tile."""

FP8_MOE_REL_L2 = 0.25
"""End-to-end relative L2 error against the reference MoE of the real channels fed the same quantized input: a
check of the composition (routing, slot order, gate/up halves, the weighted sum), which the stage checks and
the padding step already pin per element. It cannot be tight: the reference keeps FC1 exact where the kernel
rounds it to bf16 (``2^-8`` relative), and where that moves SiLU(g)·u across an E4M3 rounding midpoint or moves a
group's amax, the re-quantized intermediate moves by one E4M3 step (``2^-3`` relative at most) or its group's
scale by ``2^-8``. Averaged over a layer that is a few parts in a thousand; a gate/up mispairing, a wrong
expert or a misplaced scale tile gives 0.5 to 1.4."""


@dataclass(frozen=True)
class Fp8KernelCase(Config):
    """A drawn SiLU-gated block-FP8 MoE layer and padding past the policy's (0 or :data:`EXTRA` each)."""

    shape: MoeShape
    extra_intermediate: int
    extra_hidden: int

    def describe(self) -> str:
        return f"{self.shape.describe()}; +{self.extra_intermediate} I, +{self.extra_hidden} H past the policy's"


def silu_gated(shape: MoeShape) -> MoeShape:
    """``shape`` with SiLU-gated experts, the activation :func:`adapters.aiter_triton.fp8_block_moe` composes."""
    return replace(shape, activation=SWIGLU)


@st.composite
def kernel_cases(draw: st.DrawFn) -> Fp8KernelCase:
    """Shapes are the ``fp8_moe`` properties' (:data:`conformance.moe_formats.FP8_BLOCK`) and shrink as theirs do;
    the extras shrink towards 0."""
    extra = st.sampled_from((0, EXTRA))
    shape = draw(moe_formats.FP8_BLOCK.strategy.map(silu_gated))
    return Fp8KernelCase(shape, draw(extra), draw(extra))


REGRESSIONS = tuple(Fp8KernelCase(silu_gated(s), EXTRA, EXTRA) for s in moe_formats.FP8_BLOCK.pins)


def device_quantize(x: torch.Tensor) -> at.Fp8Device:
    """The reference's per-token 1x128-group quantization of a bf16 ``x [M, K]``, on the kernel's device."""
    q = quantize_tokens(x.float().cpu())
    return at.Fp8Device(q.codes.view(torch.float8_e4m3fn).to(kernel_device()), q.scales.to(kernel_device()))


def run_moe(w: MoeWeights, x: torch.Tensor, routing: torch.Tensor, ids: torch.Tensor) -> at.TritonMoeRun:
    """The Triton block-FP8 MoE on ``w`` (FC1 ``[gate; up]``) with ``x`` zero-padded to its hidden size."""
    xp = pad_dim(x, -1, w.hidden_size).to(kernel_device(), torch.bfloat16)
    ids = ids.to(kernel_device())
    return at.fp8_block_moe(w.w13, w.w13_scale, w.w2, w.w2_scale, xp, routing, ids, device_quantize)


def requantize_intermediate(a: torch.Tensor) -> torch.Tensor:
    """What FC2 reads of the activated intermediate: bf16, then per-token 1x128-group FP8."""
    return fp8_token_group_dequantize(quantize_tokens(a.to(torch.bfloat16).float()))


@check(
    CONTRACT,
    Fp8KernelCase,
    strategy=kernel_cases(),
    pins=REGRESSIONS,
    backends=[Fp8MoeBackend.TRITON],
    kernel=True,
    kernel_backends=False,
)
def check_triton_fp8_block_moe(case: Fp8KernelCase, backend: Fp8MoeBackend, policy: MoeAlignment) -> None:
    """The Triton block-FP8 MoE on the policy's (further padded) experts: bit-identical under the further padding,
    each GEMM within its per-element bound, the output within :data:`FP8_MOE_REL_L2` of the reference."""
    at.require_cuda()
    s = case.shape
    aligned, layer = align_fp8(s, backend, policy)
    w = aligned.weights
    assert w.fc1_layout is Fc1Layout.GATE_UP, (
        f"the policy labels FC1 rows {w.fc1_layout.value}; the kernel reads [gate; up]"
    )
    routing, ids = route(layer.logits, s.top_k)
    run = run_moe(w, layer.x, routing, ids)
    ip, hp = w.intermediate_size + case.extra_intermediate, w.hidden_size + case.extra_hidden
    if (ip, hp) != (w.intermediate_size, w.hidden_size):
        further = run_moe(pad_moe(w, True, ip, hp).weights, layer.x, routing, ids)
        same = torch.equal(further.out[:, : w.hidden_size], run.out) and not further.out[:, w.hidden_size :].any()
        record_event(f"further padding: {'bit-identical' if same else 'differs'}")
        assert same, (
            f"padding I {w.intermediate_size} -> {ip}, H {w.hidden_size} -> {hp} moved the kernel output by up to "
            f"{(further.out[:, : w.hidden_size] - run.out).abs().max().item():.4g}"
        )
    oracle = pad_moe(layer.real, True, w.intermediate_size, w.hidden_size).weights
    stages = fp8_block_moe_stages(run, oracle, routing, ids)
    for g in stages:
        assert_within(g.got, g.exact, g.tolerance, f"{g.name} vs the zero-padded real experts", g.name)
    fed = fp8_token_group_dequantize(Fp8Quantized(*run.x_q))[:, : s.hidden]
    ref = reference_output(layer.real, Fc1Layout.GATE_UP, layer, s, x=fed, requantize=requantize_intermediate)
    err = ((run.out[:, : s.hidden] - ref).norm() / ref.norm().clamp_min(1e-30)).item()
    assert err <= FP8_MOE_REL_L2, (
        f"Triton block-FP8 MoE vs the reference MoE: relative L2 error {err:.3g} > {FP8_MOE_REL_L2}"
    )
    record_event(f"relative L2 {'<= 2^-5' if err <= 2**-5 else '> 2^-5'}")
