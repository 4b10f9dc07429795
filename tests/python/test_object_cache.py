"""The local cache of remote objects from Python, against nginx and moto (scripts/with-servers.sh):
``TensorDeserializer(cache_dir=...)``, ``$TENSORIZER_CACHE_DIR`` and ``open_stream`` (the way vLLM
opens S3 objects) fetch an object once, later loads take the local file's routes (mapped from the
page cache) with the same bytes, a rewritten object is fetched again, and a cache directory that
cannot be made is an OSError naming it. Bytes a load cost the server are read from nginx's log.
"""

import os
import uuid

import pytest
import torch

from tensorizer import TensorDeserializer, TensorSerializer, stream_io

from test_remote import s3_open_kwargs, server_env


def state_dict(seed):
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(512, 1024, generator=g).to(torch.bfloat16),
        "layer.0.weight": torch.randn(1024, 1024, generator=g),
        "layer.0.bias": torch.randn(1024, generator=g),
        "ids": torch.arange(1000, dtype=torch.int64),
    }


def body_bytes(log, name):
    """Body bytes nginx sent for `name` (access log, "combined" format)."""
    total = 0
    with open(log) as f:
        for line in f:
            if f"/{name} " in line:
                total += int(line.split('"')[2].split()[1])
    return total


@pytest.fixture
def served(tmp_path):
    """(url, path on the server's disk, access log) of a fresh object name on nginx."""
    url, root, log = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT", "TZ_TEST_HTTP_ACCESS_LOG")
    name = f"pycache-{uuid.uuid4().hex}.tensors"
    path = os.path.join(root, name)
    yield f"{url}/{name}", path, log
    if os.path.exists(path):
        os.unlink(path)


def write(path, sd, mtime):
    serializer = TensorSerializer(path)
    serializer.write_state_dict(sd)
    serializer.close()
    os.utime(path, (mtime, mtime))  # nginx's ETag is mtime and size


def expect_equal(d, sd):
    assert set(d.keys()) == set(sd)
    for k, v in sd.items():
        assert torch.equal(d[k], v), k


def test_second_load_reads_the_local_copy(served, tmp_path):
    url, path, log = served
    name = os.path.basename(path)
    sd = state_dict(1)
    write(path, sd, 1700000000)
    size = os.path.getsize(path)
    cache = tmp_path / "cache"
    with TensorDeserializer(url, device="cpu", cache_dir=cache) as d:
        expect_equal(d, sd)
    probe = min(size, 512 << 10)  # every open's probe brings the first 512 KiB
    assert body_bytes(log, name) == size + probe  # the probe, then the object once
    assert [f.stat().st_size for f in cache.glob("*.tensors")] == [size]

    with TensorDeserializer(url, device="cpu", cache_dir=cache) as d:
        expect_equal(d, sd)
        assert set(d._loaded_via.values()) == {"mapped"}  # page-cache pages of the local copy
    assert body_bytes(log, name) == size + 2 * probe  # only the second probe


def test_environment_variable_and_a_rewritten_object(served, tmp_path, monkeypatch):
    url, path, log = served
    name = os.path.basename(path)
    monkeypatch.setenv("TENSORIZER_CACHE_DIR", str(tmp_path / "cache"))
    write(path, state_dict(1), 1700000000)
    with TensorDeserializer(url, device="cpu", lazy_load=True) as d:
        expect_equal(d, state_dict(1))
    write(path, state_dict(2), 1700000500)
    before = body_bytes(log, name)
    with TensorDeserializer(url, device="cpu") as d:
        expect_equal(d, state_dict(2))
    assert body_bytes(log, name) - before == os.path.getsize(path) + min(os.path.getsize(path), 512 << 10)
    assert len(list((tmp_path / "cache").glob("*.tensors"))) == 1


def test_open_stream_over_s3_uses_the_cache(tmp_path):
    (bucket,) = server_env("TZ_TEST_S3_BUCKET")
    uri = f"s3://{bucket}/pycache-{uuid.uuid4().hex}.tensors"
    sd = state_dict(3)
    with stream_io.open_stream(uri, "wb", **s3_open_kwargs()) as f:
        serializer = TensorSerializer(f)
        serializer.write_state_dict(sd)
        serializer.close()
    for _ in range(2):
        with stream_io.open_stream(uri, "rb", cache_dir=tmp_path, **s3_open_kwargs()) as f:
            with TensorDeserializer(f, device="cpu") as d:
                expect_equal(d, sd)
    assert len(list(tmp_path.glob("*.tensors"))) == 1


def test_an_unusable_cache_directory_is_an_error_naming_it(served, tmp_path):
    url, path, _ = served
    write(path, state_dict(1), 1700000000)
    (tmp_path / "a-file").write_bytes(b"x")
    bad = tmp_path / "a-file" / "cache"
    with pytest.raises(OSError, match=str(bad)):
        TensorDeserializer(url, device="cpu", cache_dir=bad)
