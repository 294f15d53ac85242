"""The ``sglang-deepseek-v4`` subject's ledger: upstream bugs of SGLang 0.5.23's DeepSeek-V4 FP4 expert path that
the properties catch (:data:`DSV4_KNOWN_FAILURES`, :data:`DSV4_SHARDING_FAILURES`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.mxfp4_moe import Mxfp4MoeBackend
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from reference.formats import MXFP4_BLOCK
from subjects.registry import Hardware, KnownFailure, Reach
from subjects.sglang.bridge import SGLANG_SOURCE
from subjects.sglang.dsv4.bridge import DSV4_BACKENDS
from subjects.sglang.dsv4.sharding import CUTLASS_REFUSAL
from subjects.sglang.ledger import FUSED_MOE_LOADERS

# --- known upstream bugs -----------------------------------------------------------------------------


def _hidden_not(multiple: int) -> Callable[[Any], bool]:
    """A layer whose hidden size is not a multiple of ``multiple``."""
    return lambda config: config.shape.hidden % multiple != 0


def _not_128_aligned(config: Any) -> bool:
    """A rank whose intermediate or hidden size is not a multiple of 128 (DeepSeek-V4 at TP16: 3072/16 = 192;
    DeepSeek-V4.1-Flash at TP4 / TP8: 576, 288)."""
    return config.shape.intermediate % 128 != 0 or config.shape.hidden % 128 != 0


TRTLLM_HIDDEN_UNPADDED = (
    "Mxfp4FlashinferTrtllmMoEMethod (DeepSeek-V4 FP4 experts on SM100) pads only the intermediate size "
    "(_pad_intermediate_size, to 128) and never the hidden size (Fp8Config is not 'mxfp4', so FusedMoE.__init__ "
    "does not round it either), so H % 256 != 0 reaches trtllm-gen with MXFP8 activations (FlashInfer 0.7.4: "
    "'must be a multiple of 256 for MxFP8') and H % 128 != 0 its FC2 row shuffle; DeepSeek-V4 (7168, 4096) and "
    "V4.1-Flash (5120) are multiples of 256, any other Fp8Config FP4-expert model is not guarded; found by this "
    "suite, not reported upstream"
)

DSV4_KNOWN_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        MXFP4_MOE,
        "Mxfp4FlashinferCutlassMoEMethod.create_weights refuses (ValueError) every rank whose I/tp or H is not a "
        "multiple of 128 instead of padding it after loading: DeepSeek-V4-Pro at TP16 (192), DeepSeek-V4.1-Flash "
        "at TP4 / TP8 (576, 288) are refused on SM90 and SM120, where flashinfer_mxfp4 is the default for "
        "DeepSeek-V4 FP4 experts since PR #35919 (Marlin pads the same shapes to 64); reported as a feature "
        "request, closed inactive",
        "https://github.com/sgl-project/sglang/issues/26250",
        applies=_not_128_aligned,
        raises=ValueError,
        match=r"Mxfp4FlashinferCutlassMoEMethod requires hidden_size and intermediate_size_per_partition to be "
        r"multiples of 128",
        backend=Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90.value,
        reach=Reach.default(
            "DeepSeek-V4.1-Flash at TP4 / TP8 and DeepSeek-V4-Pro at TP16 on SM90 and SM120: "
            "model_overrides/deepseek_v4.py picks flashinfer_mxfp4 for FP4-expert checkpoints there, which "
            "Fp8Config.get_quant_method maps to Mxfp4FlashinferCutlassMoEMethod (findings/sglang-dsv4-cutlass-"
            "refuses-default)"
        ),
        hardware=(Hardware.SM90, Hardware.SM120),
    ),
    KnownFailure(
        MXFP4_MOE,
        "Mxfp4MarlinMoEMethod.create_weights rounds the buffer's hidden size to 256, but FusedMoE._load_w13 / "
        "_load_w2 copy each expert's full checkpoint width into it, so H % 256 != 0 fails at load (the same crash "
        "as Mxfp4MoEMethod's stacked loader in the sglang subject); DeepSeek-V4's hidden sizes are multiples of "
        "256; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4_marlin_moe.py",
        applies=_hidden_not(256),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
        backend=Mxfp4MoeBackend.MARLIN.value,
        reach=Reach.latent("DeepSeek-V4's hidden sizes (7168, 5120) are multiples of 256"),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
    ),
    *(
        KnownFailure(
            MXFP4_MOE,
            TRTLLM_HIDDEN_UNPADDED,
            f"{SGLANG_SOURCE}/layers/quantization/mxfp4_flashinfer_trtllm_moe.py",
            applies=_hidden_not(256),
            raises=AssertionError,
            match=match,
            backend=Mxfp4MoeBackend.FLASHINFER_TRTLLM.value,
            check=check,
            reach=Reach.latent(
                "DeepSeek-V4's hidden sizes (7168, 5120) are multiples of 256; no other Fp8Config FP4-expert model"
            ),
            hardware=(Hardware.SM100,),
        )
        for check, match in (
            ("check_backend_accepts", r"rejects Ip=\d+, Hp=\d+:.*hidden size \d+ is not a multiple of 256"),
            ("check_trtllm_matches_flashinfer_padding", r"FlashInfer pads \(I, H\) = \(\d+, \d+\) to"),
        )
    ),
    KnownFailure(
        MXFP4_MOE,
        TRTLLM_HIDDEN_UNPADDED,
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4_flashinfer_trtllm_moe.py",
        applies=_hidden_not(128),
        raises=AssertionError,
        match=r"input_tensor\.shape\[0\]=\d+ must be a multiple of 128|get_w2_permute_indices_with_cache rejected .*assert M % 128 == 0",
        backend=Mxfp4MoeBackend.FLASHINFER_TRTLLM.value,
        check="check_trtllm_round_trip",
        reach=Reach.latent(
            "DeepSeek-V4's hidden sizes (7168, 5120) are multiples of 256; no other Fp8Config FP4-expert model"
        ),
        hardware=(Hardware.SM100,),
    ),
)
"""Upstream bugs of SGLang 0.5.23's DeepSeek-V4 FP4 expert path that the ``mxfp4_moe`` properties meet."""


def _served_shard(config: Any) -> bool:
    """A ``moe_sharding`` configuration :class:`SglangDsv4MoeSharding` loads (gated MXFP4, no biases, a backend of
    :data:`DSV4_BACKENDS` or the default, ``E % ep == 0``)."""
    backend = config.kernel_backend
    return (
        config.gated
        and config.block == MXFP4_BLOCK
        and not config.bias
        and config.experts % config.ep_size == 0
        and (backend is None or backend in DSV4_BACKENDS)
    )


DSV4_SHARDING_FAILURES: tuple[KnownFailure, ...] = (
    KnownFailure(
        MOE_SHARDING,
        "DeepSeek-V4 FP4 experts: FusedMoE.__init__ sizes every method's buffer for I/tp channels (exact, no rounding) "
        "and FusedMoE._load_w13 / _load_w2 narrow each checkpoint tensor by its own size / tp, so where "
        "(I/tp) % 32 != 0 a rank's FC2 scale groups start at r·floor(I/(32·tp)) while its channels start at r·I/tp: "
        "channels and scales mispair, silently (the vLLM #49949 split). DeepSeek-V4.1-Flash at TP16 (2304/16 = 144) "
        "on SM100 flashinfer_mxfp4 (Mxfp4FlashinferTrtllmMoEMethod) loads this way; Marlin refuses it "
        "(check_moe_marlin_supports_layer), CUTLASS SM90 refuses every I/tp % 128; found by this suite, not reported "
        "upstream",
        f"{SGLANG_SOURCE}/layers/moe/fused_moe_triton/layer.py",
        applies=lambda config: (
            _served_shard(config)
            and config.kernel_backend is not Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90  # refuses first
            and not (config.kernel_backend is Mxfp4MoeBackend.MARLIN and config.hidden % 256)  # load crash first
            and config.intermediate % config.tp == 0
            and (config.intermediate // config.tp) % MXFP4_BLOCK != 0
        ),
        raises=AssertionError,
        match=r"which cut a \d+-element scale group|is not a whole number of \d+-element groups",
        reach=Reach.default(
            "DeepSeek-V4.1-Flash at plain TP16 on SM100 with default flags (model_overrides/deepseek_v4.py picks "
            "flashinfer_mxfp4; findings/sglang-dsv4-tp16-fc2-scale-pairing)"
        ),
        hardware=(Hardware.SM100,),
    ),
    KnownFailure(
        MOE_SHARDING,
        "Mxfp4FlashinferCutlassMoEMethod.create_weights refuses every rank whose I/tp (or H) is not a multiple of "
        "128, also where I/tp is whole 32-groups (DeepSeek-V4-Pro TP16: 192; V4.1-Flash TP4 / TP8: 576, 288), "
        "instead of padding after loading, on SM90 and SM120 with default flags since PR #35919; reported as a "
        "feature request, closed inactive",
        "https://github.com/sgl-project/sglang/issues/26250",
        applies=lambda config: (
            _served_shard(config)
            and config.kernel_backend is Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90
            and config.intermediate % config.tp == 0
            and (config.intermediate // config.tp) % MXFP4_BLOCK == 0
            and ((config.intermediate // config.tp) % 128 != 0 or config.hidden % 128 != 0)
        ),
        raises=AssertionError,
        match=r"policy refused a split that keeps whole 32-groups .*" + CUTLASS_REFUSAL,
        reach=Reach.default(
            "DeepSeek-V4.1-Flash at TP4 / TP8 and DeepSeek-V4-Pro at TP16 on SM90 and SM120 with default flags"
        ),
        hardware=(Hardware.SM90, Hardware.SM120),
    ),
    KnownFailure(
        MOE_SHARDING,
        "Mxfp4MarlinMoEMethod: the mxfp4_moe ledger's load crash (the buffer's H rounded to 256, the loader copying "
        "the checkpoint's width) on every rank where H % 256 != 0; found by this suite, not reported upstream",
        f"{SGLANG_SOURCE}/layers/quantization/mxfp4_marlin_moe.py",
        applies=lambda config: (
            _served_shard(config)
            and config.kernel_backend is Mxfp4MoeBackend.MARLIN
            and config.intermediate % config.tp == 0
            and config.hidden % 256 != 0
        ),
        raises=RuntimeError,
        match=r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)",
        raised_in=FUSED_MOE_LOADERS,
        reach=Reach.latent("DeepSeek-V4's hidden sizes (7168, 5120) are multiples of 256"),
        hardware=(Hardware.SM90, Hardware.SM100, Hardware.SM120),
    ),
)
"""Upstream bugs of SGLang 0.5.23's DeepSeek-V4 loader that the ``moe_sharding`` properties meet."""
