"""What the engine subjects (:mod:`subjects.vllm`, :mod:`subjects.sglang`) share: the backend mapping, stand-ins
for GPU-only code and for modules a CPU machine lacks, and small readers of an engine's source.

An engine subject maps each backend record of each contract it implements to the engine's own backend, or says
why the engine cannot run it (:class:`BackendMap`); a record it does neither for is an error
(:class:`UnmappedBackend`), never a silent skip. Where an engine's code needs a GPU, the adapters replace the
smallest piece: ``Tensor.cuda`` by the identity (:func:`cuda_as_identity`), a function the code imports when it
runs by a stand-in (:func:`stand_in_function`), AITER's ``shuffle_weight`` by the reference's
(:func:`reference_shuffle_weight`).
"""

from __future__ import annotations

import ast
import contextlib
import enum
import functools
import importlib
import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from unittest import mock

import torch

from backends import records
from contracts.mxfp4_linear import CONTRACT as MXFP4_LINEAR
from reference.formats import MxScaleRounding
from reference.layouts import aiter_shuffle_weight

# --- the backend mapping ------------------------------------------------------------------------------


class UnmappedBackend(LookupError):
    """A backend record an engine subject neither maps nor explicitly does not map: the engine's mapping
    (its ``bridge`` module) is where a new backend is added, with the engine's backend or the reason it has none."""


@dataclass(frozen=True)
class BackendMap:
    """One contract's backend records as one engine runs them.

    ``mapped``: record member -> the engine's backend (a member name, a runner and its stand-ins, ...);
    ``not_mapped``: record member -> why the engine cannot run it, citing the engine's source (the reason the
    properties skip with). A member in both is a contradiction (``ValueError``); a member in neither is
    :class:`UnmappedBackend` where it is asked for (``tests/test_engine_mappings.py`` checks every record).
    """

    mapped: Mapping[enum.Enum, Any]
    not_mapped: Mapping[enum.Enum, str]

    def __post_init__(self) -> None:
        both = sorted(m.value for m in set(self.mapped) & set(self.not_mapped))
        if both:
            raise ValueError(f"backends both mapped and not mapped: {both}")
        empty = sorted(m.value for m, reason in self.not_mapped.items() if not reason.strip())
        if empty:
            raise ValueError(f"backends not mapped without a reason: {empty}")

    def unaccounted(self, members: tuple[enum.Enum, ...]) -> list[enum.Enum]:
        """The ``members`` neither mapped nor explicitly not mapped."""
        return [m for m in members if m not in self.mapped and m not in self.not_mapped]


def not_mapped_reason(maps: Mapping[str, BackendMap], backend: enum.Enum, engine: str) -> str:
    """Why ``engine`` does not run ``backend`` (its ``not_mapped`` entry in one of ``maps``, contract -> map).
    Raises :class:`UnmappedBackend` for a backend no map mentions, and ``ValueError`` for a mapped one."""
    for bmap in maps.values():
        if backend in bmap.not_mapped:
            return bmap.not_mapped[backend]
        if backend in bmap.mapped:
            raise ValueError(f"{engine} maps {backend.value}; it has no not-mapped reason")
    raise UnmappedBackend(
        f"{engine} neither maps backend {backend.value} nor says why not: add it to the engine's mapping "
        "(its *_BACKENDS or *_NOT_MAPPED table)"
    )


def mapped_member(mapped: Mapping[enum.Enum, Any], engine_backend: Any) -> enum.Enum:
    """The record member ``mapped`` maps to ``engine_backend`` (the inverse of the mapping, which is one-to-one
    there); :class:`UnmappedBackend` where none does."""
    members = [m for m, b in mapped.items() if b == engine_backend]
    if len(members) != 1:
        raise UnmappedBackend(f"{len(members)} backend records map to the engine's {engine_backend!r}, not 1")
    return members[0]


# --- stand-ins for GPU-only code ----------------------------------------------------------------------


def pass_through(x: Any, *_: object, **__: object) -> Any:
    """Stand-in for a GPU-only layout transform: returns its input unchanged."""
    return x


@contextlib.contextmanager
def cuda_as_identity() -> Iterator[None]:
    """``Tensor.cuda`` as the identity while the block runs: engine code that ends with ``.cuda()`` (vLLM's
    ``swizzle_blockscale``, SGLang's post-load processing) keeps its tensors on the CPU."""
    with mock.patch.object(torch.Tensor, "cuda", pass_through):
        yield


@functools.cache
def importable(module: str) -> bool:
    """Whether ``module`` imports here (FlashInfer's CuteDSL utilities need nvidia-cutlass-dsl, AITER ROCm)."""
    try:
        importlib.import_module(module)
    except (ImportError, RuntimeError, OSError):  # a missing package, or one that needs CUDA at import
        return False
    return True


@contextlib.contextmanager
def stand_in_function(module: str, name: str, stand_in: Callable[..., Any]) -> Iterator[None]:
    """``module.name`` replaced by ``stand_in`` while the block runs, for code that imports it when it runs
    (``from module import name``). Where ``module`` does not import here, it and each parent package that does
    not import are stand-in modules in ``sys.modules``, holding only ``name``."""
    if importable(module):
        with mock.patch.object(importlib.import_module(module), name, stand_in):
            yield
        return
    parts = module.split(".")
    prefixes = (".".join(parts[: k + 1]) for k in range(len(parts)))
    stubs = {prefix: types.ModuleType(prefix) for prefix in prefixes if not importable(prefix)}
    setattr(stubs[module], name, stand_in)
    with mock.patch.dict(sys.modules, stubs):
        yield


def reference_shuffle_weight(mismatch: type[Exception], engine: str) -> Callable[..., torch.Tensor]:
    """A stand-in for ``aiter.ops.shuffle.shuffle_weight(weight, layout=(16, 16))`` where AITER is absent: the
    suite's ``reference.layouts.aiter_shuffle_weight``; ``engine`` asking for another layout raises ``mismatch``."""

    def shuffle_weight(weight: torch.Tensor, layout: tuple[int, int] = (16, 16)) -> torch.Tensor:
        if tuple(layout) != (16, 16):
            raise mismatch(f"{engine} asks AITER's shuffle_weight for layout {layout}; the reference has (16, 16)")
        return aiter_shuffle_weight(weight)

    return shuffle_weight


# --- a stand-in package for one an engine imports but the code under test never calls -----------------


class _StandInType(type):
    """Metaclass of stand-in classes: any class attribute is another stand-in (``InterpolationMode.BICUBIC``)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{cls.__name__}.{name}")


def _stand_in_class(name: str) -> type:
    def unavailable(*_: object, **__: object) -> None:
        raise RuntimeError(f"{name} is a stand-in here: the package is not installed")

    return _StandInType(name, (), {"__init__": unavailable, "__call__": unavailable})


class _StandInModule(types.ModuleType):
    """A stand-in (sub)module whose every public attribute is a stand-in class."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _stand_in_class(f"{self.__name__}.{name}")


STAND_IN_VERSION = "0.0"
"""What a stand-in package reports as ``__version__`` (``transformers`` parses torchvision's): older than any
release, so no version-gated path is taken."""


class StandInPackage(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds package ``name`` and its submodules as stand-in modules, for a package an engine imports only
    through code the suite never runs (SGLang imports ``torchvision`` through its multimodal processors; the
    PyPI torchvision cannot be installed beside CPU torch, it replaces torch with a CUDA build). It has no
    distribution metadata, so ``transformers`` still reports the package as absent."""

    def __init__(self, name: str) -> None:
        self.name = name

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname == self.name or fullname.startswith(f"{self.name}."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = STAND_IN_VERSION
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


# --- reading an engine's source -----------------------------------------------------------------------


def call_name(node: ast.Call) -> str:
    """``f`` for ``f(...)`` and ``obj.f(...)``; empty for other callees."""
    func = node.func
    return func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""


QUANTIZER_ROUNDING: dict[str, MxScaleRounding] = {
    r.activation_quantizer: r.activation_rounding for r in records(MXFP4_LINEAR)
}
"""AITER's MXFP4 activation quantizers and their scale rounding, from the backend records
(:mod:`backends.mxfp4_linear`): the suite's knowledge of AITER. Which quantizer each path calls is read from
each engine's source."""


# --- default backend selection ------------------------------------------------------------------------


class Hardware(enum.Enum):
    """The hardware classes whose default FP4 MoE backend the engines' selection code is asked for."""

    SM90 = "sm90"  # Hopper (H100, H200, H20)
    SM100 = "sm100"  # datacenter Blackwell (B200, GB200)
    SM120 = "sm120"  # consumer / workstation Blackwell (RTX PRO 6000, RTX 5090)
    GFX950 = "gfx950"  # AMD CDNA 4 (MI350X, MI355X)

    @property
    def capability(self) -> tuple[int, int] | None:
        """The CUDA compute capability (``None``: a ROCm GPU)."""
        return {"sm90": (9, 0), "sm100": (10, 0), "sm120": (12, 0)}.get(self.value)


class Fp4Checkpoint(enum.Enum):
    """How a model's FP4 checkpoint is quantized, which decides the engine's quantization method and so its
    backend selection."""

    GPT_OSS_MXFP4 = "gpt-oss MXFP4 (quant_method mxfp4, fused row-interleaved experts with biases)"
    DSV4_FP4_EXPERTS = "DeepSeek-V4 FP4 routed experts (FP8 checkpoint, E8M0-scaled int4 experts)"
    MODELOPT_NVFP4 = "NVIDIA ModelOpt NVFP4"
    QUARK_MXFP4 = "AMD Quark OCP-MX MXFP4"


FP4_CHECKPOINTS: dict[str, tuple[Fp4Checkpoint, str]] = {
    "gpt-oss-20b": (Fp4Checkpoint.GPT_OSS_MXFP4, "openai/gpt-oss-20b"),
    "gpt-oss-120b": (Fp4Checkpoint.GPT_OSS_MXFP4, "openai/gpt-oss-120b"),
    "deepseek-v4": (Fp4Checkpoint.DSV4_FP4_EXPERTS, "DeepSeek-V4's released FP4 experts (SGLang #26250)"),
    "deepseek-v4.1-flash": (Fp4Checkpoint.DSV4_FP4_EXPERTS, "vLLM PR #56697"),
    "gemma-4-26b-a4b": (Fp4Checkpoint.MODELOPT_NVFP4, "nvidia/Gemma-4-26B-A4B-NVFP4"),
    "nemotron-3-nano-30b-a3b": (Fp4Checkpoint.MODELOPT_NVFP4, "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"),
    "kimi-k2": (Fp4Checkpoint.MODELOPT_NVFP4, "nvidia/Kimi-K2-Thinking-NVFP4"),
    "qwen3.8-flash-next": (Fp4Checkpoint.QUARK_MXFP4, "AMD Quark MXFP4 (vLLM PR #55213)"),
    "minimax-m2": (Fp4Checkpoint.QUARK_MXFP4, "MiniMax-M2.1-MXFP4 (AITER PR #2642)"),
}
"""The catalogued models (:data:`strategies.catalog.MODELS`) with a public FP4 checkpoint, its quantization and
where it is named."""


class Undetermined(RuntimeError):
    """Raised by a stand-in for a machine fact the selection code reads that a CPU machine cannot fake (a
    driver version, an optional package's presence): the default is not determined, and the message says
    which fact it hangs on."""


@dataclass(frozen=True)
class DefaultChoice:
    """The backend an engine selects by default for a (model, hardware, TP, EP), read from its selection code.

    ``backend``: the suite's backend record member the engine's choice maps to (the inverse of the engine's
    ``*_BACKENDS`` map), ``None`` where the engine picks a kernel the suite has no record for or the choice is
    not determined; ``reason``: what the engine chose, or why no member is given; ``consulted``: the engine
    functions called, ``module.function (engine version)``; ``loader``: where ``backend`` is ``None`` because the
    engine's kernel has no record, the record whose weight loading (the quantization method's ``create_weights``
    and the model's expert loader) the engine's choice shares, so the loading properties still run for it."""

    backend: enum.Enum | None
    reason: str
    consulted: tuple[str, ...]
    loader: enum.Enum | None = None
