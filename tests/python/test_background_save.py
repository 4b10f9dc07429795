"""Saves off the caller's critical path: write_state_dict/write_module(background=True) snapshot
the tensors, return a Future at once and write on a background thread; the caller may change the
originals, writes land in call order, an error reaches the Future and close(), and a failed
background write publishes nothing."""

import os
import subprocess
import sys
import textwrap

import numpy
import pytest
import torch

from tensorizer import TensorDeserializer, TensorSerializer


def test_the_file_holds_the_tensors_as_they_were_when_the_call_returned(tmp_path):
    sd = {"w": torch.arange(1 << 20, dtype=torch.float32), "b": torch.ones(3, dtype=torch.bfloat16)}
    expected = {k: v.clone() for k, v in sd.items()}
    serializer = TensorSerializer(str(tmp_path / "m.tensors"))
    future = serializer.write_state_dict(sd, background=True)
    for v in sd.values():  # training goes on
        v.add_(1)
    assert future.result() is None
    serializer.close()
    with TensorDeserializer(tmp_path / "m.tensors", device="cpu", verify_hash=True) as d:
        assert all(torch.equal(d[k], v) for k, v in expected.items())


def test_background_and_foreground_writes_land_in_call_order(tmp_path):
    module = torch.nn.Linear(64, 32)
    with TensorSerializer(str(tmp_path / "m.tensors")) as s:
        futures = [s.write_module(module, background=True)]
        futures.append(s.write_state_dict({"extra": torch.full((5,), 7.0)}, background=True))
        s.write_tensor(9, "numpy", 2, numpy.arange(4, dtype=numpy.int16))  # a foreground write waits its turn
        futures.append(s.write_state_dict({"late": torch.zeros(2)}, background=True))
    assert [f.result() for f in futures] == [None, None, None]
    with TensorDeserializer(tmp_path / "m.tensors", device="cpu") as d:
        assert list(d.keys()) == [".weight", ".bias", "extra", "numpy", "late"]
        assert torch.equal(d[".weight"], module.weight) and torch.equal(d["extra"], torch.full((5,), 7.0))
        assert d["numpy"].tolist() == [0, 1, 2, 3]


class FailingFile:
    """A writable, seekable binary file object whose writes fail past `limit` bytes."""

    def __init__(self, limit):
        self.limit, self.pos, self.closed = limit, 0, False

    def writable(self):
        return True

    def seekable(self):
        return True

    def readable(self):
        return False

    @property
    def mode(self):
        return "wb+"

    def seek(self, pos, whence=0):
        self.pos = pos if whence == 0 else self.pos + pos
        return self.pos

    def tell(self):
        return self.pos

    def write(self, b):
        if self.pos + len(b) > self.limit:
            raise OSError("the disk is full (test)")
        self.pos += len(b)
        return len(b)

    def flush(self):
        pass

    def close(self):
        self.closed = True


def test_an_error_reaches_the_future_and_close():
    serializer = TensorSerializer(FailingFile(1 << 20))
    future = serializer.write_state_dict({"w": torch.ones(1 << 20)}, background=True)
    with pytest.raises(OSError, match="the disk is full"):
        future.result()
    with pytest.raises(OSError, match="the disk is full"):
        serializer.close()


FULL_DISK = textwrap.dedent(
    """
    import resource, signal, sys, torch
    from tensorizer import TensorSerializer
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past the limit fail with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
    serializer = TensorSerializer(sys.argv[1])
    future = serializer.write_state_dict({"w": torch.ones(1 << 20)}, background=True)
    print(type(future.exception()).__name__)
    try:
        serializer.close()
    except OSError as e:
        print("close raised", type(e).__name__)
    """
)


def test_a_failed_background_write_publishes_nothing(tmp_path):
    run = subprocess.run(
        [sys.executable, "-c", FULL_DISK, str(tmp_path / "m.tensors")], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split("\n")[:2] == ["OSError", "close raised OSError"], run.stdout
    assert os.listdir(tmp_path) == []
