"""Self-tests of the ``sglang`` subject's adapters (skipped where SGLang is not installed).

* Each adapter returns what SGLang's code decides, with only the documented pieces substituted:
  the NVFP4 MoE path (``create_weights`` rounding, ``FusedMoE.weight_loader`` placement, both
  post-load branches); the Quark W4A4 MXFP4 linear guard, weight preparation and activation quantizers
  (read from ``apply_weights``' source); the MXFP4 MoE sizes of a real ``FusedMoE`` per backend.
* A moved or renamed SGLang symbol fails loudly, naming it (:class:`subjects.sglang.SglangSourceMismatch`).
* The known-failure ledger names only contracts, backends and checks that exist.
"""

from __future__ import annotations

import importlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.mxfp4_linear import AiterLinearPath
from backends.mxfp4_moe import Mxfp4MoeBackend
from backends.nvfp4_moe import Nvfp4MoeBackend
from conformance import test_mxfp4_linear, test_mxfp4_moe, test_nvfp4_moe
from contracts.moe import MoeWeights
from reference.formats import MxScaleRounding
from reference.layouts import Fc1Layout, aiter_shuffle_weight, vllm_asm_scale_swizzle
from reference.padding import pad_dim
from reference.sizes import padded_split, round_up
from strategies.catalog import MODELS
from strategies.moe import pinned_shape
from strategies.tensors import moe_case
from subjects import sglang as ss
from subjects.nvfp4_moe import BuiltinNvfp4MoeAlignment
from subjects.registry import backends, contracts, resolve

pytestmark = pytest.mark.sglang

NVFP4 = ss.SglangNvfp4MoeAlignment()
CHECK_MODULES = {"nvfp4_moe": test_nvfp4_moe, "mxfp4_linear": test_mxfp4_linear, "mxfp4_moe": test_mxfp4_moe}


def test_subject_policies_implement_their_contracts() -> None:
    subject = resolve("sglang")
    assert set(subject.policies) <= set(contracts())
    for contract, policy in subject.policies.items():
        assert isinstance(policy, contracts()[contract])


def test_known_failures_name_real_checks_and_backends() -> None:
    for known in ss.SGLANG_KNOWN_FAILURES:
        assert known.link.startswith("https://github.com/")
        assert known.backend is None or known.backend in {b.value for b in backends(known.contract)}
        assert known.check is None or hasattr(CHECK_MODULES[known.contract], known.check), known.check


def test_a_moved_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    ss.sglang_modules()  # the real import first, so only the symbol check runs again
    module = importlib.import_module("sglang.srt.layers.moe.moe_runner.flashinfer_trtllm")
    monkeypatch.delattr(module, "align_fp4_moe_weights_for_flashinfer_trtllm")
    ss.sglang_modules.cache_clear()
    try:
        with pytest.raises(
            ss.SglangSourceMismatch, match=r"flashinfer_trtllm\.align_fp4_moe_weights_for_flashinfer_trtllm"
        ):
            ss.sglang_modules()
    finally:
        ss.sglang_modules.cache_clear()


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


LINEAR = ss.SglangQuarkMxfp4Linear()


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
    assert ss.sglang_linear_quantizers() == {
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
    assert ss.quark_path_quantizers(good)[AiterLinearPath.TRITON] == "dynamic_mxfp4_quant"
    with pytest.raises(ss.SglangSourceMismatch, match="quantizers"):
        ss.quark_path_quantizers(APPLY.format(asm="per_1x32_f4_quant", triton="some_new_quant"))
    with pytest.raises(ss.SglangSourceMismatch, match="use_aiter_asm_fp4_gemm"):
        ss.quark_path_quantizers(good.replace("use_aiter_asm_fp4_gemm", "use_asm"))


MXFP4 = ss.SglangMxfp4MoeAlignment()


def _mxfp4_weights(intermediate: int, hidden: int) -> MoeWeights:
    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(shape, dtype=torch.uint8)

    return MoeWeights(
        w13=zeros(1, 2 * intermediate, hidden // 2), w13_scale=zeros(1, 2 * intermediate, hidden // 32),
        w2=zeros(1, hidden, intermediate // 2), w2_scale=zeros(1, hidden, intermediate // 32), block=32,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "intermediate", "hidden", "want"),
    [
        (Mxfp4MoeBackend.FLASHINFER_TRTLLM, 2880, 2880, (2944, 3072)),  # gpt-oss TP1
        (Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, 192, 7168, (256, 7168)),  # DeepSeek-V4-Pro TP16 (SGLang #26250)
        (Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90, 2880, 2880, (2944, 3072)),  # hidden: the ledger's 256
        (Mxfp4MoeBackend.AITER, 384, 3072, (512, 3072)),  # MiniMax-M3 TP8: 256 (AITER #5233)
        (Mxfp4MoeBackend.MARLIN, 288, 4096, (384, 4096)),  # DeepSeek-V4.1-Flash TP8: the ledger's 128
    ],
)
def test_mxfp4_sizes_are_sglangs(
    backend: Mxfp4MoeBackend, intermediate: int, hidden: int, want: tuple[int, int]
) -> None:
    """Sizes read off a real ``FusedMoE`` of ``Mxfp4MoEMethod`` under each backend's selection."""
    assert MXFP4.sizes(backend, _mxfp4_weights(intermediate, hidden)) == want


SPLIT_MULTIPLE = {(Nvfp4MoeBackend.FLASHINFER_TRTLLM, True): 64, (Nvfp4MoeBackend.FLASHINFER_TRTLLM, False): 128}
"""Per-rank buffer multiple of SGLang's NVFP4 loader split (``create_weights``' TRT-LLM rounding); CUTLASS
allocates ``I/tp`` and splits evenly (multiple 1)."""


@settings(max_examples=6, deadline=None)
@given(
    model=st.sampled_from(sorted(n for n, m in MODELS.items() if m.moe_intermediate > 0)),
    tp=st.sampled_from((2, 4, 8)),
    backend=st.sampled_from(list(ss.NVFP4_BACKENDS)),  # the backends SGLang runs NVFP4 MoE on
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
    multiple = SPLIT_MULTIPLE.get((backend, gated), 1)
    per_rank = padded_split(size, tp, multiple)
    ip = round_up(size // tp, multiple)
    g = torch.Generator().manual_seed(size * tp)
    f, h = (2 if gated else 1), 64

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(1, 127, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    ckpt = MoeWeights(w13=draw(1, f * size, h // 2), w13_scale=draw(1, f * size, h // 16),
                      w2=draw(1, h, size // 2), w2_scale=draw(1, h, size // 16), block=16)  # fmt: skip
    covered = 0
    for rank, real in enumerate(per_rank):
        loaded, buffer = ss.load_nvfp4_rank(backend, ckpt, gated, tp, rank)
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


def test_mxfp4_loader_places_in_the_corner_and_pads_scales_with_one() -> None:
    """SGLang's gpt-oss loader copies a rank's interleaved experts into the leading corner of the padded
    buffer (pairs stay adjacent) and leaves padded weights 0 but padded scales E8M0 127 (1.0), the neutral
    value FlashInfer 0.7.4 asks for; the suite's layout properties require zero padding bytes, which is why
    the ``mxfp4_moe`` policy keeps the suite's placement (README findings)."""
    i, h = 96, 224
    g = torch.Generator().manual_seed(1)

    def draw(*shape: int) -> torch.Tensor:
        return torch.randint(1, 127, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    weights = MoeWeights(
        w13=draw(1, 2 * i, h // 2), w13_scale=draw(1, 2 * i, h // 32), w2=draw(1, h, i // 2),
        w2_scale=draw(1, h, i // 32), block=32, fc1_layout=Fc1Layout.GATE_UP_INTERLEAVED,
    )  # fmt: skip
    loaded = ss.load_mxfp4_checkpoint(Mxfp4MoeBackend.FLASHINFER_TRTLLM, weights)
    assert tuple(loaded.w13.shape) == (1, 2 * 128, 256 // 2)  # I -> 128, H -> 256 (FusedMoE.__init__)
    for name in ("w13", "w13_scale", "w2", "w2_scale"):
        src, dst = getattr(weights, name), getattr(loaded, name)
        corner = tuple(slice(0, n) for n in src.shape)
        assert torch.equal(dst[corner], src), name
        pad = torch.ones_like(dst, dtype=torch.bool)
        pad[corner] = False
        assert set(dst[pad].unique().tolist()) == ({127} if name.endswith("scale") else {0}), name


def test_cutlass_loader_split_cuts_groups() -> None:
    """Under ``flashinfer_cutlass`` SGLang 0.5.23's NVFP4 loader narrows every tensor by its own size / tp
    (buffer ``I/tp``): Gemma-4-26B-A4B at TP8 gets 88 channels but 5 FC2 scale groups per rank, the split
    vLLM #49949 reports for vLLM (README findings; not reported to SGLang). The ``sglang`` subject's
    ``moe_sharding`` policy loads under ``flashinfer_trtllm``, whose padded split keeps whole groups; this
    fails once the CUTLASS split keeps whole groups too."""
    from conformance.test_moe_sharding import check_every_element_on_one_rank
    from strategies.moe_sharding import pinned_sharding
    from subjects.sglang_sharding import SglangMoeSharding

    policy = SglangMoeSharding(Nvfp4MoeBackend.FLASHINFER_CUTLASS)
    with pytest.raises(AssertionError, match=r"rank 0 holds channels \[0, 88\), which cut a 16-element scale group"):
        check_every_element_on_one_rank(pinned_sharding("gemma-4-26b-a4b", 8), None, policy)
