"""An analysis view of one Relax dataflow block: nodes, edges, patterns, lowerability.

Partitioners read this instead of walking Relax themselves. A node is one binding; its
inputs are the bindings of the same block it reads, its consumers the bindings that read
it. Nothing here rewrites the IR.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import tvm
from tvm import relax

from relay_passes.tvm_op_pattern import tvm_op_pattern
from tvm_ext import attrs
from tvm_ext.errors import InputError
from tvm_ext.loop_ir import SUPPORTED_DTYPES
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OPS, OpDef, OpRegistry


@dataclass
class GraphNode:
    """One binding of the block."""

    index: int
    var: relax.Var
    value: relax.Expr
    kind: str  # "op" (a Relax op call), "get_item" (field of a multi-output op), "other"
    op: str | None = None
    opdef: OpDef | None = None
    pattern: OpPattern = OpPattern.OPAQUE
    inputs: list[int] = field(default_factory=list)
    consumers: list[int] = field(default_factory=list)
    is_output: bool = False  # read after the block (a non-dataflow var)
    device: str | None = None  # device label: its ctx_group, else its VDevice; None = any
    scope: dict = field(default_factory=dict)  # its scope attributes (attrs.SCOPE_KEYS): AutoFuse's scopes
    control: bool = False  # it has control edges in or out (NNVM's control_deps)
    lowerable: bool = False
    why_not: str = ""  # why our lowering cannot take it (for the report)

    @property
    def name(self) -> str:
        return self.var.name

    @property
    def is_view(self) -> bool:
        return self.opdef is not None and self.opdef.view

    @property
    def fusion_pattern(self) -> OpPattern:
        """The pattern fusion may use: a node we cannot lower is a kernel of its own, so it
        is Opaque to its neighbours whatever ``pattern`` (ours or TVM's) says."""
        return self.pattern if self.lowerable else OpPattern.OPAQUE

    def __repr__(self) -> str:
        return f"%{self.index}:{self.name}={self.op or self.kind}"


@dataclass
class Labels:
    """What a function's attributes say about its bindings, by binding name: device groups
    (``tvm_ext.ctx_group``), scope attributes (``tvm_ext.scopes``) and control edges."""

    ctx_groups: dict = field(default_factory=dict)
    scopes: dict = field(default_factory=dict)
    control: set = field(default_factory=set)  # bindings with control edges in or out

    @classmethod
    def of(cls, func: relax.Function) -> Labels:
        fa = func.attrs if func.attrs is not None else {}
        groups = {str(k): str(v) for k, v in fa[attrs.CTX_GROUP].items()} if attrs.CTX_GROUP in fa else {}
        scopes = ({str(k): {str(a): str(b) for a, b in v.items()} for k, v in fa[attrs.SCOPES].items()}
                  if attrs.SCOPES in fa else {})
        for name, scope in scopes.items():
            cores = scope.get(attrs.CORE_SCOPE)
            if cores is not None and not (cores.isdigit() and int(cores) > 0):
                raise InputError(f"node '{name}' has {attrs.CORE_SCOPE}={cores!r}; it must be a positive number of "
                                 f"cores, e.g. sym.AttrScope({attrs.CORE_SCOPE}='1')")
        control = set()
        if attrs.CONTROL_DEPS in fa:
            for k, deps in fa[attrs.CONTROL_DEPS].items():
                control |= {str(k)} | {str(d) for d in deps}
        return cls(groups, scopes, control)


class DataflowGraph:
    """Nodes of a dataflow block in program (topological) order."""

    def __init__(self, block: relax.DataflowBlock, registry: OpRegistry = OPS, labels: Labels | None = None):
        self.block = block
        self.nodes: list[GraphNode] = []
        self.index_of: dict[relax.Var, int] = {}  # a binding's variable -> its node
        index_of = self.index_of
        labels = labels or Labels()
        for i, binding in enumerate(block.bindings):
            node = _make_node(i, binding, registry)
            for v in relax.analysis.free_vars(binding.value):
                if v in index_of and index_of[v] not in node.inputs:
                    node.inputs.append(index_of[v])
            node.is_output = not isinstance(binding.var, relax.DataflowVar)
            vdevice = getattr(binding.var.ty, "vdevice", None)
            node.device = labels.ctx_groups.get(node.name) or (None if vdevice is None else str(vdevice))
            node.scope = labels.scopes.get(node.name, {})
            node.control = node.name in labels.control
            index_of[binding.var] = i
            self.nodes.append(node)
        for node in self.nodes:
            for j in node.inputs:
                self.nodes[j].consumers.append(node.index)
        self._attach_get_items()

    def _attach_get_items(self) -> None:
        """A multi-output op is lowerable only if every reader takes a field of it."""
        for node in self.nodes:
            if node.kind == "get_item":
                src = self.nodes[node.inputs[0]] if node.inputs else None
                node.lowerable = src is not None and src.lowerable
                node.pattern = src.pattern if src is not None else OpPattern.OPAQUE
            if node.kind == "op" and isinstance(node.var.ty, relax.TupleType):
                readers = [self.nodes[c] for c in node.consumers]
                if node.is_output or any(r.kind != "get_item" for r in readers):
                    node.lowerable = False
                    node.why_not = node.why_not or "tuple result used whole"
                    for r in readers:
                        if r.kind == "get_item":
                            r.lowerable = False

    def op_inputs(self, node: GraphNode) -> list[int]:
        """Producers of ``node``, looking through field reads to the multi-output op."""
        out = []
        for i in node.inputs:
            src = self.nodes[i]
            j = src.inputs[0] if src.kind == "get_item" and src.inputs else i
            if j not in out:
                out.append(j)
        return out

    def op_readers(self, node: GraphNode) -> list[int]:
        """Readers of ``node``, looking through its field reads to who reads the fields."""
        out = []
        for c in node.consumers:
            reader = self.nodes[c]
            for r in (reader.consumers if reader.kind == "get_item" else [c]):
                if r not in out:
                    out.append(r)
        return out

    def escapes(self, node: GraphNode) -> bool:
        """Whether ``node`` (or a field of it) is read after the block."""
        return node.is_output or any(self.nodes[c].is_output for c in node.consumers
                                     if self.nodes[c].kind == "get_item")

    def __iter__(self):
        return iter(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i: int) -> GraphNode:
        return self.nodes[i]


def _make_node(i: int, binding: relax.Binding, registry: OpRegistry) -> GraphNode:
    value = binding.value if isinstance(binding, relax.VarBinding) else None
    if isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        opdef = registry.get(value.op.name)
        node = GraphNode(i, binding.var, value, "op", value.op.name, opdef)
        if opdef is None:
            node.why_not = "a copy between devices (PlaceDevice)" if value.op.name == "relax.to_vdevice" else \
                "no lowering registered"
            node.pattern = tvm_op_pattern(value)
            return node
        node.pattern = opdef.pattern_of(value)
        problem = _type_problem(binding.var.ty) or next(
            (p for p in (_type_problem(a.ty) for a in _tensor_args(value)) if p), "")
        node.lowerable = opdef.lower is not None and not problem
        node.why_not = problem if problem else ("" if opdef.lower else "no lowering registered")
        return node
    if isinstance(value, relax.TupleGetItem):
        return GraphNode(i, binding.var, value, "get_item")
    return GraphNode(i, binding.var, binding.value, "other", why_not="not an op call")


def _tensor_args(call: relax.Call):
    for a in call.args:
        if isinstance(a, relax.Tuple):
            yield from a.fields
        elif isinstance(a, (relax.Var, tvm.ir.GenericConst)):
            yield a


def _type_problem(ty) -> str:
    """Why a value of this type cannot be lowered by us ('' if it can)."""
    if isinstance(ty, relax.TupleType):
        return next((p for p in (_type_problem(f) for f in ty.fields) if p), "")
    if isinstance(ty, (tvm.ir.PrimType, relax.ShapeType)):
        return ""
    if not isinstance(ty, relax.TensorType):
        return f"value of type {type(ty).__name__}"
    if ty.shape is None or not isinstance(ty.shape, relax.ShapeExpr):
        return "unknown shape"
    if any(not isinstance(d, tvm.tirx.IntImm) for d in ty.shape.values):
        return "symbolic shape"
    if str(ty.dtype) not in SUPPORTED_DTYPES:
        return f"dtype {ty.dtype}"
    return ""
