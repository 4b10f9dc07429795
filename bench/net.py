"""Network section of the benchmark: HTTP, S3 and Redis loads over loopback, ours vs reference vs a raw client.

bench.py calls run() only when scripts/with-servers.sh exists; run() re-enters this file under that
script (nginx, moto S3 and redis-server on 127.0.0.1, described by TZ_TEST_* variables), where main()
publishes the reference-written file on each server and times every loader in a fresh process
(bench/child.py). The raw clients are curl into /dev/null (HTTP; S3 through a presigned URL, as the
reference fetches), the same curl into a file on tmpfs (the bytes kept in fresh memory, as a load
keeps them; /dev/null skips that cost) and redis-py GETs of every key. BENCH_NET_SIZE_GB (default
1) caps the file served (moto keeps objects in memory and serves them from Python), so this section
uses its own smaller file if needed.
S3 runs twice: on moto, and on nginx serving the bucket's key path-style (signatures ignored) as a real
object store serves ranges, so that the S3 client itself is measured. Over HTTP and S3 on nginx, ours
also runs through the local cache (TENSORIZER_CACHE_DIR): a miss (an empty cache each time) and a hit
(a cache filled before the rounds), next to ours loading the same file from local disk. The hit and
the local file are compared with their page cache in the same state: each is read through, untimed,
before its load (as the download that filled the cache leaves it), and the share of its bytes then
resident is kept with the row (page_cache_before; fincore). The file nginx serves is read through
the same way before each HTTP and S3-on-nginx row, so no row pays for reading it from disk, and
each fresh row starts after a sync, --settle seconds (3) after the previous one, as the
cold-start rows do (bench/coldstart.py, SETTLE_S). The headline is a fresh process per load
(--rounds, alternating the row order); repeats inside one process follow as a second table.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from coldstart import SETTLE_S  # noqa: E402 (each fresh row waits as the cold-start rows do)


def run(script, paths, args, python_for, expected):
    """Runs the section under the servers script; returns {"fresh": rows, "inprocess": rows} (or one
    fresh row saying why there are none). expected: the checksums of the full-size test set (every
    tensorizer load must give the same)."""
    net_gb = min(args.size_gb, float(os.environ.get("BENCH_NET_SIZE_GB", "1")))
    path = paths["ref"]
    if net_gb < args.size_gb:  # a smaller reference-written file, made untimed
        path = os.path.join(os.path.dirname(path), "net.tensors")
        p = subprocess.run(
            [
                python_for("ref", args),
                os.path.join(HERE, "child.py"),
                "--mode",
                "save",
                "--task",
                "tensorizer",
                "--file",
                path,
                "--reps",
                "1",
                "--warmup",
                "0",
                "--size-bytes",
                str(int(net_gb * 1e9)),
            ],
            check=True,
            capture_output=True,
            text=True,
        )
        expected = set(json.loads(p.stdout.strip().splitlines()[-1])["checksums"])
    print(f"  net   {net_gb} GB over loopback HTTP, S3 (moto and nginx), Redis ...", flush=True)
    cmd = [
        "bash",
        script,
        sys.executable,
        os.path.abspath(__file__),
        "--file",
        path,
        "--reps",
        str(args.reps),
        "--warmup",
        str(args.warmup),
        "--rounds",
        str(getattr(args, "rounds", 3)),
        "--ref-python",
        python_for("ref", args),
        "--expect",
        ",".join(str(c) for c in sorted(expected)),
    ]
    if not args.no_ours:
        cmd += ["--ours-python", python_for("ours", args)]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True)
    lines = p.stdout.strip().splitlines()
    if p.returncode != 0 or not lines:
        why = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
        error = {"label": "network section", "system": "baseline", "error": f"exit {p.returncode}: {why}"}
        return {"fresh": [error], "inprocess": []}
    return json.loads(lines[-1])


def publish(path):
    """Puts the file on each server; returns {transport: (url, extra child env)}."""
    import boto3

    env = os.environ
    out = {}
    link = os.path.join(env["TZ_TEST_HTTP_ROOT"], "bench.tensors")
    if not os.path.exists(link):
        os.symlink(os.path.abspath(path), link)
    out["HTTP"] = (env["TZ_TEST_HTTP_URL"] + "/bench.tensors", {}, None)

    s3 = boto3.client(
        "s3",
        endpoint_url=env["TZ_TEST_S3_ENDPOINT"],
        region_name="us-east-1",
        aws_access_key_id=env["TZ_TEST_S3_ACCESS_KEY"],
        aws_secret_access_key=env["TZ_TEST_S3_SECRET_KEY"],
    )
    bucket = env["TZ_TEST_S3_BUCKET"]
    s3.upload_file(path, bucket, "bench.tensors")
    presigned = s3.generate_presigned_url(
        "get_object", Params={"Bucket": bucket, "Key": "bench.tensors"}, ExpiresIn=86400
    )
    s3_env = {
        "AWS_ACCESS_KEY_ID": env["TZ_TEST_S3_ACCESS_KEY"],
        "AWS_SECRET_ACCESS_KEY": env["TZ_TEST_S3_SECRET_KEY"],
        "AWS_ENDPOINT_URL_S3": env["TZ_TEST_S3_ENDPOINT"],
        "AWS_DEFAULT_REGION": "us-east-1",
    }
    out["S3"] = (f"s3://{bucket}/bench.tensors", s3_env, presigned)

    if env.get("TZ_TEST_S3_FAST_ENDPOINT"):  # nginx serving the same key path-style at wire speed
        os.makedirs(os.path.join(env["TZ_TEST_S3_FAST_ROOT"], bucket), exist_ok=True)
        fast_link = os.path.join(env["TZ_TEST_S3_FAST_ROOT"], bucket, "bench.tensors")
        if not os.path.exists(fast_link):
            os.symlink(os.path.abspath(path), fast_link)
        fast = env["TZ_TEST_S3_FAST_ENDPOINT"]
        out["S3 (nginx)"] = (
            f"s3://{bucket}/bench.tensors",
            dict(s3_env, AWS_ENDPOINT_URL_S3=fast),
            presigned.replace(env["TZ_TEST_S3_ENDPOINT"], fast, 1),
        )
    out["S3 (moto)"] = out.pop("S3")

    redis_url = env["TZ_TEST_REDIS_URL"] + "/bench"
    out["Redis"] = (redis_url, {}, redis_url)
    return out


def to_redis(ref_python, path, redis_url):
    """Loads the file into Redis in the reference's key layout, with the reference's own to_redis."""
    code = (
        "import sys, redis; from tensorizer import TensorDeserializer\n"
        "hp, _, prefix = sys.argv[2][len('redis://'):].partition('/'); h, _, p = hp.partition(':')\n"
        "d = TensorDeserializer(sys.argv[1], device='cpu', lazy_load=True)\n"
        "d.to_redis(redis.Redis(host=h, port=int(p)), prefix); d.close()\n"
    )
    subprocess.run([ref_python, "-c", code, path, redis_url], check=True)


CACHED = ("HTTP", "S3 (nginx)")  # transports whose rows include the local cache


def rows_for(targets, args, cache_root):
    """(label, system, python, task, target, extra env) for every network row, grouped by transport;
    the rows through the local cache use cache_root (a filled cache per transport, and room for
    the misses' own)."""
    out = []
    for transport, (url, extra_env, raw_url) in targets.items():
        group = [
            ("ours", args.ours_python, "tensorizer", url, {}),
            ("ours, lazy_load", args.ours_python, "tensorizer_lazy", url, {}),
            ("reference tensorizer 2.12.1", args.ref_python, "tensorizer", url, {}),
        ]
        if transport in CACHED:
            filled = {"TENSORIZER_CACHE_DIR": os.path.join(cache_root, transport.replace(" ", "_"))}
            group.append(("ours, cache miss", args.ours_python, "tensorizer_cache_miss", url, {}))
            group.append(("ours, cache hit", args.ours_python, "tensorizer", url, filled))
        if transport == "Redis":
            group.append(("raw redis_get", sys.executable, "redis_get", raw_url, {}))
        else:  # curl into /dev/null, and into memory it keeps, as a load must
            group.append(("raw curl", sys.executable, "curl", raw_url or url, {}))
            group.append(("raw curl, kept in memory (tmpfs)", sys.executable, "curl_kept", raw_url or url, {}))
        for name, python, task, target, env in group:
            system = "ours" if name.startswith("ours") else "ref" if name.startswith("ref") else "baseline"
            env = dict(extra_env, BENCH_CACHE_ROOT=cache_root, **env)
            out.append((f"{transport}: {name}", system, python, task, target, env))
    # What a cache hit is measured against: ours loading the same bytes from local disk.
    out.append(("local file: ours", "ours", args.ours_python, "tensorizer", args.file, {}))
    return out


def local_files(row):
    """The local files a row loads from: the cache hit's entries, the local file's path; else none."""
    label, _, _, _, target, extra_env = row
    if label.endswith("cache hit"):
        root = extra_env["TENSORIZER_CACHE_DIR"]
        return [os.path.join(d, f) for d, _, files in os.walk(root) for f in files]
    return [target] if label.startswith("local file") else []


def served_files(row, path):
    """The file nginx sends for a row (HTTP and S3 on nginx serve `path` itself): read through
    before each of its rows, untimed, so that every row, the first round's included, finds the
    server's object in its page cache, as a hot object on a serving node is, rather than whatever
    reclaim left of it since the last row that read it."""
    return [path] if row[0].startswith(("HTTP:", "S3 (nginx):")) else []


def warm_page_cache(paths):
    """Reads each file through (untimed); returns the share of their bytes then in the page cache."""
    for path in paths:
        with open(path, "rb", buffering=0) as f:
            while f.read(16 << 20):
                pass
    size = sum(os.path.getsize(p) for p in paths)
    if not paths or not size or not shutil.which("fincore"):
        return None
    out = subprocess.run(
        ["fincore", "--bytes", "--noheadings", "--output", "RES", *paths], capture_output=True, text=True
    )
    return min(1.0, sum(int(x) for x in out.stdout.split()) / size) if out.returncode == 0 else None


def run_row(row, size, reps, warmup, want):
    """One child process for a row; its result dict (with error/missing when it failed)."""
    label, system, python, task, target, extra_env = row
    if not python:
        return {"label": label, "system": system, "missing": "not built"}
    cmd = [python, os.path.join(HERE, "child.py"), "--mode", "load", "--task", task, "--file", target]
    cmd += ["--reps", str(reps), "--warmup", str(warmup), "--bytes", str(size)]
    p = subprocess.run(cmd, check=False, capture_output=True, text=True, env=dict(os.environ, **extra_env))
    if p.returncode != 0 or not p.stdout.strip():
        tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
        return {"label": label, "system": system, "error": f"exit {p.returncode}: {tail}"}
    res = dict(json.loads(p.stdout.strip().splitlines()[-1]), label=label, system=system)
    if task.startswith("tensorizer") and want and set(res["checksums"]) != want:
        res["error"] = f"wrong data: checksum {res['checksums']} != {sorted(want)}"
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3, help="fresh-process rounds (the headline)")
    ap.add_argument("--ref-python", required=True)
    ap.add_argument("--ours-python", default="")
    ap.add_argument("--only", default="", help="comma-separated substrings of the labels to run")
    ap.add_argument("--expect", default="", help="comma-separated checksums a tensorizer load must give")
    ap.add_argument("--settle", type=float, default=SETTLE_S, help="seconds each fresh row waits before it starts")
    args = ap.parse_args()
    size = os.path.getsize(args.file)
    want = {int(c) for c in args.expect.split(",") if c}
    targets = publish(args.file)
    if any("Redis" in w for w in args.only.split(",")) or not args.only:
        to_redis(args.ref_python, args.file, targets["Redis"][0])
    cache_root = tempfile.mkdtemp(prefix="bench-cache-", dir=os.path.dirname(os.path.abspath(args.file)))
    rows = rows_for(targets, args, cache_root)
    rows = [r for r in rows if not args.only or any(w in r[0] for w in args.only.split(","))]
    for row in rows:  # fill the caches of the hit rows, untimed
        if row[0].endswith("cache hit"):
            run_row(row, size, 1, 0, want)
    # The headline: a fresh process per load (one load, defaults), rounds alternating the row order;
    # each round's time joins the row's lists, so a row reads like one with `rounds` repetitions.
    fresh = {}
    for rnd in range(args.rounds):
        for row in rows if rnd % 2 == 0 else rows[::-1]:
            os.sync()  # no row pays for writing back what the rows before it wrote (a miss writes ~1 GB)
            warm_page_cache(served_files(row, args.file))
            resident = warm_page_cache(local_files(row))
            time.sleep(args.settle)
            res = run_row(row, size, 1, 0, want)
            print(f"net: fresh round {rnd + 1}/{args.rounds} {row[0]} done", file=sys.stderr, flush=True)
            if resident is not None:
                res["page_cache_before"] = [resident]
            have = fresh.get(row[0])
            if have is None or "error" in res or "missing" in res or "error" in have:
                fresh[row[0]] = have if have and "error" in have else res
                continue
            for key in ("load", "touch", "touch_resident", "page_cache_before"):
                if key in res:
                    have[key] = have.get(key, []) + res[key]
    # Secondary: repeats inside one warmed-up process.
    inprocess = []
    for row in rows if args.reps > 0 else []:
        inprocess.append(run_row(row, size, args.reps, args.warmup, want))
        print(f"net: {row[0]} done", file=sys.stderr, flush=True)
    shutil.rmtree(cache_root, ignore_errors=True)
    print(json.dumps({"fresh": [fresh[r[0]] for r in rows], "inprocess": inprocess}))


if __name__ == "__main__":
    main()
