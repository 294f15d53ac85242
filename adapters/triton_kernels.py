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
HOPPER_SCALE_ALIGN_K = 2
"""Scale groups ``HopperMXScaleLayout`` pads K to (triton_kernels 3.5.1; 4 from triton PR #10800)."""
HOPPER_NUM_WARPS = 8
"""vLLM's ``_swizzle_mxfp4(num_warps=8)``; the Hopper scale unswizzle asserts 8 warps."""
LAYOUT_MODULES = (
    "triton_kernels.tensor_details.layout_details.hopper_scale",
    "vllm.third_party.triton_kernels.tensor_details.layout_details.hopper_scale",
)


def stored_scale_groups(k: int) -> int:
    """Scale groups along K that ``HopperMXScaleLayout`` stores for ``k`` elements (zero-padded to 2)."""
    groups = -(-k // MXFP4_BLOCK)
    return -(-groups // HOPPER_SCALE_ALIGN_K) * HOPPER_SCALE_ALIGN_K


def read_scale_groups(k: int) -> int:
    """Scale groups the Hopper kernel loads for ``k`` elements: ``cdiv(k, 128)`` whole 4-group tiles."""
    return -(-k // HOPPER_BLOCK_K) * (HOPPER_BLOCK_K // MXFP4_BLOCK)


def hopper_violations(intermediate: int, hidden: int) -> list[str]:
    """Why triton_kernels' Hopper MXFP4 ``matmul_ogs`` would read scales past their storage for ``(I, H)``.

    FC1 reduces over ``K = H``, FC2 over ``K = I``. The kernel reads whole 4-group tiles
    (:func:`read_scale_groups`); the contract both upstream fixes settled on is that the scales handed
    over fill whole tiles, ``K % 128 == 0`` (vLLM PR #47910 pads the groups to a multiple of 4,
    triton PR #10800 makes the layout do it). triton_kernels 3.5.1's own pad to 2 groups
    (:func:`stored_scale_groups`) happens to complete the tile when ``(K/32) % 4 == 3`` and falls
    one or two groups short when it is 1 or 2, which the message states.
    """
    problems = []
    for label, k in (("FC1", hidden), ("FC2", intermediate)):
        if k % HOPPER_BLOCK_K:
            stored, read = stored_scale_groups(k), read_scale_groups(k)
            problems.append(
                f"{label} K {k} % 128 != 0: the Hopper block_k 128 kernel reads {read} scale groups unmasked, "
                f"HopperMXScaleLayout (triton_kernels 3.5.1) stores {stored} (vLLM #47303)"
            )
    return problems


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
    scale groups along K the engine hands over, padded or not). The kernel reads ``32·G`` elements of K and
    masks the weights' K tail, so for the contract the layer is the weights zero-padded to the scales:
    ``Hp = 32·G1``, ``Ip = 32·G2``, FC1 rows (weights, scales, fp32 biases) zero-padded to ``2·Ip`` and FC2's
    to ``Hp``. FC1 rows are labelled with the order ``swiglu`` reads (gate/up pairs)."""
    w13, s13, w2, s2 = (t.transpose(-2, -1).contiguous() for t in handed)
    ip, hp = MXFP4_BLOCK * s2.shape[-1], MXFP4_BLOCK * s13.shape[-1]
    return MoeWeights(
        w13=pad_dim(pad_dim(w13, -1, hp // 2), -2, 2 * ip),
        w13_scale=pad_dim(s13, -2, 2 * ip),
        w2=pad_dim(pad_dim(w2, -1, ip // 2), -2, hp),
        w2_scale=pad_dim(s2, -2, hp),
        block=MXFP4_BLOCK,
        fc1_layout=Fc1Layout.GATE_UP_INTERLEAVED,
        w13_bias=None if w13_bias is None else pad_dim(w13_bias.float(), -1, 2 * ip),
        w2_bias=None if w2_bias is None else pad_dim(w2_bias.float(), -1, hp),
    )
