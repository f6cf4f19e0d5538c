"""The six NNVM fuse patterns, ordered from simplest to most complex.

Values follow TVM's ``OpPatternKind`` (the ``op_pattern`` attribute that
``relax.transform.AnnotateTIROpPattern`` writes on PrimFuncs), so a pattern read from a
TVM-legalized kernel and one from our registry compare directly.
"""
from __future__ import annotations

import enum


class OpPattern(enum.IntEnum):
    """How an operator may fuse with its neighbours (NNVM's ``TOpPattern``)."""

    ELEMWISE = 0  # same shape in and out, element by element
    BROADCAST = 1  # each output element maps to one input element, axis order kept
    INJECTIVE = 2  # one input element per output element, axes may move (transpose)
    COMM_REDUCE = 3  # commutative reduction over some axes
    OUT_EWISE_FUSABLE = 4  # complex op (conv2d, matmul) that can take an elementwise epilogue
    OPAQUE = 8  # never fused

    @classmethod
    def from_tvm(cls, value: int) -> "OpPattern":
        """Map a TVM ``op_pattern`` value (7 = tuple, anything unknown) onto our six kinds."""
        try:
            return cls(int(value))
        except ValueError:
            return cls.INJECTIVE if int(value) == 7 else cls.OPAQUE

    def __str__(self) -> str:
        return _NAMES[self]


_NAMES = {
    OpPattern.ELEMWISE: "ElemWise",
    OpPattern.BROADCAST: "Broadcast",
    OpPattern.INJECTIVE: "Injective",
    OpPattern.COMM_REDUCE: "CommReduce",
    OpPattern.OUT_EWISE_FUSABLE: "OutEWiseFusable",
    OpPattern.OPAQUE: "Opaque",
}
