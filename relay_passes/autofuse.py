"""AutoFuse graph-level Lowering (autofuse_lowering_en.md, "Graph Lowering").

Each output of each node gets a ``KernelBox`` that says how the value is computed:

- ``EXTERN``: the op keeps its own kernel (an op our lowering cannot take, a disabled
  scope); its inputs are realized first (AutoFuse's default lowering);
- ``FUSABLE``: the value is its Loop-IR expression; ``Load()`` inlines it into each reader
  (a value with several readers is recomputed by each of them);
- ``LOCAL``: realized as a stage of the kernel under construction (a reduction result, an
  op of the realize-immediately set); readers in the same kernel load the stage;
- ``MEMORY``: realized: written to memory by the kernel that computes it, read from there.

Walking the block in topological order, every node lowers itself on the Loop IR of its
inputs (in analysis mode: Loop IR only, no TE), and the stop rules (``StopRules``) decide
which boxes are realized and why. The kernels that come out form a ``Partition`` whose
groups may share recomputed members; ``MakeGroups`` outlines them and ``FuseCompile``
builds each as one PrimFunc, with the ``LOCAL`` boxes as kernel-local stages.

The seed's rules and where they live here (``STOP_RULES`` has their documentation):
reduction results are realized (``reduction``, kernel-local: one kernel per softmax or
norm); expressions over ``max_loop_nodes`` or ``max_loads`` are realized; inputs of ops we
cannot lower are realized (``default-lowering``); different devices (the VDevice of the
values) split kernels; ``realize_ops`` are realized at once (the seed's Exp rule); inputs an
op does not read (``zeros_like``) are not fused into it; nodes with control edges, under
``_super_kernel_scope`` or under ``_disable_autofuse_scope`` keep kernels of their own;
different ``_core_scope``s split kernels, and a kernel runs on at most its scope's cores;
dtypes we cannot compute skip lowering; a graph of scalars only is not fused. The scopes are
node attributes (``sym.AttrScope``), carried to Relax as the function attribute
``tvm_ext.scopes``; control edges as ``tvm_ext.control_deps``.
"""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from tvm import relax, tirx

from relay_passes.lower_call import lower_call
from relay_passes.graph import DataflowGraph, GraphNode
from relay_passes.partition import NodeDecision, Group, Partition, decisions_text, default_outputs, make_partition
from tvm_ext import attrs
from tvm_ext import loop_ir as L
from tvm_ext.errors import NotLowerable
from tvm_ext.lowering import KernelBuilder, TensorValue
from tvm_ext.patterns import OpPattern


class BoxKind(enum.Enum):
    EXTERN = "extern"
    FUSABLE = "fusable"
    LOCAL = "local"
    MEMORY = "memory"


STOP_RULES: dict[str, str] = {
    "reduction": "A reduction result is realized, as a kernel-local stage: its readers stay "
                 "in the same kernel (seed rule 1; multi-stage kernels).",
    "loop-nodes": "The box's Loop-IR expression has more nodes than max_loop_nodes (seed rule 2).",
    "loads": "The box's expression has more Load nodes than max_loads (seed rule 3).",
    "default-lowering": "The reader cannot be lowered (no lowering, a declined attribute, a "
                        "symbolic shape, an unsupported dtype): its inputs are realized (seed rules 4, 12, 13).",
    "anchor-input": "A matmul or conv2d reads each input element many times: inlining a computed "
                    "input would recompute it per use, so only pure views are inlined into anchors.",
    "device": "Producer and reader carry different device labels: the function's tvm_ext.ctx_group "
              "(NNVM's ctx_group) or their VDevice (the seed's stream label, rule 6). Relax itself "
              "only lets values cross VDevices through to_vdevice, which realizes them anyway.",
    "realize-op": "The op is in realize_ops and is realized at once, as a kernel-local stage "
                  "(the seed's Exp rule, rule 7), unless inlining computes it once an element: its "
                  "readers, and theirs, are elementwise at its shape up to one value read at most once.",
    "unused-input": "The reader does not read the input's values (zeros_like, ...): the input is "
                    "realized early instead of fused (seed rule 9).",
    "control-edge": "The node has control edges in or out (NNVM's control_deps, seed rule 5): its inputs "
                    "are realized and it is a kernel of its own, so the order the edges ask for is kept.",
    "cores": "Producer and reader are under different core scopes (_core_scope, seed rule 8); a kernel "
             "under one runs on at most that many cores. Unlike rule 6, an unlabelled node differs "
             "from a labelled one, so a kernel never mixes them.",
    "super-kernel": "The node is under _super_kernel_scope (seed rule 10): AutoFuse skips it. The seed's super "
                    "kernels (one launch for several kernels) have no counterpart here: it keeps its own kernel.",
    "disabled": "The node is under _disable_autofuse_scope (seed rule 11), or named in disable_fusion: it "
                "skips lowering and keeps its own kernel.",
    "scalar-graph": "Every value of the block is a scalar: nothing is fused (seed rule 14).",
    "block-output": "The value is read after the dataflow block.",
    "non-op-reader": "The value is read by a binding that is not an op call (a tuple, a call "
                     "of another function): it is realized.",
    "kernel-merge": "Joining all the reader's kernels would create a cycle between kernels: the reader "
                    "joins the newest one it can join alone and reads the other inputs from memory.",
    "rollback": "The kernel covered fewer than rollback_threshold ops (the seed's count rule), or, with a "
                "judge (compile(rollback=\"measure\"), tune), it ran more than rollback_margin slower than "
                "its ops as kernels of their own: its ops get their own kernels.",
}
"""Rule 1 and rule 7 depart from the seed on purpose: a reduction result or an Exp is realized
as a kernel-local stage, so a softmax or a norm is one kernel that keeps its row in cache,
not three or four kernels that write and read it through memory. ``StopRules(local_stages=False)``
gives the seed's literal rules. Measured on 8192x1024 float32 (2-vCPU Xeon with AVX-512 and AMX,
family 6 model 167, 2 threads, kernels only): softmax 1.21 ms as one kernel against 4.86 ms as
four (4.0x); layer norm 1.19 ms as one against 2.43 ms as three (2.0x): ``bench/local_stages.py``."""

STOP_RULES_NOT_APPLICABLE: dict[str, str] = {
    "stream label (rule 6)": "CPU kernels run one after another on one stream: the VDevice and the "
                             "ctx_group stand for the label (rule \"device\").",
}

_OWN_KERNEL = frozenset(["scalar-graph", "disabled", "super-kernel", "control-edge"])  # extern, yet our kernel


@dataclass
class StopRules:
    """The configurable stop rules of AutoFuse (see ``STOP_RULES``)."""

    max_loop_nodes: int = 64
    max_loads: int = 8  # the seed's 4 split batch-norm epilogues; 8 measured faster (README)
    realize_ops: frozenset = frozenset(["relax.exp"])
    disable_fusion: frozenset = frozenset()
    rollback_threshold: int = 2
    fuse_scalar_graphs: bool = False
    local_stages: bool = True  # False: reductions and realize_ops go to memory, as the seed's rules 1 and 7
    rollback_margin: float = 0.10  # a judged kernel is split when over this much slower than its parts


@dataclass(frozen=True)
class RollbackVerdict:
    """A judge's answer for one kernel: its time fused and its ops' time as kernels of their own."""

    fused_ms: float
    parts_ms: float
    how: str = "measured"  # "measured" now, or "recorded" (from a tuning database)

    @property
    def ratio(self) -> float:
        return self.fused_ms / self.parts_ms


#: A rollback judge: times a kernel (a one-group partition of the graph) against its parts;
#: None when it cannot (the group does not build alone). ``tvm_ext.measured_rollback`` has one.
RollbackJudge = Callable[[DataflowGraph, Group], Optional[RollbackVerdict]]


@dataclass(eq=False)
class KernelBox:
    node: int
    kind: BoxKind
    value: TensorValue | None = None  # the analysis value (a load of memory once realized)
    members: frozenset = frozenset()  # nodes whose computation its expression contains
    kernel: int | None = None  # the kernel whose stages it reads or belongs to
    loop_nodes: int = 0
    loads: int = 0
    rule: str = ""  # the stop rule that realized it

    def describe(self, graph: DataflowGraph) -> str:
        rule = f" ({self.rule})" if self.rule else ""
        kernel = f" in kernel {self.kernel}" if self.kernel is not None else ""
        return (f"{graph[self.node].name}: {self.kind.value}{rule}{kernel}, {self.loop_nodes} loop nodes, "
                f"{self.loads} loads, computes {sorted(graph[m].name for m in self.members)}")


@dataclass
class Kernel:
    kid: int
    nodes: set = field(default_factory=set)
    outputs: set = field(default_factory=set)
    local: set = field(default_factory=set)
    views: set = field(default_factory=set)  # nodes recomputed as re-indexings of memory


@dataclass
class AutoFusePlan:
    """The analysis result: the box of every node, the kernels, and the decision log."""

    graph: DataflowGraph
    boxes: dict = field(default_factory=dict)
    kernels: dict = field(default_factory=dict)
    log: list = field(default_factory=list)

    def describe(self) -> str:
        """One line per box: its kind, the rule that realized it, its size, what it computes."""
        return "\n".join(b.describe(self.graph) for _, entry in sorted(self.boxes.items(), key=lambda kv: kv[0])
                         for b in (entry if isinstance(entry, list) else [entry]) if isinstance(b, KernelBox))

    def log_text(self) -> str:
        return decisions_text(self.graph, self.log)


class AutoFuse:
    """AutoFuse's Graph Lowering as a partitioner for ``MakeGroups``."""

    def __init__(self, rules: StopRules | None = None, judge: RollbackJudge | None = None, **overrides):
        self.rules = rules or StopRules(**overrides)
        self.judge = judge  # rollback by measurement: see RollbackJudge
        self.plans: list[AutoFusePlan] = []

    def __call__(self, graph: DataflowGraph) -> Partition:
        plan = self.analyze(graph)
        self.plans.append(plan)
        return _to_partition(plan)

    def analyze(self, graph: DataflowGraph) -> AutoFusePlan:
        return _Lowering(graph, self.rules, self.judge).run()


class _Lowering:
    """One walk over a block: boxes, kernels, decisions."""

    def __init__(self, graph: DataflowGraph, rules: StopRules, judge: RollbackJudge | None = None):
        self.g = graph
        self.rules = rules
        self.judge = judge
        self.plan = AutoFusePlan(graph)
        self.kb = KernelBuilder("autofuse_analysis", emit_te=False)
        self.memory: dict = {}  # relax var -> memory-backed analysis value
        self.next_kernel = 0
        self.scalar_graph = not rules.fuse_scalar_graphs and all(
            _size(n) <= 1 for n in graph if n.kind == "op")

    # ------------------------------------------------------------------ driver
    def run(self) -> AutoFusePlan:
        for node in self.g:
            if node.kind == "get_item":
                self._get_item(node)
            elif node.kind == "op" and self._extern_reason(node) is None:
                self._lower(node)
            else:
                self._extern(node)
        for node in self.g:
            box = self.plan.boxes.get(node.index)
            if box is not None and node.is_output and box.kind is not BoxKind.EXTERN:
                self._realize(box, "block-output")
        self._rollback()
        return self.plan

    def _decide(self, node: int, action: str, rule: str, detail: str = "") -> None:
        self.plan.log.append(NodeDecision(node, action, f"{rule}" + (f": {detail}" if detail else "")))

    # ------------------------------------------------------------------ kernels
    def _new_kernel(self, nodes: Iterable[int] = ()) -> int:
        kid = self.next_kernel
        self.next_kernel += 1
        self.plan.kernels[kid] = Kernel(kid, set(nodes))
        return kid

    def _realize(self, box: KernelBox, rule: str, detail: str = "") -> None:
        """Write the box's value to memory (AutoFuse's ``Realize``); its kernel outputs it."""
        if box.kind in (BoxKind.MEMORY, BoxKind.EXTERN):
            return
        if box.kernel is None:
            box.kernel = self._new_kernel()
        kernel = self.plan.kernels[box.kernel]
        kernel.nodes |= box.members
        kernel.outputs.add(box.node)
        box.kind, box.rule = BoxKind.MEMORY, rule
        box.value = self._memory_value(self.g[box.node].var, box.value)
        self._decide(box.node, "realize", rule, detail)

    def _memory_value(self, var: relax.Var, like: TensorValue | None = None) -> TensorValue:
        if var not in self.memory:
            ty = var.ty
            shape = [int(d) for d in ty.shape.values] if like is None else like.shape
            dtype = str(ty.dtype) if like is None else like.dtype
            self.memory[var] = self.kb.add_input(var.name, shape, dtype)
        return self.memory[var]

    def _merge(self, kids: set, joining: set, views: frozenset = frozenset()) -> int | None:
        """One kernel for the given ones and the nodes ``joining`` them (a reader and what it
        recomputes); None when that would create a cycle: a path from the kernel through other
        kernels back into it. The ``views`` (re-indexings of memory each reader recomputes,
        such as a layout_transform of an input) join no kernel to another: the path through
        one is not a dependency."""
        kids = {k for k in kids if k is not None}
        if not kids:
            return None
        keep = min(kids)
        union = set().union(*(self.plan.kernels[k].nodes for k in kids)) | joining
        # the views the kernels took in before stay exempt: a later reader of a ResNet block's
        # residual add (its ReLU) joins the kernel that recomputes the block's input re-laid
        views = set(views).union(*(self.plan.kernels[k].views for k in kids))
        if not _convex(self.g, union - views):
            return None
        self.plan.kernels[keep].views |= views
        for k in sorted(kids - {keep}):
            other = self.plan.kernels.pop(k)
            mine = self.plan.kernels[keep]
            mine.nodes |= other.nodes
            mine.outputs |= other.outputs
            mine.local |= other.local
            for entry in self.plan.boxes.values():  # a multi-output node (topk) has a list
                for box in entry if isinstance(entry, list) else [entry]:
                    if box.kernel == k:
                        box.kernel = keep
        return keep

    # ------------------------------------------------------------------ extern
    def _extern_reason(self, node: GraphNode) -> str | None:
        if node.name in self.rules.disable_fusion or attrs.DISABLE_AUTOFUSE_SCOPE in node.scope:
            return "disabled"
        if attrs.SUPER_KERNEL_SCOPE in node.scope:
            return "super-kernel"
        if node.control:
            return "control-edge"
        if not node.lowerable:
            return "default-lowering"
        if self.scalar_graph:
            return "scalar-graph"
        return None

    def _extern(self, node: GraphNode) -> None:
        reason = self._extern_reason(node) or ("default-lowering" if node.kind == "op" else "non-op-reader")
        for i in node.inputs:
            box = self.plan.boxes.get(i)
            if isinstance(box, KernelBox):
                why = node.why_not if node.kind == "op" else type(node.value).__name__
                self._realize(box, reason, f"read by {node.name}" + (f" ({why})" if why else ""))
        if node.kind == "op" and reason in _OWN_KERNEL and node.lowerable:
            kid = self._new_kernel([node.index])  # still our kernel, just not fused
            self.plan.kernels[kid].outputs.add(node.index)
        value = self._memory_value(node.var) if _static_tensor(node.var.ty) else None
        self.plan.boxes[node.index] = KernelBox(node.index, BoxKind.EXTERN, value, rule=reason)
        if node.kind == "op":
            self._decide(node.index, "extern", reason, node.why_not)

    # ------------------------------------------------------------------ lower
    def _lower(self, node: GraphNode) -> None:
        g, n = self.g, node.index
        anchor = _is_anchor(node)
        shape_only = [node.value.args[i] for i in (node.opdef.shape_only if node.opdef is not None else ())]
        fused: list = []  # (var, box) of the inputs whose kernels it may join
        members = {n}
        views: set = set()  # recomputed re-indexings of memory
        values: dict = {}
        for v in relax.analysis.free_vars(node.value):
            i = g.index_of.get(v)
            box = self.plan.boxes.get(i) if i is not None else None
            if box is None:
                values[v] = self._memory_value(v)
                continue
            if box.kind in (BoxKind.FUSABLE, BoxKind.LOCAL):
                rule = None
                if any(v.same_as(a) for a in shape_only):
                    rule, detail = "unused-input", f"{node.name} reads only its shape"
                elif anchor and (box.kind is BoxKind.LOCAL or not _view_only(box)):
                    rule, detail = "anchor-input", f"{node.name} ({node.op.replace('relax.', '')}) reads it"
                elif g[box.node].device != node.device and None not in (g[box.node].device, node.device):
                    rule, detail = "device", f"{g[box.node].device} -> {node.device}"
                elif _cores(g[box.node]) != _cores(node):
                    rule, detail = "cores", f"{_cores(g[box.node]) or 'all'} -> {_cores(node) or 'all'} cores"
                if rule is not None:
                    self._realize(box, rule, detail)
                elif box.kind is BoxKind.FUSABLE:
                    members |= box.members
                    if box.kernel is None and _view_only(box):
                        views |= box.members
                    self._decide(box.node, "inline", "fusable",
                                 f"into {node.name}" + (" (recomputed)" if len(g.op_readers(g[box.node])) > 1 else ""))
            if box.kind in (BoxKind.FUSABLE, BoxKind.LOCAL):
                fused.append((v, box))
            values[v] = box.value
        joined = {box.kernel for _, box in fused}
        kernel = self._merge(joined, members, frozenset(views))
        if kernel is None and any(k is not None for k in joined):
            kernel, members = self._merge_one(node, fused, values, views)
        stages_before = len(self.kb.stages)
        try:
            out = lower_call(node.var, node.value, node.opdef, values, self.kb, [])
        except NotLowerable as err:
            node.why_not = str(err)
            self._extern(node)
            return
        reduced = len(self.kb.stages) > stages_before  # the lowering realized a reduction: a local stage
        if reduced:
            if kernel is None:
                kernel = self._new_kernel()
            self.plan.kernels[kernel].nodes |= members
            if self.rules.local_stages:
                self._decide(n, "stage", "reduction", "its reduction is a kernel-local stage")
        outs = out if isinstance(out, list) else [out]
        boxes = [self._box(n, o, frozenset(members), kernel) for o in outs]
        self.plan.boxes[n] = boxes if isinstance(out, list) else boxes[0]
        if reduced and not self.rules.local_stages:
            for box in boxes:
                self._realize(box, "reduction", "local_stages=False: written to memory, as the seed's rule 1")
        elif not isinstance(out, list):
            self._stop_rules(node, boxes[0])

    def _merge_one(self, node: GraphNode, fused: list, values: dict, views: set) -> tuple[int | None, set]:
        """The reader cannot join all its inputs' kernels (a cycle): it joins the newest one it
        can join alone, with the inputs in no kernel where it can, and reads the others from
        memory. A pre-norm block's residual add joins the kernel of its last matmul and reads
        the skip connection, where it was a kernel of its own. Returns the kernel (None if it
        joins none) and the nodes the reader recomputes."""
        n = node.index
        kernel, kept, members = None, [], {n}
        kernels = sorted({box.kernel for _, box in fused if box.kernel is not None}, reverse=True)
        frees = (True, False) if any(box.kernel is None for _, box in fused) else (False,)
        for keep, free in itertools.product(kernels, frees):  # with the inputs in no kernel first
            part = [(v, box) for v, box in fused if box.kernel == keep or (free and box.kernel is None)]
            joining = {n}.union(*(box.members for _, box in part if box.kind is BoxKind.FUSABLE))
            kernel = self._merge({keep}, joining, frozenset(views & joining))
            if kernel is not None:
                kept, members = part, joining
                break
        for v, box in fused:
            if not any(box is b for _, b in kept):
                self._realize(box, "kernel-merge", f"for {node.name}")
                values[v] = box.value
        return kernel, members

    def _box(self, n: int, value: TensorValue, members: frozenset, kernel: int | None) -> KernelBox:
        expr = value.load(tuple(tirx.Var(f"i{d}", "int32") for d in range(value.ndim)))
        return KernelBox(n, BoxKind.FUSABLE, value, members, kernel, L.count_nodes(expr), L.count_loads(expr))

    def _stop_rules(self, node: GraphNode, box: KernelBox) -> None:
        if node.op in self.rules.realize_ops and not self.rules.local_stages:
            self._realize(box, "realize-op", f"{node.op} is realized at once, to memory (local_stages=False)")
        elif node.op in self.rules.realize_ops and self._inlined_once(node):
            self._decide(node.index, "inline", "realize-op", f"{node.op} is inlined: its elementwise readers "
                                                             "compute it once an element")
        elif node.op in self.rules.realize_ops:
            if box.kernel is None:
                box.kernel = self._new_kernel()
            kernel = self.plan.kernels[box.kernel]
            kernel.nodes |= box.members
            kernel.local.add(node.index)
            box.value = self.kb.realize(box.value, node.name)
            box.kind, box.rule = BoxKind.LOCAL, "realize-op"
            self._decide(node.index, "stage", "realize-op", f"{node.op} is realized at once")
        elif box.loop_nodes > self.rules.max_loop_nodes:
            self._realize(box, "loop-nodes", f"{box.loop_nodes} > {self.rules.max_loop_nodes}")
        elif box.loads > self.rules.max_loads:
            self._realize(box, "loads", f"{box.loads} > {self.rules.max_loads}")

    def _inlined_once(self, node: GraphNode, limit: int = 16) -> bool:
        """Whether inlining ``node`` computes it once an element, so a stage would only add a
        write and a read of a buffer its size (Mish's kernel: 0.37 -> 0.17 ms): every reader, and
        every reader of those, up to ``limit`` nodes, is elementwise at its shape (reads it at
        its own index) except for one value, the sink, that is a graph output or has at most
        one reader (a value read by two is recomputed by each)."""
        shape, g = _shape(node), self.g
        seen, todo, sinks = {node.index}, [node.index], 0
        while todo:
            current = g[todo.pop()]
            readers = g.op_readers(current)
            inside = [r for r in readers if g[r].kind == "op" and g[r].fusion_pattern <= OpPattern.BROADCAST
                      and _shape(g[r]) == shape and _cores(g[r]) == _cores(node) and g[r].device == node.device]
            if current.is_output or len(inside) < len(readers) or not readers:
                if current is node:  # read by no elementwise reader: the rule as it stands
                    return False
                sinks += 1
                if sinks > 1 or len(readers) > 1 or (current.is_output and readers):
                    return False
                continue
            for r in inside:
                if r not in seen:
                    seen.add(r)
                    todo.append(r)
            if len(seen) > limit:
                return False
        return True

    def _get_item(self, node: GraphNode) -> None:
        src = node.inputs[0] if node.inputs else None
        fields = self.plan.boxes.get(src)
        if not isinstance(fields, list):
            self._extern(node)
            return
        field_box = fields[node.value.index]
        box = KernelBox(node.index, field_box.kind, field_box.value, field_box.members | {node.index},
                        field_box.kernel, field_box.loop_nodes, field_box.loads)
        self.plan.boxes[node.index] = box

    # ------------------------------------------------------------------ rollback
    def _rollback(self) -> None:
        g = self.g
        counts: dict[int, int] = {}
        for k in self.plan.kernels.values():
            for n in k.nodes:
                counts[n] = counts.get(n, 0) + 1
        for kid, k in list(self.plan.kernels.items()):
            ops = [n for n in k.nodes if g[n].kind == "op"]
            if len(ops) < 2 or not k.outputs:
                continue
            if any(counts[n] > 1 for n in k.nodes):  # shares recomputed members: keep it
                continue
            if len(ops) < self.rules.rollback_threshold:
                self._split(kid, ops, f"rollback: kernel of {len(ops)} ops < {self.rules.rollback_threshold}")
            elif self.judge is not None:
                self._judge(kid, k, ops)

    def _judge(self, kid: int, kernel: Kernel, ops: list[int]) -> None:
        """Rollback by measurement: split the kernel when its ops run faster apart."""
        verdict = self.judge(self.g, _group_of(self.g, kernel))
        out = min(kernel.outputs)
        if verdict is None:
            self._decide(out, "keep", "rollback", "not judged: the kernel does not build alone")
        elif verdict.ratio > 1 + self.rules.rollback_margin:
            self._split(kid, ops, f"rollback:{verdict.how} {verdict.ratio:.1f}x slower "
                                  f"({verdict.fused_ms:.3f} ms fused, {verdict.parts_ms:.3f} ms apart)")
        else:
            self._decide(out, "keep", "rollback", f"{verdict.how}: fused {verdict.ratio:.2f}x the time of its parts "
                                                  f"({verdict.fused_ms:.3f} ms, {verdict.parts_ms:.3f} ms apart)")

    def _split(self, kid: int, ops: list[int], reason: str) -> None:
        g = self.g
        del self.plan.kernels[kid]
        for n in sorted(ops):
            single = self._new_kernel([n] + [c for c in g[n].consumers if g[c].kind == "get_item"])
            self.plan.kernels[single].outputs = set(default_outputs(g, self.plan.kernels[single].nodes))
            self.plan.log.append(NodeDecision(n, "rollback", reason))


def _group_of(graph: DataflowGraph, kernel: Kernel) -> Group:
    """The kernel as the one group of a partition (what the rollback judge times)."""
    part = make_partition(graph, [sorted(kernel.nodes)], [sorted(kernel.outputs)], keep_views=kernel.local)
    return _finish_group(graph, part.groups[0], kernel)


def _finish_group(graph: DataflowGraph, group: Group, kernel: Kernel) -> Group:
    """A group made from ``kernel`` takes its local stages and its master."""
    group.local = sorted(kernel.local)
    anchors = [n for n in group.nodes if _is_anchor(graph[n])]
    group.master = anchors[0] if anchors else -1  # its epilogue runs on its output tiles
    return group


def _to_partition(plan: AutoFusePlan) -> Partition:
    g = plan.graph
    kernels = sorted((k for k in plan.kernels.values() if k.outputs and any(g[n].kind == "op" for n in k.nodes)),
                     key=lambda k: min(k.outputs))  # a kernel nothing reads was inlined everywhere
    part = make_partition(g, [sorted(k.nodes) for k in kernels], [sorted(k.outputs) for k in kernels],
                          keep_views={n for k in kernels for n in k.local})  # a view the rules realized
    by_outputs = {tuple(sorted(k.outputs)): k for k in kernels}
    for group in part.groups:
        _finish_group(g, group, by_outputs[tuple(group.outputs)])
    part.decisions = list(plan.log) + [d for d in part.decisions if d.action == "view"]
    return part


def _is_anchor(node: GraphNode) -> bool:
    return node.opdef is not None and node.opdef.anchor


def _cores(node: GraphNode) -> str | None:
    return node.scope.get(attrs.CORE_SCOPE)


def _static_tensor(ty) -> bool:
    return (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)
            and all(isinstance(d, tirx.IntImm) for d in ty.shape.values))


def _shape(node: GraphNode) -> tuple | None:
    """The node's static shape, None when it has none."""
    ty = node.var.ty
    return tuple(int(d) for d in ty.shape.values) if _static_tensor(ty) else None


def _size(node: GraphNode) -> int:
    ty = node.var.ty
    try:
        size = 1
        for d in ty.shape.values:
            size *= int(d)
        return size
    except (AttributeError, TypeError):
        return 2


def _view_only(box: KernelBox) -> bool:
    """Whether the box's expression only re-indexes memory (no arithmetic to recompute)."""
    expr = box.value.load(tuple(tirx.Var(f"v{d}", "int32") for d in range(box.value.ndim)))
    return all(isinstance(n, (L.Load, L.Const, L.IndexValue)) for n in L.walk(expr))


def _convex(graph: DataflowGraph, nodes: set) -> bool:
    """No path leaves ``nodes`` and comes back (merging them cannot create a cycle)."""
    outside_reach = set()
    for n in sorted(nodes):
        stack = [c for c in graph[n].consumers if c not in nodes]
        while stack:
            c = stack.pop()
            if c in outside_reach:
                continue
            outside_reach.add(c)
            for d in graph[c].consumers:
                if d in nodes:
                    return False
                stack.append(d)
    return True
