"""EncryptionParams / DecryptionParams: the reference's key API (docs/format.md §3.2, §6.4).

Keys are 32 bytes: exact, random, or derived from a passphrase with Argon2id13 (in the engine,
libsodium). A passphrase key remembers its (opslimit, memlimit, salt) so the writer can store
them in each tensor's header, which lets a reader derive the key again from the passphrase.
"""

from __future__ import annotations

import os
from enum import IntEnum
from typing import Any, Optional, Tuple, Union

_KEY_BYTES = 32
_SALT_BYTES = 16
# libsodium crypto_pwhash (Argon2id13) limits.
_OPSLIMIT_MIN, _OPSLIMIT_MAX = 1, 4294967295
_MEMLIMIT_MIN, _MEMLIMIT_MAX = 8192, 4398046510080

_Bytes = (bytes, bytearray, memoryview)


def _engine():
    from .. import _C

    return _C


class EncryptionParams:
    """Encryption parameters for a TensorSerializer.

    Use ``EncryptionParams.random()`` (save ``.key``), ``EncryptionParams.from_string(passphrase)``,
    or ``EncryptionParams(key)`` with exactly 32 bytes.
    """

    __slots__ = ("key", "_kdf")

    class OpsLimit(IntEnum):
        """Argon2id CPU cost presets (libsodium crypto_pwhash_OPSLIMIT_*)."""

        MIN = 1
        INTERACTIVE = 2
        MODERATE = 3
        SENSITIVE = 4

    class MemLimit(IntEnum):
        """Argon2id memory cost presets in bytes (libsodium crypto_pwhash_MEMLIMIT_*)."""

        MIN = 8192
        INTERACTIVE = 67108864
        MODERATE = 268435456
        SENSITIVE = 1073741824

    key: bytes
    _kdf: Optional[Tuple[int, int, bytes]]

    def __init__(self, key: bytes):
        if not isinstance(key, _Bytes):
            raise TypeError(
                "Encryption key must be a cryptographically secure bytestring."
                " To derive an encryption key from an arbitrary string,"
                " use EncryptionParams.from_string()"
            )
        if len(key) != _KEY_BYTES:
            raise ValueError(
                f"Invalid encryption key length, should be {_KEY_BYTES} bytes;"
                f" got {len(key)} bytes instead."
                " To generate a valid encryption key from any string or bytes object,"
                " use EncryptionParams.from_string()"
            )
        self.key = bytes(key)
        self._kdf = None

    def __repr__(self) -> str:
        kind = "passphrase-derived" if self._kdf else "exact"
        return f"<EncryptionParams ({kind} key)>"

    def __eq__(self, other) -> bool:
        if not isinstance(other, EncryptionParams):
            return NotImplemented
        return self.key == other.key and self._kdf == other._kdf

    __hash__ = None  # mutable, like the reference's dataclass

    @classmethod
    def random(cls) -> "EncryptionParams":
        """A random key (from the system's secure generator); read it back from ``.key``."""
        return cls(_engine().random_key())

    @property
    def salt(self) -> bytes:
        """The 16-byte salt of a passphrase-derived key; ValueError for exact/random keys."""
        if self._kdf is None:
            raise ValueError(
                "An exact binary key is being used."
                " Exact binary keys do not use key derivation algorithms,"
                " and thus have no salt."
            )
        return self._kdf[2]

    @classmethod
    def from_string(
        cls,
        source: Union[str, bytes],
        opslimit: Union["EncryptionParams.OpsLimit", int, None] = None,
        memlimit: Union["EncryptionParams.MemLimit", int, None] = None,
        salt: Union[bytes, None] = None,
        *,
        encoding: str = "utf-8",
    ) -> "EncryptionParams":
        """A key derived from `source` with Argon2id13 (libsodium crypto_pwhash).

        Defaults: ``OpsLimit.MODERATE`` and ``MemLimit.MODERATE``, a random 16-byte salt.
        The parameters and salt are stored in the file, so ``DecryptionParams.from_string``
        needs only the passphrase.
        """
        if not source:
            raise ValueError("Source cannot be empty")
        if isinstance(opslimit, cls.MemLimit) or not isinstance(opslimit, (int, type(None))):
            raise TypeError(
                "opslimit parameter: expected EncryptionParams.OpsLimit,"
                f" int, or None; {opslimit.__class__.__name__} found"
            )
        if isinstance(memlimit, cls.OpsLimit) or not isinstance(memlimit, (int, type(None))):
            raise TypeError(
                "memlimit parameter: expected EncryptionParams.MemLimit,"
                f" int, or None; {memlimit.__class__.__name__} found"
            )
        if isinstance(source, str):
            source = source.encode(encoding)
        elif isinstance(source, (bytearray, memoryview)):
            source = bytes(source)
        elif not isinstance(source, bytes):
            raise TypeError("Invalid source type: must be str or bytes")
        opslimit = int(cls.OpsLimit.MODERATE if opslimit is None else opslimit)
        memlimit = int(cls.MemLimit.MODERATE if memlimit is None else memlimit)
        if not _OPSLIMIT_MIN <= opslimit <= _OPSLIMIT_MAX:
            raise ValueError(f"Invalid opslimit, must be in the range [{_OPSLIMIT_MIN}, {_OPSLIMIT_MAX}]")
        if not _MEMLIMIT_MIN <= memlimit <= _MEMLIMIT_MAX:
            raise ValueError(f"Invalid memlimit, must be in the range [{_MEMLIMIT_MIN}, {_MEMLIMIT_MAX}]")
        if salt is None:
            salt = os.urandom(_SALT_BYTES)  # what secrets.token_bytes returns
        elif not isinstance(salt, _Bytes):
            raise TypeError(
                f"Invalid type for salt, expected bytes, bytearray, or memoryview; got {type(salt).__name__}"
            )
        salt = bytes(salt)
        if len(salt) != _SALT_BYTES:
            raise ValueError(f"Invalid salt size, {len(salt)} != {_SALT_BYTES}")
        params = cls(_engine().derive_key(source, opslimit, memlimit, salt))
        params._kdf = (opslimit, memlimit, salt)
        return params

    def _engine_args(self) -> Tuple[bytes, Optional[Tuple[int, int, bytes]]]:
        return self.key, self._kdf


class DecryptionParams:
    """Decryption parameters for a TensorDeserializer: ``from_key`` or ``from_string``.

    A passphrase-derived key costs what the file asks for; ``max_opslimit`` and ``max_memlimit``
    cap that cost (defaults: ``OpsLimit.SENSITIVE`` and ``MemLimit.SENSITIVE``, or
    ``$TENSORIZER_MAX_KDF_OPSLIMIT`` and ``$TENSORIZER_MAX_KDF_MEMLIMIT``), so a hostile file is
    refused before any derivation instead of spending minutes or all of RAM on it.
    """

    key: Optional[bytes]
    source: Optional[bytes]
    max_opslimit: Optional[int]
    max_memlimit: Optional[int]

    def __init__(self):
        self.key = None
        self.source = None
        self.max_opslimit = None
        self.max_memlimit = None

    def __repr__(self) -> str:
        kind = "key" if self.key is not None else "passphrase" if self.source else "empty"
        return f"<DecryptionParams ({kind})>"

    @classmethod
    def from_string(
        cls,
        source: Union[str, bytes],
        *,
        encoding: str = "utf-8",
        max_opslimit: Optional[int] = None,
        max_memlimit: Optional[int] = None,
    ) -> "DecryptionParams":
        """Decrypt files written with ``EncryptionParams.from_string(source)``.

        ``max_opslimit``/``max_memlimit`` raise the Argon2id cost a file may ask for (see the
        class docstring); None keeps the default.
        """
        if not source:
            raise ValueError("Source cannot be empty")
        if isinstance(source, str):
            source = source.encode(encoding)
        elif not isinstance(source, bytes):
            raise TypeError("Invalid source type: must be str or bytes")
        for name, limit in (("max_opslimit", max_opslimit), ("max_memlimit", max_memlimit)):
            if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
                raise ValueError(f"{name} must be a positive int or None, not {limit!r}")
        params = cls()
        params.source = source
        params.max_opslimit = None if max_opslimit is None else int(max_opslimit)
        params.max_memlimit = None if max_memlimit is None else int(max_memlimit)
        return params

    @classmethod
    def from_key(cls, key: bytes) -> "DecryptionParams":
        """Decrypt with an exact 32-byte key (works for any encrypted file)."""
        if not key:
            raise ValueError("Key cannot be empty")
        if len(key) != _KEY_BYTES:
            raise ValueError(
                f"Invalid decryption key length, should be {_KEY_BYTES} bytes;"
                f" got {len(key)} bytes instead."
                " DecryptionParams.from_key() should be used with a key"
                " read from EncryptionParams.key."
                " To decrypt with an arbitrary string instead of a binary key,"
                " use DecryptionParams.from_string() instead."
            )
        params = cls()
        params.key = bytes(key)
        return params

    def _engine_args(self) -> Tuple[Optional[bytes], Optional[bytes], Any]:
        """(key, passphrase, _C.KdfLimits) for _C.Reader.open."""
        if self.key is None and self.source is None:
            raise ValueError("Invalid DecryptionParams, no key or source string provided")
        limits = _engine().KdfLimits()
        if self.max_opslimit is not None:
            limits.opslimit = self.max_opslimit
        if self.max_memlimit is not None:
            limits.memlimit = self.max_memlimit
        return self.key, self.source, limits
