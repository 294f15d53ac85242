#!/usr/bin/env bash
# Install SGLang 0.5.23 (+ the minimum needed to import its FP4 MoE and quantization code)
# into the ALREADY-ACTIVE venv, which must hold CPU torch 2.13.0 (scripts/install-cpu.sh).
# SGLang's wheel declares a CUDA torch, torchvision and sgl-kernel; nothing here may pull a torch,
# so sglang and every dep that declares torch are installed with --no-deps.
#
# torchvision is NOT installed: its PyPI wheel replaces torch with a CUDA build (~7 GB) and does not
# load on CPU torch anyway. SGLang imports it only through its multimodal processors, which its
# config package imports; subjects/sglang/bridge.py puts a stand-in `torchvision` module in sys.modules
# before importing SGLang when the real one is absent (sglang_modules() documents it).
#
# usage: source VENV/bin/activate && scripts/install-sglang-cpu.sh
set -euo pipefail

py=python
"$py" - <<'PY'
import sys, torch
if not torch.__version__.startswith("2.13.0") or torch.version.cuda is not None:
    sys.exit(f"need CPU torch 2.13.0 in the active venv, found {torch.__version__} (cuda={torch.version.cuda})")
PY

pip_i() { "$py" -m pip install --disable-pip-version-check --no-compile -q "$@"; }

# 0. No amd-aiter here (scripts/install-cpu.sh installs it): SGLang 0.5.23 guards
#    `from aiter.ops.triton.quant import dynamic_mxfp4_quant` (srt/layers/quantization/quark/utils.py)
#    with `except ImportError`, but without ROCm `import aiter` raises RuntimeError, so SGLang would not import.
"$py" -m pip uninstall -y -q amd-aiter

# 1. SGLang itself, no deps (its metadata pins a CUDA torch, torchvision and sgl-kernel).
pip_i --no-deps sglang==0.5.23

# 2. Import-time deps that do not declare torch (normal resolution).
pip_i triton==3.8.0 orjson psutil pyzmq msgspec pydantic regex pybase64 setproctitle xxhash zstandard \
      pillow starlette IPython aiohttp transformers dill sentencepiece numpy einops packaging requests \
      tqdm nvidia-ml-py

# 3. Deps that declare torch (or pull heavy stacks): --no-deps. flashinfer-python at the version SGLang's own
#    wheel metadata pins (0.5.23: flashinfer_python[cu13]==0.7.2), read there by scripts/requirement.py rather
#    than retyped, so the subject runs the FlashInfer SGLang's users run (it replaces the 0.7.4 that
#    scripts/install-cpu.sh installs for the suite; the cu13 extra is CUDA-only and left out);
#    apache-tvm-ffi at the range that FlashInfer declares.
req="$(dirname "$0")/requirement.py"
flashinfer=$("$py" "$req" sglang flashinfer-python)
pip_i --no-deps compressed-tensors loguru gguf openai sniffio partial_json_parser "$flashinfer"
pip_i --no-deps "$("$py" "$req" flashinfer-python apache-tvm-ffi)"

FLASHINFER="$flashinfer" "$py" - <<'PY'
import os, sys, time, torch
assert torch.__version__.startswith("2.13.0") and torch.version.cuda is None, torch.__version__
sys.path.insert(0, ".")
t = time.time()
from subjects.sglang.bridge import sglang_modules
m = sglang_modules()
import flashinfer
assert os.environ["FLASHINFER"] == f"flashinfer-python=={flashinfer.__version__}", (os.environ["FLASHINFER"], flashinfer.__version__)
print(f"sglang {m.version} + flashinfer {flashinfer.__version__} import OK in {time.time() - t:.1f}s, torch {torch.__version__}")
PY
