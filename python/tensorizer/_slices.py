"""Lazy views of one tensor (``TensorDeserializer.get_slice``): shape and dtype without loading,
and indexing that reads only the rows asked for when it can (a range of whole rows is one
contiguous byte range of the file: ``Reader.read_range`` reads just those bytes)."""

import math
from typing import Any, List, Optional, Tuple

import torch


def row_range(index: Any, rows: int) -> Optional[Tuple[int, int, bool]]:
    """(start, stop, squeeze) when `index` selects whole consecutive rows (an int, a slice with
    step 1, either followed only by ``:`` or ``...``), else None."""
    rest: Tuple = ()
    if isinstance(index, tuple):
        if not index:
            return None
        index, rest = index[0], index[1:]
    if not all(r is Ellipsis or (isinstance(r, slice) and r == slice(None)) for r in rest):
        return None
    if isinstance(index, int) and not isinstance(index, bool):
        if not -rows <= index < rows:
            raise IndexError(f"index {index} is out of bounds for dimension 0 with size {rows}")
        start = index % rows
        return start, start + 1, True
    if isinstance(index, slice):
        start, stop, step = index.indices(rows)
        if step != 1:
            return None
        return start, max(start, stop), False
    return None


class TensorSlice:
    """One tensor of a deserializer, not loaded: ``get_shape()``, ``get_dtype()``, ``[...]``."""

    def __init__(self, owner: Any, path: Any):
        self._owner, self._path = owner, path
        self._record = owner._records[path]

    def get_shape(self) -> List[int]:
        return list(self._record.entry.shape)

    def get_dtype(self) -> str:
        return str(self._record.dtype.torch).removeprefix("torch.")

    def __getitem__(self, index) -> torch.Tensor:
        owner, record = self._owner, self._record
        shape = list(record.entry.shape)
        rows = row_range(index, shape[0]) if shape and self._path not in owner._cache else None
        if rows is None or not owner._can_read_ranges():
            return owner._bulk_load([self._path], None)[self._path].data[index]
        start, stop, squeeze = rows
        out = torch.empty([stop - start, *shape[1:]], dtype=record.dtype.torch)
        row_bytes = math.prod(shape[1:]) * out.element_size()
        if out.numel():
            owner._read_range(record.index, start * row_bytes, (stop - start) * row_bytes, out.data_ptr())
        if squeeze:
            out = out[0]
        return owner._placed(out)
