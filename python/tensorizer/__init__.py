"""tensorizer: save and load PyTorch weights in the .tensors format, on a C++ engine.

A drop-in for CoreWeave tensorizer's Python API (TensorSerializer, TensorDeserializer, ...);
the bytes are read, written, hashed and (de)crypted by the engine in ``tensorizer._C``.
"""

from . import safetensors, serialization, stream_io, torch_compat, utils
from ._version import __version__  # noqa: F401
from .serialization import *  # noqa: F401,F403

__all__ = [
    *serialization.__all__,
    "safetensors",
    "stream_io",
    "torch_compat",
    "utils",
]
