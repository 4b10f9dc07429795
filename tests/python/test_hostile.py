"""Hostile files: costs bounded by what the user asked for, and errors a user can catch.

One crafted file per failure class: an encrypted file asking for more Argon2id work than the
reader allows, a tiny file declaring a 16 GiB meta tensor, names and dtypes that are not text.
(Misbehaving servers are in test_stalls.py, interrupted loads in test_interrupts.py.)
"""

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tensorizer import CryptographyError, TensorDeserializer, TensorSerializer
from tensorizer.serialization import DecryptionParams, EncryptionParams


def write(path, tensors, encryption=None):
    s = TensorSerializer(str(path), encryption=encryption)
    s.write_state_dict(tensors)
    s.close()
    return path


# -- Argon2id cost ---------------------------------------------------------------------------


@pytest.fixture
def costly_file(tmp_path):
    """Encrypted from a passphrase with opslimit 5: one pass above the SENSITIVE preset (cheap here
    because memlimit is the minimum, so every test below runs in milliseconds)."""
    params = EncryptionParams.from_string("pw", opslimit=5, memlimit=8192)
    return write(tmp_path / "costly.tensors", {"a": torch.arange(10)}, params)


def test_kdf_cost_above_the_cap_is_refused_naming_the_cost_and_the_knobs(costly_file, monkeypatch):
    monkeypatch.delenv("TENSORIZER_MAX_KDF_OPSLIMIT", raising=False)
    monkeypatch.delenv("TENSORIZER_MAX_KDF_MEMLIMIT", raising=False)
    with pytest.raises(CryptographyError) as e:
        TensorDeserializer(costly_file, encryption=DecryptionParams.from_string("pw"))
    msg = str(e.value)
    assert "costly.tensors" in msg
    assert "opslimit 5, memlimit 8192 bytes" in msg
    assert "opslimit 4, memlimit 1073741824 bytes" in msg
    assert "max_opslimit" in msg and "TENSORIZER_MAX_KDF_OPSLIMIT" in msg


def test_kdf_cap_is_raised_by_the_argument_or_the_environment(costly_file, monkeypatch):
    d = TensorDeserializer(costly_file, encryption=DecryptionParams.from_string("pw", max_opslimit=5))
    assert torch.equal(d["a"], torch.arange(10))
    monkeypatch.setenv("TENSORIZER_MAX_KDF_OPSLIMIT", "5")
    d = TensorDeserializer(costly_file, encryption=DecryptionParams.from_string("pw"))
    assert torch.equal(d["a"], torch.arange(10))
    # Lowering the memory cap below the file's 8 KiB refuses it again.
    monkeypatch.setenv("TENSORIZER_MAX_KDF_MEMLIMIT", "4096")
    with pytest.raises(CryptographyError, match="memlimit 8192 bytes"):
        TensorDeserializer(costly_file, encryption=DecryptionParams.from_string("pw"))


def test_bad_kdf_caps_are_value_errors(costly_file, monkeypatch):
    with pytest.raises(ValueError, match="max_memlimit"):
        DecryptionParams.from_string("pw", max_memlimit=0)
    monkeypatch.setenv("TENSORIZER_MAX_KDF_OPSLIMIT", "lots")
    with pytest.raises(ValueError, match="TENSORIZER_MAX_KDF_OPSLIMIT must be a whole number"):
        TensorDeserializer(costly_file, encryption=DecryptionParams.from_string("pw"))


def test_every_preset_loads_under_the_default_cap(tmp_path):
    params = EncryptionParams.from_string(
        "pw", opslimit=EncryptionParams.OpsLimit.SENSITIVE, memlimit=EncryptionParams.MemLimit.MIN
    )
    path = write(tmp_path / "sensitive.tensors", {"a": torch.ones(3)}, params)
    assert torch.equal(TensorDeserializer(path, encryption=DecryptionParams.from_string("pw"))["a"], torch.ones(3))


# -- Declared sizes --------------------------------------------------------------------------

META_CHILD = textwrap.dedent(
    """
    import resource, sys, torch
    from tensorizer import TensorDeserializer
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d = TensorDeserializer(sys.argv[1])
    big = d["big"]
    assert big.shape == (8, 1 << 30) and big.dtype == torch.float16, (big.shape, big.dtype)
    assert float(big[0, 0]) == 0 and float(big[7, -1]) == 0 and float(big[3, 12345]) == 0
    assert torch.equal(d["small"], torch.arange(3.0))
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """
)


def test_a_16_gib_meta_tensor_commits_no_memory(tmp_path):
    path = write(
        tmp_path / "meta.tensors",
        {"big": torch.empty((8, 1 << 30), dtype=torch.float16, device="meta"), "small": torch.arange(3.0)},
    )
    assert path.stat().st_size < 1 << 20
    out = subprocess.run([sys.executable, "-c", META_CHILD, str(path)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout) < 100, f"peak RSS grew by {out.stdout.strip()} MiB"


# -- Names and dtypes that are not text ------------------------------------------------------


@pytest.fixture
def named_file(tmp_path):
    return write(tmp_path / "names.tensors", {"zq7": torch.arange(4.0), "ok": torch.ones(2)})


def patched(path, old, new):
    out = path.with_name("patched.tensors")
    data = path.read_bytes()
    assert data.count(old) == 2  # the index entry and the tensor's own header
    out.write_bytes(data.replace(old, new))
    return out


def test_a_name_that_is_not_utf8_is_a_value_error_naming_file_and_entry(named_file):
    bad = patched(named_file, b"zq7", b"z\xff7")
    with pytest.raises(ValueError) as e:
        TensorDeserializer(bad)
    assert str(e.value) == f"'{bad}': index entry 0 ('z\\xff7'): the tensor name is not valid UTF-8"


def test_a_dtype_that_is_not_ascii_is_a_value_error_naming_file_and_entry(named_file):
    data = named_file.read_bytes()
    bad = named_file.with_name("dtype.tensors")
    bad.write_bytes(data.replace(b"<f4", b"<\xff4"))
    with pytest.raises(ValueError) as e:
        TensorDeserializer(bad)
    assert str(e.value) == (
        f"'{bad}': index entry 0 ('zq7'): invalid dtype string '<\\xff4': a byte that is not printable ASCII"
    )


def test_a_nul_in_a_name_loads_and_errors_about_it_show_it(named_file):
    bad = patched(named_file, b"zq7", b"z\x007")
    assert torch.equal(TensorDeserializer(bad)["z\x007"], torch.arange(4.0))
    with TensorDeserializer(bad, lazy_load=True) as d:
        offset = next(e.data_offset for p, e in d._metadata.items() if p.normalize_() == "z\x007")
    data = bytearray(bad.read_bytes())
    data[offset] ^= 0xFF
    bad.write_bytes(bytes(data))
    with pytest.raises(Exception) as e:
        TensorDeserializer(bad, verify_hash=True)
    assert "z\\x007" in str(e.value), str(e.value)
    assert str(e.value).index("z\\x007") < len(str(e.value)) - 10  # not cut short at the NUL


# -- Writers killed mid-write ----------------------------------------------------------------

# Imports torch once, then per line "VERSION DELAY" from stdin forks a writer of that version (one
# thread, so nothing of OpenMP's is inherited by the fork), SIGKILLs it after DELAY seconds unless
# DELAY is negative (the writer is not reaped before, so the pid is still its own), and prints 1
# when the writer finished, 0 when the kill ended it.
WRITER_SERVER = textwrap.dedent(
    """
    import os, signal, sys, time, torch
    torch.set_num_threads(1)
    from tensorizer import TensorSerializer
    for line in sys.stdin:
        version, delay = int(line.split()[0]), float(line.split()[1])
        pid = os.fork()
        if pid == 0:
            try:
                tensors = {f"t{i}": torch.full((1 << 20,), float(version)) for i in range(16)}
                s = TensorSerializer(sys.argv[1])
                s.write_state_dict(tensors)
                s.close()
            finally:
                os._exit(0)
        if delay >= 0:
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
        print(int(os.WIFEXITED(os.waitpid(pid, 0)[1])), flush=True)
    """
)


def test_writers_killed_at_random_points_leave_the_destination_whole_and_nothing_behind(tmp_path):
    import random

    dest = tmp_path / "model.tensors"
    server = subprocess.Popen(
        [sys.executable, "-c", WRITER_SERVER, str(dest)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    rng = random.Random(7)

    def write(version, kill_after=-1.0):
        server.stdin.write(f"{version} {kill_after}\n")
        server.stdin.flush()
        return server.stdout.readline().strip() == "1"

    try:
        assert write(0)
        whole = 0  # the version the destination holds
        for version in range(1, 21):
            finished = write(version, kill_after=rng.uniform(0, 0.4))
            d = TensorDeserializer(dest)
            assert sorted(d.keys()) == sorted(f"t{i}" for i in range(16))
            # The old version or the new one (a writer killed after publishing), whole.
            found = float(d["t0"].detach()[0])
            assert found in (whole, version) and (found == version or not finished), (found, version)
            for name in d.keys():
                assert torch.equal(d[name], torch.full((1 << 20,), found)), (version, name)
            whole = found
            d.close()
            assert len(os.listdir(tmp_path)) <= 2  # the destination and at most one dead temp file
        assert write(21)
        assert os.listdir(tmp_path) == ["model.tensors"]
    finally:
        server.stdin.close()
        server.wait(timeout=60)


# -- Secrets ---------------------------------------------------------------------------------


def test_planted_secrets_appear_in_no_error_repr_log_or_cli_output(tmp_path, monkeypatch, caplog):
    import logging
    import shutil

    secrets = ["HUNTER2PW", "SIGSECRET123", "CREDSECRET", "S3SECRETKEY", "PASSPHRASESECRET"]
    monkeypatch.setenv("TENSORIZER_STALL_TIMEOUT", "1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIDPLANTED")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "S3SECRETKEY")
    monkeypatch.setenv("S3_ENDPOINT_URL", "http://127.0.0.1:1")
    caplog.set_level(logging.DEBUG)
    seen = []
    for uri in [
        "http://user:HUNTER2PW@127.0.0.1:1/x.tensors",
        "http://127.0.0.1:1/x.tensors?X-Amz-Signature=SIGSECRET123&X-Amz-Credential=CREDSECRET",
        "s3://bucket/x.tensors",
    ]:
        with pytest.raises(Exception) as e:
            TensorDeserializer(uri)
        seen += [str(e.value), repr(e.value)]
    encrypted = write(tmp_path / "enc.tensors", {"a": torch.ones(2)}, EncryptionParams.random())
    wrong = DecryptionParams.from_string("PASSPHRASESECRET")
    with pytest.raises(CryptographyError) as e:
        TensorDeserializer(encrypted, encryption=wrong)
    seen += [str(e.value), repr(e.value), repr(wrong), str(wrong)]
    cli = shutil.which("tensorizer")
    if cli:
        out = subprocess.run(
            [cli, "inspect", "http://user:HUNTER2PW@127.0.0.1:1/x.tensors?X-Amz-Signature=SIGSECRET123"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode != 0
        seen += [out.stdout, out.stderr]
    seen.append(caplog.text)
    text = "\n".join(seen)
    assert "127.0.0.1" in text  # the errors did name the place
    for secret in secrets:
        assert secret not in text, secret
