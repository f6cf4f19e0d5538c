"""A Symbol becomes a Relax IRModule: one ``main`` built with ``relax.BlockBuilder``.

``main``'s parameters are the symbol's arguments then its auxiliary states
(``Symbol.list_inputs()``), typed by shape inference. Every op node is emitted in graph
order and bound under the node's name (its intermediates under ``name_*``), so TVM's
struct-info inference checks the graph once more, and the function attribute
``tvm_ext.ctx_group`` (binding name -> group) carries the nodes' ``ctx_group`` attributes to
the passes that keep device groups apart. In the same way ``tvm_ext.scopes`` carries AutoFuse's
scope attributes (``attrs.SCOPE_KEYS``) and ``tvm_ext.control_deps`` the nodes' control
dependencies (binding -> the bindings it must run after), which AutoFuse never fuses across.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

import tvm
from tvm import relax

from tvm_ext import attrs as fattrs
from tvm_ext.errors import InputError
from tvm_ext.shape_inference import infer
from tvm_ext.symbol_graph import Node, op_spec

if TYPE_CHECKING:  # the class whose to_relax calls this; the translation only walks its graph
    from tvm_ext.symbol import Symbol


def to_relax(symbol: Symbol, shapes: dict[str, Sequence[int]], dtypes: dict[str, str],
             func_name: str = "main") -> tvm.IRModule:
    """The IRModule of ``symbol`` for the given (partial) input shapes and dtypes."""
    types = infer(symbol, shapes, dtypes)
    inputs = symbol.list_inputs()
    in_shapes = types.of_names(inputs, types.shapes)
    missing = [n for n, s in zip(inputs, in_shapes) if s is None]
    if missing:
        raise InputError(f"to_relax needs the shapes of {missing}, which no op fixes from the given "
                         f"{sorted(shapes)}. Fix: add them to shapes=")
    _check_unique_names(types.nodes)
    params = [relax.Var(n, relax.TensorType(s, d))
              for n, s, d in zip(inputs, in_shapes, types.of_names(inputs, types.dtypes))]
    by_name = dict(zip(inputs, params))
    out_entries = {(id(e.node), e.index) for e in symbol.outputs}
    values: dict[tuple[int, int], relax.Expr] = {}
    owner: dict[str, Node] = {}  # names of the bindings a node ends with -> the node
    bb = relax.BlockBuilder()
    with bb.function(func_name, params):
        with bb.dataflow():
            for node in types.nodes:
                if node.is_variable:
                    values[(id(node), 0)] = by_name[node.name]
                    continue
                args = [values[(id(e.node), e.index)] for e in node.inputs]
                expr = op_spec(node.op).emit(bb, args, node.attrs, node.name)
                if node.num_outputs == 1:
                    emit = bb.emit_output if (id(node), 0) in out_entries else bb.emit
                    values[(id(node), 0)] = emit(expr, node.name)
                else:  # the tuple, then each field under its output name
                    tup = bb.emit(expr, node.name)
                    for i in range(node.num_outputs):
                        emit = bb.emit_output if (id(node), i) in out_entries else bb.emit
                        values[(id(node), i)] = emit(relax.TupleGetItem(tup, i), node.output_name(i))
                        owner[node.output_name(i)] = node
                owner[node.name] = node
            results = [values[(id(e.node), e.index)] for e in symbol.outputs]
        bb.emit_func_output(results[0] if len(results) == 1 else relax.Tuple(results))
    mod = bb.get()
    func = mod[func_name]
    members = _members(func, owner)
    groups = {b: n.user_attrs["ctx_group"] for b, n in members.items() if "ctx_group" in n.user_attrs}
    scopes = {b: {k: n.user_attrs[k] for k in fattrs.SCOPE_KEYS if k in n.user_attrs} for b, n in members.items()}
    scopes = {b: s for b, s in scopes.items() if s}
    deps = {n.name: [d.name for d in n.control_deps if not d.is_variable]  # the op's binding is its name
            for n in types.nodes if any(not d.is_variable for d in n.control_deps)}
    for key, value in ((fattrs.CTX_GROUP, groups), (fattrs.SCOPES, scopes), (fattrs.CONTROL_DEPS, deps)):
        if value:
            func = func.with_attr(key, value)
    mod[func_name] = func
    return mod


def _check_unique_names(nodes: list[Node]) -> None:
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise InputError(f"two nodes of the graph are named '{n.name}'; Relax bindings take the node "
                             "names, so give them distinct name= arguments")
        seen.add(n.name)


def _members(func: relax.Function, owner: dict[str, Node]) -> dict[str, Node]:
    """Binding name -> the node whose bindings it is part of, in binding order.

    A node's bindings are contiguous and end with ones named after it, so every binding
    before those (and after the previous node's) belongs to it.
    """
    members: dict[str, Node] = {}
    pending: list[str] = []
    for block in func.body.blocks:
        for binding in block.bindings:
            pending.append(binding.var.name)
            node = owner.get(binding.var.name)
            if node is None:
                continue
            members.update(dict.fromkeys(pending, node))
            pending = []
    return members
