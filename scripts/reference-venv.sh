#!/usr/bin/env bash
# Creates .venv-ref: a virtual environment with the reference tensorizer==2.12.1 from PyPI, used
# by the interoperability tests (tests/python/test_interop.py) as a subprocess. It reuses the
# machine's torch==2.13.0 (--system-site-packages, no download); the venv's own site-packages
# come first on sys.path, so its tensorizer shadows this project's. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
VENV=${REFERENCE_VENV:-.venv-ref}
REF_VERSION=2.12.1

ok() {
  "$VENV/bin/python" - "$REF_VERSION" <<'EOF' 2>/dev/null
import importlib.metadata, os, sys
import tensorizer, torch
assert importlib.metadata.version("tensorizer") == sys.argv[1]
assert os.path.realpath(tensorizer.__file__).startswith(os.path.realpath(sys.prefix)), tensorizer.__file__
assert torch.__version__.split("+")[0] == "2.13.0", torch.__version__
EOF
}

if [ -x "$VENV/bin/python" ] && ok; then
  exit 0
fi

echo "reference-venv: creating $VENV (tensorizer==$REF_VERSION over the installed torch)"
rm -rf "$VENV"
"$PY" -m venv --system-site-packages "$VENV"
constraints=$(mktemp)
trap 'rm -f "$constraints"' EXIT
echo "torch==2.13.0" > "$constraints"
# --ignore-installed puts the reference into the venv even though this project's package (also
# named tensorizer) may be installed system-wide; --no-deps keeps pip away from torch.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --ignore-installed \
  "tensorizer==$REF_VERSION"
# Its other requirements, satisfied from the system site-packages where possible.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -c "$constraints" \
  "numpy>=1.19.5" "protobuf>=3.19.5" "psutil>=5.9.4" "boto3>=1.26.0" "redis>=4.5.5" \
  "hiredis>=2.2.0" "libnacl>=2.1.0"
ok || { echo "reference-venv: $VENV does not import the reference tensorizer $REF_VERSION" >&2; exit 1; }
echo "reference-venv: ready"
