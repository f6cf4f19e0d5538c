"""Host buffers for the call path: faulted in once, on huge pages where the OS offers them,
and pooled by size so that a loop of calls touches warm pages.

On some of our machines the first touch of a fresh 64 MiB buffer costs 35-40 ms of page
faults against 4-6 ms to rewrite a warm one; a call that allocates its outputs anew pays
that every time. A pooled block is free again once nothing refers to it: every numpy view,
DLPack export (torch, TVM) and TVM tensor made from it keeps its root array alive, so the
root's reference count tells (as PyTorch's caching allocator knows a block by its tensors).
"""
from __future__ import annotations

import math
import mmap
import sys
import threading

import numpy as np

HUGE_PAGE = 2 << 20
PAGE = 4096
ALIGN = 64


class HostBuffer:
    """``nbytes`` of 64-byte aligned memory, every page already faulted in.

    At 2 MiB and more it is its own anonymous mapping, advised ``MADV_HUGEPAGE`` and aligned
    to a huge page, so that with THP in ``madvise`` mode (the default of most distributions)
    it is backed by 2 MiB pages: 512x fewer faults and TLB entries.
    """

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.huge = nbytes >= HUGE_PAGE and hasattr(mmap, "MADV_HUGEPAGE")
        if self.huge:
            span = math.ceil(nbytes / HUGE_PAGE) * HUGE_PAGE
            mapping = mmap.mmap(-1, span + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
            self._root = np.frombuffer(mapping, np.uint8)
            start = -self._root.ctypes.data % HUGE_PAGE
            try:
                mapping.madvise(mmap.MADV_HUGEPAGE, start, span)
            except OSError:  # a kernel without THP: ordinary pages
                self.huge = False
        else:
            self._root = np.empty(max(nbytes, 1) + ALIGN, np.uint8)
            start = -self._root.ctypes.data % ALIGN
        self.data = self._root[start:start + nbytes]
        self.data[::PAGE] = 0  # fault every page in now, not in the first call
        self._idle_refs = sys.getrefcount(self._root)

    def view(self, shape: tuple, dtype: str) -> np.ndarray:
        """The buffer as an array (its first ``prod(shape)`` elements)."""
        count = math.prod(shape)
        return self.data[:count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

    @property
    def in_use(self) -> bool:
        """Whether any array, tensor or DLPack export made from this buffer is still alive."""
        return sys.getrefcount(self._root) > self._idle_refs


class BufferPool:
    """Blocks by size; ``take`` gives an array on a block nothing refers to, or on a new one."""

    def __init__(self):
        self._blocks: dict[int, list[HostBuffer]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple, dtype: str) -> np.ndarray:
        """An array on a free block; the array itself marks the block used until it is dropped."""
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        size = max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)
        with self._lock:
            blocks = self._blocks.setdefault(size, [])
            block = next((b for b in blocks if not b.in_use), None)
            if block is None:
                block = HostBuffer(size)
                blocks.append(block)
            return block.view(shape, dtype)

    @property
    def blocks(self) -> int:
        return sum(len(b) for b in self._blocks.values())

    @property
    def bytes(self) -> int:
        return sum(b.nbytes for bs in self._blocks.values() for b in bs)
