"""The ``vllm`` subject's ledger: upstream bugs of vLLM 0.33.0 that the properties catch, each a
:class:`~subjects.registry.KnownFailure` with its upstream link (:data:`VLLM_KNOWN_FAILURES`,
:data:`VLLM_SHARDING_FAILURES`)."""

from __future__ import annotations

from typing import Any

from adapters import triton_kernels
from backends.fp8_moe import CONTRACT as FP8_MOE
from backends.fp8_moe import Fp8MoeBackend
from backends.kernel_defects import AITER_LINEAR_DEFECTS, covering
from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import CONTRACT as NVFP4_MOE
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from reference.layouts import asm_scale_swizzle_ok
from reference.sizes import round_up
from subjects.mxfp4_moe import TRITON_ODD_GROUP_FAILURES
from subjects.registry import Hardware, KnownFailure, Reach
from subjects.vllm.sharding import cuts_groups_per_projection, gpt_oss_uneven_experts


def _asm_force_triton_rows(case: Any) -> bool:
    """A 2-D scale (``ScaleShapeCase``) the layout guard accepts that a required ASM defect record covers
    (the 96-row rule of vLLM PR #58139)."""
    shape = tuple(case.shape)
    defects = covering(AITER_LINEAR_DEFECTS, AiterLinearPath.ASM.value, shape)
    return len(shape) == 2 and asm_scale_swizzle_ok(*shape) and any(d.required for d in defects)


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
TRITON_STACKED_REACH = Reach.latent(
    "TRITON's experts accept only SWIGLUOAI (gpt-oss, converted by "
    "convert_gpt_oss_weight_to_mxfp4_moe_kernel_format); a stacked (SiLU) MXFP4 model is refused even "
    "with --moe-backend triton"
)
"""Why the stacked-TRITON defect is latent (its entries: the properties' failures and the guard's at H = 64)."""
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
        reach=Reach.default(
            "Gemma-4-26B-A4B NVFP4 at TP2 / TP4 and Qwen3.8-Flash-Next NVFP4 at TP4 on SM120, where "
            "FLASHINFER_CUTLASS is the first backend of select_nvfp4_moe_backend's list that supports the GPU "
            "(TRT-LLM and CuteDSL are SM100-only); on SM100 behind --moe-backend flashinfer_cutlass"
        ),
        hardware=(Hardware.SM100, Hardware.SM120),
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
        reach=Reach.flag(
            "--moe-backend cutlass (select_nvfp4_moe_backend takes FLASHINFER_CUTLASS before VLLM_CUTLASS)"
        ),
        hardware=(Hardware.SM100, Hardware.SM120),
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
        reach=Reach.flag(
            "--moe-backend cutlass with an NVFP4 MoE checkpoint whose hidden size is not a multiple of 128 (PR "
            "#35497: 2880)"
        ),
        hardware=(Hardware.SM100, Hardware.SM120),
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
        reach=Reach.flag(
            "VLLM_ROCM_USE_AITER=1 (off by default; rocm_aiter_ops.is_asm_fp4_gemm_supported needs it) with "
            "Qwen3.8 MXFP4 at TP1 (GDN in_proj_ba, 96-row scales)"
        ),
        hardware=(Hardware.GFX950,),
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
            reach=Reach.flag(
                "VLLM_ROCM_USE_AITER=1 (off by default) with Quark OCP-MX W4A4 MoE checkpoints whose I/tp % 256 != 0 "
                "(MiniMax-M3 at TP8: 384)"
            ),
            hardware=(Hardware.GFX950,),
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
        reach=Reach.default(
            "gpt-oss on SM120: with BF16 activations _get_priority_backends_for_gpt_oss reaches MARLIN first "
            "there (TRT-LLM is SM100, FLASHINFER_CUTLASS_MXFP4_BF16 SM90, TRITON moved after Marlin; gpt-oss TP2:"
            " 1440 -> 1536, not 1472), as _get_priority_backends does for DeepSeek-V4 (V4.1-Flash TP8: 288 -> "
            "384) on SM90 and SM120 (DeepSeek-V4 I 3072 at TP16: 192 -> 256, docs/matrix.md); SM90 and SM100 "
            "behind --moe-backend marlin for gpt-oss"
        ),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
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
        reach=Reach.default(
            "gpt-oss on SM120, where MARLIN is the first backend _get_priority_backends_for_gpt_oss finds "
            "supported with BF16 activations (H 2880 -> 3072: +2.58 GiB per GPU for gpt-oss-120b at TP1, "
            "findings/vllm-marlin-mxfp4-hidden-over-padding); SM90 and SM100 behind --moe-backend marlin"
        ),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
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
        reach=Reach.latent(
            "TRITON's experts (OAITritonExperts, OAITritonMxfp4ExpertsMonolithic) accept only SWIGLUOAI, gpt-"
            "oss's activation, and gpt-oss checkpoints take convert_gpt_oss_weight_to_mxfp4_moe_kernel_format; a "
            "stacked (SiLU) MXFP4 model is refused even with --moe-backend triton"
        ),
        hardware=(Hardware.SM90,),
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
            reach=Reach.latent("no MXFP4 MoE model vLLM runs on TRITON has H % 64 == 32 (gpt-oss: 2880, 90 groups)"),
            hardware=(Hardware.SM90,),
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
            reach=TRITON_STACKED_REACH,
            hardware=(Hardware.SM90,),
        )
        for check, match in (
            ("check_gate_up_layout", r"w13 gate rows as triton-kernels-sm90 reads them .*block moved or changed"),
            ("check_padding_invariance", r"padding changed the MoE output \(triton-kernels-sm90 reads FC1 rows"),
        )
    ),
    # The same defect seen first by harness.hygiene.FalseLayoutDeclared: at H = 64 the scales' last dim is 2
    # groups, which shuffle_weight leaves in place, so their rows stay stacked whole and the guard names them on
    # every guarded call, before the properties above look (the adapter labels the rows with the pairs swiglu reads).
    KnownFailure(
        MXFP4_MOE,
        TRITON_STACKED,
        TRITON_SOURCE,
        applies=lambda config: _triton_stacked(config, odd_groups=False) and config.shape.hidden == 64,
        raises=AssertionError,
        match=r"holds \w+'s gate/up rows in gate;up order, but fc1_layout says g0,u0,g1,u1\b",
        backend=Mxfp4MoeBackend.TRITON_SM90.value,
        reach=TRITON_STACKED_REACH,
        hardware=(Hardware.SM90,),
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
        reach=Reach.latent(
            "vLLM selects FLASHINFER_MOE_EP_DEEP_GEMM only with DeepSeek-V4 routing, whose hidden sizes are "
            "multiples of 128"
        ),
        hardware=(Hardware.SM100,),
    ),
    KnownFailure(
        FP8_MOE,
        "FLASHINFER_TRTLLM block FP8 (DeepSeekFp8): vLLM never pads the hidden size of a block-FP8 layer, and "
        "prepare_fp8_moe_layer_for_fi's _shuffle_deepseek_fp8_moe_weights views FC1 [E, 2I, H] as "
        "[E, 2I, H // 128, 128], which raises at load for H % 128 != 0 (FlashInfer's launcher asks hidden_size % "
        "128 too); TrtLlmFp8Experts has no _supports_shape, so select_fp8_moe_backend does not fall back to "
        "another backend; found by this suite, not reported upstream",
        "https://github.com/vllm-project/vllm/blob/v0.33.0/vllm/model_executor/layers/quantization/utils/"
        "flashinfer_utils.py",
        applies=lambda shape: shape.hidden % 128 != 0 and shape.intermediate % 128 == 0,
        raises=AssertionError,
        match=r"policy refused a shape real models produce .*vLLM FLASHINFER_TRTLLM process_weights_after_loading: "
        r"shape '\[\d+, \d+, \d+, 128\]' is invalid",
        backend=Fp8MoeBackend.FLASHINFER_TRTLLM.value,
        raised_in=("vllm.model_executor.layers.quantization.utils.flashinfer_utils:_shuffle_deepseek_fp8_moe_weights",),
        reach=Reach.latent(
            "no catalogued block-FP8 model has a hidden size that is not a multiple of 128; where one did, "
            "FLASHINFER_TRTLLM is select_fp8_moe_backend's first CUDA candidate on SM100 (AITER is ROCm-only), so "
            "it would fail to load by default there"
        ),
        hardware=(Hardware.SM100,),
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
            reach=Reach.default(
                "Nemotron-3-Nano NVFP4 (I 1856) and Gemma-4-26B-A4B NVFP4 (I 704) at TP8, DeepSeek-V4.1-Flash "
                "(I 2304) at TP16 (144 channels per rank; Marlin on SM90 and SM120, TRT-LLM on SM100, docs/matrix.md) "
                "with default flags: RoutedExperts.weight_loader is every NVFP4 backend's loader, Quark OCP-MX MXFP4's "
                "on ROCm, and DeepSeek-V4.1's (models/deepseek_v41/nvidia/model.py load_weights hands each expert "
                "tensor to the parameter's weight_loader)"
            ),
            hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120, Hardware.GFX950),
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
        reach=Reach.flag(
            "--enable-expert-parallel at an EP size that does not divide gpt-oss's 32 / 128 experts (e.g. DP 3 x TP 2)"
        ),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120, Hardware.GFX950),
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
        reach=Reach.flag("--enable-expert-parallel with more EP ranks than gpt-oss's experts (gpt-oss-20b: over 32)"),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120, Hardware.GFX950),
    ),
)
