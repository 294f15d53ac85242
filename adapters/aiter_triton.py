"""AITER's own code without ROCm: its pure-torch helpers on any machine, its Triton kernels on NVIDIA.

"AITER Triton on CUDA" (:data:`LABEL`) is a portability mode, separate from the gfx950 paths of
:mod:`adapters.aiter` (ASM ``gemm_a4w4``, CK ``fused_moe``), which stay gated on gfx950. Triton
kernels are source, so AITER's MXFP4 quantizer, its FP4 GEMM and its MXFP4 MoE kernel compile for
an NVIDIA GPU too: ``tl.dot_scaled(..., "e2m1", ..., "e2m1")`` is lowered natively on gfx950 and
decomposed (E2M1 x 2^scale upcast to bf16, bf16 MMA, fp32 accumulation) on sm_90.

Loading (:func:`aiter_module`). ``import aiter`` runs ``aiter/__init__.py``, which loads HIP
extensions and raises ``RuntimeError: ROCm version file not found`` without ROCm
(``aiter/jit/utils/cpp_extension.py``). Where that happens, the installed package's own files are
imported under stand-in parents instead: ``aiter``, ``aiter.jit`` and ``aiter.jit.utils`` become
empty packages whose ``__path__`` is the installed folder, so ``aiter.ops.triton.quant`` and the
rest run their own code and nothing of ``aiter/__init__.py``; ``aiter.jit.utils.chip_info`` becomes
a module whose ``get_gfx()`` names no AMD chip (``aiter.utility.dtypes`` reads it only to pick
its fp8 dtype). The stand-ins are installed once per process, and only where the real package
cannot be imported: on ROCm, AITER is imported as it is.

On CUDA (:func:`require_cuda`) these facts of AITER's wrappers are bridged, nothing else:

* ``arch_info.is_fp4_avail()`` answers True (the wrappers assert it; upstream it is true on
  gfx950 and gfx1250 only), and ``arch_info.get_arch()`` names the GPU as a string (``"sm90"``):
  Triton reports an int on CUDA, and AITER's ``get_arch() in ("gfx950")`` tests, run when
  ``aiter.ops.triton.utils.types`` is imported, need a string;
* AMD-only launch options (:data:`AMD_LAUNCH_OPTIONS`; ``dynamic_mxfp4_quant`` passes
  ``waves_per_eu=0``) are dropped at launch, since Triton's CUDA backend rejects them, and every
  GEMM gets an explicit tile config (:func:`gemm_config`, :data:`MOE_CONFIG`): AITER ships
  MI350X-tuned configs only;
* ``gemm_afp4wfp4`` gets its scales in buffers whose columns past ``K/32`` hold ``oob_scale_fill``
  (:func:`gemm_afp4wfp4`): amd-aiter 0.1.7 loads the scales of a partial last K tile unmasked
  (AITER issue #2656, fixed by PR #2671 on 2026-04-10, which masks them to 127), so without the
  padding they come from whatever memory follows the tensors, and a 0xFF byte (E8M0 NaN) turns
  the zero-masked data into NaN.

Versions: the module paths of amd-aiter 0.1.7.post2.dev18 (PyPI, 2025-11) and of ROCm/aiter main
(``aiter/ops/triton/{gemm/basic,moe,quant}/``) are both tried; only the former ran on CUDA here.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import torch

from adapters.calls import launch, planned
from contracts.errors import LibraryUnavailable


class AiterUnavailable(LibraryUnavailable):
    """AITER, ROCm or a gfx950 GPU is missing."""


LABEL = "AITER Triton on CUDA"
"""How the summary, skip reasons and the README name this mode."""

QUANT = ("aiter.ops.triton.quant", "aiter.ops.triton.quant.quant")
GEMM = ("aiter.ops.triton.gemm.basic.gemm_afp4wfp4", "aiter.ops.triton.gemm_afp4wfp4")
MOE = ("aiter.ops.triton.moe.moe_op_mxfp4", "aiter.ops.triton.moe_op_mxfp4")
MOE_ALIGN = ("aiter.ops.triton.moe.moe_align_block_size", "aiter.ops.triton.moe_align_block_size")
MOE_FP8 = ("aiter.ops.triton.moe.moe_op", "aiter.ops.triton.moe_op")
ARCH_INFO = ("aiter.ops.triton.utils._triton.arch_info",)
SHUFFLE = ("aiter.ops.shuffle",)
FP4_UTILS = ("aiter.utility.fp4_utils",)
"""Module paths per AITER release: amd-aiter 0.1.7 keeps the Triton ops flat, AITER main in folders."""

_STANDIN_PACKAGES = ("aiter", "aiter.jit", "aiter.jit.utils")
_STANDIN_CHIP_INFO = "aiter.jit.utils.chip_info"


@dataclass(frozen=True)
class AiterInstall:
    """Where AITER's files are and how they are imported (``native`` on ROCm, else ``stand-in``)."""

    root: Path
    version: str
    mode: str


def _version(root: Path) -> str:
    try:
        return importlib.metadata.version("amd-aiter")
    except importlib.metadata.PackageNotFoundError:
        pass
    text = (root / "_version.py").read_text() if (root / "_version.py").exists() else ""
    return text.split("=")[-1].strip().strip("'\"") or "unknown"


def _install_standins(root: Path) -> None:
    """Register the stand-in parent packages and ``chip_info`` (idempotent)."""
    for name in _STANDIN_PACKAGES:
        if name in sys.modules:
            continue
        folder = root.joinpath(*name.split(".")[1:])
        module = types.ModuleType(name, f"stand-in for {name}: its submodules load from {folder}")
        module.__path__ = [str(folder)]
        module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
        module.__spec__.submodule_search_locations = module.__path__
        sys.modules[name] = module
    if _STANDIN_CHIP_INFO not in sys.modules:
        chip = types.ModuleType(_STANDIN_CHIP_INFO, "stand-in: no AMD GPU here")
        chip.get_gfx = lambda: "none"
        sys.modules[_STANDIN_CHIP_INFO] = chip


@functools.cache
def install() -> AiterInstall:
    """Find AMD AITER and make its submodules importable; :class:`AiterUnavailable` if it is absent."""
    spec = importlib.util.find_spec("aiter") if "aiter" not in sys.modules else sys.modules["aiter"].__spec__
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    root = next((Path(p) for p in locations if (Path(p) / "ops").is_dir()), None)
    if root is None:
        raise AiterUnavailable(
            "AMD AITER is not installed (pip install 'fp4-conformance[amd]', i.e. amd-aiter; "
            "PyPI's 'aiter' is an unrelated package)"
        )
    if torch.version.hip is not None:
        try:
            importlib.import_module("aiter")
        except Exception as exc:
            raise AiterUnavailable(f"import aiter failed on this ROCm machine: {type(exc).__name__}: {exc}") from exc
        return AiterInstall(root, _version(root), "native")
    _install_standins(root)
    return AiterInstall(root, _version(root), "stand-in")


@functools.cache
def aiter_module(candidates: tuple[str, ...]) -> ModuleType:
    """The first importable module of ``candidates`` (one path per AITER release), loaded by :func:`install`."""
    found = install()
    errors = []
    for name in candidates:
        try:
            return importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - report every candidate's failure
            errors.append(f"{name}: {type(exc).__name__}: {exc}")
    raise AiterUnavailable(
        f"amd-aiter {found.version} at {found.root} has none of the modules the suite calls ("
        + "; ".join(errors)
        + "); supported: amd-aiter 0.1.7.post2.dev18 and ROCm/aiter main"
    )


# --- pure-torch helpers (any machine) ------------------------------------------------------------


def shuffle_weight(w: torch.Tensor) -> torch.Tensor:
    """AITER ``aiter.ops.shuffle.shuffle_weight(w, layout=(16, 16))`` on packed FP4 bytes ``[..., N, K/2]``
    (same shape, uint8)."""
    return aiter_module(SHUFFLE).shuffle_weight(w.contiguous(), layout=(16, 16)).view(torch.uint8)


def e8m0_shuffle(scales: torch.Tensor) -> torch.Tensor:
    """AITER ``fp4_utils.e8m0_shuffle`` on UE8M0 bytes ``[m, n]``: ``[ru(m, 256), ru(n, 8)]``, pad bytes
    uninitialised (AITER allocates them with ``torch.empty``)."""
    return aiter_module(FP4_UTILS).e8m0_shuffle(scales.contiguous()).view(torch.uint8)


def shuffle_weight_a16w4(w: torch.Tensor, gate_up: bool) -> torch.Tensor:
    """AITER ``shuffle_weight_a16w4(w, 16, gate_up)`` (the CK A16W4 MoE weight preshuffle) on packed FP4
    bytes ``[E, N, K/2]`` (same shape and dtype); with ``gate_up`` the two halves of ``N`` are shuffled as
    a pair. Its views need ``(N or N/2) % 16`` and ``(K/2) % 64``: a ``RuntimeError`` otherwise."""
    return aiter_module(SHUFFLE).shuffle_weight_a16w4(w.contiguous(), 16, gate_up)


def shuffle_scale_a16w4(scales: torch.Tensor, experts: int, gate_up: bool) -> torch.Tensor:
    """AITER ``shuffle_scale_a16w4(s, experts, gate_up)`` on UE8M0 bytes ``[E·N, K/32]`` (same shape and
    dtype). Its view needs ``N % 32`` and ``(K/32) % 8``: a ``RuntimeError`` otherwise."""
    return aiter_module(SHUFFLE).shuffle_scale_a16w4(scales.contiguous(), experts, gate_up)


def mxfp4_to_f32(packed: torch.Tensor) -> torch.Tensor:
    """AITER ``fp4_utils.mxfp4_to_f32``: fp32 ``[..., K]`` E2M1 values of packed bytes ``[..., K/2]``."""
    return aiter_module(FP4_UTILS).mxfp4_to_f32(packed.clone())


def f32_to_mxfp4(x: torch.Tensor) -> torch.Tensor:
    """AITER ``fp4_utils.f32_to_mxfp4``: packed E2M1 bytes ``[..., K/2]`` of fp32 ``x [..., K]``."""
    return aiter_module(FP4_UTILS).f32_to_mxfp4(x.float()).view(torch.uint8)


def e8m0_to_f32(scales: torch.Tensor) -> torch.Tensor:
    """AITER ``fp4_utils.e8m0_to_f32``: fp32 values of UE8M0 bytes (byte 0 -> 2^-127, 0xFF -> NaN)."""
    return aiter_module(FP4_UTILS).e8m0_to_f32(scales.clone())


# --- Triton kernels (NVIDIA GPU) -------------------------------------------------------------------


def require_cuda() -> None:
    """Raise :class:`AiterUnavailable` unless an NVIDIA GPU and AITER's Triton modules are here; then
    make ``arch_info.is_fp4_avail()`` answer True (see the module docstring)."""
    if not planned() and (torch.version.hip is not None or not torch.cuda.is_available()):
        raise AiterUnavailable(f"{LABEL} needs an NVIDIA GPU; this machine has none")
    arch_info = aiter_module(ARCH_INFO)
    if not getattr(arch_info.is_fp4_avail, "_fp4c_cuda", False):
        major, minor = (9, 0) if planned() else torch.cuda.get_device_capability(0)
        arch = f"sm{major}{minor}"

        def is_fp4_avail() -> bool:
            return True

        def get_arch() -> str:
            return arch

        is_fp4_avail._fp4c_cuda = True  # type: ignore[attr-defined]
        arch_info.is_fp4_avail, arch_info.get_arch = is_fp4_avail, get_arch


AMD_LAUNCH_OPTIONS = frozenset({"waves_per_eu", "matrix_instr_nonkdim", "kpack"})
"""Launch options of AMD's Triton backend that the CUDA backend refuses ("Keyword argument ... unrecognised")."""


class _CudaLaunch:
    """A Triton kernel of AITER's whose launches drop :data:`AMD_LAUNCH_OPTIONS` (otherwise unchanged)."""

    def __init__(self, kernel: object) -> None:
        self.kernel = kernel

    def __getitem__(self, grid: object):
        launch = self.kernel[grid]

        def run(*args: object, **kwargs: object) -> object:
            return launch(*args, **{k: v for k, v in kwargs.items() if k not in AMD_LAUNCH_OPTIONS})

        return run

    def __getattr__(self, name: str) -> object:
        return getattr(self.kernel, name)


@functools.cache
def cuda_module(candidates: tuple[str, ...]) -> ModuleType:
    """:func:`aiter_module` after :func:`require_cuda`, its Triton kernels launched through :class:`_CudaLaunch`."""
    require_cuda()
    from triton.runtime.jit import KernelInterface

    module = aiter_module(candidates)
    for name, value in vars(module).copy().items():
        if isinstance(value, KernelInterface):
            setattr(module, name, _CudaLaunch(value))
    return module


@dataclass(frozen=True)
class Mxfp4Device:
    """An MXFP4 tensor on the GPU: packed E2M1 bytes ``[M, K/2]`` and UE8M0 bytes ``[M, K/32]`` (any strides)."""

    packed: torch.Tensor
    scales: torch.Tensor

    def cpu(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(packed, scales)`` on the CPU, the scales made contiguous."""
        return self.packed.cpu(), self.scales.contiguous().cpu()


@dataclass(frozen=True)
class Fp8Device:
    """A block-FP8 activation on the GPU, quantized per token in 1x128 groups (vLLM's
    ``per_token_group_quant_fp8``): E4M3 ``codes [M, K]`` (``torch.float8_e4m3fn``) and fp32 decode
    ``scales [M, ceil(K/128)]``."""

    codes: torch.Tensor
    scales: torch.Tensor

    def cpu(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(codes as uint8 bytes, scales)`` on the CPU."""
        return self.codes.view(torch.uint8).cpu(), self.scales.contiguous().cpu()


def dynamic_mxfp4_quant(x: torch.Tensor) -> Mxfp4Device:
    """AITER ``dynamic_mxfp4_quant(x)`` (Triton, scale rounding "even") on a CUDA bf16 ``x [M, K]``.

    The scales come back as AITER allocates them: a ``(K/32, M)`` buffer viewed ``.T``.
    """
    require_cuda()
    x_q, x_s = launch("dynamic_mxfp4_quant", cuda_module(QUANT).dynamic_mxfp4_quant, x)
    return Mxfp4Device(x_q.view(torch.uint8), x_s.view(torch.uint8))


def gemm_config(m: int) -> dict[str, object]:
    """The tile config passed to ``gemm_afp4wfp4`` for ``M`` rows on CUDA: AITER's MI350X M-buckets with
    tiles that compile on sm_90 and no AMD launch options; split-K (``NUM_KSPLIT`` 4, AITER's
    ``get_splitk`` and reduce kernel) for ``M < 16`` as AITER's "small" bucket does."""
    if m < 16:
        tile = (16, 64, 256, 4)
    elif m <= 32:
        tile = (32, 64, 256, 1)
    elif m <= 128:
        tile = (64, 64, 256, 1)
    else:
        tile = (128, 128, 256, 1)
    bm, bn, bk, ksplit = tile
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": 1,
        "NUM_KSPLIT": ksplit,
        "num_warps": 4,
        "num_stages": 2,
        "cache_modifier": None,
    }


OOB_SCALE_FILL = 127
"""Scale byte past ``K/32`` (2^0, what AITER's fixed kernel substitutes for masked scales)."""


def _scale_rows(scales_kn: torch.Tensor, fill: int) -> torch.Tensor:
    """``(K/32, X)`` scale bytes in a ``(2·K/32 + 8, X)`` buffer whose extra rows hold ``fill``: every
    K tile of the GEMM, split-K included, reads its scales inside the buffer."""
    kc, x = scales_kn.shape
    out = torch.full((2 * kc + 8, x), fill, dtype=torch.uint8, device=scales_kn.device)
    out[:kc] = scales_kn
    return out


def gemm_afp4wfp4(
    act: Mxfp4Device, weight: torch.Tensor, scale_kn: torch.Tensor, oob_scale_fill: int = OOB_SCALE_FILL
) -> torch.Tensor:
    """AITER ``gemm_afp4wfp4(x, w, x_scales, w_scales.T, bf16, y, config=...)`` as vLLM's Triton fallback
    calls it: plain weights ``[N, K/2]`` and the stored ``(K/32, N)`` scale passed as its ``.T`` view;
    both scales sit in buffers padded with ``oob_scale_fill`` (see the module docstring; the kernel
    reads only strides, so the views keep AITER's layouts). Returns bf16 ``[M, N]`` on the GPU."""
    require_cuda()
    device = act.packed.device
    w = weight.to(device).contiguous()
    s = _scale_rows(scale_kn.to(device), oob_scale_fill)
    xs = _scale_rows(act.scales.T, oob_scale_fill)
    m = act.packed.shape[0]
    y = torch.empty(m, w.shape[0], dtype=torch.bfloat16, device=device)
    gemm = cuda_module(GEMM).gemm_afp4wfp4
    return launch("gemm_afp4wfp4", gemm, act.packed, w, xs.T, s.T, torch.bfloat16, y, config=gemm_config(m))


MOE_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4}
"""Tile config of ``fused_moe_mxfp4`` on CUDA; ``BLOCK_SIZE_M`` is also the block of the token alignment."""


@dataclass(frozen=True)
class SortedTokens:
    """``moe_align_block_size_triton`` output: token slots sorted by expert, padded per expert to
    ``block`` (sentinel ``T·k``), the expert of each block and the padded slot count."""

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    num_post_padded: torch.Tensor


def moe_align_block_size(topk_ids: torch.Tensor, experts: int, block: int) -> SortedTokens:
    """AITER ``moe_align_block_size_triton``, buffers sized as AITER's own test sizes them:
    ``T·k + E·(block - 1)`` slots filled with ``T·k``, ``cdiv(slots, block)`` expert ids."""
    require_cuda()
    numel = topk_ids.numel()
    slots = numel + experts * (block - 1)
    sorted_ids = torch.full((slots,), numel, dtype=torch.int32, device=topk_ids.device)
    expert_ids = torch.empty((-(-slots // block),), dtype=torch.int32, device=topk_ids.device)
    post = torch.empty((1,), dtype=torch.int32, device=topk_ids.device)
    align = cuda_module(MOE_ALIGN).moe_align_block_size_triton
    launch("moe_align_block_size_triton", align, topk_ids, experts, block, sorted_ids, expert_ids, post)
    return SortedTokens(sorted_ids, expert_ids, post)


def fused_moe_mxfp4(
    act: Mxfp4Device,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    sorted_tokens: SortedTokens,
    top_k: int,
    mul_routed_weight: bool,
) -> torch.Tensor:
    """One MXFP4 x MXFP4 expert GEMM of AITER ``fused_moe_mxfp4`` (as AITER's ``test_moe_mx.py`` calls it):
    ``act`` ``[A, K/2]`` with ``A = T`` (read once per top-k slot) or ``T·k`` (``top_k = 1``), experts
    ``weight [E, N, K/2]`` with scales ``[E, N, K/32]``, unit per-tensor scales, unswizzled MX scales.
    Returns bf16 ``[A, top_k, N]``; rows of slots not routed stay zero."""
    require_cuda()
    device = act.packed.device
    e, n, _ = weight.shape
    out = torch.zeros(act.packed.shape[0], top_k, n, dtype=torch.bfloat16, device=device)
    ones_a = torch.ones(1, dtype=torch.float32, device=device)
    ones_b = torch.ones(e, dtype=torch.float32, device=device)
    launch(
        "fused_moe_mxfp4",
        cuda_module(MOE).fused_moe_mxfp4,
        act.packed,
        weight.to(device).contiguous(),
        out,
        ones_a,
        ones_b,
        act.scales,
        weight_scale.to(device).contiguous(),
        topk_weights.to(device, torch.float32).contiguous(),
        topk_ids,
        sorted_tokens.sorted_ids,
        sorted_tokens.expert_ids,
        sorted_tokens.num_post_padded,
        mul_routed_weight,
        top_k,
        False,
        False,
        dict(MOE_CONFIG),
        _triton_bf16(),
    )
    return out


def _triton_bf16():
    import triton.language as tl

    return tl.bfloat16


@dataclass(frozen=True)
class TritonMoeRun:
    """Every stage of one MoE forward through AITER's Triton kernels (CPU copies).

    Quantized tensors are ``(codes, scales)`` pairs (:meth:`Mxfp4Device.cpu`, :meth:`Fp8Device.cpu`).
    ``x_q``: the stage-1 activation (MXFP4 ``[T, Hp/2]`` / ``[T, Hp/32]``, FP8 ``[T, Hp]`` / ``[T, Hp/128]``);
    ``fc1``: bf16 ``[T·k, 2·Ip]`` (slot ``t·k + j``); ``act``: bf16 ``[T·k, Ip]`` (SiLU(gate)·up); ``act_q``: its
    quantization; ``fc2``: bf16 ``[T·k, Hp]``, already times the routing weight; ``out``: fp32 ``[T, Hp]``.
    """

    x_q: tuple[torch.Tensor, torch.Tensor]
    fc1: torch.Tensor
    act: torch.Tensor
    act_q: tuple[torch.Tensor, torch.Tensor]
    fc2: torch.Tensor
    out: torch.Tensor


QuantizedAct = TypeVar("QuantizedAct", Mxfp4Device, Fp8Device)
ExpertGemm = Callable[
    [QuantizedAct, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, SortedTokens, int, bool], torch.Tensor
]
"""One expert GEMM of a fused MoE: ``(act, weight, weight_scale, topk_weights, topk_ids, sorted_tokens, top_k,
mul_routed_weight) -> bf16 [A, top_k, N]`` (:func:`fused_moe_mxfp4`, :func:`fused_moe_fp8_block`)."""


def _silu_gated_moe(
    gemm: ExpertGemm,
    quantize: Callable[[torch.Tensor], QuantizedAct],
    block_m: int,
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> TritonMoeRun:
    """A SiLU-gated MoE composed the way vLLM's ``fused_experts`` composes its Triton MoE kernel: quantize
    ``x``; ``moe_align_block_size_triton`` (block ``block_m``, the GEMMs' ``BLOCK_SIZE_M``); FC1 over ``[gate; up]``
    rows ``[E, 2·Ip, ...]``; SiLU(first half) · second half in fp32, rounded to bf16; quantize; FC2 with
    ``top_k = 1`` over the ``T·k`` slots, times the routing weight; sum over the top-k slots in fp32."""
    require_cuda()
    dev = x.device
    t, k = topk_ids.shape
    ids = topk_ids.to(dev, torch.int32).contiguous()
    sorted_tokens = moe_align_block_size(ids, w13.shape[0], block_m)
    xq = quantize(x.to(dev, torch.bfloat16).contiguous())
    fc1 = gemm(xq, w13, w13_scale, topk_weights, ids, sorted_tokens, k, False).view(t * k, -1)
    gate, up = fc1.float().chunk(2, dim=-1)
    act = (torch.nn.functional.silu(gate) * up).to(torch.bfloat16)
    aq = quantize(act)
    fc2 = gemm(aq, w2, w2_scale, topk_weights, ids, sorted_tokens, 1, True).view(t * k, -1)
    out = fc2.float().view(t, k, -1).sum(1)
    return TritonMoeRun(xq.cpu(), fc1.cpu(), act.cpu(), aq.cpu(), fc2.cpu(), out.cpu())


def mxfp4_moe(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    quantize: Callable[[torch.Tensor], Mxfp4Device] | None = None,
) -> TritonMoeRun:
    """A SiLU-gated MXFP4 MoE from AITER's Triton kernels (:func:`_silu_gated_moe` over
    :func:`fused_moe_mxfp4`): FC1 ``[E, 2·Ip, Hp/2]``, FC2 ``[E, Hp, Ip/2]``, scales ``[E, N, K/32]``.
    ``quantize`` is AITER's ``dynamic_mxfp4_quant`` unless given (on CUDA its scale bytes are wrong for
    negative exponents). ``x [T, Hp]`` (zero-padded by the caller, on the GPU), ``topk_weights`` / ``topk_ids``
    ``[T, k]``."""
    return _silu_gated_moe(
        fused_moe_mxfp4,
        quantize or dynamic_mxfp4_quant,
        MOE_CONFIG["BLOCK_SIZE_M"],
        w13,
        w13_scale,
        w2,
        w2_scale,
        x,
        topk_weights,
        topk_ids,
    )


# --- block-FP8 MoE: AITER's port of vLLM's fused_moe_kernel ------------------------------------------

FP8_BLOCK_SHAPE = (128, 128)
"""``block_shape = [block_n, block_k]`` of DeepSeek-V3-style weight scales."""
FP8_MOE_CONFIG = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1, "num_warps": 4}
"""Tile config of ``fused_moe`` for block FP8: vLLM 0.33.0's ``get_default_config`` on CUDA for
``fp8_w8a8`` with a block shape at ``M <= 8`` (``BLOCK_SIZE_M`` 16, ``BLOCK_SIZE_N`` 64, ``BLOCK_SIZE_K``
``block_k``; ``vllm/model_executor/layers/fused_moe/fused_moe.py``), stages left to Triton's default."""


def fused_moe_fp8_block(
    act: Fp8Device,
    weight: torch.Tensor,
    weight_scale: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    sorted_tokens: SortedTokens,
    top_k: int,
    mul_routed_weight: bool,
) -> torch.Tensor:
    """One block-FP8 expert GEMM of AITER's ``fused_moe`` (``use_fp8_w8a8``, ``block_shape = [128, 128]``).

    AITER's ``_fused_moe_kernel`` ("MoE Kernel adapted from VLLM", ``aiter/ops/triton/moe_op.py``) reads the
    block scales as vLLM 0.33.0's ``fused_moe_kernel`` does (``fused_moe.py`` lines 486-491 and 540-550):
    output column ``n`` of a ``BLOCK_SIZE_K``-wide K tile starting at ``k0`` is scaled by
    ``a_scale[token, k0 // 128] · b_scale[expert, n // 128, k0 // 128]`` after an fp32 ``tl.dot`` of the
    tile's E4M3 codes. ``act``: ``[A, K]`` with ``A = T`` (read once per top-k slot) or ``T·k``
    (``top_k = 1``); ``weight``: E4M3 bytes ``[E, N, K]``; ``weight_scale``: fp32 ``[E, ceil(N/128),
    ceil(K/128)]`` (the wrapper asserts those counts). Returns bf16 ``[A, top_k, N]``; slots not routed stay
    zero."""
    require_cuda()
    device = act.codes.device
    n = weight.shape[1]
    out = torch.zeros(act.codes.shape[0], top_k, n, dtype=torch.bfloat16, device=device)
    launch(
        "fused_moe (block FP8)",
        cuda_module(MOE_FP8).fused_moe,
        act.codes,
        weight.to(device).contiguous().view(torch.float8_e4m3fn),
        out,
        act.scales,
        weight_scale.to(device, torch.float32).contiguous(),
        None,
        topk_weights.to(device, torch.float32).contiguous(),
        topk_ids,
        sorted_tokens.sorted_ids,
        sorted_tokens.expert_ids,
        sorted_tokens.num_post_padded,
        mul_routed_weight,
        top_k,
        _triton_bf16(),
        True,
        False,
        False,
        list(FP8_BLOCK_SHAPE),
        dict(FP8_MOE_CONFIG),
    )
    return out


def fp8_block_moe(
    w13: torch.Tensor,
    w13_scale: torch.Tensor,
    w2: torch.Tensor,
    w2_scale: torch.Tensor,
    x: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    quantize: Callable[[torch.Tensor], Fp8Device],
) -> TritonMoeRun:
    """A SiLU-gated block-FP8 MoE from AITER's Triton kernels (:func:`_silu_gated_moe` over
    :func:`fused_moe_fp8_block`): FC1 E4M3 ``[E, 2·Ip, Hp]`` with scales ``[E, 2·Ip/128, ceil(Hp/128)]``, FC2
    ``[E, Hp, Ip]`` with ``[E, ceil(Hp/128), ceil(Ip/128)]``. ``quantize`` is the per-token 1x128-group
    activation quantizer (amd-aiter 0.1.7 ships none; vLLM's is its own ``per_token_group_quant_fp8``).
    ``x [T, Hp]`` (zero-padded by the caller, on the GPU), ``topk_weights`` / ``topk_ids`` ``[T, k]``."""
    return _silu_gated_moe(
        fused_moe_fp8_block,
        quantize,
        FP8_MOE_CONFIG["BLOCK_SIZE_M"],
        w13,
        w13_scale,
        w2,
        w2_scale,
        x,
        topk_weights,
        topk_ids,
    )
