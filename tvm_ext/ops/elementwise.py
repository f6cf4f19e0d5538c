"""Elementwise and broadcast ops: each lowering is its scalar compute alone.

``pointwise`` (tvm_ext.lowering) does the loading, broadcasting, type promotion and
casting around it, so most entries are one line.
"""
from __future__ import annotations

import math
from typing import Callable

from tvm import relax

from tvm_ext import loop_ir as L
from tvm_ext.gradient_rules import GradientRule, const_like, expr_dtype, sum_to_like
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


#: each output element reads only the same element of these inputs (PlanMemory checks the
#: kernel too: a broadcast operand's shape differs from the output's and is never reused)
IN_PLACE_UNARY = ((0, 0),)
IN_PLACE_BINARY = ((0, 0), (1, 0))


def unary(name: str, fn: Callable[[L.LoopExpr], L.LoopExpr], float_only: bool = False,
          doc: str = "", gradient: GradientRule | None = None) -> None:
    register_op(name, OpPattern.ELEMWISE, _pointwise_lowering(fn, float_only), doc=doc, gradient=gradient,
                inplace=IN_PLACE_UNARY)


def binary(name: str, fn: Callable[[L.LoopExpr, L.LoopExpr], L.LoopExpr], doc: str = "",
           gradient: GradientRule | None = None) -> None:
    register_op(name, elemwise_or_broadcast, _pointwise_lowering(fn), doc=doc, gradient=gradient,
                inplace=IN_PLACE_BINARY)


# ---- gradients: each maps the output's adjoint g to one adjoint per argument (new nodes);
#      broadcast arguments get theirs summed back to their shape.
_op = relax.op


def _mask(cond: relax.Expr, like: relax.Expr) -> relax.Expr:
    return _op.astype(cond, expr_dtype(like))


def _selector_gradient(first_wins: Callable):
    """maximum / minimum: the adjoint goes to the argument that was picked (the first on ties)."""
    def rule(call, y, g, bb):
        a, b = call.args
        m = _mask(first_wins(a, b), g)
        return [sum_to_like(g * m, a, bb), sum_to_like(g * (const_like(1.0, g) - m), b, bb)]
    return rule


BINARY_GRADIENTS: dict[str, GradientRule] = {
    "add": lambda call, y, g, bb: [sum_to_like(g, a, bb) for a in call.args],
    "subtract": lambda call, y, g, bb: [sum_to_like(g, call.args[0], bb),
                                        sum_to_like(_op.negative(g), call.args[1], bb)],
    "multiply": lambda call, y, g, bb: [sum_to_like(g * call.args[1], call.args[0], bb),
                                        sum_to_like(g * call.args[0], call.args[1], bb)],
    "divide": lambda call, y, g, bb: [sum_to_like(g / call.args[1], call.args[0], bb),
                                      sum_to_like(_op.negative(g * y / call.args[1]), call.args[1], bb)],
    "power": lambda call, y, g, bb: [
        sum_to_like(g * call.args[1] * _op.power(call.args[0], call.args[1] - const_like(1.0, call.args[1])),
                    call.args[0], bb),
        sum_to_like(g * y * _op.log(call.args[0]), call.args[1], bb)],
    "maximum": _selector_gradient(_op.greater_equal),
    "minimum": _selector_gradient(_op.less_equal),
}

UNARY_GRADIENTS: dict[str, GradientRule] = {
    "negative": lambda call, y, g, bb: [_op.negative(g)],
    "exp": lambda call, y, g, bb: [g * y],
    "log": lambda call, y, g, bb: [g / call.args[0]],
    "sqrt": lambda call, y, g, bb: [g * const_like(0.5, g) / y],
    "rsqrt": lambda call, y, g, bb: [g * const_like(-0.5, g) * y * y * y],
    "tanh": lambda call, y, g, bb: [g * (const_like(1.0, g) - y * y)],
    "sigmoid": lambda call, y, g, bb: [g * y * (const_like(1.0, g) - y)],
    "abs": lambda call, y, g, bb: [g * _op.sign(call.args[0])],
    "sin": lambda call, y, g, bb: [g * _op.cos(call.args[0])],
    "cos": lambda call, y, g, bb: [_op.negative(g * _op.sin(call.args[0]))],
    "erf": lambda call, y, g, bb: [g * const_like(2.0 / math.sqrt(math.pi), g)
                                   * _op.exp(_op.negative(call.args[0] * call.args[0]))],
}


# ---- arithmetic and comparisons: one scalar primitive each
for _name in ("add", "subtract", "multiply", "divide", "floor_divide", "floor_mod", "power",
              "maximum", "minimum", "equal", "not_equal", "less", "less_equal", "greater",
              "greater_equal", "logical_and", "logical_or", "logical_xor", "bitwise_and",
              "bitwise_or", "bitwise_xor"):
    binary(f"relax.{_name}", getattr(L, _name), doc=f"Binary {_name}, numpy broadcasting.",
           gradient=BINARY_GRADIENTS.get(_name))
register_op("relax.mod", elemwise_or_broadcast, _pointwise_lowering(L.trunc_mod),
            doc="C-style remainder, torch.fmod's (sign of the dividend).", inplace=IN_PLACE_BINARY)

for _name in ("negative", "abs", "sign", "logical_not", "bitwise_not", "isnan", "isinf", "isfinite",
              "exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "sin", "cos", "tan",
              "floor", "ceil", "round", "trunc"):
    _float_only = L.SCALAR_OPS[_name].float_only
    unary(f"relax.{_name}", getattr(L, _name), float_only=_float_only,
          doc=f"Unary {_name}" + (" (float)." if _float_only else "."), gradient=UNARY_GRADIENTS.get(_name))

unary("relax.square", lambda x: x * x, doc="x * x.",
      gradient=lambda call, y, g, bb: [g * const_like(2.0, g) * call.args[0]])

# ---- activations, written as their math
unary("relax.nn.relu", lambda x: L.maximum(x, 0), doc="max(x, 0).",
      # where, not g * mask: the boolean crosses to the backward kernel (a byte an element, not
      # four), and a NaN adjoint where x <= 0 gives 0, as PyTorch's threshold_backward does
      gradient=lambda call, y, g, bb: [_op.where(_op.greater(call.args[0], const_like(0.0, g)), g, const_like(0.0, g))])


def _grad_silu(call, y, g, bb):
    s = _op.sigmoid(call.args[0])
    return [g * s * (const_like(1.0, g) + call.args[0] * (const_like(1.0, g) - s))]


# x / (1 + exp(-x)) rather than x * sigmoid(x): one division and no multiply a vector, and one
# rounding less (the same infinities and NaNs: -inf gives NaN either way, as in PyTorch)
unary("relax.nn.silu", lambda x: x / (1 + L.exp(-x)), float_only=True, doc="x / (1 + exp(-x)), x * sigmoid(x).",
      gradient=_grad_silu)


def _grad_gelu(call, y, g, bb):
    """Phi(x) + x * phi(x)."""
    x = call.args[0]
    cdf = const_like(0.5, g) * (const_like(1.0, g) + _op.erf(x * const_like(1.0 / math.sqrt(2.0), g)))
    pdf = _op.exp(x * x * const_like(-0.5, g)) * const_like(1.0 / math.sqrt(2.0 * math.pi), g)
    return [g * (cdf + x * pdf)]


unary("relax.nn.gelu", L.gelu, float_only=True, doc="x * Phi(x), exact (erf) form.", gradient=_grad_gelu)
unary("relax.nn.gelu_tanh",
      lambda x: x * 0.5 * (1.0 + L.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x)))),
      float_only=True, doc="GELU, tanh approximation.")


@register_op("relax.nn.leakyrelu", OpPattern.ELEMWISE, inplace=IN_PLACE_UNARY)
def _leakyrelu(node: OpNode) -> TensorValue:
    """x if x > 0 else alpha * x."""
    alpha = float(node.attr("alpha", 0.01))
    return pointwise(lambda x: L.select(L.greater(x, 0), x, x * alpha), node.tensors,
                     node.out_dtype, node.name)


@register_op("relax.clip", OpPattern.ELEMWISE, inplace=IN_PLACE_UNARY)
def _clip(node: OpNode) -> TensorValue:
    """min(max(x, lo), hi); the bounds are scalars of the call."""
    x, lo, hi = node.args
    return pointwise(lambda v: L.minimum(L.maximum(v, lo), hi), [x], node.out_dtype, node.name)


def _grad_where(call, y, g, bb):
    cond, a, b = call.args
    zero = const_like(0.0, g)
    return [None, sum_to_like(_op.where(cond, g, zero), a, bb), sum_to_like(_op.where(cond, zero, g), b, bb)]


@register_op("relax.where", elemwise_or_broadcast, gradient=_grad_where, inplace=((1, 0), (2, 0)))
def _where(node: OpNode) -> TensorValue:
    """cond ? a : b, with the branches promoted to one dtype."""
    cond, a, b = node.args
    dtype = L.compute_dtype(L.promote_dtypes(a.dtype, b.dtype))

    def fn(c, x, y):
        return L.select(L.cast(c, "bool"), L.cast(x, dtype), L.cast(y, dtype))

    return pointwise(fn, [cond, a, b], node.out_dtype, node.name, promote=False)


def _grad_astype(call, y, g, bb):
    x = call.args[0]
    return [_op.astype(g, expr_dtype(x)) if expr_dtype(x).startswith(("float", "bfloat")) else None]


@register_op("relax.astype", OpPattern.ELEMWISE, gradient=_grad_astype, inplace=IN_PLACE_UNARY,
             fold=lambda a, c: a.astype(str(c.attrs.dtype)))
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


def _no_gradient(call, y, g, bb):
    """The output does not depend on the input's values: no adjoint flows back."""
    return [None] * len(call.args)


def _creation(value_of: Callable[[OpNode], float | int | bool]):
    def lower(node: OpNode) -> TensorValue:
        return full(node.out_shape, value_of(node), node.out_dtype)
    return lower


register_op("relax.zeros", OpPattern.ELEMWISE, _creation(lambda n: 0), doc="All zeros.")
register_op("relax.ones", OpPattern.ELEMWISE, _creation(lambda n: 1), doc="All ones.")
register_op("relax.zeros_like", OpPattern.ELEMWISE, _creation(lambda n: 0), doc="Zeros of x's shape.",
            gradient=_no_gradient, shape_only=(0,))
register_op("relax.ones_like", OpPattern.ELEMWISE, _creation(lambda n: 1), doc="Ones of x's shape.",
            gradient=_no_gradient, shape_only=(0,))
register_op("relax.full", OpPattern.ELEMWISE, _creation(lambda n: _fill_value(n, 1)), doc="Filled.")
register_op("relax.full_like", OpPattern.ELEMWISE, _creation(lambda n: _fill_value(n, 1)),
            doc="Filled, x's shape.", gradient=_no_gradient, shape_only=(0,))
register_op("relax.ewise_fma", OpPattern.ELEMWISE,
            _pointwise_lowering(lambda a, b, c: a * b + c), doc="a * b + c (TVM has no kernel for it).",
            inplace=((0, 0), (1, 0), (2, 0)))
