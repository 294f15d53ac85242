"""A real SGLang ``FusedMoE``: what its constructor needs, set through SGLang's own test hooks
(``get_flags().moe.override(...)``, ``override_platform(...)``, ``get_context().override_server_args()``,
``get_parallel().override(...)``), so the constructor picks the quant method, which rounds and allocates."""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

from subjects.sglang.bridge import sglang_modules


@contextlib.contextmanager
def moe_backend(runner_backend: str, **platform: bool) -> Iterator[types.SimpleNamespace]:
    """SGLang's MoE runner backend ``runner_backend`` (a ``MoeRunnerBackend`` value) on a platform with
    the facts ``platform`` (``override_platform``), through SGLang's own test hooks; no a2a backend."""
    m = sglang_modules()
    backend = m.MoeRunnerBackend(runner_backend)
    a2a = m.MoeA2ABackend.NONE
    with m.ctx.get_flags().moe.override(runner_backend=backend, a2a_backend=a2a), m.ctx.override_platform(**platform):
        yield m


def parallel_layout(tp: int, rank: int, ep: int = 1) -> dict[str, int]:
    """SGLang's parallel fields for rank ``rank`` of ``tp·ep`` ranks whose MoE layers are ``tp``-way tensor- and
    ``ep``-way expert-parallel (no DP or CP): attention tensor-parallel over all ranks, and SGLang's numbering
    ``moe_ep_rank = rank // moe_tp_size``, ``moe_tp_rank = rank % moe_tp_size``, as ``_validate_parallel``
    requires (``tp_size == moe_ep_size · moe_dp_size · moe_tp_size``)."""
    world = tp * ep
    return dict(
        tp_size=world, tp_rank=rank, attn_tp_size=world, attn_tp_rank=rank, attn_dp_size=1, attn_dp_rank=0,
        attn_cp_size=1, attn_cp_rank=0, moe_tp_size=tp, moe_tp_rank=rank % tp, moe_ep_size=ep,
        moe_ep_rank=rank // tp, moe_dp_size=1,
    )  # fmt: skip


@contextlib.contextmanager
def sglang_layer_context(
    runner_backend: str, platform: dict[str, bool], tp: int = 1, rank: int = 0, ep: int = 1
) -> Iterator[Any]:
    """What a real ``FusedMoE(...)`` needs to be constructed: the backend and platform (:func:`moe_backend`),
    a published dummy ``ServerArgs`` (``get_context().override_server_args()``, SGLang's test hook) and the
    MoE parallel layout of rank ``rank`` of a ``tp`` x ``ep`` grid (:func:`parallel_layout`)."""
    with moe_backend(runner_backend, **platform) as m:
        context = m.ctx.get_context()
        with (
            context.override_server_args(),
            m.ctx.get_parallel().override(**parallel_layout(tp, rank, ep)),
        ):
            yield m
