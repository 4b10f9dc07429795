"""mmap=True: large tensors of local unencrypted files are mapped copy-on-write instead of copied.
Checks exact values, that writes never reach the file, hash verification over mapped bytes, and the
fallback to copying for tensors that cannot be mapped (unaligned reference files, small tensors)."""

import hashlib

import pytest
import torch

from conftest import fixture_files, save_state_dict, tensor_bytes
from tensorizer import TensorDeserializer
from tensorizer.serialization import HashMismatchError


def _state_dict():
    g = torch.Generator().manual_seed(7)
    return {
        "big.f16": torch.randn(1024, 1024, generator=g).to(torch.float16),  # 2 MiB: mapped
        "big.bf16": torch.randn(512, 2048, generator=g).to(torch.bfloat16),  # opaque dtype, mapped
        "big.i64": torch.arange(300_000, dtype=torch.int64),
        "small": torch.arange(10, dtype=torch.float32),  # small: mapped too (64-byte aligned)
        "scalar": torch.tensor(3.5, dtype=torch.float64),
        "empty": torch.zeros(0, 4),
    }


@pytest.fixture()
def written(tmp_path):
    sd = _state_dict()
    return save_state_dict(tmp_path / "m.tensors", sd), sd


@pytest.mark.parametrize("verify", [False, True])
def test_mmap_values_equal(written, verify):
    path, sd = written
    with TensorDeserializer(str(path), device="cpu", mmap=True, verify_hash=verify) as d:
        assert set(d.keys()) == set(sd)
        for k, t in sd.items():
            assert d[k].dtype == t.dtype and d[k].shape == t.shape
            assert tensor_bytes(d[k]) == tensor_bytes(t), k


def test_mmap_writes_stay_private(written):
    path, sd = written
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    d = TensorDeserializer(str(path), device="cpu", mmap=True)
    a = d["big.f16"]
    with torch.no_grad():
        a.fill_(1.0)
    assert torch.all(a == 1.0)
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    # Tensors are independent storages.
    assert d["big.bf16"].untyped_storage().data_ptr() != a.untyped_storage().data_ptr()
    d2 = TensorDeserializer(str(path), device="cpu", mmap=True)
    assert tensor_bytes(d2["big.f16"]) == tensor_bytes(sd["big.f16"])
    del d, d2, a


def test_mmap_detects_corruption(written):
    path, _ = written
    blob = bytearray(path.read_bytes())
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        offset = d._metadata[next(p for p in d._metadata if p.normalize_() == "big.i64")].data_offset
    blob[offset + 1000] ^= 0xFF
    path.write_bytes(bytes(blob))
    with pytest.raises(HashMismatchError, match="big.i64"):
        TensorDeserializer(str(path), device="cpu", mmap=True, verify_hash=True)


@pytest.mark.parametrize(
    "path,info", [f for f in fixture_files() if not f[1].get("encryption")], ids=lambda v: getattr(v, "name", "")
)
def test_mmap_reference_files(path, info):
    """Reference files have unaligned data: those tensors fall back to the copy path."""
    with TensorDeserializer(str(path), device="cpu", mmap=True) as d:
        flat = {}
        for _, _, name, tensor in d.read_tensors():
            flat[name if isinstance(name, str) else tuple(name)] = tensor
    for t in info["tensors"]:
        name = t["name"] if isinstance(t["name"], str) else tuple(t["name"])
        got = tensor_bytes(flat[name])
        if t["meta"]:
            assert len(got) > 0 and got == bytes(len(got))  # meta tensors load as zeros
        else:
            assert hashlib.sha256(got).hexdigest() == t["sha256"]


def _mappings():
    with open("/proc/self/maps") as maps:
        return sum(1 for _ in maps)


def test_lazy_loads_tensor_by_tensor_share_one_mapping(tmp_path):
    """A lazy load maps one tensor per access; a process may hold about 65,000 mappings and a model
    may have more tensors. Every access used to map the file again and keep a thread's stack: with
    70,000 tensors kept, loading failed with "Resource temporarily unavailable"."""
    sd = {f"layer.{i}.w": torch.full((16,), float(i)) for i in range(5000)}
    path = save_state_dict(tmp_path / "many.tensors", sd)
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        before = _mappings()
        kept = [d[name] for name in sd]
        assert _mappings() < before + 16
        assert all(t[3].item() == float(i) for i, t in enumerate(kept))
