"""An engine's venv runs the flashinfer-python its engine pins, as its users do (``scripts/requirement.py``).

``scripts/install-vllm-cpu.sh`` and ``scripts/install-sglang-cpu.sh`` read the pin from the engine's own wheel
metadata (vLLM 0.33.0: ``flashinfer-python==0.7.2.post1``; SGLang 0.5.23: ``flashinfer_python[cu13]==0.7.2``) and
install it over the suite's 0.7.4. Where an engine is installed, its FlashInfer must be that version; the reader
normalizes the name and drops extras and markers.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from types import ModuleType

import pytest

from harness.checkout import ROOT


def _requirement_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("requirement", ROOT / "scripts" / "requirement.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engine_venv_has_the_engines_flashinfer(engine: str) -> None:
    try:
        importlib.metadata.version(engine)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{engine} is not installed here")
    pin = _requirement_script().requirement(engine, "flashinfer-python")
    installed = importlib.metadata.version("flashinfer-python")
    assert pin == f"flashinfer-python=={installed}", (
        f"{engine} {importlib.metadata.version(engine)} pins {pin}, this venv has flashinfer-python {installed}: "
        f"run scripts/install-{engine}-cpu.sh"
    )


def test_requirement_drops_extras_and_markers(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = ['flashinfer-python>=0.1; extra == "gpu"', "flashinfer_python[cu13]==0.7.2", "torch==2.14.0"]
    monkeypatch.setattr(importlib.metadata, "requires", lambda dist: declared)
    script = _requirement_script()
    assert script.requirement("engine", "flashinfer-python") == "flashinfer-python==0.7.2"
    assert script.requirement("engine", "amd-aiter") is None
