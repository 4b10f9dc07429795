"""Test data shared by test_interop.py (our package) and reference_tool.py (the reference):
imports no tensorizer, so either side can use it."""

import hashlib
import json

import torch

# Every dtype the reference can serialize on this torch (quantized ones excluded).
DTYPES = [
    n
    for n in (
        "float16 float32 float64 bfloat16 complex32 complex64 complex128 int8 int16 int32 int64 uint8"
        " uint16 uint32 uint64 bool float8_e5m2 float8_e4m3fn float8_e5m2fnuz float8_e4m3fnuz"
        " float8_e8m0fnu bits8 bits16 bits1x8 bits2x4 bits4x2 uint1 uint2 uint3 uint4 uint5 uint6"
        " uint7 int1 int2 int3 int4 int5 int6 int7"
    ).split()
    if isinstance(getattr(torch, n, None), torch.dtype)
]


def raw(t: torch.Tensor) -> bytes:
    t = t.detach().cpu().contiguous()
    return b"" if t.numel() == 0 else t.reshape(-1).view(torch.uint8).numpy().tobytes()


def describe(t: torch.Tensor, ttype=None) -> dict:
    return {
        "dtype": str(t.dtype),
        "shape": list(t.shape),
        "sha256": hashlib.sha256(raw(t)).hexdigest(),
        "type": None if ttype is None else int(ttype),
        "param": isinstance(t, torch.nn.Parameter),
        "requires_grad": bool(t.requires_grad),
    }


def key_name(name) -> str:
    return name if isinstance(name, str) else json.dumps(list(name))


def patterned(dtype: torch.dtype, shape, seed: int) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    g = torch.Generator().manual_seed(seed)
    bits = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=g)
    return bits.view(dtype).reshape(shape)


class InteropModule(torch.nn.Module):
    """Parameters, a persistent and a non-persistent buffer, nested children."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(3))
        self.register_buffer("steps", torch.zeros(1, dtype=torch.int64))
        self.register_buffer("scratch", torch.zeros(2, 2), persistent=False)
        self.body = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.LayerNorm(16), torch.nn.Linear(16, 4))


def filled_module(seed: int) -> InteropModule:
    torch.manual_seed(seed)
    m = InteropModule()
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p))
        m.steps.fill_(7)
        m.scratch.copy_(torch.randn(2, 2))
    return m
