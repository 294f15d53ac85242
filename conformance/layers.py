"""The layer a drawn configuration describes, aligned by the policy under test, and its reference output.

Shared by the property modules of a contract (test modules are not imported as libraries).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import Any, Generic, TypeVar

import torch

from backends.fp8_moe import Fp8MoeBackend
from backends.fp8_tensor_moe import Fp8TensorMoeBackend
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance.moe_checks import align_checked
from contracts.moe import AlignedMoe, MoeAlignment, MoeWeights, relayout_moe
from reference.formats import MXFP4_BLOCK, NVFP4_BLOCK
from reference.fp8 import FP8_BLOCK, FP8_TENSOR_BLOCK
from reference.layouts import Fc1Layout, relayout_fc1
from reference.moe import GateUpOrder, moe_reference, route
from reference.padding import pad_dim
from strategies.catalog import SWIGLU
from strategies.moe import MoeShape
from strategies.mxfp4_moe import Mxfp4MoeConfig
from strategies.tensors import dequantize_moe, generator, moe_case, real_channels, routed_experts_only

T = TypeVar("T")


def digest(value: Any) -> str:
    """SHA-256 of ``value``'s whole structure: every tensor's path, shape, dtype and bytes, and every other
    leaf's path and ``repr`` (dataclass fields, sequence items and dict values, in order).

    A collision-resistant hash of all the bytes and fields, so equal digests mean equal values (a shard's
    offsets and experts count as much as its tensors); SHA-256 rather than BLAKE2b because CPUs with the SHA
    extensions (x86 SHA-NI, ARMv8 SHA2) hash about twice as fast with it.
    """
    h = hashlib.sha256()
    _hash_into(h, value, "")
    return h.hexdigest()


def _hash_into(h: Any, value: Any, path: str) -> None:
    if isinstance(value, torch.Tensor):
        h.update(f"{path} {tuple(value.shape)} {value.dtype};".encode())
        h.update(value.detach().reshape(-1).contiguous().view(torch.uint8).numpy())
    elif isinstance(value, (tuple, list)):
        h.update(f"{path} {type(value).__name__} {len(value)};".encode())
        for i, item in enumerate(value):
            _hash_into(h, item, f"{path}[{i}]")
    elif isinstance(value, dict):
        h.update(f"{path} dict {len(value)};".encode())
        for key, item in value.items():
            _hash_into(h, item, f"{path}[{key!r}]")
    elif is_dataclass(value) and not isinstance(value, type):
        h.update(f"{path} {type(value).__qualname__};".encode())
        for field in fields(value):
            _hash_into(h, getattr(value, field.name), f"{path}.{field.name}")
    else:
        h.update(f"{path} = {value!r};".encode())


class PerConfig(Generic[T]):
    """Values computed from a drawn configuration's tensors, kept for the latest ``kept`` keys: the tests of
    one property draw the same configurations for every backend, so the backends after the first read the
    value instead of recomputing it. A value is kept under its key and the :func:`digest` of the inputs it
    is computed from, so inputs that changed since (an unguarded policy that writes into its input) are a
    new key and the value is computed from them. Callers never change a value they read."""

    def __init__(self, kept: int = 64) -> None:
        self.kept = kept
        self._values: dict[tuple[Hashable, str], T] = {}

    def get(self, key: Hashable, inputs: Any, compute: Callable[[], T]) -> T:
        """The value of ``key`` on ``inputs``, computed by ``compute()`` unless it is kept (the oldest is dropped)."""
        full = (key, digest(inputs))
        if full not in self._values:
            if len(self._values) >= self.kept:
                del self._values[next(iter(self._values))]
            self._values[full] = compute()
        return self._values[full]


@dataclass(frozen=True)
class MoeLayer:
    """One rank's MoE layer of a drawn configuration, in any format.

    ``checkpoint``: the policy's input (FC1 rows in the form the contract hands it: NVFP4 FlashInfer's
    ``[up; gate]``, MXFP4 the checkpoint's); ``real``: the rank's real channels only (the unpadded layer,
    FC1 rows in ``real.fc1_layout``); ``x [T, H]`` and ``logits [T, E]``: the inputs; ``w13_decode``,
    ``w2_decode [E]``: per-expert decode global scales (NVFP4's; ones for MXFP4, whose scales are absolute).
    """

    checkpoint: MoeWeights
    real: MoeWeights
    x: torch.Tensor
    logits: torch.Tensor
    w13_decode: torch.Tensor
    w2_decode: torch.Tensor


def nvfp4_layer(shape: MoeShape) -> MoeLayer:
    """The NVFP4 layer of ``shape`` from its seed (:func:`strategies.tensors.moe_case`, halves ``[up; gate]``)."""
    case = moe_case(shape, NVFP4_BLOCK)
    real = real_channels(case.weights, shape.gated, shape.real_intermediate)
    return MoeLayer(case.weights, real, case.x, case.logits, case.w13_decode, case.w2_decode)


def align_nvfp4(shape: MoeShape, backend: Nvfp4MoeBackend, policy: MoeAlignment) -> tuple[AlignedMoe, MoeLayer]:
    """The NVFP4 layer of ``shape`` (:func:`nvfp4_layer`) and ``policy``'s alignment of it."""
    layer = nvfp4_layer(shape)
    return align_checked(policy, backend, layer.checkpoint, shape.gated, shape.describe()), layer


def fp8_layer(shape: MoeShape, block: int = FP8_BLOCK) -> MoeLayer:
    """The FP8 layer of ``shape`` from its seed (:func:`strategies.tensors.moe_case` with 128x128 tiles, or one
    scale per weight with ``block =`` :data:`~reference.fp8.FP8_TENSOR_BLOCK`), FC1 halves ``[gate; up]`` as
    vLLM's ``w13_weight`` holds them; decode scales ones (the FP8 scales are absolute)."""
    case = moe_case(shape, block)
    weights = replace(case.weights, fc1_layout=Fc1Layout.GATE_UP)
    real = replace(real_channels(weights, shape.gated, shape.real_intermediate), fc1_layout=Fc1Layout.GATE_UP)
    return MoeLayer(weights, real, case.x, case.logits, case.w13_decode, case.w2_decode)


def align_fp8(shape: MoeShape, backend: Fp8MoeBackend, policy: MoeAlignment) -> tuple[AlignedMoe, MoeLayer]:
    """The block-FP8 layer of ``shape`` (:func:`fp8_layer`) and ``policy``'s alignment of it."""
    layer = fp8_layer(shape)
    return align_checked(policy, backend, layer.checkpoint, shape.gated, shape.describe()), layer


def align_fp8_tensor(
    shape: MoeShape, backend: Fp8TensorMoeBackend, policy: MoeAlignment
) -> tuple[AlignedMoe, MoeLayer]:
    """The per-tensor FP8 layer of ``shape`` (:func:`fp8_layer`) and ``policy``'s alignment of it."""
    layer = fp8_layer(shape, FP8_TENSOR_BLOCK)
    return align_checked(policy, backend, layer.checkpoint, shape.gated, shape.describe()), layer


def _biases(config: Mxfp4MoeConfig) -> dict[str, torch.Tensor]:
    """fp32 ``w13_bias [E, 2I]`` (``[gate; up]``, zero past the real channels) and ``w2_bias [E, H]``,
    bf16 values: MXFP4 checkpoints store expert biases in bf16 (gpt-oss's ``*_proj_bias``), and engines
    hold them in bf16 until post-load processing (SGLang's ``Mxfp4MoEMethod.create_weights``)."""
    s = config.shape
    g = generator(s.seed + 1)
    b13 = (torch.randn(s.experts, 2, s.intermediate, generator=g) / 2).bfloat16().float()
    b13[..., s.real_intermediate :] = 0
    b2 = (torch.randn(s.experts, s.hidden, generator=g) / 2).bfloat16().float()
    return {"w13_bias": b13.flatten(1), "w2_bias": b2}


def mxfp4_layer(config: Mxfp4MoeConfig) -> MoeLayer:
    """The MXFP4 layer of ``config`` from its seed (:func:`strategies.tensors.moe_case`, halves ``[gate; up]``),
    its checkpoint in ``config.form``'s FC1 layout."""
    case = moe_case(config.shape, MXFP4_BLOCK)
    stacked = replace(case.weights, fc1_layout=Fc1Layout.GATE_UP, **(_biases(config) if config.bias else {}))
    real, b13 = config.shape.real_intermediate, stacked.w13_bias
    unpadded = replace(
        real_channels(stacked, True, real),
        fc1_layout=Fc1Layout.GATE_UP,
        w13_bias=None if b13 is None else b13.unflatten(-1, (2, -1))[..., :real].flatten(1),
        w2_bias=stacked.w2_bias,
    )
    checkpoint = relayout_moe(stacked, config.form.layout)
    return MoeLayer(checkpoint, unpadded, case.x, case.logits, case.w13_decode, case.w2_decode)


def align_mxfp4(config: Mxfp4MoeConfig, backend: Mxfp4MoeBackend, policy: MoeAlignment) -> tuple[AlignedMoe, MoeLayer]:
    """The MXFP4 layer of ``config`` (:func:`mxfp4_layer`) and ``policy``'s alignment of its checkpoint."""
    layer = mxfp4_layer(config)
    return align_checked(policy, backend, layer.checkpoint, True, config.describe()), layer


def reference_output(
    w: MoeWeights,
    layout: Fc1Layout,
    layer: MoeLayer,
    shape: MoeShape,
    x: torch.Tensor | None = None,
    requantize: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Reference MoE output ``[T, H]`` of experts ``w`` whose gated FC1 rows are read in ``layout``, decoded
    with ``layer``'s per-expert scales, on ``x`` (default ``layer.x``), ``requantize`` applied to the activated
    intermediate. Only the routed experts are dequantized (:func:`~strategies.tensors.routed_experts_only`);
    every matmul is exact, so the row order FC1 is read in does not change a bit."""
    weights, ids = route(layer.logits, shape.top_k)
    w, experts, ids = routed_experts_only(w, ids)
    w13, w2 = dequantize_moe(w, layer.w13_decode[experts], layer.w2_decode[experts])
    b13 = w.w13_bias
    if shape.gated:
        w13 = relayout_fc1(w13, layout, Fc1Layout.GATE_UP)
        b13 = None if b13 is None else relayout_fc1(b13, layout, Fc1Layout.GATE_UP, dim=-1)
    xp = pad_dim(layer.x if x is None else x, -1, w13.shape[-1])
    out = moe_reference(xp, w13, w2, weights, ids, shape.activation, GateUpOrder.GATE_UP, b13, w.w2_bias, requantize)
    return out[:, : shape.hidden]


def silu_no_bias(config: Mxfp4MoeConfig) -> Mxfp4MoeConfig:
    """``config`` as the a4w4 AITER path runs it for vLLM's Quark method: SiLU-gated, no biases."""
    return replace(config, bias=False, shape=replace(config.shape, activation=SWIGLU))
