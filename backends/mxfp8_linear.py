"""The ``mxfp8_linear`` backends: FlashInfer's ``mm_mxfp8`` GEMM paths that vLLM 0.33.0 runs an MXFP8 linear layer on.

vLLM 0.33.0 picks an MXFP8 linear kernel from ``_POSSIBLE_MXFP8_KERNELS[CUDA]``
(``vllm/model_executor/kernels/linear/__init__.py``); three of them call FlashInfer's ``mm_mxfp8``
(``vllm/model_executor/kernels/linear/mxfp8/flashinfer.py``), one record each. Every rule below was read in
the installed sources, vLLM 0.33.0 and FlashInfer 0.7.4 (``flashinfer/gemm/gemm_base.py``), on 2026-12-04;
no kernel has been run (mm_mxfp8 needs SM100+), so the records hold no kernel runner.

Common to all three (FlashInfer 0.7.4 ``_check_mm_mxfp8_problem_size``, gemm_base.py:6646-6680): ``n >= 128``
and ``k >= 128`` ("The output may contain NaN/Inf if the dimensions are too small"), E4M3 operands, uint8
E8M0 scales. The weight scale is swizzled from the row-major grid padded with zeros to
``(round_up(N, 128), round_up(K/32, 4))`` (vLLM 0.33.0 ``swizzle_mxfp8_scale``,
``vllm/model_executor/layers/quantization/utils/mxfp8_utils.py:14-35``; FlashInfer 0.7.4
``_mxfp8_swizzled_scale_len``, gemm_base.py:9951, states the same length for ``layout_128x4``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from backends import BackendRecord, register
from contracts.mxfp8_linear import CONTRACT
from reference.mxfp8 import MXFP8_BLOCK
from reference.sizes import round_up

SCALE_GRID_ROWS = 128
"""Rows of one ``F8_128x4`` scale atom: the scale grid's rows are padded to a multiple of it."""
SCALE_GRID_COLS = 4
"""Scale columns of one ``F8_128x4`` atom (4 x 32 = 128 elements of K)."""
MIN_N = MIN_K = 128
"""``mm_mxfp8``'s smallest ``n`` and ``k`` (FlashInfer 0.7.4 gemm_base.py:6669-6670)."""


class Mxfp8LinearBackend(enum.Enum):
    """FlashInfer ``mm_mxfp8`` backends that vLLM 0.33.0's MXFP8 linear kernels call (the contract's backends)."""

    CUTLASS = "flashinfer-cutlass-mxfp8"  # FlashInferCutlassMxfp8LinearKernel, mm_mxfp8(backend="cutlass")
    CUTE_DSL = "flashinfer-cutedsl-mxfp8"  # FlashInferCutedslMxfp8LinearKernel, mm_mxfp8(backend="cute-dsl")
    TRTLLM = "flashinfer-trtllm-mxfp8"  # FlashInferTrtllmMxfp8LinearKernel, mm_mxfp8(backend="trtllm")


@dataclass(frozen=True, kw_only=True)
class Mxfp8LinearRecord(BackendRecord):
    """An ``mm_mxfp8`` path: the weight ``[Np, Kp]`` it takes has ``Np % n_multiple == 0``, ``Kp % k_multiple
    == 0``, ``Np >= 128`` and ``Kp >= 128``; its scale grid is ``[round_up(Np, 128), round_up(Kp/32, 4)]``."""

    n_multiple: int
    k_multiple: int
    kernel: None = None  # no kernel runner: mm_mxfp8 needs SM100+ and has not been run (module docstring)

    OPTIONAL: ClassVar[frozenset[str]] = BackendRecord.OPTIONAL | {"kernel"}

    def padded_shape(self, n: int, k: int) -> tuple[int, int]:
        """The smallest ``(Np, Kp) >= (N, K)`` the path takes: rounded up to the multiples, then to 128."""
        return max(round_up(n, self.n_multiple), MIN_N), max(round_up(k, self.k_multiple), MIN_K)

    def scale_grid(self, np_: int, kp: int) -> tuple[int, int]:
        """The row-major scale grid of a ``[Np, Kp]`` weight before the swizzle: ``(round_up(Np, 128),
        round_up(Kp/32, 4))``."""
        return round_up(np_, SCALE_GRID_ROWS), round_up(-(-kp // MXFP8_BLOCK), SCALE_GRID_COLS)

    def accepts(self, weight_shape: tuple[int, ...], scale_shape: tuple[int, ...]) -> bool:
        """Whether the path takes a 2-D weight of ``weight_shape`` with a scale grid of ``scale_shape``."""
        if len(weight_shape) != 2:
            return False
        np_, kp = weight_shape
        return (
            np_ % self.n_multiple == 0
            and kp % self.k_multiple == 0
            and np_ >= MIN_N
            and kp >= MIN_K
            and tuple(scale_shape) == self.scale_grid(np_, kp)
        )


VLLM_MXFP8 = "vllm 0.33.0 vllm/model_executor/kernels/linear/mxfp8/flashinfer.py"
VLLM_SWIZZLE = "vllm 0.33.0 vllm/model_executor/layers/quantization/utils/mxfp8_utils.py"
FLASHINFER_GEMM = "flashinfer-python 0.7.4 flashinfer/gemm/gemm_base.py"

RECORDS = (
    Mxfp8LinearRecord(
        member=Mxfp8LinearBackend.CUTLASS,
        contract=CONTRACT,
        entry_point='flashinfer.mm_mxfp8(backend="cutlass")',
        sources=(VLLM_MXFP8, VLLM_SWIZZLE, FLASHINFER_GEMM),
        # vLLM 0.33.0 flashinfer.py:27-38 (_check_mm_mxfp8_shape: K >= 128, K % 32 == 0, N >= 128) and :60-67;
        # SM12x also needs N % 32 (flashinfer.py:64, FlashInfer 0.7.4 gemm_base.py:6785): not modelled here.
        n_multiple=1,
        k_multiple=MXFP8_BLOCK,
    ),
    Mxfp8LinearRecord(
        member=Mxfp8LinearBackend.CUTE_DSL,
        contract=CONTRACT,
        entry_point='flashinfer.mm_mxfp8(backend="cute-dsl")',
        sources=(VLLM_MXFP8, VLLM_SWIZZLE, FLASHINFER_GEMM),
        # vLLM 0.33.0 flashinfer.py:141-143 (the same _check_mm_mxfp8_shape); FlashInfer 0.7.4's
        # _cute_dsl_gemm_mxfp8_requirement adds no size rule. vLLM stores this path's weight as the
        # [K, N] view .t() of the same bytes (flashinfer.py:160-161); the contract's weight is before that view.
        n_multiple=1,
        k_multiple=MXFP8_BLOCK,
    ),
    Mxfp8LinearRecord(
        member=Mxfp8LinearBackend.TRTLLM,
        contract=CONTRACT,
        entry_point='flashinfer.mm_mxfp8(backend="trtllm", use_8x4_sf_layout=True)',
        sources=(VLLM_MXFP8, VLLM_SWIZZLE, FLASHINFER_GEMM),
        # FlashInfer 0.7.4 _trtllm_gemm_mxfp8_requirement (gemm_base.py:6797-6822): k % 256 == 0, else the
        # backend is not taken. vLLM 0.33.0 flashinfer.py:229-247 raises for K % 256 and pads N to a multiple
        # of 128 with zero weight rows and zero scale rows before shuffle_matrix_a / shuffle_matrix_sf_a.
        n_multiple=SCALE_GRID_ROWS,
        k_multiple=256,
    ),
)
register(*RECORDS)
