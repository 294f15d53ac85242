"""``mxfp4_linear`` for the ``sglang`` subject: SGLang's ``QuarkW4A4MXFP4`` (Quark OCP-MX W4A4 dense layers on
AITER): ``process_weights_after_loading``'s ASM guard and each path's weight preparation, and the activation
quantizer of each path read from ``apply_weights``' source."""

from __future__ import annotations

import ast
import functools
import inspect
import textwrap
from unittest import mock

import torch

from backends.mxfp4_linear import AiterLinearPath
from contracts.mxfp4_linear import PreparedMxfp4Linear
from reference.formats import MxScaleRounding
from subjects.engine_tools import QUANTIZER_ROUNDING, call_name, mapped_member, reference_shuffle_weight
from subjects.sglang.bridge import LINEAR_PATHS, SglangSourceMismatch, sglang_modules

SGLANG_AITER_QUANTIZERS = {"per_1x32_f4_quant": "per_1x32_f4_quant_hip", "dynamic_mxfp4_quant": "dynamic_mxfp4_quant"}
"""SGLang's custom-op wrappers in ``quark_w4a4_mxfp4.py`` and the AITER quantizer each one calls
(``per_1x32_f4_quant_hip(x, shuffle=True)``, ``aiter.ops.triton.quant.dynamic_mxfp4_quant``)."""

ASM_LAYER_FLAG = "use_aiter_asm_fp4_gemm"
"""The layer attribute ``QuarkW4A4MXFP4.process_weights_after_loading`` sets and ``apply_weights`` branches on."""


def _called_quantizers(stmts: list[ast.stmt]) -> list[str]:
    names = {call_name(n) for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call)}
    return sorted(names & set(SGLANG_AITER_QUANTIZERS))


def quark_path_quantizers(apply_weights_source: str) -> dict[AiterLinearPath, str]:
    """The AITER activation quantizer each path of ``QuarkW4A4MXFP4.apply_weights`` runs, read from source.

    The ASM path is the body of ``if getattr(layer, "use_aiter_asm_fp4_gemm", False): ...``; the Triton
    path is the rest of the function after it. Each must call exactly one quantizer of
    :data:`SGLANG_AITER_QUANTIZERS`; otherwise :class:`SglangSourceMismatch`. (The fused pre-quantizing
    GEMMs serve pre-quantized tuple inputs, which the dense MXFP4 layers the suite models do not get.)
    """
    function = ast.parse(textwrap.dedent(apply_weights_source)).body[0]
    body = getattr(function, "body", [])
    branch = next(
        (
            i
            for i, s in enumerate(body)
            if isinstance(s, ast.If) and ASM_LAYER_FLAG in ast.unparse(s.test) and not s.orelse
        ),
        None,
    )
    if branch is None:
        raise SglangSourceMismatch(f"QuarkW4A4MXFP4.apply_weights has no 'if getattr(layer, {ASM_LAYER_FLAG!r}...)'")
    paths = {AiterLinearPath.ASM: body[branch].body, AiterLinearPath.TRITON: body[branch + 1 :]}
    found = {path: _called_quantizers(stmts) for path, stmts in paths.items()}
    if any(len(q) != 1 for q in found.values()):
        raise SglangSourceMismatch(
            f"QuarkW4A4MXFP4.apply_weights calls the activation quantizers {found}; the adapter expects exactly one "
            f"of {sorted(SGLANG_AITER_QUANTIZERS)} per path"
        )
    return {path: SGLANG_AITER_QUANTIZERS[q[0]] for path, q in found.items()}


@functools.cache
def sglang_linear_quantizers() -> dict[AiterLinearPath, str]:
    """:func:`quark_path_quantizers` on the installed ``QuarkW4A4MXFP4.apply_weights``."""
    return quark_path_quantizers(inspect.getsource(sglang_modules().quark_w4a4.QuarkW4A4MXFP4.apply_weights))


_reference_shuffle_weight = reference_shuffle_weight(SglangSourceMismatch, "SGLang")
"""Stand-in for ``aiter.ops.shuffle.shuffle_weight`` where AITER is absent: the reference's."""


class SglangQuarkMxfp4Linear:
    """SGLang's ``QuarkW4A4MXFP4`` (``quark/schemes/quark_w4a4_mxfp4.py``) on AITER (gfx950).

    * ``process_mxfp4_linear_weights``: ``process_weights_after_loading`` on a ``torch.nn.Module``
      holding ``weight`` and ``weight_scale`` Parameters, with the module's switches set as on an
      MI350x with ``SGLANG_ROCM_USE_AITER_FP4_ASM_GEMM=asm_enabled``: ``_use_aiter_asm_fp4_gemm =
      asm_enabled``, ``is_gfx95_supported() = True``, ``_dequant_linear_to_bf16 = False`` (no
      ``AITER_FORCE_A8W4``). The module imports AITER's ``shuffle_weight`` only on ROCm; where AITER is
      absent the adapter supplies the suite's reference (:func:`_reference_shuffle_weight`). So the
      guard (``_asm_fp4_scale_swizzle_supported`` plus SGLang's ``N <= 128`` rule), the path and the
      ASM scale swizzle are SGLang's; the ASM weight shuffle is the reference's.
    * The path is ASM when the layer's ``use_aiter_asm_fp4_gemm`` is set. On the Triton path SGLang keeps
      the scale as loaded, ``(N, K/32)``, and hands it to ``gemm_afp4wfp4`` as is; the suite's
      :class:`~contracts.mxfp4_linear.PreparedMxfp4Linear` states the Triton scale in vLLM's storage,
      ``(K/32, N)`` whose ``.T`` the GEMM gets, so the adapter reports ``scale.T.contiguous()``: the same
      GEMM operand.
    * ``use_asm_gemm(shape)``: the path that processing takes, ASM enabled, for a layer whose scale has
      that shape (a 2-D shape ``(N, K/32)`` gets an ``[N, K/2]`` weight; other ranks fail SGLang's guard
      before the weight is read).
    * ``linear_activation_rounding``: the rounding of the AITER quantizer ``apply_weights`` calls on that
      path (:func:`sglang_linear_quantizers`, :data:`subjects.engine_tools.QUANTIZER_ROUNDING`).
    """

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        m = sglang_modules()
        scheme = object.__new__(m.quark_w4a4.QuarkW4A4MXFP4)
        scheme.is_checkpoint_mxfp4_serialized = True
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(scale.clone(), requires_grad=False)
        shuffle = getattr(m.quark_w4a4, "shuffle_weight", None) or _reference_shuffle_weight
        with (
            mock.patch.object(m.quark_w4a4, "_use_aiter_asm_fp4_gemm", asm_enabled),
            mock.patch.object(m.quark_w4a4, "_dequant_linear_to_bf16", False),
            mock.patch.object(m.quark_w4a4, "is_gfx95_supported", lambda: True),
            mock.patch.object(m.quark_w4a4, "shuffle_weight", shuffle, create=True),
        ):
            scheme.process_weights_after_loading(layer)
        if mapped_member(LINEAR_PATHS, bool(getattr(layer, ASM_LAYER_FLAG))) is AiterLinearPath.ASM:
            return PreparedMxfp4Linear(AiterLinearPath.ASM, layer.weight.detach(), layer.weight_scale.detach())
        scale = layer.weight_scale.detach()
        return PreparedMxfp4Linear(
            AiterLinearPath.TRITON, layer.weight.detach(), scale.mT.contiguous() if scale.ndim == 2 else scale
        )

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        shape = tuple(scale_shape)
        rows = shape[0] if shape else 0
        weight = torch.zeros(rows, 16 * shape[1] if len(shape) == 2 else 1, dtype=torch.uint8)
        prepared = self.process_mxfp4_linear_weights(weight, torch.zeros(shape, dtype=torch.uint8), asm_enabled=True)
        return prepared.path is AiterLinearPath.ASM

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=True)

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=False)

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        return QUANTIZER_ROUNDING[sglang_linear_quantizers()[path]]
