"""Vectorizable forms of transcendental functions, for float32.

LLVM turns TVM's ``exp`` into one scalar libm call per vector lane. These forms use only
arithmetic, comparisons and bit casts, so a vectorized loop stays vectorized. Each has its
maximum error measured against numpy (float64) in ``tests/test_fast_math.py``; the Loop IR
uses them for float32 unless the kernel asks for exact math (``compile(exact_math=True)``).
"""
from __future__ import annotations

import math

import tvm
import tvm_ffi
from tvm import tirx

from tvm_ext import float_class

PrimExpr = tirx.Expr

# exp(x) = 2^n * exp(r), n = round(x / ln 2), r = x - n ln 2 in [-ln2/2, ln2/2] with ln 2 split
# in two (Cody-Waite) so n * C1 is exact; exp(r) by a degree-5 polynomial in Horner form (five
# FMAs), its coefficients fitted for least maximum relative error (Lawson's iteration, 9.1e-8
# in float64; 1.8e-7 measured in float32, tests/test_fast_math.py). The coefficients are
# doubled (exactly, a power of two) so that the scale can be 2^(n-1): see exp.
_LOG2E = 1.44269504088896341
_C1 = 0.693359375
_C2 = -2.12194440e-4
_EXP_POLY = tuple(2.0 * c for c in (0.008290314115583897, 0.04189793020486832, 0.1666763573884964,
                                     0.4999915063381195, 0.9999997019767761, 1.0))
EXP_MAX = 88.72283172607421875  # the largest float32 whose exp is finite; above: +inf
EXP_MIN = -86.98  # the accurate range starts here (n >= -125); below, results under 2^-124 may be 0
_EXP_FLOOR = -87.0  # n = -126 here and below: the result is exactly 0 (denormals are flushed)
_EXP_CLAMP = 89.0  # above EXP_MAX and small enough that 2^n stays a float: exp overflows to +inf
_ROUNDER = 12582912.0  # 1.5 * 2^23


def _f(value: float) -> PrimExpr:
    return tirx.const(value, "float32")


def _horner(coeffs: tuple[float, ...], x: PrimExpr) -> PrimExpr:
    """The polynomial with ``coeffs`` (highest degree first) at ``x``, by Horner's rule."""
    p = _f(coeffs[0])
    for c in coeffs[1:]:
        p = p * x + _f(c)
    return p


class _Lets:
    """Binds the values a form uses many times to variables (a ``Let`` each, around the
    form's result), so an argument is computed once however often the formula reads it.
    Disabled in reduction bodies, which may not hold a ``Let`` (see ``loop_ir.to_te``)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.bindings: list[tuple[tirx.Var, PrimExpr]] = []

    def __call__(self, value: PrimExpr, name: str, dtype: str = "float32") -> PrimExpr:
        if not self.enabled or isinstance(value, (tirx.Var, tirx.IntImm, tirx.FloatImm)):
            return value
        var = tirx.Var(name, dtype)
        self.bindings.append((var, value))
        return var

    def wrap(self, body: PrimExpr) -> PrimExpr:
        for var, value in reversed(self.bindings):
            body = tirx.Let(var, value, body)
        return body


def exp(x: PrimExpr, let: bool = False, nonpositive: bool = False,
        bounds: tuple[float, float] = (-math.inf, math.inf)) -> PrimExpr:
    """exp for float32; relative error below 2e-7 on [EXP_MIN, EXP_MAX], +inf above, 0 below.
    ``bounds``: what the caller knows of ``x`` (NaN aside): a clamp its range cannot reach is left
    out. ``nonpositive`` is ``bounds=(-inf, 0)``: softmax's ``x - max(x)``.

    A clamp costs an instruction a vector, and in the kernel's TIR a select on the argument:
    each select made the TIR passes that reason about conditions (FlattenBuffer,
    HoistIfThenElse) several times as long. erf (argument in [-15.4, -1]) and tanh (at least 0)
    leave out two and one: an erf kernel's TIR passes 35 -> 5 ms, tanh's 25 -> 7 (Zen 4)."""
    lo, hi = (-math.inf, 0.0) if nonpositive else bounds
    lets = _Lets(let)
    x = lets(x, "x")
    # Clamp with selects a NaN passes through (it compares false both ways), so NaN stays NaN
    # with no test of its own. Above EXP_MAX the result overflows to +inf by itself; at the
    # floor n = -126 makes the scale's exponent field 0, so the result is exactly 0.
    xc = x
    if lo < _EXP_FLOOR:
        xc = tirx.Select(xc < _f(_EXP_FLOOR), _f(_EXP_FLOOR), xc)
    if hi > EXP_MAX:
        xc = tirx.Select(xc > _f(_EXP_CLAMP), _f(_EXP_CLAMP), xc)
    xc = lets(xc, "xc")
    # n = round(x log2 e) by the float adder: adding 1.5 * 2^23 + 126 leaves n + 126 in the low
    # bits of t's mantissa. (t is read back through its bits: TVM's simplifier folds (a + c) - c
    # in floats.)
    t = lets(tirx.reinterpret("int32", xc * _f(_LOG2E) + _f(_ROUNDER + 126.0)), "t", "int32")
    n = lets(tirx.reinterpret("float32", t) - _f(_ROUNDER + 126.0), "n")
    r = lets(xc - n * _f(_C1) - n * _f(_C2), "r")
    y = _horner(_EXP_POLY, r)  # 2 exp(r)
    # 2^(n-1) from t's bits: the shift keeps the low 9 bits, n + 126 in [0, 255], as the
    # exponent field and drops t's own exponent. With y doubled no intermediate is denormal,
    # and n up to 129 stays in range. (The 126 in the rounder saves an integer add a vector.)
    bits = tirx.shift_left(t, tirx.const(23, "int32"))
    return lets.wrap(y * tirx.reinterpret("float32", bits))


def divide(a: PrimExpr, b: PrimExpr, let: bool = False) -> PrimExpr:
    """``a * (1 / b)`` when ``b`` stays the same along a row (``along_row_constant``: a
    constant, a kept-dims row sum, LayerNorm's ``sqrt(var + eps)``): LLVM then hoists the one
    division out of the vectorized loop instead of dividing every vector of the row (softmax by
    hand: 0.67 -> 0.49 ms). One rounding more than ``a / b``: at most 1 ulp."""
    if along_row_constant(b):
        return a * (_f(1.0) / b)
    return a / b


def along_row_constant(b: PrimExpr) -> bool:
    """Whether ``b`` reads tensors only at a fixed place of their last axis (as a kept-dims row
    statistic is read) and names no loop variable outside those reads: then it is the same for
    every element of a row, whatever arithmetic combines the reads. The other indices are not
    looked at: a read ``s[j, 0]`` along the row passes too, and then costs one multiplication
    more than the division would, never a different result beyond the ulp."""
    if isinstance(b, tirx.FloatImm):
        return True
    reads, varying = [0], [False]

    def visit(node):
        if isinstance(node, tvm.ir.Call) and getattr(node.op, "name", "") == "te.tensor_load":
            reads[0] += 1
            varying[0] |= not isinstance(node.args[-1], tirx.IntImm)
            return tvm_ffi.WalkResult.SKIP  # the other indices name the row: the same along it
        varying[0] |= isinstance(node, (tirx.Var, tirx.Let))
        return None

    tvm_ffi.structural_walk(b, visit, order="pre")
    return reads[0] > 0 and not varying[0]


def sigmoid(x: PrimExpr, let: bool = False) -> PrimExpr:
    """1 / (1 + exp(-x)) with the vectorizable exp."""
    return _f(1.0) / (_f(1.0) + exp(-x, let))


# Cephes logf: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), log(x) = e ln2 + log(m) where
# log(1 + f) = f - f^2/2 + f^3 P(f) (degree 8) and ln 2 is split as in exp.
_LOG_POLY = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1, 1.4249322787e-1,
             -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
_SQRT_HALF = 0.707106781186547524
_FLT_MIN = 1.17549435e-38


def log(x: PrimExpr, let: bool = False) -> PrimExpr:
    """log for float32; relative error below 2e-7 away from x = 1 (absolute 1e-7 near it)."""
    lets = _Lets(let)
    x = lets(x, "x")
    tiny = x < _f(_FLT_MIN)  # a denormal: scale it into the normal range first
    xs = tirx.Select(tiny, x * _f(8388608.0), x)  # * 2^23
    bits = lets(tirx.reinterpret("int32", xs), "bits", "int32")
    e = tirx.Cast("float32", tirx.shift_right(bits, tirx.const(23, "int32")) - tirx.const(126, "int32"))
    e = tirx.Select(tiny, e - _f(23.0), e)
    m = tirx.reinterpret("float32", tirx.bitwise_or(tirx.bitwise_and(bits, tirx.const(0x007FFFFF, "int32")),
                                                    tirx.const(0x3F000000, "int32")))  # in [0.5, 1)
    m = lets(m, "m")
    small = m < _f(_SQRT_HALF)
    e = lets(tirx.Select(small, e - _f(1.0), e), "e")
    f = lets(tirx.Select(small, m + m - _f(1.0), m - _f(1.0)), "f")
    z = lets(f * f, "z")
    p = _horner(_LOG_POLY, f)
    y = p * f * z + e * _f(_C2) - _f(0.5) * z
    out = f + y + e * _f(_C1)
    out = tirx.Select(x == _f(0.0), _f(float("-inf")), out)
    out = tirx.Select(x < _f(0.0), _f(float("nan")), out)
    out = tirx.Select(x == _f(float("inf")), x, out)  # -inf is negative: NaN, as above
    return lets.wrap(tirx.Select(float_class.isnan(x), x, out))


# tanh: an odd polynomial below 0.625 (Cephes tanhf), 1 - 2 / (exp(2|x|) + 1) above.
_TANH_POLY = (-5.70498872745e-3, 2.06390887954e-2, -5.37397155531e-2, 1.33314422036e-1, -3.33332819422e-1)


def tanh(x: PrimExpr, let: bool = False) -> PrimExpr:
    """tanh for float32; relative error below 3e-7."""
    lets = _Lets(let)
    x = lets(x, "x")
    ax = lets(tirx.Select(x < _f(0.0), -x, x), "ax")
    z = lets(x * x, "z")
    p = _horner(_TANH_POLY, z)
    small = p * z * x + x
    big = lets(_f(1.0) - _f(2.0) / (exp(ax + ax, let, bounds=(0.0, math.inf)) + _f(1.0)), "big")
    big = tirx.Select(x < _f(0.0), -big, big)
    return lets.wrap(tirx.Select(ax < _f(0.625), small, big))


# erf: x * P(x^2) on [0, 1]; 1 - exp(-x^2) * Q(1/x) on [1, 3.92]; 1 beyond (erf(3.92) rounds
# to 1 in float32). P and Q are least-squares fits of the relative error on Chebyshev nodes
# (max approximation error 1.4e-9 and 1.2e-8).
_ERF_SMALL = (7.89821018959967e-05, -0.0008024354123944977, 0.005190053577382247, -0.02685480853703675,
              0.11283612428241932, -0.3761262884332519, 1.1283791665100524)
_ERFC_LARGE = (-0.011008645663978913, 0.036079387336092006, 0.008337129597223221, -0.2244656504271146,
               0.48505322480391927, -0.4666184625224909, 0.0407210080431169, 0.5592264435650498,
               0.0002591138681131871)


# GELU's Phi(x) = 1/2 + x R(x^2) on |x| <= 5.66 (beyond, Phi is within 8e-9 of 1 or 0), R a
# rational function of degree (5, 5) fitted for least maximum relative error by Lawson's
# iteration on Chebyshev nodes (2.5e-8 in float64). Coefficients highest degree first.
_GELU_LIMIT = 5.66
_PHI_P = (2.193260446948825e-08, 6.288330241958505e-06, 0.00017178522555909333, 0.004694574051880957,
          0.034231263170112075, 0.39894227050679815)
_PHI_Q = (1.1688575521805894e-06, 7.414593883308694e-05, 0.001901846714089274, 0.028847115234425506,
          0.2524713269254652, 1.0)


def gelu(x: PrimExpr, let: bool = False) -> PrimExpr:
    """x Phi(x), GELU's exact (erf) form, for float32: one rational function and no exp, 17
    operations a vector against erf's 40. Within 2.2e-7 of the exact value relative for x > 0
    (PyTorch's vectorized form: 3.5e-7) and 8.8e-7 absolute below, where Phi cancels as
    PyTorch's 1 + erf does (1.1e-6); -0 below -5.66, so gelu(-inf) is NaN as in PyTorch.
    Measured against float64 and PyTorch in tests/test_fast_math.py."""
    lets = _Lets(let)
    x = lets(x, "x")
    xc = lets(tirx.Min(tirx.Max(x, _f(-_GELU_LIMIT)), _f(_GELU_LIMIT)), "xc")
    z = lets(xc * xc, "z")
    phi = xc * (_horner(_PHI_P, z) / _horner(_PHI_Q, z)) + _f(0.5)
    return lets.wrap(x * tirx.Select(x < _f(-_GELU_LIMIT), _f(0.0), phi))


def erf(x: PrimExpr, let: bool = False) -> PrimExpr:
    """erf for float32; its error is measured against torch.erf in the tests."""
    lets = _Lets(let)
    x = lets(x, "x")
    ax = lets(tirx.Select(x < _f(0.0), -x, x), "ax")
    z = lets(x * x, "z")
    p = _horner(_ERF_SMALL[:-1], z)
    # x * P(z) = x + x * (P(z) - 1): the small correction rounds on its own, x stays exact
    small = x + x * (p * z + _f(_ERF_SMALL[-1] - 1.0))
    axc = lets(tirx.Min(tirx.Max(ax, _f(1.0)), _f(3.92)), "axc")
    t = lets(_f(1.0) / axc, "t")
    q = _horner(_ERFC_LARGE, t)
    large = lets(_f(1.0) - exp(-(axc * axc), let, bounds=(-3.92 * 3.92, -1.0)) * q, "large")
    large = tirx.Select(ax > _f(3.92), _f(1.0), large)
    large = tirx.Select(x < _f(0.0), -large, large)
    out = tirx.Select(ax < _f(1.0), small, large)
    return lets.wrap(tirx.Select(float_class.isnan(x), x, out))
