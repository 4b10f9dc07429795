"""Deadlines a user controls: a server that trickles bytes or goes silent after its headers fails a
load once the stall timeout (keyword or $TENSORIZER_STALL_TIMEOUT) is spent, naming the URI and the
offset, instead of running on. The server is real (a socket on loopback); each load runs in a child
process so that a regression shows as a timeout of this test, not a hung suite."""

import socket
import subprocess
import sys
import threading
import time

import pytest
import torch

from conftest import save_state_dict
from tensorizer import TensorDeserializer, stream_io

# A load that ignored the stall timeout would take far longer than this (the file is ~270 KB at
# 100 B/s); a load that honours it fails in a few seconds.
CHILD_LIMIT_S = 60


class MisbehavingServer:
    """Answers ranged GETs of `body`: the first `fast_bytes` of every response at once, then either
    100 bytes per second ("trickle") or nothing at all ("silent"); or reads requests and answers
    nothing, not even headers ("mute"). `requested` is set once a request has arrived."""

    def __init__(self, body: bytes, mode: str, fast_bytes: int = 64):
        self.body, self.mode, self.fast_bytes = body, mode, fast_bytes
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/model.tensors"
        self.stop = threading.Event()
        self.requested = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn):
        with conn:
            try:
                while not self.stop.is_set():
                    request = b""
                    while b"\r\n\r\n" not in request:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        request += chunk
                    self.requested.set()
                    if self.mode == "mute":
                        self.stop.wait()
                        return
                    first, last = 0, len(self.body) - 1
                    for line in request.decode("latin-1").split("\r\n"):
                        if line.lower().startswith("range: bytes="):
                            a, b = line.split("=", 1)[1].split("-")
                            first, last = int(a), min(int(b or len(self.body) - 1), len(self.body) - 1)
                    part = self.body[first : last + 1]
                    conn.sendall(
                        b"HTTP/1.1 206 Partial Content\r\n"
                        + f"Content-Range: bytes {first}-{last}/{len(self.body)}\r\n".encode()
                        + f"Content-Length: {len(part)}\r\n\r\n".encode()
                        + part[: self.fast_bytes]
                    )
                    rest = part[self.fast_bytes :]
                    while rest and not self.stop.is_set():
                        if self.mode == "trickle":
                            conn.sendall(rest[:10])
                            rest = rest[10:]
                        time.sleep(0.1)
            except OSError:
                return

    def close(self):
        self.stop.set()
        self.sock.close()


@pytest.fixture
def model_bytes(tmp_path):
    path = save_state_dict(tmp_path / "m.tensors", {"w": torch.arange(1000, dtype=torch.float32)})
    return path.read_bytes()


def load_in_child(url: str, env_stall: str = "", keyword: str = "") -> subprocess.CompletedProcess:
    code = (
        "import sys, tensorizer\n"
        "try:\n"
        f"    tensorizer.TensorDeserializer(sys.argv[1], device='cpu'{keyword})\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
        "    sys.exit(3)\n"
    )
    env = {"PATH": "/usr/bin:/bin", "TENSORIZER_STALL_TIMEOUT": env_stall}
    return subprocess.run(
        [sys.executable, "-c", code, url], capture_output=True, text=True, timeout=CHILD_LIMIT_S, env=env
    )


@pytest.mark.parametrize("mode", ["trickle", "silent"])
@pytest.mark.parametrize("how", ["environment", "keyword"])
def test_a_stalled_server_fails_the_load_naming_uri_and_offset(model_bytes, mode, how):
    server = MisbehavingServer(model_bytes, mode)
    try:
        if how == "environment":
            done = load_in_child(server.url, env_stall="1")
        else:
            done = load_in_child(server.url, keyword=", stall_timeout=1, connect_timeout=2")
    finally:
        server.close()
    assert done.returncode == 3, done.stderr
    message = done.stdout
    assert server.url in message
    assert "gave up at offset" in message
    assert "too slow" in message.lower() or "timed out" in message.lower() or "timeout" in message.lower()


def test_timeouts_are_checked(monkeypatch):
    with pytest.raises(ValueError, match="stall_timeout must be greater than 0"):
        TensorDeserializer("http://127.0.0.1:1/x", stall_timeout=0)
    with pytest.raises(TypeError, match="connect_timeout"):
        stream_io.open_stream("http://127.0.0.1:1/x", connect_timeout="10")
    monkeypatch.setenv("TENSORIZER_STALL_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="TENSORIZER_STALL_TIMEOUT must be a number of seconds"):
        TensorDeserializer("http://127.0.0.1:1/x")


def test_a_deadline_ends_the_whole_load_with_a_timeout_error_naming_the_uri(monkeypatch):
    monkeypatch.setenv("TENSORIZER_STALL_TIMEOUT", "600")  # only the deadline can end it
    server = MisbehavingServer(b"", "mute")
    try:
        with pytest.raises(TimeoutError) as e:
            TensorDeserializer(server.url, deadline=0.5)
        assert str(e.value).endswith(f"loading '{server.url}' did not finish within its deadline of 0.5 s")
        with pytest.raises(ValueError, match="deadline must be a number of seconds"):
            TensorDeserializer(server.url, deadline=0)
    finally:
        server.close()
