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

Shapes follow MXNet's convention: a 0 in a shape is an unknown dim, which inference fills
((128, 0) -> (128, 784)); a shape nothing fixes is unknown (``()`` in ``infer_shape_partial``).
Forward, unknown dims enter TVM's inference as symbolic dims, so an output dim that is one of
them flows back into the input it came from once the output is known (NNVM's backward pass).
"""
from __future__ import annotations

import inspect
import re
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from tvm import relax, tirx

from tvm_ext.errors import CompileError, DtypeError, InputError, ShapeError
from tvm_ext.patterns import OpPattern
from tvm_ext.symbol_graph import Node, NodeEntry, OpInfo, dtype_name, format_attr, op_spec

if TYPE_CHECKING:  # the class whose methods call inference; inference only walks its graph
    from tvm_ext.symbol import Symbol

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
    partial: dict[Key, Shape] = field(default_factory=dict)  # known shapes, 0 where a dim is unknown
    dtypes: dict[Key, str] = field(default_factory=dict)
    done: set[int] = field(default_factory=set)  # nodes whose outputs are fully known

    @property
    def shapes(self) -> dict[Key, Shape]:
        """The complete shapes (no unknown dim): what a Relax function can be typed with."""
        return {k: s for k, s in self.partial.items() if all(s)}

    def shape(self, entry: NodeEntry) -> Shape | None:
        """The entry's shape as far as known (0 for unknown dims), None if not even its rank is."""
        return self.partial.get((id(entry.node), entry.index))

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
    ``list_auxiliary_states`` order, as MXNet's: ``partial`` gives what is known (``()`` where
    nothing fixes a shape, 0 for an unknown dim); otherwise an incomplete result is
    ``(None, None, None)``, with a warning that names the shapes to give."""
    types = infer(symbol, known, {})
    args, aux = symbol.list_arguments(), symbol.list_auxiliary_states()
    arg_shapes, aux_shapes = types.of_names(args, types.partial), types.of_names(aux, types.partial)
    out_shapes = types.of_outputs(types.partial)
    if partial:
        return ([s if s is not None else () for s in arg_shapes], [s if s is not None else () for s in out_shapes],
                [s if s is not None else () for s in aux_shapes])
    missing = [n for n, s in zip(args + aux, arg_shapes + aux_shapes) if s is None or not all(s)]
    if missing or any(s is None or not all(s) for s in out_shapes):
        warnings.warn(f"cannot infer the shapes of {missing or symbol.list_outputs()} from the shapes given "
                      f"for {sorted(known)}: no op fixes them, so infer_shape returns (None, None, None). Fix: "
                      f"pass them too, e.g. infer_shape({(missing or ['name'])[0]}=(...)), or give the Variable "
                      "a shape=", stacklevel=3)
        return None, None, None  # type: ignore[return-value]
    return arg_shapes, out_shapes, aux_shapes


def infer_type(symbol: Symbol, known: dict[str, Any]) -> Inferred:
    """(arg_types, out_types, aux_types) as numpy dtypes (equal to np.float32 and to "float32";
    a dtype numpy lacks, such as bfloat16, as its name); the given ones may be numpy types too."""
    types = infer(symbol, {}, known)
    args, aux = symbol.list_arguments(), symbol.list_auxiliary_states()
    return tuple([_np_dtype(d) for d in ds] for ds in (  # type: ignore[return-value]
        types.of_names(args, types.dtypes), types.of_outputs(types.dtypes), types.of_names(aux, types.dtypes)))


def _np_dtype(name: str | None) -> Any:
    """``name`` as a numpy dtype (MXNet's infer_type gives numpy types), else the name itself."""
    if name is None:
        return None
    try:
        return np.dtype(name)
    except TypeError:
        return name


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
    for name, node in variables.items():  # a value given overrides the Variable's hint, as in MXNet
        entry = NodeEntry(node, 0)
        if name in shapes:
            _set_shape(types, entry, _as_shape(name, shapes[name]), None, f"the shape given for '{name}'")
        elif "shape" in node.attrs:
            _set_shape(types, entry, tuple(node.attrs["shape"]), None, f"the shape hint of Variable '{name}'")
        if name in dtypes:
            _set_dtype(types, entry, dtype_name(dtypes[name]), None, f"the dtype given for '{name}'")
        elif "dtype" in node.attrs:
            _set_dtype(types, entry, str(node.attrs["dtype"]), None, f"the dtype hint of Variable '{name}'")


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
        param_dtype = str(node.attrs["dtype"]) if "dtype" in info.spec.attrs else data_dtype  # embedding's own
        if param_dtype is not None:
            for pname, entry in zip(names[1:], node.inputs[1:]):
                changed |= _set_dtype(types, entry, param_dtype, node, f"its data's dtype {param_dtype}", pname)
        if info.spec.input_shapes is not None:
            in_shapes = [types.shape(e) for e in node.inputs]
            new = info.spec.input_shapes(in_shapes, types.shape(NodeEntry(node, 0)), node.attrs)
            for entry, shape in zip(node.inputs, new):
                if shape is not None:
                    changed |= _set_shape(types, entry, tuple(shape), node, f"its rule {_attrs_text(node)}")
        return changed
    out_shape = types.shape(NodeEntry(node, 0))
    operands = _tensor_params(info, node)
    if (out_shape is not None and len(operands) == 1 and operands[0] in _UNARY_OPERANDS
            and info.opdef.pattern == OpPattern.ELEMWISE):
        changed |= _set_shape(types, node.inputs[0], out_shape, node, "its output (elementwise)")
    pattern = info.opdef.pattern
    if not (callable(pattern) or pattern in (OpPattern.ELEMWISE, OpPattern.BROADCAST)):
        return changed  # matmul's x1 and x2 are no elementwise operands
    shared = [e for p, e in zip(operands, node.inputs) if p in _SHARED_OPERANDS]
    known = [types.shape(e) for e in shared if types.shape(e) is not None] or [out_shape] * (out_shape is not None)
    merged = _merge_all(known)
    if guess and merged is not None:  # MXNet's elemwise ops: one shape (unknown dims filled from the others)
        for e in shared:
            changed |= _set_shape(types, e, merged, node, "its other operand (elementwise)")
    dts = [types.dtype(e) for e in shared if types.dtype(e) is not None]
    if dts:
        for e in shared:
            if types.dtype(e) is None:
                changed |= _set_dtype(types, e, dts[0], node, "its other operand")
    return changed


def _merge(a: Shape, b: Shape) -> Shape | None:
    """One shape that both partial shapes describe (0 = unknown dim), or None if they disagree."""
    if len(a) != len(b) or any(x and y and x != y for x, y in zip(a, b)):
        return None
    return tuple(x or y for x, y in zip(a, b))


def _merge_all(shapes: list[Shape]) -> Shape | None:
    """The merge of every shape given, or None if there are none or two disagree."""
    if not shapes:
        return None
    out: Shape | None = shapes[0]
    for other in shapes[1:]:
        out = _merge(out, other) if out is not None else None
    return out


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
    complete = all(s is not None and all(s) for s in in_shapes)
    dims: dict[tuple[int, int, int], tirx.Var] = {}  # an unknown dim of an entry: one symbolic var
    sources: dict[str, list[tuple[int, int]]] = {}  # var name -> the (input, dim) positions it stands for
    params = []
    for j, (e, s, d) in enumerate(zip(node.inputs, in_shapes, in_dtypes)):
        if s is None:
            params.append(relax.Var(e.name, relax.TensorType(None, d, ndim=-1)))
            continue
        values = []
        for k, v in enumerate(s):
            if v:
                values.append(v)
                continue
            var = dims.setdefault((id(e.node), e.index, k), tirx.Var(f"unknown_dim{len(dims)}", "int64"))
            sources.setdefault(var.name, []).append((j, k))
            values.append(var)
        params.append(relax.Var(e.name, relax.TensorType(values, d)))
    bb = relax.BlockBuilder()
    bb._begin_dataflow_block()
    try:
        out = bb.emit(op_spec(node.op).emit(bb, params, node.attrs, node.name), node.name)
    except (TypeError, ValueError, RuntimeError, CompileError) as err:
        error = _forward_error(node, in_shapes, in_dtypes, err)
        if not complete and not (isinstance(error, DtypeError) and _names_a_dtype(err)):
            return False  # some rule needs the shapes: wait for them (TVM's dtype conflicts show already)
        raise error from None
    finally:
        bb._end_block()
    fields = out.ty.fields if isinstance(out.ty, relax.TupleType) else [out.ty]
    changed = False
    learned: dict[int, list[int]] = {}  # input -> its dims as the outputs fix them
    for i, ty in enumerate(fields[:node.num_outputs]):
        entry = NodeEntry(node, i)
        shape = _symbolic_shape(ty)
        if shape is not None:
            changed |= _set_shape(types, entry, tuple(v if isinstance(v, int) else 0 for v in shape), node,
                                  "its inputs (forward)")
            known = types.shape(entry)
            for v, dim in zip(shape, known):  # an output dim that is an input's unknown dim, now known
                for j, k in sources.get(v.name, []) if isinstance(v, tirx.Var) and dim else []:
                    learned.setdefault(j, list(in_shapes[j]))[k] = dim
        if isinstance(ty, relax.TensorType) and str(ty.dtype) != "void":
            changed |= _set_dtype(types, entry, str(ty.dtype), node, "its inputs (forward)")
    for j, shape in learned.items():
        changed |= _set_shape(types, node.inputs[j], tuple(shape), node, "its output (backward)")
    if complete:
        types.done.add(id(node))
    return changed


def _symbolic_shape(ty) -> list | None:
    """A tensor type's dims: ints where static, TVM's expressions (a symbolic var ...) elsewhere."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    return [int(v) if isinstance(v, tirx.IntImm) else v for v in ty.shape.values]


def _forward_error(node: Node, shapes: list, dtypes: list, err: Exception) -> CompileError:
    inputs = ", ".join(f"'{e.name}' {tuple(s) if s is not None else 'unknown shape'} {d}"
                       for e, s, d in zip(node.inputs, shapes, dtypes))
    reason = _tvm_reason(err)
    if isinstance(err, TypeError) or "datatype" in reason or "dtype" in reason.replace("dtype=", ""):
        return DtypeError(f"node '{node.name}' ({node.op}): its inputs have dtypes that do not fit "
                          f"({inputs}): {reason}. Fix: give the inputs matching dtypes, or cast one with "
                          "sym.astype(x, dtype=...)")
    return ShapeError(f"node '{node.name}' ({node.op}): its inputs have shapes that do not fit "
                      f"({inputs}): {reason}. Fix: check the shapes given for these inputs and the "
                      f"node's attributes {_attrs_text(node)}")


def _names_a_dtype(err: Exception) -> bool:
    """Whether TVM's reason is about dtypes (not an emit rule that needed a static shape)."""
    reason = _tvm_reason(err).replace("dtype=", "")
    return "datatype" in reason or "dtype" in reason


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
    return _set(types.partial, entry, shape, node, source, role, "shape")


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
    merged = _merge(old, value) if kind == "shape" else None  # partial shapes that agree: fill the unknown dims
    if merged is not None:
        table[key] = merged
        return merged != old
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
