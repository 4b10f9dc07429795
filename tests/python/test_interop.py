"""Interoperability with the reference tensorizer 2.12.1 (run from .venv-ref as a subprocess):
files it writes load in this package, and files this package writes load in it with
verify_hash=True, with identical bytes, dtypes, shapes and tensor types."""

import json

import numpy
import pytest
import torch

from interop_data import DTYPES, InteropModule, describe, filled_module, key_name, patterned
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer, TensorType

pytestmark = pytest.mark.slow


def our_listing(path, encryption=None):
    out = {}
    with TensorDeserializer(str(path), verify_hash=True, device="cpu", encryption=encryption, lazy_load=True) as d:
        for module_idx, ttype, name, tensor in d.read_tensors():
            entry = describe(tensor, ttype)
            entry["module_idx"] = module_idx
            out[key_name(name)] = entry
        out["__version__"] = d._version
    return out


def without(listing, *keys):
    return {k: {f: v for f, v in e.items() if f not in keys} for k, e in listing.items() if not k.startswith("__")}


@pytest.fixture(scope="module")
def reference_files(reference, tmp_path_factory):
    directory = tmp_path_factory.mktemp("ref-written")
    return directory, reference("write", directory)


def decryption_for(spec):
    if spec is None:
        return None
    if "key_hex" in spec:
        return DecryptionParams.from_key(bytes.fromhex(spec["key_hex"]))
    return DecryptionParams.from_string(spec["passphrase"])


@pytest.mark.parametrize(
    "name",
    ["dtypes.tensors", "nested.tensors", "module.tensors", "meta.tensors", "enc_key.tensors", "enc_pass.tensors"],
)
def test_reference_written_files_load(reference_files, name):
    directory, manifest = reference_files
    info = manifest[name]
    listing = our_listing(directory / name, decryption_for(info["encryption"]))
    source_fields = ("module_idx", "param", "requires_grad")
    assert without(listing, *source_fields) == without(info["tensors"], *source_fields)
    for key, entry in without(listing).items():
        dtype = getattr(torch, entry["dtype"].split(".")[1])
        assert entry["param"] and entry["requires_grad"] == (dtype.is_floating_point or dtype.is_complex), key


def test_reference_written_dtypes_cover_every_dtype(reference_files):
    _, manifest = reference_files
    dtypes = {e["dtype"] for e in manifest["dtypes.tensors"]["tensors"].values()}
    assert {f"torch.{n}" for n in DTYPES} <= dtypes


def test_reference_written_module_loads_into_module(reference_files):
    directory, manifest = reference_files
    m = InteropModule()
    with TensorDeserializer(str(directory / "module.tensors"), verify_hash=True) as d:
        assert d.load_into_module(m) == len(manifest["module.tensors"]["tensors"])
    expected = filled_module(5)
    for (name, a), (_, b) in zip(m.state_dict(keep_vars=True).items(), expected.state_dict(keep_vars=True).items()):
        assert torch.equal(a, b), name
    assert torch.equal(m.scratch, expected.scratch)


def test_reference_written_module_indices(reference_files):
    directory, _ = reference_files
    listing = our_listing(directory / "module.tensors")
    modules = [n for n, _ in InteropModule().named_modules()]
    for name, entry in listing.items():
        if name.startswith("__"):
            continue
        owner = name.rpartition(".")[0]
        assert entry["module_idx"] == modules.index(owner), name


# -- files we write, read by the reference --------------------------------------------------


def write_ours(directory):
    files = {}

    sd = {f"dt.{n}": patterned(getattr(torch, n), (3, 5), i) for i, n in enumerate(DTYPES)}
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 4)
    sd["noncontig"] = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()
    base = torch.arange(40, dtype=torch.float64)
    sd["shared.a"], sd["shared.b"] = base[3:13], base[10:30].view(4, 5)
    sd["long"] = patterned(torch.float32, (1 << 20,), 77)  # 4 MiB: aligned differently
    with TensorSerializer(str(directory / "dtypes.tensors")) as s:
        s.write_state_dict(sd)
    files["dtypes.tensors"] = ({k: describe(v.contiguous(), TensorType.STATE_DICT) for k, v in sd.items()}, None)

    nested = {
        "model": {"layers": [{"w": patterned(torch.float32, (2, 3), 1)}, {"w": patterned(torch.bfloat16, (4,), 2)}]},
        "lm_head": patterned(torch.float16, (2, 2), 3),
    }
    s = TensorSerializer(str(directory / "nested.tensors"))
    s.write_state_dict(nested)
    s.close()
    files["nested.tensors"] = (
        {
            key_name(("model", "layers", 0, "w")): describe(nested["model"]["layers"][0]["w"], 2),
            key_name(("model", "layers", 1, "w")): describe(nested["model"]["layers"][1]["w"], 2),
            "lm_head": describe(nested["lm_head"], 2),
        },
        None,
    )

    m = filled_module(11)
    s = TensorSerializer(str(directory / "module.tensors"))
    s.write_module(m)
    s.close()

    s = TensorSerializer(str(directory / "single.tensors"))
    arr = numpy.arange(12, dtype=numpy.int16).reshape(3, 4)
    s.write_tensor(0, "np.int16", TensorType.PARAM, arr)
    s.write_tensor(3, "t.f32", TensorType.BUFFER, patterned(torch.float32, (5,), 4))
    s.write_tensor(0, "ghost", TensorType.PARAM, torch.empty(2, 3, device="meta"))
    s.close()
    files["single.tensors"] = (
        {
            "np.int16": describe(torch.from_numpy(arr), TensorType.PARAM),
            "t.f32": describe(patterned(torch.float32, (5,), 4), TensorType.BUFFER),
            "ghost": describe(torch.zeros(2, 3), TensorType.PARAM),
        },
        None,
    )

    big, small = patterned(torch.float32, (700, 1024), 5), patterned(torch.bfloat16, (5,), 6)
    key = EncryptionParams.random()
    with TensorSerializer(str(directory / "enc_key.tensors"), encryption=key) as s:
        s.write_state_dict({"big": big, "small": small})
    files["enc_key.tensors"] = ({"big": describe(big, 2), "small": describe(small, 2)}, f"key:{key.key.hex()}")
    pw = EncryptionParams.from_string("our-pass", EncryptionParams.OpsLimit.MIN, EncryptionParams.MemLimit.MIN)
    with TensorSerializer(str(directory / "enc_pass.tensors"), encryption=pw) as s:
        s.write_state_dict({"big": big, "small": small})
    files["enc_pass.tensors"] = ({"big": describe(big, 2), "small": describe(small, 2)}, "pass:our-pass")
    # Encrypted with a zero-length and a meta tensor: empty crypt info, data version 4 + flag.
    with TensorSerializer(str(directory / "enc_meta.tensors"), encryption=key) as s:
        s.write_state_dict({"small": small, "empty": torch.zeros(0, 2), "ghost": torch.empty(3, device="meta")})
    files["enc_meta.tensors"] = (
        {"small": describe(small, 2), "empty": describe(torch.zeros(0, 2), 2), "ghost": describe(torch.zeros(3), 2)},
        f"key:{key.key.hex()}",
    )
    return files, m


@pytest.fixture(scope="module")
def our_files(tmp_path_factory):
    directory = tmp_path_factory.mktemp("ours-written")
    files, module = write_ours(directory)
    return directory, files, module


@pytest.mark.parametrize(
    "name",
    ["dtypes.tensors", "nested.tensors", "single.tensors", "enc_key.tensors", "enc_pass.tensors", "enc_meta.tensors"],
)
def test_our_files_load_in_reference(reference, our_files, name):
    directory, files, _ = our_files
    expected, secret = files[name]
    args = ["read", directory / name] + ([secret] if secret else [])
    got = reference(*args)
    source_fields = ("module_idx", "param", "requires_grad")
    assert without(got, *source_fields) == without(expected, *source_fields)
    ours = our_listing(directory / name, _our_decryption(secret))
    assert got == ours  # same module indices, types, versions as our own reader sees


def _our_decryption(secret):
    if secret is None:
        return None
    kind, _, value = secret.partition(":")
    return DecryptionParams.from_key(bytes.fromhex(value)) if kind == "key" else DecryptionParams.from_string(value)


def test_our_module_loads_into_reference_module(reference, our_files):
    directory, _, module = our_files
    got = reference("module", directory / "module.tensors")
    expected = {n: describe(p) for n, p in module.named_parameters()}
    expected.update({n: describe(b) for n, b in module.named_buffers()})
    assert got.keys() == expected.keys()
    for name, e in expected.items():
        assert got[name]["sha256"] == e["sha256"], name
        assert got[name]["dtype"] == e["dtype"] and got[name]["shape"] == e["shape"]


def test_data_versions_match_reference(reference, our_files):
    """We write the lowest data version that fits, as the reference does."""
    directory, files, _ = our_files
    assert our_listing(directory / "nested.tensors")["__version__"] == 2  # bf16
    assert our_listing(directory / "single.tensors")["__version__"] == 4  # meta
    assert json.dumps(reference("read", directory / "module.tensors")["__version__"]) == "1"


def test_torch_compat_files_interchange(reference, tmp_path):
    """torch.save/torch.load sidecars from either implementation load in the other."""
    from tensorizer import torch_compat

    expected = reference("torch_save", tmp_path)
    with torch_compat.tensorizer_loading(device="cpu"):
        theirs = torch.load(tmp_path / "ref_module.pt", weights_only=False)
    assert {n: describe(t) for n, t in theirs.state_dict(keep_vars=True).items()} == expected

    ours = filled_module(22)
    with torch_compat.tensorizer_saving():
        torch.save(ours, tmp_path / "our_module.pt")
    got = reference("torch_load", tmp_path / "our_module.pt")
    assert got == {n: describe(t) for n, t in ours.state_dict(keep_vars=True).items()}
