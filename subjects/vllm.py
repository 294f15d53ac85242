"""Subject ``vllm``: vLLM's own alignment and fallback code, adapted to the suite's protocols.

Enabled when vLLM imports (``scripts/install-vllm-cpu.sh`` installs vLLM 0.33.0 on a CPU
machine). Every decision comes from vLLM's functions; this module only builds the small input
objects they need (a layer namespace carrying ``moe_config``) and converts tensors between the
suite's layout and vLLM's. Where vLLM's code needs a GPU, the adapter substitutes the smallest
piece, named here:

* ``prepare_nvfp4_moe_layer_for_fi_or_cutlass``, FLASHINFER_TRTLLM branch: vLLM pads the hidden
  size and aligns the intermediate size, then calls ``prepare_static_weights_for_trtllm_fp4_moe``
  whose 128x4 interleave is a CUDA kernel. The adapter captures that call's inputs (the padded,
  not yet shuffled weights) and returns them; the suite's own properties then run FlashInfer's
  real shuffle helpers on them.
* the CUTLASS branch: ``swizzle_blockscale`` ends with ``.cuda()``; on a machine without CUDA
  the adapter makes ``Tensor.cuda`` the identity for the duration of the call, and reads the
  swizzled scales back with the reference inverse.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import types
from collections.abc import Iterator
from unittest import mock

import torch

from reference.layouts import swap_halves, unswizzle_128x4
from subjects.moe import AlignedMoe, MoeWeights, UnsupportedConfig
from subjects.nvfp4_moe import CONTRACT as NVFP4_MOE
from subjects.nvfp4_moe import MoeBackend
from subjects.registry import KnownFailure, Subject, register_subject


class VllmUnavailable(RuntimeError):
    """vLLM is not importable here."""


@functools.cache
def vllm_modules() -> types.SimpleNamespace:
    """Import vLLM's modules under test in the order that avoids its circular import."""
    try:
        importlib.import_module("vllm.model_executor.layers.fused_moe")  # must come first
        ffm = importlib.import_module("vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe")
        nvfp4_oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.nvfp4")
        activation = importlib.import_module("vllm.model_executor.layers.fused_moe.activation")
    except Exception as exc:
        raise VllmUnavailable(
            f"vLLM is not importable ({type(exc).__name__}: {exc}); run scripts/install-vllm-cpu.sh"
        ) from exc
    return types.SimpleNamespace(
        ffm=ffm, NvFp4MoeBackend=nvfp4_oracle.NvFp4MoeBackend, MoEActivation=activation.MoEActivation
    )


@contextlib.contextmanager
def _cuda_as_identity() -> Iterator[None]:
    """Make ``Tensor.cuda`` a no-op where there is no CUDA (vLLM's ``swizzle_blockscale`` ends with it)."""
    if torch.cuda.is_available():
        yield
        return
    with mock.patch.object(torch.Tensor, "cuda", lambda self, *args, **kwargs: self):
        yield


def _fake_layer(v: types.SimpleNamespace, gated: bool, hidden: int, intermediate: int) -> types.SimpleNamespace:
    act = v.MoEActivation.SILU if gated else v.MoEActivation.RELU2_NO_MUL
    config = types.SimpleNamespace(
        moe_parallel_config=types.SimpleNamespace(enable_eplb=False),
        hidden_dim=hidden,
        hidden_dim_unpadded=None,
        intermediate_size_per_partition=intermediate,
    )
    return types.SimpleNamespace(activation=act, moe_config=config)


class VllmNvfp4MoeAlignment:
    """``prepare_nvfp4_moe_layer_for_fi_or_cutlass`` (vLLM) for FlashInfer TRT-LLM and CUTLASS."""

    def align_moe(self, backend: MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        v = vllm_modules()
        e, h, i = weights.w13.shape[0], weights.hidden_size, weights.intermediate_size
        layer = _fake_layer(v, gated, h, i)
        ones = torch.ones(e)
        # vLLM holds [w1 = gate; w3 = up] and swaps to FlashInfer's [up; gate] itself.
        w13 = swap_halves(weights.w13).contiguous() if gated else weights.w13.clone()
        w13_scale = (swap_halves(weights.w13_scale) if gated else weights.w13_scale).contiguous()
        args = (
            layer, w13, w13_scale.view(torch.float8_e4m3fn), ones, ones, weights.w2.clone(),
            weights.w2_scale.view(torch.float8_e4m3fn).contiguous(), ones, ones,
        )  # fmt: skip
        if backend is MoeBackend.FLASHINFER_TRTLLM:
            return self._trtllm(v, layer, args, gated)
        return self._cutlass(v, args, gated, h)

    @staticmethod
    def _trtllm(v: types.SimpleNamespace, layer: types.SimpleNamespace, args: tuple, gated: bool) -> AlignedMoe:
        captured: dict[str, torch.Tensor] = {}

        def capture(w13, w2, w13_scale, w2_scale, **_: object):
            captured.update(w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale)
            return w13, w13_scale, w2, w2_scale

        with mock.patch.object(v.ffm, "prepare_static_weights_for_trtllm_fp4_moe", capture):
            v.ffm.prepare_nvfp4_moe_layer_for_fi_or_cutlass(
                v.NvFp4MoeBackend.FLASHINFER_TRTLLM, *args, is_act_and_mul=gated
            )
        aligned = MoeWeights(
            w13=captured["w13"], w13_scale=captured["w13_scale"].view(torch.uint8),
            w2=captured["w2"], w2_scale=captured["w2_scale"].view(torch.uint8), block=16,
        )  # fmt: skip
        cfg = layer.moe_config
        return AlignedMoe(aligned, cfg.intermediate_size_per_partition, cfg.hidden_dim)

    @staticmethod
    def _cutlass(v: types.SimpleNamespace, args: tuple, gated: bool, hidden: int) -> AlignedMoe:
        """vLLM's CUTLASS branch pads non-gated rows itself but leaves ``intermediate_size_per_partition``
        unchanged; the padded size reported here is read off the returned ``w2``."""
        try:
            with _cuda_as_identity():
                out = v.ffm.prepare_nvfp4_moe_layer_for_fi_or_cutlass(
                    v.NvFp4MoeBackend.FLASHINFER_CUTLASS, *args, is_act_and_mul=gated
                )
        except NotImplementedError as exc:
            raise UnsupportedConfig(f"vLLM FLASHINFER_CUTLASS: {exc.args}") from exc
        w13, w13_scale, _, _, w2, w2_scale, _, _ = (t.cpu() for t in out)
        rows, ip = w13.shape[1], 2 * w2.shape[2]
        aligned = MoeWeights(
            w13=w13,
            w13_scale=unswizzle_128x4(w13_scale.view(torch.uint8), rows, hidden // 16),
            w2=w2,
            w2_scale=unswizzle_128x4(w2_scale.view(torch.uint8), hidden, ip // 16),
            block=16,
        )
        return AlignedMoe(aligned, ip, hidden)


VLLM_KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        NVFP4_MOE,
        "FLASHINFER_CUTLASS raises NotImplementedError for gated layers with 2I % 128 != 0 "
        "instead of padding each half (Qwen3.8-Flash-Next TP=4, Gemma-4 TP=2/4); open fixes: PRs #57351, #48624",
        "https://github.com/vllm-project/vllm/issues/57125",
        applies=lambda shape: shape.gated and (2 * shape.intermediate) % 128 != 0,
        backend=MoeBackend.FLASHINFER_CUTLASS.value,
    ),
)

register_subject(
    Subject(
        "vllm",
        "vLLM's real alignment and fallback functions (scripts/install-vllm-cpu.sh)",
        {NVFP4_MOE: VllmNvfp4MoeAlignment()},
        known_failures=VLLM_KNOWN_FAILURES,
    )
)
