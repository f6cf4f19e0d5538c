"""NNVM-style shape and type inference over a Symbol graph, from partial information.

Given the shapes (and dtypes) of some inputs, usually only ``data``, fill in every entry of
the graph: forward, each op's output types come from TVM's own struct-info inference (the
node is built in a scratch ``BlockBuilder``); backward, a layer's ``SymbolOp.param_shapes``
gives its weights' shapes from its data shape and attributes (dense: (num_hidden, in)),
parameters take their data's dtype, the tensor operands of elementwise ops share one shape
and dtype (MXNet's elemwise rule), and a unary elementwise op's input has its output's
shape. Both directions repeat until nothing changes (a fixed point); any two values that
disagree raise a ``ShapeError`` (or ``DtypeError``) naming the node, its op and both values.
Arguments no rule gives a dtype are float32.
"""
from __future__ import annotations

import inspect
import re
from dataclasses import dataclass, field
from typing import Any, Sequence

from tvm import relax

from tvm_ext.errors import CompileError, DtypeError, InputError, ShapeError
from tvm_ext.patterns import OpPattern
from tvm_ext.symbol import Node, NodeEntry, OpInfo, Symbol, format_attr, op_spec

DEFAULT_DTYPE = "float32"
_SHARED_OPERANDS = ("x1", "x2", "x3")  # Relax names of elementwise operands that share shape and dtype
_UNARY_OPERANDS = ("x", "data")  # the operand of a one-input elementwise op (not full's fill_value)

Shape = tuple[int, ...]
Key = tuple[int, int]  # (id(node), output index)
Inferred = tuple[list, list, list]  # per argument, per output, per auxiliary state (None where unknown)


@dataclass
class GraphTypes:
    """Shape and dtype of every entry of a symbol's graph (None where unknown)."""

    symbol: Symbol
    nodes: list[Node]
    shapes: dict[Key, Shape] = field(default_factory=dict)
    dtypes: dict[Key, str] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)  # nodes whose outputs are fully known

    def shape(self, entry: NodeEntry) -> Shape | None:
        return self.shapes.get((id(entry.node), entry.index))

    def dtype(self, entry: NodeEntry) -> str | None:
        return self.dtypes.get((id(entry.node), entry.index))

    def variables(self) -> dict[str, Node]:
        return {n.name: n for n in self.nodes if n.is_variable}

    def of_names(self, names: Sequence[str], table: dict[Key, Any]) -> list[Any]:
        by_name = self.variables()
        return [table.get((id(by_name[n]), 0)) for n in names]

    def of_outputs(self, table: dict[Key, Any]) -> list[Any]:
        return [table.get((id(e.node), e.index)) for e in self.symbol.outputs]


def infer_shape(symbol: Symbol, known: dict[str, Sequence[int]], partial: bool = False) -> Inferred:
    """(arg_shapes, out_shapes, aux_shapes) in ``list_arguments`` / ``list_outputs`` /
    ``list_auxiliary_states`` order; ``partial`` leaves ``None`` where nothing fixes a shape."""
    types = infer(symbol, known, {})
    args, aux = symbol.list_arguments(), symbol.list_auxiliary_states()
    arg_shapes, aux_shapes = types.of_names(args, types.shapes), types.of_names(aux, types.shapes)
    out_shapes = types.of_outputs(types.shapes)
    if not partial:
        missing = [n for n, s in zip(args + aux, arg_shapes + aux_shapes) if s is None]
        if missing:
            raise ShapeError(f"cannot infer the shapes of {missing} from the shapes given for "
                             f"{sorted(known)}: no op fixes them. Fix: pass them too, e.g. "
                             f"infer_shape({missing[0]}=(...)), or give the Variable a shape=")
    return arg_shapes, out_shapes, aux_shapes


def infer_type(symbol: Symbol, known: dict[str, str]) -> Inferred:
    """(arg_types, out_types, aux_types) as dtype strings."""
    types = infer(symbol, {}, known)
    args, aux = symbol.list_arguments(), symbol.list_auxiliary_states()
    return (types.of_names(args, types.dtypes), types.of_outputs(types.dtypes),
            types.of_names(aux, types.dtypes))


def infer(symbol: Symbol, shapes: dict[str, Sequence[int]], dtypes: dict[str, str]) -> GraphTypes:
    """Fill every shape and dtype that the given ones (and the Variables' hints) determine."""
    types = GraphTypes(symbol, symbol.topo_nodes())
    variables = _unique_variables(types.nodes)
    _seed(types, variables, shapes, dtypes)
    _fixed_point(types, variables)
    return types


def _seed(types: GraphTypes, variables: dict[str, Node], shapes: dict[str, Sequence[int]],
          dtypes: dict[str, str]) -> None:
    """The known values: the Variables' hints, then the shapes and dtypes given (which must agree)."""
    for name in {**shapes, **dtypes}:
        if name not in variables:
            raise InputError(f"'{name}' is not an input of this symbol; its inputs are {sorted(variables)}")
    for name, node in variables.items():
        entry = NodeEntry(node, 0)
        if "shape" in node.attrs:
            _set_shape(types, entry, tuple(node.attrs["shape"]), None, f"the shape hint of Variable '{name}'")
        if "dtype" in node.attrs:
            _set_dtype(types, entry, str(node.attrs["dtype"]), None, f"the dtype hint of Variable '{name}'")
        if name in shapes:
            _set_shape(types, entry, _as_shape(name, shapes[name]), None, f"the shape given for '{name}'")
        if name in dtypes:
            _set_dtype(types, entry, str(dtypes[name]), None, f"the dtype given for '{name}'")


def _fixed_point(types: GraphTypes, variables: dict[str, Node]) -> None:
    """Apply the rules until nothing changes."""
    ops = [n for n in types.nodes if not n.is_variable]
    # Sure rules first; then default dtypes; then, one sweep at a time, the elementwise guess
    # (operands of one shape), which an op that broadcasts would contradict.
    defaulted = False
    while True:
        while _sweep(types, ops, guess=False):
            pass
        if not defaulted:
            defaulted = True
            unknown = [NodeEntry(n, 0) for n in variables.values() if types.dtype(NodeEntry(n, 0)) is None]
            for entry in unknown:
                _set_dtype(types, entry, DEFAULT_DTYPE, None, "the default dtype")
            if unknown:
                continue
        if not _sweep(types, ops, guess=True):
            break
    for node in ops:  # outputs no rule typed (their shapes are unknown): the first input's dtype
        first = types.dtype(node.inputs[0]) if node.inputs else None
        for i in range(node.num_outputs):
            if types.dtype(NodeEntry(node, i)) is None and first is not None:
                types.dtypes[(id(node), i)] = first


def _unique_variables(nodes: list[Node]) -> dict[str, Node]:
    seen: dict[str, Node] = {}
    for n in nodes:
        if n.is_variable:
            if n.name in seen:
                raise InputError(f"two different Variables are named '{n.name}'; give them distinct names "
                                 "(inputs are bound by name)")
            seen[n.name] = n
    return seen


def _as_shape(name: str, shape: Any) -> Shape:
    try:
        out = tuple(int(s) for s in shape)
    except (TypeError, ValueError) as err:
        raise InputError(f"the shape given for '{name}' must be a sequence of ints, got {shape!r}") from err
    if any(s < 0 for s in out):
        raise InputError(f"the shape given for '{name}' has a negative dimension: {out}")
    return out


def _sweep(types: GraphTypes, ops: list[Node], guess: bool) -> bool:
    """One pass of backward then forward rules over every op node; True if anything changed."""
    changed = False
    for node in ops:
        changed |= _backward(types, node, guess)
        if id(node) not in types.done:
            changed |= _forward(types, node)
    return changed


# --------------------------------------------------------------------------- backward rules
def _backward(types: GraphTypes, node: Node, guess: bool) -> bool:
    info = op_spec(node.op)
    changed = False
    if info.spec is not None:
        names = info.spec.active_inputs(node.attrs)
        data = node.inputs[0]
        data_shape, data_dtype = types.shape(data), types.dtype(data)
        if info.spec.param_shapes is not None and data_shape is not None:
            try:
                rule = info.spec.param_shapes(data_shape, node.attrs)
            except CompileError as err:
                raise ShapeError(f"node '{node.name}' ({node.op}): {err}") from None
            for pname, entry in zip(names, node.inputs):
                if pname in rule:
                    changed |= _set_shape(types, entry, tuple(int(s) for s in rule[pname]), node,
                                          f"{_attrs_text(node)} and data of shape {data_shape}", pname)
        if data_dtype is not None:
            for pname, entry in zip(names[1:], node.inputs[1:]):
                changed |= _set_dtype(types, entry, data_dtype, node, f"its data's dtype {data_dtype}", pname)
        return changed
    out_shape = types.shape(NodeEntry(node, 0))
    operands = _tensor_params(info, node)
    if (out_shape is not None and len(operands) == 1 and operands[0] in _UNARY_OPERANDS
            and info.opdef.pattern == OpPattern.ELEMWISE and types.shape(node.inputs[0]) is None):
        changed |= _set_shape(types, node.inputs[0], out_shape, node, "its output (elementwise)")
    shared = [e for p, e in zip(operands, node.inputs) if p in _SHARED_OPERANDS]
    known = [types.shape(e) for e in shared if types.shape(e) is not None] or [out_shape] * (out_shape is not None)
    if guess and known and all(s == known[0] for s in known):  # MXNet's elemwise ops: one shape
        for e in shared:
            if types.shape(e) is None:
                changed |= _set_shape(types, e, known[0], node, "its other operand (elementwise)")
    dts = [types.dtype(e) for e in shared if types.dtype(e) is not None]
    if dts:
        for e in shared:
            if types.dtype(e) is None:
                changed |= _set_dtype(types, e, dts[0], node, "its other operand")
    return changed


def _tensor_params(info: OpInfo, node: Node) -> list[str]:
    """The Relax parameter each input of a generic op node fills, in input order."""
    params = list(inspect.signature(info.relax_fn).parameters) if info.relax_fn is not None else []
    return [p for p in params if p not in node.attrs][:len(node.inputs)]


# --------------------------------------------------------------------------- forward rules
def _forward(types: GraphTypes, node: Node) -> bool:
    """Build the node in a scratch BlockBuilder and read the struct info TVM infers."""
    in_dtypes = [types.dtype(e) for e in node.inputs]
    if any(d is None for d in in_dtypes):
        return False
    in_shapes = [types.shape(e) for e in node.inputs]
    complete = all(s is not None for s in in_shapes)
    params = [relax.Var(e.name, relax.TensorType(s, d) if s is not None else relax.TensorType(None, d, ndim=-1))
              for e, s, d in zip(node.inputs, in_shapes, in_dtypes)]
    bb = relax.BlockBuilder()
    bb._begin_dataflow_block()
    try:
        out = bb.emit(op_spec(node.op).emit(bb, params, node.attrs, node.name), node.name)
    except (TypeError, ValueError, RuntimeError, CompileError) as err:
        if not complete:
            return False  # some rule needs the shapes: wait for them
        raise _forward_error(node, in_shapes, in_dtypes, err) from None
    finally:
        bb._end_block()
    fields = out.ty.fields if isinstance(out.ty, relax.TupleType) else [out.ty]
    changed = False
    for i, ty in enumerate(fields[:node.num_outputs]):
        entry = NodeEntry(node, i)
        shape = _static_shape(ty)
        if shape is not None:
            changed |= _set_shape(types, entry, shape, node, "its inputs (forward)")
        if isinstance(ty, relax.TensorType) and str(ty.dtype) != "void":
            changed |= _set_dtype(types, entry, str(ty.dtype), node, "its inputs (forward)")
    if complete:
        types.done.add(id(node))
    return changed


def _static_shape(ty) -> Shape | None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    try:
        return tuple(int(v) for v in ty.shape.values)
    except TypeError:
        return None


def _forward_error(node: Node, shapes: list, dtypes: list, err: Exception) -> CompileError:
    inputs = ", ".join(f"'{e.name}' {tuple(s)} {d}" for e, s, d in zip(node.inputs, shapes, dtypes))
    reason = _tvm_reason(err)
    if isinstance(err, TypeError) or "datatype" in reason or "dtype" in reason.replace("dtype=", ""):
        return DtypeError(f"node '{node.name}' ({node.op}): its inputs have dtypes that do not fit "
                          f"({inputs}): {reason}. Fix: give the inputs matching dtypes, or cast one with "
                          "sym.astype(x, dtype=...)")
    return ShapeError(f"node '{node.name}' ({node.op}): its inputs have shapes that do not fit "
                      f"({inputs}): {reason}. Fix: check the shapes given for these inputs and the "
                      f"node's attributes {_attrs_text(node)}")


def _tvm_reason(err: Exception) -> str:
    """The sentence of a TVM error that says what is wrong (no traceback, no op dump)."""
    lines = [ln.strip() for ln in str(err).strip().splitlines() if ln.strip()]
    text = lines[-1] if lines else type(err).__name__
    text = re.sub(r"^.*?support_level=\d+\),\s*", "", text)
    return text.rstrip(".")


# --------------------------------------------------------------------------- setting values
def _set_shape(types: GraphTypes, entry: NodeEntry, shape: Shape, node: Node | None, source: str,
               role: str | None = None) -> bool:
    """Record ``entry``'s shape; True if it was unknown; a different known shape is a ShapeError."""
    return _set(types.shapes, entry, shape, node, source, role, "shape")


def _set_dtype(types: GraphTypes, entry: NodeEntry, dtype: str, node: Node | None, source: str,
               role: str | None = None) -> bool:
    """Record ``entry``'s dtype; True if it was unknown; a different known dtype is a DtypeError."""
    return _set(types.dtypes, entry, dtype, node, source, role, "dtype")


def _set(table: dict[Key, Any], entry: NodeEntry, value: Any, node: Node | None, source: str, role: str | None,
         kind: str) -> bool:
    key = (id(entry.node), entry.index)
    old = table.get(key)
    if old is None:
        table[key] = value
        return True
    if old == value:
        return False
    error = ShapeError if kind == "shape" else DtypeError
    what = _describe(entry, node, role)
    if node is None:
        raise error(f"{what} has {kind} {old}, but {source} is {value}. Fix: give one {kind}")
    if kind == "shape":
        result = (f"make it {value}. Fix: give '{entry.name}' the shape {value}, or change the attributes "
                  f"of '{node.name}' or the shapes that lead to it")
    else:
        result = f"makes it {value}. Fix: give '{entry.name}' dtype {value}, or cast with sym.astype(x, dtype=...)"
    raise error(f"node '{node.name}' ({node.op}): {what} has {kind} {old}, but {source} {result}")


def _describe(entry: NodeEntry, node: Node | None, role: str | None) -> str:
    kind = "output" if entry.node is node else "input"
    return f"{kind} '{entry.name}'" + (f" ({role})" if role else "")


def _attrs_text(node: Node) -> str:
    return "(" + ", ".join(f"{k}={format_attr(v)}" for k, v in node.attrs.items()) + ")"
