"""utils, stream_io, torch_compat and the encryption parameter classes."""

import io
import os
import pickle
import threading

import pytest
import torch

import tensorizer
from tensorizer import (
    DecryptionParams,
    _C,
    EncryptionParams,
    TensorDeserializer,
    TensorSerializer,
    stream_io,
    torch_compat,
    utils,
)


def test_public_names():
    for name in (
        "TensorSerializer",
        "TensorDeserializer",
        "TensorType",
        "CryptographyError",
        "EncryptionParams",
        "DecryptionParams",
        "FilterFuncType",
    ):
        assert name in tensorizer.__all__ and hasattr(tensorizer, name)
    assert tensorizer.__version__ == "2.12.1.post1"
    from tensorizer.serialization import HashMismatchError, HashType, TensorEntry, TensorHash  # noqa: F401

    assert tensorizer.serialization.TENSORIZER_MAGIC == b"|TZR|"
    assert tensorizer.TensorType.STATE_DICT == 2


def _as_generated(cls):
    """The same fields under ``dataclasses.dataclass(order=True)``: the reference's definition."""
    import dataclasses

    return dataclasses.make_dataclass(cls.__name__, [f.name for f in dataclasses.fields(cls)], order=True)


def test_index_records_behave_as_the_references_dataclasses():
    import dataclasses

    from tensorizer.serialization import HashType, TensorEntry, TensorHash, TensorType

    crc, sha = TensorHash(HashType.CRC32, b"\x01\x02"), TensorHash(HashType.SHA256, b"\x00")
    args = (3, "a.weight", TensorType.PARAM, "<f2", (2, 3), 100, 4096, 12, [crc], {HashType.CRC32: 7})
    entry = TensorEntry(*args)
    other = TensorEntry(*args[:5], 101, *args[6:])
    Hash, Entry = _as_generated(TensorHash), _as_generated(TensorEntry)
    oracle = {id(crc): Hash(*dataclasses.astuple(crc)), id(sha): Hash(*dataclasses.astuple(sha))}
    oracle[id(entry)], oracle[id(other)] = Entry(*args), Entry(*args[:5], 101, *args[6:])

    assert dataclasses.is_dataclass(entry) and dataclasses.is_dataclass(crc)
    assert [f.name for f in dataclasses.fields(TensorEntry)] == list(TensorEntry.__match_args__)
    assert TensorEntry.__match_args__ == (
        "metadata_version", "name", "type", "dtype", "shape", "offset", "data_offset", "data_length", "hashes",
        "header_hashes",
    )  # fmt: skip
    assert TensorHash.__match_args__ == ("type", "hash")
    assert repr(crc) == "TensorHash(type=<HashType.CRC32: 0>, hash=b'\\x01\\x02')"
    assert repr(entry) == repr(oracle[id(entry)])
    assert dataclasses.asdict(entry)["hashes"] == [{"type": HashType.CRC32, "hash": b"\x01\x02"}]
    assert dataclasses.replace(entry, offset=101) == other
    for a in (crc, sha):
        for b in (crc, sha):
            for op in ("__eq__", "__lt__", "__le__", "__gt__", "__ge__"):
                assert getattr(a, op)(b) == getattr(oracle[id(a)], op)(oracle[id(b)]), (a, op, b)
    for a, b in ((entry, other), (other, entry), (entry, entry)):
        for op in ("__eq__", "__lt__", "__le__", "__gt__", "__ge__"):
            assert getattr(a, op)(b) == getattr(oracle[id(a)], op)(oracle[id(b)]), (a, op, b)
    assert entry.__eq__(oracle[id(entry)]) is NotImplemented and entry != args
    with pytest.raises(TypeError):
        hash(entry)
    with pytest.raises(TypeError):
        sorted([crc, 1])
    with pytest.raises(AttributeError):
        entry.extra = 1  # slotted, as the reference's
    entry.hashes = None  # fields stay writable
    assert entry.hashes is None


def test_convert_bytes():
    assert utils.convert_bytes(123_400_000) == "123.4 MB"
    assert utils.convert_bytes(512) == "512.0 bytes"
    assert utils.convert_bytes(3 << 30, decimal=False) == "3.0 GiB"
    assert utils.convert_bytes(10**18) == "1000.0 PB"


def test_devices_and_memory():
    assert utils.get_device() == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    usage = utils.MemoryUsage.now()
    assert usage.cpu.maxrss > 0 and usage.cpu.free > 0
    assert str(usage).startswith("CPU: (maxrss: ")
    assert utils.get_mem_usage().startswith("CPU:")
    assert isinstance(utils.CPUMemoryUsage.now(), utils.CPUMemoryUsage)
    if not torch.cuda.is_available():
        assert usage.gpu is None and usage.torch is None
        assert utils.GlobalGPUMemoryUsage.now() is None and utils.TorchGPUMemoryUsage.now() is None
        assert utils.get_gpu_name() == "N/A"


def test_no_init_or_tensor_is_context_local():
    seen = {}

    def other_thread():
        seen["other"] = torch.nn.Linear(2, 2).weight.is_meta

    with utils.no_init_or_tensor():
        with utils.no_init_or_tensor():  # re-entrant
            assert torch.nn.Linear(3, 3).weight.is_meta
        t = threading.Thread(target=other_thread)
        t.start()
        t.join()
        assert torch.empty(2).is_meta
    assert seen["other"] is False
    assert not torch.empty(2).is_meta and not torch.nn.Linear(2, 2).weight.is_meta
    layer = utils.no_init_or_tensor(lambda: torch.nn.Embedding(4, 2))
    assert layer.weight.is_meta
    with pytest.raises(TypeError):
        utils.no_init_or_tensor(5)


def test_loading_inside_no_init_is_not_meta(tmp_path):
    """Loads allocate real memory even while no_init_or_tensor redirects torch.empty."""
    with TensorSerializer(str(tmp_path / "a.tensors")) as s:
        s.write_state_dict({"a": torch.ones(3)})
    with utils.no_init_or_tensor():
        with TensorDeserializer(tmp_path / "a.tensors") as d:
            assert torch.equal(d["a"], torch.ones(3))


def test_open_stream_local(tmp_path):
    path = tmp_path / "deep" / "dir" / "x.bin"
    with stream_io.open_stream(str(path), "wb+") as f:
        f.write(b"0123456789")
    with stream_io.open_stream(path, "rb", begin=4) as f:
        assert f.read() == b"456789"
    with pytest.raises(ValueError):
        stream_io.open_stream(str(path), "r")
    with pytest.raises(ValueError, match='Only the mode "rb" is valid when opening https:// streams'):
        stream_io.open_stream("HTTPS://127.0.0.1:1/x", "wb")
    # Redis stores named parts, not a byte stream: writable by TensorSerializer, not open_stream.
    with pytest.raises(ValueError, match='Only the mode "rb" is valid when opening redis:// streams'):
        stream_io.open_stream("redis://127.0.0.1:1/x", "wb")
    with pytest.raises(ValueError, match='"wb\\[\\+\\]", and "ab\\[\\+\\]" are valid when opening s3://'):
        stream_io.open_stream("s3://bucket/key", "r+b")
    with pytest.raises(ValueError):
        stream_io.CAInfo()
    with pytest.raises(ValueError):
        stream_io.CAInfo(cacert=str(tmp_path / "missing.pem"))
    assert stream_io.CAInfo(allow_untrusted=True).curl_flags == ("--insecure",)


def test_open_stream_schemes_come_from_the_engine(tmp_path, monkeypatch):
    """Which schemes are remote is the engine's answer; any other "scheme" is a local path, as in
    the reference."""
    info = {u: _C.transport_info(u) for u in ("x.tensors", "Http://h/x", "s3://b/k", "redis://h/p")}
    assert [(i.scheme, i.local, i.writable, i.sink_takes_bytes) for i in info.values()] == [
        ("file", True, True, True),
        ("http", False, False, False),
        ("s3", False, True, True),
        ("redis", False, True, False),
    ]
    assert _C.transport_info("gs://b/k") is None
    monkeypatch.chdir(tmp_path)
    with stream_io.open_stream("gs://bucket/key", "wb") as f:
        f.write(b"local after all")
    assert (tmp_path / "gs:" / "bucket" / "key").read_bytes() == b"local after all"


def test_serializer_through_open_stream(tmp_path):
    path = tmp_path / "s.tensors"
    s = TensorSerializer(stream_io.open_stream(str(path), "wb+"))
    s.write_state_dict({"a": torch.arange(5)})
    s.close()
    with TensorDeserializer(stream_io.open_stream(str(path), "rb")) as d:
        assert torch.equal(d["a"], torch.arange(5))


def test_encryption_round_trip_and_kdf(tmp_path):
    params = EncryptionParams.from_string("hunter2", opslimit=1, memlimit=8192, salt=b"0123456789abcdef")
    assert params.key.hex() == "5f61a8c05708063a9a3a44fd63189f0169304a4e5cd1dbedbca1cb91c7d30494"
    assert params.salt == b"0123456789abcdef"
    sd = {"big": torch.randn(600, 1024), "small": torch.arange(3)}
    with TensorSerializer(str(tmp_path / "e.tensors"), encryption=params) as s:
        s.write_state_dict(sd)
    for dec in (DecryptionParams.from_string("hunter2"), DecryptionParams.from_key(params.key)):
        with TensorDeserializer(tmp_path / "e.tensors", encryption=dec, verify_hash=True) as d:
            assert torch.equal(d["big"], sd["big"]) and torch.equal(d["small"], sd["small"])
    random_key = EncryptionParams.random()
    assert len(random_key.key) == 32 and random_key.key != EncryptionParams.random().key
    assert EncryptionParams.OpsLimit.MODERATE == 3 and EncryptionParams.MemLimit.MIN == 8192


def test_torch_compat_sidecar(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))
    extra = {"model": model, "meta": torch.empty(2, device="meta"), "view": model[0].weight[1:]}
    with torch_compat.tensorizer_saving():
        torch.save(extra, tmp_path / "m.pt")
    assert (tmp_path / "m.pt.tensors").exists()
    with TensorDeserializer(tmp_path / "m.pt.tensors") as d:
        assert all(isinstance(k, int) for k in d.keys())
    with torch_compat.tensorizer_loading(device="cpu"):
        loaded = torch.load(tmp_path / "m.pt", weights_only=False)
    x = torch.randn(5, 4)
    assert torch.equal(loaded["model"](x), model(x))
    assert loaded["meta"].is_meta
    assert torch.equal(loaded["view"], model[0].weight[1:])
    # Shared storage stays shared through the sidecar.
    assert loaded["view"].untyped_storage().data_ptr() == loaded["model"][0].weight.untyped_storage().data_ptr()
    # Outside the contexts torch.save/torch.load are the originals again.
    assert torch.save is torch_compat._ORIG_TORCH_SAVE and torch.load is torch_compat._ORIG_TORCH_LOAD


def test_torch_compat_explicit_file_and_callable(tmp_path):
    t = {"w": torch.arange(6.0)}
    with torch_compat.tensorizer_saving(str(tmp_path / "side.tensors")):
        torch.save(t, tmp_path / "a.pt")
    with torch_compat.tensorizer_loading(lambda f: str(tmp_path / "side.tensors")):
        assert torch.equal(torch.load(tmp_path / "a.pt", weights_only=False)["w"], t["w"])
    buf = io.BytesIO()
    with torch_compat.tensorizer_saving():  # BytesIO: no sidecar location, plain torch
        torch.save(t, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf)["w"], t["w"])
    with pytest.raises(ValueError):
        with torch_compat.tensorizer_saving():
            torch.save(t, tmp_path / "b.pt", pickle_module=io)
    with torch_compat.tensorizer_saving():
        torch.save(t, tmp_path / "d.pt")
    with torch_compat.tensorizer_loading(), pytest.raises(Exception, match="pickle_module"):
        torch.load(tmp_path / "d.pt", weights_only=True)
    with torch_compat.tensorizer_loading(suppress_weights_only=True):
        assert torch.equal(torch.load(tmp_path / "d.pt", weights_only=True)["w"], t["w"])


def test_torch_compat_save_func(tmp_path):
    seen = {}

    def save_func(file_obj, tensors, kwargs):
        seen["file"], seen["n"], seen["kwargs"] = file_obj, len(list(tensors)), kwargs

    with torch_compat.tensorizer_saving(save_func=save_func, limit_cpu_concurrency=1):
        torch.save({"a": torch.ones(2), "b": torch.zeros(3)}, tmp_path / "c.pt")
    assert seen == {"file": str(tmp_path / "c.pt") + ".tensors", "n": 2, "kwargs": {"limit_cpu_concurrency": 1}}
    assert not os.path.exists(tmp_path / "c.pt.tensors")


def test_stub_and_marker_ship():
    root = os.path.dirname(tensorizer.__file__)
    assert os.path.exists(os.path.join(root, "py.typed"))
    assert os.path.exists(os.path.join(root, "_C.pyi"))
    assert pickle.loads(pickle.dumps(tensorizer.TensorType.PARAM)) == tensorizer.TensorType.PARAM
