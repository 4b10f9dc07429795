"""``python -m tensorizer ...``: the ``tensorizer`` command installed with this package, plus
``convert`` from a ``torch.save`` checkpoint (``.pt``, ``.pth``, ``.bin``: a dict of tensors) or a
sharded Hugging Face checkpoint (its directory or ``*.safetensors.index.json``), and ``convert``
of any source (those, ``.tensors``, ``.safetensors``) into a sharded checkpoint (a DST ending in
``/``, or an existing directory; ``--shard-size``, default 5GB), which need torch and so live here
rather than in the C++ command:

    python -m tensorizer convert pytorch_model.bin model.safetensors
    python -m tensorizer convert checkpoint-dir/ model.tensors
    python -m tensorizer convert model.tensors checkpoint-dir/ --shard-size 2GB

and ``cooperative-load``, which every rank of a ``torchrun`` job runs: the ranks load one file
together (tensorizer.distributed.cooperative_load), each reading 1/N of it, and each prints what it
got, what it read and how long it took:

    torchrun --nproc-per-node 4 -m tensorizer cooperative-load s3://bucket/model.tensors --shard-dim 0
"""

import argparse
import os
import shutil
import subprocess
import sys
from typing import Dict, List

TORCH_SUFFIXES = (".pt", ".pth", ".bin")


def _is_checkpoint(path: str) -> bool:
    """A sharded Hugging Face checkpoint: its index JSON, or a directory of safetensors files."""
    return path.endswith(".index.json") or os.path.isdir(path)


def _state_dict(path: str) -> Dict[str, "torch.Tensor"]:  # noqa: F821
    import torch

    if _is_checkpoint(path):
        from .safetensors import load_checkpoint

        return load_checkpoint(path)
    if not path.endswith(TORCH_SUFFIXES):  # a .tensors or safetensors file: names flattened
        from .serialization import TensorDeserializer

        with TensorDeserializer(path, device="cpu") as d:
            return {".".join(map(str, p)): d._bulk_load([p], None)[p].data for p in d._records}

    sd = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    if isinstance(sd, dict) and "state_dict" in sd and isinstance(sd["state_dict"], dict):
        sd = sd["state_dict"]
    if not isinstance(sd, dict) or not all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in sd.items()):
        raise SystemExit(f"tensorizer: '{path}' does not hold a dict of tensors by name")
    return sd


def convert_torch(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m tensorizer convert")
    ap.add_argument("SRC")
    ap.add_argument("DST")
    ap.add_argument("--to", choices=("tensors", "safetensors", "checkpoint"))
    ap.add_argument("--shard-size", default="5GB", help="largest shard of a checkpoint (bytes or e.g. 2GB)")
    ap.add_argument("--quiet", "-q", action="store_true")
    args = ap.parse_args(argv)
    to = args.to or (
        "checkpoint"
        if args.DST.endswith("/") or os.path.isdir(args.DST)
        else "safetensors"
        if args.DST.endswith(".safetensors")
        else "tensors"
    )
    sd = _state_dict(args.SRC)
    if to in ("safetensors", "checkpoint"):
        from .safetensors import save_checkpoint, save_file

        seen = set()  # tied weights share storage, which safetensors files cannot: store copies
        flat = {}
        for name, t in sd.items():
            ptr = t.untyped_storage().data_ptr() if t.numel() else None
            flat[name] = t.contiguous().clone() if ptr in seen or not t.is_contiguous() else t
            seen.add(ptr)
        if to == "checkpoint":
            save_checkpoint(flat, args.DST.rstrip("/") or "/", max_shard_size=args.shard_size)
        else:
            save_file(flat, args.DST)
    else:
        from .serialization import TensorSerializer

        serializer = TensorSerializer(args.DST)
        serializer.write_state_dict(sd)
        serializer.close()
    if not args.quiet:
        print(f"wrote {args.DST}: {len(sd)} tensors, {to}", file=sys.stderr)
    return 0


def cooperative_load_command(argv: List[str]) -> int:
    ap = argparse.ArgumentParser(prog="torchrun ... -m tensorizer cooperative-load")
    ap.add_argument("SRC", help="a path or URI every rank reads a share of")
    ap.add_argument("--shard-dim", type=int, help="keep only this rank's block of this dimension")
    ap.add_argument("--backend", default="gloo", help="torch.distributed backend (nccl with --device cuda)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args(argv)
    import time

    import torch.distributed as dist

    from .distributed import cooperative_load, shard_plan

    dist.init_process_group(args.backend)  # rank, world size and rendezvous from torchrun
    try:
        rank, world = dist.get_rank(), dist.get_world_size()
        plan = shard_plan(rank, world, dim=args.shard_dim) if args.shard_dim is not None else None
        dist.barrier()
        start = time.perf_counter()
        state = cooperative_load(args.SRC, slice_plan=plan, device=args.device)
        seconds = time.perf_counter() - start
        held = sum(t.numel() * t.element_size() for t in state.values())
        # One write per line (print() writes the text and the newline apart when stdout is
        # unbuffered, as under torchrun), so the ranks' lines never interleave in a shared pipe.
        sys.stdout.write(
            f"rank {rank}/{world}: {len(state)} tensors, {held / 1e9:.3f} GB held,"
            f" {state.bytes_read / 1e9:.3f} GB read from the source, {seconds:.2f} s\n"
        )
        sys.stdout.flush()
    finally:
        dist.destroy_process_group()
    return 0


def _needs_python(args: List[str]) -> bool:
    """Whether a convert reads or writes a sharded checkpoint (the C++ command does neither)."""
    dst = args[1] if len(args) > 1 else ""
    return _is_checkpoint(args[0]) or dst.endswith("/") or os.path.isdir(dst) or "checkpoint" in args


def main(argv: List[str]) -> int:
    if argv and argv[0] == "cooperative-load":
        return cooperative_load_command(argv[1:])
    if len(argv) >= 3 and argv[0] == "convert" and (argv[1].endswith(TORCH_SUFFIXES) or _needs_python(argv[1:])):
        return convert_torch(argv[1:])
    here = os.path.join(os.path.dirname(sys.executable), "tensorizer")
    command = here if os.path.exists(here) else shutil.which("tensorizer")
    if command is None:
        raise SystemExit("tensorizer: the tensorizer command is not installed beside this Python")
    return subprocess.call([command, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
