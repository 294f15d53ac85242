"""Fixed FP4 MoE / MXFP4 shape grids of FlashInfer's and vLLM's own tests, as plain data.

Every :class:`Grid` names the repository, revision, file and test function it was read from, and holds the
shapes that test actually runs: the cartesian product of its ``pytest.mark.parametrize`` lists minus the
combinations the test (or its shared ``skip_checks``) skips. Points that differ only in dtype, bias, autotune,
layout flags, LoRA mode or other non-shape parameters are deduplicated. All these tests are single-GPU, so
every point is per rank (TP=1).

Conventions
-----------
* ``MoeGridPoint.intermediate`` is the per-expert intermediate size I (``w13`` has ``2*I`` rows when
  ``gated``, ``I`` rows otherwise); ``hidden`` is H; ``experts`` is the number of routed experts whose
  weights this rank holds (the EP shard size where a test shards); ``tokens`` is the number of token rows
  fed to the layer.
* ``tokens == 0`` marks a weight-preparation-only test (no forward pass, no routing); ``top_k`` is then 1
  as a placeholder.
* Fused shared experts (FlashInfer ``num_fused_shared_experts = S``) are not counted in ``experts``; those
  layers carry ``experts + S`` weight rows. They are named in the grid names (``fused_shared``).
* ``LinearGridPoint`` is a dense GEMM: activations ``(m, k)`` times weight ``(n, k)``, output ``(m, n)``.
* Format ``"mxfp4"`` covers MXFP4 weights with any activation (MXFP8, BF16, FP8, MXFP4); the grid name says
  which. Format ``"nvfp4"`` is NVFP4 weights (and NVFP4 activations unless the name says otherwise).

Sources read (the grids below cite them)
----------------------------------------
* flashinfer-ai/flashinfer @ ``fb28d7242b3506a2348265962041acc1fb56cca4`` (main, 2026-08-22,
  ``version.txt`` 0.6.18), the newest revision read. The installed flashinfer-python 0.7.4 wheel
  was built from ``77039051b0be921788dc2784ec41423b558878ec``, which that revision does not contain, and the
  wheel ships no tests; so these grids may differ from the 0.7.4 tag.

  - ``tests/moe/test_trtllm_gen_fused_moe.py``: FP4 (``FP4Moe``) cases of ``test_sigmoid_routing``,
    ``test_deepseekv3_routing``, ``test_topk_routing``, ``test_llama4_routing``, ``test_fp4_moe_gemm_bias``,
    ``test_fp4_moe_gemm_bias_changes_output``, ``test_deepseek_ngroup1_block_per_token_routing``,
    ``test_moe_lora_delta`` and ``test_fp4_block_scale_deepseekv3_unfinalized_weight_dtype``, filtered by
    ``tests/moe/utils.py::skip_checks`` (reproduced in :func:`bench.grids.flashinfer._trtllm_gen_skipped`).
  - ``tests/moe/test_trtllm_gen_fused_moe_routing_renormalize_fp4.py::test_renormalize_routing``: at this
    revision the FP4 Renormalize grid (``RENORMALIZE_*`` lists in ``trtllm_gen_fused_moe_utils.py``) lives
    in this sibling file, not in ``test_trtllm_gen_fused_moe.py``; it is included.
  - ``tests/moe/test_trtllm_cutlass_fused_moe.py``: ``test_moe_nvfp4``, ``test_moe_nvfp4_unaligned_hidden_size``,
    ``test_moe_nvfp4_ndim_padding_safety``, ``test_moe_nvfp4_unswizzled_input_sf``, ``test_moe_mxfp8_mxfp4``,
    ``test_moe_mxfp8_mxfp4_ndim_padding_safety``, ``test_moe_bf16_mxfp4`` (SM90 W4A16),
    ``test_moe_bf16_mxfp4_hopper_{correctness,coverage,activations}`` (SM90 W4A16) and
    ``test_moe_fp8_mxfp4_humming_prescale_hopper_correctness`` (SM90 FP8 x MXFP4).
  - ``tests/moe/test_unified_moe_fuzz.py``: the random pools ``_HIDDEN``, ``_INTERMED``, ``_EXPERTS``,
    ``_TOPK``, ``_TOKENS`` and ``_WEIGHT_ELEM_BUDGET``, the FP4 entries of ``_CURATED`` and
    ``test_autotune_cache_coherence``.

* vllm-project/vllm (main, 2026), each file at the commit named:

  - ``tests/kernels/moe/test_nvfp4_moe.py`` @ ``07b13497a9b52274d334090a9a8e04d5ec9ca7e9``
  - ``tests/kernels/moe/test_flashinfer_moe.py`` @ ``07bd9393a2bad56513f86d70a9e95d477aa597f0`` (the
    version at ``3ff2de9c96353a55f7e7a818b9d0c63b9f1e7eeb`` has the same grid)
  - ``tests/kernels/moe/test_flashinfer_nvfp4_cosine_similarity.py`` @ ``978a6a5e220bb6da7f3b50d65a730cae0fe911ae``
  - ``tests/kernels/moe/test_mxfp4_moe.py``: the newest revision read (83,682 characters; it has the SM90
    interleave, the MXFP8 x MXFP4 CUTLASS test and the ROCm oracle tests), whose commit was not recorded;
    the older versions at ``a485508d4114aa673cb266fa7e43b447f697451b`` and
    ``02d0c80196fc2e858c5c53f7751ef93a628a1217`` have the same trtllm-gen grid.
  - ``tests/quantization/test_trtllm_nvfp4_hidden_dim_padding.py`` @ ``12fef2fce5771cb157a72ca45f009bdd71b8615a``
  - ``tests/kernels/quantization/test_rocm_mxfp4.py`` @ ``01aae91ba16d313a628cf6e777178037f5f38ffa`` (the
    version at ``0ae1b30ba1d3a0a5e0bd59536ab69e70a07d8716`` is older and lacks the ASM guard tests)
  - ``tests/kernels/quantization/test_marlin_utils_fp4_padding.py`` @ ``c47bfadcf6847993a26bc0148b88db0f6a5ef158``

Ambiguities and judgement calls
-------------------------------
* trtllm-gen ``skip_checks`` skips SwiGLU when ``H > 1024`` or ``I > 1024`` ("for testing speed"), skips
  GeGLU above 128 tokens or outside NVFP4 / MXFP4xMXFP8, allows non-gated Relu2 only for NVFP4 among the FP4
  modes, and skips fp32 routing logits for both MXFP4 modes. ``MxFP4xBf16`` on SM103 is an xfail, not a skip;
  it is kept (these grids assume SM100).
* ``test_deepseekv3_routing`` runs fp32 logits only, so its MXFP4 cases are all skipped: it contributes NVFP4
  points only.
* ``test_topk_routing``'s ``Situ`` activation is gated (``flashinfer.tllm_enums._GATED_ACTIVATION_TYPES``).
* The fuzzer samples its pools with ``random.Random(seed)`` (seeds ``FLASHINFER_UMOE_FUZZ_SEED + i`` for 160
  tests by default). ``FUZZ_POOL_*`` is the full product of the size pools under the weight budget with
  non-EP experts; the fuzzer additionally draws EP shards (``local = E/2`` or ``E/4``, about 30 % of
  pre-routed draws when ``E >= 16``), forces ``top_k = 1`` for Llama4, restricts DeepSeekV3 ``top_k`` to
  experts reachable after the group mask, caps in-kernel-routed experts per method
  (``_FROMLOGITS_MAX_EXPERTS``), and always uses SwiGLU. It is a superset of what any seed draws.
* vLLM ``test_mxfp4_moe.py`` also parametrises Quark model-loading smoke tests (model ids, TP 1-8); they have
  no explicit layer shapes and are not encoded.
* In vLLM's ``test_trtllm_nvfp4_hidden_dim_padding.py`` and ``test_marlin_utils_fp4_padding.py`` the tensors
  are synthetic (scale tensors need not match the weight sizes); the points record the dimension each test
  pads, read from the weight tensors, with ``tokens = 0``.
* ``test_rocm_mxfp4.py`` writes A4W4 and preshuffled shapes as ``(M, K, N)`` and skinny shapes as ``M`` x
  ``(N, K)``; both are normalised to ``LinearGridPoint(m, n, k)`` here. Its ASM-swizzle truth table is keyed by
  the weight-scale shape ``(N, K/32)``: it lives once, as ``backends.mxfp4_linear.VLLM_GUARD_TABLE``, and
  :mod:`bench.grids_adapter` runs its 2-D rows as a grid, not as GEMM points.
"""

from __future__ import annotations

from bench.grids.flashinfer import CUTLASS_GRIDS, FUZZ_GRIDS, TRTLLM_GEN_GRIDS
from bench.grids.model import VLLM_ROCM_MXFP4, Grid, LinearGridPoint, MoeGridPoint
from bench.grids.vllm import VLLM_LINEAR_GRIDS, VLLM_MOE_GRIDS

__all__ = ["GRIDS", "VLLM_ROCM_MXFP4", "Grid", "LinearGridPoint", "MoeGridPoint"]

GRIDS: tuple[Grid, ...] = (*TRTLLM_GEN_GRIDS, *CUTLASS_GRIDS, *FUZZ_GRIDS, *VLLM_MOE_GRIDS, *VLLM_LINEAR_GRIDS)
"""Every grid: FlashInfer's (:mod:`bench.grids.flashinfer`), then vLLM's (:mod:`bench.grids.vllm`)."""
