"""FlashInfer's SM90 W4A16 MoE: ``cutlass_fused_moe(..., use_w4_group_scaling=True)``, MXFP4 weights x BF16 activations.

The kernel lives in FlashInfer's CUTLASS fused-MoE JIT module ``fused_moe_90``, whose default build
did not finish in 27 minutes on a 16-core H200 host. :func:`fast_build_spec` is FlashInfer's own
spec for it with ``FAST_BUILD`` defined for nvcc too (FlashInfer passes it to the host compiler
only) and a distinct name, ``fused_moe_90_fastbuild``; ``scripts/build_fused_moe_sm90_fast.py``
builds it. Nothing here ever compiles: :func:`prebuilt_module` loads an already built ``.so`` (the
fast one, else a stock ``fused_moe_90.so``) or raises :class:`LibraryUnavailable`.

How FlashInfer is pointed at that module: ``cutlass_fused_moe`` and
``interleave_moe_weights_for_sm90_mixed_gemm`` take their module from
``flashinfer.fused_moe.core.get_cutlass_fused_moe_module(arch)``, a ``functools.cache`` whose miss
path is ``gen_cutlass_fused_moe_sm90_module(...).build_and_load()`` (ninja; a rebuild of the stock
module when nothing is cached). FlashInfer 0.7.4 takes no prebuilt module as a parameter, so
:func:`_seed_module_cache` fills that one cache entry: for the duration of a single
``get_cutlass_fused_moe_module("90")`` call it rebinds the name ``gen_cutlass_fused_moe_sm90_module``
in ``flashinfer.fused_moe.core`` to a stand-in whose ``build_and_load`` returns the loaded module,
then restores it. No FlashInfer file changes, and FlashInfer builds its own runner namespace around
the module, so the public functions then run unchanged. The entry is process-wide: every later SM90
``cutlass_fused_moe`` call in the process uses the FAST_BUILD module (fewer tactics, same math).
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from adapters import flashinfer as fi
from adapters.calls import kernel_device, launch, planned, synchronize
from contracts.errors import LibraryUnavailable
from contracts.moe import MoeWeights
from reference.errors import require
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.moe import Activation, ActivationKind
from reference.padding import pad_dim

FAST_BUILD_DEFINE = "-DFAST_BUILD"
FAST_BUILD_SUFFIX = "_fastbuild"
W4A16_SUFFIX = "_w4a16"
W4A16_LAUNCHER = "kernelLauncher<__nv_bfloat16, SafeFP4, __nv_bfloat16"
"""How a generated SM90 mixed-input unit instantiates a BF16 x MXFP4 (W4A16) grouped GEMM."""
SM90_ARCH = "90"
SM90_ALIGNMENT = 128
"""The binding checks ``hidden_size % 128`` and ``inter_size % 128`` for MXFP4 weights."""
SUPPORTED_ACTIVATIONS = (ActivationKind.SWIGLU, ActivationKind.SWIGLU_OAI)
"""The activations FlashInfer's own W4A16 test (``test_moe_bf16_mxfp4``) runs: Swiglu and SwigluBias."""


def stock_spec(use_fast_build: bool = False) -> Any:
    """FlashInfer's ``gen_cutlass_fused_moe_sm90_module`` spec (``fused_moe_90``; the H20 variant on 78-SM parts).

    ``use_fast_build`` adds ``-DFAST_BUILD`` to the host compiler flags only. Creating the spec
    writes FlashInfer's generated CUTLASS instantiation sources into its JIT workspace; it compiles nothing.
    """
    return fi._import("flashinfer.jit.fused_moe").gen_cutlass_fused_moe_sm90_module(use_fast_build)


def fast_build_spec() -> Any:
    """The stock SM90 spec with ``FAST_BUILD`` for host *and* nvcc, named ``<stock name>_fastbuild``.

    Built from FlashInfer's own ``use_fast_build=True`` spec with ``dataclasses.replace`` (a
    ``JitSpecNvcc`` is a dataclass): same sources, include paths and flags, plus one nvcc define and
    a new name, so its ninja file, objects and ``.so`` live in their own JIT folder.
    """
    base = stock_spec(use_fast_build=True)
    return dataclasses.replace(
        base, name=base.name + FAST_BUILD_SUFFIX, extra_cuda_cflags=[*base.extra_cuda_cflags, FAST_BUILD_DEFINE]
    )


def is_generated_unit(source: Any) -> bool:
    """Whether ``source`` is one of FlashInfer's generated CUTLASS instantiation units (not hand-written)."""
    return str(source).endswith(".generated.cu")


def holds_w4a16(source: Any) -> bool:
    """Whether a generated unit instantiates a W4A16 grouped GEMM (:data:`W4A16_LAUNCHER`)."""
    return W4A16_LAUNCHER in Path(source).read_text()


def w4a16_spec() -> Any:
    """:func:`fast_build_spec` narrowed to what the W4A16 path launches: the hand-written sources (dispatch,
    binding, runtime) and only the generated units that instantiate W4A16 GEMMs, named
    ``<stock name>_fastbuild_w4a16``. The dispatch still names every other instantiation; they stay
    undefined in the ``.so`` and resolve lazily, so a call that reaches one fails at that call."""
    base = fast_build_spec()
    sources = [s for s in base.sources if not is_generated_unit(s) or holds_w4a16(s)]
    return dataclasses.replace(base, name=base.name + W4A16_SUFFIX, sources=sources)


def _require_sm90() -> None:
    if planned():
        return
    cc = fi.cuda_capability()
    if cc != (9, 0):
        raise LibraryUnavailable(
            f"FlashInfer's W4A16 MXFP4 MoE (cutlass_fused_moe, use_w4_group_scaling) runs on an SM90 GPU (H100/H200) "
            f"only; this machine: {'no CUDA GPU' if cc is None else f'sm{cc[0]}{cc[1]}'}"
        )


@functools.cache
def _load_prebuilt() -> tuple[str, Any] | str:
    """``(module name, loaded module)``, or the reason there is none (cached either way)."""
    tried = []
    for spec in (fast_build_spec(), w4a16_spec(), stock_spec()):
        path = spec.get_library_path()
        if not path.exists():
            tried.append(f"{path} (absent)")
            continue
        try:
            module = spec.load(path)
        except Exception as exc:  # noqa: BLE001 - any load failure (stale or foreign .so) means "not prebuilt"
            tried.append(f"{path} (does not load: {type(exc).__name__}: {exc})")
            continue
        _seed_module_cache(module)
        return spec.name, module
    return (
        "FlashInfer's SM90 CUTLASS fused-MoE module is not prebuilt; looked for " + "; ".join(tried) + ". "
        "Build it first on the SM90 host (FAST_BUILD, in the background): "
        "setsid nohup python3 scripts/build_fused_moe_sm90_fast.py --log /tmp/fastbuild.log & "
        "(tests never start the default build, which took over 27 minutes)"
    )


def unavailable_reason() -> str | None:
    """Why the W4A16 kernel cannot run here (no SM90 GPU, no FlashInfer, no prebuilt module), or ``None``."""
    try:
        prebuilt_module()
    except LibraryUnavailable as exc:
        return str(exc)
    return None


def prebuilt_module() -> tuple[str, Any]:
    """Load the prebuilt SM90 module (fast build first) and point FlashInfer's module cache at it.

    Returns ``(module name, module)``. Raises :class:`LibraryUnavailable` without an SM90 GPU,
    without FlashInfer, or when neither ``.so`` exists; never builds.
    """
    _require_sm90()
    loaded = _load_prebuilt()
    if isinstance(loaded, str):
        raise LibraryUnavailable(loaded)
    return loaded


def _seed_module_cache(module: Any) -> None:
    """Make ``get_cutlass_fused_moe_module("90")`` return FlashInfer's runner namespace around ``module``.

    A no-op for the cache when the entry already exists (then a stock module was loaded earlier in
    this process and stays in use).
    """
    core = fi._import("flashinfer.fused_moe.core")
    stand_in = SimpleNamespace(build_and_load=lambda: module)
    original = core.gen_cutlass_fused_moe_sm90_module
    core.gen_cutlass_fused_moe_sm90_module = lambda use_fast_build=False: stand_in
    try:
        core.get_cutlass_fused_moe_module(SM90_ARCH)
    finally:
        core.gen_cutlass_fused_moe_sm90_module = original


def _swiglu_params(act: Activation, experts: int, device: torch.device) -> dict[str, torch.Tensor | None]:
    """Per-expert ``swiglu_alpha/beta/limit`` (fp32 ``[E]``); all ``None`` selects plain SwiGLU."""
    if act.kind is ActivationKind.SWIGLU:
        return {"swiglu_alpha": None, "swiglu_beta": None, "swiglu_limit": None}

    def full(v: float | None) -> torch.Tensor | None:
        return None if v is None else torch.full((experts,), v, dtype=torch.float32, device=device)

    return {"swiglu_alpha": full(act.alpha), "swiglu_beta": full(act.beta), "swiglu_limit": full(act.limit)}


def w4a16_moe(
    weights: MoeWeights, x: torch.Tensor, routing: torch.Tensor, ids: torch.Tensor, act: Activation
) -> torch.Tensor:
    """Run FlashInfer's ``cutlass_fused_moe`` W4A16 path on one rank's MXFP4 experts.

    ``weights``: ``block = 32``, FC1 rows stacked ``[up; gate]`` (``Fc1Layout.UP_GATE``, FlashInfer's
    ``w31``), no biases, sizes ``Hp, Ip`` multiples of 128 (pad first). ``x [T, H]`` with ``H <= Hp`` is rounded to bf16 and zero-padded
    to ``Hp``; ``routing`` fp32 ``[T, k]`` and ``ids [T, k]`` come from the router. Preparation as
    in FlashInfer's ``test_moe_bf16_mxfp4``: weights byte-interleaved by the module's CUDA op
    (``"fp4"``), UE8M0 scales folded by ``interleave_moe_scales_for_sm90_mixed_gemm`` and viewed
    as int32. Returns the bf16 output as fp32 ``[T, H]`` on the CPU.
    """
    require(weights.block == MXFP4_BLOCK, f"W4A16 takes MXFP4 weights (32-element groups), got block {weights.block}")
    require(
        weights.fc1_layout is Fc1Layout.UP_GATE,
        f"cutlass_fused_moe reads FC1 rows as stacked [up; gate] (w31), got {weights.fc1_layout.value}",
    )
    require(
        weights.w13_bias is None and weights.w2_bias is None,
        "expert biases are not passed to the W4A16 kernel here (FlashInfer's W4A16 test runs without them)",
    )
    hp, ip = weights.hidden_size, weights.intermediate_size
    require(
        hp % SM90_ALIGNMENT == 0 and ip % SM90_ALIGNMENT == 0,
        f"FlashInfer's SM90 MXFP4 MoE needs hidden and intermediate sizes divisible by {SM90_ALIGNMENT}; "
        f"got H={hp}, I={ip} (pad the weights first)",
    )
    require(x.dim() == 2 and x.shape[1] <= hp, f"x must be [T, H] with H <= {hp}, got {tuple(x.shape)}")
    if act.kind not in SUPPORTED_ACTIVATIONS:
        raise ValueError(f"FlashInfer's W4A16 MoE is run here with swiglu / swiglu_oai only, not {act}")
    if not planned():  # a plan reports the module's prebuilt library where FlashInfer would load it
        prebuilt_module()
    fused_moe = fi._import("flashinfer.fused_moe")
    dev = kernel_device()
    experts = weights.w13.shape[0]

    def scales(s: torch.Tensor) -> torch.Tensor:
        return fi.sm90_scale_interleave(s.contiguous()).to(dev).view(torch.int32)

    def interleaved(w: torch.Tensor) -> torch.Tensor:
        return launch(
            "interleave_moe_weights_for_sm90_mixed_gemm",
            fused_moe.interleave_moe_weights_for_sm90_mixed_gemm,
            w.to(dev).contiguous(),
            "fp4",
            planned_output=lambda: torch.zeros_like(w, device=dev),
        )

    w13, w2 = interleaved(weights.w13), interleaved(weights.w2)
    x_dev = pad_dim(x.to(torch.bfloat16), -1, hp).to(dev)
    out = torch.empty(x.shape[0], hp, dtype=torch.bfloat16, device=dev)
    launch(
        "cutlass_fused_moe (W4A16 MXFP4)",
        fused_moe.cutlass_fused_moe,
        x_dev,
        ids.to(dev, torch.int32),
        routing.to(dev, torch.float32),
        w13,
        w2,
        torch.bfloat16,
        quant_scales=[scales(weights.w13_scale), scales(weights.w2_scale)],
        use_w4_group_scaling=True,
        output=out,
        **_swiglu_params(act, experts, dev),
    )
    synchronize()
    return out[:, : x.shape[1]].float().cpu()
