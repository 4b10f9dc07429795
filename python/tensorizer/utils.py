"""Helpers of the reference API (docs/reference-api.md §6.6): byte formatting, devices, memory usage, and
``no_init_or_tensor`` for building models without allocating or initialising their weights."""

from __future__ import annotations

import contextlib
import contextvars
import threading
from typing import Callable, ContextManager, NamedTuple, Optional, TypeVar, Union

import torch

try:
    import resource
except ImportError:  # not on Windows
    resource = None


def _psutil():
    """psutil, imported on first use (importing it costs a fresh process ~7 ms), or None."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil


__all__ = [
    "convert_bytes",
    "get_device",
    "GlobalGPUMemoryUsage",
    "TorchGPUMemoryUsage",
    "CPUMemoryUsage",
    "MemoryUsage",
    "get_mem_usage",
    "get_gpu_name",
    "no_init_or_tensor",
]


def convert_bytes(num, decimal: bool = True) -> str:
    """Formats a byte count with one decimal, e.g. ``"123.4 MB"`` (or ``"117.7 MiB"``)."""
    step, units = (
        (1000.0, ("bytes", "KB", "MB", "GB", "TB", "PB"))
        if decimal
        else (
            1024.0,
            ("bytes", "KiB", "MiB", "GiB", "TiB", "PiB"),
        )
    )
    unit = units[-1]
    for candidate in units[:-1]:
        if num < step:
            unit = candidate
            break
        num /= step
    return "%3.1f %s" % (num, unit)


def get_device() -> torch.device:
    """``cuda`` if available, else ``cpu``."""
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


class GlobalGPUMemoryUsage(NamedTuple):
    """Memory of one GPU across all processes, in bytes."""

    total: int
    free: int
    used: int

    @classmethod
    def now(cls, device=None) -> Optional["GlobalGPUMemoryUsage"]:
        if not torch.cuda.is_available():
            return None
        free, total = torch.cuda.mem_get_info(device)
        return cls(total, free, total - free)

    def __str__(self):
        return "GPU: (U: {:,}MiB F: {:,}MiB T: {:,}MiB)".format(self.used >> 20, self.free >> 20, self.total >> 20)


class TorchGPUMemoryUsage(NamedTuple):
    """PyTorch's own memory statistics on one GPU, in bytes."""

    reserved: int
    reserved_max: int
    used: int
    used_max: int

    @classmethod
    def now(cls, device=None) -> Optional["TorchGPUMemoryUsage"]:
        if not torch.cuda.is_available():
            return None
        stats = torch.cuda.memory.memory_stats(device)
        return cls(
            stats.get("reserved_bytes.all.current", 0),
            stats.get("reserved_bytes.all.peak", 0),
            stats.get("allocated_bytes.all.current", 0),
            stats.get("allocated_bytes.all.peak", 0),
        )

    def __str__(self):
        return "TORCH: (R: {:,}MiB/{:,}MiB, A: {:,}MiB/{:,}MiB)".format(
            self.reserved >> 20, self.reserved_max >> 20, self.used >> 20, self.used_max >> 20
        )


def _available_ram() -> int:
    psutil = _psutil()
    if psutil is not None:
        return psutil.virtual_memory().available
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) << 10
    return 0


class CPUMemoryUsage(NamedTuple):
    """Peak resident set size (this process and its children) and available RAM, in bytes."""

    maxrss: int
    free: int

    @classmethod
    def now(cls) -> "CPUMemoryUsage":
        if resource is not None:
            maxrss = (
                resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                + resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
            ) << 10
        else:
            process = _psutil().Process()
            maxrss = process.memory_info().rss + sum(p.memory_info().rss for p in process.children(True))
        return cls(maxrss, _available_ram())

    def __str__(self):
        return "CPU: (maxrss: {:,}MiB F: {:,}MiB)".format(self.maxrss >> 20, self.free >> 20)


class MemoryUsage(NamedTuple):
    """CPU, GPU and PyTorch memory statistics together (GPU parts None without CUDA)."""

    cpu: CPUMemoryUsage
    gpu: Optional[GlobalGPUMemoryUsage]
    torch: Optional[TorchGPUMemoryUsage]

    @classmethod
    def now(cls, device=None) -> "MemoryUsage":
        gpu = torch_info = None
        try:
            gpu = GlobalGPUMemoryUsage.now(device)
            torch_info = TorchGPUMemoryUsage.now(device)
        except AssertionError:
            pass
        return cls(CPUMemoryUsage.now(), gpu, torch_info)

    def __str__(self):
        return " ".join(str(item) for item in self if item)


def get_mem_usage() -> str:
    """``str(MemoryUsage.now())``."""
    return str(MemoryUsage.now())


def get_gpu_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "N/A"


Model = TypeVar("Model")


class _NoInit:
    """State of no_init_or_tensor: torch patches are installed while any context is active,
    and act only in contexts (threads/coroutines) that entered it."""

    modules = (torch.nn.Linear, torch.nn.Embedding, torch.nn.LayerNorm)
    originals = tuple((m, m.reset_parameters) for m in modules)
    original_empty = torch.empty
    active = contextvars.ContextVar("tensorizer_no_init_active", default=False)
    count = 0
    lock = threading.Lock()

    @classmethod
    def _skip_when_active(cls, func):
        def reset_parameters(*args, **kwargs):
            if not cls.active.get():
                return func(*args, **kwargs)

        return reset_parameters

    @classmethod
    def _empty(cls, *args, **kwargs):
        if cls.active.get():
            kwargs["device"] = "meta"
        return cls.original_empty(*args, **kwargs)

    @classmethod
    @contextlib.contextmanager
    def context(cls):
        if cls.active.get():  # re-entrant
            yield
            return
        with cls.lock:
            cls.count += 1
            if cls.count == 1:
                for module, original in cls.originals:
                    module.reset_parameters = cls._skip_when_active(original)
                torch.empty = cls._empty
        token = cls.active.set(True)
        try:
            yield
        finally:
            cls.active.reset(token)
            with cls.lock:
                cls.count -= 1
                if cls.count == 0:
                    torch.empty = cls.original_empty
                    for module, original in cls.originals:
                        module.reset_parameters = original


def no_init_or_tensor(loading_code: Optional[Callable[..., Model]] = None) -> Union[Model, ContextManager]:
    """Builds models without initialising weights: ``Linear``/``Embedding``/``LayerNorm``
    ``reset_parameters`` become no-ops and ``torch.empty`` allocates on the ``meta`` device, in
    the current thread/coroutine only. Use as a context manager, or pass a callable to run.
    """
    if loading_code is None:
        return _NoInit.context()
    if callable(loading_code):
        with _NoInit.context():
            return loading_code()
    raise TypeError(
        "no_init_or_tensor() expected a callable to evaluate, or None if being used as a context"
        f' manager; got an object of type "{type(loading_code).__name__}" instead.'
    )
