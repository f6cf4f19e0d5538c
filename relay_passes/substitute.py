"""Variable substitution in the A-normal-form binding values our passes copy between functions."""
from __future__ import annotations

from tvm import relax


def substitute(expr: relax.Expr, vmap: dict) -> relax.Expr:
    """Replace variables in an A-normal-form binding value (call, tuple, field read)."""
    if isinstance(expr, relax.Var):
        return vmap.get(expr, expr)
    if isinstance(expr, relax.Tuple):
        return relax.Tuple([substitute(f, vmap) for f in expr.fields])
    if isinstance(expr, relax.TupleGetItem):
        return relax.TupleGetItem(substitute(expr.tuple_value, vmap), expr.index)
    if isinstance(expr, relax.Call):
        return relax.Call(expr.op, [substitute(a, vmap) for a in expr.args], expr.attrs, expr.ty_args)
    return expr
