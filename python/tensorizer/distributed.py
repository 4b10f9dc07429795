"""Tensor-parallel loads: slice plans for one rank of N, and cooperative loads of one file by every
rank of a torch.distributed process group (an extension of the reference API).

Everything between ranks goes through torch.distributed (gloo on CPU, NCCL for CUDA tensors); this
module writes no networking of its own. A cooperative load cuts the file's tensors, in file order,
into one contiguous share per rank of about equal bytes; each rank reads only its share through
the engine (any source: local file, HTTP(S), S3, Redis) into one flat buffer, the ranks agree that
every share was read (a rank whose read failed makes every rank raise, naming it), and then each
share is broadcast from its reader. Each rank keeps what its slice plan selects of every tensor
(whole tensors without a plan); with a plan, only one share's buffer is held at a time.

Models saved already split use one file per rank, as vLLM writes and reads them:
``save_per_rank("model-rank-%03d.tensors", shards)`` and ``rank_file(template, rank)``.

    torchrun --nproc-per-node 4 my_server.py      # in each rank:
    dist.init_process_group("gloo")
    state = cooperative_load("s3://bucket/model.tensors",
                             slice_plan=shard_plan(dist.get_rank(), dist.get_world_size(), dim=0))
"""

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch

from ._deserializer import SlicePlan, TensorDeserializer
from ._tensor_path import TensorPath

_ALIGN = 64  # each tensor starts at this multiple in a share's buffer (so dtype views line up)


def split_bounds(n: int, parts: int, part: int) -> Tuple[int, int]:
    """[start, stop) of part `part` when `n` items are cut into `parts` (``torch.tensor_split``'s
    rule: the first ``n % parts`` parts get one item more)."""
    if not 0 <= part < parts:
        raise ValueError(f"part {part} is not in [0, {parts})")
    base, extra = divmod(n, parts)
    start = part * base + min(part, extra)
    return start, start + base + (part < extra)


def shard_plan(
    rank: int, world_size: int, dim: int = 0, select: Optional[Callable[[Any], bool]] = None
) -> Callable[[Any, List[int]], Any]:
    """A slice plan (``TensorDeserializer(slice_plan=...)``) giving rank `rank` of `world_size` its
    block of dimension `dim` (negative counts from the end) of every tensor that has that dimension
    and that `select(name)` accepts (default: every tensor with at least two dimensions, so biases
    and norms stay whole). ``dim=0``: row-parallel blocks (one contiguous read each);
    ``dim=-1``: column blocks (strided reads). Uneven sizes split as ``torch.tensor_split`` does."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is not in [0, {world_size})")

    def plan(name: Any, shape: List[int]) -> Any:
        chosen = select(name) if select is not None else len(shape) >= 2
        if not chosen or not -len(shape) <= dim < len(shape):
            return None
        d = dim % len(shape)
        start, stop = split_bounds(shape[d], world_size, rank)
        return (slice(None),) * d + (slice(start, stop),)

    return plan


def shares_of(sizes: Sequence[int], world_size: int) -> List[Tuple[int, int]]:
    """Contiguous [first, last) ranges of items, one per rank, of about equal total size (each
    rank's share ends at the first item boundary past its fair cut)."""
    total = sum(sizes)
    out, start, acc = [], 0, 0
    for r in range(world_size):
        stop = start
        cut = total * (r + 1) / world_size
        while stop < len(sizes) and (acc + sizes[stop] / 2 <= cut or r == world_size - 1):
            acc += sizes[stop]
            stop += 1
        out.append((start, stop))
        start = stop
    return out


def rank_file(template: str, rank: int) -> str:
    """The file of rank `rank` named by a vLLM-style template (``"model-rank-%03d.tensors"``, a
    path or a URI): the template with its one integer placeholder filled, as vLLM does with
    ``tensorizer_uri % rank``."""
    if not isinstance(template, str):
        raise TypeError(f"template: expected str, got {template.__class__.__name__}")
    try:
        name = template % rank
    except TypeError as e:
        raise ValueError(f"{template!r} has no single integer placeholder (such as %03d) for the rank") from e
    if name == template % (rank + 1):
        raise ValueError(f"{template!r} does not name a different file per rank")
    return name


def save_per_rank(template: str, shards: Sequence[Any], **serializer_args: Any) -> List[str]:
    """Writes one file per rank, ``rank_file(template, r)`` holding ``shards[r]`` (a state dict or
    a module, as ``TensorSerializer`` takes them), the layout vLLM loads tensor-parallel models
    from; returns the names written. In a distributed job, each rank can instead write its own:
    ``save_per_rank(template, {rank: my_shard})``."""
    from ._serializer import TensorSerializer

    items = shards.items() if isinstance(shards, dict) else enumerate(shards)
    written = []
    for rank, shard in items:
        if isinstance(rank, bool) or not isinstance(rank, int):
            raise TypeError(f"shards: expected a sequence or a mapping of rank (int) to shard, got key {rank!r}")
        name = rank_file(template, rank)
        with TensorSerializer(name, **serializer_args) as serializer:
            if isinstance(shard, torch.nn.Module):
                serializer.write_module(shard)
            else:
                serializer.write_state_dict(shard)
        written.append(name)
    return written


class CooperativeLoad(dict):
    """The tensors a cooperative load gave this rank (name -> tensor), plus what it cost:
    ``bytes_read`` (bytes this rank took from the source) and ``share`` (the names it read)."""

    bytes_read: int = 0
    share: List[Any] = []


def _layout(records: Sequence[Tuple[Any, Any]]) -> Tuple[List[int], int]:
    """Offsets of each (path, record) in a share's buffer, and the buffer's size."""
    offsets, size = [], 0
    for _, record in records:
        offsets.append(size)
        size += -(-record.expected_bytes // _ALIGN) * _ALIGN
    return offsets, size


def cooperative_load(
    file: Any,
    *,
    group: Any = None,
    device: Any = "cpu",
    slice_plan: Optional[SlicePlan] = None,
    filter_func: Optional[Callable[[Any], Any]] = None,
    **deserializer_args: Any,
) -> CooperativeLoad:
    """Loads `file` (anything ``TensorDeserializer`` opens) once across the ranks of `group` (the
    default process group when None): each rank reads a distinct 1/N of the tensor bytes and the
    shares are broadcast on the group's backend, so every rank gets the tensors its `slice_plan`
    selects (whole tensors without one), on `device`. Every rank must call it with the same file
    and filter. Raises RuntimeError on every rank when any rank's read failed; a rank that dies
    makes the others' collectives fail after the group's timeout."""
    import torch.distributed as dist

    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = torch.device(device)
    d, failure = None, ""
    try:  # the open and this rank's share; every rank must learn of a failure before broadcasting
        d = TensorDeserializer(
            file, device=device, lazy_load=True, mmap=False, filter_func=filter_func, **deserializer_args
        )
        records = list(d._records.items())
        bounds = shares_of([r.expected_bytes for _, r in records], world)
        mine = records[bounds[rank][0] : bounds[rank][1]]
        offsets, size = _layout(mine)
        flat = torch.empty(size, dtype=torch.uint8, device=device)
        d._bulk_load([p for p, _ in mine], None, into=_views(flat, mine, offsets))
    except Exception as e:
        failure = f"{type(e).__name__}: {e}"
    try:
        _agree(failure, rank, world, group, device, dist)
        plan_of = _plan_lookup(slice_plan)
        result = CooperativeLoad()
        result.bytes_read = d._reader.bytes_read
        result.share = [p.normalize_() for p, _ in mine]
        for r, (first, last) in enumerate(bounds):
            share = records[first:last]
            offsets, size = _layout(share)
            buffer = flat if r == rank else torch.empty(size, dtype=torch.uint8, device=device)
            if size:
                dist.broadcast(buffer, src=r if group is None else dist.get_global_rank(group, r), group=group)
            for (path, record), view in zip(share, _views(buffer, share, offsets).values()):
                name = path.normalize_()
                index = plan_of(name, list(record.entry.shape))
                result[name] = d._placed(view if index is None else view[index].clone())
        return result
    finally:
        if d is not None:
            d.close()


def _plan_lookup(plan: Optional[SlicePlan]) -> Callable[[Any, List[int]], Any]:
    if plan is None:
        return lambda name, shape: None
    if callable(plan):
        return plan
    return lambda name, shape: plan.get(name)


def _views(flat: torch.Tensor, share: Sequence[Tuple[Any, Any]], offsets: List[int]) -> Dict[TensorPath, torch.Tensor]:
    """Each tensor of `share` as a view of its bytes in `flat`."""
    out = {}
    for (path, record), offset in zip(share, offsets):
        dtype = record.dtype.torch
        if dtype is None:
            raise ValueError(
                f"tensor {path.normalize_()!r} has dtype {record.entry.dtype!r}, which names no torch dtype"
            )
        out[path] = flat[offset : offset + record.expected_bytes].view(dtype).view(list(record.entry.shape))
    return out


def _agree(failure: str, rank: int, world: int, group: Any, device: torch.device, dist: Any) -> None:
    """Raises on every rank when any rank's read failed, naming the ranks (one all_reduce)."""
    failed = torch.zeros(world, dtype=torch.int32, device=device)
    failed[rank] = 1 if failure else 0
    dist.all_reduce(failed, group=group)
    bad = [r for r in range(world) if failed[r]]
    if bad:
        own = f": {failure}" if failure else ""
        raise RuntimeError(f"cooperative load failed: rank(s) {bad} could not read their share{own}")
