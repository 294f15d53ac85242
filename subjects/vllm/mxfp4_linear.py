"""``mxfp4_linear`` for the ``vllm`` subject: vLLM's ``AiterMxfp4LinearKernel``
(``_asm_fp4_scale_swizzle_supported`` and ``process_weights_after_loading``; the activation quantizer of each path
read from ``gemm_with_dynamic_quant``'s source)."""

from __future__ import annotations

import ast
import contextlib
import functools
import inspect
import textwrap
import types
from collections.abc import Iterator
from unittest import mock

import torch

from adapters import aiter_triton
from adapters.aiter import AiterUnavailable
from backends.mxfp4_linear import AiterLinearPath
from contracts.mxfp4_linear import PreparedMxfp4Linear
from reference.formats import MxScaleRounding
from subjects.engine_tools import (
    QUANTIZER_ROUNDING,
    call_name,
    mapped_member,
    reference_shuffle_weight,
    stand_in_function,
)
from subjects.vllm.bridge import LINEAR_PATHS, VllmSourceMismatch, vllm_modules

ASM_FLAG = "rocm_use_aiter_fp4_asm_gemm"
"""The parameter of vLLM's ``gemm_with_dynamic_quant`` that selects the ASM branch."""

_TUNED = types.SimpleNamespace(
    is_asm_fp4_gemm_tuned=lambda n, k_bytes: True,
    is_triton_gemm_afp4wfp4_presh_ws_tuned=lambda n, k_bytes: True,
)
"""Stands in for ``rocm_aiter_ops`` in the kernel module: every (N, K) is tuned, so only the scale-shape
guard decides (the suite does not model AITER's tuned-shape lists)."""


_reference_shuffle_weight = reference_shuffle_weight(VllmSourceMismatch, "vLLM")
"""Stand-in for ``aiter.ops.shuffle.shuffle_weight`` where AITER is absent: the reference's."""


@contextlib.contextmanager
def _aiter_shuffle_importable() -> Iterator[None]:
    """Make ``from aiter.ops.shuffle import shuffle_weight`` work: AITER's own function where amd-aiter is
    installed (loaded without ROCm by :func:`adapters.aiter_triton.install`), else
    :func:`~subjects.engine_tools.stand_in_function` with :data:`_reference_shuffle_weight`."""
    try:
        aiter_triton.aiter_module(aiter_triton.SHUFFLE)
    except AiterUnavailable:
        with stand_in_function("aiter.ops.shuffle", "shuffle_weight", _reference_shuffle_weight):
            yield
        return
    yield


def _branch_quantizer(stmts: list[ast.stmt], path: AiterLinearPath) -> str:
    """The one activation quantizer called in a branch of ``gemm_with_dynamic_quant``."""
    names = {call_name(n) for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call)}
    quantizers = sorted(n for n in names if "quant" in n)
    if len(quantizers) != 1 or quantizers[0] not in QUANTIZER_ROUNDING:
        raise VllmSourceMismatch(
            f"vLLM's gemm_with_dynamic_quant calls the activation quantizer(s) {quantizers} on the {path.value} "
            f"path; the adapter knows the rounding of {sorted(QUANTIZER_ROUNDING)} and expects exactly one"
        )
    return quantizers[0]


def quantizers_from_source(module_source: str, apply_weights_source: str) -> dict[AiterLinearPath, str]:
    """Which AITER quantizer each path of vLLM's ``gemm_with_dynamic_quant`` runs, read from source.

    ``module_source`` must define ``gemm_with_dynamic_quant(..., rocm_use_aiter_fp4_asm_gemm, ...)``
    with an ``if rocm_use_aiter_fp4_asm_gemm: ... else: ...`` branch (ASM body, Triton else), and
    ``apply_weights_source`` must pass ``self.use_asm_gemm`` as that flag, so the path the kernel
    reports after weight processing is the branch that runs. Raises :class:`VllmSourceMismatch`.
    """
    gemm = next(
        (
            n
            for n in ast.walk(ast.parse(module_source))
            if isinstance(n, ast.FunctionDef) and n.name == "gemm_with_dynamic_quant"
        ),
        None,
    )
    params = [] if gemm is None else [a.arg for a in gemm.args.args]
    if ASM_FLAG not in params:
        raise VllmSourceMismatch(f"vLLM's aiter linear module has no gemm_with_dynamic_quant(..., {ASM_FLAG}, ...)")
    branch = next(
        (
            n
            for n in ast.walk(gemm)
            if isinstance(n, ast.If) and isinstance(n.test, ast.Name) and n.test.id == ASM_FLAG and n.orelse
        ),
        None,
    )
    if branch is None:
        raise VllmSourceMismatch(f"gemm_with_dynamic_quant has no 'if {ASM_FLAG}: ... else: ...' branch")
    position = params.index(ASM_FLAG)
    calls = [
        n
        for n in ast.walk(ast.parse(textwrap.dedent(apply_weights_source)))
        if isinstance(n, ast.Call) and call_name(n) == "gemm_with_dynamic_quant"
    ]
    flag_args = [ast.unparse(c.args[position]) for c in calls if len(c.args) > position]
    if flag_args != ["self.use_asm_gemm"]:
        raise VllmSourceMismatch(
            f"AiterMxfp4LinearKernel.apply_weights passes {flag_args} as {ASM_FLAG}, not self.use_asm_gemm"
        )
    return {
        AiterLinearPath.ASM: _branch_quantizer(branch.body, AiterLinearPath.ASM),
        AiterLinearPath.TRITON: _branch_quantizer(branch.orelse, AiterLinearPath.TRITON),
    }


@functools.cache
def linear_path_quantizers() -> dict[AiterLinearPath, str]:
    """:func:`quantizers_from_source` on the installed vLLM (``gemm_with_dynamic_quant`` is defined only
    where AITER is supported, so the whole module's source is parsed)."""
    v = vllm_modules()
    return quantizers_from_source(
        inspect.getsource(v.aiter_linear), inspect.getsource(v.aiter_linear.AiterMxfp4LinearKernel.apply_weights)
    )


class VllmAiterMxfp4Linear:
    """vLLM's ``AiterMxfp4LinearKernel`` (``vllm/model_executor/kernels/linear/mxfp4/aiter.py``).

    * ``use_asm_gemm(shape)``: ``_asm_fp4_scale_swizzle_supported`` on an empty uint8 tensor of that shape.
    * ``process_mxfp4_linear_weights``: ``process_weights_after_loading`` on a ``torch.nn.Module``
      holding ``weight`` and ``weight_scale`` Parameters. The kernel is built with
      ``object.__new__`` (its constructor asserts a ROCm platform) with ``asm_gemm_supported =
      asm_enabled`` (what ``rocm_aiter_ops.is_asm_fp4_gemm_supported()`` answers under
      ``VLLM_ROCM_USE_AITER_FP4_ASM_GEMM``). Patched: the module's ``rocm_aiter_ops`` reports every
      (N, K) as tuned (:data:`_TUNED`); where AITER is not importable, ``aiter.ops.shuffle`` is a
      stub whose ``shuffle_weight`` is the suite's ``reference.layouts.aiter_shuffle_weight``. So on
      CPU the guard, the path, the scale swizzle and the Triton transpose are vLLM's; the ASM
      weight shuffle is the reference's.
    * ``prepare_asm_linear`` / ``prepare_triton_linear``: the same call with ASM enabled / disabled
      (vLLM itself falls back to Triton if its guard rejects the scale).
    * ``linear_activation_rounding``: the rounding (:data:`QUANTIZER_ROUNDING`) of the quantizer
      vLLM's ``gemm_with_dynamic_quant`` calls on that path (:func:`linear_path_quantizers`).
    """

    def use_asm_gemm(self, scale_shape: tuple[int, ...]) -> bool:
        v = vllm_modules()
        return bool(v.aiter_linear._asm_fp4_scale_swizzle_supported(torch.empty(tuple(scale_shape), dtype=torch.uint8)))

    def process_mxfp4_linear_weights(
        self, weight: torch.Tensor, scale: torch.Tensor, asm_enabled: bool
    ) -> PreparedMxfp4Linear:
        v = vllm_modules()
        kernel = object.__new__(v.aiter_linear.AiterMxfp4LinearKernel)
        kernel.config = v.MxFp4LinearLayerConfig(activation_quant_key=v.kMxfp4Dynamic)
        kernel.asm_gemm_supported = asm_enabled
        kernel.use_asm_gemm = False
        kernel.out_dtype = torch.bfloat16
        layer = torch.nn.Module()
        layer.weight = torch.nn.Parameter(weight.clone(), requires_grad=False)
        layer.weight_scale = torch.nn.Parameter(scale.clone(), requires_grad=False)
        with mock.patch.object(v.aiter_linear, "rocm_aiter_ops", _TUNED), _aiter_shuffle_importable():
            kernel.process_weights_after_loading(layer)
        path = mapped_member(LINEAR_PATHS, kernel.use_asm_gemm)
        return PreparedMxfp4Linear(path, layer.weight.detach(), layer.weight_scale.detach())

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=True)

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=False)

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        return QUANTIZER_ROUNDING[linear_path_quantizers()[path]]
