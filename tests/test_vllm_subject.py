"""Self-tests of the ``vllm`` subject's adapters (skipped where vLLM is not installed).

* Each adapter returns what vLLM's function decides, with only the documented pieces substituted:
  the AITER linear guard and weight processing, the shared-expert composition, the MXFP4 oracle's
  sizes (AITER under the patched ROCm platform), the NVFP4 CUTLASS branch.
* The source readers (activation quantizer per path, fusion-before-replicate order) read the
  installed vLLM, and raise :class:`subjects.vllm.bridge.VllmSourceMismatch` on altered sources, so a
  vLLM regression of either fails the properties instead of passing silently.
* The block-FP8 adapter pads a rank as vLLM's TP loader does (whole 128-blocks, zero weights, unit scales) and
  reports a refined block grid as not served.
* The known-failure ledger names only contracts, backends and checks that exist.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import inspect
import sys

import pytest
import torch

from adapters import triton_kernels as tk
from backends.fp8_moe import Fp8MoeBackend
from backends.fp8_tensor_moe import Fp8TensorMoeBackend
from backends.mxfp4_linear import ASM_FORCE_TRITON_SCALE_ROWS, VLLM_GUARD_TABLE, AiterLinearPath
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance import (
    test_fp8_moe,
    test_moe_sharding,
    test_mxfp4_linear,
    test_mxfp4_moe,
    test_nvfp4_moe,
    test_shared_expert,
)
from conformance.layers import fp8_layer
from contracts.errors import CheckpointNotServed, LibraryUnavailable, UnsupportedConfig
from contracts.moe import MoeWeights
from contracts.shared_expert import SharedExpertPlacement, SharedExpertRefused, SharedExpertSetup
from reference.formats import MxScaleRounding
from reference.layouts import Fc1Layout, aiter_shuffle_weight, grouped_gate_up_interleave, vllm_asm_scale_swizzle
from strategies.moe import pinned_shape
from strategies.shared_expert import shared_expert_case
from subjects.registry import backends, contracts, resolve
from subjects.vllm import nvfp4_moe as vllm_nvfp4_moe
from subjects.vllm import shared_expert as vllm_shared_expert
from subjects.vllm.bridge import FP8_TENSOR_NOT_MAPPED, MXFP4_BACKENDS, VllmSourceMismatch, vllm_modules
from subjects.vllm.fp8_moe import VllmFp8MoeAlignment, VllmFp8TensorMoeAlignment, stand_in_tp
from subjects.vllm.ledger import VLLM_KNOWN_FAILURES, VLLM_SHARDING_FAILURES
from subjects.vllm.mxfp4_linear import linear_path_quantizers, quantizers_from_source
from subjects.vllm.mxfp4_moe import VllmMxfp4MoeAlignment, hopper_scale_groups, triton_kernel_format
from subjects.vllm.nvfp4_moe import VllmNvfp4MoeAlignment
from subjects.vllm.sharding import VllmMoeSharding
from subjects.vllm.shared_expert import (
    FSE_RESOLVER,
    REPLICATE_GATE,
    VllmQwen3NextSharedExpert,
    call_order_problem,
    fse_order_problem,
)

pytestmark = pytest.mark.vllm

ASM, TRITON = AiterLinearPath.ASM, AiterLinearPath.TRITON
POLICY = VllmQwen3NextSharedExpert()


NOT_ADAPTED = {"mxfp8_linear"}
"""Contracts whose vLLM paths are not adapted (vLLM's MXFP8 linear preparation)."""


def test_subject_implements_every_contract_but_mxfp8_linear() -> None:
    subject = resolve("vllm")
    assert set(subject.policies) == set(contracts()) - NOT_ADAPTED
    assert subject.policy("mxfp4_linear") is subject.policy("shared_expert")  # one unit: vLLM's own guard
    for contract, policy in subject.policies.items():
        assert isinstance(policy, contracts()[contract])


def test_known_failures_name_real_checks_and_backends() -> None:
    modules = {
        "fp8_moe": test_fp8_moe,
        "nvfp4_moe": test_nvfp4_moe,
        "mxfp4_linear": test_mxfp4_linear,
        "shared_expert": test_shared_expert,
        "mxfp4_moe": test_mxfp4_moe,
        "moe_sharding": test_moe_sharding,
    }
    for known in VLLM_KNOWN_FAILURES + VLLM_SHARDING_FAILURES:
        assert known.link.startswith("https://github.com/")
        assert known.backend is None or known.backend in {b.value for b in backends(known.contract)}
        assert known.check is None or hasattr(modules[known.contract], known.check), known.check


@pytest.mark.parametrize(
    ("shape", "want"),
    [(shape, want) for shape, want in VLLM_GUARD_TABLE if shape[0] not in ASM_FORCE_TRITON_SCALE_ROWS],
)
def test_guard_is_vllms(shape: tuple[int, ...], want: bool) -> None:
    assert POLICY.use_asm_gemm(shape) is want


def test_guard_lacks_the_96_row_rule_in_0_33_0() -> None:
    """vLLM PR #58139 is not in 0.33.0 (the ledger's expected failure); this fails once it is."""
    assert POLICY.use_asm_gemm((96, 160)) is True


def _layer(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(n * k)
    weight = torch.randint(0, 256, (n, k // 2), generator=g, dtype=torch.int64).to(torch.uint8)
    scale = torch.randint(118, 136, (n, k // 32), generator=g, dtype=torch.int64).to(torch.uint8)
    return weight, scale


def test_weight_processing_paths() -> None:
    """ASM: vLLM's scale swizzle and the (reference) weight shuffle; Triton: the stored transpose; a
    guarded-out scale falls back inside vLLM; the inputs are never modified."""
    weight, scale = _layer(64, 512)
    w0, s0 = weight.clone(), scale.clone()
    asm = POLICY.process_mxfp4_linear_weights(weight, scale, asm_enabled=True)
    assert asm.path is ASM
    assert torch.equal(asm.scale, vllm_asm_scale_swizzle(scale))
    assert torch.equal(asm.weight, aiter_shuffle_weight(weight))
    triton = POLICY.process_mxfp4_linear_weights(weight, scale, asm_enabled=False)
    assert triton.path is TRITON and torch.equal(triton.weight, weight)
    assert torch.equal(triton.scale, scale.T) and triton.scale.is_contiguous()
    assert torch.equal(weight, w0) and torch.equal(scale, s0)
    assert POLICY.prepare_asm_linear(*_layer(48, 512)).path is TRITON  # 48 rows: vLLM's own fallback
    assert "aiter.ops.shuffle" not in sys.modules or importlib.util.find_spec("aiter") is not None


def test_activation_rounding_read_from_vllm() -> None:
    assert linear_path_quantizers() == {ASM: "per_1x32_f4_quant_hip", TRITON: "dynamic_mxfp4_quant"}
    assert POLICY.linear_activation_rounding(ASM) is MxScaleRounding.RCEIL
    assert POLICY.linear_activation_rounding(TRITON) is MxScaleRounding.EVEN


GEMM = """
def gemm_with_dynamic_quant(x, weight, weight_scale, rocm_use_aiter_fp4_asm_gemm=False):
    if rocm_use_aiter_fp4_asm_gemm:
        x_q, x_s = {asm}(x)
    else:
        x_q, x_s = {triton}(x)
"""
APPLY = """
    def apply_weights(self, layer, x, bias=None):
        return torch.ops.vllm.gemm_with_dynamic_quant(x, layer.weight, layer.weight_scale, {flag})
"""


def test_quantizer_reader_follows_the_source() -> None:
    swapped = GEMM.format(asm="dynamic_mxfp4_quant", triton="per_1x32_f4_quant_hip")
    got = quantizers_from_source(swapped, APPLY.format(flag="self.use_asm_gemm"))
    assert got == {ASM: "dynamic_mxfp4_quant", TRITON: "per_1x32_f4_quant_hip"}
    with pytest.raises(VllmSourceMismatch, match=r"unknown_mx_quant|knows the rounding"):
        quantizers_from_source(
            GEMM.format(asm="unknown_mx_quant", triton="dynamic_mxfp4_quant"), APPLY.format(flag="self.use_asm_gemm")
        )
    with pytest.raises(VllmSourceMismatch, match=r"not self\.use_asm_gemm"):
        quantizers_from_source(
            GEMM.format(asm="per_1x32_f4_quant_hip", triton="dynamic_mxfp4_quant"), APPLY.format(flag="True")
        )


def test_fusion_order_read_from_vllm() -> None:
    assert fse_order_problem() is None
    source = inspect.getsource(vllm_modules().qwen3_next.Qwen3NextSparseMoeBlock.__init__)
    assert source.find(f"{FSE_RESOLVER}(") < source.find(f"{REPLICATE_GATE}(")


def test_reversed_order_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    reversed_init = """
def __init__(self):
    self.replicate = _should_replicate_misaligned_shared_expert(i, tp, g, ep, sp)
    if not self.replicate:
        self.fused = resolve_layer_fused_shared_expert(q, prefix)
"""
    problem = call_order_problem(reversed_init)
    assert problem is not None and "pre-#55213" in problem
    monkeypatch.setattr(vllm_shared_expert, "fse_order_problem", lambda: problem)
    case = shared_expert_case("qwen3.8-flash-next", 8, ep=True, fse=True)
    with pytest.raises(VllmSourceMismatch):  # not a ValueError: the properties must not read it as a refusal
        test_shared_expert.check_fusion_resolved_first(case, None, POLICY)


@pytest.mark.parametrize(
    ("setup", "want"),
    [
        (SharedExpertSetup(640, 8, 32, True, False, True, True), SharedExpertPlacement.FUSED),
        (SharedExpertSetup(640, 8, 32, True, False, True, False), SharedExpertPlacement.REPLICATED),
        (SharedExpertSetup(640, 4, 32, False, False, False, True), SharedExpertPlacement.SHARDED),
        (SharedExpertSetup(0, 8, 32, False, False, True, True), SharedExpertPlacement.ABSENT),
    ],
)
def test_shared_expert_placement(setup: SharedExpertSetup, want: SharedExpertPlacement) -> None:
    assert POLICY.shared_expert_placement(setup) is want


def test_shared_expert_refusal_is_the_suites_type() -> None:
    with pytest.raises(SharedExpertRefused, match=r"640.*3"):
        POLICY.shared_expert_placement(SharedExpertSetup(640, 3, 32, False, False, False, True))


def _mxfp4_weights(intermediate: int, hidden: int) -> MoeWeights:
    e = 1
    return MoeWeights(
        w13=torch.zeros(e, 2 * intermediate, hidden // 2, dtype=torch.uint8),
        w13_scale=torch.zeros(e, 2 * intermediate, hidden // 32, dtype=torch.uint8),
        w2=torch.zeros(e, hidden, intermediate // 2, dtype=torch.uint8),
        w2_scale=torch.zeros(e, hidden, intermediate // 32, dtype=torch.uint8),
        block=32,
    )


@pytest.mark.parametrize(
    ("backend", "want"),
    [
        # gpt-oss (I 720, H 2880): docs/vllm-logic.md §8
        (Mxfp4MoeBackend.FLASHINFER_TRTLLM, (768, 3072)),
        (Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, (768, 2944)),
        (Mxfp4MoeBackend.AITER, (768, 3072)),
        (Mxfp4MoeBackend.MARLIN, (768, 3072)),
        (Mxfp4MoeBackend.VLLM_CUTLASS, (768, 2944)),
        (Mxfp4MoeBackend.B12X, (720, 2880)),  # exact sizes
        (Mxfp4MoeBackend.TRITON_SM90, (768, 2944)),  # ru(720, 64) = 768; H's 90 scale groups padded to 92
        (Mxfp4MoeBackend.AITER_A16W4, (768, 3072)),
        (Mxfp4MoeBackend.FLASHINFER_MOE_EP, (720, 2880)),  # the model's sizes
    ],
)
def test_mxfp4_sizes_are_the_oracles(backend: Mxfp4MoeBackend, want: tuple[int, int]) -> None:
    assert VllmMxfp4MoeAlignment().sizes(backend, _mxfp4_weights(720, 2880)) == want


@pytest.mark.parametrize(
    ("suite", "alias"),
    [(Mxfp4MoeBackend.VLLM_CUTLASS, "DEEPGEMM_MXFP4"), (Mxfp4MoeBackend.TRITON_SM90, "TRITON_UNFUSED")],
)
def test_mxfp4_aliases_round_alike(suite: Mxfp4MoeBackend, alias: str) -> None:
    """The engine backends a record names as aliases get the same rounding from vLLM's oracle."""
    oracle = vllm_modules().mxfp4_oracle
    for i, h in ((720, 2880), (96, 96), (192, 7168), (288, 5120)):
        want = oracle.mxfp4_round_up_hidden_size_and_intermediate_size(
            oracle.Mxfp4MoeBackend[MXFP4_BACKENDS[suite]], h, i
        )
        assert oracle.mxfp4_round_up_hidden_size_and_intermediate_size(oracle.Mxfp4MoeBackend[alias], h, i) == want


def test_hopper_scale_groups_padded_to_whole_tiles() -> None:
    """vLLM 0.33.0's ``_swizzle_mxfp4`` zero-pads SM90 scale groups to a multiple of 4 (PR #47910): gpt-oss's
    90 become 92; 96 stay. A vLLM without the pad hands 90, which the triton-kernels-sm90 rule rejects."""
    v = vllm_modules()
    for groups, want in ((90, 92), (96, 96), (3, 4)):
        assert hopper_scale_groups(v, torch.zeros(1, 64, groups, dtype=torch.uint8)) == want


def test_triton_conversion_of_gpt_oss_keeps_pairs() -> None:
    """vLLM's TRITON conversion of a gpt-oss (row-interleaved) checkpoint hands triton_kernels the rows as they
    are, the scale groups padded to whole tiles (``I`` 64: 2 groups -> 4, read as weights zero-padded to 128;
    ``H`` 96: 3 -> 4, but an odd group count is wrong on Hopper whatever the scales, so ``H`` stays 96 for the
    odd-group rule to judge: ``adapters.triton_kernels.contract_k``); a stacked one has the last dim of its scales
    split in half, which fails for H/32 odd (the ledger's TRITON entries)."""
    v = vllm_modules()
    g = torch.Generator().manual_seed(0)
    e, i, h = 1, 64, 96
    w = MoeWeights(
        w13=torch.randint(0, 256, (e, 2 * i, h // 2), generator=g, dtype=torch.uint8),
        w13_scale=torch.randint(118, 123, (e, 2 * i, h // 32), generator=g, dtype=torch.uint8),
        w2=torch.randint(0, 256, (e, h, i // 2), generator=g, dtype=torch.uint8),
        w2_scale=torch.randint(118, 123, (e, h, i // 32), generator=g, dtype=torch.uint8),
        block=32,
        fc1_layout=Fc1Layout.GATE_UP_INTERLEAVED,
        w13_bias=torch.randn(e, 2 * i, generator=g),
        w2_bias=torch.randn(e, h, generator=g),
    )
    out = triton_kernel_format(v, w)
    assert (out.intermediate_size, out.hidden_size) == (128, 96)
    assert torch.equal(out.w13[:, : 2 * i], w.w13) and torch.equal(out.w2[..., : i // 2], w.w2)
    assert torch.equal(out.w13_scale[:, : 2 * i], w.w13_scale)
    assert torch.equal(out.w13_bias[:, : 2 * i], w.w13_bias)
    assert not out.w13[:, 2 * i :].any() and not out.w2[..., i // 2 :].any()
    assert tk.hopper_violations(out.intermediate_size, out.hidden_size), "H 96 (3 groups) must be a violation"
    with pytest.raises(RuntimeError, match="stack expects each tensor to be equal size"):  # 3 groups split in half
        triton_kernel_format(v, dataclasses.replace(w, fc1_layout=Fc1Layout.GATE_UP, w13_bias=None))


def test_aiter_a16w4_sizes_without_activation_take_256() -> None:
    """GptOssMxfp4MoEMethod asks without an activation: 256 for AITER_MXFP4_BF16 (SiLU would give 128)."""
    assert VllmMxfp4MoeAlignment().sizes(Mxfp4MoeBackend.AITER_A16W4, _mxfp4_weights(384, 2880)) == (512, 3072)


def test_aiter_sizes_take_the_rocm_branch() -> None:
    """I 320: the ROCm W4A4 branch rounds to 128 (384); off ROCm the fallback branch gives ru(320, 64) = 320."""
    assert VllmMxfp4MoeAlignment().sizes(Mxfp4MoeBackend.AITER, _mxfp4_weights(320, 512)) == (384, 512)
    assert "vllm.platforms.rocm" not in sys.modules
    assert not vllm_modules().mxfp4_oracle.current_platform.is_rocm()


def _nvfp4_weights(intermediate: int, hidden: int, gated: bool) -> MoeWeights:
    rows = (2 if gated else 1) * intermediate
    return MoeWeights(
        w13=torch.ones(2, rows, hidden // 2, dtype=torch.uint8),
        w13_scale=torch.full((2, rows, hidden // 16), 0x38, dtype=torch.uint8),
        w2=torch.ones(2, hidden, intermediate // 2, dtype=torch.uint8),
        w2_scale=torch.full((2, hidden, intermediate // 16), 0x38, dtype=torch.uint8),
        block=16,
    )


def test_nvfp4_cutlass_reports_the_kernel_visible_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's CUTLASS branch pads non-gated I 176 to 256 rows but leaves ``intermediate_size_per_partition``
    at 176; the adapter reports 256, the width of the returned ``w2`` that the kernel reads."""
    layers = []
    original = vllm_nvfp4_moe._fake_layer
    monkeypatch.setattr(vllm_nvfp4_moe, "_fake_layer", lambda *a: layers.append(original(*a)) or layers[-1])
    aligned = VllmNvfp4MoeAlignment().align_moe(
        Nvfp4MoeBackend.FLASHINFER_CUTLASS, _nvfp4_weights(176, 256, False), False
    )
    assert aligned.intermediate_size == 256 and aligned.weights.w2.shape[2] == 128
    assert layers[0].moe_config.intermediate_size_per_partition == 176


@pytest.mark.parametrize(
    ("backend", "gated", "hidden"),
    [
        (Nvfp4MoeBackend.FLASHINFER_TRTLLM, False, 2816),
        (Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN, False, 3072),
        (Nvfp4MoeBackend.FLASHINFER_TRTLLM_PER_TOKEN, True, 2816),
    ],
)
def test_nvfp4_trtllm_hidden_alignment_from_vllm(backend: Nvfp4MoeBackend, gated: bool, hidden: int) -> None:
    """Nemotron's H = 2688: vLLM's ``trtllm_nvfp4_hidden_alignment`` pads per-token non-gated layers to 512."""
    aligned = VllmNvfp4MoeAlignment().align_moe(backend, _nvfp4_weights(128, 2688, gated), gated)
    assert aligned.hidden_size == hidden and aligned.weights.w2.shape[1] == hidden


def test_nvfp4_cutlass_gated_refusal() -> None:
    with pytest.raises(UnsupportedConfig, match="FLASHINFER_CUTLASS"):
        VllmNvfp4MoeAlignment().align_moe(Nvfp4MoeBackend.FLASHINFER_CUTLASS, _nvfp4_weights(176, 256, True), True)


@pytest.mark.parametrize("half", [64, 128, 384])
def test_cutedsl_interleave_is_vllms(half: int) -> None:
    """The reference 64-row up/gate regrouping equals vLLM's ``interleave_linear_and_gate(group_size=64)``."""
    rows = torch.arange(2 * half)[None, :, None].expand(2, -1, 3).contiguous()
    vllm_rows = vllm_modules().ffm.interleave_linear_and_gate(rows, group_size=64, dim=1)
    assert torch.equal(vllm_rows, rows[:, grouped_gate_up_interleave(2 * half, 64)])


@pytest.mark.parametrize(
    ("backend", "gated", "intermediate", "hidden", "want"),
    [
        (Nvfp4MoeBackend.FLASHINFER_CUTEDSL, True, 176, 2688, (192, 2816)),  # Gemma-4 TP=4 I, Nemotron H
        (Nvfp4MoeBackend.FLASHINFER_CUTEDSL, False, 176, 2688, (256, 2816)),
        (Nvfp4MoeBackend.B12X, True, 176, 2688, (192, 2688)),  # b12x leaves H as it is
        (Nvfp4MoeBackend.B12X, False, 176, 2688, (256, 2688)),  # end-padded to the swizzle's 128 rows
        (Nvfp4MoeBackend.VLLM_CUTLASS, True, 192, 2880, (192, 2880)),  # H left at 2880 (vLLM PR #35497)
        (Nvfp4MoeBackend.VLLM_CUTLASS, False, 176, 2688, (256, 2688)),
    ],
)
def test_nvfp4_new_backend_sizes_from_vllm(
    backend: Nvfp4MoeBackend, gated: bool, intermediate: int, hidden: int, want: tuple[int, int]
) -> None:
    aligned = VllmNvfp4MoeAlignment().align_moe(backend, _nvfp4_weights(intermediate, hidden, gated), gated)
    assert (aligned.intermediate_size, aligned.hidden_size) == want
    assert aligned.weights.w2.shape[1:] == (want[1], want[0] // 2)


def test_nvfp4_vllm_cutlass_keeps_w1_w3() -> None:
    """VLLM_CUTLASS gets vLLM's ``[w1; w3]`` back; the adapter returns the contract's ``[up; gate]``: a gate
    row labelled 1 and an up row labelled 2 land where the built-in policy puts them."""
    weights = _nvfp4_weights(128, 256, True)
    w13 = weights.w13.clone()
    w13[:, :128] = 2  # [up; gate]: up rows first
    w13[:, 128:] = 1
    labelled = MoeWeights(w13, weights.w13_scale, weights.w2, weights.w2_scale, block=16)
    aligned = VllmNvfp4MoeAlignment().align_moe(Nvfp4MoeBackend.VLLM_CUTLASS, labelled, True)
    assert torch.equal(aligned.weights.w13, w13)


# --- moe_sharding: vLLM's loaders over a TP x EP grid and per backend ------------------------------------


def _sharding_weights(experts: int, intermediate: int, block: int, layout: Fc1Layout, bias: bool) -> MoeWeights:
    """Random FP4 expert bytes (codes and scales 1..126); bf16 biases when ``bias``."""
    g = torch.Generator().manual_seed(experts * intermediate)
    e, i, h = experts, intermediate, 256

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(1, 127, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    return MoeWeights(
        w13=draw(e, 2 * i, h // 2), w13_scale=draw(e, 2 * i, h // block), w2=draw(e, h, i // 2),
        w2_scale=draw(e, h, i // block), block=block, fc1_layout=layout,
        w13_bias=torch.randn(e, 2 * i, generator=g).bfloat16().float() if bias else None,
        w2_bias=torch.randn(e, h, generator=g).bfloat16().float() if bias else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("placement", "experts", "want"),
    [
        ("linear", 4, ((0, 1), (2, 3))),
        ("linear", 3, ((0, 1), (2,))),  # determine_expert_map: the remainder on the first ranks
        ("round_robin", 4, ((0, 2), (1, 3))),
        ("round_robin", 3, ((0, 2), (1,))),
    ],
)
def test_ep_experts_read_back_from_vllms_expert_map(placement: str, experts: int, want: tuple) -> None:
    """Under EP (TP 1, ``FusedMoEParallelConfig.make`` with ``enable_expert_parallel``) each rank's
    ``RoutedExperts.weight_loader`` keeps the experts ``determine_expert_map`` assigns it, in local order; the
    experts and whole channel range are read back from the coordinate checkpoint."""
    ckpt = _sharding_weights(experts, 128, 16, Fc1Layout.GATE_UP, False)
    shards = VllmMoeSharding(placement).shard_moe(ckpt, True, 1, ep=2, backend=Nvfp4MoeBackend.FLASHINFER_TRTLLM)
    assert tuple(s.experts for s in shards) == want
    for s in shards:
        assert (s.offset, s.real, s.start) == (0, 128, 0)
        assert torch.equal(s.weights.w13, ckpt.w13[list(s.experts)])
        assert torch.equal(s.weights.w2_scale, ckpt.w2_scale[list(s.experts)])


def test_ep_inside_tp_is_not_a_vllm_configuration() -> None:
    """vLLM gives MoE layers TP 1 under EP (``FusedMoEParallelConfig.make``): a 2 x 2 grid is not served."""
    ckpt = _sharding_weights(4, 128, 16, Fc1Layout.GATE_UP, False)
    with pytest.raises(UnsupportedConfig, match="no MoE TP=2 inside EP=2"):
        VllmMoeSharding().shard_moe(ckpt, True, 2, ep=2)


def test_gpt_oss_ep_uneven_experts_broadcast_in_0_33_0() -> None:
    """vLLM 0.33.0's ``GptOssModel.load_weights`` slices ``E // ep`` experts per EP rank while the layer holds
    ``E // ep + 1`` on the first ``E % ep`` ranks: at E = 3, EP = 2 rank 0's two slots both hold expert 0 and
    expert 1 lands on rank 1, where the map says expert 2; at E = 1 the empty slice fails to load (the ledger's
    PR #51130 entry). Fails once vLLM slices the map's experts; then update both."""
    ckpt = _sharding_weights(3, 256, 32, Fc1Layout.GATE_UP_INTERLEAVED, True)
    shards = VllmMoeSharding().shard_moe(ckpt, True, 1, ep=2, backend=Mxfp4MoeBackend.FLASHINFER_TRTLLM)
    assert [s.experts for s in shards] == [(0, 0), (1,)]
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        VllmMoeSharding().shard_moe(_sharding_weights(1, 256, 32, Fc1Layout.GATE_UP_INTERLEAVED, True), True, 1, ep=2)


GPT_OSS_UNSELECTED = (Mxfp4MoeBackend.B12X, Mxfp4MoeBackend.FLASHINFER_MOE_EP)
"""Backends vLLM 0.33.0 never selects for gpt-oss / Quark OCP-MX experts (``_get_priority_backends_for_gpt_oss``;
b12x also refuses expert biases): their exact-size buffers (720 at TP 4) would not hold the whole-block share."""


@pytest.mark.parametrize("backend", GPT_OSS_UNSELECTED)
def test_backends_vllm_never_selects_for_gpt_oss_are_not_served(backend: Mxfp4MoeBackend) -> None:
    ckpt = _sharding_weights(1, 2880, 32, Fc1Layout.GATE_UP_INTERLEAVED, True)
    with pytest.raises(UnsupportedConfig, match="_get_priority_backends_for_gpt_oss"):
        VllmMoeSharding().shard_moe(ckpt, True, 4, backend=backend)


@pytest.mark.parametrize("backend", [b for b in MXFP4_BACKENDS if b not in GPT_OSS_UNSELECTED])
def test_gpt_oss_buffer_is_the_backends(backend: Mxfp4MoeBackend) -> None:
    """The runner axis: a gpt-oss rank's buffer is ``GptOssMxfp4MoEMethod.maybe_roundup_sizes`` for the drawn
    backend (vLLM's ``mxfp4_round_up_hidden_size_and_intermediate_size``, as ``RoutedExperts.__init__`` calls it),
    and ``_load_weights_mxfp4`` fills rank 0 with the first whole-block share (gpt-oss I = 2880 at TP 4: 736)."""
    ckpt = _sharding_weights(1, 2880, 32, Fc1Layout.GATE_UP_INTERLEAVED, True)
    shards = VllmMoeSharding().shard_moe(ckpt, True, 4, backend=backend)
    want, _ = VllmMxfp4MoeAlignment().oracle_sizes(backend, _sharding_weights(1, 720, 32, Fc1Layout.GATE_UP, False))
    assert {s.weights.intermediate_size for s in shards} == {want}
    assert [(s.offset, s.real) for s in shards] == [(0, 736), (736, 736), (1472, 736), (2208, 672)]


def test_stand_in_tp_makes_the_global_intermediate_whole_blocks() -> None:
    assert [stand_in_tp(i) for i in (128, 256, 80, 96, 160, 16)] == [1, 1, 8, 4, 4, 8]
    assert all(stand_in_tp(i) * i % 128 == 0 for i in range(16, 1024, 16))


@pytest.mark.parametrize("backend", list(Fp8MoeBackend))
def test_fp8_rank_of_partial_blocks_is_padded_by_the_tp_loader(backend: Fp8MoeBackend) -> None:
    """Qwen3.8-Flash-Next at TP=8 (I 80 per rank, gcd(128, 80, H) = 16: no refinement): vLLM's block-aligned TP
    loading (PR #55867) gives the rank one whole block, zero weights and unit scales past the real channels."""
    shape = pinned_shape("qwen3.8-flash-next", 8)
    ckpt = fp8_layer(shape).checkpoint
    aligned = VllmFp8MoeAlignment().align_moe(backend, ckpt, gated=True)
    w = aligned.weights
    assert (aligned.intermediate_size, aligned.hidden_size) == (128, shape.hidden)
    gate, up = w.w13.unflatten(1, (2, 128)).unbind(1)
    ckpt_gate, ckpt_up = ckpt.w13.unflatten(1, (2, 80)).unbind(1)
    assert torch.equal(gate[:, :80], ckpt_gate) and torch.equal(up[:, :80], ckpt_up)
    assert not gate[:, 80:].any() and not up[:, 80:].any() and not w.w2[..., 80:].any()
    assert torch.equal(w.w2[..., :80], ckpt.w2)
    assert torch.equal(w.w13_scale, ckpt.w13_scale)  # one partial tile per half: the rank's own scales


def test_fp8_triton_refinement_is_not_served() -> None:
    """Qwen3-30B-A3B at TP=8 (I 96, gcd(128, 96, H) = 32): with --moe-backend triton vLLM refines the grid to
    32x32 (refine_fp8_moe_block_shape) instead of padding; FLASHINFER_TRTLLM, which takes only 128x128, pads."""
    ckpt = fp8_layer(pinned_shape("qwen3-30b-a3b", 8)).checkpoint
    with pytest.raises(CheckpointNotServed, match=r"refines the block grid to \[32, 32\]"):
        VllmFp8MoeAlignment().align_moe(Fp8MoeBackend.TRITON, ckpt, gated=True)
    padded = VllmFp8MoeAlignment().align_moe(Fp8MoeBackend.FLASHINFER_TRTLLM, ckpt, gated=True)
    assert padded.intermediate_size == 128


def test_fp8_tensor_backends_are_skipped_with_their_reason() -> None:
    ckpt = fp8_layer(pinned_shape("qwen3.8-flash-next", 8)).checkpoint
    for backend in Fp8TensorMoeBackend:
        with pytest.raises(LibraryUnavailable, match="trtllm_fp8_per_tensor_scale_moe"):
            VllmFp8TensorMoeAlignment().align_moe(backend, ckpt, gated=True)
        assert "staged" in FP8_TENSOR_NOT_MAPPED[backend]
