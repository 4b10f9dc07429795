#!/usr/bin/env bash
# Two moto S3 servers (`moto_server`, from PyPI) for the transport tests, on free ports of 127.0.0.1:
#   open: no request authentication (any or no credentials), bucket tz-test
#   auth: moto's signature checking on, bucket tz-auth, an IAM key made by s3_setup.py
# Both get every fixture under s3://BUCKET/fixtures/.
#   s3.sh start DIR FIXTURES_DIR -> writes DIR/s3.env (TZ_TEST_S3_{ENDPOINT,BUCKET,ACCESS_KEY,SECRET_KEY},
#                                   TZ_TEST_S3_AUTH_{ENDPOINT,BUCKET,ACCESS_KEY,SECRET_KEY})
#   s3.sh stop DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
cmd=${1:?usage: s3.sh start|stop DIR [FIXTURES_DIR]}
dir=$(cd "${2:?usage: s3.sh start|stop DIR}" && pwd)
d=$dir/s3

if [ "$cmd" = stop ]; then
  stop_pidfile "$d/open.pid"
  stop_pidfile "$d/auth.pid"
  exit 0
fi
fixtures=${3:?usage: s3.sh start DIR FIXTURES_DIR}
mkdir -p "$d"
: > "$dir/s3.env"
for kind in open auth; do
  port=$(free_port)
  # Credentials in the environment only matter to moto's own boto calls, never to our client.
  AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 \
    moto_server -H 127.0.0.1 -p "$port" > "$d/$kind.log" 2>&1 &
  pid=$!
  echo "$pid" > "$d/$kind.pid"
  wait_port "$port" 60 "$pid" || { cat "$d/$kind.log" >&2; exit 1; }
  if [ $kind = open ]; then
    python3 "$here/s3_setup.py" --endpoint "http://127.0.0.1:$port" --bucket tz-test \
      --fixtures "$fixtures" --prefix TZ_TEST_S3 >> "$dir/s3.env"
  else
    python3 "$here/s3_setup.py" --endpoint "http://127.0.0.1:$port" --bucket tz-auth \
      --fixtures "$fixtures" --prefix TZ_TEST_S3_AUTH --auth >> "$dir/s3.env"
  fi
done
