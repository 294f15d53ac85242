"""Rank-local size arithmetic: rounding, tensor-parallel splits and group integrity.

Symbols follow ``docs/vllm-logic.md``: ``I`` is an intermediate size, ``tp`` the
tensor-parallel degree, ``g`` the quantization group (16 for NVFP4, 32 for MXFP4).
"""

from __future__ import annotations

from reference.errors import ShapeContractError, require


def round_up(x: int, multiple: int) -> int:
    """``ru(x, m)``: the smallest multiple of ``multiple`` that is ``>= x``."""
    require(multiple > 0, f"round_up: multiple must be positive, got {multiple}")
    return -(-x // multiple) * multiple


def even_split(size: int, tp: int, group: int) -> int:
    """Rank-local size of an even tensor-parallel split, as NVFP4 ModelOpt loaders shard.

    Returns ``size / tp``. Raises :class:`ShapeContractError` when ``tp`` does not divide
    ``size`` or when the rank-local size cuts a quantization group (``(size/tp) % group != 0``):
    rank ``r`` then starts at ``r·size/tp``, inside a group, and no padding can repair the
    misaligned block scales (``docs/vllm-logic.md`` §15).
    """
    require(tp >= 1, f"tensor-parallel degree must be >= 1, got {tp}")
    require(group >= 1, f"quantization group must be >= 1, got {group}")
    part, rem = divmod(size, tp)
    if rem:
        raise ShapeContractError(f"size {size} is not divisible by tensor-parallel degree {tp}")
    if part % group:
        raise ShapeContractError(
            f"TP={tp} splits size {size} into {part} per rank, which cuts a {group}-element "
            f"quantization group ({part} % {group} = {part % group}); padding cannot repair a "
            "group straddle: refuse this TP degree or shard in whole groups"
        )
    return part


def whole_block_split(size: int, tp: int, group: int) -> tuple[int, ...]:
    """Real channels per rank when a loader shards in whole ``group``-element blocks.

    The gpt-oss loader gives every rank ``cdiv(size/group, tp)·group`` channels, and the last
    ranks hold what remains (possibly fewer, possibly zero); ``size % group == 0`` is required.
    Returns the real channel count of each rank, ``sum == size``.
    """
    require(tp >= 1, f"tensor-parallel degree must be >= 1, got {tp}")
    require(group >= 1, f"quantization group must be >= 1, got {group}")
    require(size % group == 0, f"size {size} is not a whole number of {group}-element blocks")
    per_rank = -(-(size // group) // tp) * group
    return tuple(max(0, min(per_rank, size - r * per_rank)) for r in range(tp))


def padded_split(size: int, tp: int, multiple: int) -> tuple[int, ...]:
    """Real channels per rank when a loader gives every rank a buffer of ``ru(size/tp, multiple)``
    channels and fills the ranks' buffers in order from the checkpoint.

    SGLang's padded loading (``FusedMoE._load_w13`` / ``_load_w2`` with
    ``narrow_padded_param_and_loaded_weight``, taken under ``flashinfer_trtllm``) reads rank ``r``'s
    channels from ``r·ru(size/tp, multiple)``: whole padded blocks per rank, so the last ranks hold
    fewer real channels than their buffer, possibly none (Gemma-4 I = 704 at TP=2: 384 and 320, not
    352 and 352). ``size % tp == 0`` is required (SGLang asserts it). Returns each rank's real channel
    count, ``sum == size``; with ``size % multiple == 0`` it equals ``whole_block_split(size, tp, multiple)``.
    """
    require(tp >= 1 and multiple >= 1, f"need tp >= 1 and multiple >= 1, got {tp}, {multiple}")
    require(size % tp == 0, f"size {size} does not split evenly over {tp} ranks")
    per_rank = round_up(size // tp, multiple)
    return tuple(max(0, min(per_rank, size - r * per_rank)) for r in range(tp))


def expert_blocks(experts: int, ep: int) -> tuple[tuple[int, ...], ...]:
    """The global experts each of ``ep`` expert-parallel ranks holds: contiguous blocks in rank order,
    ``⌊E/ep⌋`` each and one more on the first ``E % ep`` ranks (ranks hold none when ``E < ep``).

    vLLM's ``determine_expert_map`` ("linear" placement, vLLM 0.33.0
    ``model_executor/layers/fused_moe/expert_map_manager.py``): rank ``r`` holds
    ``[r·⌊E/ep⌋ + min(r, E % ep), …)``; with ``E % ep == 0`` (which SGLang's ``FusedMoE`` asserts) it is
    SGLang's ``[r·E/ep, (r+1)·E/ep)``.
    """
    require(ep >= 1, f"expert-parallel degree must be >= 1, got {ep}")
    require(experts >= 0, f"expert count must be >= 0, got {experts}")
    base, rem = divmod(experts, ep)
    starts = [r * base + min(r, rem) for r in range(ep + 1)]
    return tuple(tuple(range(starts[r], starts[r + 1])) for r in range(ep))
