"""ConcretizeBroadcast: broadcasts are a property of the op that concretizes them.

After nvFuser's proposal (nvfuser_broadcast_concretization.txt): ``broadcast_to``,
``expand_dims``, ``squeeze`` and reshapes that only add or drop unit dimensions move no
data; only the op that reads them at a larger shape (the concretization) matters. So a
group made only of such views is not a kernel: its members join, as recomputed index
views, every group that reads them, and the reader's loads do the re-indexing. A view is
materialized only when it is read after the block (a graph output) or by something that is
not one of our kernels.

This refines a ``Partition`` of any strategy.
AutoFuse needs no wrapper: a view is a fusable KernelBox, inlined into every reader.
"""
from __future__ import annotations

from relay_passes.graph import DataflowGraph, GraphNode
from relay_passes.partition import NodeDecision, Group, Partition

def is_broadcast_view(node: GraphNode) -> bool:
    """An op whose registry entry says it only adds, drops or repeats unit dims for this call
    (broadcast_to, expand_dims, squeeze, a reshape of unit dims: ``OpDef.broadcast_view``)."""
    if node.kind != "op" or not node.lowerable or node.opdef is None:
        return False
    return node.opdef.is_broadcast_view(node.value, node.var)


def concretize_broadcast(part: Partition) -> Partition:
    """Dissolve every group made only of broadcast views into the groups that read it."""
    g = part.graph
    groups = list(part.groups)
    decisions = list(part.decisions)
    changed = True
    while changed:
        changed = False
        for grp in groups:
            ops = [n for n in grp.nodes if g[n].kind == "op"]
            if not ops or not all(is_broadcast_view(g[n]) for n in ops):
                continue
            readers = _readers(g, grp)
            if readers is None:
                continue
            hosts = [h for h in groups if h is not grp and any(r in h.nodes for r in readers)]
            if not hosts or any(not any(r in h.nodes for h in hosts) for r in readers):
                continue  # read by something that is not one of our kernels: keep it
            for host in hosts:
                host.nodes = sorted(set(host.nodes) | set(grp.nodes))
            groups.remove(grp)
            names = ", ".join(g[n].name for n in ops)
            decisions.append(NodeDecision(ops[-1], "fuse", f"concretize: {names} folded into the loads of "
                                      + ", ".join(g[h.root].name for h in hosts)))
            changed = True
            break
    out = Partition(g, [Group(i, grp.nodes, grp.pattern, grp.master, grp.outputs, grp.local)
                        for i, grp in enumerate(groups)], decisions)
    return out


def _readers(g: DataflowGraph, grp: Group) -> list[int] | None:
    """Nodes outside ``grp`` that read its outputs; None if an output leaves the block."""
    readers = []
    inside = set(grp.nodes)
    for n in grp.outputs:
        if g.escapes(g[n]):
            return None
        readers.extend(c for c in g[n].consumers if c not in inside)
    return readers
