#!/usr/bin/env bash
# The suite as an engine's CI uses it: installed with `pip install .` (no -e) into a fresh venv, then run from an
# unrelated folder (no checkout, no PYTHONPATH) through pytest's entry point: every property collects (the same
# tests as the checkout) and passes its pins and 3 generated examples, the README's external subject
# (`--subject my_fp4_engine:SUBJECT`, imported from that folder) passes them too, and the same subject padding gated layers to 16 fails with a reproduction line and
# script that, run as pasted from that folder, raise the same error.
# usage: scripts/check-installed.sh [VENV_DIR]   (default: a new temporary folder; an existing venv is reused)
# The checkout's own .venv (scripts/install-cpu.sh) lists the tests the installed copy must collect.
set -euo pipefail
cd "$(dirname "$0")/.."
checkout=$(pwd)
venv="${1:-$(mktemp -d)/venv}"
scripts/install-cpu.sh "$venv" --copy
python="$(cd "$venv" && pwd)/bin/python"
work=$(mktemp -d)
export FP4_PROFILE=ci

ids() { grep '::' | sed 's|^[^:]*/||' | sort; }  # node ids, without the folders before the module
diff <(.venv/bin/python -m pytest conformance --collect-only -q -p no:cacheprovider | ids) \
  <(cd "$work" && "$python" -m pytest --pyargs conformance --collect-only -q -p no:cacheprovider | ids) \
  || { echo "the installed copy collects other tests than the checkout" >&2 && exit 1; }

cd "$work"
# every property runs from the installed copy on its pins and 3 generated examples (the smoke profile): this
# checks the package (modules, data files, plugin), the checkout's run above searches
FP4_PROFILE=smoke "$python" -m pytest --pyargs conformance -p no:cacheprovider -n 2 --strict-markers

# the README's external subject, saved in this folder, and its copy padding gated layers to 16
awk '/<!-- readme-test: my_fp4_engine.py -->/ {on = 1; next} on && /^```python/ {code = 1; next}
     code && /^```/ {exit} code' "$checkout/README.md" >my_fp4_engine.py
sed 's/64 if gated else 128/16 if gated else 128/' my_fp4_engine.py >my_fp4_engine_pad16.py
# (smoke as well: the checkout's tests/test_readme.py searches with this subject under the ci profile)
FP4_PROFILE=smoke "$venv/bin/pytest" --pyargs conformance.test_nvfp4_moe -p no:cacheprovider --strict-markers \
  --subject my_fp4_engine:SUBJECT --backend flashinfer-trtllm
set +e
"$venv/bin/pytest" --pyargs conformance.test_nvfp4_moe -p no:cacheprovider --strict-markers \
  --subject my_fp4_engine_pad16:SUBJECT --backend flashinfer-trtllm -k backend_accepts --results pad16 >pad16.log
status=$?
set -e
[ "$status" = 1 ] || { cat pad16.log && echo "the gated-pad-16 subject did not fail (exit $status)" >&2 && exit 1; }
line=$(awk -v p="$python -m harness.repro " 'index($0, p) == 1 {print; exit}' pad16.log)
script=$(sed -n 's/^script: //p' pad16.log | head -1)
[ -n "$line" ] && [ -n "$script" ] || { cat pad16.log && echo "no reproduction line or script printed" >&2 && exit 1; }
expected='must be a multiple of 128'
for run in "$line" "$python $script"; do
  echo "reproduce: $run"
  if out=$(bash -c "$run" 2>&1); then echo "$out" && echo "the reproduction passed" >&2 && exit 1; fi
  grep -q -- "$expected" <<<"$out" || { echo "$out" && echo "the reproduction raised another error" >&2 && exit 1; }
done
echo "installed copy: properties, external subject and reproductions as in the checkout"
