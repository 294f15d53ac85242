"""The generic MoE alignment properties, each written once over a format record (:mod:`conformance.moe_formats`).

For every format and backend: the backend accepts the padded sizes (``check_backend_accepts``); the
reference output of the padded weights is bit-identical to the unpadded layer's
(``check_padding_invariance``); shapes, dtypes, gate/up rows, pad codes and the declared FC1 layout are
as the contract says (``check_gate_up_layout``); no smaller size is accepted and aligning again changes
nothing (``check_minimal_and_idempotent``). A format's test module calls
:func:`moe_alignment_properties` once; that binds each property to the format as the module's own
``check_NAME`` (reproductions name ``conformance.test_<format>_moe:check_NAME``) and generates
``test_NAME``, one parameter per backend record (:mod:`harness.properties`). Properties that exist for
one format only stay in its test module.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import torch

from backends import record
from conformance.layers import PerConfig, reference_output
from conformance.moe_checks import (
    assert_bit_identical,
    assert_embedded,
    assert_idempotent,
    assert_minimal,
    assert_shapes,
    fc1_parts,
)
from conformance.moe_formats import MoeFormat
from contracts.moe import MoeAlignment
from harness.properties import ALL_BACKENDS, check, property_test


def check_backend_accepts(fmt: MoeFormat, config: Any, backend: enum.Enum, policy: MoeAlignment) -> None:
    """The padded sizes pass the backend library's own helpers and its record's rules (``violations``)."""
    aligned, _ = fmt.align(config, backend, policy)
    shape, ip, hp = fmt.shape(config), aligned.intermediate_size, aligned.hidden_size
    problems = record(backend).violations(ip, hp, shape.gated, shape.experts)
    assert not problems, f"{backend.value} rejects Ip={ip}, Hp={hp}: " + "; ".join(problems)


_REAL_OUTPUTS: PerConfig[torch.Tensor] = PerConfig()
"""Reference outputs of drawn layers' real channels by ``(format, configuration JSON)``."""

_PADDED_OUTPUTS: PerConfig[torch.Tensor] = PerConfig()
"""Reference outputs of aligned layers by ``(format, configuration JSON, FC1 layout read)`` and the aligned
weights' digest: a policy that pads a layer the same way for several backends whose kernels read FC1 rows in
the same order gets one computation."""


def check_padding_invariance(fmt: MoeFormat, config: Any, backend: enum.Enum, policy: MoeAlignment) -> None:
    """The reference output of the padded weights, FC1 rows read as the backend's kernel reads them (the
    format's intermediate re-quantization included), equals the output of the rank's real channels bit for bit."""
    aligned, layer = fmt.align(config, backend, policy)
    shape, layout = fmt.shape(config), fmt.fc1_layout(backend)
    assert_bit_identical(
        lambda: _PADDED_OUTPUTS.get(
            (fmt.name, config.to_json(), layout),
            aligned.weights,
            lambda: reference_output(aligned.weights, layout, layer, shape, requantize=fmt.requantize),
        ),
        _REAL_OUTPUTS.get(
            (fmt.name, config.to_json()),
            layer,
            lambda: reference_output(layer.real, layer.real.fc1_layout, layer, shape, requantize=fmt.requantize),
        ),
        f"padding changed the MoE output ({backend.value} reads FC1 rows as {layout.value}; "
        f"I {shape.intermediate} -> {aligned.intermediate_size}, H {shape.hidden} -> {aligned.hidden_size})",
    )


def check_gate_up_layout(fmt: MoeFormat, config: Any, backend: enum.Enum, policy: MoeAlignment) -> None:
    """Shapes and dtypes are the contract's (``uint8 [E, F·Ip, Hp/2]`` etc.); read in the kernel's FC1 order,
    gate and up rows (weights, scales, bias) are the checkpoint's with pad rows appended per half; FC2 keeps
    its block; every added element satisfies the format's pad rule (:func:`~conformance.moe_checks.pad_rule`);
    where the policy chooses the FC1 order (the format fixes none), the declared FC1 layout is the one the kernel
    reads."""
    aligned, layer = fmt.align(config, backend, policy)
    shape, layout = fmt.shape(config), fmt.fc1_layout(backend)
    ip, hp = aligned.intermediate_size, aligned.hidden_size
    assert ip >= shape.intermediate and hp >= shape.hidden, (
        f"policy shrank sizes: I {shape.intermediate} -> {ip}, H {shape.hidden} -> {hp}"
    )
    assert_shapes(aligned, shape.experts, 2 if shape.gated else 1)
    w, src = aligned.weights, layer.checkpoint
    for name, dim in (("w13", -2), ("w13_scale", -2), ("w13_bias", -1)):
        before, after = getattr(src, name), getattr(w, name)
        if before is None:
            continue
        assert after is not None, f"the policy dropped {name}"
        original = fc1_parts(before, src.fc1_layout, shape.gated, dim)
        padded = fc1_parts(after, layout, shape.gated, dim)
        for part in original:
            label = f"{name} {part} rows as {backend.value} reads them ({layout.value})"
            assert_embedded(label, original[part], padded[part], fmt.pad_rule(name))
    for name in ("w2", "w2_scale", "w2_bias"):
        if getattr(src, name) is not None:
            assert getattr(w, name) is not None, f"the policy dropped {name}"
            assert_embedded(name, getattr(src, name), getattr(w, name), fmt.pad_rule(name))
    # a format whose contract fixes the order (NVFP4: [up; gate]) is read in it whatever the label says
    assert fmt.aligned_layout is not None or w.fc1_layout is layout, (
        f"the policy labels FC1 rows {w.fc1_layout.value}; {backend.value} reads {layout.value}"
    )


def check_minimal_and_idempotent(fmt: MoeFormat, config: Any, backend: enum.Enum, policy: MoeAlignment) -> None:
    """No smaller whole-group size is accepted by the backend, and aligning again changes nothing."""
    aligned, _ = fmt.align(config, backend, policy)
    shape, ip, hp, violations = (
        fmt.shape(config),
        aligned.intermediate_size,
        aligned.hidden_size,
        record(backend).violations,
    )
    assert_minimal(lambda i: violations(i, hp, shape.gated, shape.experts), "I", shape.intermediate, ip, fmt.step)
    assert_minimal(lambda h: violations(ip, h, shape.gated, shape.experts), "H", shape.hidden, hp, fmt.step)
    assert_idempotent(policy, backend, aligned, shape.gated)


PROPERTIES = (check_backend_accepts, check_padding_invariance, check_gate_up_layout, check_minimal_and_idempotent)
"""The generic MoE alignment properties, in the order their tests are generated."""


def bind(prop: Callable[..., None], fmt: MoeFormat, module: str) -> Callable[..., None]:
    """``prop`` for ``fmt``: a bare check ``(config, backend, policy)`` of ``fmt``'s contract, named as ``prop``
    and belonging to ``module`` (so ``python -m harness.repro module:check_NAME`` finds it)."""

    def bound(config: Any, backend: enum.Enum, policy: MoeAlignment) -> None:
        __tracebackhide__ = True
        prop(fmt, config, backend, policy)

    bound.__name__ = bound.__qualname__ = prop.__name__
    bound.__module__, bound.__doc__ = module, prop.__doc__
    return check(fmt.contract, fmt.config)(bound)


def moe_alignment_properties(fmt: MoeFormat, namespace: dict[str, Any]) -> None:
    """Add every generic property of ``fmt`` to the test module whose globals are ``namespace``: its bare
    ``check_NAME`` and the generated ``test_NAME`` over ``fmt``'s strategy and pins, for every backend."""
    for prop in PROPERTIES:
        fn = bind(prop, fmt, namespace["__name__"])
        namespace[fn.__name__] = fn
        property_test(fn, strategy=fmt.strategy, pins=fmt.pins, backends=ALL_BACKENDS, namespace=namespace)
