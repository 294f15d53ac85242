"""The ``sglang`` subject's ledger: upstream bugs of SGLang 0.5.23 that the properties catch, each a
:class:`~subjects.registry.KnownFailure` with its upstream link (:data:`SGLANG_KNOWN_FAILURES`,
:data:`SGLANG_SHARDING_FAILURES`), and the upstream loaders entries name as ``raised_in``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from adapters import triton_kernels as tk
from backends.fp8_moe import CONTRACT as FP8_MOE
from backends.fp8_moe import Fp8MoeBackend
from backends.mxfp4_linear import asm_gemm_eligible
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import CONTRACT as NVFP4_MOE
from backends.nvfp4_moe import Nvfp4MoeBackend
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from reference.sizes import round_up
from strategies.catalog import CheckpointForm
from subjects.mxfp4_moe import TRITON_ODD_GROUP_FAILURES
from subjects.registry import Hardware, KnownFailure, Reach
from subjects.sglang.bridge import MXFP4_BACKENDS, NVFP4_BACKENDS, SGLANG_SOURCE
from subjects.sglang.sharding import FP8_BACKEND, MXFP4_BACKEND, NVFP4_BACKEND

FUSED_MOE_LOADERS = tuple(
    f"sglang.srt.layers.moe.fused_moe_triton.layer:FusedMoE.{f}" for f in ("_load_w13", "_load_w2")
)
"""The per-projection expert loaders whose copy into a method's buffer raises torch's size-mismatch error (the
ledger's ``raised_in``: the same message from an adapter's own code is no upstream bug)."""

GPT_OSS_LOADERS = ("sglang.srt.models.gpt_oss:GptOssForCausalLM._load_mxfp4_experts_weights",)
"""gpt-oss's fused MXFP4 expert loader, whose copy of whole 32-blocks overruns an ``I/tp`` buffer."""


TRTLLM_NVFP4 = tuple(b for b, sel in NVFP4_BACKENDS.items() if sel.runner == "flashinfer_trtllm")
"""The suite's NVFP4 backends SGLang runs on its TRT-LLM branch (static and per-token activation scales)."""


def _hidden_left_unpadded(backend: Nvfp4MoeBackend, rule: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """``rule``, on the shapes whose hidden size SGLang's TRT-LLM branch leaves unpadded on ``backend``
    (``trtllm_nvfp4_hidden_alignment`` is 1, except 512 for per-token activation scales and non-gated layers)."""
    per_token = NVFP4_BACKENDS[backend].per_token_activation
    return lambda shape: (shape.gated or not per_token) and rule(shape)


def _gated_rows_not_128(shape: Any) -> bool:
    """A gated NVFP4 layer whose fused FC1 rows ``2I`` the 128x4 scale swizzle would pad."""
    return shape.gated and (2 * shape.intermediate) % 128 != 0


def _hidden_not_128(shape: Any) -> bool:
    """A hidden size FlashInfer's FC2 row shuffle and 128x4 swizzle reject unpadded (``H % 128``)."""
    return shape.hidden % 128 != 0


def _hidden_128_not_256(shape: Any) -> bool:
    """A hidden size that is a multiple of 128 but not of 256 (Nemotron-3-Nano's 2688)."""
    return shape.hidden % 128 == 0 and shape.hidden % 256 != 0


def _gated_halves_not_64(shape: Any) -> bool:
    """A gated NVFP4 layer whose gate/up halves are not whole 64-row groups (``2I % 128 != 0``)."""
    return shape.gated and shape.intermediate % 64 != 0


def _cutedsl_hidden_not_256(shape: Any) -> bool:
    """A hidden size not a multiple of 256 that SGLang's CuteDSL branch reaches (it refuses gated layers with
    partial 64-row groups first, :func:`_gated_halves_not_64`)."""
    return shape.hidden % 256 != 0 and not _gated_halves_not_64(shape)


def _small_n_asm_capable(config: Any) -> bool:
    """A scale the suite's contract sends to ASM (:func:`backends.mxfp4_linear.asm_gemm_eligible`) with
    ``N <= 128``: SGLang 0.5.23 keeps it on Triton."""
    shape = tuple(config.shape if hasattr(config, "shape") else config.scale_shape)
    return asm_gemm_eligible(shape) and shape[0] <= 128


def _hidden_256_over_128(config: Any) -> bool:
    """An MXFP4 MoE hidden size that rounding to 256 pads further than rounding to 128 (gpt-oss 2880)."""
    h = config.shape.hidden
    return round_up(h, 256) != round_up(h, 128)


def _stacked_hidden_padded(config: Any) -> bool:
    """A stacked ``[gate; up]`` MXFP4 checkpoint without biases (with biases the adapter loads it as gpt-oss's,
    :func:`subjects.sglang.mxfp4_moe.mxfp4_layer`) whose hidden size every SGLang MXFP4 backend pads (to 256)."""
    return config.form is CheckpointForm.STACKED and not config.bias and config.shape.hidden % 256 != 0


def _quark_hidden_not_256(config: Any) -> bool:
    """A stacked checkpoint without biases (Quark OCP-MX on AITER) whose hidden size is not a multiple of 256."""
    return config.form is CheckpointForm.STACKED and not config.bias and config.shape.hidden % 256 != 0


def _deep_gemm_k_not_128(config: Any) -> bool:
    """An MXFP4 MoE shape whose GEMM K (``H`` for FC1, ``I`` for FC2) is not whole 128-element activation groups."""
    return config.shape.hidden % 128 != 0 or config.shape.intermediate % 128 != 0


def _gpt_oss_form(config: Any) -> bool:
    """A checkpoint SGLang loads as gpt-oss's (row-interleaved pairs, or expert biases: :func:`subjects.sglang.mxfp4_moe.gpt_oss_family`)."""
    return config.form.layout.interleaved or config.bias


def _marlin_refused_hidden(config: Any) -> bool:
    """A hidden size SGLang's Marlin check refuses before padding it (``hidden_size % 64``)."""
    return config.shape.hidden % 64 != 0


def _inter_128_over_64(config: Any) -> bool:
    """An MXFP4 MoE intermediate size that rounding to 128 pads further than rounding to 64 (288, 192)."""
    i = config.shape.intermediate
    return round_up(i, 128) != round_up(i, 64)


HIDDEN_256_BACKENDS = (
    Mxfp4MoeBackend.FLASHINFER_TRTLLM,
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90,
    Mxfp4MoeBackend.AITER_A16W4,
    Mxfp4MoeBackend.MARLIN,
)
"""The backends whose ``Mxfp4MoEMethod`` buffers round the hidden size to 256 (``FusedMoE.__init__`` for
``flashinfer_mxfp4``, ``create_weights`` for AITER and Marlin)."""


FP8_CREATE_WEIGHTS = ("sglang.srt.layers.quantization.fp8:Fp8MoEMethod.create_fp8_moe_weight_",)
"""``Fp8MoEMethod``'s buffer allocation, whose ``I/tp % block_n`` check raises the block-FP8 refusal."""


def _fp8_partial_tile(shape: Any) -> bool:
    """A block-FP8 MoE rank whose intermediate size is not whole 128-channel tiles."""
    return shape.intermediate % 128 != 0


SGLANG_KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        FP8_MOE,
        "triton (and every block-FP8 runner but flashinfer_trtllm and AITER): Fp8MoEMethod.create_fp8_moe_weight_ "
        "raises 'The output_size of gate's and up's weight = I is not divisible by weight quantization block_n = "
        "128' for I/tp % 128 != 0 instead of padding the rank to whole tiles (Qwen3.8-Flash-Next-FP8 I 640 at "
        "TP 2/4/8: 320, 160, 80; Qwen3-235B-A22B-FP8 and MiniMax-M2 I 1536 at TP 8: 192); SGLang pads only under "
        "flashinfer_trtllm (FusedMoE.__init__ rounds I/tp to 128); vLLM's same refusal was vLLM #54178, fixed by "
        "padding in vLLM PR #55867; reported to SGLang as #10641 (open; SGLang's Qwen3 deployment tracker #5858 "
        "advises --tp 4, or --tp 8 with expert parallelism, for Qwen3-235B-A22B-FP8)",
        "https://github.com/sgl-project/sglang/issues/10641",
        applies=_fp8_partial_tile,
        raises=ValueError,
        match=r"is not divisible by weight quantization block_n = 128",
        backend=Fp8MoeBackend.TRITON.value,
        raised_in=FP8_CREATE_WEIGHTS,
        reach=Reach.default(
            "block-FP8 MoE checkpoints at a TP degree with I/tp % 128 != 0 on SM90, where --moe-runner-backend "
            "auto resolves to triton (Fp8MoEMethod.create_moe_runner): Qwen3-235B-A22B-FP8 and MiniMax-M2 at TP8 "
            "(192), Qwen3.8-Flash-Next-FP8 at TP2/4/8; on SM100 for the models whose override does not pick "
            "flashinfer_trtllm (model_overrides/qwen3_moe.py picks it for the Qwen3 MoE family)"
        ),
        hardware=(Hardware.SM90, Hardware.SM100),
    ),
    KnownFailure(
        FP8_MOE,
        "flashinfer_trtllm block FP8: FusedMoE.__init__ rounds I/tp to 128 but nothing pads the hidden size, so "
        "H % 128 != 0 reaches trtllm_fp8_block_scale_moe, whose launcher checks hidden_states_scale.size(0) == "
        "hidden_size / 128 (the runner quantizes activations in 128-element groups, per_token_group_quant_fp8); "
        "no block-FP8 MoE checkpoint the suite catalogues has such H; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/moe_runner/flashinfer_trtllm.py",
        applies=lambda shape: shape.hidden % 128 != 0,
        raises=AssertionError,
        match=r"flashinfer-trtllm-fp8-block rejects Ip=\d+, Hp=\d+: hidden size \d+ is not a multiple of 128",
        backend=Fp8MoeBackend.FLASHINFER_TRTLLM.value,
        check="check_backend_accepts",
        reach=Reach.latent("no block-FP8 MoE checkpoint the suite catalogues has H % 128 != 0"),
        hardware=(Hardware.SM100,),
    ),
    KnownFailure(
        NVFP4_MOE,
        "flashinfer_cutlass: process_weights_after_loading asserts 'The intermediate size required padding, but "
        "padding is also implemented for gated activations' when the 128x4 swizzle pads gated FC1 rows "
        "(Gemma-4-26B-A4B TP=2, Step-3.7-Flash TP=8); open fix: PR #30888",
        "https://github.com/sgl-project/sglang/issues/30887",
        applies=_gated_rows_not_128,
        raises=AssertionError,
        match=r"The intermediate size required padding, but padding is also implemented for gated activations",
        backend=Nvfp4MoeBackend.FLASHINFER_CUTLASS.value,
        reach=Reach.flag(
            "--moe-runner-backend flashinfer_cutlass (Gemma-4-26B-A4B NVFP4 TP2, Step-3.7-Flash TP8); the only "
            "override that picks flashinfer_cutlass, model_overrides/nemotron_h.py on SM120, is for non-gated "
            "layers"
        ),
        hardware=(Hardware.SM100, Hardware.SM120),
    ),
    KnownFailure(
        NVFP4_MOE,
        "flashinfer_cutedsl: ModelOptNvFp4FusedMoEMethod.process_weights_after_loading regroups gated FC1 rows "
        "with interleave_w13_halves(group_size=64) before any padding, which raises 'Expected split dim divisible "
        "by group_size=64' when I/tp % 64 != 0 (Gemma-4-26B-A4B TP=4: 176); the CUTLASS branch's #30887 at the "
        "step before it (issue closed as inactive; its fix PR #30888, open, pads each half before the CuteDSL "
        "interleave too)",
        "https://github.com/sgl-project/sglang/issues/30887",
        applies=_gated_halves_not_64,
        raises=ValueError,
        match=r"Expected split dim divisible by group_size=64",
        backend=Nvfp4MoeBackend.FLASHINFER_CUTEDSL.value,
        reach=Reach.flag("--moe-runner-backend flashinfer_cutedsl (Gemma-4-26B-A4B NVFP4 TP4: 176)"),
        hardware=(Hardware.SM100,),
    ),
    KnownFailure(
        NVFP4_MOE,
        "Disputed: SGLang runs NVFP4 CuteDSL MoE (flashinfer_cutedsl) with the hidden size unpadded, vLLM 0.33.0 "
        "pads it to 256 for GEMM1's K tile, which has no tail predicate in the FlashInfer 0.7.2 both pin "
        "(FlashInfer 0.7.4's gather kernel predicates K tails); settled by cute_dsl_fused_moe (w4a4) on a B200 "
        "with FlashInfer 0.7.2 at H = 2688 (Nemotron-3-Nano) against the reference",
        f"{SGLANG_SOURCE}/layers/quantization/modelopt_quant.py",
        applies=_cutedsl_hidden_not_256,
        raises=AssertionError,
        match=r"hidden size \d+ is not a multiple of 256",
        backend=Nvfp4MoeBackend.FLASHINFER_CUTEDSL.value,
        check="check_backend_accepts",
        reach=Reach.flag("--moe-runner-backend flashinfer_cutedsl with H % 256 != 0 (Nemotron-3-Nano: 2688)"),
        hardware=(Hardware.SM100,),
    ),
    *(
        KnownFailure(
            NVFP4_MOE,
            "flashinfer_trtllm: align_fp4_moe_weights_for_flashinfer_trtllm pads the hidden size only to "
            "trtllm_nvfp4_hidden_alignment (1, or 512 for per-token non-gated), so H % 128 != 0 reaches "
            "FlashInfer's FC2 shuffle, which asks callers to zero-pad hidden_size to 128 (no NVFP4 MoE checkpoint "
            "this method serves has such H; gpt-oss's 2880 is MXFP4, loaded by Mxfp4MoEMethod); found by this "
            "suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/moe/moe_runner/flashinfer_trtllm.py",
            applies=_hidden_left_unpadded(backend, _hidden_not_128),
            raises=AssertionError,
            match=r"rejected FC2 scales with \d+ rows: (?:input_tensor\.shape\[0\]=\d+ must be a multiple of 128|assert M % 128 == 0)",
            backend=backend.value,
            check=check,
            reach=Reach.latent(
                "no NVFP4 MoE checkpoint ModelOptNvFp4FusedMoEMethod serves has H % 128 != 0 (Nemotron-3-Nano 2688, "
                "Gemma-4-26B-A4B 2816); gpt-oss (2880) is MXFP4, loaded by Mxfp4MoEMethod"
            ),
            hardware=(Hardware.SM100,),
        )
        for check in ("check_backend_accepts", "check_prepare_round_trip")
        for backend in TRTLLM_NVFP4
    ),
    *(
        KnownFailure(
            NVFP4_MOE,
            "Disputed: SGLang runs NVFP4 TRT-LLM MoE (static, and per-token gated) with H % 256 == 128 unpadded (its docstring: 'Every other "
            "variant runs unpadded', measured with FlashInfer 0.7.0.post1), FlashInfer 0.7.4's valid_hidden_size "
            "docstring says 'For NVFP4 the padded hidden_size must be a multiple of 256 (128 gives wrong results)'; "
            "settled by trtllm_fp4_block_scale_moe on a B200 at H = 2688 against the reference",
            f"{SGLANG_SOURCE}/layers/moe/moe_runner/flashinfer_trtllm.py",
            applies=_hidden_left_unpadded(backend, _hidden_128_not_256),
            raises=AssertionError,
            match=r"hidden size \d+ is not a multiple of 256 \(FlashInfer 0\.7\.4: 128 gives wrong results\)",
            backend=backend.value,
            check="check_backend_accepts",
            reach=Reach.default(
                "Nemotron-3-Nano NVFP4 (H 2688) on SM100, where model_overrides/nemotron_h.py picks flashinfer_trtllm"
            ),
            hardware=(Hardware.SM100,),
        )
        for backend in TRTLLM_NVFP4
    ),
    *(
        KnownFailure(
            MXFP4_LINEAR,
            "Disputed: QuarkW4A4MXFP4 keeps every layer with N <= 128 on the Triton GEMM (_ASM_FP4_UNSAFE_MAX_N: "
            "'gemm_a4w4's untuned ASM heuristic returns wrong rows 1..M-1 for N <= 128 at 2 <= M <= 64', measured "
            "on ROCm/aiter@e7d2453f2, MI355X, with 'TODO: link the AITER issue': no upstream report, so no "
            "backends.kernel_defects record); vLLM PR #58139 forces only 96-row scales to Triton and keeps "
            "(128, 160) on ASM. Settled by conformance.test_mxfp4_linear:check_aiter_gemm_kernel on the ASM path "
            "(the builtin subject keeps N <= 128 on gemm_a4w4) on an MI350x/MI355x (gfx950) at N = 32, 64, 128 "
            "(N = 160 as control), M = 2..64",
            f"{SGLANG_SOURCE}/layers/quantization/quark/schemes/quark_w4a4_mxfp4.py",
            applies=_small_n_asm_capable,
            raises=AssertionError,
            match=r"guard falls back to Triton for scale \(\d+, \d+\)",
            check=check,
            reach=Reach.flag(
                "SGLANG_USE_AITER=1 (off by default) with Quark OCP-MX W4A4 MXFP4 linear layers of N <= 128"
            ),
            hardware=(Hardware.GFX950,),
        )
        for check in ("check_asm_guard_truth_table", "check_asm_taken_where_supported")
    ),
    KnownFailure(
        MXFP4_MOE,
        "flashinfer_mxfp4 on SM90 and SM120 (CUTLASS mixed GEMM, K % 128): FusedMoE.__init__ rounds the hidden "
        "size to 256 for every flashinfer_mxfp4 layer, the SM100 trtllm-gen rule (gpt-oss 2880 -> 3072, not 2944; "
        "Mxfp4MoEMethod's comment notes it); gpt-oss's default on SM120 since PR #32668; found by this suite, not "
        "reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=_hidden_256_over_128,
        raises=AssertionError,
        match=r"over-padding: H \d+ was padded to \d+, but \d+ is accepted",
        backend=Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90.value,
        check="check_minimal_and_idempotent",
        reach=Reach.default(
            "gpt-oss on SM120, where model_overrides/gpt_oss.py picks flashinfer_mxfp4 and FusedMoE.__init__ "
            "rounds H 2880 -> 3072 (+2.58 GiB per GPU for gpt-oss-120b at TP1, findings/sglang-mxfp4-over-"
            "padding); SM90 behind --moe-runner-backend flashinfer_mxfp4"
        ),
        hardware=(Hardware.SM90, Hardware.SM120),
    ),
    KnownFailure(
        MXFP4_MOE,
        "marlin: Mxfp4MoEMethod.create_weights rounds the intermediate to 128 and the hidden size to 256 where "
        "Marlin needs ru(I, 64) and H % 128 (DeepSeek-V4.1-Flash TP8 288 -> 384, not 320; gpt-oss H 2880 -> "
        "3072, not 2944): the over-padding vLLM PR #56697 removes from vLLM; found by this suite, not reported "
        "to SGLang",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4.py",
        applies=lambda config: _inter_128_over_64(config) or _hidden_256_over_128(config),
        raises=AssertionError,
        match=r"over-padding: [IH] \d+ was padded to \d+, but \d+ is accepted",
        backend=Mxfp4MoeBackend.MARLIN.value,
        check="check_minimal_and_idempotent",
        reach=Reach.flag(
            "--moe-runner-backend marlin with gpt-oss or a stacked MXFP4 checkpoint (no model override picks "
            "marlin for Mxfp4MoEMethod)"
        ),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "stacked [gate; up] MXFP4 experts (Kimi-K3, MiniMax-M3: Mxfp4MoEMethod with gate_up_interleaved=False, "
            "per-expert w1/w3 loading) on FlashInfer TRT-LLM, FlashInfer SM90 and Marlin: the buffer's hidden size is "
            "rounded to 256 (FusedMoE.__init__ for flashinfer_mxfp4, create_weights for Marlin), but FusedMoE._load_w13 / "
            "_load_w2 copy the expert's full checkpoint width into that row, so H % 256 != 0 fails at load; no SGLang "
            "model with stacked MXFP4 experts has such H (K3 7168, MiniMax-M3 3072); found by this suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
            applies=_stacked_hidden_padded,
            raises=RuntimeError,
            match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
            backend=backend.value,
            raised_in=FUSED_MOE_LOADERS,
            reach=Reach.latent(
                "no SGLang model with stacked MXFP4 experts has H % 256 != 0 (Kimi-K3 7168, MiniMax-M3 3072)"
            ),
            hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120, Hardware.GFX950),
        )
        for backend in HIDDEN_256_BACKENDS
    ),
    KnownFailure(
        MXFP4_MOE,
        "deep_gemm (DeepGEMM's fp8 x MXFP4 grouped GEMM): Mxfp4MoEMethod.create_weights keeps the checkpoint's "
        "sizes ('no padding'), while the runner quantizes activations to FP8 in 128-element groups along K "
        "(recipe (1, 128)): H % 128 != 0 or I/tp % 128 != 0 reach the kernel unpadded (MiniMax-M2-shaped "
        "I = 1536 at TP8: 192); SGLang's deep_gemm MXFP4 models run H 7168 / 3072; found by this suite, not "
        "reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4.py",
        applies=_deep_gemm_k_not_128,
        raises=AssertionError,
        match=r"DeepGEMM quantizes activations in 128-element groups",
        backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
        check="check_backend_accepts",
        reach=Reach.flag(
            "--moe-runner-backend deep_gemm with an MXFP4 checkpoint whose H or I/tp is not a multiple of 128 "
            "(model_overrides/minimax_m3.py picks deep_gemm for its MXFP8 and NVFP4 checkpoints, not "
            "Mxfp4MoEMethod)"
        ),
        hardware=(Hardware.SM100,),
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "deep_gemm: gpt-oss-form MXFP4 experts (row-interleaved gate/up pairs, expert biases) are handed to "
            "DeepGEMM as loaded: the branch does not de-interleave them (Mxfp4MoEMethod.process_weights_after_loading "
            "only views and re-lays the scales), the runner's activation reads GEMM1's output as [gate; up] halves, "
            "and DeepGemmMoeQuantInfo carries no biases; nothing keeps gpt-oss off --moe-runner-backend deep_gemm "
            "(model_overrides/gpt_oss.py picks it only for MUSA bf16); found by this suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/moe/moe_runner/deep_gemm.py",
            applies=_gpt_oss_form,
            raises=AssertionError,
            match=r"reads them \(gate;up\)|reads FC1 rows as gate;up",
            backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
            check=check,
            reach=Reach.flag(
                "--moe-runner-backend deep_gemm with gpt-oss (model_overrides/gpt_oss.py never picks it for MXFP4)"
            ),
            hardware=(Hardware.SM100,),
        )
        for check in ("check_gate_up_layout", "check_padding_invariance")
    ),
    KnownFailure(
        MXFP4_MOE,
        "deep_gemm: the gpt-oss pairs handed to DeepGEMM as loaded (the entry above) sit in buffers whose layout is "
        "the [gate; up] halves the runner reads, so the policy's result declares an fc1_layout its rows are not in "
        "(harness.hygiene.FalseLayoutDeclared, raised on every call before the properties look)",
        f"{SGLANG_SOURCE}/layers/moe/moe_runner/deep_gemm.py",
        applies=_gpt_oss_form,
        raises=AssertionError,
        match=r"holds \w+'s gate/up rows in g0,u0,g1,u1 order, but fc1_layout says gate;up\b",
        backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
        reach=Reach.flag(
            "--moe-runner-backend deep_gemm with gpt-oss (model_overrides/gpt_oss.py never picks it for MXFP4)"
        ),
        hardware=(Hardware.SM100,),
    ),
    KnownFailure(
        MXFP4_MOE,
        "deep_gemm, gpt-oss-form experts with biases: the entry above seen by re-aligning the output; its rows are "
        "gpt-oss's pairs where the kernel reads [gate; up], so loading them again as gpt-oss's (biases) reorders them",
        f"{SGLANG_SOURCE}/layers/moe/moe_runner/deep_gemm.py",
        applies=lambda config: config.bias,
        raises=AssertionError,
        match=r"not idempotent: w13 changed",
        backend=Mxfp4MoeBackend.VLLM_CUTLASS.value,
        check="check_minimal_and_idempotent",
        reach=Reach.flag(
            "--moe-runner-backend deep_gemm with gpt-oss (model_overrides/gpt_oss.py never picks it for MXFP4)"
        ),
        hardware=(Hardware.SM100,),
    ),
    KnownFailure(
        MXFP4_MOE,
        "triton_kernel: stacked [gate; up] MXFP4 experts (Kimi-K3, MiniMax-M3: per-expert w1/w3/w2 loading into "
        "Mxfp4MoEMethod) do not load: FusedMoE._load_w13 / _load_w2 transpose every non-bias checkpoint tensor "
        "when use_triton_kernels (the unquantized triton_kernels layout), but Mxfp4MoEMethod's buffers keep the "
        "checkpoint's [E, N, K/2] orientation, so the copy raises; gpt-oss's fused loader (expert_id=None) is "
        "not affected. Were it loaded, the branch would hand triton_kernels stacked halves where its swiglu reads "
        "gate/up pairs; no guard keeps these models off --moe-runner-backend triton_kernel; found by this suite, "
        "not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: config.form is CheckpointForm.STACKED and not config.bias,
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        backend=Mxfp4MoeBackend.TRITON_SM90.value,
        raised_in=FUSED_MOE_LOADERS,
        reach=Reach.flag(
            "--moe-runner-backend triton_kernel with Kimi-K3 or MiniMax-M3 MXFP4 (model_overrides/gpt_oss.py "
            "picks triton_kernel for gpt-oss only)"
        ),
        hardware=(Hardware.SM90, Hardware.SM100),
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "triton_kernel on SM90 rounds I to 64 and keeps H; _swizzle_mxfp4 pads only each GEMM's scale groups "
            "(_pad_hopper_mxfp4_scale): with H % 64 == 32 FC1's K holds an odd number of 32-element groups, which "
            "triton_kernels' Hopper matmul_ogs computes wrongly without an error whatever the scale padding (measured "
            "on an H200: backends/truth/triton-kernels-sm90.sm90.json); found by this suite, not reported upstream",
            f"{SGLANG_SOURCE}/layers/quantization/mxfp4.py",
            applies=lambda config: tk.odd_groups(config.shape.hidden),
            raises=AssertionError,
            match=match,
            backend=Mxfp4MoeBackend.TRITON_SM90.value,
            check=check,
            reach=Reach.latent("no MXFP4 MoE model has H % 64 == 32 (gpt-oss: 2880, 90 groups)"),
            hardware=(Hardware.SM90,),
        )
        for check, match in TRITON_ODD_GROUP_FAILURES
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            "aiter: QuarkW4A4MXFp4MoE.create_weights (get_moe_weight_sizes(is_aiter_moe=True)) pads I to 256 but "
            "leaves H unpadded, so H % 256 != 0 reaches AITER's per_1x32 MoE: process_weights_after_loading's "
            "e8m0_shuffle pads the [E·N, H/32] scales to 8 columns and .view(E, N, -1) no longer gives H/32, and the "
            "gfx950 stage-1 kernels are built for tile_k = 256 (vLLM PR #55104); found by this suite, not reported "
            "upstream",
            f"{SGLANG_SOURCE}/layers/quantization/quark/schemes/quark_w4a4_mxfp4_moe.py",
            applies=_quark_hidden_not_256,
            raises=AssertionError,
            match=r"aiter-ck rejects|w(13|2)_scale \[.*\]: e8m0_shuffle pads",
            backend=backend.value,
            check=check,
            reach=Reach.latent(
                "no Quark OCP-MX MXFP4 MoE checkpoint the suite catalogues has H % 256 != 0; it would also need "
                "SGLANG_USE_AITER=1"
            ),
            hardware=(Hardware.GFX950,),
        )
        for backend, selection in MXFP4_BACKENDS.items()
        if selection.stacked_via_quark
        for check in ("check_backend_accepts", "check_aiter_shuffle_round_trip")
    ),
    KnownFailure(
        MXFP4_MOE,
        "marlin: Mxfp4MoEMethod.process_weights_after_loading refuses the layer ('Current MXFP4 MoE layer is not "
        "supported by Marlin.') when the unpadded hidden size is not a multiple of 64 "
        "(check_moe_marlin_supports_layer with allow_tile_padding), although create_weights has padded it to 256: "
        "a loud refusal of shapes no catalogued model has; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/marlin_utils.py",
        applies=_marlin_refused_hidden,
        raises=RuntimeError,
        match=r"Current MXFP4 MoE layer is not supported by Marlin",
        backend=Mxfp4MoeBackend.MARLIN.value,
        reach=Reach.latent(
            "no catalogued MXFP4 model has H % 64 != 0; a loud refusal behind --moe-runner-backend marlin"
        ),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
    ),
)


def _sharding_backend(config: Any) -> Nvfp4MoeBackend | Mxfp4MoeBackend | Fp8MoeBackend:
    """The backend whose runner loads a ``ShardingConfig``'s shards (:mod:`subjects.sglang.sharding`'s default
    where none is drawn)."""
    default = {16: NVFP4_BACKEND, 32: MXFP4_BACKEND}.get(config.block, FP8_BACKEND)
    return config.kernel_backend or default


def _nvfp4_unrounded(config: Any) -> bool:
    """An NVFP4 ``ShardingConfig`` whose runner allocates ``I/tp`` channels (every mapped one but TRT-LLM's)."""
    runner = NVFP4_BACKENDS.get(_sharding_backend(config))
    return runner is not None and runner.runner != "flashinfer_trtllm"


def _stacked_mxfp4(config: Any, via_quark: bool) -> bool:
    """A stacked ``[gate; up]`` MXFP4 ``ShardingConfig`` without biases loaded by Quark OCP-MX's
    ``QuarkW4A4MXFp4MoE`` (``via_quark``: the AITER backends) or else by ``Mxfp4MoEMethod``'s per-expert loader
    (the triton_kernel runner aside: it does not load them at all)."""
    runner = MXFP4_BACKENDS.get(_sharding_backend(config))
    stacked = config.gated and config.block == 32 and not config.layout.interleaved and not config.bias
    return stacked and runner is not None and runner.stacked_via_quark is via_quark and not runner.triton_kernels


UNROUNDED_MXFP4_BACKENDS = (Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, Mxfp4MoeBackend.VLLM_CUTLASS)
"""The backends whose ``Mxfp4MoEMethod.create_weights`` allocates ``I/tp`` rows per half unrounded (the SM90
CUTLASS branch pads after loading; ``deep_gemm`` keeps the checkpoint's sizes)."""


def _stacked_hidden_crash(config: Any) -> bool:
    """A stacked ``ShardingConfig`` whose ``Mxfp4MoEMethod`` buffer rounds the hidden size to 256
    (:data:`HIDDEN_256_BACKENDS`) past the checkpoint's, so ``FusedMoE._load_w13`` / ``_load_w2`` fail to copy."""
    backend = _sharding_backend(config)
    return _stacked_mxfp4(config, via_quark=False) and backend in HIDDEN_256_BACKENDS and config.hidden % 256 != 0


def _even_split_cuts_groups(config: Any) -> bool:
    """A ``ShardingConfig`` SGLang's ``FusedMoE`` accepts (``I % tp``, ``E % ep``) whose even split ``I/tp``
    is not a whole number of groups."""
    part, rem = divmod(config.intermediate, config.tp)
    return rem == 0 and config.experts % config.ep_size == 0 and part % config.block != 0


SGLANG_SHARDING_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        MOE_SHARDING,
        "stacked [gate; up] MXFP4 experts: the mxfp4_moe ledger's load crash (the HIDDEN_256_BACKENDS allocate the "
        "hidden size rounded to 256, FusedMoE._load_w13 / _load_w2 copy the checkpoint's full width) hits every "
        "rank's load when H % 256 != 0; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: _stacked_hidden_crash(config) and config.experts % config.ep_size == 0,
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
        reach=Reach.latent(
            "no SGLang model with stacked MXFP4 experts has H % 256 != 0 (Kimi-K3 7168, MiniMax-M3 3072)"
        ),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120, Hardware.GFX950),
    ),
    KnownFailure(
        MOE_SHARDING,
        "stacked [gate; up] MXFP4 experts (Kimi-K3, MiniMax-M3 form): FusedMoE._load_w13 / _load_w2 narrow each "
        "projection evenly, I/tp channels per rank, into the backend's buffer, so where (I/tp) % 32 != 0 "
        "a rank's channels straddle 32-groups and pair with the wrong scales: silently wrong output (the vLLM #49949 "
        "split); no SGLang model with stacked MXFP4 experts has such I/tp; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: (
            _stacked_mxfp4(config, via_quark=False)
            and not _stacked_hidden_crash(config)
            and _even_split_cuts_groups(config)
        ),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
        reach=Reach.latent("no SGLang model with stacked MXFP4 experts has (I/tp) % 32 != 0 at its TP degrees"),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
    ),
    KnownFailure(
        MOE_SHARDING,
        "flashinfer_cutlass and flashinfer_cutedsl NVFP4 (ModelOptNvFp4FusedMoEMethod): create_weights allocates "
        "I/tp channels (only the TRT-LLM branch rounds them, to 64) and FusedMoE._load_w13 / _load_w2 narrow every "
        "tensor by its own size / tp, so where (I/tp) % 16 != 0 (Gemma-4-26B-A4B I = 704 at TP 16: 44) a rank's "
        "channels straddle 16-groups and pair with the wrong scales (the vLLM #49949 split); found by this suite, "
        "not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: config.block == 16 and _nvfp4_unrounded(config) and _even_split_cuts_groups(config),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
        reach=Reach.default(
            "Nemotron-3-Nano NVFP4 (I 1856) at TP8 on SM120, where model_overrides/nemotron_h.py picks "
            "flashinfer_cutlass (findings/sglang-nvfp4-cutlass-split-cuts-groups); SM100 behind --moe-runner-"
            "backend flashinfer_cutlass or flashinfer_cutedsl (Gemma-4-26B-A4B TP16)"
        ),
        hardware=(Hardware.SM100, Hardware.SM120),
    ),
    KnownFailure(
        MOE_SHARDING,
        "flashinfer_mxfp4 on SM90 and SM120 (the cutlass_sm90 / cutlass_sm120 branch; gpt-oss's default on SM120 "
        "since PR #32668) and deep_gemm: Mxfp4MoEMethod.create_weights allocates I/tp rows per half "
        "(padding comes after loading), but GptOssForCausalLM._load_mxfp4_experts_weights narrows whole 32-blocks, "
        "cdiv(I/32, tp)·32 channels, so where (I/tp) % 32 != 0 a full rank does not fit its buffer (gpt-oss I = 2880 "
        "at TP 4: 736 > 720); found by this suite, not reported upstream (the path came with PR #24816)",
        f"{SGLANG_SOURCE}/models/gpt_oss.py",
        applies=lambda config: (
            _sharding_backend(config) in UNROUNDED_MXFP4_BACKENDS
            and config.block == 32
            and config.layout.interleaved
            and _even_split_cuts_groups(config)
        ),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=GPT_OSS_LOADERS,
        reach=Reach.default(
            "gpt-oss at TP4 / TP8 / TP16 on SM120 (720, 360, 180 channels per rank), where "
            "model_overrides/gpt_oss.py picks flashinfer_mxfp4 "
            "(findings/sglang-gpt-oss-mxfp4-cutlass-tp-load); SM90 behind --moe-runner-backend flashinfer_mxfp4, "
            "SM100 behind --moe-runner-backend deep_gemm"
        ),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
    ),
    KnownFailure(
        MOE_SHARDING,
        "Quark OCP-MX MXFP4 on AITER (QuarkW4A4MXFp4MoE): _rank_chunk_padding_loader narrows I/tp channels per rank "
        "and zero-pads them to ru(I/tp, 256), so where (I/tp) % 32 != 0 (DeepSeek-V4.1-Flash I = 2304 at TP 16: "
        "144) a rank's channels straddle 32-groups and pair with the wrong scales; found by this suite, not reported "
        "upstream",
        f"{SGLANG_SOURCE}/layers/quantization/quark/schemes/quark_w4a4_mxfp4_moe.py",
        applies=lambda config: _stacked_mxfp4(config, via_quark=True) and _even_split_cuts_groups(config),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
        reach=Reach.flag(
            "SGLANG_USE_AITER=1 (off by default) with Quark OCP-MX MXFP4 MoE at (I/tp) % 32 != 0 "
            "(DeepSeek-V4.1-Flash-shaped I 2304 at TP16: 144)"
        ),
        hardware=(Hardware.GFX950,),
    ),
    KnownFailure(
        MOE_SHARDING,
        "triton_kernel: stacked [gate; up] MXFP4 experts do not load (the mxfp4_moe ledger's: FusedMoE._load_w13 / "
        "_load_w2 transpose every non-bias tensor under use_triton_kernels, Mxfp4MoEMethod's buffers keep [E, N, K/2]) "
        "on any rank; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: (
            _sharding_backend(config) is Mxfp4MoeBackend.TRITON_SM90
            and config.gated
            and not config.layout.interleaved
            and not config.bias
            and config.intermediate % config.tp == 0
            and config.experts % config.ep_size == 0
        ),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
        reach=Reach.flag("--moe-runner-backend triton_kernel with Kimi-K3 or MiniMax-M3 MXFP4"),
        hardware=(Hardware.SM90, Hardware.SM100),
    ),
)
"""Upstream bugs of SGLang 0.5.23 that the ``moe_sharding`` properties meet (:mod:`subjects.sglang.sharding`)."""
