"""torch dtypes <-> the dtype strings stored in .tensors files (docs/format.md §1.9).

The table itself lives in the C++ engine (tensorizer/dtype.h); this module caches lookups and
maps names to ``torch.dtype`` objects. No I/O here.
"""

from __future__ import annotations

import functools
import warnings
from typing import NamedTuple, Optional, Union

import numpy
import torch

from . import _C

# The real torch.empty, captured before utils.no_init_or_tensor can redirect it to "meta".
_torch_empty = torch.empty
_COMPLEX32 = getattr(torch, "complex32", None)


def empty(shape, dtype: torch.dtype, device: Union[str, torch.device] = "cpu") -> torch.Tensor:
    """An uninitialised tensor (the destination of a load)."""
    if dtype is _COMPLEX32:
        with warnings.catch_warnings():  # "ComplexHalf support is experimental"
            warnings.simplefilter("ignore", UserWarning)
            return _torch_empty(shape, dtype=dtype, device=device)
    return _torch_empty(shape, dtype=dtype, device=device)


QUANTIZED = frozenset(
    d
    for d in (getattr(torch, n, None) for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4"))
    if isinstance(d, torch.dtype)
)


@functools.lru_cache(maxsize=None)
def dtype_string(dtype: torch.dtype) -> str:
    """The stored dtype string for a torch dtype (NotImplementedError for quantized ones)."""
    if dtype in QUANTIZED:
        raise NotImplementedError(f"Serialization for {dtype} is not implemented.")
    return _C.dtype_string_for_torch(str(dtype))


class StoredDType(NamedTuple):
    numpy: str  # numpy part, e.g. "<f4" or "<V2"
    torch: Optional[torch.dtype]  # None when the string names no torch dtype
    torch_name: str  # "torch.bfloat16", or "" when unknown
    itemsize: int
    opaque: bool


def _torch_dtype(name: str) -> Optional[torch.dtype]:
    module, _, attr = name.partition(".")
    if module != "torch" or not attr:
        return None
    value = getattr(torch, attr, None)
    return value if isinstance(value, torch.dtype) else None


@functools.lru_cache(maxsize=None)
def parse(dtype: str) -> StoredDType:
    """Decodes a stored dtype string; ValueError if malformed."""
    np_part, torch_name, itemsize, opaque = _C.parse_dtype(dtype)
    return StoredDType(np_part, _torch_dtype(torch_name), torch_name, itemsize, opaque)


def numpy_dtype(stored: StoredDType) -> numpy.dtype:
    """The numpy dtype of the raw data (opaque types as the signed int of the same size)."""
    if stored.opaque:
        return numpy.dtype(stored.numpy.replace("V", "i"))
    return numpy.dtype(stored.numpy)


def requires_grad(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex
