"""The op registry: one typed entry per Relax op with everything the compiler knows of it.

An ``OpDef`` holds the op's fuse pattern (one of the six NNVM kinds), its Loop-IR lowering,
its symbolic gradient (``tvm_ext.gradient_rules``) and its in-place pairs (PlanMemory). Entries
are registered in the modules of ``tvm_ext.ops`` (one file per family), which
``tvm_ext.ops`` imports explicitly: the set of ops never depends on who imported what
first, and registering a name twice is an error.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence, Union

import numpy as np
from tvm import relax

from tvm_ext.gradient_rules import GradientRule
from tvm_ext.lowering import KernelBuilder, TensorValue
from tvm_ext.patterns import OpPattern


@dataclass
class OpNode:
    """What a lowering sees of one Relax call: converted arguments, attributes, output types."""

    name: str  # the binding's variable name, for error messages
    op: str
    args: tuple  # TensorValue, list of TensorValue (tuples), or plain python values
    attrs: Any  # the Relax attrs object, or None
    out_shapes: list[tuple[int, ...]]
    out_dtypes: list[str]
    kb: KernelBuilder

    @property
    def out_shape(self) -> tuple[int, ...]:
        return self.out_shapes[0]

    @property
    def out_dtype(self) -> str:
        return self.out_dtypes[0]

    @property
    def tensors(self) -> list[TensorValue]:
        return [a for a in self.args if isinstance(a, TensorValue)]

    def attr(self, key: str, default: Any = None) -> Any:
        if self.attrs is None:
            return default
        return getattr(self.attrs, key, default)


Lowering = Callable[[OpNode], Union[TensorValue, Sequence[TensorValue]]]
PatternRule = Union[OpPattern, Callable[[relax.Call], OpPattern]]
ShapeRule = Callable[[tuple, dict], dict]  # (data shape, attrs) -> {input name: shape}
ConstantFold = Callable[[np.ndarray, relax.Call], np.ndarray]  # (the constant input, the call) -> the result
BroadcastRule = Union[bool, Callable[[relax.Call, relax.Var], bool]]  # (call, its result) -> a broadcast view?
# (input shapes, output shape, attrs) -> input shapes; None = unknown, a 0 dim = unknown dim (MXNet's)
InputShapeRule = Callable[[list, "tuple | None", dict], list]


@dataclass(frozen=True)
class SymbolOp:
    """How the Symbol API (``tvm_ext.symbol``) builds an op that needs more than its Relax call.

    ``emit(bb, inputs, attrs, name)`` adds the op's bindings to a Relax ``BlockBuilder`` (inputs
    are normalized Relax expressions, so their shapes are known) and returns the final
    expression, which the caller binds under the node's name; TVM's struct-info inference
    gives the forward shapes. ``param_shapes(data_shape, attrs)`` is the backward rule of
    NNVM's partial inference: the shapes of the weight-like inputs that the op's attributes fix.
    Ops without a ``SymbolOp`` get a generic one from their Relax call.
    """

    name: str  # function name in tvm_ext.symbol, e.g. "dense"
    emit: Callable[..., relax.Expr]
    inputs: tuple[str, ...] = ("data",)  # named inputs; all but the first become Variables if not given
    aux: tuple[str, ...] = ()  # inputs that are auxiliary states (batch-norm moving statistics)
    attrs: dict = field(default_factory=dict)  # attribute defaults; other keys are rejected
    required: tuple[str, ...] = ()  # attributes without a default
    optional: dict = field(default_factory=dict)  # input name -> attribute that, when true, drops it
    param_shapes: ShapeRule | None = None
    input_shapes: InputShapeRule | None = None  # NNVM's backward partial rule for what TVM cannot tell
    num_outputs: int | Callable[[dict], int] = 1
    variadic: bool = False  # any number of positional tensor inputs (concat); ``inputs`` unused
    aliases: tuple[str, ...] = ()  # MXNet names, e.g. "FullyConnected"
    doc: str = ""

    def active_inputs(self, attrs: dict) -> tuple[str, ...]:
        """The inputs present for these attributes (``no_bias=True`` drops the bias)."""
        return tuple(i for i in self.inputs if not (i in self.optional and attrs.get(self.optional[i])))


def pair(value: int | Sequence[int]) -> tuple[int, int]:
    """A 2-d size attribute (kernel, stride, pad) given as one int or two, as (h, w)."""
    if isinstance(value, int):
        return (value, value)
    h, w = (int(v) for v in value)
    return (h, w)


@dataclass(frozen=True)
class OpDef:
    """Everything the compiler knows about one Relax op."""

    name: str  # Relax op name, e.g. "relax.add"
    pattern: PatternRule  # fixed, or computed from the call (e.g. ElemWise vs Broadcast)
    lower: Lowering | None = None  # Loop-IR lowering; None keeps TVM's legalization
    gradient: GradientRule | None = None  # (call, output, out_grad, bb) -> adjoint per argument
    inplace: tuple[tuple[int, int], ...] = ()  # (input, output) pairs that may share memory
    mutates: tuple[int, ...] = ()  # inputs the op updates in place (NNVM's FMutateInputs): same device only
    view: bool = False  # a pure re-indexing that TVM can turn into a zero-copy reshape
    anchor: bool = False  # reads each input element many times (matmul, conv2d): inputs are not inlined
    shape_only: tuple[int, ...] = ()  # inputs read for their shape only (NNVM's FIgnoreInputs)
    fold: ConstantFold | None = None  # the op applied to a constant (FoldWeightLayout folds it away)
    broadcast_view: BroadcastRule = False  # only adds, drops or repeats unit dims (ConcretizeBroadcast)
    doc: str = ""
    symbol: SymbolOp | None = None  # how tvm_ext.symbol builds it, when its Relax call alone is not enough
    symbols: tuple[SymbolOp, ...] = ()  # more Symbol-API ops built on this Relax op (MXNet's dot, batch_dot)

    def pattern_of(self, call: relax.Call) -> OpPattern:
        return self.pattern(call) if callable(self.pattern) else self.pattern

    def is_broadcast_view(self, call: relax.Call, var: relax.Var) -> bool:
        return self.broadcast_view(call, var) if callable(self.broadcast_view) else self.broadcast_view


class OpRegistry:
    """A name -> ``OpDef`` table. Explicit and typed; no string attributes fetched at random."""

    def __init__(self) -> None:
        self._ops: dict[str, OpDef] = {}
        self.version = 0  # counts registrations: tables built from the registry rebuild when it moves

    def register(self, opdef: OpDef) -> OpDef:
        if opdef.name in self._ops:
            raise ValueError(f"op {opdef.name} is registered twice")
        self._ops[opdef.name] = opdef
        self.version += 1
        return opdef

    def get(self, name: str) -> OpDef | None:
        return self._ops.get(name)

    def __getitem__(self, name: str) -> OpDef:
        return self._ops[name]

    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def __iter__(self) -> Iterator[OpDef]:
        return iter(self._ops.values())

    def __len__(self) -> int:
        return len(self._ops)

    def names(self) -> list[str]:
        return sorted(self._ops)

    def without(self, *names: str) -> "OpRegistry":
        """A copy without the given ops (they then keep TVM's kernels)."""
        out = OpRegistry()
        for opdef in self:
            if opdef.name not in names:
                out.register(opdef)
        return out


OPS = OpRegistry()


def register_op(name: str, pattern: PatternRule, lower: Lowering | None = None, **kw) -> Any:
    """Register ``name`` in ``OPS``; without ``lower`` it decorates the lowering function."""
    if lower is not None:
        return OPS.register(OpDef(name, pattern, lower, **kw))

    def decorate(fn: Lowering) -> Lowering:
        OPS.register(OpDef(name, pattern, fn, doc=kw.pop("doc", fn.__doc__ or ""), **kw))
        return fn

    return decorate
