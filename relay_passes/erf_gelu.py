"""ErfGelu: GELU written out with erf, ``x * 0.5 * (1 + erf(x / sqrt(2)))``, as ``nn.gelu(x)``.

ONNX exports before opset 20 spell GELU so (Div, Erf, Add, Mul, Mul), as do models that wrote
it by hand before frameworks had the op. Written out, the erf takes our vectorizable erf (both
its branches, a division and an exp for every element); ``nn.gelu`` takes GELU's own form
(``fast_math.gelu``, one rational function): PyTorch's ONNX export of ``nn.GELU`` over
8x128x3072, kernels alone, 1.21 -> 0.52 ms (Zen 4). The factors may come in any order and
grouping: (x * 0.5) * (1 + e), (x * (1 + e)) * 0.5, x * ((1 + e) * 0.5), each product either
way round; the division by sqrt(2) may be a multiplication by its inverse. The result differs from the written-out form by the forms'
errors (below 3e-7 relative for x > 0, 1e-6 absolute below), so the rewrite is left out under
``exact_math`` with the other algebra.
"""
from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import PatternMatchingRewriter, is_const, is_op, wildcard

from relay_passes.simplify import scalar_value

#: how near a constant must be to 1/2, 1, sqrt(2) or its inverse (relative)
_TOLERANCE = 1e-6


def _mul(a, b):
    return is_op("relax.multiply")(a, b) | is_op("relax.multiply")(b, a)


def _pattern():
    """GELU written out, and its pattern nodes: x (one wildcard, which the matcher holds to one
    value wherever it stands), 1/2, 1, sqrt(2) (a divisor) and 1/sqrt(2) (a factor)."""
    x, half, one, root, inverse = wildcard(), is_const(), is_const(), is_const(), is_const()
    erf = is_op("relax.erf")(is_op("relax.divide")(x, root) | _mul(x, inverse))
    one_plus = is_op("relax.add")(erf, one) | is_op("relax.add")(one, erf)
    gelu = _mul(_mul(x, half), one_plus) | _mul(_mul(x, one_plus), half) | _mul(x, _mul(one_plus, half))
    return gelu, (x, half, one, root, inverse)


def _near(expr: relax.Expr | None, want: float) -> bool:
    value = scalar_value(expr) if expr is not None else None
    return value is not None and abs(value - want) <= _TOLERANCE * abs(want)


def _rewriter(parts):
    x_pat, half, one, root, inverse = parts

    def rewrite(expr: relax.Expr, matches: dict) -> relax.Expr:
        x = matches[x_pat]
        same_type = isinstance(expr.ty, relax.TensorType) and tvm_ffi.structural_equal(x.ty, expr.ty)
        scaled = _near(matches.get(root), math.sqrt(2.0)) or _near(matches.get(inverse), 1 / math.sqrt(2.0))
        if not (same_type and str(expr.ty.dtype) == "float32" and scaled and _near(matches[half], 0.5)
                and _near(matches[one], 1.0)):
            return expr  # another dtype, a broadcast, or other constants: not GELU
        return relax.op.nn.gelu(x)
    return rewrite


@tvm.ir.transform.module_pass(opt_level=0, name="ErfGelu")
class ErfGelu:
    """Rewrite ``x * 0.5 * (1 + erf(x / sqrt(2)))``, in any order of its factors (float32),
    into ``nn.gelu(x)``."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        pattern, parts = _pattern()
        return PatternMatchingRewriter.from_pattern(pattern, _rewriter(parts))(mod)
