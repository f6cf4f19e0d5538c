"""Vectorizable forms of transcendental functions, for float32.

LLVM turns TVM's ``exp`` into one scalar libm call per vector lane. These forms use only
arithmetic, comparisons and bit casts, so a vectorized loop stays vectorized. Each has its
maximum error measured against numpy (float64) in ``tests/test_fast_math.py``; the Loop IR
uses them for float32 unless the kernel asks for exact math (``compile(exact_math=True)``).
"""
from __future__ import annotations

from tvm import te, tirx

PrimExpr = tirx.Expr

# Cephes expf: exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2]
# with ln 2 split in two (Cody-Waite) so n * C1 is exact, and a degree-6 minimax polynomial.
_LOG2E = 1.44269504088896341
_C1 = 0.693359375
_C2 = -2.12194440e-4
_EXP_POLY = (1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1,
             5.0000001201e-1)
EXP_MAX = 88.72283172607421875  # the largest float32 whose exp is finite; above: +inf
EXP_MIN = -86.64  # below: 0 (the result would be below 2^-125; denormals are flushed)


def _f(value: float) -> PrimExpr:
    return tirx.const(value, "float32")


def exp(x: PrimExpr) -> PrimExpr:
    """exp for float32; relative error below 2e-7 on [EXP_MIN, EXP_MAX]."""
    xc = tirx.Min(tirx.Max(x, _f(EXP_MIN)), _f(EXP_MAX))
    n = te.floor(xc * _f(_LOG2E) + _f(0.5))
    r = xc - n * _f(_C1) - n * _f(_C2)
    p = _f(_EXP_POLY[0])
    for c in _EXP_POLY[1:]:
        p = p * r + _f(c)
    y = p * (r * r) + r + _f(1.0)
    # 2^(n-1) * 2 keeps the exponent field in range for n up to 128 (x near EXP_MAX)
    bits = tirx.shift_left(tirx.Cast("int32", n) + tirx.const(126, "int32"), tirx.const(23, "int32"))
    scaled = y * tirx.reinterpret("float32", bits) * _f(2.0)
    out = tirx.Select(x < _f(EXP_MIN), _f(0.0), scaled)
    out = tirx.Select(x > _f(EXP_MAX), _f(float("inf")), out)
    return tirx.Select(tirx.isnan(x), x, out)  # NaN stays NaN


def sigmoid(x: PrimExpr) -> PrimExpr:
    """1 / (1 + exp(-x)) with the vectorizable exp."""
    return _f(1.0) / (_f(1.0) + exp(-x))
