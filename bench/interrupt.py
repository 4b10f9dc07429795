"""How long Ctrl-C takes to end a load: SIGINT to a child process in the middle of a load, timed
from the signal to the KeyboardInterrupt the child catches (one monotonic clock for both).

    python bench/interrupt.py FILE.tensors [--rounds 5]

Cases: a local load of FILE with verify_hash (signal 0.3 s in), and an open against a server that
accepts the request and never answers (signal once the request arrived). Prints median, min-max.
"""

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time

CHILD = r"""
import signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from tensorizer import TensorDeserializer
print("ready", flush=True)
try:
    while True:
        TensorDeserializer(sys.argv[1], verify_hash=True, lazy_load=False)
except KeyboardInterrupt:
    print(time.monotonic(), flush=True)
"""


def mute_server():
    sock = socket.create_server(("127.0.0.1", 0))
    requested = threading.Event()

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            conn.recv(65536)
            requested.set()

    threading.Thread(target=serve, daemon=True).start()
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}/x.tensors", requested


def one(target, started):
    env = {**os.environ, "TENSORIZER_STALL_TIMEOUT": "120"}
    child = subprocess.Popen([sys.executable, "-c", CHILD, target], stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout.readline().strip() == "ready"
    started()
    sent = time.monotonic()
    child.send_signal(signal.SIGINT)
    caught = float(child.stdout.readline())
    child.wait(timeout=60)
    return caught - sent


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    sock, url, requested = mute_server()
    rows = {"local load, verify_hash": [], "stalled HTTP open": []}
    for _ in range(args.rounds):
        rows["local load, verify_hash"].append(one(args.file, lambda: time.sleep(0.3 + 0.5 * (time.time() % 1))))
        requested.clear()
        rows["stalled HTTP open"].append(one(url, lambda: requested.wait(30)))
    sock.close()
    for name, xs in rows.items():
        ms = sorted(x * 1000 for x in xs)
        print(f"{name:26s} median {statistics.median(ms):6.0f} ms  (min {ms[0]:.0f}, max {ms[-1]:.0f})")


if __name__ == "__main__":
    main()
