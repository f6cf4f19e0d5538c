"""Host buffers for the call path: faulted in once, and pooled by size so that a loop of
calls touches warm pages.

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

import numpy as np

PAGE = 4096
ALIGN = 64
#: blocks of this many bytes or more are mappings of their own (see ``HostBuffer``)
OWN_MAPPING = 2 << 20


def alignment(nbytes: int) -> int:
    """Where a buffer of ``nbytes`` starts: on a page from a page up (see ``HostBuffer``), on a
    cache line below."""
    return PAGE if nbytes >= PAGE else ALIGN


class HostBuffer:
    """``nbytes`` of memory, every page already faulted in, starting on a page from 4 KiB up
    (a cache line below).

    Page alignment keeps a kernel's loads and stores at the same offsets in their pages: with a
    softmax's output one or two cache lines ahead of its input modulo 4 KiB, each store stalls
    the next load that matches it in the low 12 address bits (4K aliasing), and the kernel ran
    25% slower.

    From 2 MiB up it is an anonymous mapping of its own, in the OS's ordinary pages. Not a
    numpy array: numpy advises its arrays of 4 MiB and more ``MADV_HUGEPAGE``, and in 2 MiB
    pages a fresh 64 MiB buffer took 240-450 ms to fault in on our Zen 4 VM, against 27-43 ms
    in 4 KiB pages, while calls on warm buffers ran within 2-4% either way (softmax, Mish and
    GroupNorm + SiLU on 64 MiB, a 2048^2 matmul, conv-bn-relu-residual). A caller that keeps
    its outputs paid that at every new block, and every model at its first call. Below 2 MiB
    it is a numpy array: a mapping each would spend the process's map count (65530 on Linux by
    default) on a caller that keeps many small outputs.
    """

    def __init__(self, nbytes: int):
        if nbytes >= OWN_MAPPING:  # a mapping starts on a page
            # the array holds the mapping (its base): unmapped when the last view goes
            self.root = np.frombuffer(mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS), np.uint8)
        else:
            self.root = np.empty(max(nbytes, 1) + alignment(nbytes), np.uint8)
        start = -self.root.ctypes.data % alignment(nbytes)
        self.data = self.root[start:start + nbytes]
        self.data[::PAGE] = 0  # fault every page in now, not in the first call
        self._tensors: dict = {}  # (shape, dtype) -> (an array over the buffer, its TVM tensor), made once
        # the root's reference count when nothing outside refers to it (every view's base is the root)
        self.idle_refs = sys.getrefcount(self.root)

    def view(self, shape: tuple, dtype: str) -> np.ndarray:
        """The buffer as an array (its first ``prod(shape)`` elements)."""
        count = math.prod(shape)
        return self.data[:count * np.dtype(dtype).itemsize].view(dtype).reshape(shape)

    def template(self, shape: tuple, dtype: str) -> tuple[np.ndarray, object]:
        """The block as an array of ``shape`` and the TVM tensor over it that the kernels write
        through, both made on first use and kept (``template.view()`` lends it)."""
        key = (shape, dtype)
        if key not in self._tensors:
            import tvm_ffi

            template = self.view(shape, dtype)
            self._tensors[key] = (template, tvm_ffi.from_dlpack(template, require_alignment=ALIGN))
            self.idle_refs += 1  # the template holds the root (the export holds the template)
        return self._tensors[key]

    def lease(self, shape: tuple, dtype: str) -> tuple[np.ndarray, object]:
        """A new array over the buffer (it marks the buffer used until dropped) and its TVM tensor."""
        template, tensor = self.template(shape, dtype)
        return template.view(), tensor

    @property
    def in_use(self) -> bool:
        """Whether any array, tensor or DLPack export made from this buffer is still alive."""
        return sys.getrefcount(self.root) > self.idle_refs


def block_size(shape: tuple, dtype: str) -> int:
    """The pool's block size for an array: its bytes, rounded up to the alignment."""
    nbytes = math.prod(shape) * np.dtype(dtype).itemsize
    return max(ALIGN, (nbytes + ALIGN - 1) // ALIGN * ALIGN)


class BufferPool:
    """Blocks by size; ``take`` gives an array on a block nothing refers to, or on a new one.

    A pool belongs to one thread (``CompiledModel`` keeps one per calling thread): a block found
    free is leased by the same thread before anything else can see it, so no lock is needed,
    and a thread may check the block it lent last without asking the pool.
    """

    def __init__(self):
        self._blocks: dict[int, list[HostBuffer]] = {}

    def take(self, shape: tuple, dtype: str) -> tuple[np.ndarray, object]:
        """An array on a free block, and the block's TVM tensor of that shape; the array marks
        the block used until it (and every view of it) is dropped."""
        return self.take_sized(block_size(shape, dtype), shape, dtype)

    def take_sized(self, size: int, shape: tuple, dtype: str) -> tuple[np.ndarray, object]:
        """``take`` with the block size (``block_size(shape, dtype)``) worked out beforehand."""
        return self.take_block(size).lease(shape, dtype)

    def take_block(self, size: int) -> HostBuffer:
        """A block of ``size`` bytes nothing refers to, or a new one, to lease at once."""
        blocks = self._blocks.setdefault(size, [])
        for block in blocks:
            if not block.in_use:
                return block
        block = HostBuffer(size)
        blocks.append(block)
        return block

    @property
    def blocks(self) -> int:
        return sum(len(b) for b in self._blocks.values())
