"""Row slices (TensorDeserializer.get_slice, safe_open.get_slice): a range of whole rows reads only
its bytes (counted by the engine) from a local file, HTTP and an encrypted file, equals slicing the
loaded tensor, and anything else falls back to loading the tensor."""

import os
import uuid

import pytest
import torch

import tensorizer.safetensors as ts
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer

from test_remote import server_env

ROWS, COLS = 300, 1000  # float32: 4000 bytes a row


def tensors():
    g = torch.Generator().manual_seed(9)
    return {"w": torch.randn(ROWS, COLS, generator=g), "v": torch.randn(7, generator=g)}


def write(path, encryption=None):
    with TensorSerializer(str(path), encryption=encryption) as s:
        s.write_state_dict(tensors())


@pytest.mark.parametrize(
    "index",
    [slice(10, 20), 5, -1, (slice(3, 7), Ellipsis), (slice(250, None), slice(None)), slice(-3, None), slice(40, 10)],
)
def test_a_row_range_reads_only_its_bytes(tmp_path, index):
    path = tmp_path / "m.tensors"
    write(path)
    full = tensors()["w"]
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        before = d._reader.bytes_read
        got = d.get_slice("w")[index]
        read = d._reader.bytes_read - before
    assert torch.equal(got, full[index])
    assert read == got.numel() * 4


@pytest.mark.parametrize("index", [slice(None, None, 2), (slice(0, 5), 3), (Ellipsis, 1)])
def test_other_indexing_loads_the_tensor(tmp_path, index):
    path = tmp_path / "m.tensors"
    write(path)
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        s = d.get_slice("w")
        assert s.get_shape() == [ROWS, COLS] and s.get_dtype() == "float32"
        assert torch.equal(s[index], tensors()["w"][index])
    with pytest.raises(IndexError):
        TensorDeserializer(str(path), device="cpu", lazy_load=True).get_slice("w")[ROWS]


def test_encrypted_and_verified_slices(tmp_path):
    path = tmp_path / "e.tensors"
    key = EncryptionParams.random()
    write(path, key)
    full = tensors()["w"]
    dec = DecryptionParams.from_key(key.key)
    with TensorDeserializer(str(path), device="cpu", lazy_load=True, encryption=dec) as d:
        assert torch.equal(d.get_slice("w")[100:140], full[100:140])  # whole chunks decrypted
        assert torch.equal(d.get_slice("w")[299], full[299])
    with TensorDeserializer(str(path), device="cpu", lazy_load=True, encryption=dec, verify_hash=True) as d:
        assert torch.equal(d.get_slice("w")[1:3], full[1:3])  # loaded whole and checked


def test_safetensors_slices_over_http(tmp_path):
    url, root = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT")
    name = f"slices-{uuid.uuid4().hex}.safetensors"
    ts.save_file(tensors(), os.path.join(root, name))
    with ts.safe_open(f"{url}/{name}", "pt") as f:
        before = f._deserializer._reader.bytes_read
        got = f.get_slice("w")[20:30]
        assert f._deserializer._reader.bytes_read - before == 10 * COLS * 4
        assert f.get_slice("w").get_dtype() == "F32"
    assert torch.equal(got, tensors()["w"][20:30])
