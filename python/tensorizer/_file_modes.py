"""The reference's checks of a file object passed to TensorSerializer or TensorDeserializer."""

from __future__ import annotations

import io
from typing import Any


def _check_file_mode(file_obj: Any, operation: str, message: str) -> None:
    """Raises ValueError(message + current mode) unless file_obj is a binary stream that can
    `operation` ("read" or "write")."""
    try:
        able = getattr(file_obj, {"read": "readable", "write": "writable"}[operation])()
    except AttributeError:
        able = hasattr(file_obj, operation)
    if isinstance(file_obj, io.TextIOBase) or not able:
        mode = getattr(file_obj, "mode", "")
        raise ValueError(message + (mode and f', current mode="{mode}"') + ")")
