"""TensorDeserializer: the reference's reading API over the engine. It allocates destination
tensors with torch (CPU or CUDA), hands their addresses to the engine, which reads, decrypts and
verifies with the GIL released, and presents the result as the reference's Mapping and module
views. It never touches tensor bytes itself, and opens no source: the engine takes whatever the
caller passed (python/src/python_io.cc)."""

from __future__ import annotations

import collections.abc
import contextlib
import functools
import io
import os
import threading
import types
import typing
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
from . import _slices
from . import _tensor_path
from . import stream_io
from ._crypt import DecryptionParams
from ._tensor_path import TensorPath
from ._entries import (
    _TENSOR_TYPES,
    HashType,
    TensorEntry,
    TensorType,
    _Record,
    _tensor_hashes,
)
from ._file_modes import _check_file_mode
from ._gc import _gc_paused
from ._redis_copy import copy_to_redis

FilterFuncType = Callable[[Union[str, Sequence[Union[str, int]]]], Any]
# Names (as filter_func gets them) to the index of the part to load; see TensorDeserializer.
SlicePlan = Union[typing.Mapping[Any, Any], Callable[[Any, List[int]], Any]]


def _slice_plan(records: Dict[TensorPath, Any], plan: Optional[SlicePlan]) -> Dict[TensorPath, Any]:
    """The index each record's plan entry names (records the plan leaves whole are absent)."""
    if plan is None:
        return {}
    if not callable(plan) and not isinstance(plan, collections.abc.Mapping):
        raise TypeError(f"slice_plan: expected a mapping or a callable, got {plan.__class__.__name__}")
    out = {}
    for path, record in records.items():
        name = path.normalize_()
        index = plan(name, list(record.entry.shape)) if callable(plan) else plan.get(name)
        if index is not None:
            out[path] = index
    return out


def _resolve_cuda_device() -> torch.device:
    """The contextually active CUDA device (docs/reference-api.md §4.9), without initialising CUDA needlessly."""
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

    A safetensors file opens the same way (the engine tells the formats apart by their first
    bytes) and loads through the same routes; its tensors are keyed by their names, it has no
    hashes to verify and it is never encrypted. ``tensorizer.safetensors`` has the
    ``safetensors.torch``-shaped entry points.

    Args:
        file_obj: a path, a URI (``http(s)://``, ``s3://``, ``redis://``, any transport the
            engine knows), a stream from ``stream_io.open_stream``, or a readable binary file
            object.
        device: where tensors go (None: CUDA if available, else CPU).
        filter_func: ``(name: str | tuple) -> bool``; tensors it rejects are left out entirely.
        dtype: cast every tensor that is not bool to this dtype, as the reference does (vLLM
            passes its model's dtype and relies on it).
        cast_within_kind: with ``dtype``, cast only tensors of its kind (float to float,
            complex to complex, int to int), so integer ids and quantized weights stay exact
            (an extension of the reference API).
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
            with direct I/O into fresh memory, everything else is copied into fresh memory.
            True: map every tensor that can be mapped. False: plain copies into memory
            torch allocates. The ``TENSORIZER_MMAP`` environment variable ("1" or "0") sets
            True or False when the argument is None. Mapped tensors stay valid when the file is
            deleted or replaced by rename; truncating it in place while they live raises SIGBUS
            on access (as with any file mapping, safetensors included).
        connect_timeout, stall_timeout: seconds (extensions of the reference API) for remote
            sources: a connection not made in ``connect_timeout``, or a transfer slower than
            4 KiB/s for ``stall_timeout``, is retried from the first missing byte, and the load
            fails once failing (or stalling) has lasted ``stall_timeout``. None: the
            ``TENSORIZER_CONNECT_TIMEOUT`` / ``TENSORIZER_STALL_TIMEOUT`` environment variables,
            else 10 and 30 s.
        deadline: seconds (an extension of the reference API) within which the open and every
            load through this deserializer must finish, counted from construction; past it the
            engine stops and raises TimeoutError naming the file. None: no deadline.
        cache_dir: a directory (an extension of the reference API) where HTTP(S) and S3 objects
            are kept for later loads, validated by the server's ETag (or Last-Modified) and
            size on every open: a miss fetches the whole object into the cache first (one
            download however many processes ask at once), a hit loads the local copy as a
            local file. None: ``TENSORIZER_CACHE_DIR`` if set, else no cache;
            ``TENSORIZER_CACHE_MAX_GIB`` bounds its size (least recently used entries go).
        slice_plan: which part of each tensor to load (an extension of the reference API), for
            tensor-parallel ranks: a mapping from name to an index (``{"w": (slice(None),
            slice(0, 512))}``), or a callable ``(name, shape) -> index or None``; None (or a
            name the mapping lacks) loads the whole tensor. An index of ints and slices reads
            only the selected block's bytes (a block of rows in one request, a block of
            columns as strided runs); ``tensorizer.distributed.shard_plan(rank, world_size,
            dim)`` builds the plan of one rank of N. With ``verify_hash=True`` the
            whole tensor is loaded and checked, then cut.

    Ctrl-C during construction or a load raises KeyboardInterrupt within a fraction of a second,
    after the engine has stopped its workers and closed its connections.
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
        connect_timeout: Optional[float] = None,
        stall_timeout: Optional[float] = None,
        deadline: Optional[float] = None,
        cast_within_kind: bool = False,
        cache_dir: Optional[Union[str, os.PathLike]] = None,
        slice_plan: Optional[SlicePlan] = None,
    ):
        del plaid_mode, plaid_mode_buffers  # accepted for compatibility; the engine stages every CUDA load
        self._reader = None
        self._cache_status = None
        self._file = None  # a caller's file object, closed with the source (as the reference does)
        self._lock = threading.RLock()
        self._cache: Dict[TensorPath, torch.nn.Parameter] = {}
        self._bytes_read_closed = 0
        self._read_cursor = -1  # position of the last tensor yielded by read_tensors()
        self._unhashed: List[_Record] = []  # loaded records whose entry.hashes are not filled in yet

        if device is None:  # utils.get_device(), whose module a load does not import
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        device = torch.device(device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("Cannot deserialize to CUDA device because CUDA is not available")
        self._device_is_dynamic = device.type == "cuda" and device.index is None and lazy_load
        if device.type == "cuda" and device.index is None:
            device = _resolve_cuda_device()
        self._device: torch.device = device

        if dtype is not None and not isinstance(dtype, torch.dtype):
            raise TypeError(f"dtype: expected torch.dtype or None, got {dtype.__class__.__name__}")
        self._dtype = dtype
        self._cast_within_kind = bool(cast_within_kind)
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
        key, passphrase, kdf_limits = encryption._engine_args() if encryption is not None else (None, None, None)
        self._encrypted = encryption is not None

        options = stream_io._transport_options(
            connect_timeout=connect_timeout, stall_timeout=stall_timeout, cache_dir=cache_dir
        )
        if deadline is not None and (isinstance(deadline, bool) or not deadline > 0):
            raise ValueError(f"deadline must be a number of seconds greater than 0, not {deadline!r}")
        # Everything to host memory through the engine's block (load_host): a slow server's wait
        # for its first byte is spent mapping that memory (ReaderOptions::expect_host_load).
        expect_host_load = (
            not self._lazy_load
            and filter_func is None
            and slice_plan is None
            and device.type == "cpu"
            and self._route is not None
            and not self._staged
        )
        self._reader = self._open(
            file_obj, options, key, passphrase, kdf_limits, float(deadline or 0), expect_host_load
        )
        self._cache_status = self._reader.cache_status  # the HTTP probe's answer; kept after close
        self._file_label = self._reader.uri
        reader = self._reader
        self._version = reader.version
        self._format: str = reader.format  # "tensorizer" or "safetensors"
        self._file_metadata: Dict[str, str] = reader.metadata  # safetensors' __metadata__
        self.total_file_bytes: int = reader.tensor_size
        self.total_compressed_tensor_bytes = 0
        self.read_bytes = 0

        with _gc_paused():
            self._index_and_load(reader, filter_func, slice_plan)

    def _index_and_load(self, reader, filter_func, slice_plan) -> None:
        """Builds the records of every entry (filtered), then loads them unless lazy."""
        self._records: Dict[TensorPath, _Record] = {}
        records, types = self._records, _TENSOR_TYPES
        parsed: Dict[str, _dtypes.StoredDType] = {}  # a model stores a handful of dtypes
        for i, (name, kind, dtype, shape, header_offset, data_offset, data_length, expected) in enumerate(
            reader.index_rows()  # one tuple per tensor: no engine object or attribute call each
        ):
            path = TensorPath(name)
            entry = TensorEntry(  # positional, in field order: a keyword call costs more per tensor
                5 if shape and max(shape) >= 1 << 32 else 1,  # metadata_version
                path,
                types[kind] if kind in types else TensorType(kind),
                dtype,
                shape,
                header_offset,
                data_offset,
                data_length,
                None,  # hashes: known once the tensor's header is read
                None,  # header_hashes
            )
            stored = parsed.get(dtype)
            if stored is None:
                stored = parsed[dtype] = _dtypes.parse(dtype)
            records[path] = _Record(i, entry, stored, expected)
        if filter_func is not None:
            self._records = {p: r for p, r in self._records.items() if filter_func(p.normalize_())}
        self._plan: Dict[TensorPath, Any] = _slice_plan(self._records, slice_plan)
        self._index_entries: Dict[TensorPath, TensorEntry] = {p: r.entry for p, r in self._records.items()}
        self._order: Dict[TensorPath, int] = {p: k for k, p in enumerate(self._records)}
        self._structure = _tensor_path.build_tree(list(self._records))

        self.total_tensor_bytes: int = sum(r.expected_bytes for r in self._records.values())
        if not self._lazy_load:
            self._bulk_load(list(self._records), None)
            self.total_tensor_bytes = sum(r.entry.data_length for r in self._records.values())
            self._close_source()

    @property
    def _metadata(self) -> Dict[TensorPath, TensorEntry]:
        """The index as the reference keeps it (private there too), each loaded tensor's entry with
        its stored hashes."""
        self._fill_hashes()
        return self._index_entries

    def _fill_hashes(self) -> None:
        """Sets entry.hashes of the records loaded since the last call: made on request, since
        building hundreds of small objects per load costs a fresh process about a millisecond."""
        pending, self._unhashed = self._unhashed, []
        for r in pending:
            r.entry.hashes = _tensor_hashes(r.infos.hashes(r.at) or ())

    # -- opening -----------------------------------------------------------------------------

    def _open(
        self,
        file_obj: Any,
        options: "_C.TransportOptions",
        key,
        passphrase,
        kdf_limits,
        deadline: float,
        expect_host_load: bool = False,
    ):
        """The engine reader over `file_obj`; the engine decides what kind of source it is."""
        if not isinstance(file_obj, (str, bytes, os.PathLike, int)):
            if not isinstance(file_obj, stream_io._EngineStreamFile):
                self._mode_check(file_obj)
            self._file = file_obj
        return _C.Reader.open(file_obj, options, key, passphrase, kdf_limits, deadline, expect_host_load)

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

    @property
    def _file_header(self) -> "types.SimpleNamespace":
        """The reference's private attribute its own tests read (``version_number``)."""
        return types.SimpleNamespace(version_number=self._version)

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
        """The dtype to cast a stored dtype to (None: keep it): every dtype but bool, or with
        cast_within_kind only one of the target's kind (float, complex, int)."""
        target = self._dtype
        if target is None or target == stored or stored == torch.bool:
            return None
        if self._cast_within_kind:
            kind = (stored.is_floating_point, stored.is_complex)
            if kind != (target.is_floating_point, target.is_complex) or target == torch.bool:
                return None
        return target

    def _bulk_load(
        self,
        paths: Sequence[TensorPath],
        verify_hash: Optional[bool],
        into: Optional[Dict[TensorPath, torch.Tensor]] = None,
    ) -> Dict[TensorPath, torch.nn.Parameter]:
        """Loads (or takes from the cache) every path; one engine call for the uncached ones.
        `into`: existing tensors (see _in_place_targets) that uncached paths load into."""
        with self._lock, _gc_paused():
            missing = [p for p in paths if p not in self._cache]
            self._load_planned([p for p in missing if p in self._plan])
            missing = [p for p in missing if p not in self._plan]
            if missing:
                verify = self._verify_hash if verify_hash is None else verify_hash
                self._load_uncached(missing, verify, into or {})
            return {p: self._cache[p] for p in paths}

    def _load_uncached(self, paths: List[TensorPath], verify_hash: bool, into: Dict[TensorPath, torch.Tensor]) -> None:
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
            tensors = [
                into[p].data if p in into else _dtypes.empty(r.entry.shape, r.dtype.torch, self._device)
                for p, r in zip(paths, records)
            ]
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
            loaded, infos = self._reader.load_host(indices, self._num_readers, verify_hash, self._route)
            tensors = [
                raw if raw.dtype == r.dtype.torch else raw.view(r.dtype.torch).view(r.entry.shape)
                for (raw, _), r in zip(loaded, records)
            ]
            self._loaded_via.update(zip(paths, [via for _, via in loaded]))
        else:
            tensors = [
                into[p].data if p in into else _dtypes.empty(r.entry.shape, r.dtype.torch)
                for p, r in zip(paths, records)
            ]
            infos = self._reader.load(indices, [t.data_ptr() for t in tensors], self._num_readers, verify_hash)
            for path in paths:
                self._loaded_via[path] = "copied"
        device, cache = self._device, self._cache
        on_cpu = device.type == "cpu"
        decided: Dict[torch.dtype, Tuple[Optional[torch.dtype], bool]] = {}  # per stored dtype
        parameter, make_parameter = torch.nn.Parameter, torch.Tensor._make_subclass
        self._unhashed.extend(records)  # entry.hashes made when asked for (_metadata, verify_module)
        for k, (path, r, tensor) in enumerate(zip(paths, records, tensors)):
            r.infos, r.at = infos, k  # what its header said, asked for when needed
            if into and path in into:  # loaded into a module's own tensor: it is the result
                existing = into[path]
                self._loaded_via[path] = "in-place"
                cache[path] = (
                    existing
                    if isinstance(existing, parameter)
                    else parameter(existing, requires_grad=_dtypes.requires_grad(existing.dtype))
                )
                continue
            stored = tensor.dtype
            if stored not in decided:
                target = self._cast_target(stored)
                # As the reference: from the stored dtype (a cast to an integer dtype cannot have it).
                decided[stored] = (target, _dtypes.requires_grad(stored) and _dtypes.requires_grad(target or stored))
            target, grad = decided[stored]
            if not on_cpu or target is not None:
                tensor = tensor.to(device=device, dtype=target)
            # What Parameter(tensor, grad) does for a plain tensor, without its Python frame.
            cache[path] = (
                make_parameter(parameter, tensor, grad)
                if type(tensor) is torch.Tensor
                else parameter(tensor, requires_grad=grad)
            )

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

    def get_slice(self, name) -> "_slices.TensorSlice":
        """A lazy view of one tensor (an extension of the reference API): ``get_shape()``,
        ``get_dtype()``, and indexing; a range of whole rows (``[a:b]``, ``[i]``, ``[a:b, ...]``)
        reads only those rows' bytes (not hash-checked: with ``verify_hash=True`` the whole tensor
        is loaded and checked first)."""
        path = name if isinstance(name, TensorPath) else TensorPath((name,))
        if path not in self._records:
            raise KeyError(f"Tensor {name} not found")
        return _slices.TensorSlice(self, path)

    def _can_read_ranges(self) -> bool:
        return not self._verify_hash and self._reader is not None and not self._reader.closed

    def _read_strided(self, index: int, offset: int, run: int, stride: int, runs: int, address: int) -> None:
        with self._lock:
            self._reader.read_strided(index, offset, run, stride, runs, address, self._num_readers)

    def _whole(self, path: TensorPath) -> torch.Tensor:
        """The whole tensor at `path` (placed), whatever a slice plan says: cached as usual when
        the plan leaves it whole, loaded and dropped when the plan keeps only part of it."""
        if path not in self._plan:
            return self._bulk_load([path], None)[path].data
        with self._lock, _gc_paused():
            self._load_uncached([path], self._verify_hash, {})
            return self._cache.pop(path).data

    def _load_planned(self, paths: List[TensorPath]) -> None:
        """Loads the part of each path its slice plan selects (reading only those bytes when no
        hash check needs the whole tensor)."""
        for path in paths:
            part = _slices.TensorSlice(self, path)[self._plan[path]].contiguous()
            grad = _dtypes.requires_grad(part.dtype)
            self._cache[path] = torch.nn.Parameter(part, requires_grad=grad)
            self._loaded_via[path] = "sliced"

    def _placed(self, tensor: torch.Tensor) -> torch.Tensor:
        """`tensor` (CPU, as stored) on this deserializer's device and dtype."""
        target = self._cast_target(tensor.dtype)
        if self._device.type != "cpu" or target is not None:
            tensor = tensor.to(device=self._device, dtype=target)
        return tensor

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

    def _next_page(self, filter_func, num_tensors: int, verify_hash) -> Tuple[List[TensorPath], Dict]:
        """The next paths of read_tensors/read_numpy_arrays and their loaded tensors."""
        paths = self._next_paths(filter_func, num_tensors)
        return paths, (self._bulk_load(paths, verify_hash) if paths else {})

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
        paths, loaded = self._next_page(filter_func, num_tensors, verify_hash)
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
        paths, loaded = self._next_page(filter_func, num_tensors, verify_hash)
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
        A safetensors file does not say which tensors are buffers: the module's own buffers
        stay buffers, every other tensor becomes a parameter.

        A tensor not loaded yet (``lazy_load=True``) whose module already holds a materialized
        tensor of the same shape and dtype on the target device (contiguous, no ``dtype=`` cast)
        is read straight into that tensor's memory, on a GPU or, on CPU, with ``mmap=False``: no
        second copy, and the module keeps its own Parameter objects. Otherwise (meta tensors, a
        mismatch, tensors loaded at construction, CPU tensors mapped from the page cache, which
        cost no memory of their own) the loaded tensors are registered in their place.
        """
        paths = [p for p in self._records if filter_func is None or filter_func(p.normalize_())]
        for path in paths:
            entry = self._records[path].entry
            if entry.type == TensorType.STATE_DICT and self._format != "safetensors":
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
        loaded = self._bulk_load(paths, verify_hash, self._in_place_targets(paths, modules))
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
            entry_type = self._records[path].entry.type
            if entry_type == TensorType.PARAM or (entry_type == TensorType.STATE_DICT and attr not in module._buffers):
                module.register_parameter(attr, tensor)
            else:
                persistent = attr not in getattr(module, "_non_persistent_buffers_set", ())
                module.register_buffer(attr, tensor.data, persistent=persistent)
        self._close_source()
        return len(paths)

    def _in_place_targets(
        self, paths: Sequence[TensorPath], modules: Dict[str, torch.nn.Module]
    ) -> Dict[TensorPath, torch.Tensor]:
        """The module tensors that uncached `paths` can be loaded into (see load_into_module)."""
        if not (self._device.type != "cpu" or self._staged or self._route is None):
            return {}
        targets: Dict[TensorPath, torch.Tensor] = {}
        taken = set()  # a tensor shared by two names (tied weights) is loaded into once
        for path in paths:
            if path in self._cache:
                continue
            module_path, _, attr = path[0].rpartition(".")
            module = modules.get(module_path)
            if module is None:
                continue
            existing = module._parameters.get(attr)
            if existing is None:
                existing = module._buffers.get(attr)
            r = self._records[path]
            if (
                existing is not None
                and not existing.is_meta
                and existing.device == self._device
                and r.dtype.torch is not None
                and existing.dtype == r.dtype.torch
                and self._cast_target(r.dtype.torch) is None
                and tuple(existing.shape) == tuple(r.entry.shape)
                and existing.is_contiguous()
                and existing.numel() * existing.element_size() == r.expected_bytes
                and existing.data_ptr() not in taken
            ):
                targets[path] = existing
                taken.add(existing.data_ptr())
        return targets

    def verify_module(self, m: torch.nn.Module) -> Tuple[bool, List[Tuple[Union[str, tuple], bool]]]:
        """Checks a live module's tensors against the stored hashes of the loaded tensors."""
        tensors: Dict[Any, torch.Tensor] = {}
        tensors.update(m.state_dict())
        tensors.update(m.named_buffers())
        results: List[Tuple[Any, bool]] = []
        self._fill_hashes()
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
        """Copies the file into Redis keys the way tensorizer lays them out (docs/format.md §4).

        Uses the given redis-py client (its auth, database and TLS apply); the keys are the
        engine's object_parts, as its Redis sink writes them. Without `force`, tensors whose header
        key exists are skipped. See _redis_copy.copy_to_redis.
        """
        if self._reader is None or self._reader.closed:
            raise OSError(f"'{self._file_label}' is closed; use lazy_load=True to copy it to Redis")
        copy_to_redis(self._reader, redis_client, key_prefix, force, self._file_label)


# to_redis sends a value larger than this in pieces of this size, so a copy never holds more than
