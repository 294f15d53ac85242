"""Preflight: every kernel property of a hardware target, its library calls built and checked, nothing launched.

``python -m harness.preflight --hardware {sm100,sm90,gfx950}`` finds the kernel properties
(``@check(..., kernel=True)`` tests in ``conformance/``, with each backend the plugin parametrizes them with)
whose hardware markers that target has, and runs each one's bare check on its first pinned example (the
built-in policy; a property without pins gets its strategy's simplest example) inside
:func:`adapters.calls.planning`. The adapters then build every call exactly as on the GPU, with inputs on
the CPU (:func:`adapters.calls.kernel_device`), and hand it to :func:`check_call` instead of launching it:

1. the entry point imports (AITER's HIP entry points need ROCm: elsewhere their signature is read from the
   installed source, :class:`adapters.calls.SourceOnly`);
2. ``inspect.signature(fn).bind(*args, **kwargs)`` accepts the call (a mismatch shows both signatures);
3. the library's own Python code runs on those tensors up to the launch: FlashInfer up to loading its JIT
   module (``JitSpec.build_and_load``, intercepted: the spec's sources must exist; whether the module is
   prebuilt and whether trtllm-gen's artifacts are in ``FLASHINFER_CUBIN_DIR`` is reported, nothing is
   downloaded or built), Triton libraries up to each kernel launch (``JITFunction.run`` and
   ``Autotuner.run`` become no-ops, so their wrappers' checks and allocations run). Device queries answer the
   target's architecture. AITER's compiled (HIP, ASM, CK) entry points are bound only: calling one loads,
   and may build, its module.

Verdicts, worst first (:class:`Status`): ``FAIL`` (the property would fail: a signature mismatch, a dtype or
shape the library refuses, a missing JIT source, a property that cannot build its call), ``missing`` (a
library its markers need is not installed: the property would be skipped), ``version gate`` (the installed
version lacks an API the property needs, :class:`contracts.errors.VersionGate`), ``fetch`` (a JIT build or an
artifact download at first use), ``needs hardware`` (what could be checked here passed) and ``ready``. The
exit code is 1 on ``FAIL``; ``--require-libraries`` adds ``missing`` and ``version gate``, ``--offline`` adds
``fetch`` (docs/hardware-ci.md).
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import importlib
import importlib.metadata
import importlib.util
import inspect
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from adapters import calls
from contracts.errors import LibraryUnavailable, VersionGate
from harness.hardware import REQUIREMENTS, machine
from harness.properties import PropertySpec

ROOT = Path(__file__).resolve().parent.parent

TARGETS = {
    "sm100": frozenset({"cuda", "sm100", "aiter_triton"}),
    "sm90": frozenset({"cuda", "sm90", "aiter_triton"}),
    "gfx950": frozenset({"gfx950"}),
}
"""The hardware markers each target satisfies (B200, H200, MI350x); a property runs on a target when it
has at least one hardware marker and all of them are the target's."""

HARDWARE = frozenset().union(*TARGETS.values())

CAPABILITIES = {"sm100": (10, 0), "sm90": (9, 0)}
"""The compute capability FlashInfer's device queries and JIT specs see in a target's plan (no GPU is asked)."""


class Status(enum.IntEnum):
    """A call's or property's verdict, in increasing severity."""

    READY = 0
    NEEDS_HARDWARE = 1
    FETCH = 2
    GATED = 3
    MISSING = 4
    FAIL = 5

    @property
    def label(self) -> str:
        return ("ready", "needs hardware", "fetch", "version gate", "missing", "FAIL")[self.value]


@dataclass(frozen=True)
class CallCheck:
    """The verdict on one call (``call``: its name in the adapter), with what was found."""

    call: str
    status: Status
    detail: str


@dataclass
class PropertyPlan:
    """One kernel property on one backend: the calls its check reached, in order, and how the plan ended."""

    test: str
    backend: str | None
    example: str
    checks: list[CallCheck] = field(default_factory=list)
    ended: str = ""

    @property
    def status(self) -> Status:
        return max((c.status for c in self.checks), default=Status.READY)


@dataclass(frozen=True)
class KernelProperty:
    """A kernel test, the check it runs, its backend and the requirement markers of that parameter."""

    test: str
    check: Callable[..., None]
    spec: PropertySpec
    backend: enum.Enum | None
    markers: frozenset[str]


# --- which properties ------------------------------------------------------------------------------------


def _marker_names(marks: Any) -> set[str]:
    marks = marks if isinstance(marks, list | tuple) else [marks]
    return {getattr(m, "mark", m).name for m in marks}


def kernel_properties() -> list[KernelProperty]:
    """Every kernel test of ``conformance/`` with each backend it is parametrized with (as the plugin does)."""
    from backends import record
    from harness.properties import ALL_BACKENDS
    from subjects.registry import backends

    found = []
    for path in sorted((ROOT / "conformance").glob("test_*.py")):
        module = importlib.import_module(f"conformance.{path.stem}")
        module_marks = _marker_names(getattr(module, "pytestmark", []))
        for name, test in vars(module).items():
            inner = getattr(getattr(test, "hypothesis", None), "inner_test", None)  # Hypothesis keeps it there
            spec = getattr(inner, "__fp4_spec__", None)
            if spec is None or not spec.kernel or test.__module__ != module.__name__:
                continue
            check = inner.__fp4_property__
            contract = check.__fp4_check__[0]
            marks = module_marks | set(spec.marks)
            if spec.backends is None:
                members: tuple[Any, ...] = (None,)
            else:
                members = backends(contract) if spec.backends is ALL_BACKENDS else tuple(spec.backends)
            on_kernel = spec.kernel if spec.kernel_backends is None else spec.kernel_backends
            for member in members:
                requires: tuple[str, ...] = ()
                if member is not None:
                    r = record(member)
                    if on_kernel and not r.kernel_requires:
                        continue
                    requires = (*r.requires, *(r.kernel_requires if on_kernel else ()))
                markers = frozenset(m for m in (*marks, *requires) if m in REQUIREMENTS)
                found.append(KernelProperty(f"{path.name}::{name}", check, spec, member, markers))
    return found


def for_target(props: list[KernelProperty], target: str) -> list[KernelProperty]:
    """The properties whose hardware markers ``target`` satisfies."""
    return [p for p in props if (hw := p.markers & HARDWARE) and hw <= TARGETS[target]]


def libraries_missing(markers: frozenset[str]) -> list[str]:
    """The library markers of ``markers`` not installed here (AITER's files count for ``aiter``)."""
    libs = set(machine().libraries)
    if "amd-aiter" in libs:
        libs |= {"aiter", "aiter_triton"}
    return sorted(m for m in markers - HARDWARE - libs if m not in ("cuda",))


# --- checking one call ----------------------------------------------------------------------------------


class _Boundary(Exception):
    def __init__(self, status: Status, detail: str) -> None:
        super().__init__(detail)
        self.status, self.detail = status, detail


HARDWARE_ERROR = re.compile(
    r"CUDA|cuda|NVIDIA|nvidia|driver|ROCm|HIP\b|GPU|compute capability|NVML|nvml|Torch not compiled|gfx\d|active drivers"
)
"""Errors that say the GPU (or its runtime) is absent, not that the call is wrong."""

DEVICE_OP = re.compile(r"from the '(CPU|Meta)' backend")
"""A device op (``torch.ops``) reached with CPU inputs: the library's checks before it have passed."""


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).removeprefix('torch.')}{list(value.shape)}"
    if isinstance(value, list | tuple):
        inner = ", ".join(_describe(v) for v in value)
        return f"[{inner}]" if isinstance(value, list) else f"({inner})"
    return type(value).__name__ if callable(value) else repr(value)[:40]


def describe_call(call: calls.KernelCall) -> str:
    """``(arg, ..., kw=arg)`` with tensors as ``dtype[shape]``: the call's side of a signature mismatch."""
    parts = [_describe(a) for a in call.args] + [f"{k}={_describe(v)}" for k, v in call.kwargs.items()]
    return "(" + ", ".join(parts) + ")"


def _flashinfer_version() -> str:
    try:
        return importlib.metadata.version("flashinfer-python")
    except importlib.metadata.PackageNotFoundError:
        return "?"


def _jit_verdict(spec: Any) -> _Boundary:
    """What loading FlashInfer JIT module ``spec`` would need: its sources (missing: FAIL) and a prebuilt library."""
    sources = [Path(s) for s in getattr(spec, "sources", ()) or ()]
    absent = [str(s) for s in sources if not s.exists()]
    if absent:
        return _Boundary(
            Status.FAIL, f"JIT module {spec.name}: {len(absent)} of {len(sources)} sources missing: {absent[:3]}"
        )
    try:
        prebuilt = bool(spec.is_compiled)
        library = spec.get_library_path()
    except Exception as exc:  # noqa: BLE001 - an unreadable spec is reported as such
        return _Boundary(Status.FAIL, f"JIT module {spec.name}: spec unreadable ({type(exc).__name__}: {exc})")
    if prebuilt:
        return _Boundary(Status.READY, f"JIT module {spec.name}: prebuilt at {library}")
    return _Boundary(
        Status.FETCH,
        f"JIT module {spec.name}: {len(sources)} sources present, not prebuilt ({library} absent): compiles with "
        f"nvcc at first use (CUDA toolkit on PATH, FLASHINFER_WORKSPACE_BASE writable), or "
        f"pip install flashinfer-jit-cache=={_flashinfer_version()} (the cu12x/cu13x index)",
    )


@contextlib.contextmanager
def _patched(owner: Any, name: str, value: Any) -> Iterator[None]:
    original = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, original)


def _patch_everywhere(stack: contextlib.ExitStack, prefix: str, name: str, value: Any) -> None:
    """Replace ``name`` in every loaded module under ``prefix`` that holds the original (imported by name)."""
    original = getattr(importlib.import_module(prefix + ".utils"), name, None)
    if original is None:
        return
    for module in [m for n, m in list(sys.modules.items()) if n.startswith(prefix) and m is not None]:
        if getattr(module, name, None) is original:
            stack.enter_context(_patched(module, name, value))


@contextlib.contextmanager
def launch_boundaries(launched: list[str], target: str | None = None) -> Iterator[None]:
    """Stop FlashInfer at JIT module loading and trtllm-gen artifact reads (raising :class:`_Boundary`) and
    turn Triton kernel launches into no-ops recorded in ``launched``, for the libraries installed. Without a
    GPU needed, the device queries of FlashInfer (compute capability, current device) and AITER's Triton
    wrappers (``get_arch``) answer ``target``'s architecture (on its own host too: the plan's tensors are
    on the CPU, which those queries would refuse)."""
    capability = CAPABILITIES.get(target or "")
    with contextlib.ExitStack() as stack:
        if target == "gfx950":
            arch_info = sys.modules.get("aiter.ops.triton.utils._triton.arch_info")
            if arch_info is not None:
                stack.enter_context(_patched(arch_info, "get_arch", lambda: "gfx950"))
        if capability is not None:
            stack.enter_context(_patched(torch.cuda, "current_device", lambda: 0))
            stack.enter_context(_patched(torch.cuda, "device", lambda device: contextlib.nullcontext()))
        if "flashinfer" in machine().libraries:
            core = importlib.import_module("flashinfer.jit.core")
            if capability is not None:
                _patch_everywhere(stack, "flashinfer", "get_compute_capability", lambda device: capability)
                context = core.current_compilation_context  # what FLASHINFER_CUDA_ARCH_LIST would set
                arch = {(capability[0], f"{capability[1]}a")}
                stack.enter_context(_patched(context, "TARGET_CUDA_ARCHS", arch))

            def build_and_load(spec: Any) -> Any:
                raise _jit_verdict(spec)

            stack.enter_context(_patched(core.JitSpec, "build_and_load", build_and_load))
            loader = importlib.import_module("flashinfer.jit.cubin_loader")
            env = importlib.import_module("flashinfer.jit.env")
            original = loader.get_artifact

            def get_artifact(file_name: str, sha256: str, *args: Any, **kwargs: Any) -> bytes:
                data = loader.load_cubin(str(env.FLASHINFER_CUBIN_DIR / file_name), sha256)
                if data:  # None (0.7.4) or b"" (0.7.2) when absent
                    return data
                raise _Boundary(
                    Status.FETCH,
                    f"trtllm-gen artifact {file_name} not in FLASHINFER_CUBIN_DIR ({env.FLASHINFER_CUBIN_DIR}): "
                    f"downloaded at first use; an offline host needs `python -m flashinfer download-cubin` run "
                    f"beforehand with flashinfer-python {_flashinfer_version()} (or FLASHINFER_CUBIN_DIR at such a copy)",
                )

            for module in [m for n, m in list(sys.modules.items()) if n.startswith("flashinfer") and m is not None]:
                if getattr(module, "get_artifact", None) is original:
                    stack.enter_context(_patched(module, "get_artifact", get_artifact))
        if importlib.util.find_spec("triton") is not None:
            jit = importlib.import_module("triton.runtime.jit")
            autotuner = importlib.import_module("triton.runtime.autotuner")

            def run(kernel: Any, *args: Any, **kwargs: Any) -> None:
                fn = getattr(kernel, "fn", kernel)
                launched.append(getattr(fn, "__name__", type(fn).__name__))

            stack.enter_context(_patched(jit.JITFunction, "run", run))
            stack.enter_context(_patched(autotuner.Autotuner, "run", run))
        yield


def is_hip_module(fn: Any) -> bool:
    """Whether ``fn`` is one of AITER's compiled (HIP, ASM, CK) entry points rather than its Triton code."""
    module = getattr(inspect.unwrap(fn), "__module__", "") or ""
    return module.startswith("aiter") and not module.startswith("aiter.ops.triton")


def check_call(call: calls.KernelCall, target: str | None = None) -> tuple[CallCheck, Any]:
    """The verdict on ``call`` and its output where the library's code ran to the end (else ``calls.NOT_RUN``)."""
    fn = call.fn
    try:
        signature = inspect.signature(fn)
    except (ImportError, OSError, SyntaxError, ValueError, TypeError) as exc:
        return CallCheck(call.name, Status.FAIL, f"entry point not found: {exc}"), calls.NOT_RUN
    try:
        signature.bind(*call.args, **call.kwargs)
    except TypeError as exc:
        return CallCheck(
            call.name,
            Status.FAIL,
            f"signature mismatch ({exc}): the adapter calls {call.name}{describe_call(call)}; "
            f"the installed library has {getattr(fn, '__name__', call.name)}{signature}",
        ), calls.NOT_RUN
    if not isinstance(fn, calls.SourceOnly) and is_hip_module(fn):
        return CallCheck(
            call.name,
            Status.READY,
            f"binds to {fn.__module__}.{call.name.split()[0]}{signature}; AITER's HIP/ASM/CK modules are bound only "
            "(calling one loads, and may build, its module)",
        ), calls.NOT_RUN
    if isinstance(fn, calls.SourceOnly):
        return CallCheck(
            call.name,
            Status.NEEDS_HARDWARE,
            f"binds to {fn.module}.{fn.name}{signature} (installed source); importing it needs the GPU runtime: "
            f"{fn.reason[:160]}",
        ), calls.NOT_RUN
    launched: list[str] = []
    try:
        with launch_boundaries(launched, target):
            out = fn(*call.args, **call.kwargs)
    except _Boundary as stop:
        return CallCheck(call.name, stop.status, stop.detail), calls.NOT_RUN
    except Exception as exc:  # noqa: BLE001 - every failure of the library's own checks is a verdict
        text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
        if DEVICE_OP.search(text):
            return CallCheck(
                call.name, Status.READY, f"library checks passed up to a device op ({text[:120]})"
            ), calls.NOT_RUN
        if HARDWARE_ERROR.search(text):
            return CallCheck(
                call.name, Status.NEEDS_HARDWARE, f"bound; the library's checks need the GPU: {text}"
            ), calls.NOT_RUN
        return CallCheck(call.name, Status.FAIL, f"the library refuses the call: {text}"), calls.NOT_RUN
    what = f"Triton launches intercepted: {', '.join(dict.fromkeys(launched))}" if launched else "no kernel launched"
    return CallCheck(call.name, Status.READY, f"bound; wrapper ran to its launch ({what})"), out


# --- planning a property ----------------------------------------------------------------------------------


def examples(prop: KernelProperty) -> list[Any]:
    """The pinned examples matching the current pin, then the explicit ones, else the strategy's simplest."""
    from hypothesis import HealthCheck, find, settings

    from strategies.pins import matches_pin

    found = [c for c in prop.spec.pins if matches_pin(c)] + list(prop.spec.examples)
    if found:
        return found
    quiet = settings(database=None, derandomize=True, suppress_health_check=list(HealthCheck))
    return [find(prop.spec.strategy, lambda _: True, settings=quiet)]


def plan(prop: KernelProperty, target: str | None = None, tries: int = 8) -> PropertyPlan:
    """Run ``prop``'s check under :func:`adapters.calls.planning` on its first example (of ``tries``) that
    reaches a kernel call."""
    from hypothesis.errors import UnsatisfiedAssumption

    from harness.inputs import guard_inputs
    from subjects.registry import builtin

    backend = prop.backend.value if prop.backend is not None else None
    missing = libraries_missing(prop.markers)
    if missing:
        result = PropertyPlan(prop.test, backend, "-")
        needs = "; ".join(REQUIREMENTS[m] for m in missing)
        result.checks.append(CallCheck("(library)", Status.MISSING, f"not installed: {needs}"))
        return result
    policy = guard_inputs(builtin().policy(prop.check.__fp4_check__[0]))
    result = PropertyPlan(prop.test, backend, "-")
    for config in examples(prop)[:tries]:
        describe = getattr(config, "describe", None)
        result = PropertyPlan(prop.test, backend, describe() if describe else str(config))

        def planner(call: calls.KernelCall, result: PropertyPlan = result) -> Any:
            verdict, out = check_call(call, target)
            result.checks.append(verdict)
            return out

        try:
            with calls.planning(planner):
                prop.check(config, prop.backend, policy)
            if not result.checks:
                continue  # the check skips this example before any call (a layer another path serves)
            result.ended = "the check returned"
        except calls.PlanComplete as done:
            result.ended = f"ends at {done}"
        except UnsatisfiedAssumption:
            if result.checks:
                result.ended = "the example was rejected after its calls"
            else:
                continue  # the check rejects this example before any call: try the next one
        except LibraryUnavailable as exc:
            status = Status.GATED if isinstance(exc, VersionGate) else Status.MISSING
            result.checks.append(CallCheck("(library)", status, str(exc)[:300]))
        except Exception as exc:  # noqa: BLE001 - reported in the table
            text = f"{type(exc).__name__}: {exc}".replace("\n", " ")[:300]
            if result.checks:
                result.ended = f"after its last call the check compared unwritten outputs ({type(exc).__name__})"
            else:
                result.checks.append(
                    CallCheck("(property)", Status.FAIL, f"raised before its first kernel call: {text}")
                )
        return result
    result.checks.append(CallCheck("(property)", Status.FAIL, f"none of {tries} examples reached a kernel call"))
    return result


# --- the command ----------------------------------------------------------------------------------------


def versions() -> str:
    """The library versions the verdicts are about, and the AITER ``gemm_a4w4`` API detected."""
    from adapters.aiter import gemm_a4w4_api

    parts = [f"torch {torch.__version__}"]
    for dist in ("flashinfer-python", "flashinfer-cubin", "flashinfer-jit-cache", "amd-aiter", "triton"):
        try:
            parts.append(f"{dist} {importlib.metadata.version(dist)}")
        except importlib.metadata.PackageNotFoundError:
            parts.append(f"{dist} absent")
    try:
        parts.append(
            f"AITER gemm_a4w4 API: {gemm_a4w4_api(calls.SourceOnly('aiter.ops.gemm_op_a4w4', 'gemm_a4w4', ''))}"
        )
    except Exception as exc:  # noqa: BLE001 - reported, not fatal here (the property's row says more)
        parts.append(f"AITER gemm_a4w4 API: {type(exc).__name__}")
    return ", ".join(parts)


def table(target: str, plans: list[PropertyPlan]) -> str:
    """One markdown table: property [backend] -> kernel call -> verdict and what is missing."""
    lines = [
        f"preflight {target} on {machine().describe()}: {versions()}",
        "",
        "| property [backend] | kernel call | verdict | detail |",
        "|---|---|---|---|",
    ]
    for p in plans:
        name = f"{p.test} [{p.backend}]" if p.backend else p.test
        counts = Counter(p.checks)
        for c in dict.fromkeys(p.checks):
            times = f" (x{counts[c]})" if counts[c] > 1 else ""
            lines.append(f"| {name} | {c.call}{times} | {c.status.label} | {c.detail.replace('|', '/')} |")
        ended = f"; {p.ended}" if p.ended else ""
        lines.append(f"| {name} | (example) | | {p.example.replace('|', '/')}{ended.replace('|', '/')} |")
    return "\n".join(lines)


def run(target: str) -> list[PropertyPlan]:
    """Plan every kernel property of ``target``."""
    return [plan(p, target) for p in for_target(kernel_properties(), target)]


def fatal(plans: list[PropertyPlan], require_libraries: bool, offline: bool) -> list[PropertyPlan]:
    """The plans that make the preflight fail under these options."""
    worst = {Status.FAIL} | ({Status.MISSING, Status.GATED} if require_libraries else set())
    worst |= {Status.FETCH} if offline else set()
    return [p for p in plans if p.status in worst or not p.checks]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.preflight", description=__doc__.split("\n")[0])
    parser.add_argument("--hardware", required=True, choices=sorted(TARGETS))
    parser.add_argument("--require-libraries", action="store_true", help="a missing library fails (nightly hosts)")
    parser.add_argument("--offline", action="store_true", help="JIT compilation or artifact download fails")
    args = parser.parse_args(argv)
    capability = CAPABILITIES.get(args.hardware)
    if capability is not None and not torch.cuda.is_available():  # FlashInfer names its JIT folders after it
        os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", f"{capability[0]}.{capability[1]}a")
    plans = run(args.hardware)
    print(table(args.hardware, plans))
    bad = fatal(plans, args.require_libraries, args.offline)
    if bad:
        names = ", ".join(f"{p.test} [{p.backend}]" for p in bad)
        print(f"\npreflight {args.hardware}: {len(bad)} of {len(plans)} kernel properties would fail: {names}")
        return 1
    print(
        f"\npreflight {args.hardware}: {len(plans)} kernel properties, none would fail for a reason other than the hardware"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
