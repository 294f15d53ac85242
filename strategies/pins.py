"""Triage pins: ``--model NAME --tp N [--ep]`` narrows every strategy to one catalogued shape.

The pytest plugin sets the pin once per session; strategies read it when they are built.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from hypothesis import example

T = TypeVar("T")


@dataclass(frozen=True)
class Pin:
    """A model, a tensor-parallel degree and expert parallelism to pin strategies to (None: free)."""

    model: str | None = None
    tp: int | None = None
    ep: bool | None = None


_current = Pin()


def set_pin(pin: Pin) -> None:
    global _current
    _current = pin


def current_pin() -> Pin:
    return _current


def matches_pin(config: object, pin: Pin | None = None) -> bool:
    """Whether a configuration belongs to the pinned model / TP / EP (everything does when unpinned).

    A configuration wrapping a MoE shape is judged by ``config.shape``; one without a ``model``
    (a bare scale shape) belongs to no pinned model.
    """
    pin = pin or current_pin()
    if pin == Pin():
        return True
    inner = getattr(config, "shape", config)
    model = getattr(inner, "model", None)
    if model is None:
        return False
    ep = getattr(inner, "ep", getattr(inner, "expert_parallel", None))
    return (
        pin.model in (None, model)
        and pin.tp in (None, getattr(inner, "tp", None))
        and (pin.ep is None or ep is None or pin.ep == ep)
    )


def pinned_examples(argname: str, configs: Iterable[object]) -> Callable[[T], T]:
    """``@example(argname=c)`` for each configuration that :func:`matches_pin`, run in the listed order.

    Applied at import time, after the plugin has set the run's pin, so ``--model/--tp/--ep``
    triage runs replay only the pinned model's regressions.
    """
    kept = [c for c in configs if matches_pin(c)]

    def deco(test: T) -> T:
        for config in reversed(kept):
            test = example(**{argname: config})(test)
        return test

    return deco
