#!/usr/bin/env bash
# redis-server for the transport tests, in memory only, on a free port of 127.0.0.1.
#   redis.sh start DIR   -> writes DIR/redis.env (TZ_TEST_REDIS_URL, TZ_TEST_REDIS_PORT, and
#                           TZ_TEST_REDIS_USER / TZ_TEST_REDIS_PASSWORD: an ACL user besides the
#                           open default one, for credentials in URIs)
#   redis.sh stop DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
cmd=${1:?usage: redis.sh start|stop DIR}
dir=$(cd "${2:?usage: redis.sh start|stop DIR}" && pwd)
d=$dir/redis

if [ "$cmd" = stop ]; then
  stop_pidfile "$d/redis.pid"
  exit 0
fi

mkdir -p "$d"
port=$(free_port)
# Values up to 2 GiB so a whole large tensor can be one key, as the reference layout needs.
redis-server --bind 127.0.0.1 --port "$port" --save "" --appendonly no --dir "$d" \
  --protected-mode no --proto-max-bulk-len 2gb --client-query-buffer-limit 2gb \
  --logfile "$d/redis.log" --daemonize no > /dev/null 2>&1 &
pid=$!
wait_port "$port" 20 "$pid" || { cat "$d/redis.log" >&2 || true; exit 1; }
# A password holding ':' and '@', as URIs must escape them (%3A, %40).
redis-cli -p "$port" ACL SETUSER tz-user on '>p:ss@word' '~*' '&*' '+@all' > /dev/null
echo "$pid" > "$d/redis.pid"
cat > "$dir/redis.env" <<ENV
export TZ_TEST_REDIS_URL=redis://127.0.0.1:$port
export TZ_TEST_REDIS_PORT=$port
export TZ_TEST_REDIS_USER=tz-user
export TZ_TEST_REDIS_PASSWORD='p:ss@word'
ENV
