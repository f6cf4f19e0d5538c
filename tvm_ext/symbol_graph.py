"""The Symbol API's graph and its op table, apart from the ``Symbol`` class, so that shape
inference and the Relax translation read them without importing the class that calls them:
``Node``/``NodeEntry`` (the seed's "Graph Abstraction"), attribute strings, and ``OpInfo``,
one entry per Symbol op built from the op registry (rebuilt after any registration)."""
from __future__ import annotations

import ast
import inspect
from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import tvm
from tvm import relax

from tvm_ext.errors import DtypeError, InputError
from tvm_ext.registry import OPS, OpDef, SymbolOp


# --------------------------------------------------------------------------- graph structures
@dataclass(eq=False)
class Node:
    """One node: an op applied to input entries, or a variable (``op is None``)."""

    op: str | None  # name of the op in this module's table; None for a variable
    name: str
    attrs: dict[str, Any] = field(default_factory=dict)  # op attributes (variables: shape/dtype hints)
    inputs: list[NodeEntry] = field(default_factory=list)
    user_attrs: dict[str, str] = field(default_factory=dict)  # free attributes: ctx_group, lr_mult, ...
    num_outputs: int = 1
    control_deps: list[Node] = field(default_factory=list)  # NNVM's: nodes that must run before this one

    @property
    def is_variable(self) -> bool:
        return self.op is None

    def output_name(self, index: int) -> str:
        if self.is_variable:
            return self.name
        return f"{self.name}_output" if self.num_outputs == 1 else f"{self.name}_output{index}"

    def __repr__(self) -> str:
        return f"Node({self.op or 'null'}, {self.name!r})"


class NodeEntry(NamedTuple):
    """One output of a node: the node and which of its outputs."""

    node: Node
    index: int = 0

    @property
    def name(self) -> str:
        return self.node.output_name(self.index)



def dtype_name(dtype: Any) -> str:
    """A dtype as its name: strings as given, numpy types (np.float32, np.dtype) as numpy names them."""
    if isinstance(dtype, str):
        return dtype
    try:
        return np.dtype(dtype).name
    except TypeError as err:
        raise InputError(f"{dtype!r} is not a dtype; use a name ('float32') or a numpy type (np.float32)") from err


def format_attr(value: Any) -> str:
    """An attribute as NNVM stores it: a string (Python literal syntax for non-strings)."""
    return value if isinstance(value, str) else repr(value)


def parse_attr(text: str) -> Any:
    """The value ``format_attr`` wrote: a Python literal (``inf`` and ``nan`` too), else the string."""
    try:
        return ast.literal_eval(_NonFinite().visit(ast.parse(text, mode="eval")))
    except (ValueError, SyntaxError, TypeError):
        return text


class _NonFinite(ast.NodeTransformer):
    """``inf`` and ``nan``, as ``repr`` writes them, become float constants for ``literal_eval``."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.Constant(float(node.id)) if node.id in ("inf", "nan") else node


# --------------------------------------------------------------------------- the op table
@dataclass(frozen=True)
class OpInfo:
    """One op of the Symbol API: a registry op's Relax function, or its ``SymbolOp``."""

    name: str
    opdef: OpDef
    spec: SymbolOp | None  # None: the generic form (inputs are the Symbols passed to the Relax function)
    relax_fn: Callable | None = None

    def num_outputs(self, attrs: dict) -> int:
        if self.spec is not None:
            n = self.spec.num_outputs
            return n(attrs) if callable(n) else n
        return 1

    def emit(self, bb: relax.BlockBuilder, inputs: list[relax.Expr], attrs: dict, name: str) -> relax.Expr:
        """The Relax expression of one node (intermediates go into ``bb`` as ``name_*``)."""
        if self.spec is not None:
            return self.spec.emit(bb, inputs, attrs, name)
        return _generic_emit(self.relax_fn, self.tensor_params, inputs, attrs)

    @property
    def tensor_params(self) -> frozenset:
        """Parameters the Relax op declares as tensors (a number there becomes a constant)."""
        op = tvm.ir.Op.get(self.opdef.name)
        return frozenset(a.name for a in op.arguments if a.type_info == "Tensor")


def _generic_emit(fn: Callable, tensor_params: frozenset, inputs: list[relax.Expr], attrs: dict) -> relax.Expr:
    """Call the Relax op: attributes by keyword, tensors fill the remaining parameters in order.

    A number given for a tensor parameter (``x + 2``) becomes a constant of the tensors' dtype.
    """
    params = list(inspect.signature(fn).parameters)
    dtype = str(inputs[0].ty.dtype) if inputs and isinstance(inputs[0].ty, relax.TensorType) else "float32"
    kwargs = {}
    for key, value in attrs.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and key in tensor_params:
            if isinstance(value, float) and not value.is_integer() and not dtype.startswith(("float", "bfloat")):
                raise DtypeError(f"the scalar {value} would be truncated on a {dtype} tensor; "
                                 f"cast the tensor first (sym.astype(x, dtype='float32'))")
            value = relax.const(value, dtype)
        kwargs[key] = value
    free = iter(p for p in params if p not in attrs)
    for expr in inputs:
        kwargs[next(free)] = expr
    return fn(**kwargs)


def _relax_function(opdef: OpDef) -> Callable | None:
    fn: Any = relax.op
    for part in opdef.name.split(".")[1:]:
        fn = getattr(fn, part, None)
        if fn is None:
            return None
    return fn


def _build_table() -> tuple[dict[str, OpInfo], dict[str, str]]:
    """Symbol op name -> entry: each registry op under its short name, each SymbolOp under its
    name (a SymbolOp wins over a generic entry of the same name)."""
    table: dict[str, OpInfo] = {}
    aliases: dict[str, str] = {}
    for opdef in OPS:
        fn = _relax_function(opdef)
        short = opdef.name.split(".")[-1]
        if fn is not None and (opdef.symbol is None or opdef.symbol.name != short) and short not in table:
            table[short] = OpInfo(short, opdef, None, fn)
        for spec in ([opdef.symbol] if opdef.symbol is not None else []) + list(opdef.symbols):
            if spec.name in table and table[spec.name].spec is not None:
                raise ValueError(f"symbol op {spec.name} is defined twice")
            table[spec.name] = OpInfo(spec.name, opdef, spec, fn)
            for alias in spec.aliases:
                aliases[alias] = spec.name
    return table, aliases


class OpTable:
    """Symbol op name -> ``OpInfo`` (and alias -> name), built from the registry when first asked
    for and rebuilt whenever an op has been registered since."""

    def __init__(self) -> None:
        self.version = -1
        self.ops: dict[str, OpInfo] = {}
        self.aliases: dict[str, str] = {}

    def current(self) -> OpTable:
        if self.version != OPS.version:
            self.ops, self.aliases = _build_table()
            self.version = OPS.version
        return self


_TABLE = OpTable()


def op_table() -> OpTable:
    """The op table as the registry now stands."""
    return _TABLE.current()


def op_spec(name: str) -> OpInfo:
    """The table entry of a symbol op name (or alias)."""
    table = op_table()
    info = table.ops.get(table.aliases.get(name, name))
    if info is None:
        raise InputError(f"unknown symbol op {name!r}; known ops: {', '.join(sorted(table.ops))}")
    return info
