#!/usr/bin/env bash
# Python tests (`make test-python`): builds and installs the package with pip (scikit-build-core,
# incremental build in build-py/), prepares the reference venv for the interop tests, then runs
# pytest on tests/python. Fails when pytest fails or collects no test.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
export CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}

echo "test-python: pip install . (engine + nanobind extension + tensorizer command)"
# --no-build-isolation: use the installed scikit-build-core/nanobind (scripts/install-deps.sh);
# --no-deps: never let pip touch torch.
$PY -m pip install -q --disable-pip-version-check --no-build-isolation --no-deps .

bash scripts/reference-venv.sh

# Run from outside the checkout so `import tensorizer` is the installed package.
export TZ_REQUIRE_REFERENCE=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
rc=0
(cd tests && $PY -m pytest -p no:cacheprovider -ra "$@" python) || rc=$?
if [ "$rc" -eq 5 ]; then
  echo "test-python: pytest collected no tests" >&2
  exit 1
fi
exit "$rc"
