"""One benchmark task in a fresh process (so its memory is this task's alone), printed as one JSON line.

Run by bench.py with the interpreter of the system under test (the reference tensorizer runs from its
own venv with this same file). A load task runs a warm-up, then --reps timed repetitions, each:
  load -> checksum (first touch of every byte; with --touch pages one byte per 4 KiB page, then the
checksum untimed) -> checksum again (resident touch cost) -> free,
with the peak RSS (VmHWM, reset first) of the first load over the RSS before it as the load's memory.
A save task generates the test set once, then per repetition unlinks the previous file, syncs (untimed,
so no earlier dirty pages are being written back) and times the save until it returns (no fsync).
"""

import argparse
import gc
import importlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testset
import torch


# ---- loaders: path -> (owner kept alive while the tensors are used, list of tensors or arrays) ----
def load_tensorizer(path):
    from tensorizer import TensorDeserializer

    d = TensorDeserializer(path, device="cpu")
    return d, list(d.values())


def load_tensorizer_lazy(path):
    """lazy_load=True: the index at open, each tensor read when first accessed (here: all, in order)."""
    from tensorizer import TensorDeserializer

    d = TensorDeserializer(path, device="cpu", lazy_load=True)
    return d, list(d.values())


def load_tensorizer_cache_miss(path):
    """Ours through the local cache with an empty cache: the object is fetched into a new cache
    directory under $BENCH_CACHE_ROOT (removed when the process ends), then loaded from it."""
    import atexit
    import shutil
    import tempfile

    from tensorizer import TensorDeserializer

    cache = tempfile.mkdtemp(dir=os.environ["BENCH_CACHE_ROOT"])
    atexit.register(shutil.rmtree, cache, True)
    d = TensorDeserializer(path, device="cpu", cache_dir=cache)
    return d, list(d.values())


def load_tensorizer_mmap(path):
    """Ours with mmap=True: large tensors mapped copy-on-write from the page cache (no copy)."""
    from tensorizer import TensorDeserializer

    d = TensorDeserializer(path, device="cpu", mmap=True)
    return d, list(d.values())


def load_tensorizer_safetensors(path):
    """Ours reading a safetensors file (tensorizer.safetensors.load_file, defaults)."""
    from tensorizer.safetensors import load_file

    return None, list(load_file(path).values())


def load_safetensors(path):
    from safetensors.torch import load_file

    return None, list(load_file(path, device="cpu").values())


def load_torch(path):
    return None, list(torch.load(path, map_location="cpu", weights_only=True).values())


def load_torch_mmap(path):
    return None, list(torch.load(path, map_location="cpu", weights_only=True, mmap=True).values())


def load_runai(path):
    from runai_model_streamer import SafetensorsStreamer

    with SafetensorsStreamer() as s:
        s.stream_file(path)  # owned=True (default): the yielded tensors stay valid after the session
        tensors = [t for _, t in s.get_tensors()]
    return None, tensors


def read_into(path, buf):
    """read() the whole file into buf (one call per at most 2 GiB, the kernel's cap per read)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        mv, off = memoryview(buf), 0
        while off < len(mv):
            n = os.readv(fd, [mv[off:]])
            if n <= 0:
                raise OSError(f"{path}: short read at byte {off}")
            off += n
    finally:
        os.close(fd)
    return None, [buf]


def load_read_fresh(path):
    return read_into(path, np.empty(os.path.getsize(path), np.uint8))


_pretouched = {}


def load_read_pretouched(path):
    if path not in _pretouched:  # allocated and written once, before the timed repetitions
        _pretouched[path] = np.ones(os.path.getsize(path), np.uint8)
    return read_into(path, _pretouched[path])


def load_cat(path):
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)
    return None, []


def load_dd_direct(path):
    """The disk's own pace: dd with O_DIRECT and 16 MiB reads into one reused buffer."""
    subprocess.run(["dd", f"if={path}", "of=/dev/null", "bs=16M", "iflag=direct", "status=none"], check=True)
    return None, []


def load_curl(url):
    """Raw HTTP client: curl into /dev/null (for S3, url is a presigned GET URL)."""
    subprocess.run(["curl", "-s", "-f", "-o", "/dev/null", url], check=True)
    return None, []


class _Unlinked:
    """Owner of a file the bytes were kept in: removes it when the load's result is dropped."""

    def __init__(self, path):
        self.path = path

    def __del__(self):
        os.unlink(self.path)


def load_curl_kept(url):
    """Raw HTTP client that keeps the bytes in memory, as a load must: curl into a file on tmpfs
    (/dev/shm), so the time includes the fresh pages the object lands in, which /dev/null skips."""
    fd, path = tempfile.mkstemp(prefix="bench-curl-", dir="/dev/shm")
    os.close(fd)
    owner = _Unlinked(path)
    code = subprocess.run(["curl", "-s", "-f", "-o", path, url]).returncode
    if code != 0:
        free = shutil.disk_usage("/dev/shm").free
        raise RuntimeError(f"curl into {path} failed (exit {code}; /dev/shm has {free / 1e9:.2f} GB free)")
    return owner, []


def load_redis_get(url):
    """Raw Redis client: GET of every key under redis://host:port/prefix, in file order, into bytes."""
    import redis

    host_port, _, prefix = url[len("redis://") :].partition("/")
    host, _, port = host_port.partition(":")
    r = redis.Redis(host=host, port=int(port or 6379))
    keys = sorted(r.scan_iter(match=prefix + ":*", count=10000), key=lambda k: int(k.rsplit(b":", 1)[1]))
    values = [r.get(k) for k in keys]
    r.close()
    return None, [v for v in values if v]


LOADERS = {
    "tensorizer": load_tensorizer,
    "tensorizer_mmap": load_tensorizer_mmap,
    "tensorizer_lazy": load_tensorizer_lazy,
    "tensorizer_cache_miss": load_tensorizer_cache_miss,
    "tensorizer_safetensors": load_tensorizer_safetensors,
    "safetensors": load_safetensors,
    "torch": load_torch,
    "torch_mmap": load_torch_mmap,
    "runai": load_runai,
    "read_fresh": load_read_fresh,
    "read_pretouched": load_read_pretouched,
    "cat": load_cat,
    "dd_direct": load_dd_direct,
    "curl": load_curl,
    "curl_kept": load_curl_kept,
    "redis_get": load_redis_get,
}


# ---- savers: (state dict, path) -> None ----
def save_tensorizer(sd, path):
    from tensorizer import TensorSerializer

    s = TensorSerializer(path)
    s.write_state_dict(sd)
    s.close()


def save_safetensors(sd, path):
    from safetensors.torch import save_file

    save_file(sd, path)


def save_torch(sd, path):
    torch.save(sd, path)


SAVERS = {"tensorizer": save_tensorizer, "safetensors": save_safetensors, "torch": save_torch}


def rss_bytes(kind="VmRSS"):
    """Resident bytes now: VmRSS (all), RssAnon (private memory) or RssFile (mapped file pages)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(kind + ":"):
                return int(line.split()[1]) * 1024
    return 0


def reset_hwm():
    """Resets this process's peak RSS (VmHWM) to its current RSS; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def versions(task):
    mod = {
        "tensorizer": "tensorizer",
        "tensorizer_mmap": "tensorizer",
        "tensorizer_lazy": "tensorizer",
        "tensorizer_cache_miss": "tensorizer",
        "tensorizer_safetensors": "tensorizer",
        "safetensors": "safetensors",
        "runai": "runai_model_streamer",
    }.get(task)
    out = {"python": sys.version.split()[0], "torch": torch.__version__, "executable": sys.executable}
    # The modules each timed load imports, imported here before the clock starts, so no row's load
    # includes an import (safetensors' load_file lives in safetensors.torch, ~0.6 ms to import).
    # How long that took (after torch, which every row imports first) is reported as import_s.
    t0 = time.perf_counter()
    for used in {"safetensors": ["safetensors.torch"], "tensorizer_safetensors": ["tensorizer.safetensors"]}.get(
        task, []
    ):
        importlib.import_module(used)
    if mod:
        m = __import__(mod)
    out["import_s"] = time.perf_counter() - t0
    if mod:
        out["module_file"] = m.__file__
        try:
            import importlib.metadata as md

            out["version"] = md.version(mod.replace("_", "-"))
        except Exception:
            out["version"] = getattr(m, "__version__", "?")
    return out


def run_load(args):
    fn = LOADERS[args.task]
    times, touch1, touch2, checks = [], [], [], set()
    anon, mapped = 0, 0  # private / file-backed memory held by the first loaded result (after its touch)
    anon0, file0 = rss_bytes("RssAnon"), rss_bytes("RssFile")
    peak = 0  # resident memory the first load added at its high point (VmHWM - VmRSS before it)
    for rep in range(args.warmup + args.reps):
        if rep == 0:
            reset_peak, before = reset_hwm(), rss_bytes()
        t0 = time.perf_counter()
        owner, tensors = fn(args.file)
        t1 = time.perf_counter()
        if args.touch == "pages":  # one byte per page is the first touch; the checksum comes after, untimed
            testset.touch_pages(tensors)
            t2 = time.perf_counter()
            c = testset.checksum(tensors)
        else:
            c = testset.checksum(tensors)
            t2 = time.perf_counter()
        testset.checksum(tensors)
        t3 = time.perf_counter()
        if rep >= args.warmup:
            times.append(t1 - t0)
            touch1.append(t2 - t1)
            touch2.append(t3 - t2)
        checks.add(c)
        if rep == 0:  # the first load of a fresh process: later ones reuse freed heap
            peak = rss_bytes("VmHWM") - before if reset_peak else 0
            anon, mapped = rss_bytes("RssAnon") - anon0, rss_bytes("RssFile") - file0
        nbytes = testset.tensor_bytes(tensors) if tensors else (args.bytes or os.path.getsize(args.file))
        del owner, tensors
        gc.collect()
    return {
        "load": times,
        "touch": touch1,
        "touch_resident": touch2,
        "bytes": nbytes,
        "checksums": sorted(checks),
        "anon_held": anon,
        "file_mapped": mapped,
        "load_peak": peak or None,
    }


def run_save(args):
    sd = testset.make_state_dict(args.size_bytes, args.seed)
    base = rss_bytes()  # the saver's own memory is what comes on top of the state dict
    fn = SAVERS[args.task]
    times = []
    for rep in range(args.warmup + args.reps):
        if os.path.exists(args.file):
            os.unlink(args.file)  # drops its dirty pages: nothing left for writeback to do
        os.sync()
        t0 = time.perf_counter()
        fn(sd, args.file)
        t1 = time.perf_counter()
        if rep >= args.warmup:
            times.append(t1 - t0)
    return {
        "save": times,
        "bytes": testset.tensor_bytes(sd.values()),
        "rss_base": base,
        "file_bytes": os.path.getsize(args.file),
        "checksums": [testset.checksum(sd.values())],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["load", "save"], required=True)
    ap.add_argument("--task", required=True)
    ap.add_argument("--file", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--size-bytes", type=int, default=0)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--touch", choices=["bytes", "pages"], default="bytes", help="what the timed first touch reads")
    ap.add_argument("--bytes", type=int, default=0, help="bytes moved, for loaders that keep nothing")
    args = ap.parse_args()
    info = versions(args.task)
    base = rss_bytes()
    res = run_load(args) if args.mode == "load" else run_save(args)
    ru = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    res.update(info, peak_rss=ru)
    res.setdefault("rss_base", base)
    # The tool's peak is not measurable here (its ru_maxrss counts the forked Python it started as),
    # and not the point of the row.
    if args.task in ("cat", "curl", "curl_kept", "dd_direct"):
        res.update(rss_base=0, peak_rss=None)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
