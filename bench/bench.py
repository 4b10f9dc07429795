"""Benchmark driver (`make bench` runs it through bench/run.sh): ours against the peers, same files, same run.

Each system saves the same generated state dict (timed; the last save leaves the file the loads use).
The headline is bench/coldstart.py: each loader in a fresh process, one load with default options and
the first touch of every page, page cache warm and dropped, rounds alternating. Then, secondary, each
loader repeats loads inside one process after a warm-up (bench/child.py), then the optional network
section. Prints a table and writes bench/results/<date>-<host>.{md,json,png}.
Rates are decimal GB/s (1e9 bytes) of tensor bytes (file bytes for the physical baselines).
"""

import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import report  # noqa: E402 (bench/ is put on the path first)

# (label, system, child task, file key): the systems whose files are written by the save phase.
SAVES = [
    ("ours", "ours", "tensorizer", "ours"),
    ("reference tensorizer 2.12.1", "ref", "tensorizer", "ref"),
    ("safetensors save_file", "peer", "safetensors", "safetensors"),
    ("torch.save", "peer", "torch", "torch"),
]
LOADS = [
    ("ours", "ours", "tensorizer", "ours"),
    ("ours, reference-written file", "ours", "tensorizer", "ref"),
    ("ours, mmap=True", "ours", "tensorizer_mmap", "ours"),
    ("reference tensorizer 2.12.1", "ref", "tensorizer", "ref"),
    ("ours, safetensors file", "ours", "tensorizer_safetensors", "safetensors"),
    ("safetensors load_file", "peer", "safetensors", "safetensors"),
    ("torch.load", "peer", "torch", "torch"),
    ("torch.load mmap=True", "peer", "torch_mmap", "torch"),
    ("runai-model-streamer (safetensors)", "peer", "runai", "safetensors"),
    ("read() into fresh buffer", "baseline", "read_fresh", "ref"),
    ("read() into pre-touched buffer", "baseline", "read_pretouched", "ref"),
    ("cat FILE > /dev/null", "baseline", "cat", "ref"),
]
FILES = {
    "ours": "ours.tensors",
    "ref": "ref.tensors",
    "safetensors": "model.safetensors",
    "torch": "model.pt",
}


def run_child(python, mode, task, path, args, size_bytes=0):
    """Runs one task in a fresh process; returns its JSON result, or {"error": ...}."""
    cmd = [
        python,
        os.path.join(HERE, "child.py"),
        "--mode",
        mode,
        "--task",
        task,
        "--file",
        path,
        "--reps",
        str(args.reps),
        "--warmup",
        str(args.warmup),
        "--size-bytes",
        str(size_bytes),
        "--touch",
        getattr(args, "touch", "bytes"),
    ]
    env = dict(os.environ, RUNAI_STREAMER_LOG_LEVEL="WARNING")
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=env)
    if p.returncode != 0 or not p.stdout.strip():
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        return {"error": f"exit {p.returncode}: " + " | ".join(tail)}
    return json.loads(p.stdout.strip().splitlines()[-1])


def python_for(system, args):
    return {"ref": args.ref_python, "ours": args.ours_python}.get(system, sys.executable)


def recache(path):
    """Drops a (clean) file from the page cache and reads it back once with cat: every system's file then
    sits in the page cache as readahead leaves it, whichever writer made it (writers leave different
    folio sizes behind, which changes what mapping the file costs)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=float(os.environ.get("BENCH_SIZE_GB", "2")))
    ap.add_argument("--reps", type=int, default=int(os.environ.get("BENCH_REPS", "5")))
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--out-dir", default=os.path.join(HERE, "results"))
    ap.add_argument("--ref-python", default=os.path.join(HERE, "..", ".venv-bench-ref", "bin", "python"))
    ap.add_argument("--ours-python", default=sys.executable)
    ap.add_argument("--no-ours", action="store_true", help="ours is not built: report it as missing")
    ap.add_argument(
        "--no-net",
        action="store_true",
        default=bool(os.environ.get("BENCH_SKIP_NET")),
        help="skip the network section (also BENCH_SKIP_NET=1)",
    )
    ap.add_argument("--skip-save", action="store_true", help="reuse the files of an earlier run")
    ap.add_argument(
        "--rounds",
        type=int,
        default=int(os.environ.get("BENCH_ROUNDS", "3")),
        help="rounds of the fresh-process (cold-start) table",
    )
    ap.add_argument("--no-coldstart", action="store_true", help="skip the fresh-process table")
    ap.add_argument("--only", default="", help="comma-separated substrings of the row labels to run")
    args = ap.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    size = int(args.size_gb * 1e9)
    paths = {k: os.path.join(args.data_dir, v) for k, v in FILES.items()}
    wanted = [s.strip() for s in args.only.split(",") if s.strip()]

    def skip(label, system):
        return (system == "ours" and args.no_ours) or (wanted and not any(w in label for w in wanted))

    run = {
        "machine": report.machine(args.data_dir),
        "size_gb": args.size_gb,
        "reps": args.reps,
        "warmup": args.warmup,
        "save": [],
        "load": [],
        "net": [],
        "started": time.time(),
    }
    print(
        f"bench: {args.size_gb} GB test set, {args.reps} reps after {args.warmup} warm-up, " f"data in {args.data_dir}",
        flush=True,
    )
    for label, system, task, key in SAVES:
        if args.skip_save or skip(label, system):
            row = {"missing": "not built"} if system == "ours" and args.no_ours else None
        else:
            print(f"  save  {label} ...", flush=True)
            row = run_child(python_for(system, args), "save", task, paths[key], args, size)
        if row is not None:
            run["save"].append(dict(row, label=label, system=system))
    subprocess.run(["sync"], check=False)  # untimed: leave no dirty pages behind for the loads
    for key in sorted({key for *_, key in LOADS}):
        if os.path.exists(paths[key]):
            recache(paths[key])
    expected = {c for r in run["save"] for c in r.get("checksums", [])}
    if not args.no_coldstart:  # the headline: fresh processes, page cache warm and dropped
        import coldstart

        run["coldstart"] = coldstart.run(
            paths, lambda system: python_for(system, args), run_child, expected, rounds=args.rounds, wanted=wanted
        )
        for key in sorted({key for *_, key in LOADS}):  # leave the page cache as the section below expects
            if os.path.exists(paths[key]):
                recache(paths[key])
    import gpu

    if not wanted and gpu.available(python_for("ours", args)):  # only where torch sees a CUDA device
        run["gpu"] = gpu.run(paths, lambda system: python_for(system, args), expected, rounds=args.rounds)
        for key in sorted({key for *_, key in LOADS}):
            if os.path.exists(paths[key]):
                recache(paths[key])
    for label, system, task, key in LOADS:
        if skip(label, system):
            if system == "ours" and args.no_ours:
                run["load"].append({"label": label, "system": system, "missing": "not built"})
            continue
        if not os.path.exists(paths[key]):
            run["load"].append({"label": label, "system": system, "missing": f"no {FILES[key]}"})
            continue
        print(f"  load  {label} ...", flush=True)
        row = run_child(python_for(system, args), "load", task, paths[key], args)
        if system != "baseline" and expected and "checksums" in row and set(row["checksums"]) != expected:
            row["error"] = f"wrong data: checksum {row['checksums']} != {sorted(expected)}"
        run["load"].append(dict(row, label=label, system=system, file=FILES[key]))
    net_script = os.path.join(HERE, "..", "scripts", "with-servers.sh")
    if os.path.exists(net_script) and not wanted and not args.no_net:
        import net

        res = net.run(net_script, paths, args, python_for, expected)
        run["net_fresh"], run["net"] = res["fresh"], res["inprocess"]
    run["finished"] = time.time()
    run["machine"]["loadavg_end"] = report.loadavg()
    print(report.table(run))
    print(report.targets(run))
    written = report.write(run, args.out_dir)
    print("bench: wrote " + ", ".join(written))


if __name__ == "__main__":
    main()
