"""Network section of the benchmark: HTTP, S3 and Redis loads over loopback, ours vs reference vs a raw client.

bench.py calls run() only when scripts/with-servers.sh exists; run() re-enters this file under that
script (nginx, moto S3 and redis-server on 127.0.0.1, described by TZ_TEST_* variables), where main()
publishes the reference-written file on each server and times every loader in a fresh process
(bench/child.py). The raw clients are curl into /dev/null (HTTP; S3 through a presigned URL, as the
reference fetches) and redis-py GETs of every key. BENCH_NET_SIZE_GB caps the file served (moto keeps
objects in memory and serves them from Python), so this section uses its own smaller file if needed.
"""

import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(script, paths, args, python_for, expected):
    """Runs the section under the servers script; returns its rows (or one row saying why none).
    expected: the checksums of the full-size test set (every tensorizer load must give the same)."""
    net_gb = min(args.size_gb, float(os.environ.get("BENCH_NET_SIZE_GB", "0.5")))
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
    print(f"  net   {net_gb} GB over loopback HTTP, S3 (moto), Redis ...", flush=True)
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
        return [{"label": "network section", "system": "baseline", "error": f"exit {p.returncode}: {why}"}]
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


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--ref-python", required=True)
    ap.add_argument("--ours-python", default="")
    ap.add_argument("--expect", default="", help="comma-separated checksums a tensorizer load must give")
    args = ap.parse_args()
    size = os.path.getsize(args.file)
    targets = publish(args.file)
    to_redis(args.ref_python, args.file, targets["Redis"][0])
    rows = []
    for transport, (url, extra_env, raw_url) in targets.items():
        runs = [("ours", args.ours_python, "tensorizer", url, {}), ("ref", args.ref_python, "tensorizer", url, {})]
        if transport == "S3":  # moto copies the whole object per ranged GET: also with few, large GETs
            runs.insert(1, ("ours", args.ours_python, "tensorizer", url, {"TENSORIZER_READ_MIB": "1024"}))
        raw = ("curl", raw_url or url) if transport != "Redis" else ("redis_get", raw_url)
        runs.append(("baseline", sys.executable, raw[0], raw[1], {}))
        for system, python, task, target, knobs in runs:
            label = {"ours": "ours", "ref": "reference tensorizer 2.12.1"}.get(system, f"raw {task}")
            label = f"{transport}: {label}" + "".join(f", {k}={v}" for k, v in knobs.items())
            if not python:
                rows.append({"label": label, "system": system, "missing": "not built"})
                continue
            cmd = [
                python,
                os.path.join(HERE, "child.py"),
                "--mode",
                "load",
                "--task",
                task,
                "--file",
                target,
                "--reps",
                str(args.reps),
                "--warmup",
                str(args.warmup),
                "--bytes",
                str(size),
            ]
            p = subprocess.run(
                cmd, check=False, capture_output=True, text=True, env=dict(os.environ, **extra_env, **knobs)
            )
            if p.returncode != 0 or not p.stdout.strip():
                tail = " | ".join((p.stderr or p.stdout).strip().splitlines()[-3:])
                rows.append({"label": label, "system": system, "error": f"exit {p.returncode}: {tail}"})
                continue
            row = json.loads(p.stdout.strip().splitlines()[-1])
            want = {int(c) for c in args.expect.split(",") if c}
            if task == "tensorizer" and want and set(row["checksums"]) != want:
                row["error"] = f"wrong data: checksum {row['checksums']} != {sorted(want)}"
            rows.append(dict(row, label=label, system=system))
            print(f"net: {label} done", file=sys.stderr, flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
