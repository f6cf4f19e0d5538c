"""Gradient: reverse-mode automatic differentiation of a Relax function (NNVM's Gradient pass).

The forward bindings are copied, then walked in reverse topological order. Each binding's
adjoint (the gradient of the target with respect to it) is complete when the walk reaches
it, because all its consumers come later; the op's gradient rule (``OpDef.gradient``, see
``tvm_ext.gradient_rules``) turns it into new graph nodes, one contribution per argument.
Contributions reaching a value along several paths are summed. Only values on a path from
a requested ``wrt`` parameter to the target get adjoint code; rules' leftovers are removed
by dead-code elimination. The result, ``(target, (grads...))``, is an ordinary Relax
function that the pipeline fuses and compiles like any other.
"""
from __future__ import annotations

from typing import Sequence

import tvm
from tvm import relax

from relay_passes.substitute import substitute
from tvm_ext import attrs
from tvm_ext.errors import InputError, ShapeError, UnsupportedOpError
from tvm_ext.gradient_rules import shape_of
from tvm_ext.registry import OPS, OpRegistry


@tvm.ir.transform.module_pass(opt_level=0, name="Gradient")
class Gradient:
    """Add ``adjoint_name`` (default ``<func_name>_adjoint``) returning ``(target, (grads...))``.

    ``wrt`` names the parameters to differentiate (names or positions; default: every float
    parameter). The target is the function's scalar result, or its ``target_index``-th
    result if it returns a tuple. ``adjoint_name="main"`` makes the adjoint the module's
    entry, replacing the forward function, so ``tvm_ext.compile`` builds it.
    """

    def __init__(self, func_name: str = "main", wrt: Sequence[str | int] | None = None,
                 target_index: int = 0, adjoint_name: str | None = None, registry: OpRegistry = OPS):
        self.func_name = func_name
        self.wrt = None if wrt is None else list(wrt)
        self.target_index = target_index
        self.adjoint_name = adjoint_name or f"{func_name}_adjoint"
        self.registry = registry

    def transform_module(self, mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        names = [gv.name_hint for gv in mod.get_global_vars()]
        if self.func_name not in names or not isinstance(mod[self.func_name], relax.Function):
            raise InputError(f"Gradient: the module has no Relax function '{self.func_name}' (it has {names})")
        func = mod[self.func_name]
        wrt = select_params(func, self.wrt)
        params = [relax.Var(p.name, p.ty) for p in func.params]
        if self.adjoint_name in names:
            mod = tvm.IRModule({gv: f for gv, f in mod.functions_items() if gv.name_hint != self.adjoint_name},
                               attrs=mod.attrs, global_infos=mod.global_infos)
        bb = relax.BlockBuilder(mod)
        grad_of: dict[str, str] = {}
        with bb.function(self.adjoint_name, params):
            with bb.dataflow():
                target, grads = emit_adjoint(bb, func, params, wrt, self.target_index, self.registry, grad_of)
                out = bb.emit_output(relax.Tuple([target, relax.Tuple(grads)]))
            bb.emit_func_output(out)
        out_mod = bb.get()
        gv = out_mod.get_global_var(self.adjoint_name)
        adjoint = relax.analysis.remove_all_unused(out_mod[gv])
        kept = {attrs.GRAD_OF: grad_of} if grad_of else {}
        if func.attrs is not None and attrs.CTX_GROUP in func.attrs:  # the forward copies keep their names
            kept[attrs.CTX_GROUP] = func.attrs[attrs.CTX_GROUP]
        out_mod[gv] = adjoint.with_attrs(kept) if kept else adjoint
        return out_mod


def select_params(func: relax.Function, wrt: Sequence[str | int] | None) -> list[relax.Var]:
    """The parameters ``wrt`` names (names or positions); ``None``: every float parameter."""
    if wrt is None:
        return [p for p in func.params if is_float(p)]
    by_name = {p.name: p for p in func.params}
    chosen = []
    for w in wrt:
        if isinstance(w, int):
            if not -len(func.params) <= w < len(func.params):
                raise InputError(f"Gradient: wrt position {w} out of range: the function has "
                                 f"{len(func.params)} parameters")
            p = func.params[w]
        elif w in by_name:
            p = by_name[w]
        else:
            raise InputError(f"Gradient: wrt '{w}' is not a parameter (parameters: {list(by_name)})")
        if not is_float(p):
            raise InputError(f"Gradient: parameter '{p.name}' has dtype {p.ty.dtype}; only float "
                             "parameters have gradients")
        if any(p.same_as(c) for c in chosen):
            raise InputError(f"Gradient: wrt names '{p.name}' twice")
        chosen.append(p)
    return chosen


def emit_adjoint(bb: relax.BlockBuilder, func: relax.Function, args: Sequence[relax.Expr],
                 wrt: Sequence[relax.Var], target_index: int = 0, registry: OpRegistry = OPS,
                 grad_of: dict[str, str] | None = None) -> tuple[relax.Expr, list[relax.Expr]]:
    """In ``bb``'s open dataflow block, emit ``func``'s bindings on ``args``, then its backward.

    Returns the target (the emitted copy) and the gradient of each ``wrt`` parameter of
    ``func``. Used by the ``Gradient`` pass and by training steps that add updates after.
    ``grad_of``, when given, receives for each backward binding the name of the forward
    binding whose rule emitted it (what PlaceDevice's reverse pass places it by).
    """
    bindings = [b for block in func.body.blocks for b in block.bindings]
    env, calls = _emit_forward(bb, func, bindings, args)
    target = _target_of(func, bindings, target_index)
    if shape_of(target) != ():
        raise InputError(f"Gradient: the target '{_name(target)}' has shape {list(shape_of(target))}; "
                         "it must be a scalar (reduce it with sum or mean)")
    if not is_float(target):
        raise InputError(f"Gradient: the target '{_name(target)}' has dtype {target.ty.dtype}; it must be a float "
                         "scalar (an integer or boolean result has no gradient)")
    live = _reachable(bindings, wrt)
    recorder = _Recording(bb)
    adj = _Adjoints(recorder)
    if target in live:
        adj.add(target, relax.const(1.0, str(target.ty.dtype)))
    for b in reversed(bindings):
        if b.var in live and adj.get(b.var) is not None:
            start = len(recorder.emitted)
            _emit_backward(recorder, b, env, calls, adj, live, registry)
            if grad_of is not None:
                grad_of.update({v.name: b.var.name for v in recorder.emitted[start:]})
    grads = []
    for p in wrt:
        g = adj.get(p)
        grads.append(g if g is not None else relax.op.zeros(relax.ShapeExpr(shape_of(p)), str(p.ty.dtype)))
    return env.get(target, target), grads


def _emit_forward(bb: relax.BlockBuilder, func: relax.Function, bindings: Sequence,
                  args: Sequence[relax.Expr]) -> tuple[dict, dict]:
    """Copy ``func``'s bindings onto ``args``: (forward var -> its copy, forward var -> its copied call)."""
    env: dict = dict(zip(func.params, args))
    calls: dict = {}
    for b in bindings:
        if isinstance(b, relax.MatchCast):
            raise UnsupportedOpError(f"Gradient: node '{b.var.name}' is a match_cast; differentiate a "
                                     "function with static shapes")
        value = bb.normalize(substitute(b.value, env))
        env[b.var] = bb.emit(value, name_hint=b.var.name)
        if isinstance(value, relax.Call):
            calls[b.var] = value
    return env, calls


def _emit_backward(bb: relax.BlockBuilder, b: relax.Binding, env: dict, calls: dict, adj: _Adjoints,
                   live: set, registry: OpRegistry) -> None:
    """Pass binding ``b``'s complete adjoint on to the values it reads (its op's rule for a call)."""
    y, value, g = b.var, b.value, adj.get(b.var)
    if isinstance(value, relax.Var):
        adj.add(value, g)
    elif isinstance(value, relax.Tuple):
        for f, gf in zip(value.fields, g):
            if gf is not None and f in live:
                adj.add(f, gf)
    elif isinstance(value, relax.TupleGetItem):
        adj.add_field(value.tuple_value, value.index, g, len(value.tuple_value.ty.fields))
    elif isinstance(value, relax.Call) and isinstance(value.op, tvm.ir.Op):
        grads = _rule(y, value, registry)(calls[y], env[y], g, bb)
        if len(grads) != len(value.args):
            raise UnsupportedOpError(f"gradient rule of {value.op.name} returned {len(grads)} values for "
                                     f"{len(value.args)} arguments (node '{y.name}')")
        for arg, grad in zip(value.args, grads):
            if grad is not None and isinstance(arg, relax.Var) and arg in live:
                adj.add(arg, grad, where=f"node '{y.name}' ({value.op.name})")
    else:
        raise UnsupportedOpError(f"Gradient: node '{y.name}' is a {type(value).__name__}, which cannot be "
                                 "differentiated; only op calls, tuples and aliases can")


class _Recording:
    """A BlockBuilder that also notes every variable it emits (which backward node made what)."""

    def __init__(self, bb: relax.BlockBuilder):
        self._bb = bb
        self.emitted: list[relax.Var] = []

    def emit(self, *args, **kwargs) -> relax.Var:
        var = self._bb.emit(*args, **kwargs)
        self.emitted.append(var)
        return var

    def __getattr__(self, name: str):
        return getattr(self._bb, name)


class _Adjoints:
    """Per variable, the sum of the adjoint contributions emitted so far."""

    def __init__(self, bb: relax.BlockBuilder):
        self.bb = bb
        self.values: dict = {}

    def get(self, var: relax.Var):
        return self.values.get(var)

    def add(self, var: relax.Var, grad, where: str = "") -> None:
        if isinstance(grad, list):  # a tuple-typed value: one adjoint per field
            for i, g in enumerate(grad):
                if g is not None:
                    self.add_field(var, i, g, len(grad))
            return
        grad = self.bb.normalize(grad)
        if isinstance(var.ty, relax.TensorType) and shape_of(grad) != shape_of(var):
            raise ShapeError(f"gradient rule of {where or 'a node'} gave '{var.name}' a gradient of shape "
                             f"{list(shape_of(grad))}, but '{var.name}' has shape {list(shape_of(var))}")
        old = self.values.get(var)
        if old is None and isinstance(grad, relax.Var):
            self.values[var] = grad  # no alias binding
            return
        total = grad if old is None else relax.op.add(old, grad)
        self.values[var] = self.bb.emit(total, name_hint=f"{var.name}_adjoint")

    def add_field(self, var: relax.Var, index: int, grad, arity: int) -> None:
        fields = self.values.setdefault(var, [None] * arity)
        grad = self.bb.normalize(grad)
        old = fields[index]
        fields[index] = self.bb.emit(grad if old is None else relax.op.add(old, grad),
                                     name_hint=f"{var.name}_{index}_adjoint")


def _rule(var: relax.Var, call: relax.Call, registry: OpRegistry):
    opdef = registry.get(call.op.name)
    if opdef is None or opdef.gradient is None:
        where = "tvm_ext has no entry for it" if opdef is None else "its OpDef has no gradient"
        raise UnsupportedOpError(
            f"Gradient: node '{var.name}' uses {call.op.name}, which has no gradient ({where}). Register "
            f"one: give its OpDef (tvm_ext/ops/*.py) gradient=rule, a function (call, output, out_grad, bb) "
            f"-> one adjoint expression (or None) per argument; see tvm_ext.gradient_rules. Or keep "
            f"'{var.name}' off the path from the differentiated parameters to the target.")
    return opdef.gradient


def _reachable(bindings: Sequence, wrt: Sequence[relax.Var]) -> set:
    """Variables that depend on a ``wrt`` parameter: only they get adjoints."""
    live = set(wrt)
    for b in bindings:
        if any(v in live for v in relax.analysis.free_vars(b.value)):
            live.add(b.var)
    return live


def _target_of(func: relax.Function, bindings: Sequence, index: int) -> relax.Expr:
    ret = func.body.body
    if isinstance(ret, relax.Var) and isinstance(ret.ty, relax.TupleType):
        bound = {b.var: b.value for b in bindings}.get(ret)
        if not isinstance(bound, relax.Tuple):
            raise InputError("Gradient: cannot see the fields of the function's tuple result")
        ret = bound
    if isinstance(ret, relax.Tuple):
        if not 0 <= index < len(ret.fields):
            raise InputError(f"Gradient: target_index {index}, but the function returns {len(ret.fields)} values")
        ret = ret.fields[index]
    if not isinstance(ret, relax.Var) or not isinstance(ret.ty, relax.TensorType):
        raise InputError(f"Gradient: the target must be a tensor variable of the function, got {ret}")
    return ret


def is_float(var: relax.Var) -> bool:
    """Whether a variable is a float tensor (only those have gradients)."""
    return isinstance(var.ty, relax.TensorType) and str(var.ty.dtype).startswith(("float", "bfloat"))


def _name(expr: relax.Expr) -> str:
    return expr.name if isinstance(expr, relax.Var) else str(expr)
