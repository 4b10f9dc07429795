#!/usr/bin/env bash
# Runs a command with the transport-test servers up, and always stops them afterwards:
#   scripts/with-servers.sh COMMAND [ARGS...]
# Starts nginx (HTTP, HTTPS, HTTP without ranges, a caching proxy), two moto S3 servers and redis-server on free
# ports of 127.0.0.1, in a temporary directory, with every fixture served by each; exports their
# URLs and credentials (TZ_TEST_* variables, see scripts/servers/*.sh) plus TZ_TEST_FAULT_PROXY
# (our fault-injecting proxy) and TZ_REQUIRE_SERVERS=1, so tests fail rather than skip.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
servers=$root/scripts/servers
fixtures=${TZ_FIXTURES_DIR:-$root/tests/fixtures/tensorizer-2.11.1}
[ $# -gt 0 ] || { echo "usage: $0 COMMAND [ARGS...]" >&2; exit 2; }
[ -d "$fixtures" ] || { echo "with-servers: fixtures not found at $fixtures" >&2; exit 2; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/tz-servers.XXXXXX")
chmod 755 "$dir"
stop_all() {
  bash "$servers/redis.sh" stop "$dir" || true
  bash "$servers/s3.sh" stop "$dir" || true
  bash "$servers/nginx.sh" stop "$dir" || true
  rm -rf "$dir"
}
trap stop_all EXIT
trap 'exit 130' INT TERM

mkdir -p "$dir/www/fixtures"
cp "$fixtures"/* "$dir/www/fixtures/"
echo "with-servers: starting nginx, moto (S3) and redis in $dir" >&2
bash "$servers/nginx.sh" start "$dir"
bash "$servers/redis.sh" start "$dir"
bash "$servers/s3.sh" start "$dir" "$fixtures"
for f in nginx redis s3; do source "$dir/$f.env"; done
export TZ_TEST_FAULT_PROXY=$root/tests/tools/fault_proxy.py
export TZ_REQUIRE_SERVERS=1
export TZ_TEST_SERVERS_DIR=$dir
set +e
"$@"
rc=$?
set -e
exit $rc
