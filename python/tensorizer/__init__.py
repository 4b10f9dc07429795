"""tensorizer: save and load PyTorch weights in the .tensors format, on a C++ engine.

A drop-in for CoreWeave tensorizer's Python API (TensorSerializer, TensorDeserializer, ...);
the bytes are read, written, hashed and (de)crypted by the engine in ``tensorizer._C``.
"""

from . import serialization, stream_io
from ._version import __version__  # noqa: F401
from .serialization import *  # noqa: F401,F403

__all__ = [
    *serialization.__all__,
    "safetensors",  # noqa: F405 (imported on first use, below)
    "stream_io",
    "torch_compat",  # noqa: F405
    "utils",  # noqa: F405
]

# Submodules imported on first use, as attributes (`tensorizer.torch_compat`) or by name: a load
# needs none of them, and importing them would cost every `import tensorizer` about 3 ms.
_ON_FIRST_USE = ("safetensors", "torch_compat", "utils")


def __getattr__(name):
    if name in _ON_FIRST_USE:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted({*globals(), *_ON_FIRST_USE})
