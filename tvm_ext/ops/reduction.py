"""Reductions (CommReduce): sum, mean, max, min, prod, variance, std.

Each reduction result is realized as a stage of its kernel (AutoFuse stop rule 1); the
pointwise work around it (the 1/N of a mean) stays fusable.
"""
from __future__ import annotations

import math

from tvm import relax

from tvm_ext import loop_ir as L
from tvm_ext.gradient_rules import GradientRule, broadcast_grad, const_like, keep_reduced_dims, reduced_axes, shape_of
from tvm_ext.lowering import (TensorValue, check_no_lowering, normalize_axes, on_first_load, pointwise, reduce,
                              reduction)
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OPS, OpDef, OpNode, SymbolOp, pair, register_op


def _axes(node: OpNode, x: TensorValue) -> tuple[int, ...]:
    axis = node.attr("axis")
    return normalize_axes(None if axis is None else [int(a) for a in axis], x.ndim, node.name)


def _keepdims(node: OpNode) -> bool:
    return bool(node.attr("keepdims", False))


def _count(x: TensorValue, axes) -> int:
    n = 1
    for a in axes:
        n *= x.shape[a]
    return n


def _simple(kind: str):
    def lower(node: OpNode) -> TensorValue:
        x = node.args[0]
        if kind in ("max", "min") and L.is_float(x.dtype):
            return _float_extremum(node, kind, x, _axes(node, x), _keepdims(node))
        return reduce(node.kb, x, _axes(node, x), kind, _keepdims(node), node.out_dtype, node.name)
    lower.__doc__ = f"Reduce with {kind} over the given axes" + (
        " (NaN if any element is NaN, -inf / inf over elements all -inf / inf, as in PyTorch)."
        if kind in ("max", "min") else ".")
    return lower


def _float_extremum(node: OpNode, kind: str, x: TensorValue, axes, keepdims: bool) -> TensorValue:
    """The max (min) of floats as PyTorch has it, in one integer reduction over ``ordered_key``.

    TVM's float max reducer (the one rfactor knows) skips NaN, which PyTorch propagates, and
    starts from the most extreme finite value (a max over a row all -inf, a fully masked row of
    attention scores, gave -3.4e38). The keys order as the floats do, with NaN beyond every
    value, so their max is the answer. The correction it replaces, a second reduction over a
    class of each element, cost softmax by hand 24% (2048 x 1024: 0.329 ms against 0.267 ms
    without it, Zen 4)."""
    if any(x.shape[a] == 0 for a in axes):  # the identity, -inf (inf), which no key's reduction starts from
        return reduce(node.kb, x, axes, kind, keepdims, node.out_dtype, node.name)
    float_type = _key_float(x.dtype)
    keys = pointwise(lambda v: ordered_key(L.cast(v, float_type), kind), [x], _KEYS[float_type][0],
                     node.name + "_key")
    best = reduce(node.kb, keys, axes, kind, keepdims, keys.dtype, node.name + "_keys")
    return pointwise(lambda k: float_of_key(k, float_type), [best], node.out_dtype, node.name)


# float -> (the integer of its width, that integer's largest value)
_KEYS = {"float32": ("int32", 0x7FFFFFFF), "float64": ("int64", 0x7FFFFFFFFFFFFFFF)}


def _key_float(dtype: str) -> str:
    """The float the keys of ``dtype`` are made from (half precision: float32, which holds it)."""
    return "float64" if dtype == "float64" else "float32"


def ordered_key(v: L.LoopExpr, kind: str) -> L.LoopExpr:
    """An integer that orders as the float ``v`` does, NaN beyond every value (above for a max,
    below for a min): a negative float's bits count down as it grows, so all but the sign bit
    are flipped; -0.0 falls just below 0.0."""
    int_type, top = _KEYS[v.dtype]
    bits = L.reinterpret(v, int_type)
    key = L.select(L.less(bits, L.const(0, int_type)), L.bitwise_xor(bits, L.const(top, int_type)), bits)
    return L.select(L.isnan(v), L.const(top if kind == "max" else -top - 1, int_type), key)


def float_of_key(k: L.LoopExpr, float_type: str) -> L.LoopExpr:
    """The float whose ``ordered_key`` is ``k`` (NaN's key gives a NaN)."""
    int_type, top = _KEYS[float_type]
    bits = L.select(L.less(k, L.const(0, int_type)), L.bitwise_xor(k, L.const(top, int_type)), k)
    return L.reinterpret(bits, float_type)


# ---- gradients: the output's adjoint, reduced dims kept, broadcast back over the input
def _spread(call: relax.Call, g: relax.Expr) -> relax.Expr:
    shape = shape_of(call.args[0])
    return keep_reduced_dims(g, shape, call.attrs.axis, bool(call.attrs.keepdims))


def _reduced_count(call: relax.Call) -> int:
    """How many input elements each output element of the reduction combines."""
    shape = shape_of(call.args[0])
    return math.prod(shape[a] for a in reduced_axes(shape, call.attrs.axis))


def _grad_sum(call, y, g, bb):
    return [broadcast_grad(_spread(call, g), shape_of(call.args[0]), bb)]


def _grad_mean(call, y, g, bb):
    scaled = _spread(call, g) * const_like(1.0 / _reduced_count(call), g)
    return [broadcast_grad(scaled, shape_of(call.args[0]), bb)]


def _grad_extremum(call, y, g, bb):
    """Through the positions that hold the max (min); ties share the adjoint equally."""
    x = call.args[0]
    hit = relax.op.astype(relax.op.equal(x, _spread(call, y)), str(g.ty.dtype))
    count = relax.op.sum(hit, reduced_axes(shape_of(x), call.attrs.axis), keepdims=True)
    return [hit * (_spread(call, g) / count)]


def _grad_variance(call, y, g, bb):
    """d var / dx = 2 (x - mean) / N."""
    x = call.args[0]
    centered = x - relax.op.mean(x, reduced_axes(shape_of(x), call.attrs.axis), keepdims=True)
    return [centered * (_spread(call, g) * const_like(2.0 / _reduced_count(call), g))]


REDUCE_GRADIENTS: dict[str, GradientRule] = {"sum": _grad_sum, "max": _grad_extremum, "min": _grad_extremum}


def _pool_emit(kind: str):
    def emit(bb, inputs, attrs, name):
        """Windows that tile the image are a reshape to (N, C, H/kh, kh, W/kw, kw) and a reduction
        over the window axes (fusable here); other windows keep Relax's pooling op."""
        x = inputs[0]
        (kh, kw), (ph, pw) = pair(attrs["kernel"]), pair(attrs["pad"])
        sh, sw = pair(attrs["kernel"] if attrs["stride"] is None else attrs["stride"])
        n, c, h, w = shape_of(x)
        if (sh, sw) == (kh, kw) and (ph, pw) == (0, 0) and h % kh == 0 and w % kw == 0:
            windows = bb.emit(relax.op.reshape(x, (n, c, h // kh, kh, w // kw, kw)), name + "_windows")
            return (relax.op.max if kind == "max" else relax.op.mean)(windows, axis=[3, 5])
        pool = relax.op.nn.max_pool2d if kind == "max" else relax.op.nn.avg_pool2d
        return pool(x, (kh, kw), (sh, sw), (ph, pw))
    return emit


POOLS = {kind: SymbolOp(f"{kind}_pool2d", _pool_emit(kind), attrs={"stride": None, "pad": (0, 0)},
                        required=("kernel",),
                        doc=f"2-d {kind} pooling of NCHW data; stride defaults to the kernel"
                            + (", padding left out of the average." if kind == "avg" else "."))
         for kind in ("max", "avg")}

for _kind in ("max", "avg"):  # TVM's kernels (no lowering here); the Symbol ops build windows as reductions
    OPS.register(OpDef(f"relax.nn.{_kind}_pool2d", OpPattern.OUT_EWISE_FUSABLE, symbol=POOLS[_kind],
                       doc=f"2-d {_kind} pooling: TVM's legalization (tiling windows become reductions in sym)"))

for _kind in ("sum", "max", "min", "prod"):
    register_op(f"relax.{_kind}", OpPattern.COMM_REDUCE, _simple(_kind), gradient=REDUCE_GRADIENTS.get(_kind))


def mean(node: OpNode, x: TensorValue, axes, keepdims: bool, out_dtype: str) -> TensorValue:
    """sum(x) * (1/N), the scale fused into the consumer."""
    total = reduce(node.kb, x, axes, "sum", keepdims, L.compute_dtype(out_dtype), node.name + "_sum")
    count = _count(x, axes)
    scale = 1.0 / count if count else math.nan  # the mean of nothing is NaN, as in numpy and PyTorch
    return pointwise(lambda s: s * scale, [total], out_dtype, node.name)


def variance(node: OpNode, x: TensorValue, axes, keepdims: bool, out_dtype: str,
             m: TensorValue | None = None) -> TensorValue:
    """Population variance, two-pass: mean((x - m)^2) with m = mean(x) (kept dims) if not given."""
    cdt = L.compute_dtype(out_dtype)
    if m is None:
        m = mean(node, x, axes, True, cdt)
    sq = pointwise(lambda v, mu: (v - mu) * (v - mu), [x, m], cdt, node.name + "_sq")
    return mean(node, sq, axes, keepdims, out_dtype)


@register_op("relax.mean", OpPattern.COMM_REDUCE, gradient=_grad_mean)
def _mean(node: OpNode) -> TensorValue:
    """Arithmetic mean over the given axes."""
    x = node.args[0]
    return mean(node, x, _axes(node, x), _keepdims(node), node.out_dtype)


@register_op("relax.variance", OpPattern.COMM_REDUCE, gradient=_grad_variance)
def _variance(node: OpNode) -> TensorValue:
    """Population variance (ddof=0) over the given axes."""
    x = node.args[0]
    return variance(node, x, _axes(node, x), _keepdims(node), node.out_dtype)


@register_op("relax.std", OpPattern.COMM_REDUCE)
def _std(node: OpNode) -> TensorValue:
    """Population standard deviation over the given axes."""
    x = node.args[0]
    v = variance(node, x, _axes(node, x), _keepdims(node), L.compute_dtype(node.out_dtype))
    return pointwise(L.sqrt, [v], node.out_dtype, node.name)


@register_op("relax.topk", OpPattern.COMM_REDUCE)
def _topk(node: OpNode) -> TensorValue | list[TensorValue]:
    """k = 1 only (what ``max(dim)`` imports as): the max (or min) and the first index where
    it occurs, each a reduction computed only if something reads it. Larger k keeps TVM's
    sort-based kernel."""
    check_no_lowering(int(node.attr("k")) != 1, "topk with k > 1")
    x = node.args[0]
    axis = normalize_axes([node.attr("axis")], x.ndim, node.name)[0]
    kind = "max" if bool(node.attr("largest", True)) else "min"
    shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape))
    n = x.shape[axis]

    def at(idx, k):
        return [k if d == axis else i for d, i in enumerate(idx)]

    if L.is_float(x.dtype):  # a NaN in the row is the row's max (min), at its first index, as in PyTorch
        float_type = _key_float(x.dtype)
        keys = on_first_load(node.kb, reduction(
            shape, [n], lambda idx, ks: ordered_key(L.cast(x.load(at(idx, ks[0])), float_type), kind), kind,
            _KEYS[float_type][0], node.name + "_keys"), node.name + "_keys")
        values = pointwise(lambda k: float_of_key(k, float_type), [keys], x.dtype, node.name + "_values")
    else:
        values = on_first_load(node.kb, reduction(shape, [n], lambda idx, ks: x.load(at(idx, ks[0])), kind,
                                                  L.compute_dtype(x.dtype), node.name + "_values"),
                               node.name + "_values")
        values = cast_like(values, x.dtype)
    index_dtype = str(node.attr("dtype", "int64"))

    def first_index(idx, ks):
        v, m = L.cast(x.load(at(idx, ks[0])), values.dtype), values.load(idx)
        hit = L.equal(v, m)
        if L.is_float(x.dtype):
            hit = L.logical_or(hit, L.logical_and(L.isnan(v), L.isnan(m)))
        return L.select(hit, L.IndexValue(ks[0], index_dtype), L.Const(n, index_dtype))

    indices = on_first_load(node.kb, reduction(shape, [n], first_index, "min", index_dtype, node.name + "_indices"),
                            node.name + "_indices")
    ret = str(node.attr("ret_type", "both"))
    return {"both": [values, indices], "values": values, "indices": indices}[ret]


def cast_like(value: TensorValue, dtype: str) -> TensorValue:
    return pointwise(lambda v: v, [value], dtype, value.name, promote=False)
