"""Parts of one tensor read without loading the rest (``TensorDeserializer.get_slice`` and slice
plans): an index made of ints and slices selects a block of the tensor; the block's bytes are, in
row-major order, runs of equal length at equal distances (a block of rows: one run; a block of
columns: one run per row), which ``Reader.read_strided`` reads packed, and nothing else. Steps
are taken from the bounding block afterwards."""

from __future__ import annotations

import itertools
import math
import operator
from typing import Any, List, Optional, Sequence, Tuple

import torch

# One read_strided call: (offset, run_bytes, stride, runs).
Runs = Tuple[int, int, int, int]


def block_of(index: Any, shape: Sequence[int]) -> Optional[Tuple[List[Tuple[int, int]], Tuple]]:
    """For an index of ints, slices with positive steps and at most one ``...``: the bounding block
    ([start, stop) per dimension) and the index that finishes the selection from that block (steps,
    dropped dimensions). None for anything else (tensors, None, bools): such an index is applied to
    the whole tensor."""
    items = index if isinstance(index, tuple) else (index,)
    if not shape or sum(i is Ellipsis for i in items) > 1:
        return None
    if any(i is Ellipsis for i in items):
        at = next(k for k, i in enumerate(items) if i is Ellipsis)
        items = items[:at] + (slice(None),) * (len(shape) - len(items) + 1) + items[at + 1 :]
    if len(items) > len(shape):
        return None
    items += (slice(None),) * (len(shape) - len(items))
    bounds: List[Tuple[int, int]] = []
    finish: List[Any] = []
    for dim, (item, n) in enumerate(zip(items, shape)):
        if isinstance(item, slice):
            start, stop, step = item.indices(n)
            if step < 1:
                return None
            stop = start + (stop - start - 1) // step * step + 1 if stop > start else start
            bounds.append((start, stop))
            finish.append(slice(None, None, step))
            continue
        if isinstance(item, bool):
            return None
        try:
            i = operator.index(item)
        except TypeError:
            return None
        if not -n <= i < n:
            raise IndexError(f"index {i} is out of bounds for dimension {dim} with size {n}")
        bounds.append((i % n, i % n + 1))
        finish.append(0)
    return bounds, tuple(finish)


def runs_of(bounds: Sequence[Tuple[int, int]], shape: Sequence[int], element_size: int) -> List[Runs]:
    """The read_strided calls that read block `bounds` of a row-major tensor packed in row-major
    order, in that order."""
    strides = [math.prod(shape[d + 1 :]) * element_size for d in range(len(shape))]
    partial = [d for d, (a, b) in enumerate(bounds) if (a, b) != (0, shape[d])]
    if not partial:
        total = math.prod(shape) * element_size
        return [(0, total, total, 1)]
    p = partial[-1]  # dimensions after p are whole: each run is a block of dimension p
    run = (bounds[p][1] - bounds[p][0]) * strides[p]
    if p == 0:
        return [(bounds[0][0] * strides[0], run, run, 1)]
    # Runs step along dimension p-1, and on through the whole dimensions before it.
    m = p - 1
    while m >= 1 and bounds[m] == (0, shape[m]):
        m -= 1
    runs = (bounds[m][1] - bounds[m][0]) * math.prod(shape[m + 1 : p])
    base = bounds[m][0] * strides[m] + bounds[p][0] * strides[p]
    calls = []
    for outer in itertools.product(*(range(a, b) for a, b in bounds[:m])):
        offset = base + sum(i * strides[d] for d, i in enumerate(outer))
        calls.append((offset, run, strides[p - 1], runs))
    return calls


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
        return self._owner._placed(self.read(index))

    def read(self, index) -> torch.Tensor:
        """The selection, as stored (CPU, stored dtype) when read in part."""
        owner, record = self._owner, self._record
        shape = list(record.entry.shape)
        block = block_of(index, shape) if record.dtype.torch is not None else None
        if block is None or not owner._can_read_ranges():
            return owner._whole(self._path)[index]
        bounds, finish = block
        out = torch.empty([b - a for a, b in bounds], dtype=record.dtype.torch)
        address = out.data_ptr()
        if out.numel():
            for offset, run, stride, runs in runs_of(bounds, shape, out.element_size()):
                owner._read_strided(record.index, offset, run, stride, runs, address)
                address += run * runs
        return out[finish]
