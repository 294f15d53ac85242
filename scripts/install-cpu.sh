#!/usr/bin/env bash
# Install fp4-conformance into ./.venv on a CPU machine (no GPU, no multi-GB CUDA torch).
#   torch 2.13.0 CPU build (on this workplace's disk; elsewhere: --index-url https://download.pytorch.org/whl/cpu)
#   flashinfer-python 0.7.4 without its CUDA-only dependencies: its pure-torch layout helpers run on CPU.
# usage: scripts/install-cpu.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-.venv}"
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
pip=("$venv/bin/python" -m pip install -q --disable-pip-version-check)
"${pip[@]}" "torch==2.13.0" || "${pip[@]}" "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
"${pip[@]}" -e ".[dev]"
"${pip[@]}" --no-deps "flashinfer-python==0.7.4" "apache-tvm-ffi>=0.1.11,<0.2"
"${pip[@]}" numpy einops packaging requests tabulate tqdm click ninja nvidia-ml-py
"$venv/bin/python" -c "import torch, flashinfer.utils; print('torch', torch.__version__, '| flashinfer', __import__('flashinfer').__version__)"
