"""``nvfp4_moe`` for the ``vllm`` subject: vLLM's NVFP4 MoE weight preparation per backend
(``prepare_nvfp4_moe_layer_for_fi_or_cutlass``, ``prepare_nvfp4_moe_layer_for_flashinfer_cutedsl``,
``prepare_nvfp4_moe_layer_for_b12x``), read back in the contract's form."""

from __future__ import annotations

import types
from unittest import mock

import torch

from adapters import flashinfer_cutedsl as cutedsl
from backends import record
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.errors import LibraryUnavailable, UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights
from reference.layouts import (
    Fc1Layout,
    grouped_gate_up_interleave,
    inverse_permutation,
    relayout_fc1,
    swap_halves,
    unswizzle_128x4,
)
from subjects.engine_tools import cuda_as_identity
from subjects.vllm.bridge import NVFP4_BACKENDS, not_mapped, vllm_modules


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
    """vLLM's NVFP4 MoE weight preparation per backend (:data:`NVFP4_BACKENDS`), read back in the contract's form.

    * FLASHINFER_TRTLLM branch: vLLM pads the hidden size and aligns the intermediate size, then
      calls ``prepare_static_weights_for_trtllm_fp4_moe`` whose 128x4 interleave is a CUDA kernel.
      The adapter captures that call's inputs (the padded, not yet shuffled weights) and returns
      them; the suite's own properties then run FlashInfer's real shuffle helpers on them. The hidden
      alignment is chosen as ``ModelOptNvFp4FusedMoE.process_weights_after_loading`` chooses it:
      vLLM's ``trtllm_nvfp4_hidden_alignment(per_token_activation, is_act_and_mul)`` (512 for a
      per-token non-gated layer, else 256).
    * CUTLASS branch: ``swizzle_blockscale`` ends with ``.cuda()``; on a machine without CUDA the
      adapter makes ``Tensor.cuda`` the identity for the duration of the call, and reads the
      swizzled scales back with the reference inverse.
    * FLASHINFER_CUTEDSL: ``prepare_nvfp4_moe_layer_for_flashinfer_cutedsl`` (its own function, which swaps
      ``[w1; w3]`` itself, pads per half to 64 / 128 and the hidden size to 256, regroups gated FC1 rows
      into 64-row up/gate groups and swizzles the scales), under the same ``Tensor.cuda`` identity. The
      padded sizes are the ones it records in the layer's ``moe_config``; the adapter undoes the swizzle
      and the regrouping with the reference inverses (``unswizzle_128x4``, the inverse of
      ``grouped_gate_up_interleave``), so a misplaced row shows up as a padding-invariance failure.
    * B12X: ``prepare_nvfp4_moe_layer_for_b12x`` (``quantization/utils/b12x_moe.py``) as
      ``convert_to_nvfp4_moe_kernel_format`` calls it for W4A4 (``reorder_w13=False``: b12x reads
      ``[w1; w3]``, its ``"w31"``), under the ``Tensor.cuda`` identity; the swizzled scales are read back
      with the reference inverse and the halves swapped back to ``[up; gate]``. Nothing of the ``b12x``
      library runs: vLLM pads and swizzles before b12x sees the weights.
    """

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        v = vllm_modules()
        e, h, i = weights.w13.shape[0], weights.hidden_size, weights.intermediate_size
        layer = _fake_layer(v, gated, h, i)
        ones = torch.ones(e)
        # vLLM holds [w1 = gate; w3 = up] and swaps to FlashInfer's [up; gate] itself. Its loader copies the
        # checkpoint into the layer's own parameters: every tensor handed over here is a copy, never the caller's.
        w13 = swap_halves(weights.w13).contiguous() if gated else weights.w13.clone()
        w13_scale = swap_halves(weights.w13_scale).contiguous() if gated else weights.w13_scale.clone()
        args = (
            layer, w13, w13_scale.view(torch.float8_e4m3fn), ones, ones, weights.w2.clone(),
            weights.w2_scale.clone().view(torch.float8_e4m3fn), ones, ones,
        )  # fmt: skip
        if backend not in NVFP4_BACKENDS:
            raise LibraryUnavailable(not_mapped(backend))
        member, per_token = NVFP4_BACKENDS[backend]
        branches = {
            "FLASHINFER_TRTLLM": lambda: self._trtllm(v, layer, args, gated, per_token),
            "FLASHINFER_CUTLASS": lambda: self._cutlass(v, backend, args, gated, h),
            "VLLM_CUTLASS": lambda: self._cutlass(v, backend, args, gated, h),
            "FLASHINFER_CUTEDSL": lambda: self._cutedsl(v, layer, args, gated),
            "B12X": lambda: self._b12x(v, args, gated, h),
        }
        return branches[member]()

    @staticmethod
    def _trtllm(
        v: types.SimpleNamespace, layer: types.SimpleNamespace, args: tuple, gated: bool, per_token: bool
    ) -> AlignedMoe:
        captured: dict[str, torch.Tensor] = {}
        alignment = v.fiu.trtllm_nvfp4_hidden_alignment(per_token_activation=per_token, is_act_and_mul=gated)

        def capture(w13, w2, w13_scale, w2_scale, **_: object):
            captured.update(w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale)
            return w13, w13_scale, w2, w2_scale

        with mock.patch.object(v.ffm, "prepare_static_weights_for_trtllm_fp4_moe", capture):
            v.ffm.prepare_nvfp4_moe_layer_for_fi_or_cutlass(
                v.NvFp4MoeBackend.FLASHINFER_TRTLLM, *args, is_act_and_mul=gated, trtllm_hidden_alignment=alignment
            )
        aligned = MoeWeights(
            w13=captured["w13"], w13_scale=captured["w13_scale"].view(torch.uint8),
            w2=captured["w2"], w2_scale=captured["w2_scale"].view(torch.uint8), block=16,
        )  # fmt: skip
        cfg = layer.moe_config
        return AlignedMoe(aligned, cfg.intermediate_size_per_partition, cfg.hidden_dim)

    @staticmethod
    def _cutlass(
        v: types.SimpleNamespace, backend: Nvfp4MoeBackend, args: tuple, gated: bool, hidden: int
    ) -> AlignedMoe:
        """vLLM's CUTLASS branch (FLASHINFER_CUTLASS, VLLM_CUTLASS) pads non-gated rows itself but leaves
        ``intermediate_size_per_partition`` unchanged. No consumer on that path reads it
        (``FlashInferExperts.apply`` hands the weights to ``cutlass_fused_moe``, ``run_cutlass_moe_fp4``
        and the modular kernel take N from ``w1.shape``), so the size the kernel sees, reported here, is
        read off the returned ``w2``. FC1 comes back in the order the backend's kernel reads (its record's
        ``fc1_layout``) and is turned into the contract's ``[up; gate]``."""
        member = NVFP4_BACKENDS[backend][0]
        vllm_backend = v.NvFp4MoeBackend[member]
        if not v.global_input_scale(vllm_backend):  # per-expert [w1, w3] input scales, as ModelOpt loads them
            args = (*args[:4], torch.ones(args[4].shape[0], 2), *args[5:])
        try:
            with cuda_as_identity():
                out = v.ffm.prepare_nvfp4_moe_layer_for_fi_or_cutlass(vllm_backend, *args, is_act_and_mul=gated)
        except NotImplementedError as exc:
            raise UnsupportedConfig(f"vLLM {member}: {exc.args}") from exc
        w13, w13_scale, _, _, w2, w2_scale, _, _ = (t.cpu() for t in out)
        rows, ip = w13.shape[1], 2 * w2.shape[2]
        w13_scale = unswizzle_128x4(w13_scale.view(torch.uint8), rows, hidden // 16).contiguous()
        if gated:
            source = record(backend).fc1_layout
            w13, w13_scale = (
                relayout_fc1(w13, source, Fc1Layout.UP_GATE),
                relayout_fc1(w13_scale, source, Fc1Layout.UP_GATE),
            )
        aligned = MoeWeights(
            w13=w13,
            w13_scale=w13_scale,
            w2=w2,
            w2_scale=unswizzle_128x4(w2_scale.view(torch.uint8), hidden, ip // 16).contiguous(),
            block=16,
        )
        return AlignedMoe(aligned, ip, hidden)

    @staticmethod
    def _cutedsl(v: types.SimpleNamespace, layer: types.SimpleNamespace, args: tuple, gated: bool) -> AlignedMoe:
        with cuda_as_identity():  # args hold vLLM's [w1; w3]; the function swaps to [up; gate] itself
            out = v.ffm.prepare_nvfp4_moe_layer_for_flashinfer_cutedsl(*args)
        w13, w13_scale, _, _, w2, w2_scale, _, _ = (t.cpu() for t in out)
        cfg = layer.moe_config
        ip, hp, rows = cfg.intermediate_size_per_partition, cfg.hidden_dim, w13.shape[1]
        inverse = (
            inverse_permutation(grouped_gate_up_interleave(rows, cutedsl.FC1_GROUP)) if gated else torch.arange(rows)
        )
        aligned = MoeWeights(
            w13=w13[:, inverse],
            w13_scale=unswizzle_128x4(w13_scale.view(torch.uint8), rows, hp // 16)[:, inverse],
            w2=w2,
            w2_scale=unswizzle_128x4(w2_scale.view(torch.uint8), hp, ip // 16).contiguous(),
            block=16,
        )
        return AlignedMoe(aligned, ip, hp)

    @staticmethod
    def _b12x(v: types.SimpleNamespace, args: tuple, gated: bool, hidden: int) -> AlignedMoe:
        with cuda_as_identity():  # args hold vLLM's [w1; w3], which b12x's W4A4 path keeps
            out = v.b12x_moe.prepare_nvfp4_moe_layer_for_b12x(*args[1:], is_act_and_mul=gated, reorder_w13=False)
        w13, w13_scale, _, _, w2, w2_scale, _, _ = (t.cpu() for t in out)
        rows, ip = w13.shape[1], 2 * w2.shape[2]
        w13_scale = unswizzle_128x4(w13_scale.view(torch.uint8), rows, hidden // 16).contiguous()
        aligned = MoeWeights(
            w13=swap_halves(w13) if gated else w13,
            w13_scale=swap_halves(w13_scale) if gated else w13_scale,
            w2=w2,
            w2_scale=unswizzle_128x4(w2_scale.view(torch.uint8), hidden, ip // 16).contiguous(),
            block=16,
        )
        return AlignedMoe(aligned, ip, hidden)
