"""open_stream and friends: local files, and remote objects through the C++ engine's transports.

``open_stream`` keeps the reference's signature and dispatch (docs/reference-api.md §5.1). Local paths are plain
Python files. ``http(s)://``, ``s3://`` (read) and ``redis://`` URIs return a read-only,
seekable stream over the engine's transport for that scheme (libcurl, S3 signing, hiredis);
the stream also tells a TensorDeserializer its URI and options, so loads from it run on the
engine directly (parallel ranges, no Python buffering). S3 writes go to a temporary file that is
uploaded by the engine when closed.
"""

from __future__ import annotations

import io
import os
import time
import typing
from typing import Dict, List, Optional, Sequence, Union

from . import _C

__all__ = ["open_stream", "CURLStreamFile", "RedisStreamFile", "CAInfo", "s3_upload", "s3_download"]

default_s3_read_endpoint = "accel-object.ord1.coreweave.com"
default_s3_write_endpoint = "object.ord1.coreweave.com"
curl_path = None  # the engine uses libcurl, not the curl program


class CAInfo:
    """How to verify TLS certificates: exactly one of a CA bundle, a CA directory, or none."""

    __slots__ = ("_cacert", "_capath", "_allow_untrusted")

    def __init__(self, *, cacert: Optional[str] = None, capath: Optional[str] = None, allow_untrusted: bool = False):
        if (cacert, capath).count(None) + (not allow_untrusted) != 2:
            raise ValueError(
                "Exactly one of cacert, capath, or allow_untrusted=True"
                " must be specified. For default certificate verification"
                " behaviour, use certificate_handling=None instead of"
                " an explicit CAInfo instance"
            )
        if cacert is not None and not os.path.isfile(cacert):
            raise ValueError(f"Invalid cacert file path: {cacert!r}")
        if capath is not None and not os.path.isdir(capath):
            raise ValueError(f"Invalid capath directory path: {capath!r}")
        self._cacert = None if cacert is None else str(cacert)
        self._capath = None if capath is None else str(capath)
        self._allow_untrusted = bool(allow_untrusted)

    @property
    def curl_flags(self) -> tuple:
        if self._cacert is not None:
            return ("--cacert", self._cacert)
        if self._capath is not None:
            return ("--capath", self._capath)
        return ("--insecure",)

    def apply(self, options: "_C.TransportOptions") -> None:
        if self._cacert is not None:
            options.http.ca_file = self._cacert
        if self._capath is not None:
            options.http.ca_path = self._capath
        options.http.allow_untrusted = self._allow_untrusted

    def __eq__(self, other):
        return isinstance(other, CAInfo) and self.curl_flags == other.curl_flags

    def __hash__(self):
        return hash(self.curl_flags)


def _transport_options(
    *,
    certificate_handling: Optional[CAInfo] = None,
    headers: Optional[Union[Dict[str, str], Sequence[str]]] = None,
    s3_access_key_id: Optional[str] = None,
    s3_secret_access_key: Optional[str] = None,
    s3_endpoint: Optional[str] = None,
    s3_config_path: Optional[str] = None,
    s3_region_name: Optional[str] = None,
    force_http: Optional[bool] = None,
    connect_timeout: Optional[float] = None,
    stall_timeout: Optional[float] = None,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
) -> "_C.TransportOptions":
    """The engine's TransportOptions for the reference's keyword arguments (and ours: timeouts,
    the cache directory)."""
    # Timeouts default to $TENSORIZER_{CONNECT,STALL}_TIMEOUT, the cache to $TENSORIZER_CACHE_DIR.
    options = _C.TransportOptions()
    if cache_dir is not None:
        options.cache.dir = os.fsdecode(os.fspath(cache_dir))
    for name, seconds in (("connect_timeout", connect_timeout), ("stall_timeout", stall_timeout)):
        if seconds is None:
            continue
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise TypeError(f"{name}: expected a number of seconds or None, got {seconds.__class__.__name__}")
        if not seconds > 0:
            raise ValueError(f"{name} must be greater than 0 seconds, not {seconds!r}")
        setattr(options.retry, f"{name}_s", float(seconds))
    if certificate_handling is not None:
        if not isinstance(certificate_handling, CAInfo):
            raise TypeError("certificate_handling must be a CAInfo instance or None")
        certificate_handling.apply(options)
    if headers:
        if isinstance(headers, dict):
            headers = [f"{k}: {v}" for k, v in headers.items()]
        options.http.headers = list(headers)
    if s3_access_key_id is not None:
        options.s3.access_key_id = s3_access_key_id
    if s3_secret_access_key is not None:
        options.s3.secret_access_key = s3_secret_access_key
    if s3_endpoint:
        options.s3.endpoint = s3_endpoint
    if s3_config_path is not None:
        if not os.path.exists(s3_config_path):
            raise FileNotFoundError(f"s3_config_path does not exist: {s3_config_path}")
        options.s3.config_path = s3_config_path
    if s3_region_name is not None:
        options.s3.region = s3_region_name
    if force_http is not None:
        options.s3.force_http = bool(force_http)
    return options


def _is_utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _seek_target(pos: int, offset: int, whence: int, end: Optional[int]) -> int:
    """The position a seek moves to; `end` None: the stream has no end to seek from yet."""
    if whence == io.SEEK_SET:
        target = offset
    elif whence == io.SEEK_CUR:
        target = pos + offset
    elif whence == io.SEEK_END and end is not None:
        target = end + offset
    elif whence == io.SEEK_END:
        raise io.UnsupportedOperation("seek relative to the end of a stream being written")
    else:
        raise ValueError(f"invalid whence ({whence})")
    if target < 0:
        raise ValueError("negative seek position")
    return target


class _EngineStreamFile(io.RawIOBase):
    """A read-only, seekable stream over one of the engine's transports."""

    @classmethod
    def _over(cls, uri: str, options: "_C.TransportOptions", begin: Optional[int], end: Optional[int]):
        """A stream of this class over `uri` with ready-made engine options."""
        stream = cls.__new__(cls)
        _EngineStreamFile.__init__(stream, uri, options, begin, end)
        return stream

    def __init__(self, uri: str, options: "_C.TransportOptions", begin: Optional[int], end: Optional[int]):
        super().__init__()
        if begin is not None and begin < 0:
            raise ValueError("begin must be non-negative")
        if end is not None and end <= (begin or 0):
            raise ValueError("end must be greater than begin")
        self.uri = uri
        self.transport_options = options
        opened = time.monotonic()
        try:
            self._source = _C.Source.open(uri, options)
            size = self._source.size  # the first request
        except OSError as e:  # worded as the reference's streams word it, so matching code works
            raise type(e)(f"Failed to open stream: {e}") from None
        self._open_latency = time.monotonic() - opened
        self._read_latencies: List[float] = []
        # A TensorDeserializer over this stream shares the source (python/src/python_io.cc).
        self._engine_source = self._source
        self._end = size if end is None else min(end, size)
        self._pos = begin or 0
        self.read_operations = 0
        self.bytes_skipped = 0
        self.response_headers: Dict[str, str] = {}

    @property
    def bytes_read(self) -> int:
        return 0 if self._source.closed else self._source.bytes_read

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.closed:
            raise ValueError("I/O operation on a closed stream")
        view = memoryview(b).cast("B")
        if self._pos >= self._end:
            return 0
        want = min(len(view), self._end - self._pos)
        start = time.monotonic()
        n = self._source.read_into(self._pos, view[:want])
        self._read_latencies.append(time.monotonic() - start)
        self._pos += n
        self.read_operations += 1
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = _seek_target(self._pos, offset, whence, self._end)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def readline(self, size: Optional[int] = -1) -> bytes:
        raise io.UnsupportedOperation("readline")

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")

    def close(self) -> None:
        if not self.closed:
            self._source.close()
        super().close()


class CURLStreamFile(_EngineStreamFile):
    """An HTTP(S) (or presigned S3) object as a read-only stream (the engine's libcurl transport).

    As the reference's: ``popen_latencies`` holds the time the open took (the engine's first
    request: connection, TLS, the object's size), ``http_response_latencies`` the time of each
    read (request to last byte), in seconds; an open that fails raises ``OSError`` whose message
    begins "Failed to open stream" (certificate failures name cURL exit code 60).
    """

    @property
    def popen_latencies(self) -> List[float]:
        return [self._open_latency]

    @property
    def http_response_latencies(self) -> List[float]:
        return self._read_latencies

    def __init__(
        self,
        uri: str,
        begin: Optional[int] = None,
        end: Optional[int] = None,
        headers: Optional[Dict[str, str]] = None,
        *,
        buffer_size: Optional[int] = None,
        certificate_handling: Optional[CAInfo] = None,
        _options: Optional["_C.TransportOptions"] = None,
    ):
        del buffer_size  # the engine reads straight into the destination
        options = _options or _transport_options(certificate_handling=certificate_handling, headers=headers)
        super().__init__(uri, options, begin, end)


class RedisStreamFile(_EngineStreamFile):
    """Keys written by ``TensorDeserializer.to_redis`` as a read-only stream (hiredis).

    As the reference's: ``setup_latency`` is the time the open took (connection and key
    listing), ``response_latencies`` the time of each read, in seconds.
    """

    @property
    def setup_latency(self) -> float:
        return self._open_latency

    @property
    def response_latencies(self) -> List[float]:
        return self._read_latencies

    def __init__(
        self, uri: str, *, begin: Optional[int] = None, end: Optional[int] = None, buffer_size: Optional[int] = None
    ):
        del buffer_size
        super().__init__(uri, _C.TransportOptions(), begin, end)


def s3_upload(
    path: str,
    target_uri: str,
    s3_access_key_id: Optional[str] = None,
    s3_secret_access_key: Optional[str] = None,
    s3_endpoint: Optional[str] = None,
    s3_region_name: Optional[str] = None,
    s3_signature_version: Optional[str] = None,
) -> None:
    """Uploads a local file to ``s3://bucket/key`` through the engine."""
    del s3_signature_version  # the engine signs with SigV4
    options = _transport_options(
        s3_access_key_id=s3_access_key_id,
        s3_secret_access_key=s3_secret_access_key,
        s3_endpoint=s3_endpoint,
        s3_region_name=s3_region_name,
    )
    _C.upload_file(os.fspath(path), target_uri, options)


def s3_download(
    path_uri: str,
    s3_access_key_id: Optional[str] = None,
    s3_secret_access_key: Optional[str] = None,
    s3_endpoint: Optional[str] = None,
    s3_region_name: Optional[str] = None,
    s3_signature_version: Optional[str] = None,
    buffer_size: Optional[int] = None,
    begin: Optional[int] = None,
    end: Optional[int] = None,
    certificate_handling: Optional[CAInfo] = None,
) -> CURLStreamFile:
    """Opens ``s3://bucket/key`` for reading through the engine."""
    del s3_signature_version
    options = _transport_options(
        certificate_handling=certificate_handling,
        s3_access_key_id=s3_access_key_id,
        s3_secret_access_key=s3_secret_access_key,
        s3_endpoint=s3_endpoint,
        s3_region_name=s3_region_name,
    )
    return CURLStreamFile(path_uri, begin, end, buffer_size=buffer_size, _options=options)


class _EngineSinkFile(io.RawIOBase):
    """A write-only, seekable stream into one of the engine's sinks (an S3 upload staged by the
    engine); what was written is published when the stream is closed."""

    def __init__(self, uri: str, options: "_C.TransportOptions", mode: str):
        super().__init__()
        self._sink = _C.Sink.open(uri, options)
        self._pos = 0
        self.name = uri
        self.mode = mode

    def writable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def write(self, b) -> int:
        if self.closed:
            raise ValueError("I/O operation on a closed stream")
        data = bytes(b)
        self._sink.write_at(self._pos, data)
        self._pos += len(data)
        return len(data)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = _seek_target(self._pos, offset, whence, None)
        return self._pos

    def tell(self) -> int:
        return self._pos

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")

    def close(self) -> None:
        if not self.closed:
            try:
                self._sink.commit()
            finally:
                super().close()


def open_stream(
    path_uri: Union[str, os.PathLike],
    mode: str = "rb",
    s3_access_key_id: Optional[str] = None,
    s3_secret_access_key: Optional[str] = None,
    s3_endpoint: Optional[str] = None,
    s3_config_path: Optional[str] = None,
    buffer_size: Optional[int] = None,
    force_http: Optional[bool] = None,
    *,
    begin: Optional[int] = None,
    end: Optional[int] = None,
    s3_region_name: Optional[str] = None,
    s3_signature_version: Optional[str] = None,
    certificate_handling: Optional[CAInfo] = None,
    connect_timeout: Optional[float] = None,
    stall_timeout: Optional[float] = None,
    cache_dir: Optional[Union[str, os.PathLike]] = None,
) -> typing.BinaryIO:
    """Opens a local path or a URI as a binary stream (docs/reference-api.md §5.1).

    Which schemes exist and what each can do is the engine's (``_C.transport_info``): remote
    objects open for reading (``rb``) as engine streams; those whose engine sink takes plain bytes
    (``s3://``) also open for writing (``wb``/``wb+``/``ab``/``ab+``), staged by the engine and
    published on close. Anything else is a local file (binary modes only; parent directories are
    created for writing). ``connect_timeout`` and ``stall_timeout`` (seconds) bound remote
    transfers as in ``TensorDeserializer``. ``cache_dir`` (default ``$TENSORIZER_CACHE_DIR``)
    keeps a local copy of HTTP(S) and S3 objects opened for reading, as in ``TensorDeserializer``.
    """
    del s3_signature_version
    local_only = isinstance(path_uri, os.PathLike)
    path_uri = os.fsdecode(os.fspath(path_uri))
    # A name that is not UTF-8 (os.fsdecode keeps its bytes as surrogates) is no URI.
    local_only = local_only or not _is_utf8(path_uri)
    normalized_mode = "".join(sorted(mode))
    transport = None if local_only else _C.transport_info(path_uri)

    if transport is not None and not transport.local:
        scheme = transport.scheme
        options = _transport_options(
            certificate_handling=certificate_handling,
            s3_access_key_id=s3_access_key_id,
            s3_secret_access_key=s3_secret_access_key,
            s3_endpoint=s3_endpoint,
            s3_config_path=s3_config_path,
            s3_region_name=s3_region_name,
            force_http=force_http,
            connect_timeout=connect_timeout,
            stall_timeout=stall_timeout,
            cache_dir=cache_dir,
        )
        if normalized_mode == "br":
            stream_class = RedisStreamFile if scheme == "redis" else CURLStreamFile
            return typing.cast(typing.BinaryIO, stream_class._over(path_uri, options, begin, end))
        if not (transport.writable and transport.sink_takes_bytes):
            raise ValueError(f'Only the mode "rb" is valid when opening {scheme}:// streams.')
        if normalized_mode not in ("bw", "ab", "+bw", "+ab"):
            raise ValueError(f'Only the modes "rb", "wb[+]", and "ab[+]" are valid when opening {scheme}:// streams.')
        return typing.cast(typing.BinaryIO, _EngineSinkFile(path_uri, options, mode))

    if "b" not in normalized_mode:
        raise ValueError('Only binary modes ("rb", "wb", "wb+", etc.) are valid when opening local file streams.')
    if any(c in normalized_mode for c in "wax"):
        dirname = os.path.dirname(path_uri)
        if dirname:
            os.makedirs(dirname, exist_ok=True)
    handle = open(path_uri, mode, buffering=buffer_size or io.DEFAULT_BUFFER_SIZE)
    handle.seek(begin or 0)
    return typing.cast(typing.BinaryIO, handle)
