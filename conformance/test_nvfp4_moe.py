"""Contract ``nvfp4_moe``: NVFP4 MoE weight alignment for FlashInfer (the Gemma-4 class of bugs).

For every MoE shape a catalogued model produces at any TP degree (and adversarial ones), the
policy under test pads one rank's NVFP4 expert weights so that FlashInfer's preparation accepts
them, and the padding leaves the layer's output unchanged. The four generic MoE properties
(``check_backend_accepts``, ``check_padding_invariance``, ``check_gate_up_layout``,
``check_minimal_and_idempotent``) are :mod:`conformance.moe_properties`' over the format record
:data:`conformance.moe_formats.NVFP4`; this module adds FlashInfer's trtllm-gen round trip and scale
interleave kernel. :func:`harness.properties.check` generates each Hypothesis test, and any failure
prints a one-line reproduction. Pinned regressions (``@example``): ``conformance.regressions.NVFP4_MOE_REGRESSIONS``.
"""

from __future__ import annotations

import pytest
import torch

from adapters import flashinfer as fi
from backends import record
from backends.nvfp4_moe import CONTRACT, Nvfp4MoeBackend
from conformance.layers import align_nvfp4
from conformance.moe_formats import NVFP4
from conformance.moe_properties import moe_alignment_properties
from conformance.regressions import NVFP4_MOE_REGRESSIONS
from contracts.moe import MoeAlignment
from harness.properties import check, record_error
from reference.layouts import inverse_permutation, swizzle_128x4, unswizzle_128x4
from strategies.moe import MoeShape, moe_shapes

pytestmark = [pytest.mark.contract(CONTRACT)]

TRTLLM = [Nvfp4MoeBackend.FLASHINFER_TRTLLM]

moe_alignment_properties(NVFP4, globals())


@check(
    CONTRACT,
    MoeShape,
    strategy=moe_shapes(),
    pins=NVFP4_MOE_REGRESSIONS,
    backends=[Nvfp4MoeBackend.FLASHINFER_TRTLLM, Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN],
)
def check_prepare_round_trip(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """Undoing FlashInfer's trtllm-gen shuffles and the 128x4 swizzle gives back the padded tensors."""
    aligned, _ = align_nvfp4(shape, backend, policy)
    prepared = record(backend).prepare(aligned, shape.gated)
    w = aligned.weights
    rows, hidden = w.w13.shape[1], w.w2.shape[1]
    for name, perm in (
        ("w13", fi.fc1_permutation(rows, shape.gated, False)),
        ("w2", fi.fc2_permutation(hidden, False)),
    ):
        assert torch.equal(getattr(prepared, name)[:, inverse_permutation(perm)], getattr(w, name)), (
            f"{name} does not round-trip"
        )
    for name, perm in (
        ("w13_scale", fi.fc1_permutation(rows, shape.gated, True)),
        ("w2_scale", fi.fc2_permutation(hidden, True)),
    ):
        src = getattr(w, name)
        lin = unswizzle_128x4(getattr(prepared, name).view(torch.uint8), src.shape[1], src.shape[2])
        assert torch.equal(lin[:, inverse_permutation(perm)], src), f"{name} does not round-trip"


@check(
    CONTRACT,
    MoeShape,
    strategy=moe_shapes(),
    pins=NVFP4_MOE_REGRESSIONS,
    backends=TRTLLM,
    kernel=True,
    kernel_backends=False,
    marks=[pytest.mark.cuda],
)
def check_scale_interleave_kernel(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> None:
    """FlashInfer's CUDA ``block_scale_interleave`` on the gathered padded scales equals the reference swizzle."""
    aligned, _ = align_nvfp4(shape, backend, policy)
    prepare = record(backend).prepare
    on_gpu = prepare(aligned, shape.gated, lambda s: fi.block_scale_interleave(s).view(swizzle_128x4(s).shape))
    reference = prepare(aligned, shape.gated)
    for name in ("w13_scale", "w2_scale"):
        assert torch.equal(getattr(on_gpu, name).view(torch.uint8), getattr(reference, name).view(torch.uint8)), (
            f"block_scale_interleave differs from the 128x4 reference on {name}"
        )
    record_error(0.0, "exact: block_scale_interleave")
