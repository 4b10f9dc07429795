"""Scale-out section of the benchmark: 1, 2 and 4 ranks (one process each, a gloo process group on
loopback) load one file over HTTP through a proxy that caps every connection's bandwidth, as a
remote store's per-connection limit does: cooperatively (each rank reads 1/N and the shares are
broadcast, tensorizer.distributed.cooperative_load) and each rank reading the whole file. Prints,
per row, the load time (the slowest rank's, from a barrier before to a barrier after; median and
min-max of --rounds, alternating the row order) and the bytes fetched from the server by all ranks.

Runs itself under scripts/with-servers.sh (nginx) and starts tests/tools/fault_proxy.py --rate.
Knobs: BENCH_SCALE_GB (file size, default 0.5), BENCH_SCALE_MBPS (cap per connection, MB/s,
default 10). Never run by `make test`.
"""

import argparse
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import time
from datetime import timedelta

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import testset  # noqa: E402


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, mode, url, queue):
    import torch.distributed as dist

    from tensorizer import TensorDeserializer
    from tensorizer.distributed import cooperative_load

    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timedelta(seconds=600)
    )
    dist.barrier()
    start = time.perf_counter()
    if mode == "cooperative":
        state = cooperative_load(url)
        fetched = state.bytes_read
    else:
        with TensorDeserializer(url, device="cpu") as d:
            state = dict(d)
            fetched = d.total_bytes_read
    testset.touch_pages(list(state.values()))
    dist.barrier()
    seconds = time.perf_counter() - start
    queue.put((rank, seconds, fetched, sum(t.numel() * t.element_size() for t in state.values())))
    dist.destroy_process_group()


def run(world, mode, url):
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, mode, url, queue)) for r in range(world)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=900) for _ in procs]
    for p in procs:
        p.join()
    return max(r[1] for r in results), sum(r[2] for r in results), results[0][3]


def write_file(path, size):
    import torch

    from tensorizer import TensorSerializer

    g = torch.Generator().manual_seed(0)
    n = max(1, size // (32 << 20))
    sd = {f"layer.{i}.weight": torch.randn(4096, size // n // 4 // 4096, generator=g) for i in range(n)}
    with TensorSerializer(path) as s:
        s.write_state_dict(sd)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--size-gb", type=float, default=float(os.environ.get("BENCH_SCALE_GB", "0.5")))
    ap.add_argument("--mbps", type=float, default=float(os.environ.get("BENCH_SCALE_MBPS", "10")))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ranks", default="1,2,4")
    args = ap.parse_args()
    if not os.environ.get("TZ_TEST_HTTP_ROOT"):  # re-enter under the servers script
        cmd = ["bash", os.path.join(ROOT, "scripts", "with-servers.sh"), sys.executable, *sys.argv]
        sys.exit(subprocess.call(cmd))
    root, url = os.environ["TZ_TEST_HTTP_ROOT"], os.environ["TZ_TEST_HTTP_URL"]
    path = os.path.join(root, "scaleout.tensors")
    write_file(path, int(args.size_gb * 1e9))
    size = os.path.getsize(path)
    port_file = os.path.join(root, "..", "scaleout-proxy.port")
    upstream = url.split("://", 1)[1].split("/", 1)[0]
    proxy = subprocess.Popen(
        [sys.executable, os.path.join(ROOT, "tests", "tools", "fault_proxy.py"), "--upstream", upstream]
        + ["--rate", str(int(args.mbps * 1e6)), "--port-file", port_file]
    )
    try:
        while not os.path.exists(port_file):
            time.sleep(0.05)
        with open(port_file) as f:
            proxied = f"http://127.0.0.1:{f.read().strip()}/scaleout.tensors"
        rows = [(w, m) for w in map(int, args.ranks.split(",")) for m in ("cooperative", "whole file each")]
        rows = [r for r in rows if not (r[0] == 1 and r[1] != "cooperative")]
        times = {r: [] for r in rows}
        fetched = {}
        for rnd in range(args.rounds):
            for row in rows if rnd % 2 == 0 else rows[::-1]:
                seconds, got, _ = run(row[0], row[1], proxied)
                times[row].append(seconds)
                fetched[row] = got
                print(f"scaleout: round {rnd + 1} {row} {seconds:.2f} s", file=sys.stderr, flush=True)
    finally:
        proxy.terminate()
        proxy.wait()
        os.unlink(path)
    print(f"\n{size / 1e9:.2f} GB over HTTP, each connection capped at {args.mbps:g} MB/s, {args.rounds} rounds")
    print("| ranks | load | seconds, median (min-max) | GB/s per rank | GB fetched, all ranks |")
    print("|---:|---|---:|---:|---:|")
    out = []
    for (world, mode), ts in times.items():
        med = statistics.median(ts)
        print(
            f"| {world} | {mode} | {med:.2f} ({min(ts):.2f}-{max(ts):.2f}) | {size / med / 1e9:.2f} |"
            f" {fetched[(world, mode)] / 1e9:.2f} |"
        )
        out.append({"ranks": world, "mode": mode, "seconds": ts, "fetched": fetched[(world, mode)], "bytes": size})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
