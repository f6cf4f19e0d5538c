"""Partitions of a dataflow block into fusion groups, as a plain result object.

A ``Partition`` says which nodes form each group and why; ``relay_passes.grouping`` turns
it into grouped Relax functions. The trivial strategies live here (NNVM's fusion is in
``fuse_partition``; all are named in ``strategies``):

- ``partition_none``: every op alone (one kernel per op);
- ``partition_each``: the same, views included (a copy kernel each; for tests);
- ``partition_chains``: maximal single-consumer trees of ElemWise/Broadcast ops.

Nodes our lowering cannot take (``GraphNode.lowerable`` false) stay outside every group: TVM's
LegalizeOps gives them their own kernel (AutoFuse's "default lowering"). A view op
(reshape, expand_dims, squeeze, flatten) left alone also stays out: TVM turns it into a
zero-copy reshape, which beats any copy kernel.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Collection

from relay_passes.graph import DataflowGraph, GraphNode
from tvm_ext.patterns import OpPattern


@dataclass
class Group:
    """A set of nodes compiled into one kernel."""

    gid: int
    nodes: list[int]  # node indices, in topological order
    pattern: OpPattern
    master: int = -1  # the node the kernel is built around (FusePartition); -1: the root
    outputs: list[int] = field(default_factory=list)  # members whose values leave the kernel
    local: list[int] = field(default_factory=list)  # members realized as kernel-local stages

    @property
    def root(self) -> int:
        return self.nodes[-1]


@dataclass
class NodeDecision:
    """One line of the fusion log: what happened to a node and why."""

    node: int
    action: str  # "fused", "alone", "tvm" (left to TVM's legalization), "view"
    reason: str


@dataclass
class Partition:
    graph: DataflowGraph
    groups: list[Group] = field(default_factory=list)
    decisions: list[NodeDecision] = field(default_factory=list)

    def describe(self) -> str:
        """A printable table: one line per group, then nodes left to TVM."""
        lines = []
        for g in self.groups:
            names = ", ".join(f"{self.graph[n].name}={_short(self.graph[n])}" for n in g.nodes)
            lines.append(f"group {g.gid} [{g.pattern}]: {names}")
        for d in self.decisions:
            if d.action in ("tvm", "view"):
                node = self.graph[d.node]
                lines.append(f"{d.action:5s} {node.name}={_short(node)}: {d.reason}")
        return "\n".join(lines)


def _short(node: GraphNode) -> str:
    return (node.op or node.kind).replace("relax.", "")


Partitioner = Callable[[DataflowGraph], Partition]


def _leftovers(graph: DataflowGraph, part: Partition, taken: set[int]) -> None:
    for node in graph:
        if node.index in taken or node.kind == "other":
            continue
        if node.lowerable and node.is_view:
            part.decisions.append(NodeDecision(node.index, "view", "alone: TVM makes it a zero-copy reshape"))
        elif not node.lowerable and node.kind == "op":
            part.decisions.append(NodeDecision(node.index, "tvm", node.why_not or "not lowerable"))


def default_outputs(graph: DataflowGraph, members) -> list[int]:
    """Members read outside the group or after the block."""
    inside = set(members)
    return sorted(n for n in inside if graph[n].is_output or any(c not in inside for c in graph[n].consumers))


def make_partition(graph: DataflowGraph, sets: list[list[int]], outputs: list[list[int]] | None = None,
                   keep_views: Collection[int] = ()) -> Partition:
    """Groups from sets of node indices (pattern: the most complex inside; outputs given or
    ``default_outputs``), plus the log lines for nodes left to TVM or left as views. A set
    that is one view op alone is not a group unless the op is in ``keep_views``: TVM makes
    it a zero-copy reshape, which beats any copy kernel."""
    part = Partition(graph)
    taken: set[int] = set()
    for i, members in enumerate(sets):
        members = sorted(set(members))
        ops = [n for n in members if graph[n].kind == "op"]
        if len(ops) == 1 and graph[ops[0]].is_view and ops[0] not in keep_views:
            continue
        pattern = max((graph[n].pattern for n in ops), default=OpPattern.OPAQUE)
        outs = sorted(outputs[i]) if outputs is not None else default_outputs(graph, members)
        part.groups.append(Group(len(part.groups), members, pattern, outputs=outs))
        taken.update(members)
    _leftovers(graph, part, taken)
    return part


def decisions_text(graph: DataflowGraph, decisions: list[NodeDecision]) -> str:
    """A decision log, one line per decision: node, action, reason."""
    w = max([4] + [len(n.name) for n in graph])
    return "\n".join(f"{graph[d.node].name:>{w}s} {d.action:9s} {d.reason}" for d in decisions)


def _with_get_items(graph: DataflowGraph, members: list[int]) -> list[int]:
    """A multi-output op's field reads (TupleGetItem) always join the op's group."""
    out = list(members)
    for n in members:
        out.extend(c for c in graph[n].consumers if graph[c].kind == "get_item" and graph[c].lowerable)
    return out


def _groupable(node: GraphNode) -> bool:
    return node.kind == "op" and node.lowerable


def partition_none(graph: DataflowGraph) -> Partition:
    """Every lowerable op in a group of its own (views alone stay TVM's reshapes)."""
    return _singletons(graph, include_views=False)


def partition_each(graph: DataflowGraph) -> Partition:
    """Every lowerable op in a group of its own, views included (a copy kernel each): shows
    each op's own lowering, for tests and debugging."""
    return _singletons(graph, include_views=True)


def _singletons(graph: DataflowGraph, include_views: bool) -> Partition:
    sets = [_with_get_items(graph, [n.index]) for n in graph if _groupable(n)]
    part = make_partition(graph, sets, keep_views={n.index for n in graph} if include_views else ())
    for g in part.groups:
        part.decisions.append(NodeDecision(g.root, "alone", "fusion disabled"))
    return part


_CHAIN = (OpPattern.ELEMWISE, OpPattern.BROADCAST)


def partition_chains(graph: DataflowGraph) -> Partition:
    """Fuse an ElemWise/Broadcast op with each ElemWise/Broadcast producer whose only reader
    it is. Groups are in-trees, which can never form a cycle with the rest of the graph."""
    parent = {n.index: n.index for n in graph}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    reasons: dict[int, str] = {}
    for node in graph:
        if not _groupable(node) or node.pattern not in _CHAIN:
            continue
        for i in graph.op_inputs(node):
            prod = graph[i]
            if not _groupable(prod) or prod.pattern not in _CHAIN:
                continue
            readers = graph.op_readers(prod)
            if graph.escapes(prod):
                reasons[i] = "realized: block output"
                continue
            if len(readers) != 1:
                reasons[i] = f"realized: {len(readers)} readers"
                continue
            parent[find(i)] = find(node.index)
            reasons[i] = f"fused into {node.name}"
    sets: dict[int, list[int]] = {}
    for node in graph:
        if _groupable(node):
            sets.setdefault(find(node.index), []).append(node.index)
    part = make_partition(graph, [_with_get_items(graph, m) for m in sets.values()])
    for g in part.groups:
        for n in g.nodes:
            if graph[n].kind == "op":
                part.decisions.append(NodeDecision(n, "fused" if len(g.nodes) > 1 else "alone",
                                               reasons.get(n, "group root")))
    return part

