"""The caller's stall during a save (issue 16): a blocking TensorSerializer save, a background
one (write_state_dict(background=True): the caller waits only for the snapshot), and
torch.distributed.checkpoint.async_save on CPU (single process). Each row runs in a fresh
process, rounds alternate the rows, and every row starts with no dirty pages (os.sync); prints
the median (min-max) stall and total per row.

  python bench/async_save.py [--size-mb 1024] [--rounds 3] [--dir /tmp/tz-async-save]
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(
    """
    import json, sys, time, warnings, torch
    warnings.simplefilter("ignore")
    kind, path, size_mb = sys.argv[1], sys.argv[2], int(sys.argv[3])
    n = 16
    sd = {f"layer{i}.weight": torch.randn(size_mb * (1 << 20) // 4 // n) for i in range(n)}
    if kind == "dcp":
        import torch.distributed.checkpoint as dcp
        dcp.async_save({"w": torch.ones(1)}, checkpoint_id=path + ".warm").result()  # import cost out
        start = time.perf_counter()
        future = dcp.async_save(sd, checkpoint_id=path)
        stall = time.perf_counter() - start
        future.result()
    else:
        from tensorizer import TensorSerializer
        start = time.perf_counter()
        s = TensorSerializer(path)
        if kind == "background":
            s.write_state_dict(sd, background=True)
            stall = time.perf_counter() - start
        else:
            s.write_state_dict(sd)
        s.close()
        if kind == "blocking":
            stall = time.perf_counter() - start
    total = time.perf_counter() - start
    print(json.dumps({"stall": stall, "total": total}))
    """
)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--dir", default="/tmp/tz-async-save")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    rows = ["blocking", "background", "dcp"]
    results = {r: [] for r in rows}
    for _ in range(args.rounds):
        for row in rows:
            path = os.path.join(args.dir, f"{row}.out")
            out = subprocess.run(
                [sys.executable, "-c", CHILD, row, path, str(args.size_mb)], capture_output=True, text=True, check=True
            )
            results[row].append(json.loads(out.stdout.strip().splitlines()[-1]))
            for p in (path, path + ".warm"):
                shutil.rmtree(p, ignore_errors=True) if os.path.isdir(p) else None
                if os.path.isfile(p):
                    os.unlink(p)
            os.sync()  # no writeback of one row's file throttles the next row's writes

    def fmt(values):
        return f"{statistics.median(values):6.3f} s ({min(values):.3f}-{max(values):.3f})"

    print(f"{args.size_mb} MiB fp32 state dict, {args.rounds} rounds, fresh process per save")
    print(f"{'row':<40} {'caller stall':<26} total")
    names = {
        "blocking": "tensorizer write_state_dict + close",
        "background": "tensorizer background=True",
        "dcp": "torch DCP async_save (CPU, 1 process)",
    }
    for row in rows:
        stall = [r["stall"] for r in results[row]]
        total = [r["total"] for r in results[row]]
        print(f"{names[row]:<40} {fmt(stall):<26} {fmt(total)}")


if __name__ == "__main__":
    main()
