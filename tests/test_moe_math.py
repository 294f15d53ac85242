"""Self-tests of ``reference/linear.py`` and ``reference/moe.py``.

Cross-checks and their source of truth:

* ``exact_matmul``: torch's float64 matmul (error bound of a K-term fp64 sum plus one fp32
  rounding), and bit-identity (value and sign of zero) under zero padding of K in both operands;
  bit-identity with the order-fixed loop (``sequential_matmul``), which the GEMM and the reversed
  loop also reach wherever ``order_free`` holds; ``lsb_exponent`` against Python's exact floats.
* ``mxfp4_linear``: ``exact_matmul`` of the operands dequantized by ``reference.formats``.
* Activations: every activation maps a zero gate/up pair to exactly 0 (the property that makes
  zero padding of FC1 rows invisible), pair by pair, in both gate/up orders; the formulas
  written out here (silu, gelu-tanh, gpt-oss clamped SwiGLU, relu²) in float64.
* ``route``: softmax + top-k by hand; renormalised weights sum to 1.
* ``moe_reference``: a dense einsum MoE written here in float64 (every token through every
  expert, then the routing weights gather), with biases and the ``requantize`` hook.
* Every shape error is a :class:`ShapeContractError`.

Hypothesis draws sizes, flags and a seed; tensors are built from the seed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pytest
import torch
from hypothesis import event, given, note
from hypothesis import strategies as st

from reference.errors import ShapeContractError
from reference.formats import MxScaleRounding, mxfp4_dequantize, mxfp4_quantize
from reference.linear import exact_matmul, lsb_exponent, mxfp4_linear, order_free, sequential_matmul
from reference.moe import (
    Activation,
    ActivationKind,
    GateUpOrder,
    activate,
    moe_fused_magnitude,
    moe_magnitude,
    moe_reference,
    route,
    split_gate_up,
)

ACTIVATIONS = (
    Activation(ActivationKind.SWIGLU),
    Activation(ActivationKind.GEGLU),
    Activation(ActivationKind.SWIGLU_OAI, alpha=1.702, beta=1.0, limit=7.0),
    Activation(ActivationKind.SWIGLU_OAI, alpha=1.0, beta=0.5, limit=None),
    Activation(ActivationKind.RELU2),
)
ACTIVATION = st.sampled_from(ACTIVATIONS)
ORDER = st.sampled_from(GateUpOrder)
SEED = st.integers(0, 2**16)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def with_zeros(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """``x`` with about a quarter of its entries replaced by +0.0 or -0.0 (FP4 weights have both)."""
    mask = torch.rand(x.shape, generator=g) < 0.25
    zero = torch.where(torch.rand(x.shape, generator=g) < 0.5, 0.0, -0.0)
    return torch.where(mask, zero, x)


# --- exact_matmul ----------------------------------------------------------------------------------


@given(t=st.integers(1, 5), n=st.integers(1, 5), k=st.integers(1, 300), pad=st.integers(1, 64), seed=SEED)
def test_exact_matmul(t: int, n: int, k: int, pad: int, seed: int) -> None:
    """``|C - C64| <= ulp32(C64)/2·(1+2^-20) + 2K·2^-53·Σ|a||b|``, and zero K-padding changes no bit."""
    g = gen(seed)
    a = with_zeros(torch.randn(t, k, generator=g) * 2.0 ** torch.randint(-8, 9, (t, 1), generator=g), g)
    b = with_zeros(torch.randn(n, k, generator=g), g)
    got = exact_matmul(a, b)
    assert got.dtype == torch.float32 and got.shape == (t, n)
    ref = a.double() @ b.double().T
    magnitude = a.double().abs() @ b.double().abs().T
    ulp = torch.nextafter(ref.float().abs(), torch.tensor(math.inf)).double() - ref.float().abs().double()
    bound = ulp / 2 * (1 + 2.0**-20) + 2 * k * 2.0**-53 * magnitude
    err = (got.double() - ref).abs()
    assert bool((err <= bound).all()), f"exact_matmul off by {(err - bound).max().item():.3g} beyond the bound"
    padded = exact_matmul(torch.cat((a, a.new_zeros(t, pad)), 1), torch.cat((b, b.new_zeros(n, pad)), 1))
    assert torch.equal(padded.view(torch.int32), got.view(torch.int32)), "zero padding of K changed bits"


def sequential_sum(x: torch.Tensor, y: torch.Tensor) -> float:
    """``Σ x_i·y_i`` in fp64, strictly left to right (``sum()`` is compensated from Python 3.12 on)."""
    acc = 0.0
    for xi, yi in zip(x.tolist(), y.tolist(), strict=True):
        acc += xi * yi
    return acc


@given(t=st.integers(1, 3), n=st.integers(1, 3), k=st.integers(2, 48), pad=st.integers(1, 40), seed=SEED)
def test_exact_matmul_sums_left_to_right(t: int, n: int, k: int, pad: int, seed: int) -> None:
    """Bit-equal to a sequential fp64 sum over K (fp32 products are exact in fp64), also after
    zero K-padding; the data hold large cancelling product pairs, where any other order or a
    blocked (BLAS) sum shows up in the fp32 result."""
    g = gen(seed)
    a = torch.randn(t, k, generator=g) * 2.0 ** torch.randint(-30, 31, (1, k), generator=g)
    b = torch.randn(n, k, generator=g)
    i = torch.randint(0, k - 1, (1,), generator=g).item()
    a[:, i + 1], b[:, i + 1] = a[:, i], -b[:, i]  # products p and -p next to each other
    a[:, i] *= 2.0**40
    a[:, i + 1] *= 2.0**40
    want = torch.tensor([[sequential_sum(a[r], b[c]) for c in range(n)] for r in range(t)]).float()
    got = exact_matmul(a, b)
    assert torch.equal(got.view(torch.int32), want.view(torch.int32)), "not a left-to-right fp64 sum"
    padded = exact_matmul(torch.cat((a, a.new_zeros(t, pad)), 1), torch.cat((b, b.new_zeros(n, pad)), 1))
    assert torch.equal(padded.view(torch.int32), got.view(torch.int32)), "zero padding of K changed bits"


def lsb_by_hand(v: float) -> int:
    """Exponent of the lowest set bit of a non-zero float: ``v = odd · 2^e``."""
    num, den = abs(v).as_integer_ratio()  # den is a power of two
    e = -(den.bit_length() - 1)
    while num % 2 == 0:
        num, e = num // 2, e + 1
    return e


@given(seed=SEED, spread=st.integers(0, 120))
def test_lsb_exponent_matches_python(seed: int, spread: int) -> None:
    """Row minimum of the lowest-set-bit exponent, zeros left out, subnormals and signs included."""
    g = gen(seed)
    x = torch.randn(6, 64, generator=g) * 2.0 ** torch.randint(-spread, spread + 1, (6, 64), generator=g).float()
    x = with_zeros(x, g)
    x[0, :3] = torch.tensor([2.0**-149, -3 * 2.0**-140, 0.75])  # subnormals and a two-bit value
    x[1] = 0.0
    x[2] = mxfp4_dequantize(mxfp4_quantize(x[2:3]))[0]
    want = [min((lsb_by_hand(v) for v in row if v != 0), default=None) for row in x.tolist()]
    got = lsb_exponent(x).tolist()
    for r, (w, v) in enumerate(zip(want, got, strict=True)):
        assert (v > 2**30) if w is None else (v == w), f"row {r}: lsb_exponent {v}, by hand {w}"


@given(
    t=st.integers(1, 6),
    n=st.integers(1, 24),
    blocks=st.integers(1, 24),
    spread=st.integers(0, 24),
    zeros=st.booleans(),
    seed=SEED,
)
def test_order_free_sums_equal_the_left_to_right_loop(
    t: int, n: int, blocks: int, spread: int, zeros: bool, seed: int
) -> None:
    """``exact_matmul`` equals the order-fixed loop bit for bit, on fp32 activations (their
    exponents spread over ``2·spread`` binades) times dequantized MXFP4 weights. Where
    :func:`order_free` holds, the fp64 GEMM and the loop over K reversed give the loop's sums too
    (any order is exact), which is the proof's claim; wide spreads exercise the loop fallback."""
    g = gen(seed)
    k = 32 * blocks
    x = torch.randn(t, k, generator=g) * 2.0 ** torch.randint(-spread, spread + 1, (t, k), generator=g).float()
    w = mxfp4_dequantize(mxfp4_quantize(torch.randn(n, k, generator=g)))
    if zeros:
        x, w = with_zeros(x, g), with_zeros(w, g)
    loop = sequential_matmul(x, w)
    got = exact_matmul(x, w)
    assert torch.equal(got.view(torch.int32), loop.float().view(torch.int32)), "exact_matmul differs from the loop"
    proven = order_free(x, w)
    event(f"order_free: {proven}")
    if proven:
        gemm = x.double() @ w.double().T + 0.0
        reversed_loop = sequential_matmul(x.flip(1), w.flip(1))
        assert torch.equal(gemm.view(torch.int64), loop.view(torch.int64)), "a proven sum rounded in the GEMM"
        assert torch.equal(reversed_loop.view(torch.int64), loop.view(torch.int64)), "a proven sum depends on order"


def plain_loop(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``acc = acc + a[:, k]·b[:, k]`` in fp64 from +0.0 for every ``k``: the definition, no shortcut."""
    acc = torch.zeros(a.shape[0], b.shape[0], dtype=torch.float64)
    for k in range(a.shape[1]):
        acc = acc + a[:, k, None].double() * b[None, :, k].double()
    return acc


@given(t=st.integers(1, 4), n=st.integers(1, 6), k=st.integers(1, 40), spread=st.integers(0, 60), seed=SEED)
def test_sequential_matmul_shortcuts_keep_the_plain_loops_bits(t: int, n: int, k: int, spread: int, seed: int) -> None:
    """Skipping K indices whose products are all ±0 and the fused multiply-add give the plain loop's fp64 bits
    (signed zeros, cancellation, an Inf meeting a zero column included); ``exact_matmul``, which runs the loop
    only on the rows and columns of the sums its proof does not cover, gives the plain loop's fp32 bits."""
    g = gen(seed)
    a = torch.randn(t, k, generator=g) * 2.0 ** torch.randint(-spread, spread + 1, (t, k), generator=g).float()
    b = mxfp4_dequantize(mxfp4_quantize(torch.randn(n, k + (-k % 32), generator=g)))[:, :k]
    a, b = with_zeros(a, g), with_zeros(b, g)
    a[:, torch.rand(k, generator=g) < 0.3] = -0.0
    b[:, torch.rand(k, generator=g) < 0.3] = 0.0
    if k > 1:
        a[:, 1], b[:, 1] = a[:, 0], -b[:, 0]  # products p and -p: the sum returns to +0.0
    if seed % 5 == 0:
        b[0, 0] = math.inf  # meets a zero or a value in a[:, 0]: NaN or Inf, never skipped
    want = plain_loop(a, b)
    assert torch.equal(sequential_matmul(a, b).view(torch.int64), want.view(torch.int64))
    assert torch.equal(sequential_matmul(a.double(), b.double()).view(torch.int64), want.view(torch.int64))
    assert torch.equal(exact_matmul(a, b).view(torch.int32), want.float().view(torch.int32))


def test_order_free_covers_fp4_weights_and_rejects_cancellation() -> None:
    """Typical suite data (fp32 activations, MXFP4 weights) take the GEMM; a sum whose terms span
    more than 53 binades with cancellation does not, and ``exact_matmul`` gives the loop's bits."""
    g = gen(0)
    x, w = torch.randn(4, 2048, generator=g), mxfp4_dequantize(mxfp4_quantize(torch.randn(64, 2048, generator=g)))
    assert order_free(x, w)
    a, b = torch.tensor([[2.0**60, 1.0, -(2.0**60)]]), torch.ones(1, 3)
    assert not order_free(a, b)
    assert exact_matmul(a, b).item() == 0.0 == sequential_matmul(a, b).item()  # 2^60 + 1 rounds to 2^60
    assert not order_free(torch.tensor([[1.0, float("inf")]]), torch.ones(1, 2))
    assert not order_free(torch.ones(1, 2, dtype=torch.float64), torch.ones(1, 2))


def test_exact_matmul_empty_and_errors() -> None:
    assert torch.equal(exact_matmul(torch.ones(2, 0), torch.ones(3, 0)), torch.zeros(2, 3))
    with pytest.raises(ShapeContractError, match="reduction sizes differ"):
        exact_matmul(torch.ones(2, 4), torch.ones(3, 5))
    with pytest.raises(ShapeContractError, match="2-D"):
        exact_matmul(torch.ones(4), torch.ones(3, 4))


@given(
    t=st.integers(1, 4), n=st.integers(1, 4), blocks=st.integers(1, 3), mode=st.sampled_from(MxScaleRounding), seed=SEED
)
def test_mxfp4_linear_is_matmul_of_dequantized_operands(
    t: int, n: int, blocks: int, mode: MxScaleRounding, seed: int
) -> None:
    g = gen(seed)
    x, w = torch.randn(t, 32 * blocks, generator=g), mxfp4_quantize(torch.randn(n, 32 * blocks, generator=g))
    want = exact_matmul(mxfp4_dequantize(mxfp4_quantize(x, mode)), mxfp4_dequantize(w))
    assert torch.equal(mxfp4_linear(x, w, mode), want)
    with pytest.raises(ShapeContractError, match="activations K"):
        mxfp4_linear(torch.randn(t, 32 * blocks + 32), w, mode)


# --- activations -----------------------------------------------------------------------------------


def activation_f64(gate: torch.Tensor, up: torch.Tensor, act: Activation) -> torch.Tensor:
    """The activation formulas written out in float64 (``up`` unused by RELU2, which gets the rows)."""
    gate, up = gate.double(), up.double()
    if act.kind is ActivationKind.SWIGLU:
        return gate / (1 + torch.exp(-gate)) * up
    if act.kind is ActivationKind.GEGLU:
        inner = math.sqrt(2 / math.pi) * (gate + 0.044715 * gate**3)
        return 0.5 * gate * (1 + torch.tanh(inner)) * up
    if act.kind is ActivationKind.SWIGLU_OAI:
        if act.limit is not None:
            gate, up = gate.clamp(max=act.limit), up.clamp(-act.limit, act.limit)
        return (up + act.beta) * gate / (1 + torch.exp(-act.alpha * gate))
    return gate.clamp(min=0) ** 2


def fc1_halves(h: torch.Tensor, act: Activation, order: GateUpOrder) -> tuple[torch.Tensor, torch.Tensor]:
    """(gate, up) of fused FC1 outputs by hand; RELU2 is non-gated (the rows themselves)."""
    if not act.gated:
        return h, h
    first, second = h[..., : h.shape[-1] // 2], h[..., h.shape[-1] // 2 :]
    return (first, second) if order is GateUpOrder.GATE_UP else (second, first)


@given(act=ACTIVATION, order=ORDER, tokens=st.integers(1, 4), inter=st.integers(1, 24), seed=SEED)
def test_activation_zero_pairs_give_exact_zero(
    act: Activation, order: GateUpOrder, tokens: int, inter: int, seed: int
) -> None:
    """Channels whose gate and up are both ±0 come out exactly 0; the others match the formula."""
    g = gen(seed)
    f = 2 if act.gated else 1
    h = torch.randn(tokens, f * inter, generator=g) * 4
    zero_channel = torch.rand(inter, generator=g) < 0.4
    zero_rows = zero_channel.repeat(f)
    h[:, zero_rows] = torch.where(torch.rand(tokens, int(zero_rows.sum()), generator=g) < 0.5, 0.0, -0.0)
    out = activate(h, act, order)
    assert out.shape == (tokens, inter)
    assert bool((out[:, zero_channel] == 0).all()), f"{act}: a zero gate/up pair did not give 0"
    want = activation_f64(*fc1_halves(h, act, order), act)
    assert torch.allclose(out.double(), want, rtol=1e-5, atol=1e-6), f"{act} ({order.name}) differs from its formula"


@given(act=ACTIVATION, tokens=st.integers(1, 4), inter=st.integers(1, 80), pad=st.integers(1, 160), seed=SEED)
def test_activation_of_a_channel_does_not_depend_on_the_width(
    act: Activation, tokens: int, inter: int, pad: int, seed: int
) -> None:
    """A real channel's activation has the same bits whether its row is ``inter`` or ``inter + pad`` wide
    (zero-padded per half): ATen's scalar tail and vector body would differ in the last bit of ``exp``."""
    f = 2 if act.gated else 1
    h = torch.randn(tokens, f, inter, generator=gen(seed)) * 4
    wide = torch.cat((h, torch.zeros(tokens, f, pad)), dim=-1)
    narrow_out = activate(h.flatten(1), act, GateUpOrder.GATE_UP)
    wide_out = activate(wide.flatten(1), act, GateUpOrder.GATE_UP)
    assert torch.equal(wide_out[:, :inter], narrow_out), f"{act}: padding the row changed a real channel's bits"


def test_split_gate_up_orders_and_odd_width() -> None:
    h = torch.arange(8.0).reshape(1, 8)
    gate, up = split_gate_up(h, GateUpOrder.GATE_UP)
    assert gate.tolist() == [[0, 1, 2, 3]] and up.tolist() == [[4, 5, 6, 7]]
    gate, up = split_gate_up(h, GateUpOrder.UP_GATE)
    assert gate.tolist() == [[4, 5, 6, 7]] and up.tolist() == [[0, 1, 2, 3]]
    with pytest.raises(ShapeContractError, match="even"):
        activate(torch.ones(2, 5), ACTIVATIONS[0], GateUpOrder.GATE_UP)


# --- routing -----------------------------------------------------------------------------------------


@given(tokens=st.integers(1, 6), experts=st.integers(1, 16), data=st.data(), seed=SEED)
def test_route(tokens: int, experts: int, data: st.DataObject, seed: int) -> None:
    top_k = data.draw(st.integers(1, experts), label="top_k")
    logits = torch.randn(tokens, experts, generator=gen(seed)) * 3
    weights, ids = route(logits, top_k)
    plain, plain_ids = route(logits, top_k, renormalize=False)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64 and ids.shape == (tokens, top_k)
    assert torch.equal(ids, plain_ids)
    probs = torch.exp(logits.double() - logits.double().max(-1, keepdim=True).values)
    probs = probs / probs.sum(-1, keepdim=True)
    assert torch.allclose(plain.double(), probs.gather(1, ids), rtol=1e-6, atol=1e-7), "not the softmax at ids"
    assert bool((plain[:, :-1] >= plain[:, 1:]).all()), "weights not in descending order"
    kth = probs.gather(1, ids[:, -1:])
    others = probs.scatter(1, ids, -1.0)
    assert bool((others <= kth + 1e-7).all()), "an unselected expert has a larger probability"
    assert torch.allclose(weights.double().sum(-1), torch.ones(tokens, dtype=torch.float64), atol=4e-7)
    assert torch.allclose(weights.double(), plain.double() / plain.double().sum(-1, keepdim=True), rtol=1e-6)


def test_route_errors() -> None:
    with pytest.raises(ShapeContractError, match="top_k"):
        route(torch.randn(2, 4), 5)
    with pytest.raises(ShapeContractError, match="top_k"):
        route(torch.randn(2, 4), 0)
    with pytest.raises(ShapeContractError, match=r"\[T, E\]"):
        route(torch.randn(4), 1)


# --- moe_reference vs a dense einsum ------------------------------------------------------------------


@dataclass(frozen=True)
class MoeCase:
    experts: int
    tokens: int
    hidden: int
    inter: int
    top_k: int
    act: Activation
    order: GateUpOrder
    bias: bool
    seed: int


@st.composite
def moe_cases(draw: st.DrawFn) -> MoeCase:
    experts = draw(st.integers(1, 5))
    return MoeCase(
        experts,
        draw(st.integers(1, 6)),
        draw(st.integers(1, 24)),
        draw(st.integers(1, 16)),
        draw(st.integers(1, experts)),
        draw(ACTIVATION),
        draw(ORDER),
        draw(st.booleans()),
        draw(SEED),
    )


def dense_moe(x, w13, w2, weights, ids, act, order, b13=None, b2=None) -> torch.Tensor:
    """Every token through every expert in float64 (einsum), then gather the routed experts."""
    h = torch.einsum("th,eih->tei", x.double(), w13.double())
    if b13 is not None:
        h = h + b13.double()
    y = torch.einsum("tei,ehi->teh", activation_f64(*fc1_halves(h, act, order), act), w2.double())
    if b2 is not None:
        y = y + b2.double()
    picked = y.gather(1, ids[..., None].expand(-1, -1, y.shape[-1]))  # [T, k, H]
    return (weights.double()[..., None] * picked).sum(1)


@given(case=moe_cases())
def test_moe_reference_matches_dense_einsum(case: MoeCase) -> None:
    """Tolerance: the reference rounds FC1 outputs, activations and FC2 outputs to fp32 (2^-24
    relative each, amplified by at most ~2 through the activation); 1e-5 of the output scale."""
    g = gen(case.seed)
    e, t, h, i = case.experts, case.tokens, case.hidden, case.inter
    f = 2 if case.act.gated else 1
    x = torch.randn(t, h, generator=g)
    w13 = torch.randn(e, f * i, h, generator=g) / math.sqrt(h)
    w2 = torch.randn(e, h, i, generator=g) / math.sqrt(i)
    b13 = torch.randn(e, f * i, generator=g) if case.bias else None
    b2 = torch.randn(e, h, generator=g) if case.bias else None
    weights, ids = route(torch.randn(t, e, generator=g), case.top_k)
    got = moe_reference(x, w13, w2, weights, ids, case.act, case.order, b13, b2)
    want = dense_moe(x, w13, w2, weights, ids, case.act, case.order, b13, b2)
    scale = 1 + want.abs().max().item()
    note(f"{case}: max |diff| {(got.double() - want).abs().max().item():.3g}, scale {scale:.3g}")
    assert got.dtype == torch.float32 and got.shape == (t, h)
    assert torch.allclose(got.double(), want, rtol=0, atol=1e-5 * scale), (
        f"moe_reference differs from the dense einsum ({case})"
    )
    silenced = moe_reference(x, w13, w2, weights, ids, case.act, case.order, b13, b2, requantize=torch.zeros_like)
    want_bias_only = (weights.double()[..., None] * b2.double()[ids]).sum(1) if b2 is not None else torch.zeros(t, h)
    assert torch.allclose(silenced.double(), want_bias_only.double(), atol=1e-6), "requantize is not applied before FC2"


def test_moe_reference_shape_errors() -> None:
    act, order = ACTIVATIONS[0], GateUpOrder.GATE_UP
    x, w13, w2 = torch.ones(2, 8), torch.ones(3, 8, 8), torch.ones(3, 8, 4)
    weights, ids = torch.ones(2, 1), torch.zeros(2, 1, dtype=torch.int64)
    bad = {
        "x hidden": lambda: moe_reference(torch.ones(2, 6), w13, w2, weights, ids, act, order),
        "odd gated rows": lambda: moe_reference(x, torch.ones(3, 7, 8), w2, weights, ids, act, order),
        "w2 shape": lambda: moe_reference(x, w13, torch.ones(3, 8, 5), weights, ids, act, order),
        "ids out of range": lambda: moe_reference(x, w13, w2, weights, ids + 3, act, order),
        "weights/ids shape": lambda: moe_reference(x, w13, w2, torch.ones(2, 2), ids, act, order),
        "w13 not 3-D": lambda: moe_reference(x, torch.ones(8, 8), w2, weights, ids, act, order),
    }
    for name, call in bad.items():
        with pytest.raises(ShapeContractError) as info:
            call()
        assert str(info.value), name


@given(seed=st.integers(0, 2**16), tokens=st.integers(1, 4), experts=st.integers(1, 3))
def test_fused_magnitude_bounds_output_and_perturbed_activations(seed: int, tokens: int, experts: int) -> None:
    """``moe_fused_magnitude`` bounds ``|out|`` and the effect of rounding the activation to bf16 (the kernel's
    first rounding), and is tighter than the absolute bound ``moe_magnitude`` on random weights."""
    g = torch.Generator().manual_seed(seed)
    h, i = 64, 32
    act = Activation(ActivationKind.SWIGLU_OAI)
    x = torch.randn(tokens, h, generator=g)
    w13, w2 = torch.randn(experts, 2 * i, h, generator=g) / 8, torch.randn(experts, h, i, generator=g) / 8
    b13, b2 = torch.randn(experts, 2 * i, generator=g), torch.randn(experts, h, generator=g)
    weights, ids = route(torch.randn(tokens, experts, generator=g), min(2, experts))
    args = (x, w13, w2, weights, ids, act, GateUpOrder.GATE_UP)
    out = moe_reference(*args, b13, b2)
    fused = moe_fused_magnitude(*args, b13, b2)
    assert bool((out.abs() <= fused * (1 + 1e-6)).all())
    assert bool((fused <= moe_magnitude(*args, b13, b2) * (1 + 1e-6)).all())
    rounded = moe_reference(*args, b13, b2, requantize=lambda a: a.to(torch.bfloat16).float())
    assert bool(((rounded - out).abs() <= 2.0**-8 * fused * (1 + 1e-6)).all())
