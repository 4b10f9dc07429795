#!/usr/bin/env python3
"""Regenerates the small seed corpus of fuzz/fuzz_index.cc (fuzz/corpus/) from the fixtures.

Each fixture written by the reference tensorizer reserves a 256 KiB index, far over the fuzzer's
input size limit, so each seed is a *compacted* copy: the same tensor records (headers and data
byte for byte, so their hashes still hold) behind an index sized exactly to its entries, keeping
only the first tensors that fit in ~3.5 KiB. Plus: the first 512 bytes of one fixture (a cut
file), a hand-built data-version-5 file with a long (>= 2^32) dimension (spec Appendix B) and a
small safetensors file with metadata and several dtypes (docs/format.md §5).
Usage: python3 fuzz/make_corpus.py [FIXTURES_DIR]
"""
import hashlib
import json
import os
import struct
import sys
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    HERE, "..", "tests", "fixtures", "tensorizer-2.11.1")
OUT = os.path.join(HERE, "corpus")
BUDGET = 3584


def parse_entries(buf):
    count = struct.unpack_from("<Q", buf, 57)[0]
    pos = 73
    entries = []
    for _ in range(count):
        start = pos
        (n,) = struct.unpack_from("<H", buf, pos)
        pos += 2 + n + 1
        d = buf[pos]
        pos += 1 + d
        r = buf[pos]
        pos += 1 + 4 * r
        hoff, doff, dlen = struct.unpack_from("<QQQ", buf, pos)
        pos += 24
        entries.append((buf[start:pos - 24], hoff, doff, dlen))
    return entries


def compact(buf):
    chosen, used = [], 73
    for prefix, hoff, doff, dlen in parse_entries(buf):
        cost = len(prefix) + 24 + (doff - hoff) + dlen
        if used + cost > BUDGET:
            continue
        chosen.append((prefix, hoff, doff, dlen))
        used += cost
    index_size = sum(len(p) + 24 for p, *_ in chosen)
    index, records = b"", b""
    cursor = 73 + index_size
    for prefix, hoff, doff, dlen in chosen:
        record = buf[hoff:doff + dlen]
        index += prefix + struct.pack("<QQQ", cursor, cursor + doff - hoff, dlen)
        records += record
        cursor += len(record)
    head = bytearray(buf[:73])
    struct.pack_into("<Q", head, 41, sum(c[3] for c in chosen))
    struct.pack_into("<Q", head, 57, len(chosen))
    struct.pack_into("<Q", head, 65, index_size)
    return bytes(head) + index + records + bytes(8)


def long_dims_file():
    """Data version 5, flag 2 (versioned entries): one v1-tagged and one v5-tagged entry."""
    tensors = [  # (name, dtype, shape, data, long)
        (b"small", b"<f4", (2,), struct.pack("<2f", 1.0, 2.0), False),
        (b"long", b"<f4", (1 << 32, 0), b"", True),
    ]
    records, index_parts = [], []
    index_size = sum(4 + 29 + len(n) + len(d) + len(s) * (8 if lg else 4)
                     for n, d, s, _, lg in tensors)
    cursor = 73 + index_size
    for name, dtype, shape, data, long_ in tensors:
        dim = "Q" if long_ else "I"
        body = struct.pack("<HBH", 0, 2, len(name)) + name + bytes([len(dtype)]) + dtype
        body += bytes([len(shape)]) + struct.pack("<%d%s" % (len(shape), dim), *shape)
        hashes = struct.pack("<HB", 41, 2) + b"\x00\x04" + bytes(4) + b"\x01\x20" + bytes(32)
        size = 8 + len(body) + len(hashes) + 8
        header = bytearray(struct.pack("<Q", size) + body + hashes + struct.pack("<q", len(data)))
        crc = zlib.crc32(bytes(header) + data)
        sha = hashlib.sha256(bytes(header) + data).digest()
        h = 8 + len(body)
        struct.pack_into("<I", header, h + 5, crc)
        header[h + 11:h + 43] = sha
        index_parts.append(struct.pack("<I", 5 if long_ else 1) + struct.pack("<H", len(name)) +
                           name + b"\x02" + bytes([len(dtype)]) + dtype + bytes([len(shape)]) +
                           struct.pack("<%d%s" % (len(shape), dim), *shape) +
                           struct.pack("<QQQ", cursor, cursor + size, len(data)))
        records.append(bytes(header) + data)
        cursor += size + len(data)
    flags = (2).to_bytes(32, "little")
    head = b"|TZR|" + struct.pack("<I", 5) + flags + struct.pack(
        "<Q8xQQ", sum(len(t[3]) for t in tensors), len(tensors), index_size)
    return head + b"".join(index_parts) + b"".join(records) + bytes(8)


def safetensors_file():
    """A safetensors file as the safetensors library writes one (widest dtype first)."""
    tensors = [("w", "F32", [2, 2], bytes(range(16))), ("b", "BF16", [3], b"abcdef"), ("m", "BOOL", [2], b"\1\0")]
    header, data = {"__metadata__": {"format": "pt"}}, b""
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def main():
    os.makedirs(OUT, exist_ok=True)
    for name in sorted(os.listdir(FIXTURES)):
        if not name.endswith(".tensors"):
            continue
        buf = open(os.path.join(FIXTURES, name), "rb").read()
        with open(os.path.join(OUT, name.replace(".tensors", ".compact")), "wb") as f:
            f.write(compact(buf))
    buf = open(os.path.join(FIXTURES, "module.tensors"), "rb").read()
    with open(os.path.join(OUT, "module.cut512"), "wb") as f:
        f.write(buf[:512])
    with open(os.path.join(OUT, "long_dims.v5"), "wb") as f:
        f.write(long_dims_file())
    with open(os.path.join(OUT, "small.safetensors"), "wb") as f:
        f.write(safetensors_file())


if __name__ == "__main__":
    main()
