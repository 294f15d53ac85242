"""Triage pins: ``--model NAME --tp N [--ep]`` narrows every strategy to one catalogued shape.

The pytest plugin sets the pin once per session; strategies read it when they are built.
"""

from __future__ import annotations

from dataclasses import dataclass


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
