#!/usr/bin/env bash
# Remote load throughput over loopback: our engine (bench/remote_load) next to a raw client on the
# same server, for HTTP (nginx), S3 (moto) and Redis. Not part of `make test`.
#   bash bench/remote.sh     (REMOTE_SIZE_MB, default 2048; REMOTE_S3_SIZE_MB, default the same;
#                             REMOTE_S3_READ_MIB, default "": TENSORIZER_READ_MIB values also
#                             timed for S3 (the old fixed-size schedule: moto copies the whole
#                             object in Python for every ranged GET); REMOTE_RANGED_CURL=1 also
#                             times curl doing 16 MiB ranged GETs on moto (slow); REMOTE_REPS,
#                             default 3: best of; BUILD)
# S3 is timed on moto and on nginx serving the bucket path-style (TZ_TEST_S3_FAST_ENDPOINT), an
# endpoint that serves ranges at wire speed as real object stores do.
# Raw baselines: `curl -o /dev/null` of the file; curl of a presigned S3 URL (made by boto3);
# `redis-cli --raw GET` of every key of the object, one after another, into /dev/null.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD:-build}
SIZE_MB=${REMOTE_SIZE_MB:-2048}
S3_SIZE_MB=${REMOTE_S3_SIZE_MB:-$SIZE_MB}
S3_READ_MIB=${REMOTE_S3_READ_MIB:-}
REPS=${REMOTE_REPS:-3}
if [ -z "${TZ_TEST_HTTP_URL:-}" ]; then
  cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release > /dev/null
  cmake --build "$BUILD" -j "${JOBS:-2}" --target remote_load tensorizer_cli > /dev/null
  exec bash scripts/with-servers.sh env BUILD="$BUILD" REMOTE_SIZE_MB="$SIZE_MB" REMOTE_S3_SIZE_MB="$S3_SIZE_MB" \
    REMOTE_S3_READ_MIB="$S3_READ_MIB" REMOTE_REPS="$REPS" bash "$0"
fi

T=$BUILD/tensorizer
L=$BUILD/remote_load
name=bench-$SIZE_MB.tensors
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_ENDPOINT_URL=$TZ_TEST_S3_ENDPOINT
echo "remote bench: making a $SIZE_MB MiB model" >&2
$L --make "$TZ_TEST_HTTP_ROOT/$name" "$SIZE_MB"
s3name=bench-s3-$S3_SIZE_MB.tensors
[ "$s3name" = "$name" ] || $L --make "$TZ_TEST_HTTP_ROOT/$s3name" "$S3_SIZE_MB"
s3uri=s3://$TZ_TEST_S3_BUCKET/$s3name
redisuri=$TZ_TEST_REDIS_URL/bench
echo "remote bench: uploading to S3 and Redis" >&2
$T cp -q "$TZ_TEST_HTTP_ROOT/$s3name" "$s3uri"
s3bytes=$(stat -c %s "$TZ_TEST_HTTP_ROOT/$s3name")
$T cp -q "$TZ_TEST_HTTP_ROOT/$name" "$redisuri"
bytes=$(stat -c %s "$TZ_TEST_HTTP_ROOT/$name")

# best of $REPS wall-clock seconds of a command
best3() {
  local best="" t
  for _ in $(seq "$REPS"); do
    t=$(python3 -c "import time,subprocess,sys; t=time.perf_counter(); subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True); print(time.perf_counter()-t)" "$@")
    if [ -z "$best" ] || python3 -c "import sys; sys.exit(0 if $t < $best else 1)"; then best=$t; fi
  done
  echo "$best"
}
row() {  # row LABEL SECONDS [BYTES]
  python3 -c "import sys; s=float(sys.argv[2]); print(f'{sys.argv[1]:<40} {s:7.2f} s {int(sys.argv[3])/s/1e9:6.2f} GB/s')" "$1" "$2" "${3:-$bytes}"
}
ours() {  # ours URI WORKERS -> seconds
  $L "$1" --workers "$2" --reps "$REPS" | python3 -c "import json,sys; print(json.load(sys.stdin)['seconds'])"
}

presigned=$(python3 - "$TZ_TEST_S3_ENDPOINT" "$TZ_TEST_S3_BUCKET" "$s3name" <<'PY'
import sys, boto3
s3 = boto3.client("s3", endpoint_url=sys.argv[1], aws_access_key_id="testing",
                  aws_secret_access_key="testing", region_name="us-east-1")
print(s3.generate_presigned_url("get_object", Params={"Bucket": sys.argv[2], "Key": sys.argv[3]}, ExpiresIn=3600))
PY
)
# The same 16 MiB ranged GETs as the engine's plan, one after another, over one curl process.
ranged_curl() {
  local args=() off=0 piece=$((16 << 20))
  while [ $off -lt "$s3bytes" ]; do
    args+=(-r "$off-$((off + piece - 1))" -o /dev/null "$presigned")
    off=$((off + piece))
  done
  curl -s "${args[@]}"
}
export -f ranged_curl
export s3bytes presigned
redis_port=$TZ_TEST_REDIS_PORT
redis_all_keys() {
  redis-cli -p "$redis_port" --scan --pattern 'bench:*' | while read -r k; do
    redis-cli -p "$redis_port" --raw GET "$k" > /dev/null
  done
}
export -f redis_all_keys
export redis_port

echo "== $bytes bytes over loopback, $(nproc) cores =="
row "HTTP raw: curl -o /dev/null" "$(best3 curl -s -o /dev/null "$TZ_TEST_HTTP_URL/$name")"
for w in 1 2 0; do row "HTTP ours ($w workers, 0 = default)" "$(ours "$TZ_TEST_HTTP_URL/$name" $w)"; done
echo "== S3: $s3bytes bytes =="
row "S3 raw: curl presigned URL" "$(best3 curl -s -o /dev/null "$presigned")" "$s3bytes"
[ -z "${REMOTE_RANGED_CURL:-}" ] ||
  row "S3 raw: curl presigned, 16 MiB ranges" "$(best3 bash -c ranged_curl)" "$s3bytes"
row "S3 ours (defaults: 8 streamed shares)" "$(ours "$s3uri" 0)" "$s3bytes"
for mib in $S3_READ_MIB; do
  row "S3 ours (TENSORIZER_READ_MIB=$mib)" "$(export TENSORIZER_READ_MIB=$mib; ours "$s3uri" 8)" "$s3bytes"
done
echo "== S3 on nginx (path-style, wire speed): $s3bytes bytes =="
mkdir -p "$TZ_TEST_S3_FAST_ROOT/$TZ_TEST_S3_BUCKET"
ln -sf "$TZ_TEST_HTTP_ROOT/$s3name" "$TZ_TEST_S3_FAST_ROOT/$TZ_TEST_S3_BUCKET/$s3name"
row "S3 nginx raw: curl presigned URL" \
  "$(best3 curl -s -o /dev/null "${presigned/$TZ_TEST_S3_ENDPOINT/$TZ_TEST_S3_FAST_ENDPOINT}")" "$s3bytes"
row "S3 nginx ours (defaults)" "$(export AWS_ENDPOINT_URL=$TZ_TEST_S3_FAST_ENDPOINT; ours "$s3uri" 0)" "$s3bytes"
echo "== Redis: $bytes bytes =="
row "Redis raw: redis-cli --raw GET" "$(best3 bash -c redis_all_keys)"
for w in 1 2 4; do row "Redis ours ($w workers)" "$(ours "$redisuri" $w)"; done
