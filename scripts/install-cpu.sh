#!/usr/bin/env bash
# Install fp4-conformance into ./.venv on a CPU machine (no GPU, no multi-GB CUDA torch).
#   torch 2.13.0 CPU build (from the configured package index, else from https://download.pytorch.org/whl/cpu)
#   flashinfer-python 0.7.4 without its CUDA-only dependencies: its pure-torch layout helpers run on CPU
#   (scripts/install-vllm-cpu.sh and install-sglang-cpu.sh then replace it with the version their engine pins).
#   amd-aiter 0.1.7.post2.dev18 (PyPI's only release, pure Python) without its ROCm JIT dependencies:
#   adapters/aiter_triton.py loads its pure-torch helpers without ROCm; its fp4_utils imports Triton
#   (triton 3.6.0, the H200's; it only imports on CPU).
# usage: scripts/install-cpu.sh [VENV_DIR] [--copy]
#   --copy: install a copy of the suite (`pip install .`, as an engine's CI does) instead of `pip install -e .[dev]`
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
case "${2:-}" in
  "") suite=(-e ".[dev]") ;;
  --copy) suite=(.) ;;
  *) echo "usage: scripts/install-cpu.sh [VENV_DIR] [--copy]" >&2 && exit 2 ;;
esac
# FP4_SEED_VENV=DIR (.ci/run sets it to the checkout's .venv once that is installed): a new venv starts from DIR's
# packages (scripts/seed-venv.sh), so the pins below are already satisfied and torch is not unpacked again;
# a copy (--copy) then drops what only the dev extra installs.
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  if [ -n "${FP4_SEED_VENV:-}" ]; then
    scripts/seed-venv.sh "$FP4_SEED_VENV" "$venv"
    if [ "${2:-}" = --copy ]; then
      mapfile -t dev_only < <("$FP4_SEED_VENV/bin/python" scripts/extra_only.py dev)
      "$venv/bin/python" -m pip uninstall -q -y "${dev_only[@]}"
    fi
  fi
fi
# --no-compile (here and in the engines' scripts): pip would compile every module of every wheel, most never imported
# (installing torch 2.13.0: 18.9 s with, 6.5 s without on the 2-core machine); Python compiles what a run imports
# on its first import and keeps it (about 1.4 s for torch's)
pip=("$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check)
# the kernel libraries without their dependencies (none of them torch's or the suite's) install beside torch and the
# suite (on 2 cores about 10 s sooner)
"${pip[@]}" --no-deps "flashinfer-python==0.7.4" "apache-tvm-ffi>=0.1.11,<0.2" "amd-aiter==0.1.7.post2.dev18" \
  "triton==3.6.0" &
kernels=$!
"${pip[@]}" "torch==2.13.0" || "${pip[@]}" "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
# building the suite writes into the checkout (fp4_conformance.egg-info, and build/ for a copy): one build at a time
# when several venvs install at once (.ci/run installs the engines' in the background); a copy first empties build/,
# setuptools' staging folder, whose stale modules would be installed too
lock="${TMPDIR:-/tmp}/fp4-conformance-build.lock"
if [ "${2:-}" = --copy ]; then
  flock "$lock" bash -c 'rm -rf build && "$@"' _ "${pip[@]}" "${suite[@]}"
else
  flock "$lock" "${pip[@]}" "${suite[@]}"
fi
wait "$kernels"
"${pip[@]}" numpy einops packaging requests tabulate tqdm click ninja nvidia-ml-py
"$venv/bin/python" -c "import torch, flashinfer.utils; print('torch', torch.__version__, '| flashinfer', __import__('flashinfer').__version__)"
"$venv/bin/python" -c "from adapters import aiter_triton as a; print('amd-aiter', a.install().version, '| fp4_utils', a.aiter_module(a.FP4_UTILS).__name__)"
