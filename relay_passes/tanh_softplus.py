"""TanhSoftplus: ``tanh(softplus(x))`` (Mish's gate) as one exp and one division.

With ``e = exp(x)``, ``tanh(log(1 + e)) = ((1 + e)^2 - 1) / ((1 + e)^2 + 1) = n / (n + 2)`` for
``n = e * (e + 2)``. PyTorch exports softplus as ``where(x > 20, x, log(1 + exp(x)))``, and
Mish as ``x * tanh(that)``: three transcendentals (exp, log, and tanh's own exp) and a
division, where the closed form needs one exp and one division (Mish 3x500x700 on an
AVX-512 Xeon, kernel alone: 0.67 -> 0.37 ms).

Float32 only, where the edges are exact: ``exp`` takes ``min(x, 20)``, so ``n`` cannot
overflow (for x > 9.1, ``n / (n + 2)`` and ``tanh(x)`` both round to 1, and so does the
where's branch for any threshold above 9.1); NaN stays NaN, ``-inf`` gives 0 as the original
does; for very negative x, ``n / (n + 2) ~ e`` keeps its relative precision (no cancellation).
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from relay_passes.simplify import scalar_value

# tanh(v) rounds to 1.0 in float32 for v above this; a softplus threshold below it would
# make the where's x-branch differ from the closed form
_TANH_IS_ONE = 9.1


def _pattern():
    x = wildcard()
    one = is_const()
    log = is_op("relax.log")(is_op("relax.add")(is_op("relax.exp")(x), one))
    threshold = is_const()
    soft = log | is_op("relax.where")(is_op("relax.greater")(x, threshold), x, log)
    return is_op("relax.tanh")(soft), x, one, threshold


def _rewrite(x_pat, one_pat, threshold_pat):
    def rewriter(expr: relax.Expr, matches: dict) -> relax.Expr:
        x = matches[x_pat]
        if not isinstance(expr.ty, relax.TensorType) or str(expr.ty.dtype) != "float32":
            return expr
        if scalar_value(matches[one_pat]) != 1.0:
            return expr
        if threshold_pat in matches and not (scalar_value(matches[threshold_pat]) or 0.0) >= _TANH_IS_ONE:
            return expr
        e = relax.op.exp(relax.op.minimum(x, relax.const(20.0, "float32")))
        n = relax.op.multiply(e, relax.op.add(e, relax.const(2.0, "float32")))
        return relax.op.divide(n, relax.op.add(n, relax.const(2.0, "float32")))
    return rewriter


@tvm.ir.transform.module_pass(opt_level=0, name="TanhSoftplus")
class TanhSoftplus:
    """Rewrite ``tanh(log(1 + exp(x)))``, and PyTorch's thresholded softplus under tanh, into
    ``n / (n + 2)``, ``n = e (e + 2)``, ``e = exp(min(x, 20))`` (float32)."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        pattern, *parts = _pattern()
        rewriter = _rewrite(*parts)
        out = mod.clone()
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                out.update_func(gv, rewrite_call(pattern, rewriter, func))
        return out
