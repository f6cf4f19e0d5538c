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

It behaves as MXNet's Symbol (tests/test_mxnet_symbol.py runs MXNet's own tests): MXNet's op
names and keywords (``Activation(act_type=)``, ``Pooling``, ``SliceChannel``, ``elemwise_add`` ...,
``MXNET_ALIASES``), automatic names ``<lower-case op><n>`` (``NameManager``, ``Prefix``),
composition (``net2(fc3_data=net1)``), ``get_children``, copies, fluent methods (``s.exp()``),
hidden attribute keys (``lr_mult`` is also ``__lr_mult__``) and partial shapes (0 = unknown dim).
"""
from __future__ import annotations

import inspect
import json
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tvm

from tvm_ext.errors import InputError
from tvm_ext.registry import SymbolOp, pair
from tvm_ext.shape_inference import infer_shape, infer_type
from tvm_ext.symbol_graph import (Node, NodeEntry, OpInfo, dtype_name, format_attr, op_spec, op_table,
                                  parse_attr)
from tvm_ext.symbol_to_relax import to_relax

JSON_VERSION = 1


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


# MXNet's kHiddenKeys: stored as ``key`` here, read as ``key`` or ``__key__``, listed under both
HIDDEN_KEYS = ("ctx_group", "lr_mult", "wd_mult", "force_mirroring", "mirror_stage", "profiler_scope")


def _attr_key(key: str) -> str:
    """The stored form of a free attribute's key: ``__lr_mult__`` is ``lr_mult`` (MXNet's hidden keys)."""
    if len(key) > 4 and key.startswith("__") and key.endswith("__") and key[2:-2] in HIDDEN_KEYS:
        return key[2:-2]
    return key


def _new_user_attrs(attr: dict[str, str] | None) -> dict[str, str]:
    merged = {_attr_key(k): v for k, v in {**AttrScope.current(), **(attr or {})}.items()}
    for key, value in merged.items():
        if not isinstance(value, str):
            raise InputError(f"attribute {key}={value!r} must be a string; free attributes are strings "
                             f"(use str({value!r}))")
    return merged


def _hidden_kwargs(kwargs: dict, attr: dict[str, str] | None) -> dict[str, str] | None:
    """Pop MXNet's hidden keys (``lr_mult=2``) from an op call's keywords into its ``attr``, as strings."""
    hidden = {k: kwargs.pop(k) for k in [k for k in kwargs if _attr_key(k) in HIDDEN_KEYS]}
    if not hidden:
        return attr
    return {**(attr or {}), **{_attr_key(k): v if isinstance(v, str) else str(v) for k, v in hidden.items()}}


class NameManager:
    """Automatic node names, as MXNet's ``mx.name.NameManager``: the lower-case op name and a
    counter per name (``fullyconnected0``, ``fullyconnected1``).

        with sym.NameManager():     # fresh counters inside the block
            net = sym.FullyConnected(data, num_hidden=8)    # fullyconnected0
    """

    _local = threading.local()

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}
        self.lock = threading.Lock()
        self._old: NameManager | None = None

    def get(self, name: str | None, hint: str) -> str:
        """``name`` if given, else ``hint`` with the next counter of that hint."""
        if name is not None:
            return name
        with self.lock:
            n = self.counts.get(hint, 0)
            self.counts[hint] = n + 1
        return f"{hint}{n}"

    @staticmethod
    def current() -> NameManager:
        """The manager of the innermost ``with`` block (a process-wide one outside any)."""
        manager = getattr(NameManager._local, "value", None)
        return manager if manager is not None else _DEFAULT_NAMES

    def __enter__(self) -> NameManager:
        self._old = getattr(NameManager._local, "value", None)
        NameManager._local.value = self
        return self

    def __exit__(self, *_exc: object) -> None:
        NameManager._local.value = self._old


class Prefix(NameManager):
    """A NameManager that puts ``prefix`` before every op node name, given or automatic (MXNet's)."""

    def __init__(self, prefix: str) -> None:
        super().__init__()
        self.prefix = prefix

    def get(self, name: str | None, hint: str) -> str:
        return self.prefix + super().get(name, hint)


_DEFAULT_NAMES = NameManager()


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
                for dep in reversed([e.node for e in node.inputs] + node.control_deps):
                    if id(dep) not in seen:
                        stack.append((dep, False))
        return order

    def _add_control_deps(self, deps: Symbol | Sequence[Symbol]) -> Symbol:
        """Make this symbol's node run after every output node of ``deps`` (NNVM's control
        dependencies, ``NNSymbolAddControlDeps``); AutoFuse never fuses across them (seed rule 5)."""
        node = self._single("add control dependencies to")
        if node.is_variable:
            raise InputError(f"'{node.name}' is a variable; only op nodes take control dependencies")
        for dep in ([deps] if isinstance(deps, Symbol) else list(deps)):
            for entry in dep.outputs:
                if entry.node is node or node in _ancestors(entry.node):
                    raise InputError(f"a control dependency of '{node.name}' on '{entry.node.name}' would make "
                                     "a cycle: that node already depends on it")
                if all(d is not entry.node for d in node.control_deps):
                    node.control_deps.append(entry.node)
        return self

    add_control_deps = _add_control_deps

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
        """A free attribute (``ctx_group``, ``lr_mult``: also as ``__lr_mult__``) or op attribute of
        this node, as a string."""
        node = self._single("attr()")
        key = _attr_key(key)
        if key in node.user_attrs:
            return node.user_attrs[key]
        return format_attr(node.attrs[key]) if key in node.attrs else None

    def _set_attr(self, **kwargs: str) -> None:
        """Set free attributes of this node (``name=`` renames it), string values only, as MXNet's."""
        node = self._single("_set_attr()")
        for key, value in kwargs.items():
            if not isinstance(value, str):
                raise InputError(f"_set_attr({key}={value!r}) on '{node.name}': attribute values are strings "
                                 f"(use str({value!r}))")
            if key == "name":
                node.name = value
            else:
                node.user_attrs[_attr_key(key)] = value

    # ---- copies, composition and children (MXNet's Symbol.__copy__, __call__, get_children)
    def _rebuilt(self, replace: dict[int, NodeEntry]) -> list[NodeEntry]:
        """This graph's outputs in a copy of every node, the variables in ``replace`` (by id) swapped
        for the entries given there (which are shared, not copied)."""
        new: dict[int, Node] = {}

        def entry(e: NodeEntry) -> NodeEntry:
            return replace[id(e.node)] if id(e.node) in replace else NodeEntry(new[id(e.node)], e.index)

        for node in self.topo_nodes():
            if id(node) in replace:
                continue
            deps = [new[id(d)] if id(d) in new else replace[id(d)].node for d in node.control_deps]
            new[id(node)] = Node(node.op, node.name, dict(node.attrs), [entry(e) for e in node.inputs],
                                 dict(node.user_attrs), node.num_outputs, deps)
        return [entry(e) for e in self.outputs]

    def __getstate__(self) -> dict[str, str]:
        """Pickled as its JSON, as MXNet's Symbol (no recursion through deep graphs)."""
        return {"json": self.tojson()}

    def __setstate__(self, state: dict[str, str]) -> None:
        self.outputs = load_json(state["json"]).outputs

    def __copy__(self) -> Symbol:
        """A copy of the whole graph (as MXNet's: renaming a copy leaves the original alone)."""
        return Symbol(self._rebuilt({}))

    def __deepcopy__(self, memo: dict) -> Symbol:
        return self.__copy__()

    def __call__(self, *args: Symbol, name: str | None = None, **kwargs: Symbol) -> Symbol:
        """A copy of this graph with free variables replaced by other graphs (MXNet's composition):
        ``net2(fc3_data=net1)`` by argument name, ``net(a, b)`` in ``list_arguments()`` order.
        ``name`` is accepted for MXNet's signature; the nodes keep their names, as in NNVM."""
        s = self.__copy__()
        s._compose(*args, name=name, **kwargs)
        return s

    def _compose(self, *args: Symbol, name: str | None = None, **kwargs: Symbol) -> None:
        """Replace this symbol's free variables in place (see ``__call__``)."""
        if args and kwargs:
            raise InputError("compose a symbol with positional or keyword arguments, not both")
        arguments = self.list_arguments()
        if len(args) > len(arguments):
            raise InputError(f"{len(args)} symbols given to compose a symbol with arguments {arguments}")
        unknown = [k for k in kwargs if k not in arguments]
        if unknown:
            raise InputError(f"cannot compose: {unknown} are not arguments of this symbol; its arguments "
                             f"are {arguments}")
        by_name = {**dict(zip(arguments, args)), **kwargs}
        entries = {k: _entry_of(v, f"the symbol composed in for '{k}'") for k, v in by_name.items()}
        replace = {id(n): entries[n.name] for n in self.topo_nodes() if n.is_variable and n.name in entries}
        self.outputs = self._rebuilt(replace)

    def get_children(self) -> Symbol | None:
        """The inputs of the output nodes, as one group (None for a variable), as MXNet's."""
        seen: set[int] = set()
        children: list[NodeEntry] = []
        for e in self.outputs:
            if id(e.node) not in seen:
                seen.add(id(e.node))
                children.extend(e.node.inputs)
        return Symbol(children) if children else None

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
            if n.control_deps:
                item["control_deps"] = [index[id(d)] for d in n.control_deps]
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

        Weight shapes come from the op attributes; a 0 in a given shape is an unknown dim. If some
        shape stays unknown the result is ``(None, None, None)`` (with a warning), as in MXNet;
        shapes that disagree raise ``ShapeError``.
        """
        return infer_shape(self, self._by_name(args, kwargs), partial=False)

    def infer_shape_partial(self, *args: Sequence[int], **kwargs: Sequence[int]) -> tuple[list, list, list]:
        """Like ``infer_shape``, with what is known: ``()`` for an unknown shape, 0 for an unknown dim."""
        return infer_shape(self, self._by_name(args, kwargs), partial=True)

    def infer_type(self, *args: Any, **kwargs: Any) -> tuple[list, list, list]:
        """(arg_types, out_types, aux_types) as numpy dtypes (given as names or numpy types, as in
        MXNet); arguments nothing fixes are float32."""
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
        for key, shape in (shapes or {}).items():
            if shape is not None and any(int(d) == 0 for d in shape):
                raise InputError(f"to_relax needs complete shapes, but '{key}' has {tuple(shape)}: a 0 is an "
                                 "unknown dim (MXNet's convention). Fix: give every dim (infer_shape_partial "
                                 "tells what the graph fixes)")
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

    def __mod__(self, other): return _binary("floor_mod", self, other)  # MXNet's %: the sign of the divisor
    def __rmod__(self, other): return _binary("floor_mod", other, self)
    def __floordiv__(self, other): return _binary("floor_divide", self, other)
    def __rfloordiv__(self, other): return _binary("floor_divide", other, self)
    def __abs__(self): return _call("abs", [self], {})

    @property
    def T(self) -> Symbol:
        """All axes reversed (``sym.transpose(s)``)."""
        return _function("transpose")(self)

    def __getattr__(self, name: str) -> Callable[..., Symbol]:
        """MXNet's fluent methods: ``s.exp()`` is ``sym.exp(s)``, ``s.reshape(shape=...)`` ..."""
        fn = _function(name) if name in FLUENT_METHODS else None
        if fn is not None:
            return lambda *args, **kwargs: fn(self, *args, **kwargs)
        raise AttributeError(f"'Symbol' object has no attribute {name!r}")

    def __bool__(self) -> bool:
        raise TypeError("a Symbol has no truth value (== and < build graph nodes); compare with 'is'")

    def __repr__(self) -> str:
        if len(self.outputs) == 1:
            return f"<Symbol {self.outputs[0].name}>"
        return f"<Symbol group [{', '.join(self.list_outputs())}]>"


def Variable(name: str, shape: Sequence[int] | None = None, dtype: Any = None,
             attr: dict[str, str] | None = None, *, lr_mult: float | None = None, wd_mult: float | None = None,
             **kwargs: str) -> Symbol:
    """A graph input. ``shape``/``dtype`` are hints inference starts from (a 0 in ``shape`` is an
    unknown dim, as in MXNet); ``attr``, ``lr_mult``, ``wd_mult`` and ``__key__=`` free attributes."""
    if not isinstance(name, str) or not name:
        raise InputError(f"a Variable needs a non-empty string name, got {name!r}")
    bad = [k for k in kwargs if not (len(k) > 4 and k.startswith("__") and k.endswith("__"))]
    if bad:
        raise InputError(f"Variable '{name}': unknown arguments {bad}; free attributes go in attr= "
                         "or as __key__='value' (as in MXNet)")
    attrs: dict[str, Any] = {}
    if shape is not None:
        attrs["shape"] = tuple(int(s) for s in shape)
    if dtype is not None:
        attrs["dtype"] = dtype_name(dtype)
    extra = {**kwargs, **{k: str(v) for k, v in (("lr_mult", lr_mult), ("wd_mult", wd_mult)) if v is not None}}
    return Symbol([NodeEntry(Node(None, name, attrs, [], _new_user_attrs({**(attr or {}), **extra})))])


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
        deps = [_json_entry(nodes, src, 0, f"node {i} ('{item['name']}')").node
                for src in item.get("control_deps", [])]
        nodes.append(Node(op, item["name"], attrs, inputs, user, num_outputs, deps))
    return Symbol([_json_entry(nodes, src, idx, f"head {i}") for i, (src, idx, *_) in enumerate(heads)])


def _ancestors(node: Node) -> list[Node]:
    """Every node ``node`` depends on, through inputs and control dependencies."""
    return Symbol([NodeEntry(node, 0)]).topo_nodes()[:-1]


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
    """A node's op attributes then free attributes, all as strings; MXNet's hidden keys
    (``lr_mult``) under both their names (``lr_mult`` and ``__lr_mult__``), as MXNet lists them."""
    out = {k: format_attr(v) for k, v in node.attrs.items()}
    for key, value in node.user_attrs.items():
        out[key] = value
        if key in HIDDEN_KEYS:
            out[f"__{key}__"] = value
    return out


def _attr_value(value: Any) -> Any:
    """An attribute as plain Python (numpy scalars as int/float, lists as tuples): what JSON gives back."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (list, tuple)):
        return tuple(_attr_value(v) for v in value)
    return value


# --------------------------------------------------------------------------- the op table
class _OpFunctions:
    """The Symbol API's op functions, one per entry of the op table (``symbol_graph.op_table``),
    rebuilt with it whenever an op has been registered since (``tvm_ext.register_op`` at run
    time gets its ``sym.name``)."""

    def __init__(self) -> None:
        self.version = -1
        self.functions: dict[str, Callable[..., Symbol]] = {}

    def current(self) -> dict[str, Callable[..., Symbol]]:
        table = op_table()
        if self.version != table.version:
            self.functions = {**{name: _op_function(info, name) for name, info in table.ops.items()},
                              **{alias: _op_function(table.ops[target], alias) for alias, target in table.aliases.items()},
                              **_MXNET_FUNCTIONS}
            self.version = table.version
        return self.functions


_FUNCTIONS = _OpFunctions()


def _function(name: str) -> Callable[..., Symbol] | None:
    """The op function ``sym.<name>``, None if there is none."""
    return _FUNCTIONS.current().get(name)


def _call(op: str, args: Sequence[Any], kwargs: dict, name: str | None = None,
          attr: dict[str, str] | None = None, hint: str | None = None, exact_name: str | None = None) -> Symbol:
    """One op node on ``args``; the NameManager names it from ``name`` or ``hint`` (default: the op
    name); ``exact_name`` (a name derived from one it already gave) bypasses it."""
    info = op_spec(op)
    kwargs = dict(kwargs)
    attr = _hidden_kwargs(kwargs, attr)
    if info.spec is not None and info.spec.variadic:
        inputs, attrs = list(args), _bind_attrs(info.spec, {**info.spec.attrs}, kwargs)
        if not inputs or any(isinstance(a, (list, tuple)) for a in inputs):
            raise InputError(f"{info.name} takes its tensors one by one: {info.name}(a, b, ..., axis=...)")
    elif info.spec is not None:
        inputs, attrs = _bind_spec(info, args, kwargs)
    else:
        inputs, attrs = _bind_generic(info, args, kwargs)
    node_name = exact_name or NameManager.current().get(name, (hint or info.name).lower())
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
        return _call(info.name, args, kwargs, name, attr, hint=public_name)

    fn.__name__ = fn.__qualname__ = public_name
    if info.spec is not None:
        attrs = ", ".join([*info.spec.required, *(f"{k}={v!r}" for k, v in info.spec.attrs.items())])
        inputs = "*data" if info.spec.variadic else ", ".join(info.spec.inputs)
        fn.__doc__ = f"{info.spec.doc or info.name}\n\n{public_name}({inputs}, {attrs}, name=None, attr=None)"
    else:
        fn.__doc__ = f"Symbol form of {info.opdef.name}{inspect.signature(info.relax_fn)}. " \
                     f"{info.opdef.doc}".strip()
    return fn




# --------------------------------------------------------------------------- MXNet's names
@dataclass(frozen=True)
class MXNetAlias:
    """An MXNet op name as a thin alias of an op here: its tensor keywords (``data``, ``lhs``) become
    positional inputs, ``rename`` maps MXNet keywords to ours, ``defaults`` are MXNet's where they
    differ, ``drop`` keywords have no meaning here (``num_args``). Auto names use the MXNet name."""

    target: str
    inputs: tuple[str, ...] = ("data",)
    rename: dict = field(default_factory=dict)
    defaults: dict = field(default_factory=dict)
    drop: tuple[str, ...] = ()
    values: dict = field(default_factory=dict)  # keyword -> converter of MXNet's value to ours

    def bind(self, public: str, args: tuple, kwargs: dict) -> tuple[list, dict]:
        """(positional inputs, keywords of the target op) of one MXNet-style call."""
        args = list(args)
        for key in self.inputs[len(args):]:
            if key in kwargs:
                args.append(kwargs.pop(key))
        extra = [k for k in self.inputs if k in kwargs]
        if extra:
            raise InputError(f"{public}: {extra} given both positionally and by keyword")
        out = {k: v for k, v in self.defaults.items()}
        for key, value in kwargs.items():
            if key in self.drop:
                continue
            out[self.rename.get(key, key)] = self.values[key](value) if key in self.values else value
        return args, out


_LHS_RHS = ("lhs", "rhs")
_BINARY = {**{f"elemwise_{m}": t for m, t in (("add", "add"), ("sub", "subtract"), ("mul", "multiply"),
                                              ("div", "divide"))},
           **{f"broadcast_{m}": t for m, t in (("add", "add"), ("sub", "subtract"), ("plus", "add"),
                                               ("minus", "subtract"), ("mul", "multiply"), ("div", "divide"),
                                               ("mod", "floor_mod"), ("power", "power"), ("maximum", "maximum"),
                                               ("minimum", "minimum"), ("equal", "equal"),
                                               ("not_equal", "not_equal"), ("greater", "greater"),
                                               ("greater_equal", "greater_equal"), ("lesser", "less"),
                                               ("lesser_equal", "less_equal"))}}
_AXES = {"axes": lambda axes: None if axes is None or tuple(axes) == () else tuple(axes)}  # () reverses all

MXNET_ALIASES: dict[str, MXNetAlias] = {
    **{name: MXNetAlias(target, inputs=_LHS_RHS) for name, target in _BINARY.items()},
    "transpose": MXNetAlias("permute_dims", values=_AXES),
    "Cast": MXNetAlias("astype", values={"dtype": lambda d: dtype_name(d)}),
    "cast": MXNetAlias("astype", values={"dtype": lambda d: dtype_name(d)}),
    "Reshape": MXNetAlias("reshape"),
    "SoftmaxOutput": MXNetAlias("softmax", inputs=("data",), drop=("label", "grad_scale", "ignore_label",
                                                                   "multi_output", "use_ignore", "normalization")),
    "clip": MXNetAlias("clip", rename={"a_min": "min", "a_max": "max"}),
    "pad": MXNetAlias("pad", rename={"mode": "pad_mode", "constant_value": "pad_value"},
                      values={"pad_width": tuple}),
}


def _mxnet_function(public: str, alias: MXNetAlias) -> Callable[..., Symbol]:
    def fn(*args: Any, name: str | None = None, attr: dict[str, str] | None = None, **kwargs: Any) -> Symbol:
        inputs, kw = alias.bind(public, args, dict(kwargs))
        if alias.target == "reshape" and any(int(d) < -1 or int(d) == 0 for d in kw.get("shape", ())):
            raise InputError(f"{public}: MXNet's special shape codes (0, -2, -3, -4) are not supported; "
                             f"give the dims (-1 for one inferred dim), got shape={kw['shape']}")
        return _call(alias.target, inputs, kw, name, attr, hint=public)

    fn.__name__ = fn.__qualname__ = public
    fn.__doc__ = f"MXNet's {public}: sym.{alias.target} with MXNet's keywords ({', '.join(alias.inputs)}" + \
        "".join(f", {k} -> {v}" for k, v in alias.rename.items()) + ")."
    return fn


def Activation(data: Symbol | None = None, act_type: str = "relu", name: str | None = None,
               attr: dict[str, str] | None = None, **kwargs: Any) -> Symbol:
    """MXNet's Activation: ``act_type`` relu, sigmoid or tanh (the registry's ops of those names)."""
    ops = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh"}
    if act_type not in ops:
        raise InputError(f"Activation act_type={act_type!r} has no op here; use one of {sorted(ops)}")
    if data is None:
        raise InputError("Activation needs its input data")
    return _call(ops[act_type], [data], kwargs, name, attr, hint="activation")


def Pooling(data: Symbol | None = None, kernel: Sequence[int] = (1, 1), pool_type: str = "max",
            stride: Sequence[int] = (1, 1), pad: Sequence[int] = (0, 0), global_pool: bool = False,
            count_include_pad: bool = True, name: str | None = None, attr: dict[str, str] | None = None,
            **kwargs: Any) -> Symbol:
    """MXNet's Pooling of NCHW data: max or avg, stride (1, 1) by default; ``global_pool`` reduces H, W."""
    if pool_type not in ("max", "avg"):
        raise InputError(f"Pooling pool_type={pool_type!r} has no op here; use 'max' or 'avg'")
    if data is None:
        raise InputError("Pooling needs its input data")
    if global_pool:
        return _call("max" if pool_type == "max" else "mean", [data], {"axis": (2, 3), "keepdims": True, **kwargs},
                     name, attr, hint="pooling")
    if pool_type == "avg" and count_include_pad and any(int(p) for p in pair(pad)):
        raise InputError("Pooling: an average with count_include_pad=True over padding is not supported here; "
                         "pass count_include_pad=False (the padding is left out of the average)")
    op = "max_pool2d" if pool_type == "max" else "avg_pool2d"
    return _call(op, [data], {"kernel": tuple(pair(kernel)), "stride": tuple(pair(stride)), "pad": tuple(pair(pad)),
                              **kwargs}, name, attr, hint="pooling")


def SliceChannel(data: Symbol | None = None, num_outputs: int | None = None, axis: int = 1,
                 squeeze_axis: bool = False, name: str | None = None, attr: dict[str, str] | None = None,
                 *, _hint: str = "slicechannel") -> Symbol:
    """MXNet's SliceChannel (``split``): ``num_outputs`` equal parts along ``axis``, one output each;
    ``squeeze_axis`` drops that axis from each part."""
    if data is None or num_outputs is None:
        raise InputError("SliceChannel needs data and num_outputs")
    parts = _call("split", [data], {"indices_or_sections": int(num_outputs), "axis": int(axis)}, name, attr,
                  hint=_hint)
    if not squeeze_axis:
        return parts
    node = parts.outputs[0].node.name
    return Group([_call("squeeze", [p], {"axis": [int(axis)]}, attr=attr, exact_name=f"{node}_squeeze{i}")
                  for i, p in enumerate(parts)])


def _split(*args: Any, name: str | None = None, attr: dict[str, str] | None = None, **kwargs: Any) -> Symbol:
    """split(x, indices_or_sections, axis=0) as in Relax, or MXNet's split(data, num_outputs, axis=1,
    squeeze_axis=False) (``SliceChannel``) when ``num_outputs`` is given."""
    if "num_outputs" in kwargs:
        return SliceChannel(*args, name=name, attr=attr, _hint="split", **kwargs)
    return _call("split", args, kwargs, name, attr)


def where(condition: Symbol, x: Symbol, y: Symbol, name: str | None = None,
          attr: dict[str, str] | None = None) -> Symbol:
    """MXNet's where: ``x`` where ``condition`` is nonzero, else ``y`` (a condition of any dtype is
    cast to bool first, node ``<name>_cond``, as Relax's where takes a bool condition)."""
    node = NameManager.current().get(name, "where")
    cond = _call("astype", [condition], {"dtype": "bool"}, attr=attr, exact_name=f"{node}_cond")
    return _call("where", [cond, x, y], {}, attr=attr, exact_name=node)


def Concat(*data: Symbol, dim: int | None = None, axis: int | None = None, num_args: int | None = None,
           name: str | None = None, attr: dict[str, str] | None = None) -> Symbol:
    """MXNet's Concat: the tensors given positionally, joined along ``dim`` (default 1, as MXNet;
    ``axis`` too); ``num_args``, if given, must count them."""
    if num_args is not None and int(num_args) != len(data):
        raise InputError(f"Concat: num_args={num_args} but {len(data)} symbols given")
    if dim is not None and axis is not None and dim != axis:
        raise InputError(f"Concat: dim={dim} and axis={axis} disagree; give one")
    return _call("concat", data, {"axis": int(next((a for a in (dim, axis) if a is not None), 1))}, name, attr,
                 hint="concat")


_MXNET_FUNCTIONS: dict[str, Callable[..., Symbol]] = {
    **{name: _mxnet_function(name, alias) for name, alias in MXNET_ALIASES.items()},
    "Activation": Activation, "Pooling": Pooling, "SliceChannel": SliceChannel, "split": _split,
    "Concat": Concat, "where": where}

# MXNet's fluent methods (``s.exp()``), those whose op exists here
FLUENT_METHODS = frozenset("""reshape reshape_like zeros_like ones_like broadcast_axes repeat pad swapaxes split slice
    slice_axis slice_like take one_hot pick sort topk argsort argmax argmax_channel argmin clip abs sign flatten
    expand_dims broadcast_to broadcast_like tile transpose flip sum nansum prod nanprod mean max min norm round rint
    fix floor ceil trunc sin cos tan arcsin arccos arctan degrees radians sinh cosh tanh arcsinh arccosh arctanh
    exp expm1 log log10 log2 log1p sqrt rsqrt cbrt rcbrt square reciprocal relu sigmoid softmax log_softmax
    softmin squeeze astype""".split())


def __getattr__(name: str) -> Callable[..., Symbol]:
    """Op functions (``sym.exp``, ``sym.dense``, ``sym.FullyConnected`` ...), from the op table."""
    fn = _function(name)
    if fn is not None:
        return fn
    raise AttributeError(f"module 'tvm_ext.symbol' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_FUNCTIONS.current()])


def list_ops() -> list[str]:
    """Names of the op functions of this module (aliases included)."""
    return sorted(_FUNCTIONS.current())
