"""FusePartition: NNVM's operator-fusion partition (nnvm_graph_passes.txt, "Operator Fusion").

An analysis over one dataflow block that computes, with the seed's vocabulary,

- ``fuse_rule[n]``: ``FUSE_TO_MASTER`` (n joins the group of the node that reads it) or
  ``REALIZE`` (n's value is written to memory; its group ends at n);
- ``master_node[n]``: the node a group's code is built around (an anchor such as conv2d
  with its elementwise epilogue, or the group's own root);
- ``fuse_pattern[n]``: the pattern of n's group so far, the most complex inside it;
- ``group_root[n]``: the group's final node, whose value leaves the group.

It runs the seed's three passes: a forward topological pass (fuse rules, masters,
patterns), a reverse pass (roots, and the master re-pointing when a node fuses both an
OutEWiseFusable and an Injective input), and the diamond fusion (a node whose readers all
sit in one ElemWise/Broadcast group joins it, with its own group: ResNet's
branch-and-rejoin). Every decision is logged with a reason code. The result, a
``FusePlan``, prints as a table and turns into a ``Partition`` for ``MakeGroups``.

Nodes our lowering cannot take are Opaque here (they keep TVM's kernel, which cannot share
a kernel with Loop-IR code); their TVM pattern is still shown.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Iterable

from tvm import relax

from relay_passes.graph import DataflowGraph, GraphNode
from relay_passes.partition import NodeDecision, Partition, decisions_text, make_partition
from tvm_ext.patterns import OpPattern


class FuseRule(enum.Enum):
    UNKNOWN = "unknown"
    FUSE_TO_MASTER = "fuse"
    REALIZE = "realize"


# Reason codes of the decision log (``NodeDecision.reason`` starts with one of these).
FUSED_SIMPLE_INPUT = "fused:simple-input"  # an input no more complex than Injective
FUSED_EPILOGUE = "fused:epilogue"  # an OutEWiseFusable anchor takes this node as epilogue
FUSED_DIAMOND = "fused:diamond"  # all readers sit in one elementwise group
REALIZE_READERS = "realize:readers"  # read by several nodes (or after the block)
REALIZE_ANCHOR = "realize:anchor"  # an OutEWiseFusable / Opaque node realizes its inputs
REALIZE_PATTERN = "realize:pattern"  # the input's group is too complex for the reader
REALIZE_SHAPE = "realize:shape"  # an anchor input whose shape differs from the reader's
REALIZE_SECOND_ANCHOR = "realize:second-anchor"  # the reader already took one anchor
REALIZE_NO_LOWERING = "realize:no-lowering"  # TVM's kernel: cannot share a kernel with ours
REALIZE_OVERRIDE = "realize:override"  # the user asked for it
MASTER_REPOINTED = "master:repointed"  # fuses an anchor and an injective input


@dataclass
class FusePlan:
    """The analysis result: per node, its rule, master, pattern and root, plus the log."""

    graph: DataflowGraph
    fuse_rule: list[FuseRule]
    master_node: list[int]
    fuse_pattern: list[OpPattern]
    group_root: list[int]
    log: list[NodeDecision] = field(default_factory=list)

    def members(self, root: int) -> list[int]:
        return [n for n in range(len(self.graph)) if self.group_root[n] == root]

    def describe(self) -> str:
        """One row per op node: its pattern, group pattern, rule, master and root."""
        g = self.graph
        w = max([4] + [len(n.name) for n in g])
        rows = [f"{'node':>{w}s} {'op':22s} {'own pattern':16s} {'group pattern':16s} {'rule':8s} "
                f"{'master':>{w}s} {'root':>{w}s}"]
        for n in g:
            if n.kind != "op":
                continue
            i = n.index
            master = g[self.master_node[i]].name if self.master_node[i] >= 0 else "-"
            root = g[self.group_root[i]].name if self.group_root[i] >= 0 else "-"
            rows.append(f"{n.name:>{w}s} {_short(n):22s} {str(n.pattern):16s} {str(self.fuse_pattern[i]):16s} "
                        f"{self.fuse_rule[i].value:8s} {master:>{w}s} {root:>{w}s}")
        return "\n".join(rows)

    def log_text(self) -> str:
        return decisions_text(self.graph, self.log)

    def partition(self) -> Partition:
        """Groups by root. Nodes we cannot lower stay out (TVM's kernels); a view op alone
        stays out too (TVM makes it a zero-copy reshape)."""
        g = self.graph
        by_root: dict[int, list[int]] = {}
        for n in g:
            if n.kind == "op" and n.lowerable:
                by_root.setdefault(self.group_root[n.index], []).append(n.index)
        sets = [members + [c for m in members for c in g[m].consumers if g[c].kind == "get_item" and g[c].lowerable]
                for members in by_root.values()]
        part = make_partition(g, sets)
        for grp in part.groups:
            grp.master = self.master_node[grp.root]
        part.decisions = list(self.log) + [d for d in part.decisions if d.action in ("tvm", "view")]
        return part


def _short(node: GraphNode) -> str:
    return (node.op or node.kind).replace("relax.", "")


class FusePartition:
    """NNVM's fusion partition as a partitioner for ``MakeGroups``.

    ``realize``: names of nodes whose value must be written to memory (a kernel boundary
    after them), overriding the rules. ``diamond``: run the diamond fusion step.
    """

    def __init__(self, realize: Iterable[str] = (), diamond: bool = True):
        self.realize = set(realize)
        self.diamond = diamond
        self.plans: list[FusePlan] = []

    def __call__(self, graph: DataflowGraph) -> Partition:
        plan = self.analyze(graph)
        self.plans.append(plan)
        return plan.partition()

    def analyze(self, graph: DataflowGraph) -> FusePlan:
        size = len(graph)
        plan = FusePlan(graph, [FuseRule.UNKNOWN] * size, [-1] * size, [OpPattern.OPAQUE] * size, [-1] * size)
        self._forward(plan)
        self._backward(plan)
        if self.diamond:
            self._diamond(plan)
        for n in range(size):  # every node of a group shares the group's master
            if plan.group_root[n] >= 0:
                root = plan.group_root[n]
                if plan.master_node[root] < 0:
                    plan.master_node[root] = root
                plan.master_node[n] = plan.master_node[root]
        return plan

    # ------------------------------------------------------------------ forward
    def _forward(self, plan: FusePlan) -> None:
        g = plan.graph
        rule, master, pattern = plan.fuse_rule, plan.master_node, plan.fuse_pattern

        def decide(i: int, new_rule: FuseRule, reader: GraphNode, code: str, detail: str = "") -> None:
            rule[i] = new_rule
            action = "fuse" if new_rule is FuseRule.FUSE_TO_MASTER else "realize"
            plan.log.append(NodeDecision(i, action, f"{code}: {detail or 'read by ' + reader.name}"))

        for node in g:
            n = node.index
            if node.kind != "op":
                continue
            pt = node.fusion_pattern
            inputs = g.op_inputs(node)
            if pt <= OpPattern.BROADCAST:
                chosen = -1
                group = pt
                for i in inputs:
                    ipt = pattern[i]
                    if rule[i] is FuseRule.UNKNOWN:
                        if ipt <= OpPattern.INJECTIVE:
                            decide(i, FuseRule.FUSE_TO_MASTER, node, FUSED_SIMPLE_INPUT,
                                   f"{g[i].name} ({ipt}) joins {node.name}")
                        elif ipt == OpPattern.OUT_EWISE_FUSABLE and chosen < 0 and _same_shape(node, g[i]):
                            chosen = master[i]
                            decide(i, FuseRule.FUSE_TO_MASTER, node, FUSED_EPILOGUE,
                                   f"{node.name} is an epilogue of anchor {g[chosen].name}")
                        elif ipt == OpPattern.OUT_EWISE_FUSABLE and chosen >= 0:
                            decide(i, FuseRule.REALIZE, node, REALIZE_SECOND_ANCHOR,
                                   f"{node.name} already takes anchor {g[chosen].name}")
                        elif ipt == OpPattern.OUT_EWISE_FUSABLE:
                            decide(i, FuseRule.REALIZE, node, REALIZE_SHAPE,
                                   f"{g[i].name} {list(_shape(g[i]))} vs {node.name} {list(_shape(node))}")
                        else:
                            decide(i, FuseRule.REALIZE, node, _too_complex(g[i]),
                                   f"{g[i].name} ({ipt}) cannot join {node.name} ({pt})")
                    if rule[i] is FuseRule.FUSE_TO_MASTER and ipt != OpPattern.OUT_EWISE_FUSABLE:
                        group = max(group, ipt)
                master[n] = chosen
                pattern[n] = OpPattern.OUT_EWISE_FUSABLE if chosen >= 0 else group
            elif pt in (OpPattern.INJECTIVE, OpPattern.COMM_REDUCE):
                group = pt
                for i in inputs:
                    if rule[i] is FuseRule.UNKNOWN:
                        if pattern[i] <= OpPattern.INJECTIVE:
                            decide(i, FuseRule.FUSE_TO_MASTER, node, FUSED_SIMPLE_INPUT,
                                   f"{g[i].name} ({pattern[i]}) joins {node.name}")
                        else:
                            decide(i, FuseRule.REALIZE, node, _too_complex(g[i]),
                                   f"{g[i].name} ({pattern[i]}) cannot join {node.name} ({pt})")
                    if rule[i] is FuseRule.FUSE_TO_MASTER:
                        group = max(group, pattern[i])
                if pt == OpPattern.COMM_REDUCE:
                    master[n] = n
                pattern[n] = group
            else:  # OutEWiseFusable and Opaque nodes realize their inputs
                master[n] = n
                for i in inputs:
                    if rule[i] is FuseRule.UNKNOWN:
                        code = REALIZE_NO_LOWERING if not node.lowerable else REALIZE_ANCHOR
                        decide(i, FuseRule.REALIZE, node, code, f"{node.name} ({_short(node)}) reads it")
                        if master[i] < 0:
                            master[i] = i
                pattern[n] = pt
            readers = g.op_readers(node)
            if len(readers) > 1 or g.escapes(node) or not node.lowerable or node.name in self.realize:
                if node.name in self.realize:
                    code, detail = REALIZE_OVERRIDE, "asked to realize"
                elif not node.lowerable:
                    code, detail = REALIZE_NO_LOWERING, node.why_not or "TVM's kernel"
                elif len(readers) > 1:
                    code = REALIZE_READERS
                    detail = f"{len(readers)} readers" + (" and read after the block" if g.escapes(node) else "")
                else:
                    code, detail = REALIZE_READERS, "read after the block"
                rule[n] = FuseRule.REALIZE
                plan.log.append(NodeDecision(n, "realize", f"{code}: {detail}"))
                if master[n] < 0:
                    master[n] = n

    # ------------------------------------------------------------------ backward
    def _backward(self, plan: FusePlan) -> None:
        g = plan.graph
        rule, master, pattern, root = plan.fuse_rule, plan.master_node, plan.fuse_pattern, plan.group_root
        for node in reversed(g.nodes):
            n = node.index
            if node.kind != "op":
                continue
            if root[n] < 0:
                root[n] = n
            fused = [i for i in g.op_inputs(node) if rule[i] is FuseRule.FUSE_TO_MASTER]
            takes_anchor = any(pattern[i] == OpPattern.OUT_EWISE_FUSABLE for i in fused)
            takes_injective = any(pattern[i] == OpPattern.INJECTIVE for i in fused)
            if takes_anchor and takes_injective:
                master[n] = master[root[n]] = n
                plan.log.append(NodeDecision(n, "master", f"{MASTER_REPOINTED}: {node.name} fuses an "
                                                      "OutEWiseFusable and an Injective input"))
            for i in fused:
                root[i] = root[n]
                if master[n] == n and pattern[i] == OpPattern.INJECTIVE:
                    master[i] = n
        for node in g:  # a multi-output op's field reads belong to the op's group
            if node.kind == "get_item" and node.inputs:
                root[node.index] = root[node.inputs[0]]

    # ------------------------------------------------------------------ diamond
    def _diamond(self, plan: FusePlan) -> None:
        g = plan.graph
        root, pattern, master = plan.group_root, plan.fuse_pattern, plan.master_node
        for node in reversed(g.nodes):
            n = node.index
            if node.kind != "op" or node.fusion_pattern == OpPattern.OPAQUE or node.name in self.realize:
                continue
            readers = g.op_readers(node)
            if len(readers) < 2:
                continue
            child_roots = {root[r] for r in readers}
            if len(child_roots) != 1:
                continue
            child = child_roots.pop()
            if child == root[n]:
                continue
            members = plan.members(child)
            if not all(g[m].kind != "op" or (g[m].lowerable and g[m].pattern <= OpPattern.BROADCAST)
                       for m in members):
                continue
            old = root[n]
            for m in plan.members(old):  # the parent's whole group joins the children's
                root[m] = child
            plan.fuse_rule[n] = FuseRule.FUSE_TO_MASTER
            for m in plan.members(child):
                pattern[m] = max(pattern[n], pattern[m])
                master[m] = master[n] if master[n] >= 0 else master[m]
            plan.log.append(NodeDecision(n, "fuse", f"{FUSED_DIAMOND}: all {len(readers)} readers are in "
                                                 f"the group of {g[child].name}"))


def _same_shape(a: GraphNode, b: GraphNode) -> bool:
    return _shape(a) == _shape(b)


def _shape(node: GraphNode) -> tuple:
    """The node's output shape (a multi-output op: its first field, the one epilogues read)."""
    ty = node.var.ty
    if isinstance(ty, relax.TupleType) and ty.fields:
        ty = ty.fields[0]
    try:
        return tuple(int(d) for d in ty.shape.values)
    except (AttributeError, TypeError):
        return ()


def _too_complex(node: GraphNode) -> str:
    return REALIZE_NO_LOWERING if not node.lowerable else REALIZE_PATTERN
