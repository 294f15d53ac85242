"""Self-tests of the ``sglang`` subject's adapters (skipped where SGLang is not installed).

* Each adapter returns what SGLang's code decides, with only the documented pieces substituted:
  the NVFP4 MoE path (``create_weights`` rounding, ``FusedMoE.weight_loader`` placement, both
  post-load branches); the Quark W4A4 MXFP4 linear guard, weight preparation and activation quantizers
  (read from ``apply_weights``' source); the MXFP4 MoE sizes of a real ``FusedMoE`` per backend.
* A moved or renamed SGLang symbol fails loudly, naming it (:class:`subjects.sglang.bridge.SglangSourceMismatch`).
* The known-failure ledger names only contracts, backends and checks that exist.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from backends.fp8_moe import Fp8MoeBackend
from backends.fp8_tensor_moe import Fp8TensorMoeBackend
from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance import test_fp8_moe, test_mxfp4_linear, test_mxfp4_moe, test_nvfp4_moe
from conformance.layers import fp8_layer
from contracts.errors import LibraryUnavailable, UnsupportedConfig
from contracts.moe import MoeWeights, select_experts
from contracts.moe_sharding import ShardRefused
from reference.formats import MxScaleRounding
from reference.fp8 import FP8_TENSOR_BLOCK
from reference.layouts import Fc1Layout, aiter_shuffle_weight, split_fc1, vllm_asm_scale_swizzle
from reference.padding import pad_dim
from reference.sizes import padded_split, round_up, whole_block_split
from strategies.catalog import MODELS
from strategies.moe import pinned_shape
from strategies.tensors import moe_case
from subjects.fp8_moe import BuiltinFp8MoeAlignment
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment
from subjects.registry import backends, contracts, resolve
from subjects.sglang.bridge import (
    FP8_BACKENDS,
    FP8_TENSOR_NOT_MAPPED,
    MXFP4_BACKENDS,
    MXFP4_NOT_MAPPED,
    NVFP4_BACKENDS,
    NVFP4_NOT_MAPPED,
    SglangSourceMismatch,
    sglang_modules,
)
from subjects.sglang.fp8_moe import SglangFp8MoeAlignment
from subjects.sglang.fp8_tensor_moe import SglangFp8TensorMoeAlignment, sglang_per_tensor_fp8
from subjects.sglang.ledger import SGLANG_KNOWN_FAILURES
from subjects.sglang.mxfp4_linear import SglangQuarkMxfp4Linear, quark_path_quantizers, sglang_linear_quantizers
from subjects.sglang.mxfp4_moe import SglangMxfp4MoeAlignment, load_mxfp4_rank, load_quark_mxfp4_rank
from subjects.sglang.nvfp4_moe import SglangNvfp4MoeAlignment, load_nvfp4_rank
from subjects.sglang.sharding import SglangMoeSharding

pytestmark = pytest.mark.sglang

NVFP4 = SglangNvfp4MoeAlignment()
CHECK_MODULES = {
    "nvfp4_moe": test_nvfp4_moe,
    "mxfp4_linear": test_mxfp4_linear,
    "mxfp4_moe": test_mxfp4_moe,
    "fp8_moe": test_fp8_moe,
}


def test_subject_policies_implement_their_contracts() -> None:
    subject = resolve("sglang")
    assert set(subject.policies) <= set(contracts())
    for contract, policy in subject.policies.items():
        assert isinstance(policy, contracts()[contract])


def test_known_failures_name_real_checks_and_backends() -> None:
    for known in SGLANG_KNOWN_FAILURES:
        assert known.link.startswith("https://github.com/")
        assert known.backend is None or known.backend in {b.value for b in backends(known.contract)}
        assert known.check is None or hasattr(CHECK_MODULES[known.contract], known.check), known.check


def test_a_moved_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    sglang_modules()  # the real import first, so only the symbol check runs again
    module = importlib.import_module("sglang.srt.layers.moe.moe_runner.flashinfer_trtllm")
    monkeypatch.delattr(module, "align_fp4_moe_weights_for_flashinfer_trtllm")
    sglang_modules.cache_clear()
    try:
        with pytest.raises(
            SglangSourceMismatch, match=r"flashinfer_trtllm\.align_fp4_moe_weights_for_flashinfer_trtllm"
        ):
            sglang_modules()
    finally:
        sglang_modules.cache_clear()


def _aligned(model: str, tp: int, backend: Nvfp4MoeBackend):
    shape = pinned_shape(model, tp)
    case = moe_case(shape, 16)
    return shape, case, NVFP4.align_moe(backend, case.weights, shape.gated)


@pytest.mark.parametrize(("model", "tp", "ip"), [("gemma-4-26b-a4b", 4, 192), ("gemma-4-26b-a4b", 2, 384)])
def test_trtllm_create_weights_rounds_gated_to_64(model: str, tp: int, ip: int) -> None:
    """SGLang's ``create_weights`` rounds the gated TRT-LLM intermediate to 64 and its loader places
    each half at ``[h·Ip, h·Ip + I)``: byte for byte the built-in policy where H needs no padding."""
    shape, case, aligned = _aligned(model, tp, Nvfp4MoeBackend.FLASHINFER_TRTLLM)
    assert aligned.intermediate_size == ip
    builtin = BuiltinNvfp4MoeAlignment().align_moe(Nvfp4MoeBackend.FLASHINFER_TRTLLM, case.weights, shape.gated)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(aligned.weights, name).view(torch.uint8), getattr(builtin.weights, name)), name


def test_trtllm_non_gated_rounds_to_128_and_keeps_hidden() -> None:
    """Non-gated (ReLU2) rounds to 128; the hidden size stays unpadded (static activation scales)."""
    shape, _, aligned = _aligned("nemotron-3-nano-30b-a3b", 2, Nvfp4MoeBackend.FLASHINFER_TRTLLM)
    assert not shape.gated
    assert aligned.intermediate_size == 512 and aligned.hidden_size == shape.hidden


def test_cutlass_gated_padding_is_refused_in_0_5_23() -> None:
    """SGLang #30887 (open fix PR #30888): fails once gated CUTLASS padding lands; then update the ledger."""
    with pytest.raises(AssertionError, match="padding is also implemented for gated activations"):
        _aligned("gemma-4-26b-a4b", 4, Nvfp4MoeBackend.FLASHINFER_CUTLASS)


def test_cutlass_aligned_layer_runs_the_real_swizzle() -> None:
    """Where no padding is needed the CUTLASS branch runs whole; the swizzled scales read back exactly."""
    shape, case, aligned = _aligned("qwen3-30b-a3b", 4, Nvfp4MoeBackend.FLASHINFER_CUTLASS)
    assert (2 * shape.intermediate) % 128 == 0
    assert aligned.intermediate_size == shape.intermediate
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(aligned.weights, name).view(torch.uint8), getattr(case.weights, name)), name


def test_cutedsl_aligned_layer_reads_back_through_the_regrouping() -> None:
    """CuteDSL (``flashinfer_cutedsl``, v2 standard path): SGLang regroups gated FC1 into 64-row ``[up; gate]``
    groups and swizzles the scales; read back through both inverses, a layer needing no padding is the
    checkpoint's, byte for byte, and the hidden size stays unpadded."""
    shape, case, aligned = _aligned("qwen3-30b-a3b", 4, Nvfp4MoeBackend.FLASHINFER_CUTEDSL)
    assert shape.gated and shape.intermediate % 64 == 0
    assert (aligned.intermediate_size, aligned.hidden_size) == (shape.intermediate, shape.hidden)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(aligned.weights, name).view(torch.uint8), getattr(case.weights, name)), name


def test_cutedsl_gated_split_is_refused_in_0_5_23() -> None:
    """SGLang 0.5.23's ``interleave_w13_halves`` refuses gated halves that are not whole 64-row groups (Gemma-4
    TP=4, I = 176); the ledger links SGLang #30887, whose fix PR #30888 pads each half first. Fails once that
    lands; then update the ledger."""
    with pytest.raises(ValueError, match="Expected split dim divisible by group_size=64"):
        _aligned("gemma-4-26b-a4b", 4, Nvfp4MoeBackend.FLASHINFER_CUTEDSL)


def test_cutedsl_non_gated_pads_to_128() -> None:
    """A non-gated (ReLU2) layer goes through the CUTLASS branch's padding (rows the 128x4 swizzle adds are
    zero-filled weights): I to 128, H unpadded."""
    shape, _, aligned = _aligned("nemotron-3-nano-30b-a3b", 2, Nvfp4MoeBackend.FLASHINFER_CUTEDSL)
    assert not shape.gated
    assert aligned.intermediate_size == round_up(shape.intermediate, 128) and aligned.hidden_size == shape.hidden


@pytest.mark.parametrize("backend", sorted(NVFP4_NOT_MAPPED, key=lambda b: b.value))
def test_unmapped_nvfp4_backends_skip_with_the_reason(backend: Nvfp4MoeBackend) -> None:
    shape = pinned_shape("qwen3-30b-a3b", 4)
    with pytest.raises(LibraryUnavailable, match=r"SGLang 0\.5\.23 has no path"):
        NVFP4.align_moe(backend, moe_case(shape, 16).weights, shape.gated)


LINEAR = SglangQuarkMxfp4Linear()


@pytest.mark.parametrize(
    ("shape", "want"),
    [
        ((2560, 80), True),
        ((160, 8), True),
        ((128, 160), False),  # SGLang: N <= 128 stays on Triton (the ledger's disputed rule)
        ((96, 160), False),
        ((32, 8), False),
        ((2560, 20), False),
        ((30, 8), False),
        ((2560,), False),
        ((80, 2, 16), False),
    ],
)
def test_linear_guard_is_sglangs(shape: tuple[int, ...], want: bool) -> None:
    assert LINEAR.use_asm_gemm(shape) is want


def test_linear_weight_processing_paths() -> None:
    """ASM: SGLang's scale swizzle and the (reference) weight shuffle; Triton: the scale as loaded, reported in
    the suite's transposed storage; the inputs are never modified."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randint(0, 256, (160, 256), generator=g, dtype=torch.int64).to(torch.uint8)
    scale = torch.randint(118, 136, (160, 16), generator=g, dtype=torch.int64).to(torch.uint8)
    w0, s0 = weight.clone(), scale.clone()
    asm = LINEAR.process_mxfp4_linear_weights(weight, scale, asm_enabled=True)
    assert asm.path is AiterLinearPath.ASM
    assert torch.equal(asm.scale, vllm_asm_scale_swizzle(scale))
    assert torch.equal(asm.weight, aiter_shuffle_weight(weight))
    triton = LINEAR.process_mxfp4_linear_weights(weight, scale, asm_enabled=False)
    assert triton.path is AiterLinearPath.TRITON and torch.equal(triton.weight, weight)
    assert torch.equal(triton.scale.T, scale) and triton.scale.is_contiguous()
    assert torch.equal(weight, w0) and torch.equal(scale, s0)


def test_linear_activation_quantizers_read_from_sglang() -> None:
    assert sglang_linear_quantizers() == {
        AiterLinearPath.ASM: "per_1x32_f4_quant_hip",
        AiterLinearPath.TRITON: "dynamic_mxfp4_quant",
    }
    assert LINEAR.linear_activation_rounding(AiterLinearPath.ASM) is MxScaleRounding.RCEIL
    assert LINEAR.linear_activation_rounding(AiterLinearPath.TRITON) is MxScaleRounding.EVEN


APPLY = """
def apply_weights(self, layer, x, bias=None):
    if getattr(layer, "use_aiter_asm_fp4_gemm", False):
        x_q, x_scales = {asm}(x)
        return gemm_a4w4(x_q, layer.weight, x_scales, layer.weight_scale)
    x_q, x_s = {triton}(x)
    return gemm_afp4wfp4(x_q, layer.weight, x_s, layer.weight_scale)
"""


def test_linear_quantizer_reader_fails_on_altered_source() -> None:
    good = APPLY.format(asm="per_1x32_f4_quant", triton="dynamic_mxfp4_quant")
    assert quark_path_quantizers(good)[AiterLinearPath.TRITON] == "dynamic_mxfp4_quant"
    with pytest.raises(SglangSourceMismatch, match="quantizers"):
        quark_path_quantizers(APPLY.format(asm="per_1x32_f4_quant", triton="some_new_quant"))
    with pytest.raises(SglangSourceMismatch, match="use_aiter_asm_fp4_gemm"):
        quark_path_quantizers(good.replace("use_aiter_asm_fp4_gemm", "use_asm"))


MXFP4 = SglangMxfp4MoeAlignment()


def _mxfp4_weights(intermediate: int, hidden: int, layout: Fc1Layout, experts: int = 1, seed: int = 0) -> MoeWeights:
    """Random MXFP4 expert bytes (codes and scales 1..126, never 0 or 127, so padding is visible); bf16 biases
    for gpt-oss's interleaved form only (SGLang's stacked MXFP4 models have none)."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(1, 127, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    e, i, h = experts, intermediate, hidden
    biased = layout.interleaved
    return MoeWeights(
        w13=draw(e, 2 * i, h // 2), w13_scale=draw(e, 2 * i, h // 32), w2=draw(e, h, i // 2),
        w2_scale=draw(e, h, i // 32), block=32, fc1_layout=layout,
        w13_bias=torch.randn(e, 2 * i, generator=g).bfloat16().float() if biased else None,
        w2_bias=torch.randn(e, h, generator=g).bfloat16().float() if biased else None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "intermediate", "hidden", "want"),
    [
        (Mxfp4MoeBackend.FLASHINFER_TRTLLM, 2880, 2880, (2944, 3072)),  # gpt-oss TP1
        (Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, 192, 7168, (256, 7168)),  # DeepSeek-V4-Pro TP16 (SGLang #26250)
        (Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, 2880, 2880, (2944, 3072)),  # hidden: the ledger's 256
        (Mxfp4MoeBackend.AITER, 384, 3072, (512, 3072)),  # MiniMax-M3 TP8: 256 (AITER #5233)
        (Mxfp4MoeBackend.MARLIN, 288, 4096, (384, 4096)),  # DeepSeek-V4.1-Flash TP8: the ledger's 128
        (Mxfp4MoeBackend.TRITON_SM90, 2880, 2880, (2944, 2944)),  # gpt-oss TP1: Hopper scale tiles of 128
        (Mxfp4MoeBackend.TRITON_SM90, 736, 2880, (768, 2944)),  # gpt-oss TP4 rank 0: I to 64, K tiles of 128
        (Mxfp4MoeBackend.VLLM_CUTLASS, 2880, 2880, (2880, 2880)),  # deep_gemm: the checkpoint's sizes
    ],
)
def test_mxfp4_sizes_are_sglangs(
    backend: Mxfp4MoeBackend, intermediate: int, hidden: int, want: tuple[int, int]
) -> None:
    """Sizes of the buffers SGLang's ``Mxfp4MoEMethod`` hands its GPU-only layout calls, per backend."""
    aligned = MXFP4.align_moe(backend, _mxfp4_weights(intermediate, hidden, Fc1Layout.GATE_UP_INTERLEAVED), True)
    assert (aligned.intermediate_size, aligned.hidden_size) == want


STACKED_TRITON_LOAD = pytest.mark.xfail(
    raises=RuntimeError,
    strict=True,
    reason="SGLang 0.5.23: the per-expert loader transposes MXFP4 tensors under triton_kernel (the ledger's entry)",
)
GPT_OSS_DEEP_GEMM = pytest.mark.xfail(
    raises=AssertionError,
    strict=True,
    reason="SGLang 0.5.23: deep_gemm keeps gpt-oss's pairs where the runner reads [gate; up] halves (the ledger's entry)",
)


def _post_load_marks(backend: Mxfp4MoeBackend, layout: Fc1Layout) -> list[pytest.MarkDecorator]:
    """The ledger's post-load bugs for ``backend`` and a checkpoint in ``layout`` (as strict expected failures)."""
    if MXFP4_BACKENDS[backend].triton_kernels and not layout.interleaved:
        return [STACKED_TRITON_LOAD]
    if backend is Mxfp4MoeBackend.VLLM_CUTLASS and layout.interleaved:
        return [GPT_OSS_DEEP_GEMM]
    return []


@pytest.mark.parametrize(
    ("backend", "layout"),
    [
        pytest.param(b, layout, marks=_post_load_marks(b, layout))
        for b in MXFP4_BACKENDS
        for layout in (Fc1Layout.GATE_UP_INTERLEAVED, Fc1Layout.GATE_UP)
    ],
)
def test_mxfp4_post_load_keeps_pairs(backend: Mxfp4MoeBackend, layout: Fc1Layout) -> None:
    """After SGLang's loader and post-load processing, the rows read in the order SGLang states are the
    checkpoint's gate and up rows, each half's padding after it; FC2 keeps its corner."""
    i, h = 96, 256
    weights = _mxfp4_weights(i, h, layout, seed=3)
    aligned = MXFP4.align_moe(backend, weights, True)
    ip, out = aligned.intermediate_size, aligned.weights
    assert out.fc1_layout is MXFP4_BACKENDS[backend].fc1_layout
    for name, dim in (("w13", -2), ("w13_scale", -2), ("w13_bias", -1)):
        if getattr(weights, name) is None:
            continue
        src = split_fc1(getattr(weights, name), layout, dim)
        dst = split_fc1(getattr(out, name), out.fc1_layout, dim)
        for half, a, b in zip(("gate", "up"), src, dst, strict=True):
            assert torch.equal(b[tuple(slice(0, n) for n in a.shape)], a), (name, half)
        assert getattr(out, name).shape[dim] == 2 * ip
    for name in ("w2", "w2_scale", "w2_bias"):
        src, dst = getattr(weights, name), getattr(out, name)
        if src is None:
            continue
        corner = tuple(slice(0, n) for n in src.shape)
        assert torch.equal(dst[corner], src), name


GPT_OSS_I = 2880
"""gpt-oss-20b's and gpt-oss-120b's expert intermediate size (90 MXFP4 blocks)."""
STACKED_I = 2304
"""A stacked checkpoint's intermediate size whose ``I/tp`` is whole 32-blocks at TP 2, 4, 8 but not whole
128-blocks at TP 4 and 8 (576, 288), so the buffers are padded."""


@settings(max_examples=6, deadline=None)
@given(
    tp=st.sampled_from((2, 4, 8)),
    backend=st.sampled_from([b for b in MXFP4_BACKENDS if b is not Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90]),
    layout=st.sampled_from([Fc1Layout.GATE_UP_INTERLEAVED, Fc1Layout.GATE_UP]),
)
def test_mxfp4_loader_split_is_the_modelled_split(tp: int, backend: Mxfp4MoeBackend, layout: Fc1Layout) -> None:
    """SGLang's loaders, given the whole checkpoint at every rank of ``tp``, fill rank ``r``'s buffer with the
    channels the suite models: gpt-oss's whole 32-blocks (``reference.sizes.whole_block_split``, the last
    ranks short) or ``I/tp`` per half for stacked checkpoints, in the buffer's leading corner (interleaved)
    or at the head of each half (stacked); padded weights are zero codes, padded scales E8M0 127 (the
    buffer's fill) under gpt-oss's corner copy and 0 under the per-expert loader's zero-padded narrow.
    Every checkpoint channel lands on exactly one rank."""
    interleaved = layout is Fc1Layout.GATE_UP_INTERLEAVED
    assume(interleaved or not MXFP4_BACKENDS[backend].triton_kernels)  # stacked does not load there (the ledger)
    # deep_gemm allocates I/tp like the SM90 path, so gpt-oss's whole-block shards overflow it at TP 4 / 8
    assume(not interleaved or backend is not Mxfp4MoeBackend.VLLM_CUTLASS)
    i, h = (GPT_OSS_I if interleaved else STACKED_I), 256
    ckpt = _mxfp4_weights(i, h, layout, seed=tp)
    per_rank = whole_block_split(i, tp, 32) if interleaved else (i // tp,) * tp
    covered = 0
    for rank, real in enumerate(per_rank):
        loaded, ip = load_mxfp4_rank(backend, ckpt, tp, rank)
        start = rank * per_rank[0]
        for name in ("w13", "w13_scale"):
            src, dst = getattr(ckpt, name), getattr(loaded, name)
            width = src.shape[-1]
            if interleaved:
                want = src[:, 2 * start : 2 * (start + real)]
                assert torch.equal(dst[:, : 2 * real, :width], want), f"rank {rank} {name}"
                pad = dst[:, 2 * real :]
            else:
                for half in range(2):
                    want = src[:, half * i + start : half * i + start + real]
                    assert torch.equal(dst[:, half * ip : half * ip + real, :width], want), f"rank {rank} {name} {half}"
                pad = torch.cat([dst[:, real:ip], dst[:, ip + real :]], dim=1)
            fill = (127 if interleaved else 0) if name.endswith("scale") else 0
            assert set(pad.unique().tolist()) <= {fill}, f"rank {rank} {name} pad"
        for name, per in (("w2", 2), ("w2_scale", 32)):
            src, dst = getattr(ckpt, name), getattr(loaded, name)
            want = src[..., start // per : (start + real) // per]
            assert torch.equal(dst[:, :h, : real // per], want), f"rank {rank} {name}"
        covered += real
    assert covered == i


def test_triton_kernel_pads_hopper_scale_groups() -> None:
    """``triton_kernel`` on SM90: SGLang's ``_swizzle_mxfp4`` pads each GEMM's scale groups along K to whole
    128-element tiles with E8M0 127 (gpt-oss K = 2880: 90 groups -> 92), the weights keep their K (the kernel
    masks them; the contract form zero-pads them), and the gpt-oss pairs and biases are the checkpoint's."""
    weights = _mxfp4_weights(2880, 2880, Fc1Layout.GATE_UP_INTERLEAVED, seed=5)
    out = MXFP4.align_moe(Mxfp4MoeBackend.TRITON_SM90, weights, True).weights
    assert out.fc1_layout is Fc1Layout.GATE_UP_INTERLEAVED
    assert out.w13_scale.shape[-1] == 92 and set(out.w13_scale[:, :5760, 90:].unique().tolist()) == {127}
    assert out.w2_scale.shape[-1] == 92 and set(out.w2_scale[:, :2880, 90:].unique().tolist()) == {127}
    assert not out.w13[:, :, 1440:].any() and not out.w2[:, :, 1440:].any()
    for name in ("w13", "w13_scale", "w13_bias"):
        src = getattr(weights, name)
        assert torch.equal(getattr(out, name)[tuple(slice(0, n) for n in src.shape)], src), name


def test_triton_kernel_stacked_checkpoint_does_not_load_in_0_5_23() -> None:
    """SGLang 0.5.23 under ``triton_kernel``: ``FusedMoE._load_w13`` transposes the per-expert MXFP4 weight as if
    it were an unquantized triton_kernels one, so a stacked (Kimi-K3 / MiniMax-M3 form) checkpoint fails to
    load (found by this suite, the ledger has it). Fails once SGLang loads it; then update both."""
    with pytest.raises(RuntimeError, match=r"The size of tensor a \(\d+\) must match"):
        MXFP4.align_moe(Mxfp4MoeBackend.TRITON_SM90, _mxfp4_weights(384, 512, Fc1Layout.GATE_UP), True)


@pytest.mark.parametrize("backend", sorted(MXFP4_NOT_MAPPED, key=lambda b: b.value))
def test_unmapped_mxfp4_backends_skip_with_the_reason(backend: Mxfp4MoeBackend) -> None:
    with pytest.raises(LibraryUnavailable, match=r"SGLang 0\.5\.23 (has no path|feeds)"):
        MXFP4.align_moe(backend, _mxfp4_weights(128, 256, Fc1Layout.GATE_UP_INTERLEAVED), True)


def test_deep_gemm_gpt_oss_loader_overflows_at_tp4_in_0_5_23() -> None:
    """SGLang 0.5.23 under ``deep_gemm``: like the SM90 path below, ``create_weights`` keeps ``I/tp`` = 720 rows per
    half for gpt-oss at TP 4 while the gpt-oss loader narrows 736 channels for rank 0 (found by this suite)."""
    ckpt = _mxfp4_weights(GPT_OSS_I, 256, Fc1Layout.GATE_UP_INTERLEAVED)
    with pytest.raises(RuntimeError, match=r"size of tensor a \(1440\) must match the size of tensor b \(1472\)"):
        load_mxfp4_rank(Mxfp4MoeBackend.VLLM_CUTLASS, ckpt, 4, 0)


def test_sm90_gpt_oss_loader_overflows_at_tp4_in_0_5_23() -> None:
    """SGLang 0.5.23 on SM90 ``flashinfer_mxfp4``: ``create_weights`` allocates ``I/tp`` = 720 rows per half for
    gpt-oss at TP 4, but the gpt-oss loader narrows whole blocks, 736 channels, for rank 0 (found by this
    suite; the ledger has it). Fails once SGLang sizes the buffer for the whole-block shard; then update both."""
    ckpt = _mxfp4_weights(GPT_OSS_I, 256, Fc1Layout.GATE_UP_INTERLEAVED)
    with pytest.raises(RuntimeError, match=r"size of tensor a \(1440\) must match the size of tensor b \(1472\)"):
        load_mxfp4_rank(Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, ckpt, 4, 0)


SPLIT_MULTIPLE = {("flashinfer_trtllm", True): 64, ("flashinfer_trtllm", False): 128}
"""Per-rank buffer multiple of SGLang's NVFP4 loader split by ``--moe-runner-backend`` and gating
(``create_weights``' TRT-LLM rounding, per-token activation or not); CUTLASS allocates ``I/tp`` and splits
evenly (multiple 1)."""


@settings(max_examples=6, deadline=None)
@given(
    model=st.sampled_from(sorted(n for n, m in MODELS.items() if m.moe_intermediate > 0)),
    tp=st.sampled_from((2, 4, 8)),
    backend=st.sampled_from(list(NVFP4_BACKENDS)),  # the backends SGLang runs NVFP4 MoE on
)
def test_loader_split_is_the_modelled_split(model: str, tp: int, backend: Nvfp4MoeBackend) -> None:
    """SGLang's loader, given the whole checkpoint at every rank of ``tp``, fills rank ``r``'s buffers with the
    channels ``reference.sizes.padded_split`` assigns it, at offset ``r·Ip`` of the checkpoint, each gate/up
    half and FC2's K alike, zero past them: whole padded blocks under TRT-LLM (short or empty last ranks),
    ``I/tp`` under CUTLASS. Every checkpoint channel lands on exactly one rank."""
    m = MODELS[model]
    gated, size = m.activation.gated, m.moe_intermediate
    if size % tp:
        return  # SGLang asserts intermediate_size % moe_tp_size == 0
    multiple = SPLIT_MULTIPLE.get((NVFP4_BACKENDS[backend].runner, gated), 1)
    per_rank = padded_split(size, tp, multiple)
    ip = round_up(size // tp, multiple)
    # I/tp not whole 16-groups (CUTLASS, CuteDSL): the loader cuts scale groups, the sharding ledger's entry
    # (test_cutlass_nvfp4_split_cuts_groups_in_0_5_23), not this split
    assume(ip % 16 == 0)
    g = torch.Generator().manual_seed(size * tp)
    f, h = (2 if gated else 1), 64

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(1, 127, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    ckpt = MoeWeights(w13=draw(1, f * size, h // 2), w13_scale=draw(1, f * size, h // 16),
                      w2=draw(1, h, size // 2), w2_scale=draw(1, h, size // 16), block=16)  # fmt: skip
    covered = 0
    for rank, real in enumerate(per_rank):
        loaded, buffer = load_nvfp4_rank(backend, ckpt, gated, tp, rank)
        assert buffer == ip, f"rank {rank}: buffer {buffer}, modelled {ip}"
        start = rank * ip
        for name in ("w13", "w13_scale"):
            src, dst = getattr(ckpt, name), getattr(loaded, name)
            for half in range(f):
                want = pad_dim(src[:, half * size + start : half * size + start + real], -2, ip)
                assert torch.equal(dst[:, half * ip : (half + 1) * ip], want), f"rank {rank} {name} half {half}"
        for name, per in (("w2", 2), ("w2_scale", 16)):
            src, dst = getattr(ckpt, name), getattr(loaded, name)
            want = pad_dim(src[..., start // per : (start + real) // per], -1, ip // per)
            assert torch.equal(dst, want), f"rank {rank} {name}"
        covered += real
    assert covered == size


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_quark_mxfp4_loader_split(tp: int) -> None:
    """SGLang's Quark OCP-MX MoE on AITER (``QuarkW4A4MXFp4MoE``): every rank's buffer is ``ru(I/tp, 256)``
    channels per half, the hidden size unpadded; rank ``r`` holds channels ``[r·I/tp, (r+1)·I/tp)`` at the head
    of each half, the rest zero codes and zero scales (``_rank_chunk_padding_loader``)."""
    i, h = STACKED_I, 256
    ckpt = _mxfp4_weights(i, h, Fc1Layout.GATE_UP, seed=tp)
    real = i // tp
    for rank in range(tp):
        loaded, ip = load_quark_mxfp4_rank(ckpt, tp, rank)
        assert ip == round_up(real, 256) and loaded.hidden_size == h, (ip, loaded.hidden_size)
        start = rank * real
        for name in ("w13", "w13_scale"):
            src, dst = getattr(ckpt, name), getattr(loaded, name)
            for half in range(2):
                want = src[:, half * i + start : half * i + start + real]
                assert torch.equal(dst[:, half * ip : half * ip + real], want), f"rank {rank} {name} {half}"
                assert not dst[:, half * ip + real : (half + 1) * ip].any(), f"rank {rank} {name} {half} pad"
        for name, per in (("w2", 2), ("w2_scale", 32)):
            src, dst = getattr(ckpt, name), getattr(loaded, name)
            assert torch.equal(dst[..., : real // per], src[..., start // per : (start + real) // per]), name
            assert not dst[..., real // per :].any(), f"rank {rank} {name} pad"


# --- moe_sharding: SGLang's loaders over a TP x EP grid and per runner ----------------------------------

POLICY_SHARDING = SglangMoeSharding()


def _nvfp4_weights(experts: int, intermediate: int) -> MoeWeights:
    """Random NVFP4 expert bytes (codes and scales 1..126), gated, stacked ``[gate; up]``."""
    g = torch.Generator().manual_seed(experts * intermediate)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(1, 127, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    e, i, h = experts, intermediate, 64
    return MoeWeights(w13=draw(e, 2 * i, h // 2), w13_scale=draw(e, 2 * i, h // 16), w2=draw(e, h, i // 2),
                      w2_scale=draw(e, h, i // 16), block=16)  # fmt: skip


@pytest.mark.parametrize("backend", [Nvfp4MoeBackend.FLASHINFER_TRTLLM, Nvfp4MoeBackend.FLASHINFER_CUTLASS])
def test_ep_grid_read_back(backend: Nvfp4MoeBackend) -> None:
    """TP 2 x EP 2 (SGLang's ``moe_ep_rank = rank // moe_tp_size``): each EP rank's ``FusedMoE.weight_loader`` keeps
    its ``E / ep`` experts (``_map_global_expert_id_to_local_expert_id``), its TP ranks split their channels."""
    ckpt = _nvfp4_weights(4, 256)
    shards = POLICY_SHARDING.shard_moe(ckpt, True, 2, ep=2, backend=backend)
    assert [s.experts for s in shards] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    assert [(s.offset, s.real, s.start) for s in shards] == [(0, 128, 0), (128, 128, 0)] * 2


def test_ep_gpt_oss_read_back() -> None:
    """gpt-oss under TP 2 x EP 2: ``_load_mxfp4_experts_weights`` slices the EP rank's experts and the TP rank's
    whole 32-blocks (gpt-oss I = 2880: 1440 channels each)."""
    ckpt = _mxfp4_weights(GPT_OSS_I, 256, Fc1Layout.GATE_UP_INTERLEAVED, experts=2)
    shards = POLICY_SHARDING.shard_moe(ckpt, True, 2, ep=2, backend=Mxfp4MoeBackend.FLASHINFER_TRTLLM)
    assert [s.experts for s in shards] == [(0,), (0,), (1,), (1,)]
    assert [(s.offset, s.real) for s in shards] == [(0, 1440), (1440, 1440)] * 2


def test_ep_not_dividing_experts_is_refused() -> None:
    """``FusedMoE.__init__`` asserts ``E % moe_ep_size == 0``: reported as the policy's refusal."""
    with pytest.raises(ShardRefused, match="3 experts at EP=2"):
        POLICY_SHARDING.shard_moe(_nvfp4_weights(3, 256), True, 1, ep=2)


def test_ranks_of_a_layer_share_one_published_server_args(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every rank's ``FusedMoE`` of one ``shard_moe`` (TP 2 x EP 2, each rank loaded twice: 8 layers) is built
    under one published dummy ``ServerArgs`` (:func:`subjects.sglang.layer.shared_server_args`), and the context
    before it is restored after; a layer built alone publishes its own."""
    ctx = sglang_modules().ctx.get_context()
    calls, original = [], type(ctx).override_server_args
    monkeypatch.setattr(type(ctx), "override_server_args", lambda self, **kw: calls.append(kw) or original(self, **kw))
    before = ctx._server_args
    POLICY_SHARDING.shard_moe(_nvfp4_weights(4, 256), True, 2, ep=2, backend=Nvfp4MoeBackend.FLASHINFER_TRTLLM)
    assert len(calls) == 1 and ctx._server_args is before
    for rank in range(2):
        load_nvfp4_rank(Nvfp4MoeBackend.FLASHINFER_TRTLLM, _nvfp4_weights(1, 256), True, 2, rank)
    assert len(calls) == 3 and ctx._server_args is before


@pytest.mark.parametrize(
    ("backend", "want"),
    [
        (Mxfp4MoeBackend.FLASHINFER_TRTLLM, 640),  # Mxfp4MoEMethod.create_weights: ru(I/tp, 128)
        (Mxfp4MoeBackend.MARLIN, 640),  # ru(I/tp, 128)
        (Mxfp4MoeBackend.AITER, 768),  # Quark OCP-MX's QuarkW4A4MXFp4MoE: get_moe_weight_sizes, ru(I/tp, 256)
    ],
)
def test_stacked_buffer_is_the_runners(backend: Mxfp4MoeBackend, want: int) -> None:
    """The runner axis: a stacked ``[gate; up]`` checkpoint (I = 2304 at TP 4: 576 per rank) loads under the drawn
    backend's method, which sizes the buffer; the rank's channels sit at its head."""
    ckpt = _mxfp4_weights(STACKED_I, 256, Fc1Layout.GATE_UP)
    shards = POLICY_SHARDING.shard_moe(ckpt, True, 4, backend=backend)
    assert {s.weights.intermediate_size for s in shards} == {want}
    assert [(s.offset, s.real, s.start) for s in shards] == [(576 * r, 576, 0) for r in range(4)]


def test_cutlass_nvfp4_split_cuts_groups_in_0_5_23() -> None:
    """SGLang 0.5.23 under ``flashinfer_cutlass``: Gemma-4-26B-A4B's I = 704 at TP 8 gives every rank 88 channels
    at ``88·r``, inside 16-groups (the ledger's entry). Fails once SGLang splits on whole groups; then update both."""
    shards = POLICY_SHARDING.shard_moe(_nvfp4_weights(1, 704), True, 8, backend=Nvfp4MoeBackend.FLASHINFER_CUTLASS)
    assert [(s.offset, s.real) for s in shards] == [(88 * r, 88) for r in range(8)]
    assert {s.weights.intermediate_size for s in shards} == {88}


def test_unmapped_backend_is_not_served() -> None:
    """A backend without an SGLang runner (``NVFP4_BACKENDS``) is :class:`~contracts.errors.UnsupportedConfig`."""
    with pytest.raises(UnsupportedConfig):
        POLICY_SHARDING.shard_moe(_nvfp4_weights(1, 256), True, 2, backend=Nvfp4MoeBackend.VLLM_CUTLASS)


# --- fp8_moe: SGLang's block-FP8 MoE path (Fp8MoEMethod) -------------------------------------------------

FP8 = SglangFp8MoeAlignment()


def _fp8_aligned(model: str, tp: int, backend: Fp8MoeBackend):
    shape = pinned_shape(model, tp)
    case = fp8_layer(shape)
    return shape, case.checkpoint, FP8.align_moe(backend, case.checkpoint, shape.gated)


@pytest.mark.parametrize("backend", list(FP8_BACKENDS))
def test_fp8_whole_tiles_are_kept_as_they_are(backend: Fp8MoeBackend) -> None:
    """DeepSeek-V3 at TP 8 (I 256, H 7168): whole 128-tiles, so both runners keep the checkpoint byte for byte
    (the TRT-LLM loader's ``[up; gate]`` buffer read back ``[gate; up]``)."""
    shape, ckpt, aligned = _fp8_aligned("deepseek-v3", 8, backend)
    assert (aligned.intermediate_size, aligned.hidden_size) == (shape.intermediate, shape.hidden)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(aligned.weights, name), getattr(ckpt, name)), name


def test_fp8_trtllm_rounds_partial_tiles_to_128() -> None:
    """Under ``flashinfer_trtllm`` ``FusedMoE.__init__`` rounds ``I/tp`` to 128 (Qwen3.8-Flash-Next TP 8: 80 -> 128)
    and the loader zero-fills each half's tail: byte for byte the built-in policy, the hidden size unpadded."""
    shape, ckpt, aligned = _fp8_aligned("qwen3.8-flash-next", 8, Fp8MoeBackend.FLASHINFER_TRTLLM)
    assert (aligned.intermediate_size, aligned.hidden_size) == (128, shape.hidden)
    builtin = BuiltinFp8MoeAlignment().align_moe(Fp8MoeBackend.FLASHINFER_TRTLLM, ckpt, shape.gated)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        assert torch.equal(getattr(aligned.weights, name), getattr(builtin.weights, name)), name


def test_fp8_trtllm_non_gated_rounds_to_128() -> None:
    """A non-gated (ReLU2) layer: one FC1 projection, its rows rounded to 128 like a gated half."""
    shape = pinned_shape("nemotron-3-nano-30b-a3b", 8)
    assert not shape.gated and shape.intermediate % 128
    aligned = FP8.align_moe(Fp8MoeBackend.FLASHINFER_TRTLLM, fp8_layer(shape).checkpoint, False)
    assert aligned.intermediate_size == round_up(shape.intermediate, 128)


def test_fp8_triton_refuses_partial_tiles_in_0_5_23() -> None:
    """SGLang 0.5.23's ``Fp8MoEMethod.create_weights`` refuses ``I/tp % 128 != 0`` on every runner but
    ``flashinfer_trtllm`` and AITER (the ledger's entry, SGLang #10641; vLLM's same refusal was vLLM #54178, fixed
    by padding in vLLM PR #55867). Fails once SGLang pads there too; then update the ledger."""
    with pytest.raises(ValueError, match=r"weight = 80 is not divisible by weight quantization block_n = 128"):
        _fp8_aligned("qwen3.8-flash-next", 8, Fp8MoeBackend.TRITON)


def _fp8_weights(experts: int, intermediate: int, hidden: int = 256) -> MoeWeights:
    """Random block-FP8 expert bytes (codes 1..126) and tile scales (1..126), gated, stacked ``[gate; up]``."""
    g = torch.Generator().manual_seed(experts * intermediate)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(1, 127, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    e, i, h, t = experts, intermediate, hidden, -(-intermediate // 128)
    return MoeWeights(w13=draw(e, 2 * i, h), w13_scale=draw(e, 2 * t, h // 128).float(), w2=draw(e, h, i),
                      w2_scale=draw(e, h // 128, t).float(), block=128, fc1_layout=Fc1Layout.GATE_UP)  # fmt: skip


def test_fp8_trtllm_split_is_whole_tiles() -> None:
    """Qwen3.8-Flash-Next's I = 640 at TP 8 under ``flashinfer_trtllm``: every rank's buffer is ``ru(80, 128)``
    and rank ``r`` reads from ``128·r``, weights and scale tiles alike: five full ranks, three empty (vLLM PR
    #55867's split, ``reference.sizes.padded_split``)."""
    shards = POLICY_SHARDING.shard_moe(_fp8_weights(1, 640), True, 8, backend=Fp8MoeBackend.FLASHINFER_TRTLLM)
    assert [(s.offset, s.real) for s in shards] == [(128 * r, 128) for r in range(5)] + [(640, 0)] * 3
    assert {s.weights.intermediate_size for s in shards} == {128}


def test_fp8_triton_split_refused_where_it_cuts_tiles() -> None:
    """The Triton runner (SGLang's default without DeepGEMM): ``I/tp`` per rank, refused where it cuts a tile
    (640 at TP 4: 160), split evenly where it does not (640 at TP 5: 128)."""
    with pytest.raises(ShardRefused, match="not divisible by weight quantization block_n"):
        POLICY_SHARDING.shard_moe(_fp8_weights(1, 640), True, 4)
    shards = POLICY_SHARDING.shard_moe(_fp8_weights(1, 640), True, 5)
    assert [(s.offset, s.real, s.start) for s in shards] == [(128 * r, 128, 0) for r in range(5)]


@pytest.mark.parametrize("backend", list(FP8_BACKENDS))
def test_fp8_ep_ranks_hold_their_experts_scales(backend: Fp8MoeBackend) -> None:
    """TP 2 x EP 2: every ``Fp8MoEMethod`` parameter, tile scales included, is loaded through
    ``FusedMoE.weight_loader``'s global-to-local expert map, so an EP rank holds its own experts' scales
    (the ``moe_sharding`` contract's ``assert_scales_local``; SGLang #36597 was ModelOpt's global input scales)."""
    ckpt = _fp8_weights(4, 256)
    shards = POLICY_SHARDING.shard_moe(ckpt, True, 2, ep=2, backend=backend)
    assert [s.experts for s in shards] == [(0, 1), (0, 1), (2, 3), (2, 3)]
    for s in shards:
        src, t = select_experts(ckpt, s.experts), s.offset // 128  # one 128-tile per half on each TP rank
        assert torch.equal(s.weights.w2_scale, src.w2_scale[..., t : t + 1])
        assert torch.equal(s.weights.w13_scale, src.w13_scale[:, [t, 2 + t]])


# --- fp8_tensor_moe: SGLang's per-tensor FP8 MoE path (no suite record served) ------------------------


@pytest.mark.parametrize("backend", sorted(FP8_TENSOR_NOT_MAPPED, key=lambda b: b.value))
def test_unmapped_fp8_tensor_backends_skip_with_the_reason(backend: Fp8TensorMoeBackend) -> None:
    shape = pinned_shape("qwen3.8-flash-next", 8)
    with pytest.raises(LibraryUnavailable, match=r"SGLang 0\.5\.23 has no path"):
        SglangFp8TensorMoeAlignment().align_moe(backend, fp8_layer(shape, FP8_TENSOR_BLOCK).checkpoint, True)


@pytest.mark.parametrize(("model", "tp"), [("qwen3.8-flash-next", 8), ("nemotron-3-nano-30b-a3b", 8)])
def test_per_tensor_fp8_trtllm_pads_to_128(model: str, tp: int) -> None:
    """SGLang's per-tensor FP8 MoE for its fused ``trtllm_fp8_per_tensor_scale_moe``: ``FusedMoE.__init__`` rounds
    ``I/tp`` to 128 (Qwen3.8-Flash-Next TP 8: 80 -> 128; ``align_fp8_moe_weights_for_flashinfer_trtllm``'s own
    16 / 128 then has nothing left to pad), the hidden size unpadded, each half's tail zero; the FC1 half whose
    scale is the expert's maximum keeps its bytes (the other is re-quantized to that scale)."""
    shape = pinned_shape(model, tp)
    ckpt = fp8_layer(shape, FP8_TENSOR_BLOCK).checkpoint
    aligned = sglang_per_tensor_fp8(ckpt, shape.gated)
    i, ip = shape.intermediate, round_up(shape.intermediate, 128)
    assert (aligned.intermediate_size, aligned.hidden_size) == (ip, shape.hidden)
    w, f = aligned.weights, 2 if shape.gated else 1
    for half in range(f):
        assert not w.w13[:, half * ip + i : (half + 1) * ip].any(), f"half {half} tail"
    assert not w.w2[..., i:].any() and torch.equal(w.w2[..., :i], ckpt.w2)
    assert torch.equal(w.w13_scale[:, 0], ckpt.w13_scale.amax(dim=1))
    for e in range(ckpt.w13.shape[0]):
        top = int(ckpt.w13_scale[e, :, 0].argmax())
        assert torch.equal(w.w13[e, top * ip : top * ip + i], ckpt.w13[e, top * i : (top + 1) * i]), e
