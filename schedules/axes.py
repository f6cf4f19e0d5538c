"""The ImplGraph axis model (implgraph_axes.txt): axes, their transformations and rules.

An ``ImplGraph`` describes how one ScheduleGroup (one block of a kernel) iterates:
``sched.axis`` is its axes in loop order, each with a ``type`` (Original, BlockOuter,
BlockInner, TileOuter, TileInner, Merged), ``from`` (the axis or axes it came from),
``split_pair`` (the other half of its split) and its size, as a number and as the seed's
expression (``ceil(s0/s0b)``). Transformations follow the seed's rules and raise
``AxisRuleError`` naming the rule they break:

- a block split (``z0`` -> ``z0B``, ``z0b``) distributes the outer part over the cores; an
  ImplGraph has at most one BlockOuter axis;
- a tile split (``z1`` -> ``z1T``, ``z1t``) has no special meaning;
- a merge fuses axes that are consecutive in ``sched.axis``; an axis produced by a split
  and then moved by a reorder cannot be merged any more;
- a reorder permutes the axes.

``loop_axis`` is the loop stop axis: it and the axes before it are loops; the axes after it
are the data one step computes (``computed_axis``), which a CPU vectorizes. The output
buffer is a separate position, ``buffer_axis``: the loop that allocates it (the seed's
``buffer[s1 * s2 * s3]`` under ``q0``), so the buffer spans the axes after it
(``vectorized_axis``, with its strides in ``vectorized_stride``). By default the buffer sits at
the loop axis and holds one step's data, which is what our CPU policies build. Every transformation is also recorded as
a step, so the ImplGraph can be applied to a ``tvm.s_tir.Schedule`` (``schedule_result``).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field, replace

from schedules.primitives import prim

AT_LOOP_AXIS = "<at loop_axis>"  # ImplGraph.buffer_axis's default: the buffer holds one step's data


class AxisType(enum.Enum):
    ORIGINAL = "Original"
    BLOCK_OUTER = "BlockOuter"
    BLOCK_INNER = "BlockInner"
    TILE_OUTER = "TileOuter"
    TILE_INNER = "TileInner"
    MERGED = "Merged"


class AxisRuleError(ValueError):
    """A transformation the ImplGraph rules forbid; the message names the rule."""


@dataclass(frozen=True)
class Axis:
    name: str
    type: AxisType
    size: int
    size_expr: str
    from_: tuple[str, ...] = ()  # the seed's ``from``
    split_pair: str | None = None
    reordered: bool = False  # moved by a reorder after it was split (it can no longer merge)
    reduce: bool = False  # iterates a reduction

    @property
    def is_split(self) -> bool:
        return self.type in (AxisType.BLOCK_OUTER, AxisType.BLOCK_INNER, AxisType.TILE_OUTER, AxisType.TILE_INNER)


@dataclass
class Step:
    """One recorded transformation: ``op`` with its axis names and arguments."""

    op: str
    axes: tuple[str, ...]
    args: tuple = ()


#: the widest vectorized loop a schedule may make, in elements: four AVX-512 registers of float32.
#: LLVM's time grows faster than the vector: a schedule bug that vectorized a row of 512 floats
#: took 48 s to compile one kernel. A wider one fails the policy's trial, which falls back.
MAX_VECTOR_LANES = 64


@dataclass
class ImplGraph:
    """The axes of one ScheduleGroup and the transformations that made them.

    Bound to a schedule (``bind``), every transformation is also applied to the block's
    loops there, so the ImplGraph always describes the loops TVM will build.
    """

    block: str
    axis: list[Axis]
    loop_axis: str | None = None
    steps: list[Step] = field(default_factory=list)
    buffer_axis: str | None = AT_LOOP_AXIS  # the loop that allocates the output buffer (None: outside all)
    parallel: str | None = None
    unrolled: list[str] = field(default_factory=list)
    sch: object = field(default=None, repr=False)  # tvm.s_tir.Schedule when bound
    loops: dict = field(default_factory=dict, repr=False)  # axis name -> LoopRV

    def bind(self, sch, loops) -> "ImplGraph":
        if len(loops) != len(self.axis):
            raise ValueError(f"{self.block}: {len(loops)} loops for {len(self.axis)} axes")
        self.sch = sch
        self.loops = dict(zip(self.names, loops))
        if self.loop_axis is None and self.axis:
            self.loop_axis = self.axis[-1].name  # nothing vectorized yet: every axis is a loop
        return self

    @classmethod
    def of_block(cls, block: str, extents: list[int], reduce: list[bool] | None = None,
                 prefix: str = "z") -> "ImplGraph":
        reduce = reduce or [False] * len(extents)
        axes = [Axis(f"{prefix}{i}", AxisType.ORIGINAL, int(n), f"s{i}", reduce=r)
                for i, (n, r) in enumerate(zip(extents, reduce))]
        return cls(block, axes, axes[-1].name if axes else None)

    # ------------------------------------------------------------------ lookup
    def __getitem__(self, name: str) -> Axis:
        for a in self.axis:
            if a.name == name:
                return a
        raise KeyError(f"{self.block} has no axis {name!r}; axes are {[a.name for a in self.axis]}")

    def index(self, name: str) -> int:
        return [a.name for a in self.axis].index(self[name].name)

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.axis]

    # ------------------------------------------------------------------ transformations
    def block_split(self, name: str, inner: int) -> tuple[str, str]:
        """``z`` -> ``zB`` (over the cores), ``zb`` of size ``inner``."""
        if any(a.type is AxisType.BLOCK_OUTER for a in self.axis):
            raise AxisRuleError(f"{self.block}: an ImplGraph has at most one block-outer axis "
                                f"({[a.name for a in self.axis if a.type is AxisType.BLOCK_OUTER][0]} exists)")
        return self._split(name, inner, "B", "b", AxisType.BLOCK_OUTER, AxisType.BLOCK_INNER, "block_split")

    def tile_split(self, name: str, inner: int) -> tuple[str, str]:
        """``z`` -> ``zT``, ``zt`` of size ``inner``."""
        return self._split(name, inner, "T", "t", AxisType.TILE_OUTER, AxisType.TILE_INNER, "tile_split")

    def _split(self, name, inner, up, low, outer_type, inner_type, op) -> tuple[str, str]:
        axis = self[name]
        inner = int(inner)
        if not 1 <= inner <= axis.size:
            raise AxisRuleError(f"{self.block}: cannot split {name} of size {axis.size} by {inner}")
        i = self.index(name)
        outer_name, inner_name = self._fresh(name + up), self._fresh(name + low)
        inner_sym = _sym(inner_name)
        outer = Axis(outer_name, outer_type, math.ceil(axis.size / inner), f"ceil({_sym(name)}/{inner_sym})",
                     (name,), inner_name, reduce=axis.reduce)
        inner_axis = Axis(inner_name, inner_type, inner, inner_sym, (name,), outer_name, reduce=axis.reduce)
        self.axis[i:i + 1] = [outer, inner_axis]
        self.steps.append(Step(op, (name,), (inner, outer_name, inner_name, axis.size)))
        if self.sch is not None:
            lo, li = prim.split(self.sch, self.loops.pop(name), [None, inner])
            self.loops[outer_name], self.loops[inner_name] = lo, li
        return outer_name, inner_name

    def merge(self, *names: str) -> str:
        """Fuse axes that are consecutive in ``sched.axis`` into one Merged axis."""
        if len(names) < 2:
            raise AxisRuleError(f"{self.block}: a merge needs at least two axes")
        idx = [self.index(n) for n in names]
        if idx != list(range(idx[0], idx[0] + len(idx))):
            raise AxisRuleError(f"{self.block}: only consecutive axes can merge; {list(names)} are at "
                                f"positions {idx} of {self.names}")
        moved = [n for n in names if self[n].reordered]
        if moved:
            raise AxisRuleError(f"{self.block}: {moved[0]} was split and then reordered, so it cannot merge")
        if len({self[n].reduce for n in names}) > 1:
            raise AxisRuleError(f"{self.block}: cannot merge a reduction axis with a spatial one ({list(names)})")
        axes = [self[n] for n in names]
        merged = Axis(self._fresh("".join(names)), AxisType.MERGED, math.prod(a.size for a in axes),
                      "*".join(_sym(n) for n in names), tuple(names), reduce=axes[0].reduce)
        self.axis[idx[0]:idx[-1] + 1] = [merged]
        self.steps.append(Step("merge", tuple(names), (merged.name,)))
        if self.sch is not None:
            self.loops[merged.name] = prim.fuse(self.sch, *[self.loops.pop(n) for n in names])
        return merged.name

    def reorder(self, *names: str) -> None:
        """Put ``names`` in this order, in the positions they occupy now."""
        positions = sorted(self.index(n) for n in names)
        moved = dict(zip(positions, names))
        before = self.names
        new = list(self.axis)
        for pos, n in moved.items():
            axis = self[n]
            if axis.is_split and before[pos] != n:
                axis = replace(axis, reordered=True)
            new[pos] = axis
        self.axis = new
        self.steps.append(Step("reorder", tuple(names)))
        if self.sch is not None:
            prim.reorder(self.sch, *[self.loops[n] for n in names])

    def set_loop_axis(self, name: str | None) -> None:
        if name is not None:
            self[name]
        self.loop_axis = name

    def set_buffer_axis(self, name: str | None) -> None:
        """The buffer is allocated inside loop ``name`` (None: outside every loop); it must
        not sit below the loop axis, whose steps each write a part of it."""
        if name is not None and self.loop_axis is not None and self.index(name) > self.index(self.loop_axis):
            raise AxisRuleError(f"{self.block}: the buffer cannot sit inside {name}, below the loop axis "
                                f"{self.loop_axis}: each step writes a part of it")
        self.buffer_axis = name

    def mark_parallel(self, name: str) -> None:
        """Run ``name`` across the cores (the BlockOuter axis, or the outermost loop)."""
        self[name]
        self.parallel = name
        self.steps.append(Step("parallel", (name,)))
        if self.sch is not None:
            prim.parallel(self.sch, self.loops[name])

    def mark_vectorized(self, name: str) -> None:
        if self[name].size > MAX_VECTOR_LANES:
            raise AxisRuleError(f"{self.block}: {name} would be a vector of {self[name].size} lanes; at most "
                                f"{MAX_VECTOR_LANES}")
        self.set_loop_axis(self.names[self.index(name) - 1] if self.index(name) else None)
        self.steps.append(Step("vectorize", (name,)))
        if self.sch is not None:
            prim.vectorize(self.sch, self.loops[name])

    def mark_unrolled(self, name: str) -> None:
        self[name]
        self.unrolled.append(name)
        self.steps.append(Step("unroll", (name,)))
        if self.sch is not None:
            prim.unroll(self.sch, self.loops[name])

    def _fresh(self, name: str) -> str:
        taken = set(self.names)
        out, n = name, 1
        while out in taken:
            out, n = f"{name}{n}", n + 1
        return out

    # ------------------------------------------------------------------ the seed's output fields
    def _after(self, name: str | None) -> list[str]:
        return self.names if name is None else self.names[self.index(name) + 1:]

    @property
    def computed_axis(self) -> list[str]:
        """The axes one step computes: those after ``loop_axis`` (all of them if it is None)."""
        return self._after(self.loop_axis)

    @property
    def vectorized_axis(self) -> list[str]:
        """The axes the output buffer spans: those after ``buffer_axis``."""
        return self._after(self.loop_axis if self.buffer_axis == AT_LOOP_AXIS else self.buffer_axis)

    def merge_all(self, names: list[str]) -> str:
        """Merge ``names`` (consecutive) into one axis; a single name is returned as is."""
        return self.merge(*names) if len(names) > 1 else names[0]

    @property
    def vectorized_stride(self) -> list[int]:
        sizes = [self[n].size for n in self.vectorized_axis]
        return [math.prod(sizes[i + 1:]) for i in range(len(sizes))]

    @property
    def vectorized_stride_expr(self) -> list[str]:
        """The strides as the seed writes them: ``[s2*s3, s3, 1]``."""
        exprs = [self[n].size_expr for n in self.vectorized_axis]
        return ["*".join(exprs[i + 1:]) or "1" for i in range(len(exprs))]

    def table(self) -> str:
        """The axis table: name, type, size, from, split_pair, and the loop / vector roles."""
        rows = [f"ImplGraph of {self.block}: sched.axis = [{', '.join(self.names)}], "
                f"sched.loop_axis = {self.loop_axis}",
                f"  computed_axis = [{', '.join(self.computed_axis)}], "
                f"vectorized_axis = [{', '.join(self.vectorized_axis)}], "
                f"vectorized_stride = [{', '.join(self.vectorized_stride_expr)}] = {self.vectorized_stride}",
                f"  {'axis':10s} {'type':11s} {'size':>6s} {'expr':18s} {'from':12s} {'split_pair':10s} role"]
        for a in self.axis:
            role = []
            if a.name == self.parallel:
                role.append("parallel")
            if a.name in self.computed_axis:
                role.append("vector")
            if a.name in self.unrolled:
                role.append("unroll")
            if a.reduce:
                role.append("reduce")
            rows.append(f"  {a.name:10s} {a.type.value:11s} {a.size:6d} {a.size_expr:18s} "
                        f"{','.join(a.from_) or '-':12s} {a.split_pair or '-':10s} {' '.join(role)}")
        return "\n".join(rows)


def _sym(name: str) -> str:
    """The symbol of an axis's size, after the seed: z0 -> s0, z0b -> s0b, z1T -> s1T."""
    return "s" + name[1:] if name.startswith("z") else f"s_{name}"
