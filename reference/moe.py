"""Mixture-of-experts math on dequantized fp32 weights: routing, activations, the MoE layer.

Shapes: ``x [T, H]``; ``w13 [E, F·I, H]`` with ``F = 2`` for gated activations, rows in the
order named by :class:`GateUpOrder`; ``w2 [E, H, I]``; routing ``weights, ids [T, k]``.
Every matmul goes through :func:`reference.linear.exact_matmul`, so zero padding along I or H
leaves the output bit-identical.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from reference.errors import ShapeContractError, require
from reference.linear import exact_matmul


class GateUpOrder(enum.Enum):
    """Which half of the fused FC1 rows the activation is applied to."""

    GATE_UP = "gate_up"  # [gate; up]: vLLM canonical, VLLM_CUTLASS, Marlin, AITER
    UP_GATE = "up_gate"  # [up; gate]: FlashInfer trtllm-gen and cutlass_fused_moe


class ActivationKind(enum.Enum):
    SWIGLU = "swiglu"  # silu(gate) · up
    GEGLU = "geglu"  # gelu_tanh(gate) · up (Gemma-4)
    SWIGLU_OAI = "swiglu_oai"  # gpt-oss: clamped, (up + beta) · gate · sigmoid(alpha · gate)
    RELU2 = "relu2"  # non-gated relu(x)^2 (Nemotron-3-Nano)


@dataclass(frozen=True)
class Activation:
    """An MoE activation; ``alpha``, ``beta`` and ``limit`` are used by SWIGLU_OAI only."""

    kind: ActivationKind
    alpha: float = 1.702
    beta: float = 1.0
    limit: float | None = 7.0

    @property
    def gated(self) -> bool:
        return self.kind is not ActivationKind.RELU2

    def __str__(self) -> str:
        if self.kind is ActivationKind.SWIGLU_OAI:
            return f"swiglu_oai(alpha={self.alpha}, beta={self.beta}, limit={self.limit})"
        return self.kind.value


def split_gate_up(h: torch.Tensor, order: GateUpOrder) -> tuple[torch.Tensor, torch.Tensor]:
    """Split fused FC1 outputs ``[..., 2I]`` into ``(gate, up)`` according to ``order``."""
    require(h.shape[-1] % 2 == 0, f"gated FC1 output width {h.shape[-1]} must be even")
    first, second = h.chunk(2, dim=-1)
    return (first, second) if order is GateUpOrder.GATE_UP else (second, first)


WIDTH_FREE_RUN = 64
"""Elements each transcendental input is repeated to (:func:`width_free`): a multiple of every CPU vector
loop's step (two AVX-512 fp32 vectors are 32)."""


def width_free(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """``fn(x)`` elementwise, each element's bits independent of ``x``'s width.

    ATen's CPU elementwise loops run whole vector steps and a scalar tail, and a transcendental (``exp``
    in ``silu``, ``tanh`` in GELU) may differ in the last bit between the two; so an element's result
    depends on where it sits (a 16-wide gate row runs in the tail, a 128-wide one in the body). Each
    element is repeated :data:`WIDTH_FREE_RUN` times, so every run is whole vector steps.
    """
    wide = x.unsqueeze(-1).expand(*x.shape, WIDTH_FREE_RUN).contiguous()
    return fn(wide)[..., 0].contiguous()


def activate(h: torch.Tensor, act: Activation, order: GateUpOrder) -> torch.Tensor:
    """Apply ``act`` to FC1 outputs ``h [..., F·I]``; returns ``[..., I]`` (fp32).

    Every activation maps a zero gate/up pair to exactly 0, which is what makes zero padding of
    FC1 rows invisible downstream; transcendentals are :func:`width_free`, so padding does not move a
    real channel's bits either.
    """
    if act.kind is ActivationKind.RELU2:
        return torch.relu(h).square()
    gate, up = split_gate_up(h, order)
    if act.kind is ActivationKind.SWIGLU:
        return width_free(torch.nn.functional.silu, gate) * up
    if act.kind is ActivationKind.GEGLU:
        return width_free(lambda g: torch.nn.functional.gelu(g, approximate="tanh"), gate) * up
    if act.kind is ActivationKind.SWIGLU_OAI:
        if act.limit is not None:
            gate = gate.clamp(max=act.limit)
            up = up.clamp(-act.limit, act.limit)
        return (up + act.beta) * (gate * width_free(torch.sigmoid, act.alpha * gate))
    raise ShapeContractError(f"unknown activation {act!r}")


def route(logits: torch.Tensor, top_k: int, renormalize: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax (fp32) over experts, top-k, optional renormalisation to sum 1.

    ``logits [T, E]`` -> ``(weights [T, k] fp32, ids [T, k] int64)``.
    """
    require(logits.dim() == 2, f"route: logits must be [T, E], got {tuple(logits.shape)}")
    require(0 < top_k <= logits.shape[1], f"route: top_k = {top_k} must be in 1..{logits.shape[1]}")
    probs = torch.softmax(logits.float(), dim=-1)
    weights, ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    return weights, ids


def routed_experts(ids: torch.Tensor) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """``(expert, tokens, slots)`` for every expert routed to, in ascending id: the tokens that send
    it work and the top-k slot each sends it from, as (token, slot) pairs in row-major order."""
    for expert in ids.unique().tolist():
        tokens, slots = (ids == expert).nonzero(as_tuple=True)
        yield expert, tokens, slots


def weighted_sum(weights: torch.Tensor, per_slot: torch.Tensor) -> torch.Tensor:
    """``out[t] = Σ_j weights[t, j] · per_slot[t, j]`` (``[T, k]``, ``[T, k, H]`` -> ``[T, H]`` fp32),
    added in slot order ``j = 0..k-1`` from +0.0, so the result is deterministic."""
    out = torch.zeros(per_slot.shape[0], per_slot.shape[2], dtype=torch.float32, device=per_slot.device)
    for j in range(per_slot.shape[1]):
        out += weights[:, j, None] * per_slot[:, j]
    return out


def moe_reference(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: Activation,
    order: GateUpOrder,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
    requantize: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """``out[t] = Σ_j weights[t, j] · (act(x[t] W13[e]^T + b13[e]) W2[e]^T + b2[e])``, ``e = ids[t, j]``.

    ``requantize`` (optional) maps the activated intermediate ``[n, I]`` of one expert's tokens to
    what the kernel feeds its second GEMM (for example an NVFP4 quantize-dequantize), row by row:
    a row's result may not depend on the other rows. Each expert runs once on all its tokens (the
    rows of :func:`exact_matmul` are independent) and top-k slots are accumulated in order
    ``j = 0..k-1`` (:func:`weighted_sum`), so the result is deterministic. Returns fp32 ``[T, H]``.
    """
    require(w13.dim() == 3, f"moe: w13 must be [E, F·I, H], got {tuple(w13.shape)}")
    e, rows, h = w13.shape
    f = 2 if act.gated else 1
    require(x.dim() == 2 and x.shape[1] == h, f"moe: x {tuple(x.shape)} does not match w13 hidden size {h}")
    require(rows % f == 0, f"moe: w13 has {rows} rows, not a multiple of {f} for {act}")
    inter = rows // f
    require(
        tuple(w2.shape) == (e, h, inter),
        f"moe: w2 {tuple(w2.shape)} must be [E, H, I] = [{e}, {h}, {inter}] to match w13 {tuple(w13.shape)}",
    )
    require(weights.shape == ids.shape and ids.shape[0] == x.shape[0], "moe: routing weights/ids must be [T, k]")
    require(bool(((ids >= 0) & (ids < e)).all()), f"moe: expert ids must lie in 0..{e - 1}")
    per_slot = torch.zeros(*ids.shape, h, dtype=torch.float32, device=x.device)
    for expert, tok, slot in routed_experts(ids):
        hid = exact_matmul(x[tok], w13[expert])
        if w13_bias is not None:
            hid = hid + w13_bias[expert]
        a = activate(hid, act, order)
        if requantize is not None:
            a = requantize(a)
        y = exact_matmul(a, w2[expert])
        if w2_bias is not None:
            y = y + w2_bias[expert]
        per_slot[tok, slot] = y
    return weighted_sum(weights, per_slot)


def moe_magnitude(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: Activation,
    order: GateUpOrder,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rounding-error scale of a gated MoE layer: ``M[t] = Σ_j w[t,j] · (|W2[e]| (G ⊙ (U + β)) + |b2[e]|)``,
    ``e = ids[t, j]``.

    ``G = |x| |W_gate[e]|^T + |b_gate[e]|`` and ``U = |x| |W_up[e]|^T + |b_up[e]|`` bound ``|gate|`` and ``|up|``
    channel by channel (``β`` is SwiGLU-OAI's beta, else 0; absent biases are 0). For SwiGLU, GeGLU and SwiGLU-OAI,
    ``|act| <= |gate|·(|up| + β)``, ``|∂act/∂up| <= |gate|`` and ``|∂act/∂gate| <= 1.13·(|up| + β)``,
    so relative perturbations ``ε`` of gate, up and the activation output move ``out[t]`` by at
    most about ``3.2·ε·M[t]``. Same shapes as :func:`moe_reference`; returns fp32 ``[T, H]``.
    """
    if not act.gated:
        raise ValueError(f"moe_magnitude is derived for gated activations only, not {act}")
    beta = act.beta if act.kind is ActivationKind.SWIGLU_OAI else 0.0
    return _output_bound(x, w13, w2, weights, ids, order, w13_bias, w2_bias, lambda expert, tok, g, u: g * (u + beta))


def _output_bound(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    order: GateUpOrder,
    w13_bias: torch.Tensor | None,
    w2_bias: torch.Tensor | None,
    activation_bound: Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """``Σ_j w[t,j] · (|W2[e]| A + |b2[e]|)`` with ``A = activation_bound(e, tokens, G, U)`` for the absolute FC1
    bounds ``G``, ``U`` of :func:`moe_magnitude` (biases included); fp32 ``[T, H]``."""
    per_slot = torch.zeros(*ids.shape, x.shape[1], dtype=torch.float32, device=x.device)
    for expert, tok, slot in routed_experts(ids):
        hid = exact_matmul(x[tok].abs(), w13[expert].abs())
        if w13_bias is not None:
            hid = hid + w13_bias[expert].abs()
        y = exact_matmul(activation_bound(expert, tok, *split_gate_up(hid, order)), w2[expert].abs())
        per_slot[tok, slot] = y if w2_bias is None else y + w2_bias[expert].abs()
    return weighted_sum(weights, per_slot)


def moe_fused_magnitude(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    weights: torch.Tensor,
    ids: torch.Tensor,
    act: Activation,
    order: GateUpOrder,
    w13_bias: torch.Tensor | None = None,
    w2_bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rounding-error scale of a gated MoE layer whose kernel keeps FC1 and the activation in fp32 and rounds the
    activation it stores: ``M[t] = Σ_j w[t,j] · (|W2[e]| A_e + |b2[e]|)``, ``e = ids[t, j]``, with

    ``A = |act(gate, up)| + γ·(1.13·(U + β)·G + G·U)``, ``γ = H·2^-24``,

    ``act`` on the exact FC1 outputs, ``G``, ``U`` the absolute bounds of :func:`moe_magnitude` (biases
    included). ``γ·|x||W|^T`` bounds fp32 accumulation over ``H`` terms, and the activation's slopes
    (:func:`moe_magnitude`) carry it to ``act``; so ``A`` bounds what the stored activation may hold before its
    rounding, and rounding it, each slot's FC2 output and the top-k sum to a format of unit roundoff ``u``
    moves ``out[t]`` by at most about ``3·u·M[t]``. Unlike :func:`moe_magnitude` it follows the real
    activation, not its absolute bound: random weights make ``|x||W|^T`` hundreds of times ``|x W^T|``, so a
    wrong FC2 input would otherwise hide inside the bound. Same shapes as :func:`moe_reference`; fp32 ``[T, H]``.
    """
    if not act.gated:
        raise ValueError(f"moe_fused_magnitude is derived for gated activations only, not {act}")
    beta = act.beta if act.kind is ActivationKind.SWIGLU_OAI else 0.0
    gamma = x.shape[1] * 2.0**-24

    def bound(expert: int, tok: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        hid = exact_matmul(x[tok], w13[expert])
        if w13_bias is not None:
            hid = hid + w13_bias[expert]
        return activate(hid, act, order).abs() + gamma * (1.13 * (u + beta) * g + g * u)

    return _output_bound(x, w13, w2, weights, ids, order, w13_bias, w2_bias, bound)
