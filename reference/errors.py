"""Errors raised by the reference when an input breaks a documented shape or format contract.

Every check in ``reference`` raises :class:`ShapeContractError` (a ``ValueError``) with a
message that names the tensor, the rule and the offending numbers, so that a property failure
reads as a contract violation instead of a traceback from inside ``torch.view``.
"""

from __future__ import annotations


class ShapeContractError(ValueError):
    """A tensor shape or size violates a layout, format or sharding contract."""


class NanEncodingError(ShapeContractError):
    """A NaN reached an FP4/FP8 encoding that has no NaN code (the reference never invents one)."""


def require(condition: bool, message: str) -> None:
    """Raise :class:`ShapeContractError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise ShapeContractError(message)
