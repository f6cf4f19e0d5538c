"""PlanMemory: NNVM's memory planning (nnvm seed, "Memory Allocation") as a Relax pass.

It runs where TVM's ``StaticPlanBlockMemory`` would, right after ``CallTIRRewrite``: every
kernel is then a call in destination-passing style and every value it writes a
``R.builtin.alloc_tensor``. The plan follows the seed:

- reference counts are the number of kernels that read a value; a kernel argument read only
  for its shape (the seed's FIgnoreInputs: ``OpDef.shape_only``, which FuseCompile writes on
  the kernel as ``tvm_ext.shape_only``) holds none;
- graph outputs are never planned (their storage leaves the call);
- in topological order, a kernel first reuses in place the storage of an input it reads last,
  when its ops allow it (``OpDef.inplace``), the sizes fit and the kernel itself is safe in
  place (each output element reads only the same input element, checked on its blocks);
- its other outputs are requested smallest first from a best-fit allocator with
  ``match_range`` m (MXNet's GraphAllocator), then inputs whose count reaches zero are freed,
  and so is an output nothing reads;
- m is swept over 1..16 and the smallest total kept; the blocks are laid end to end in one
  arena. The same in-place decisions are also packed by offset (greedy by size, with a few
  seeded reorderings), which whole blocks cannot always match; the smaller total wins.
- a tensor of a page or more takes whole pages and starts on one (page blocks first), so a
  kernel's buffers sit at the same offsets in their pages (4K aliasing: ``HostBuffer``).

The execution order decides the lower bound. A memory-aware order runs first, of the kernels
whose inputs are ready, the one that frees the most bytes net of what it allocates; when its
liveness bound is below the program order's (the bindings as emitted), the kernels are
reordered that way before planning (the MLP training step under AutoFuse: 1.5 MiB instead of
2.0), otherwise the program order is kept. The report gives the order used and both bounds.

Each static function gets its arena as one ``R.memory.alloc_storage`` (the VM's pooled
allocator hands the same block back on every call) and its tensors at their offsets.
``main`` also gets an entry ``main_planned`` that takes the arena as a workspace tensor and
its outputs as destination tensors, so that a caller (``CompiledModel``) allocates both once
and calls without any allocation; ``main`` itself then allocates them and calls
``main_planned``, so the body and its constants are in the executable once. Functions with
symbolic shapes keep ``StaticPlanBlockMemory``. ``release_registers``, an empty function,
lets that caller drop the VM's references to the last call's tensors.
"""
from __future__ import annotations

import bisect
import math
import random
from dataclasses import dataclass, field, replace

import tvm
import tvm_ffi
from tvm import relax, s_tir, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from tvm_ext import attrs
from tvm_ext.host_memory import ALIGN, PAGE, alignment  # ALIGN: a cache line, TVM's own allocation alignment
from tvm_ext.registry import OPS, OpRegistry
from tvm_ext.report import MemoryReport

PLANNED_ENTRY = "main_planned"
RELEASE = "release_registers"  # an empty function: calling it drops the registers of the last call

_ALLOC = tvm.ir.Op.get("relax.builtin.alloc_tensor")
_ALLOC_STORAGE = tvm.ir.Op.get("relax.memory.alloc_storage")
_VIEW_OPS = frozenset(["relax.reshape", "relax.memory.view", "relax.memory.ensure_zero_offset"])
_VIEW_PACKED = frozenset(["vm.builtin.reshape"])
_PURE_PACKED = tvm.ir.Op.get("relax.call_pure_packed")
_TO_VDEVICE = tvm.ir.Op.get("relax.to_vdevice")


# --------------------------------------------------------------------------- the graph
@dataclass(eq=False)
class Value:
    """One tensor a kernel writes (an ``alloc_tensor`` after CallTIRRewrite)."""

    var: relax.Var
    nbytes: int
    shape: tuple
    dtype: str
    defined: int = -1  # the step that writes it
    readers: list = field(default_factory=list)  # steps that read it (each once)
    output: bool = False  # part of the function's result: never planned
    device: int = 0  # the VM device index it is allocated on (PlaceDevice's VDevice)

    @property
    def size(self) -> int:
        return _round(self.nbytes)


@dataclass(eq=False)
class Step:
    """One call in execution order: a kernel, or another call that reads values."""

    index: int
    kernel: str | None  # the PrimFunc's name, None for other calls
    args: list  # per argument: the set of Values it reaches (empty for inputs, constants)
    reads: list = field(default_factory=list)
    writes: list = field(default_factory=list)
    binding: int = -1  # its binding's position in the function
    after: set = field(default_factory=set)  # steps it must follow (values it reads, results it uses)


@dataclass
class FunctionGraph:
    steps: list[Step]
    values: list[Value]
    outputs: list  # per returned leaf: the set of Values it reaches


def _round(n: int) -> int:
    """``n`` bytes rounded up to whole cache lines, or to whole pages from a page up (where the
    call's buffers start: ``host_memory.alignment``)."""
    return _up(n, alignment(n))


def _up(n: int, step: int) -> int:
    return -(-n // step) * step


def _static_nbytes(ty) -> tuple[tuple, int] | None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = []
    for d in ty.shape.values:
        if not isinstance(d, tirx.IntImm):
            return None
        dims.append(int(d))
    dtype = tvm.DataType(str(ty.dtype))
    return tuple(dims), math.prod(dims) * ((dtype.bits * dtype.lanes + 7) // 8)


class NotPlannable(Exception):
    """The function has a form this planner does not handle (symbolic shapes, control flow)."""


def function_graph(func: relax.Function, mod: tvm.IRModule) -> FunctionGraph:
    """Steps and values of a function after CallTIRRewrite, with the aliases resolved."""
    if not isinstance(func.body, relax.SeqExpr):
        raise NotPlannable("body is not a sequence")
    roots: dict = {}  # var -> frozenset of Values it aliases
    shape_only: dict = {}  # kernel -> its parameters read only for their shape
    tuples: dict = {}  # var bound to a Tuple -> per-field roots
    defined_by: dict = {}  # var -> the steps its value comes from (through views and aliases)
    values, steps = [], []

    def reach(expr) -> frozenset:
        if isinstance(expr, relax.Var):
            return roots.get(expr, frozenset())
        if isinstance(expr, relax.Tuple):
            return frozenset().union(*[reach(f) for f in expr.fields])
        return frozenset()

    position = -1
    for block in func.body.blocks:
        if isinstance(block, relax.DataflowBlock):
            raise NotPlannable("a dataflow block is left")
        for b in block.bindings:
            if not isinstance(b, relax.VarBinding):
                raise NotPlannable("a match_cast binding")
            position += 1
            uses = set().union(*(defined_by[u] for u in relax.analysis.free_vars(b.value) if u in defined_by))
            defined_by[b.var] = frozenset(uses)
            v = b.value
            if isinstance(v, relax.Call) and v.op.same_as(_ALLOC):
                static = _static_nbytes(b.var.ty)
                if static is None:
                    raise NotPlannable(f"'{b.var.name}' has a symbolic shape")
                device = int(v.args[2].value) if isinstance(v.args[2], tirx.IntImm) else 0
                val = Value(b.var, static[1], static[0], str(b.var.ty.dtype), device=int(device))
                values.append(val)
                roots[b.var] = frozenset([val])
            elif isinstance(v, relax.Var):
                roots[b.var] = reach(v)
                if v in tuples:
                    tuples[b.var] = tuples[v]
            elif isinstance(v, relax.Tuple):
                tuples[b.var] = [reach(f) for f in v.fields]
                roots[b.var] = reach(v)
            elif isinstance(v, relax.TupleGetItem):
                fields = tuples.get(v.tuple_value)
                roots[b.var] = fields[v.index] if fields is not None else reach(v.tuple_value)
            elif isinstance(v, relax.Call):
                view = (isinstance(v.op, tvm.ir.Op) and v.op.name in _VIEW_OPS) or (
                    v.op.same_as(_PURE_PACKED) and isinstance(v.args[0], relax.ExternFunc)
                    and str(v.args[0].global_symbol) in _VIEW_PACKED)
                args = list(v.args[1:]) if v.op.same_as(_PURE_PACKED) else list(v.args)
                if view:
                    roots[b.var] = reach(args[0])
                    continue
                kernel = v.op.name_hint if isinstance(v.op, tvm.ir.GlobalVar) and isinstance(
                    mod[v.op], tirx.PrimFunc) else None
                if kernel is not None and kernel not in shape_only:
                    shape_only[kernel] = shape_only_params(mod[v.op])
                ignored = shape_only.get(kernel, set())
                step = Step(len(steps), kernel, [frozenset() if i in ignored else reach(a)
                                                 for i, a in enumerate(args)], binding=position, after=set(uses))
                defined_by[b.var] = frozenset([step.index])
                for vals in step.args:
                    for val in vals:
                        if val.defined < 0:
                            val.defined = step.index
                            step.writes.append(val)
                        elif val not in step.reads and val not in step.writes:
                            step.reads.append(val)
                steps.append(step)
                # a call we do not know may return an alias of what it reads; a copy between
                # devices (PlaceDevice's to_vdevice) returns fresh memory
                fresh = kernel is not None or (isinstance(v.op, tvm.ir.Op) and v.op.same_as(_TO_VDEVICE))
                roots[b.var] = frozenset() if fresh else frozenset().union(*step.args)
            elif isinstance(v, relax.If):
                raise NotPlannable("control flow")
            else:
                roots[b.var] = frozenset()
    result = func.body.body
    leaves = [reach(f) for f in result.fields] if isinstance(result, relax.Tuple) else (
        [frozenset(x) for x in tuples[result]] if result in tuples else [reach(result)])
    for leaf in leaves:
        for val in leaf:
            val.output = True
    for step in steps:
        for val in step.reads:
            val.readers.append(step.index)
            step.after.add(val.defined)
    return FunctionGraph(steps, [v for v in values if v.defined >= 0], leaves)


# --------------------------------------------------------------------------- kernel facts
def _sblocks(func: tirx.PrimFunc) -> list:
    found = []
    tvm_ffi.structural_walk(func.body, (s_tir.SBlock, lambda blk: found.append(blk)))
    return [b for b in found if b.iter_vars or b.reads or b.writes]


def shape_only_params(func: tirx.PrimFunc) -> set[int]:
    """Arguments a kernel reads only for their shape (the seed's FIgnoreInputs): what FuseCompile
    wrote from the ops' ``OpDef.shape_only`` (``tvm_ext.shape_only``); for a kernel TVM's
    legalization made, which carries no op facts, the parameters none of its blocks touch."""
    if attrs.SHAPE_ONLY in func.attrs:
        return {int(i) for i in func.attrs[attrs.SHAPE_ONLY]}
    return unread_params(func)


def unread_params(func: tirx.PrimFunc) -> set[int]:
    """Parameters no block reads or writes (only their shape was used): FIgnoreInputs, read off
    the kernel, since a fused kernel's arguments are no longer one op's."""
    blocks = _sblocks(func)
    if not blocks:
        return set()
    touched = [r.source for b in blocks for r in (*b.reads, *b.writes)]
    return {i for i, p in enumerate(func.params)
            if isinstance(p.ty, tirx.BufferType) and not any(p.same_as(t) for t in touched)}


def safe_in_place(func: tirx.PrimFunc, src: int, dst: int) -> bool:
    """Whether ``dst`` may be written into ``src``'s memory: one block reads ``src``, at exactly
    the one element it writes of ``dst``, and nothing else touches either."""
    a, b = func.params[src], func.params[dst]
    if not (isinstance(a.ty, tirx.BufferType) and isinstance(b.ty, tirx.BufferType)):
        return False
    if not tvm_ffi.structural_equal(list(a.ty.shape), list(b.ty.shape)):
        return False
    if tvm.DataType(str(a.ty.dtype)).bits != tvm.DataType(str(b.ty.dtype)).bits:
        return False
    blocks = _sblocks(func)
    readers = [blk for blk in blocks if any(r.source.same_as(a) for r in blk.reads)]
    writers = [blk for blk in blocks if any(w.source.same_as(b) for w in blk.writes)]
    if len(readers) != 1 or len(writers) != 1 or not readers[0].same_as(writers[0]):
        return False
    if any(w.source.same_as(a) for blk in blocks for w in blk.writes):
        return False
    if any(r.source.same_as(b) for blk in blocks for r in blk.reads):
        return False
    blk = readers[0]
    read = [r.region for r in blk.reads if r.source.same_as(a)]
    write = [w.region for w in blk.writes if w.source.same_as(b)]
    if len(read) != 1 or len(write) != 1:
        return False
    if not all(isinstance(r.extent, tirx.IntImm) and int(r.extent) == 1 for r in read[0]):
        return False
    return tvm_ffi.structural_equal([r.min for r in read[0]], [w.min for w in write[0]])


def kernel_allows_in_place(func: tirx.PrimFunc, registry: OpRegistry) -> bool:
    """Every op of our kernel declares an in-place pair (views re-index and are checked with
    the kernel), or TVM marked its kernel elementwise or broadcast."""
    if func.attrs is not None and attrs.OPS in func.attrs:
        defs = [registry.get("relax." + o) for o in str(func.attrs[attrs.OPS]).split(",") if o]
        return bool(defs) and all(d is not None and (d.inplace or d.view) for d in defs) and \
            any(d.inplace for d in defs)
    pattern = func.attrs.get("op_pattern") if func.attrs is not None else None
    return pattern is not None and int(pattern) <= 1


# --------------------------------------------------------------------------- the allocator
class BestFit:
    """MXNet's GraphAllocator: free blocks by size, searched in [size/m, size*m]; larger
    blocks first, then the largest smaller one, enlarged."""

    def __init__(self, match_range: int):
        self.m = match_range
        self.sizes: list[int] = []  # block id -> size
        self._free: list[tuple[int, int]] = []  # sorted (size, block id)

    def request(self, size: int) -> int:
        lo = bisect.bisect_left(self._free, (size // self.m, -1))
        mid = bisect.bisect_left(self._free, (size, -1))
        hi = bisect.bisect_right(self._free, (size * self.m, math.inf))
        if mid < hi:
            _, block = self._free.pop(mid)
            return block
        if mid > lo:
            _, block = self._free.pop(mid - 1)
            self.sizes[block] = max(self.sizes[block], size)
            return block
        self.sizes.append(size)
        return len(self.sizes) - 1

    def release(self, block: int) -> None:
        bisect.insort(self._free, (self.sizes[block], block))

    @property
    def total(self) -> int:
        return sum(self.sizes)


@dataclass
class Plan:
    """Where each planned value lives: its byte offset in one arena of ``total`` bytes."""

    offset_of: dict  # Value -> byte offset
    total: int
    inplace: int
    allocator: str  # "best-fit" (the seed's, blocks laid end to end) or "offsets"
    match_range: int = 0
    storages: int = 0  # blocks (best-fit) or in-place chains (offsets)
    per_device: dict = field(default_factory=dict)  # VM device index -> bytes of its arena


def in_place_pairs(graph: FunctionGraph, in_place_ok) -> dict:
    """``{output: input}`` for every in-place reuse the seed's conditions allow: the kernel is
    the input's last reader, the input is planned (neither a graph input, a parameter nor an
    output), the output is not yet placed and fits, and ``in_place_ok`` (ops and kernel) agrees.
    One input goes to one output: two outputs written over one input would clobber each other."""
    refs = {v: len(v.readers) for v in graph.values}
    pairs: dict = {}
    for step in graph.steps:
        taken: set = set()
        for out in step.writes:
            if out.output:
                continue
            for src in step.reads:
                if (refs[src] == 1 and not src.output and src not in taken and src.size >= out.size
                        and in_place_ok(step, src, out)):
                    pairs[out] = src
                    taken.add(src)
                    break
        for src in step.reads:
            refs[src] -= 1
    return pairs


def plan_graph(graph: FunctionGraph, pairs: dict, match_range: int) -> Plan:
    """The seed's topological traversal with MXNet's best-fit allocator; blocks end to end."""
    alloc = BestFit(match_range)
    refs = {v: len(v.readers) for v in graph.values}
    block_of: dict = {}
    for step in graph.steps:
        pending = []
        for out in step.writes:
            if out.output or out in block_of:
                continue
            if out in pairs:
                block_of[out] = block_of[pairs[out]]
            else:
                pending.append(out)
        for out in sorted(pending, key=lambda v: v.size):
            block_of[out] = alloc.request(out.size)
        donated = {pairs[o] for o in step.writes if o in pairs}
        for src in step.reads:
            refs[src] -= 1
            if refs[src] == 0 and src in block_of and src not in donated:
                alloc.release(block_of[src])
        for out in step.writes:
            if not out.output and refs[out] == 0 and out in block_of:
                alloc.release(block_of[out])
    starts, at = {}, 0
    for b in sorted(range(len(alloc.sizes)), key=lambda b: alloc.sizes[b] < PAGE):  # whole pages first
        starts[b] = at
        at += alloc.sizes[b]
    return Plan({v: starts[b] for v, b in block_of.items()}, alloc.total, len(pairs), "best-fit", match_range,
                len(alloc.sizes))


def _chains(graph: FunctionGraph, pairs: dict) -> tuple[dict, dict]:
    """Each planned value's chain head (in-place values share one), and each chain's
    (first step, last step, bytes)."""
    chain_of: dict = {}
    for v in sorted((v for v in graph.values if not v.output), key=lambda v: v.defined):
        chain_of[v] = chain_of[pairs[v]] if v in pairs else v
    spans: dict = {}
    for v, head in chain_of.items():
        first, last, size = spans.get(head, (v.defined, v.defined, 0))
        spans[head] = (min(first, v.defined), max(last, max(v.readers, default=v.defined)), max(size, v.size))
    return chain_of, spans


def _place(order: list, spans: dict) -> tuple[dict, int]:
    """Each chain, in ``order``, in the smallest gap left by the chains it overlaps in time."""
    placed: list = []  # (offset, size, first, last)
    offset_of: dict = {}
    for head in order:
        first, last, size = spans[head]
        step = alignment(size)
        busy = sorted((o, s) for o, s, f, l in placed if f <= last and first <= l)
        best, at = None, 0
        for o, s in busy:
            start = _up(at, step)
            if o - start >= size and (best is None or o - start < best[1]):
                best = (start, o - start)
            at = max(at, o + s)
        offset = best[0] if best is not None else _up(at, step)
        placed.append((offset, size, first, last))
        offset_of[head] = offset
    return offset_of, max((o + s for o, s, _, _ in placed), default=0)


def pack_offsets(graph: FunctionGraph, pairs: dict, tries: int = 64, seed: int = 0) -> Plan:
    """Offsets in one arena. Each chain of in-place values is an interval of time and bytes;
    greedy by size (Pisarchyk and Lee, 2020) places the largest first, each in the smallest
    gap left by the intervals it overlaps in time. Greedy orders can miss a packing at the
    liveness bound, so orders with sizes kept in front and ties shuffled are tried too
    (``tries``, seeded, deterministic), stopping early at the bound."""
    chain_of, spans = _chains(graph, pairs)
    bound = peak_bytes(spans.values())
    heads = sorted(spans, key=lambda h: (-spans[h][2], spans[h][0]))
    best = _place(heads, spans)
    rng = random.Random(seed)
    for _ in range(tries if best[1] > bound else 0):
        keys = {h: (-spans[h][2] * rng.uniform(0.5, 1.5), rng.random()) for h in heads}
        trial = _place(sorted(heads, key=keys.__getitem__), spans)
        if trial[1] < best[1]:
            best = trial
            if best[1] <= bound:
                break
    offsets, total = best
    return Plan({v: offsets[h] for v, h in chain_of.items()}, total, len(pairs), "offsets", 0, len(spans))


def peak_bytes(intervals) -> int:
    """The largest sum of ``size`` over the ``(first, last, size)`` intervals live at one step."""
    live: dict = {}
    for first, last, size in intervals:
        for i in range(first, last + 1):
            live[i] = live.get(i, 0) + size
    return max(live.values(), default=0)


def best_plan(graph: FunctionGraph, in_place_ok, ranges=range(1, 17)) -> Plan:
    """The smallest total: the seed's best-fit over match ranges 1..16 (as MXNet sweeps them),
    and, when it does better, the same in-place decisions packed by offset."""
    pairs = in_place_pairs(graph, in_place_ok)
    plans = [plan_graph(graph, pairs, m) for m in ranges]
    seed = min(plans, key=lambda p: (p.total, p.match_range))
    packed = pack_offsets(graph, pairs)
    return packed if packed.total < seed.total else seed


def plan_devices(graph: FunctionGraph, in_place_ok) -> Plan:
    """``best_plan`` for each device's values apart, each in an arena of its own: no value of
    one device is ever placed in, or written in place over, another's memory."""
    devices = sorted({v.device for v in graph.values}) or [0]
    plans = {d: best_plan(_on_device(graph, d), in_place_ok) for d in devices}
    if len(plans) == 1:
        plan = plans[devices[0]]
        plan.per_device = {devices[0]: plan.total}
        return plan
    first = plans[devices[0]]
    return Plan({v: o for p in plans.values() for v, o in p.offset_of.items()}, sum(p.total for p in plans.values()),
                sum(p.inplace for p in plans.values()), "/".join(sorted({p.allocator for p in plans.values()})),
                first.match_range, sum(p.storages for p in plans.values()), {d: p.total for d, p in plans.items()})


def _on_device(graph: FunctionGraph, device: int) -> FunctionGraph:
    keep = {v for v in graph.values if v.device == device}
    steps = [replace(s, reads=[v for v in s.reads if v in keep], writes=[v for v in s.writes if v in keep])
             for s in graph.steps]
    return FunctionGraph(steps, [v for v in graph.values if v in keep], graph.outputs)


def lower_bound(graph: FunctionGraph, order: list[int] | None = None) -> int:
    """Largest sum of live planned bytes over the steps (a value lives from its write to its
    last read), in program order or in ``order`` (step indices, a topological order)."""
    at = {step: i for i, step in enumerate(order)} if order is not None else {s.index: s.index for s in graph.steps}
    return peak_bytes((at[v.defined], max((at[r] for r in v.readers), default=at[v.defined]), v.size)
                      for v in graph.values if not v.output)


def memory_aware_order(graph: FunctionGraph) -> list[int]:
    """A topological order that runs first, among the steps whose inputs are ready, the one
    that frees the most bytes net of what it allocates (ties: program order)."""
    deps = {s.index: s.after for s in graph.steps}
    remaining = {v: len(v.readers) for v in graph.values}
    done: set = set()
    order: list[int] = []
    while len(order) < len(graph.steps):
        ready = [s for s in graph.steps if s.index not in done and deps[s.index] <= done]

        def gain(step: Step) -> int:
            freed = sum(v.size for v in step.reads if remaining[v] == 1 and not v.output)
            return freed - sum(v.size for v in step.writes if not v.output)
        step = max(ready, key=lambda s: (gain(s), -s.index))
        done.add(step.index)
        order.append(step.index)
        for v in step.reads:
            remaining[v] -= 1
    return order


def in_place_rule(mod: tvm.IRModule, registry: OpRegistry = OPS):
    """``ok(step, src, dst)``: may the kernel of ``step`` write ``dst`` over ``src``?"""
    allowed: dict = {}
    safe: dict = {}

    def ok(step: Step, src: Value, dst: Value) -> bool:
        if step.kernel is None:
            return False
        if step.kernel not in allowed:
            allowed[step.kernel] = kernel_allows_in_place(mod[step.kernel], registry)
        if not allowed[step.kernel]:
            return False
        src_at = [i for i, vals in enumerate(step.args) if src in vals]
        dst_at = [i for i, vals in enumerate(step.args) if dst in vals]
        if len(src_at) != 1 or len(dst_at) != 1:
            return False
        key = (step.kernel, src_at[0], dst_at[0])
        if key not in safe:
            safe[key] = safe_in_place(mod[step.kernel], src_at[0], dst_at[0])
        return safe[key]
    return ok


def reordered(func: relax.Function, graph: FunctionGraph, order: list[int]) -> relax.Function:
    """``func`` with its kernel calls in ``order``; every other binding is moved just before
    its first user, so allocations sit right before the kernel that writes them."""
    bindings = [b for block in func.body.blocks for b in block.bindings]
    index = {b.var: i for i, b in enumerate(bindings)}
    uses = [[index[v] for v in relax.analysis.free_vars(b.value) if v in index] for b in bindings]
    emitted: set = set()
    out: list = []

    def emit(i: int) -> None:
        if i in emitted:
            return
        for j in uses[i]:
            emit(j)
        emitted.add(i)
        out.append(bindings[i])
    for step in order:
        emit(graph.steps[step].binding)
    for i in range(len(bindings)):
        emit(i)
    body = relax.SeqExpr([relax.BindingBlock(out)], func.body.body)
    return relax.Function(func.params, body, func.ret_ty, func.is_pure, func.attrs)


def plan_function(mod: tvm.IRModule, name: str = "main", registry: OpRegistry = OPS
                  ) -> tuple[relax.Function, FunctionGraph, Plan, int]:
    """The function to emit (its kernels reordered when a memory-aware order lowers the
    liveness bound), its graph and best plan, and the program order's bound."""
    func = mod[name]
    graph = function_graph(func, mod)
    program_bound = lower_bound(graph)
    if all(s.kernel is not None for s in graph.steps) and len(func.body.blocks) == 1:
        order = memory_aware_order(graph)
        if lower_bound(graph, order) < program_bound:
            func = reordered(func, graph, order)
            graph = function_graph(func, mod)
    return func, graph, plan_devices(graph, in_place_rule(mod, registry)), program_bound


# --------------------------------------------------------------------------- emission
@mutator
class _EmitPlan(PyExprMutator):
    """Replaces each planned ``alloc_tensor`` by a tensor at its offset of one arena (the
    ``workspace`` parameter, or one ``alloc_storage``), and each output by ``outputs``."""

    def __init__(self, mod, plan: Plan, values: dict, workspace: relax.Var | None, outputs: dict):
        super().__init__(mod)
        self.plan, self.values, self.workspace, self.outputs = plan, values, workspace, outputs
        self.storage: dict[int, relax.Var] = {}  # device index -> its arena

    def visit_var_binding_(self, binding: relax.VarBinding) -> None:
        val = self.values.get(binding.var)
        if val is None:
            return super().visit_var_binding_(binding)
        if val in self.outputs:
            self.set_var_remap(binding.var, self.outputs[val])
            return None
        if val not in self.plan.offset_of:
            return super().visit_var_binding_(binding)
        offset = self.plan.offset_of[val]
        shape, dtype = relax.ShapeExpr([tirx.IntImm("int64", d) for d in val.shape]), val.dtype
        if self.workspace is not None:
            tensor = self.builder_.emit(relax.op.memory.view(self.workspace, shape, dtype, offset),
                                        binding.var.name + "_at")
        else:
            if val.device not in self.storage:
                size = self.plan.per_device.get(val.device, self.plan.total)
                self.storage[val.device] = self.builder_.emit(relax.op.memory.alloc_storage(
                    relax.ShapeExpr([size]), val.device, "global", "uint8"), "arena")
            tensor = self.builder_.emit(relax.op.memory.alloc_tensor(self.storage[val.device], offset, shape, dtype),
                                        binding.var.name + "_at")
        # TVM's kernels take no byte_offset; on the CPU this re-bases the pointer instead
        self.set_var_remap(binding.var, self.builder_.emit(relax.op.memory.ensure_zero_offset(tensor),
                                                           binding.var.name))
        return None


@dataclass
class PlannedEntry:
    """The calling convention of ``main_planned``: inputs, then the workspace, then destinations."""

    workspace_bytes: int
    outputs: list[tuple[tuple, str]]  # shape, dtype of each destination parameter
    returned: list[int | None]  # per returned leaf: the destination it lives in, None = copy it

    def to_dict(self) -> dict:
        return {"workspace_bytes": self.workspace_bytes, "outputs": [[list(s), d] for s, d in self.outputs],
                "returned": self.returned}

    @classmethod
    def from_dict(cls, d: dict) -> "PlannedEntry":
        return cls(int(d["workspace_bytes"]), [(tuple(s), str(t)) for s, t in d["outputs"]], list(d["returned"]))


@tvm.transform.module_pass(opt_level=0, name="PlanMemory")
class PlanMemory:
    """NNVM's memory planning in place of StaticPlanBlockMemory (see the module docstring).

    After it ran, ``reports`` holds a ``MemoryReport`` per planned function and ``entry`` the
    calling convention of ``main_planned`` (None when ``main`` could not be planned).
    """

    def __init__(self, registry: OpRegistry = OPS, planned_entry: bool = True):
        self.registry = registry
        self.planned_entry = planned_entry
        self.reports: dict[str, MemoryReport] = {}
        self.entry: PlannedEntry | None = None
        self.skipped: dict[str, str] = {}

    def transform_module(self, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> tvm.IRModule:
        static = relax.transform.StaticPlanBlockMemory()(mod)
        out = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
        for gv, func in mod.functions_items():
            if not isinstance(func, relax.Function):
                continue
            try:
                func, graph, plan, program_bound = plan_function(mod, gv.name_hint, self.registry)
            except NotPlannable as why:
                self.skipped[gv.name_hint] = str(why)
                out[gv] = static[gv.name_hint]
                continue
            bound = lower_bound(graph) if len(plan.per_device) <= 1 else sum(  # one arena per device
                lower_bound(_on_device(graph, d)) for d in plan.per_device)
            self.reports[gv.name_hint] = MemoryReport(
                plan.total, sum(v.size for v in graph.values if not v.output),
                _storage_bytes(static[gv.name_hint]), bound, plan.inplace, plan.allocator,
                plan.match_range, plan.storages, program_bound,
                "memory-aware (the ready kernel that frees the most first)" if lower_bound(graph) < program_bound
                else "program order (bindings as emitted, topological)",
                {_device_name(mod, d): n for d, n in plan.per_device.items()} if _several_devices(mod) else {})
            values = {v.var: v for v in graph.values}
            if gv.name_hint == "main" and self.planned_entry and not _several_devices(mod):
                planned = self._planned_entry(mod, func, graph, plan, values)
                planned_gv, out[gv] = _calling_planned_entry(func, planned, self.entry)
                out[planned_gv] = planned
            else:
                out[gv] = self._emit(mod, func, plan, values, None, {})
        if self.planned_entry:
            out[RELEASE] = _empty_function()
        return out

    @staticmethod
    def _emit(mod, func, plan, values, workspace, outputs, params=None) -> relax.Function:
        emitter = _EmitPlan(mod, plan, values, workspace, outputs)
        new = emitter.visit_expr(func)
        if params is None:
            return new
        return relax.Function(list(func.params) + params, new.body, func.ret_ty, func.is_pure,
                              func.attrs)

    def _planned_entry(self, mod, func, graph: FunctionGraph, plan: Plan, values: dict) -> relax.Function:
        workspace = relax.Var("workspace", relax.TensorType([max(plan.total, ALIGN)], "uint8"))
        dests: dict = {}
        for leaf in graph.outputs:
            for val in sorted(leaf, key=lambda v: v.defined):
                if val not in dests:
                    dests[val] = relax.Var(f"out{len(dests)}", relax.TensorType(val.shape, val.dtype))
        order = list(dests)
        returned = [order.index(next(iter(leaf))) if len(leaf) == 1 else None for leaf in graph.outputs]
        self.entry = PlannedEntry(max(plan.total, ALIGN), [(v.shape, v.dtype) for v in order], returned)
        new = self._emit(mod, func, plan, values, workspace, dests, [workspace, *dests.values()])
        return new.with_attr("global_symbol", PLANNED_ENTRY) if new.attrs is not None and \
            "global_symbol" in new.attrs else new


def _calling_planned_entry(func: relax.Function, planned: relax.Function, entry: PlannedEntry
                           ) -> tuple[tvm.ir.GlobalVar, relax.Function]:
    """``main`` as a call of ``main_planned`` on a workspace and destinations of its own (and
    the GlobalVar it calls): the same results, and the body (with its constants) only once in
    the executable. The VM's code generation hashes each constant at each use (the 16 MB
    weight of a 2048^2 matmul: 9 ms a use)."""
    params = [relax.Var(p.name, p.ty) for p in func.params]
    bb = relax.BlockBuilder()
    planned_gv = bb.add_func(planned, PLANNED_ENTRY)
    attrs = dict(func.attrs) if func.attrs is not None else None
    with bb.function("main", params, attrs=attrs, pure=func.is_pure):
        workspace = bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr([entry.workspace_bytes]), "uint8", 0),
                            "workspace")
        dests = [bb.emit(relax.op.builtin.alloc_tensor(relax.ShapeExpr(list(shape)), dtype, 0), f"out{i}")
                 for i, (shape, dtype) in enumerate(entry.outputs)]
        result = bb.emit(relax.Call(planned_gv, [*params, workspace, *dests]), "result")
        bb.emit_func_output(result)
    return planned_gv, bb.get()["main"]


def _several_devices(mod: tvm.IRModule) -> bool:
    """Whether the module is placed on several devices (its caller-allocated workspace and
    destinations would then have to live on each): such a module is called through ``main``."""
    infos = mod.global_infos.get("vdevice", []) if mod.global_infos is not None else []
    return len(infos) > 1


def _device_name(mod: tvm.IRModule, index: int) -> str:
    names = mod.attrs.get(attrs.DEVICES) if mod.attrs is not None else None
    return str(names[index]) if names is not None and index < len(names) else f"device {index}"


def _empty_function() -> relax.Function:
    """The VM keeps a finished call's frame, registers and all, for the next call to reuse: the
    arguments and results of the last call stay referenced (so a caller's output buffer would
    not come free when the caller drops it). Running this function, which has no registers,
    over that frame releases them."""
    return relax.Function([], relax.Tuple([]), relax.TupleType([]), is_pure=False,
                          attrs=tvm.ir.make_node("ir.DictAttrs", **{"relax.force_pure": True}))


def _storage_bytes(func: relax.Function) -> int | None:
    sizes = []

    def visit(e):
        if isinstance(e, relax.Call) and e.op.same_as(_ALLOC_STORAGE):
            dims = e.args[0].values
            sizes.append(int(dims[0]) if isinstance(dims[0], tirx.IntImm) else None)
    relax.analysis.post_order_visit(func, visit)
    return None if None in sizes else sum(sizes)
