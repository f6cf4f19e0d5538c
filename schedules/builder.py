"""ScheduleResult and ScheduleGroup, and the builder that makes them on a ``tvm.s_tir.Schedule``.

A ScheduleResult is one complete implementation of a kernel: one ScheduleGroup per block
(per sub-computation: a reduction's partial sums, the reduction, the pointwise work around
it), each described by its ImplGraph. Groups may share outer axes (a stage computed under
another's row loop): the axes they share keep the owner's names.

Policies (``schedules.policies``) build results through a ``ScheduleBuilder``: per-group
axis transformations go through the group's bound ImplGraph, operations that involve
several blocks (rfactor, compute_at, cache_write, ...) through the builder, which rebinds
the ImplGraphs of the blocks whose loops TVM regenerated.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from schedules.analysis import REDUCE, BlockInfo, block_infos, root_blocks, stmt
from schedules.axes import Axis, AxisType, ImplGraph
from schedules.primitives import prim


@dataclass
class ScheduleGroup:
    """One sub-computation of a kernel (one block) and how it iterates."""

    block: str
    impl: ImplGraph
    role: str = ""  # what the policy made of it: "row reduction", "epilogue", ...
    moved: bool = False  # another block's policy placed it after its own policy had (its role says how)


@dataclass
class ScheduleResult:
    """One complete implementation of a kernel: the policies used, their knobs, the groups."""

    kernel: str
    choices: list[tuple[str, dict]]  # (policy name, knobs) per scheduled block or block set
    groups: list[ScheduleGroup]
    func: tirx.PrimFunc
    trace: str = ""

    @property
    def policy(self) -> str:
        return " + ".join(p for p, _ in self.choices)

    def summary(self) -> str:
        """``block:policy`` for the blocks a policy chose, ``block:role`` for the blocks it
        placed around them (partial sums, an epilogue on the tile, ...)."""
        chosen = {p.partition("@")[2]: p.partition("@")[0] for p, _ in self.choices if "@" in p}
        whole = [p for p, _ in self.choices if "@" not in p]
        parts = []
        for g in self.groups:
            label = (g.role if g.moved else chosen.get(g.block)) or (whole[0] if whole else g.role or "unscheduled")
            parts.append(f"{g.block}:{label}")
        return ", ".join(parts)

    def describe(self) -> str:
        """Every group's axis table."""
        head = f"ScheduleResult of {self.kernel}: " + "; ".join(f"{p} {k}" for p, k in self.choices)
        return "\n".join([head] + [f"[{g.role or 'group'}] " + g.impl.table() for g in self.groups])

    def script(self) -> str:
        return tvm.IRModule({"main": self.func}).script()


@dataclass
class ScheduleBuilder:
    """A schedule of one PrimFunc with an ImplGraph bound to every block."""

    func: tirx.PrimFunc
    sch: s_tir.Schedule = field(init=False)
    groups: dict[str, ScheduleGroup] = field(init=False, default_factory=dict)
    choices: list = field(init=False, default_factory=list)
    into_output: list = field(init=False, default_factory=list)  # (scratch, output) buffer names
    prefetches: list = field(init=False, default_factory=list)  # (block, axis, (row block, row axis), rows)
    _infos: tuple | None = field(init=False, default=None, repr=False)  # (PrimFunc, its block infos)

    def __post_init__(self):
        self.sch = s_tir.Schedule(tvm.IRModule({"main": self.func}))
        for block in root_blocks(self.sch):
            # a block with no loop (a 0-d result: the mean of a loss) made TVM's rfactor fail
            # on every other block of the kernel ("block_realize == old_block_realize_"), whose
            # row reductions then ran one scalar at a time (log_softmax + mean of a column of
            # 2048 x 1000: 4.4 ms of kernel, 0.44 with vectors); a loop of extent 1 avoids that
            if not prim.get_loops(self.sch, block):
                prim.add_unit_loop(self.sch, block)
        for name in self.block_names():
            self.groups[name] = ScheduleGroup(name, self._fresh_impl(name))

    # ------------------------------------------------------------------ blocks
    def infos(self) -> list[BlockInfo]:
        """``block_infos`` of the schedule as it stands, computed once for each state of it: the
        heuristic asks before choosing a whole-kernel form and PersistentRows again in its
        ``applies`` (3 ms a kernel of the transformer layer's, Zen 4)."""
        func = self.sch.mod["main"]
        if self._infos is None or not self._infos[0].same_as(func):
            self._infos = (func, block_infos(self.sch))
        return list(self._infos[1])

    def runs(self, name: str) -> int:
        """How many times block ``name``'s body runs: the product of its loops' extents (after
        a compute_at, more than it has elements where it is computed again under the loop)."""
        return math.prod(a.size for a in self.impl(name).axis)

    def block_names(self) -> list[str]:
        return [stmt(self.sch, b).name_hint for b in root_blocks(self.sch)]

    def block(self, name: str):
        return stmt(self.sch, prim.get_sblock(self.sch, name))

    def impl(self, name: str) -> ImplGraph:
        return self.groups[name].impl

    def _fresh_impl(self, name: str, shared: list[Axis] | None = None) -> ImplGraph:
        """An ImplGraph over the block's current loops; the first ``len(shared)`` loops are
        another group's axes (kept with their names), the others get fresh names."""
        block = prim.get_sblock(self.sch, name)
        loops = prim.get_loops(self.sch, block)
        stmts = [stmt(self.sch, loop) for loop in loops]
        shared = shared or []
        kinds = _loop_kinds(stmt(self.sch, block), stmts)
        axes = list(shared)
        taken = {a.name for a in shared}
        for i, loop in enumerate(stmts[len(shared):], start=len(shared)):
            fresh = f"z{i}"
            while fresh in taken:  # a shared axis made by a split or merge can hold the name
                fresh += "'"
            taken.add(fresh)
            axes.append(Axis(fresh, AxisType.ORIGINAL, int(loop.extent), f"s{i}", reduce=kinds[i]))
        return ImplGraph(name, axes).bind(self.sch, loops)

    # ------------------------------------------------------------------ multi-block operations
    def rfactor(self, name: str, axis: str, factor_axis: int = 0) -> str:
        """Partial reductions over ``axis`` (the returned ``*_rf`` group); ``name`` then
        reduces them."""
        rf = prim.rfactor(self.sch, self.impl(name).loops[axis], factor_axis=factor_axis)
        rf_name = stmt(self.sch, rf).name_hint
        self.groups[rf_name] = ScheduleGroup(rf_name, self._fresh_impl(rf_name), "partial reduction")
        self.groups[name].impl = self._fresh_impl(name)
        return rf_name

    def compute_at(self, name: str, target: str, axis: str) -> None:
        """Compute ``name`` (a producer) inside ``target``'s loop ``axis``."""
        prim.compute_at(self.sch, prim.get_sblock(self.sch, name), self.impl(target).loops[axis])
        self._rebind_under(name, target, axis)

    def reverse_compute_at(self, name: str, target: str, axis: str) -> None:
        """Compute ``name`` (a consumer) inside ``target``'s loop ``axis``."""
        prim.reverse_compute_at(self.sch, prim.get_sblock(self.sch, name), self.impl(target).loops[axis])
        self._rebind_under(name, target, axis)

    def cache_write(self, name: str) -> str:
        """Accumulate ``name`` in a local buffer; the returned group copies it out."""
        cache = prim.cache_write(self.sch, prim.get_sblock(self.sch, name), 0, "global")
        copy_out = stmt(self.sch, cache).name_hint  # the new block that copies the tile out
        for n in self.block_names():
            if n not in self.groups:
                self.groups[n] = ScheduleGroup(n, self._fresh_impl(n), "write-back")
        return copy_out

    def compute_inline(self, name: str) -> None:
        """Inline block ``name`` (a copy, say) into its consumers; its group goes."""
        prim.compute_inline(self.sch, prim.get_sblock(self.sch, name))
        del self.groups[name]

    def decompose_reduction(self, name: str, axis: str, flat_init: int = 0) -> None:
        """Hoist the reduction's initialization out of ``axis``. ``flat_init`` (a vector's
        elements): the initialization's loops are put in its buffer's order and merged into one
        loop, vectorized. Hoisted above a split reduction, it would get the register tile's
        loops, unrolled: hundreds of vector stores from one base address, on which LLVM's code
        generation spent 0.2 s (the transformer layer's output projection, Zen 4) for a memset."""
        depth = self.impl(name).index(axis)
        init = prim.decompose_reduction(self.sch, prim.get_sblock(self.sch, name), self.impl(name).loops[axis])
        if flat_init:
            self._flatten(init, depth, flat_init)

    def _flatten(self, block: s_tir.SBlockRV, depth: int, lanes: int) -> None:
        """Block ``block``'s loops from ``depth`` on, which drive only spatial iterators, as one
        loop in the order of the iterators they drive, split by ``lanes`` and vectorized."""
        loops = prim.get_loops(self.sch, block)[depth:]
        stmts = [stmt(self.sch, loop) for loop in loops]
        values = stmts[-1].body.iter_values
        # each loop at its first iterator; one driving none goes last
        first = [min(d, default=len(values)) for d in _iterators_driven(values, stmts)]
        order = [loop for _, loop in sorted(zip(first, loops), key=lambda p: p[0])]
        prim.reorder(self.sch, *order)
        flat = prim.fuse(self.sch, *order)
        if int(stmt(self.sch, flat).extent) % lanes == 0:
            prim.vectorize(self.sch, prim.split(self.sch, flat, [None, lanes])[1])

    def write_into_output(self, name: str) -> bool:
        """Let block ``name`` write its full-size result into the kernel's output, which the
        last block then updates in place (softmax's exp rows): no scratch buffer, and no
        allocation per row. Applies when the last block reads that result only at the element
        it writes; the caller guarantees that all stages run one row at a time under shared
        loops (the persistent-row form), so that no row is overwritten before it is read."""
        names = self.block_names()
        last = self.block(names[-1])
        block = self.block(name)
        if name == names[-1] or len(block.writes) != 1 or len(last.writes) != 1:
            return False
        tmp, out = block.writes[0].source, last.writes[0].source
        root = stmt(self.sch, prim.get_sblock(self.sch, "root"))
        if not any(b.same_as(tmp) for b in root.alloc_buffers) or \
                not any(p.same_as(out) for p in self.sch.mod["main"].params):
            return False
        if tmp.dtype != out.dtype or [int(d) for d in tmp.shape] != [int(d) for d in out.shape]:
            return False
        if any(self.block(n).writes[0].source.same_as(out) for n in names[:-1]):
            return False
        reads = [r for r in last.reads if r.source.same_as(tmp)]
        if len(reads) != 1 or not tvm_ffi.structural_equal(reads[0].region, last.writes[0].region):
            return False
        self.into_output.append((tmp.name, out.name))
        return True

    def prefetch_next_row(self, block: str, axis: str, row: tuple[str, str], rows: int) -> None:
        """While ``block``'s loop ``axis`` walks a row (one vector an iteration), fetch the
        same place of the next row of every input shaped like the output (``rows`` rows of
        contiguous elements, which ``row`` = (block, axis) walks) into the cache, so that the
        next row's loads overlap this row's arithmetic instead of following it."""
        self.prefetches.append((block, axis, row, rows))

    def _rebind_under(self, name: str, target: str, axis: str) -> None:
        owner = self.impl(target)
        shared = owner.axis[:owner.index(axis) + 1]
        self.groups[name].impl = self._fresh_impl(name, shared)
        # the target's own loop handles are unchanged; the moved block's are new
        for a in shared:
            self.groups[name].impl.loops[a.name] = owner.loops[a.name]

    def copy(self) -> "ScheduleBuilder":
        """An independent builder in the same state (a policy that fails leaves this intact)."""
        other = object.__new__(ScheduleBuilder)
        other.func = self.func
        other.sch = self.sch.copy()  # the copy keeps the loop and block handles valid
        other.groups = {}
        for name, g in self.groups.items():
            impl = replace(g.impl, axis=list(g.impl.axis), steps=list(g.impl.steps),
                           unrolled=list(g.impl.unrolled), loops=dict(g.impl.loops), sch=other.sch)
            other.groups[name] = ScheduleGroup(g.block, impl, g.role, g.moved)
        other.choices = list(self.choices)
        other.into_output = list(self.into_output)
        other.prefetches = list(self.prefetches)
        other._infos = self._infos  # keyed by its PrimFunc: valid while the copy is unchanged
        return other

    # ------------------------------------------------------------------ result
    def choose(self, policy: str, knobs: dict) -> None:
        self.choices.append((policy, dict(knobs)))

    def result(self, kernel: str) -> ScheduleResult:
        order = self.block_names()
        groups = sorted(self.groups.values(), key=lambda g: order.index(g.block) if g.block in order else len(order))
        func = self.sch.mod["main"]
        for tmp, out in self.into_output:
            func = _alias_to_output(func, tmp, out)
        for block, axis, (row_block, row_axis), rows in self.prefetches:
            impl = self.impl(block)
            span = math.prod(a.size for a in impl.axis[impl.index(axis) + 1:])
            loop = stmt(self.sch, impl.loops[axis]).loop_var
            row = stmt(self.sch, self.impl(row_block).loops[row_axis]).loop_var
            func = _prefetch_next_row(func, loop, span, row, rows)
        return ScheduleResult(kernel, list(self.choices), groups, func, str(self.sch.trace))


_CACHE_LINE = 64  # bytes; x86 and most Arm cores


def _prefetch_next_row(func: tirx.PrimFunc, loop: tirx.Var, span: int, row: tirx.Var, rows: int) -> tirx.PrimFunc:
    """``func`` with prefetches at the top of ``loop``'s body for each input shaped like the
    output (``rows`` rows): the cache lines of elements ``loop * span`` to ``(loop + 1) * span``
    of row ``row + 1`` (the last row prefetches itself)."""
    out = func.params[-1]
    shape = [int(d) for d in out.shape]
    n_rows, n_cols = rows, math.prod(shape) // rows
    inputs = [p for p in func.params[:-1] if [int(d) for d in p.shape] == shape and p.dtype == out.dtype]
    if not inputs:
        return func
    dtype = str(row.ty)  # TVM's own kernels index in int64

    def c(value: int) -> tirx.Expr:
        return tirx.const(value, dtype)

    step = loop if str(loop.ty) == dtype else tirx.Cast(dtype, loop)
    start = tirx.Min(row + c(1), c(n_rows - 1)) * c(n_cols) + step * c(span)
    hints = []
    line = max(1, _CACHE_LINE // (tvm.DataType(out.dtype).bits // 8))
    for offset in range(0, span, line):  # every cache line of the iteration's span
        index, rest = [], start + c(offset)
        for extent in reversed(shape):
            index.append(tirx.floormod(rest, c(extent)))
            rest = tirx.floordiv(rest, c(extent))
        index.reverse()
        # llvm.prefetch(address, read, high locality, data cache); a prefetch never faults
        hints += [tirx.Evaluate(tirx.call_llvm_intrin("void", "llvm.prefetch.p0",
                                                      tirx.address_of(tirx.BufferLoad(b, index)), 0, 3, 1))
                  for b in inputs]

    def visit(node: tirx.For) -> tirx.For:
        if not node.loop_var.same_as(loop):
            return node
        return tirx.For(node.loop_var, node.min, node.extent, node.kind, tirx.SeqStmt([*hints, node.body]),
                        node.thread_binding, node.annotations)

    return tvm_ffi.structural_map(func, (tirx.For, visit))


def _alias_to_output(func: tirx.PrimFunc, tmp_name: str, out_name: str) -> tirx.PrimFunc:
    """``func`` with its root scratch buffer ``tmp_name`` replaced everywhere by its output
    parameter ``out_name``: the scratch buffer becomes a parameter, which ``specialize`` binds."""
    realize = func.body
    root = realize.block
    tmp = next(b for b in root.alloc_buffers if b.name == tmp_name)
    root = s_tir.SBlock(root.iter_vars, root.reads, root.writes, root.name_hint, root.body, root.init,
                        [b for b in root.alloc_buffers if not b.same_as(tmp)], root.match_buffers,
                        root.annotations)
    body = s_tir.SBlockRealize(realize.iter_values, realize.predicate, root)
    widened = tirx.PrimFunc([*func.params, tmp], body, func.ret_type, func.attrs)
    return widened.specialize({tmp: next(p for p in func.params if p.name == out_name)})


def _loop_kinds(blk: s_tir.SBlock, loops: list[tirx.For]) -> list[bool]:
    """Whether each loop (outermost first) drives a reduction iterator of the block ``blk``."""
    if not loops:
        return []
    values = getattr(loops[-1].body, "iter_values", None)
    if values is None:  # not directly under its innermost loop: say spatial
        return [False] * len(loops)
    reduce = {i for i, iv in enumerate(blk.iter_vars) if int(iv.iter_type) == REDUCE}
    return [bool(d & reduce) for d in _iterators_driven(values, loops)]


def _iterators_driven(values, loops: list[tirx.For]) -> list[set[int]]:
    """For each loop, the positions of the block iterators whose bindings (``values``) use it."""
    used = [tirx.analysis.undefined_vars(value, []) for value in values]
    return [{i for i, vs in enumerate(used) if any(v.same_as(loop.loop_var) for v in vs)} for loop in loops]
