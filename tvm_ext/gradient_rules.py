"""What op gradients are written with: the rule signature and the shape helpers they share.

A gradient rule gets the forward call, the variable it is bound to and the adjoint of that
variable (the gradient of the target with respect to it), and returns one expression per
argument of the call: the argument's adjoint contribution, built from new Relax nodes
(symbolic, never numeric), or ``None`` for arguments without one (integer indices, shapes).
``relay_passes.gradient.Gradient`` walks the graph and calls the rules; each op's rule sits
in its ``OpDef`` beside its lowering.
"""
from __future__ import annotations

from typing import Callable, Sequence, Union

from tvm import relax

from tvm_ext.errors import ShapeError

GradientRule = Callable[[relax.Call, relax.Var, relax.Expr, relax.BlockBuilder], list]
Axes = Union[Sequence[int], None]  # a reduction's ``axis`` attribute: None reduces every axis


def shape_of(expr: relax.Expr) -> tuple[int, ...]:
    """The static shape of a tensor expression; gradients need known shapes."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        raise ShapeError(f"gradient of {expr}: its shape is unknown; give the function static shapes")
    try:
        return tuple(int(d) for d in ty.shape.values)
    except TypeError as err:
        raise ShapeError(f"gradient of {expr}: symbolic shape {ty.shape}; give the function static "
                         "shapes") from err


def expr_dtype(expr: relax.Expr) -> str:
    """The dtype of a tensor expression."""
    return str(expr.ty.dtype)


def const_like(value: float, like: relax.Expr) -> relax.Constant:
    """A scalar constant of ``like``'s dtype."""
    return relax.const(value, expr_dtype(like))


def sum_to(grad: relax.Expr, shape: Sequence[int], bb: relax.BlockBuilder) -> relax.Expr:
    """Reduce a gradient of a broadcast result back to the input's ``shape``.

    Sums the leading axes broadcasting added and the axes where the input had size 1, then
    reshapes to ``shape``; the inverse of numpy broadcasting.
    """
    grad = bb.normalize(grad)
    gshape = shape_of(grad)
    shape = tuple(int(s) for s in shape)
    if gshape == shape:
        return grad
    lead = len(gshape) - len(shape)
    if lead < 0:
        raise ShapeError(f"cannot reduce a gradient of shape {list(gshape)} to {list(shape)}")
    axes = list(range(lead)) + [lead + d for d, s in enumerate(shape) if s == 1 and gshape[lead + d] != 1]
    if axes:
        grad = relax.op.sum(grad, axis=axes, keepdims=False)
    return relax.op.reshape(grad, shape)


def sum_to_like(grad: relax.Expr, like: relax.Expr, bb: relax.BlockBuilder) -> relax.Expr:
    """``sum_to`` the shape of ``like`` (the argument a broadcast gradient belongs to)."""
    return sum_to(grad, shape_of(like), bb)


def keep_reduced_dims(grad: relax.Expr, in_shape: Sequence[int], axis: Axes, keepdims: bool) -> relax.Expr:
    """The gradient of a reduction over ``axis`` reshaped with the reduced dims kept (size 1)."""
    shape = reduced_shape(in_shape, axis)
    if keepdims or shape == ():
        return grad
    return relax.op.reshape(grad, shape)


def broadcast_grad(grad: relax.Expr, shape: Sequence[int], bb: relax.BlockBuilder) -> relax.Expr:
    """``broadcast_to`` unless ``grad`` has the shape already."""
    grad = bb.normalize(grad)
    return grad if shape_of(grad) == tuple(shape) else relax.op.broadcast_to(grad, shape)


def reduced_axes(in_shape: Sequence[int], axis: Axes) -> list[int]:
    """The axes a reduction attribute names (``None``: all), non-negative."""
    ndim = len(in_shape)
    return list(range(ndim)) if axis is None else sorted(int(a) % ndim for a in axis)


def reduced_shape(in_shape: Sequence[int], axis: Axes) -> tuple[int, ...]:
    """The shape of a reduction's result with the reduced dims kept (size 1)."""
    axes = reduced_axes(in_shape, axis)
    return tuple(1 if d in axes else s for d, s in enumerate(in_shape))


def swap_last_two(expr: relax.Expr, ndim: int) -> relax.Expr:
    """Transpose the last two axes (a batched matrix transpose)."""
    axes = list(range(ndim))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    return relax.op.permute_dims(expr, axes)
