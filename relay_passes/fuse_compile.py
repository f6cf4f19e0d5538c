"""FuseCompile: each grouped function becomes ONE PrimFunc built from TE compute.

For every ``Primitive`` function made by ``MakeGroups``, the bindings are lowered one by
one through the op registry into Loop IR (composed: a consumer inlines its producers'
expressions; reductions become kernel-local stages), translated to TE, and turned into a
single PrimFunc. The caller's call to the group becomes ``R.call_tir`` of that PrimFunc.

A group our lowering cannot take (``NotLowerable``: an attribute, dtype or shape it does
not handle) is inlined back into its caller, so TVM's LegalizeOps gives its ops their own
kernels: every model TVM compiles still compiles here.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import tvm
from tvm import relax, tirx
from tvm.relax.expr_functor import PyExprMutator, mutator

from relay_passes.grouping import substitute
from relay_passes.lower_call import lower_call, static_type
from tvm_ext import attrs
from tvm_ext.errors import NotLowerable
from tvm_ext.lowering import KernelBuilder
from tvm_ext.registry import OPS, OpRegistry


@dataclass
class LoweredGroup:
    prim_func: tirx.PrimFunc  # carries the ops, pattern and Loop IR as attributes
    const_args: list  # constants read as buffers, appended to the call's arguments
    out_types: list[relax.TensorType]


@dataclass
class FuseCompileLog:
    fallbacks: dict[str, str] = field(default_factory=dict)  # group -> why TVM kept it


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
        lowered: dict[str, LoweredGroup] = {}
        fallback: dict[str, relax.Function] = {}
        rest = {}
        for gv, func in mod.functions_items():
            if not (isinstance(func, relax.Function) and func.attrs is not None and attrs.GROUP in func.attrs):
                rest[gv] = func
                continue
            try:
                lowered[gv.name_hint] = lower_group(func, gv.name_hint, self.registry, self.exact_math)
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
        for name, group in lowered.items():
            rewriter.prim_gvs[name] = rewriter.builder_.add_func(group.prim_func, name)
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
            out_ty = group.out_types[0] if len(group.out_types) == 1 else group.out_types
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


# --------------------------------------------------------------------------- lowering
def lower_group(func: relax.Function, name: str, registry: OpRegistry = OPS,
                exact_math: bool = False) -> LoweredGroup:
    """Compose the Loop IR of every binding of ``func`` and build one PrimFunc."""
    kb = KernelBuilder(name, exact_math=exact_math)
    env: dict = {}
    for p in func.params:
        shape, dtype = static_type(p.ty, p.name)
        env[p] = kb.add_input(p.name, shape, dtype)
    const_args: list = []
    ops: list[str] = []
    local = {str(n) for n in func.attrs[attrs.LOCAL]} if attrs.LOCAL in func.attrs else set()
    for block in func.body.blocks:
        for b in block.bindings:
            value = _lower_binding(b, env, kb, const_args, registry)
            if b.var.name in local and not isinstance(value, list):
                value = kb.realize(value, b.var.name)  # a kernel-local stage, not recomputed
            env[b.var] = value
            if isinstance(b.value, relax.Call):
                ops.append(b.value.op.name.replace("relax.", ""))
    result = func.body.body
    outs = list(result.fields) if isinstance(result, relax.Tuple) else [result]
    stages = [kb.store(env[o], o.name) for o in outs]
    prim = kb.build(stages)
    pattern = str(func.attrs[attrs.PATTERN]) if attrs.PATTERN in func.attrs else ""
    master = str(func.attrs[attrs.MASTER]) if attrs.MASTER in func.attrs else ""
    prim = prim.with_attrs({attrs.KERNEL: pattern, attrs.OPS: ",".join(ops), attrs.LOOP_IR: kb.describe(),
                            attrs.MASTER: master})
    out_types = [relax.TensorType(s.buffer.shape, s.buffer.dtype) for s in stages]
    return LoweredGroup(prim, const_args, out_types)


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
