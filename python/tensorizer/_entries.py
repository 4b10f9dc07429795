"""What the Python API shows of a file's index: TensorType, HashType, TensorHash, TensorEntry,
the data-version constants (the engine's, re-exported under the reference's names) and the
deserializer's per-tensor record."""

from __future__ import annotations

import dataclasses
from enum import IntEnum
from typing import (
    Any,
    Dict,
    List,
    Optional,
    Tuple,
)


from . import _C
from . import _dtypes
from ._tensor_path import TensorPath


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


def _tensor_hashes(hashes) -> List["TensorHash"]:
    """TensorHash objects for the engine's (hash type, value) pairs."""
    return [TensorHash(_HASH_TYPES[t] if t in _HASH_TYPES else HashType(t), h) for t, h in hashes]


# Data versions (docs/format.md): the engine writes the lowest one a file needs.
TENSORIZER_VERSION = _C.MAX_VERSION
LONG_TENSOR_TENSORIZER_VERSION = _C.LONG_DIMS_VERSION
META_TENSOR_TENSORIZER_VERSION = _C.META_VERSION
ENCRYPTION_TENSORIZER_VERSION = _C.ENCRYPTION_VERSION
OPAQUE_TENSORIZER_VERSION = _C.OPAQUE_VERSION
NON_OPAQUE_TENSORIZER_VERSION = 1
TENSORIZER_MAGIC = _C.MAGIC
OPAQUE_DTYPE_SEP = "\0"


class _FieldMethods:
    """What ``dataclasses.dataclass(order=True)`` would generate for TensorHash and TensorEntry
    (the reference's types): repr, equality and ordering over the fields, in field order, and no
    hash. Written out because generating them runs ``exec`` at import, 0.6 ms a class; the classes
    stay dataclasses (``dataclasses.fields``, ``asdict`` and ``replace`` work)."""

    __slots__ = ()
    __hash__ = None  # mutable, like the reference's

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__qualname__}({fields})"

    def __eq__(self, other):
        return self._values() == other._values() if other.__class__ is self.__class__ else NotImplemented

    def __lt__(self, other):
        return self._values() < other._values() if other.__class__ is self.__class__ else NotImplemented

    def __le__(self, other):
        return self._values() <= other._values() if other.__class__ is self.__class__ else NotImplemented

    def __gt__(self, other):
        return self._values() > other._values() if other.__class__ is self.__class__ else NotImplemented

    def __ge__(self, other):
        return self._values() >= other._values() if other.__class__ is self.__class__ else NotImplemented


_fields_only = dataclasses.dataclass(init=False, repr=False, eq=False)


@_fields_only
class TensorHash(_FieldMethods):
    __slots__ = ("type", "hash")
    type: HashType
    hash: bytes

    def __init__(self, type: HashType, hash: bytes):  # noqa: A002 (the reference's field names)
        self.type = type
        self.hash = hash


@_fields_only
class TensorEntry(_FieldMethods):
    """One index entry, as the reference exposes it in ``TensorDeserializer._metadata``."""

    __slots__ = (
        "metadata_version",
        "name",
        "type",
        "dtype",
        "shape",
        "offset",
        "data_offset",
        "data_length",
        "hashes",
        "header_hashes",
    )
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

    def __init__(
        self,
        metadata_version: int,
        name: TensorPath,
        type: TensorType,  # noqa: A002
        dtype: str,
        shape: Tuple[int, ...],
        offset: int,
        data_offset: int,
        data_length: int,
        hashes: Optional[List[TensorHash]],
        header_hashes: Optional[Dict[HashType, Any]],
    ):
        self.metadata_version = metadata_version
        self.name = name
        self.type = type
        self.dtype = dtype
        self.shape = shape
        self.offset = offset
        self.data_offset = data_offset
        self.data_length = data_length
        self.hashes = hashes
        self.header_hashes = header_hashes

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


class _Record:
    """What the deserializer knows about one tensor beyond its TensorEntry. Once the tensor is
    loaded, `infos` is what its load's headers said (the engine's LoadedInfos, one per load) and
    `at` its position there; its module index and hashable header are asked of it when needed (the
    hashable header is built on request: only verify_module wants it)."""

    __slots__ = ("index", "entry", "dtype", "expected_bytes", "infos", "at")

    def __init__(self, index: int, entry: TensorEntry, dtype: "_dtypes.StoredDType", expected_bytes: int):
        self.index = index  # position in the engine's index
        self.entry = entry
        self.dtype = dtype
        self.expected_bytes = expected_bytes
        self.infos: Any = None
        self.at = 0

    @property
    def module_idx(self) -> Optional[int]:
        return None if self.infos is None else self.infos.module_idx(self.at)

    @property
    def hashable_header(self) -> Optional[bytes]:
        return None if self.infos is None else self.infos.hashable_header(self.at)
