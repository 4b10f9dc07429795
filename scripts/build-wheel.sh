#!/usr/bin/env bash
# make wheel: a self-contained binary wheel in dist/. Builds the wheel with pip (scikit-build-core,
# the build tools install-deps.sh put in place), then `auditwheel repair` copies every shared
# library the extension and the `tensorizer` command need, beyond what the manylinux policy lets a
# wheel take from the base system, into the wheel (tensorizer.libs/) and tags it with the
# manylinux tag of this machine's glibc. Prints the wheel's path last.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
py=${PY:-python3}
raw=$(mktemp -d "${TMPDIR:-/tmp}/tz-wheel.XXXXXX")
trap 'rm -rf "$raw"' EXIT
"$py" -m pip wheel . --no-build-isolation --no-deps -w "$raw" >&2
mkdir -p dist
rm -f dist/tensorizer-*.whl
"$py" -m auditwheel repair "$raw"/tensorizer-*.whl -w dist >&2
ls dist/tensorizer-*manylinux*.whl
