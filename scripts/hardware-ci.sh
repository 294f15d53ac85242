#!/usr/bin/env bash
# Nightly run of the suite on one GPU host: B200 (sm100), H200 (sm90) or MI350x (gfx950).
#   1. install this checkout with the vendor extra ([nvidia]: flashinfer-python; [amd]: amd-aiter) into a venv
#      that sees the host's torch (a CUDA or ROCm build: --system-site-packages);
#   2. check that the machine is that hardware, then run the preflight (python -m harness.preflight): every
#      kernel property's calls against the installed libraries, before any test; it stops the run with one
#      message on a mismatch or a missing library (and, with FP4_OFFLINE=1, on a JIT build or download);
#   3. pytest -n auto conformance, one worker per GPU, with --results and --junitxml;
#   4. the kernel truth tables of the kernels that run on this hardware (python -m bench.kernel_truth);
#   5. the merged report (python -m harness.report --strict), whose exit status is the run's.
# usage: scripts/hardware-ci.sh {sm100|sm90|gfx950} [RESULTS_DIR]
# environment: FP4_VENV (default .venv-hw), FP4_PROFILE (default ci), FP4_OFFLINE=1 on a host without network.
set -euo pipefail
cd "$(dirname "$0")/.."
hw="${1:-}"
case "$hw" in
  sm100 | sm90) extra=nvidia ;;
  gfx950) extra=amd ;;
  *) echo "usage: scripts/hardware-ci.sh {sm100|sm90|gfx950} [RESULTS_DIR]" >&2; exit 2 ;;
esac
results="${2:-results/hardware-$hw}"
venv="${FP4_VENV:-.venv-hw}"
export FP4_PROFILE="${FP4_PROFILE:-ci}"
mkdir -p "$results"

[ -x "$venv/bin/python" ] || python3 -m venv --system-site-packages "$venv"
py="$venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check -e ".[dev,$extra]"

reason=$("$py" -c "import sys; from harness.hardware import missing; print(missing(sys.argv[1]) or '')" "$hw")
if [ -n "$reason" ]; then
  echo "hardware-ci $hw: this host is not $hw: $reason" >&2
  exit 1
fi
preflight=(--hardware "$hw" --require-libraries)
[ "${FP4_OFFLINE:-0}" = 1 ] && preflight+=(--offline)
if ! "$py" -m harness.preflight "${preflight[@]}" >"$results/preflight.md"; then
  echo "hardware-ci $hw: preflight failed, no test was run: $(tail -n 1 "$results/preflight.md") (table: $results/preflight.md)" >&2
  exit 1
fi
tail -n 1 "$results/preflight.md"

status=0
"$py" -m pytest -n auto conformance --results "$results/conformance" \
  --junitxml "$results/conformance/junit.xml" || status=$?
case "$hw" in
  sm90) kernels=(triton-kernels-sm90 aiter-triton triton-fp8-block) ;;
  sm100) kernels=(aiter-triton triton-fp8-block) ;;
  gfx950) kernels=() ;;  # no truth-table sweep is written for the gfx950 kernels (docs/hardware-ci.md)
esac
for kernel in "${kernels[@]}"; do
  "$py" -m bench.kernel_truth --kernel "$kernel" --out "$results/truth" || status=1
done
"$py" -m harness.report "$results/report" "$results/conformance" --strict || status=1
exit "$status"
