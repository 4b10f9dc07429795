"""Write with TensorSerializer, read with TensorDeserializer: every dtype, meta/non-contiguous/
shared tensors, numpy arrays, nested state dicts, modules, file objects, and the deserializer's
options (lazy_load, filter_func, dtype, num_readers, verify_hash, tree, read_* paging)."""

import hashlib
import io
import os
import threading
import warnings
import zlib

import numpy
import pytest
import torch

from conftest import tensor_bytes
from interop_data import DTYPES, InteropModule, filled_module, patterned
from tensorizer import TensorDeserializer, TensorSerializer, TensorType, utils
from tensorizer.serialization import HashType


def write_sd(path, sd, **kwargs):
    s = TensorSerializer(str(path), **kwargs)
    s.write_state_dict(sd)
    s.close()


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and tensor_bytes(a) == tensor_bytes(b)


@pytest.mark.parametrize("name", DTYPES)
def test_every_dtype_round_trips(tmp_path, name):
    dtype = getattr(torch, name)
    sd = {"x": patterned(dtype, (4, 3), 1), "scalar": patterned(dtype, (), 2), "row": patterned(dtype, (7,), 3)}
    write_sd(tmp_path / "f.tensors", sd)
    with TensorDeserializer(tmp_path / "f.tensors", verify_hash=True) as d:
        for k, v in sd.items():
            got = d[k]
            assert isinstance(got, torch.nn.Parameter)
            assert same(got, v), k
            assert got.requires_grad == (dtype.is_floating_point or dtype.is_complex)


def test_dtype_strings_and_versions(tmp_path):
    """uint16/32/64 are stored as <u2/<u4/<u8 (version 1); opaque dtypes need version 2."""
    write_sd(
        tmp_path / "u.tensors",
        {"a": torch.tensor([0, 1, 2], dtype=torch.uint16), "b": torch.zeros(2, dtype=torch.uint64)},
    )
    with TensorDeserializer(tmp_path / "u.tensors", lazy_load=True) as d:
        assert d._version == 1
        assert [e.dtype for e in d._metadata.values()] == ["<u2", "<u8"]
    write_sd(tmp_path / "b.tensors", {"a": torch.zeros(2, dtype=torch.bfloat16)})
    with TensorDeserializer(tmp_path / "b.tensors", lazy_load=True) as d:
        assert d._version == 2
        assert d._metadata[("a",)].dtype == "<V2\0torch.bfloat16"


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
def test_quantized_is_not_implemented(tmp_path):
    q = torch.quantize_per_tensor(torch.rand(4), 0.1, 0, torch.quint8)
    s = TensorSerializer(str(tmp_path / "q.tensors"))
    with pytest.raises(NotImplementedError, match="quint8"):
        s.write_tensor(0, "q", TensorType.PARAM, q)
    s.close()


def test_meta_non_contiguous_shared_and_views(tmp_path):
    base = torch.arange(30, dtype=torch.float32)
    sd = {
        "meta": torch.empty(3, 4, device="meta"),
        "t": torch.arange(12.0).reshape(3, 4).t(),
        "stride": base[::3],
        "shared1": base[2:10],
        "shared2": base[5:25].view(4, 5),
        "conj": torch.tensor([1 + 2j, 3 - 4j]).conj(),
        "neg": torch.tensor([1.0, 2.0])._neg_view(),
        "expanded": torch.tensor([1, 2, 3]).expand(4, 3),
        "empty": torch.zeros(0, 5, dtype=torch.int32),
    }
    write_sd(tmp_path / "f.tensors", sd)
    with TensorDeserializer(tmp_path / "f.tensors", verify_hash=True) as d:
        assert d._version == 4
        assert torch.equal(d["meta"], torch.zeros(3, 4))
        for k in sd:
            if k != "meta":
                expected = sd[k].resolve_conj().resolve_neg()
                assert torch.equal(d[k].detach(), expected), k
        # Each tensor owns its memory: shared sources do not come back shared.
        assert d["shared1"].data_ptr() != d["shared2"].data_ptr()


def test_numpy_arrays(tmp_path):
    arrays = {
        "f4": numpy.arange(6, dtype=numpy.float32).reshape(2, 3),
        "u2": numpy.arange(5, dtype=numpy.uint16),
        "b": numpy.array([True, False]),
        "nc": numpy.arange(12, dtype=numpy.int64).reshape(3, 4).T,
        "c16": numpy.array([1 + 1j, 2 - 2j]),
    }
    s = TensorSerializer(str(tmp_path / "n.tensors"))
    for i, (k, a) in enumerate(arrays.items()):
        s.write_tensor(i, k, TensorType.PARAM, a)
    s.close()
    with TensorDeserializer(tmp_path / "n.tensors", lazy_load=True) as d:
        for (_, ttype, name, array, opaque, tdtype), (k, a) in zip(d.read_numpy_arrays(), arrays.items()):
            assert name == k and ttype == TensorType.PARAM and not opaque and tdtype is None
            assert array.dtype == a.dtype and numpy.array_equal(array, a)
        assert [m for m, *_ in d.read_tensors()] == []  # paging continues after the last one read
    with pytest.raises(TypeError):
        TensorSerializer(str(tmp_path / "bad.tensors")).write_tensor(0, "x", TensorType.PARAM, numpy.array(["s"]))
    with pytest.raises(TypeError):
        TensorSerializer(str(tmp_path / "bad2.tensors")).write_tensor(
            0, "x", TensorType.PARAM, numpy.arange(3, dtype=">f4")
        )


def test_nested_state_dict_and_tree(tmp_path):
    sd = {
        "model": {"layers": [{"w": torch.ones(2), "b": torch.zeros(1)}, {"w": torch.full((2,), 2.0)}]},
        "head": (torch.tensor([1]), torch.tensor([2])),
        "plain.name": torch.tensor(3.0),
    }
    write_sd(tmp_path / "s.tensors", sd)
    with TensorDeserializer(tmp_path / "s.tensors", lazy_load=True) as d:
        assert list(d.keys()) == ["model", "head", "plain.name"]
        assert "model" in d and "nope" not in d
        assert list(d["model"]["layers"].keys()) == [0, 1]
        assert torch.equal(d["model"]["layers"][1]["w"], torch.full((2,), 2.0))
        tree = d.tree()
        assert isinstance(tree["model"]["layers"], list) and isinstance(tree["head"], list)
        assert torch.equal(tree["head"][1], torch.tensor([2]))
        assert list(d.tree(("model", "layers", 0)).keys()) == ["w", "b"]
        assert d.tree(("missing",), default="d") == "d"
        only_w = d.tree(filter_func=lambda n: isinstance(n, tuple) and n[-1] == "w")
        assert list(only_w) == ["model"] and len(only_w["model"]["layers"]) == 2
        with pytest.raises(TypeError):
            d.tree("model")
        names = [n for _, _, n, _ in d.read_tensors()]
    assert names == [
        ("model", "layers", 0, "w"),
        ("model", "layers", 0, "b"),
        ("model", "layers", 1, "w"),
        ("head", 0),
        ("head", 1),
        "plain.name",
    ]
    # Lists at the top level.
    write_sd(tmp_path / "l.tensors", [torch.tensor(1), torch.tensor(2)])
    with TensorDeserializer(tmp_path / "l.tensors") as d:
        assert list(d.keys()) == [0, 1] and [int(t) for t in d.tree()] == [1, 2]


def test_write_module_names_order_and_load(tmp_path):
    m = filled_module(3)
    s = TensorSerializer(str(tmp_path / "m.tensors"))
    s.write_module(m)
    s.close()
    with TensorDeserializer(tmp_path / "m.tensors", lazy_load=True) as d:
        got = [(n, int(t), i) for i, t, n, _ in d.read_tensors()]
    assert got == [
        (".w", 0, 0),
        (".steps", 1, 0),
        (".scratch", 1, 0),
        ("body.0.weight", 0, 2),
        ("body.0.bias", 0, 2),
        ("body.1.weight", 0, 3),
        ("body.1.bias", 0, 3),
        ("body.2.weight", 0, 4),
        ("body.2.bias", 0, 4),
    ]
    with utils.no_init_or_tensor():
        empty = InteropModule()
    assert empty.body[0].weight.is_meta
    with TensorDeserializer(tmp_path / "m.tensors") as d:
        assert d.load_into_module(empty) == 9
        ok, results = d.verify_module(empty)
        assert ok and len(results) == 9
    for (n, a), (_, b) in zip(empty.state_dict().items(), m.state_dict().items()):
        assert torch.equal(a, b), n
    assert isinstance(empty.w, torch.nn.Parameter) and not isinstance(empty.steps, torch.nn.Parameter)
    assert "scratch" not in empty.state_dict()  # stays non-persistent
    assert torch.equal(empty.scratch, m.scratch)
    # A changed tensor fails verification, by name.
    with torch.no_grad():
        empty.body[0].bias[0] += 1
    with TensorDeserializer(tmp_path / "m.tensors") as d:
        ok, results = d.verify_module(empty)
    assert not ok and dict(results)["body.0.bias"] is False and dict(results)["body.0.weight"] is True


def test_write_module_options(tmp_path):
    m = filled_module(4)
    s = TensorSerializer(str(tmp_path / "m.tensors"))
    s.write_module(m, remove_tensors=True, include_non_persistent_buffers=False)
    s.close()
    assert m.w is None and m.body[0].weight is None
    with TensorDeserializer(tmp_path / "m.tensors") as d:
        assert ".scratch" not in d and ".steps" in d and len(d) == 8


def test_tied_weights_written_twice(tmp_path):
    emb = torch.nn.Embedding(5, 3)
    head = torch.nn.Linear(3, 5, bias=False)
    head.weight = emb.weight
    m = torch.nn.Sequential(emb, head)
    s = TensorSerializer(str(tmp_path / "t.tensors"))
    s.write_module(m)
    s.close()
    with TensorDeserializer(tmp_path / "t.tensors") as d:
        assert list(d.keys()) == ["0.weight", "1.weight"]  # once per owning module (docs/format.md §1.11)
        assert torch.equal(d["0.weight"], emb.weight) and torch.equal(d["1.weight"], emb.weight)


def test_lazy_load_any_order_and_filter(tmp_path):
    sd = {f"t{i}": torch.full((3,), float(i)) for i in range(6)}
    write_sd(tmp_path / "f.tensors", sd)
    with TensorDeserializer(tmp_path / "f.tensors", lazy_load=True) as d:
        assert torch.equal(d["t4"], sd["t4"])
        assert torch.equal(d["t1"], sd["t1"])  # earlier than the last load: still works
        assert d["t4"] is d["t4"]  # cached
        assert [n for *_, n, _ in d.read_tensors(num_tensors=2)] == ["t0", "t1"]
        assert [n for *_, n, _ in d.read_tensors(num_tensors=2)] == ["t2", "t3"]
        assert [n for *_, n, _ in d.read_tensors()] == ["t4", "t5"]
        assert list(d.read_tensors()) == []
        with pytest.raises(ValueError):
            list(d.read_tensors(num_tensors=-2))
    with TensorDeserializer(tmp_path / "f.tensors", filter_func=lambda n: n in ("t2", "t5")) as d:
        assert list(d.keys()) == ["t2", "t5"] and len(d) == 2
        with pytest.raises(KeyError):
            d["t0"]
        assert d.total_tensor_bytes == 24
    with TensorDeserializer(tmp_path / "f.tensors") as d:  # eager: read_tensors still yields all
        assert [n for *_, n, _ in d.read_tensors(filter_func=lambda n: n != "t0")] == ["t1", "t2", "t3", "t4", "t5"]


def test_filter_prunes_emptied_branches(tmp_path):
    write_sd(tmp_path / "s.tensors", {"a": {"x": torch.ones(1)}, "b": torch.ones(1)})
    with TensorDeserializer(tmp_path / "s.tensors", filter_func=lambda n: n == "b") as d:
        assert list(d.keys()) == ["b"]


def test_dtype_override_casts_every_non_bool_tensor_unless_asked_to_keep_kinds(tmp_path):
    sd = {
        "f": torch.tensor([1.5, 2.5]),
        "i": torch.tensor([70000]),
        "b": torch.tensor([True]),
        "h": torch.ones(1, dtype=torch.bfloat16),
    }
    write_sd(tmp_path / "f.tensors", sd)
    with TensorDeserializer(tmp_path / "f.tensors", dtype=torch.float16) as d:  # the reference's rule
        assert d["f"].dtype == torch.float16 and d["f"].requires_grad
        assert d["h"].dtype == torch.float16
        assert d["i"].dtype == torch.float16 and float(d["i"]) == float("inf") and not d["i"].requires_grad  # overflows
        assert d["b"].dtype == torch.bool
    with TensorDeserializer(tmp_path / "f.tensors", dtype=torch.float16, cast_within_kind=True) as d:
        assert d["f"].dtype == torch.float16 and d["f"].requires_grad
        assert d["h"].dtype == torch.float16
        assert d["i"].dtype == torch.int64 and int(d["i"]) == 70000
        assert d["b"].dtype == torch.bool
    with TensorDeserializer(tmp_path / "f.tensors", dtype=torch.int32) as d:  # no gradient for ints
        assert d["f"].dtype == torch.int32 and d["f"].tolist() == [1, 2] and not d["f"].requires_grad


@pytest.mark.parametrize("num_readers", [1, 2, 5])
def test_num_readers(tmp_path, num_readers):
    sd = {f"t{i}": patterned(torch.float32, (1000 + i,), i) for i in range(9)}
    write_sd(tmp_path / "f.tensors", sd)
    with TensorDeserializer(tmp_path / "f.tensors", num_readers=num_readers, verify_hash=True) as d:
        for k, v in sd.items():
            assert same(d[k], v)
    with pytest.raises(ValueError):
        TensorDeserializer(tmp_path / "f.tensors", num_readers=0)
    with pytest.raises(TypeError):
        TensorDeserializer(tmp_path / "f.tensors", num_readers="2")


def test_file_object_targets(tmp_path):
    sd = {"a": patterned(torch.float32, (300,), 1), "b": patterned(torch.bfloat16, (3, 3), 2)}
    # A real file (written with pwrite on its descriptor).
    with open(tmp_path / "f.tensors", "wb+") as f:
        s = TensorSerializer(f)
        s.write_state_dict(sd)
        s.close()
        assert f.closed
    # A BytesIO (written through its write/seek methods) and a BufferedRandom over it.
    buf = io.BytesIO()
    buf.close = lambda: None  # keep the bytes readable after the serializer closes it
    s = TensorSerializer(buf)
    s.write_state_dict(sd)
    s.close()
    assert buf.getvalue() == (tmp_path / "f.tensors").read_bytes()
    for source in (
        tmp_path / "f.tensors",
        str(tmp_path / "f.tensors"),
        io.BytesIO(buf.getvalue()),
        open(tmp_path / "f.tensors", "rb"),
    ):
        with TensorDeserializer(source, verify_hash=True) as d:
            assert same(d["a"], sd["a"]) and same(d["b"], sd["b"])
    with pytest.raises(ValueError):
        TensorSerializer(io.StringIO())
    with open(tmp_path / "r.tensors", "wb") as f:
        pass
    with open(tmp_path / "r.tensors", "rb") as f, pytest.raises(ValueError):
        TensorSerializer(f)


class CountingReader(io.RawIOBase):
    """A seekable binary stream without a descriptor that records every read's size."""

    def __init__(self, data: bytes, fail_after: int = -1):
        self._inner, self.reads, self._fail_after = io.BytesIO(data), [], fail_after

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, offset, whence=io.SEEK_SET):
        return self._inner.seek(offset, whence)

    def readinto(self, b):
        if len(self.reads) == self._fail_after:
            raise OSError("injected failure")
        n = self._inner.readinto(b)
        self.reads.append(n)
        return n


def test_file_object_without_descriptor_is_read_in_place(tmp_path):
    """The engine reads a descriptor-less file object through its own readinto: a lazy load of
    one tensor reads that tensor and the index, never the whole object."""
    big = patterned(torch.float32, (1 << 20,), 3)  # 4 MiB, past the 512 KiB first read
    small = patterned(torch.int16, (7,), 4)
    write_sd(tmp_path / "f.tensors", {"big": big, "small": small})
    data = (tmp_path / "f.tensors").read_bytes()
    stream = CountingReader(data)
    with TensorDeserializer(stream, lazy_load=True, verify_hash=True) as d:
        assert same(d["small"], small)
        assert sum(stream.reads) < len(data) // 4, stream.reads
        assert same(d["big"], big)
    assert stream.closed  # the deserializer closes a file object it was given
    # A read that fails names the object and the offset.
    failing = CountingReader(data, fail_after=2)
    with pytest.raises(OSError, match=r"CountingReader.*injected failure"):
        TensorDeserializer(failing)


def test_pipe_is_read_whole(tmp_path):
    """A stream that cannot seek (a pipe) still loads: the engine reads it once, in order."""
    sd = {"a": patterned(torch.float16, (33,), 5)}
    write_sd(tmp_path / "f.tensors", sd)
    r, w = os.pipe()
    data = (tmp_path / "f.tensors").read_bytes()

    def feed():
        with os.fdopen(w, "wb") as f:
            f.write(data)

    feeder = threading.Thread(target=feed)
    feeder.start()
    with os.fdopen(r, "rb") as pipe, TensorDeserializer(pipe) as d:
        assert same(d["a"], sd["a"])
    feeder.join()


def test_path_is_published_on_close_and_abort_keeps_old(tmp_path):
    target = tmp_path / "sub" / "f.tensors"
    s = TensorSerializer(str(target))
    s.write_state_dict({"a": torch.ones(2)})
    assert s.total_tensor_bytes == 8
    s.close()
    assert target.exists() and s.total_tensor_bytes == 8
    old = target.read_bytes()
    with pytest.raises(RuntimeError):
        with TensorSerializer(str(target)) as s:
            s.write_state_dict({"b": torch.ones(3)})
            raise RuntimeError("boom")
    assert target.read_bytes() == old
    assert not [p for p in target.parent.iterdir() if p.name != "f.tensors"]  # no temp files left


def test_several_writes_and_duplicates(tmp_path):
    s = TensorSerializer(str(tmp_path / "f.tensors"), limit_cpu_concurrency=1)
    s.write_tensor(0, "a", TensorType.PARAM, torch.ones(2))
    s.write_tensor(1, "b", TensorType.BUFFER, torch.zeros(3))
    with pytest.raises(ValueError, match="a"):
        s.write_tensor(0, "a", TensorType.PARAM, torch.ones(2))
    s.write_state_dict({"c": torch.ones(1)})
    s.close()
    with TensorDeserializer(tmp_path / "f.tensors") as d:
        assert list(d.keys()) == ["a", "b", "c"]
        assert [(i, int(t)) for i, t, _, _ in d.read_tensors()] == [(0, 0), (1, 1), (0, 2)]


def test_properties_and_close(tmp_path):
    write_sd(tmp_path / "f.tensors", {"a": torch.ones(4), "m": torch.empty(2, device="meta")})
    with TensorDeserializer(tmp_path / "f.tensors", lazy_load=True) as d:
        assert d.total_tensor_bytes == 24 and d.total_file_bytes == 16
        before = d.total_bytes_read
        d["a"]
        assert d.total_bytes_read >= before + 16
    d = TensorDeserializer(tmp_path / "f.tensors")
    assert d.total_tensor_bytes == 16  # after an eager load: bytes on disk (reference behaviour)
    assert d.total_bytes_read > 16
    d.close()
    assert torch.equal(d["a"], torch.ones(4))  # cached tensors survive close()
    lazy = TensorDeserializer(tmp_path / "f.tensors", lazy_load=True)
    lazy.close()
    with pytest.raises(OSError, match="closed"):
        lazy["a"]


def test_zero_length_opaque_warns(tmp_path):
    s = TensorSerializer(str(tmp_path / "z.tensors"))
    with pytest.warns(UserWarning, match="reference"):
        s.write_tensor(0, "z", TensorType.STATE_DICT, torch.zeros(0, 3, dtype=torch.bfloat16))
    s.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with TensorDeserializer(tmp_path / "z.tensors") as d:
            assert d["z"].shape == (0, 3) and d["z"].dtype == torch.bfloat16


def test_long_dims_round_trip_metadata(tmp_path):
    """A dim >= 2**32 needs data version 5 (as tensorizer 2.12 writes): meta keeps it cheap."""
    write_sd(tmp_path / "l.tensors", {"big": torch.empty(1 << 32, 2, device="meta"), "x": torch.ones(1)})
    with TensorDeserializer(tmp_path / "l.tensors", lazy_load=True) as d:
        assert d._version == 5 and d._metadata[("big",)].shape == (1 << 32, 2)
        assert torch.equal(d["x"], torch.ones(1))


def test_path_like_and_bytes_paths(tmp_path):
    write_sd(tmp_path / "p.tensors", {"a": torch.ones(1)})
    for spec in (tmp_path / "p.tensors", os.fsencode(tmp_path / "p.tensors")):
        with TensorDeserializer(spec) as d:
            assert torch.equal(d["a"], torch.ones(1))
    fd = os.open(tmp_path / "p.tensors", os.O_RDONLY)
    try:
        with TensorDeserializer(fd) as d:
            assert torch.equal(d["a"], torch.ones(1))
    finally:
        os.close(fd)


def test_loads_leave_the_garbage_collector_as_they_found_it(tmp_path):
    """Loads pause Python's cyclic GC while they make objects; afterwards it is in its old state,
    also when a load fails."""
    import gc

    write_sd(tmp_path / "f.tensors", {f"t{i}": torch.full((3,), float(i)) for i in range(50)})
    for was_enabled in (True, False):
        (gc.enable if was_enabled else gc.disable)()
        try:
            seen = []  # the collector's state while the deserializer indexes (filter_func runs then)
            for lazy in (False, True):
                keep = lambda name: seen.append(gc.isenabled()) or True  # noqa: E731
                with TensorDeserializer(tmp_path / "f.tensors", lazy_load=lazy, filter_func=keep) as d:
                    assert gc.isenabled() == was_enabled
                    assert [d[f"t{i}"][0].item() for i in range(50)] == [float(i) for i in range(50)]
                    assert gc.isenabled() == was_enabled
            assert seen and not any(seen), "paused while loading"
            with pytest.raises(ValueError):
                TensorDeserializer(tmp_path / "f.tensors", filter_func=lambda name: _raise())
            assert gc.isenabled() == was_enabled
        finally:
            gc.enable()


def _raise():
    raise ValueError("filter failed")


@pytest.mark.parametrize("mmap", [None, False])
def test_metadata_hashes_are_the_stored_ones_once_loaded(tmp_path, mmap):
    """Each loaded tensor's index entry carries the hashes its header stores (filled in when the
    index is asked for): CRC32 then SHA-256 of the hashable header followed by the tensor's bytes."""
    path = str(tmp_path / "h.tensors")
    sd = {"w": torch.arange(1000, dtype=torch.float32), "b": torch.tensor([True, False])}
    s = TensorSerializer(path)
    s.write_state_dict(sd)
    s.close()
    d = TensorDeserializer(path, device="cpu", mmap=mmap, lazy_load=True)
    assert all(e.hashes is None for e in d._metadata.values())  # nothing read yet
    d["w"]  # loads "w" only
    by_name = {p.normalize_(): (p, e) for p, e in d._metadata.items()}
    assert by_name["b"][1].hashes is None
    p, e = by_name["w"]
    data = d._records[p].hashable_header + tensor_bytes(sd["w"])
    assert [h.type for h in e.hashes] == [HashType.CRC32, HashType.SHA256]
    assert e.hashes[0].hash == zlib.crc32(data).to_bytes(4, "little")
    assert e.hashes[1].hash == hashlib.sha256(data).digest()
    d.close()
