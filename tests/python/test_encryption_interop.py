"""Encryption interoperability with the reference tensorizer 2.12.1 (run from .venv-ref through the
`reference` fixture), beyond test_interop.py: tensors on every side of the 2 MiB chunk boundaries,
meta and zero-length tensors in encrypted files, files encrypted and decrypted by the `tensorizer
encrypt` / `decrypt` commands, and a flipped ciphertext byte in one of our files, which the
reference must reject. The reference always reads with verify_hash=True."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from interop_data import describe, patterned
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer

pytestmark = pytest.mark.slow

MIB = 1 << 20


def _cli():
    here = Path(sys.executable).parent / "tensorizer"
    path = str(here) if here.exists() else shutil.which("tensorizer")
    if not path:
        pytest.fail("the tensorizer command is not installed (pip install . installs it)")
    return path


def run_cli(*args, env_extra=None):
    import os

    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run([_cli(), *map(str, args)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, f"tensorizer {args[0]} failed:\n{proc.stdout}\n{proc.stderr}"


def essentials(listing):
    """name -> (dtype, shape, sha256): what must agree between the two implementations."""
    return {k: (v["dtype"], v["shape"], v["sha256"]) for k, v in listing.items() if not k.startswith("__")}


def boundary_tensors():
    """uint8 tensors on each side of the chunk boundaries, a multi-chunk bf16, a zero-length and a
    meta tensor (so the file is data version 4 with the encrypted flag)."""
    sd = {
        f"u8_{n}": patterned(torch.uint8, (n,), i)
        for i, n in enumerate((1, 2 * MIB - 1, 2 * MIB, 2 * MIB + 1, 6 * MIB, 6 * MIB + 5))
    }
    sd["bf16_multi"] = patterned(torch.bfloat16, (3 * MIB,), 50)
    sd["empty"] = torch.zeros(0, 4)
    sd["ghost"] = torch.empty(3, 2, device="meta")
    expected = {k: describe(torch.zeros(3, 2) if k == "ghost" else v) for k, v in sd.items()}
    return sd, expected


@pytest.mark.parametrize("kind", ["key", "pass"])
def test_our_chunk_boundaries_and_meta_load_in_reference(reference, tmp_path, kind):
    sd, expected = boundary_tensors()
    if kind == "key":
        enc = EncryptionParams.random()
        secret, dec = f"key:{enc.key.hex()}", DecryptionParams.from_key(enc.key)
    else:
        enc = EncryptionParams.from_string("b0undary", EncryptionParams.OpsLimit.MIN, EncryptionParams.MemLimit.MIN)
        secret, dec = "pass:b0undary", DecryptionParams.from_string("b0undary")
    path = tmp_path / "boundaries.tensors"
    with TensorSerializer(str(path), encryption=enc) as s:
        s.write_state_dict(sd)
    got = reference("read", path, secret)
    assert got["__version__"] == 4
    assert essentials(got) == essentials(expected)
    with TensorDeserializer(str(path), encryption=dec, verify_hash=True, device="cpu") as d:
        assert {k: describe(d[k])["sha256"] for k in d.keys()} == {k: v["sha256"] for k, v in expected.items()}


@pytest.fixture(scope="module")
def reference_written(reference, tmp_path_factory):
    directory = tmp_path_factory.mktemp("ref-written-enc")
    return directory, reference("write", directory)


@pytest.mark.parametrize("name", ["dtypes.tensors", "nested.tensors", "module.tensors", "meta.tensors"])
def test_cli_encrypted_reference_files_load_in_reference(reference, reference_written, tmp_path, name):
    directory, manifest = reference_written
    key = bytes(range(32))
    (tmp_path / "k.key").write_bytes(key)
    enc_key, enc_pass = tmp_path / ("key-" + name), tmp_path / ("pass-" + name)
    run_cli("encrypt", "-q", directory / name, enc_key, "--key-file", tmp_path / "k.key")
    run_cli(
        "encrypt",
        "-q",
        directory / name,
        enc_pass,
        "--passphrase-env",
        "TZ_INTEROP_PASS",
        "--opslimit",
        "min",
        "--memlimit",
        "min",
        env_extra={"TZ_INTEROP_PASS": "cli pass"},
    )
    expected = essentials(manifest[name]["tensors"])
    assert essentials(reference("read", enc_key, f"key:{key.hex()}")) == expected
    assert essentials(reference("read", enc_pass, "pass:cli pass")) == expected


@pytest.mark.parametrize("name", ["enc_key.tensors", "enc_pass.tensors"])
def test_cli_decrypts_reference_encrypted_files(reference, reference_written, tmp_path, name):
    directory, manifest = reference_written
    spec = manifest[name]["encryption"]
    plain = tmp_path / "plain.tensors"
    if "key_hex" in spec:
        (tmp_path / "k.key").write_bytes(bytes.fromhex(spec["key_hex"]))
        run_cli("decrypt", "-q", directory / name, plain, "--key-file", tmp_path / "k.key")
    else:
        run_cli(
            "decrypt",
            "-q",
            directory / name,
            plain,
            "--passphrase-env",
            "TZ_INTEROP_PASS",
            env_extra={"TZ_INTEROP_PASS": spec["passphrase"]},
        )
    assert essentials(reference("read", plain)) == essentials(manifest[name]["tensors"])


def test_reference_rejects_a_flipped_byte_in_our_ciphertext(reference, tmp_path):
    enc = EncryptionParams.random()
    path = tmp_path / "flip.tensors"
    big = patterned(torch.uint8, (3 * MIB,), 77)
    with TensorSerializer(str(path), encryption=enc) as s:
        s.write_state_dict({"big": big})
    # The only tensor's data ends right before the 8-byte end marker.
    data_offset = path.stat().st_size - 8 - big.numel()
    raw = bytearray(path.read_bytes())
    raw[data_offset + 2 * MIB + 1] ^= 0x01  # in the second chunk
    path.write_bytes(bytes(raw))
    with pytest.raises(AssertionError, match="Tensor decryption failed|CryptographyError"):
        reference("read", path, f"key:{enc.key.hex()}")
