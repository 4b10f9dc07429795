"""File names are any bytes Linux allows: names that are not UTF-8 save, load and appear in messages
(escaped), given as bytes or as the str os.fsdecode makes of them; a NUL byte, which the system
calls would stop at (another file), is refused as open() refuses it."""

import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tensorizer import TensorDeserializer, TensorSerializer, stream_io
from tensorizer.safetensors import load_file, save_file

STATE = {"a": torch.arange(10, dtype=torch.int32), "b": torch.full((3, 4), 2.5)}
NOT_UTF8 = b"caf\xe9-\xff.tensors"


def check(loaded):
    assert set(loaded.keys()) == set(STATE)
    for name, tensor in STATE.items():
        assert torch.equal(loaded[name], tensor)


@pytest.mark.parametrize("as_str", [False, True], ids=["bytes", "fsdecoded-str"])
def test_a_name_that_is_not_utf8_saves_and_loads(tmp_path, as_str):
    raw = os.path.join(os.fsencode(tmp_path), NOT_UTF8)
    name = os.fsdecode(raw) if as_str else raw
    s = TensorSerializer(name)
    s.write_state_dict(STATE)
    s.close()
    assert os.listdir(os.fsencode(tmp_path)) == [NOT_UTF8]  # the very bytes, no other file
    with TensorDeserializer(name, device="cpu") as d:
        check(d)
        assert d._file_label == os.fsdecode(raw)  # the str that opens the same file
    with TensorDeserializer(name, device="cpu", lazy_load=True) as d:
        check(d)
    with stream_io.open_stream(os.fsdecode(raw), "rb") as f:
        with TensorDeserializer(f, device="cpu") as d:
            check(d)


def test_safetensors_name_that_is_not_utf8(tmp_path):
    raw = os.path.join(os.fsencode(tmp_path), b"m\xe9.safetensors")
    save_file(STATE, os.fsdecode(raw))
    check(load_file(raw))
    check(load_file(os.fsdecode(raw)))


def test_a_missing_name_that_is_not_utf8_is_named_escaped(tmp_path):
    raw = os.path.join(os.fsencode(tmp_path), b"gone\xe9.tensors")
    for name in (raw, os.fsdecode(raw)):
        with pytest.raises(FileNotFoundError, match=r"gone\\xe9\.tensors"):
            TensorDeserializer(name, device="cpu")


@pytest.mark.parametrize(
    "name", ["x\0y.tensors", b"x\0y.tensors", os.fsdecode(b"x\xe9\0y.tensors")], ids=["str", "bytes", "not-utf8"]
)
def test_a_nul_byte_in_a_name_is_refused(tmp_path, name):
    target = os.path.join(os.fsencode(tmp_path) if isinstance(name, bytes) else str(tmp_path), name)
    (tmp_path / "x").write_bytes(b"")  # what the system calls would open, stopping at the NUL
    with pytest.raises(ValueError, match="null byte"):
        TensorDeserializer(target, device="cpu")
    with pytest.raises(ValueError, match="null byte"):
        TensorSerializer(target)
    assert sorted(os.listdir(tmp_path)) == ["x"]  # nothing written


def test_cli_json_names_a_file_that_is_not_utf8_as_os_fsdecode_does(tmp_path):
    raw = os.path.join(os.fsencode(tmp_path), NOT_UTF8)
    with TensorSerializer(raw) as s:
        s.write_state_dict(STATE)
    run = subprocess.run([shutil.which("tensorizer"), "inspect", "--json", raw], capture_output=True)
    assert run.returncode == 0, run.stderr
    shown = json.loads(run.stdout)  # valid JSON although the name is not UTF-8
    assert shown["uri"] == os.fsdecode(raw) and os.path.exists(shown["uri"])
    assert [t["name"] for t in shown["tensors"]] == list(STATE)


def test_a_symbolic_link_is_written_through_and_a_directory_refused(tmp_path):
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "abc").write_bytes(b"old")
    link = tmp_path / "model.tensors"
    link.symlink_to("blobs/abc")  # as a Hugging Face snapshot links its blobs
    with TensorSerializer(str(link)) as s:
        s.write_state_dict(STATE)
    assert link.is_symlink() and os.readlink(link) == "blobs/abc"
    with TensorDeserializer(tmp_path / "blobs" / "abc", device="cpu") as d:
        check(d)
    with pytest.raises(ValueError, match="is a directory"):
        TensorSerializer(str(tmp_path / "blobs"))
    assert sorted(os.listdir(tmp_path / "blobs")) == ["abc"]


def test_dev_stdin_fed_by_a_pipe_loads(tmp_path):
    path = tmp_path / "m.tensors"
    with TensorSerializer(str(path)) as s:
        s.write_state_dict(STATE)
    script = (
        "import torch, sys\n"
        "from tensorizer import TensorDeserializer\n"
        "d = TensorDeserializer('/dev/stdin', device='cpu', verify_hash=True)\n"
        "print(sorted(d.keys()), int(d['a'].sum()), float(d['b'].sum()))\n"
    )
    with open(path, "rb") as f:
        cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)  # stdin is a pipe, not the file
        run = subprocess.run([sys.executable, "-c", script], stdin=cat.stdout, capture_output=True, text=True)
        cat.stdout.close()
        cat.wait()
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["['a',", "'b']", "45", "30.0"]


@pytest.mark.parametrize("given", ["path", "file object"])
def test_an_endless_pipe_is_an_error_naming_the_bound(monkeypatch, given):
    monkeypatch.setenv("TENSORIZER_PIPE_MAX_GIB", "0.001")  # about 1 MiB
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)  # never ends
    try:
        source = f"/proc/self/fd/{yes.stdout.fileno()}" if given == "path" else yes.stdout
        with pytest.raises(ValueError, match=r"delivered more than 1073741 bytes .*TENSORIZER_PIPE_MAX_GIB"):
            TensorDeserializer(source, device="cpu")
    finally:
        yes.kill()
        yes.wait()
