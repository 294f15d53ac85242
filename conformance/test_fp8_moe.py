"""Contract ``fp8_moe``: block-scaled FP8 MoE weight alignment (E4M3 experts, fp32 128x128 tile scales).

For every MoE shape a catalogued model produces at any TP degree (and adversarial ones), the policy under
test pads one rank's FP8 expert weights so that the backend accepts them (whole 128-blocks of the
intermediate size per rank, and of the hidden size where the backend reads it in 128-blocks), the padding
is zeros with finite scales, and the layer's output is unchanged. The four generic MoE properties are
:mod:`conformance.moe_properties`' over the format record :data:`conformance.moe_formats.FP8_BLOCK`. Pinned
regressions (``@example``): ``conformance.regressions.FP8_MOE_REGRESSIONS``.
"""

from __future__ import annotations

import pytest

from backends.fp8_moe import CONTRACT
from conformance.moe_formats import FP8_BLOCK
from conformance.moe_properties import moe_alignment_properties

pytestmark = [pytest.mark.contract(CONTRACT)]

moe_alignment_properties(FP8_BLOCK, globals())
