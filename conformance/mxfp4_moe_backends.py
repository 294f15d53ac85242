"""The ``mxfp4_moe`` oracle: how each backend's kernel reads FC1 rows and which padded sizes it accepts.

Written from the libraries, never from the policies under test: FlashInfer's own helpers decide
for its two backends (:mod:`adapters.flashinfer_mxfp4`), the reference AITER layouts and AITER's
issues for AITER, vLLM's Marlin MoE support check for Marlin.
"""

from __future__ import annotations

from adapters import flashinfer_mxfp4 as fim
from reference.formats import MXFP4_BLOCK
from reference.layouts import Fc1Layout
from reference.sizes import round_up
from subjects.mxfp4_moe import Mxfp4MoeBackend

KERNEL_FC1_LAYOUT = {
    # [up; gate] after FlashInfer's gated reorder: pairs (u_j, g_j); its prep then only row-shuffles
    Mxfp4MoeBackend.FLASHINFER_TRTLLM: Fc1Layout.UP_GATE_INTERLEAVED,
    # cutlass_fused_moe's w31: activation on the second half (kernels.md §10)
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90: Fc1Layout.UP_GATE,
    # aiter.fused_moe, GateMode.SEPARATED: activation on the first half
    Mxfp4MoeBackend.AITER: Fc1Layout.GATE_UP,
    # fused_marlin_moe + silu_and_mul: gate = first half, each shard padded to its 64-row tile. vLLM's
    # gpt-oss Marlin path instead keeps the checkpoint's pairs for swigluoai_and_mul (x[..., ::2] is
    # gate); the contract models the SiLU path (DeepSeek-V4.1-Flash, vLLM PR #56697) for every activation
    Mxfp4MoeBackend.MARLIN: Fc1Layout.GATE_UP,
}
"""How each kernel splits the fused FC1 rows into gate and up."""


def aiter_violations(intermediate: int, hidden: int, experts: int) -> list[str]:
    """Why AITER's per_1x32 MoE (as vLLM's Quark OCP-MX path prepares it) rejects ``(I, H)`` for ``E`` experts.

    ``shuffle_weight`` (16, 16) needs ``N % 16`` and ``K % 64``; ``e8m0_shuffle`` pads the scale
    viewed as ``[E·N, K/32]`` to ``(ru(E·N, 256), ru(K/32, 8))`` and vLLM views it back as
    ``[E, N, -1]``, which holds only without padding; CK-Tile stage 2 mis-indexes scales unless
    ``I % 256`` (AITER #5233); the gfx950 stage-1 MXFP4 kernels are built with ``tile_k = 256``
    only (vLLM PR #55104), so ``H % 256``.
    """
    problems: list[str] = []
    for label, n, k in (("FC1", 2 * intermediate, hidden), ("FC2", hidden, intermediate)):
        if n % 16 or k % 64:
            problems.append(f"{label} weights [{n}, {k // 2}] bytes: shuffle_weight needs N % 16 and K % 64")
        rows, cols = experts * n, k // MXFP4_BLOCK
        padded = (round_up(rows, 256), round_up(cols, 8))
        if padded != (rows, cols):
            problems.append(
                f"{label} scales [{experts}·{n}, {cols}]: e8m0_shuffle pads to {padded}, so vLLM's "
                f".view({experts}, {n}, -1) does not give back [{experts}, {n}, {cols}]"
            )
    if intermediate % 256:
        problems.append(f"inter_dim {intermediate} % 256 != 0: CK-Tile stage 2 mis-indexes E8M0 scales (AITER #5233)")
    if hidden % 256:
        problems.append(f"hidden size {hidden} % 256 != 0: gfx950 stage-1 MXFP4 kernels use tile_k = 256")
    return problems


def marlin_violations(intermediate: int, hidden: int) -> list[str]:
    """vLLM ``check_moe_marlin_supports_layer``: "moe marlin requires n % 128 == 0 and k % 64 == 0"
    for gate-up ``(n, k) = (2I, H)`` and down ``(H, I)``, i.e. ``H % 128`` and ``I % max(64, 32)``."""
    problems: list[str] = []
    if hidden % 128:
        problems.append(f"hidden size {hidden} is not a multiple of 128 (Marlin MoE down-projection n)")
    if intermediate % 64:
        problems.append(f"intermediate size {intermediate} is not a multiple of 64 (Marlin MoE per-shard tile)")
    return problems


def violations(backend: Mxfp4MoeBackend, intermediate: int, hidden: int, experts: int) -> list[str]:
    """Why ``backend`` rejects gated MXFP4 experts padded to ``(I, H)``; empty when it accepts them."""
    if backend is Mxfp4MoeBackend.FLASHINFER_TRTLLM:
        return fim.trtllm_mxfp4_violations(intermediate, hidden)
    if backend is Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90:
        return fim.sm90_violations(intermediate, hidden)
    if backend is Mxfp4MoeBackend.AITER:
        return aiter_violations(intermediate, hidden, experts)
    return marlin_violations(intermediate, hidden)
