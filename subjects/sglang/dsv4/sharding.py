"""``moe_sharding`` for the ``sglang-deepseek-v4`` subject: SGLang 0.5.23's ``FusedMoE.weight_loader`` for every
rank of a DeepSeek-V4 FP4 expert layer (:func:`subjects.sglang.dsv4.mxfp4_moe.load_dsv4_rank`)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from backends.mxfp4_moe import Mxfp4MoeBackend
from contracts.errors import CheckpointNotServed
from contracts.moe import MoeWeights, relayout_moe
from contracts.moe_sharding import ShardRefused
from reference.formats import MXFP4_BLOCK
from subjects.sglang.dsv4.bridge import DSV4_BACKENDS, not_mapped
from subjects.sglang.dsv4.mxfp4_moe import load_dsv4_rank
from subjects.sglang.sharding import SglangLoaderSharding, uneven_split_refused

DSV4_SHARDING_BACKEND = Mxfp4MoeBackend.FLASHINFER_TRTLLM
"""The backend whose ``FusedMoE`` loads shards for ``moe_sharding`` (every DeepSeek-V4 method narrows ``I/tp``
channels per tensor through the same ``FusedMoE._load_w13`` / ``_load_w2``)."""


class SglangDsv4MoeSharding(SglangLoaderSharding):
    """SGLang 0.5.23's ``FusedMoE.weight_loader`` for every rank of a DeepSeek-V4 FP4 expert layer
    (:func:`load_dsv4_rank`) under the kernel backend asked for (``None``: :data:`DSV4_SHARDING_BACKEND`).
    Rank ``(ep_rank, tp_rank)`` is SGLang's rank ``ep_rank·tp + tp_rank`` of ``tp·ep``. ``FusedMoE.__init__``'s
    ``I % tp == 0`` and ``E % ep == 0`` assertions and ``Mxfp4FlashinferCutlassMoEMethod.create_weights``'
    128-alignment ``ValueError`` are reported as :class:`~contracts.moe_sharding.ShardRefused`. Not served
    (:class:`~contracts.errors.CheckpointNotServed`): what no DeepSeek-V4 checkpoint or method has (non-gated or
    NVFP4 experts, expert biases, a backend outside :data:`DSV4_BACKENDS`)."""

    def load_rank(
        self, ckpt: MoeWeights, gated: bool, tp: int, tp_rank: int, *, ep: int, ep_rank: int, backend
    ) -> MoeWeights:
        if not gated or ckpt.block != MXFP4_BLOCK:
            raise CheckpointNotServed("DeepSeek-V4's FP4 experts are gated MXFP4 (32-element groups)")
        backend = DSV4_SHARDING_BACKEND if backend is None else backend
        if backend not in DSV4_BACKENDS:
            raise CheckpointNotServed(not_mapped(backend))
        experts = ckpt.w13.shape[0]
        with uneven_split_refused(ckpt.intermediate_size, tp, experts, ep), cutlass_refusal():
            loaded = load_dsv4_rank(backend, ckpt, tp, ep_rank * tp + tp_rank, ep)
        return relayout_moe(loaded, ckpt.fc1_layout)


CUTLASS_REFUSAL = "Mxfp4FlashinferCutlassMoEMethod requires hidden_size and intermediate_size_per_partition"
"""The start of ``Mxfp4FlashinferCutlassMoEMethod.create_weights``' ``ValueError`` for shards not 128-aligned."""


@contextlib.contextmanager
def cutlass_refusal() -> Iterator[None]:
    """``Mxfp4FlashinferCutlassMoEMethod.create_weights``' refusal, raised inside, as
    :class:`~contracts.moe_sharding.ShardRefused` with SGLang's message (any other ``ValueError`` propagates)."""
    try:
        yield
    except ValueError as exc:
        if CUTLASS_REFUSAL in str(exc):
            raise ShardRefused(str(exc)) from exc
        raise
