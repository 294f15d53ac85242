"""Subject ``sglang-deepseek-v4``: SGLang 0.5.23's DeepSeek-V4 FP4 expert path, adapted to the suite's protocols.

SGLang loads DeepSeek-V4's MXFP4 routed experts (``quantization_config.quant_method = "fp8"``, FP4 experts
detected by ``ModelConfig.is_fp4_experts``) through ``Fp8Config``, whose ``get_quant_method`` picks, for a
``FusedMoE`` with ``is_fp4_experts`` set (``model_loader/loader.py`` sets it from the model config):

* ``--moe-runner-backend flashinfer_mxfp4`` on SM100: ``Mxfp4FlashinferTrtllmMoEMethod``
  (``quantization/mxfp4_flashinfer_trtllm_moe.py``);
* ``flashinfer_mxfp4`` on SM90 or SM120: ``Mxfp4FlashinferCutlassMoEMethod``
  (``quantization/mxfp4_flashinfer_cutlass_moe.py``; W4A16 on SM90 unless
  ``--flashinfer-mxfp4-moe-precision fp8``, MXFP8 x MXFP4 on SM120);
* ``marlin``: ``Mxfp4MarlinMoEMethod`` (``quantization/mxfp4_marlin_moe.py``).

Unlike ``Mxfp4MoEMethod`` (the ``sglang`` subject's MXFP4 families), these allocate the checkpoint's exact
per-rank sizes (``2·I/tp`` rows of ``H/2`` bytes; Marlin rounds only the hidden size, to 256) and pad, if at
all, in ``process_weights_after_loading``. Everything here is SGLang's: a real ``FusedMoE`` constructed under
SGLang's test hooks (:func:`subjects.sglang.layer.sglang_layer_context`) with ``Fp8Config.from_config`` of
DeepSeek-V4's ``quantization_config`` (:data:`subjects.sglang.dsv4.mxfp4_moe.DSV4_QUANT_CONFIG`), the checkpoint's tensors under DeepSeek-V4's
names through ``DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format``,
``FusedMoE.make_expert_params_mapping`` and ``FusedMoE.weight_loader`` (:func:`subjects.sglang.dsv4.mxfp4_moe.load_dsv4_experts`), then the
method's ``process_weights_after_loading`` with the calls that need a GPU, or that the properties run
themselves, replaced by the stand-ins :data:`subjects.sglang.dsv4.bridge.DSV4_BACKENDS` names.

Contracts: ``mxfp4_moe`` (:class:`subjects.sglang.dsv4.mxfp4_moe.SglangDsv4MoeAlignment`) and ``moe_sharding``
(:class:`subjects.sglang.dsv4.sharding.SglangDsv4MoeSharding`). DeepSeek-V4's FP4 experts are gated SwiGLU, stacked per projection
(``w1`` gate, ``w3`` up, ``w2`` down), without biases: a checkpoint with expert biases is not one this path
serves (none of its methods allocates a bias), and raises :class:`~contracts.errors.CheckpointNotServed`.
Upstream bugs the properties meet are :data:`subjects.sglang.dsv4.ledger.DSV4_KNOWN_FAILURES`.
"""

from __future__ import annotations

from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from subjects.registry import Subject, register_subject
from subjects.sglang.bridge import SGLANG_VERSION, sglang_missing
from subjects.sglang.dsv4.ledger import DSV4_KNOWN_FAILURES, DSV4_SHARDING_FAILURES
from subjects.sglang.dsv4.mxfp4_moe import SglangDsv4MoeAlignment
from subjects.sglang.dsv4.sharding import SglangDsv4MoeSharding
from subjects.sglang.layer import shared_server_args

register_subject(
    Subject(
        "sglang-deepseek-v4",
        f"SGLang's DeepSeek-V4 FP4 expert methods under Fp8Config (TRT-LLM, CUTLASS SM90, Marlin; "
        f"scripts/install-sglang-cpu.sh, SGLang {SGLANG_VERSION})",
        {MXFP4_MOE: SglangDsv4MoeAlignment(), MOE_SHARDING: SglangDsv4MoeSharding()},
        known_failures=DSV4_KNOWN_FAILURES + DSV4_SHARDING_FAILURES,
        missing=sglang_missing,
        context=shared_server_args,
    )
)
