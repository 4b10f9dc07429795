"""What the Python API shows of a file's index: TensorType, HashType, TensorHash, TensorEntry,
the data-version constants (the engine's, re-exported under the reference's names) and the
deserializer's per-tensor record."""

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
