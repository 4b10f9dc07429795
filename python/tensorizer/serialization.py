"""TensorSerializer and TensorDeserializer: the reference tensorizer API over the C++ engine.

The reference's module of this name, kept for its importers; the code lives in _serializer.py
(torch/numpy objects to engine write requests), _deserializer.py (engine loads into torch
tensors, the Mapping and module views), _entries.py (index entries and format constants) and
_redis_copy.py (to_redis). Deliberate departures from the reference: docs/python-decisions.md.
"""

from ._crypt import DecryptionParams, EncryptionParams
from ._deserializer import FilterFuncType, TensorDeserializer
from ._entries import (  # noqa: F401 (public here, as in the reference)
    ENCRYPTION_TENSORIZER_VERSION,
    LONG_TENSOR_TENSORIZER_VERSION,
    META_TENSOR_TENSORIZER_VERSION,
    NON_OPAQUE_TENSORIZER_VERSION,
    OPAQUE_DTYPE_SEP,
    OPAQUE_TENSORIZER_VERSION,
    TENSORIZER_MAGIC,
    TENSORIZER_VERSION,
    HashType,
    TensorEntry,
    TensorHash,
    TensorType,
)
from ._errors import CryptographyError, HashMismatchError  # noqa: F401
from ._serializer import TensorSerializer, cpu_count  # noqa: F401

__all__ = [
    "TensorSerializer",
    "TensorDeserializer",
    "TensorType",
    "CryptographyError",
    "EncryptionParams",
    "DecryptionParams",
    "FilterFuncType",
]
