#!/usr/bin/env bash
# Runs the reference project's own test suite (tests/ of the tensorizer 2.12.1 source
# distribution from PyPI) against this project's installed package, offline, and prints the
# outcome of every test. Not part of `make test` (it downloads the sdist and takes minutes).
#
# Offline stand-ins: its tests load "EleutherAI/gpt-neo-125M" from the Hugging Face hub; a model
# of that architecture and size with random weights is put in a temporary hub cache under that
# name. What still cannot pass here: tests that fetch a README from GitHub, need a GPU, mock S3
# with moto's pre-5.0 in-process API (it patches boto3, which our engine does not use), or read
# the reference's private modules (test_syscalls.py, skipped).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
$PY -m pip download -q --disable-pip-version-check --no-deps --no-binary :all: tensorizer==2.12.1 -d "$work"
tar xzf "$work"/tensorizer-2.12.1.tar.gz -C "$work"
export HF_HUB_CACHE="$work/hub" HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
$PY - "$HF_HUB_CACHE" <<'PYEOF'
import os, sys, torch
from transformers import GPTNeoConfig, GPTNeoForCausalLM
repo = os.path.join(sys.argv[1], "models--EleutherAI--gpt-neo-125M")
revision = "0" * 40
os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
with open(os.path.join(repo, "refs", "main"), "w") as f:
    f.write(revision)
config = GPTNeoConfig(hidden_size=768, num_layers=12, num_heads=12, vocab_size=50257,
                      attention_types=[[["global", "local"], 6]], max_position_embeddings=2048,
                      window_size=256)
torch.manual_seed(0)
GPTNeoForCausalLM(config).save_pretrained(os.path.join(repo, "snapshots", revision))
PYEOF
cd "$work/tensorizer-2.12.1/tests"  # its tests import `tensorizer`: the installed one, ours
$PY -m pytest -p no:cacheprovider -q -rA --ignore=test_syscalls.py "$@" |
  grep -E "^(PASSED|FAILED|ERROR|SKIPPED)|(passed|failed).* in [0-9.]+s" || true
