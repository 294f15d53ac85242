"""``moe_sharding`` for the ``sglang`` subject: SGLang 0.5.23's own MoE weight loaders, driven on CPU for every rank.

For each rank of a TP degree the adapter constructs that rank's real ``FusedMoE`` (SGLang's own
constructor under its test hooks, :func:`subjects.sglang.sglang_layer_context`) and feeds it the whole
(unsharded) checkpoint through ``FusedMoE.weight_loader``; the buffers after loading are the rank's
shard. The loaders are :mod:`subjects.sglang`'s, unchanged:

* NVFP4 (ModelOpt, 16-groups, gate / up / down per expert): :func:`subjects.sglang.load_nvfp4_rank`
  under a ``--moe-runner-backend`` on a B200, by default :data:`NVFP4_BACKEND` (``flashinfer_trtllm``):
  every rank's buffer is ``ru(I/tp, 64)`` channels (gated; 128 non-gated) and rank ``r`` reads from
  ``r·ru(I/tp, 64)``, so the last ranks are short or empty (``reference.sizes.padded_split``). Under
  ``flashinfer_cutlass`` the buffer is ``I/tp`` and every tensor is narrowed by its own size / tp,
  which cuts scale groups where ``(I/tp) % 16 != 0`` (``tests/test_sglang_subject.py`` pins it).

* MXFP4 (32-groups, gated): :func:`subjects.sglang.load_mxfp4_rank` under :data:`MXFP4_BACKEND`
  (``flashinfer_mxfp4`` on a B200): gpt-oss's fused row-interleaved checkpoint through
  ``GptOssForCausalLM._load_mxfp4_experts_weights`` (whole 32-blocks per rank), a stacked ``[gate; up]``
  one per expert and projection as Kimi-K3 and MiniMax-M3 load it. The buffer's hidden padding (the
  ``mxfp4_moe`` contract's) is cut back to the checkpoint's hidden size. SGLang's ``Mxfp4MoEMethod`` has
  no non-gated experts: such a checkpoint raises :class:`~contracts.errors.UnsupportedConfig`.

SGLang asserts ``I % tp == 0`` in ``FusedMoE.__init__``; that assertion is reported as
:class:`~contracts.moe_sharding.ShardRefused`. Which channels a rank holds is read back
(:class:`subjects.moe_sharding.LoaderSharding`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.errors import UnsupportedConfig
from contracts.moe import MoeWeights
from contracts.moe_sharding import ShardRefused
from reference.formats import NVFP4_BLOCK
from reference.layouts import Fc1Layout, relayout_fc1
from subjects.moe_sharding import LoaderSharding

NVFP4_BACKEND = Nvfp4MoeBackend.FLASHINFER_TRTLLM
"""The runner backend whose ``FusedMoE`` loads NVFP4 shards for the ``sglang`` subject: SGLang's padded
whole-block split."""


MXFP4_BACKEND = Mxfp4MoeBackend.FLASHINFER_TRTLLM
"""The backend whose ``FusedMoE`` of ``Mxfp4MoEMethod`` loads MXFP4 shards for the ``sglang`` subject."""


def hidden_cut(w: MoeWeights, hidden: int) -> MoeWeights:
    """``w`` with its hidden dimension cut back to ``hidden`` (FC1 columns, FC2 rows, ``w2_bias``)."""
    g = w.block
    return replace(
        w, w13=w.w13[..., : hidden // 2], w13_scale=w.w13_scale[..., : hidden // g], w2=w.w2[:, :hidden],
        w2_scale=w.w2_scale[:, :hidden], w2_bias=None if w.w2_bias is None else w.w2_bias[:, :hidden],
    )  # fmt: skip


@contextmanager
def uneven_split_refused(intermediate: int, tp: int) -> Iterator[None]:
    """SGLang's ``FusedMoE.__init__`` assertion ``I % tp == 0``, raised inside, as :class:`ShardRefused`
    (any other assertion propagates)."""
    try:
        yield
    except AssertionError as exc:
        if intermediate % tp:
            raise ShardRefused(f"SGLang FusedMoE: intermediate size {intermediate} at TP={tp}") from exc
        raise


class SglangMoeSharding(LoaderSharding):
    """SGLang 0.5.23's ``FusedMoE.weight_loader`` for every rank (module docstring): NVFP4 under ``backend``,
    MXFP4 under ``mxfp4_backend``."""

    def __init__(
        self, backend: Nvfp4MoeBackend = NVFP4_BACKEND, mxfp4_backend: Mxfp4MoeBackend = MXFP4_BACKEND
    ) -> None:
        self.backend, self.mxfp4_backend = backend, mxfp4_backend

    def load_rank(
        self, ckpt: MoeWeights, gated: bool, tp: int, rank: int, *, ep: int, ep_rank: int, backend
    ) -> MoeWeights:
        """Plain TP groups only (``ep > 1`` is not driven: :class:`~contracts.errors.UnsupportedConfig`);
        ``backend`` is not read: the subject's own ``backend`` / ``mxfp4_backend`` load every shard."""
        if ep != 1:
            raise UnsupportedConfig(f"the SGLang sharding adapter drives plain TP groups only, not EP={ep}")
        if ckpt.block != NVFP4_BLOCK:
            return self.load_mxfp4(ckpt, gated, tp, rank)
        return self.load_nvfp4(ckpt, gated, tp, rank)

    def load_mxfp4(self, ckpt: MoeWeights, gated: bool, tp: int, rank: int) -> MoeWeights:
        from subjects.sglang import load_mxfp4_rank

        if not gated:
            raise UnsupportedConfig("SGLang's Mxfp4MoEMethod runs gated experts only")
        if ckpt.w13_bias is not None and not ckpt.fc1_layout.interleaved:
            raise UnsupportedConfig("SGLang loads MXFP4 expert biases from gpt-oss's fused row-interleaved form only")
        with uneven_split_refused(ckpt.intermediate_size, tp):
            loaded, _ = load_mxfp4_rank(self.mxfp4_backend, ckpt, tp, rank)
        return hidden_cut(loaded, ckpt.hidden_size)

    def load_nvfp4(self, ckpt: MoeWeights, gated: bool, tp: int, rank: int) -> MoeWeights:
        from subjects.sglang import load_nvfp4_rank

        layout = ckpt.fc1_layout
        # load_nvfp4_checkpoint reads FC1 rows as [up; gate] (FlashInfer's order) and keeps that order
        rows = relayout_fc1(ckpt.w13, layout, Fc1Layout.UP_GATE) if gated else ckpt.w13
        scales = relayout_fc1(ckpt.w13_scale, layout, Fc1Layout.UP_GATE) if gated else ckpt.w13_scale
        with uneven_split_refused(ckpt.intermediate_size, tp):
            loaded, _ = load_nvfp4_rank(self.backend, replace(ckpt, w13=rows, w13_scale=scales), gated, tp, rank)
        if not gated:
            return replace(loaded, fc1_layout=layout)
        return replace(
            loaded,
            w13=relayout_fc1(loaded.w13, Fc1Layout.UP_GATE, layout),
            w13_scale=relayout_fc1(loaded.w13_scale, Fc1Layout.UP_GATE, layout),
            fc1_layout=layout,
        )
