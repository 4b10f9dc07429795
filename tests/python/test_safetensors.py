"""safetensors files through the engine (tensorizer.safetensors and TensorDeserializer): the same
tensors, dtypes and metadata as the safetensors library gives, on every host route, from HTTP and
S3, and hostile headers refused as ValueErrors naming the file and the cause."""

import os
import struct
import uuid

import pytest
import safetensors.torch
import torch

import tensorizer.safetensors as ts
from tensorizer import TensorDeserializer, stream_io

from test_remote import s3_open_kwargs, server_env


def sample_state_dict():
    g = torch.Generator().manual_seed(3)
    sd = {
        "model.embed.weight": torch.randn(257, 33, generator=g),
        "model.layers.0.w": torch.randn(64, 64, generator=g).to(torch.bfloat16),
        "model.layers.0.b": torch.randn(13, generator=g).to(torch.float16),
        "ids": torch.arange(11, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "u8": torch.arange(5, dtype=torch.uint8),
        "i8": torch.arange(-3, 4, dtype=torch.int8),
        "i16": torch.arange(6, dtype=torch.int16),
        "i32": torch.arange(6, dtype=torch.int32),
        "f64": torch.randn(4, generator=g, dtype=torch.float64),
        "c64": torch.randn(3, generator=g, dtype=torch.complex64),
        "f8": torch.randn(9, generator=g).to(torch.float8_e4m3fn),
        "f8b": torch.randn(9, generator=g).to(torch.float8_e5m2),
        "empty": torch.zeros(0, 7),
        "scalar": torch.tensor(2.5),
    }
    for name in ("u16", "u32", "u64"):
        dtype = getattr(torch, "uint" + name[1:])
        sd[name] = torch.arange(4).to(dtype)
    return sd


def same(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.dtype == b.dtype and a.shape == b.shape and a.view(-1).view(torch.uint8).equal(b.view(-1).view(torch.uint8))
    )


@pytest.fixture
def st_file(tmp_path):
    path = str(tmp_path / "model.safetensors")
    sd = sample_state_dict()
    safetensors.torch.save_file(sd, path, metadata={"format": "pt", "note": "ü"})
    return path, sd


def drop_page_cache(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


@pytest.mark.parametrize("mmap", [None, True, False])
@pytest.mark.parametrize("cold", [False, True])
def test_load_file_matches_the_safetensors_library(st_file, mmap, cold, monkeypatch):
    path, sd = st_file
    if mmap is not None:
        monkeypatch.setenv("TENSORIZER_MMAP", "1" if mmap else "0")
    if cold:
        drop_page_cache(path)
    got = ts.load_file(path)
    theirs = safetensors.torch.load_file(path)
    assert list(got) == list(theirs) or sorted(got) == sorted(theirs)
    for name, t in sd.items():
        assert type(got[name]) is torch.Tensor
        assert same(got[name], t), name
        assert same(got[name], theirs[name]), name


def test_the_staged_pipeline_and_lazy_verified_loads(st_file, monkeypatch):
    path, sd = st_file
    with TensorDeserializer(path, device="cpu", lazy_load=True, verify_hash=True) as d:
        assert all(same(d[k].data, v) for k, v in sd.items())
    monkeypatch.setenv("TENSORIZER_STAGED", "1")  # the pipeline CUDA loads take, into CPU memory
    got = ts.load_file(path)
    assert all(same(got[k], v) for k, v in sd.items())


def test_the_default_route_maps_aligned_tensors_of_a_cached_file(st_file):
    path, _ = st_file
    with TensorDeserializer(path, device="cpu") as d:
        via = {p[0]: v for p, v in d._loaded_via.items()}
    # safetensors aligns its buffer to 8 bytes; a tensor at its element size's alignment is mapped.
    assert via["model.embed.weight"] == "mapped"
    assert set(via.values()) <= {"mapped", "direct", "copied"}


def test_safe_open_keys_metadata_tensors_and_slices(st_file):
    path, sd = st_file
    with ts.safe_open(path, framework="pt") as ours, safetensors.safe_open(path, framework="pt") as theirs:
        assert ours.keys() == sorted(theirs.keys())
        assert ours.metadata() == theirs.metadata() == {"format": "pt", "note": "ü"}
        for name in ours.keys():
            assert same(ours.get_tensor(name), theirs.get_tensor(name)), name
        s, t = ours.get_slice("model.embed.weight"), theirs.get_slice("model.embed.weight")
        assert s.get_shape() == t.get_shape() == [257, 33]
        assert s.get_dtype() == t.get_dtype() == "F32"
        assert ours.get_slice("model.layers.0.w").get_dtype() == theirs.get_slice("model.layers.0.w").get_dtype()
        assert torch.equal(s[10:20, 3:5], t[10:20, 3:5])
        with pytest.raises(KeyError):
            ours.get_tensor("missing")
    with pytest.raises(ValueError, match="framework"):
        ts.safe_open(path, framework="np")


def test_load_from_bytes_and_a_tensors_file_is_refused(st_file, tmp_path):
    path, sd = st_file
    with open(path, "rb") as f:
        got = ts.load(f.read())
    assert all(same(got[k], v) for k, v in sd.items())
    from tensorizer import TensorSerializer

    tz = str(tmp_path / "m.tensors")
    with TensorSerializer(tz) as s:
        s.write_state_dict({"a": torch.ones(2)})
    with pytest.raises(ValueError, match="is not a safetensors file"):
        ts.load_file(tz)


def test_deserializer_mapping_view_and_load_into_module(tmp_path):
    def make():
        return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))

    model = make()
    model[1].running_mean.add_(3)
    path = str(tmp_path / "m.safetensors")
    safetensors.torch.save_file(model.state_dict(), path)
    fresh = make()
    with TensorDeserializer(path, device="cpu", lazy_load=True) as d:
        assert sorted(d.keys()) == sorted(model.state_dict())
        assert torch.equal(d["0.weight"], model[0].weight)
        d.load_into_module(fresh)
    for k, v in model.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k
    assert sorted(n for n, _ in fresh.named_buffers()) == sorted(n for n, _ in model.named_buffers())
    assert sorted(n for n, _ in fresh.named_parameters()) == sorted(n for n, _ in model.named_parameters())


def test_over_http_and_s3(st_file):
    path, sd = st_file
    with open(path, "rb") as f:
        data = f.read()
    url, root = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT")
    name = f"st-{uuid.uuid4().hex}.safetensors"
    with open(os.path.join(root, name), "wb") as f:
        f.write(data)
    got = ts.load_file(f"{url}/{name}")
    assert all(same(got[k], v) for k, v in sd.items())

    _, bucket = server_env("TZ_TEST_S3_ENDPOINT", "TZ_TEST_S3_BUCKET")
    uri = f"s3://{bucket}/{name}"
    with stream_io.open_stream(uri, "wb", **s3_open_kwargs()) as f:
        f.write(data)
    stream = stream_io.open_stream(uri, **s3_open_kwargs())
    with TensorDeserializer(stream, device="cpu", lazy_load=True) as d:
        assert all(same(d[k].data, v) for k, v in sd.items())


def header_file(tmp_path, header: bytes, data: bytes = b"") -> str:
    path = str(tmp_path / f"{uuid.uuid4().hex}.safetensors")
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header + data)
    return path


@pytest.mark.parametrize(
    "header, data, message",
    [
        (b'{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}', b"\0" * 4, "dtype and shape make 8 bytes"),
        (b'{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 2, "past the data buffer"),
        (b'{"a":{"dtype":"XX","shape":[1],"data_offsets":[0,1]}}', b"\0", "unknown safetensors dtype 'XX'"),
        (b'{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}', b"\0", "not valid JSON"),
        (
            b'{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[1,3]}}',
            b"\0" * 3,
            "overlaps",
        ),
        (b'{"__metadata__":{"k":[1]}}', b"", "is not a string"),
    ],
)
def test_hostile_headers_are_value_errors_naming_file_and_cause(tmp_path, header, data, message):
    path = header_file(tmp_path, header, data)
    with pytest.raises(ValueError, match=message) as err:
        ts.load_file(path)
    assert path in str(err.value)


def test_an_unsupported_dtype_is_named(tmp_path):
    path = header_file(tmp_path, b'{"a":{"dtype":"F4","shape":[2],"data_offsets":[0,1]}}', b"\0")
    with pytest.raises(Exception, match="F4") as err:
        ts.load_file(path)
    assert path in str(err.value)


# -- writing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("metadata", [None, {}, {"format": "pt"}])
def test_save_writes_the_bytes_the_safetensors_library_writes(metadata, tmp_path):
    sd = sample_state_dict()
    sd['odd "name"\n\u00e9'] = torch.arange(6.0)
    assert ts.save(sd, metadata=metadata) == safetensors.torch.save(sd, metadata=metadata)
    ours, theirs = tmp_path / "ours.safetensors", tmp_path / "theirs.safetensors"
    ts.save_file(sd, ours, metadata=metadata)
    safetensors.torch.save_file(sd, str(theirs), metadata=metadata)
    assert ours.read_bytes() == theirs.read_bytes()
    assert ts.save({}) == safetensors.torch.save({})


def test_save_refuses_what_safetensors_refuses_and_keeps_the_old_file(tmp_path):
    path = tmp_path / "m.safetensors"
    ts.save_file({"a": torch.ones(2)}, path)
    before = path.read_bytes()
    base = torch.arange(12.0).view(3, 4)
    with pytest.raises(ValueError, match="non contiguous"):
        ts.save_file({"t": base.t()}, path)
    with pytest.raises(RuntimeError, match="share memory"):
        ts.save_file({"a": base, "b": base.view(-1)}, path)
    with pytest.raises(ValueError, match="expected torch.Tensor"):
        ts.save_file({"a": [1, 2]}, path)
    with pytest.raises(ValueError, match="metadata"):
        ts.save_file({"a": torch.ones(1)}, path, metadata={"k": 1})
    with pytest.raises(Exception, match="complex128"):
        ts.save_file({"a": torch.ones(1, dtype=torch.complex128)}, path)
    assert path.read_bytes() == before
    assert not [p for p in os.listdir(tmp_path) if p != "m.safetensors"]


def test_save_to_s3_and_a_file_object_round_trips(tmp_path):
    sd = sample_state_dict()
    _, bucket = server_env("TZ_TEST_S3_ENDPOINT", "TZ_TEST_S3_BUCKET")
    uri = f"s3://{bucket}/saved-{uuid.uuid4().hex}.safetensors"
    with stream_io.open_stream(uri, "wb", **s3_open_kwargs()) as f:
        ts.save_file(sd, f, metadata={"format": "pt"})
    with stream_io.open_stream(uri, **s3_open_kwargs()) as f:
        data = f.read()
    assert data == safetensors.torch.save(sd, metadata={"format": "pt"})
    with open(tmp_path / "obj.safetensors", "wb") as f:
        ts.save_file(sd, f)
    assert (tmp_path / "obj.safetensors").read_bytes() == safetensors.torch.save(sd)


def test_the_cli_converts_both_ways(tmp_path):
    import shutil
    import subprocess

    from tensorizer import TensorSerializer

    cli = shutil.which("tensorizer")
    sd = {k: v for k, v in sample_state_dict().items() if k != "scalar"}
    nested = {"layers": [{"w": torch.arange(4.0)}, {"w": torch.arange(3.0)}], **sd}
    src, st, back = tmp_path / "m.tensors", tmp_path / "m.safetensors", tmp_path / "back.tensors"
    with TensorSerializer(str(src)) as s:
        s.write_state_dict(nested)
    run = subprocess.run([cli, "convert", str(src), str(st), "--quiet"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    theirs = safetensors.torch.load_file(str(st))
    assert all(same(theirs[k], v) for k, v in sd.items())
    assert torch.equal(theirs["layers.1.w"], torch.arange(3.0))
    shown = subprocess.run([cli, "inspect", str(st)], capture_output=True, text=True).stdout
    assert f"{st}: safetensors, {len(sd) + 2} tensors" in shown and "metadata tensorizer.names = " in shown
    checked = subprocess.run([cli, "verify", str(st)], capture_output=True, text=True)
    assert checked.returncode == 0 and "safetensors files store no hashes" in checked.stdout
    run = subprocess.run([cli, "convert", str(st), str(back)], capture_output=True, text=True)
    assert run.returncode == 0 and "wrote" in run.stderr, run.stderr
    with TensorDeserializer(str(back), device="cpu") as d:
        assert torch.equal(d["layers"][1]["w"], torch.arange(3.0))  # the structure came back
        assert all(same(d[k].data, v) for k, v in sd.items())
    bad = subprocess.run(
        [cli, "convert", str(src), str(tmp_path / "x"), "--to", "onnx"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--to 'onnx'" in bad.stderr


def test_a_sharded_checkpoint_loads_from_its_directory_index_and_over_http(tmp_path):
    import shutil

    save_torch_state_dict = pytest.importorskip("huggingface_hub").save_torch_state_dict  # writes the shards

    g = torch.Generator().manual_seed(5)
    sd = {f"layers.{i}.w": torch.randn(64, 64, generator=g) for i in range(6)}
    sd["head.b"] = torch.randn(7, generator=g).to(torch.bfloat16)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    save_torch_state_dict(sd, str(ckpt), max_shard_size="40KB")
    shards = sorted(p.name for p in ckpt.iterdir() if p.suffix == ".safetensors")
    assert len(shards) > 2 and (ckpt / "model.safetensors.index.json").exists()
    for where in (ckpt, ckpt / "model.safetensors.index.json"):
        got = ts.load_checkpoint(where)
        assert list(got) == list(json_weight_map(ckpt))
        assert all(same(got[k], v) for k, v in sd.items())
    url, root = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT")
    name = f"ckpt-{uuid.uuid4().hex}"
    shutil.copytree(ckpt, os.path.join(root, name))
    got = ts.load_checkpoint(f"{url}/{name}/model.safetensors.index.json")
    assert all(same(got[k], v) for k, v in sd.items())
    (ckpt / shards[0]).unlink()
    with pytest.raises(OSError):
        ts.load_checkpoint(ckpt)


def json_weight_map(ckpt):
    import json

    return json.loads((ckpt / "model.safetensors.index.json").read_text())["weight_map"]


def test_python_m_tensorizer_converts_a_torch_checkpoint(tmp_path):
    import subprocess
    import sys

    sd = {k: v for k, v in sample_state_dict().items() if k != "scalar"}
    sd["tied"] = sd["model.embed.weight"]  # shares storage, as tied weights do
    pt = tmp_path / "pytorch_model.bin"
    torch.save(sd, pt)
    for dst in ("m.safetensors", "m.tensors"):
        run = subprocess.run(
            [sys.executable, "-m", "tensorizer", "convert", str(pt), str(tmp_path / dst)],
            capture_output=True,
            text=True,
        )
        assert run.returncode == 0, run.stderr
    got = safetensors.torch.load_file(str(tmp_path / "m.safetensors"))
    assert all(same(got[k], v) for k, v in sd.items())
    with TensorDeserializer(str(tmp_path / "m.tensors"), device="cpu") as d:
        assert all(same(d[k].data, v) for k, v in sd.items())
    run = subprocess.run([sys.executable, "-m", "tensorizer", "--version"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip()


def test_a_sharded_gpt2_checkpoint_converts_to_a_model_with_identical_outputs(tmp_path):
    import subprocess
    import sys

    transformers = pytest.importorskip("transformers")  # installed by scripts/install-deps.sh
    GPT2Config, GPT2LMHeadModel = transformers.GPT2Config, transformers.GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=64, vocab_size=300, n_positions=32)
    model = GPT2LMHeadModel(config).eval()
    ckpt = tmp_path / "gpt2"
    model.save_pretrained(str(ckpt), max_shard_size="100KB", safe_serialization=True)
    assert len([p for p in ckpt.iterdir() if p.suffix == ".safetensors"]) > 2
    out = tmp_path / "gpt2.tensors"
    run = subprocess.run(
        [sys.executable, "-m", "tensorizer", "convert", str(ckpt), str(out)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    fresh = GPT2LMHeadModel(config).eval()
    with TensorDeserializer(str(out), device="cpu", verify_hash=True) as d:
        missing, unexpected = fresh.load_state_dict({k: v.data for k, v in d.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    ids = torch.arange(20).view(1, 20)
    with torch.no_grad():
        assert torch.equal(fresh(ids).logits, model(ids).logits)


@pytest.mark.parametrize("max_shard_size", ["40KB", "1MB", 20000])
def test_save_checkpoint_writes_what_huggingface_hub_writes(tmp_path, max_shard_size):
    hub = pytest.importorskip("huggingface_hub")
    g = torch.Generator().manual_seed(6)
    sd = {f"layers.{i}.w": torch.randn(40 + i, 64, generator=g) for i in range(6)}
    sd["big"] = torch.randn(100, 100, generator=g)  # larger than the smaller limits: a shard of its own
    sd["head.b"] = torch.randn(7, generator=g).to(torch.bfloat16)
    ours, theirs = tmp_path / "ours", tmp_path / "theirs"
    theirs.mkdir()
    # One file holds {"format": "pt", **metadata}, whose key order safetensors leaves to chance.
    metadata = None if max_shard_size == "1MB" else {"k": "v"}
    written = ts.save_checkpoint(sd, ours, max_shard_size=max_shard_size, metadata=metadata)
    hub.save_torch_state_dict(sd, str(theirs), max_shard_size=max_shard_size, metadata=metadata)
    assert sorted(written) == sorted(os.listdir(theirs))
    for name in written:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    got = ts.load_checkpoint(ours)
    assert all(same(got[k], v) for k, v in sd.items())


def test_save_checkpoint_to_s3_loads_back(monkeypatch):
    endpoint, bucket = server_env("TZ_TEST_S3_ENDPOINT", "TZ_TEST_S3_BUCKET")
    sd = {f"w{i}": torch.full((100, 100), float(i)) for i in range(4)}
    prefix = f"s3://{bucket}/ckpt-{uuid.uuid4().hex}"
    # URIs alone: credentials and endpoint from the environment (the default chain).
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", endpoint if "://" in endpoint else f"http://{endpoint}")
    written = ts.save_checkpoint(sd, prefix, max_shard_size="50KB")
    assert len(written) == 5  # four shards and the index
    got = ts.load_checkpoint(f"{prefix}/model.safetensors.index.json")
    assert all(torch.equal(got[k], v) for k, v in sd.items())


def test_redis_stores_and_serves_safetensors(st_file):
    import shutil
    import subprocess

    path, sd = st_file
    (url,) = server_env("TZ_TEST_REDIS_URL")
    saved, copied = f"{url}/st-{uuid.uuid4().hex}", f"{url}/st-{uuid.uuid4().hex}"
    ts.save_file(sd, saved, metadata={"format": "pt", "note": "ü"})
    run = subprocess.run([shutil.which("tensorizer"), "cp", path, copied, "-q"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    for uri in (saved, copied):
        got = ts.load_file(uri)
        assert all(same(got[k], v) for k, v in sd.items()), uri
        with ts.safe_open(uri, "pt") as f:
            assert f.metadata() == {"format": "pt", "note": "ü"}


def test_python_m_tensorizer_converts_into_a_sharded_checkpoint(tmp_path):
    import subprocess
    import sys

    from tensorizer import TensorSerializer

    g = torch.Generator().manual_seed(8)
    nested = {
        "layers": [{"w": torch.randn(64, 64, generator=g)} for _ in range(4)],
        "head": torch.randn(9, generator=g),
    }
    src = tmp_path / "m.tensors"
    with TensorSerializer(str(src)) as s:
        s.write_state_dict(nested)
    dst = tmp_path / "ckpt"
    run = subprocess.run(
        [sys.executable, "-m", "tensorizer", "convert", str(src), f"{dst}/", "--shard-size", "40KB", "-q"],
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert (dst / "model.safetensors.index.json").exists()
    got = ts.load_checkpoint(dst)
    assert sorted(got) == sorted([f"layers.{i}.w" for i in range(4)] + ["head"])
    assert all(torch.equal(got[f"layers.{i}.w"], nested["layers"][i]["w"]) for i in range(4))
    assert torch.equal(got["head"], nested["head"])
