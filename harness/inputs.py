"""Every protocol call leaves its inputs unchanged: one guard around the policy under test.

A policy gets the suite's tensors (one rank's expert weights, a layer's weight and scale) and
must treat them as read-only: an engine that writes into the checkpoint tensors it was handed
corrupts the next caller's weights, and a property comparing against those tensors afterwards
would blame the wrong step ("padding changed the MoE output"). So the properties never call a
policy directly: the ``policy`` fixture, :func:`harness.repro.reproduce` and the bench hand
them :func:`guard_inputs` of the subject's policy, a proxy whose every public method

1. snapshots each tensor reachable from its arguments (through dataclasses, tuples, lists and
   dict values): shape, dtype, strides and a byte copy;
2. calls the policy's method;
3. raises :class:`InputModified` naming the method, the argument path (``weights.w13``) and the
   first changed element if any tensor's shape, dtype, strides or bytes changed, whether the
   method returned or raised.

Bytes are compared, not values, so a NaN left in place counts as unchanged and ``-0.0``
written over ``0.0`` counts as a change. Returned tensors may alias the inputs (the Triton
layout keeps the weight as it is); only writes are failures.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any

import torch

from contracts.errors import GuardViolation


class InputModified(GuardViolation):
    """A policy method wrote to (or resized) a tensor it was given."""


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    tensor: torch.Tensor
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    data: torch.Tensor  # the bytes, flattened


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().reshape(-1).contiguous().view(torch.uint8).clone()


def _tensors(value: Any, path: str) -> Iterator[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in ``value`` (dataclass fields, sequence items, dict values)."""
    if isinstance(value, torch.Tensor):
        yield path, value
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            yield from _tensors(getattr(value, f.name), f"{path}.{f.name}")
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            yield from _tensors(item, f"{path}[{i}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _tensors(item, f"{path}[{key!r}]")


def snapshot(args: dict[str, Any]) -> dict[str, _Snapshot]:
    """Snapshots of every tensor reachable from the named arguments ``args``."""
    return {
        path: _Snapshot(t, tuple(t.shape), tuple(t.stride()), t.dtype, _bytes(t))
        for name, value in args.items()
        for path, t in _tensors(value, name)
    }


def changes(before: dict[str, _Snapshot]) -> list[str]:
    """What changed in the snapshotted tensors since :func:`snapshot`, one line per tensor."""
    problems = []
    for path, s in before.items():
        t = s.tensor
        if (tuple(t.shape), t.dtype, tuple(t.stride())) != (s.shape, s.dtype, s.stride):
            problems.append(
                f"{path} was {list(s.shape)} {s.dtype} strides {s.stride}, now {list(t.shape)} {t.dtype} "
                f"strides {tuple(t.stride())}"
            )
            continue
        now = _bytes(t)
        if not torch.equal(now, s.data):
            diff = (now != s.data).nonzero().flatten()
            element = int(diff[0]) // t.element_size()
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(element), s.shape)) if s.shape else ()
            problems.append(
                f"{path} {list(s.shape)} {s.dtype}: {diff.numel()} byte(s) changed, first at element {list(index)}"
            )
    return problems


def raise_if_changed(label: str, before: dict[str, _Snapshot]) -> None:
    """Raise :class:`InputModified` naming ``label`` if any snapshotted tensor changed."""
    problems = changes(before)
    if problems:
        raise InputModified(
            f"input modified: {label} wrote to the tensors it was given (a policy must leave its inputs "
            "unchanged): " + "; ".join(problems)
        )


def _named(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name (``weights``, not ``arg1``) where the signature says."""
    try:
        return dict(inspect.signature(method).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}


def _forward(name: str) -> Callable[..., Any]:
    def method(self: _Guarded, *args: Any, **kwargs: Any) -> Any:
        policy = object.__getattribute__(self, "_policy")
        target = getattr(policy, name)
        label = f"{type(policy).__name__}.{name}"
        before = snapshot(_named(target, args, kwargs))
        try:
            return target(*args, **kwargs)
        finally:
            raise_if_changed(label, before)

    method.__name__ = name
    return method


class _Guarded:
    """Base of the proxy classes; attribute reads other than public methods go to the policy."""

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_policy"), name)

    def __repr__(self) -> str:
        return f"guard_inputs({object.__getattribute__(self, '_policy')!r})"


@functools.cache
def _proxy_class(cls: type) -> type:
    """A :class:`_Guarded` subclass with one checked forwarder per public method of ``cls``.

    The forwarders are class attributes, so runtime protocol checks (``isinstance(p, Protocol)``)
    see them whichever way Python looks them up.
    """
    methods = {n: _forward(n) for n in dir(cls) if not n.startswith("_") and callable(getattr(cls, n, None))}
    return type(f"Guarded{cls.__name__}", (_Guarded,), methods)


def guard_inputs(policy: Any) -> Any:
    """``policy`` behind the input check (None and already guarded policies are returned as they are)."""
    if policy is None or isinstance(policy, _Guarded):
        return policy
    proxy = object.__new__(_proxy_class(type(policy)))
    object.__setattr__(proxy, "_policy", policy)
    return proxy
