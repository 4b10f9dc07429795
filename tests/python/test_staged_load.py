"""Loads through the engine's staging ring (tensorizer/staged_load.h), the path every CUDA load
takes: on CPU through the host copy backend (``TENSORIZER_STAGED=1``), and on a GPU (skipped
without one) through the CUDA runtime. Every fixture loads bit-exact, a ring far smaller than the
model still gives exact bytes, hashes and decryption work across pieces, dtype casts happen on
the target device, and a corrupt or truncated file raises a clear error."""

import pytest
import torch

from conftest import save_state_dict
from test_fixtures import FILES, IDS, check_tensor, lookup, open_fixture
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer
from tensorizer.serialization import HashMismatchError

HAS_CUDA = torch.cuda.is_available()
TARGETS = [
    pytest.param("cpu", id="cpu-staged"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device")),
]
SMALL_RING = str(3 << 20)  # 3 MiB: two slots of the largest item, far below the models here


@pytest.fixture(params=TARGETS)
def target(request, monkeypatch):
    """The device to load to; CPU loads are sent through the staging pipeline."""
    monkeypatch.setenv("TENSORIZER_STAGED", "1")
    return request.param


def _state_dict():
    g = torch.Generator().manual_seed(3)
    sd = {f"layer{i}.w": torch.randn(64, 17 + i, generator=g) for i in range(40)}
    sd["embed"] = torch.randn(3000, 700, generator=g).to(torch.bfloat16)  # 4 MiB: several pieces
    sd["big"] = torch.randn(5 << 18, generator=g)  # 5 MiB
    sd["ids"] = torch.arange(100_003, dtype=torch.int64)
    sd["mask"] = torch.tensor([True, False, True])
    sd["empty"] = torch.zeros(0, 3)
    return sd


def _assert_loaded(d, sd, device):
    assert set(d.keys()) == set(sd)
    for k, v in sd.items():
        assert d[k].device.type == device, k
        assert d[k].dtype == v.dtype and torch.equal(d[k].cpu(), v), k
    assert set(d._loaded_via.values()) == {"staged"}


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_every_fixture_loads_bit_exact(path, info, target):
    with open_fixture(path, info, device=target) as d:
        for t in info["tensors"]:
            check_tensor(lookup(d, t["name"]), t)
        assert set(d._loaded_via.values()) == {"staged"}


def test_ring_smaller_than_the_model(tmp_path, target, monkeypatch):
    sd = _state_dict()
    path = save_state_dict(tmp_path / "m.tensors", sd)
    monkeypatch.setenv("TENSORIZER_STAGING_BYTES", SMALL_RING)
    for readers in (1, 3, None):
        with TensorDeserializer(path, device=target, verify_hash=True, num_readers=readers) as d:
            _assert_loaded(d, sd, target)


def test_encrypted_file(tmp_path, target, monkeypatch):
    sd = _state_dict()
    enc = EncryptionParams.random()
    with TensorSerializer(str(tmp_path / "e.tensors"), encryption=enc) as s:
        s.write_state_dict(sd)
    monkeypatch.setenv("TENSORIZER_STAGING_BYTES", str(12 << 20))
    with TensorDeserializer(
        tmp_path / "e.tensors", device=target, verify_hash=True, encryption=DecryptionParams.from_key(enc.key)
    ) as d:
        _assert_loaded(d, sd, target)


def test_dtype_cast_happens_on_the_target(tmp_path, target):
    sd = _state_dict()
    path = save_state_dict(tmp_path / "m.tensors", sd)
    with TensorDeserializer(path, device=target, dtype=torch.float16, plaid_mode=True, plaid_mode_buffers=4) as d:
        assert d["big"].dtype == torch.float16 and d["big"].device.type == target
        assert torch.equal(d["big"].cpu(), sd["big"].to(torch.float16))
        assert d["ids"].dtype == torch.float16 and torch.equal(d["ids"].cpu(), sd["ids"].to(torch.float16))
    with TensorDeserializer(path, device=target, dtype=torch.float16, cast_within_kind=True) as d:
        assert d["big"].dtype == torch.float16 and d["ids"].dtype == torch.int64
        assert torch.equal(d["ids"].cpu(), sd["ids"])


def test_load_into_module(tmp_path, target):
    m = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.LayerNorm(200))
    with TensorSerializer(str(tmp_path / "mod.tensors")) as s:
        s.write_module(m)
    fresh = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.LayerNorm(200)).to(target)
    with TensorDeserializer(tmp_path / "mod.tensors", device=target) as d:
        d.load_into_module(fresh)
    for (name, a), b in zip(fresh.state_dict().items(), m.state_dict().values()):
        assert a.device.type == target and torch.equal(a.cpu(), b), name


def test_corrupt_byte_is_a_hash_mismatch(tmp_path, target, monkeypatch):
    sd = _state_dict()
    path = save_state_dict(tmp_path / "m.tensors", sd)
    with TensorDeserializer(path, device="cpu", lazy_load=True) as d:
        offset = d._metadata[next(p for p in d._metadata if p.normalize_() == "big")].data_offset
    data = bytearray(path.read_bytes())
    data[offset + (3 << 20) + 7] ^= 0x10  # inside "big", several pieces in
    path.write_bytes(bytes(data))
    monkeypatch.setenv("TENSORIZER_STAGING_BYTES", SMALL_RING)
    with pytest.raises(HashMismatchError) as info:
        TensorDeserializer(path, device=target, verify_hash=True)
    assert "big" in str(info.value) and "m.tensors" in str(info.value)


def test_truncated_file_is_an_error(tmp_path, target):
    sd = _state_dict()
    path = save_state_dict(tmp_path / "m.tensors", sd)
    path.write_bytes(path.read_bytes()[: path.stat().st_size - 5000])
    with pytest.raises(ValueError) as info:
        TensorDeserializer(path, device=target)
    assert "m.tensors" in str(info.value) and "truncated" in str(info.value)
