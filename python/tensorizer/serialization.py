"""TensorSerializer and TensorDeserializer: the reference tensorizer API over the C++ engine.

This layer maps torch/numpy objects to engine calls and reproduces the reference's behaviour
(spec §4, §6): it allocates destination tensors with torch and hands their addresses to the
engine, which reads, decrypts and verifies with the GIL released; it never touches tensor bytes
itself. Deliberate departures from the reference are listed in docs/python-decisions.md.
"""

import collections.abc
import contextlib
import dataclasses
import functools
import gc
import io
import logging
import os
import stat
import threading
import types
import typing
import uuid
import warnings
from enum import IntEnum
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Tuple,
    Union,
)

import numpy
import torch

from . import _C
from . import _dtypes
from . import _tensor_path
from . import stream_io
from . import utils
from ._crypt import DecryptionParams, EncryptionParams
from ._errors import CryptographyError, HashMismatchError  # noqa: F401 (public here, as in the reference)
from ._tensor_path import TensorPath

__all__ = [
    "TensorSerializer",
    "TensorDeserializer",
    "TensorType",
    "CryptographyError",
    "EncryptionParams",
    "DecryptionParams",
    "FilterFuncType",
]

logger = logging.getLogger(__name__)

cpu_count: int = _C.usable_cores()

FilterFuncType = Callable[[Union[str, Sequence[Union[str, int]]]], Any]


class TensorType(IntEnum):
    """Whether a tensor is a module parameter, a module buffer, or a state-dict entry."""

    PARAM = 0
    BUFFER = 1
    STATE_DICT = 2


class HashType(IntEnum):
    CRC32 = 0
    SHA256 = 1


# Enum members by value: calling an IntEnum costs microseconds, and a load makes three per tensor.
_TENSOR_TYPES = {m.value: m for m in TensorType}
_HASH_TYPES = {m.value: m for m in HashType}


@contextlib.contextmanager
def _gc_paused():
    """Pauses Python's cyclic garbage collector while a load makes objects by the thousand: the
    collections they trigger walk every object of the process (torch's too), 40% of the time of a
    20,000-tensor load. Restores the collector's state afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def _tensor_hashes(hashes) -> List["TensorHash"]:
    """TensorHash objects for the engine's (hash type, value) pairs."""
    return [TensorHash(_HASH_TYPES[t] if t in _HASH_TYPES else HashType(t), h) for t, h in hashes]


# Data versions (spec §1.3): the engine writes the lowest one a file needs.
TENSORIZER_VERSION = 5
LONG_TENSOR_TENSORIZER_VERSION = 5
META_TENSOR_TENSORIZER_VERSION = 4
ENCRYPTION_TENSORIZER_VERSION = 3
OPAQUE_TENSORIZER_VERSION = 2
NON_OPAQUE_TENSORIZER_VERSION = 1
TENSORIZER_MAGIC = b"|TZR|"
OPAQUE_DTYPE_SEP = "\0"


@dataclasses.dataclass(order=True)
class TensorHash:
    __slots__ = ("type", "hash")
    type: HashType
    hash: bytes


@dataclasses.dataclass
class TensorEntry:
    """One index entry, as the reference exposes it in ``TensorDeserializer._metadata``."""

    metadata_version: int
    name: TensorPath
    type: TensorType
    dtype: str
    shape: Tuple[int, ...]
    offset: int
    data_offset: int
    data_length: int
    hashes: Optional[List[TensorHash]]
    header_hashes: Optional[Dict[HashType, Any]]

    @property
    def deserialized_length(self) -> int:
        """Bytes of the loaded tensor (meta tensors count their full size)."""
        if self.data_length > 0:
            return self.data_length
        n = 1
        for d in self.shape:
            n *= d
        return n * _dtypes.parse(self.dtype).itemsize

    @property
    def is_long_tensor(self) -> bool:
        return self.metadata_version >= LONG_TENSOR_TENSORIZER_VERSION


@dataclasses.dataclass
class _Record:
    """What the deserializer knows about one tensor beyond its TensorEntry."""

    index: int  # position in the engine's index
    entry: TensorEntry
    dtype: "_dtypes.StoredDType"
    expected_bytes: int
    module_idx: Optional[int] = None
    hashable_header: Optional[bytes] = None


def _file_label(file_obj: Any) -> str:
    name = getattr(file_obj, "name", None)
    if isinstance(name, (str, bytes)) and name:
        return os.fsdecode(name)
    return f"<{type(file_obj).__name__}>"


def _regular_fd(file_obj: Any) -> Optional[int]:
    """The file object's descriptor when it is a regular file, else None."""
    fileno = getattr(file_obj, "fileno", None)
    if not callable(fileno):
        return None
    try:
        fd = fileno()
    except (OSError, ValueError, io.UnsupportedOperation):
        return None
    if not isinstance(fd, int) or fd < 0:
        return None
    try:
        return fd if stat.S_ISREG(os.fstat(fd).st_mode) else None
    except OSError:
        return None


def _path_for_fd(file_obj: Any, fd: int) -> str:
    """A path that opens the same file as `fd`: its name when that still matches, else /proc."""
    name = getattr(file_obj, "name", None)
    if isinstance(name, (str, bytes)):
        try:
            if os.path.samestat(os.fstat(fd), os.stat(name)):
                return os.fsdecode(name)
        except OSError:
            pass
    return f"/proc/self/fd/{fd}"


def _local_uri(path: Union[str, bytes, os.PathLike]) -> str:
    """A path-like object is always a local file, even if it looks like a URI."""
    path = os.fsdecode(os.fspath(path))
    return "file://" + path if "://" in path else path


# ---------------------------------------------------------------------------------------------
# Deserializer
# ---------------------------------------------------------------------------------------------


def _resolve_cuda_device() -> torch.device:
    """The contextually active CUDA device (spec §4.9), without initialising CUDA needlessly."""
    try:
        mode = torch.overrides._get_current_function_mode()  # torch.device(...) context
        ctx = getattr(mode, "device", None)
    except (AttributeError, TypeError):
        ctx = None
    if ctx is None and hasattr(torch, "get_default_device"):  # torch >= 2.3
        ctx = torch.get_default_device()
    if ctx is None:
        ctx = "cpu"
    ctx = torch.device(ctx)
    if ctx.type == "cuda" and ctx.index is not None:
        return ctx
    if torch.cuda.is_initialized():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cuda", 0)


def _check_file_mode(file_obj: Any, operation: str, message: str) -> None:
    """Raises ValueError(message + current mode) unless file_obj is a binary stream that can
    `operation` ("read" or "write")."""
    try:
        able = getattr(file_obj, {"read": "readable", "write": "writable"}[operation])()
    except AttributeError:
        able = hasattr(file_obj, operation)
    if isinstance(file_obj, io.TextIOBase) or not able:
        mode = getattr(file_obj, "mode", "")
        raise ValueError(message + (mode and f', current mode="{mode}"') + ")")


def _staging_bytes() -> int:
    """The staging ring size of device loads: ``TENSORIZER_STAGING_BYTES``, else the engine's."""
    value = os.environ.get("TENSORIZER_STAGING_BYTES", "")
    return int(value) if value.isdigit() else 0


@functools.lru_cache(maxsize=None)
def _cuda_runtime_path() -> str:
    """The CUDA runtime library torch loaded (so the engine copies with the same one), or ""."""
    torch.cuda.init()
    with contextlib.suppress(OSError), open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split(maxsplit=5)[-1].strip()
            if "/libcudart" in path and ".so" in path:
                return path
    return ""


class TensorDeserializer(collections.abc.Mapping, contextlib.AbstractContextManager):
    """Reads a .tensors file into torch tensors; a read-only Mapping of its top-level keys.

    Args:
        file_obj: a path, a URI (``http(s)://``, ``s3://``, ``redis://``, any transport the
            engine knows), a stream from ``stream_io.open_stream``, or a readable binary file
            object.
        device: where tensors go (None: CUDA if available, else CPU).
        filter_func: ``(name: str | tuple) -> bool``; tensors it rejects are left out entirely.
        dtype: cast floating-point tensors to this dtype (see docs/python-decisions.md).
        lazy_load: load on access instead of everything at construction.
        plaid_mode, plaid_mode_buffers: accepted for compatibility; CUDA loads always stream
            through the engine's pinned staging ring (``TENSORIZER_STAGING_BYTES`` sizes it,
            256 MiB by default), with reads, decryption, hashing and host-to-device copies
            overlapping.
        num_readers: engine workers (None: one per usable core, or what the transport prefers).
        verify_hash: check CRC32/SHA-256 of every tensor loaded (HashMismatchError).
        encryption: DecryptionParams for encrypted files.
        mmap: how CPU tensors are loaded (an extension of the reference API). None (the
            default): the engine picks the fastest safe route per tensor: tensors of a local,
            unencrypted file whose pages are in the page cache are mapped copy-on-write
            (zero-copy; writes to a tensor stay private), tensors not in the page cache are read
            with direct I/O into huge-page memory, everything else is copied into huge-page
            memory. True: map every tensor that can be mapped. False: plain copies into memory
            torch allocates. The ``TENSORIZER_MMAP`` environment variable ("1" or "0") sets
            True or False when the argument is None. Mapped tensors stay valid when the file is
            deleted or replaced by rename; truncating it in place while they live raises SIGBUS
            on access (as with any file mapping, safetensors included).
    """

    def __init__(
        self,
        file_obj: Union[io.BufferedIOBase, io.RawIOBase, typing.BinaryIO, str, bytes, os.PathLike, int],
        device: Optional[Union[torch.device, str]] = None,
        filter_func: Optional[FilterFuncType] = None,
        dtype: Optional[torch.dtype] = None,
        *,
        lazy_load: bool = False,
        plaid_mode: Optional[bool] = None,
        plaid_mode_buffers: Optional[int] = None,
        num_readers: Optional[int] = None,
        verify_hash: bool = False,
        encryption: Optional[DecryptionParams] = None,
        mmap: Optional[bool] = None,
    ):
        del plaid_mode, plaid_mode_buffers  # accepted for compatibility; the engine stages every CUDA load
        self._reader = None
        self._cache_status = None
        self._file = None  # a caller's file object, closed with the source (as the reference does)
        self._lock = threading.RLock()
        self._cache: Dict[TensorPath, torch.nn.Parameter] = {}
        self._bytes_read_closed = 0
        self._read_cursor = -1  # position of the last tensor yielded by read_tensors()

        device = utils.get_device() if device is None else torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("Cannot deserialize to CUDA device because CUDA is not available")
        self._device_is_dynamic = device.type == "cuda" and device.index is None and lazy_load
        if device.type == "cuda" and device.index is None:
            device = _resolve_cuda_device()
        self._device: torch.device = device

        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype: expected torch.dtype or None, got {dtype.__class__.__name__}")
        self._dtype = dtype
        self._verify_hash = bool(verify_hash)
        self._lazy_load = bool(lazy_load)
        if mmap is None:
            mmap = {"1": True, "0": False}.get(os.environ.get("TENSORIZER_MMAP", ""))
        # The engine's host route ("auto", "map"), or None for plain copies into torch memory.
        self._route: Optional[str] = {None: "auto", True: "map", False: None}[None if mmap is None else bool(mmap)]
        self._loaded_via: Dict[TensorPath, str] = {}  # route each tensor took (tests, diagnostics)
        # CPU loads through the staging pipeline CUDA loads take (diagnostics; tests on CPU).
        self._staged = os.environ.get("TENSORIZER_STAGED", "") == "1"

        if num_readers is not None:
            if isinstance(num_readers, bool) or not isinstance(num_readers, int):
                raise TypeError(f"num_readers: expected int or None, got {num_readers.__class__.__name__}")
            if num_readers < 1:
                raise ValueError("num_readers must be positive")
        self._num_readers = num_readers or 0

        if encryption is not None and not isinstance(encryption, DecryptionParams):
            raise TypeError(
                "encryption parameter: expected DecryptionParams instance"
                f" or None, {encryption.__class__.__name__} found"
            )
        key, passphrase = encryption._engine_args() if encryption is not None else (None, None)
        self._encrypted = encryption is not None

        self._reader = self._open(file_obj, key, passphrase)
        self._cache_status = self._reader.cache_status  # the HTTP probe's answer; kept after close
        self._file_label = self._reader.uri
        reader = self._reader
        self._version = reader.version
        self.total_file_bytes: int = reader.tensor_size
        self.total_compressed_tensor_bytes = 0
        self.read_bytes = 0

        with _gc_paused():
            self._index_and_load(reader, filter_func)

    def _index_and_load(self, reader, filter_func) -> None:
        """Builds the records of every entry (filtered), then loads them unless lazy."""
        self._records: Dict[TensorPath, _Record] = {}
        for i, e in enumerate(reader.entries()):
            path = TensorPath(e.path)
            shape = e.shape
            entry = TensorEntry(
                metadata_version=5 if any(d >= 1 << 32 for d in shape) else 1,
                name=path,
                type=_TENSOR_TYPES[e.type] if e.type in _TENSOR_TYPES else TensorType(e.type),
                dtype=e.dtype,
                shape=shape,
                offset=e.header_offset,
                data_offset=e.data_offset,
                data_length=e.data_length,
                hashes=None,
                header_hashes=None,
            )
            self._records[path] = _Record(i, entry, _dtypes.parse(e.dtype), e.expected_bytes)
        if filter_func is not None:
            self._records = {p: r for p, r in self._records.items() if filter_func(p.normalize_())}
        self._metadata: Dict[TensorPath, TensorEntry] = {p: r.entry for p, r in self._records.items()}
        self._order: Dict[TensorPath, int] = {p: k for k, p in enumerate(self._records)}
        self._structure = _tensor_path.build_tree(list(self._records))

        self.total_tensor_bytes: int = sum(r.expected_bytes for r in self._records.values())
        if not self._lazy_load:
            self._bulk_load(list(self._records), None)
            self.total_tensor_bytes = sum(r.entry.data_length for r in self._records.values())
            self._close_source()

    # -- opening -----------------------------------------------------------------------------

    def _open(self, file_obj: Any, key, passphrase):
        transport = _C.TransportOptions()
        if isinstance(file_obj, stream_io._EngineStreamFile):
            self._file = file_obj
            return _C.Reader.open(file_obj.uri, file_obj.transport_options, key, passphrase)
        if isinstance(file_obj, os.PathLike):
            return _C.Reader.open(_local_uri(file_obj), transport, key, passphrase)
        if isinstance(file_obj, bytes):
            return _C.Reader.open(_local_uri(file_obj), transport, key, passphrase)
        if isinstance(file_obj, str):
            return _C.Reader.open(file_obj, transport, key, passphrase)
        if isinstance(file_obj, int) and not isinstance(file_obj, bool):
            return _C.Reader.open(f"/proc/self/fd/{file_obj}", transport, key, passphrase)
        self._mode_check(file_obj)
        self._file = file_obj
        fd = _regular_fd(file_obj)
        if fd is not None:
            return _C.Reader.open(_path_for_fd(file_obj, fd), transport, key, passphrase)
        # No descriptor (BytesIO, pipes, custom objects): the engine reads from a copy in memory.
        with contextlib.suppress(AttributeError, OSError, io.UnsupportedOperation):
            if file_obj.seekable():
                file_obj.seek(0)
        data = file_obj.read()
        if not isinstance(data, bytes):
            data = bytes(data)
        return _C.Reader.from_bytes(data, _file_label(file_obj), key, passphrase)

    @staticmethod
    def _mode_check(file_obj: Any) -> None:
        _check_file_mode(
            file_obj, "read", 'TensorDeserializer\'s file_obj must be readable and in binary mode (mode="rb"'
        )

    def _close_source(self) -> None:
        with self._lock:
            if self._reader is not None and not self._reader.closed:
                self._bytes_read_closed = self._reader.bytes_read
                self._reader.close()
            if self._file is not None:
                with contextlib.suppress(Exception):
                    self._file.close()

    def close(self) -> None:
        """Releases the source (and a file object passed in). Loaded tensors stay usable."""
        if getattr(self, "_reader", None) is not None:
            self._close_source()

    def __exit__(self, exc_type, exc_val, traceback):
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()

    # -- loading -----------------------------------------------------------------------------

    def _cast_target(self, stored: torch.dtype) -> Optional[torch.dtype]:
        """The dtype to cast a stored dtype to: only within its kind (float, complex, int)."""
        target = self._dtype
        if target is None or target == stored or stored == torch.bool:
            return None
        kind = (stored.is_floating_point, stored.is_complex)
        if kind != (target.is_floating_point, target.is_complex) or target == torch.bool:
            return None
        return target

    def _bulk_load(
        self, paths: Sequence[TensorPath], verify_hash: Optional[bool]
    ) -> Dict[TensorPath, torch.nn.Parameter]:
        """Loads (or takes from the cache) every path; one engine call for the uncached ones."""
        with self._lock, _gc_paused():
            missing = [p for p in paths if p not in self._cache]
            if missing:
                self._load_uncached(missing, self._verify_hash if verify_hash is None else verify_hash)
            return {p: self._cache[p] for p in paths}

    def _load_uncached(self, paths: List[TensorPath], verify_hash: bool) -> None:
        if self._reader is None or self._reader.closed:
            raise OSError(f"'{self._file_label}' is closed; create a new TensorDeserializer to load again")
        if self._device_is_dynamic:
            self._device = _resolve_cuda_device()
        records = [self._records[p] for p in paths]
        for r in records:
            if r.dtype.torch is None:
                raise ValueError(
                    f"Tensor {_tensor_path.display(r.entry.name)!r} in '{self._file_label}'"
                    f" has dtype {r.entry.dtype!r}, which names no torch dtype"
                )
        indices = [r.index for r in records]
        if self._device.type == "cuda" or self._staged:
            # Straight into the destination through the engine's staging ring: CUDA memory on a
            # GPU (pinned buffers, asynchronous copies), or CPU memory via the host copy backend.
            tensors = [_dtypes.empty(r.entry.shape, r.dtype.torch, self._device) for r in records]
            device_index = self._device.index if self._device.type == "cuda" else -1
            infos = self._reader.load_staged(
                indices,
                [t.data_ptr() for t in tensors],
                device_index,
                self._num_readers,
                verify_hash,
                _staging_bytes(),
                _cuda_runtime_path() if device_index >= 0 else "",
            )
            for path in paths:
                self._loaded_via[path] = "staged"
        elif self._route is not None:
            loaded = self._reader.load_host(indices, self._num_readers, verify_hash, self._route)
            tensors = [
                raw if raw.dtype == r.dtype.torch else raw.view(r.dtype.torch).view(r.entry.shape)
                for (raw, _, _), r in zip(loaded, records)
            ]
            infos = [info for _, info, _ in loaded]
            for path, (_, _, via) in zip(paths, loaded):
                self._loaded_via[path] = via
        else:
            tensors = [_dtypes.empty(r.entry.shape, r.dtype.torch) for r in records]
            infos = self._reader.load(indices, [t.data_ptr() for t in tensors], self._num_readers, verify_hash)
            for path in paths:
                self._loaded_via[path] = "copied"
        device = self._device
        for path, r, tensor, info in zip(paths, records, tensors, infos):
            r.module_idx, r.hashable_header = info.module_idx, info.hashable_header
            r.entry.hashes = _tensor_hashes(info.hashes)
            grad = _dtypes.requires_grad(tensor.dtype)
            target = self._cast_target(tensor.dtype)
            if device.type != "cpu" or target is not None:
                tensor = tensor.to(device=device, dtype=target)
            self._cache[path] = torch.nn.Parameter(tensor, requires_grad=grad)

    # -- Mapping view ------------------------------------------------------------------------

    def __getitem__(self, name) -> Union[torch.nn.Parameter, typing.Mapping]:
        path = TensorPath((name,))
        cached = self._cache.get(path)
        if cached is not None:
            return cached
        if name not in self._structure:
            raise KeyError(f"Tensor {name} not found")
        if isinstance(self._structure[name], TensorPath):
            return self._bulk_load([path], None)[path]
        return self._load_prefixed(path, use_proxies=True) or types.MappingProxyType({})

    def __iter__(self):
        return iter(self._structure)

    def __len__(self) -> int:
        return len(self._structure)

    def __contains__(self, key) -> bool:
        return key in self._structure

    def keys(self):
        return self._structure.keys()

    def _load_prefixed(
        self,
        prefix: Tuple,
        use_proxies: bool,
        filter_func: Optional[FilterFuncType] = None,
    ):
        n = len(prefix)
        paths = [p for p in self._records if p[:n] == prefix and (filter_func is None or filter_func(p.normalize_()))]
        if not paths:
            return None
        loaded = self._bulk_load(paths, None)
        tree = _tensor_path.restructure(loaded, use_proxies)
        for component in prefix:
            tree = tree[0] if isinstance(tree, list) else tree[component]
        return tree

    def tree(
        self,
        prefix: Optional[Iterable[Union[str, int]]] = None,
        *,
        default: Any = None,
        filter_func: Optional[FilterFuncType] = None,
    ) -> Any:
        """Loads the (sub)tree under `prefix` as nested dicts/lists, or a leaf tensor.

        Levels with int keys become lists (ordered by index), str keys dicts. Returns `default`
        when no tensor matches.
        """
        if prefix is None:
            prefix = ()
        if isinstance(prefix, (str, int)):
            raise TypeError(
                f"Invalid prefix: expected sequence, got {prefix.__class__.__name__!r}"
                " (for a single-element prefix, use a single-element sequence)"
            )
        result = self._load_prefixed(tuple(prefix), use_proxies=False, filter_func=filter_func)
        return default if result is None else result

    # -- iteration APIs ----------------------------------------------------------------------

    def _next_paths(self, filter_func, num_tensors: int) -> List[TensorPath]:
        if num_tensors < 0 and num_tensors != -1:
            raise ValueError("num_tensors must be -1 or non-negative")
        paths = list(self._records)[self._read_cursor + 1 :]
        if filter_func is not None:
            paths = [p for p in paths if filter_func(p.normalize_())]
        if num_tensors != -1:
            paths = paths[:num_tensors]
        return paths

    def read_tensors(
        self,
        filter_func: Optional[FilterFuncType] = None,
        num_tensors: int = -1,
        verify_hash: Optional[bool] = None,
    ) -> Iterator[Tuple[int, int, Union[str, tuple], torch.nn.Parameter]]:
        """Yields ``(module_idx, tensor_type, name, tensor)`` in file order.

        Repeated calls continue after the last tensor this method (or read_numpy_arrays)
        yielded, so ``num_tensors`` can page through a file.
        """
        paths = self._next_paths(filter_func, num_tensors)
        if not paths:
            return
        loaded = self._bulk_load(paths, verify_hash)
        for path in paths:
            r = self._records[path]
            self._read_cursor = self._order[path]
            yield r.module_idx or 0, r.entry.type, path.normalize_(), loaded[path]

    def read_numpy_arrays(
        self,
        filter_func: Optional[FilterFuncType] = None,
        num_tensors: int = -1,
        allow_raw_data: bool = False,
        verify_hash: Optional[bool] = None,
    ) -> Iterator[Tuple[int, int, Union[str, tuple], numpy.ndarray, bool, Optional[str]]]:
        """Yields ``(module_idx, tensor_type, name, array, is_opaque, torch_dtype)`` (CPU only).

        Opaque dtypes (no numpy equivalent, e.g. bfloat16) raise ValueError unless
        `allow_raw_data`, in which case the array holds the raw bits as the signed int type of
        the same size and `torch_dtype` names the real type.
        """
        if self._device.type != "cpu":
            raise RuntimeError("read_numpy_arrays is only valid when deserializing to the CPU")
        paths = self._next_paths(filter_func, num_tensors)
        if not paths:
            return
        loaded = self._bulk_load(paths, verify_hash)
        for path in paths:
            r = self._records[path]
            tensor = loaded[path].detach()
            opaque = r.dtype.opaque and tensor.dtype == r.dtype.torch
            if opaque:
                raw_dtype = _dtypes.numpy_dtype(r.dtype)
                if not allow_raw_data:
                    raise ValueError(
                        f"{path.normalize_()} has an opaque datatype: "
                        f"(Torch: {r.dtype.torch_name}, Numpy: {raw_dtype.str}). "
                        "Set `allow_raw_data=True` to return as a numpy array "
                        f"with a datatype of {raw_dtype.str}"
                    )
                int_dtype = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[r.dtype.itemsize]
                array = tensor.view(int_dtype).numpy()
            else:
                array = tensor.numpy()
            self._read_cursor = self._order[path]
            yield (
                r.module_idx or 0,
                r.entry.type,
                path.normalize_(),
                array,
                opaque,
                r.dtype.torch_name if opaque else None,
            )

    # -- modules -----------------------------------------------------------------------------

    def load_into_module(
        self,
        m: torch.nn.Module,
        filter_func: Optional[FilterFuncType] = None,
        verify_hash: Optional[bool] = None,
    ) -> int:
        """Registers every (filtered) PARAM/BUFFER tensor on `m`; returns how many were selected.

        Parameters become ``nn.Parameter`` attributes; buffers are registered as plain tensors
        and keep the persistence they had on the module. Closes the source, as the reference does.
        """
        paths = [p for p in self._records if filter_func is None or filter_func(p.normalize_())]
        for path in paths:
            entry = self._records[path].entry
            if entry.type == TensorType.STATE_DICT:
                raise NotImplementedError(
                    "This was serialized using TensorSerializer.write_state_dict(), so it cannot be"
                    " loaded using TensorDeserializer.load_into_module()."
                    " Use the TensorDeserializer object directly as a state_dict mapping instead."
                    f" (tensor {_tensor_path.display(path)!r} in '{self._file_label}')"
                )
            if not path.is_str_:
                raise NotImplementedError(
                    "Cannot deserialize structured tensor keys as a module;"
                    " try using the TensorDeserializer directly as a state_dict mapping instead."
                    f" (tensor {_tensor_path.display(path)!r} in '{self._file_label}')"
                )
        modules = dict(m.named_modules(remove_duplicate=False))
        loaded = self._bulk_load(paths, verify_hash)
        for path in paths:
            name = path[0]
            module_path, _, attr = name.rpartition(".")
            module = modules.get(module_path)
            if module is None:
                raise KeyError(
                    f"Module {module_path!r} (for tensor {name!r} in '{self._file_label}')"
                    " does not exist in the given torch.nn.Module"
                )
            tensor = loaded[path]
            if self._records[path].entry.type == TensorType.PARAM:
                module.register_parameter(attr, tensor)
            else:
                persistent = attr not in getattr(module, "_non_persistent_buffers_set", ())
                module.register_buffer(attr, tensor.data, persistent=persistent)
        self._close_source()
        return len(paths)

    def verify_module(self, m: torch.nn.Module) -> Tuple[bool, List[Tuple[Union[str, tuple], bool]]]:
        """Checks a live module's tensors against the stored hashes of the loaded tensors."""
        tensors: Dict[Any, torch.Tensor] = {}
        tensors.update(m.state_dict())
        tensors.update(m.named_buffers())
        results: List[Tuple[Any, bool]] = []
        for path, r in self._records.items():
            name = path.normalize_()
            tensor = tensors.get(name)
            if tensor is None and isinstance(name, str) and name.startswith("."):
                tensor = tensors.get(name[1:])  # root-level names from write_module (".w")
            if tensor is None:
                results.append((name, False))
                continue
            if r.entry.hashes is None or r.hashable_header is None:
                raise RuntimeError(
                    f"No hashes found in metadata for {name}. This is usually"
                    " caused by a TensorDeserializer that was instantiated"
                    " with lazy_load=True, and not loaded into a module before"
                    " calling this."
                )
            results.append((name, self._matches_hashes(r, tensor)))
        reported = {name for name, _ in results}
        for key in self.keys():
            if key not in tensors and key not in reported and f".{key}" not in reported:
                results.append((key, False))
        return all(ok for _, ok in results), results

    @staticmethod
    def _matches_hashes(r: _Record, tensor: torch.Tensor) -> bool:
        if tensor.is_meta:
            return False
        t = tensor.detach().to("cpu").resolve_conj().resolve_neg().contiguous()
        nbytes = t.numel() * t.element_size()
        if r.entry.data_length == 0:
            nbytes = 0  # meta/empty: the hash covers the header only
        elif nbytes != r.entry.data_length:
            return False
        crc, sha = _C.compute_hashes(r.hashable_header, t.data_ptr(), nbytes)
        for h in r.entry.hashes:
            want = crc.to_bytes(4, "little") if h.type == HashType.CRC32 else sha
            if h.hash != want:
                return False
        return True

    # -- other members -----------------------------------------------------------------------

    @property
    def total_bytes_read(self) -> int:
        """Bytes read from the source so far (index included)."""
        reader = self._reader
        if reader is not None and not reader.closed:
            return reader.bytes_read
        return self._bytes_read_closed

    @property
    def cache_status(self) -> Optional[str]:
        """The X-Cache-Status header an HTTP(S) source's server sent (e.g. a caching proxy's HIT); else None."""
        return self._cache_status

    def to_redis(self, redis_client, key_prefix: str, force: bool = False) -> None:
        """Copies the file into Redis keys the way tensorizer lays them out (spec §5.6).

        Uses the given redis-py client (its auth, database and TLS apply). Memory stays bounded by
        REDIS_CHUNK_BYTES whatever the tensor sizes: larger values are streamed (see _redis_put).
        Without `force`, tensors whose header key exists are skipped; a tensor's header key is
        written after its data, so an interrupted copy never leaves a header key that would make
        a later call skip a tensor whose data is missing.
        """
        if self._reader is None or self._reader.closed:
            raise OSError(f"'{self._file_label}' is closed; use lazy_load=True to copy it to Redis")
        reader = self._reader

        def put(key: str, offset: int, size: int, what: str) -> None:
            try:
                _redis_put(redis_client, reader.read_raw, key_prefix, key, offset, size)
            except Exception as e:
                if hasattr(e, "add_note"):  # Python 3.11+
                    e.add_note(
                        f"while copying {what} of '{self._file_label}' (bytes {offset}+{size}) to Redis key {key!r}"
                    )
                raise

        put(f"{key_prefix}:header:0", 0, 73 + reader.index_size, "the file header and index")
        for path, r in self._records.items():
            e = r.entry
            name = path.serialized_().decode("utf-8")
            header_key = f"{key_prefix}:{name}:{e.offset}"
            if not force and redis_client.exists(header_key):
                continue
            label = f"tensor {_tensor_path.display(path)!r}"
            put(f"{key_prefix}:{name}:{e.data_offset}", e.data_offset, e.data_length, f"the data of {label}")
            put(header_key, e.offset, e.data_offset - e.offset, f"the header of {label}")


# to_redis sends a value larger than this in pieces of this size, so a copy never holds more than
# one piece of a tensor in memory.
REDIS_CHUNK_BYTES = 32 << 20
# Lifetime of the temporary key a large value is assembled in, renewed with every piece, so that a
# killed process leaves nothing behind for long.
_REDIS_TMP_TTL_S = 3600


def _redis_put(client, read_raw, key_prefix: str, key: str, offset: int, size: int) -> None:
    """Sets Redis `key` to the `size` source bytes at `offset` (read with `read_raw(offset, n)`).

    Up to REDIS_CHUNK_BYTES this is one SET. A larger value is assembled in a temporary key
    (SET of the first piece, then APPEND of each next one, whose returned length is checked) and
    RENAMEd to `key` at the end, so a reader never sees a partial value and a failure leaves no
    partial `key`: the temporary key is deleted on failure. The temporary key is
    `<key_prefix>.tz-staging-<random>` (as the Redis sink names its own), outside the
    `<key_prefix>:*` namespace that readers SCAN.
    """
    chunk = REDIS_CHUNK_BYTES
    if size <= chunk:
        client.set(key, read_raw(offset, size))
        return
    tmp = f"{key_prefix}.tz-staging-{uuid.uuid4().hex}"
    try:
        client.set(tmp, read_raw(offset, chunk), ex=_REDIS_TMP_TTL_S)
        done = chunk
        while done < size:
            n = min(chunk, size - done)
            pipe = client.pipeline(transaction=False)
            pipe.append(tmp, read_raw(offset + done, n))
            pipe.expire(tmp, _REDIS_TMP_TTL_S)
            length = pipe.execute()[0]
            done += n
            if length != done:
                raise OSError(
                    f"Redis temporary key {tmp!r} holds {length} bytes after APPEND, expected {done}"
                    " (it expired or was changed by another client)"
                )
        pipe = client.pipeline(transaction=True)  # MULTI/EXEC: the final key never has a TTL
        pipe.rename(tmp, key)
        pipe.persist(key)
        pipe.execute()
    except BaseException:
        with contextlib.suppress(Exception):
            client.delete(tmp)
        raise


# ---------------------------------------------------------------------------------------------
# Serializer
# ---------------------------------------------------------------------------------------------


class _Request(typing.NamedTuple):
    fields: tuple  # (path, type, module_idx, dtype, shape, address, meta) for _C.Writer.write
    keepalive: Any  # the memory behind `address`, held until the write returns


def _tensor_request(path, tensor_type: int, idx: int, tensor: Any) -> _Request:
    label = _tensor_path.display(TensorPath.wrap_(path))
    if isinstance(tensor, torch.Tensor):
        if tensor.is_quantized or tensor.dtype in _dtypes.QUANTIZED:
            raise NotImplementedError(f"Serialization for {tensor.dtype} is not implemented. (tensor {label!r})")
        if tensor.layout != torch.strided:
            raise NotImplementedError(f"Cannot serialize {tensor.layout} tensor {label!r}: only dense tensors")
        dtype = _dtypes.dtype_string(tensor.dtype)
        shape = list(tensor.shape)
        if tensor.is_meta:
            _warn_unreadable_opaque(label, dtype, shape, meta=True)
            return _Request((path, tensor_type, idx, dtype, shape, 0, True), None)
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.resolve_conj().resolve_neg()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.numel() == 0:
            _warn_unreadable_opaque(label, dtype, shape, meta=False)
        return _Request((path, tensor_type, idx, dtype, shape, t.data_ptr(), False), t)
    if isinstance(tensor, numpy.ndarray):
        try:
            torch.from_numpy(numpy.empty((), dtype=tensor.dtype))
        except Exception as e:
            raise TypeError(f"Cannot serialize an array with dtype {tensor.dtype.name} (tensor {label!r})") from e
        arr = tensor if tensor.flags.c_contiguous else numpy.ascontiguousarray(tensor)
        return _Request((path, tensor_type, idx, arr.dtype.str, list(arr.shape), arr.ctypes.data, False), arr)
    raise TypeError(
        f"Cannot serialize {type(tensor).__name__} as tensor {label!r}: expected torch.Tensor or numpy.ndarray"
    )


def _warn_unreadable_opaque(label: str, dtype: str, shape: List[int], meta: bool) -> None:
    n = 1
    for d in shape:
        n *= d
    if OPAQUE_DTYPE_SEP in dtype and (meta or n == 0):
        warnings.warn(
            f"Tensor {label!r} is a {'meta' if meta else 'zero-element'} tensor of opaque dtype"
            f" {dtype.split(OPAQUE_DTYPE_SEP)[1]}: this package reads it back, but the reference"
            " tensorizer (<= 2.12.1) cannot open a file that contains one",
            stacklevel=4,
        )


class TensorSerializer:
    """Writes tensors to a .tensors file readable by tensorizer 2.11+ (and this package).

    Args:
        file_obj: a path or URI (written under a temporary name and moved into place, or
            uploaded, on close), or an open binary file object that is writable and seekable.
        compress_tensors: accepted and ignored, as in the reference.
        encryption: EncryptionParams to encrypt tensor data.
        limit_cpu_concurrency: cap on the engine's hashing/writing threads.
    """

    def __init__(
        self,
        file_obj: Union[io.BufferedIOBase, io.RawIOBase, typing.BinaryIO, str, bytes, os.PathLike, int],
        compress_tensors: bool = False,
        *,
        encryption: Optional[EncryptionParams] = None,
        limit_cpu_concurrency: Optional[int] = None,
    ) -> None:
        self._writer = None
        self._file = None
        if limit_cpu_concurrency is not None:
            if isinstance(limit_cpu_concurrency, bool) or not isinstance(limit_cpu_concurrency, int):
                raise TypeError(
                    "limit_cpu_concurrency parameter: expected int or None,"
                    f" {limit_cpu_concurrency.__class__.__name__} found"
                )
            if limit_cpu_concurrency < 1:
                raise ValueError(
                    "limit_cpu_concurrency parameter: must be positive"
                    f" (or None for unbound), got {limit_cpu_concurrency}"
                )
        self.cpu_limit: int = limit_cpu_concurrency or cpu_count
        if encryption is not None and not isinstance(encryption, EncryptionParams):
            raise TypeError(
                "encryption parameter: expected EncryptionParams instance"
                f" or None, {encryption.__class__.__name__} found"
            )
        self._encrypted = encryption is not None
        key, kdf = encryption._engine_args() if encryption is not None else (None, None)
        workers = limit_cpu_concurrency or 0
        self.compress_tensors = compress_tensors
        self.total_compressed_tensor_bytes = 0
        self._final_tensor_bytes = 0
        self._lock = threading.Lock()

        if isinstance(file_obj, (os.PathLike, bytes)):
            self._writer = _C.Writer.open(_local_uri(file_obj), _C.TransportOptions(), key, kdf, workers)
        elif isinstance(file_obj, str):
            self._writer = _C.Writer.open(file_obj, _C.TransportOptions(), key, kdf, workers)
        elif isinstance(file_obj, int) and not isinstance(file_obj, bool):
            self._writer = _C.Writer.to_file(None, file_obj, f"<fd {file_obj}>", key, kdf, workers)
        else:
            self._mode_check(file_obj)
            seekable = getattr(file_obj, "seekable", None)
            if callable(seekable) and not seekable():
                raise ValueError("file_obj must support seeking for serialization")
            if hasattr(file_obj, "flush"):
                file_obj.flush()
            fd = _regular_fd(file_obj)
            self._file = file_obj
            self._writer = _C.Writer.to_file(
                file_obj, -1 if fd is None else fd, _file_label(file_obj), key, kdf, workers
            )

    @staticmethod
    def _mode_check(file_obj: Any) -> None:
        _check_file_mode(
            file_obj,
            "write",
            'TensorSerializer\'s file_obj must be writable, seekable, and in binary mode (mode="wb+"',
        )

    @property
    def total_tensor_bytes(self) -> int:
        """Sum of the data lengths written so far (the file header's tensor_size)."""
        w = self._writer
        return w.tensor_size if w is not None and not w.closed else self._final_tensor_bytes

    def _writer_or_raise(self):
        if self._writer is None or self._writer.closed:
            raise ValueError("I/O operation on a closed TensorSerializer")
        return self._writer

    def _write(self, requests: List[_Request]) -> None:
        with self._lock:
            writer = self._writer_or_raise()
            writer.write([r.fields for r in requests])
            del requests  # the engine is done with the memory

    def write_tensor(
        self,
        idx: int,
        name: Union[str, Sequence[Union[str, int]]],
        tensor_type: TensorType,
        tensor: Union[torch.Tensor, numpy.ndarray],
    ) -> None:
        """Writes one tensor (torch or numpy). The file is complete up to it when this returns."""
        if isinstance(tensor_type, bool) or not isinstance(tensor_type, int):
            raise TypeError(f"tensor_type: expected TensorType, got {tensor_type.__class__.__name__}")
        tensor_type = TensorType(tensor_type)
        if not isinstance(name, str):
            name = tuple(name)
        self._write([_tensor_request(name, int(tensor_type), idx, tensor)])

    def write_module(
        self,
        m: torch.nn.Module,
        remove_tensors: bool = False,
        *,
        include_non_persistent_buffers: bool = True,
    ) -> None:
        """Writes every parameter and buffer of `m` in one batch (names per spec §1.11).

        Args:
            remove_tensors: afterwards, set each written attribute to None.
            include_non_persistent_buffers: False matches ``state_dict()`` (persistent only).
        """
        with _gc_paused():
            written = self._write_module(m, include_non_persistent_buffers)
        if remove_tensors:
            for module, name in written:
                setattr(module, name, None)

    def _write_module(self, m: torch.nn.Module, include_non_persistent_buffers: bool):
        """Writes the tensors of write_module; returns the (module, attribute) pairs written."""
        requests: List[_Request] = []
        written: List[Tuple[torch.nn.Module, str]] = []
        for idx, (module_name, module) in enumerate(m.named_modules()):
            non_persistent = getattr(module, "_non_persistent_buffers_set", set())
            for name, tensor in module.named_parameters(recurse=False):
                requests.append(_tensor_request(f"{module_name}.{name}", TensorType.PARAM, idx, tensor))
                written.append((module, name))
            for name, tensor in module.named_buffers(recurse=False):
                if not include_non_persistent_buffers and name in non_persistent:
                    continue
                requests.append(_tensor_request(f"{module_name}.{name}", TensorType.BUFFER, idx, tensor))
                written.append((module, name))
        self._write(requests)
        return written

    def write_state_dict(self, state_dict: Union[Dict, List, Tuple]) -> None:
        """Writes a (possibly nested) dict/list of tensors; keys become paths (spec §2.2)."""
        with _gc_paused():
            requests = [
                _tensor_request(path.normalize_() if path.is_str_ else tuple(path), TensorType.STATE_DICT, 0, tensor)
                for path, tensor in _tensor_path.flatten_structure(torch.Tensor, state_dict)
            ]
            self._write(requests)

    def close(self) -> None:
        """Finishes the file: publishes it at its path (or uploads it), closes a file object."""
        with self._lock:
            writer = self._writer
            if writer is not None and not writer.closed:
                self._final_tensor_bytes = writer.tensor_size
                writer.close()
            if self._file is not None:
                file_obj, self._file = self._file, None
                file_obj.close()

    def _abort(self) -> None:
        with self._lock:
            writer = self._writer
            if writer is not None and not writer.closed:
                writer.abort()

    def __enter__(self) -> "TensorSerializer":
        return self

    def __exit__(self, exc_type, exc_val, traceback) -> None:
        if exc_type is not None:
            self._abort()
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()
