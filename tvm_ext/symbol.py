"""The Symbol API: NNVM/MXNet-style graph construction that becomes a Relax IRModule.

    import tvm_ext.symbol as sym
    data = sym.Variable("data")
    fc1 = sym.FullyConnected(data, num_hidden=128, name="fc1")     # makes fc1_weight, fc1_bias
    net = sym.softmax(sym.relu(fc1) * 2.0, name="out")
    net.list_arguments()                    # ['data', 'fc1_weight', 'fc1_bias']
    arg_shapes, out_shapes, aux_shapes = net.infer_shape(data=(8, 784))
    mod = net.to_relax(shapes={"data": (8, 784)})                  # main(data, fc1_weight, fc1_bias)
    compiled = tvm_ext.compile(net, shape_dict={"data": (8, 784)})

A ``Symbol`` holds only its output ``NodeEntry``s; a ``Node`` holds its op, attributes and
input entries, so the graph is reached from the outputs (the seed's "Graph Abstraction").
Op functions are generated from the op registry: each registered Relax op gives one
(``relax.nn.softmax`` -> ``sym.softmax``), and an ``OpDef.symbol`` (``tvm_ext.registry.SymbolOp``)
adds layers that own parameters (``dense``/``FullyConnected``, ``conv2d``, ``batch_norm``).
"""
from __future__ import annotations

import ast
import inspect
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np
import tvm
from tvm import relax

from tvm_ext.errors import DtypeError, InputError
from tvm_ext.registry import OPS, OpDef, SymbolOp

JSON_VERSION = 1


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


# --------------------------------------------------------------------------- attribute scopes
_SCOPE = threading.local()


class AttrScope:
    """Attributes given to every node (variables included) created inside a ``with`` block.

        with AttrScope(ctx_group="dev1"):
            net = a * b          # net.attr("ctx_group") == "dev1"
    Scopes nest; an inner value overrides an outer one; explicit ``attr=`` overrides both.
    """

    def __init__(self, **attrs: str) -> None:
        for key, value in attrs.items():
            if not isinstance(value, str):
                raise InputError(f"AttrScope attribute {key}={value!r} must be a string (as in MXNet)")
        self.attrs = attrs
        self._saved: dict[str, str] | None = None

    @staticmethod
    def current() -> dict[str, str]:
        return dict(getattr(_SCOPE, "attrs", {}))

    def __enter__(self) -> AttrScope:
        self._saved = AttrScope.current()
        _SCOPE.attrs = {**self._saved, **self.attrs}
        return self

    def __exit__(self, *_exc: object) -> None:
        _SCOPE.attrs = self._saved or {}


def _new_user_attrs(attr: dict[str, str] | None) -> dict[str, str]:
    merged = {**AttrScope.current(), **(attr or {})}
    for key, value in merged.items():
        if not isinstance(value, str):
            raise InputError(f"attribute {key}={value!r} must be a string; free attributes are strings "
                             f"(use str({value!r}))")
    return merged


class _NameManager:
    """Automatic node names: the op name and a counter per op (``dense0``, ``dense1``)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()

    def get(self, name: str | None, hint: str) -> str:
        if name is not None:
            return name
        with self.lock:
            n = self.counts.get(hint, 0)
            self.counts[hint] = n + 1
        return f"{hint}{n}"


NAMES = _NameManager()


# --------------------------------------------------------------------------- Symbol
class Symbol:
    """Outputs of a graph: a list of ``NodeEntry``; everything else is reached through them."""

    __hash__ = object.__hash__  # comparisons build graph nodes, so hashing stays by identity

    def __init__(self, outputs: Sequence[NodeEntry]) -> None:
        self.outputs = list(outputs)

    # ---- structure
    @property
    def name(self) -> str | None:
        """The node name of a single-output symbol (None for a group)."""
        return self.outputs[0].node.name if len(self.outputs) == 1 else None

    def __len__(self) -> int:
        return len(self.outputs)

    def __iter__(self) -> Iterator[Symbol]:
        return (Symbol([e]) for e in self.outputs)

    def __getitem__(self, key: int | str) -> Symbol:
        """One output, by position or by its ``list_outputs()`` name."""
        if isinstance(key, str):
            names = self.list_outputs()
            if key not in names:
                raise InputError(f"symbol has no output named {key!r}; its outputs are {names}")
            key = names.index(key)
        if not -len(self.outputs) <= key < len(self.outputs):
            raise IndexError(f"output {key} of a symbol with {len(self.outputs)} outputs")
        return Symbol([self.outputs[key]])

    def topo_nodes(self) -> list[Node]:
        """Every node reachable from the outputs, inputs before users (DFS post-order)."""
        order: list[Node] = []
        seen: set[int] = set()
        for entry in self.outputs:
            stack = [(entry.node, False)]
            while stack:
                node, expanded = stack.pop()
                if id(node) in seen:
                    continue
                if expanded:
                    seen.add(id(node))
                    order.append(node)
                    continue
                stack.append((node, True))
                for inp in reversed(node.inputs):
                    if id(inp.node) not in seen:
                        stack.append((inp.node, False))
        return order

    def _aux_ids(self, nodes: list[Node]) -> set[int]:
        aux = set()
        for node in nodes:
            if node.is_variable:
                continue
            spec = op_spec(node.op).spec
            if spec is not None and spec.aux:
                for name, inp in zip(spec.active_inputs(node.attrs), node.inputs):
                    if name in spec.aux and inp.node.is_variable:
                        aux.add(id(inp.node))
        return aux

    def list_arguments(self) -> list[str]:
        """Variables the graph reads that are not auxiliary states, in graph order."""
        nodes = self.topo_nodes()
        aux = self._aux_ids(nodes)
        return [n.name for n in nodes if n.is_variable and id(n) not in aux]

    def list_auxiliary_states(self) -> list[str]:
        """Variables that ops keep as state rather than learn (batch-norm moving mean/var)."""
        nodes = self.topo_nodes()
        aux = self._aux_ids(nodes)
        return [n.name for n in nodes if n.is_variable and id(n) in aux]

    def list_inputs(self) -> list[str]:
        """Arguments then auxiliary states: the parameters of ``to_relax``'s ``main``."""
        return self.list_arguments() + self.list_auxiliary_states()

    def list_outputs(self) -> list[str]:
        """Names of the outputs: ``<node>_output`` (``<node>_output<i>`` of a multi-output node), a variable's name."""
        return [e.name for e in self.outputs]

    def get_internals(self) -> Symbol:
        """Every output of every node, as one group (to take an intermediate as an output)."""
        return Symbol([NodeEntry(n, i) for n in self.topo_nodes() for i in range(n.num_outputs)])

    # ---- attributes
    def _single(self, what: str) -> Node:
        if len(self.outputs) != 1:
            raise InputError(f"{what} needs a single-output symbol; this one has outputs {self.list_outputs()}")
        return self.outputs[0].node

    def attr(self, key: str) -> str | None:
        """A free attribute (``ctx_group``, ``lr_mult``) or op attribute of this node, as a string."""
        node = self._single("attr()")
        if key in node.user_attrs:
            return node.user_attrs[key]
        return format_attr(node.attrs[key]) if key in node.attrs else None

    def list_attr(self) -> dict[str, str]:
        """All attributes of this node, as strings."""
        return _string_attrs(self._single("list_attr()"))

    def attr_dict(self) -> dict[str, dict[str, str]]:
        """Node name -> its attributes, for every node that has any."""
        out = {}
        for node in self.topo_nodes():
            attrs = _string_attrs(node)
            if attrs:
                out[node.name] = attrs
        return out

    # ---- serialization
    def tojson(self) -> str:
        """NNVM's graph JSON: nodes in graph order, ``arg_nodes``, ``node_row_ptr``, ``heads``."""
        nodes = self.topo_nodes()
        index = {id(n): i for i, n in enumerate(nodes)}
        jnodes = []
        for n in nodes:
            item: dict[str, Any] = {"op": n.op or "null", "name": n.name}
            attrs = {k: format_attr(v) for k, v in n.attrs.items()}
            attrs.update({f"__{k}__": v for k, v in n.user_attrs.items()})
            if attrs:
                item["attrs"] = attrs
            item["inputs"] = [[index[id(e.node)], e.index, 0] for e in n.inputs]
            jnodes.append(item)
        row_ptr = [0]
        for n in nodes:
            row_ptr.append(row_ptr[-1] + n.num_outputs)
        rest = {"arg_nodes": [i for i, n in enumerate(nodes) if n.is_variable], "node_row_ptr": row_ptr,
                "heads": [[index[id(e.node)], e.index, 0] for e in self.outputs],
                "attrs": {"tvm_ext_symbol": ["int", JSON_VERSION]}}
        lines = ",\n".join(f"    {json.dumps(n)}" for n in jnodes)  # one node a line
        tail = ",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in rest.items())
        return f'{{\n  "nodes": [\n{lines}\n  ],\n{tail}\n}}'

    def save(self, path: str | os.PathLike) -> None:
        """Write ``tojson()`` to ``path``."""
        with open(path, "w") as f:
            f.write(self.tojson())

    # ---- inference and conversion (tvm_ext.shape_inference, tvm_ext.symbol_to_relax)
    def infer_shape(self, *args: Sequence[int], **kwargs: Sequence[int]) -> tuple[list, list, list]:
        """(arg_shapes, out_shapes, aux_shapes) from the shapes of some arguments, as in MXNet.

        Weight shapes come from the op attributes; raises ``ShapeError`` if some stay unknown.
        """
        from tvm_ext.shape_inference import infer_shape
        return infer_shape(self, self._by_name(args, kwargs), partial=False)

    def infer_shape_partial(self, *args: Sequence[int], **kwargs: Sequence[int]) -> tuple[list, list, list]:
        """Like ``infer_shape``, with ``None`` for the shapes that cannot be inferred."""
        from tvm_ext.shape_inference import infer_shape
        return infer_shape(self, self._by_name(args, kwargs), partial=True)

    def infer_type(self, *args: str, **kwargs: str) -> tuple[list, list, list]:
        """(arg_types, out_types, aux_types) as dtype strings; arguments nothing fixes are float32."""
        from tvm_ext.shape_inference import infer_type
        return infer_type(self, self._by_name(args, kwargs))

    def _by_name(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if args:
            names = self.list_arguments()
            if len(args) > len(names):
                raise InputError(f"{len(args)} positional values for {len(names)} arguments {names}")
            kwargs = {**dict(zip(names, args)), **kwargs}
        known = set(self.list_inputs())
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            raise InputError(f"{unknown} are not inputs of this symbol; its inputs are {sorted(known)}")
        return kwargs

    def to_relax(self, shapes: dict[str, Sequence[int]] | None = None, dtypes: dict[str, str] | None = None,
                 func_name: str = "main") -> tvm.IRModule:
        """A Relax IRModule whose ``func_name`` takes ``list_inputs()`` (arguments, then aux states).

        Shapes not given are inferred (``infer_shape``); each op node's bindings are named after
        the node, and ``ctx_group`` attributes become the function attribute ``tvm_ext.ctx_group``.
        """
        from tvm_ext.symbol_to_relax import to_relax
        return to_relax(self, shapes or {}, dtypes or {}, func_name)

    # ---- operators (scalars on either side)
    def __add__(self, other): return _binary("add", self, other)
    def __radd__(self, other): return _binary("add", other, self)
    def __sub__(self, other): return _binary("subtract", self, other)
    def __rsub__(self, other): return _binary("subtract", other, self)
    def __mul__(self, other): return _binary("multiply", self, other)
    def __rmul__(self, other): return _binary("multiply", other, self)
    def __truediv__(self, other): return _binary("divide", self, other)
    def __rtruediv__(self, other): return _binary("divide", other, self)
    def __pow__(self, other): return _binary("power", self, other)
    def __rpow__(self, other): return _binary("power", other, self)
    def __neg__(self): return _call("negative", [self], {})
    def __lt__(self, other): return _binary("less", self, other)
    def __le__(self, other): return _binary("less_equal", self, other)
    def __gt__(self, other): return _binary("greater", self, other)
    def __ge__(self, other): return _binary("greater_equal", self, other)
    def __eq__(self, other): return _binary("equal", self, other)  # type: ignore[override]
    def __ne__(self, other): return _binary("not_equal", self, other)  # type: ignore[override]

    def __bool__(self) -> bool:
        raise TypeError("a Symbol has no truth value (== and < build graph nodes); compare with 'is'")

    def __repr__(self) -> str:
        if len(self.outputs) == 1:
            return f"<Symbol {self.outputs[0].name}>"
        return f"<Symbol group [{', '.join(self.list_outputs())}]>"


def Variable(name: str, shape: Sequence[int] | None = None, dtype: str | None = None,
             attr: dict[str, str] | None = None) -> Symbol:
    """A graph input. ``shape``/``dtype`` are hints inference starts from; ``attr`` free attributes."""
    if not isinstance(name, str) or not name:
        raise InputError(f"a Variable needs a non-empty string name, got {name!r}")
    attrs: dict[str, Any] = {}
    if shape is not None:
        attrs["shape"] = tuple(int(s) for s in shape)
    if dtype is not None:
        attrs["dtype"] = str(dtype)
    return Symbol([NodeEntry(Node(None, name, attrs, [], _new_user_attrs(attr)))])


var = Variable


def Group(symbols: Sequence[Symbol]) -> Symbol:
    """One symbol whose outputs are the outputs of ``symbols``, in order."""
    outputs = []
    for s in symbols:
        if not isinstance(s, Symbol):
            raise InputError(f"Group takes Symbols, got {type(s).__name__}")
        outputs.extend(s.outputs)
    return Symbol(outputs)


def load_json(text: str) -> Symbol:
    """The symbol saved by ``Symbol.tojson``."""
    try:
        graph = json.loads(text)
        jnodes, heads = graph["nodes"], graph["heads"]
    except (ValueError, KeyError, TypeError) as err:
        raise InputError(f"not a symbol JSON (needs 'nodes' and 'heads'): {err}") from err
    nodes: list[Node] = []
    for i, item in enumerate(jnodes):
        if "op" not in item or "name" not in item:
            raise InputError(f"node {i} of the symbol JSON needs 'op' and 'name', got {sorted(item)}")
        attrs, user = {}, {}
        for key, value in item.get("attrs", {}).items():
            if len(key) > 4 and key.startswith("__") and key.endswith("__"):
                user[key[2:-2]] = value
            else:
                attrs[key] = parse_attr(value)
        inputs = [_json_entry(nodes, src, idx, f"node {i} ('{item['name']}')")
                  for src, idx, *_ in item.get("inputs", [])]
        op = None if item["op"] == "null" else item["op"]
        num_outputs = 1 if op is None else op_spec(op).num_outputs(attrs)
        nodes.append(Node(op, item["name"], attrs, inputs, user, num_outputs))
    return Symbol([_json_entry(nodes, src, idx, f"head {i}") for i, (src, idx, *_) in enumerate(heads)])


def _json_entry(nodes: list[Node], src: int, idx: int, where: str) -> NodeEntry:
    """Output ``idx`` of node ``src`` among the nodes loaded so far (a JSON reference, checked)."""
    if not 0 <= src < len(nodes):
        raise InputError(f"{where} reads node {src}, output {idx}, but only the {len(nodes)} nodes before it "
                         "can be read: not a graph saved by Symbol.tojson")
    if not 0 <= idx < nodes[src].num_outputs:
        raise InputError(f"{where} reads node {src}, output {idx}, but '{nodes[src].name}' has "
                         f"{nodes[src].num_outputs} output(s)")
    return NodeEntry(nodes[src], idx)


def load(path: str | os.PathLike) -> Symbol:
    """The symbol ``Symbol.save`` wrote to ``path``."""
    with open(path) as f:
        return load_json(f.read())


def _string_attrs(node: Node) -> dict[str, str]:
    """A node's op attributes then free attributes, all as strings."""
    return {**{k: format_attr(v) for k, v in node.attrs.items()}, **node.user_attrs}


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


def _attr_value(value: Any) -> Any:
    """An attribute as plain Python (numpy scalars as int/float, lists as tuples): what JSON gives back."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return tuple(_attr_value(v) for v in value)
    return value


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
        if opdef.symbol is not None:
            spec = opdef.symbol
            if spec.name in table and table[spec.name].spec is not None:
                raise ValueError(f"symbol op {spec.name} is defined twice")
            table[spec.name] = OpInfo(spec.name, opdef, spec, fn)
            for alias in spec.aliases:
                aliases[alias] = spec.name
    return table, aliases


SYMBOL_OPS, ALIASES = _build_table()


def op_spec(name: str) -> OpInfo:
    """The table entry of a symbol op name (or alias)."""
    info = SYMBOL_OPS.get(ALIASES.get(name, name))
    if info is None:
        raise InputError(f"unknown symbol op {name!r}; known ops: {', '.join(sorted(SYMBOL_OPS))}")
    return info


def _call(op: str, args: Sequence[Any], kwargs: dict, name: str | None = None,
          attr: dict[str, str] | None = None) -> Symbol:
    info = op_spec(op)
    if info.spec is not None and info.spec.variadic:
        inputs, attrs = list(args), _bind_attrs(info.spec, {**info.spec.attrs}, kwargs)
        if not inputs or any(isinstance(a, (list, tuple)) for a in inputs):
            raise InputError(f"{info.name} takes its tensors one by one: {info.name}(a, b, ..., axis=...)")
    elif info.spec is not None:
        inputs, attrs = _bind_spec(info, args, kwargs)
    else:
        inputs, attrs = _bind_generic(info, args, kwargs)
    node_name = NAMES.get(name, info.name)
    user = _new_user_attrs(attr)
    entries = []
    if info.spec is not None and not info.spec.variadic:  # missing parameters: variables named after the node
        for pname, given in zip(info.spec.active_inputs(attrs), inputs):
            if given is None:
                given = Symbol([NodeEntry(Node(None, f"{node_name}_{pname}", {}, [], dict(user)))])
            entries.append(_entry_of(given, f"input '{pname}' of {info.name} '{node_name}'"))
    else:
        entries = [_entry_of(s, f"input {i} of {info.name} '{node_name}'") for i, s in enumerate(inputs)]
    node = Node(info.name, node_name, attrs, entries, user, info.num_outputs(attrs))
    return Symbol([NodeEntry(node, i) for i in range(node.num_outputs)])


def _entry_of(s: Symbol, where: str) -> NodeEntry:
    if not isinstance(s, Symbol):
        raise InputError(f"{where} must be a Symbol, got {type(s).__name__}")
    if len(s.outputs) != 1:
        raise InputError(f"{where} is a symbol with {len(s.outputs)} outputs {s.list_outputs()}; "
                         "pick one with s[i]")
    return s.outputs[0]


def _bind_spec(info: OpInfo, args: Sequence[Any], kwargs: dict) -> tuple[list, dict]:
    spec = info.spec
    assert spec is not None
    if len(args) > len(spec.inputs):
        raise InputError(f"{info.name} takes at most {len(spec.inputs)} inputs {list(spec.inputs)} "
                         f"positionally, got {len(args)}")
    given = dict(zip(spec.inputs, args))
    given.update({k: v for k, v in kwargs.items() if k in spec.inputs})
    attrs = _bind_attrs(spec, dict(spec.attrs), {k: v for k, v in kwargs.items() if k not in spec.inputs})
    if given.get(spec.inputs[0]) is None:
        raise InputError(f"{info.name} needs its input '{spec.inputs[0]}'")
    active = spec.active_inputs(attrs)
    dropped = [k for k, v in given.items() if k not in active and v is not None]
    if dropped:
        raise InputError(f"{info.name}: inputs {dropped} given but the attributes drop them "
                         f"({ {k: spec.optional[k] for k in dropped} })")
    return [given.get(k) for k in active], attrs


def _bind_attrs(spec: SymbolOp, attrs: dict, kwargs: dict) -> dict:
    for key, value in kwargs.items():
        if key not in spec.attrs and key not in spec.required:
            raise InputError(f"{spec.name} has no attribute {key!r}; its attributes are "
                             f"{sorted([*spec.required, *spec.attrs])}"
                             + ("" if spec.variadic else f", its inputs {list(spec.inputs)}"))
        attrs[key] = _attr_value(value)
    missing = [k for k in spec.required if k not in attrs]
    if missing:
        raise InputError(f"{spec.name} needs the attribute(s) {missing}")
    return attrs


def _bind_generic(info: OpInfo, args: Sequence[Any], kwargs: dict) -> tuple[list, dict]:
    try:
        bound = inspect.signature(info.relax_fn).bind(*args, **kwargs)
    except TypeError as err:
        raise InputError(f"{info.name}{inspect.signature(info.relax_fn)}: {err}") from err
    inputs, attrs = [], {}
    for key, value in bound.arguments.items():
        if isinstance(value, Symbol):
            inputs.append(value)
        elif isinstance(value, (list, tuple)) and any(isinstance(v, Symbol) for v in value):
            raise InputError(f"{info.name}: pass the Symbols of '{key}' one by one, not as a list")
        else:
            attrs[key] = _attr_value(value)
    if not inputs:
        raise InputError(f"{info.name} needs at least one Symbol input")
    _check_order(info, bound.arguments)
    return inputs, attrs


def _check_order(info: OpInfo, arguments: dict) -> None:
    """Tensors fill the parameters not given as attributes, in order: a Symbol may not come
    after a parameter left to its default (the JSON could not say which it was)."""
    params = list(inspect.signature(info.relax_fn).parameters)
    free = [p for p in params if p not in arguments or isinstance(arguments[p], Symbol)]
    symbols = [p for p in params if isinstance(arguments.get(p), Symbol)]
    if free[:len(symbols)] != symbols:
        raise InputError(f"{info.name}: give the parameters before {symbols[-1]!r} explicitly")


def _binary(op: str, lhs: Any, rhs: Any) -> Symbol:
    for side in (lhs, rhs):
        if not isinstance(side, (Symbol, int, float, np.integer, np.floating)) or isinstance(side, bool):
            raise InputError(f"cannot apply {op} to a {type(side).__name__}; use a Symbol or a number")
    return _call(op, [lhs, rhs], {})


def _op_function(info: OpInfo, public_name: str) -> Callable[..., Symbol]:
    def fn(*args: Any, name: str | None = None, attr: dict[str, str] | None = None, **kwargs: Any) -> Symbol:
        return _call(info.name, args, kwargs, name, attr)

    fn.__name__ = fn.__qualname__ = public_name
    if info.spec is not None:
        attrs = ", ".join([*info.spec.required, *(f"{k}={v!r}" for k, v in info.spec.attrs.items())])
        inputs = "*data" if info.spec.variadic else ", ".join(info.spec.inputs)
        fn.__doc__ = f"{info.spec.doc or info.name}\n\n{public_name}({inputs}, {attrs}, name=None, attr=None)"
    else:
        fn.__doc__ = f"Symbol form of {info.opdef.name}{inspect.signature(info.relax_fn)}. " \
                     f"{info.opdef.doc}".strip()
    return fn


_FUNCTIONS: dict[str, Callable[..., Symbol]] = {
    **{name: _op_function(info, name) for name, info in SYMBOL_OPS.items()},
    **{alias: _op_function(SYMBOL_OPS[target], alias) for alias, target in ALIASES.items()},
}


def __getattr__(name: str) -> Callable[..., Symbol]:
    """Op functions (``sym.exp``, ``sym.dense``, ``sym.FullyConnected`` ...), from the op table."""
    if name in _FUNCTIONS:
        return _FUNCTIONS[name]
    raise AttributeError(f"module 'tvm_ext.symbol' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_FUNCTIONS])


def list_ops() -> list[str]:
    """Names of the op functions of this module (aliases included)."""
    return sorted(_FUNCTIONS)
