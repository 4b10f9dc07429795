"""The benchmark's test set: a deterministic, transformer-shaped state dict of bf16/fp16 tensors.

Shapes follow a LLaMA-style decoder (embeddings, per-layer attention q/k/v/o, gated MLP, norms,
lm_head); the hidden size and layer count are picked so the total is close to the requested size.
Also holds the one checksum every loader's result goes through (so every byte is touched, the same
way for all). Imported by the benchmark children, including the reference's venv: torch only.
"""

import numpy as np
import torch

VOCAB = 32000


def shapes(size_bytes: int) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of a model whose tensors add up to about size_bytes."""
    hidden = 512
    while hidden < 4096 and 4 * (hidden * 2) ** 2 * 2 * 2 * 12 <= size_bytes:
        hidden *= 2  # keep at least ~12 layers' worth of the budget in the decoder blocks
    inter = (hidden * 11 // 4 + 255) // 256 * 256
    per_layer = (4 * hidden * hidden + 3 * hidden * inter + 2 * hidden) * 2
    embed = 2 * VOCAB * hidden * 2
    layers = max(1, round((size_bytes - embed) / per_layer))
    out = [("model.embed_tokens.weight", (VOCAB, hidden), torch.bfloat16)]
    for i in range(layers):
        p = f"model.layers.{i}."
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((p + f"self_attn.{n}.weight", (hidden, hidden), torch.bfloat16))
        out.append((p + "mlp.gate_proj.weight", (inter, hidden), torch.bfloat16))
        out.append((p + "mlp.up_proj.weight", (inter, hidden), torch.bfloat16))
        out.append((p + "mlp.down_proj.weight", (hidden, inter), torch.bfloat16))
        # Norms in fp16 so both half-precision dtypes appear.
        out.append((p + "input_layernorm.weight", (hidden,), torch.float16))
        out.append((p + "post_attention_layernorm.weight", (hidden,), torch.float16))
    out.append(("model.norm.weight", (hidden,), torch.float16))
    out.append(("lm_head.weight", (VOCAB, hidden), torch.bfloat16))
    return out


def make_state_dict(size_bytes: int, seed: int = 1234) -> dict[str, torch.Tensor]:
    """Deterministic tensors of random bits (not zeros: no page can be shared or skipped)."""
    gen = torch.Generator().manual_seed(seed)
    sd = {}
    for name, shape, dtype in shapes(size_bytes):
        bits = torch.randint(-(2**15), 2**15, shape, dtype=torch.int16, generator=gen)
        sd[name] = bits.view(dtype)
    return sd


def _byte_view(t) -> np.ndarray:
    """A flat uint8 numpy view (no copy) of a torch tensor, numpy array or bytes-like object."""
    if isinstance(t, torch.Tensor):
        return t.detach().reshape(-1).view(torch.uint8).numpy()
    if isinstance(t, np.ndarray):
        return t.reshape(-1).view(np.uint8)
    return np.frombuffer(t, np.uint8)


def tensor_bytes(tensors) -> int:
    return sum(_byte_view(t).size for t in tensors)


def touch_pages(tensors) -> int:
    """Reads one byte of every 4 KiB page of every tensor (what a first use of the weights faults in)."""
    total = 0
    for t in tensors:
        b = _byte_view(t)
        if b.size:
            total += int(b[::4096].sum(dtype=np.int64))
    return total


def checksum(tensors) -> int:
    """Sum of every tensor's bytes read as int64 words (wrapping), mod 2**64: touches every byte once.

    numpy's int64 sum (vectorised, ~8 GB/s on one core) rather than torch's, which costs ~6x more on
    a few-MB tensor. Bytes before the first 8-aligned address and after the last whole word are added
    one by one (none for the test set's tensors, a few for a whole file).
    """
    total = 0
    for t in tensors:
        b = _byte_view(t)
        head = min((-b.ctypes.data) % 8, b.size)
        end = head + (b.size - head) // 8 * 8
        total += int(b[head:end].view(np.int64).sum())
        total += int(b[:head].sum(dtype=np.int64)) + int(b[end:].sum(dtype=np.int64))
    return total % 2**64
