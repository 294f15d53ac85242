"""Rules every policy result obeys, checked by the guard around each protocol call (:mod:`harness.inputs`).

* **Determinism** (:class:`NonDeterministic`): the guard calls each method twice, the second time under
  other global seeds of Python's ``random``, NumPy and torch (:func:`reseeded`), and the two results must
  be equal (:func:`differences`: tensors byte for byte, with dtype and shape, through dataclasses,
  sequences and dicts; other values with ``==``). Hypothesis reseeds ``random`` for every example, so a
  policy that draws from a global generator is wrong on the same examples in every run; only a second
  call under other seeds shows it.
* **No aliasing** (:class:`OutputAliased`): no returned tensor shares storage with a tensor the call was
  given, nor with one an earlier call of the same guarded policy was given or returned while that tensor
  is alive (a buffer reused across calls changes results the caller still holds).
* **Placement** (:class:`OutputNotContiguous`, :class:`OutputOffDevice`): every returned tensor is
  contiguous and on the device of the call's input tensors (the engines' loaders hand kernels contiguous
  buffers on the layer's device).
* **Declared layouts** (:class:`FalseLayoutDeclared`): a returned :class:`~contracts.moe.MoeWeights` of a
  gated call declares the FC1 row order its data is in: where its FC1 tensors hold the input's gate and up
  rows in some order (:func:`contracts.moe.fc1_layouts_holding`), ``fc1_layout`` names one of those.
  Data in no layout is the padding properties' business, not this rule's. This rule raises an
  ``AssertionError`` (an engine bug a ledger entry may name), the others :class:`GuardViolation`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import random
import sys
from collections.abc import Iterator
from typing import Any

import torch

from contracts.errors import GuardViolation
from contracts.moe import FC1_TENSORS, WORDS, MoeWeights, fc1_layout_holds
from reference.layouts import Fc1Layout


class NonDeterministic(GuardViolation):
    """Two calls with the same arguments under different global RNG seeds gave different results."""


class OutputAliased(GuardViolation):
    """A returned tensor shares storage with an input, or with an earlier call's input or output."""


class OutputNotContiguous(GuardViolation):
    """A returned tensor is not contiguous."""


class OutputOffDevice(GuardViolation):
    """A returned tensor is not on the device of the call's input tensors."""


class FalseLayoutDeclared(AssertionError):
    """A returned :class:`~contracts.moe.MoeWeights` declares an ``fc1_layout`` its FC1 rows are not in.

    Unlike the other rules this one judges the weights, not the call: an engine adapter labels its buffers with
    the order its kernel reads, so an engine that hands the kernel rows in another order (SGLang's ``deep_gemm``
    branch with gpt-oss pairs) fails here, and a ledger entry naming that bug may expect it. So it is a property
    failure (an ``AssertionError``), not a :class:`GuardViolation`."""


def tensors(value: Any, path: str) -> list[tuple[str, torch.Tensor]]:
    """``(path, tensor)`` for every tensor in ``value`` (dataclass fields, sequence items, dict values), in
    field and item order."""
    found: list[tuple[str, torch.Tensor]] = []
    _collect(value, path, found)
    return found


@functools.cache
def _field_names(cls: type) -> tuple[str, ...] | None:
    """The field names of dataclass ``cls`` (``None`` for another class); looked up once per class."""
    return tuple(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else None


_ATOMS = frozenset({int, float, bool, str, bytes, type(None)})
"""Leaf types that hold no tensor (exact types: a subclass may be a dataclass); :func:`_collect` stops at them
before the container and dataclass tests, the commonest leaves being the ints of expert lists."""


def _collect(value: Any, path: str, found: list[tuple[str, torch.Tensor]]) -> None:
    if type(value) in _ATOMS:
        return
    if isinstance(value, torch.Tensor):
        found.append((path, value))
    elif isinstance(value, (tuple, list)):
        for i, item in enumerate(value):
            _collect(item, f"{path}[{i}]", found)
    elif isinstance(value, dict):
        for key, item in value.items():
            _collect(item, f"{path}[{key!r}]", found)
    elif (names := _field_names(type(value))) is not None:
        for name in names:
            _collect(getattr(value, name), f"{path}.{name}", found)


def storage_key(t: torch.Tensor) -> tuple[torch.device, int] | None:
    """Identity of ``t``'s storage (device, base address); ``None`` for a tensor that holds no bytes."""
    if t.numel() == 0 or t.untyped_storage().nbytes() == 0:
        return None
    return t.device, t.untyped_storage().data_ptr()


# --- determinism ---------------------------------------------------------------------------------------------


def raw_words(t: torch.Tensor) -> torch.Tensor:
    """``t``'s bytes in memory order, flat, viewed as the widest of int64, int32, int16 and uint8 that divides
    their count and offset in bytes (as :func:`contracts.moe.byte_words` picks words): the same bits, fewer
    elements, so ``torch.equal`` on them is faster. ``.view(torch.uint8)`` gives the bytes back.

    The word is read off the flat tensor's element size, count and storage offset rather than through a uint8
    view and :func:`~contracts.moe.byte_words`: the guard calls this for every tensor it copies or compares, and
    the fewer tensor calls halve its cost."""
    flat = t.detach().reshape(-1).contiguous()
    size = flat.element_size()
    return flat.view(WORDS.get(math.gcd(8, flat.numel() * size, flat.storage_offset() * size), torch.uint8))


def byte_difference(
    x: torch.Tensor, y: torch.Tensor, shape: tuple[int, ...], element_size: int
) -> tuple[int, list[int]] | None:
    """``None`` when :func:`raw_words` views ``x`` and ``y`` (one device) hold the same bytes; otherwise how many
    bytes differ and the position of the first differing element of a tensor of ``shape``."""
    if x.dtype == y.dtype and torch.equal(x, y):
        return None
    diff = (x.view(torch.uint8) != y.view(torch.uint8)).nonzero().flatten()
    if diff.numel() == 0:
        return None  # the same bytes, viewed as different words
    element = int(diff[0]) // element_size
    return diff.numel(), [int(i) for i in torch.unravel_index(torch.tensor(element), shape)] if shape else []


def _bytes_differ(a: torch.Tensor, b: torch.Tensor) -> str | None:
    if (a.dtype, tuple(a.shape)) != (b.dtype, tuple(b.shape)):
        return f"{list(a.shape)} {a.dtype} vs {list(b.shape)} {b.dtype}"
    found = byte_difference(raw_words(a), raw_words(b).to(a.device), tuple(a.shape), a.element_size())
    if found is None:
        return None
    count, index = found
    return f"{list(a.shape)} {a.dtype}: {count} byte(s) differ, first at element {index}"


def differences(a: Any, b: Any, path: str) -> list[str]:
    """Where results ``a`` and ``b`` differ, one line per differing leaf (tensors by bytes, dtype and shape)."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
        problem = _bytes_differ(a, b)
        return [] if problem is None else [f"{path} {problem}"]
    if type(a) is not type(b):
        return [f"{path}: {type(a).__name__} vs {type(b).__name__}"]
    if (names := _field_names(type(a))) is not None:
        return [d for name in names for d in differences(getattr(a, name), getattr(b, name), f"{path}.{name}")]
    if isinstance(a, (tuple, list)):
        if len(a) != len(b):
            return [f"{path}: {len(a)} vs {len(b)} items"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(map(repr, a))} vs {sorted(map(repr, b))}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}[{k!r}]")]
    return [] if a == b else [f"{path}: {a!r} vs {b!r}"]


@dataclasses.dataclass(frozen=True)
class _RngState:
    python: Any
    numpy: Any
    torch: torch.Tensor
    cuda: list[torch.Tensor] | None

    @classmethod
    def capture(cls) -> _RngState:
        numpy = sys.modules.get("numpy")
        cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None
        return cls(random.getstate(), numpy.random.get_state() if numpy else None, torch.get_rng_state(), cuda)

    def restore(self) -> None:
        random.setstate(self.python)
        if self.numpy is not None:
            sys.modules["numpy"].random.set_state(self.numpy)
        torch.set_rng_state(self.torch)
        if self.cuda is not None:
            torch.cuda.set_rng_state_all(self.cuda)


@contextlib.contextmanager
def reseeded(seed: int) -> Iterator[None]:
    """Seed Python's ``random``, NumPy's and torch's global generators (CPU and, where CUDA is available, every
    GPU's) with ``seed`` for the block, then put every generator back in the state it had before: the caller's
    draws are unchanged.

    Not ``torch.manual_seed``: on a host without CUDA it queues a seeding of the CUDA, XPU and MTIA generators
    for a later initialisation, recording the Python stack each time (about 3 ms per call on the 2-core CPU,
    a tenth of the conformance properties' CPU time). A host without CUDA has no CUDA generator to seed."""
    state = _RngState.capture()
    random.seed(seed)
    if state.numpy is not None:
        sys.modules["numpy"].random.seed(seed % 2**32)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)
    try:
        yield
    finally:
        state.restore()


# --- result rules ----------------------------------------------------------------------------------------------


def aliasing(returned: list[tuple[str, torch.Tensor]], held: dict[tuple[torch.device, int], str]) -> list[str]:
    """Returned tensors (``tensors(result, "result")``) whose storage is one of ``held`` (storage key -> what
    holds it)."""
    return [
        f"{path} shares storage with {held[key]}"
        for path, t in returned
        if (key := storage_key(t)) is not None and key in held
    ]


def placement(returned: list[tuple[str, torch.Tensor]], devices: set[torch.device]) -> tuple[list[str], list[str]]:
    """``(not contiguous, off device)``: returned tensors (``tensors(result, "result")``) that are not
    contiguous, and (when the inputs' tensors are all on one device) those on another device."""
    strided, moved = [], []
    device = next(iter(devices)) if len(devices) == 1 else None
    for path, t in returned:
        if not t.is_contiguous():
            strided.append(f"{path} {list(t.shape)} has strides {tuple(t.stride())}")
        if device is not None and t.device != device:
            moved.append(f"{path} is on {t.device}, its inputs on {device}")
    return strided, moved


def _false_layouts(source: MoeWeights, out: MoeWeights, field: str) -> list[Fc1Layout]:
    """The layouts in which ``out``'s FC1 tensor ``field`` holds ``source``'s rows (in :class:`Fc1Layout` order),
    unless the layout ``out`` declares is one of them: then none (it passes the rule), and the others are not
    looked at (most results pass, and each look compares the data)."""
    declared = out.fc1_layout
    if isinstance(declared, Fc1Layout) and fc1_layout_holds(source, out, field, declared):
        return []
    return [layout for layout in Fc1Layout if layout is not declared and fc1_layout_holds(source, out, field, layout)]


def declared_layouts(args: dict[str, Any], result: Any) -> list[str]:
    """For a gated call given :class:`MoeWeights` and returning them (``result`` or ``result.weights``): FC1
    tensors whose rows hold the input's in some layouts, none of them the declared ``fc1_layout``."""
    out = getattr(result, "weights", result)
    if not isinstance(out, MoeWeights) or args.get("gated", True) is not True:
        return []
    problems = []
    for name, source in args.items():
        if not isinstance(source, MoeWeights):
            continue
        for field in FC1_TENSORS:
            holding = _false_layouts(source, out, field)
            if holding:
                problems.append(
                    f"result{'.weights' if out is not result else ''}.{field} holds {name}'s gate/up rows in "
                    f"{' or '.join(layout.value for layout in holding)} order, but fc1_layout says "
                    f"{out.fc1_layout.value}"
                )
    return problems
