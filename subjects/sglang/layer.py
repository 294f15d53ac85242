"""A real SGLang ``FusedMoE``: what its constructor needs, set through SGLang's own test hooks
(``get_flags().moe.override(...)``, ``override_platform(...)``, ``get_context().override_server_args()``,
``get_parallel().override(...)``), so the constructor picks the quant method, which rounds and allocates.

Each ``override_server_args()`` builds and resolves a new dummy ``ServerArgs`` (``ServerArgs(model_path="dummy")``
and ``resolve_once()``, then ``set_server_args`` rebuilds the config bags: SGLang 0.5.23
``python/sglang/srt/runtime_context.py``), which costs more than building the layer on CPU. Layers built inside
:func:`shared_server_args` share one, as the layers of an engine process share the one it published at launch.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from dataclasses import dataclass, field
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


@dataclass
class _Published:
    """What a :func:`shared_server_args` scope keeps published: under which backend and platform, and its restore."""

    key: tuple[str, tuple[tuple[str, bool], ...]] | None = None
    restore: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)


_SCOPES: list[_Published] = []


@contextlib.contextmanager
def shared_server_args() -> Iterator[None]:
    """Every layer built inside (:func:`sglang_layer_context`) under one backend and platform sees the same
    published dummy ``ServerArgs``: the first such layer publishes it (``override_server_args()``, resolved under
    that backend and platform) and it stays published until the scope ends or a layer under another backend or
    platform publishes its own; then the context before it is restored, as each layer's own publication restores
    it. For the ranks of one layer (:class:`subjects.moe_sharding.LoaderSharding`): one resolution instead of one
    per rank and load. Inside another scope (the subject's, around a property test's examples): that scope's."""
    if _SCOPES:
        yield
        return
    scope = _Published()
    _SCOPES.append(scope)
    try:
        yield
    finally:
        _SCOPES.pop()
        scope.restore.close()


def _server_args(m: types.SimpleNamespace, runner_backend: str, platform: dict[str, bool]) -> Any:
    """The context that publishes a layer's dummy ``ServerArgs``: outside any :func:`shared_server_args` scope,
    its own (``override_server_args()``); inside one, nothing to enter or restore, the scope's being published
    here unless it already is under the same backend and platform."""
    if not _SCOPES:
        return m.ctx.get_context().override_server_args()
    scope, key = _SCOPES[-1], (runner_backend, tuple(sorted(platform.items())))
    if scope.key != key:
        scope.restore.close()
        scope.restore.enter_context(m.ctx.get_context().override_server_args())
        scope.key = key
    return contextlib.nullcontext()


@contextlib.contextmanager
def sglang_layer_context(
    runner_backend: str, platform: dict[str, bool], tp: int = 1, rank: int = 0, ep: int = 1
) -> Iterator[Any]:
    """What a real ``FusedMoE(...)`` needs to be constructed: the backend and platform (:func:`moe_backend`),
    a published dummy ``ServerArgs`` (``get_context().override_server_args()``, SGLang's test hook; inside
    :func:`shared_server_args`, the scope's) and the MoE parallel layout of rank ``rank`` of a ``tp`` x ``ep``
    grid (:func:`parallel_layout`)."""
    with (
        moe_backend(runner_backend, **platform) as m,
        _server_args(m, runner_backend, platform),
        m.ctx.get_parallel().override(**parallel_layout(tp, rank, ep)),
    ):
        yield m
