"""Python's cycle collector paused while a model is imported and compiled.

Import and compile make objects by the hundred thousand. Python runs a full collection once
enough of them have survived two younger ones, and a full collection scans every object the
process holds: 400,000 with torch and TVM loaded, 0.12-0.27 s on a Zen 4. Such a collection
fell inside one compile in seven of a loop over the benchmark's models (the transformer
layer's: 0.57 s instead of 0.38). With the collector paused, what the compile makes and drops
is freed by reference counts, never promoted, and the next young collection frees its cycles.
A full collection that other work has made due still runs, when the pause ends: in one
benchmark run, one of its four (0.24-0.42 s each) fell at the end of an import.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_pauses = 0  # blocks under way that paused the collector (threads may compile at once)
_was_enabled = False  # its state before the first of them


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """The cycle collector off for the block, as it was before once the last such block ends."""
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
        _pauses += 1
        gc.disable()
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()
