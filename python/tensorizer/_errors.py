"""Exception classes shared by the package and the C++ extension.

The extension maps engine error codes to these (kHashMismatch -> HashMismatchError, kCrypto ->
CryptographyError) and to builtins (ValueError, OSError, FileNotFoundError, NotImplementedError).
"""

from ._crypt import CryptographyError as _BaseCryptographyError

__all__ = ["HashMismatchError", "CryptographyError"]


class HashMismatchError(Exception):
    """A tensor's stored CRC32/SHA-256 does not match its bytes."""


class CryptographyError(_BaseCryptographyError):
    """Encryption or decryption failed (wrong key, MAC failure, encryption mismatch)."""
