"""Zero padding of fused MoE weights: per-half FC1 row padding and trailing-dimension padding.

A fused gated FC1 tensor holds two halves of ``I`` rows each (``[gate; up]`` or ``[up; gate]``);
the kernel splits it at the padded size ``Ip``. Padding must therefore grow each half
separately, ``[a; b] -> [a, 0_(Ip-I); b, 0_(Ip-I)]``, so that row ``j`` of one half still pairs
with row ``j`` of the other (``docs/vllm-logic.md`` §2). Padding the fused block at its end instead
shifts the pairing by ``Ip - I``: that is the Gemma-4 TP=2 silent corruption (vLLM #55649).
"""

from __future__ import annotations

import torch

from reference.errors import require


def pad_dim(x: torch.Tensor, dim: int, size: int, fill: int | float = 0) -> torch.Tensor:
    """Grow ``dim`` of ``x`` to ``size`` by appending ``fill``; returns ``x`` itself if already there."""
    cur = x.shape[dim]
    require(size >= cur, f"pad_dim: cannot pad dim {dim} of size {cur} down to {size}")
    if size == cur:
        return x
    shape = list(x.shape)
    shape[dim] = size - cur
    return torch.cat((x, x.new_full(shape, fill)), dim=dim)


def outside_corner(dst: torch.Tensor, shape: tuple[int, ...]) -> list[torch.Tensor]:
    """The elements of ``dst`` outside its leading ``shape`` corner (what trailing padding added), as disjoint
    views: for each dim ``i`` that ``dst`` extends, the block within the corner along dims ``< i`` and past it
    along dim ``i``. Empty when ``dst`` has ``shape``."""
    return [dst[(*(slice(0, m) for m in shape[:i]), slice(n, None))] for i, n in enumerate(shape) if dst.shape[i] > n]


def pad_fused_rows(x: torch.Tensor, halves: int, padded_half: int, fill: int | float = 0) -> torch.Tensor:
    """Pad each of the ``halves`` (1 or 2) stacked row blocks along dim -2 to ``padded_half`` rows.

    ``x [..., halves·I, C] -> [..., halves·Ip, C]``; block ``h`` keeps its rows at
    ``[h·Ip, h·Ip + I)`` and the rest is ``fill``.
    """
    rows = x.shape[-2]
    require(halves in (1, 2), f"pad_fused_rows: halves must be 1 or 2, got {halves}")
    require(rows % halves == 0, f"pad_fused_rows: {rows} rows do not split into {halves} halves")
    blocks = x.split(rows // halves, dim=-2)
    return torch.cat([pad_dim(b, -2, padded_half, fill) for b in blocks], dim=-2)


def unpad_fused_rows(x: torch.Tensor, halves: int, half: int) -> torch.Tensor:
    """Inverse of :func:`pad_fused_rows`: keep the first ``half`` rows of each padded block."""
    rows = x.shape[-2]
    require(halves in (1, 2), f"unpad_fused_rows: halves must be 1 or 2, got {halves}")
    require(
        rows % halves == 0 and 0 <= half <= rows // halves,
        f"unpad_fused_rows: {rows} rows do not hold {halves} blocks of at least {half} rows",
    )
    blocks = x.split(rows // halves, dim=-2)
    return torch.cat([b[..., :half, :] for b in blocks], dim=-2)
