"""Self-tests of the ``sglang-deepseek-v4`` subject's adapters (skipped where SGLang is not installed).

* ``Fp8Config`` picks the DeepSeek-V4 FP4 expert method the subject names for each backend, and the buffers
  after SGLang's loader and ``process_weights_after_loading`` are SGLang's sizes, with the checkpoint's gate and
  up rows in the order the backend reads them.
* SGLang's loader splits the checkpoint evenly, ``I/tp`` channels per projection and rank.
* Each ledger finding is pinned where it happens, so a fix in SGLang shows up here first.
* A moved or renamed SGLang symbol fails loudly, naming it.
"""

from __future__ import annotations

import importlib
from dataclasses import replace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from backends.mxfp4_moe import Mxfp4MoeBackend
from conformance import test_moe_sharding, test_mxfp4_moe
from contracts.errors import CheckpointNotServed
from contracts.moe import MoeWeights
from reference.layouts import Fc1Layout, split_fc1
from strategies.catalog import SWIGLU
from strategies.moe_sharding import ShardingConfig
from subjects.registry import backends, contracts, resolve
from subjects.sglang.bridge import SglangSourceMismatch
from subjects.sglang.dsv4.bridge import DSV4_BACKENDS, dsv4_modules
from subjects.sglang.dsv4.ledger import DSV4_KNOWN_FAILURES, DSV4_SHARDING_FAILURES
from subjects.sglang.dsv4.mxfp4_moe import DSV4_PREFIX, SglangDsv4MoeAlignment, dsv4_checkpoint, load_dsv4_rank

pytestmark = pytest.mark.sglang

DSV4 = SglangDsv4MoeAlignment()
TRTLLM, CUTLASS, MARLIN = (
    Mxfp4MoeBackend.FLASHINFER_TRTLLM,
    Mxfp4MoeBackend.FLASHINFER_CUTLASS_SM90,
    Mxfp4MoeBackend.MARLIN,
)


def _weights(i: int, h: int, e: int = 2, seed: int = 0, biased: bool = False) -> MoeWeights:
    """Stacked ``[gate; up]`` MXFP4 experts of non-zero bytes (scale bytes 100..139, so any pad value shows)."""
    g = torch.Generator().manual_seed(seed)

    def draw(*shape: int, low: int = 1, high: int = 255) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=g, dtype=torch.int64).to(torch.uint8)

    return MoeWeights(
        w13=draw(e, 2 * i, h // 2), w13_scale=draw(e, 2 * i, h // 32, low=100, high=140),
        w2=draw(e, h, i // 2), w2_scale=draw(e, h, i // 32, low=100, high=140), block=32,
        fc1_layout=Fc1Layout.GATE_UP,
        w13_bias=torch.zeros(e, 2 * i) if biased else None, w2_bias=torch.zeros(e, h) if biased else None,
    )  # fmt: skip


def test_subject_policies_implement_their_contracts() -> None:
    subject = resolve("sglang-deepseek-v4")
    assert set(subject.policies) == {"mxfp4_moe", "moe_sharding"}
    for contract, policy in subject.policies.items():
        assert isinstance(policy, contracts()[contract])


def test_known_failures_name_real_checks_and_backends() -> None:
    for known in DSV4_KNOWN_FAILURES + DSV4_SHARDING_FAILURES:
        assert known.link.startswith("https://github.com/")
        assert known.backend is None or known.backend in {b.value for b in backends(known.contract)}
        assert known.check is None or hasattr(test_mxfp4_moe, known.check), known.check


def test_a_moved_symbol_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    dsv4_modules()  # the real import first, so only the symbol check runs again
    module = importlib.import_module("sglang.srt.layers.quantization.mxfp4_flashinfer_trtllm_moe")
    monkeypatch.delattr(module, "_pad_intermediate_size")
    dsv4_modules.cache_clear()
    try:
        with pytest.raises(SglangSourceMismatch, match=r"mxfp4_flashinfer_trtllm_moe\._pad_intermediate_size"):
            dsv4_modules()
    finally:
        dsv4_modules.cache_clear()


def test_checkpoint_names_reach_every_parameter() -> None:
    """DeepSeek-V4's names (``layers.L.ffn.experts.E.w1.weight`` / ``.scale``), through
    ``remap_weight_name_to_dpsk_hf_format`` and ``make_expert_params_mapping``, reach the four expert parameters."""
    m = dsv4_modules()
    names = {
        m.dsv4.DeepseekV4ForCausalLM.remap_weight_name_to_dpsk_hf_format(n, num_hidden_layers=1)
        for n, _ in dsv4_checkpoint(_weights(64, 64, e=1))
    }
    assert names == {
        f"{DSV4_PREFIX}.0.{proj}.{kind}"
        for proj in ("gate_proj", "up_proj", "down_proj")
        for kind in ("weight", "weight_scale_inv")
    }


@pytest.mark.parametrize(
    ("backend", "intermediate", "hidden", "want"),
    [
        (TRTLLM, 288, 5120, (384, 5120)),  # DeepSeek-V4.1-Flash TP8: I to 128 after loading, H as is
        (TRTLLM, 2048, 4096, (2048, 4096)),  # DeepSeek-V4-Flash TP1
        (CUTLASS, 384, 7168, (384, 7168)),  # DeepSeek-V4-Pro TP8: exact sizes, nothing padded
        (MARLIN, 288, 5120, (320, 5120)),  # DeepSeek-V4.1-Flash TP8: I to 64 in the Hopper repack, not 384
        (MARLIN, 192, 7168, (192, 7168)),  # DeepSeek-V4-Pro TP16
    ],
)
def test_sizes_are_sglangs(backend: Mxfp4MoeBackend, intermediate: int, hidden: int, want: tuple[int, int]) -> None:
    """Sizes of the buffers SGLang's DeepSeek-V4 method hands its GPU-only layout calls, per backend."""
    aligned = DSV4.align_moe(backend, _weights(intermediate, hidden, e=1), True)
    assert (aligned.intermediate_size, aligned.hidden_size) == want


PAD_SCALE = {TRTLLM: 127, CUTLASS: None, MARLIN: 0}
"""The UE8M0 byte each method leaves in padded scale rows: TRT-LLM's ``_pad_intermediate_size`` fills 1.0, Marlin's
repack pads its bf16 ``2^e`` scales with 0.0 (which ``mxfp4_marlin_process_scales``' cast makes byte 0); CUTLASS pads
nothing."""


@pytest.mark.parametrize("backend", list(DSV4_BACKENDS))
def test_post_load_keeps_pairs(backend: Mxfp4MoeBackend) -> None:
    """Read in the order the subject declares (the kernel's), each half holds the checkpoint's gate / up rows then
    its padding (zero codes, the method's scale fill); FC2 keeps its corner and pads K with zero codes."""
    i, h = 128 if backend is CUTLASS else 96, 256
    weights = _weights(i, h, seed=3)
    aligned = DSV4.align_moe(backend, weights, True)
    out, ip = aligned.weights, aligned.intermediate_size
    assert out.fc1_layout is DSV4_BACKENDS[backend].fc1_layout
    for name, fill in (("w13", 0), ("w13_scale", PAD_SCALE[backend])):
        for half, a, b in zip(("gate", "up"), split_fc1(getattr(weights, name), Fc1Layout.GATE_UP),
                              split_fc1(getattr(out, name), out.fc1_layout), strict=True):  # fmt: skip
            assert torch.equal(b[:, :i], a), (name, half)
            assert b.shape[1] == ip and set(b[:, i:].unique().tolist()) <= {fill}, (name, half)
    for name, per, fill in (("w2", 2, 0), ("w2_scale", 32, PAD_SCALE[backend])):
        a, b = getattr(weights, name), getattr(out, name)
        assert torch.equal(b[..., : i // per], a), name
        assert set(b[..., i // per :].unique().tolist()) <= {fill}, name


def test_biased_checkpoints_are_not_served() -> None:
    """None of the three methods allocates an expert bias: such a checkpoint is not this path's."""
    with pytest.raises(CheckpointNotServed, match="no expert biases"):
        DSV4.align_moe(TRTLLM, _weights(128, 128, biased=True), True)


@pytest.mark.parametrize("backend", list(DSV4_BACKENDS))
@pytest.mark.parametrize("tp", [2, 4, 8])
def test_loader_split_is_even(backend: Mxfp4MoeBackend, tp: int) -> None:
    """SGLang's loader, given the whole checkpoint at every rank, fills rank ``r``'s buffers with channels
    ``[r·I/tp, (r+1)·I/tp)`` of each projection and FC2 scale groups ``[r·I/(32·tp), ...)`` (``I = 3072``,
    DeepSeek-V4-Pro's: whole 128-blocks at every degree here, so every method loads). Every channel lands once."""
    i, h = 3072, 256
    ckpt = _weights(i, h, e=1, seed=tp)
    part = i // tp
    for rank in range(tp):
        loaded = load_dsv4_rank(backend, ckpt, tp, rank)
        start = rank * part
        for name in ("w13", "w13_scale"):
            for half, (a, b) in enumerate(
                zip(
                    split_fc1(getattr(ckpt, name), Fc1Layout.GATE_UP),
                    split_fc1(getattr(loaded, name), Fc1Layout.GATE_UP),
                    strict=True,
                )
            ):
                assert torch.equal(b, a[:, start : start + part]), f"rank {rank} {name} half {half}"
        for name, per in (("w2", 2), ("w2_scale", 32)):
            a, b = getattr(ckpt, name), getattr(loaded, name)
            assert torch.equal(b, a[..., start // per : (start + part) // per]), f"rank {rank} {name}"


# --- the ledger's findings, pinned --------------------------------------------------------------------


def test_cutlass_refuses_tp16_deepseek_v4_pro_in_0_5_23() -> None:
    """sglang#26250: DeepSeek-V4-Pro at TP16 (``I/tp`` = 192) on SM90 ``flashinfer_mxfp4`` is refused in
    ``create_weights``. Fails once SGLang pads the shard instead; then update the ledger."""
    with pytest.raises(ValueError, match=r"multiples of 128 \(got hidden=7168, intermediate=192\)"):
        DSV4.align_moe(CUTLASS, _weights(192, 7168, e=1), True)


def test_marlin_hidden_not_256_fails_at_load_in_0_5_23() -> None:
    """``Mxfp4MarlinMoEMethod.create_weights`` rounds H = 2880 to 3072 but the loader copies 1440 bytes per row
    (found by this suite). Fails once SGLang loads such a hidden size; then update the ledger."""
    with pytest.raises(RuntimeError, match=r"size of tensor a \(1536\) must match the size of tensor b \(1440\)"):
        DSV4.align_moe(MARLIN, _weights(128, 2880, e=1), True)


def test_trtllm_leaves_hidden_unpadded_in_0_5_23() -> None:
    """``Mxfp4FlashinferTrtllmMoEMethod`` keeps H = 2880 (not a multiple of 256, nor of 128) unpadded (found by this
    suite). Fails once SGLang pads the hidden size; then update the ledger."""
    aligned = DSV4.align_moe(TRTLLM, _weights(128, 2880, e=1), True)
    assert aligned.hidden_size == 2880


def test_trtllm_tp16_deepseek_v4_1_flash_mispairs_fc2_scales_in_0_5_23() -> None:
    """DeepSeek-V4.1-Flash (I = 2304) at TP16 on SM100: rank 1 holds channels [144, 288), which start inside
    32-group 4, but SGLang's loader hands it FC2 scale groups [4, 8) (``(2304/32) // 16 = 4`` per rank) and its
    buffer has room for 4 groups, 128 channels (found by this suite; ``DSV4_SHARDING_FAILURES``). Fails once SGLang
    splits such a layer on whole groups (or refuses it); then update the ledger."""
    i, h, tp = 2304, 64, 16
    ckpt = _weights(i, h, e=1, seed=16)
    loaded = load_dsv4_rank(TRTLLM, ckpt, tp, 1)
    assert torch.equal(loaded.w2, ckpt.w2[..., 72:144])  # channels [144, 288): bytes of 2 channels each
    assert loaded.w2_scale.shape[-1] == 4
    assert torch.equal(loaded.w2_scale, ckpt.w2_scale[..., 4:8])  # groups [128, 256), not those of [144, 288)


SHARD = ShardingConfig(
    model="adversarial", tp=2, intermediate=512, hidden=256, block=32, layout=Fc1Layout.GATE_UP,
    activation=SWIGLU, experts=1, top_k=1, tokens=2, seed=0,
)  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "intermediate", "hidden", "ledger"),
    [
        (TRTLLM, 512, 256, None),  # 256 channels per rank: whole groups, passes
        (TRTLLM, 288, 256, "fused_moe_triton/layer.py"),  # 144 per rank: scale groups cut, silently
        (MARLIN, 288, 256, "fused_moe_triton/layer.py"),
        (MARLIN, 512, 320, "mxfp4_marlin_moe.py"),  # H % 256: load crash
        (CUTLASS, 384, 256, "issues/26250"),  # 192 per rank: whole groups, refused
        (CUTLASS, 288, 256, None),  # 144 per rank: refused where an even split cuts groups, accepted
    ],
)
def test_sharding_findings_are_the_ledgers(
    backend: Mxfp4MoeBackend, intermediate: int, hidden: int, ledger: str | None
) -> None:
    """Both ``moe_sharding`` properties at TP2 per backend: pass, or fail the way exactly one ledger entry
    (``DSV4_SHARDING_FAILURES``) describes."""
    config = replace(SHARD, intermediate=intermediate, hidden=hidden, backend=backend.value)
    policy = resolve("sglang-deepseek-v4").policy("moe_sharding")
    for check in (test_moe_sharding.check_every_element_on_one_rank, test_moe_sharding.check_ranks_sum_to_layer):
        known = [k for k in DSV4_SHARDING_FAILURES if k.matches("moe_sharding", check.__name__, None, config)]
        if ledger is None:
            assert not known
            check(config, backend, policy)
            continue
        assert [k.link.split("/sglang/")[-1].endswith(ledger) for k in known] == [True], known
        with pytest.raises(BaseException) as caught:
            check(config, backend, policy)
        assert known[0].recognises(caught.value), caught.value


@settings(max_examples=10, deadline=None)
@given(
    groups=st.integers(1, 144),
    tp=st.sampled_from((1, 2, 4, 8, 16)),
    ep=st.sampled_from((1, 2, 4)),
    experts=st.integers(1, 4),
    hidden=st.sampled_from((256, 320, 512)),
    backend=st.sampled_from(list(DSV4_BACKENDS)),
)
def test_sharding_ledger_is_exact(
    groups: int, tp: int, ep: int, experts: int, hidden: int, backend: Mxfp4MoeBackend
) -> None:
    """Over layers this adapter loads, TP x EP (the CI strategy draws them rarely: most sharding draws are NVFP4,
    biased or for other backends), both ``moe_sharding`` properties pass exactly where no ledger entry applies,
    and fail the way the entry describes where one does."""
    tp = max(1, min(tp, 16 // ep))
    config = replace(
        SHARD, intermediate=32 * groups, hidden=hidden, tp=tp, ep_size=ep, experts=experts, backend=backend.value
    )
    policy = resolve("sglang-deepseek-v4").policy("moe_sharding")
    for check in (test_moe_sharding.check_every_element_on_one_rank, test_moe_sharding.check_ranks_sum_to_layer):
        known = [k for k in DSV4_SHARDING_FAILURES if k.matches("moe_sharding", check.__name__, None, config)]
        if not known:
            check(config, backend, policy)
            continue
        with pytest.raises(BaseException) as caught:
            check(config, backend, policy)
        assert any(k.recognises(caught.value) for k in known), caught.value
