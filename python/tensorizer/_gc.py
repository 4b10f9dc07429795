"""Loads and writes make Python objects by the thousand; the collector need not watch them."""

import contextlib
import gc


@contextlib.contextmanager
def _gc_paused():
    """Pauses Python's cyclic garbage collector while a load makes objects by the thousand: the
    collections they trigger walk every object of the process (torch's too), 40% of the time of a
    20,000-tensor load. Restores the collector's state afterwards."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
