"""OpenAI's ``triton_kernels`` (``matmul_ogs``): the Hopper MXFP4 weight-scale layout and what its kernel reads.

vLLM's ``TRITON`` / ``TRITON_UNFUSED`` MXFP4 MoE backends (``OAITritonExperts``) run
``triton_kernels.matmul_ogs`` with the weights' quantization axis on dim 1 (``_swizzle_mxfp4`` in
``vllm/model_executor/layers/quantization/utils/mxfp4_utils.py``, vLLM 0.33.0, which vendors
triton_kernels 3.5.1 as ``vllm.third_party.triton_kernels``). On Hopper the scales go through
``HopperMXScaleLayout``, whose ``swizzle_data`` zero-pads the scale groups along K to a multiple of
``SWIZZLE_ALIGN_K = 2`` (``tensor_details/layout_details/hopper_scale.py``), while the kernel walks K
in ``block_k = 128`` tiles (``opt_flags_nvidia.compute_block_k`` forces 128 for MXFP4 on Hopper) and
loads each tile's four scale groups unmasked (the ``HOPPER_SCALE`` branch of ``_matmul_ogs``). A K
whose group count is 1 or 2 modulo 4 therefore reads one or two groups past the stored scales:
uninitialised bytes, 0xFF being an E8M0 NaN (gpt-oss, K = 2880: 90 groups, 92 read; vLLM issue
#47303, accuracy 0 % on GSM8K; SGLang PR #36456, illegal address on the last expert). Fixes: vLLM PR
#47910 zero-pads the scale groups to a multiple of 4 before ``convert_layout``; triton-lang/triton
PR #10800 makes ``HopperMXScaleLayout`` pad to 4 (triton_kernels 3.8).

FC1 row order: ``swiglu`` reads ``gelu = a[..., ::2]`` and ``linear = a[..., 1::2]``
(``swiglu.py``), gpt-oss's row-interleaved pairs.

:func:`hopper_layout` loads the library's own layout (``triton_kernels`` or vLLM's vendored copy;
both import Triton) for the layout property; the rule itself is plain arithmetic here.
"""

from __future__ import annotations

import contextlib
import importlib
import sys
from collections.abc import Iterator, Sequence
from types import ModuleType
from unittest import mock

import torch

from contracts.errors import LibraryUnavailable
from contracts.moe import MoeWeights
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.padding import pad_dim

HOPPER_BLOCK_K = 128
"""K elements per ``matmul_ogs`` tile for MXFP4 weights on Hopper (``compute_block_k``): 4 scale groups."""
HOPPER_TILE_GROUPS = HOPPER_BLOCK_K // MXFP4_BLOCK
"""Scale groups per ``block_k`` tile: what vLLM 0.33.0 (PR #47910) pads the scale groups to before the layout."""
HOPPER_SCALE_ALIGN_K = 2
"""Scale groups ``HopperMXScaleLayout`` pads K to (triton_kernels 3.5.1; 4 from triton PR #10800)."""
HOPPER_NUM_WARPS = 8
"""vLLM's ``_swizzle_mxfp4(num_warps=8)``; the Hopper scale unswizzle asserts 8 warps."""
LAYOUT_MODULES = (
    "triton_kernels.tensor_details.layout_details.hopper_scale",
    "vllm.third_party.triton_kernels.tensor_details.layout_details.hopper_scale",
)


def stored_scale_groups(k: int, groups_to: int = HOPPER_SCALE_ALIGN_K) -> int:
    """Scale groups along K stored for ``k`` elements when they are zero-padded to a multiple of ``groups_to``
    (``HopperMXScaleLayout`` of triton_kernels 3.5.1 pads to 2; vLLM 0.33.0 pads to 4 before it)."""
    groups = -(-k // MXFP4_BLOCK)
    return -(-groups // groups_to) * groups_to


def read_scale_groups(k: int) -> int:
    """Scale groups the Hopper kernel loads for ``k`` elements: ``cdiv(k, 128)`` whole 4-group tiles."""
    return -(-k // HOPPER_BLOCK_K) * HOPPER_TILE_GROUPS


ODD_GROUPS_K = 2 * MXFP4_BLOCK
"""The Hopper ``matmul_ogs`` result is right only for ``K % 64 == 0``: an odd number of 32-element groups along
K gives a silently wrong output whatever the scale padding (``backends/truth/triton-kernels-sm90.sm90.json``,
every ``K % 64 == 32`` from 32 to 2016 wrong by 10 to 225 units of ``2^-8`` magnitude, no error raised;
zero-padding such a K to a multiple of 64 makes it right)."""
REFUSED_OUTPUT_WIDTH = 128
"""The Hopper ``matmul_ogs`` refuses ``N <= 128`` output columns at compile time
(``CompileTimeAssertionFailure``, ``tl.static_assert(W_TRANSPOSE)``; measured for N = 32 ... 128, N = 160 runs).
A loud refusal, not a padding rule: no MXFP4 MoE model has ``H <= 128`` or ``2·I <= 128`` per rank."""


def odd_groups(k: int) -> bool:
    """Whether ``k`` elements along K hold an odd number of 32-element groups (:data:`ODD_GROUPS_K`)."""
    return k % ODD_GROUPS_K != 0


def gemm_violations(k: int, stored_groups: int) -> list[str]:
    """Why one Hopper MXFP4 ``matmul_ogs`` GEMM with ``k`` weight elements along K and ``stored_groups`` scale
    groups stored before the layout gives a wrong result without an error.

    Two rules, each measured (``backends/truth``), the first reported alone since it holds whatever the scales:
    ``k % 64 == 32`` (an odd number of 32-groups, :data:`ODD_GROUPS_K`), and fewer stored scale groups than the
    ``block_k = 128`` kernel reads unmasked
    (:func:`read_scale_groups`): it then reads bytes past the stored scales, uninitialised memory whose
    0xFF bytes are E8M0 NaNs (vLLM #47303; the measured K = 960 with the layout's own padding came out
    non-finite, K = 2880 happened to read zeros).
    """
    if odd_groups(k):
        return [f"K {k} has an odd number of 32-element groups ({k // MXFP4_BLOCK}): silently wrong on Hopper"]
    read = read_scale_groups(k)
    if stored_groups < read:
        return [f"{stored_groups} scale groups stored, the block_k 128 kernel reads {read} (vLLM #47303)"]
    return []


def contract_k(k_weights: int, stored_groups: int) -> int:
    """The K of one GEMM as the contract states it, for weights of ``k_weights`` elements along K handed over with
    ``stored_groups`` scale groups (an engine that pads only the scales, as vLLM 0.33.0 does).

    Where the weights' K has an even number of groups the kernel's result equals that of the weights zero-padded
    to the scales (bit-identical, measured: 2880 vs 2944, 704 vs 768, 320 vs 384), so K is ``32 · stored``;
    otherwise the kernel is wrong (:func:`gemm_violations`) and K stays ``k_weights``, which the rule rejects.
    """
    return k_weights if odd_groups(k_weights) else MXFP4_BLOCK * stored_groups


def hopper_violations(intermediate: int, hidden: int) -> list[str]:
    """Why triton_kernels' Hopper MXFP4 ``matmul_ogs`` would be silently wrong for experts zero-padded to ``(I, H)``
    (weights and scales alike), with the scales laid out by triton_kernels 3.5.1's ``HopperMXScaleLayout``
    (:func:`stored_scale_groups`, pad to 2): :func:`gemm_violations` of FC1 (``K = H``) and FC2 (``K = I``).

    Together the rules amount to ``K % 128 == 0``, what both upstream fixes of vLLM #47303 settled on (vLLM
    PR #47910 pads the groups to a multiple of 4, triton PR #10800 makes the layout do it), but for two
    reasons: an odd group count is wrong by itself, and ``K % 128 == 64`` reads two groups past the layout's.
    """
    return [
        f"{label}: {problem}"
        for label, k in (("FC1", hidden), ("FC2", intermediate))
        for problem in gemm_violations(k, stored_scale_groups(k))
    ]


def hopper_layout() -> ModuleType:
    """triton_kernels' ``hopper_scale`` module (its own or vLLM's vendored copy); raises
    :class:`LibraryUnavailable` where neither imports (both need Triton)."""
    reasons = []
    for name in LAYOUT_MODULES:
        try:
            return importlib.import_module(name)
        except ImportError as exc:
            reasons.append(f"{name}: {exc}")
    raise LibraryUnavailable("triton_kernels is not importable (" + "; ".join(reasons) + ")")


def _hopper_scale_layout(module: ModuleType, shape: list[int]) -> object:
    """The layout object for ``shape``: triton_kernels 3.5.1 builds it from the shape, newer versions
    from ``(mx_axis, num_warps)`` and then ``make_transformation(shape)``."""
    cls = module.HopperMXScaleLayout
    if hasattr(cls, "make_transformation"):
        return cls(mx_axis=1, num_warps=HOPPER_NUM_WARPS).make_transformation(shape)
    return cls(shape, mx_axis=1, num_warps=HOPPER_NUM_WARPS)


def hopper_scale_round_trip(scale: torch.Tensor) -> tuple[int, torch.Tensor]:
    """triton_kernels' own ``HopperMXScaleLayout(mx_axis=1)`` on ``scale [E, N, K/32]``, handed over as
    vLLM's ``_swizzle_mxfp4`` does (transposed to ``[E, K/32, N]``): the scale groups stored along K
    (the swizzled tensor is ``[E, K_stored·32, ru(N, 256)/32]``) and the unswizzled ``[E, N, K/32]``."""
    kn = scale.transpose(-2, -1)
    layout = _hopper_scale_layout(hopper_layout(), list(kn.shape))
    swizzled = layout.swizzle_data(kn)
    back = layout.unswizzle_data(swizzled)[..., : kn.shape[-2], : kn.shape[-1]]
    return swizzled.shape[-2] // MXFP4_BLOCK, back.transpose(-2, -1)


STAND_IN_MODULES = (
    "triton_kernels",
    "triton_kernels.matmul",
    "triton_kernels.matmul_details",
    "triton_kernels.matmul_details.opt_flags",
    "triton_kernels.matmul_ogs_details",
    "triton_kernels.matmul_ogs_details.opt_flags",
    "triton_kernels.numerics",
    "triton_kernels.tensor",
    "triton_kernels.tensor_details",
    "triton_kernels.tensor_details.layout",
)
"""The triton_kernels modules the engines' MXFP4 preparation imports: vLLM 0.33.0's ``_swizzle_mxfp4``
(``matmul_ogs_details`` for triton_kernels 3.5.1) and SGLang 0.5.23's ``Mxfp4MoEMethod`` (``matmul``,
``matmul_details``)."""


@contextlib.contextmanager
def recorded_hand_over() -> Iterator[list[torch.Tensor]]:
    """Stand-ins for :data:`STAND_IN_MODULES` on ``sys.modules`` (triton_kernels is no PyPI package and its
    layouts need a GPU), yielding the list of tensors an engine hands ``convert_layout`` (weights
    ``[E, K/2, N]``, scales ``[E, K/32, N]``, in the engine's order; :func:`handed_weights` reads them).

    ``convert_layout`` appends its tensor and returns it; ``wrap_torch_tensor`` returns its tensor; the layout
    factories return a ``(layout, options)`` pair, ``StridedLayout`` a name; ``update_opt_flags_constraints``,
    ``InFlexData``, ``PrecisionConfig`` and ``FlexCtx`` are inert. So every transpose and padding is the
    engine's.
    """
    handed: list[torch.Tensor] = []
    stubs = {name: ModuleType(name) for name in STAND_IN_MODULES}
    for name in ("triton_kernels.matmul_details.opt_flags", "triton_kernels.matmul_ogs_details.opt_flags"):
        stubs[name].update_opt_flags_constraints = lambda constraints: None
    stubs["triton_kernels.matmul"].FlexCtx = lambda **kwargs: None
    stubs["triton_kernels.matmul"].PrecisionConfig = lambda **kwargs: None
    stubs["triton_kernels.numerics"].InFlexData = lambda *args, **kwargs: None
    tensor = stubs["triton_kernels.tensor"]
    tensor.FP4 = "fp4"
    tensor.wrap_torch_tensor = lambda t, dtype=None: t
    tensor.convert_layout = lambda t, layout, **opts: handed.append(t) or t
    layout = stubs["triton_kernels.tensor_details.layout"]
    layout.StridedLayout = "strided"
    layout.make_default_matmul_mxfp4_w_layout = lambda mx_axis: ("value", {})
    layout.make_default_matmul_mxfp4_w_scale_layout = lambda mx_axis, num_warps: ("scale", {})
    for name in STAND_IN_MODULES:
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(stubs[parent], child, stubs[name])
    with mock.patch.dict(sys.modules, stubs):
        yield handed


def handed_weights(
    handed: Sequence[torch.Tensor], w13_bias: torch.Tensor | None, w2_bias: torch.Tensor | None
) -> MoeWeights:
    """An MXFP4 MoE layer as an engine hands it to triton_kernels' ``convert_layout``, in the contract's form.

    ``handed``: FC1 weights ``[E, H/2, 2I]``, FC1 scales ``[E, G1, 2I]``, FC2 weights ``[E, I/2, H]``, FC2
    scales ``[E, G2, H]`` (the quantization axis on dim 1, as ``_swizzle_mxfp4`` transposes them; ``G`` the
    scale groups along K the engine hands over, padded or not). Where the weights' K has an even number of
    groups the kernel's result is that of the weights zero-padded to the scales (:func:`contract_k`), so for the
    contract the layer is ``Hp = 32·G1``, ``Ip = 32·G2``; where it is odd, ``K`` stays the weights' and the scale
    groups past it (the engine's zero padding) are dropped, so the odd-group rule judges it. FC1 rows (weights,
    scales, fp32 biases) are zero-padded to ``2·Ip`` and FC2's to ``Hp``, labelled with the order ``swiglu``
    reads (gate/up pairs)."""
    w13, s13, w2, s2 = (t.transpose(-2, -1).contiguous() for t in handed)
    ip, hp = contract_k(2 * w2.shape[-1], s2.shape[-1]), contract_k(2 * w13.shape[-1], s13.shape[-1])
    return MoeWeights(
        w13=pad_dim(pad_dim(w13, -1, hp // 2), -2, 2 * ip),
        w13_scale=pad_dim(s13[..., : hp // MXFP4_BLOCK].contiguous(), -2, 2 * ip),
        w2=pad_dim(pad_dim(w2, -1, ip // 2), -2, hp),
        w2_scale=pad_dim(s2[..., : ip // MXFP4_BLOCK].contiguous(), -2, hp),
        block=MXFP4_BLOCK,
        fc1_layout=Fc1Layout.GATE_UP_INTERLEAVED,
        w13_bias=None if w13_bias is None else pad_dim(w13_bias.float(), -1, 2 * ip),
        w2_bias=None if w2_bias is None else pad_dim(w2_bias.float(), -1, hp),
    )
