"""The one place that knows the machine: GPUs, their architecture, and which libraries import.

Requirements are named by pytest markers (``cuda``, ``sm90``, ``sm100``, ``gfx950``,
``flashinfer``, ``aiter``, ``aiter_triton``, ``triton_kernels``, ``vllm``, ``sglang``); :func:`missing` returns the skip
reason for a requirement this machine lacks, naming what is absent, or ``None`` when the test can run here.
Architecture gates are exact families (``sm100`` means compute capability 10.x, not ">= 10"),
so consumer Blackwell (12.x) never collects a B200-only kernel.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
from dataclasses import dataclass

import torch

from adapters import aiter_triton

REQUIREMENTS = {
    "cuda": "an NVIDIA GPU",
    "sm90": "an SM90 GPU (H100/H200, compute capability 9.0)",
    "sm100": "an SM100 GPU (B200/GB200, compute capability 10.x)",
    "gfx950": "an AMD gfx950 GPU (MI350x/MI355x)",
    "flashinfer": "flashinfer-python (pip install 'fp4-conformance[nvidia]')",
    "aiter": "AMD AITER (pip install amd-aiter; needs ROCm)",
    "aiter_triton": "an NVIDIA GPU and amd-aiter for AITER Triton on CUDA (pip install 'fp4-conformance[amd]')",
    "triton_kernels": "OpenAI's triton_kernels (its own package, or vLLM's vendored vllm/third_party/triton_kernels)",
    "vllm": "vLLM (scripts/install-vllm-cpu.sh)",
    "sglang": "SGLang (scripts/install-sglang-cpu.sh)",
}

MODE_LABELS = {"aiter_triton": aiter_triton.LABEL}
"""Requirements that name a portability mode rather than a chip: the summary shows the mode next to
the hardware (AITER's own Triton kernels on an NVIDIA GPU, apart from its gfx950 paths)."""


@dataclass(frozen=True)
class Machine:
    """What this process can use. ``gpu_name`` / ``capability`` describe device 0."""

    cuda_devices: int
    rocm: bool
    capability: tuple[int, int] | None
    gfx: str | None
    gpu_name: str | None
    libraries: frozenset[str]

    def has(self, requirement: str) -> bool:
        cc = self.capability
        return {
            "cuda": self.cuda_devices > 0 and not self.rocm,
            "sm90": not self.rocm and cc == (9, 0),
            "sm100": not self.rocm and cc is not None and cc[0] == 10,
            "gfx950": self.rocm and self.gfx is not None and self.gfx.startswith("gfx950"),
            "aiter_triton": self.cuda_devices > 0 and not self.rocm and "amd-aiter" in self.libraries,
        }.get(requirement, requirement in self.libraries)

    def describe(self) -> str:
        if self.cuda_devices == 0:
            return "cpu"
        arch = self.gfx if self.rocm else f"sm{self.capability[0]}{self.capability[1]}"
        return f"{arch} ({self.gpu_name} x{self.cuda_devices})"


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _vendored_triton_kernels() -> bool:
    """Whether vLLM's vendored ``vllm/third_party/triton_kernels`` is on disk (found without importing vLLM)."""
    spec = importlib.util.find_spec("vllm") if _importable("vllm") else None
    roots = spec.submodule_search_locations if spec is not None else None
    return any(os.path.isdir(os.path.join(root, "third_party", "triton_kernels")) for root in roots or ())


@functools.cache
def machine() -> Machine:
    """Detect the machine once per process (after any xdist device pinning)."""
    rocm = torch.version.hip is not None
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cc = torch.cuda.get_device_capability(0) if n else None
    name = torch.cuda.get_device_name(0) if n else None
    gfx = torch.cuda.get_device_properties(0).gcnArchName if (n and rocm) else None
    libs = {lib for lib in ("flashinfer", "vllm", "sglang", "ml_dtypes") if _importable(lib)}
    if _importable("triton_kernels") or _vendored_triton_kernels():
        libs.add("triton_kernels")
    if _importable("aiter"):  # the package's files; importing it needs ROCm
        libs.add("aiter" if rocm else "amd-aiter")
    return Machine(n, rocm, cc, gfx, name, frozenset(libs))


def missing(requirement: str, m: Machine | None = None) -> str | None:
    """Skip reason if ``requirement`` is unmet here, else ``None``."""
    m = m or machine()
    if m.has(requirement):
        return None
    return f"needs {_what_is_missing(requirement, m)}; this machine: {m.describe()}"


def _what_is_missing(requirement: str, m: Machine) -> str:
    """What ``requirement`` needs that ``m`` lacks: an install hint only for a package that is absent."""
    if requirement == "aiter_triton":
        if "amd-aiter" in m.libraries:
            return "an NVIDIA GPU for AITER Triton on CUDA (amd-aiter is installed)"
        if m.has("cuda"):
            return "amd-aiter for AITER Triton on CUDA (pip install 'fp4-conformance[amd]')"
    if requirement == "aiter" and "amd-aiter" in m.libraries:
        return "AMD AITER on ROCm (amd-aiter is installed; its HIP code needs a ROCm build of torch and an AMD GPU)"
    return REQUIREMENTS.get(requirement, requirement)


def labels(m: Machine, requirements: list[str]) -> str:
    """The hardware column of a test with these requirement markers on ``m``: the machine, then each
    portability mode (:data:`MODE_LABELS`) that runs here (a mode that cannot run is no hardware of it)."""
    return " · ".join([m.describe(), *(MODE_LABELS[r] for r in requirements if r in MODE_LABELS and m.has(r))])


def count_gpus_without_init() -> int:
    """GPU count for the xdist controller, without initialising CUDA/HIP in this process.

    Honours ``CUDA_VISIBLE_DEVICES`` / ``HIP_VISIBLE_DEVICES``; otherwise asks ``nvidia-smi -L``
    or ``rocm-smi``; 0 when neither tool exists.
    """
    for var in ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES"):
        value = os.environ.get(var)
        if value is not None:
            return len([d for d in value.split(",") if d.strip() and d.strip() != "-1"])
    for tool, args, prefix in (("nvidia-smi", ["-L"], "GPU "), ("rocm-smi", ["--showid"], "GPU[")):
        if shutil.which(tool):
            try:
                out = subprocess.run([tool, *args], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError):
                continue
            ids = {line.split(":")[0] for line in out.splitlines() if line.startswith(prefix)}
            return len(ids)
    return 0
