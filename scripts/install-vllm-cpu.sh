#!/usr/bin/env bash
# Install vLLM 0.33.0 (+ the minimum needed to import its FP4 alignment/padding code)
# into the ALREADY-ACTIVE venv, which must hold CPU torch 2.13.0 (`pip install torch==2.13.0`).
# vLLM's wheel declares torch==2.14.0 and a CUDA stack; nothing here may pull a torch,
# so vllm and every dep that declares torch are installed with --no-deps.
#
# Measured wall time on this 2-core machine (fresh venv that already had torch): 62 s (61.7 s; an earlier run 64.1 s), incl. the 336 MB vllm wheel download
#
# Enables (verified):
#   import vllm.model_executor.layers.fused_moe            # must come first (circular import)
#   from vllm.model_executor.layers.quantization.utils.flashinfer_utils import align_fp4_moe_weights_for_fi
#   from vllm.model_executor.kernels.linear.mxfp4.aiter import _asm_fp4_scale_swizzle_supported
#   import vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe
#   import vllm.model_executor.layers.fused_moe.oracle.mxfp4
#   import vllm.model_executor.models.qwen3_next           # needs compressed-tensors + loguru
#   import flashinfer                                      # only for the TRTLLM shuffle path; vLLM's pin
set -euo pipefail

py=python
"$py" - <<'PY'
import sys, torch
if not torch.__version__.startswith("2.13.0") or torch.version.cuda is not None:
    sys.exit(f"need CPU torch 2.13.0 in the active venv, found {torch.__version__} (cuda={torch.version.cuda})")
PY

pip_i() { "$py" -m pip install --disable-pip-version-check --no-compile -q "$@"; }

# 1. vLLM itself, no deps (its metadata pins torch==2.14.0 + CUDA packages).
pip_i --no-deps vllm==0.33.0

# 2. Import-time deps that do not declare torch (normal resolution). Each one was checked
#    by uninstall + re-import: every name below is imported (numpy/packaging/regex/tqdm also
#    come with transformers). nvidia-ml-py (module pynvml) is what `import flashinfer` needs.
pip_i packaging psutil pyzmq urllib3 regex transformers cbor2 aiohttp openai-harmony \
      openai pillow pybase64 cachetools msgspec cloudpickle uvloop py-cpuinfo \
      prometheus_client fastapi partial_json_parser llguidance einops loguru \
      numpy requests tqdm nvidia-ml-py

# 3. Deps that declare torch (and triton/CUDA packages): --no-deps.
#    xgrammar: imported by vllm at import time; compressed-tensors: by qwen3_next;
#    flashinfer-python: by prepare_static_weights_for_trtllm_fp4_moe (call time only), at the version vLLM's
#    own wheel metadata pins (0.33.0: flashinfer-python==0.7.2.post1), read there by scripts/requirement.py
#    rather than retyped, so the subject runs the FlashInfer vLLM's users run (it replaces the 0.7.4 that
#    scripts/install-cpu.sh installs for the suite); apache-tvm-ffi at the range that FlashInfer declares.
req="$(dirname "$0")/requirement.py"
flashinfer=$("$py" "$req" vllm flashinfer-python)
pip_i --no-deps xgrammar compressed-tensors "$flashinfer"
pip_i --no-deps "$("$py" "$req" flashinfer-python apache-tvm-ffi)"

FLASHINFER="$flashinfer" "$py" - <<'PY'
import os, sys, time, torch
assert torch.__version__.startswith("2.13.0") and torch.version.cuda is None, torch.__version__
t = time.time()
import vllm.model_executor.layers.fused_moe  # noqa: F401  (first: avoids a circular import)
from vllm.model_executor.layers.quantization.utils.flashinfer_utils import align_fp4_moe_weights_for_fi  # noqa: F401
from vllm.model_executor.kernels.linear.mxfp4.aiter import _asm_fp4_scale_swizzle_supported  # noqa: F401
import vllm.model_executor.layers.quantization.utils.flashinfer_fp4_moe  # noqa: F401
import vllm.model_executor.layers.fused_moe.oracle.mxfp4  # noqa: F401
import vllm.model_executor.models.qwen3_next  # noqa: F401
import flashinfer  # noqa: F401
import vllm
assert os.environ["FLASHINFER"] == f"flashinfer-python=={flashinfer.__version__}", (os.environ["FLASHINFER"], flashinfer.__version__)
print(f"vllm {vllm.__version__} + flashinfer {flashinfer.__version__} import OK in {time.time()-t:.1f}s, torch {torch.__version__}")
PY
