"""Kernel truth tables: what a kernel really does at the sizes its backend record speaks about.

``python -m bench.kernel_truth --kernel triton-kernels-sm90 --out backends/truth`` runs the kernel on this
machine's GPU over a grid of sizes and classifies each point as

* ``correct``: it ran and every output element is within :data:`GEMM_TOLERANCE` (GEMM points) or the MoE
  kernel property's bound (MoE points) of the fp32 reference on the same inputs,
* ``loud``: the library raised (the error's type and first line are kept), or
* ``silent``: it ran and returned a wrong (or non-finite) result without an error.

It writes ``<out>/<kernel>.<arch>.json``: the hardware, library versions and date it was measured with, and
one row per point. ``tests/test_kernel_truth.py`` checks each backend record's ``violations`` oracle
against every table present, on any machine: each loud or silent point must be a violation and each
correct point must not be, unless the table's ``exceptions`` name the point with a reason.

Error metric: ``|got - want| / (2^-8 · |x| |W|^T)`` per element. Argument for GEMM points: ``x`` is rounded
to bf16 before both run and E2M1 codes times UE8M0 scales are exact in bf16, so the kernel's only
roundings are fp32 accumulation (``K · 2^-24 <= 2^-12`` relative to the magnitude for ``K <= 4096``)
and the bf16 output (``<= 2^-8 · |y|``); :data:`GEMM_TOLERANCE` = 2 leaves a factor 2. A misread scale
group or a misplaced code moves an element by a whole term, ``>= 2^-1`` of its magnitude share.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import math
import platform
import sys
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path

import torch

from adapters import aiter_triton, matmul_ogs
from backends import record
from backends.mxfp4_linear import AiterLinearPath
from conformance.moe_checks import fp8_block_moe_stages
from contracts.errors import LibraryUnavailable
from contracts.moe import MoeWeights
from reference.formats import (
    MXFP4_BLOCK,
    MxScaleRounding,
    Quantized,
    Ue8m0Byte0,
    Ue8m0Byte255,
    mxfp4_dequantize,
    mxfp4_quantize,
)
from reference.fp8 import FP8_BLOCK, fp8_block_quantize, fp8_token_group_quantize
from reference.layouts import Fc1Layout
from reference.linear import exact_matmul
from reference.moe import route
from strategies.tensors import SCALE_BYTES, random_bytes

GEMM_TOLERANCE = 2.0
"""Largest allowed GEMM error in units of ``2^-8 ·`` magnitude (the module docstring's argument)."""
TOKENS = 16
EXPERTS = 2

K_SWEEP = (*range(32, 1025, 32), 1440, 2016, 2048, 2880, 2944)
"""Reduction sizes of the GEMM sweep: every 32-element group count up to 32, and gpt-oss's sizes."""
N_SWEEP = (32, 64, 96, 128, 160, 192, 224, 256, 320, 512, 2880)
"""Output sizes of the GEMM sweep (``K = 256``)."""
PREPARATIONS = {4: "scale groups zero-padded to 4 (vLLM 0.33.0 _swizzle_mxfp4)", 1: "the layout's own padding"}
"""``groups_to`` of :func:`adapters.matmul_ogs.hopper_weights` the sweep runs, and what each stands for."""


def classify(run: Callable[[], tuple[torch.Tensor, torch.Tensor, torch.Tensor]], tolerance: float) -> dict:
    """Run ``run() -> (got, want, magnitude)`` and classify it (module docstring); the row's ``error`` is the
    largest ``|got - want| / (2^-8 · magnitude)`` (``inf`` for non-finite output)."""
    try:
        got, want, magnitude = run()
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - every library error is a loud refusal, recorded by type
        lines = [line.strip() for line in str(exc).splitlines() if line.strip().strip("^~")]
        message = next((line for line in lines if "assert" in line.lower()), lines[0] if lines else "")
        if not message:  # a bare ``assert``: the failing source line
            message = (traceback.extract_tb(exc.__traceback__)[-1].line or "").strip()
        return {"outcome": "loud", "error_type": type(exc).__name__, "message": message[:300]}
    got = got.cpu().double()
    if not bool(torch.isfinite(got).all()):
        return {"outcome": "silent", "error": math.inf}
    ratio = (got - want.double()).abs() / (2.0**-8 * magnitude.double()).clamp_min(torch.finfo(torch.float32).tiny)
    error = float(ratio.max())
    return {"outcome": "correct" if error <= tolerance else "silent", "error": round(error, 4)}


def random_mxfp4(g: torch.Generator, e: int, n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random packed E2M1 codes ``[e, n, k/2]`` and UE8M0 scale bytes ``[e, n, k/32]`` in the range the MoE
    strategies draw (:data:`strategies.tensors.SCALE_BYTES`)."""
    low, high = SCALE_BYTES[MXFP4_BLOCK]
    return random_bytes(g, e, n, k // 2), random_bytes(g, e, n, k // MXFP4_BLOCK, low=low, high=high)


def gemm_point(k: int, n: int, groups_to: int, seed: int = 0) -> dict:
    """One GEMM point: ``x [E, M, K] · W[e]^T`` through :func:`adapters.matmul_ogs.batched_gemm`."""
    g = torch.Generator().manual_seed(seed)
    codes, scales = random_mxfp4(g, EXPERTS, n, k)
    x = torch.randn(EXPERTS, TOKENS, k, generator=g).to(torch.bfloat16).float()
    w = mxfp4_dequantize(Quantized(codes, scales), Ue8m0Byte0.POW2, Ue8m0Byte255.NAN)

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        prepared = matmul_ogs.hopper_weights(codes, scales, groups_to=groups_to)
        got = matmul_ogs.batched_gemm(x, prepared)
        want = torch.stack([exact_matmul(x[e], w[e]) for e in range(EXPERTS)])
        magnitude = torch.stack([exact_matmul(x[e].abs(), w[e].abs()) for e in range(EXPERTS)])
        return got, want, magnitude

    return {"k": k, "n": n, "groups_to": groups_to, **classify(run, GEMM_TOLERANCE)}


def gemm_points(ks: Iterable[int] = K_SWEEP, ns: Iterable[int] = N_SWEEP) -> list[dict]:
    """The GEMM sweep: every ``K`` at ``N = 256`` and every ``N`` at ``K = 256``, for each preparation."""
    grid = sorted({(k, 256) for k in ks} | {(256, n) for n in ns})
    return [gemm_point(k, n, groups_to) for groups_to in PREPARATIONS for k, n in grid]


AITER_SIZES = (32, 64, 96, 160, 320, 640, 2880)
"""``N`` and ``K`` of the AITER sweep: single and odd scale groups, the shared-expert widths of the seed bug."""
AITER_TOKENS = (1, 16, 64)
"""``M`` of the AITER sweep: its split-K configs differ by ``M`` (``adapters.aiter_triton.gemm_config``)."""


def aiter_point(n: int, k: int, m: int, seed: int = 0) -> dict:
    """One AITER ``gemm_afp4wfp4`` point on CUDA as vLLM's Triton fallback calls it (the record's ``on_cuda``
    kernel), with the reference-quantized MXFP4 activation, against the record's per-element bound."""
    kernel = record(AiterLinearPath.TRITON).on_cuda
    g = torch.Generator().manual_seed(seed)
    codes, scales = random_mxfp4(g, 1, n, k)
    q = mxfp4_quantize(torch.randn(m, k, generator=g), MxScaleRounding.EVEN)
    x = mxfp4_dequantize(q, Ue8m0Byte0.POW2, Ue8m0Byte255.NAN)
    w = mxfp4_dequantize(Quantized(codes[0], scales[0]), Ue8m0Byte0.POW2, Ue8m0Byte255.NAN)

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        act = aiter_triton.Mxfp4Device(q.packed.cuda(), q.scales.cuda())
        got = kernel.gemm(act, codes[0], scales[0].T.contiguous()).float()
        exact = exact_matmul(x, w)
        bound = kernel.tolerance(exact, exact_matmul(x.abs(), w.abs()), k, kernel.splits(m))
        return got, exact, bound * 2.0**8  # classify() divides by 2^-8 · magnitude: the bound itself

    return {"n": n, "k": k, "m": m, **classify(run, 1.0)}


def aiter_points() -> list[dict]:
    """The AITER sweep: every ``(N, K)`` of :data:`AITER_SIZES` at every ``M`` of :data:`AITER_TOKENS`."""
    return [aiter_point(n, k, m) for m in AITER_TOKENS for n in AITER_SIZES for k in AITER_SIZES]


FP8_INTERMEDIATE = (32, 48, 64, 80, 96, 112, 128, 144, 160, 176, 192, 208, 240, 256, 320, 352, 384, 640, 704)
"""Per-rank ``I`` of the block-FP8 sweep: whole 128-tiles, and partial last tiles of both kinds: ``I mod 128`` at
most 64 (the fused ``[gate; up]`` rows span ``ceil(2I/128) = 2·ceil(I/128) - 1`` tile rows, one fewer than the
checkpoint's per-half scale rows) and above 64 (as many, but the up half starts inside a gate tile);
80 is Qwen3.8-Flash-Next at TP=8 (vLLM #54178), 176 and 352 Gemma-4-26B-A4B at TP=4 and 2, 704 Gemma-4 FP8's
padded size (vLLM PR #55251)."""
FP8_HIDDEN = (128, 320, 2880)
"""``H`` of the block-FP8 sweep: one tile, a partial last tile, gpt-oss's 2880 (22.5 tiles)."""


def fp8_block_point(intermediate: int, hidden: int, seed: int = 0) -> dict:
    """One block-FP8 MoE point: a SiLU-gated layer of :data:`EXPERTS` experts (top-2, :data:`TOKENS` tokens) whose
    ``I`` and ``H`` are handed to the kernel as they are, each gate/up half with its own 128x128 tiles as the
    checkpoint stores them (``w13_scale [E, 2·ceil(I/128), ceil(H/128)]``), through
    :func:`adapters.aiter_triton.fp8_block_moe`; every element of both GEMMs against its bound
    (:func:`conformance.moe_checks.fp8_block_moe_stages`, so 1 means within it)."""
    g = torch.Generator().manual_seed(seed)
    halves = [fp8_block_quantize(torch.randn(EXPERTS, intermediate, hidden, generator=g)) for _ in range(2)]
    down = fp8_block_quantize(torch.randn(EXPERTS, hidden, intermediate, generator=g))
    w = MoeWeights(
        torch.cat([q.codes for q in halves], 1),
        torch.cat([q.scales for q in halves], 1),
        down.codes,
        down.scales,
        FP8_BLOCK,
        Fc1Layout.GATE_UP,
    )
    x = torch.randn(TOKENS, hidden, generator=g).to(torch.bfloat16)
    routing, ids = route(torch.randn(TOKENS, EXPERTS, generator=g), EXPERTS)

    def quantize(a: torch.Tensor) -> aiter_triton.Fp8Device:
        q = fp8_token_group_quantize(a.float().cpu())
        return aiter_triton.Fp8Device(q.codes.view(torch.float8_e4m3fn).cuda(), q.scales.cuda())

    def run() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        moe = aiter_triton.fp8_block_moe(w.w13, w.w13_scale, w.w2, w.w2_scale, x.cuda(), routing, ids.cuda(), quantize)
        stages = fp8_block_moe_stages(moe, w, routing, ids)
        flat = [torch.cat([getattr(st, f).flatten().double() for st in stages]) for f in ("got", "exact", "tolerance")]
        return flat[0], flat[1], flat[2] * 2.0**8  # classify() divides by 2^-8 · magnitude: the bound itself

    return {"intermediate": intermediate, "hidden": hidden, **classify(run, 1.0)}


def fp8_block_points() -> list[dict]:
    """The block-FP8 sweep: every ``I`` of :data:`FP8_INTERMEDIATE` at every ``H`` of :data:`FP8_HIDDEN`."""
    return [fp8_block_point(i, h) for h in FP8_HIDDEN for i in FP8_INTERMEDIATE]


def versions() -> dict[str, str]:
    """Versions of what ran: Python, torch, CUDA, Triton, and where triton_kernels came from."""
    import triton

    found = {"python": platform.python_version(), "torch": torch.__version__, "cuda": str(torch.version.cuda)}
    found["triton"] = triton.__version__
    with contextlib.suppress(LibraryUnavailable):
        found["triton_kernels"] = matmul_ogs.package().name
    with contextlib.suppress(LibraryUnavailable):
        found["amd-aiter"] = aiter_triton.install().version
    try:
        import vllm

        found["vllm"] = vllm.__version__
    except ImportError:
        pass
    return found


KERNELS = {
    "triton-kernels-sm90": (gemm_points, GEMM_TOLERANCE),
    "aiter-triton": (aiter_points, 1.0),
    "triton-fp8-block": (fp8_block_points, 1.0),
}
"""Kernels this command can sweep, by their backend record's name: the sweep and its tolerance (units of
``2^-8`` magnitude; AITER's and the block-FP8 points are judged by their records' own per-element bounds, so 1
means within it). ``triton-fp8-block`` runs AITER's port of vLLM's Triton kernel (same block-scale indexing,
:func:`adapters.aiter_triton.fused_moe_fp8_block`)."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kernel_truth", description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", choices=sorted(KERNELS), required=True)
    parser.add_argument("--out", type=Path, required=True, help="folder the table is written to")
    parser.add_argument("--origin", default="", help="where the libraries came from, kept in the table's versions")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a GPU: a truth table records what a kernel does on real hardware")
    major, minor = torch.cuda.get_device_capability(0)
    arch = f"sm{major}{minor}"
    started = datetime.datetime.now(datetime.timezone.utc)
    sweep, tolerance = KERNELS[args.kernel]
    points = sweep()
    notes = {"preparations": {str(k): v for k, v in PREPARATIONS.items()}} if sweep is gemm_points else {}
    table = {
        "kernel": args.kernel,
        "hardware": f"{torch.cuda.get_device_name(0)} ({arch})",
        "versions": {**versions(), **({"origin": args.origin} if args.origin else {})},
        "date": started.date().isoformat(),
        "command": "python -m bench.kernel_truth " + " ".join(sys.argv[1:] if argv is None else argv),
        "tolerance": tolerance,
        **notes,
        "points": points,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"{args.kernel}.{arch}.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    counts = {o: sum(p["outcome"] == o for p in points) for o in ("correct", "loud", "silent")}
    print(
        f"{path}: {len(points)} points, {counts}, {(datetime.datetime.now(datetime.timezone.utc) - started).seconds} s"
    )
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except KeyboardInterrupt:
        traceback.print_exc()
        raise SystemExit(130) from None
