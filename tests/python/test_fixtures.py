"""Every file in tests/fixtures (written by the reference) loads with exact bytes, names,
types and dtypes through each read API: the Mapping view, tree(), read_tensors,
read_numpy_arrays and load_into_module."""

import pytest
import torch

from conftest import decryption_for, fixture_files, manifest_name, sha256, tensor_bytes
from tensorizer import TensorDeserializer, TensorType

FILES = fixture_files()
IDS = [f"{p.parent.name}/{p.name}" for p, _ in FILES]


def open_fixture(path, info, **kwargs):
    return TensorDeserializer(str(path), encryption=decryption_for(path, info), verify_hash=True, **kwargs)


def check_tensor(tensor, expected):
    assert isinstance(tensor, torch.nn.Parameter)
    assert str(tensor.dtype) == expected["torch_dtype"]
    assert list(tensor.shape) == expected["shape"]
    assert tensor.requires_grad == (tensor.dtype.is_floating_point or tensor.dtype.is_complex)
    data = tensor_bytes(tensor)
    if expected["meta"]:
        assert len(data) == expected_size(expected)
        assert not any(data), "meta tensors load as zeros"
    else:
        assert len(data) == expected["nbytes"]
        assert sha256(data) == expected["sha256"]


def expected_size(t):
    """Bytes of the loaded tensor (meta tensors included)."""
    n = 1
    for d in t["shape"]:
        n *= d
    return n * getattr(torch, t["torch_dtype"].split(".", 1)[1]).itemsize


def lookup(mapping, name):
    if isinstance(name, str):
        return mapping[name]
    for part in name:
        mapping = mapping[part]
    return mapping


def test_fixture_set_present():
    assert FILES, "no fixtures found under tests/fixtures"


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_header_and_index(path, info):
    with open_fixture(path, info, lazy_load=True) as d:
        assert d._version == info["version"]
        names = [manifest_name(t["name"]) for t in info["tensors"]]
        assert [p.normalize_() for p in d._metadata] == names
        assert [int(e.type) for e in d._metadata.values()] == [t["type"] for t in info["tensors"]]
        assert d.total_tensor_bytes == sum(expected_size(t) for t in info["tensors"])
        assert d.total_file_bytes == sum(0 if t["meta"] else t["nbytes"] for t in info["tensors"])


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
@pytest.mark.parametrize("lazy", [False, True], ids=["eager", "lazy"])
def test_mapping_view(path, info, lazy):
    with open_fixture(path, info, lazy_load=lazy) as d:
        top = []
        for t in info["tensors"]:
            key = t["name"] if isinstance(t["name"], str) else t["name"][0]
            if key not in top:
                top.append(key)
        assert list(d.keys()) == top
        assert len(d) == len(top)
        for t in info["tensors"]:
            check_tensor(lookup(d, t["name"]), t)
        if not lazy:
            assert d.total_tensor_bytes == sum(0 if t["meta"] else t["nbytes"] for t in info["tensors"])


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_tree(path, info):
    with open_fixture(path, info) as d:
        tree = d.tree()
        for t in info["tensors"]:
            name = t["name"]
            if isinstance(name, str):
                check_tensor(tree[name], t)
            else:
                node = tree
                for part in name:
                    node = node[part]  # lists index by position, dicts by key
                check_tensor(node, t)
                check_tensor(d.tree(name), t)


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_read_tensors(path, info):
    with open_fixture(path, info, lazy_load=True) as d:
        got = list(d.read_tensors())
    assert [g[2] for g in got] == [manifest_name(t["name"]) for t in info["tensors"]]
    for (module_idx, ttype, _name, tensor), t in zip(got, info["tensors"]):
        assert module_idx == t["module_idx"]
        assert ttype == t["type"] and isinstance(ttype, TensorType)
        check_tensor(tensor, t)


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_read_numpy_arrays(path, info):
    with open_fixture(path, info, lazy_load=True) as d:
        got = list(d.read_numpy_arrays(allow_raw_data=True))
    assert [g[2] for g in got] == [manifest_name(t["name"]) for t in info["tensors"]]
    for (module_idx, ttype, _name, array, opaque, torch_dtype), t in zip(got, info["tensors"]):
        assert module_idx == t["module_idx"] and ttype == t["type"]
        assert list(array.shape) == t["shape"]
        assert opaque == (t["torch_dtype"] in ("torch.bfloat16", "torch.complex32") or "float8" in t["torch_dtype"])
        assert torch_dtype == (t["torch_dtype"] if opaque else None)
        data = array.tobytes()
        if t["meta"]:
            assert not any(data)
        else:
            assert sha256(data) == t["sha256"]


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_load_into_module(path, info):
    state_dict_file = any(t["type"] == TensorType.STATE_DICT for t in info["tensors"])
    module = torch.nn.Module()
    # Build the empty module tree the names need.
    for t in info["tensors"]:
        if not isinstance(t["name"], str):
            continue
        parent = module
        for part in t["name"].split(".")[:-1]:
            if not part:
                continue
            if not hasattr(parent, part):
                parent.add_module(part, torch.nn.Module())
            parent = getattr(parent, part)
    with open_fixture(path, info, lazy_load=True) as d:
        if state_dict_file:
            with pytest.raises(NotImplementedError, match="write_state_dict"):
                d.load_into_module(module)
            return
        assert d.load_into_module(module) == len(info["tensors"])
    params = dict(module.named_parameters())
    buffers = dict(module.named_buffers())
    for t in info["tensors"]:
        name = t["name"].lstrip(".")
        if t["type"] == TensorType.PARAM:
            check_tensor(params[name], t)
        else:
            tensor = buffers[name]
            assert not isinstance(tensor, torch.nn.Parameter)
            assert sha256(tensor_bytes(tensor)) == t["sha256"]


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_bytes_and_file_objects(path, info):
    """The same file through an open file and a BytesIO gives the same tensors."""
    import io

    data = path.read_bytes()
    for source in (open(path, "rb"), io.BytesIO(data)):
        with TensorDeserializer(source, encryption=decryption_for(path, info), verify_hash=True) as d:
            for t in info["tensors"]:
                check_tensor(lookup(d, t["name"]), t)
        assert source.closed  # the reference closes the file it was given


@pytest.mark.parametrize("path,info", FILES, ids=IDS)
def test_cli_verify(path, info):
    """The `tensorizer` command that pip installs verifies every fixture."""
    import shutil
    import subprocess

    exe = shutil.which("tensorizer")
    if exe is None:
        pytest.skip("tensorizer command not on PATH (package not installed with pip)")
    import os

    args = [exe, "verify", str(path)]
    env = dict(os.environ)
    enc = info.get("encryption")
    if enc and "key_file" in enc:
        args += ["--key-file", str(path.parent / enc["key_file"])]
    elif enc:
        env["TZ_TEST_PASSPHRASE"] = enc["passphrase"]
        args += ["--passphrase-env", "TZ_TEST_PASSPHRASE"]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
