"""Keys for tensor encryption: EncryptionParams and DecryptionParams (docs/format.md §3.2, §6.4).

Sealing and opening tensor data happens in the C++ engine (libsodium); this package only holds
keys and the passphrase parameters that travel to it.
"""

__all__ = ["available", "CryptographyError", "EncryptionParams", "DecryptionParams"]

# libsodium is linked into the engine, so encryption is always available.
available: bool = True


class CryptographyError(Exception):
    """Base of tensorizer.CryptographyError (mirrors the reference's internal class)."""


from ._params import DecryptionParams, EncryptionParams  # noqa: E402
