#!/usr/bin/env bash
# `make bench`: sets up the benchmark's virtual environments, then runs bench/bench.py.
#   .venv-bench      our tensorizer (pip install . from the repo), safetensors, runai-model-streamer,
#                    matplotlib; sees the system torch (never upgraded: constraints pin it).
#   .venv-bench-ref  the reference tensorizer 2.12.1, isolated so its `import tensorizer` is the reference.
# Knobs: BENCH_SIZE_GB (default 2), BENCH_REPS (default 5), BENCH_ARGS (extra flags for bench.py),
# BENCH_SKIP_OURS=1 (do not build/install ours). Never run by `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-bench
REF_VENV=.venv-bench-ref
# pip constraints: never replace the system torch (the venvs see it through --system-site-packages).
CONSTRAINTS=$(mktemp)
trap 'rm -f "$CONSTRAINTS"' EXIT
$PY -c "import torch; print('torch==' + torch.__version__.split('+')[0])" > "$CONSTRAINTS"

# Creates a venv over the system site-packages (for torch) once; installs what is missing.
make_venv() {  # make_venv DIR PACKAGE...
  local dir=$1; shift
  [ -x "$dir/bin/python" ] || $PY -m venv --system-site-packages "$dir"
  if ! "$dir/bin/python" -c "import importlib.metadata as m, sys
for spec in sys.argv[1:]:
    name, _, want = spec.partition('==')
    have = m.version(name)
    assert not want or have == want, spec" "$@" 2>/dev/null; then
    echo "bench: installing $* into $dir"
    "$dir/bin/python" -m pip install -q -c "$CONSTRAINTS" "$@"
  fi
}

make_venv "$VENV" safetensors==0.8.0 runai-model-streamer==0.17.0 matplotlib redis hiredis
if [ -x scripts/reference-venv.sh ] && [ -z "${BENCH_OWN_REF_VENV:-}" ]; then
  # The Python engineer's helper prints the reference venv's python (or sets it up); fall back if not.
  REF_PY=$(bash scripts/reference-venv.sh 2>/dev/null | tail -n 1 || true)
  [ -n "$REF_PY" ] && [ -x "$REF_PY" ] && [ "$("$REF_PY" -c 'import importlib.metadata as m
print(m.version("tensorizer"))' 2>/dev/null)" = 2.12.1 ] || REF_PY=""
fi
if [ -z "${REF_PY:-}" ]; then
  make_venv "$REF_VENV" "tensorizer==2.12.1"
  REF_PY=$REF_VENV/bin/python
fi

# Ours: built from this checkout into the bench venv (incremental build dir, so re-runs are quick).
OURS_FLAG=()
if [ -z "${BENCH_SKIP_OURS:-}" ] && [ -f pyproject.toml ]; then
  echo "bench: building and installing our tensorizer into $VENV"
  if ! CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} "$VENV/bin/python" -m pip install -q --no-build-isolation -c "$CONSTRAINTS" \
       -C build-dir=build-bench/{wheel_tag} . ; then
    echo "bench: WARNING: could not build our tensorizer; ours is reported as missing" >&2
    OURS_FLAG=(--no-ours)
  fi
else
  echo "bench: no pyproject.toml (or BENCH_SKIP_OURS): ours is reported as missing"
  OURS_FLAG=(--no-ours)
fi

"$VENV/bin/python" bench/bench.py --ref-python "$REF_PY" "${OURS_FLAG[@]}" ${BENCH_ARGS:-}
# Scale-out: 1, 2 and 4 ranks loading one file over a bandwidth-capped HTTP proxy (bench/scaleout.py).
if [ -z "${BENCH_SKIP_SCALEOUT:-}" ] && [ ${#OURS_FLAG[@]} -eq 0 ]; then
  "$VENV/bin/python" bench/scaleout.py
fi
