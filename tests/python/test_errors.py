"""Bad input gives the reference's exception types, with messages naming the file and tensor."""

import io
import struct

import pytest
import torch

from conftest import FIXTURES_ROOT
from tensorizer import (
    CryptographyError,
    DecryptionParams,
    EncryptionParams,
    TensorDeserializer,
    TensorSerializer,
    TensorType,
)
from tensorizer.serialization import HashMismatchError


def good_file(tmp_path, name="f.tensors"):
    path = tmp_path / name
    s = TensorSerializer(str(path))
    s.write_state_dict({"first": torch.arange(1000, dtype=torch.float32), "second": torch.ones(2000)})
    s.close()
    return path


def entry_offsets(path):
    with TensorDeserializer(path, lazy_load=True) as d:
        return {p.normalize_(): e for p, e in d._metadata.items()}


def test_not_a_tensorizer_file(tmp_path):
    bad = tmp_path / "bad.tensors"
    bad.write_bytes(b"hello world, not tensors" * 10)
    with pytest.raises(ValueError, match="bad.tensors"):
        TensorDeserializer(bad)


def test_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.tensors"):
        TensorDeserializer(tmp_path / "nope.tensors")


def test_unsupported_version(tmp_path):
    path = good_file(tmp_path)
    data = bytearray(path.read_bytes())
    data[5:9] = struct.pack("<I", 9)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="f.tensors"):
        TensorDeserializer(path)


def test_truncated_file_names_tensor(tmp_path):
    path = good_file(tmp_path)
    e = entry_offsets(path)["second"]
    path.write_bytes(path.read_bytes()[: e.data_offset + 100])
    for lazy in (False, True):  # the index is checked against the file size when opening
        with pytest.raises(ValueError) as info:
            TensorDeserializer(path, lazy_load=lazy)
        assert "f.tensors" in str(info.value) and "second" in str(info.value) and "truncated" in str(info.value)


def test_corrupted_data_hash_mismatch(tmp_path):
    path = good_file(tmp_path)
    e = entry_offsets(path)["second"]
    data = bytearray(path.read_bytes())
    data[e.data_offset + 5] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(HashMismatchError) as info:
        TensorDeserializer(path, verify_hash=True)
    assert "second" in str(info.value) and "f.tensors" in str(info.value)
    # Without verification the corrupt bytes load; read_tensors can opt in per call.
    with TensorDeserializer(path, lazy_load=True) as d:
        with pytest.raises(HashMismatchError, match="second"):
            list(d.read_tensors(verify_hash=True))


def test_corrupted_header_names_tensor(tmp_path):
    path = good_file(tmp_path)
    e = entry_offsets(path)["second"]
    data = bytearray(path.read_bytes())
    data[e.offset + 10] = 7  # tensor type byte in the per-tensor header
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError) as info:
        TensorDeserializer(path)
    assert "second" in str(info.value) and "f.tensors" in str(info.value)


def test_encryption_errors(tmp_path):
    enc_path = FIXTURES_ROOT / "tensorizer-2.11.1" / "encrypted_key.tensors"
    with pytest.raises(CryptographyError, match="encrypted_key.tensors"):
        TensorDeserializer(enc_path)
    with pytest.raises(CryptographyError, match="'a'"):
        TensorDeserializer(enc_path, encryption=DecryptionParams.from_key(bytes(32)))
    plain = good_file(tmp_path)
    with pytest.raises(CryptographyError):
        TensorDeserializer(plain, encryption=DecryptionParams.from_key(bytes(32)))
    with pytest.raises(TypeError):
        TensorDeserializer(plain, encryption="secret")
    with pytest.raises(ValueError):
        TensorDeserializer(plain, encryption=DecryptionParams())
    with pytest.raises(TypeError):
        TensorSerializer(str(tmp_path / "x.tensors"), encryption=b"k" * 32)
    assert issubclass(CryptographyError, Exception)


def test_write_errors(tmp_path):
    s = TensorSerializer(str(tmp_path / "w.tensors"))
    with pytest.raises(TypeError, match="key type"):
        s.write_state_dict({1: torch.ones(1)})
    with pytest.raises(TypeError, match="str"):
        s.write_state_dict({"a": "not a tensor"})
    with pytest.raises(ValueError, match="empty"):
        s.write_tensor(0, "", TensorType.PARAM, torch.ones(1))
    with pytest.raises(ValueError):
        s.write_tensor(0, "\x1eweird", TensorType.PARAM, torch.ones(1))
    with pytest.raises(ValueError):
        s.write_tensor(0, ("a", 0), TensorType.PARAM, torch.ones(1))  # structured names: STATE_DICT only
    with pytest.raises(ValueError):
        s.write_tensor(0, "a", 7, torch.ones(1))
    with pytest.raises(TypeError):
        s.write_tensor(0, "a", TensorType.PARAM, [1, 2])
    with pytest.raises(NotImplementedError, match="sparse"):
        s.write_tensor(0, "sp", TensorType.PARAM, torch.eye(3).to_sparse())
    with pytest.raises(NotImplementedError, match="nested tensor 'nt'"):
        s.write_tensor(0, "nt", TensorType.PARAM, torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]))
    s.write_state_dict({"x": {"y": torch.ones(1)}})
    with pytest.raises(ValueError):
        s.write_state_dict({"x": torch.ones(1)})  # a leaf that is also a prefix
    with pytest.raises(ValueError):
        s.write_state_dict({"x": [torch.ones(1)]})  # mixed str/int keys under "x"
    s.close()
    with pytest.raises(ValueError, match="closed"):
        s.write_tensor(0, "late", TensorType.PARAM, torch.ones(1))
    with pytest.raises(ValueError):
        TensorSerializer(str(tmp_path / "c.tensors"), limit_cpu_concurrency=0)
    with pytest.raises(TypeError):
        TensorSerializer(str(tmp_path / "c.tensors"), limit_cpu_concurrency=1.5)


def test_read_api_errors(tmp_path):
    path = tmp_path / "s.tensors"
    s = TensorSerializer(str(path))
    s.write_state_dict({"b": torch.ones(2, dtype=torch.bfloat16), "n": {"x": torch.ones(1)}})
    s.close()
    with TensorDeserializer(path, lazy_load=True) as d:
        with pytest.raises(ValueError, match="opaque.*allow_raw_data"):
            list(d.read_numpy_arrays())
        with pytest.raises(KeyError):
            d["missing"]
        with pytest.raises(NotImplementedError, match="write_state_dict"):
            d.load_into_module(torch.nn.Module())
    with pytest.raises(ValueError, match="readable"):
        TensorDeserializer(io.StringIO("text"))
    with pytest.raises(RuntimeError, match="CUDA"):
        if torch.cuda.is_available():
            raise RuntimeError("CUDA present: nothing to check")
        TensorDeserializer(path, device="cuda")


def test_module_mismatch_names_tensor(tmp_path):
    path = tmp_path / "m.tensors"
    s = TensorSerializer(str(path))
    s.write_module(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    s.close()
    with TensorDeserializer(path) as d:
        with pytest.raises(KeyError, match="0.weight"):
            d.load_into_module(torch.nn.Module())


def test_encryption_params_validation():
    with pytest.raises(ValueError):
        EncryptionParams(b"short")
    with pytest.raises(TypeError):
        EncryptionParams("not bytes" * 4)
    with pytest.raises(ValueError):
        EncryptionParams.from_string("")
    with pytest.raises(TypeError):
        EncryptionParams.from_string("pw", opslimit=EncryptionParams.MemLimit.MIN)
    with pytest.raises(TypeError):
        EncryptionParams.from_string("pw", salt="a string salt!!!")
    with pytest.raises(ValueError):
        EncryptionParams.from_string("pw", salt=b"short")
    with pytest.raises(ValueError):
        EncryptionParams.from_string("pw", opslimit=0)
    with pytest.raises(ValueError):
        EncryptionParams.random().salt
    with pytest.raises(ValueError):
        DecryptionParams.from_key(b"x" * 31)
    with pytest.raises(ValueError):
        DecryptionParams.from_string("")
