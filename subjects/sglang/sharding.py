"""``moe_sharding`` for the ``sglang`` subject: SGLang 0.5.23's own MoE weight loaders, driven on CPU for every rank.

For each rank of a TP degree the adapter constructs that rank's real ``FusedMoE`` (SGLang's own
constructor under its test hooks, :func:`subjects.sglang.layer.sglang_layer_context`) and feeds it the whole
(unsharded) checkpoint through ``FusedMoE.weight_loader``; the buffers after loading are the rank's
shard. The loaders are the contract modules', unchanged:

* NVFP4 (ModelOpt, 16-groups, gate / up / down per expert): :func:`subjects.sglang.nvfp4_moe.load_nvfp4_rank`
  under a ``--moe-runner-backend`` on a B200, by default :data:`NVFP4_BACKEND` (``flashinfer_trtllm``):
  every rank's buffer is ``ru(I/tp, 64)`` channels (gated; 128 non-gated) and rank ``r`` reads from
  ``r·ru(I/tp, 64)``, so the last ranks are short or empty (``reference.sizes.padded_split``). Under
  ``flashinfer_cutlass`` the buffer is ``I/tp`` and every tensor is narrowed by its own size / tp,
  which cuts scale groups where ``(I/tp) % 16 != 0`` (``tests/test_sglang_subject.py`` pins it).

* MXFP4 (32-groups, gated): :func:`subjects.sglang.mxfp4_moe.load_mxfp4_rank` under :data:`MXFP4_BACKEND`
  (``flashinfer_mxfp4`` on a B200): gpt-oss's fused row-interleaved checkpoint through
  ``GptOssForCausalLM._load_mxfp4_experts_weights`` (whole 32-blocks per rank), a stacked ``[gate; up]``
  one per expert and projection as Kimi-K3 and MiniMax-M3 load it. The buffer's hidden padding (the
  ``mxfp4_moe`` contract's) is cut back to the checkpoint's hidden size. SGLang's ``Mxfp4MoEMethod`` has
  no non-gated experts: such a checkpoint raises :class:`~contracts.errors.UnsupportedConfig`.

* Block FP8 (128x128 tiles, gated or not): :func:`subjects.sglang.fp8_moe.load_fp8_rank` under :data:`FP8_BACKEND`
  (``triton``, what ``--moe-runner-backend auto`` resolves to without DeepGEMM or AITER): the buffer is
  ``I/tp`` channels, which ``Fp8MoEMethod.create_weights`` refuses unless a multiple of 128 (reported as
  :class:`~contracts.moe_sharding.ShardRefused`: such an even split would cut a tile). Under
  ``flashinfer_trtllm`` ``FusedMoE.__init__`` rounds every rank's buffer to ``ru(I/tp, 128)`` and rank ``r``
  reads from ``r·ru(I/tp, 128)``, weights and scale tiles alike (whole tiles, the last ranks short or empty).
  Each EP rank's block scales are its own experts' (``FusedMoE.weight_loader`` maps global expert ids to
  local ones for every parameter).

SGLang asserts ``I % tp == 0`` in ``FusedMoE.__init__``; that assertion is reported as
:class:`~contracts.moe_sharding.ShardRefused`. Which channels a rank holds is read back
(:class:`subjects.moe_sharding.LoaderSharding`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace

from backends.fp8_moe import Fp8MoeBackend
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.errors import UnsupportedConfig
from contracts.moe import MoeWeights, cut_hidden, relayout_moe, tiled
from contracts.moe_sharding import ShardRefused
from reference.formats import NVFP4_BLOCK
from reference.layouts import Fc1Layout, relayout_fc1
from subjects.moe_sharding import LoaderSharding
from subjects.sglang.bridge import FP8_BACKENDS, MXFP4_BACKENDS, NVFP4_BACKENDS, not_mapped
from subjects.sglang.fp8_moe import load_fp8_rank
from subjects.sglang.layer import shared_server_args
from subjects.sglang.mxfp4_moe import gpt_oss_family, load_mxfp4_rank, load_quark_mxfp4_rank
from subjects.sglang.nvfp4_moe import load_nvfp4_rank

NVFP4_BACKEND = Nvfp4MoeBackend.FLASHINFER_TRTLLM
"""The runner backend whose ``FusedMoE`` loads NVFP4 shards for the ``sglang`` subject: SGLang's padded
whole-block split."""


MXFP4_BACKEND = Mxfp4MoeBackend.FLASHINFER_TRTLLM
"""The backend whose ``FusedMoE`` of ``Mxfp4MoEMethod`` loads MXFP4 shards for the ``sglang`` subject."""


@contextmanager
def uneven_split_refused(intermediate: int, tp: int, experts: int = 1, ep: int = 1) -> Iterator[None]:
    """SGLang's ``FusedMoE.__init__`` assertions ``I % moe_tp_size == 0`` and ``E % moe_ep_size == 0``, raised
    inside, as :class:`ShardRefused` (any other assertion propagates)."""
    try:
        yield
    except AssertionError as exc:
        if intermediate % tp:
            raise ShardRefused(f"SGLang FusedMoE: intermediate size {intermediate} at TP={tp}") from exc
        if experts % ep:
            raise ShardRefused(f"SGLang FusedMoE: {experts} experts at EP={ep}") from exc
        raise


FP8_BACKEND = Fp8MoeBackend.TRITON
"""The backend whose ``FusedMoE`` of ``Fp8MoEMethod`` loads block-FP8 shards for the ``sglang`` subject: the Triton
runner, ``Fp8MoEMethod.create_moe_runner``'s choice under ``auto`` without DeepGEMM or AITER."""

FP8_SPLIT_REFUSED = "is not divisible by weight quantization block_n"
"""``Fp8MoEMethod.create_weights``' refusal of a rank's ``I/tp`` that is not whole 128-channel tiles."""


class SglangLoaderSharding(LoaderSharding):
    """A policy driven by SGLang's loader: every rank's ``FusedMoE`` of one layer is built under one published
    dummy ``ServerArgs`` (:func:`shared_server_args`)."""

    def loading(self) -> AbstractContextManager[object]:
        return shared_server_args()


class SglangMoeSharding(SglangLoaderSharding):
    """SGLang 0.5.23's ``FusedMoE.weight_loader`` for every rank of a TP x EP grid (module docstring), under
    the drawn kernel backend's runner (None: :data:`NVFP4_BACKEND` / :data:`MXFP4_BACKEND`)."""

    def load_rank(
        self,
        ckpt: MoeWeights,
        gated: bool,
        tp: int,
        tp_rank: int,
        *,
        ep: int,
        ep_rank: int,
        backend: Nvfp4MoeBackend | Mxfp4MoeBackend | Fp8MoeBackend | None,
    ) -> MoeWeights:
        """Rank ``(ep_rank, tp_rank)``: SGLang's rank ``ep_rank·tp + tp_rank`` of ``tp·ep``
        (:func:`subjects.sglang.layer.parallel_layout`)."""
        rank = ep_rank * tp + tp_rank
        if tiled(ckpt.block):
            return self.load_fp8(ckpt, gated, tp, rank, ep, backend or FP8_BACKEND)
        nvfp4 = ckpt.block == NVFP4_BLOCK
        if backend is not None and backend not in (NVFP4_BACKENDS if nvfp4 else MXFP4_BACKENDS):
            raise UnsupportedConfig(not_mapped(backend))
        with uneven_split_refused(ckpt.intermediate_size, tp, ckpt.w13.shape[0], ep):
            if not nvfp4:
                return self.load_mxfp4(ckpt, gated, tp, rank, ep, backend or MXFP4_BACKEND)
            return self.load_nvfp4(ckpt, gated, tp, rank, ep, backend or NVFP4_BACKEND)

    @staticmethod
    def load_fp8(ckpt: MoeWeights, gated: bool, tp: int, rank: int, ep: int, backend: Fp8MoeBackend) -> MoeWeights:
        """``Fp8MoEMethod``'s loader (:func:`~subjects.sglang.fp8_moe.load_fp8_rank`), FC1 rows in the checkpoint's
        layout; ``create_weights``' refusal of ``I/tp`` cutting a tile is :class:`ShardRefused`."""
        if backend not in FP8_BACKENDS:
            raise UnsupportedConfig(not_mapped(backend))
        layout = ckpt.fc1_layout
        stacked = relayout_moe(ckpt, Fc1Layout.GATE_UP) if gated else ckpt
        with uneven_split_refused(ckpt.intermediate_size, tp, ckpt.w13.shape[0], ep):
            try:
                loaded, _ = load_fp8_rank(backend, stacked, gated, tp, rank, ep)
            except ValueError as exc:
                if FP8_SPLIT_REFUSED not in str(exc):
                    raise
                raise ShardRefused(f"SGLang Fp8MoEMethod.create_weights: {exc}") from exc
        return relayout_moe(loaded, layout) if gated else replace(loaded, fc1_layout=layout)

    @staticmethod
    def load_mxfp4(ckpt: MoeWeights, gated: bool, tp: int, rank: int, ep: int, backend: Mxfp4MoeBackend) -> MoeWeights:
        """``Mxfp4MoEMethod``'s loader (:func:`~subjects.sglang.mxfp4_moe.load_mxfp4_rank`), or on a backend that serves
        stacked checkpoints through Quark OCP-MX (AITER), ``QuarkW4A4MXFp4MoE``'s
        (:func:`~subjects.sglang.mxfp4_moe.load_quark_mxfp4_rank`)."""
        if not gated:
            raise UnsupportedConfig("SGLang's MXFP4 MoE methods run gated experts only")
        if ckpt.w13_bias is not None and not ckpt.fc1_layout.interleaved:
            raise UnsupportedConfig("SGLang loads MXFP4 expert biases from gpt-oss's fused row-interleaved form only")
        runner = MXFP4_BACKENDS.get(backend)
        if runner is not None and runner.stacked_via_quark and not gpt_oss_family(ckpt):
            loaded, _ = load_quark_mxfp4_rank(ckpt, tp, rank, ep)
            return cut_hidden(relayout_moe(loaded, ckpt.fc1_layout), ckpt.hidden_size)
        loaded, _ = load_mxfp4_rank(backend, ckpt, tp, rank, ep)
        return cut_hidden(loaded, ckpt.hidden_size)

    @staticmethod
    def load_nvfp4(ckpt: MoeWeights, gated: bool, tp: int, rank: int, ep: int, backend: Nvfp4MoeBackend) -> MoeWeights:
        """``ModelOptNvFp4FusedMoEMethod``'s loader (:func:`~subjects.sglang.nvfp4_moe.load_nvfp4_rank`)."""
        layout = ckpt.fc1_layout
        # load_nvfp4_checkpoint reads FC1 rows as [up; gate] (FlashInfer's order) and keeps that order
        rows = relayout_fc1(ckpt.w13, layout, Fc1Layout.UP_GATE) if gated else ckpt.w13
        scales = relayout_fc1(ckpt.w13_scale, layout, Fc1Layout.UP_GATE) if gated else ckpt.w13_scale
        loaded, _ = load_nvfp4_rank(backend, replace(ckpt, w13=rows, w13_scale=scales), gated, tp, rank, ep)
        if not gated:
            return replace(loaded, fc1_layout=layout)
        return replace(
            loaded,
            w13=relayout_fc1(loaded.w13, Fc1Layout.UP_GATE, layout),
            w13_scale=relayout_fc1(loaded.w13_scale, Fc1Layout.UP_GATE, layout),
            fc1_layout=layout,
        )
