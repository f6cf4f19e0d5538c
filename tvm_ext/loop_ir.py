"""Loop IR: the scalar expression that computes one element of a tensor.

This is AutoFuse's operator-level Lowering IR (autofuse_lowering_en.md, "Operator
Lowering"). A node computes one scalar for one point of an iteration space:

- ``Load``: one element of a buffer, at an index (a tuple of TIR index expressions). View
  operators (reshape, transpose, broadcast, slice) only change that index, so they cost
  nothing.
- ``Const`` / ``IndexValue``: a literal, or an index expression used as data (iota, masks).
- ``Cast``: a dtype conversion (type promotion inserts these); ``Reinterpret``: the same
  bits read as another dtype of their width (a float's bits as an integer).
- ``Compute``: one scalar primitive of ``SCALAR_OPS`` applied to its arguments.
- ``Select``: a choice; ``guarded`` selects evaluate only the chosen branch (padding,
  concat), the others evaluate both (relu, where).
- ``Reduce``: a commutative reduction of a body over reduce axes; it only appears at the
  top of a realized stage (a reduction result is always realized: AutoFuse stop rule 1).

Broadcasting and storing are not nodes: a broadcast is an index map on ``Load`` (see
``tvm_ext.lowering.broadcast_to``) and a store is the realization of a stage. Every node
translates to TE by ``to_te``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, Union

import tvm
import tvm_ffi
from tvm import te, tirx

from tvm_ext import fast_math, float_class

PrimExpr = tirx.Expr
Index = Union[PrimExpr, "LoopExpr"]  # a LoopExpr index is a data-dependent (gather) index


# --------------------------------------------------------------------------- dtypes
_FLOATS = ("float16", "bfloat16", "float32", "float64")
_INTS = ("int8", "int16", "int32", "int64")
_UINTS = ("uint8", "uint16", "uint32", "uint64")
SUPPORTED_DTYPES = frozenset(("bool", "float16", "float32", "float64") + _INTS + ("uint8",))


def is_float(dtype: str) -> bool:
    return str(dtype) in _FLOATS


def is_int(dtype: str) -> bool:
    return str(dtype) in _INTS or str(dtype) in _UINTS


def _bits(dtype: str) -> int:
    return 1 if dtype == "bool" else tvm.DataType(dtype).bits


def promote_dtypes(*dtypes: str) -> str:
    """The dtype a pointwise op computes in: PyTorch's promotion (the highest category of
    bool < int < float wins, then the widest type of that category; int32 + float16 is
    float16, unlike numpy's float64)."""
    dtypes = [str(d) for d in dtypes]
    floats = [d for d in dtypes if is_float(d)]
    if floats:
        return max(floats, key=_bits)
    ints = [d for d in dtypes if is_int(d)]
    if not ints:
        return "bool"
    signed = [d for d in ints if d in _INTS]
    unsigned = [d for d in ints if d in _UINTS]
    if signed and unsigned:
        bits = max(max(_bits(d) for d in signed), 2 * max(_bits(d) for d in unsigned))
        return f"int{min(bits, 64)}"
    return max(ints, key=_bits)


def compute_dtype(dtype: str) -> str:
    """Half precision is computed in float32 and rounded once at the end (as Inductor does)."""
    return "float32" if dtype == "float16" else dtype


# --------------------------------------------------------------------------- nodes
class LoopExpr:
    """Base of all Loop IR nodes; ``dtype`` is the scalar type of the value."""

    dtype: str

    def children(self) -> tuple["LoopExpr", ...]:
        return ()

    # Arithmetic sugar so lowerings read like the math: ``x * sigmoid(x)``.
    def __add__(self, other): return compute("add", self, _lift(other, self.dtype))
    def __radd__(self, other): return compute("add", _lift(other, self.dtype), self)
    def __sub__(self, other): return compute("subtract", self, _lift(other, self.dtype))
    def __rsub__(self, other): return compute("subtract", _lift(other, self.dtype), self)
    def __mul__(self, other): return compute("multiply", self, _lift(other, self.dtype))
    def __rmul__(self, other): return compute("multiply", _lift(other, self.dtype), self)
    def __truediv__(self, other): return compute("divide", self, _lift(other, self.dtype))
    def __rtruediv__(self, other): return compute("divide", _lift(other, self.dtype), self)
    def __neg__(self): return compute("negative", self)

    def __repr__(self) -> str:
        return format_expr(self)


@dataclass(eq=False, repr=False)
class Buffer:
    """A tensor in memory that a kernel reads: a kernel input or a realized stage."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    tensor: te.Tensor | None = None  # set when the kernel builder creates its TE tensor


@dataclass(eq=False, repr=False)
class Load(LoopExpr):
    buffer: Buffer
    index: tuple[Index, ...]

    def __post_init__(self):
        if len(self.index) != len(self.buffer.shape):
            raise ValueError(f"load of {self.buffer.name}{list(self.buffer.shape)} with "
                             f"{len(self.index)} indices")
        self.dtype = self.buffer.dtype

    def children(self):
        return tuple(i for i in self.index if isinstance(i, LoopExpr))


@dataclass(eq=False, repr=False)
class Const(LoopExpr):
    value: float | int | bool
    dtype: str


@dataclass(eq=False, repr=False)
class IndexValue(LoopExpr):
    expr: PrimExpr
    dtype: str


@dataclass(eq=False, repr=False)
class Cast(LoopExpr):
    value: LoopExpr
    dtype: str

    def children(self):
        return (self.value,)


@dataclass(eq=False, repr=False)
class Reinterpret(LoopExpr):
    value: LoopExpr
    dtype: str

    def __post_init__(self):
        if _bits(self.value.dtype) != _bits(self.dtype):
            raise TypeError(f"reinterpret keeps the width: {self.value.dtype} is not {self.dtype}'s")

    def children(self):
        return (self.value,)


@dataclass(eq=False, repr=False)
class Compute(LoopExpr):
    op: str
    args: tuple[LoopExpr, ...]
    dtype: str = field(init=False)

    def __post_init__(self):
        spec = SCALAR_OPS[self.op]
        if len(self.args) != spec.arity:
            raise ValueError(f"{self.op} takes {spec.arity} arguments, got {len(self.args)}")
        dtypes = {a.dtype for a in self.args}
        if len(dtypes) > 1:
            raise TypeError(f"{self.op} arguments disagree on dtype: {sorted(dtypes)}; "
                            "cast them to one compute dtype first")
        self.dtype = "bool" if spec.boolean else self.args[0].dtype

    def children(self):
        return self.args


@dataclass(eq=False, repr=False)
class Select(LoopExpr):
    cond: LoopExpr
    true_value: LoopExpr
    false_value: LoopExpr
    guarded: bool = False
    dtype: str = field(init=False)

    def __post_init__(self):
        if self.true_value.dtype != self.false_value.dtype:
            raise TypeError(f"select branches disagree on dtype: {self.true_value.dtype} vs "
                            f"{self.false_value.dtype}")
        self.dtype = self.true_value.dtype

    def children(self):
        return (self.cond, self.true_value, self.false_value)


REDUCE_KINDS = ("sum", "max", "min", "prod")


@dataclass(eq=False, repr=False)
class Reduce(LoopExpr):
    kind: str
    body: LoopExpr
    axes: tuple[tirx.IterVar, ...]
    dtype: str = field(init=False)

    def __post_init__(self):
        if self.kind not in REDUCE_KINDS:
            raise ValueError(f"unknown reduction {self.kind!r}; one of {REDUCE_KINDS}")
        self.dtype = self.body.dtype

    def children(self):
        return (self.body,)


def walk(expr: LoopExpr) -> Iterator[LoopExpr]:
    """Every distinct node under ``expr`` (shared subtrees once), parents before children."""
    seen: set[int] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        yield node
        stack.extend(reversed(node.children()))


def count_nodes(expr: LoopExpr) -> int:
    return sum(1 for _ in walk(expr))


def tree_size(expr: LoopExpr) -> int:
    """Nodes the expression would have as a tree: what recomputing every shared subexpression
    (no memoized loads, no CSE) would build. Exponential in the depth of a fan-out chain."""
    sizes: dict[int, int] = {}
    stack = [(expr, False)]
    while stack:  # post-order without recursion: children are sized before their parent
        node, ready = stack.pop()
        if id(node) in sizes:
            continue
        if ready:
            sizes[id(node)] = 1 + sum(sizes[id(c)] for c in node.children())
        else:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children() if id(c) not in sizes)
    return sizes[id(expr)]


def inlined_size(expr: LoopExpr, exact_math: bool = False) -> int:
    """Nodes of the TIR expression ``to_te`` makes of ``expr`` once every ``Let`` is substituted:
    what TVM's arithmetic analyzer walks, since its passes and LLVM codegen bind each ``Let``
    value to its variable and simplify through it. A fast-math form reads its argument many
    times (tanh 784, log 209), so nesting forms multiplies sizes: the compile time of a kernel
    grows with this number (about 15 us a node), not with its Loop IR."""
    sizes: dict[int, int] = {}
    stack = [(expr, False)]
    while stack:  # post-order without recursion, as in tree_size
        node, ready = stack.pop()
        if id(node) in sizes:
            continue
        if not ready:
            stack.append((node, True))
            stack.extend((c, False) for c in node.children() if id(c) not in sizes)
            continue
        child = [sizes[id(c)] for c in node.children()]
        if isinstance(node, Compute):
            own, uses = _op_profile(node.op, tuple(a.dtype for a in node.args), _is_fast(node, exact_math),
                                    _constants(node))
            sizes[id(node)] = own + sum(u * c for u, c in zip(uses, child))
        else:
            sizes[id(node)] = 1 + sum(child)
    return sizes[id(expr)]


_PROFILES: dict[tuple, tuple[int, tuple[int, ...]]] = {}


def _op_profile(op: str, dtypes: tuple[str, ...], fast: bool,
                constants: tuple = ()) -> tuple[int, tuple[int, ...]]:
    """(nodes of the op's own TIR, how often it reads each argument), Lets substituted, from
    translating the op once on variables, or on the numbers ``constants`` gives (None for a
    variable): ``power(x, 0.5)`` is a square root that reads x once, ``power(x, y)`` thrice."""
    constants = constants or (None,) * len(dtypes)
    key = (op, dtypes, fast, tuple(repr(c) for c in constants))  # repr: NaN equal to itself
    if key not in _PROFILES:
        spec = SCALAR_OPS[op]
        args = [tirx.Var(f"a{i}", d) if c is None else tirx.const(c, d)
                for i, (d, c) in enumerate(zip(dtypes, constants))]
        expr = spec.te_fast(*args, let=True) if fast else spec.te_fn(*args)
        size, uses = _te_inlined(expr, args)
        _PROFILES[key] = (size - sum(uses), tuple(uses))
    return _PROFILES[key]


def _constants(node: Compute) -> tuple:
    return tuple(a.value if isinstance(a, Const) else None for a in node.args)


def tir_inlined_size(expr: PrimExpr) -> int:
    """``inlined_size`` of a TIR expression itself (a block's stored value, say)."""
    return _te_inlined(expr, [])[0]


def _te_inlined(expr: PrimExpr, leaves: list[tirx.Var]) -> tuple[int, list[int]]:
    """Tree size of a (small) TIR expression with its Lets substituted, and the occurrences
    of each of ``leaves`` in it."""
    leaf_index = {hash(v): i for i, v in enumerate(leaves)}
    env: dict[int, tuple[int, list[int]]] = {}

    def go(e) -> tuple[int, list[int]]:
        if isinstance(e, tirx.Let):
            env[hash(e.var)] = go(e.value)
            return go(e.body)
        if isinstance(e, tirx.Var):
            if hash(e) in leaf_index:
                uses = [0] * len(leaves)
                uses[leaf_index[hash(e)]] = 1
                return 1, uses
            return env.get(hash(e), (1, [0] * len(leaves)))
        size, uses = 1, [0] * len(leaves)
        for c in _te_children(e):
            cs, cu = go(c)
            size += cs
            uses = [a + b for a, b in zip(uses, cu)]
        return size, uses
    return go(expr)


def _te_children(e) -> list:
    if isinstance(e, tirx.Select):
        return [e.condition, e.true_value, e.false_value]
    if isinstance(e, tvm.ir.Call):  # a tensor read counts one node, as a Loop IR Load does
        return [] if getattr(e.op, "name", "") == "te.tensor_load" else list(e.args)
    if isinstance(e, (tirx.Cast, tirx.Broadcast)):
        return [e.value]
    if isinstance(e, tirx.Not):
        return [e.a]
    if hasattr(e, "a") and hasattr(e, "b"):  # binary arithmetic and comparisons
        return [e.a, e.b]
    return []


def count_loads(expr: LoopExpr) -> int:
    return sum(1 for n in walk(expr) if isinstance(n, Load))


def format_expr(expr: LoopExpr) -> str:
    """One-line text form, e.g. ``add(load(x, [i0, i1]), 1f32)``."""
    if isinstance(expr, Load):
        return f"load({expr.buffer.name}, [{', '.join(map(_fmt_index, expr.index))}])"
    if isinstance(expr, Const):
        return f"{expr.value}{_short(expr.dtype)}"
    if isinstance(expr, IndexValue):
        return f"index({expr.expr})"
    if isinstance(expr, Cast):
        return f"cast<{expr.dtype}>({format_expr(expr.value)})"
    if isinstance(expr, Reinterpret):
        return f"reinterpret<{expr.dtype}>({format_expr(expr.value)})"
    if isinstance(expr, Compute):
        return f"{expr.op}({', '.join(format_expr(a) for a in expr.args)})"
    if isinstance(expr, Select):
        kind = "guarded_select" if expr.guarded else "select"
        return f"{kind}({', '.join(format_expr(a) for a in expr.children())})"
    if isinstance(expr, Reduce):
        axes = ", ".join(f"{a.var}<{a.dom.extent}" for a in expr.axes)
        return f"reduce_{expr.kind}[{axes}]({format_expr(expr.body)})"
    return type(expr).__name__


def _fmt_index(index: Index) -> str:
    return format_expr(index) if isinstance(index, LoopExpr) else str(index)


def _short(dtype: str) -> str:
    return {"float32": "f", "float64": "d", "float16": "h", "bool": "b"}.get(dtype, dtype)


# --------------------------------------------------------------------------- scalar ops
@dataclass(frozen=True)
class ScalarOp:
    """A scalar primitive: its arity, its TE translation and whether it returns bool."""

    name: str
    arity: int
    te_fn: Callable[..., PrimExpr]
    boolean: bool = False
    float_only: bool = False
    te_fast: Callable[..., PrimExpr] | None = None  # a vectorizable float32 form (fast_math)


def dtype_of(expr) -> str:
    """The dtype of a TIR expression (TVM 0.27 keeps it in ``.ty``; tensor reads in ``.dtype``)."""
    ty = getattr(expr, "ty", None)
    return str(ty) if ty is not None else str(expr.dtype)


def _binds_lets(fn: Callable[..., PrimExpr]) -> Callable[..., PrimExpr]:
    """``fn`` with every argument that holds a ``Let`` (a fast-math form's) bound to a variable
    first: ``fn`` reads its arguments more than once, and a copied ``Let`` defines its
    variable twice. Reduction bodies hold no ``Let``, so nothing is bound there."""
    def bound(*args):
        lets = []
        for i, a in enumerate(args):
            if _holds_let(a):
                var = tirx.Var(f"arg{i}", dtype_of(a))
                lets.append((var, a))
                args = args[:i] + (var,) + args[i + 1:]
        out = fn(*args)
        for var, value in reversed(lets):
            out = tirx.Let(var, value, out)
        return out
    return bound


def _holds_let(expr: PrimExpr) -> bool:
    if isinstance(expr, (tirx.Var, tirx.IntImm, tirx.FloatImm)):
        return False
    found = []
    tvm_ffi.structural_walk(expr, (tirx.Let, lambda e: found.append(e)))
    return bool(found)


def _floor_divide(a, b):
    if is_float(dtype_of(a)):
        return te.floor(a / b)
    return tirx.floordiv(a, b)


@_binds_lets
def _floor_mod(a, b):
    """The remainder with the divisor's sign. For floats, as PyTorch and numpy: fmod, then the
    divisor added where the signs differ (a - floor(a / b) * b gives NaN for an infinite b and
    rounds the quotient)."""
    dtype = dtype_of(a)
    if not is_float(dtype):
        return tirx.floormod(a, b)
    zero = tirx.const(0, dtype)
    r = tirx.Var("rem", dtype)
    fix = tirx.Or(tirx.And(r < zero, b > zero), tirx.And(r > zero, b < zero))  # signs differ
    return tirx.Let(r, _trunc_mod(a, b), tirx.Select(fix, r + b, r))


def _trunc_mod(a, b):
    """The remainder with the dividend's sign; for floats libm's fmod, which is exact (a - trunc(a
    / b) * b rounds the quotient), one scalar call a lane."""
    dtype = dtype_of(a)
    if not is_float(dtype):
        return tirx.truncmod(a, b)
    return tirx.call_pure_extern(dtype, {"float32": "fmodf", "float64": "fmod"}[dtype], a, b)


def _maximum(a, b):
    """max that returns NaN when either operand is NaN, as PyTorch does (a compare-select, or
    x86's maxps, returns the other operand for one of them): LLVM's ``llvm.maximum`` (IEEE
    754-2019: NaN if either is, +0 over -0), which reads each operand once. A select on the
    first operand's bits read it four times, and maxima nested as a tree (a chain of clamps)
    grew fourfold a level: six took minutes to compile. Against a number it is one vmaxps
    (a NaN fix-up more for 0)."""
    if not is_float(dtype_of(a)):
        return tirx.Max(a, b)
    return tirx.call_llvm_pure_intrin(dtype_of(a), "llvm.maximum", a, b)


def _minimum(a, b):
    if not is_float(dtype_of(a)):
        return tirx.Min(a, b)
    return tirx.call_llvm_pure_intrin(dtype_of(a), "llvm.minimum", a, b)


@_binds_lets
def _power(a, b):
    """pow as PyTorch computes it: an exponent of 0.5 or -0.5 given as a number is sqrt or rsqrt
    (so (-inf) ** 0.5 is NaN), any other is C's pow (pow(-inf, 0.5) is +inf, a finite negative
    base with a non-integer exponent NaN)."""
    dtype = dtype_of(a)
    if not is_float(dtype):
        return te.power(a, b)
    if isinstance(b, tirx.FloatImm) and float(b.value) in (0.5, -0.5):
        root = te.sqrt(a)
        return root if float(b.value) > 0 else tirx.const(1.0, dtype) / root
    zero, nan = tirx.const(0, dtype), tirx.const(float("nan"), dtype)
    finite_negative = tirx.And(a < zero, a > tirx.const(float("-inf"), dtype))
    return tirx.Select(tirx.And(finite_negative, te.floor(b) != b), nan, te.power(a, b))


@_binds_lets
def _sign(a):
    zero, one = tirx.const(0, dtype_of(a)), tirx.const(1, dtype_of(a))
    return tirx.Select(a > zero, one, tirx.Select(a < zero, -one, zero))


def _divide(a, b):
    return a / b if is_float(dtype_of(a)) else tirx.truncdiv(a, b)


_SCALAR_OP_LIST = [
    ScalarOp("add", 2, lambda a, b: a + b),
    ScalarOp("subtract", 2, lambda a, b: a - b),
    ScalarOp("multiply", 2, lambda a, b: a * b),
    ScalarOp("divide", 2, _divide, te_fast=fast_math.divide),
    ScalarOp("floor_divide", 2, _floor_divide),
    ScalarOp("floor_mod", 2, _floor_mod),
    ScalarOp("trunc_mod", 2, _trunc_mod),
    ScalarOp("power", 2, _power),
    ScalarOp("maximum", 2, _maximum),
    ScalarOp("minimum", 2, _minimum),
    ScalarOp("equal", 2, tirx.EQ, boolean=True),
    ScalarOp("not_equal", 2, tirx.NE, boolean=True),
    ScalarOp("less", 2, tirx.LT, boolean=True),
    ScalarOp("less_equal", 2, tirx.LE, boolean=True),
    ScalarOp("greater", 2, tirx.GT, boolean=True),
    ScalarOp("greater_equal", 2, tirx.GE, boolean=True),
    ScalarOp("logical_and", 2, tirx.And, boolean=True),
    ScalarOp("logical_or", 2, tirx.Or, boolean=True),
    # NE on two i1 values makes LLVM's codegen emit a float compare; spell xor out.
    ScalarOp("logical_xor", 2, _binds_lets(lambda a, b: tirx.And(tirx.Or(a, b), tirx.Not(tirx.And(a, b)))),
             boolean=True),
    ScalarOp("logical_not", 1, tirx.Not, boolean=True),
    ScalarOp("bitwise_and", 2, tirx.bitwise_and),
    ScalarOp("bitwise_or", 2, tirx.bitwise_or),
    ScalarOp("bitwise_xor", 2, tirx.bitwise_xor),
    ScalarOp("bitwise_not", 1, tirx.bitwise_not),
    ScalarOp("negative", 1, lambda a: -a),
    ScalarOp("abs", 1, te.abs),
    ScalarOp("sign", 1, _sign),
    ScalarOp("exp", 1, te.exp, float_only=True, te_fast=fast_math.exp),
    # exp of an argument its op knows is <= 0 (x - max(x)): the fast form needs no overflow clamp
    ScalarOp("exp_nonpositive", 1, te.exp, float_only=True,
             te_fast=lambda x, let=False: fast_math.exp(x, let, nonpositive=True)),
    ScalarOp("log", 1, te.log, float_only=True, te_fast=fast_math.log),
    ScalarOp("sqrt", 1, te.sqrt, float_only=True),
    ScalarOp("rsqrt", 1, te.rsqrt, float_only=True),
    ScalarOp("tanh", 1, te.tanh, float_only=True, te_fast=fast_math.tanh),
    ScalarOp("sigmoid", 1, te.sigmoid, float_only=True, te_fast=fast_math.sigmoid),
    ScalarOp("erf", 1, te.erf, float_only=True, te_fast=fast_math.erf),
    ScalarOp("gelu", 1, lambda x: x * (0.5 + 0.5 * te.erf(x * (1.0 / math.sqrt(2.0)))), float_only=True,
             te_fast=fast_math.gelu),
    ScalarOp("sin", 1, te.sin, float_only=True),
    ScalarOp("cos", 1, te.cos, float_only=True),
    ScalarOp("tan", 1, te.tan, float_only=True),
    ScalarOp("floor", 1, te.floor, float_only=True),
    ScalarOp("ceil", 1, te.ceil, float_only=True),
    ScalarOp("round", 1, te.round, float_only=True),
    ScalarOp("trunc", 1, te.trunc, float_only=True),
    ScalarOp("isnan", 1, float_class.isnan, boolean=True),
    ScalarOp("isinf", 1, float_class.isinf, boolean=True),
    ScalarOp("isfinite", 1, float_class.isfinite, boolean=True),
]
SCALAR_OPS: dict[str, ScalarOp] = {op.name: op for op in _SCALAR_OP_LIST}


def compute(op: str, *args: LoopExpr) -> Compute:
    return Compute(op, tuple(args))


def _lift(value, dtype: str) -> LoopExpr:
    return value if isinstance(value, LoopExpr) else Const(value, dtype)


def const(value, dtype: str) -> Const:
    return Const(value, dtype)


def cast(value: LoopExpr, dtype: str) -> LoopExpr:
    """Cast unless already of ``dtype``."""
    return value if value.dtype == dtype else Cast(value, dtype)


def reinterpret(value: LoopExpr, dtype: str) -> Reinterpret:
    """``value``'s bits as ``dtype``, a type of the same width."""
    return Reinterpret(value, dtype)


def select(cond: LoopExpr, true_value, false_value, guarded: bool = False) -> Select:
    dtype = true_value.dtype if isinstance(true_value, LoopExpr) else false_value.dtype
    return Select(cond, _lift(true_value, dtype), _lift(false_value, dtype), guarded)


def _scalar_fn(name: str, arity: int):
    def fn(*args):
        if len(args) != arity:
            raise TypeError(f"{name} takes {arity} arguments")
        first = next((a for a in args if isinstance(a, LoopExpr)), None)
        if first is None:
            raise TypeError(f"{name} needs at least one Loop IR argument")
        return compute(name, *[_lift(a, first.dtype) for a in args])
    fn.__name__ = name
    fn.__doc__ = f"Loop IR ``{name}``."
    return fn


# Module-level constructors, one per scalar op: ``loop_ir.exp(x)``, ``loop_ir.maximum(a, b)``.
for _op in _SCALAR_OP_LIST:
    globals()[_op.name] = _scalar_fn(_op.name, _op.arity)
del _op


# --------------------------------------------------------------------------- to TE
def to_te(expr: LoopExpr, exact_math: bool = False, bounds: Sequence[tuple] = ()) -> PrimExpr:
    """Translate a Loop IR expression to a TE/TIR expression (loads become tensor reads).

    float32 transcendentals use the vectorizable forms of ``fast_math`` unless
    ``exact_math`` asks for TVM's (libm) ones.

    Common subexpressions are computed once: a node with several parents in the DAG is
    bound to a variable by a ``Let`` around the expression. Nodes under a guarded select
    stay in place, as they may only run when the guard holds, and so do the nodes of a load's
    index (a gather), from which TVM derives the block's read region. The vectorizable forms bind
    the values they read many times the same way, locally. A reduction's body holds no
    ``Let`` (LLVM's CSE does the work there): schedules copy reduction bodies (``rfactor``),
    and a copied ``Let`` would define its variable twice.

    ``bounds`` gives the (variable, extent) of each loop around ``expr``; with them (and the
    reduce axes' ranges) every load's index is simplified.
    """
    indices = _LoadIndices(bounds)
    if isinstance(expr, Reduce):
        memo: dict[int, PrimExpr] = {}

        def tr(node: LoopExpr) -> PrimExpr:
            if id(node) not in memo:
                memo[id(node)] = _translate(node, tr, exact_math, False, indices)
            return memo[id(node)]
        return tr(expr)
    return _translate_cse(expr, exact_math, indices)


class _LoadIndices:
    """Simplifies a load's index with the ranges of the loops it runs in: a view chain's div/mod
    (a reshape of (4, 48, 30, 30) to (4, 8, 5400) reads ``x[((i1 * 5400 + k) // 43200 + i0) % 4,
    ...]``) becomes the index it means (``x[i0, i1 * 6 + k // 900, ...]``), which the schedule
    analysis and TVM's vectorizer can follow."""

    def __init__(self, bounds: Sequence[tuple]):
        self.analyzer = tvm.sym.Analyzer()
        self.bound: set = set()
        for var, extent in bounds:
            self.bind(var, tvm.ir.Range(0, extent))

    def bind(self, var: tirx.Var, dom: tvm.ir.Range) -> None:
        if var not in self.bound:
            self.bound.add(var)
            self.analyzer.bind(var, dom)

    def bind_axes(self, axes: Sequence[Any]) -> None:
        for iv in axes:
            self.bind(iv.var, iv.dom)

    def __call__(self, index: PrimExpr) -> PrimExpr:
        return self.analyzer.simplify(index) if self.bound else index




def _is_load(expr) -> bool:
    """A tensor read: TE's ``tensor_load`` call, or a buffer load."""
    if isinstance(expr, tvm.ir.Call):
        return getattr(expr.op, "name", "") == "te.tensor_load"
    return type(expr).__name__ in ("BufferLoad", "ProducerLoad")


def _translate_cse(root: LoopExpr, exact_math: bool, indices: _LoadIndices) -> PrimExpr:
    parents: dict[int, int] = {}
    guarded: set[int] = set()
    for node in walk(root):
        for child in node.children():
            parents[id(child)] = parents.get(id(child), 0) + 1
        if isinstance(node, Select) and node.guarded:
            for branch in (node.true_value, node.false_value):
                guarded.update(id(n) for n in walk(branch))
        if isinstance(node, Load):  # an index stays in place: a block's read region is computed
            for index in node.children():  # from its loads' indices, outside any Let
                guarded.update(id(n) for n in walk(index))
    shared = {key for key, count in parents.items() if count > 1 and key not in guarded}
    memo: dict[int, PrimExpr] = {}
    lets: list[tuple] = []
    # one analyzer a kernel: a long-lived one kept what it learnt of earlier kernels' reads and
    # then failed to hash a TE read (PlaceholderOp) in a float class's integer comparison
    analyzer = tvm.sym.Analyzer()

    def tr(node: LoopExpr) -> PrimExpr:
        key = id(node)
        if key in memo:
            return memo[key]
        out = _translate(node, tr, exact_math, True, indices)
        # a boolean stays inline: once vectorized, TVM's analyzer cannot bind a bool-vector Let
        # (it builds an IntImm of type boolx8 and fails)
        if key in shared and not isinstance(node, (Load, Const, IndexValue, Reduce)) and node.dtype != "bool":
            if count_nodes(node) <= 16:  # a value TVM simplifies to a load stays inline: a Let of
                # max(a, a) bound to a, then x = a - cse, made TVM's analyzer bind x twice and fail
                try:
                    simple = analyzer.simplify(out)
                except TypeError:  # it cannot hash a TE read inside an integer comparison (a
                    simple = out   # float class's bit test of a load): nothing to simplify then
                if isinstance(simple, (tirx.Var, tirx.IntImm, tirx.FloatImm)) or _is_load(simple):
                    memo[key] = simple
                    return simple
            var = tirx.Var(f"cse{len(lets)}", node.dtype)
            lets.append((var, out))
            out = var
        memo[key] = out
        return out

    body = tr(root)
    for var, value in reversed(lets):
        body = tirx.Let(var, value, body)
    return body


def _translate(node: LoopExpr, tr: Callable[[LoopExpr], PrimExpr], exact_math: bool, let: bool,
               indices: _LoadIndices) -> PrimExpr:
    if isinstance(node, Load):
        if node.buffer.tensor is None:
            raise RuntimeError(f"buffer {node.buffer.name} has no TE tensor yet")
        index = [_te_index(tr(i)) if isinstance(i, LoopExpr) else indices(i) for i in node.index]
        return node.buffer.tensor(*index)
    if isinstance(node, Const):
        return tirx.const(node.value, node.dtype)
    if isinstance(node, IndexValue):
        return node.expr if dtype_of(node.expr) == node.dtype else tirx.Cast(node.dtype, node.expr)
    if isinstance(node, Cast):
        value = tr(node.value)
        return value if dtype_of(value) == node.dtype else tirx.Cast(node.dtype, value)
    if isinstance(node, Reinterpret):
        return tirx.reinterpret(node.dtype, tr(node.value))
    if isinstance(node, Compute):
        spec = SCALAR_OPS[node.op]
        if _is_fast(node, exact_math):  # its Lets only outside reduction bodies
            return spec.te_fast(*[tr(a) for a in node.args], let=let)
        return spec.te_fn(*[tr(a) for a in node.args])
    if isinstance(node, Select):
        cond, t, f = tr(node.cond), tr(node.true_value), tr(node.false_value)
        return tirx.if_then_else(cond, t, f) if node.guarded else tirx.Select(cond, t, f)
    if isinstance(node, Reduce):
        indices.bind_axes(node.axes)
        body = tr(node.body)
        axes = list(node.axes)
        if node.kind == "sum":
            return te.sum(body, axis=axes)
        if node.kind == "max":  # drops NaN (PyTorch keeps it): rfactor takes only TVM's reducers
            return te.max(body, axis=axes)
        if node.kind == "min":
            return te.min(body, axis=axes)
        return _PROD(body, axis=axes)
    raise TypeError(f"cannot translate {type(node).__name__} to TE")


def _is_fast(node: LoopExpr, exact_math: bool) -> bool:
    """Whether ``node`` translates to a vectorizable float32 form of ``fast_math``."""
    return (isinstance(node, Compute) and not exact_math and node.dtype == "float32"
            and SCALAR_OPS[node.op].te_fast is not None)


_PROD = te.comm_reducer(lambda a, b: a * b, lambda dtype: tirx.const(1, dtype), name="prod")


def _te_index(value: PrimExpr) -> PrimExpr:
    return value if dtype_of(value) in ("int32", "int64") else tirx.Cast("int64", value)
