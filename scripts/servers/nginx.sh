#!/usr/bin/env bash
# nginx for the transport tests: serves DIR/www over HTTP, HTTPS (certificate signed by a CA the
# script makes), HTTP without range support (max_ranges 0) and a caching proxy in front of the
# HTTP server (X-Cache-Status: MISS, then HIT) and a server that redirects (302 to the HTTP server,
# 301 to the HTTPS one, a loop, a non-HTTP scheme), on free ports of 127.0.0.1.
#   nginx.sh start DIR   -> writes DIR/nginx.env (TZ_TEST_HTTP_URL, TZ_TEST_HTTPS_URL,
#                           TZ_TEST_HTTP_NORANGE_URL, TZ_TEST_HTTP_CACHE_URL,
#                           TZ_TEST_HTTP_REDIRECT_URL, TZ_TEST_HTTP_ROOT,
#                           TZ_TEST_HTTP_ACCESS_LOG (requests to TZ_TEST_HTTP_URL),
#                           TZ_TEST_S3_FAST_ENDPOINT and TZ_TEST_S3_FAST_ROOT (path-style S3 reads
#                           of files under that root, for the benchmarks), TZ_TEST_CA_FILE,
#                           TZ_TEST_CA_DIR)
#   nginx.sh stop DIR
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
source "$here/lib.sh"
cmd=${1:?usage: nginx.sh start|stop DIR}
dir=$(cd "${2:?usage: nginx.sh start|stop DIR}" && pwd)
d=$dir/nginx

if [ "$cmd" = stop ]; then
  stop_pidfile "$d/nginx.pid"
  exit 0
fi

mkdir -p "$d/tmp" "$d/ca-dir" "$dir/www"
# A throwaway CA and a server certificate for 127.0.0.1/localhost signed by it.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=tensorizer test CA" \
  -keyout "$d/ca.key" -out "$d/ca.pem" -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj "/CN=127.0.0.1" -keyout "$d/server.key" \
  -out "$d/server.csr" 2>/dev/null
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' > "$d/ext.cnf"
openssl x509 -req -in "$d/server.csr" -CA "$d/ca.pem" -CAkey "$d/ca.key" -CAcreateserial -days 2 \
  -extfile "$d/ext.cnf" -out "$d/server.pem" 2>/dev/null
cp "$d/ca.pem" "$d/ca-dir/ca.pem"
openssl rehash "$d/ca-dir" 2>/dev/null || c_rehash "$d/ca-dir" >/dev/null

http_port=$(free_port); https_port=$(free_port); norange_port=$(free_port); cache_port=$(free_port)
s3fast_port=$(free_port); redirect_port=$(free_port)
mkdir -p "$dir/s3fast"
user_line=""
[ "$(id -u)" -eq 0 ] && user_line="user root;"
cat > "$d/nginx.conf" <<CONF
$user_line
worker_processes 2;
daemon off;
pid $d/nginx.pid;
error_log $d/error.log warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_temp_path $d/tmp/body;
  proxy_temp_path $d/tmp/proxy;
  fastcgi_temp_path $d/tmp/fastcgi;
  uwsgi_temp_path $d/tmp/uwsgi;
  scgi_temp_path $d/tmp/scgi;
  default_type application/octet-stream;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  keepalive_timeout 120s;
  server { listen 127.0.0.1:$http_port; root $dir/www; access_log $d/access.log; }
  server {
    listen 127.0.0.1:$https_port ssl;
    ssl_certificate $d/server.pem;
    ssl_certificate_key $d/server.key;
    root $dir/www;
  }
  server { listen 127.0.0.1:$norange_port; root $dir/www; max_ranges 0; }
  # An S3 read endpoint at wire speed for the benchmarks: path-style GETs (/BUCKET/KEY) of
  # DIR/s3fast/BUCKET/KEY, signatures ignored, ranges served as nginx serves them.
  server { listen 127.0.0.1:$s3fast_port; root $dir/s3fast; }
  # Redirects, as CDNs and model hubs answer: /X -> the HTTP server's /X (302), /https/X -> the
  # HTTPS server's /X (301), /loop/X -> itself, /ftp/X -> a scheme a load must not follow.
  server {
    listen 127.0.0.1:$redirect_port;
    location / { return 302 http://127.0.0.1:$http_port\$request_uri; }
    location ~ ^/https(/.*)\$ { return 301 https://127.0.0.1:$https_port\$1; }
    location /loop/ { return 302 \$request_uri; }
    location ~ ^/ftp(/.*)\$ { return 302 ftp://127.0.0.1:$http_port\$1; }
  }
  proxy_cache_path $d/cache levels=1 keys_zone=tz_cache:1m max_size=4g;
  server {
    listen 127.0.0.1:$cache_port;
    location / {
      proxy_pass http://127.0.0.1:$http_port;
      proxy_cache tz_cache;
      proxy_cache_valid 200 206 10m;
      add_header X-Cache-Status \$upstream_cache_status always;
    }
  }
}
CONF
nginx -p "$d" -c "$d/nginx.conf" -e "$d/error.log" > "$d/stdout.log" 2>&1 &
pid=$!
for port in $http_port $https_port $norange_port $cache_port $s3fast_port $redirect_port; do
  wait_port "$port" 20 "$pid" || { cat "$d/error.log" "$d/stdout.log" >&2 || true; exit 1; }
done
echo "$pid" > "$d/nginx.pid"
cat > "$dir/nginx.env" <<ENV
export TZ_TEST_HTTP_URL=http://127.0.0.1:$http_port
export TZ_TEST_HTTPS_URL=https://127.0.0.1:$https_port
export TZ_TEST_HTTP_NORANGE_URL=http://127.0.0.1:$norange_port
export TZ_TEST_HTTP_CACHE_URL=http://127.0.0.1:$cache_port
export TZ_TEST_HTTP_REDIRECT_URL=http://127.0.0.1:$redirect_port
export TZ_TEST_HTTP_ROOT=$dir/www
export TZ_TEST_HTTP_ACCESS_LOG=$d/access.log
export TZ_TEST_S3_FAST_ENDPOINT=http://127.0.0.1:$s3fast_port
export TZ_TEST_S3_FAST_ROOT=$dir/s3fast
export TZ_TEST_CA_FILE=$d/ca.pem
export TZ_TEST_CA_DIR=$d/ca-dir
ENV
