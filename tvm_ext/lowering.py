"""Tensor-level lowering on top of the Loop IR: values, kernels, and the shared helpers.

An operator's lowering (registered in ``tvm_ext.ops``) receives ``TensorValue`` inputs and
returns ``TensorValue`` outputs. A value knows its shape and dtype and how to ``load`` one
element at an index; it is either

- *fusable*: loading it returns its own Loop IR expression, inlined into the consumer
  (AutoFuse's KernelBox that "can still fuse"), or
- *realized*: it was materialized as a stage of the kernel (a kernel input, an output, or
  a kernel-local intermediate such as a reduction result) and loading it reads memory.

The helpers here do what every op needs, written once: broadcasting, type promotion and
casting (``pointwise``), reductions (``reduce``), and index-map views (reshape, permute,
slice, concat, ...). ``KernelBuilder`` turns realized stages into TE computes and one
PrimFunc.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
from tvm import te, tirx

from tvm_ext import loop_ir as L
from tvm_ext.errors import NotLowerable, ShapeError

Shape = tuple[int, ...]
Loader = Callable[[tuple], L.LoopExpr]


class TensorValue:
    """A tensor inside a kernel under construction.

    Loading the same value twice at the same index (the same index objects) returns the
    same Loop IR node: a value read twice by one consumer (``x * x``) is built once, so a
    chain of such fan-outs stays linear instead of doubling at every level.
    """

    def __init__(self, shape: Sequence[int], dtype: str, loader: Loader, name: str = "t",
                 buffer: L.Buffer | None = None):
        self.shape: Shape = tuple(int(s) for s in shape)
        self.dtype = str(dtype)
        self.name = name
        self.buffer = buffer  # set for realized values: loads read this buffer
        self._loader = loader
        self._loaded: dict[tuple, tuple[tuple, L.LoopExpr]] = {}

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    def load(self, index: Sequence) -> L.LoopExpr:
        """The Loop IR expression for the element at ``index`` (one index per dimension)."""
        if len(index) != self.ndim:
            raise ValueError(f"{self.name}: {len(index)} indices for a {self.ndim}-d tensor")
        index = tuple(index)
        # Keyed by identity; the entry keeps the index objects alive, so ids are not reused.
        key = tuple(i if isinstance(i, int) else id(i) for i in index)
        hit = self._loaded.get(key)
        if hit is None:
            hit = self._loaded[key] = (index, self._loader(index))
        return hit[1]

    def __repr__(self) -> str:
        kind = "realized" if self.buffer is not None else "fusable"
        return f"<{kind} {self.name} {list(self.shape)} {self.dtype}>"


# --------------------------------------------------------------------------- kernel
@dataclass(eq=False)
class Stage:
    """A realized value: one TE compute (one block of the PrimFunc)."""

    buffer: L.Buffer
    expr: L.LoopExpr | None = None  # the Loop IR of one element, over the stage's axes
    axes: tuple = ()
    is_output: bool = False

    @property
    def name(self) -> str:
        return self.buffer.name


@dataclass(eq=False)
class KernelBuilder:
    """Collects inputs and realized stages of one kernel and builds its PrimFunc.

    Realizing a value creates its TE compute right away (its Loop IR is built over the
    compute's own index variables), so stages appear in dependence order. With
    ``emit_te=False`` only the Loop IR is built (over fresh variables): fusion passes use
    that to measure an expression before deciding where kernels end.
    """

    name: str
    emit_te: bool = True
    exact_math: bool = False  # libm transcendentals instead of the vectorizable forms
    inputs: list[L.Buffer] = field(default_factory=list)
    stages: list[Stage] = field(default_factory=list)
    _names: set = field(default_factory=set)

    def unique(self, name: str) -> str:
        base = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "t"
        out, n = base, 1
        while out in self._names:
            out, n = f"{base}_{n}", n + 1
        self._names.add(out)
        return out

    def add_input(self, name: str, shape: Sequence[int], dtype: str) -> TensorValue:
        buf = L.Buffer(self.unique(name), tuple(int(s) for s in shape), str(dtype))
        if self.emit_te:
            buf.tensor = te.placeholder(buf.shape, buf.dtype, name=buf.name)
        self.inputs.append(buf)
        return _buffer_value(buf)

    def realize(self, value: TensorValue, name: str | None = None) -> TensorValue:
        """Materialize ``value`` as a stage of this kernel (AutoFuse's ``Realize``)."""
        if value.buffer is not None:
            return value
        buf = L.Buffer(self.unique(name or value.name), value.shape, value.dtype)
        stage = Stage(buf)

        def body(*axes):
            stage.axes = axes
            stage.expr = value.load(axes)
            if stage.expr.dtype != value.dtype:
                raise TypeError(f"{buf.name}: body is {stage.expr.dtype}, stage is {value.dtype}")
            return L.to_te(stage.expr, self.exact_math, list(zip(axes, buf.shape))) if self.emit_te else None

        if self.emit_te:
            buf.tensor = te.compute(buf.shape, body, name=buf.name)
        else:
            body(*(tirx.Var(f"i{d}", "int32") for d in range(len(buf.shape))))
        self.stages.append(stage)
        return _buffer_value(buf)

    def store(self, value: TensorValue, name: str) -> Stage:
        """Make ``value`` a kernel output: its stage, or a copy when it is an input or already
        another output (outputs never alias)."""
        stage = self._stage_of(value)
        if stage is None or stage.is_output:
            copy = TensorValue(value.shape, value.dtype, value.load, name)
            stage = self._stage_of(self.realize(copy, name))
        stage.is_output = True
        return stage

    def _stage_of(self, value: TensorValue) -> Stage | None:
        if value.buffer is None:
            return None
        return next((s for s in self.stages if s.buffer is value.buffer), None)

    @property
    def outputs(self) -> list[Stage]:
        return [s for s in self.stages if s.is_output]

    def build(self, outputs: Sequence[Stage]) -> tirx.PrimFunc:
        """One PrimFunc: inputs, then ``outputs`` in order; other stages are kernel-local."""
        tensors = [b.tensor for b in self.inputs] + [s.buffer.tensor for s in outputs]
        func = te.create_prim_func(tensors)
        return func.with_attr("global_symbol", self.name)

    def describe(self) -> str:
        """The kernel's Loop IR, one stage per line."""
        lines = [f"kernel {self.name}({', '.join(b.name for b in self.inputs)})"]
        for s in self.stages:
            tag = "store" if s.is_output else "local"
            axes = ", ".join(str(a) for a in s.axes)
            lines.append(f"  {tag} {s.name}[{axes}] = {L.format_expr(s.expr)}")
        return "\n".join(lines)


def _buffer_value(buf: L.Buffer) -> TensorValue:
    return TensorValue(buf.shape, buf.dtype, lambda idx: L.Load(buf, tuple(idx)), buf.name, buf)


# --------------------------------------------------------------------------- broadcast
def broadcast_shapes(*shapes: Sequence[int], node: str = "") -> Shape:
    """Numpy broadcasting of several shapes, with an error naming the node."""
    ndim = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(ndim):
        dims = {s[len(s) - ndim + d] for s in shapes if len(s) - ndim + d >= 0}
        dims.discard(1)
        if len(dims) > 1:
            raise ShapeError(f"{node}: shapes {' and '.join(str(list(s)) for s in shapes)} do not "
                             f"broadcast (dimension {d} is {sorted(dims)})")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def broadcast_to(value: TensorValue, shape: Sequence[int]) -> TensorValue:
    """View of ``value`` broadcast to ``shape``: size-1 and missing dims read index 0."""
    shape = tuple(int(s) for s in shape)
    if value.shape == shape:
        return value
    lead = len(shape) - value.ndim
    if lead < 0:
        raise ShapeError(f"cannot broadcast {list(value.shape)} to {list(shape)}")
    for d, s in enumerate(value.shape):
        if s != 1 and s != shape[lead + d]:
            raise ShapeError(f"cannot broadcast {list(value.shape)} to {list(shape)}")

    def loader(idx):
        return value.load([0 if value.shape[d] == 1 else idx[lead + d] for d in range(value.ndim)])

    return TensorValue(shape, value.dtype, loader, value.name)


def cast_value(value: TensorValue, dtype: str) -> TensorValue:
    if value.dtype == dtype:
        return value
    return TensorValue(value.shape, dtype, lambda idx: L.cast(value.load(idx), dtype), value.name)


# --------------------------------------------------------------------------- pointwise
def pointwise(fn: Callable[..., L.LoopExpr], inputs: Sequence[TensorValue], out_dtype: str,
              name: str = "pointwise", promote: bool = True) -> TensorValue:
    """Broadcast ``inputs``, cast them to their promoted compute dtype, apply ``fn``, cast the
    result to ``out_dtype``. ``fn`` is the op's scalar compute alone."""
    shape = broadcast_shapes(*[v.shape for v in inputs], node=name)
    views = [broadcast_to(v, shape) for v in inputs]
    dtype = L.compute_dtype(L.promote_dtypes(*[v.dtype for v in inputs])) if promote else None

    def loader(idx):
        args = [v.load(idx) for v in views]
        if dtype is not None:
            args = [L.cast(a, dtype) for a in args]
        return L.cast(fn(*args), out_dtype)

    return TensorValue(shape, out_dtype, loader, name)


# --------------------------------------------------------------------------- reduce
def normalize_axes(axes: Sequence[int] | None, ndim: int, node: str = "") -> tuple[int, ...]:
    if axes is None:
        return tuple(range(ndim))
    out = []
    for a in axes:
        a = int(a)
        if not -ndim <= a < max(ndim, 1):
            raise ShapeError(f"{node}: axis {a} out of range for a {ndim}-d tensor")
        out.append(a % ndim if ndim else 0)
    return tuple(sorted(set(out)))


def reduction(shape: Sequence[int], extents: Sequence[int], body: Callable[[tuple, list], L.LoopExpr],
              kind: str, acc_dtype: str, name: str) -> TensorValue:
    """The (unrealized) value whose element ``idx`` reduces ``body(idx, ks)`` over reduce axes
    ``ks`` of the given ``extents``. It must be realized before it is read."""
    def loader(idx):
        ks = [te.reduce_axis((0, int(n)), name=f"k{j}") for j, n in enumerate(extents)]
        expr = L.cast(body(idx, [k.var for k in ks]), acc_dtype)
        return L.Reduce(kind, expr, tuple(ks))

    return TensorValue(shape, acc_dtype, loader, name)


def reduce_stage(kb: KernelBuilder, shape: Sequence[int], extents: Sequence[int],
                 body: Callable[[tuple, list], L.LoopExpr], kind: str, acc_dtype: str,
                 name: str) -> TensorValue:
    """A reduction realized as a stage of ``kb`` (kernel-local, or an output if stored later)."""
    return kb.realize(reduction(shape, extents, body, kind, acc_dtype, name), name)


def on_first_load(kb: KernelBuilder, value: TensorValue, name: str) -> TensorValue:
    """``value``, realized as a stage the first time something loads it: an output of a
    multi-output op that nothing reads costs nothing."""
    realized: list[TensorValue] = []

    def loader(idx):
        if not realized:
            realized.append(kb.realize(value, name))
        return realized[0].load(idx)

    return TensorValue(value.shape, value.dtype, loader, name)


def reduce(kb: KernelBuilder, value: TensorValue, axes: Sequence[int] | None, kind: str,
           keepdims: bool, out_dtype: str, name: str = "reduce",
           blocked_above: int | None = None) -> TensorValue:
    """Reduce ``value`` over ``axes``; the result is realized as a stage of ``kb``.

    Half precision accumulates in float32; the returned view casts to ``out_dtype``. A float
    sum of more than ``blocked_above`` elements (default ``BLOCKED_SUM_ABOVE``) is blocked.
    """
    axes = normalize_axes(axes, value.ndim, name)
    out_shape = tuple(1 if d in axes else s for d, s in enumerate(value.shape) if keepdims or d not in axes)
    kept = [d for d in range(value.ndim) if d not in axes]
    if any(value.shape[d] == 0 for d in axes):  # an empty reduction is its identity: a loop that
        # never runs would leave the output unwritten
        return full(out_shape, _reduce_identity(kind, out_dtype), out_dtype)
    limit = BLOCKED_SUM_ABOVE if blocked_above is None else blocked_above
    if kind == "sum" and L.is_float(value.dtype) and math.prod(value.shape[d] for d in axes) > limit:
        return _blocked_sum(kb, value, sorted(axes), keepdims, out_dtype, name, out_shape)

    def body(idx, ks):
        full = [None] * value.ndim
        spatial = [idx[d] for d in kept] if keepdims else list(idx)
        for d, i in zip(kept, spatial):
            full[d] = i
        for d, k in zip(axes, ks):
            full[d] = k
        return value.load(full)

    staged = reduce_stage(kb, out_shape, [value.shape[d] for d in axes], body, kind,
                          L.compute_dtype(out_dtype), name)
    return cast_value(staged, out_dtype)


# A float sum over more than BLOCKED_SUM_ABOVE elements adds at most SUM_BLOCK of them into
# one partial before the partials are summed in turn: its error grows with the number of
# levels, not with n. One sequential float32 accumulator stalls at 2^24: 2^26 ones summed to
# 2^25, and a sum of 2^28 uniform values was 75% off (float32 partials: 1.1e-7; a long last
# axis in lanes with float64 partials, _lane_blocked_sum: 8.0e-9, PyTorch 6.8e-8).
# Shorter sums (softmax rows, norms) keep their single stage and its schedules.
SUM_BLOCK = 1 << 12
BLOCKED_SUM_ABOVE = 1 << 16


def _blocked_sum(kb: KernelBuilder, value: TensorValue, axes: list[int], keepdims: bool,
                 out_dtype: str, name: str, out_shape: Shape) -> TensorValue:
    """A long sum as two sums: the innermost reduced axes (at most ``SUM_BLOCK`` elements; the
    last axis cut into zero-padded blocks when it alone is longer) into a kernel-local stage of
    partial sums, then those partials (blocked again if still long)."""
    long = [d for d in axes if value.shape[d] > 1]  # unit axes add nothing
    extents = [value.shape[d] for d in long]
    t = next(i for i in range(len(long) + 1) if math.prod(extents[i:]) <= SUM_BLOCK)
    if t < len(long):  # the axes from t on fit in a block: partial sums over them, then the rest
        partial = reduce(kb, value, long[t:], "sum", True, L.compute_dtype(out_dtype), name + "_part")
        return reduce(kb, partial, axes, "sum", keepdims, out_dtype, name, blocked_above=SUM_BLOCK)
    d, n = long[-1], extents[-1]  # the last axis alone is too long: (blocks, SUM_BLOCK)
    blocks = -(-n // SUM_BLOCK)
    if d == value.ndim - 1 and L.is_float(value.dtype):
        return _lane_blocked_sum(kb, value, axes, keepdims, out_dtype, name, out_shape, blocks)
    split = _split_axis(value, d, (blocks, SUM_BLOCK))
    split_axes = [a if a <= d else a + 1 for a in axes] + [d + 1]  # d: the blocks, d + 1: in a block
    total = reduce(kb, split, sorted(split_axes), "sum", False, out_dtype, name, blocked_above=SUM_BLOCK)
    return reshape(total, out_shape) if keepdims else total


def _split_axis(value: TensorValue, d: int, sizes: Sequence[int]) -> TensorValue:
    """Axis ``d`` of ``value`` as the axes ``sizes`` (row-major), zero past its end."""
    n, k, strides = value.shape[d], len(sizes), _strides(sizes)
    zero = L.const(0, value.dtype)

    def padded(i):
        flat = i[d] * strides[0]
        for j in range(1, k):
            flat = flat + i[d + j] * strides[j]
        element = (*i[:d], flat, *i[d + k:])
        if isinstance(flat, int):
            return value.load(element) if flat < n else zero
        return L.Select(L.IndexValue(flat < n, "bool"), value.load(element), zero, guarded=True)

    return TensorValue((*value.shape[:d], *sizes, *value.shape[d + 1:]), value.dtype, padded, value.name)


SUM_LANES = 16


def _lane_blocked_sum(kb: KernelBuilder, value: TensorValue, axes: list[int], keepdims: bool, out_dtype: str,
                      name: str, out_shape: Shape, blocks: int) -> TensorValue:
    """A float sum whose last axis is too long: each block of ``SUM_BLOCK`` elements into
    ``SUM_LANES`` partial sums (lane j adds the block's elements j, j + SUM_LANES, ...: a
    reduction over a middle axis, vectorized over the lanes, no rfactor), then every partial in
    float64. The partials' rounding was most of a blocked float32 sum's error."""
    d = value.ndim - 1
    split = _split_axis(value, d, (blocks, SUM_BLOCK // SUM_LANES, SUM_LANES))
    partial = reduce(kb, split, [d + 1], "sum", False, L.compute_dtype(out_dtype), name + "_part", blocked_above=1 << 62)
    rest = [a for a in axes if a != d] + [d, d + 1]  # the other reduced axes, the blocks, the lanes
    total = reduce(kb, partial, sorted(rest), "sum", False, "float64", name + "_total", blocked_above=1 << 62)
    total = cast_value(total, out_dtype)
    return reshape(total, out_shape) if keepdims else total


def _reduce_identity(kind: str, dtype: str) -> float | int:
    """What a reduction over no element gives (numpy's and PyTorch's value for sum and prod;
    the neutral element of max and min, where both of them raise instead)."""
    if kind == "sum":
        return 0
    if kind == "prod":
        return 1
    if L.is_float(dtype):
        return -math.inf if kind == "max" else math.inf
    info = np.iinfo(dtype) if dtype != "bool" else None
    if info is None:
        return kind == "min"
    return info.min if kind == "max" else info.max


# --------------------------------------------------------------------------- views
def view(value: TensorValue, shape: Sequence[int], index_map: Callable[[tuple], Sequence],
         name: str | None = None) -> TensorValue:
    """A view: element ``idx`` of the result is element ``index_map(idx)`` of ``value``."""
    return TensorValue(shape, value.dtype, lambda idx: value.load(tuple(index_map(idx))),
                       name or value.name)


def _strides(shape: Sequence[int]) -> list[int]:
    out, acc = [], 1
    for s in reversed(shape):
        out.append(acc)
        acc *= s
    return out[::-1]


def reshape(value: TensorValue, shape: Sequence[int]) -> TensorValue:
    shape = tuple(int(s) for s in shape)
    if math.prod(shape) != value.size:
        raise ShapeError(f"cannot reshape {list(value.shape)} ({value.size} elements) to {list(shape)}")
    if shape == value.shape:
        return value
    src = [s for s in value.shape if s != 1]
    dst = [s for s in shape if s != 1]
    if src == dst:  # only unit dims move: a pure re-indexing, no div/mod
        keep = [d for d, s in enumerate(shape) if s != 1]
        return view(value, shape, lambda idx: _squeeze_index(idx, keep, value.shape))
    out_strides, in_strides = _strides(shape), _strides(value.shape)

    def index_map(idx):
        flat = sum((i * s for i, s in zip(idx, out_strides) if s and _nonunit(i)), tirx.const(0, "int32"))
        return [tirx.floormod(tirx.floordiv(flat, st), dim) if dim != 1 else 0
                for st, dim in zip(in_strides, value.shape)]

    return view(value, shape, index_map)


def _nonunit(i) -> bool:
    return not (isinstance(i, int) and i == 0)


def _squeeze_index(idx, keep, in_shape):
    it = iter(idx[d] for d in keep)
    return [0 if s == 1 else next(it) for s in in_shape]


def permute(value: TensorValue, axes: Sequence[int] | None) -> TensorValue:
    axes = list(range(value.ndim))[::-1] if axes is None else [int(a) % value.ndim for a in axes]
    if sorted(axes) != list(range(value.ndim)):
        raise ShapeError(f"permutation {axes} is not a permutation of {value.ndim} axes")
    inverse = [axes.index(d) for d in range(value.ndim)]
    return view(value, [value.shape[a] for a in axes], lambda idx: [idx[inverse[d]] for d in range(value.ndim)])


def layout_transform(value: TensorValue, index_map, shape: Sequence[int], node: str = "layout_transform"
                     ) -> TensorValue:
    """Relax's ``layout_transform`` (NCHW <-> NCHW16c and the like): output element ``idx`` is the
    input element the inverse of ``index_map`` (a bijective ``tirx.IndexMap``) gives for it."""
    inverse = index_map.inverse([tirx.IntImm("int64", s) for s in value.shape])
    params = list(inverse.initial_indices)

    def index(idx):
        env = {p.name: i for p, i in zip(params, idx)}
        return [_eval_index(e, env, node) for e in inverse.final_indices]
    return view(value, shape, index)


_INDEX_OPS = {tirx.Add: lambda a, b: a + b, tirx.Sub: lambda a, b: a - b, tirx.Mul: lambda a, b: a * b,
              tirx.FloorDiv: tirx.floordiv, tirx.FloorMod: tirx.floormod}
_INT_OPS = {tirx.Add: operator.add, tirx.Sub: operator.sub, tirx.Mul: operator.mul,
            tirx.FloorDiv: operator.floordiv, tirx.FloorMod: operator.mod}


def _eval_index(expr, env: dict, node: str):
    """An index expression of an IndexMap, rebuilt on our (int32) loop indices."""
    if isinstance(expr, tirx.Var):
        return env[expr.name]
    if isinstance(expr, tirx.IntImm):
        return int(expr.value)
    if isinstance(expr, tirx.Cast):
        return _eval_index(expr.value, env, node)
    op = _INDEX_OPS.get(type(expr))
    if op is None:
        raise NotLowerable(f"{node}: index map term {type(expr).__name__} ({expr})")
    a, b = _eval_index(expr.a, env, node), _eval_index(expr.b, env, node)
    if isinstance(a, int) and isinstance(b, int):
        return _INT_OPS[type(expr)](a, b)
    return op(a, b)


def expand_dims(value: TensorValue, axes: Sequence[int]) -> TensorValue:
    ndim = value.ndim + len(axes)
    new = sorted(int(a) % ndim for a in axes)
    shape, it = [], iter(value.shape)
    for d in range(ndim):
        shape.append(1 if d in new else next(it))
    keep = [d for d in range(ndim) if d not in new]
    return view(value, shape, lambda idx: [idx[d] for d in keep])


def squeeze(value: TensorValue, axes: Sequence[int] | None) -> TensorValue:
    if axes is None:
        drop = [d for d, s in enumerate(value.shape) if s == 1]
    else:
        drop = [int(a) % value.ndim for a in axes]
        bad = [d for d in drop if value.shape[d] != 1]
        if bad:
            raise ShapeError(f"cannot squeeze axis {bad[0]} of size {value.shape[bad[0]]}")
    shape = [s for d, s in enumerate(value.shape) if d not in drop]

    def index_map(idx):
        it = iter(idx)
        return [0 if d in drop else next(it) for d in range(value.ndim)]

    return view(value, shape, index_map)


def strided_slice(value: TensorValue, axes: Sequence[int], begin: Sequence[int],
                  end: Sequence[int], strides: Sequence[int] | None = None) -> TensorValue:
    strides = list(strides) if strides else [1] * len(axes)
    starts, steps, shape = [0] * value.ndim, [1] * value.ndim, list(value.shape)
    for a, b, e, st in zip(axes, begin, end, strides):
        a = int(a) % value.ndim
        n = value.shape[a]
        b, e, st = int(b), int(e), int(st)
        if st == 0:
            raise ShapeError("strided_slice with stride 0")
        b, e = _clamp_slice(b, e, st, n)
        shape[a] = max(0, -(-(e - b) // st)) if st > 0 else max(0, -(-(b - e) // -st))
        starts[a], steps[a] = b, st
    return view(value, shape, lambda idx: [s + i * st if (s or st != 1) else i
                                           for i, s, st in zip(idx, starts, steps)])


def _clamp_slice(b: int, e: int, st: int, n: int) -> tuple[int, int]:
    if b < 0:
        b += n
    if e < 0:
        e += n
    if st > 0:
        return min(max(b, 0), n), min(max(e, 0), n)
    return min(max(b, -1), n - 1), min(max(e, -1), n - 1)


def concat(values: Sequence[TensorValue], axis: int, node: str = "concat") -> TensorValue:
    """Concatenation: a guarded select over the inputs along ``axis`` (reads only one)."""
    first = values[0]
    axis = int(axis) % first.ndim
    for v in values[1:]:
        if v.ndim != first.ndim or any(a != b for d, (a, b) in enumerate(zip(v.shape, first.shape)) if d != axis):
            raise ShapeError(f"{node}: cannot concatenate {list(first.shape)} and {list(v.shape)} on axis {axis}")
    offsets = [0]
    for v in values:
        offsets.append(offsets[-1] + v.shape[axis])
    shape = list(first.shape)
    shape[axis] = offsets[-1]
    dtype = first.dtype

    def loader(idx):
        i = idx[axis]
        expr = None
        for k in range(len(values) - 1, -1, -1):
            shifted = list(idx)
            shifted[axis] = i - offsets[k] if offsets[k] else i
            part = values[k].load(shifted)
            if expr is None:
                expr = part
            else:
                cond = L.IndexValue(i < offsets[k + 1], "bool")
                expr = L.Select(cond, part, expr, guarded=True)
        return expr

    return TensorValue(shape, dtype, loader, node)


def take(value: TensorValue, indices: TensorValue, axis: int | None) -> TensorValue:
    """Gather along ``axis``. A literal index is plain index arithmetic (a slice); a tensor
    of indices is loaded per element, so ``value`` must be realized (views of it cannot
    re-index a data-dependent position): see ``needs_realized_source``."""
    if axis is None:
        value = reshape(value, (value.size,))
        axis = 0
    axis = int(axis) % value.ndim
    shape = value.shape[:axis] + indices.shape + value.shape[axis + 1:]
    n = value.shape[axis]
    literal = _literal(indices)

    def loader(idx):
        if literal is not None:
            pos = int(literal) % n
        else:
            p = L.cast(indices.load(idx[axis:axis + indices.ndim]), "int64")
            pos = L.Select(L.less(p, L.Const(0, "int64")), p + n, p)
        full = list(idx[:axis]) + [pos] + list(idx[axis + indices.ndim:])
        return value.load(full)

    return TensorValue(shape, value.dtype, loader, "take")


def needs_realized_source(indices: TensorValue) -> bool:
    """Whether ``take`` with these indices reads its source at data-dependent positions."""
    return _literal(indices) is None


def _literal(value: TensorValue):
    """The python value of a constant-valued tensor (a literal), else None."""
    if value.buffer is not None:
        return None
    expr = value.load(tuple(tirx.Var(f"q{d}", "int32") for d in range(value.ndim)))
    return expr.value if isinstance(expr, L.Const) else None


def pad(value: TensorValue, pad_before: Sequence[int], pad_after: Sequence[int],
        pad_value: float = 0.0) -> TensorValue:
    """Constant padding: a guarded select that never reads out of bounds."""
    shape = [s + b + a for s, b, a in zip(value.shape, pad_before, pad_after)]
    fill = L.Const(pad_value, value.dtype)

    def loader(idx):
        conds, src = [], []
        for i, b, a, s in zip(idx, pad_before, pad_after, value.shape):
            src.append(i - b if b else i)
            if b:
                conds.append(i >= b)
            if a:
                conds.append(i < b + s)
        inner = value.load(src)
        if not conds:
            return inner
        return L.Select(L.IndexValue(tirx.all(*conds), "bool"), inner, fill, guarded=True)

    return TensorValue(shape, value.dtype, loader, "pad")


#: where a padded position reads, by mode: j is the position less the padding before, n the
#: axis' size, and (max, min, mod) work on TIR expressions or on numbers
_PAD_SOURCES = {
    # mirrored, the edge not repeated (valid for -n < j < 2n - 1): n - 1 - |n - 1 - |j||
    "reflect": lambda j, n, mx, mn, mod: (n - 1) - mx((n - 1) - mx(j, 0 - j), mx(j, 0 - j) - (n - 1)),
    "replicate": lambda j, n, mx, mn, mod: mn(mx(j, 0), n - 1),
    "circular": lambda j, n, mx, mn, mod: mod(j, n),
}
_TIR_OPS, _NUMBER_OPS = (tirx.max, tirx.min, tirx.floormod), (max, min, lambda a, b: a % b)
#: the widest padding of the last axis whose positions are each selected on their own
_EDGE_SELECTS = 4


def pad_by_mode(value: TensorValue, pad_before: Sequence[int], pad_after: Sequence[int], mode: str,
                node: str = "pad") -> TensorValue:
    """Padding that reads the input itself: ``reflect`` (mirrored, the edge not repeated),
    ``replicate`` (the edge repeated) or ``circular`` (wrapped around). Reflection needs each pad
    below its axis' size, wrapping at most its size.

    Along the last axis, the one vectors run along, the row is the input's row read where it
    lies (a guarded load, masked at the ends) with each padded position selected on its own, a
    load at a constant position (up to ``_EDGE_SELECTS`` a side). Read through one index
    expression for all, the row was a gather: 8x64x56x56 by 1, reflect 0.53 -> 0.15 ms, replicate
    0.47 -> 0.12, circular 0.53 -> 0.17 (eager 0.16, 0.16, 0.30; Zen 4)."""
    rule = _PAD_SOURCES[mode]

    def read_at(idx):  # the input's position read by output position idx (or its leading axes)
        return [rule(i - b, n, *_TIR_OPS) if b or a else i
                for i, b, a, n in zip(idx, pad_before, pad_after, value.shape)]

    limit = {"reflect": 1, "replicate": None, "circular": 0}[mode]
    for d, (b, a, n) in enumerate(zip(pad_before, pad_after, value.shape)):
        if min(b, a) < 0:
            raise ShapeError(f"{node}: negative padding {b}, {a} on axis {d} (a crop) is not a pad")
        if limit is not None and max(b, a) > n - limit:
            raise ShapeError(f"{node}: {mode} padding of {max(b, a)} on axis {d} of size {n}: it must be "
                             f"at most {n - limit}")
    shape = [s + b + a for s, b, a in zip(value.shape, pad_before, pad_after)]
    b, a, n = pad_before[-1], pad_after[-1], value.shape[-1]
    if max(b, a) > _EDGE_SELECTS:
        return view(value, shape, read_at, node)

    def loader(idx):
        outer = read_at(idx[:-1])
        i = idx[-1]
        expr = value.load(outer + [i - b if b else i])
        if not (b or a):
            return expr
        inside = [c for c in ((i >= b) if b else None, (i < b + n) if a else None) if c is not None]
        expr = L.Select(L.IndexValue(tirx.all(*inside), "bool"), expr, L.Const(0, value.dtype), guarded=True)
        for k in [*range(b), *range(b + n, b + n + a)]:
            at = rule(k - b, n, *_NUMBER_OPS)
            expr = L.Select(L.IndexValue(tirx.EQ(i, k), "bool"), value.load(outer + [at]), expr)
        return expr

    return TensorValue(shape, value.dtype, loader, node)


def full(shape: Sequence[int], value: float | int | bool, dtype: str) -> TensorValue:
    return TensorValue(shape, dtype, lambda idx: L.Const(value, dtype), "full")


def check_no_lowering(condition: bool, why: str) -> None:
    """Raise ``NotLowerable`` (the op falls back to TVM's legalization) when ``condition``."""
    if condition:
        raise NotLowerable(why)
