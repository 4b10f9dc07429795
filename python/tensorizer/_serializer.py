"""TensorSerializer: the reference's writing API over the engine. It maps torch tensors and numpy
arrays to engine write requests (address, dtype, shape); the engine hashes, encrypts and writes
them to whatever the caller passed (python/src/python_io.cc)."""

from __future__ import annotations

import concurrent.futures
import contextlib
import io
import os
import threading
import typing
import warnings
from typing import (
    Any,
    Dict,
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
from ._crypt import EncryptionParams
from ._tensor_path import TensorPath
from ._entries import OPAQUE_DTYPE_SEP, TensorType
from ._file_modes import _check_file_mode
from ._gc import _gc_paused

cpu_count: int = _C.usable_cores()


class _Request(typing.NamedTuple):
    request: "_C.WriteRequest"
    keepalive: Any  # the memory behind `address`, held until the write returns
    shared: bool = False  # `address` is the caller's own memory (no copy was needed)


def _tensor_request(path, tensor_type: int, idx: int, tensor: Any) -> _Request:
    label = _tensor_path.display(TensorPath.wrap_(path))
    if isinstance(tensor, torch.Tensor):
        if tensor.is_quantized or tensor.dtype in _dtypes.QUANTIZED:
            raise NotImplementedError(f"Serialization for {tensor.dtype} is not implemented. (tensor {label!r})")
        if tensor.is_nested:  # strided layout, but no single shape: torch's own error names neither
            raise NotImplementedError(f"Cannot serialize nested tensor {label!r}: only dense tensors")
        if tensor.layout != torch.strided:
            raise NotImplementedError(f"Cannot serialize {tensor.layout} tensor {label!r}: only dense tensors")
        dtype = _dtypes.dtype_string(tensor.dtype)
        shape = list(tensor.shape)
        if tensor.is_meta:
            _warn_unreadable_opaque(label, dtype, shape, meta=True)
            return _Request(_C.WriteRequest(path, tensor_type, idx, dtype, shape, 0, meta=True), None)
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        t = t.resolve_conj().resolve_neg()
        if not t.is_contiguous():
            t = t.contiguous()
        if t.numel() == 0:
            _warn_unreadable_opaque(label, dtype, shape, meta=False)
        shared = t.numel() > 0 and t.untyped_storage().data_ptr() == tensor.untyped_storage().data_ptr()
        return _Request(_C.WriteRequest(path, tensor_type, idx, dtype, shape, t.data_ptr()), t, shared)
    if isinstance(tensor, numpy.ndarray):
        try:
            torch.from_numpy(numpy.empty((), dtype=tensor.dtype))
        except Exception as e:
            raise TypeError(f"Cannot serialize an array with dtype {tensor.dtype.name} (tensor {label!r})") from e
        arr = tensor if tensor.flags.c_contiguous else numpy.ascontiguousarray(tensor)
        request = _C.WriteRequest(path, tensor_type, idx, arr.dtype.str, list(arr.shape), arr.ctypes.data)
        return _Request(request, arr, arr is tensor)
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

    ``write_state_dict`` and ``write_module`` take ``background=True`` (an extension of the
    reference API): the tensors are copied to host memory (the only time the caller waits), and
    the engine hashes, encrypts and writes them on a background thread without the GIL while the
    caller goes on (training may change the originals). They then return a
    ``concurrent.futures.Future`` whose ``result()`` raises the write's error. Writes land in call
    order; ``close()`` waits for every pending one, and if any failed it publishes nothing and
    raises that error.
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
        self._background: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._pending: List[concurrent.futures.Future] = []

        if not isinstance(file_obj, (str, bytes, os.PathLike, int)):
            self._mode_check(file_obj)
            seekable = getattr(file_obj, "seekable", None)
            if callable(seekable) and not seekable():
                raise ValueError("file_obj must support seeking for serialization")
            self._file = file_obj
        self._writer = _C.Writer.open(file_obj, _C.TransportOptions(), key, kdf, workers)

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
        if self._background is not None:  # after background writes, in order behind them
            self._write_in_background(requests, snapshot=False).result()
            return
        self._write_now(requests)

    def _write_now(self, requests: List[_Request]) -> None:
        with self._lock:
            writer = self._writer_or_raise()
            writer.write([r.request for r in requests])
            del requests  # the engine is done with the memory

    def _snapshot(self, requests: List[_Request]) -> List[_Request]:
        """`requests` with the caller's memory replaced by one engine snapshot (all cores): the
        only part of a background write the caller waits for."""
        shared = [k for k, r in enumerate(requests) if r.shared]
        if not shared:
            return requests
        copies, owner = _C.snapshot([requests[k].request for k in shared], 0)
        out = list(requests)
        for k, copy in zip(shared, copies):
            out[k] = _Request(copy, owner)
        return out

    def _write_in_background(self, requests: List[_Request], snapshot: bool = True) -> concurrent.futures.Future:
        self._writer_or_raise()
        if snapshot:
            requests = self._snapshot(requests)
        if self._background is None:
            self._background = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="tensorizer-save")
        future = self._background.submit(self._write_now, requests)
        self._pending = [f for f in self._pending if not f.done() or f.exception() is not None]
        self._pending.append(future)
        return future

    def _wait_for_background(self) -> Optional[BaseException]:
        """Waits for every background write; returns the first one's error (None: all wrote)."""
        if self._background is None:
            return None
        pending, self._pending = self._pending, []
        errors = [f.exception() for f in pending]
        self._background.shutdown(wait=True)
        self._background = None
        return next((e for e in errors if e is not None), None)

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
        background: bool = False,
    ) -> Optional[concurrent.futures.Future]:
        """Writes every parameter and buffer of `m` in one batch (names per docs/format.md §1.11).

        Args:
            remove_tensors: afterwards, set each written attribute to None.
            include_non_persistent_buffers: False matches ``state_dict()`` (persistent only).
            background: snapshot and write on a background thread; returns a Future (see the
                class docstring).
        """
        with _gc_paused():
            requests, written = self._module_requests(m, include_non_persistent_buffers)
        future = self._write_in_background(requests) if background else self._write(requests)
        if remove_tensors:
            for module, name in written:
                setattr(module, name, None)
        return future

    def _module_requests(self, m: torch.nn.Module, include_non_persistent_buffers: bool):
        """The requests of write_module, and the (module, attribute) pairs they write."""
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
        return requests, written

    def write_state_dict(
        self, state_dict: Union[Dict, List, Tuple], *, background: bool = False
    ) -> Optional[concurrent.futures.Future]:
        """Writes a (possibly nested) dict/list of tensors; keys become paths (docs/format.md §2.2).
        ``background=True``: snapshot and write on a background thread; returns a Future."""
        with _gc_paused():
            requests = [
                _tensor_request(path.normalize_() if path.is_str_ else tuple(path), TensorType.STATE_DICT, 0, tensor)
                for path, tensor in _tensor_path.flatten_structure(torch.Tensor, state_dict)
            ]
        if background:
            return self._write_in_background(requests)
        self._write(requests)
        return None

    def close(self) -> None:
        """Finishes the file: publishes it at its path (or uploads it), closes a file object.
        Waits for background writes first; if one failed, publishes nothing and raises its error."""
        failed = self._wait_for_background()
        if failed is not None:
            self._abort()
        self._close()
        if failed is not None:
            raise failed

    def _close(self) -> None:
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
            self._wait_for_background()
            self._abort()
        self.close()

    def __del__(self):
        with contextlib.suppress(Exception):
            self.close()
