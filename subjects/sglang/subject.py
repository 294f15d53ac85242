"""Subject ``sglang``: SGLang's own alignment, placement and fallback code, adapted to the suite's protocols.

Enabled when SGLang imports (``scripts/install-sglang-cpu.sh`` installs SGLang 0.5.23 on a CPU
machine). Every decision comes from SGLang's functions: the MoE adapters construct a real
``FusedMoE`` through SGLang's own test hooks (``get_flags().moe.override(runner_backend=...)``,
``override_platform(...)``, ``get_context().override_server_args()``, ``get_parallel().override(...)``),
so its constructor picks the quant method, which allocates and rounds; the linear adapter builds a
``torch.nn.Module`` with parameters. Only calls that need a GPU are replaced, each named in the
adapter's docstring:

* ``nvfp4_moe``: :class:`SglangNvfp4MoeAlignment` (``ModelOptNvFp4FusedMoEMethod.create_weights``,
  ``FusedMoE.weight_loader``, ``process_weights_after_loading``: the TRT-LLM, CUTLASS and CuteDSL branches;
  :data:`subjects.sglang.bridge.NVFP4_NOT_MAPPED`: the backends SGLang has no path to);
* ``mxfp4_linear``: :class:`SglangQuarkMxfp4Linear` (``QuarkW4A4MXFP4.process_weights_after_loading``:
  the AITER ASM guard and each path's weight preparation; the activation quantizer of each path read
  from ``apply_weights``' source);
* ``mxfp4_moe``: :class:`SglangMxfp4MoeAlignment` (``Mxfp4MoEMethod`` per backend: ``create_weights``'
  rounding, the gpt-oss and the stacked per-expert loaders' placement, ``process_weights_after_loading``
  with its GPU-only layout calls passed through, triton_kernels' and DeepGEMM's modules stood in;
  :data:`subjects.sglang.bridge.MXFP4_NOT_MAPPED`: the backends not served by ``Mxfp4MoEMethod``);
* ``fp8_moe``: :class:`~subjects.sglang.fp8_moe.SglangFp8MoeAlignment` (``Fp8MoEMethod`` with 128x128 block
  scales under the Triton and FlashInfer TRT-LLM runners: ``FusedMoE.__init__``'s TRT-LLM rounding,
  ``create_weights``' refusal elsewhere, ``FusedMoE.weight_loader``'s block-scale branch,
  ``process_weights_after_loading`` whole; :data:`subjects.sglang.bridge.FP8_BACKENDS`);
* ``fp8_tensor_moe``: :class:`~subjects.sglang.fp8_tensor_moe.SglangFp8TensorMoeAlignment`: its one record
  (FlashInfer's staged per-tensor launcher) is one SGLang has no path to
  (:data:`subjects.sglang.bridge.FP8_TENSOR_NOT_MAPPED`); what SGLang prepares for its fused per-tensor kernel is
  :func:`subjects.sglang.fp8_tensor_moe.sglang_per_tensor_fp8` (``scaled_fp8_quant``'s CUDA kernel and
  FlashInfer's row reorder and shuffle stood in);
* ``moe_sharding``: :class:`subjects.sglang.sharding.SglangMoeSharding` (``FusedMoE.weight_loader`` of a
  real ``FusedMoE`` per rank, :func:`load_nvfp4_rank`, :func:`load_mxfp4_rank` and
  :func:`~subjects.sglang.fp8_moe.load_fp8_rank`).

How SGLang's loaders split a checkpoint over TP ranks is :func:`subjects.sglang.nvfp4_moe.load_nvfp4_rank` (whole padded blocks
under TRT-LLM, modelled by ``reference.sizes.padded_split``) and :func:`subjects.sglang.mxfp4_moe.load_mxfp4_rank` (gpt-oss's whole
32-blocks, ``reference.sizes.whole_block_split``; ``I/tp`` per half for stacked checkpoints).

``shared_expert`` is not adapted: SGLang 0.5.23's Qwen3-Next / Qwen2-MoE block
(``models/qwen2_moe.py``, ``Qwen2MoeSparseMoeBlock.__init__``) fuses the shared expert into the MoE when
``can_fuse_shared_expert`` allows it (AITER or CUDA, equal sizes, no DeepEP/MoRI, the quant config's
``can_fuse_shared_expert``), replicates it (``parallel_group="replicated"``) under the DeepEP, MoRI,
FlashInfer, MegaMoE and Ascend all-to-all backends, and otherwise shards it as a tensor-parallel MLP. It
has no counterpart of vLLM's OCP-MX group-straddle gate (``_should_replicate_misaligned_shared_expert``),
which is what the contract's inputs (group, EP, SP) decide.

Upstream bugs of SGLang 0.5.23 that properties catch are listed in :data:`subjects.sglang.ledger.SGLANG_KNOWN_FAILURES`.
"""

from __future__ import annotations

from backends.fp8_moe import CONTRACT as FP8_MOE
from backends.fp8_tensor_moe import CONTRACT as FP8_TENSOR_MOE
from backends.mxfp4_moe import CONTRACT as MXFP4_MOE
from backends.nvfp4_moe import CONTRACT as NVFP4_MOE
from contracts.moe_sharding import CONTRACT as MOE_SHARDING
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from subjects.registry import Subject, register_subject
from subjects.sglang.bridge import SGLANG_VERSION, sglang_missing
from subjects.sglang.fp8_moe import SglangFp8MoeAlignment
from subjects.sglang.fp8_tensor_moe import SglangFp8TensorMoeAlignment
from subjects.sglang.layer import shared_server_args
from subjects.sglang.ledger import SGLANG_KNOWN_FAILURES, SGLANG_SHARDING_FAILURES
from subjects.sglang.mxfp4_linear import SglangQuarkMxfp4Linear
from subjects.sglang.mxfp4_moe import SglangMxfp4MoeAlignment
from subjects.sglang.nvfp4_moe import SglangNvfp4MoeAlignment
from subjects.sglang.sharding import SglangMoeSharding

register_subject(
    Subject(
        "sglang",
        f"SGLang's real alignment, placement and fallback functions (scripts/install-sglang-cpu.sh, SGLang {SGLANG_VERSION})",
        {
            NVFP4_MOE: SglangNvfp4MoeAlignment(),
            MXFP4_LINEAR: SglangQuarkMxfp4Linear(),
            MXFP4_MOE: SglangMxfp4MoeAlignment(),
            MOE_SHARDING: SglangMoeSharding(),
            FP8_MOE: SglangFp8MoeAlignment(),
            FP8_TENSOR_MOE: SglangFp8TensorMoeAlignment(),
        },
        known_failures=SGLANG_KNOWN_FAILURES + SGLANG_SHARDING_FAILURES,
        missing=sglang_missing,
        context=shared_server_args,
    )
)
