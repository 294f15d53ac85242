"""Hypothesis strategies for the shared-expert placement decision (``docs/vllm-logic.md`` §12).

A case is one MoE block's shared expert (global intermediate size ``I``, hidden size ``H``) under
a parallel configuration (TP degree, EP, sequence parallelism), a quantization group (32 for
Quark OCP-MX, None otherwise) and the AITER fused-shared-experts switch and compatibility.
Sizes come from the catalogued models with a shared expert or, two times in three, are
adversarial (:func:`shared_intermediate_sizes`: around multiples of ``32·tp``, vLLM's unit-test
values 0 / 640 / 672, any size). Nothing is reduced: the decision and the linear guard only need
sizes.
"""

from __future__ import annotations

import enum
import functools
from dataclasses import dataclass

from hypothesis import strategies as st

from contracts.shared_expert import SharedExpertPlacement, SharedExpertSetup
from strategies.boundaries import boundary_sizes, moduli_for
from strategies.catalog import MODELS, TP_DEGREES
from strategies.config import Config
from strategies.linear import LinearLayer, Mxfp4LinearShape, Parallel, linear_shape, rank_local
from strategies.pins import current_pin

QUARK_OCP_MX_GROUP = 32


@dataclass(frozen=True)
class SharedExpertCase(Config):
    """A shared expert and the configuration its placement is decided under."""

    model: str
    hidden: int
    intermediate: int
    tp: int
    group: int | None
    expert_parallel: bool
    sequence_parallel: bool
    fse_enabled: bool
    fse_quant_compatible: bool

    def setup(self) -> SharedExpertSetup:
        return SharedExpertSetup(
            intermediate=self.intermediate,
            tp=self.tp,
            group=self.group,
            expert_parallel=self.expert_parallel,
            sequence_parallel=self.sequence_parallel,
            fse_enabled=self.fse_enabled,
            fse_quant_compatible=self.fse_quant_compatible,
        )

    def describe(self) -> str:
        flags = [f for f, on in (("EP", self.expert_parallel), ("SP", self.sequence_parallel)) if on]
        fse = "on" if self.fse_enabled else "off"
        compat = "compatible" if self.fse_quant_compatible else "incompatible"
        return (
            f"{self.model}: shared I={self.intermediate}, H={self.hidden}, TP={self.tp}{''.join(' ' + f for f in flags)}, "
            f"group={self.group}, FSE {fse} ({compat})"
        )


def shared_expert_case(
    model: str,
    tp: int,
    *,
    ep: bool = False,
    sp: bool = False,
    group: int | None = QUARK_OCP_MX_GROUP,
    fse: bool = False,
    compatible: bool = True,
    intermediate: int | None = None,
) -> SharedExpertCase:
    """A catalogued model's case (``intermediate`` overrides its shared size, for vLLM's 672 test)."""
    m = MODELS[model]
    return SharedExpertCase(
        model=model,
        hidden=m.hidden,
        intermediate=m.shared_intermediate if intermediate is None else intermediate,
        tp=tp,
        group=group,
        expert_parallel=ep,
        sequence_parallel=sp,
        fse_enabled=fse,
        fse_quant_compatible=compatible,
    )


SHARED_EXPERT_MODELS = tuple(sorted(name for name, m in MODELS.items() if m.shared_intermediate > 0))
"""Catalogued models with a shared expert (models without one only reach ``ABSENT``, which the
adversarial size 0 covers)."""


class FseState(enum.Enum):
    """AITER fused shared experts as the decision reads it: off, or on with a compatible or an
    incompatible quantization (the compatibility is not read while the switch is off)."""

    OFF = "off"
    COMPATIBLE = "on, compatible"
    INCOMPATIBLE = "on, incompatible"


@functools.cache
def shared_intermediate_sizes(tp: int) -> st.SearchStrategy[int]:
    """Adversarial shared-expert sizes at degree ``tp``: on, one channel off and half-way between
    multiples of ``32·tp`` and the powers of two up to 256 (a whole-group split, one not divisible
    by ``tp``, one that cuts a group; :func:`strategies.boundaries.boundary_sizes`), vLLM's unit-test
    values 0 / 640 / 672, or any size up to 8192. Shrinks to 8."""
    return st.one_of(
        boundary_sizes(unit=1, moduli=moduli_for("shared_expert.intermediate", scale=tp)),
        st.sampled_from((0, 640, 672)),
        st.integers(1, 8192),
    )


@st.composite
def shared_expert_cases(draw: st.DrawFn) -> SharedExpertCase:
    """A :class:`SharedExpertCase`, honouring ``--model`` / ``--tp`` / ``--ep`` pins.

    The TP degree is drawn first so adversarial sizes aim at its ``32·tp`` boundary
    (:func:`shared_intermediate_sizes`); the FSE switch and its compatibility are drawn as one
    :class:`FseState`. Shrinks to a catalogued model at TP=1, group 32, no EP / SP, FSE off.
    """
    pin = current_pin()
    tp = pin.tp if pin.tp is not None else draw(st.sampled_from(TP_DEGREES))
    if pin.model is None and draw(st.integers(0, 2)) > 0:  # two in three adversarial: misaligned sizes live there
        model = "adversarial"
        hidden = 32 * draw(st.integers(1, 256))
        intermediate = draw(shared_intermediate_sizes(tp))
    else:
        m = MODELS[pin.model] if pin.model else MODELS[draw(st.sampled_from(SHARED_EXPERT_MODELS))]
        model, hidden, intermediate = m.name, m.hidden, m.shared_intermediate
    group = None if draw(st.integers(0, 3)) == 3 else QUARK_OCP_MX_GROUP  # one in four without groups: nothing to align
    if group is not None and 0 < intermediate < group:
        # a quantized layer holds whole groups: no checkpoint has a shared expert narrower than one
        # group (its down_proj scale would have zero columns), as no layer has an empty scale
        intermediate = group
    expert_parallel = pin.ep if pin.ep is not None else draw(st.booleans())
    sequence_parallel = draw(st.booleans())
    fse = draw(st.sampled_from(FseState))
    return SharedExpertCase(
        model=model,
        hidden=hidden,
        intermediate=intermediate,
        tp=tp,
        group=group,
        expert_parallel=expert_parallel,
        sequence_parallel=sequence_parallel,
        fse_enabled=fse is not FseState.OFF,
        fse_quant_compatible=fse is not FseState.INCOMPATIBLE,
    )


def dense_layers(case: SharedExpertCase) -> tuple[LinearLayer, LinearLayer]:
    """The dense shared-expert MLP: merged column-parallel ``gate_up_proj [2I, H]``, row-parallel ``down_proj [H, I]``."""
    i, h = case.intermediate, case.hidden
    return (
        LinearLayer(case.model, "shared_expert.gate_up_proj", h, 2 * i, Parallel.COLUMN, replicable=True),
        LinearLayer(case.model, "shared_expert.down_proj", i, h, Parallel.ROW, replicable=True),
    )


def dense_layer_shapes(
    case: SharedExpertCase, placement: SharedExpertPlacement
) -> tuple[tuple[LinearLayer, Mxfp4LinearShape | None], ...]:
    """The dense MXFP4 linear layers ``placement`` builds on one rank, each with its rank-local shape.

    SHARDED: both layers at ``case.tp`` with their own sharding; REPLICATED: both whole. FUSED and
    ABSENT build no dense layer. The shape is None when the rank cannot hold the layer (a sharded
    ``down_proj`` whose ``I/tp`` is not a whole number of 32-element groups).
    """
    if placement is SharedExpertPlacement.SHARDED:
        parallel = None
    elif placement is SharedExpertPlacement.REPLICATED:
        parallel = Parallel.REPLICATED
    else:
        return ()
    out = []
    for layer in dense_layers(case):
        how = parallel or layer.parallel
        loadable = rank_local(layer, case.tp, how) is not None
        out.append((layer, linear_shape(layer, case.tp, how, tokens=1, seed=0) if loadable else None))
    return tuple(out)
