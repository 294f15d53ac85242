"""``mxfp4_moe`` for the ``vllm`` subject: sizes from vLLM's
``mxfp4_round_up_hidden_size_and_intermediate_size`` per backend (AITER's under a ROCm CDNA4 platform), and for
``triton-kernels-sm90`` what vLLM's ``TRITON`` conversion hands triton_kernels; placement is the suite's."""

from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from unittest import mock

import torch

from adapters import triton_kernels
from backends.mxfp4_moe import Mxfp4MoeBackend
from contracts.moe import AlignedMoe, MoeWeights, pad_moe
from reference.layouts import Fc1Layout
from subjects.mxfp4_moe import BuiltinMxfp4MoeAlignment
from subjects.vllm.bridge import MXFP4_BACKENDS, VllmSourceMismatch, vllm_modules

ROCM_BACKENDS = (Mxfp4MoeBackend.AITER, Mxfp4MoeBackend.AITER_A16W4)
"""Backends whose rounding vLLM decides under ``current_platform.is_rocm()`` (:func:`rocm_platform`)."""

CDNA4 = 4
"""gfx950 (MI350x / MI355x), the suite's AITER target, is CDNA 4."""


@contextlib.contextmanager
def rocm_platform(v: types.SimpleNamespace) -> Iterator[None]:
    """A ROCm CDNA4 platform for the oracle: its ``current_platform`` answers ``is_rocm()``, and
    ``vllm.platforms.rocm`` (which queries the GPU at import) is a stub with ``get_cdna_version() = 4``.
    Nothing is patched where the platform already is ROCm."""
    if v.mxfp4_oracle.current_platform.is_rocm():
        yield
        return
    platform = types.SimpleNamespace(is_rocm=lambda: True, is_xpu=lambda: False)
    rocm = types.ModuleType("vllm.platforms.rocm")
    rocm.get_cdna_version = lambda: CDNA4
    with (
        mock.patch.object(v.mxfp4_oracle, "current_platform", platform),
        mock.patch.dict(sys.modules, {"vllm.platforms.rocm": rocm}),
    ):
        yield


@contextlib.contextmanager
def _hopper_triton_kernels(v: types.SimpleNamespace) -> Iterator[list[torch.Tensor]]:
    """Run vLLM's triton_kernels preparation as on an SM90 GPU, recording what it hands ``convert_layout``.

    ``current_platform`` (in ``mxfp4_utils``) is CUDA capability 9.0 with torch >= 2.8.1 (its swizzled
    branch), triton_kernels 3.5.1 is present; the triton_kernels modules vLLM imports are
    ``adapters.triton_kernels.recorded_hand_over``'s stand-ins, which record what ``convert_layout`` is handed
    (the yielded list), and the oracle's ``PrecisionConfig`` / ``FlexCtx`` are inert.
    """
    sm90 = types.SimpleNamespace(
        is_cuda=lambda: True,
        is_rocm=lambda: False,
        is_device_capability=lambda capability: capability == 90,
        is_device_capability_family=lambda capability: False,
    )
    utils, oracle = v.mxfp4_utils, v.mxfp4_oracle
    with (
        triton_kernels.recorded_hand_over() as handed,
        mock.patch.object(utils, "current_platform", sm90),
        mock.patch.object(utils, "has_triton_kernels", lambda: True),
        mock.patch.object(utils, "get_triton_kernels_version", lambda: "3.5.1"),
        mock.patch.object(utils, "is_torch_equal_or_newer", lambda version: True),
        mock.patch.object(utils, "should_use_gfx1250_mx_scale_swizzle", lambda: False),
        mock.patch.object(oracle, "PrecisionConfig", lambda **kwargs: None, create=True),
        mock.patch.object(oracle, "FlexCtx", lambda **kwargs: None, create=True),
        mock.patch.object(oracle, "_mx_scale_kwargs", lambda scale: {}),
    ):
        yield handed


def hopper_scale_groups(v: types.SimpleNamespace, scale: torch.Tensor) -> int:
    """Scale groups along K that vLLM's ``_swizzle_mxfp4`` hands triton_kernels on an SM90 GPU
    (:func:`_hopper_triton_kernels`), for one GEMM's ``scale [E, N, K/32]``. vLLM PR #47910 (in 0.33.0)
    pads them to a multiple of 4 there; without it they stay ``K/32``."""
    e, n, groups = scale.shape
    with _hopper_triton_kernels(v) as handed:
        v.mxfp4_utils._swizzle_mxfp4(torch.zeros(e, n, groups * 16, dtype=torch.uint8), scale)
    if len(handed) != 2 or handed[1].shape[0] != e or handed[1].shape[-1] != n:
        raise VllmSourceMismatch(
            f"_swizzle_mxfp4 no longer hands convert_layout the weights then the [E, K/32, N] scales: {handed}"
        )
    return handed[1].shape[1]


def triton_kernel_format(v: types.SimpleNamespace, weights: MoeWeights) -> MoeWeights:
    """The experts vLLM's ``TRITON`` conversion hands triton_kernels (:func:`_hopper_triton_kernels`), back in
    the contract's orientation: ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` for gpt-oss's
    row-interleaved checkpoints (``GptOssMxfp4MoEMethod``), ``convert_weight_to_mxfp4_moe_kernel_format`` for
    stacked ones (``Mxfp4MoEMethod``). ``weights`` are the loader's padded buffers; the scales come back with
    the groups vLLM added (zero bytes), the weights are zero-padded to match them, and FC1 rows are labelled
    with the order triton_kernels' ``swiglu`` reads (gate/up pairs)."""
    oracle = v.mxfp4_oracle
    layer = torch.nn.Module()
    tensors = {"w13_weight": weights.w13, "w2_weight": weights.w2,
               "w13_weight_scale": weights.w13_scale, "w2_weight_scale": weights.w2_scale}  # fmt: skip
    for name, t in tensors.items():
        layer.register_parameter(name, torch.nn.Parameter(t.clone(), requires_grad=False))
    args = (layer.w13_weight, layer.w2_weight, layer.w13_weight_scale, layer.w2_weight_scale)
    biases = tuple(None if b is None else b.clone() for b in (weights.w13_bias, weights.w2_bias))
    convert = (
        oracle.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format
        if weights.fc1_layout is Fc1Layout.GATE_UP_INTERLEAVED
        else oracle.convert_weight_to_mxfp4_moe_kernel_format
    )
    with _hopper_triton_kernels(v) as handed:
        out = convert(oracle.Mxfp4MoeBackend.TRITON, layer, *args, *biases)
    if len(handed) != 4:
        raise VllmSourceMismatch(f"vLLM's TRITON conversion handed triton_kernels {len(handed)} tensors, not 4")
    return triton_kernels.handed_weights(handed, *out[4:6])


class VllmMxfp4MoeAlignment(BuiltinMxfp4MoeAlignment):
    """Sizes from vLLM's ``mxfp4_round_up_hidden_size_and_intermediate_size`` (``fused_moe/oracle/mxfp4.py``),
    for the vLLM backend :data:`MXFP4_BACKENDS` names; the AITER ones under a patched ROCm CDNA4
    platform (:func:`rocm_platform`), called without ``activation`` as Quark's and gpt-oss's
    ``maybe_roundup_sizes`` do.

    ``triton-kernels-sm90``: vLLM keeps its rounded sizes and zero-pads only the scale groups along K
    (:func:`hopper_scale_groups`, vLLM PR #47910); where the weights' K has an even number of 32-groups that
    equals weights and scales zero-padded to ``32 × groups`` along K for the kernel, otherwise K stays the
    weights' (:func:`adapters.triton_kernels.contract_k`), the sizes reported here (FC1's K is ``H``, FC2's
    is ``I``).

    Only the sizes are vLLM's: the zero padding per gate/up half and the FC1 row order are the built-in
    policy's (``contracts.moe.pad_moe``, ``reference.padding``), since vLLM places weights in the padded
    buffers through its weight loader, which needs a whole model.
    """

    def align_moe(self, backend: Mxfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if backend is not Mxfp4MoeBackend.TRITON_SM90:
            return super().align_moe(backend, weights, gated)
        ip, hp = self.oracle_sizes(backend, weights)
        loaded = pad_moe(weights, gated, ip, hp).weights  # the loader's buffers (placement: the suite's)
        w = triton_kernel_format(vllm_modules(), loaded)
        return AlignedMoe(w, w.intermediate_size, w.hidden_size)

    def sizes(self, backend: Mxfp4MoeBackend, weights: MoeWeights) -> tuple[int, int]:
        ip, hp = self.oracle_sizes(backend, weights)
        if backend is Mxfp4MoeBackend.TRITON_SM90:
            e = weights.w13.shape[0]
            v = vllm_modules()
            fc1 = hopper_scale_groups(v, torch.zeros(e, 2 * ip, hp // 32, dtype=torch.uint8))
            fc2 = hopper_scale_groups(v, torch.zeros(e, hp, ip // 32, dtype=torch.uint8))
            hp, ip = triton_kernels.contract_k(hp, fc1), triton_kernels.contract_k(ip, fc2)
        return ip, hp

    def oracle_sizes(self, backend: Mxfp4MoeBackend, weights: MoeWeights) -> tuple[int, int]:
        """``(Ip, Hp)`` from ``mxfp4_round_up_hidden_size_and_intermediate_size`` for ``backend``."""
        v = vllm_modules()
        member = v.mxfp4_oracle.Mxfp4MoeBackend[MXFP4_BACKENDS[backend]]
        platform = rocm_platform(v) if backend in ROCM_BACKENDS else contextlib.nullcontext()
        with platform:
            hidden, intermediate = v.mxfp4_oracle.mxfp4_round_up_hidden_size_and_intermediate_size(
                member, weights.hidden_size, weights.intermediate_size
            )
        return intermediate, hidden
