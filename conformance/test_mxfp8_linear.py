"""Contract ``mxfp8_linear``: an MXFP8 linear layer's weight prepared for FlashInfer's ``mm_mxfp8`` backends.

For every layer size (any ``N``, any ``K``, partial last scale block included) and every backend, the policy's
padded weight and scale grid are what the backend's record takes (:mod:`backends.mxfp8_linear`: vLLM 0.33.0 and
FlashInfer 0.7.4 rules), the padding changes no output bit of the reference GEMM, and the padding is the
smallest the backend takes and idempotent. Pure torch on CPU; no kernel is run (``mm_mxfp8`` needs SM100+).
"""

from __future__ import annotations

import enum

import pytest
import torch

from backends import record
from backends.mxfp8_linear import Mxfp8LinearRecord
from conformance.layers import PerConfig
from contracts.mxfp8_linear import CONTRACT, Mxfp8LinearPreparation, PreparedMxfp8Linear
from harness.inputs import InputModified
from harness.properties import ALL_BACKENDS, check, record_event
from reference.formats import ue8m0_decode
from reference.linear import exact_matmul
from reference.mxfp8 import MXFP8_BLOCK, Mxfp8Quantized, mxfp8_dequantize
from reference.padding import outside_corner, pad_dim
from reference.sizes import round_up
from strategies.mxfp8_linear import Mxfp8LinearCase, Mxfp8LinearShape, mxfp8_linear_case, mxfp8_linear_shapes

pytestmark = [pytest.mark.contract(CONTRACT)]

PINS = [
    Mxfp8LinearShape(n=100, k=100, tokens=3, seed=0),  # both below mm_mxfp8's 128 minimum
    Mxfp8LinearShape(n=2112, k=7168, tokens=2, seed=1),  # DeepSeek-V3 fused_qkv_a_proj
    Mxfp8LinearShape(n=130, k=144, tokens=1, seed=2),  # K % 32 == 16, N just above 128
    Mxfp8LinearShape(n=256, k=200, tokens=4, seed=3),  # K % 32 == 8, partial last block
]
"""Sizes every run checks first."""


def prepare(policy: Mxfp8LinearPreparation, backend: enum.Enum, layer: Mxfp8Quantized) -> PreparedMxfp8Linear:
    """The policy's preparation of copies of ``layer`` (a refusal or any exception fails the property)."""
    try:
        return policy.prepare_mxfp8_linear(backend, layer.codes.clone(), layer.scales.clone())
    except InputModified:
        raise
    except Exception as exc:
        raise AssertionError(
            f"preparation for {backend.value} raised on weight {tuple(layer.codes.shape)}: {type(exc).__name__}: {exc}"
        ) from exc


_CASES: PerConfig[Mxfp8LinearCase] = PerConfig(kept=128)
"""A shape's tensors by shape JSON: the three properties and every backend's test draw the same shapes, and
quantizing the weight is most of an example's work. Callers never change a case (``prepare`` hands copies)."""


def case_of(shape: Mxfp8LinearShape) -> Mxfp8LinearCase:
    """:func:`strategies.mxfp8_linear.mxfp8_linear_case` of ``shape``, built once while it is kept."""
    return _CASES.get(shape.to_json(), (), lambda: mxfp8_linear_case(shape))


def rec(backend: enum.Enum) -> Mxfp8LinearRecord:
    r = record(backend)
    assert isinstance(r, Mxfp8LinearRecord)
    return r


def dequantize_prepared(prepared: PreparedMxfp8Linear) -> torch.Tensor:
    """fp32 ``[Np, Kp]`` of a prepared layer: the codes with the grid's first ``Np`` rows and ``ceil(Kp/32)``
    columns (codes padded with zeros to whole blocks for the reference)."""
    np_, kp = prepared.weight.shape
    k32 = round_up(kp, MXFP8_BLOCK)
    scale = prepared.scale[:np_, : k32 // MXFP8_BLOCK]
    return mxfp8_dequantize(Mxfp8Quantized(pad_dim(prepared.weight, 1, k32), scale))[:, :kp]


def mxfp8_dequantize_layer(layer: Mxfp8Quantized, k: int) -> torch.Tensor:
    """fp32 ``[N, K]`` of an unpadded layer whose last scale block may be partial."""
    k32 = round_up(k, MXFP8_BLOCK)
    return mxfp8_dequantize(Mxfp8Quantized(pad_dim(layer.codes, 1, k32), layer.scales))[:, :k]


@check(CONTRACT, Mxfp8LinearShape, strategy=mxfp8_linear_shapes(), pins=PINS, backends=ALL_BACKENDS)
def check_backend_accepts(shape: Mxfp8LinearShape, backend: enum.Enum, policy: Mxfp8LinearPreparation) -> None:
    """The prepared weight and scale grid are uint8, 2-D, and of sizes the backend's ``mm_mxfp8`` path takes
    (``Kp`` a multiple of its K unit, ``Np`` of its N unit, both >= 128, grid ``[ru(Np, 128), ru(Kp/32, 4)]``)."""
    r = rec(backend)
    prepared = prepare(policy, backend, case_of(shape).layer)
    w, s = prepared.weight, prepared.scale
    assert w.dtype == torch.uint8 and s.dtype == torch.uint8, f"dtypes {w.dtype}, {s.dtype}; want uint8 bytes"
    want = r.padded_shape(shape.n, shape.k)
    assert r.accepts(tuple(w.shape), tuple(s.shape)), (
        f"{backend.value} does not take weight {tuple(w.shape)} with scale grid {tuple(s.shape)} (layer "
        f"[{shape.n}, {shape.k}]): it needs N % {r.n_multiple}, K % {r.k_multiple}, both >= 128 and the grid "
        f"ru(N, 128) x ru(K/32, 4); e.g. weight {want}, grid {r.scale_grid(*want)}"
    )
    record_event(f"padded N {'yes' if want[0] > shape.n else 'no'}, K {'yes' if want[1] > shape.k else 'no'}")


_UNPADDED_OUTPUTS: PerConfig[torch.Tensor] = PerConfig()
"""The unpadded layer's reference GEMM by shape JSON (every backend's test draws the same shapes)."""


@check(CONTRACT, Mxfp8LinearShape, strategy=mxfp8_linear_shapes(), pins=PINS, backends=ALL_BACKENDS)
def check_padding_invariance(shape: Mxfp8LinearShape, backend: enum.Enum, policy: Mxfp8LinearPreparation) -> None:
    """The original bytes stay in place, padded weight bytes are E4M3 zeros, every padded scale byte is a finite
    E8M0 value (the swizzled grid the kernel gets is the whole padded grid, FlashInfer 0.7.4
    ``_mxfp8_swizzled_scale_len``; a NaN scale there multiplies zero operands and IEEE ``0 · NaN`` is NaN: the
    kernel's handling of it was not measured here), and the reference GEMM ``x @ W.T`` (fp64, left to right along K) through the padded layer, first ``N`` columns, is
    bit-identical to the unpadded layer's."""
    case = case_of(shape)
    prepared = prepare(policy, backend, case.layer)
    w, s = prepared.weight, prepared.scale
    n, k, kc = shape.n, shape.k, case.layer.scales.shape[1]
    assert w.shape[0] >= n and w.shape[1] >= k and s.shape[0] >= n and s.shape[1] >= kc, (
        f"prepared weight {tuple(w.shape)} / grid {tuple(s.shape)} smaller than the layer [{n}, {k}] / [{n}, {kc}]"
    )
    assert torch.equal(w[:n, :k], case.layer.codes), "the original weight bytes moved or changed"
    assert torch.equal(s[:n, :kc], case.layer.scales), "the original scale bytes moved or changed"
    nonzero = sum(int(((part & 0x7F) != 0).sum()) for part in outside_corner(w, (n, k)))
    assert nonzero == 0, f"{nonzero} padded weight byte(s) are not E4M3 zeros"
    nan = sum(int(torch.isnan(ue8m0_decode(part)).sum()) for part in outside_corner(s, (n, kc)))
    assert nan == 0, f"{nan} padded scale byte(s) are 0xFF, an E8M0 NaN ({backend.value} reads the whole grid)"
    want = _UNPADDED_OUTPUTS.get(
        shape.to_json(), case, lambda: exact_matmul(case.x, mxfp8_dequantize_layer(case.layer, k))
    )
    got = exact_matmul(pad_dim(case.x, 1, w.shape[1]), dequantize_prepared(prepared))[:, :n]
    if not torch.equal(got, want):
        diff = (got - want).abs().nan_to_num(nan=float("inf")).max().item()
        raise AssertionError(f"{backend.value}: padding changed the reference GEMM, max |diff| = {diff:.4g}")


@check(CONTRACT, Mxfp8LinearShape, strategy=mxfp8_linear_shapes(), pins=PINS, backends=ALL_BACKENDS)
def check_minimal_and_idempotent(shape: Mxfp8LinearShape, backend: enum.Enum, policy: Mxfp8LinearPreparation) -> None:
    """The weight is padded to exactly the smallest sizes the backend takes (``padded_shape``) and the grid to
    exactly its ``scale_grid``; preparing the prepared layer again (its weight, the grid's first ``Np`` rows and
    ``Kp/32`` columns) returns the same bytes."""
    r = rec(backend)
    prepared = prepare(policy, backend, case_of(shape).layer)
    w, s = prepared.weight, prepared.scale
    want = r.padded_shape(shape.n, shape.k)
    assert tuple(w.shape) == want, (
        f"{backend.value}: layer [{shape.n}, {shape.k}] padded to {tuple(w.shape)}; the smallest it takes is {want}"
    )
    assert tuple(s.shape) == r.scale_grid(*want), f"scale grid {tuple(s.shape)}, want {r.scale_grid(*want)}"
    kc = -(-want[1] // MXFP8_BLOCK)
    again = prepare(policy, backend, Mxfp8Quantized(w, s[: want[0], :kc].contiguous()))
    assert torch.equal(again.weight, w) and torch.equal(again.scale, s), (
        f"{backend.value}: preparing the prepared layer changed it (weight {tuple(again.weight.shape)}, "
        f"grid {tuple(again.scale.shape)})"
    )
