"""tensorizer as a backend for ``torch.save`` / ``torch.load`` (docs/reference-api.md §6.7).

Inside ``tensorizer_saving()``, ``torch.save(obj, f)`` pickles `obj` as usual except that every
tensor storage with data becomes a persistent id ``("TensorizerPickler", 0, "storage", i,
dtype)``, and the storages go to a sidecar ``.tensors`` file (default: ``f + ".tensors"``) written
with ``write_state_dict(list_of_storages)``. Inside ``tensorizer_loading()``, ``torch.load``
rebuilds those storages from the sidecar. Both are per thread/coroutine and nestable; the
innermost wins. Files are interchangeable with the reference's.
"""

import contextlib
import contextvars
import io
import logging
import os
import pickle
import threading
import types
import typing
from typing import Any, Callable, Iterable, List, Optional

import torch

from .serialization import TensorDeserializer, TensorSerializer

__all__ = ("tensorizer_saving", "tensorizer_loading")

logger = logging.getLogger(__name__)

# What torch.save/torch.load take as a file (the reference's name; user callbacks annotate with it).
_FileLike = typing.Union[str, os.PathLike, typing.BinaryIO, typing.IO[bytes]]

_ORIG_TORCH_SAVE: typing.Final[Callable] = torch.save
_ORIG_TORCH_LOAD: typing.Final[Callable] = torch.load


class _Settings(typing.NamedTuple):
    file_obj: Any  # where the sidecar goes, or a callable f -> file_obj, or None (derive it)
    func: Optional[Callable]  # save_func / load_func
    kwargs: dict  # for TensorSerializer / TensorDeserializer
    suppress_weights_only: bool = False


_saving: contextvars.ContextVar[Optional[_Settings]] = contextvars.ContextVar("tensorizer_saving", default=None)
_loading: contextvars.ContextVar[Optional[_Settings]] = contextvars.ContextVar("tensorizer_loading", default=None)
# The sidecar chosen for the torch.save/torch.load call in progress.
_sidecar: contextvars.ContextVar[Any] = contextvars.ContextVar("tensorizer_sidecar", default=None)


def _sidecar_for(f: Any, settings: _Settings) -> Any:
    """The sidecar target for the torch file `f`, or None to fall back to plain torch."""
    if settings.file_obj is None:
        if isinstance(f, io.BytesIO):
            logger.warning(
                "Cannot infer .tensors location from io.BytesIO; not using tensorizer backend"
                " (set the file_obj parameter to choose a location instead)"
            )
            return None
        try:
            name = os.fsdecode(f)
        except TypeError:
            name = os.fsdecode(f.name)
        return name + ".tensors"
    if callable(settings.file_obj):
        return settings.file_obj(f)
    return settings.file_obj


def _storage_has_data(storage) -> bool:
    untyped = getattr(storage, "_untyped_storage", storage)
    return untyped.device.type != "meta" and untyped.data_ptr() != 0


class _Pickler(pickle.Pickler):
    """Sends storages with data to the sidecar instead of the pickle."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tensorizer_target = _sidecar.get()
        self._tensorizer_storages: List[torch.Tensor] = []
        self._tensorizer_ids: dict = {}

    def persistent_id(self, obj):
        if self._tensorizer_target is None or not torch.is_storage(obj) or not _storage_has_data(obj):
            return None
        untyped = obj if isinstance(obj, torch.UntypedStorage) else getattr(obj, "_untyped_storage", None)
        if untyped is None:
            untyped = obj.untyped()
        view = torch.empty((0,), dtype=torch.uint8, device=untyped.device)
        view.set_(untyped)
        key = (view.data_ptr(), view.dtype, view.shape, view.layout, view.stride())
        index = self._tensorizer_ids.setdefault(key, len(self._tensorizer_storages))
        if index == len(self._tensorizer_storages):
            self._tensorizer_storages.append(view)
        return "TensorizerPickler", 0, "storage", index, getattr(obj, "dtype", None)

    def dump(self, obj):
        super().dump(obj)
        storages, self._tensorizer_storages = self._tensorizer_storages, []
        self._tensorizer_ids = {}
        if not storages or self._tensorizer_target is None:
            return
        settings = _saving.get()
        kwargs = settings.kwargs if settings else {}
        if settings is not None and settings.func is not None:
            settings.func(self._tensorizer_target, storages, kwargs)
            return
        serializer = TensorSerializer(self._tensorizer_target, **kwargs)
        serializer.write_state_dict(storages)
        serializer.close()

    def __init_subclass__(cls, **kwargs):
        # torch.save subclasses this Pickler with its own persistent_id; ours must run first.
        super().__init_subclass__(**kwargs)
        theirs = cls.__dict__.get("persistent_id")
        if theirs is None:
            return

        def persistent_id(self, obj):
            pid = _Pickler.persistent_id(self, obj)
            return pid if pid is not None else theirs(self, obj)

        cls.persistent_id = persistent_id


class _Unpickler(pickle.Unpickler):
    """Rebuilds storages from the sidecar on the first TensorizerPickler persistent id."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._tensorizer_source = _sidecar.get()
        self._tensorizer_tensors: Optional[list] = None
        self._tensorizer_fallback: Optional[Callable] = None

    def __setattr__(self, key, value):
        # torch.load assigns its own persistent_load to the instance; keep ours as the one the
        # unpickler calls, and defer to torch's for ids that are not ours.
        if key == "persistent_load":
            key = "_tensorizer_fallback"
        super().__setattr__(key, value)

    def _tensorizer_load(self) -> list:
        if self._tensorizer_tensors is None:
            settings = _loading.get()
            kwargs = settings.kwargs if settings else {}
            if settings is not None and settings.func is not None:
                self._tensorizer_tensors = list(settings.func(self._tensorizer_source, kwargs))
            else:
                with TensorDeserializer(self._tensorizer_source, **kwargs) as deserializer:
                    self._tensorizer_tensors = deserializer.tree()
        return self._tensorizer_tensors

    def persistent_load(self, pid):
        if (
            self._tensorizer_source is not None
            and isinstance(pid, tuple)
            and len(pid) >= 3
            and pid[0] == "TensorizerPickler"
        ):
            if pid[1] != 0:
                raise pickle.UnpicklingError(f"Unsupported TensorizerPickler data version ({pid[1]})")
            if pid[2] != "storage":
                raise pickle.UnpicklingError(f"Unsupported TensorizerPickler object type ({pid[2]})")
            index, dtype = pid[3:5]
            tensor = self._tensorizer_load()[index]
            return torch.TypedStorage(wrap_storage=tensor.untyped_storage(), dtype=dtype or torch.uint8, _internal=True)
        if self._tensorizer_fallback is not None:
            return self._tensorizer_fallback(pid)
        raise pickle.UnpicklingError("unsupported persistent id encountered")

    def load(self):
        try:
            return super().load()
        finally:
            self._tensorizer_tensors = None


_pickle_module = types.ModuleType("tensorizer_pickle")
_pickle_module.__getattr__ = lambda name: getattr(pickle, name)
_pickle_module.Pickler = _Pickler
_pickle_module.Unpickler = _Unpickler


def _check_pickle_module(pickle_module) -> None:
    if pickle_module is not None and pickle_module is not pickle:
        raise ValueError(
            "Tensorizer-based torch serialization is incompatible with using a pickle_module other than the default"
        )


def _save(obj, f, pickle_module=pickle, *args, **kwargs):
    settings = _saving.get()
    if settings is None:
        return _ORIG_TORCH_SAVE(obj, f, pickle_module, *args, **kwargs)
    _check_pickle_module(pickle_module)
    token = _sidecar.set(_sidecar_for(f, settings))
    try:
        return _ORIG_TORCH_SAVE(obj, f, *args, pickle_module=_pickle_module, **kwargs)
    finally:
        _sidecar.reset(token)


def _load(f, map_location=None, pickle_module=None, *args, weights_only=None, **kwargs):
    settings = _loading.get()
    if settings is None:
        return _ORIG_TORCH_LOAD(f, map_location, pickle_module, *args, weights_only=weights_only, **kwargs)
    _check_pickle_module(pickle_module)
    if settings.suppress_weights_only:
        weights_only = False
    token = _sidecar.set(_sidecar_for(f, settings))
    try:
        return _ORIG_TORCH_LOAD(
            f, map_location, *args, pickle_module=_pickle_module, weights_only=weights_only, **kwargs
        )
    finally:
        _sidecar.reset(token)


# torch.save / torch.load stay patched while any context in any thread is active; the patched
# functions behave like the originals in threads/coroutines without an active context.
_patch_lock = threading.Lock()
_patch_counts = {"save": 0, "load": 0}


@contextlib.contextmanager
def _patched(which: str):
    with _patch_lock:
        _patch_counts[which] += 1
        if _patch_counts[which] == 1:
            if which == "save":
                torch.save = _save
            else:
                torch.load = _load
    try:
        yield
    finally:
        with _patch_lock:
            _patch_counts[which] -= 1
            if _patch_counts[which] == 0:
                if which == "save":
                    torch.save = _ORIG_TORCH_SAVE
                else:
                    torch.load = _ORIG_TORCH_LOAD


@contextlib.contextmanager
def tensorizer_saving(
    file_obj: Any = None,
    *,
    save_func: Optional[Callable[[Any, Iterable[torch.Tensor], dict], Any]] = None,
    **kwargs,
):
    """Within this context, ``torch.save`` writes tensor storages to a tensorizer sidecar.

    Args:
        file_obj: the sidecar (anything TensorSerializer accepts), a callable ``f -> file_obj``
            (returning None means plain torch), or None for ``<f>.tensors``.
        save_func: ``save_func(file_obj, tensors, kwargs)`` replaces the default writing step.
        kwargs: passed to TensorSerializer.
    """
    token = _saving.set(_Settings(file_obj, save_func, kwargs))
    try:
        with _patched("save"):
            yield
    finally:
        _saving.reset(token)


@contextlib.contextmanager
def tensorizer_loading(
    file_obj: Any = None,
    *,
    load_func: Optional[Callable[[Any, dict], Iterable[torch.Tensor]]] = None,
    suppress_weights_only: bool = False,
    **kwargs,
):
    """Within this context, ``torch.load`` reads tensor storages from a tensorizer sidecar.

    Args:
        file_obj: the sidecar (anything TensorDeserializer accepts), a callable ``f ->
            file_obj`` (returning None means plain torch), or None for ``<f>.tensors``.
        load_func: ``load_func(file_obj, kwargs) -> tensors`` replaces the default reading step.
        suppress_weights_only: force ``weights_only=False`` (torch refuses a custom pickle
            module with ``weights_only=True``).
        kwargs: passed to TensorDeserializer.
    """
    token = _loading.set(_Settings(file_obj, load_func, kwargs, suppress_weights_only))
    try:
        with _patched("load"):
            yield
    finally:
        _loading.reset(token)
