"""GPU section of the benchmark: a file to CUDA tensors, one fresh process per load (runs only where
torch sees a CUDA device; bench.py calls it, or run it alone over the files of an earlier `make bench`):

  .venv-bench/bin/python bench/gpu.py --ref-python .venv-ref/bin/python [--rounds 3]

Rows, each with the page cache warm (cat first) and dropped (fsync + POSIX_FADV_DONTNEED):
  ours (device="cuda")                    TensorDeserializer(path, device="cuda"): the engine's pinned staging ring
  reference plaid_mode                    the reference tensorizer, device="cuda", plaid_mode=True
  safetensors load_file(device="cuda:0")
  runai-model-streamer -> cuda            its SafetensorsStreamer, each tensor .to("cuda")
  fastsafetensors                         SafeTensorsFileLoader + copy_files_to_device (when installed)
  ours, HTTP loopback                     the same file through nginx (only under scripts/with-servers.sh)
and two baselines measured in the same run: pinned host-to-device bandwidth (cudaMemcpyAsync from a
page-locked buffer, via torch) and the parallel read bandwidth of the file (16 threads of 16 MiB preads).

Each child creates its CUDA context first (untimed: every loader pays it alike), then times one load
until torch.cuda.synchronize(). Its peak host RSS (VmHWM) is taken before the data is checked; the check
copies every tensor back, untimed, and compares testset.checksum with the CPU checksum of the saved set.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import coldstart  # noqa: E402 (bench/ is put on the path first)

# (label, system, task, file key)
ROWS = [
    ("ours (device=cuda)", "ours", "ours", "ours"),
    ("ours, reference-written file", "ours", "ours", "ref"),
    ("reference plaid_mode", "ref", "ref_plaid", "ref"),
    ("safetensors load_file(device=cuda)", "peer", "safetensors", "safetensors"),
    ("runai-model-streamer -> cuda", "peer", "runai", "safetensors"),
    ("fastsafetensors", "peer", "fastsafetensors", "safetensors"),
    ("ours, HTTP loopback (nginx)", "ours", "ours_http", "ours"),
    ("pinned host-to-device copy", "baseline", "h2d", "ours"),
    ("parallel file read, 16 threads", "baseline", "pread", "ours"),
]
STATES = ("warm", "cold")


# ---- child side: one load in this process ---------------------------------------------------


def _load_ours(path):
    from tensorizer import TensorDeserializer

    d = TensorDeserializer(path, device="cuda")
    return d, list(d.values())


def _load_ours_http(path):
    url = os.environ["TZ_TEST_HTTP_URL"] + "/gpu-bench.tensors"
    return _load_ours(url)


def _load_ref_plaid(path):
    from tensorizer import TensorDeserializer

    d = TensorDeserializer(path, device="cuda", plaid_mode=True)
    return d, list(d.values())


def _load_safetensors(path):
    from safetensors.torch import load_file

    sd = load_file(path, device="cuda:0")
    return sd, list(sd.values())


def _load_runai(path):
    from runai_model_streamer import SafetensorsStreamer

    out = {}
    with SafetensorsStreamer() as s:
        s.stream_file(path)
        for name, t in s.get_tensors():
            out[name] = t.to("cuda", non_blocking=True)
    return out, list(out.values())


def _load_fastsafetensors(path):
    from fastsafetensors import SafeTensorsFileLoader, SingleGroup

    loader = SafeTensorsFileLoader(SingleGroup(), "cuda:0")
    loader.add_filenames({0: [path]})
    fb = loader.copy_files_to_device()
    out = {k: fb.get_tensor(k) for k in fb.key_to_rank_lidx}
    return (loader, fb, out), list(out.values())


def _h2d(path):
    """Pinned host-to-device bandwidth for as many bytes as the file holds (in 1 GiB pieces)."""
    import torch

    size = os.path.getsize(path)
    piece = min(size, 1 << 30)
    src = torch.empty(piece, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(piece, dtype=torch.uint8, device="cuda")
    dst.copy_(src, non_blocking=True)  # warm the path once
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    done = 0
    while done < size:
        n = min(piece, size - done)
        dst[:n].copy_(src[:n], non_blocking=True)
        done += n
    torch.cuda.synchronize()
    return time.perf_counter() - t0, size


def _pread(path, threads=16, piece=16 << 20):
    """Reads the whole file with `threads` threads of `piece`-byte preads into reused buffers."""
    size = os.path.getsize(path)
    fd = os.open(path, os.O_RDONLY)
    offsets = list(range(0, size, piece))
    lock = threading.Lock()

    def worker():
        buf = bytearray(piece)
        view = memoryview(buf)
        while True:
            with lock:
                if not offsets:
                    return
                off = offsets.pop(0)
            os.preadv(fd, [view[: min(piece, size - off)]], off)

    t0 = time.perf_counter()
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    os.close(fd)
    return time.perf_counter() - t0, size


LOADERS = {
    "ours": _load_ours,
    "ours_http": _load_ours_http,
    "ref_plaid": _load_ref_plaid,
    "safetensors": _load_safetensors,
    "runai": _load_runai,
    "fastsafetensors": _load_fastsafetensors,
}


def _rss(kind):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(kind + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(task, path):
    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")  # the CUDA context: untimed, the same for every loader
    torch.cuda.synchronize()
    if task in ("h2d", "pread"):
        seconds, nbytes = (_h2d if task == "h2d" else _pread)(path)
        return {"seconds": seconds, "bytes": nbytes, "peak_rss": _rss("VmHWM")}
    import testset

    base = _rss("VmRSS")
    t0 = time.perf_counter()
    owner, tensors = LOADERS[task](path)
    torch.cuda.synchronize()
    seconds = time.perf_counter() - t0
    peak = _rss("VmHWM")
    assert all(t.device.type == "cuda" for t in tensors), "a tensor is not on the GPU"
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    checksum = testset.checksum([t.cpu() for t in tensors])  # untimed: bit-exact check against the save
    del owner, tensors
    return {"seconds": seconds, "bytes": nbytes, "peak_rss": peak, "rss_before": base, "checksum": checksum}


# ---- parent side ---------------------------------------------------------------------------------


def available(python=sys.executable):
    p = subprocess.run([python, "-c", "import torch; print(torch.cuda.is_available())"], capture_output=True, text=True)
    return p.stdout.strip() == "True"


def _run_child(python, task, path):
    env = dict(os.environ, RUNAI_STREAMER_LOG_LEVEL="WARNING")
    p = subprocess.run([python, __file__, "--child", task, "--file", path], capture_output=True, text=True, env=env)
    if p.returncode != 0 or not p.stdout.strip():
        tail = (p.stderr or p.stdout).strip().splitlines()[-2:]
        return {"error": f"exit {p.returncode}: " + " | ".join(tail)}
    return json.loads(p.stdout.strip().splitlines()[-1])


def run(paths, python_for, expected=(), rounds=3):
    """One dict per (row, state): label, state, times, bytes, peak RSS, errors."""
    rows = [r for r in ROWS if os.path.exists(paths[r[3]])]
    if "TZ_TEST_HTTP_ROOT" in os.environ:
        link = os.path.join(os.environ["TZ_TEST_HTTP_ROOT"], "gpu-bench.tensors")
        if not os.path.exists(link):
            os.symlink(os.path.abspath(paths["ours"]), link)
    else:
        rows = [r for r in rows if r[2] != "ours_http"]
    results = {
        (r[0], s): {"label": r[0], "state": s, "times": [], "errors": [], "peaks": []} for r in rows for s in STATES
    }
    files = sorted({paths[r[3]] for r in rows})
    for rnd in range(rounds):
        order = rows if rnd % 2 == 0 else rows[::-1]
        for state in STATES:
            for label, system, task, key in order:
                if state == "cold":
                    for f in files:
                        coldstart.drop(f)
                else:
                    coldstart.warm(paths[key])
                print(f"  gpu round {rnd + 1}/{rounds} {state:4} {label} ...", flush=True)
                res = _run_child(python_for(system), task, paths[key])
                out = results[(label, state)]
                if "error" in res:
                    out["errors"].append(res["error"])
                    continue
                if expected and "checksum" in res and res["checksum"] not in expected:
                    out["errors"].append(f"wrong data: checksum {res['checksum']} not in {sorted(expected)}")
                    continue
                out["times"].append(res["seconds"])
                out["bytes"] = res["bytes"]
                out["peaks"].append(res["peak_rss"])
    return list(results.values())


def table(rows):
    """A markdown table: GB/s median (min-max), ratio to the pinned copy and to the file read, peak RSS."""

    def rate(r):
        return [r["bytes"] / t / 1e9 for t in r["times"]] if r["times"] else []

    base = {}
    for r in rows:
        if r["label"].startswith(("pinned", "parallel file read")) and rate(r):
            base.setdefault(r["state"], {})[r["label"].split()[0]] = statistics.median(rate(r))
    lines = [
        "| GPU load, fresh process | page cache | GB/s median (min-max) "
        "| vs pinned H2D | vs file read | peak host RSS |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        g = rate(r)
        if not g:
            lines.append(f"| {r['label']} | {r['state']} | {'; '.join(r['errors'])[:120] or 'n/a'} | | | |")
            continue
        med = statistics.median(g)
        b = base.get(r["state"], {})
        h2d = f"{med / b['pinned']:.2f}x" if b.get("pinned") else ""
        rd = f"{med / b['parallel']:.2f}x" if b.get("parallel") else ""
        peak = f"{max(r['peaks']) / 2**30:.2f} GiB" if r["peaks"] else ""
        lines.append(f"| {r['label']} | {r['state']} | {med:.2f} ({min(g):.2f}-{max(g):.2f}) | {h2d} | {rd} | {peak} |")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--file", help=argparse.SUPPRESS)
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--ref-python", default=os.path.join(HERE, "..", ".venv-ref", "bin", "python"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args.file)))
        return
    if not available():
        print("gpu: torch sees no CUDA device; nothing to run")
        return
    from bench import FILES

    paths = {k: os.path.join(args.data_dir, v) for k, v in FILES.items()}
    rows = run(paths, lambda system: args.ref_python if system == "ref" else sys.executable, rounds=args.rounds)
    print(table(rows))


if __name__ == "__main__":
    main()
