"""What a schedule needs to know about a kernel's blocks, read from its TIR alone."""
from __future__ import annotations

import math
from dataclasses import dataclass

import tvm
import tvm_ffi
from tvm import s_tir, tirx

from schedules.axes import MAX_VECTOR_LANES
from schedules.primitives import prim
from tvm_ext import attrs
from tvm_ext.machine import Machine

SPATIAL, REDUCE = 0, 2


def stmt(sch: s_tir.Schedule, rv) -> tirx.Stmt:
    """The block or loop that ``rv`` names (``sch.get`` through ``prim``, unchecked: see
    ``schedules.primitives``; the transformer layer's scheduling makes 407 lookups)."""
    return prim.get(sch, rv)


def root_blocks(sch: s_tir.Schedule) -> list[s_tir.SBlockRV]:
    """The blocks directly under the kernel's root block, in order."""
    return list(prim.get_child_blocks(sch, prim.get_sblock(sch, "root")))


def master_is_anchor(func: tirx.PrimFunc) -> bool:
    """Whether the kernel's epilogue runs on its master's output tiles (FuseCompile's
    ``tvm_ext.tiled_epilogue``; TVM's own kernels: yes); a master re-pointed to an elementwise
    node keeps the stages apart."""
    return bool(func.attrs.get(attrs.TILED_EPILOGUE, True)) if func.attrs is not None else True


@dataclass(frozen=True)
class BlockInfo:
    """One block: its kind and iteration extents."""

    name: str
    kind: str  # "pointwise", "transpose", "row_reduce", "anchor", "reduce"
    spatial: tuple[int, ...]
    reduce: tuple[int, ...]
    dtype_bits: int
    period: int = 0  # an anchor reading an operand packed in panels of this many columns
    uniform: bool = False  # every read is one element at the block's own index: merging its
    # axes into one keeps every load contiguous (no div/mod of a broadcast index)
    flat_reduce: bool = False  # two or more reduce axes that every read walks as one contiguous
    # run (a group norm's channels x height x width): merged, they make one vectorizable row
    read_axis: tuple[int, int] = (-1, 0)  # a transpose's spatial axis (index into ``spatial``)
    # along which a read is contiguous, and its period p when the read walks it as ``a % p``
    # (a blocked layout's channel block); (-1, 0) if none
    reuse_axis: int = -1  # an anchor's outer spatial axis (index into ``spatial``) that only the
    # operands read along the vector axis depend on (a blocked conv's output-channel blocks):
    # steps of it in the register tile share every load of the other operand
    stages: int = 0  # an anchor's input stages: spatial blocks at the root that only it reads (a
    # convolution's padding), which its schedule may move under its own loops

    @property
    def size(self) -> int:
        return math.prod(self.spatial)

    @property
    def inner(self) -> int:
        """Index into ``spatial`` of the innermost axis longer than 1 (trailing axes of 1, as in
        (4, 48, 900, 1), add nothing to a row); the last axis if none is."""
        return next((d for d in range(len(self.spatial) - 1, -1, -1) if self.spatial[d] > 1),
                    len(self.spatial) - 1)

    def lanes(self, machine: Machine) -> int:
        return max(1, machine.vector_bytes * 8 // self.dtype_bits)


def _uniform(block, ivars) -> bool:
    own = [iv.var for iv in ivars]
    for region in block.reads:
        ranges = list(region.region)
        if len(ranges) != len(own) or not all(
                r.min.same_as(v) and isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1
                for r, v in zip(ranges, own)):
            return False
    return True


def block_infos(sch: s_tir.Schedule) -> list[BlockInfo]:
    """What the policies need of each block at the root of ``sch``, in order."""
    out = []
    roots = root_blocks(sch)
    at_root = {stmt(sch, rv).name_hint for rv in roots}
    for rv in roots:
        block = stmt(sch, rv)
        ivars = list(block.iter_vars)
        spatial = tuple(int(iv.dom.extent) for iv in ivars if int(iv.iter_type) == SPATIAL)
        reduce = tuple(int(iv.dom.extent) for iv in ivars if int(iv.iter_type) == REDUCE)
        bits = tvm.DataType(str(block.writes[0].source.dtype)).bits
        kind, period = _kind(block)
        out.append(BlockInfo(block.name_hint, kind, spatial, reduce, bits, period, _uniform(block, ivars),
                             _flat_reduce(block, ivars), _read_axis(block) if kind == "transpose" else (-1, 0),
                             _reuse_axis(block, ivars) if kind == "anchor" else -1,
                             len(input_stages(sch, rv, at_root)) if kind == "anchor" else 0))
    return out


def input_stages(sch: s_tir.Schedule, rv: s_tir.SBlockRV, at_root: set[str]) -> list[str]:
    """The producers of block ``rv`` that are spatial blocks at the root (names in ``at_root``)
    read by no other block."""
    out = []
    for producer in prim.get_producers(sch, rv):
        block = stmt(sch, producer)
        if block.name_hint in at_root and block.name_hint not in out and len(prim.get_consumers(sch, producer)) == 1 \
                and all(int(iv.iter_type) == SPATIAL for iv in block.iter_vars):
            out.append(block.name_hint)
    return out


def _read_axis(block) -> tuple[int, int]:
    """For a transpose: the first spatial axis but the last along which some read's last index
    steps by one (period 0) or runs as ``axis % p`` (period p); (-1, 0) if none."""
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == SPATIAL]
    for e in _last_read_indices(block):
        for index, var in enumerate(spatial[:-1]):
            if _unit_stride(e, var):
                return index, 0
            if _period(e, var) >= 4:
                return index, _period(e, var)
    return -1, 0


def _reuse_axis(block, ivars) -> int:
    """For an anchor: the outermost of its spatial axes before the last two that the reads
    along the last axis (the vector operand, a weight) use and the other reads (the operand
    broadcast into the vector) do not; -1 if none. The block's own output is not a read."""
    spatial = [iv.var for iv in ivars if int(iv.iter_type) == SPATIAL]
    if len(spatial) < 3:
        return -1
    uses = []
    for region in block.reads:
        if any(region.source.same_as(w.source) for w in block.writes):
            continue
        used = set()
        for r in region.region:
            used |= set(tirx.analysis.undefined_vars(r.min, []))
        uses.append(used)
    along = [u for u in uses if spatial[-1] in u]
    across = [u for u in uses if spatial[-1] not in u]
    if not along or not across:
        return -1
    for index, var in enumerate(spatial[:-2]):
        if any(var in u for u in along) and not any(var in u for u in across):
            return index
    return -1


def _flat_reduce(block, ivars) -> bool:
    """Whether every read that depends on the block's reduce axes walks them, in their order,
    as one contiguous run: its row-major flat index is linear in them with coefficients
    (..., size2 * size3, size3, 1), so the axes merged into one are read at unit stride."""
    every = [iv for iv in ivars if int(iv.iter_type) == REDUCE]
    reduce = [iv for iv in every if _longer_than_one(iv)]  # axes of 1 merge for free
    if not reduce or len(every) < 2:
        return False
    sizes = [int(iv.dom.extent) for iv in reduce]
    want = [math.prod(sizes[i + 1:]) for i in range(len(sizes))]
    reduce_vars = [iv.var for iv in reduce]
    used = 0
    for region in block.reads:
        mins = [r.min for r in region.region]
        if not any(set(tirx.analysis.undefined_vars(e, [])) & set(reduce_vars) for e in mins):
            continue
        if not all(isinstance(d, tirx.IntImm) for d in region.source.shape):
            return False
        flat = tirx.const(0, str(reduce_vars[0].ty))
        for index, dim in zip(mins, region.source.shape):
            flat = flat * int(dim) + index
        coeffs = tvm.sym.detect_linear_equation(flat, reduce_vars)
        if len(coeffs) != len(reduce_vars) + 1 or not all(
                isinstance(c, tirx.IntImm) and int(c) == w for c, w in zip(coeffs, want)):
            return False
        used += 1
    return used > 0


def _kind(block) -> tuple[str, int]:
    """The block's kind, and for an anchor whose operand is packed in column panels
    (``Wp[j // p, k, j % p]``, see ``relay_passes.pack_weights``) the panel width p."""
    last_dims = _last_read_indices(block)
    kind = _kind_of(block, _read_indices(block))
    if kind != "anchor":
        return kind, 0
    spatial = [iv.var for iv in block.iter_vars if int(iv.iter_type) == SPATIAL]
    periods = [_period(e, spatial[-1]) for e in last_dims]
    return kind, min([p for p in periods if p], default=0)


def _bounded_analyzer(block) -> tvm.sym.Analyzer:
    """An analyzer that knows the block's iteration ranges."""
    analyzer = tvm.sym.Analyzer()
    for iv in block.iter_vars:
        analyzer.bind(iv.var, iv.dom)
    return analyzer


def _last_read_indices(block) -> list:
    """Each read's index along its last axis, simplified with the block's iteration ranges
    (a view chain leaves ``j % 1024 // 32`` where ``j // 32`` is meant)."""
    analyzer = _bounded_analyzer(block)
    return [analyzer.simplify(r.region[-1].min) for r in block.reads if len(r.region)]


def _read_indices(block) -> list[tuple]:
    """(index, reads along a reduce axis) for each read's last index and for its row-major flat
    index, both simplified with the block's iteration ranges. The flat index finds a read
    through a reshape that walks its row at unit stride (``(i * 6 + k // 900) * 900 + k % 900``
    is ``i * 5400 + k``) where no single axis's index does."""
    analyzer = _bounded_analyzer(block)
    reduce_vars = {iv.var for iv in block.iter_vars if int(iv.iter_type) == REDUCE}
    out = []
    for region in block.reads:
        if not len(region.region):
            continue
        mins = [r.min for r in region.region]
        along = any(set(tirx.analysis.undefined_vars(e, [])) & reduce_vars for e in mins)
        out.append((analyzer.simplify(mins[-1]), along))
        if len(mins) > 1 and all(isinstance(d, tirx.IntImm) for d in region.source.shape):
            flat = mins[0]
            for index, dim in zip(mins[1:], list(region.source.shape)[1:]):
                flat = flat * int(dim) + index
            out.append((analyzer.simplify(flat), along))
    return out


def _period(expr, var) -> int:
    """p when ``expr`` is ``var % p`` (contiguous within each panel of p columns), else 0."""
    if isinstance(expr, tirx.FloorMod) and expr.a.same_as(var) and isinstance(expr.b, tirx.IntImm):
        return int(expr.b)
    return 0


def _kind_of(block, indices: list[tuple]) -> str:
    ivars = list(block.iter_vars)
    # an axis of extent 1 says nothing of contiguity (the bounded simplifier makes its index 0):
    # the innermost axes that count are the last ones longer than 1 (a group norm over
    # (4, 48, 900, 1) read as no row at all ran its statistics unvectorized: 0.25 ms, 0.089 with it)
    spatial = [iv.var for iv in ivars if int(iv.iter_type) == SPATIAL and _longer_than_one(iv)]
    reduce_ivs = [iv for iv in ivars if int(iv.iter_type) == REDUCE]
    reduce = [iv.var for iv in reduce_ivs if _longer_than_one(iv)] or [iv.var for iv in reduce_ivs]
    if not reduce:
        if spatial and indices and not any(_unit_stride(e, spatial[-1]) or _constant(e) for e, _ in indices):
            return "transpose"  # no read is contiguous along the innermost written axis
        return "pointwise"
    extent = {iv.var: int(iv.dom.extent) for iv in ivars}
    # an anchor's operand runs along both its last output axis and the reduction (B[k, j]); a
    # value read along the output axis alone (a row's mean in its variance) is a broadcast
    if spatial and extent[spatial[-1]] >= 4 and any(
            along and (_unit_stride(e, spatial[-1]) or _period(e, spatial[-1]) >= 4) for e, along in indices):
        return "anchor"
    if any(_unit_stride(e, reduce[-1]) for e, _ in indices):
        return "row_reduce"
    return "reduce"


def _longer_than_one(iv) -> bool:
    return not (isinstance(iv.dom.extent, tirx.IntImm) and int(iv.dom.extent) == 1)


def _unit_stride(expr, var) -> bool:
    coeffs = tvm.sym.detect_linear_equation(expr, [var])
    return len(coeffs) == 2 and isinstance(coeffs[0], tirx.IntImm) and int(coeffs[0]) == 1


def _constant(expr) -> bool:
    return not tirx.analysis.undefined_vars(expr, [])


def vector_factor(n: int, lanes: int) -> int:
    """The widest vector (lanes, lanes/2, ... 4) that divides ``n``; 0 if none."""
    f = lanes
    while f >= 4:
        if n % f == 0:
            return f
        f //= 2
    return 0


def widest_divisor(n: int, most: int, above: int) -> int:
    """The widest v dividing ``n`` with ``above < v <= most``; 0 if none."""
    return next((v for v in range(most, above, -1) if n % v == 0), 0)


def row_vector(n: int, lanes: int) -> int:
    """The widest vector for a pointwise row of ``n`` (keep_2d's first choice): two whole
    vectors or one where they divide it, else its widest divisor up to two vectors (900 takes
    30 lanes of 16, not 4), else ``vector_factor``'s, else its widest divisor up to four vectors
    (58, a 56-wide row padded by one each side, takes 29 lanes of 8: it ran one element at a
    time: a reflect pad of 8x64x56x56 built for znver3, 1.21 -> 0.18 ms on a Zen 4)."""
    if n % lanes == 0:
        return 2 * lanes if n % (2 * lanes) == 0 else lanes
    return widest_divisor(n, 2 * lanes, lanes) or vector_factor(n, lanes) or \
        widest_divisor(n, min(4 * lanes, MAX_VECTOR_LANES), 2 * lanes)


_ARITHMETIC = (tirx.Add, tirx.Sub, tirx.Mul, tirx.Div, tirx.Min, tirx.Max, tirx.Select, tvm.ir.Call)


def arithmetic_ops(stmt) -> int:
    """How many arithmetic operations one execution of ``stmt`` (a block body) evaluates."""
    count = 0

    def seen(_):
        nonlocal count
        count += 1

    tvm_ffi.structural_walk(stmt, (_ARITHMETIC, seen))
    return count
