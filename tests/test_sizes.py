"""Self-tests of ``reference/sizes.py``: round-up, even TP splits, whole-block splits.

Cross-checks and their source of truth:

* ``round_up``: its definition (smallest multiple ``>= x``).
* ``even_split``: ``docs/vllm-logic.md`` §15 and ``docs/models.md`` §3 (Gemma-4-26B-A4B I = 704 splits
  into 352 and 176 at TP 2/4, and is refused at TP 8: 704/8 = 88 cuts a 16-element NVFP4
  group); in general it succeeds exactly when ``tp | size`` and ``group | size/tp``.
* ``whole_block_split``: ``docs/models.md`` §4 (gpt-oss 2880 with 32-element blocks at TP 1/2/4/8:
  2880; 1440/1440; 736 x3 / 672; 384 x7 / 192) and the gpt-oss loader rule
  ``cdiv(size/group, tp)·group`` per rank, the last ranks holding what remains.
"""

from __future__ import annotations

import itertools

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from reference.errors import ShapeContractError
from reference.sizes import even_split, padded_split, round_up, whole_block_split


@given(x=st.integers(0, 10**6), multiple=st.integers(1, 1024))
def test_round_up(x: int, multiple: int) -> None:
    r = round_up(x, multiple)
    assert r % multiple == 0 and x <= r < x + multiple


@pytest.mark.parametrize("multiple", [0, -16])
def test_round_up_rejects_non_positive_multiple(multiple: int) -> None:
    with pytest.raises(ShapeContractError, match="positive"):
        round_up(5, multiple)


@pytest.mark.parametrize(("tp", "want"), [(1, 704), (2, 352), (4, 176)])
def test_even_split_gemma4(tp: int, want: int) -> None:
    assert even_split(704, tp, 16) == want


def test_even_split_refuses_gemma4_tp8_group_straddle() -> None:
    with pytest.raises(ShapeContractError, match=r"88 % 16 = 8"):
        even_split(704, 8, 16)


def test_even_split_mxfp4_straddle_glm_air_tp8() -> None:
    """docs/models.md §3: GLM-4.5-Air I = 1408 at TP8 gives 176, which cuts a 32-element MXFP4 group."""
    assert even_split(1408, 8, 16) == 176
    with pytest.raises(ShapeContractError, match="quantization group"):
        even_split(1408, 8, 32)


@given(size=st.integers(1, 20000), tp=st.sampled_from([1, 2, 3, 4, 8, 16]), group=st.sampled_from([16, 32]))
def test_even_split_accepts_exactly_whole_groups(size: int, tp: int, group: int) -> None:
    if size % tp == 0 and (size // tp) % group == 0:
        assert even_split(size, tp, group) == size // tp
    else:
        with pytest.raises(ShapeContractError) as info:
            even_split(size, tp, group)
        assert str(size) in str(info.value)


@pytest.mark.parametrize(("tp", "group"), [(0, 16), (-2, 16), (2, 0)])
def test_even_split_rejects_bad_tp_or_group(tp: int, group: int) -> None:
    with pytest.raises(ShapeContractError, match="must be >= 1"):
        even_split(704, tp, group)


GPT_OSS = {1: (2880,), 2: (1440, 1440), 4: (736, 736, 736, 672), 8: (384,) * 7 + (192,)}


@pytest.mark.parametrize("tp", sorted(GPT_OSS))
def test_whole_block_split_gpt_oss(tp: int) -> None:
    assert whole_block_split(2880, tp, 32) == GPT_OSS[tp]


@given(blocks=st.integers(1, 400), tp=st.integers(1, 16), group=st.sampled_from([16, 32]))
def test_whole_block_split_rule(blocks: int, tp: int, group: int) -> None:
    """Ranks get ``cdiv(blocks, tp)`` whole blocks in order until the channels run out."""
    size = blocks * group
    split = whole_block_split(size, tp, group)
    per_rank = -(-blocks // tp) * group
    assert len(split) == tp and sum(split) == size
    assert all(n % group == 0 for n in split), "a rank holds a partial block"
    assert all(a >= b for a, b in itertools.pairwise(split)), "ranks are not filled in order"
    full = [n for n in split if n == per_rank]
    assert split[: len(full)] == tuple(full) and all(n < per_rank for n in split[len(full) :])
    assert len([n for n in split if 0 < n < per_rank]) <= 1, "more than one partially filled rank"


def test_whole_block_split_errors() -> None:
    with pytest.raises(ShapeContractError, match="whole number"):
        whole_block_split(2880 + 16, 4, 32)
    for tp, group in ((0, 32), (-1, 32), (4, 0)):
        with pytest.raises(ShapeContractError):
            whole_block_split(2880, tp, group)


@pytest.mark.parametrize(
    ("size", "tp", "multiple", "want"),
    [
        (704, 2, 64, (384, 320)),  # Gemma-4 TP=2 under SGLang's TRT-LLM padded loading
        (704, 4, 64, (192, 192, 192, 128)),  # Gemma-4 TP=4
        (1856, 2, 128, (1024, 832)),  # Nemotron-3-Nano (non-gated) TP=2
        (768, 8, 64, (128, 128, 128, 128, 128, 128, 0, 0)),  # Qwen3-30B-A3B TP=8: two empty ranks
        (768, 4, 1, (192, 192, 192, 192)),  # multiple 1: the even split
    ],
)
def test_padded_split(size: int, tp: int, multiple: int, want: tuple[int, ...]) -> None:
    assert padded_split(size, tp, multiple) == want


@given(blocks=st.integers(1, 400), tp=st.integers(1, 16), group=st.sampled_from([16, 32, 64, 128]))
def test_padded_split_is_whole_block_split_on_whole_blocks(blocks: int, tp: int, group: int) -> None:
    """On whole blocks that split evenly over the ranks, padding each rank's share is the whole-block split."""
    size = blocks * group
    assume(size % tp == 0)
    assert padded_split(size, tp, group) == whole_block_split(size, tp, group)


def test_padded_split_needs_an_even_split() -> None:
    with pytest.raises(ShapeContractError, match="evenly"):
        padded_split(704, 3, 64)
