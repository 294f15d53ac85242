"""Every protocol call leaves its inputs unchanged and obeys the result rules: one guard around the policy.

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
   method returned or raised, and :class:`EarlierCallModified` if the call wrote to a tensor an
   earlier call of the same guarded policy was given or returned (while anything still holds it:
   the guard keeps weak references and byte copies, so a policy that keeps the previous call's
   input and writes into it on its next call fails, and nothing is kept alive for the check);
4. checks the result rules of :mod:`harness.hygiene` (no aliasing of inputs or of earlier calls'
   tensors, contiguous tensors on the inputs' device, a true ``fc1_layout``);
5. calls the method again with the same arguments under other global seeds of ``random``, NumPy and
   torch (derived from the inputs' bytes and the current ``random`` state, so a reproduction of the
   example draws the same ones) and raises :class:`~harness.hygiene.NonDeterministic` unless both
   calls return equal results or raise the same exception type; every generator is put back, so the
   property's own draws do not change. The second result gets the rules of step 4 too; the declared-layout
   rule reads only a result's data and ``fc1_layout``, so a second result equal to the first has its verdict
   and is not read again. The first call's result (or exception) is what the caller gets.

Bytes are compared, not values, so a NaN left in place counts as unchanged and ``-0.0``
written over ``0.0`` counts as a change. Changes the caller makes between calls (a property
editing its own tensors) are not the policy's: the byte copies of earlier calls' tensors are
refreshed before each call, and a tensor an earlier call was given or returned that is passed again
keeps its refreshed copy as its snapshot instead of being copied a second time.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import random
import types
import weakref
import zlib
from collections.abc import Callable
from typing import Any

import torch

from contracts.errors import GuardViolation
from harness import hygiene
from harness.hygiene import tensors


class InputModified(GuardViolation):
    """A policy method wrote to (or resized) a tensor it was given."""


class EarlierCallModified(GuardViolation):
    """A policy method wrote to a tensor an earlier call of the same guarded policy was given or returned."""


@dataclasses.dataclass(frozen=True)
class _Snapshot:
    tensor: torch.Tensor
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    data: torch.Tensor  # the bytes, flattened (:func:`harness.hygiene.raw_words`)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return hygiene.raw_words(t).clone()


def _take(t: torch.Tensor) -> _Snapshot:
    return _Snapshot(t, tuple(t.shape), tuple(t.stride()), t.dtype, _bytes(t))


def snapshot(args: dict[str, Any], history: _History | None = None) -> dict[str, _Snapshot]:
    """Snapshots of every tensor reachable from the named arguments ``args``; a tensor ``history`` holds, just
    refreshed (:meth:`_History.refresh`), is not copied again: its held copy is its bytes."""
    return {path: _held_or_take(t, history) for name, value in args.items() for path, t in tensors(value, name)}


def _held_or_take(t: torch.Tensor, history: _History | None) -> _Snapshot:
    held = None if history is None else history.copy_of(t)
    return _take(t) if held is None else held


def _change(path: str, s: _Snapshot, t: torch.Tensor) -> str | None:
    """How ``t`` differs from its snapshot ``s`` (``None``: unchanged)."""
    if (tuple(t.shape), t.dtype, tuple(t.stride())) != (s.shape, s.dtype, s.stride):
        return (
            f"{path} was {list(s.shape)} {s.dtype} strides {s.stride}, now {list(t.shape)} {t.dtype} "
            f"strides {tuple(t.stride())}"
        )
    found = hygiene.byte_difference(hygiene.raw_words(t), s.data, s.shape, t.element_size())
    if found is None:
        return None
    count, index = found
    return f"{path} {list(s.shape)} {s.dtype}: {count} byte(s) changed, first at element {index}"


def changes(before: dict[str, _Snapshot]) -> list[str]:
    """What changed in the snapshotted tensors since :func:`snapshot`, one line per tensor."""
    return [c for path, s in before.items() if (c := _change(path, s, s.tensor)) is not None]


def raise_if_changed(label: str, before: dict[str, _Snapshot]) -> None:
    """Raise :class:`InputModified` naming ``label`` if any snapshotted tensor changed."""
    problems = changes(before)
    if problems:
        raise InputModified(
            f"input modified: {label} wrote to the tensors it was given (a policy must leave its inputs "
            "unchanged): " + "; ".join(problems)
        )


_NONE = torch.empty(0)  # a held snapshot keeps no strong reference to its tensor


class _History:
    """Weak references to, and byte copies of, the tensors earlier calls of one guarded policy were given or
    returned; an entry goes when its tensor does."""

    def __init__(self) -> None:
        self._held: dict[int, tuple[weakref.ref[torch.Tensor], str, _Snapshot]] = {}

    def add(self, what: str, taken: dict[str, _Snapshot]) -> None:
        """Hold the snapshotted tensors ``taken`` (path -> a snapshot of the tensor as it is now) not held yet."""
        self._alive()  # drops dead entries, whose ids a new tensor may reuse
        for path, s in taken.items():
            if id(s.tensor) not in self._held:
                self._held[id(s.tensor)] = (
                    weakref.ref(s.tensor),
                    f"{what} {path}",
                    dataclasses.replace(s, tensor=_NONE),
                )

    def copy_of(self, t: torch.Tensor) -> _Snapshot | None:
        """The held snapshot of ``t`` (``None``: not held), as :func:`_take` would take it now if no write reached
        ``t`` since :meth:`refresh`: refresh found its shape, dtype, strides and bytes equal to the copy's, or took
        a new copy."""
        entry = self._held.get(id(t))
        if entry is None or entry[0]() is not t:
            return None
        return dataclasses.replace(entry[2], tensor=t)

    def _alive(self) -> list[tuple[int, torch.Tensor, str, _Snapshot]]:
        alive = []
        for key, (ref, what, s) in list(self._held.items()):
            if (t := ref()) is None:
                del self._held[key]
            else:
                alive.append((key, t, what, s))
        return alive

    def refresh(self) -> None:
        """Take new copies of the tensors the caller changed since the last call (its own business)."""
        for key, t, what, s in self._alive():
            if _change(what, s, t) is not None:
                self._held[key] = (self._held[key][0], what, dataclasses.replace(_take(t), tensor=_NONE))

    def raise_if_changed(self, label: str, unchanged: dict[str, _Snapshot]) -> None:
        """Raise :class:`EarlierCallModified` if a held tensor changed since :meth:`refresh`; the tensors of
        ``unchanged`` (snapshots taken after :meth:`refresh`, found unchanged since) are not compared again."""
        skip = {id(s.tensor) for s in unchanged.values()}
        problems = [
            c for key, t, what, s in self._alive() if key not in skip and (c := _change(what, s, t)) is not None
        ]
        if problems:
            raise EarlierCallModified(
                f"earlier call modified: {label} wrote to tensors an earlier call was given or returned (a policy "
                "must not keep and reuse them): " + "; ".join(problems)
            )

    def storages(self) -> dict[tuple[torch.device, int], str]:
        """Storage key -> what holds it, for every held tensor still alive."""
        return {key: what for _, t, what, _ in self._alive() if (key := hygiene.storage_key(t)) is not None}


_SIGNATURES: weakref.WeakKeyDictionary[types.FunctionType, inspect.Signature] = weakref.WeakKeyDictionary()
"""Signatures of bound methods by their function: a bound method's signature is its function's without the
first parameter, so it is worked out once per method, not once per call."""


def _signature(method: Callable[..., Any]) -> inspect.Signature:
    """``inspect.signature(method)``, looked up once per function for a method bound to a plain function."""
    func = getattr(method, "__func__", None)
    if not (isinstance(method, types.MethodType) and isinstance(func, types.FunctionType)):
        return inspect.signature(method)
    found = _SIGNATURES.get(func)
    if found is None:
        found = _SIGNATURES[func] = inspect.signature(method)
    return found


def _named(method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The call's arguments by parameter name (``weights``, not ``arg1``) where the signature says."""
    try:
        return dict(_signature(method).bind_partial(*args, **kwargs).arguments)
    except (TypeError, ValueError):
        return {**{f"arg{i}": a for i, a in enumerate(args)}, **kwargs}


def _second_seed(label: str, before: dict[str, _Snapshot]) -> int:
    """The seed of the second call: a function of the method, the inputs' bytes (the first 64 KiB of each) and
    the ``random`` state, so it changes from example to example and a reproduction draws the same one."""
    crc = zlib.crc32(label.encode())
    for path, s in before.items():
        crc = zlib.crc32(s.data.view(torch.uint8)[: 1 << 16].cpu().numpy(), zlib.crc32(path.encode(), crc))
    return zlib.crc32(repr(random.getstate()).encode(), crc)  # not hash(): hash(None) varies by process before 3.12


def _outcome(
    target: Callable[..., Any], args: tuple, kwargs: dict, label: str, before: dict, history: _History
) -> tuple[Any, Exception | None]:
    """``(result, None)`` or ``(None, exception)`` of one call, after the input and earlier-call checks
    (which take precedence over the method's own exception)."""
    try:
        return target(*args, **kwargs), None
    except Exception as exc:  # noqa: BLE001 - the caller re-raises it after the determinism check
        return None, exc
    finally:
        raise_if_changed(label, before)
        history.raise_if_changed(label, before)


def _check_result(
    label: str, named: dict[str, Any], before: dict[str, _Snapshot], result: Any, history: _History
) -> list[tuple[str, torch.Tensor]]:
    """The call rules of :mod:`harness.hygiene` for a result of a call given ``named`` (its tensors snapshotted
    in ``before``): aliasing and placement, each raising its own :class:`GuardViolation`; the returned tensors
    (``tensors(result, "result")``, walked once for every rule and the caller) when all pass. The data rule is
    :func:`_check_layouts`."""
    returned = tensors(result, "result")
    inputs = {k: f"the input {path}" for path, s in before.items() if (k := hygiene.storage_key(s.tensor)) is not None}
    strided, moved = hygiene.placement(returned, {s.tensor.device for s in before.values()})
    checks = (
        (hygiene.OutputAliased, "output aliased", "returned a tensor it does not own",
         hygiene.aliasing(returned, {**history.storages(), **inputs})),
        (hygiene.OutputNotContiguous, "output not contiguous", "returned a strided view", strided),
        (hygiene.OutputOffDevice, "output off device", "returned a tensor on another device", moved),
    )  # fmt: skip
    for error, title, what, problems in checks:
        if problems:
            raise error(f"{title}: {label} {what}: " + "; ".join(problems))
    return returned


def _check_layouts(label: str, named: dict[str, Any], result: Any) -> None:
    """The declared-layout rule (:func:`harness.hygiene.declared_layouts`) for a result of a call given ``named``:
    it reads the result's data and ``fc1_layout`` only."""
    problems = hygiene.declared_layouts(named, result)
    if problems:
        raise hygiene.FalseLayoutDeclared(
            f"false layout declared: {label} labels FC1 rows with a layout they are not in: " + "; ".join(problems)
        )


def _guarded_call(proxy: _Guarded, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    policy = object.__getattribute__(proxy, "_policy")
    history: _History = object.__getattribute__(proxy, "_history")
    target = getattr(policy, name)
    label = f"{type(policy).__name__}.{name}"
    named = _named(target, args, kwargs)
    history.refresh()
    before = snapshot(named, history)
    seed = _second_seed(label, before)
    first, error = _outcome(target, args, kwargs, label, before, history)
    history.add(f"{label}'s earlier input", before)  # unchanged by the call (checked), so still their copies
    if error is None:
        returned = _check_result(label, named, before, first, history)
        _check_layouts(label, named, first)
        history.add(f"{label}'s earlier result", {path: _take(t) for path, t in returned})
    with hygiene.reseeded(seed):
        second, error2 = _outcome(target, args, kwargs, label, before, history)
    if error2 is None:
        _check_result(label, named, before, second, history)
    if error is None and error2 is None:
        problems = hygiene.differences(first, second, "result")
    elif error is None or error2 is None or type(error) is not type(error2):
        outcomes = [repr(e) if e is not None else "returned" for e in (error, error2)]
        problems = [f"first call {outcomes[0]}, second call {outcomes[1]}"]
    else:
        problems = []
    if error2 is None and (error is not None or problems):
        _check_layouts(label, named, second)  # a result equal to the first (data and fc1_layout) has its verdict
    if problems:
        raise hygiene.NonDeterministic(
            f"non-deterministic: {label} gave another result for the same arguments under other random/NumPy/"
            f"torch seeds (second call seed {seed}): " + "; ".join(problems)
        )
    if error is not None:
        raise error
    return first


def _forward(name: str) -> Callable[..., Any]:
    def method(self: _Guarded, *args: Any, **kwargs: Any) -> Any:
        return _guarded_call(self, name, args, kwargs)

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
    """``policy`` behind the guard (None and already guarded policies are returned as they are)."""
    if policy is None or isinstance(policy, _Guarded):
        return policy
    proxy = object.__new__(_proxy_class(type(policy)))
    object.__setattr__(proxy, "_policy", policy)
    object.__setattr__(proxy, "_history", _History())
    return proxy
