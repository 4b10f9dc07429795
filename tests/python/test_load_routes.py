"""Default CPU loads take the fastest safe route per tensor (tensorizer/host_load.h): mapped when the
file is in the page cache, direct I/O when it is not, copies otherwise (encrypted, unaligned while
cached, mmap=False). Every route gives the stored bytes, verify_hash catches a flipped byte on each,
and mapped tensors survive what users do to files: delete, replace by rename, close, write to them."""

import gc
import hashlib
import math
import os
import shutil

import pytest
import torch

from conftest import FIXTURES_ROOT, save_state_dict, tensor_bytes
from tensorizer import TensorDeserializer
from tensorizer.serialization import HashMismatchError

REF_DIR = FIXTURES_ROOT / "tensorizer-2.11.1"


def _state_dict(seed=7):
    g = torch.Generator().manual_seed(seed)
    return {
        "big.f16": torch.randn(2048, 1024, generator=g).to(torch.float16),  # 4 MiB
        "big.bf16": torch.randn(512, 2048, generator=g).to(torch.bfloat16),
        "odd.i64": torch.arange(300_001, dtype=torch.int64),
        "small": torch.arange(10, dtype=torch.float32),
        "flag": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


def _drop(path):
    """fsync + POSIX_FADV_DONTNEED: the file leaves the page cache (what a cold start sees)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _warm(path):
    with open(path, "rb") as f:
        while f.read(1 << 20):
            pass


def _direct_io_works(path):
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
        return True
    except OSError:
        return False


def _routes(d):
    return {p.normalize_(): via for p, via in d._loaded_via.items()}


@pytest.fixture()
def written(tmp_path):
    sd = _state_dict()
    return save_state_dict(tmp_path / "m.tensors", sd), sd


def _assert_equal(d, sd):
    assert set(d.keys()) == set(sd)
    for k, t in sd.items():
        assert d[k].dtype == t.dtype and d[k].shape == t.shape, k
        assert tensor_bytes(d[k]) == tensor_bytes(t), k


def test_cached_file_is_mapped(written):
    path, sd = written
    _warm(path)
    with TensorDeserializer(str(path), device="cpu") as d:
        _assert_equal(d, sd)
        routes = _routes(d)
    assert routes["big.f16"] == routes["odd.i64"] == routes["small"] == "mapped"
    assert routes["empty"] == "copied"


def _mapped(path):
    with open("/proc/self/maps") as maps:
        return str(path) in maps.read()


def test_the_last_mapped_tensor_unmaps_the_file(written):
    """Each tensor owns a share of the mapping: it stays while any tensor lives, even after the
    deserializer and its other tensors are gone, and the last one unmaps the file."""
    path, sd = written
    _warm(path)
    d = TensorDeserializer(str(path), device="cpu")
    assert _routes(d)["big.f16"] == "mapped"
    kept = d["odd.i64"]
    del d
    gc.collect()
    assert _mapped(path)
    assert tensor_bytes(kept) == tensor_bytes(sd["odd.i64"])
    del kept
    gc.collect()
    assert not _mapped(path)


def test_cold_file_is_read_direct_with_the_same_bytes(written):
    path, sd = written
    if not _direct_io_works(path):
        pytest.skip("no O_DIRECT on this file system")
    _drop(path)
    with TensorDeserializer(str(path), device="cpu") as d:
        _assert_equal(d, sd)
        routes = _routes(d)
    # Large tensors; small ones near the index may have come into the page cache with it.
    assert routes["big.f16"] == routes["big.bf16"] == routes["odd.i64"] == "direct"


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_opt_out_gives_plain_copies(written, how, monkeypatch):
    path, sd = written
    if how == "environment":
        monkeypatch.setenv("TENSORIZER_MMAP", "0")
        kwargs = {}
    else:
        kwargs = {"mmap": False}
    for state in (_warm, _drop):
        state(path)
        with TensorDeserializer(str(path), device="cpu", **kwargs) as d:
            _assert_equal(d, sd)
            assert set(_routes(d).values()) == {"copied"}


def test_tensors_survive_delete_rename_replace_and_close(written, tmp_path):
    path, sd = written
    for state in (_warm, _drop):
        state(path)
        d = TensorDeserializer(str(path), device="cpu")
        tensors = dict(d.items())
        d.close()
        other = save_state_dict(tmp_path / "other.tensors", _state_dict(seed=99))
        os.replace(other, path)  # replaced by rename, as writers and download tools do
        for k, t in sd.items():
            assert tensor_bytes(tensors[k]) == tensor_bytes(t), k
        os.unlink(path)  # deleted
        for k, t in sd.items():
            assert tensor_bytes(tensors[k]) == tensor_bytes(t), k
        save_state_dict(path, sd)  # back for the next state


def test_writes_to_mapped_tensors_stay_private(written):
    path, sd = written
    _warm(path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    d = TensorDeserializer(str(path), device="cpu")
    assert _routes(d)["big.f16"] == "mapped"
    with torch.no_grad():
        d["big.f16"].fill_(1.0)
    assert torch.all(d["big.f16"] == 1.0)
    assert tensor_bytes(d["big.bf16"]) == tensor_bytes(sd["big.bf16"])  # neighbours untouched
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    with TensorDeserializer(str(path), device="cpu") as again:
        assert tensor_bytes(again["big.f16"]) == tensor_bytes(sd["big.f16"])


def test_each_tensor_is_its_own_storage(written, tmp_path):
    """torch.save of one loaded tensor saves only its bytes, not the file it was mapped from."""
    path, sd = written
    _warm(path)
    with TensorDeserializer(str(path), device="cpu") as d:
        t = d["small"]
        assert t.untyped_storage().nbytes() == t.numel() * t.element_size()
        torch.save(t.detach(), tmp_path / "one.pt")
    assert os.path.getsize(tmp_path / "one.pt") < 4096
    assert torch.equal(torch.load(tmp_path / "one.pt"), sd["small"])


def _flip(path, name):
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        offset = d._metadata[next(p for p in d._metadata if p.normalize_() == name)].data_offset
    blob = bytearray(path.read_bytes())
    blob[offset + 3] ^= 0x01
    path.write_bytes(bytes(blob))


@pytest.mark.parametrize("route", ["mapped", "direct", "copied"])
def test_verify_hash_catches_a_flipped_byte_on_every_route(written, route):
    path, _ = written
    _flip(path, "odd.i64")
    if route == "direct" and not _direct_io_works(path):
        pytest.skip("no O_DIRECT on this file system")
    (_drop if route == "direct" else _warm)(path)
    with pytest.raises(HashMismatchError, match="odd.i64"):
        TensorDeserializer(str(path), device="cpu", verify_hash=True, mmap=False if route == "copied" else None)


@pytest.mark.parametrize("state", ["cached", "cold"])
def test_reference_written_unaligned_file(tmp_path, state):
    """The reference stores data at arbitrary offsets: cached, the tensors that lie at their element
    size are mapped and the others copied; cold, all are read direct and the others moved to
    64-byte boundaries. Same bytes, hashes checked, every tensor at its element size."""
    import json

    manifest = json.loads((REF_DIR / "manifest.json").read_text())
    path = tmp_path / "dtypes.tensors"
    shutil.copy(REF_DIR / "dtypes.tensors", path)
    (_warm if state == "cached" else _drop)(path)
    with TensorDeserializer(str(path), device="cpu", verify_hash=True) as d:
        flat = {name if isinstance(name, str) else tuple(name): t for _, _, name, t in d.read_tensors()}
        routes = _routes(d)
        # Non-empty tensors: whether each lies at its element size in the file.
        in_place = {
            p.normalize_(): e.data_offset % (e.data_length // math.prod(e.shape)) == 0
            for p, e in d._metadata.items()
            if e.data_length and math.prod(e.shape)
        }
    for t in manifest["files"]["dtypes.tensors"]["tensors"]:
        name = t["name"] if isinstance(t["name"], str) else tuple(t["name"])
        assert hashlib.sha256(tensor_bytes(flat[name])).hexdigest() == t["sha256"], name
        assert flat[name].data_ptr() % flat[name].element_size() == 0 or flat[name].numel() == 0, name
    loaded = {p: routes[p] for p in in_place}
    assert all(in_place[p] for p, via in loaded.items() if via == "mapped")
    if state == "cold" and _direct_io_works(path):
        assert "direct" in loaded.values()  # (the pages the open read are cached: those map or copy)
    else:
        assert {p: via == "mapped" for p, via in loaded.items()} == in_place
        assert set(loaded.values()) == {"mapped", "copied"}  # the fixture has tensors of both kinds


def test_encrypted_file_is_copied():
    import json

    from tensorizer import DecryptionParams

    manifest = json.loads((REF_DIR / "manifest.json").read_text())["files"]["encrypted_key.tensors"]
    key = (REF_DIR / "encrypted_key.key").read_bytes()
    with TensorDeserializer(
        str(REF_DIR / "encrypted_key.tensors"), device="cpu", encryption=DecryptionParams.from_key(key)
    ) as d:
        flat = {name if isinstance(name, str) else tuple(name): t for _, _, name, t in d.read_tensors()}
        assert set(_routes(d).values()) == {"copied"}
    for t in manifest["tensors"]:
        name = t["name"] if isinstance(t["name"], str) else tuple(t["name"])
        assert hashlib.sha256(tensor_bytes(flat[name])).hexdigest() == t["sha256"], name
