"""vLLM's own CUTLASS NVFP4 MoE (``cutlass_moe_fp4``, vLLM 0.33.0 ``VLLM_CUTLASS``): acceptance rules.

The kernel is vLLM's compiled ``cutlass_fp4_moe_mm`` (``csrc/quantization/fp4/nvfp4_blockwise_moe_kernel.cu``,
SM100), driven by ``run_cutlass_moe_fp4`` (``fused_moe/experts/cutlass_moe.py``); nothing of it runs
without vLLM's CUDA build. Its weights come from ``prepare_nvfp4_moe_layer_for_fi_or_cutlass``, which keeps
vLLM's ``[w1; w3]`` (``[gate; up]``) order for this backend and 128x4-swizzles both scale tensors
(``swizzle_blockscale``: rows to 128, scale columns to 4) without padding the weights to match.

The kernel's grouped GEMM finds expert ``e``'s weight scales at ``e · N · (K/16)`` from the logical
``N`` and ``K``, while each expert's swizzled block holds ``ru(N, 128) · ru(K/16, 4)`` bytes. So the
scales of every expert after the first are read from the wrong place unless the swizzle adds nothing:
FC1 (``N = F·Ip``, ``K = Hp``) and FC2 (``N = Hp``, ``K = Ip``) need ``F·Ip % 128``, ``Hp % 128``,
``Hp/16 % 4`` and ``Ip/16 % 4``. vLLM PR #35497 reports the FC2 case (hidden 2880 -> scales 2944,
"every expert > 0 reads scale data at the wrong offset", garbage output) and was closed unmerged;
vLLM 0.33.0's preparation still leaves ``w2`` at ``H`` rows.
"""

from __future__ import annotations

from reference.sizes import round_up

SWIZZLE_ROWS, SWIZZLE_COLS = 128, 4
"""The 128x4 scale-swizzle atom."""


def vllm_cutlass_nvfp4_violations(intermediate: int, hidden: int, gated: bool) -> list[str]:
    """Why ``cutlass_moe_fp4`` would read NVFP4 expert weights of padded sizes ``(Ip, Hp)`` wrongly: for each
    GEMM, the 128x4-swizzled scales of one expert must be exactly ``N · K/16`` bytes (the kernel's expert
    stride). Empty when every rule holds."""
    f = 2 if gated else 1
    problems: list[str] = []
    for label, n, k in (("FC1", f * intermediate, hidden), ("FC2", hidden, intermediate)):
        swizzled = round_up(n, SWIZZLE_ROWS) * round_up(k // 16, SWIZZLE_COLS)
        if k % 16 or swizzled != n * (k // 16):
            problems.append(
                f"{label} scales: the kernel strides experts by N x K/16 = {n} x {k // 16} bytes but each swizzled "
                f"expert holds {round_up(n, SWIZZLE_ROWS)} x {round_up(k // 16, SWIZZLE_COLS)} (needs N % 128 and "
                "K % 64; vLLM PR #35497: every expert after the first reads wrong scales)"
            )
    return problems
