"""The Python API over the remote transports, against the real servers of scripts/with-servers.sh
(nginx HTTP/HTTPS, moto S3, redis-server): TensorDeserializer over http://, https:// (CAInfo),
redirects, s3:// and redis:// (eager and lazy, 1 and 4 readers) gives the manifest's bytes;
TensorSerializer writes to s3:// (URI and open_stream) and redis:// (credentials in the URI too);
to_redis stores the reference key layout.

Without the servers' TZ_TEST_* variables these tests skip, except under `make test`
(TZ_REQUIRE_SERVERS=1), where they fail.
"""

import hashlib
import os
import uuid

import pytest
import torch

from tensorizer import TensorDeserializer, TensorSerializer, stream_io

from conftest import FIXTURES_ROOT, fault_proxy, tensor_bytes

FIXTURES = FIXTURES_ROOT / "tensorizer-2.11.1"
MANIFEST = __import__("json").loads((FIXTURES / "manifest.json").read_text())
PLAIN = [n for n, f in MANIFEST["files"].items() if not f.get("encryption")]


def server_env(*names):
    """The values of the TZ_TEST_* variables `names` (fails or skips when one is missing)."""
    missing = [n for n in names if not os.environ.get(n)]
    if missing:
        msg = f"{', '.join(missing)} not set: run under scripts/with-servers.sh (make test does)"
        if os.environ.get("TZ_REQUIRE_SERVERS") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return [os.environ[n] for n in names]


def lookup(mapping, name):
    if isinstance(name, str):
        return mapping[name]
    for part in name:
        mapping = mapping[part]
    return mapping


def expect_manifest(deserializer, name):
    """Every tensor of fixture `name` has the manifest's bytes (meta tensors: zeros)."""
    for info in MANIFEST["files"][name]["tensors"]:
        data = tensor_bytes(lookup(deserializer, info["name"]))
        if info["meta"]:
            assert not any(data), info["name"]
        else:
            assert hashlib.sha256(data).hexdigest() == info["sha256"], info["name"]


def s3_open_kwargs():
    (endpoint,) = server_env("TZ_TEST_S3_ENDPOINT")
    return dict(s3_access_key_id="testing", s3_secret_access_key="testing", s3_endpoint=endpoint, force_http=True)


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("num_readers", [1, 4])
@pytest.mark.parametrize("lazy", [False, True])
def test_deserializer_over_http(name, num_readers, lazy):
    (url,) = server_env("TZ_TEST_HTTP_URL")
    with TensorDeserializer(f"{url}/fixtures/{name}", device="cpu", num_readers=num_readers, lazy_load=lazy) as d:
        expect_manifest(d, name)


@pytest.mark.parametrize("num_readers", [1, 4])
def test_deserializer_over_https_with_ca_file(num_readers):
    url, ca = server_env("TZ_TEST_HTTPS_URL", "TZ_TEST_CA_FILE")
    stream = stream_io.open_stream(f"{url}/fixtures/dtypes.tensors", certificate_handling=stream_io.CAInfo(cacert=ca))
    with TensorDeserializer(stream, device="cpu", num_readers=num_readers) as d:
        expect_manifest(d, "dtypes.tensors")


@pytest.mark.parametrize("variable", ["SSL_CERT_FILE", "CURL_CA_BUNDLE"])
def test_https_trusts_the_ca_bundle_the_environment_names(monkeypatch, variable):
    """As curl and OpenSSL users expect: $CURL_CA_BUNDLE or $SSL_CERT_FILE names the CA bundle."""
    url, ca = server_env("TZ_TEST_HTTPS_URL", "TZ_TEST_CA_FILE")
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)  # it wins over SSL_CERT_FILE, as in curl
    monkeypatch.setenv(variable, ca)
    with TensorDeserializer(f"{url}/fixtures/dtypes.tensors", device="cpu") as d:
        expect_manifest(d, "dtypes.tensors")


def test_https_without_the_ca_fails():
    (url,) = server_env("TZ_TEST_HTTPS_URL")
    with pytest.raises(Exception) as err:
        TensorDeserializer(f"{url}/fixtures/dtypes.tensors", device="cpu")
    assert "certificate" in str(err.value).lower()


def test_stream_open_failures_read_as_the_references_do():
    """Code matching the reference's messages keeps working: "Failed to open stream", and a
    certificate failure names cURL exit code 60."""
    url, https = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTPS_URL")
    with pytest.raises(OSError, match=r"^Failed to open stream: .*404"):
        stream_io.open_stream(f"{url}/fixtures/missing.tensors")
    with pytest.raises(OSError, match=r"^Failed to open stream: .*cURL exit code 60"):
        stream_io.open_stream(f"{https}/fixtures/dtypes.tensors")


def test_stream_latencies_as_the_reference_reports_them():
    url, redis_url = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_REDIS_URL")
    with stream_io.open_stream(f"{url}/fixtures/dtypes.tensors") as f:
        assert isinstance(f, stream_io.CURLStreamFile)
        f.read(100)
        f.read(100)
        assert len(f.popen_latencies) == 1 and 0 < f.popen_latencies[0] < 30
        assert len(f.http_response_latencies) == 2 and all(0 < t < 30 for t in f.http_response_latencies)
    prefix = f"py-{uuid.uuid4().hex}"
    with TensorDeserializer(str(FIXTURES / "dtypes.tensors"), device="cpu", lazy_load=True) as src:
        src.to_redis(redis_client(redis_url), prefix)
    with stream_io.open_stream(f"{redis_url}/{prefix}") as f:
        assert isinstance(f, stream_io.RedisStreamFile)
        assert f.read(8) == (FIXTURES / "dtypes.tensors").read_bytes()[:8]
        assert 0 < f.setup_latency < 30
        assert len(f.response_latencies) == 1 and 0 < f.response_latencies[0] < 30


@pytest.mark.parametrize("lazy", [False, True])
def test_a_redirected_url_loads_and_reads_as_a_stream(lazy):
    """A model hub's URL answers with a redirect to where the bytes are: loads and streams follow it
    (302 to http, 301 to https) and keep the URL they were given."""
    redirect, ca = server_env("TZ_TEST_HTTP_REDIRECT_URL", "TZ_TEST_CA_FILE")
    uri = f"{redirect}/fixtures/dtypes.tensors"
    with TensorDeserializer(uri, device="cpu", num_readers=4, lazy_load=lazy) as d:
        expect_manifest(d, "dtypes.tensors")
    handling = stream_io.CAInfo(cacert=ca)
    with stream_io.open_stream(f"{redirect}/https/fixtures/dtypes.tensors", certificate_handling=handling) as f:
        assert f.read() == (FIXTURES / "dtypes.tensors").read_bytes()
    with pytest.raises(OSError, match=r"redirects"):
        TensorDeserializer(f"{redirect}/loop/fixtures/dtypes.tensors", device="cpu")


def test_http_404():
    (url,) = server_env("TZ_TEST_HTTP_URL")
    with pytest.raises(Exception) as err:
        TensorDeserializer(f"{url}/fixtures/missing.tensors", device="cpu")
    assert "404" in str(err.value)


def test_cache_status_from_a_caching_proxy():
    """cache_status is the X-Cache-Status a caching proxy (nginx proxy_cache) sent: MISS, then HIT."""
    url, root = server_env("TZ_TEST_HTTP_CACHE_URL", "TZ_TEST_HTTP_ROOT")
    name = PLAIN[0]
    fresh = f"cache-{uuid.uuid4().hex}.tensors"  # never requested before: the proxy's cache is cold
    with open(os.path.join(root, fresh), "wb") as f:
        f.write((FIXTURES / name).read_bytes())
    try:
        with TensorDeserializer(f"{url}/{fresh}", device="cpu") as d:
            assert d.cache_status == "MISS"
            expect_manifest(d, name)
        with TensorDeserializer(f"{url}/{fresh}", device="cpu") as d:
            assert d.cache_status == "HIT"
            expect_manifest(d, name)
        assert d.cache_status == "HIT"  # still answered after close
        with TensorDeserializer(str(FIXTURES / name), device="cpu") as d:
            assert d.cache_status is None  # not an HTTP source
    finally:
        os.unlink(os.path.join(root, fresh))


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("num_readers", [1, 4])
@pytest.mark.parametrize("lazy", [False, True])
def test_deserializer_over_s3(name, num_readers, lazy):
    (bucket,) = server_env("TZ_TEST_S3_BUCKET")
    stream = stream_io.open_stream(f"s3://{bucket}/fixtures/{name}", **s3_open_kwargs())
    with TensorDeserializer(stream, device="cpu", num_readers=num_readers, lazy_load=lazy) as d:
        expect_manifest(d, name)


def sample_state_dict():
    g = torch.Generator().manual_seed(5)
    return {
        "embed.weight": torch.randn(1000, 64, generator=g),
        "norm.bias": torch.arange(7, dtype=torch.float16),
        "big": torch.randint(0, 255, (20 << 20,), dtype=torch.uint8, generator=g),  # multipart upload
    }


def expect_state_dict(d, sd):
    assert set(d.keys()) == set(sd.keys())
    for k, v in sd.items():
        assert torch.equal(d[k], v), k


def expect_round_trip(uri):
    """sample_state_dict() saved to `uri` loads back exactly (4 readers)."""
    sd = sample_state_dict()
    s = TensorSerializer(uri)
    s.write_state_dict(sd)
    s.close()
    with TensorDeserializer(uri, device="cpu", num_readers=4) as d:
        expect_state_dict(d, sd)


def test_serializer_to_s3_uri_round_trips(monkeypatch):
    endpoint, bucket = server_env("TZ_TEST_S3_ENDPOINT", "TZ_TEST_S3_BUCKET")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    uri = f"s3://{bucket}/py-{uuid.uuid4().hex}.tensors"
    expect_round_trip(uri)


def test_serializer_to_s3_open_stream_round_trips():
    (bucket,) = server_env("TZ_TEST_S3_BUCKET")
    uri = f"s3://{bucket}/py-{uuid.uuid4().hex}.tensors"
    sd = sample_state_dict()
    with stream_io.open_stream(uri, "wb+", **s3_open_kwargs()) as f:
        s = TensorSerializer(f)
        s.write_state_dict(sd)
        s.close()
    with TensorDeserializer(stream_io.open_stream(uri, **s3_open_kwargs()), device="cpu") as d:
        expect_state_dict(d, sd)


def redis_client(url):
    redis = pytest.importorskip("redis")
    host, port = url.split("://", 1)[1].split(":")
    return redis.Redis(host=host, port=int(port))


@pytest.mark.parametrize("name", PLAIN)
@pytest.mark.parametrize("num_readers", [1, 4])
@pytest.mark.parametrize("lazy", [False, True])
def test_to_redis_then_deserialize(name, num_readers, lazy):
    (url,) = server_env("TZ_TEST_REDIS_URL")
    client = redis_client(url)
    prefix = f"py-{uuid.uuid4().hex}"
    with TensorDeserializer(str(FIXTURES / name), device="cpu", lazy_load=True) as src:
        src.to_redis(client, prefix)
    # The reference layout: header:0 is the file's prelude and index.
    raw = (FIXTURES / name).read_bytes()
    m = int.from_bytes(raw[65:73], "little")
    assert client.get(f"{prefix}:header:0") == raw[: 73 + m]
    with TensorDeserializer(f"{url}/{prefix}", device="cpu", num_readers=num_readers, lazy_load=lazy) as d:
        expect_manifest(d, name)


def test_serializer_straight_to_redis():
    (url,) = server_env("TZ_TEST_REDIS_URL")
    uri = f"{url}/py-{uuid.uuid4().hex}"
    expect_round_trip(uri)


def test_redis_credentials_in_the_uri():
    """redis://user:password@host/prefix authenticates every connection, for saves, loads and
    streams; a refused password is an OSError naming the server's reason, never the password."""
    url, user = server_env("TZ_TEST_REDIS_URL", "TZ_TEST_REDIS_USER")
    host, prefix = url[len("redis://") :], f"py-{uuid.uuid4().hex}"
    uri = f"redis://{user}:p%3Ass%40word@{host}/{prefix}"
    expect_round_trip(uri)
    with stream_io.open_stream(uri) as f, stream_io.open_stream(f"{url}/{prefix}") as g:
        assert f.read() == g.read()
    wrong = f"redis://{user}:hunter2@{host}/{prefix}"
    for attempt in (lambda: TensorDeserializer(wrong), lambda: stream_io.open_stream(wrong)):
        with pytest.raises(OSError, match="refused the credentials") as err:
            attempt()
        assert "hunter2" not in str(err.value) and f"redis://***@{host}/{prefix}" in str(err.value)


def chunked_source(tmp_path, monkeypatch):
    """A lazy deserializer over a file whose "big" tensor spans several to_redis pieces (1 MiB)."""
    from tensorizer import _redis_copy

    monkeypatch.setattr(_redis_copy, "REDIS_CHUNK_BYTES", 1 << 20)
    g = torch.Generator().manual_seed(11)
    sd = {
        "big": torch.randint(0, 255, ((5 << 20) + 123,), dtype=torch.uint8, generator=g),  # 6 pieces
        "small": torch.arange(10, dtype=torch.float32),
    }
    path = tmp_path / "chunked.tensors"
    s = TensorSerializer(str(path))
    s.write_state_dict(sd)
    s.close()
    return sd, path, TensorDeserializer(str(path), device="cpu", lazy_load=True)


def entry_of(d, name):
    (r,) = [r for p, r in d._records.items() if p.normalize_() == name]
    return r.entry


def test_to_redis_streams_a_large_tensor_in_bounded_pieces(tmp_path, monkeypatch):
    import tracemalloc

    (url,) = server_env("TZ_TEST_REDIS_URL")
    client = redis_client(url)
    prefix = f"py-{uuid.uuid4().hex}"
    sd, path, src = chunked_source(tmp_path, monkeypatch)
    with src:
        e = entry_of(src, "big")
        tracemalloc.start()
        try:
            src.to_redis(client, prefix)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    # One 1 MiB piece at a time, never the 5 MiB tensor (nor two copies of it).
    assert peak < (3 << 20), peak
    raw = path.read_bytes()
    data_key = f"{prefix}:big:{e.data_offset}"
    assert client.get(data_key) == raw[e.data_offset : e.data_offset + e.data_length]
    assert client.ttl(data_key) == -1  # the temporary key's expiry does not survive the rename
    assert list(client.scan_iter(match=f"{prefix}.tz-staging-*")) == []
    for num_readers in (1, 4):
        with TensorDeserializer(f"{url}/{prefix}", device="cpu", num_readers=num_readers) as d:
            expect_state_dict(d, sd)


def test_to_redis_without_force_keeps_existing_keys(tmp_path, monkeypatch):
    (url,) = server_env("TZ_TEST_REDIS_URL")
    client = redis_client(url)
    prefix = f"py-{uuid.uuid4().hex}"
    sd, path, src = chunked_source(tmp_path, monkeypatch)
    raw = path.read_bytes()
    with src:
        e = entry_of(src, "big")
        header_key, data_key = f"{prefix}:big:{e.offset}", f"{prefix}:big:{e.data_offset}"
        client.set(header_key, b"existing header")
        client.set(data_key, b"existing data")
        src.to_redis(client, prefix)
        assert client.get(header_key) == b"existing header"
        assert client.get(data_key) == b"existing data"
        s = entry_of(src, "small")
        assert client.get(f"{prefix}:small:{s.data_offset}") == raw[s.data_offset : s.data_offset + s.data_length]
        src.to_redis(client, prefix, force=True)
    assert client.get(header_key) == raw[e.offset : e.data_offset]
    assert client.get(data_key) == raw[e.data_offset : e.data_offset + e.data_length]
    with TensorDeserializer(f"{url}/{prefix}", device="cpu") as d:
        expect_state_dict(d, sd)


class FailingReader:
    """The deserializer's engine reader, but read_raw fails on its `fail_at`-th call."""

    def __init__(self, inner, fail_at):
        self._inner, self._left = inner, fail_at

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def read_raw(self, offset, size):
        self._left -= 1
        if self._left == 0:
            raise OSError(f"injected read failure at byte {offset}")
        return self._inner.read_raw(offset, size)


def test_to_redis_failure_leaves_no_partial_or_temporary_key(tmp_path, monkeypatch):
    (url,) = server_env("TZ_TEST_REDIS_URL")
    client = redis_client(url)
    prefix = f"py-{uuid.uuid4().hex}"
    _, _, src = chunked_source(tmp_path, monkeypatch)
    with src:
        e = entry_of(src, "big")
        # Reads: header:0, then "big" data pieces 1, 2, 3 (the third fails mid-value).
        monkeypatch.setattr(src, "_reader", FailingReader(src._reader, fail_at=4))
        with pytest.raises(OSError, match="injected read failure"):
            src.to_redis(client, prefix)
    assert client.exists(f"{prefix}:big:{e.data_offset}") == 0
    assert client.exists(f"{prefix}:big:{e.offset}") == 0  # header written only after the data
    assert list(client.scan_iter(match=f"{prefix}.tz-staging-*")) == []


def moto_log_lines(kind, key):
    """The request lines moto's `kind` server ("open" or "auth") logged for object `key`."""
    (servers,) = server_env("TZ_TEST_SERVERS_DIR")
    log = os.path.join(servers, "s3", f"{kind}.log")
    with open(log) as f:
        return [line for line in f if f"/{key} HTTP" in line]


def test_open_stream_then_load_probes_the_object_once(monkeypatch):
    """open_stream resolves the credentials and probes the object; the deserializer over that
    stream shares its engine source instead of opening the URI again: the signing server sees
    the same requests as for a load by URI alone."""
    endpoint, bucket, access, secret = server_env(
        "TZ_TEST_S3_AUTH_ENDPOINT", "TZ_TEST_S3_AUTH_BUCKET", "TZ_TEST_S3_AUTH_ACCESS_KEY", "TZ_TEST_S3_AUTH_SECRET_KEY"
    )
    name = PLAIN[0]
    key = f"{bucket}/fixtures/{name}"
    uri = f"s3://{key}"

    before = len(moto_log_lines("auth", key))
    with stream_io.open_stream(
        uri, s3_access_key_id=access, s3_secret_access_key=secret, s3_endpoint=endpoint, force_http=True
    ) as stream:
        with TensorDeserializer(stream, device="cpu", num_readers=1) as d:
            expect_manifest(d, name)
    through_stream = moto_log_lines("auth", key)[before:]

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", access)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
    before = len(moto_log_lines("auth", key))
    with TensorDeserializer(uri, device="cpu", num_readers=1) as d:
        expect_manifest(d, name)
    by_uri = moto_log_lines("auth", key)[before:]

    methods = [line.split('"')[1].split()[0] for line in through_stream]
    methods_by_uri = [line.split('"')[1].split()[0] for line in by_uri]
    # A HEAD is timing's, not the route's: an eager load by URI asks the size while a first answer
    # slower than 50 ms is coming (engine/warm_block.h).
    assert [m for m in methods if m != "HEAD"] == [m for m in methods_by_uri if m != "HEAD"], (through_stream, by_uri)
    assert all(" 20" in line.split('"')[2][:4] for line in through_stream), through_stream  # 200/206
    assert methods.count("HEAD") <= 1, through_stream
    assert methods_by_uri.count("HEAD") <= 1, by_uri


def test_open_stream_writes_s3_through_the_engine_sink():
    """An s3:// write stream is the engine's S3 sink (staged by the engine, uploaded on close):
    seeks and rewrites land where they were written."""
    (bucket,) = server_env("TZ_TEST_S3_BUCKET")
    uri = f"s3://{bucket}/py-{uuid.uuid4().hex}.bin"
    with stream_io.open_stream(uri, "wb", **s3_open_kwargs()) as f:
        assert not f.readable() and f.seekable()
        assert f.write(b"hello world") == 11
        f.seek(0)
        f.write(b"J")
        f.seek(11)
        f.write(memoryview(b"!"))
    with stream_io.open_stream(uri, **s3_open_kwargs()) as r:
        assert r.read() == b"Jello world!"


def test_redis_sink_without_parts_refuses_to_publish():
    """The Redis sink stores the parts a tensorizer writer or copy tells it; bytes written to it
    any other way are refused at commit with a clear error, and the prefix is left untouched."""
    from tensorizer import _C

    (url,) = server_env("TZ_TEST_REDIS_URL")
    client = redis_client(url)
    prefix = f"py-{uuid.uuid4().hex}"
    client.set(f"{prefix}:header:0", b"kept")
    sink = _C.Sink.open(f"{url}/{prefix}", _C.TransportOptions())
    sink.write_at(0, b"not a tensors file")
    with pytest.raises(ValueError, match="say how it is cut into keys"):
        sink.commit()
    assert sink.closed
    assert sorted(client.scan_iter(match=f"{prefix}*")) == [f"{prefix}:header:0".encode()]
    assert client.get(f"{prefix}:header:0") == b"kept"


@pytest.mark.parametrize("lazy", [False, True])
def test_an_eager_cpu_load_maps_its_memory_while_a_slow_server_thinks(tmp_path, lazy):
    """An eager CPU load of every tensor asks the engine to map its host memory while the server's
    first answer is slow (ReaderOptions::expect_host_load, engine/warm_block.h); a lazy load does
    not. nginx behind the fault proxy, its first answer held back 1 s, sees one HEAD for the eager
    load and none for the lazy one; the tensors are exact either way."""
    url, root, access_log, proxy_script = server_env(
        "TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT", "TZ_TEST_HTTP_ACCESS_LOG", "TZ_TEST_FAULT_PROXY"
    )
    name = f"warm-{uuid.uuid4().hex}.tensors"
    sd = {"a": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(3, 5, dtype=torch.float16)}
    s = TensorSerializer(os.path.join(root, name))
    s.write_state_dict(sd)
    s.close()
    try:
        with fault_proxy(proxy_script, url, "delay:1000", tmp_path) as (proxy_url, _):
            with TensorDeserializer(f"{proxy_url}/{name}", device="cpu", lazy_load=lazy) as d:
                for k, v in sd.items():
                    assert torch.equal(d[k], v), k
        with open(access_log) as f:
            heads = [line for line in f if f'"HEAD /{name} ' in line]
        assert len(heads) == (0 if lazy else 1), heads
    finally:
        os.unlink(os.path.join(root, name))
