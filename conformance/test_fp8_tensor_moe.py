"""Contract ``fp8_tensor_moe``: per-tensor FP8 MoE weight alignment (E4M3 experts, one fp32 scale per weight).

For every MoE shape a catalogued model produces at any TP degree (and adversarial ones), the policy under
test pads one rank's per-tensor FP8 expert weights so that the backend accepts them, the padding is E4M3
zeros (the per-weight scales are not padded), and the layer's output is unchanged. The four generic MoE
properties are :mod:`conformance.moe_properties`' over the format record
:data:`conformance.moe_formats.FP8_TENSOR`. Pinned regressions (``@example``):
``conformance.regressions.FP8_TENSOR_MOE_REGRESSIONS``.
"""

from __future__ import annotations

import pytest

from backends.fp8_tensor_moe import CONTRACT
from conformance.moe_formats import FP8_TENSOR
from conformance.moe_properties import moe_alignment_properties

pytestmark = [pytest.mark.contract(CONTRACT)]

moe_alignment_properties(FP8_TENSOR, globals())
