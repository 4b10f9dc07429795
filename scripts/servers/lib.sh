# Helpers shared by the test-server scripts (sourced, not run): free ports, waiting for a port.
# Everything listens on 127.0.0.1 only.

# Prints a TCP port on 127.0.0.1 that is free right now.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# wait_port PORT SECONDS [PID]: waits until something accepts on 127.0.0.1:PORT; fails early if PID died.
wait_port() {
  local port=$1 secs=$2 pid=${3:-} i
  for ((i = 0; i < secs * 10; i++)); do
    if python3 -c "import socket,sys; s=socket.socket(); s.settimeout(0.2); sys.exit(s.connect_ex(('127.0.0.1',$port)))" 2>/dev/null; then
      return 0
    fi
    if [ -n "$pid" ] && ! kill -0 "$pid" 2>/dev/null; then
      echo "servers: process $pid exited before listening on port $port" >&2
      return 1
    fi
    sleep 0.1
  done
  echo "servers: nothing listens on 127.0.0.1:$port after ${secs}s" >&2
  return 1
}

# stop_pidfile FILE: stops the process whose id FILE holds (TERM, then KILL), if it still runs.
stop_pidfile() {
  local f=$1 pid i
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 50; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}
