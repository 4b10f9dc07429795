"""The headline benchmark: time to a loaded model in a fresh process, page cache warm and dropped.

Each row is one fresh process (bench/child.py --warmup 0 --reps 1) doing one load with default
options and touching every 4 KiB page of the result once (one byte per page), timed from the call to
the end of that first touch; the checksum of every byte follows, untimed, to check the data. Before
a "warm" row the file is dropped and read once with cat (see warm()); before a "cold" row every
benchmark file is synced and dropped from the page cache (fsync + posix_fadvise(DONTNEED),
unprivileged); then the row waits SETTLE_S seconds, so that the memory earlier rows freed has gone
back to the host as before a real cold start. Rounds alternate the row order; the table gives the
median and min-max of the rounds, the memory the first load held (private RSS + page cache the file
still occupies) and its peak, and the median time each row's process took to import the loader's
package after torch (outside the clock; a real start pays it too).

Run by bench.py (make bench), or alone over the files of an earlier `make bench`:
  .venv-bench/bin/python bench/coldstart.py --ref-python .venv-ref/bin/python [--rounds 3]
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (label, system, child task, file key)
ROWS = [
    ("ours (defaults)", "ours", "tensorizer", "ours"),
    ("ours, reference-written file", "ours", "tensorizer", "ref"),
    ("reference tensorizer 2.12.1", "ref", "tensorizer", "ref"),
    ("ours, safetensors file", "ours", "tensorizer_safetensors", "safetensors"),
    ("safetensors load_file", "peer", "safetensors", "safetensors"),
    ("torch.load", "peer", "torch", "torch"),
    ("torch.load mmap=True", "peer", "torch_mmap", "torch"),
    ("runai-model-streamer (safetensors)", "peer", "runai", "safetensors"),
    ("cat FILE > /dev/null", "baseline", "cat", "ours"),
    ("dd iflag=direct bs=16M", "baseline", "dd_direct", "ours"),
]
STATES = ("warm", "cold")
# Seconds each row waits before it starts. A VM whose balloon reports free memory to the host (this
# one: virtio_balloon, reporting 2 s after pages are freed) backs it lazily again, so a process
# started right after another one freed its memory gets memory the host still backs and skips the
# host faults a real cold start pays: fresh huge pages then fault 10x faster than after a pause.
SETTLE_S = 3.0


def drop(path):
    """fsync + POSIX_FADV_DONTNEED: the file's clean pages leave the page cache (no root needed)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def warm(path):
    """Drops the file, then reads it once with cat: its pages are in the page cache, in the folios
    one sequential read makes. How big those are depends on how the pages came in (a mapped read's
    faults, dd's 16 MiB reads and cat's readahead each leave other sizes), and mapping a file cached
    in small folios costs ~10x more page-table entries, so every warm row starts from this state."""
    drop(path)
    subprocess.run(["cat", path], stdout=subprocess.DEVNULL, check=True)


def cached_bytes(path):
    """Bytes of the file in the page cache now (util-linux fincore), or None."""
    p = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", path], capture_output=True, text=True)
    try:
        return int(p.stdout.split()[0])
    except (IndexError, ValueError):
        return None


def run(paths, python_for, run_child, expected=None, rounds=3, wanted=(), settle=SETTLE_S):
    """Returns one dict per (row, state): label, state, times (s), bytes, memory, errors.
    python_for(system) names the interpreter of a system; run_child is bench.run_child; each row
    starts `settle` seconds after the previous one ended (see SETTLE_S)."""
    one_load = argparse.Namespace(reps=1, warmup=0, touch="pages")
    rows = [r for r in ROWS if os.path.exists(paths[r[3]]) and (not wanted or any(w in r[0] for w in wanted))]
    results = {
        (label, state): {"label": label, "state": state, "system": system, "times": [], "errors": []}
        for label, system, _, _ in rows
        for state in STATES
    }
    files = sorted({paths[key] for *_, key in rows})
    for rnd in range(rounds):
        order = rows if rnd % 2 == 0 else rows[::-1]
        for state in STATES:
            for label, system, task, key in order:
                path = paths[key]
                if state == "cold":
                    for f in files:
                        drop(f)
                else:
                    warm(path)
                time.sleep(settle)
                print(f"  coldstart round {rnd + 1}/{rounds} {state:4} {label} ...", flush=True)
                res = run_child(python_for(system), "load", task, path, one_load)
                out = results[(label, state)]
                if "error" in res:
                    out["errors"].append(res["error"])
                    continue
                if system != "baseline" and expected and set(res.get("checksums", [])) != expected:
                    out["errors"].append(f"wrong data: checksum {res.get('checksums')}")
                    continue
                out["times"].append(res["load"][0] + res["touch"][0])
                out.setdefault("imports", []).append(res.get("import_s", 0.0))
                out["bytes"] = res["bytes"]
                out["file_bytes"] = os.path.getsize(path)
                if rnd == 0:
                    out["anon_held"] = res.get("anon_held")
                    out["load_peak"] = res.get("load_peak")
                    out["cached_after"] = cached_bytes(path)
    return list(results.values())


def _gb(x):
    return "–" if x is None else f"{x / 1e9:.2f}"


def table(results):
    """Markdown: rate per state (median, min-max of rounds), ratio to ours, memory held after a cold load."""
    by = {(r["label"], r["state"]): r for r in results}
    labels = list(dict.fromkeys(r["label"] for r in results))

    def rate(r):
        if not r or not r["times"]:
            return None
        rates = sorted(r["bytes"] / t / 1e9 for t in r["times"])
        return statistics.median(rates), rates[0], rates[-1], statistics.median(r["times"])

    ours = {s: rate(by.get(("ours (defaults)", s))) for s in STATES}
    lines = [
        "| fresh process, one load + first touch | warm cache GB/s (min–max) | s | ours ÷ row | "
        "dropped cache GB/s (min–max) | s | ours ÷ row | memory held GB, warm: private + page cache | "
        "cold: private + page cache | peak RSS GB (cold) | import ms, not in the clock |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label in labels:
        cells = [label]
        imports = [t for s in STATES for t in (by.get((label, s)) or {}).get("imports", [])]
        for s in STATES:
            r = rate(by.get((label, s)))
            if r is None:
                err = (by.get((label, s)) or {}).get("errors") or ["not run"]
                cells += [f"error: {err[0][:60]}", "", ""]
                continue
            ratio = f"{ours[s][0] / r[0]:.2f}×" if ours[s] else "–"
            cells += [f"{r[0]:.2f} ({r[1]:.2f}–{r[2]:.2f})", f"{r[3]:.3f}", ratio]
        for s in STATES:
            m = by.get((label, s)) or {}
            cells.append(f"{_gb(m.get('anon_held'))} + {_gb(m.get('cached_after'))}")
        cells.append(_gb((by.get((label, "cold")) or {}).get("load_peak")))
        cells.append(f"{statistics.median(imports) * 1e3:.1f}" if imports else "–")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main():
    sys.path.insert(0, HERE)
    import bench

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default=os.path.join(HERE, "data"))
    ap.add_argument("--ref-python", default=os.path.join(HERE, "..", ".venv-bench-ref", "bin", "python"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", default="")
    ap.add_argument("--settle", type=float, default=SETTLE_S, help="seconds each row waits before it starts")
    args = ap.parse_args()
    paths = {k: os.path.join(args.data_dir, v) for k, v in bench.FILES.items()}

    def python_for(system):
        return {"ref": args.ref_python}.get(system, sys.executable)

    wanted = [w for w in args.only.split(",") if w]
    print(table(run(paths, python_for, bench.run_child, rounds=args.rounds, wanted=wanted, settle=args.settle)))


if __name__ == "__main__":
    main()
