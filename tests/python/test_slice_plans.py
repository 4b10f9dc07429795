"""Slice plans (TensorDeserializer(slice_plan=...), tensorizer.distributed.shard_plan) and block
indexing of get_slice: a block of rows, of columns or of any dimensions equals slicing the whole
tensor, and reads only its bytes (columns: across small gaps in one request, run by run across
large ones; counted by the engine), from a local file, an encrypted one and over HTTP; with
verify_hash the whole tensor is checked first; shard plans for every rank of N put the whole back
together, even and uneven."""

import os
import uuid

import pytest
import torch

from tensorizer import EncryptionParams, DecryptionParams, TensorDeserializer, TensorSerializer
from tensorizer.distributed import shard_plan, split_bounds
from tensorizer.serialization import HashMismatchError

from test_remote import server_env

ROWS, COLS = 300, 1000  # float32: 4000 bytes a row


def tensors():
    g = torch.Generator().manual_seed(11)
    return {
        "w": torch.randn(ROWS, COLS, generator=g),
        "wide": torch.randn(8, 65536, generator=g),  # 256 KiB rows: column gaps too large to read
        "cube": torch.randn(6, 10, 12, generator=g).to(torch.bfloat16),
        "bias": torch.randn(COLS, generator=g),
        "ids": torch.arange(301, dtype=torch.int64),
    }


def write(path, encryption=None):
    with TensorSerializer(str(path), encryption=encryption) as s:
        s.write_state_dict(tensors())


# (name, index, bytes the engine reads): gaps of at most 128 KiB in a local file are read through.
CASES = [
    ("w", (slice(None), slice(100, 200)), 299 * 4000 + 400),
    ("w", (slice(0, 5), 3), 4 * 4000 + 4),
    ("w", (Ellipsis, 1), 299 * 4000 + 4),
    ("w", slice(None, None, 2), 299 * 4000),  # the bounding block of rows 0..298, then every other
    ("w", (slice(10, 20), slice(0, COLS)), 10 * 4000),
    ("wide", (slice(None), slice(0, 1024)), 8 * 4096),  # 252 KiB gaps: only the runs
    ("wide", (slice(2, 4), slice(65000, None)), 2 * 536 * 4),
    ("cube", (slice(1, 3), slice(None), slice(4, 8)), (1 * 120 + 9 * 12 + 4) * 2),
    ("cube", (slice(None), slice(2, 5)), (5 * 120 + 3 * 12) * 2),
    ("cube", (slice(1, 4), slice(2, 5), slice(4, 8)), 3 * (2 * 12 + 4) * 2),
]


@pytest.mark.parametrize("name,index,expected_read", CASES)
def test_blocks_read_only_their_bytes(tmp_path, name, index, expected_read):
    path = tmp_path / "m.tensors"
    write(path)
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        before = d._reader.bytes_read
        got = d.get_slice(name)[index]
        read = d._reader.bytes_read - before
    assert torch.equal(got, tensors()[name][index])
    assert read == expected_read


def test_a_mapping_plan_loads_parts_and_leaves_the_rest_whole(tmp_path):
    path = tmp_path / "m.tensors"
    write(path)
    plan = {"w": (slice(None), slice(100, 300)), "cube": (1, slice(3, 6)), "ids": slice(5, 9)}
    full = tensors()
    for lazy in (False, True):
        with TensorDeserializer(str(path), device="cpu", lazy_load=lazy, slice_plan=plan) as d:
            for name, t in full.items():
                want = t[plan[name]] if name in plan else t
                assert torch.equal(d[name], want), name
                assert d[name].is_contiguous()
            assert {p.normalize_() for p, v in d._loaded_via.items() if v == "sliced"} == set(plan)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_shard_plans_of_every_rank_put_the_whole_back_together(tmp_path, world, dim):
    path = tmp_path / "m.tensors"
    write(path)
    full = tensors()
    parts = []
    for rank in range(world):
        with TensorDeserializer(str(path), device="cpu", slice_plan=shard_plan(rank, world, dim=dim)) as d:
            parts.append(dict(d))
    for name, t in full.items():
        if t.dim() < 2:  # biases and ids stay whole on every rank by default
            assert all(torch.equal(p[name], t) for p in parts)
            continue
        assert torch.equal(torch.cat([p[name] for p in parts], dim=dim), t), name
        d = dim % t.dim()
        assert [p[name].shape[d] for p in parts] == [
            b - a for a, b in (split_bounds(t.shape[d], world, r) for r in range(world))
        ]


def test_split_bounds_follow_tensor_split():
    for n in (0, 1, 7, 300):
        for parts in (1, 2, 3, 4, 7):
            sizes = [len(c) for c in torch.tensor_split(torch.arange(n), parts)]
            assert [b - a for a, b in (split_bounds(n, parts, p) for p in range(parts))] == sizes
    with pytest.raises(ValueError):
        shard_plan(4, 4)


def test_encrypted_and_verified_plans(tmp_path):
    path = tmp_path / "e.tensors"
    key = EncryptionParams.random()
    write(path, key)
    plan = shard_plan(1, 3, dim=1)
    full = tensors()
    for verify in (False, True):
        with TensorDeserializer(
            str(path), device="cpu", slice_plan=plan, encryption=DecryptionParams.from_key(key.key), verify_hash=verify
        ) as d:
            for name, t in full.items():
                index = plan(name, list(t.shape))
                assert torch.equal(d[name], t if index is None else t[index]), name


def test_a_flipped_byte_fails_a_verified_plan(tmp_path):
    path = tmp_path / "m.tensors"
    write(path)
    with TensorDeserializer(str(path), device="cpu", lazy_load=True) as d:
        offset = d._metadata[next(p for p in d._metadata if p.normalize_() == "w")].data_offset
    with open(path, "r+b") as f:
        f.seek(offset + 5)
        byte = f.read(1)
        f.seek(offset + 5)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(HashMismatchError):
        TensorDeserializer(str(path), device="cpu", verify_hash=True, slice_plan=shard_plan(0, 2, dim=1))


def test_column_plans_over_http_read_only_their_runs():
    url, root = server_env("TZ_TEST_HTTP_URL", "TZ_TEST_HTTP_ROOT")
    name = f"plan-{uuid.uuid4().hex}.tensors"
    write(os.path.join(root, name))
    try:
        full = tensors()
        plan = {"wide": (slice(None), slice(0, 1024)), "w": (slice(None), slice(500, 750))}
        with TensorDeserializer(f"{url}/{name}", device="cpu", lazy_load=True, slice_plan=plan) as d:
            before = d._reader.bytes_read
            assert torch.equal(d["wide"], full["wide"][plan["wide"]])
            # 252 KiB gaps are read through remotely (one request costs more than 4 MiB of bytes)
            assert d._reader.bytes_read - before == 7 * 65536 * 4 + 1024 * 4
            assert torch.equal(d["w"], full["w"][plan["w"]])
    finally:
        os.unlink(os.path.join(root, name))


def test_plan_arguments_are_checked(tmp_path):
    path = tmp_path / "m.tensors"
    write(path)
    with pytest.raises(TypeError, match="slice_plan"):
        TensorDeserializer(str(path), device="cpu", slice_plan=[1, 2])
    with pytest.raises(IndexError):
        TensorDeserializer(str(path), device="cpu", slice_plan={"w": (slice(None), COLS)})
