"""Per-rank files as vLLM names them (save_per_rank, rank_file: each rank reads only its own file,
counted in nginx's access log), and cooperative loads (tensorizer.distributed.cooperative_load) with
real torch.distributed process groups (gloo over loopback, 2 and 4 ranks, one spawned process each):
every rank ends with bit-exact tensors (whole, or the block its shard plan selects) while reading
only its share of the bytes (counted by the engine), from a local file and over HTTP through the
fault proxy dropping connections; a rank whose read fails makes every rank raise naming it, and a
rank that dies makes the others raise within the group's timeout instead of hanging."""

import hashlib
import multiprocessing
import os
import socket
import subprocess
import sys
import time
import uuid
from datetime import timedelta

import pytest
import torch

from tensorizer import TensorSerializer

from conftest import fault_proxy
from test_remote import server_env

TIMEOUT_S = 15  # the process group's timeout in the children


def model():
    g = torch.Generator().manual_seed(5)
    # Uneven for 2 and 4 ranks along both dimensions (split as torch.tensor_split does).
    sd = {f"layer.{i}.weight": torch.randn(255, 385 + 64 * i, generator=g) for i in range(10)}
    sd["embed"] = torch.randn(1000, 256, generator=g).to(torch.bfloat16)
    sd["norm"] = torch.randn(256, generator=g)
    sd["flags"] = torch.arange(37) % 3 == 0
    return sd


def digest(t):
    return hashlib.sha256(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes()).hexdigest() + str(
        (tuple(t.shape), t.dtype)
    )


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_main(rank, world, port, task, args, queue):
    """One rank: joins the group, runs `task`, reports (rank, outcome, value, seconds)."""
    import torch.distributed as dist

    from tensorizer.distributed import cooperative_load, shard_plan

    start = time.monotonic()
    try:
        dist.init_process_group(
            "gloo",
            init_method=f"tcp://127.0.0.1:{port}",
            rank=rank,
            world_size=world,
            timeout=timedelta(seconds=TIMEOUT_S),
        )
        if task == "die" and rank == 1:
            os._exit(3)
        file = args["file"] if not (task == "fail" and rank == 1) else args["file"] + ".missing"
        plan = shard_plan(rank, world, dim=args["dim"]) if args.get("dim") is not None else None
        out = cooperative_load(file, slice_plan=plan)
        value = {
            "digests": {name: digest(t) for name, t in out.items()},
            "bytes_read": out.bytes_read,
            "share": out.share,
        }
        queue.put((rank, "ok", value, time.monotonic() - start))
    except BaseException as e:  # reported to the parent, which asserts on it
        queue.put((rank, "error", f"{type(e).__name__}: {e}", time.monotonic() - start))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(world, task, args, expect_reports=None):
    """Runs `world` ranks; returns {rank: (outcome, value, seconds)} of the ranks that reported."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=rank_main, args=(r, world, port, task, args, queue)) for r in range(world)]
    for p in procs:
        p.start()
    reports = {}
    deadline = time.monotonic() + 120
    want = world if expect_reports is None else expect_reports
    while len(reports) < want and time.monotonic() < deadline:
        try:
            rank, outcome, value, seconds = queue.get(timeout=1)
            reports[rank] = (outcome, value, seconds)
        except Exception:
            if all(not p.is_alive() for p in procs) and queue.empty():
                break
    for p in procs:
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
    return reports


def expected_digests(world, rank, dim):
    from tensorizer.distributed import shard_plan

    plan = shard_plan(rank, world, dim=dim) if dim is not None else None
    out = {}
    for name, t in model().items():
        index = plan(name, list(t.shape)) if plan else None
        out[name] = digest(t if index is None else t[index])
    return out


def check_ranks(reports, world, dim, data_bytes):
    assert sorted(reports) == list(range(world)), reports
    for rank, (outcome, value, _) in reports.items():
        assert outcome == "ok", (rank, value)
        assert value["digests"] == expected_digests(world, rank, dim), rank
    shares = [set(reports[r][1]["share"]) for r in range(world)]
    assert set().union(*shares) == set(model()) and sum(map(len, shares)) == len(model())
    # Each rank read its share (and the index), not the whole file.
    for rank in range(world):
        read = reports[rank][1]["bytes_read"]
        assert read < data_bytes / world * 1.35 + (512 << 10), (rank, read, data_bytes)
        assert read >= sum(model()[n].numel() * model()[n].element_size() for n in shares[rank])


def write_model(path):
    with TensorSerializer(str(path)) as s:
        s.write_state_dict(model())
    return sum(t.numel() * t.element_size() for t in model().values())


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("dim", [None, 0, -1])
def test_cooperative_local_load(tmp_path, world, dim):
    path = tmp_path / "m.tensors"
    data_bytes = write_model(path)
    check_ranks(run_ranks(world, "load", {"file": str(path), "dim": dim}), world, dim, data_bytes)


def test_cooperative_http_load_through_dropped_connections(tmp_path):
    url, root, proxy_script = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT", "TZ_TEST_FAULT_PROXY")
    name = f"coop-{uuid.uuid4().hex}.tensors"
    data_bytes = write_model(os.path.join(root, name))
    try:
        with fault_proxy(proxy_script, url, "drop:20000-400000x12", tmp_path) as (proxy_url, log):
            check_ranks(run_ranks(2, "load", {"file": f"{proxy_url}/{name}", "dim": 1}), 2, 1, data_bytes)
        assert "faulted" in log.read_text()  # connections were dropped, and the load resumed
    finally:
        os.unlink(os.path.join(root, name))


def test_a_rank_that_cannot_read_makes_every_rank_raise(tmp_path):
    path = tmp_path / "m.tensors"
    write_model(path)
    reports = run_ranks(2, "fail", {"file": str(path)})
    assert sorted(reports) == [0, 1]
    for rank, (outcome, message, seconds) in reports.items():
        assert outcome == "error" and "rank(s) [1]" in message, (rank, message)
        assert seconds < TIMEOUT_S  # told at once, not after a timeout
    assert "missing" in reports[1][1]


def test_a_rank_that_dies_makes_the_others_raise_within_the_timeout(tmp_path):
    path = tmp_path / "m.tensors"
    write_model(path)
    reports = run_ranks(2, "die", {"file": str(path)}, expect_reports=1)
    assert list(reports) == [0]
    outcome, message, seconds = reports[0]
    assert outcome == "error", message
    assert seconds < TIMEOUT_S + 30


def test_per_rank_files_are_written_and_each_rank_reads_only_its_own():
    from tensorizer import TensorDeserializer, stream_io
    from tensorizer.distributed import rank_file, save_per_rank, shard_plan

    url, root, log = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT", "TZ_TEST_HTTP_ACCESS_LOG")
    stem = f"tp-{uuid.uuid4().hex}"
    full = model()
    shards = []
    for rank in range(3):
        plan = shard_plan(rank, 3, dim=0)
        shards.append(
            {n: (t if plan(n, list(t.shape)) is None else t[plan(n, list(t.shape))]).clone() for n, t in full.items()}
        )
    written = save_per_rank(os.path.join(root, stem + "-rank-%03d.tensors"), shards)
    try:
        assert [os.path.basename(w) for w in written] == [f"{stem}-rank-{r:03d}.tensors" for r in range(3)]
        template = f"{url}/{stem}-rank-%03d.tensors"
        with stream_io.open_stream(rank_file(template, 1)) as f:  # the way vLLM opens its rank's file
            with TensorDeserializer(f, device="cpu") as d:
                assert {n: digest(t) for n, t in d.items()} == {n: digest(t) for n, t in shards[1].items()}
        with open(log) as f:
            requested = [line for line in f if stem in line]
        assert requested and all(f"{stem}-rank-001.tensors" in line for line in requested)
    finally:
        for w in written:
            os.unlink(w)
    for bad in ("model.tensors", "model-%d-%d.tensors", "model-%%.tensors"):
        with pytest.raises(ValueError):
            rank_file(bad, 0)
    with pytest.raises(TypeError):
        save_per_rank("m-%d.tensors", {"w": torch.zeros(1)})


def test_torchrun_runs_the_cooperative_load_command(tmp_path):
    path = tmp_path / "m.tensors"
    write_model(path)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    cmd += ["-m", "tensorizer", "cooperative-load", str(path), "--shard-dim", "0"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = sorted(line for line in p.stdout.splitlines() if line.startswith("rank "))
    assert [line.split(":")[0] for line in lines] == ["rank 0/2", "rank 1/2"], p.stdout
    assert all(f"{len(model())} tensors" in line for line in lines), lines
