"""Ctrl-C works everywhere: SIGINT during a load, an open or a save raises KeyboardInterrupt in the
caller once the engine has stopped its workers and closed its connections, leaving no thread
running and no partial output; the CLI exits with status 130.

Each case runs in a child process that would otherwise be stuck far longer than the test waits
(a mute server with a 120 s stall timeout, a file object that yields 4 KiB per 0.2 s), so a
regression shows as a timeout here rather than a slow pass."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from conftest import save_state_dict
from test_stalls import MisbehavingServer

WAIT_S = 30  # the child must be gone well before this; without interrupts it would take minutes

CHILD = textwrap.dedent(
    """
    import io, os, signal, sys, threading, time, torch
    from tensorizer import DecryptionParams, TensorDeserializer, TensorSerializer

    # Python leaves SIGINT ignored when it started so (a background job of a shell): not here.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    class Slow(io.RawIOBase):  # a file object that hands out 4 KiB every 0.2 s
        def __init__(self, data):
            self.data, self.pos = data, 0
        def readable(self): return True
        def seekable(self): return True
        def seek(self, pos, whence=0):
            self.pos = {0: pos, 1: self.pos + pos, 2: len(self.data) + pos}[whence]
            return self.pos
        def readinto(self, b):
            time.sleep(0.2)
            n = min(len(b), 4096, len(self.data) - self.pos)
            b[:n] = self.data[self.pos : self.pos + n]
            self.pos += n
            return n

    what, target = sys.argv[1], sys.argv[2]
    if what == "slow-file":
        with open(target, "rb") as f:  # read first: CPython's finalizer of a file object left to
            data = f.read()            # the GC silently drops a KeyboardInterrupt raised in it
    print("ready", flush=True)
    try:
        if what == "open":
            TensorDeserializer(target)
        elif what == "slow-file":
            TensorDeserializer(Slow(data), verify_hash=True)
        elif what == "costly-passphrase":
            key = DecryptionParams.from_string("pass", max_opslimit=4000, max_memlimit=64 << 20)
            TensorDeserializer(target, encryption=key)
        elif what == "save":
            while True:
                with TensorSerializer(target) as s:  # an exception inside aborts the save
                    s.write_state_dict({f"t{i}": torch.ones(1 << 24) for i in range(8)})
                os.unlink(target)
    except KeyboardInterrupt:
        print("interrupted", threading.active_count(), flush=True)
        sys.exit(0)
    print("finished", flush=True)
    """
)


def interrupt(what, target, started, env=None):
    """Runs CHILD(what, target); once `started()` holds, sends SIGINT and returns its stdout."""
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, what, str(target)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TENSORIZER_STALL_TIMEOUT": "120", **(env or {})},
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + WAIT_S
        while not started() and time.monotonic() < deadline:
            time.sleep(0.05)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=WAIT_S)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    assert "Exception ignored" not in err and "lost sys.stderr" not in err, err
    return out.strip()


def test_ctrl_c_ends_an_open_waiting_on_a_mute_server():
    server = MisbehavingServer(b"", "mute")
    try:
        assert interrupt("open", server.url, server.requested.is_set) == "interrupted 1"
    finally:
        server.close()


def test_ctrl_c_ends_a_load_from_a_slow_file_object(tmp_path):
    path = tmp_path / "model.tensors"
    save_state_dict(path, {"w": torch.arange(1 << 20, dtype=torch.float32)})
    start = time.monotonic()
    assert interrupt("slow-file", path, lambda: time.monotonic() > start + 2) == "interrupted 1"


def test_ctrl_c_ends_a_load_waiting_on_a_costly_key_derivation(tmp_path):
    """Argon2id cannot stop; the load stops waiting for it. The file asks for about 100 s of it."""
    import struct

    from tensorizer import EncryptionParams, TensorSerializer

    path = tmp_path / "model.tensors"
    cheap = EncryptionParams.from_string("pass", opslimit=1, memlimit=8192)
    with TensorSerializer(str(path), encryption=cheap) as s:
        s.write_state_dict({"w": torch.ones(16)})
    data = path.read_bytes()
    kdf = b"\x01\x00\x01\x00" + struct.pack("<QQ", 1, 8192)  # crypt info chunk type 1 (format.md)
    assert data.count(kdf) == 1
    path.write_bytes(data.replace(kdf, b"\x01\x00\x01\x00" + struct.pack("<QQ", 4000, 64 << 20)))
    start = time.monotonic()
    assert interrupt("costly-passphrase", path, lambda: time.monotonic() > start + 1) == "interrupted 1"


def test_ctrl_c_during_saves_leaves_no_partial_output(tmp_path):
    target = tmp_path / "out.tensors"
    start = time.monotonic()
    assert interrupt("save", target, lambda: time.monotonic() > start + 4) == "interrupted 1"
    # Nothing, or (Ctrl-C between a save's close and the unlink) one whole file; no temp file.
    left = os.listdir(tmp_path)
    assert left in ([], ["out.tensors"]), left
    if left:
        from tensorizer import TensorDeserializer

        d = TensorDeserializer(target)
        assert sorted(d.keys()) == sorted(f"t{i}" for i in range(8))
        assert all(torch.equal(d[k], torch.ones(1 << 24)) for k in d.keys())


def cli():
    import shutil

    return shutil.which("tensorizer")


@pytest.mark.skipif(cli() is None, reason="the tensorizer CLI is not on PATH")
def test_the_cli_exits_130_on_ctrl_c_and_leaves_no_output(tmp_path):
    server = MisbehavingServer(b"", "mute")
    dest = tmp_path / "copy.tensors"
    try:
        child = subprocess.Popen(
            [cli(), "cp", server.url, str(dest)],
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "TENSORIZER_STALL_TIMEOUT": "120"},
        )
        assert server.requested.wait(WAIT_S)
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=WAIT_S)
        assert child.returncode == 130, err
        assert "interrupted" in err
        assert os.listdir(tmp_path) == []
    finally:
        server.close()
