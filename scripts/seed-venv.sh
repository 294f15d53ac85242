#!/usr/bin/env bash
# Start a new venv from another venv's installed packages: hard links (a copy where links cannot be made) of
# SEED's site-packages, without the suite's own install (editable or copied) and without pip and setuptools
# (the new venv has its own), then pytest's console scripts for the new interpreter.
# scripts/install-cpu.sh then finds torch 2.13.0 and every other pin already satisfied, and installs only
# the suite (editable, or `pip install .` with --copy) and what differs: the ~2.7 GB of torch 2.13.0 CPU and
# its dependencies are not unpacked again. pip removes a package by unlinking its files and writes new files
# for an upgrade, so neither venv's changes reach the other's files.
# usage: scripts/seed-venv.sh SEED_VENV NEW_VENV   (NEW_VENV: made with `python -m venv`, nothing installed yet)
set -euo pipefail
seed="$1" venv="$2"
src=$(cd "$seed" && echo "$(pwd)"/lib/python3*/site-packages)
dst=$(cd "$venv" && echo "$(pwd)"/lib/python3*/site-packages)
[ -d "$src" ] && [ -d "$dst" ] || { echo "no site-packages in $seed or $venv" >&2 && exit 2; }
[ "$(basename "$(dirname "$src")")" = "$(basename "$(dirname "$dst")")" ] \
  || { echo "$seed and $venv run different Python versions" >&2 && exit 2; }
# the suite's own files, editable or copied: the top-level entries its RECORD lists
suite=$(cut -d, -f1 "$src"/fp4_conformance-*.dist-info/RECORD 2>/dev/null | cut -d/ -f1 | sort -u)
for entry in "$src"/*; do
  name=$(basename "$entry")
  grep -qxF -- "$name" <<<"$suite" && continue
  case "$name" in
    fp4_conformance-*.dist-info | pip | pip-*.dist-info | setuptools | setuptools-*.dist-info | _distutils_hack \
      | distutils-precedence.pth | __pycache__ ) continue ;;
  esac
  cp -al "$entry" "$dst/" 2>/dev/null || cp -a "$entry" "$dst/"
done
pytest_version=$("$venv/bin/python" -c "import importlib.metadata as m; print(m.version('pytest'))")
"$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "pytest==$pytest_version"
