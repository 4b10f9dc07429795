"""Shared helpers for the Python tests: fixture files and manifests, raw tensor bytes, and the
reference tensorizer in .venv-ref (run as a subprocess)."""

import contextlib
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import time

import pytest
import torch

REPO = pathlib.Path(__file__).resolve().parents[2]
FIXTURES_ROOT = REPO / "tests" / "fixtures"
REF_PYTHON = REPO / ".venv-ref" / "bin" / "python"
REF_TOOL = pathlib.Path(__file__).resolve().parent / "reference_tool.py"


def fixture_sets():
    """[(directory, manifest dict)] for every fixture set under tests/fixtures."""
    return [(m.parent, json.loads(m.read_text())) for m in sorted(FIXTURES_ROOT.glob("*/manifest.json"))]


def fixture_files():
    """[(path, manifest entry)] for every fixture file."""
    out = []
    for directory, manifest in fixture_sets():
        for name, info in manifest["files"].items():
            out.append((directory / name, info))
    return out


def save_state_dict(path, sd) -> pathlib.Path:
    """Writes `sd` to `path` with our TensorSerializer; returns the path."""
    from tensorizer import TensorSerializer

    with TensorSerializer(str(path)) as s:
        s.write_state_dict(sd)
    return pathlib.Path(path)


@contextlib.contextmanager
def fault_proxy(script, url, actions, tmp_path):
    """tests/tools/fault_proxy.py in front of the server of `url` (http://host:port/...), applying
    `actions`; yields (the proxy's http://127.0.0.1:port, the path of its log)."""
    port_file, log = tmp_path / "proxy-port", tmp_path / "proxy-log"
    upstream = url.split("://", 1)[1].split("/", 1)[0]
    proxy = subprocess.Popen(
        [sys.executable, script, "--upstream", upstream, "--actions", actions]
        + ["--port-file", str(port_file), "--log", str(log)]
    )
    try:
        for _ in range(200):
            if port_file.exists() and port_file.read_text().strip():
                break
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port_file.read_text().strip()}", log
    finally:
        proxy.terminate()
        proxy.wait()


def tensor_bytes(t: torch.Tensor) -> bytes:
    """The C-contiguous little-endian bytes of a tensor (what .tensors stores)."""
    t = t.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def manifest_name(name):
    """A manifest tensor name as the deserializer reports it (str, or a tuple)."""
    return name if isinstance(name, str) else tuple(name)


def decryption_for(path: pathlib.Path, info: dict):
    from tensorizer import DecryptionParams

    enc = info.get("encryption")
    if not enc:
        return None
    if "key_file" in enc:
        return DecryptionParams.from_key((path.parent / enc["key_file"]).read_bytes())
    return DecryptionParams.from_string(enc["passphrase"])


@pytest.fixture(scope="session")
def reference():
    """Runs reference_tool.py under the reference tensorizer; returns its JSON output."""
    if not REF_PYTHON.exists():
        if os.environ.get("TZ_REQUIRE_REFERENCE"):
            pytest.fail(f"{REF_PYTHON} is missing: run scripts/reference-venv.sh")
        pytest.skip("no reference venv (scripts/reference-venv.sh creates it)")

    def run(*args):
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
        proc = subprocess.run(
            [str(REF_PYTHON), str(REF_TOOL), *map(str, args)],
            capture_output=True,
            text=True,
            env=env,
            cwd=str(REF_TOOL.parent.parent),
            timeout=600,
        )
        if proc.returncode != 0:
            raise AssertionError(f"reference tool {args} failed:\n{proc.stderr[-4000:]}")
        return json.loads(proc.stdout)

    return run
