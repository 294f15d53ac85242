"""Subject ``vllm``: vLLM's own alignment, fallback and placement code, adapted to the suite's protocols.

Enabled when vLLM imports (``scripts/install-vllm-cpu.sh`` installs vLLM 0.33.0 on a CPU
machine). Every decision comes from vLLM's functions; this module only builds the small input
objects they need and converts tensors between the suite's layout and vLLM's. Where vLLM's code
needs a GPU, ROCm or AITER, the adapter substitutes the smallest piece, named in each adapter's
docstring:

* ``nvfp4_moe``: :class:`VllmNvfp4MoeAlignment` (``prepare_nvfp4_moe_layer_for_fi_or_cutlass``);
* ``mxfp4_linear``: :class:`VllmAiterMxfp4Linear` (``_asm_fp4_scale_swizzle_supported`` and
  ``AiterMxfp4LinearKernel.process_weights_after_loading``; the activation quantizer of each
  path read from ``gemm_with_dynamic_quant``'s source);
* ``shared_expert``: :class:`VllmQwen3NextSharedExpert` (``resolve_layer_fused_shared_expert``
  then ``_should_replicate_misaligned_shared_expert``, in the order ``Qwen3NextSparseMoeBlock``
  uses, checked against its source); it is also the linear policy, so its dense shared expert
  meets vLLM's own ASM guard;
* ``mxfp4_moe``: :class:`VllmMxfp4MoeAlignment` (sizes from
  ``mxfp4_round_up_hidden_size_and_intermediate_size``; placement from the suite);
* ``moe_sharding``: :class:`subjects.vllm_sharding.VllmMoeSharding` (vLLM's MoE weight loaders for
  every rank: ``RoutedExperts.weight_loader`` for ModelOpt NVFP4 and Quark OCP-MX MXFP4 experts,
  ``GptOssModel._load_weights_mxfp4`` for gpt-oss's fused row-interleaved MXFP4 experts).

Upstream bugs of vLLM 0.33.0 that properties catch are listed in :data:`VLLM_KNOWN_FAILURES`.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import importlib.util
import inspect
import sys
import textwrap
import types
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch

from adapters import aiter_triton, triton_kernels
from adapters import flashinfer_cutedsl as cutedsl
from adapters.aiter import AiterUnavailable
from backends import record, records
from backends.kernel_defects import AITER_LINEAR_DEFECTS, covering
from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import CONTRACT as NVFP4_MOE
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.errors import UnsupportedConfig
from contracts.moe import AlignedMoe, MoeWeights, pad_moe
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from contracts.mxfp4_linear import PreparedMxfp4Linear
from contracts.shared_expert import CONTRACT as SHARED_EXPERT
from contracts.shared_expert import SharedExpertPlacement, SharedExpertRefused, SharedExpertSetup
from reference.formats import MxScaleRounding
from reference.layouts import (
    Fc1Layout,
    aiter_shuffle_weight,
    grouped_gate_up_interleave,
    inverse_permutation,
    relayout_fc1,
    swap_halves,
    unswizzle_128x4,
)
from reference.sizes import round_up
from subjects.mxfp4_moe import TRITON_ODD_GROUP_FAILURES, BuiltinMxfp4MoeAlignment
from subjects.registry import KnownFailure, Subject, register_subject
from subjects.vllm_sharding import VllmMoeSharding, cuts_groups_per_projection, gpt_oss_uneven_experts


class VllmUnavailable(RuntimeError):
    """vLLM is not importable here."""


class VllmSourceMismatch(RuntimeError):
    """vLLM's source no longer has the structure an adapter reads from it: a vLLM regression, or an
    adapter to update. Deliberately not a ``ValueError``, which properties read as a refusal."""


def vllm_missing() -> str | None:
    """Why the ``vllm`` subject cannot run here (vLLM not installed), without importing vLLM."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed; install it with scripts/install-vllm-cpu.sh (CPU) or pip install vllm"
    return None


@functools.cache
def vllm_modules() -> types.SimpleNamespace:
    """Import vLLM's modules under test in the order that avoids its circular import."""
    try:
        importlib.import_module("vllm.model_executor.layers.fused_moe")  # must come first
        ffm = importlib.import_module("vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe")
        b12x_moe = importlib.import_module("vllm.model_executor.layers.quantization.utils.b12x_moe")
        fiu = importlib.import_module("vllm.model_executor.layers.quantization.utils.flashinfer_utils")
        nvfp4_oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.nvfp4")
        activation = importlib.import_module("vllm.model_executor.layers.fused_moe.activation")
        mxfp4_oracle = importlib.import_module("vllm.model_executor.layers.fused_moe.oracle.mxfp4")
        moe_utils = importlib.import_module("vllm.model_executor.layers.fused_moe.utils")
        aiter_linear = importlib.import_module("vllm.model_executor.kernels.linear.mxfp4.aiter")
        linear_base = importlib.import_module("vllm.model_executor.kernels.linear.mxfp4.base")
        quant_utils = importlib.import_module("vllm.model_executor.layers.quantization.utils.quant_utils")
        mxfp4_utils = importlib.import_module("vllm.model_executor.layers.quantization.utils.mxfp4_utils")
        qwen3_next = importlib.import_module("vllm.model_executor.models.qwen3_next")
    except Exception as exc:
        raise VllmUnavailable(
            f"vLLM is not importable ({type(exc).__name__}: {exc}); run scripts/install-vllm-cpu.sh"
        ) from exc
    return types.SimpleNamespace(
        ffm=ffm,
        b12x_moe=b12x_moe,
        fiu=fiu,
        NvFp4MoeBackend=nvfp4_oracle.NvFp4MoeBackend,
        global_input_scale=nvfp4_oracle.is_global_sf_supported_for_nvfp4_backend,
        MoEActivation=activation.MoEActivation,
        mxfp4_oracle=mxfp4_oracle,
        moe_utils=moe_utils,
        aiter_linear=aiter_linear,
        MxFp4LinearLayerConfig=linear_base.MxFp4LinearLayerConfig,
        kMxfp4Dynamic=quant_utils.kMxfp4Dynamic,
        mxfp4_utils=mxfp4_utils,
        qwen3_next=qwen3_next,
    )


def _call_name(node: ast.Call) -> str:
    """``f`` for ``f(...)`` and ``obj.f(...)``; empty for other callees."""
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


# --- nvfp4_moe: prepare_nvfp4_moe_layer_for_fi_or_cutlass ------------------------------------------


@contextlib.contextmanager
def _cuda_as_identity() -> Iterator[None]:
    """Make ``Tensor.cuda`` a no-op where there is no CUDA (vLLM's ``swizzle_blockscale`` ends with it)."""
    if torch.cuda.is_available():
        yield
        return
    with mock.patch.object(torch.Tensor, "cuda", lambda self, *args, **kwargs: self):
        yield


def _fake_layer(v: types.SimpleNamespace, gated: bool, hidden: int, intermediate: int) -> types.SimpleNamespace:
    act = v.MoEActivation.SILU if gated else v.MoEActivation.RELU2_NO_MUL
    config = types.SimpleNamespace(
        moe_parallel_config=types.SimpleNamespace(enable_eplb=False),
        hidden_dim=hidden,
        hidden_dim_unpadded=None,
        intermediate_size_per_partition=intermediate,
    )
    return types.SimpleNamespace(activation=act, moe_config=config)


VLLM_NVFP4_BACKENDS: dict[Nvfp4MoeBackend, tuple[str, bool]] = {
    Nvfp4MoeBackend.FLASHINFER_TRTLLM: ("FLASHINFER_TRTLLM", False),
    Nvfp4MoeBackend.FLASHINFER_CUTLASS: ("FLASHINFER_CUTLASS", False),
    Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN: ("FLASHINFER_TRTLLM", True),
    Nvfp4MoeBackend.FLASHINFER_CUTEDSL: ("FLASHINFER_CUTEDSL", False),
    Nvfp4MoeBackend.B12X: ("B12X", False),
    Nvfp4MoeBackend.VLLM_CUTLASS: ("VLLM_CUTLASS", False),
}
"""The suite's NVFP4 MoE backends as vLLM's ``NvFp4MoeBackend`` members and whether the layer's
activation scale is per-token (ModelOpt ``kNvfp4DynamicToken``: ``ModelOptNvFp4FusedMoE.per_token_activation``).
A backend without an entry raises ``KeyError``: the engine mapping is where a new backend is added."""


class VllmNvfp4MoeAlignment:
    """vLLM's NVFP4 MoE weight preparation per backend (:data:`VLLM_NVFP4_BACKENDS`), read back in the contract's form.

    * FLASHINFER_TRTLLM branch: vLLM pads the hidden size and aligns the intermediate size, then
      calls ``prepare_static_weights_for_trtllm_fp4_moe`` whose 128x4 interleave is a CUDA kernel.
      The adapter captures that call's inputs (the padded, not yet shuffled weights) and returns
      them; the suite's own properties then run FlashInfer's real shuffle helpers on them. The hidden
      alignment is chosen as ``ModelOptNvFp4FusedMoE.process_weights_after_loading`` chooses it:
      vLLM's ``trtllm_nvfp4_hidden_alignment(per_token_activation, is_act_and_mul)`` (512 for a
      per-token non-gated layer, else 256).
    * CUTLASS branch: ``swizzle_blockscale`` ends with ``.cuda()``; on a machine without CUDA the
      adapter makes ``Tensor.cuda`` the identity for the duration of the call, and reads the
      swizzled scales back with the reference inverse.
    * FLASHINFER_CUTEDSL: ``prepare_nvfp4_moe_layer_for_flashinfer_cutedsl`` (its own function, which swaps
      ``[w1; w3]`` itself, pads per half to 64 / 128 and the hidden size to 256, regroups gated FC1 rows
      into 64-row up/gate groups and swizzles the scales), under the same ``Tensor.cuda`` identity. The
      padded sizes are the ones it records in the layer's ``moe_config``; the adapter undoes the swizzle
      and the regrouping with the reference inverses (``unswizzle_128x4``, the inverse of
      ``grouped_gate_up_interleave``), so a misplaced row shows up as a padding-invariance failure.
    * B12X: ``prepare_nvfp4_moe_layer_for_b12x`` (``quantization/utils/b12x_moe.py``) as
      ``convert_to_nvfp4_moe_kernel_format`` calls it for W4A4 (``reorder_w13=False``: b12x reads
      ``[w1; w3]``, its ``"w31"``), under the ``Tensor.cuda`` identity; the swizzled scales are read back
      with the reference inverse and the halves swapped back to ``[up; gate]``. Nothing of the ``b12x``
      library runs: vLLM pads and swizzles before b12x sees the weights.
    """

    def align_moe(self, backend: Nvfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        v = vllm_modules()
        e, h, i = weights.w13.shape[0], weights.hidden_size, weights.intermediate_size
        layer = _fake_layer(v, gated, h, i)
        ones = torch.ones(e)
        # vLLM holds [w1 = gate; w3 = up] and swaps to FlashInfer's [up; gate] itself. Its loader copies the
        # checkpoint into the layer's own parameters: every tensor handed over here is a copy, never the caller's.
        w13 = swap_halves(weights.w13).contiguous() if gated else weights.w13.clone()
        w13_scale = swap_halves(weights.w13_scale).contiguous() if gated else weights.w13_scale.clone()
        args = (
            layer, w13, w13_scale.view(torch.float8_e4m3fn), ones, ones, weights.w2.clone(),
            weights.w2_scale.clone().view(torch.float8_e4m3fn), ones, ones,
        )  # fmt: skip
        member, per_token = VLLM_NVFP4_BACKENDS[backend]
        branches = {
            "FLASHINFER_TRTLLM": lambda: self._trtllm(v, layer, args, gated, per_token),
            "FLASHINFER_CUTLASS": lambda: self._cutlass(v, backend, args, gated, h),
            "VLLM_CUTLASS": lambda: self._cutlass(v, backend, args, gated, h),
            "FLASHINFER_CUTEDSL": lambda: self._cutedsl(v, layer, args, gated),
            "B12X": lambda: self._b12x(v, args, gated, h),
        }
        return branches[member]()

    @staticmethod
    def _trtllm(
        v: types.SimpleNamespace, layer: types.SimpleNamespace, args: tuple, gated: bool, per_token: bool
    ) -> AlignedMoe:
        captured: dict[str, torch.Tensor] = {}
        alignment = v.fiu.trtllm_nvfp4_hidden_alignment(per_token_activation=per_token, is_act_and_mul=gated)

        def capture(w13, w2, w13_scale, w2_scale, **_: object):
            captured.update(w13=w13, w2=w2, w13_scale=w13_scale, w2_scale=w2_scale)
            return w13, w13_scale, w2, w2_scale

        with mock.patch.object(v.ffm, "prepare_static_weights_for_trtllm_fp4_moe", capture):
            v.ffm.prepare_nvfp4_moe_layer_for_fi_or_cutlass(
                v.NvFp4MoeBackend.FLASHINFER_TRTLLM, *args, is_act_and_mul=gated, trtllm_hidden_alignment=alignment
            )
        aligned = MoeWeights(
            w13=captured["w13"], w13_scale=captured["w13_scale"].view(torch.uint8),
            w2=captured["w2"], w2_scale=captured["w2_scale"].view(torch.uint8), block=16,
        )  # fmt: skip
        cfg = layer.moe_config
        return AlignedMoe(aligned, cfg.intermediate_size_per_partition, cfg.hidden_dim)

    @staticmethod
    def _cutlass(
        v: types.SimpleNamespace, backend: Nvfp4MoeBackend, args: tuple, gated: bool, hidden: int
    ) -> AlignedMoe:
        """vLLM's CUTLASS branch (FLASHINFER_CUTLASS, VLLM_CUTLASS) pads non-gated rows itself but leaves
        ``intermediate_size_per_partition`` unchanged. No consumer on that path reads it
        (``FlashInferExperts.apply`` hands the weights to ``cutlass_fused_moe``, ``run_cutlass_moe_fp4``
        and the modular kernel take N from ``w1.shape``), so the size the kernel sees, reported here, is
        read off the returned ``w2``. FC1 comes back in the order the backend's kernel reads (its record's
        ``fc1_layout``) and is turned into the contract's ``[up; gate]``."""
        member = VLLM_NVFP4_BACKENDS[backend][0]
        vllm_backend = v.NvFp4MoeBackend[member]
        if not v.global_input_scale(vllm_backend):  # per-expert [w1, w3] input scales, as ModelOpt loads them
            args = (*args[:4], torch.ones(args[4].shape[0], 2), *args[5:])
        try:
            with _cuda_as_identity():
                out = v.ffm.prepare_nvfp4_moe_layer_for_fi_or_cutlass(vllm_backend, *args, is_act_and_mul=gated)
        except NotImplementedError as exc:
            raise UnsupportedConfig(f"vLLM {member}: {exc.args}") from exc
        w13, w13_scale, _, _, w2, w2_scale, _, _ = (t.cpu() for t in out)
        rows, ip = w13.shape[1], 2 * w2.shape[2]
        w13_scale = unswizzle_128x4(w13_scale.view(torch.uint8), rows, hidden // 16).contiguous()
        if gated:
            source = record(backend).fc1_layout
            w13, w13_scale = (
                relayout_fc1(w13, source, Fc1Layout.UP_GATE),
                relayout_fc1(w13_scale, source, Fc1Layout.UP_GATE),
            )
        aligned = MoeWeights(
            w13=w13,
            w13_scale=w13_scale,
            w2=w2,
            w2_scale=unswizzle_128x4(w2_scale.view(torch.uint8), hidden, ip // 16).contiguous(),
            block=16,
        )
        return AlignedMoe(aligned, ip, hidden)

    @staticmethod
    def _cutedsl(v: types.SimpleNamespace, layer: types.SimpleNamespace, args: tuple, gated: bool) -> AlignedMoe:
        with _cuda_as_identity():  # args hold vLLM's [w1; w3]; the function swaps to [up; gate] itself
            out = v.ffm.prepare_nvfp4_moe_layer_for_flashinfer_cutedsl(*args)
        w13, w13_scale, _, _, w2, w2_scale, _, _ = (t.cpu() for t in out)
        cfg = layer.moe_config
        ip, hp, rows = cfg.intermediate_size_per_partition, cfg.hidden_dim, w13.shape[1]
        inverse = (
            inverse_permutation(grouped_gate_up_interleave(rows, cutedsl.FC1_GROUP)) if gated else torch.arange(rows)
        )
        aligned = MoeWeights(
            w13=w13[:, inverse],
            w13_scale=unswizzle_128x4(w13_scale.view(torch.uint8), rows, hp // 16)[:, inverse],
            w2=w2,
            w2_scale=unswizzle_128x4(w2_scale.view(torch.uint8), hp, ip // 16).contiguous(),
            block=16,
        )
        return AlignedMoe(aligned, ip, hp)

    @staticmethod
    def _b12x(v: types.SimpleNamespace, args: tuple, gated: bool, hidden: int) -> AlignedMoe:
        with _cuda_as_identity():  # args hold vLLM's [w1; w3], which b12x's W4A4 path keeps
            out = v.b12x_moe.prepare_nvfp4_moe_layer_for_b12x(*args[1:], is_act_and_mul=gated, reorder_w13=False)
        w13, w13_scale, _, _, w2, w2_scale, _, _ = (t.cpu() for t in out)
        rows, ip = w13.shape[1], 2 * w2.shape[2]
        w13_scale = unswizzle_128x4(w13_scale.view(torch.uint8), rows, hidden // 16).contiguous()
        aligned = MoeWeights(
            w13=swap_halves(w13) if gated else w13,
            w13_scale=swap_halves(w13_scale) if gated else w13_scale,
            w2=w2,
            w2_scale=unswizzle_128x4(w2_scale.view(torch.uint8), hidden, ip // 16).contiguous(),
            block=16,
        )
        return AlignedMoe(aligned, ip, hidden)


# --- mxfp4_linear: AiterMxfp4LinearKernel ----------------------------------------------------------

ASM_FLAG = "rocm_use_aiter_fp4_asm_gemm"
"""The parameter of vLLM's ``gemm_with_dynamic_quant`` that selects the ASM branch."""

QUANTIZER_ROUNDING: dict[str, MxScaleRounding] = {
    r.activation_quantizer: r.activation_rounding for r in records(MXFP4_LINEAR)
}
"""AITER's MXFP4 activation quantizers and their scale rounding, from the backend records
(:mod:`backends.mxfp4_linear`): the suite's knowledge of AITER. Which quantizer each path calls is
read from vLLM's source."""

_TUNED = types.SimpleNamespace(
    is_asm_fp4_gemm_tuned=lambda n, k_bytes: True,
    is_triton_gemm_afp4wfp4_presh_ws_tuned=lambda n, k_bytes: True,
)
"""Stands in for ``rocm_aiter_ops`` in the kernel module: every (N, K) is tuned, so only the scale-shape
guard decides (the suite does not model AITER's tuned-shape lists)."""


def _reference_shuffle_weight(weight: torch.Tensor, layout: tuple[int, int] = (16, 16)) -> torch.Tensor:
    """Stand-in for ``aiter.ops.shuffle.shuffle_weight``: the suite's ``reference.layouts.aiter_shuffle_weight``."""
    if tuple(layout) != (16, 16):
        raise VllmSourceMismatch(f"vLLM asks AITER's shuffle_weight for layout {layout}; the reference has (16, 16)")
    return aiter_shuffle_weight(weight)


@contextlib.contextmanager
def _aiter_shuffle_importable() -> Iterator[None]:
    """Make ``from aiter.ops.shuffle import shuffle_weight`` work: AITER's own function where amd-aiter is
    installed (loaded without ROCm by :func:`adapters.aiter_triton.install`), else stub modules holding
    :func:`_reference_shuffle_weight`."""
    try:
        aiter_triton.aiter_module(aiter_triton.SHUFFLE)
    except AiterUnavailable:
        pass
    else:
        yield
        return
    shuffle = types.ModuleType("aiter.ops.shuffle")
    shuffle.shuffle_weight = _reference_shuffle_weight
    ops = types.ModuleType("aiter.ops")
    ops.shuffle = shuffle
    aiter = types.ModuleType("aiter")
    aiter.ops = ops
    with mock.patch.dict(sys.modules, {"aiter": aiter, "aiter.ops": ops, "aiter.ops.shuffle": shuffle}):
        yield


def _branch_quantizer(stmts: list[ast.stmt], path: AiterLinearPath) -> str:
    """The one activation quantizer called in a branch of ``gemm_with_dynamic_quant``."""
    names = {_call_name(n) for s in stmts for n in ast.walk(s) if isinstance(n, ast.Call)}
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
        if isinstance(n, ast.Call) and _call_name(n) == "gemm_with_dynamic_quant"
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
        path = AiterLinearPath.ASM if kernel.use_asm_gemm else AiterLinearPath.TRITON
        return PreparedMxfp4Linear(path, layer.weight.detach(), layer.weight_scale.detach())

    def prepare_asm_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=True)

    def prepare_triton_linear(self, weight: torch.Tensor, scale: torch.Tensor) -> PreparedMxfp4Linear:
        return self.process_mxfp4_linear_weights(weight, scale, asm_enabled=False)

    def linear_activation_rounding(self, path: AiterLinearPath) -> MxScaleRounding:
        return QUANTIZER_ROUNDING[linear_path_quantizers()[path]]


# --- shared_expert: Qwen3NextSparseMoeBlock ----------------------------------------------------------

FSE_RESOLVER = "resolve_layer_fused_shared_expert"
REPLICATE_GATE = "_should_replicate_misaligned_shared_expert"


def call_order_problem(init_source: str) -> str | None:
    """Why ``init_source`` (``Qwen3NextSparseMoeBlock.__init__``) does not resolve fusion before the
    replicate gate: a missing call, or the first ``_should_replicate_misaligned_shared_expert`` call
    before the first ``resolve_layer_fused_shared_expert`` call. None when the order is vLLM's fixed one."""
    lines: dict[str, int] = {}
    for node in ast.walk(ast.parse(textwrap.dedent(init_source))):
        if isinstance(node, ast.Call) and _call_name(node) in (FSE_RESOLVER, REPLICATE_GATE):
            name = _call_name(node)
            lines[name] = min(lines.get(name, node.lineno), node.lineno)
    missing = [n for n in (FSE_RESOLVER, REPLICATE_GATE) if n not in lines]
    if missing:
        return f"Qwen3NextSparseMoeBlock.__init__ no longer calls {', '.join(missing)}"
    if lines[FSE_RESOLVER] > lines[REPLICATE_GATE]:
        return (
            f"Qwen3NextSparseMoeBlock.__init__ calls {REPLICATE_GATE} (line {lines[REPLICATE_GATE]}) before "
            f"{FSE_RESOLVER} (line {lines[FSE_RESOLVER]}): the pre-#55213 order, where an FSE-capable shared "
            "expert is replicated or refused"
        )
    return None


@functools.cache
def fse_order_problem() -> str | None:
    """:func:`call_order_problem` on the installed ``Qwen3NextSparseMoeBlock.__init__``.

    The composition is inlined in the model's constructor (it needs distributed groups and a
    ``VllmConfig``), so the adapter composes the two functions itself and checks the order here.
    """
    return call_order_problem(inspect.getsource(vllm_modules().qwen3_next.Qwen3NextSparseMoeBlock.__init__))


class VllmQwen3NextSharedExpert(VllmAiterMxfp4Linear):
    """``Qwen3NextSparseMoeBlock.__init__``'s shared-expert decision, from vLLM's two functions.

    ``fused = resolve_layer_fused_shared_expert(None, prefix, shared_expert_name="shared_expert")``
    (only when ``I > 0``), then ``replicate = False if fused else
    _should_replicate_misaligned_shared_expert(I, tp, group, ep, sp)``, the model's order, which
    :func:`fse_order_problem` checks against the constructor's source (a mismatch raises
    :class:`VllmSourceMismatch`). Patched for the call: ``fused_moe.utils.rocm_aiter_ops`` reports
    the setup's FSE switch (AITER's ``is_fusion_moe_shared_experts_enabled``), and
    ``is_shared_expert_quant_fse_compatible`` the setup's quantization compatibility (vLLM derives
    it from a Quark config; the setup's ``group`` replaces ``get_quark_ocp_mx_group_size`` likewise).
    vLLM's ``ValueError`` becomes :class:`SharedExpertRefused`. The class is also the linear policy
    (vLLM's AITER guard), so the dense shared expert is tested with vLLM's own guard.
    """

    PREFIX = "model.layers.0.mlp"

    def shared_expert_placement(self, setup: SharedExpertSetup) -> SharedExpertPlacement:
        problem = fse_order_problem()
        if problem is not None:
            raise VllmSourceMismatch(problem)
        v = vllm_modules()
        try:
            fused = setup.intermediate > 0 and self._resolve_fused(v, setup)
            replicate = False if fused else v.qwen3_next._should_replicate_misaligned_shared_expert(
                setup.intermediate, setup.tp, setup.group, setup.expert_parallel, setup.sequence_parallel
            )  # fmt: skip
        except ValueError as exc:
            raise SharedExpertRefused(str(exc)) from exc
        if setup.intermediate <= 0:
            return SharedExpertPlacement.ABSENT
        if fused:
            return SharedExpertPlacement.FUSED
        return SharedExpertPlacement.REPLICATED if replicate else SharedExpertPlacement.SHARDED

    def _resolve_fused(self, v: types.SimpleNamespace, setup: SharedExpertSetup) -> bool:
        aiter_ops = types.SimpleNamespace(is_fusion_moe_shared_experts_enabled=lambda: setup.fse_enabled)
        reason = None if setup.fse_quant_compatible else "shared-expert quantization differs from the routed experts'"

        def compatible(*_: object, **__: object) -> tuple[bool, str | None]:
            return setup.fse_quant_compatible, reason

        with (
            mock.patch.object(v.moe_utils, "rocm_aiter_ops", aiter_ops),
            mock.patch.object(v.moe_utils, "is_shared_expert_quant_fse_compatible", compatible),
        ):
            return bool(
                v.moe_utils.resolve_layer_fused_shared_expert(None, self.PREFIX, shared_expert_name="shared_expert")
            )


# --- mxfp4_moe: mxfp4_round_up_hidden_size_and_intermediate_size -----------------------------------

VLLM_MXFP4_BACKENDS = {
    Mxfp4MoeBackend.FLASHINFER_TRTLLM: "FLASHINFER_TRTLLM_MXFP4_BF16",  # same rounding as _MXFP8 (TRTLLM_BACKENDS)
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90: "FLASHINFER_CUTLASS_MXFP4_BF16",
    # Quark OCP-MX W4A4: e8m0_shuffle + shuffle_weights, the layout the suite's AITER backend models
    # (AITER_MXFP4_BF16 is the a16w4 path with shuffle_weight_a16w4, another layout)
    Mxfp4MoeBackend.AITER: "AITER_MXFP4_MXFP4",
    Mxfp4MoeBackend.MARLIN: "MARLIN",
    Mxfp4MoeBackend.VLLM_CUTLASS: "CUTLASS_MXFP4_MXFP4",  # DEEPGEMM_MXFP4 rounds alike (tests/test_vllm_subject.py)
    Mxfp4MoeBackend.B12X: "B12X_MXFP4_BF16",
    Mxfp4MoeBackend.TRITON_SM90: "TRITON",  # on CUDA; TRITON_UNFUSED rounds alike there
    # GptOssMxfp4MoEMethod's call (no activation): 256; Mxfp4MoEMethod passes SiLU and gets 128
    Mxfp4MoeBackend.AITER_A16W4: "AITER_MXFP4_BF16",
    Mxfp4MoeBackend.FLASHINFER_MOE_EP: "FLASHINFER_MOE_EP_DEEP_GEMM",  # the model's sizes, unrounded
}
"""The suite's MXFP4 MoE backends as vLLM's ``Mxfp4MoeBackend`` members."""

ROCM_BACKENDS = (Mxfp4MoeBackend.AITER, Mxfp4MoeBackend.AITER_A16W4)
"""Backends whose rounding vLLM decides under ``current_platform.is_rocm()`` (:func:`rocm_platform`)."""

CDNA4 = 4
"""gfx950 (MI350x / MI355x), the suite's AITER target, is CDNA 4."""


@contextlib.contextmanager
def rocm_platform(v: types.SimpleNamespace) -> Iterator[None]:
    """A ROCm CDNA4 platform for the oracle: its ``current_platform`` answers ``is_rocm()``, and
    ``vllm.platforms.rocm`` (which queries the GPU at import) is a stub with ``get_cdna_version() = 4``.
    Nothing is patched where the platform already is ROCm."""
    if v.mxfp4_oracle.current_platform.is_rocm():
        yield
        return
    platform = types.SimpleNamespace(is_rocm=lambda: True, is_xpu=lambda: False)
    rocm = types.ModuleType("vllm.platforms.rocm")
    rocm.get_cdna_version = lambda: CDNA4
    with (
        mock.patch.object(v.mxfp4_oracle, "current_platform", platform),
        mock.patch.dict(sys.modules, {"vllm.platforms.rocm": rocm}),
    ):
        yield


@contextlib.contextmanager
def _hopper_triton_kernels(v: types.SimpleNamespace) -> Iterator[list[torch.Tensor]]:
    """Run vLLM's triton_kernels preparation as on an SM90 GPU, recording what it hands ``convert_layout``.

    ``current_platform`` (in ``mxfp4_utils``) is CUDA capability 9.0 with torch >= 2.8.1 (its swizzled
    branch), triton_kernels 3.5.1 is present; the triton_kernels modules vLLM imports are
    ``adapters.triton_kernels.recorded_hand_over``'s stand-ins, which record what ``convert_layout`` is handed
    (the yielded list), and the oracle's ``PrecisionConfig`` / ``FlexCtx`` are inert.
    """
    sm90 = types.SimpleNamespace(
        is_cuda=lambda: True,
        is_rocm=lambda: False,
        is_device_capability=lambda capability: capability == 90,
        is_device_capability_family=lambda capability: False,
    )
    utils, oracle = v.mxfp4_utils, v.mxfp4_oracle
    with (
        triton_kernels.recorded_hand_over() as handed,
        mock.patch.object(utils, "current_platform", sm90),
        mock.patch.object(utils, "has_triton_kernels", lambda: True),
        mock.patch.object(utils, "get_triton_kernels_version", lambda: "3.5.1"),
        mock.patch.object(utils, "is_torch_equal_or_newer", lambda version: True),
        mock.patch.object(utils, "should_use_gfx1250_mx_scale_swizzle", lambda: False),
        mock.patch.object(oracle, "PrecisionConfig", lambda **kwargs: None, create=True),
        mock.patch.object(oracle, "FlexCtx", lambda **kwargs: None, create=True),
        mock.patch.object(oracle, "_mx_scale_kwargs", lambda scale: {}),
    ):
        yield handed


def hopper_scale_groups(v: types.SimpleNamespace, scale: torch.Tensor) -> int:
    """Scale groups along K that vLLM's ``_swizzle_mxfp4`` hands triton_kernels on an SM90 GPU
    (:func:`_hopper_triton_kernels`), for one GEMM's ``scale [E, N, K/32]``. vLLM PR #47910 (in 0.33.0)
    pads them to a multiple of 4 there; without it they stay ``K/32``."""
    e, n, groups = scale.shape
    with _hopper_triton_kernels(v) as handed:
        v.mxfp4_utils._swizzle_mxfp4(torch.zeros(e, n, groups * 16, dtype=torch.uint8), scale)
    if len(handed) != 2 or handed[1].shape[0] != e or handed[1].shape[-1] != n:
        raise VllmSourceMismatch(
            f"_swizzle_mxfp4 no longer hands convert_layout the weights then the [E, K/32, N] scales: {handed}"
        )
    return handed[1].shape[1]


def triton_kernel_format(v: types.SimpleNamespace, weights: MoeWeights) -> MoeWeights:
    """The experts vLLM's ``TRITON`` conversion hands triton_kernels (:func:`_hopper_triton_kernels`), back in
    the contract's orientation: ``convert_gpt_oss_weight_to_mxfp4_moe_kernel_format`` for gpt-oss's
    row-interleaved checkpoints (``GptOssMxfp4MoEMethod``), ``convert_weight_to_mxfp4_moe_kernel_format`` for
    stacked ones (``Mxfp4MoEMethod``). ``weights`` are the loader's padded buffers; the scales come back with
    the groups vLLM added (zero bytes), the weights are zero-padded to match them, and FC1 rows are labelled
    with the order triton_kernels' ``swiglu`` reads (gate/up pairs)."""
    oracle = v.mxfp4_oracle
    layer = torch.nn.Module()
    tensors = {"w13_weight": weights.w13, "w2_weight": weights.w2,
               "w13_weight_scale": weights.w13_scale, "w2_weight_scale": weights.w2_scale}  # fmt: skip
    for name, t in tensors.items():
        layer.register_parameter(name, torch.nn.Parameter(t.clone(), requires_grad=False))
    args = (layer.w13_weight, layer.w2_weight, layer.w13_weight_scale, layer.w2_weight_scale)
    biases = tuple(None if b is None else b.clone() for b in (weights.w13_bias, weights.w2_bias))
    convert = (
        oracle.convert_gpt_oss_weight_to_mxfp4_moe_kernel_format
        if weights.fc1_layout is Fc1Layout.GATE_UP_INTERLEAVED
        else oracle.convert_weight_to_mxfp4_moe_kernel_format
    )
    with _hopper_triton_kernels(v) as handed:
        out = convert(oracle.Mxfp4MoeBackend.TRITON, layer, *args, *biases)
    if len(handed) != 4:
        raise VllmSourceMismatch(f"vLLM's TRITON conversion handed triton_kernels {len(handed)} tensors, not 4")
    return triton_kernels.handed_weights(handed, *out[4:6])


class VllmMxfp4MoeAlignment(BuiltinMxfp4MoeAlignment):
    """Sizes from vLLM's ``mxfp4_round_up_hidden_size_and_intermediate_size`` (``fused_moe/oracle/mxfp4.py``),
    for the vLLM backend :data:`VLLM_MXFP4_BACKENDS` names; the AITER ones under a patched ROCm CDNA4
    platform (:func:`rocm_platform`), called without ``activation`` as Quark's and gpt-oss's
    ``maybe_roundup_sizes`` do.

    ``triton-kernels-sm90``: vLLM keeps its rounded sizes and zero-pads only the scale groups along K
    (:func:`hopper_scale_groups`, vLLM PR #47910); where the weights' K has an even number of 32-groups that
    equals weights and scales zero-padded to ``32 × groups`` along K for the kernel, otherwise K stays the
    weights' (:func:`adapters.triton_kernels.contract_k`), the sizes reported here (FC1's K is ``H``, FC2's
    is ``I``).

    Only the sizes are vLLM's: the zero padding per gate/up half and the FC1 row order are the built-in
    policy's (``contracts.moe.pad_moe``, ``reference.padding``), since vLLM places weights in the padded
    buffers through its weight loader, which needs a whole model.
    """

    def align_moe(self, backend: Mxfp4MoeBackend, weights: MoeWeights, gated: bool) -> AlignedMoe:
        if backend is not Mxfp4MoeBackend.TRITON_SM90:
            return super().align_moe(backend, weights, gated)
        ip, hp = self.oracle_sizes(backend, weights)
        loaded = pad_moe(weights, gated, ip, hp).weights  # the loader's buffers (placement: the suite's)
        w = triton_kernel_format(vllm_modules(), loaded)
        return AlignedMoe(w, w.intermediate_size, w.hidden_size)

    def sizes(self, backend: Mxfp4MoeBackend, weights: MoeWeights) -> tuple[int, int]:
        ip, hp = self.oracle_sizes(backend, weights)
        if backend is Mxfp4MoeBackend.TRITON_SM90:
            e = weights.w13.shape[0]
            v = vllm_modules()
            fc1 = hopper_scale_groups(v, torch.zeros(e, 2 * ip, hp // 32, dtype=torch.uint8))
            fc2 = hopper_scale_groups(v, torch.zeros(e, hp, ip // 32, dtype=torch.uint8))
            hp, ip = triton_kernels.contract_k(hp, fc1), triton_kernels.contract_k(ip, fc2)
        return ip, hp

    def oracle_sizes(self, backend: Mxfp4MoeBackend, weights: MoeWeights) -> tuple[int, int]:
        """``(Ip, Hp)`` from ``mxfp4_round_up_hidden_size_and_intermediate_size`` for ``backend``."""
        v = vllm_modules()
        member = v.mxfp4_oracle.Mxfp4MoeBackend[VLLM_MXFP4_BACKENDS[backend]]
        platform = rocm_platform(v) if backend in ROCM_BACKENDS else contextlib.nullcontext()
        with platform:
            hidden, intermediate = v.mxfp4_oracle.mxfp4_round_up_hidden_size_and_intermediate_size(
                member, weights.hidden_size, weights.intermediate_size
            )
        return intermediate, hidden


# --- known upstream bugs -----------------------------------------------------------------------------


def _asm_force_triton_rows(case: Any) -> bool:
    """A 2-D scale (``ScaleShapeCase``) the layout guard accepts that a required ASM defect record covers
    (the 96-row rule of vLLM PR #58139)."""
    shape = tuple(case.shape)
    defects = covering(AITER_LINEAR_DEFECTS, AiterLinearPath.ASM.value, shape)
    return len(shape) == 2 and shape[1] % 8 == 0 and any(d.required for d in defects)


def _aiter_w4a4_inter_not_256(config: Any) -> bool:
    """vLLM 0.33.0 rounds the AITER W4A4 intermediate (``Mxfp4MoeConfig``) to 128; the result is not a multiple of 256."""
    return round_up(config.shape.intermediate, 128) % 256 != 0


def _marlin_hidden_over_128(config: Any) -> bool:
    """vLLM rounds Marlin's hidden size to 256 where ``check_moe_marlin_supports_layer`` needs only 128."""
    h = config.shape.hidden
    return round_up(h, 256) != round_up(h, 128)


def _marlin_inter_over_128(config: Any) -> bool:
    """vLLM rounds Marlin's intermediate (``Mxfp4MoeConfig``) to 128 where ``ru(I, 64)`` is smaller."""
    i = config.shape.intermediate
    return round_up(i, 128) != round_up(i, 64)


def _moe_ep_hidden_not_128(config: Any) -> bool:
    """vLLM hands the MoE-EP megakernel the model's hidden size (``Mxfp4MoeConfig``); not a multiple of 128."""
    return config.shape.hidden % 128 != 0


def _triton_stacked(config: Any, odd_groups: bool) -> bool:
    """A stacked ``[gate; up]`` checkpoint (``Mxfp4MoeConfig``) whose hidden size has an odd (``odd_groups``)
    or even number of 32-element groups: vLLM's TRITON conversion splits that last dim of the FC1 scales in
    half."""
    return config.form.value == "stacked" and (config.shape.hidden // 32) % 2 == int(odd_groups)


TRITON_STACKED = (
    "convert_weight_to_mxfp4_moe_kernel_format (TRITON, stacked [w1; w3] checkpoints of Mxfp4MoEMethod) "
    "interleaves the two halves of the last dim of w13 [E, 2I, H/2] and of its scales [E, 2I, H/32] (its "
    "shuffle_weight, right for the bias [E, 2I] only): gate and up rows stay stacked while triton_kernels' swiglu "
    "reads pairs, and K is permuted, bytes and scale groups differently; an odd H/32 makes torch.stack raise. "
    "gpt-oss checkpoints take the other converter and pass; found by this suite, not reported upstream"
)
TRITON_SOURCE = "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/model_executor/layers/fused_moe/oracle/mxfp4.py"
MXFP4_ORACLE = "vllm.model_executor.layers.fused_moe.oracle.mxfp4"
"""The module of vLLM's MXFP4 MoE weight conversion (ledger entries' ``raised_in``)."""

AITER_5233 = (
    "vLLM 0.33.0's oracle rounds the AITER W4A4 (AITER_MXFP4_MXFP4) intermediate size to 128 (the change of vLLM "
    "PR #55104, which its author marks as silently corrupting decode output until AITER PR #5232 lands): AITER's "
    "CK-Tile stage 2 mis-indexes E8M0 scales unless inter_dim % 256 == 0 (MiniMax-M3 TP8, I = 384), and "
    "e8m0_shuffle pads scales whose K/32 is not a multiple of 8"
)

VLLM_KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        NVFP4_MOE,
        "FLASHINFER_CUTLASS raises NotImplementedError for gated layers with 2I % 128 != 0 "
        "instead of padding each half (Qwen3.8-Flash-Next TP=4, Gemma-4 TP=2/4); open fixes: PRs #57351, #48624",
        "https://github.com/vllm-project/vllm/issues/57125",
        applies=lambda shape: shape.gated and (2 * shape.intermediate) % 128 != 0,
        raises=AssertionError,
        match=r"policy refused a shape real models produce .*vLLM FLASHINFER_CUTLASS: .*Intermediate size padding "
        r"for w1 and w3",
        backend=Nvfp4MoeBackend.FLASHINFER_CUTLASS.value,
    ),
    KnownFailure(
        NVFP4_MOE,
        "VLLM_CUTLASS shares FLASHINFER_CUTLASS's preparation: NotImplementedError for gated layers with "
        "2I % 128 != 0 instead of padding each half; open fix: PR #48624 (names the VLLM_CUTLASS path)",
        "https://github.com/vllm-project/vllm/pull/48624",
        applies=lambda shape: shape.gated and (2 * shape.intermediate) % 128 != 0,
        raises=AssertionError,
        match=r"policy refused a shape real models produce .*vLLM VLLM_CUTLASS: .*Intermediate size padding "
        r"for w1 and w3",
        backend=Nvfp4MoeBackend.VLLM_CUTLASS.value,
    ),
    KnownFailure(
        NVFP4_MOE,
        "VLLM_CUTLASS leaves the hidden size unpadded while swizzle_blockscale pads FC2's scale rows to 128: "
        "cutlass_fp4_moe_mm strides experts' scales by the logical N x K/16, so every expert after the first "
        "reads wrong scales (hidden 2880: garbage output); fix PR #35497 closed unmerged",
        "https://github.com/vllm-project/vllm/pull/35497",
        applies=lambda shape: shape.hidden % 128 != 0,
        raises=AssertionError,
        match=r"vllm-cutlass rejects .*FC2 scales: the kernel strides experts",
        backend=Nvfp4MoeBackend.VLLM_CUTLASS.value,
        check="check_backend_accepts",
    ),
    KnownFailure(
        MXFP4_LINEAR,
        "_asm_fp4_scale_swizzle_supported keeps 96-row scales (Qwen3.8 TP1 GDN in_proj_ba, (96, 160)) on the ASM "
        "GEMM, numerically wrong at M <= 64; open fix: PR #58139 (not in 0.33.0)",
        "https://github.com/vllm-project/vllm/pull/58139",
        applies=_asm_force_triton_rows,
        raises=AssertionError,
        match=r"guard sends scale \(96, \d+\) to the ASM GEMM, which a documented defect covers: ASM gemm_a4w4 is "
        r"numerically wrong for 96-row",
        check="check_asm_guard_truth_table",
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            AITER_5233,
            "https://github.com/ROCm/aiter/issues/5233",
            applies=_aiter_w4a4_inter_not_256,
            raises=AssertionError,
            match=match,
            backend=Mxfp4MoeBackend.AITER.value,
            check=check,
        )
        for check, match in (
            ("check_backend_accepts", r"inter_dim \d+ % 256 != 0: CK-Tile stage 2 mis-indexes E8M0 scales"),
            ("check_aiter_shuffle_round_trip", r"w(13|2)_scale \[.*\]: e8m0_shuffle pads"),
        )
    ),
    KnownFailure(
        MXFP4_MOE,
        "Marlin MXFP4 MoE intermediate rounded to 128 instead of ru(I, lcm(64, 32)) (DeepSeek-V4.1-Flash TP8: "
        "288 -> 384, not 320; 7.8 GiB per GPU); open fix: PR #56697",
        "https://github.com/vllm-project/vllm/pull/56697",
        applies=_marlin_inter_over_128,
        raises=AssertionError,
        match=r"over-padding: I \d+ was padded to \d+, but \d+ is accepted",
        backend=Mxfp4MoeBackend.MARLIN.value,
        check="check_minimal_and_idempotent",
    ),
    KnownFailure(
        MXFP4_MOE,
        "Marlin MXFP4 MoE hidden size rounded to 256 where Marlin needs 128 (gpt-oss H = 2880 -> 3072, not 2944); "
        "found by this suite, not reported upstream; PR #56697 (the Marlin over-padding fix) keeps H at 256",
        "https://github.com/vllm-project/vllm/pull/56697",
        applies=_marlin_hidden_over_128,
        raises=AssertionError,
        match=r"over-padding: H \d+ was padded to \d+, but \d+ is accepted",
        backend=Mxfp4MoeBackend.MARLIN.value,
        check="check_minimal_and_idempotent",
    ),
    KnownFailure(
        MXFP4_MOE,
        TRITON_STACKED,
        TRITON_SOURCE,
        applies=lambda config: _triton_stacked(config, odd_groups=True),
        raises=RuntimeError,
        match=r"stack expects each tensor to be equal size",
        backend=Mxfp4MoeBackend.TRITON_SM90.value,
        raised_in=(f"{MXFP4_ORACLE}:convert_weight_to_mxfp4_moe_kernel_format.<locals>.shuffle_weight",),
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "TRITON on SM90 keeps the hidden size (mxfp4_round_up_hidden_size_and_intermediate_size rounds only I, to 64) "
            "and _swizzle_mxfp4 zero-pads only the scale groups: with H % 64 == 32 FC1's K holds an odd number of "
            "32-element groups, which triton_kernels' Hopper matmul_ogs computes wrongly without an error whatever the "
            "scale padding (measured on an H200: backends/truth/triton-kernels-sm90.sm90.json); found by this suite, not "
            "reported upstream",
            TRITON_SOURCE,
            applies=lambda config: triton_kernels.odd_groups(config.shape.hidden),
            raises=AssertionError,
            match=match,
            backend=Mxfp4MoeBackend.TRITON_SM90.value,
            check=check,
        )
        for check, match in TRITON_ODD_GROUP_FAILURES
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            TRITON_STACKED,
            TRITON_SOURCE,
            applies=lambda config: _triton_stacked(config, odd_groups=False),
            raises=AssertionError,
            match=match,
            backend=Mxfp4MoeBackend.TRITON_SM90.value,
            check=check,
        )
        for check, match in (
            ("check_gate_up_layout", r"w13 gate rows as triton-kernels-sm90 reads them .*block moved or changed"),
            ("check_padding_invariance", r"padding changed the MoE output \(triton-kernels-sm90 reads FC1 rows"),
        )
    ),
    KnownFailure(
        MXFP4_MOE,
        "FLASHINFER_MOE_EP_DEEP_GEMM: mxfp4_round_up_hidden_size_and_intermediate_size returns the model's sizes "
        "('the megakernel ... validates them itself'), and FlashInfer's DeepGEMM staging raises for H % 128 != 0; "
        "latent: vLLM selects this backend only with DeepSeek-V4 routing, whose hidden sizes are multiples of "
        "128; found by this suite, not reported upstream",
        "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/model_executor/layers/fused_moe/oracle/mxfp4.py",
        applies=_moe_ep_hidden_not_128,
        raises=AssertionError,
        match=r"hidden size \d+ % 128 != 0: FlashInfer MoE-EP DeepGEMM staging raises",
        backend=Mxfp4MoeBackend.FLASHINFER_MOE_EP.value,
        check="check_backend_accepts",
    ),
)

VLLM_GROUP_CUT = (
    "RoutedExperts.weight_loader narrows each per-projection checkpoint tensor by its own size / tp: weights "
    "at r·I/tp, block scales at r·floor(I/(g·tp)) groups, so an even split with (I/tp) % g != 0 cuts scale groups "
    "and pairs later ranks' channels with the wrong scales (ModelOpt NVFP4: Nemotron-3-Nano I = 1856 at TP8, "
    "Gemma-4-26B-A4B I = 704 at TP8; the same generic path loads Quark OCP-MX MXFP4 experts); open fix: PR #49951"
)

VLLM_SHARDING_FAILURES: tuple[KnownFailure, ...] = (
    *(
        KnownFailure(
            MOE_SHARDING,
            VLLM_GROUP_CUT,
            "https://github.com/vllm-project/vllm/issues/49949",
            applies=cuts_groups_per_projection,
            raises=AssertionError,
            match=match,
            check=check,
        )
        for check, match in (
            ("check_every_element_on_one_rank", r"which cut a \d+-element scale group"),
            # a buffer of I/tp channels (ModelOpt NVFP4), or one the MXFP4 backend rounds to whole groups (Quark)
            (
                "check_ranks_sum_to_layer",
                r"is not a whole number of \d+-element groups|which cut a \d+-element scale group",
            ),
        )
    ),
    KnownFailure(
        MOE_SHARDING,
        "gpt-oss MXFP4 under EP with E % ep != 0: GptOssModel.load_weights slices E // ep experts from "
        "ep_rank·(E // ep) per rank, while the layer (determine_expert_map) holds E // ep + 1 on the first E % ep "
        "ranks; the loader's copy into w13_weight[:, :N, :K] broadcasts one expert over two slots (its neighbour is "
        "lost) or fails on an empty slice (E < ep). Latent for gpt-oss's 32 / 128 experts at EP 2, 4, 8, 16; "
        "reached where EP does not divide them (DP 3 x TP 2 with EP: 128 experts over 6 ranks); open fix: "
        "PR #51130 ('uneven expert counts')",
        "https://github.com/vllm-project/vllm/pull/51130",
        applies=gpt_oss_uneven_experts,
        raises=AssertionError,
        # a rank whose two slots hold one expert, and the neighbour no rank holds
        match=r"expert \d+ on EP ranks|experts \[[\d, ]+\] are on no EP rank|claims experts \[(?:\d+, )*(\d+), \1\b",
    ),
    KnownFailure(
        MOE_SHARDING,
        "gpt-oss MXFP4 under EP with more EP ranks than experts: GptOssModel.load_weights' slice of E // ep = 0 "
        "experts cannot fill the layer's slot (the PR #51130 entry above)",
        "https://github.com/vllm-project/vllm/pull/51130",
        applies=gpt_oss_uneven_experts,
        raises=RuntimeError,
        match=r"output with shape \[[\d, ]+\] doesn't match the broadcast shape",
        raised_in=("vllm.model_executor.models.gpt_oss:GptOssModel._load_weights_mxfp4",),
    ),
)

_SHARED_AND_LINEAR = VllmQwen3NextSharedExpert()

register_subject(
    Subject(
        "vllm",
        "vLLM's real alignment, fallback and placement functions (scripts/install-vllm-cpu.sh)",
        {
            NVFP4_MOE: VllmNvfp4MoeAlignment(),
            MXFP4_LINEAR: _SHARED_AND_LINEAR,
            SHARED_EXPERT: _SHARED_AND_LINEAR,
            MXFP4_MOE: VllmMxfp4MoeAlignment(),
            MOE_SHARDING: VllmMoeSharding(),
        },
        known_failures=VLLM_KNOWN_FAILURES + VLLM_SHARDING_FAILURES,
        missing=vllm_missing,
    )
)
