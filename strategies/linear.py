"""Hypothesis strategies for MXFP4 dense linear layers of one tensor-parallel rank (AITER linear path).

An MXFP4 linear layer holds packed weights ``[N, K/2]`` and UE8M0 scales ``[N, K/32]``; the AITER
ASM guard looks only at the scale shape (``rows % 32``, ``cols % 8``, i.e. ``N % 32`` and
``K % 256``). Shapes come from the layers of catalogued models at every TP degree and sharding
vLLM applies (column-parallel shards N, row-parallel shards K, replicated keeps both), or are
adversarial rank-local sizes.

Every config keeps the **real** rank-local scale shape: the guard and the weight processing always
get the real layer (a guard may route on any size it sees, ``contracts.mxfp4_linear``). The reduced
sizes ``n, k`` serve only the numerical checks of each path's layout, and keep what the guards look
at: N keeps its residue mod 32, whether it is 96 (the row count vLLM forces to Triton) and whether it
exceeds 128 (SGLang keeps ``N <= 128`` off the ASM GEMM); K keeps its residue mod 256 (see
:func:`reduce_rows`, :func:`strategies.moe.reduce_size`). Token counts include 1-4 and
non-multiples of 32.

Layer sizes: shared experts and the dense projections come from the model catalogue
(``strategies.catalog``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from hypothesis import strategies as st

from reference.formats import MXFP4_BLOCK
from strategies.boundaries import GUARD_SIDES, RULE_MODULI, SPECIAL_SIZES, boundary_sizes, moduli_for
from strategies.catalog import MODELS, TP_DEGREES, Parallel
from strategies.config import Config
from strategies.moe import reduce_size
from strategies.pins import current_pin

REDUCE_ROWS_ABOVE = 160
REDUCE_ROWS_STEP = 32
SCALE_BYTES = (118, 136)
"""UE8M0 weight-scale bytes drawn in ``[118, 136)``: 2^-9 .. 2^8, finite, never 0 or 0xFF."""


@dataclass(frozen=True)
class LinearLayer:
    """A dense MXFP4 linear layer of a model: global sizes, its TP sharding and the largest usable TP."""

    model: str
    name: str
    in_features: int
    out_features: int
    parallel: Parallel
    replicable: bool = False  # may be built with disable_tp (a replicated shared expert)
    max_tp: int = 16  # heads / kv-heads divisibility limit


def _shared_expert_layers() -> tuple[LinearLayer, ...]:
    layers = []
    for m in MODELS.values():
        if m.shared_intermediate > 0:
            i = m.shared_intermediate
            layers += [
                LinearLayer(m.name, "shared_expert.gate_up_proj", m.hidden, 2 * i, Parallel.COLUMN, replicable=True),
                LinearLayer(m.name, "shared_expert.down_proj", i, m.hidden, Parallel.ROW, replicable=True),
            ]
    return tuple(layers)


DENSE_LAYERS: tuple[LinearLayer, ...] = tuple(
    LinearLayer(m.name, d.name, d.in_features, d.out_features, d.parallel, max_tp=d.max_tp)
    for m in MODELS.values()
    for d in m.dense_layers
)
"""The catalogue's dense projections (:attr:`strategies.catalog.ModelShape.dense_layers`)."""

LINEAR_LAYERS: tuple[LinearLayer, ...] = _shared_expert_layers() + DENSE_LAYERS


def rank_local(layer: LinearLayer, tp: int, parallel: Parallel) -> tuple[int, int] | None:
    """Rank-local ``(N, K)`` of ``layer`` held as ``parallel`` at degree ``tp``, or None if vLLM cannot load it.

    Column: ``out % tp == 0``. Row: ``in % tp == 0`` and whole 32-element groups per rank (a cut
    group cannot be repaired, ``docs/vllm-logic.md`` §15; the shared-expert contract decides those).
    Replicated: always (``N = out``, ``K = in``).
    """
    out, k_in = layer.out_features, layer.in_features
    if parallel is Parallel.REPLICATED or tp == 1:
        return out, k_in
    if tp > layer.max_tp:
        return None
    if parallel is Parallel.COLUMN:
        return (out // tp, k_in) if out % tp == 0 else None
    part, rem = divmod(k_in, tp)
    return (out, part) if rem == 0 and part % MXFP4_BLOCK == 0 else None


def shardings(layer: LinearLayer, tp: int) -> list[Parallel]:
    """The ways a rank can hold ``layer`` at degree ``tp`` (its own sharding, or replicated)."""
    if tp == 1:
        return [Parallel.REPLICATED]
    options = [layer.parallel] if rank_local(layer, tp, layer.parallel) is not None else []
    if layer.replicable and Parallel.REPLICATED not in options:
        options.append(Parallel.REPLICATED)
    return options


def reduce_rows(n: int) -> int:
    """Subtract the multiple of 32 that brings ``n`` into ``(128, 160]``; ``n <= 160`` is kept.

    Keeps ``n mod 32``, ``n >= 32``, ``n == 96`` (vLLM's forced-Triton row count) and ``n > 128``
    (SGLang's ASM threshold, ``_ASM_FP4_UNSAFE_MAX_N`` in ``quark_w4a4_mxfp4.py``), so either guard
    answers the same for the reduced and the real row count.
    """
    if n <= REDUCE_ROWS_ABOVE:
        return n
    return n - -(-(n - REDUCE_ROWS_ABOVE) // REDUCE_ROWS_STEP) * REDUCE_ROWS_STEP


@dataclass(frozen=True)
class Mxfp4LinearShape(Config):
    """One rank's MXFP4 linear layer: real scale shape ``(N, K/32)`` and reduced tensor sizes ``n, k``."""

    model: str
    layer: str
    tp: int
    parallel: Parallel
    in_features: int
    out_features: int
    scale_shape: tuple[int, ...]
    n: int
    k: int
    tokens: int
    seed: int

    @property
    def real_n(self) -> int:
        return self.scale_shape[0]

    @property
    def real_k(self) -> int:
        return MXFP4_BLOCK * self.scale_shape[1]

    def describe(self) -> str:
        return (
            f"{self.model} {self.layer} TP={self.tp} [{self.parallel.value}]: global in {self.in_features} "
            f"out {self.out_features} -> rank N={self.real_n} K={self.real_k}, scale {tuple(self.scale_shape)}; "
            f"tensors N={self.n} K={self.k}, T={self.tokens} seed={self.seed}"
        )


def linear_shape(layer: LinearLayer, tp: int, parallel: Parallel, tokens: int, seed: int) -> Mxfp4LinearShape:
    """The :class:`Mxfp4LinearShape` of ``layer`` at ``tp`` held as ``parallel`` (raises if not loadable)."""
    local = rank_local(layer, tp, parallel)
    if local is None:
        raise ValueError(f"{layer.model} {layer.name} cannot be held {parallel.value} at TP={tp}")
    n, k = local
    return Mxfp4LinearShape(
        model=layer.model,
        layer=layer.name,
        tp=tp,
        parallel=Parallel.REPLICATED if tp == 1 else parallel,
        in_features=layer.in_features,
        out_features=layer.out_features,
        scale_shape=(n, k // MXFP4_BLOCK),
        n=reduce_rows(n),
        k=reduce_size(k),
        tokens=tokens,
        seed=seed,
    )


def find_layer(model: str, name: str) -> LinearLayer:
    """Look up a catalogued linear layer; raises ``KeyError`` naming the known ones."""
    for layer in LINEAR_LAYERS:
        if (layer.model, layer.name) == (model, name):
            return layer
    known = ", ".join(sorted(f"{lay.model}:{lay.name}" for lay in LINEAR_LAYERS))
    raise KeyError(f"no linear layer {model}:{name}; catalogued: {known}")


def pinned_linear(model: str, name: str, tp: int, parallel: Parallel | None = None, tokens: int = 3, seed: int = 0):
    """The :class:`Mxfp4LinearShape` of a catalogued layer (for ``@example`` pins)."""
    layer = find_layer(model, name)
    return linear_shape(layer, tp, parallel or layer.parallel, tokens, seed)


def token_counts() -> st.SearchStrategy[int]:
    """Decode sizes 1-4, non-multiples of 32 around the 32/64 kernel thresholds, and small prefills."""
    return st.one_of(st.integers(1, 4), st.sampled_from((5, 31, 33, 63, 64, 65)), st.integers(1, 65))


def _loadable(layer: LinearLayer, tp: int) -> bool:
    return bool(shardings(layer, tp))


@st.composite
def _catalog_shape(draw: st.DrawFn, layers: list[LinearLayer], tp: int | None) -> Mxfp4LinearShape:
    if tp is None:
        layer = draw(st.sampled_from(layers))
        tp = draw(st.sampled_from([t for t in TP_DEGREES if _loadable(layer, t)]))
    else:
        layer = draw(st.sampled_from([lay for lay in layers if _loadable(lay, tp)]))
    parallel = draw(st.sampled_from(shardings(layer, tp)))
    return linear_shape(layer, tp, parallel, draw(token_counts()), draw(st.integers(0, 2**16)))


ROWS_RULE, COLS_RULE = "mxfp4_linear.scale_rows", "mxfp4_linear.scale_cols"
GUARD_RULES = ("rows", "cols", "forced rows")
"""The ASM guard's rules a drawn scale shape straddles, drawn equally often: the swizzle's ``rows % 32``
and ``cols % 8``, and the row counts vLLM forces to Triton (96)."""


_ROWS = boundary_sizes(unit=1, moduli=moduli_for(ROWS_RULE), special=SPECIAL_SIZES[ROWS_RULE], sides=GUARD_SIDES)
_COLS = boundary_sizes(unit=1, moduli=(RULE_MODULI[COLS_RULE], ()), max_multiple=64, sides=GUARD_SIDES)
"""Columns around multiples of the cols rule's own divisor 8 only, half-way one time in two
(:data:`~strategies.boundaries.GUARD_SIDES`): a weaker rule ``cols % d`` (``d`` = 4, 2, 1) disagrees with it
on ``cols ≡ 4 (mod 8)`` whatever ``d`` is, and on the odd columns one off a multiple when ``d = 1``; a
stricter rule ``cols % 16 … % 256`` on ``8·k`` for odd ``k``, which the multiples ``k <= 64`` hit (up to
512 columns). The generic moduli would only take draws from the half-way class."""
_WHOLE_ROWS = st.integers(1, 64).map(lambda a: 32 * a)
_WHOLE_COLS = st.integers(1, 64).map(lambda a: 8 * a)


@st.composite
def guard_boundary_scales(draw: st.DrawFn) -> tuple[int, int]:
    """A 2-D scale shape ``(rows, cols)`` straddling one rule of the ASM guard (:data:`GUARD_RULES`) while
    the others hold.

    ``rows``: rows on, one off and half-way between multiples of 32 and the powers of two up to
    256 (:func:`strategies.boundaries.boundary_sizes`, sides as :data:`~strategies.boundaries.GUARD_SIDES`),
    or a row count a rule singles out (96), cols a multiple of 8; ``cols``: cols around
    multiples of 8 (:data:`_COLS`: ``cols ≡ 4 (mod 8)`` one time in two), rows a multiple of 32;
    ``forced rows``: a row count vLLM sends to Triton (96), cols a multiple of 8 (so only that rule
    decides). Shrinks to the ``rows`` rule at 32 rows, 8 columns.
    """
    rule = draw(st.sampled_from(GUARD_RULES))
    if rule == "rows":
        return draw(_ROWS), draw(_WHOLE_COLS)
    if rule == "cols":
        return draw(_WHOLE_ROWS), draw(_COLS)
    return draw(st.sampled_from(SPECIAL_SIZES[ROWS_RULE])), draw(_WHOLE_COLS)


def adversarial_scale_shapes() -> st.SearchStrategy[tuple[int, int]]:
    """2-D scale shapes: :func:`guard_boundary_scales`, or any rows in ``[1, 4096]`` and columns in
    ``[1, 512]``. Shrinks to the guard's boundary at ``(32, 8)``."""
    return st.one_of(guard_boundary_scales(), st.tuples(st.integers(1, 4096), st.integers(1, 512)))


@st.composite
def _adversarial_shape(draw: st.DrawFn, tp: int | None) -> Mxfp4LinearShape:
    tp = tp if tp is not None else draw(st.sampled_from(TP_DEGREES))
    parallel = Parallel.REPLICATED if tp == 1 else draw(st.sampled_from(list(Parallel)))
    n, cols = draw(adversarial_scale_shapes())
    out = n * tp if parallel is Parallel.COLUMN else n
    k_in = MXFP4_BLOCK * cols * (tp if parallel is Parallel.ROW else 1)
    layer = LinearLayer("adversarial", "linear", k_in, out, parallel, replicable=True)
    return linear_shape(layer, tp, parallel, draw(token_counts()), draw(st.integers(0, 2**16)))


@st.composite
def linear_shapes(draw: st.DrawFn) -> Mxfp4LinearShape:
    """A rank's :class:`Mxfp4LinearShape`: a catalogued layer (honouring ``--model``/``--tp`` pins)
    or, without ``--model``, adversarial sizes. A pinned model has only its own layers: one without a
    catalogued MXFP4 linear layer loadable at the pinned TP has none to draw, and the plugin deselects
    the contract's tests (:func:`strategies.presence.absent_layers`)."""
    pin = current_pin()
    layers = [lay for lay in LINEAR_LAYERS if pin.model is None or lay.model == pin.model]
    if pin.tp is not None:
        layers = [lay for lay in layers if _loadable(lay, pin.tp)]
    if pin.model is None and draw(st.booleans()):
        return draw(_adversarial_shape(pin.tp))
    return draw(_catalog_shape(layers, pin.tp))


@dataclass(frozen=True)
class ScaleShapeCase(Config):
    """A weight-scale shape handed to the ASM guard (any rank; real layers are 2-D) and where it came from."""

    shape: tuple[int, ...]
    origin: str

    def describe(self) -> str:
        return f"scale shape {tuple(self.shape)} ({self.origin})"


SCALE_SHAPE_KINDS = ("layer", "boundary", "boundary", "boundary", "boundary", "boundary", "boundary", "not-2-D")
"""Where a guard's scale shape comes from, drawn with ``sampled_from`` (``integers`` over the
indices favours the ends): six in eight on the guard's boundaries (:func:`guard_boundary_scales`: three
rules, each wrong variant of which differs on one residue class, share them), one rank-local layer
(:func:`linear_shapes`: catalogued and adversarial), one not 2-D (one branch of the guard)."""


@st.composite
def scale_shapes(draw: st.DrawFn) -> ScaleShapeCase:
    """Rank-local layers' scale shapes, 2-D shapes on the guard's boundaries (rows, cols >= 1) and
    non-2-D shapes (:data:`SCALE_SHAPE_KINDS`); shrinks to a layer's shape. Under ``--model`` only
    the model's layers (the guard's boundaries are no layer of it).

    Empty scales are not drawn: ``(0, c)`` passes vLLM's modulo checks and torch's view, but no
    layer has zero rows (``asm_scale_swizzle_ok`` rejects it).
    """
    kind = "layer" if current_pin().model is not None else draw(st.sampled_from(SCALE_SHAPE_KINDS))
    if kind == "layer":
        s = draw(linear_shapes())
        return ScaleShapeCase(tuple(s.scale_shape), f"{s.model} {s.layer} TP={s.tp} {s.parallel.value}")
    if kind == "boundary":
        return ScaleShapeCase(draw(guard_boundary_scales()), "adversarial")
    ndim = draw(st.sampled_from((1, 3, 4)))
    dims = draw(st.lists(st.integers(1, 64), min_size=ndim, max_size=ndim))
    return ScaleShapeCase(tuple(dims), "not 2-D")


@dataclass(frozen=True)
class ActivationBlocks(Config):
    """Activation rows of MXFP4 blocks whose amax is ``mantissas[b] · 2^exponents[b]`` (``m ∈ [1, 2)``).

    Block ``b`` holds its amax once (sign and position from the seed) and 31 values of smaller
    magnitude, so ``amax`` is exact in fp32.
    """

    mantissas: tuple[float, ...]
    exponents: tuple[int, ...]
    seed: int

    def describe(self) -> str:
        pairs = ", ".join(f"{m!r}·2^{e}" for m, e in zip(self.mantissas, self.exponents, strict=True))
        return f"block amax [{pairs}] seed={self.seed}"


RCEIL_EVEN_BAND = (1.5, 1.75)
"""Open interval of amax mantissas where RCEIL (RoundUp) and EVEN scale exponents differ (docs/formats.md §7)."""


def _fp32(x: float) -> float:
    return float(torch.tensor(x, dtype=torch.float32))


def _next_fp32(x: float, toward: float) -> float:
    return float(torch.nextafter(torch.tensor(x, dtype=torch.float32), torch.tensor(toward, dtype=torch.float32)))


def amax_mantissas() -> st.SearchStrategy[float]:
    """fp32 mantissas in ``[1, 2)``: the (1.5, 1.75) band, its edges and their fp32 neighbours,
    AITER's checked examples 1.7 and 1.7499, or anywhere."""
    lo, hi = RCEIL_EVEN_BAND
    edges = (1.0, lo, _next_fp32(lo, 2.0), _next_fp32(hi, 1.0), hi, _fp32(1.7), _fp32(1.7499))
    band = st.floats(lo, hi, exclude_min=True, exclude_max=True, width=32)
    anywhere = st.floats(1.0, 2.0, exclude_max=True, width=32)
    return st.one_of(band, st.sampled_from(edges), anywhere)


@st.composite
def activation_blocks(draw: st.DrawFn) -> ActivationBlocks:
    """1-8 blocks with drawn amax mantissas (biased to the RCEIL/EVEN band) and exponents in [-60, 60]."""
    count = draw(st.integers(1, 8))
    mantissas = tuple(draw(amax_mantissas()) for _ in range(count))
    exponents = tuple(draw(st.integers(-60, 60)) for _ in range(count))
    return ActivationBlocks(mantissas, exponents, draw(st.integers(0, 2**16)))


def activation_row(blocks: ActivationBlocks) -> torch.Tensor:
    """fp32 ``[1, 32·B]``: block ``b`` has amax exactly ``mantissas[b] · 2^exponents[b]``."""
    g = torch.Generator().manual_seed(blocks.seed)
    parts = []
    for m, e in zip(blocks.mantissas, blocks.exponents, strict=True):
        amax = math.ldexp(m, e)
        vals = (torch.rand(MXFP4_BLOCK, generator=g) * 2 - 1) * amax * 0.999
        pos = int(torch.randint(MXFP4_BLOCK, (1,), generator=g))
        vals[pos] = amax if torch.rand(1, generator=g).item() < 0.5 else -amax
        parts.append(vals)
    return torch.cat(parts).float()[None, :]


@dataclass(frozen=True)
class Mxfp4LinearCase:
    """Tensors of one layer: packed weight uint8 ``[N, K/2]``, UE8M0 scale ``[N, K/32]``, fp32 ``x [T, K]``."""

    weight: torch.Tensor
    scale: torch.Tensor
    x: torch.Tensor


def mxfp4_linear_case(shape: Mxfp4LinearShape, n: int | None = None, k: int | None = None) -> Mxfp4LinearCase:
    """Build ``shape``'s tensors from its seed at sizes ``(n, k)`` (default: the reduced sizes).

    Weight bytes cover every E2M1 code; scale bytes lie in :data:`SCALE_BYTES`; activation rows
    are normal samples times ``2^r``, ``r ∈ [-4, 4]`` per row.
    """
    n = shape.n if n is None else n
    k = shape.k if k is None else k
    g = torch.Generator().manual_seed(shape.seed)
    weight = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int64).to(torch.uint8)
    scale = torch.randint(*SCALE_BYTES, (n, k // MXFP4_BLOCK), generator=g, dtype=torch.int64).to(torch.uint8)
    rows = torch.ldexp(torch.ones(shape.tokens, 1), torch.randint(-4, 5, (shape.tokens, 1), generator=g))
    x = torch.randn(shape.tokens, k, generator=g) * rows
    return Mxfp4LinearCase(weight, scale, x)


def grid_layer(m: int, n: int, k: int) -> Mxfp4LinearShape | None:
    """A fixed-grid GEMM point ``(M, N, K)`` of another test suite as a TP=1 layer (None if ``K % 32``)."""
    if k % MXFP4_BLOCK:
        return None
    layer = LinearLayer("grid", f"gemm M={m}", k, n, Parallel.REPLICATED)
    return linear_shape(layer, 1, Parallel.REPLICATED, tokens=min(m, 8), seed=0)
