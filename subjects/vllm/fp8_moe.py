"""``fp8_moe`` and ``fp8_tensor_moe`` for the ``vllm`` subject: vLLM 0.33.0's block-FP8 MoE method
(``Fp8MoEMethod``: block-shape resolution, ``create_weights``, ``RoutedExperts.weight_loader``,
``process_weights_after_loading``) run on CPU for one rank, read back in the contract's form.

vLLM pads a block-FP8 rank in one place only: ``resolve_fp8_moe_weight_block_shape`` (``fused_moe/oracle/fp8.py``,
run by ``Fp8MoEMethod.__init__``) either refines the 128x128 grid to ``[g, g]``, ``g = gcd(128, I/tp, H) >= 32``
(``refine_fp8_moe_block_shape``; only Triton-based kernels take a refined shape), or, with an explicit
``--moe-backend`` at TP > 1, grows ``intermediate_size_per_partition`` to whole 128-blocks
(``pad_tp_shard_to_weight_blocks``, vLLM PR #55867), and the loader fills the buffers with zero weights and unit
scales before copying the rank's whole blocks (``RoutedExperts._load_model_weight_or_group_weight_scale``,
``tp_shard_with_padding``). Otherwise ``create_weights`` calls ``validate_fp8_block_shape_moe``, which raises for
``I/tp % 128``. The hidden size is never padded; ``prepare_fp8_moe_layer_for_fi`` (FLASHINFER_TRTLLM) swaps
FC1 to ``[up; gate]`` and clamps block scales to at least ``1e-10``.
"""

from __future__ import annotations

import contextlib
import functools
import math
import types
from collections.abc import Iterator
from unittest import mock

import torch

from backends.fp8_moe import Fp8MoeBackend
from backends.fp8_tensor_moe import Fp8TensorMoeBackend
from contracts.errors import CheckpointNotServed, LibraryUnavailable, UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, pad_moe
from reference.fp8 import FP8_BLOCK
from reference.layouts import Fc1Layout, split_fc1, swap_halves
from subjects.vllm.bridge import FP8_BACKENDS, fp8_modules, not_mapped, sharding_modules
from subjects.vllm.sharding import PREFIX, _filled, expert_map, experts_layer, moe_config, parallel_config


def stand_in_tp(intermediate: int) -> int:
    """The TP degree of the layer the adapter hands vLLM for a rank of ``intermediate`` channels: 1 where they
    are whole 128-blocks, else the smallest ``T`` with ``T·I % 128 == 0`` (``128 / gcd(I, 128)``), so that the
    layer's global intermediate size is 128-aligned as ``pad_tp_shard_to_weight_blocks`` asks."""
    return 1 if intermediate % FP8_BLOCK == 0 else FP8_BLOCK // math.gcd(intermediate, FP8_BLOCK)


@contextlib.contextmanager
def _tp_world(v: types.SimpleNamespace, f: types.SimpleNamespace, tp: int) -> Iterator[None]:
    """vLLM's TP-group queries answering rank 0 of ``tp`` while weights are created (``create_weights``,
    ``validate_fp8_block_shape_moe``, ``vllm.model_executor.parameter``); ``torch.empty`` buffers filled with
    NaN codes, so memory vLLM never writes shows up."""
    with (
        mock.patch.object(torch, "empty", functools.partial(_filled, torch.empty)),
        mock.patch.object(f.fp8, "get_tensor_model_parallel_world_size", lambda: tp),
        mock.patch.object(f.distributed, "get_tensor_model_parallel_world_size", lambda: tp),
        mock.patch.object(v.parameter, "get_tensor_model_parallel_rank", lambda: 0),
        mock.patch.object(v.parameter, "get_tensor_model_parallel_world_size", lambda: tp),
    ):
        yield


FP8_GPU = types.SimpleNamespace(
    is_cuda=lambda: True,
    is_rocm=lambda: False,
    is_xpu=lambda: False,
    has_device_capability=lambda capability: True,
    supports_fp8=lambda: True,
)
"""The platform ``TritonExperts._supports_quant_scheme`` is asked on (``fused_moe/experts/triton_moe.py``): a CUDA
GPU with FP8 (SM90, SM100). On a CPU ``supports_fp8()`` is false and Triton would take no FP8 block shape at all, so
the refinement a GPU gets (:func:`_method`) would never happen."""


def _method(v: types.SimpleNamespace, f: types.SimpleNamespace, config, member: str):
    """``Fp8Config`` (128x128 blocks, dynamic activations) and ``Fp8MoEMethod`` as its ``__init__`` builds them,
    without the ``select_fp8_moe_backend`` call (it asks the GPU): the block-shape resolution runs as ``__init__``
    runs it, on an FP8 GPU (:data:`FP8_GPU`), the backend is the record's member."""
    quant_config = f.fp8.Fp8Config(is_checkpoint_fp8_serialized=True, weight_block_size=[FP8_BLOCK, FP8_BLOCK])
    method = object.__new__(f.fp8.Fp8MoEMethod)
    f.fp8.FusedMoEMethodBase.__init__(method, config)
    method.quant_config, method.weight_block_size, method.block_quant = quant_config, [FP8_BLOCK] * 2, True
    method.weight_scale_name = "weight_scale_inv"
    try:
        with mock.patch.object(f.triton_experts, "current_platform", FP8_GPU):
            method.moe_block_shape, method.weight_scale_refine = f.oracle.resolve_fp8_moe_weight_block_shape(
                config, method.weight_block_size, f.quant_utils.kFp8Dynamic128Sym, True
            )
    except ValueError as exc:  # pad_tp_shard_to_weight_blocks: a global size not whole 128-blocks
        raise CheckpointNotServed(
            f"vLLM's block-aligned TP loading (pad_tp_shard_to_weight_blocks) declines the layer: {exc}"
        ) from exc
    method.fp8_backend, method.experts_cls, method.per_act_token_quant = f.oracle.Fp8MoeBackend[member], None, False
    method._init_moe_kernel = lambda layer: None  # builds the GPU kernel object: not run
    return quant_config, method


class VllmFp8MoeAlignment:
    """vLLM 0.33.0's block-FP8 MoE loading and post-load preparation for one rank, per backend
    (:data:`subjects.vllm.bridge.FP8_BACKENDS`, asked for as ``--moe-backend`` asks: ``FusedMoEConfig.moe_backend``).

    The rank's experts are handed to vLLM as rank 0 of a layer of TP degree :func:`stand_in_tp`, whose other
    ranks' channels are zero: a rank of whole 128-blocks is a TP=1 layer, any other takes vLLM's TP path,
    where its padding lives. That stand-in layer's global intermediate size is whole 128-blocks; a model whose
    own is not (Gemma-4-26B-A4B, I = 704) is declined by ``pad_tp_shard_to_weight_blocks`` at every TP degree,
    a fact of the global layer this rank-local contract does not see. vLLM's own code then resolves the block shape, allocates the parameters
    (``create_weights``, ``validate_fp8_block_shape_moe`` included), loads every expert's ``w1``, ``w3``, ``w2``
    and block scales (``RoutedExperts.weight_loader``, which narrows rank 0's whole blocks) and runs
    ``process_weights_after_loading``. Substituted: ``select_fp8_moe_backend`` (the record's member instead),
    the layer's constructor (as in :mod:`subjects.vllm.sharding`), ``_init_moe_kernel`` (the GPU kernel object)
    and, for FLASHINFER_TRTLLM, ``_shuffle_deepseek_fp8_moe_weights``, FlashInfer's BlockMajorK row gather, by
    the identity (a fixed permutation for the kernel; the weights are read before it). FC1 comes back in
    ``[gate; up]``: the FLASHINFER_TRTLLM halves vLLM swapped to ``[up; gate]`` are swapped back.

    Where vLLM refines the block grid instead (``weight_scale_refine``: Triton, ``gcd(128, I, H) >= 32``) the
    layer has ``g x g`` tiles, outside this contract's 128x128 form: :class:`CheckpointNotServed`.
    """

    def align_moe(self, backend: Fp8MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if backend not in FP8_BACKENDS:
            raise LibraryUnavailable(not_mapped(backend))
        if weights.block != FP8_BLOCK:
            raise ValueError(f"fp8_moe takes 128x128 block-scaled FP8 weights, got block {weights.block}")
        v, f = sharding_modules(), fp8_modules()
        member, flag = FP8_BACKENDS[backend]
        e, h, i = weights.w13.shape[0], weights.hidden_size, weights.intermediate_size
        tp = stand_in_tp(i)
        ckpt = pad_moe(weights, gated, tp * i, h).weights  # the other ranks' channels: zeros
        parallel = parallel_config(v, tp, 0)
        experts = expert_map(v, parallel, e, "linear")
        config = moe_config(v, e, e, h, tp * i, gated, parallel)
        config.moe_backend = flag
        quant_config, method = _method(v, f, config, member)
        if method.weight_scale_refine is not None:
            raise CheckpointNotServed(
                f"vLLM refines the block grid to {method.moe_block_shape} for I={i}, H={h} "
                "(refine_fp8_moe_block_shape): the Triton kernel runs finer tiles than the contract's 128x128"
            )
        layer = experts_layer(v.routed.RoutedExperts, config, quant_config, method, experts)
        layer.activation = config.activation
        try:
            with _tp_world(v, f, tp):
                method.create_weights(
                    layer=layer, num_experts=e, hidden_size=h,
                    intermediate_size_per_partition=config.intermediate_size_per_partition,
                    params_dtype=torch.bfloat16, weight_loader=layer.weight_loader,
                )  # fmt: skip
        except ValueError as exc:  # validate_fp8_block_shape_moe
            raise UnsupportedConfig(f"vLLM {member} Fp8MoEMethod.create_weights: {exc}") from exc
        _load(layer, ckpt, gated)
        with mock.patch.object(f.fiu, "_shuffle_deepseek_fp8_moe_weights", _shuffled_then_kept(f)):
            try:
                method.process_weights_after_loading(layer)
            except RuntimeError as exc:  # the BlockMajorK view of a K that is not whole 128-blocks
                raise UnsupportedConfig(f"vLLM {member} process_weights_after_loading: {exc}") from exc
        w13, w13_scale = layer.w13_weight.detach(), layer.w13_weight_scale_inv.detach()
        if gated and member == "FLASHINFER_TRTLLM":  # prepare_fp8_moe_layer_for_fi: swap_w13_to_w31
            w13, w13_scale = swap_halves(w13), swap_halves(w13_scale)
        aligned = MoeWeights(
            w13=w13.contiguous().view(torch.uint8), w13_scale=w13_scale.float().contiguous(),
            w2=layer.w2_weight.detach().view(torch.uint8), w2_scale=layer.w2_weight_scale_inv.detach().float(),
            block=FP8_BLOCK, fc1_layout=Fc1Layout.GATE_UP,
        )  # fmt: skip
        return AlignedMoe(aligned, layer.moe_config.intermediate_size_per_partition, h)


def _shuffled_then_kept(f: types.SimpleNamespace):
    """A stand-in for ``_shuffle_deepseek_fp8_moe_weights`` that runs vLLM's own (so its BlockMajorK view's demands
    on the shapes hold) and returns the weights it was given: the shuffle is a fixed row permutation for the
    kernel, and the contract reads the weights before it."""
    shuffle = f.fiu._shuffle_deepseek_fp8_moe_weights

    def stand_in(w13: torch.Tensor, w2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        shuffle(w13, w2)
        return w13, w2

    return stand_in


def _load(layer: torch.nn.Module, ckpt: MoeWeights, gated: bool) -> None:
    """Every expert's ``w1`` (gate), ``w3`` (up), ``w2`` weights and block scales of ``ckpt`` (the layer's whole
    checkpoint, FC1 ``[gate; up]``) through ``RoutedExperts.weight_loader``, as fp8 E4M3 / fp32 tensors."""
    fc1 = {
        "w13_weight": split_fc1(ckpt.w13, Fc1Layout.GATE_UP) if gated else (ckpt.w13,),
        "w13_weight_scale_inv": split_fc1(ckpt.w13_scale, Fc1Layout.GATE_UP) if gated else (ckpt.w13_scale,),
    }
    for x in range(ckpt.w13.shape[0]):
        for name, halves in fc1.items():
            for shard, half in zip(("w1", "w3")[: len(halves)], halves, strict=True):
                t = half[x] if name.endswith("inv") else half[x].view(torch.float8_e4m3fn)
                layer.weight_loader(getattr(layer, name), t.contiguous(), f"{PREFIX}.{name}", shard, x)
        layer.weight_loader(layer.w2_weight, ckpt.w2[x].view(torch.float8_e4m3fn), f"{PREFIX}.w2_weight", "w2", x)
        layer.weight_loader(layer.w2_weight_scale_inv, ckpt.w2_scale[x], f"{PREFIX}.w2_weight_scale_inv", "w2", x)


class VllmFp8TensorMoeAlignment:
    """vLLM 0.33.0 runs none of the ``fp8_tensor_moe`` records (:data:`subjects.vllm.bridge.FP8_TENSOR_NOT_MAPPED`):
    every backend is skipped with its reason."""

    def align_moe(self, backend: Fp8TensorMoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        raise LibraryUnavailable(not_mapped(backend))
