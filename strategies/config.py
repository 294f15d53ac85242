"""Drawn configurations: frozen dataclasses that round-trip through plain JSON.

A property's input is a configuration of sizes, flags and a tensor seed (never tensors), so a
failure is reproduced from its JSON literal alone (``harness.repro``).
"""

from __future__ import annotations

import dataclasses
import enum
import json
import typing
from typing import Any, TypeVar

T = TypeVar("T", bound="Config")


def _encode(value: Any) -> Any:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, tuple):
        return [_encode(v) for v in value]
    return value


def _decode(tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        if value is None:
            return None
        tp = next(a for a in typing.get_args(tp) if a is not type(None))
        return _decode(tp, value)
    if origin is tuple:
        (item, *_) = typing.get_args(tp)
        return tuple(_decode(item, v) for v in value)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return tp(value)
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{k: _decode(hints[k], v) for k, v in value.items()})
    return value


@dataclasses.dataclass(frozen=True)
class Config:
    """Base class of drawn configurations."""

    def to_dict(self) -> dict[str, Any]:
        return _encode(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls: type[T], data: dict[str, Any]) -> T:
        return _decode(cls, data)

    def for_backend(self: T, backend: enum.Enum) -> T:
        """The configuration as run against ``backend``, the test's parameter: itself, unless the
        configuration records the backend it runs against (the property runner calls this before the
        example runs, so the reproduction and the known-failure ledgers see the backend too)."""
        return self
