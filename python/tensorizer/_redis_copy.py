"""TensorDeserializer.to_redis: a file's parts (the engine's object_parts, the one statement of the
Redis layout) stored under `<prefix>:<name>:<offset>` through the caller's redis-py client, one
value at a time in bounded pieces. The engine's own Redis sink (TensorSerializer("redis://..."))
writes the same keys; this path exists because to_redis takes a client, whose connection settings
(auth, database, TLS, sockets) only redis-py knows."""

from __future__ import annotations

import contextlib
import uuid

# one piece of a tensor in memory.
REDIS_CHUNK_BYTES = 32 << 20
# Lifetime of the temporary key a large value is assembled in, renewed with every piece, so that a
# killed process leaves nothing behind for long.
_REDIS_TMP_TTL_S = 3600


def _redis_put(client, read_raw, key_prefix: str, key: str, offset: int, size: int) -> None:
    """Sets Redis `key` to the `size` source bytes at `offset` (read with `read_raw(offset, n)`).

    Up to REDIS_CHUNK_BYTES this is one SET. A larger value is assembled in a temporary key
    (SET of the first piece, then APPEND of each next one, whose returned length is checked) and
    RENAMEd to `key` at the end, so a reader never sees a partial value and a failure leaves no
    partial `key`: the temporary key is deleted on failure. The temporary key is
    `<key_prefix>.tz-staging-<random>` (as the Redis sink names its own), outside the
    `<key_prefix>:*` namespace that readers SCAN.
    """
    chunk = REDIS_CHUNK_BYTES
    if size <= chunk:
        client.set(key, read_raw(offset, size))
        return
    tmp = f"{key_prefix}.tz-staging-{uuid.uuid4().hex}"
    try:
        client.set(tmp, read_raw(offset, chunk), ex=_REDIS_TMP_TTL_S)
        done = chunk
        while done < size:
            n = min(chunk, size - done)
            pipe = client.pipeline(transaction=False)
            pipe.append(tmp, read_raw(offset + done, n))
            pipe.expire(tmp, _REDIS_TMP_TTL_S)
            length = pipe.execute()[0]
            done += n
            if length != done:
                raise OSError(
                    f"Redis temporary key {tmp!r} holds {length} bytes after APPEND, expected {done}"
                    " (it expired or was changed by another client)"
                )
        pipe = client.pipeline(transaction=True)  # MULTI/EXEC: the final key never has a TTL
        pipe.rename(tmp, key)
        pipe.persist(key)
        pipe.execute()
    except BaseException:
        with contextlib.suppress(Exception):
            client.delete(tmp)
        raise


def copy_to_redis(reader, client, key_prefix: str, force: bool, label: str) -> None:
    """Stores the parts of `reader`'s file. Each tensor's data goes before its header key, so an
    interrupted copy never leaves a header key that would make a later call (without `force`)
    skip a tensor whose data is missing."""

    def put(part, what: str) -> None:
        key = f"{key_prefix}:{part.name}:{part.offset}"
        try:
            _redis_put(client, reader.read_raw, key_prefix, key, part.offset, part.size)
        except Exception as e:
            if hasattr(e, "add_note"):  # Python 3.11+
                e.add_note(f"while copying {what} of '{label}' (bytes {part.offset}+{part.size}) to Redis key {key!r}")
            raise

    header, *rest = reader.object_parts()
    tensors = {}  # name -> [header part, data part (when it stores data)]
    for part in rest:
        tensors.setdefault(part.name, []).append(part)
    put(header, "the file header and index")
    for name, (tensor_header, *data) in tensors.items():
        if not force and client.exists(f"{key_prefix}:{name}:{tensor_header.offset}"):
            continue
        for part in data:
            put(part, f"the data of tensor {name!r}")
        put(tensor_header, f"the header of tensor {name!r}")
