"""Standalone reproduction: triton_kernels' Hopper MXFP4 ``matmul_ogs`` is silently wrong when K / 32 is odd.

Needs only torch, Triton and triton_kernels (its own package, or vLLM's vendored copy put on the path as
``triton_kernels``) on an SM90 GPU (H100/H200). Run ``python scripts/repro_matmul_ogs_odd_k.py``.

The weights are prepared as vLLM 0.33.0's ``_swizzle_mxfp4`` prepares them on Hopper: ``[E, K/2, N]`` E2M1
bytes in ``HopperMXValueLayout(mx_axis=1)``, ``[E, K/32, N]`` UE8M0 scales zero-padded to a multiple of 4
groups in ``HopperMXScaleLayout(mx_axis=1, num_warps=8)``, ``split_k = 1``. Each K is compared with an fp32
reference on the same bf16 activations; the printed error is ``max |got - want| / max |want|``. Expected
(measured on an H200, torch 2.11.0+cu130, Triton 3.6.0, triton_kernels 3.5.1 from vLLM 0.33.0): errors
around 1e-3 for K % 64 == 0 and 0.2 to 1 for K % 64 == 32, where no error is raised. Zero-padding such a K
to a multiple of 64 (codes 0, scales 127) makes it right. Exit status 1 when an odd-group K is wrong.
"""

from __future__ import annotations

import sys

import torch
from triton_kernels.matmul_ogs import FlexCtx, PrecisionConfig, matmul_ogs
from triton_kernels.matmul_ogs_details.opt_flags import update_opt_flags_constraints
from triton_kernels.numerics import InFlexData
from triton_kernels.tensor import FP4, convert_layout, wrap_torch_tensor
from triton_kernels.tensor_details.layout import HopperMXScaleLayout, HopperMXValueLayout

E2M1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def dequantize(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``codes [E, N, K/2]`` (low nibble first) and ``scales [E, N, K/32]`` -> fp32 ``[E, N, K]``."""
    values = torch.stack([E2M1[(codes & 0xF).long()], E2M1[(codes >> 4).long()]], dim=-1).flatten(-2)
    return values * torch.exp2(scales.float() - 127).repeat_interleave(32, dim=-1)


def run(k: int, n: int = 256, m: int = 16, experts: int = 1, seed: int = 0) -> float:
    g = torch.Generator().manual_seed(seed)
    codes = torch.randint(0, 256, (experts, n, k // 2), generator=g, dtype=torch.uint8)
    scales = torch.randint(118, 123, (experts, n, k // 32), generator=g, dtype=torch.uint8)
    x = torch.randn(experts, m, k, generator=g).to(torch.bfloat16)
    want = x.float() @ dequantize(codes, scales).transpose(-2, -1)

    update_opt_flags_constraints({"split_k": 1})
    groups = -(-scales.shape[-1] // 4) * 4
    padded = torch.nn.functional.pad(scales, (0, groups - scales.shape[-1]))
    w = convert_layout(wrap_torch_tensor(codes.cuda().transpose(-2, -1), dtype=FP4), HopperMXValueLayout, mx_axis=1)
    s = convert_layout(wrap_torch_tensor(padded.cuda().transpose(-2, -1)), HopperMXScaleLayout, mx_axis=1, num_warps=8)
    precision = PrecisionConfig(weight_scale=s, flex_ctx=FlexCtx(rhs_data=InFlexData()))
    got = matmul_ogs(x.cuda(), w, None, precision_config=precision).float().cpu()
    return float((got - want).abs().max() / want.abs().max())


def main() -> int:
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}")
    wrong = []
    for k in (64, 96, 128, 160, 192, 224, 2880, 2912):
        error = run(k)
        odd = (k // 32) % 2 == 1
        print(f"K = {k:5d} ({k // 32} groups, {'odd' if odd else 'even'}): max error / max |want| = {error:.3g}")
        if odd and error > 0.05:
            wrong.append(k)
    print(f"silently wrong at K = {wrong}" if wrong else "every K right")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
