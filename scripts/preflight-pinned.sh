#!/usr/bin/env bash
# Preflight against the FlashInfer that vLLM 0.33.0 pins (flashinfer-python 0.7.2.post1), on CPU.
#   Builds a venv (default /tmp/pf-fi072) with torch 2.13.0 CPU as scripts/install-cpu.sh installs it,
#   this checkout editable, flashinfer-python 0.7.2.post1 and amd-aiter 0.1.7.post2.dev18 without their
#   GPU dependencies, then runs `python -m harness.preflight` for every hardware target (the three at once).
#   An existing venv that holds those pins (vLLM's, scripts/install-vllm-cpu.sh) is used as it is; another
#   existing one gets them installed; with FP4_SEED_VENV set, a new one starts from that venv's packages
#   (scripts/seed-venv.sh) instead of installing torch again.
# usage: scripts/preflight-pinned.sh [VENV_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${1:-/tmp/pf-fi072}"
# the preflight imports this checkout's modules (it runs in the checkout), so the venv needs only the pins
holds_pins() {
  "$venv/bin/python" - <<'PY' 2>/dev/null
import importlib.metadata as m, sys
pins = {"flashinfer-python": "0.7.2.post1", "amd-aiter": "0.1.7.post2.dev18", "torch": "2.13.0+cpu"}
sys.exit(0 if all(m.version(name) == version for name, version in pins.items()) else 1)
PY
}
if [ -x "$venv/bin/python" ] && holds_pins; then
  echo "preflight-pinned: $venv holds flashinfer-python 0.7.2.post1 and amd-aiter 0.1.7.post2.dev18, used as it is"
else
  if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    # FP4_SEED_VENV: start from that venv's packages, as scripts/install-cpu.sh does
    [ -z "${FP4_SEED_VENV:-}" ] || scripts/seed-venv.sh "$FP4_SEED_VENV" "$venv"
  fi
  pip=("$venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check)
  "${pip[@]}" "torch==2.13.0" || "${pip[@]}" "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
  flock "${TMPDIR:-/tmp}/fp4-conformance-build.lock" "${pip[@]}" -e .  # one build at a time (scripts/install-cpu.sh)
  "${pip[@]}" --no-deps "flashinfer-python==0.7.2.post1" "apache-tvm-ffi>=0.1.11,<0.2"
  "${pip[@]}" numpy einops packaging requests tabulate tqdm click ninja nvidia-ml-py
  "${pip[@]}" --no-deps "amd-aiter==0.1.7.post2.dev18" "triton==3.6.0"
fi
# the three targets at once (each one process on one core), their reports in this order
out=$(mktemp -d) pids=()
for hw in sm100 sm90 gfx950; do
  "$venv/bin/python" -m harness.preflight --hardware "$hw" >"$out/$hw" 2>&1 &
  pids+=("$!")
done
status=0
for i in 0 1 2; do wait "${pids[$i]}" || status=1; done
cat "$out/sm100" "$out/sm90" "$out/gfx950"
exit "$status"
