"""Elementwise and broadcast ops: each lowering is its scalar compute alone.

``pointwise`` (tvm_ext.lowering) does the loading, broadcasting, type promotion and
casting around it, so most entries are one line.
"""
from __future__ import annotations

import math
from typing import Callable

from tvm import relax

from tvm_ext import loop_ir as L
from tvm_ext.lowering import TensorValue, check_no_lowering, full, pointwise
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OpNode, register_op


def elemwise_or_broadcast(call: relax.Call) -> OpPattern:
    """ElemWise when every tensor input already has the output's shape, else Broadcast."""
    out = call.ty
    for arg in call.args:
        ty = arg.ty
        if isinstance(ty, relax.TensorType) and not _same_shape(ty, out):
            return OpPattern.BROADCAST
    return OpPattern.ELEMWISE


def _same_shape(a: relax.TensorType, b) -> bool:
    if not isinstance(b, relax.TensorType) or a.shape is None or b.shape is None:
        return False
    try:
        return [int(x) for x in a.shape.values] == [int(x) for x in b.shape.values]
    except (TypeError, AttributeError):
        return False


def _pointwise_lowering(fn: Callable[..., L.LoopExpr], float_only: bool = False):
    def lower(node: OpNode) -> TensorValue:
        if float_only:
            check_no_lowering(not all(L.is_float(t.dtype) for t in node.tensors),
                              f"{node.op} on {[t.dtype for t in node.tensors]}: float only")
        return pointwise(fn, node.tensors, node.out_dtype, node.name)
    return lower


def unary(name: str, fn: Callable[[L.LoopExpr], L.LoopExpr], float_only: bool = False,
          doc: str = "") -> None:
    register_op(name, OpPattern.ELEMWISE, _pointwise_lowering(fn, float_only), doc=doc)


def binary(name: str, fn: Callable[[L.LoopExpr, L.LoopExpr], L.LoopExpr], doc: str = "") -> None:
    register_op(name, elemwise_or_broadcast, _pointwise_lowering(fn), doc=doc)


# ---- arithmetic and comparisons: one scalar primitive each
for _name in ("add", "subtract", "multiply", "divide", "floor_divide", "floor_mod", "power",
              "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
              "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
              "bitwise_or", "bitwise_xor"):
    binary(f"relax.{_name}", getattr(L, _name), doc=f"Binary {_name}, numpy broadcasting.")
register_op("relax.mod", elemwise_or_broadcast, _pointwise_lowering(L.floor_mod),
            doc="Python-style modulo (sign of the divisor).")

for _name in ("negative", "abs", "sign", "logical_not", "bitwise_not", "isnan", "isinf", "isfinite",
              "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "tan",
              "floor", "ceil", "round", "trunc"):
    _float_only = L.SCALAR_OPS[_name].float_only
    unary(f"relax.{_name}", getattr(L, _name), float_only=_float_only,
          doc=f"Unary {_name}" + (" (float)." if _float_only else "."))

unary("relax.square", lambda x: x * x, doc="x * x.")

# ---- activations, written as their math
unary("relax.nn.relu", lambda x: L.maximum(x, 0), doc="max(x, 0).")
unary("relax.nn.silu", lambda x: x * L.sigmoid(x), float_only=True, doc="x * sigmoid(x).")
unary("relax.nn.gelu", lambda x: x * 0.5 * (1.0 + L.erf(x * (1.0 / math.sqrt(2.0)))),
      float_only=True, doc="x * Phi(x), exact (erf) form.")
unary("relax.nn.gelu_tanh",
      lambda x: x * 0.5 * (1.0 + L.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x)))),
      float_only=True, doc="GELU, tanh approximation.")


@register_op("relax.nn.leakyrelu", OpPattern.ELEMWISE)
def _leakyrelu(node: OpNode) -> TensorValue:
    """x if x > 0 else alpha * x."""
    alpha = float(node.attr("alpha", 0.01))
    return pointwise(lambda x: L.select(L.greater(x, 0), x, x * alpha), node.tensors,
                     node.out_dtype, node.name)


@register_op("relax.clip", OpPattern.ELEMWISE)
def _clip(node: OpNode) -> TensorValue:
    """min(max(x, lo), hi); the bounds are scalars of the call."""
    x, lo, hi = node.args
    return pointwise(lambda v: L.minimum(L.maximum(v, lo), hi), [x], node.out_dtype, node.name)


@register_op("relax.where", elemwise_or_broadcast)
def _where(node: OpNode) -> TensorValue:
    """cond ? a : b, with the branches promoted to one dtype."""
    cond, a, b = node.args
    dtype = L.compute_dtype(L.promote_dtypes(a.dtype, b.dtype))

    def fn(c, x, y):
        return L.select(L.cast(c, "bool"), L.cast(x, dtype), L.cast(y, dtype))

    return pointwise(fn, [cond, a, b], node.out_dtype, node.name, promote=False)


@register_op("relax.astype", OpPattern.ELEMWISE)
def _astype(node: OpNode) -> TensorValue:
    """A cast; float -> int truncates toward zero as C does."""
    return pointwise(lambda x: x, node.tensors, node.out_dtype, node.name, promote=False)


# ---- creation ops: a constant at every index
def _fill_value(node: OpNode, arg: int) -> float | int | bool:
    value = node.args[arg]
    if isinstance(value, TensorValue):
        check_no_lowering(value.ndim != 0 or value.buffer is not None, "fill value is not a literal")
        return value.load(()).value
    return value


def _creation(value_of: Callable[[OpNode], float | int | bool]):
    def lower(node: OpNode) -> TensorValue:
        return full(node.out_shape, value_of(node), node.out_dtype)
    return lower


register_op("relax.zeros", OpPattern.ELEMWISE, _creation(lambda n: 0), doc="All zeros.")
register_op("relax.ones", OpPattern.ELEMWISE, _creation(lambda n: 1), doc="All ones.")
register_op("relax.zeros_like", OpPattern.ELEMWISE, _creation(lambda n: 0), doc="Zeros of x's shape.")
register_op("relax.ones_like", OpPattern.ELEMWISE, _creation(lambda n: 1), doc="Ones of x's shape.")
register_op("relax.full", OpPattern.ELEMWISE, _creation(lambda n: _fill_value(n, 1)), doc="Filled.")
register_op("relax.full_like", OpPattern.ELEMWISE, _creation(lambda n: _fill_value(n, 1)),
            doc="Filled, x's shape.")
register_op("relax.ewise_fma", OpPattern.ELEMWISE,
            _pointwise_lowering(lambda a, b, c: a * b + c), doc="a * b + c (TVM has no kernel for it).")
