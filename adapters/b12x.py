"""The ``b12x`` kernel library's NVFP4 MoE (vLLM 0.33.0's ``B12X`` backend): acceptance rules.

``b12x`` (PyPI ``b12x``, 1.5.1) is a CuTe DSL kernel library for SM120/SM121 (RTX PRO 6000, RTX 50,
DGX Spark): vLLM's ``B12xExperts._supports_current_device`` asks ``is_device_capability_family(120)``, and
its weight preparation (``b12x.moe.fused_moe.plan_weights`` / ``prepare_weights``) runs on that GPU. The
suite installs nothing of it: vLLM's own ``prepare_nvfp4_moe_layer_for_b12x``
(``quantization/utils/b12x_moe.py``), which pads and swizzles before b12x sees the weights, is pure torch
and runs on CPU (the vLLM subject calls it).

The rules, from vLLM 0.33.0's preparation:

* gated FC1 is padded per half to a multiple of 64 (``_pad_gated_weights``), so the 128x4 swizzle of
  its scales (``swizzle_blockscale``) adds no rows; a gated layer whose swizzle would add rows raises
  ``RuntimeError("gated NVFP4 MoE padding must precede scale swizzling")``;
* a non-gated layer's FC1 rows are padded at their end to the swizzle's 128 rows (with FC2's K);
* the hidden size is not padded: the swizzled scale buffers carry their own row and column padding.

W4A4 ModelOpt weights reach b12x with FC1 ``[gate; up]`` (``w13_layout = "w31"``, gate first, in b12x's
naming); the W4A16 path swaps to ``[up; gate]`` (``"w13"``).
"""

from __future__ import annotations

from reference.sizes import round_up

SWIZZLE_ROWS = 128
"""Rows of a 128x4 scale-swizzle atom (``swizzle_blockscale`` pads FC1 rows to it)."""


def b12x_nvfp4_violations(intermediate: int, hidden: int, gated: bool) -> list[str]:
    """Why vLLM's B12X preparation would reject (or have to re-pad) expert weights of padded sizes
    ``(Ip, Hp)``: the 128x4 scale swizzle must add no FC1 rows (``F·Ip % 128``), and ``Ip``, ``Hp``
    must be whole NVFP4 blocks (``% 16``). Empty when every rule holds."""
    rows = (2 if gated else 1) * intermediate
    problems: list[str] = []
    if rows % SWIZZLE_ROWS:
        problems.append(
            f"the 128x4 scale swizzle pads FC1 from {rows} to {round_up(rows, SWIZZLE_ROWS)} rows (gated={gated}): "
            "vLLM pads gated halves to 64 before it, or raises"
        )
    if intermediate % 16:
        problems.append(f"intermediate size {intermediate} is not a multiple of 16 (NVFP4 blocks)")
    if hidden % 16:
        problems.append(f"hidden size {hidden} is not a multiple of 16 (NVFP4 blocks)")
    return problems
