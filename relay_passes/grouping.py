"""MakeGroups: turn a partition into grouped Relax functions ("New Graph Construction").

Each group becomes a private Relax function marked ``Primitive`` (as TVM's FuseOps does),
with a new parameter per value it reads from outside, its outputs as results, and our
partition attributes (``tvm_ext.group``, ``tvm_ext.pattern``). The caller's dataflow block
calls it. ``mod.script()`` shows the groups; ``FuseCompile`` then lowers each to one PrimFunc.
"""
from __future__ import annotations

import heapq

import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from relay_passes.graph import DataflowGraph, Labels
from relay_passes.substitute import substitute
from relay_passes.partition import Group, Partition, Partitioner
from relay_passes.strategies import PARTITIONERS
from tvm_ext import attrs
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OPS, OpRegistry


@tvm.ir.transform.module_pass(opt_level=0, name="MakeGroups")
class MakeGroups:
    """Partition every dataflow block and outline each group as a ``Primitive`` function.

    ``partitioner`` is a strategy name of ``PARTITIONERS`` or a callable taking a
    ``DataflowGraph`` and returning a ``Partition``. The partitions made are kept in
    ``self.partitions`` for reports and tests.
    """

    def __init__(self, partitioner: str | Partitioner = "chains", registry: OpRegistry = OPS):
        if isinstance(partitioner, str):
            if partitioner not in PARTITIONERS:
                raise ValueError(f"unknown partition strategy {partitioner!r}; "
                                 f"choose one of {sorted(PARTITIONERS)}")
            partitioner = PARTITIONERS[partitioner]
        self.partitioner = partitioner
        self.registry = registry
        self.partitions: list[Partition] = []

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        rewriter = _GroupRewriter(mod, self)
        for gv, func in list(mod.functions_items()):
            if isinstance(func, relax.Function) and not _is_primitive(func):
                rewriter.labels = Labels.of(func)
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()


def _is_primitive(func: relax.Function) -> bool:
    return func.attrs is not None and "Primitive" in func.attrs


@mutator
class _GroupRewriter(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, owner: MakeGroups):
        super().__init__(mod)
        self.owner = owner
        self.names = {gv.name_hint for gv in mod.get_global_vars()}
        self.labels = Labels()

    def visit_dataflow_block_(self, block: relax.DataflowBlock):
        graph = DataflowGraph(block, self.owner.registry, self.labels)
        part = self.owner.partitioner(graph)
        self.owner.partitions.append(part)
        self.builder_._begin_dataflow_block()
        for item in _condensed_order(graph, part.groups):
            if isinstance(item, Group):
                self._emit_group(graph, item)
            else:
                self.visit_binding(block.bindings[item])
        return self.builder_._end_block()

    def _unique(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            name, n = f"{base}{n}", n + 1
        self.names.add(name)
        return name

    def _emit_group(self, graph: DataflowGraph, group: Group) -> None:
        ops = [graph[n].op.replace("relax.", "").replace("nn.", "") for n in group.nodes if graph[n].op]
        name = self._unique("fused_" + "_".join(ops[:6]))
        func, inputs, outputs = outline_group(graph, group, name)
        gv = self.builder_.add_func(func, name)
        call = relax.Call(gv, [self.visit_expr(v) for v in inputs])
        if len(outputs) == 1:
            self._bind(outputs[0], call)
            return
        tup = self.builder_.emit(call, name_hint=name)
        for i, var in enumerate(outputs):
            self._bind(var, relax.TupleGetItem(tup, i))

    def _bind(self, var: relax.Var, value: relax.Expr) -> None:
        if isinstance(var, relax.DataflowVar):
            new = self.builder_.emit(value, name_hint=var.name)
        else:
            new = self.builder_.emit_output(value, name_hint=var.name)
        self.set_var_remap(var, new)


def outline_group(graph: DataflowGraph, group: Group, name: str):
    """The group as a ``Primitive`` Relax function; returns (function, inputs, outputs)."""
    inputs = group_inputs(graph, group)
    outputs = [graph[n].var for n in group.outputs]
    params = [relax.Var(v.name, v.ty) for v in inputs]
    vmap: dict = dict(zip(inputs, params))
    master = graph[group.master if group.master >= 0 else group.root]
    fattrs = {"Primitive": True, attrs.GROUP: group.gid, attrs.PATTERN: str(group.pattern),
              attrs.MASTER: f"{master.name}:{(master.op or '').replace('relax.', '')}",
              attrs.TILED_EPILOGUE: master.opdef is None or master.pattern == OpPattern.OUT_EWISE_FUSABLE}
    cores = [int(graph[n].scope[attrs.CORE_SCOPE]) for n in group.nodes if attrs.CORE_SCOPE in graph[n].scope]
    if cores:
        fattrs[attrs.CORES] = min(cores)
    if group.local:
        fattrs[attrs.LOCAL] = [graph[n].name for n in group.local]
    bb = relax.BlockBuilder()
    with bb.function(name, params, attrs=fattrs, private=True):
        with bb.dataflow():
            for n in group.nodes:
                node = graph[n]
                value = substitute(node.value, vmap)
                emit = bb.emit_output if node.var in outputs else bb.emit
                vmap[node.var] = emit(value, name_hint=node.name)
        result = vmap[outputs[0]] if len(outputs) == 1 else relax.Tuple([vmap[o] for o in outputs])
        bb.emit_func_output(result)
    return bb.get()[name], inputs, outputs


def group_inputs(graph: DataflowGraph, group: Group) -> list[relax.Var]:
    """Variables the group's members read that no member binds, in first-use order."""
    bound = {graph[n].var for n in group.nodes}
    inputs: list[relax.Var] = []
    for n in group.nodes:
        for v in relax.analysis.free_vars(graph[n].value):
            if v not in bound and v not in inputs:
                inputs.append(v)
    return inputs


def _condensed_order(graph: DataflowGraph, groups: list[Group]):
    """Groups and ungrouped nodes in a topological order, as close to program order as
    possible. A node inside groups only (recomputed, never read outside) is not emitted; one
    that something outside its groups reads is emitted on its own as well."""
    owner = {}  # node -> the item whose emission binds the node's variable
    for g in groups:
        for n in g.outputs:
            if n in owner:
                raise RuntimeError(f"node {graph[n].name} is an output of two groups")
            owner[n] = ("g", g.gid)
    grouped = {n for g in groups for n in g.nodes}
    for n in graph:
        if n.index not in grouped:
            owner[n.index] = ("n", n.index)

    def needs(reads) -> set:
        out = set()
        for v in reads:
            i = graph.index_of.get(v)
            if i is None:
                continue
            if i not in owner:  # recomputed inside groups, and read outside them too (a view
                owner[i] = ("n", i)  # that is also a graph output): it is emitted on its own
                alone.append(i)
            out.add(owner[i])
        return out

    alone = [n.index for n in graph if n.index not in grouped]

    deps: dict = {}
    first: dict = {}
    for g in groups:
        key = ("g", g.gid)
        deps[key] = needs(group_inputs(graph, g)) - {key}
        first[key] = min(g.outputs) if g.outputs else min(g.nodes)
    done = 0
    while done < len(alone):
        n = graph[alone[done]]
        done += 1
        key = ("n", n.index)
        deps[key] = needs(relax.analysis.free_vars(n.value)) - {key}
        first[key] = n.index
    users: dict = {k: [] for k in deps}
    for k, ds in deps.items():
        for d in ds:
            users[d].append(k)
    waiting = {k: len(ds) for k, ds in deps.items()}
    ready = [(first[k], k) for k, c in waiting.items() if c == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, k = heapq.heappop(ready)
        order.append(groups[k[1]] if k[0] == "g" else k[1])
        for u in users[k]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, (first[u], u))
    if len(order) != len(deps):
        raise RuntimeError("partition creates a cycle between groups")
    return order
