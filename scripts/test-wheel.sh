#!/usr/bin/env bash
# make test-wheel: the wheel as users get it. Builds it (scripts/build-wheel.sh), checks it with
# `auditwheel show` (manylinux-consistent) and installs it into a throwaway venv that has only
# torch and numpy (and the wheel's own dependencies), outside the source tree; there,
# tests/wheel/smoke.py checks that every library the extension and the command load resolves
# inside the wheel or to the base system, then saves, loads, verifies with the CLI and loads over
# HTTP, S3 and Redis (servers from scripts/with-servers.sh).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
py=${PY:-python3}
wheel=$(bash "$root/scripts/build-wheel.sh" | tail -n 1)
echo "test-wheel: $wheel ($(du -h "$wheel" | cut -f1))"
# Printed with echo, not `tee /dev/stderr`: tee would reopen (and truncate) a log file on stderr.
report=$("$py" -m auditwheel show "$wheel")
echo "$report"
echo "$report" | tr -s ' \n' ' ' | grep -q 'consistent with the following platform tag: "manylinux_' \
  || { echo "test-wheel: auditwheel does not call $wheel manylinux-consistent" >&2; exit 1; }
venv=$(mktemp -d "${TMPDIR:-/tmp}/tz-wheel-venv.XXXXXX")
trap 'rm -rf "$venv"' EXIT
"$py" -m venv "$venv"
torch_version=$("$py" -c 'import torch; print(torch.__version__.split("+")[0])')
"$venv/bin/pip" install -q "torch==$torch_version" numpy
start=$(date +%s%N)
"$venv/bin/pip" install -q "$wheel"
echo "test-wheel: pip install of the wheel took $(( ($(date +%s%N) - start) / 1000000 )) ms"
cd "$venv"  # nothing of the source tree is importable from here
bash "$root/scripts/with-servers.sh" "$venv/bin/python" "$root/tests/wheel/smoke.py"
