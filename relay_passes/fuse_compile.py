"""FuseCompile: each grouped function becomes ONE PrimFunc built from TE compute.

For every ``Primitive`` function made by ``MakeGroups``, the bindings are lowered one by
one through the op registry into Loop IR (composed: a consumer inlines its producers'
expressions; reductions become kernel-local stages), translated to TE, and turned into a
single PrimFunc. The caller's call to the group becomes ``R.call_tir`` of that PrimFunc.

A group our lowering cannot take (``NotLowerable``: an attribute, dtype or shape it does
not handle) is inlined back into its caller, so TVM's LegalizeOps gives its ops their own
kernels: every model TVM compiles still compiles here.

Groups whose kernels differ only in their names (a model's repeated layers) share one
PrimFunc: it is scheduled and compiled once and called from each place. A group that differs
from one lowered before only in names and in the contents of the constants its kernel takes
as arguments is not lowered again (``_Lowerings``).
"""
from __future__ import annotations

import functools
import warnings
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from relay_passes.simplify import constant_data
from relay_passes.substitute import substitute
from relay_passes.lower_call import lower_call, static_type
from tvm_ext import attrs
from tvm_ext import loop_ir as L
from tvm_ext.errors import NotLowerable
from tvm_ext.lowering import KernelBuilder, Stage, TensorValue
from tvm_ext.registry import OPS, OpRegistry


@dataclass
class LoweredGroup:
    prim_func: tirx.PrimFunc  # carries the ops, pattern and Loop IR as attributes
    const_args: list  # constants read as buffers, appended to the call's arguments
    out_types: list[relax.TensorType]


# A kernel stage whose TIR, Lets substituted, would exceed this many nodes has its inputs
# realized as kernel-local stages first (``inlined_size``): TVM's analyzer walks that tree in
# several passes and in codegen, 15-20 us a node each, so nested fast-math forms (Mish's tanh
# of a log: 1.2e6 nodes) took minutes to compile; log(exp(x) + 1), 8e4 nodes, builds in 0.2 s.
MAX_INLINED_NODES = 50_000
# A reduction's body holds no Let (``loop_ir.to_te``): its TIR is the whole tree, which rfactor
# copies and TVM's passes simplify again and again, Select-heavy forms worst: GELU's erf under a
# LayerNorm, two sums of 7,860 and 15,730 nodes, built in 6 s (Zen 4); 2,000 keeps it at 0.3 s.
MAX_REDUCE_NODES = 2_000


@dataclass
class FuseCompileLog:
    fallbacks: dict[str, str] = field(default_factory=dict)  # group -> why TVM kept it
    stages: list[tuple[str, str, str]] = field(default_factory=list)  # (node, op, why) realized
    shared: dict[str, str] = field(default_factory=dict)  # group -> the kernel it calls, an earlier group's
    reused: dict[str, str] = field(default_factory=dict)  # group -> the group whose lowering it took


@tvm.ir.transform.module_pass(opt_level=0, name="FuseCompile")
class FuseCompile:
    """Lower every group made by ``MakeGroups`` to one PrimFunc and call it with ``call_tir``.

    ``strict=True`` re-raises lowering failures instead of falling back (used by tests so a
    broken lowering cannot hide behind TVM's kernels). ``exact_math=True`` keeps libm's
    transcendentals instead of the vectorizable forms of ``tvm_ext.fast_math``.
    """

    def __init__(self, registry: OpRegistry = OPS, strict: bool = False, exact_math: bool = False):
        self.registry = registry
        self.strict = strict
        self.exact_math = exact_math
        self.log = FuseCompileLog()

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        placed = mod.attrs is not None and attrs.DEVICES in mod.attrs  # a kernel per device's target
        lowerings = _Lowerings(self.log.reused)
        lowered: dict[str, LoweredGroup] = {}
        fallback: dict[str, relax.Function] = {}
        rest = {}
        for gv, func in mod.functions_items():
            if not (isinstance(func, relax.Function) and func.attrs is not None and attrs.GROUP in func.attrs):
                rest[gv] = func
                continue
            try:
                lower = functools.partial(lower_group, func, gv.name_hint, self.registry, self.exact_math,
                                          self.log.stages)
                lowered[gv.name_hint] = lower() if placed else lowerings.lower(func, gv.name_hint, lower)
            except NotLowerable as err:
                fallback[gv.name_hint] = func
                self.log.fallbacks[gv.name_hint] = str(err)
            except Exception as err:  # a bug in a lowering: keep compiling with TVM's kernels
                if self.strict:
                    raise
                warnings.warn(f"lowering of {gv.name_hint} failed ({type(err).__name__}: {err}); "
                              "using TVM's kernels for its ops", stacklevel=2)
                fallback[gv.name_hint] = func
                self.log.fallbacks[gv.name_hint] = f"lowering failed: {err}"
        out = tvm.IRModule(rest, attrs=mod.attrs, global_infos=mod.global_infos)
        rewriter = _CallRewriter(out, lowered, fallback)
        kernels: dict[int, list[tuple[tirx.PrimFunc, tvm.ir.GlobalVar]]] = {}
        for name, group in lowered.items():
            if name in self.log.reused:  # its first group's kernel, the same PrimFunc
                shared = rewriter.prim_gvs[self.log.reused[name]]
            else:
                key = _without_names(group.prim_func)
                same = kernels.setdefault(tvm_ffi.structural_hash(key), [])
                shared = None if placed else next((gv for k, gv in same if tvm_ffi.structural_equal(k, key)), None)
            if shared is not None:
                rewriter.prim_gvs[name] = shared
                self.log.shared[name] = shared.name_hint
                continue
            rewriter.prim_gvs[name] = rewriter.builder_.add_func(group.prim_func, name)
            same.append((key, rewriter.prim_gvs[name]))
        for gv, func in rest.items():
            if isinstance(func, relax.Function):
                rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
        return rewriter.builder_.get()


@mutator
class _CallRewriter(PyExprMutator):
    def __init__(self, mod, lowered: dict[str, LoweredGroup], fallback: dict[str, relax.Function]):
        super().__init__(mod)
        self.lowered = lowered
        self.fallback = fallback
        self.prim_gvs: dict[str, tvm.ir.GlobalVar] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.GlobalVar):
            return call
        name = call.op.name_hint
        if name in self.lowered:
            group = self.lowered[name]
            vdevice = _vdevice_of(call.ty)
            out_types = group.out_types if vdevice is None else [
                relax.TensorType(t.shape, t.dtype, vdevice) for t in group.out_types]
            if vdevice is not None:  # placed by PlaceDevice: the kernel is built for its device's target
                gv = self.prim_gvs[name]
                self.builder_.update_func(gv, self.builder_.get()[gv].with_attr("target", vdevice.target))
            out_ty = out_types[0] if len(out_types) == 1 else out_types
            return relax.call_tir(self.prim_gvs[name], relax.Tuple(list(call.args) + group.const_args), out_ty)
        if name in self.fallback:
            return self._inline(self.fallback[name], call.args)
        return call

    def _inline(self, func: relax.Function, args) -> relax.Expr:
        vmap = dict(zip(func.params, args))
        for block in func.body.blocks:
            for b in block.bindings:
                vmap[b.var] = self.builder_.emit(substitute(b.value, vmap), name_hint=b.var.name)
        return substitute(func.body.body, vmap)


class _Lowerings:
    """Lowered groups by what their lowering reads: a group the same as one lowered before but
    for its names and the contents of the constants the kernel takes as arguments (a repeated
    layer, its own weights) takes that group's kernel with its own constants, without lowering
    again. Constants the kernel holds as literals (a scale, an epsilon) must be equal. FuseCompile
    on a TransformerEncoder (d_model 256) of 4 layers, 20 groups of which 7 lowered: 71.8 -> 33.0
    ms; of 8 layers, 40 and 7: 147.6 -> 40.6 ms (medians of 7, alternating, Zen 4)."""

    def __init__(self, reused: dict[str, str]):
        self.reused = reused
        self.groups: dict[int, list[tuple[str, relax.Function, tuple, LoweredGroup, list[int], list]]] = {}

    def lower(self, func: relax.Function, name: str, lower: Callable[[], LoweredGroup]) -> LoweredGroup:
        shape, local = _lowering_key(func)
        constants = _constants(func)
        same = self.groups.setdefault(tvm_ffi.structural_hash(shape, skip_tensor_content=True), [])
        for first, other, other_local, group, args, its_constants in same:
            if other_local == local and len(its_constants) == len(constants) \
                    and tvm_ffi.structural_equal(other, shape, skip_tensor_content=True) \
                    and all(np.array_equal(constant_data(constants[i]), constant_data(its_constants[i]))
                            for i in range(len(constants)) if i not in args):
                self.reused[name] = first
                return LoweredGroup(group.prim_func, [constants[i] for i in args], group.out_types)
        group = lower()
        args = [next((i for i, c in enumerate(constants) if c.same_as(arg)), -1) for arg in group.const_args]
        if -1 not in args:  # every argument is one of the group's constants: others may take their own
            same.append((name, shape, local, group, args, constants))
        return group


def _lowering_key(func: relax.Function) -> tuple[relax.Function, tuple[int, ...]]:
    """``func`` without the attributes that name or number its group, and the positions of the
    bindings it realizes as kernel-local stages (``attrs.LOCAL`` names them)."""
    local = {str(n) for n in func.attrs[attrs.LOCAL]} if attrs.LOCAL in func.attrs else set()
    names = [b.var.name for block in func.body.blocks for b in block.bindings]
    for key in (attrs.GROUP, attrs.MASTER, attrs.LOCAL):
        if key in func.attrs:
            func = func.without_attr(key)
    return func, tuple(i for i, n in enumerate(names) if n in local)


def _constants(func: relax.Function) -> list:
    """``func``'s constants in the order a visit meets them (the same for two functions equal but
    for their constants' contents)."""
    found: list = []
    relax.analysis.post_order_visit(func, lambda e: found.append(e) if isinstance(e, tvm.ir.GenericConst)
                                    and not any(e.same_as(f) for f in found) else None)
    return found


def _without_names(prim: tirx.PrimFunc) -> tirx.PrimFunc:
    """``prim`` without the attributes that only name things (its symbol, the group's nodes in
    its Loop IR and master): what two groups' kernels must agree on to share one. Twelve layers
    (Linear 256, GELU, LayerNorm) on 64 rows: one kernel instead of twelve, compile and first
    call 0.31 s instead of 0.80; a 4-layer TransformerEncoder, 7 kernels instead of 20, 0.86 s
    instead of 1.32 (medians of 3, Zen 4)."""
    for key in ("global_symbol", attrs.LOOP_IR, attrs.MASTER):
        if prim.attrs is not None and key in prim.attrs:
            prim = prim.without_attr(key)
    return prim


def _vdevice_of(ty):
    """The VDevice a call's result is placed on (the first field's, for a tuple), or None."""
    if isinstance(ty, relax.TupleType):
        return _vdevice_of(ty.fields[0]) if len(ty.fields) else None
    vdevice = getattr(ty, "vdevice", None)
    return vdevice if vdevice is not None and int(vdevice.vdevice_id) >= 0 else None


# --------------------------------------------------------------------------- lowering
def lower_group(func: relax.Function, name: str, registry: OpRegistry = OPS,
                exact_math: bool = False, stages_log: list | None = None) -> LoweredGroup:
    """Compose the Loop IR of every binding of ``func`` and build one PrimFunc. A binding
    whose expression would grow past its bound (``MAX_INLINED_NODES``, ``MAX_REDUCE_NODES``)
    reads its inputs from kernel-local stages instead (each recorded in ``stages_log`` as
    (node, op, why))."""
    kb = KernelBuilder(name, exact_math=exact_math)
    env: dict = {}
    for p in func.params:
        shape, dtype = static_type(p.ty, p.name)
        env[p] = kb.add_input(p.name, shape, dtype)
    const_args: list = []
    ops: list[str] = []
    ops_of: dict = {}
    local = {str(n) for n in func.attrs[attrs.LOCAL]} if attrs.LOCAL in func.attrs else set()
    for block in func.body.blocks:
        for b in block.bindings:
            staged: list = []
            value = _lower_bounded(b, env, kb, const_args, registry, staged)
            if stages_log is not None:
                stages_log += [(v.name, ops_of.get(v, "param"), why) for v, why in staged]
            if b.var.name in local and not isinstance(value, list):
                value = kb.realize(value, b.var.name)  # a kernel-local stage, not recomputed
            env[b.var] = value
            if isinstance(b.value, relax.Call):
                ops.append(b.value.op.name.replace("relax.", ""))
                ops_of[b.var] = ops[-1]
    result = func.body.body
    outs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    stages = [kb.store(env[o], o.name) for o in outs]
    prim = kb.build(stages)
    pattern = str(func.attrs[attrs.PATTERN]) if attrs.PATTERN in func.attrs else ""
    master = str(func.attrs[attrs.MASTER]) if attrs.MASTER in func.attrs else ""
    prim = prim.with_attrs({attrs.KERNEL: pattern, attrs.OPS: ",".join(ops), attrs.LOOP_IR: kb.describe(),
                            attrs.MASTER: master})
    for key in (attrs.CORES, attrs.TILED_EPILOGUE):
        if key in func.attrs:
            prim = prim.with_attr(key, func.attrs[key])
    prim = prim.with_attr(attrs.SHAPE_ONLY, shape_only_params(func, registry))
    out_types = [relax.TensorType(s.buffer.shape, s.buffer.dtype) for s in stages]
    return LoweredGroup(prim, const_args, out_types)


def shape_only_params(func: relax.Function, registry: OpRegistry = OPS) -> list[int]:
    """Indices of ``func``'s parameters that every binding reads only for their shape: each use
    is an argument its op declares ``shape_only`` (zeros_like's input). The kernel's first
    parameters are the group's, in order, so these are the kernel's too."""
    read, shape_read = set(), set()
    for block in func.body.blocks:
        for b in block.bindings:
            call = b.value
            opdef = registry.get(call.op.name) if isinstance(call, relax.Call) and isinstance(
                call.op, tvm.ir.Op) else None
            if opdef is None:
                read.update(relax.analysis.free_vars(call))
                continue
            for i, arg in enumerate(call.args):  # a tuple of tensors is read, whatever its position
                only_shape = isinstance(arg, relax.Var) and i in opdef.shape_only
                (shape_read if only_shape else read).update(relax.analysis.free_vars(arg))
    read.update(relax.analysis.free_vars(func.body.body))
    return [i for i, p in enumerate(func.params) if p in shape_read and p not in read]


def _lower_bounded(b: relax.Binding, env: dict, kb: KernelBuilder, const_args: list,
                   registry: OpRegistry, staged: list):
    """``_lower_binding``; while the result or a stage it made is over its bound
    (``MAX_INLINED_NODES``, ``MAX_REDUCE_NODES`` for a reduction), undo it, realize the largest
    input it inlines, and lower again."""
    while True:
        marks = len(kb.stages), len(kb.inputs), len(const_args)
        value = _lower_binding(b, env, kb, const_args, registry)
        size, limit, reduction = _most_over(value, kb.stages[marks[0]:], kb.exact_math)
        if size <= limit:
            return value
        inputs = [(v, env[v]) for v in relax.analysis.free_vars(b.value)
                  if isinstance(env.get(v), TensorValue) and env[v].buffer is None]
        if not inputs:
            return value
        sized = [(_value_size(t, kb.exact_math), v, t) for v, t in inputs]
        in_size, var, biggest = max(sized, key=lambda x: x[0])
        del kb.stages[marks[0]:], kb.inputs[marks[1]:], const_args[marks[2]:]
        env[var] = kb.realize(biggest, var.name)
        where = " in a reduction" if reduction else ""
        staged.append((var, f"inlined-size: {b.var.name} would be {size:,} TIR nodes{where} "
                            f"(> {limit:,}); {var.name} ({in_size:,}) is a kernel-local stage"))


def _most_over(value, new_stages: list[Stage], exact_math: bool) -> tuple[int, int, bool]:
    """(size, bound, whether a reduction) of the new stage, or of the value left to inline,
    furthest over its bound."""
    sized = []
    for stage in new_stages:
        if stage.expr is not None:
            reduction = isinstance(stage.expr, L.Reduce)
            sized.append((L.inlined_size(stage.expr, exact_math),
                          MAX_REDUCE_NODES if reduction else MAX_INLINED_NODES, reduction))
    if isinstance(value, TensorValue) and value.buffer is None:
        sized.append((_value_size(value, exact_math), MAX_INLINED_NODES, False))
    return max(sized, key=lambda p: p[0] / p[1], default=(0, 1, False))


def _value_size(value: TensorValue, exact_math: bool) -> int:
    return L.inlined_size(value.load(tuple(tirx.Var(f"i{d}", "int32") for d in range(value.ndim))), exact_math)


def _lower_binding(b: relax.Binding, env: dict, kb: KernelBuilder, const_args: list,
                   registry: OpRegistry):
    value = b.value
    if isinstance(value, relax.TupleGetItem):
        return env[value.tuple_value][value.index]
    if isinstance(value, relax.Var):
        return env[value]
    if not (isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op)):
        raise NotLowerable(f"{b.var.name}: {type(value).__name__} is not an op call")
    opdef = registry.get(value.op.name)
    if opdef is None or opdef.lower is None:
        raise NotLowerable(f"{b.var.name}: {value.op.name} has no lowering")
    return lower_call(b.var, value, opdef, env, kb, const_args)
