"""safetensors files through the engine, with the entry points of ``safetensors.torch``.

``load_file``, ``load``, ``safe_open``, ``save_file`` and ``save`` behave as safetensors' own do,
but read and write through the tensorizer engine: local files take the mapped / direct-I/O / copy
routes, paths may be URIs (``http(s)://``, ``s3://``, ``redis://``), and files are
written byte for byte as safetensors writes them (its tensor order and header padding;
``metadata`` in the dict's order, which safetensors leaves to chance past one key).
``TensorDeserializer`` opens safetensors files too (same Mapping view, ``load_into_module``).
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Union

import torch

from . import _dtypes, stream_io
from ._C import write_safetensors as _write_safetensors
from ._deserializer import TensorDeserializer
from ._slices import TensorSlice
from ._tensor_path import TensorPath

__all__ = ["load_file", "load", "load_checkpoint", "safe_open", "save_file", "save", "save_checkpoint"]

PathOrUri = Union[str, bytes, os.PathLike]

# The safetensors name of each torch dtype a safetensors file can hold (for get_slice().get_dtype()).
_SAFETENSORS_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.uint16: "U16",
    torch.int32: "I32",
    torch.uint32: "U32",
    torch.int64: "I64",
    torch.uint64: "U64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.complex64: "C64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e8m0fnu: "F8_E8M0",
}


def _plain(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor itself, not the Parameter the deserializer keeps it in."""
    return tensor.data if isinstance(tensor, torch.nn.Parameter) else tensor


def _open(source: Any, device: Union[str, int, torch.device], lazy: bool) -> TensorDeserializer:
    if isinstance(device, int):
        device = torch.device("cuda", device)
    deserializer = TensorDeserializer(source, device=device, lazy_load=lazy)
    if deserializer._format != "safetensors":
        deserializer.close()
        raise ValueError(f"'{deserializer._file_label}' is not a safetensors file")
    return deserializer


def load_file(
    filename: Union[PathOrUri, Any], device: Union[str, int, torch.device] = "cpu"
) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file (path, URI or binary file object), by name, on ``device``."""
    with _open(filename, device, lazy=False) as d:
        return {name: _plain(d[name]) for name in d.keys()}


def _index_location(checkpoint: str) -> Optional[str]:
    """The index JSON of a sharded checkpoint: `checkpoint` itself, or the one in a local directory."""
    if checkpoint.endswith(".index.json"):
        return checkpoint
    if os.path.isdir(checkpoint):
        found = sorted(f for f in os.listdir(checkpoint) if f.endswith(".safetensors.index.json"))
        if len(found) > 1:
            raise ValueError(f"'{checkpoint}' holds several checkpoint indexes: {found}")
        if found:
            return os.path.join(checkpoint, found[0])
    return None


def load_checkpoint(checkpoint: PathOrUri, device: Union[str, int, torch.device] = "cpu") -> Dict[str, torch.Tensor]:
    """Every tensor of a Hugging Face style checkpoint, by name: a sharded one (its
    ``*.safetensors.index.json``, a path or URI, or the local directory holding it; shards are
    found beside the index), a directory with one ``*.safetensors`` file, or a single file."""
    checkpoint = os.fsdecode(checkpoint)
    index = _index_location(checkpoint)
    if index is None:
        if os.path.isdir(checkpoint):
            files = sorted(f for f in os.listdir(checkpoint) if f.endswith(".safetensors"))
            if len(files) != 1:
                raise ValueError(f"'{checkpoint}' has no index and {len(files)} .safetensors files")
            checkpoint = os.path.join(checkpoint, files[0])
        return load_file(checkpoint, device)
    import json

    with stream_io.open_stream(index, "rb") as f:
        try:
            weight_map = json.loads(f.read())["weight_map"]
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"'{index}' is not a safetensors checkpoint index ({e})") from None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise ValueError(f"'{index}': weight_map must map tensor names to shard file names")
    base = index.rsplit("/", 1)[0] if "/" in index else "."
    out: Dict[str, torch.Tensor] = {}
    for shard in dict.fromkeys(weight_map.values()):  # each shard once, in the index's order
        if "/" in shard or shard in ("", ".", ".."):
            raise ValueError(f"'{index}': shard name {shard!r} is not a file beside the index")
        tensors = load_file(f"{base}/{shard}", device)
        wanted = {name for name, s in weight_map.items() if s == shard}
        missing = wanted - tensors.keys()
        if missing:
            raise ValueError(f"'{index}': shard {shard!r} lacks {sorted(missing)[:5]}")
        out.update((name, tensors[name]) for name in wanted)
    return {name: out[name] for name in weight_map}


def load(data: bytes) -> Dict[str, torch.Tensor]:
    """Every tensor of a safetensors file held in memory, by name, on the CPU."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"data: expected bytes, got {data.__class__.__name__}")
    import io

    return load_file(io.BytesIO(bytes(data)))


class _Slice(TensorSlice):
    """What ``safe_open.get_slice`` returns: a TensorSlice whose dtype reads as safetensors names it."""

    def get_dtype(self) -> str:
        """The safetensors dtype name ("F32", "BF16", ...)."""
        return _SAFETENSORS_DTYPES[self._record.dtype.torch]


class safe_open:  # noqa: N801 (the name safetensors gives it)
    """A safetensors file opened lazily: ``keys()``, ``get_tensor``, ``get_slice``, ``metadata()``.

    Usable as a context manager, as safetensors' own. ``framework`` must be "pt" (or "torch").
    """

    def __init__(self, filename: PathOrUri, framework: str = "pt", device: Union[str, int, torch.device] = "cpu"):
        if framework not in ("pt", "torch"):
            raise ValueError(f"framework {framework!r} is not supported: tensorizer loads torch tensors ('pt')")
        self._deserializer = _open(filename, device, lazy=True)

    def keys(self) -> List[str]:
        return sorted(self._deserializer.keys())

    def offset_keys(self) -> List[str]:
        """Names in the order of their data in the file."""
        return list(self._deserializer.keys())

    def metadata(self) -> Optional[Dict[str, str]]:
        return dict(self._deserializer._file_metadata) or None

    def get_tensor(self, name: str) -> torch.Tensor:
        if name not in self._deserializer:
            raise KeyError(f"tensor {name!r} is not in the file")
        return _plain(self._deserializer[name])

    def get_slice(self, name: str) -> _Slice:
        if name not in self._deserializer:
            raise KeyError(f"tensor {name!r} is not in the file")
        return _Slice(self._deserializer, TensorPath((name,)))

    def close(self) -> None:
        self._deserializer.close()

    def __enter__(self) -> "safe_open":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _write_inputs(tensors: Dict[str, torch.Tensor]):
    """(names, dtype strings, shapes, addresses, kept tensors), checked as safetensors checks."""
    if not isinstance(tensors, dict):
        raise ValueError(f"Expected a dict of [str, torch.Tensor] but received {type(tensors)}")
    names, dtypes, shapes, addresses, kept = [], [], [], [], []
    storages: Dict[int, str] = {}
    for name, tensor in tensors.items():
        if not isinstance(name, str):
            raise ValueError(f"tensor names must be str, got {name!r}")
        if not isinstance(tensor, torch.Tensor):
            raise ValueError(f"Key `{name}` is invalid, expected torch.Tensor but received {type(tensor)}")
        if tensor.layout != torch.strided:
            raise ValueError(f"You are trying to save a sparse tensor: `{name}` which this library does not support.")
        if not tensor.is_contiguous():
            raise ValueError(
                f"You are trying to save a non contiguous tensor: `{name}` which is not allowed. It either means you"
                " are trying to save tensors which are reference of each other in which case it's recommended to save"
                " only the full tensors, and reslice at load time, or simply call `.contiguous()` on your tensor to"
                " pack it before saving."
            )
        if tensor.numel() > 0 and not tensor.is_meta:
            ptr = tensor.untyped_storage().data_ptr()
            if ptr in storages:
                raise RuntimeError(
                    f"Some tensors share memory, this will lead to duplicate memory on disk and potential differences"
                    f" when loading them again: [{storages[ptr]!r}, {name!r}]."
                )
            storages[ptr] = name
        t = tensor.detach()
        if t.device.type != "cpu":
            t = t.to("cpu")
        names.append(name)
        dtypes.append(_dtypes.dtype_string(t.dtype))
        shapes.append(list(t.shape))
        addresses.append(t.data_ptr() if t.numel() else 0)
        kept.append(t)
    return names, dtypes, shapes, addresses, kept


def _metadata_pairs(metadata: Optional[Dict[str, str]]):
    if metadata is None:
        return None
    if not isinstance(metadata, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()
    ):
        raise ValueError("metadata must be a dict of str to str")
    return list(metadata.items())


def save_file(
    tensors: Dict[str, torch.Tensor], filename: Union[PathOrUri, Any], metadata: Optional[Dict[str, str]] = None
) -> None:
    """Writes ``tensors`` as a safetensors file: a path, a URI (``s3://``) or a binary file object.
    A local file appears whole or not at all (the engine's crash-safe writes)."""
    names, dtypes, shapes, addresses, kept = _write_inputs(tensors)
    pairs = _metadata_pairs(metadata)
    target = os.fsdecode(filename) if isinstance(filename, (bytes, os.PathLike)) else filename
    options = stream_io._transport_options(connect_timeout=None, stall_timeout=None)
    _write_safetensors(target, options, names, dtypes, shapes, addresses, pairs)
    del kept  # the bytes had to live until the write returned


def save(tensors: Dict[str, torch.Tensor], metadata: Optional[Dict[str, str]] = None) -> bytes:
    """The bytes of a safetensors file holding ``tensors``."""
    import io

    buffer = io.BytesIO()
    save_file(tensors, buffer, metadata)
    return buffer.getvalue()


_SIZE_UNITS = {"TB": 10**12, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def _shard_size(size: Union[int, str]) -> int:
    if isinstance(size, int) and not isinstance(size, bool) and size > 0:
        return size
    if isinstance(size, str) and size.strip()[-2:].upper() in _SIZE_UNITS:
        try:
            return int(float(size.strip()[:-2]) * _SIZE_UNITS[size.strip()[-2:].upper()])
        except ValueError:
            pass
    raise ValueError(f"max_shard_size: expected bytes or a size like '5GB', got {size!r}")


def save_checkpoint(
    tensors: Dict[str, torch.Tensor],
    directory: PathOrUri,
    max_shard_size: Union[int, str] = "5GB",
    metadata: Optional[Dict[str, str]] = None,
) -> List[str]:
    """Writes ``tensors`` as a Hugging Face style checkpoint in ``directory`` (a local directory or a
    URI prefix such as ``s3://bucket/model``): ``model.safetensors``, or, past ``max_shard_size``,
    ``model-0000k-of-0000n.safetensors`` shards and ``model.safetensors.index.json``, with the same
    sharding, names and bytes as ``huggingface_hub.save_torch_state_dict`` (state dict order, a shard
    closed when the next tensor would overflow it, a larger tensor alone in its shard). Returns the
    names written. Earlier checkpoint files of that pattern in a local directory are removed."""
    import json
    import re

    limit = _shard_size(max_shard_size)
    names, dtypes, shapes, addresses, kept = _write_inputs(tensors)  # checks everything first
    del names, dtypes, shapes, addresses, kept
    shards: List[List[str]] = []
    current: List[str] = []
    current_size = total = 0
    for name, tensor in tensors.items():
        size = tensor.untyped_storage().nbytes()
        total += size
        if size > limit:
            shards.append([name])
            continue
        if current_size + size > limit:
            shards.append(current)
            current, current_size = [], 0
        current.append(name)
        current_size += size
    if current or not shards:
        shards.append(current)
    directory = os.fsdecode(directory)
    local = "://" not in directory
    if local:
        os.makedirs(directory, exist_ok=True)
        stale = re.compile(r"model(-\d{5}-of-\d{5})?\.safetensors(\.index\.json)?")
        for existing in os.listdir(directory):
            if stale.fullmatch(existing):
                os.remove(os.path.join(directory, existing))
    files = (
        ["model.safetensors"]
        if len(shards) == 1
        else [f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors" for k in range(len(shards))]
    )
    per_file = {"format": "pt", **(metadata or {})} if len(shards) == 1 else {"format": "pt"}
    for file, shard in zip(files, shards):
        save_file({name: tensors[name] for name in shard}, f"{directory}/{file}", metadata=per_file)
    if len(shards) == 1:
        return files
    index = {
        "metadata": {"total_size": total, **(metadata or {})},
        "weight_map": {name: file for file, shard in zip(files, shards) for name in shard},
    }
    index_name = "model.safetensors.index.json"
    with stream_io.open_stream(f"{directory}/{index_name}", "wb") as f:
        f.write(json.dumps(index, indent=2).encode())
    return [*files, index_name]
