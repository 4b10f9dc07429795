#!/usr/bin/env bash
# Builds this package and runs a core subset of its Python tests on other CPython versions, each in
# a throwaway venv with torch==2.13.0 from PyPI (issue: supported Pythons 3.10-3.13). Not part of
# `make test` (each venv downloads torch's CUDA build, about 3 GB, and compiles the engine).
# Interpreters: $PYTHONS (default: the pyenv 3.10, 3.12 and 3.13 found under ~/.pyenv/versions).
# Prints one line per version: "python X.Y: N passed" or what failed.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ -z "${PYTHONS:-}" ]; then
  PYTHONS=$(ls -d "$HOME"/.pyenv/versions/3.1[0-3]*/bin/python 2>/dev/null | grep -v "/3.11" || true)
fi
[ -n "$PYTHONS" ] || { echo "python-versions: no interpreters (set PYTHONS)" >&2; exit 1; }
TESTS=(test_roundtrip.py test_fixtures.py test_errors.py test_safetensors.py test_load_routes.py test_mmap.py)
status=0
for py in $PYTHONS; do
  version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  venv="$work/venv-$version"
  echo "python-versions: $version ($py)"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check \
    "torch==2.13.0" numpy psutil pytest safetensors nanobind scikit-build-core ninja cmake
  # A build directory of its own per version (the default build-py/ is keyed by the wheel tag).
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$venv/bin/python" -m pip install -q \
    --disable-pip-version-check --no-build-isolation --no-deps "$root"
  log="$work/pytest-$version.log"
  if (cd "$root/tests" && "$venv/bin/python" -m pytest -p no:cacheprovider -q \
        "${TESTS[@]/#/python/}" > "$log" 2>&1); then
    echo "python $version: $(tail -n 1 "$log")"
  else
    echo "python $version: FAILED"; tail -n 30 "$log"; status=1
  fi
done
exit $status
