"""The ledger rule (:mod:`subjects.ledger`): a known-failure entry describes one bug, never a catch-all.

* Each catch-all form is refused where the entry is written: bare ``Exception`` / ``BaseException``, a
  guard error type, a pattern matching the empty string or messages of several generic families, and
  a generic message (torch's broadcasting, Python's built-ins, the suite's own assertion headlines, or
  a suite message quoting one of those) without the upstream function it must be raised from.
* An entry with a generic message and ``raised_in`` recognises the error only when that function is on
  its traceback (or its cause's): the same message from an adapter's own code is not the bug.
* The runner never absorbs a :class:`contracts.errors.GuardViolation`, whatever an entry's ``raises``.

The end-to-end probes (a pytest run on a subject whose adapter raises the entry's message from its own
function) are in ``tests/test_verdicts.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pytest
import torch

from contracts.errors import GuardViolation
from harness.inputs import InputModified
from harness.runner import RunState, run_check
from subjects.ledger import PLACEHOLDER, SUITE, LedgerError, frames, generic_messages
from subjects.registry import Hardware, KnownFailure, Reach

SIZE = r"The size of tensor a \(\d+\) must match the size of tensor b \(\d+\)"
LOADER = "engine.layers.moe:FusedMoE.load_w13"
UPSTREAM = """
class FusedMoE:
    def load_w13(self, param, loaded):
        param.copy_(loaded)
"""


def entry(match: str, raises: Any = RuntimeError, raised_in: tuple[str, ...] = ()) -> KnownFailure:
    return KnownFailure(
        "c", "r", "https://x", lambda _: True, raises=raises, match=match, raised_in=raised_in,
        reach=Reach.latent("a test entry"), hardware=(Hardware.SM100,),
    )  # fmt: skip


def upstream_loader() -> Any:
    """``FusedMoE.load_w13`` of a stand-in engine module ``engine.layers.moe`` (not one of the suite's packages)."""
    namespace: dict[str, Any] = {"__name__": "engine.layers.moe"}
    exec(compile(UPSTREAM, "engine/layers/moe.py", "exec"), namespace)
    return namespace["FusedMoE"]().load_w13


def adapter_copy(param: torch.Tensor, loaded: torch.Tensor) -> None:
    """An adapter's own bug: the same copy, the same torch message, another function."""
    param.copy_(loaded)


def raised(fn: Any) -> BaseException:
    with pytest.raises(RuntimeError) as info:
        fn(torch.empty(2, 3), torch.empty(4))
    return info.value


# --- the rule refuses each catch-all form ------------------------------------------------------------


@pytest.mark.parametrize(
    "raises", [Exception, BaseException, (ValueError, Exception), GuardViolation, InputModified, (InputModified,)]
)
def test_catch_all_types_are_refused(raises: Any) -> None:
    with pytest.raises(LedgerError, match="raises="):
        entry("Intermediate size padding for w1 and w3", raises=raises)


@pytest.mark.parametrize("match", ["", ".*", "x*", "(|a)", "(?s).*"])
def test_universal_patterns_are_refused_even_with_raised_in(match: str) -> None:
    with pytest.raises(LedgerError, match="matches the empty string"):
        entry(match, raised_in=(LOADER,))


@pytest.mark.parametrize("match", [".", "e", r"\d", r"\w+", " ", "(?i)SIZE", r"not|size"])
def test_near_universal_patterns_are_refused_even_with_raised_in(match: str) -> None:
    with pytest.raises(LedgerError, match="near-universal"):
        entry(match, raised_in=(LOADER,))


GENERIC = [
    # torch's shape and broadcasting errors
    SIZE,
    r"shape '\[[\d, -]+\]' is invalid for input of size \d+",
    r"mat1 and mat2 shapes cannot be multiplied",
    r"stack expects each tensor to be equal size",
    r"doesn't match the broadcast shape",
    r"Sizes of tensors must match except in dimension",
    r"index \d+ is out of bounds",
    # Python's built-in errors
    r"list index out of range",
    r"object has no attribute",
    r"not enough values to unpack",
    # the suite's own assertion headlines (read from conformance/)
    r"not idempotent",
    r"padding changed the MoE output",
    r"do not sum to the layer's",
    r"over-padding: \S+ \S+ was padded to",
    # a suite message quoting a generic one: no more specific than the quoted part
    r"policy refused a shape real models produce .*" + SIZE,
    r"weight processing raised .*RuntimeError: shape '\[",
]


@pytest.mark.parametrize("match", GENERIC)
def test_generic_messages_need_the_upstream_function(match: str) -> None:
    with pytest.raises(LedgerError, match="raised_in"):
        entry(match)
    entry(match, raised_in=(LOADER,))  # the same message, tied to where the bug raises it


@pytest.mark.parametrize(
    "raised_in",
    [
        ("load_w13",),
        (":FusedMoE.load_w13",),
        ("conformance.moe_checks:assert_idempotent",),  # the property itself: says nothing about the bug
        ("subjects.sglang.mxfp4_moe:SglangMxfp4MoeAlignment.align_moe",),  # an adapter: the probe's bug lives there
        (LOADER, "harness.runner:run_check"),
    ],
)
def test_raised_in_names_upstream_functions(raised_in: tuple[str, ...]) -> None:
    with pytest.raises(LedgerError, match="raised_in"):
        entry(SIZE, raised_in=raised_in)


@pytest.mark.parametrize(
    "match",
    [
        r"Intermediate size padding for w1 and w3",
        r"not idempotent: w13 changed",  # pins the tensor the headline formats in
        r"padding changed the MoE output \(triton-kernels-sm90 reads FC1 rows",
        r"over-padding: I \d+ was padded to \d+, but \d+ is accepted",
        r"policy refused a shape real models produce .*vLLM FLASHINFER_CUTLASS: .*Intermediate size padding",
    ],
)
def test_specific_messages_are_accepted(match: str) -> None:
    assert entry(match, raises=AssertionError).match == match


def test_suite_messages_are_read_from_the_properties() -> None:
    """The headlines come from conformance/ (formatted values as the placeholder), not from a typed list."""
    suite = generic_messages()[SUITE]
    assert f"not idempotent: sizes {PLACEHOLDER} -> {PLACEHOLDER}" in suite
    assert f"not idempotent: {PLACEHOLDER} changed" in suite
    assert any(m.startswith("padding changed the MoE output (") for m in suite)
    assert any(
        re.match(r"The size of tensor a \(3\)", m) for m in generic_messages()["torch's shape and broadcasting errors"]
    )


def test_kept_answers_are_the_searched_ones() -> None:
    """Every shipped ledger pattern's kept :func:`generic_hits` answer (read from ``__pycache__`` where an earlier
    process wrote it) is what searching the families gives now."""
    from subjects import ledger, registry

    matches = {k.match for s in registry.named_subjects().values() for k in s.known_failures}
    assert len(matches) > 20
    for match in sorted(matches):
        assert ledger.generic_hits(match) == ledger._search_families(match), match


# --- raised_in: the traceback decides --------------------------------------------------------------


def test_generic_message_is_recognised_only_from_the_named_function() -> None:
    bug = entry(SIZE, raised_in=(LOADER,))
    upstream, adapter = raised(upstream_loader()), raised(adapter_copy)
    assert str(upstream).split(" at ")[0] == str(adapter).split(" at ")[0]  # the same message
    assert LOADER in frames(upstream)
    assert bug.recognises(upstream)
    assert not bug.recognises(adapter)
    without = KnownFailure.__new__(KnownFailure)  # the entry as written before the rule: message only
    object.__setattr__(without, "raises", RuntimeError)
    object.__setattr__(without, "match", SIZE)
    object.__setattr__(without, "raised_in", ())
    assert without.recognises(adapter)  # what the rule exists to prevent


def test_raised_in_follows_the_explicit_cause() -> None:
    """A property quoting the upstream error (``raise AssertionError(...) from exc``) keeps its origin."""
    bug = entry(r"policy refused a shape real models produce .*" + SIZE, raises=AssertionError, raised_in=(LOADER,))
    for fn, expected in ((upstream_loader(), True), (adapter_copy, False)):
        try:
            try:
                fn(torch.empty(2, 3), torch.empty(4))
            except RuntimeError as exc:
                raise AssertionError(f"policy refused a shape real models produce (I 3): {exc}") from exc
        except AssertionError as wrapped:
            assert bug.recognises(wrapped) is expected


# --- guard errors are never absorbed ----------------------------------------------------------------


class GuardedRuntimeError(GuardViolation, RuntimeError):
    """A guard error that is also a ``RuntimeError``: an entry's ``raises=RuntimeError`` would match it."""


@dataclass(frozen=True)
class _Config:
    def to_dict(self) -> dict[str, Any]:
        return {}


def _check(exc: BaseException) -> Any:
    def check_probe(config: Any, backend: Any, policy: Any) -> None:
        raise exc

    check_probe.__fp4_check__ = ("c", _Config)  # type: ignore[attr-defined]
    return check_probe


def test_guard_violation_is_never_absorbed() -> None:
    message = "align_moe wrote to its input w13"
    state = RunState(known_failures=(entry(re.escape(message)),))
    run_check(_check(RuntimeError(message)), _Config(), None, None, state=state, nodeid="n")  # the entry's bug
    assert state.expected_failures == {"latent": {"https://x": 1}}
    with pytest.raises(GuardedRuntimeError):
        run_check(_check(GuardedRuntimeError(message)), _Config(), None, None, state=state, nodeid="n")
    assert state.expected_failures == {"latent": {"https://x": 1}}
