"""Runs under the REFERENCE tensorizer (.venv-ref/bin/python), driven by test_interop.py.

  reference_tool.py write DIR       write files with the reference; print their manifest (JSON)
  reference_tool.py read FILE [KEY] load FILE with verify_hash=True; print every tensor (JSON)
  reference_tool.py module FILE     load_into_module into interop_module(); print its tensors
  reference_tool.py torch_save DIR  torch.save a module with torch_compat; print its tensors
  reference_tool.py torch_load PT   torch.load with torch_compat; print the module's tensors

A manifest/tensor listing maps each name (str, or a JSON list for structured paths) to
{"dtype", "shape", "sha256", "type"} of the tensor's raw bytes.
"""

import json
import os
import sys

import torch

import tensorizer
from interop_data import DTYPES, InteropModule, describe, filled_module, key_name, patterned
from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer, TensorType

# Guard: this must be the reference package from the venv, never the project's own.
assert os.path.realpath(tensorizer.__file__).startswith(os.path.realpath(sys.prefix)), tensorizer.__file__


def write(directory: str) -> dict:
    os.makedirs(directory, exist_ok=True)
    files = {}

    def record(name, tensors, encryption=None):
        files[name] = {"tensors": tensors, "encryption": encryption}

    # Every dtype, plus scalars, empty and non-contiguous tensors, in one state dict.
    sd = {f"dt.{n}": patterned(getattr(torch, n), (3, 5), i) for i, n in enumerate(DTYPES)}
    sd["scalar"] = torch.tensor(2.5)
    sd["empty"] = torch.zeros(0, 4)
    sd["noncontig"] = torch.arange(24, dtype=torch.float32).reshape(4, 6).t()
    path = os.path.join(directory, "dtypes.tensors")
    s = TensorSerializer(path)
    s.write_state_dict(sd)
    s.close()
    record("dtypes.tensors", {k: describe(v, TensorType.STATE_DICT) for k, v in sd.items()})

    # Nested structures (structured names).
    nested = {
        "model": {
            "layers": [{"w": patterned(torch.float32, (2, 3), 100)}, {"w": patterned(torch.bfloat16, (4,), 101)}]
        },
        "lm_head": patterned(torch.float16, (2, 2), 102),
        "ünï": patterned(torch.int32, (2,), 103),
    }
    path = os.path.join(directory, "nested.tensors")
    s = TensorSerializer(path)
    s.write_state_dict(nested)
    s.close()
    entries = {
        key_name(("model", "layers", 0, "w")): describe(nested["model"]["layers"][0]["w"], TensorType.STATE_DICT),
        key_name(("model", "layers", 1, "w")): describe(nested["model"]["layers"][1]["w"], TensorType.STATE_DICT),
        "lm_head": describe(nested["lm_head"], TensorType.STATE_DICT),
        "ünï": describe(nested["ünï"], TensorType.STATE_DICT),
    }
    record("nested.tensors", entries)

    # A module with write_module (root names with a leading dot, buffers).
    m = filled_module(5)
    path = os.path.join(directory, "module.tensors")
    s = TensorSerializer(path)
    s.write_module(m)
    s.close()
    entries = {f".{n}": describe(p, TensorType.PARAM) for n, p in m.named_parameters() if "." not in n}
    entries.update({n: describe(p, TensorType.PARAM) for n, p in m.named_parameters() if "." in n})
    entries[".steps"] = describe(m.steps, TensorType.BUFFER)
    entries[".scratch"] = describe(m.scratch, TensorType.BUFFER)
    record("module.tensors", entries)

    # Meta tensors (load as zeros).
    path = os.path.join(directory, "meta.tensors")
    s = TensorSerializer(path)
    real = patterned(torch.float32, (4,), 7)
    s.write_state_dict({"real": real, "ghost": torch.empty(3, 2, device="meta")})
    s.close()
    record("meta.tensors", {"real": describe(real, 2), "ghost": describe(torch.zeros(3, 2), 2)})

    # Encrypted: exact key and passphrase (a tensor over 2 MiB for several chunks).
    big = patterned(torch.float32, (700, 1024), 8)
    small = patterned(torch.bfloat16, (5,), 9)
    for name, enc, spec in (
        ("enc_key.tensors", EncryptionParams.random(), None),
        (
            "enc_pass.tensors",
            EncryptionParams.from_string("interop-pass", EncryptionParams.OpsLimit.MIN, EncryptionParams.MemLimit.MIN),
            {"passphrase": "interop-pass"},
        ),
    ):
        s = TensorSerializer(os.path.join(directory, name), encryption=enc)
        s.write_state_dict({"big": big, "small": small})
        s.close()
        record(
            name,
            {"big": describe(big, 2), "small": describe(small, 2)},
            spec or {"key_hex": enc.key.hex()},
        )
    return files


def decryption(arg):
    if arg is None:
        return None
    kind, _, value = arg.partition(":")
    return DecryptionParams.from_key(bytes.fromhex(value)) if kind == "key" else DecryptionParams.from_string(value)


def read(path: str, secret=None) -> dict:
    out = {}
    with TensorDeserializer(path, verify_hash=True, device="cpu", encryption=decryption(secret), lazy_load=True) as d:
        for module_idx, ttype, name, tensor in d.read_tensors():
            entry = describe(tensor, ttype)
            entry["module_idx"] = module_idx
            out[key_name(name)] = entry
        out["__version__"] = d._file_header.version_number
    return out


def module(path: str) -> dict:
    m = InteropModule()
    with TensorDeserializer(path, verify_hash=True, device="cpu") as d:
        d.load_into_module(m)
    out = {n: describe(p) for n, p in m.named_parameters()}
    out.update({n: describe(b) for n, b in m.named_buffers()})
    return out


def torch_save(directory: str) -> dict:
    """torch.save of a module through the reference's torch_compat (sidecar .tensors)."""
    from tensorizer.torch_compat import tensorizer_saving

    m = filled_module(21)
    path = os.path.join(directory, "ref_module.pt")
    with tensorizer_saving():
        torch.save(m, path)
    return {n: describe(t) for n, t in m.state_dict(keep_vars=True).items()}


def torch_load(path: str) -> dict:
    """torch.load through the reference's torch_compat."""
    from tensorizer.torch_compat import tensorizer_loading

    with tensorizer_loading(device="cpu"):
        m = torch.load(path, weights_only=False)
    return {n: describe(t) for n, t in m.state_dict(keep_vars=True).items()}


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    commands = {"write": write, "read": read, "module": module, "torch_save": torch_save, "torch_load": torch_load}
    result = commands[command](*args)
    json.dump(result, sys.stdout)
