"""Loads release the GIL for their whole duration, and URIs go straight to the engine.

The source here is an HTTP server written in Python, running in a thread of the SAME process
(on 127.0.0.1). Every byte the engine reads must be served by Python code, so a load that held
the GIL would deadlock; the load runs in a child process with a time limit so that failure shows
as a failed test, not a hang. The test times nothing.
"""

import subprocess
import sys
import textwrap

import pytest
import torch

from tensorizer import TensorSerializer

SERVER_AND_LOAD = textwrap.dedent(
    r"""
    import http.server, os, re, sys, threading, torch
    from tensorizer import TensorDeserializer, stream_io

    root, expected_path = sys.argv[1], sys.argv[2]

    class RangeHandler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args):
            pass
        def _send(self, body_too):
            path = os.path.join(root, self.path.lstrip("/"))
            if not os.path.isfile(path):
                self.send_error(404)
                return
            size = os.path.getsize(path)
            begin, end = 0, size - 1
            m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if m:
                begin = int(m.group(1))
                end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {begin}-{end}/{size}")
            else:
                self.send_response(200)
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(end - begin + 1))
            self.end_headers()
            if body_too:
                with open(path, "rb") as f:
                    f.seek(begin)
                    left = end - begin + 1
                    while left:
                        chunk = f.read(min(left, 1 << 16))  # Python code runs for every piece
                        self.wfile.write(chunk)
                        left -= len(chunk)
        def do_GET(self):
            self._send(True)
        def do_HEAD(self):
            self._send(False)

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), RangeHandler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/model.tensors"

    expected = torch.load(expected_path)
    for source in (url, stream_io.open_stream(url, "rb")):
        with TensorDeserializer(source, verify_hash=True, num_readers=2) as d:
            assert d.keys() == expected.keys()
            for k, v in expected.items():
                assert torch.equal(d[k], v), k
    print("OK", len(expected))
    server.shutdown()
    """
)


def test_http_load_releases_gil(tmp_path):
    sd = {f"layer{i}": torch.randn(256, 1024) for i in range(8)}  # 8 MiB over HTTP
    with TensorSerializer(str(tmp_path / "model.tensors")) as s:
        s.write_state_dict(sd)
    torch.save(sd, tmp_path / "expected.pt")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", SERVER_AND_LOAD, str(tmp_path), str(tmp_path / "expected.pt")],
            capture_output=True,
            text=True,
            timeout=180,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("loading from an in-process Python HTTP server hung: the GIL was held during the load")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "OK 8"


def test_python_file_object_sink_releases_gil(tmp_path):
    """Writing to a file object without a descriptor calls back into Python from engine threads."""
    import io

    class Recorder(io.RawIOBase):
        def __init__(self):
            self.buf = bytearray()
            self.pos = 0
            self.calls = 0

        def writable(self):
            return True

        def seekable(self):
            return True

        def seek(self, pos, whence=0):
            self.pos = pos
            return pos

        def write(self, b):
            self.calls += 1
            b = bytes(b)
            end = self.pos + len(b)
            if len(self.buf) < end:
                self.buf.extend(bytes(end - len(self.buf)))
            self.buf[self.pos : end] = b
            self.pos = end
            return len(b)

    sd = {f"t{i}": torch.randn(1000) for i in range(20)}
    rec = Recorder()
    s = TensorSerializer(rec, limit_cpu_concurrency=2)
    s.write_state_dict(sd)
    s.close()
    assert rec.calls > 20 and rec.closed
    from tensorizer import TensorDeserializer

    with TensorDeserializer(io.BytesIO(bytes(rec.buf)), verify_hash=True) as d:
        for k, v in sd.items():
            assert torch.equal(d[k], v)
