"""Simplifications run before fusion, so the graph shows fusion what really happens.

FoldWeightLayout evaluates layout ops on constants at compile time.

Imported models transpose their weights in the graph (``permute_dims(W)`` before a
matmul). Folding that once at compile time removes a kernel and a full read and write of
the weight from every call. TVM's ``FoldConstant`` would do it too, but it also
materializes ``broadcast_to`` of constants (a weight broadcast over the batch grows by
the batch size), so this pass folds only ops that keep the constant's size.

Folded constants are written once into their new tensors (a transpose tile by tile);
FoldWeightLayout, PackMatmulWeights and the lowerings read constants through read-only views
(``constant_data``) instead of ``.numpy()`` copies.

EliminateCommonSubexprAroundWeights is Relax's CSE with the large constants held as
parameters while it runs, so that it does not hash their bytes.

FoldTupleGetItem turns ``t = (a, b); x = t[0]`` into ``x = a``.

Importers pack values into tuples and unpack them again (PyTorch's ``max(dim)`` gives
``(values, indices)``); left in place, the tuple hides the value's producer from fusion.
Relax's CanonicalizeBindings does not fold this, so this small pass does; dead-code
elimination then drops the tuple.
"""
from __future__ import annotations

import numpy as np
import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from tvm_ext.registry import OPS, OpRegistry
from tvm_ext.report import tensor_type_bytes


def rewrite_functions(mod: tvm.IRModule, rewriter: PyExprMutator) -> tvm.IRModule:
    """Run ``rewriter`` over every Relax function of ``mod``."""
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()


def scalar_value(expr: relax.Expr) -> float | None:
    """The value of a constant with one element (a scalar or any shape of ones), else None."""
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    data = constant_data(expr)
    return float(data.reshape(-1)[0]) if data.size == 1 else None


def constant_data(const: tvm.ir.GenericConst) -> np.ndarray:
    """A constant's data as a read-only numpy view of its tensor, not a copy (``.numpy()``
    copies: 3 ms for a 16 MB weight, paid at every read by a pass or a lowering). A dtype
    that DLPack cannot give numpy (bfloat16) comes as ``.numpy()``'s copy."""
    try:
        view = np.from_dlpack(const.value)
    except (RuntimeError, BufferError, TypeError):
        view = const.value.numpy()
    view.flags.writeable = False
    return view


def bound_constant(rewriter: PyExprMutator, expr: relax.Expr) -> tvm.ir.GenericConst | None:
    """The constant ``expr`` is, directly or through the variable bound to it; else None."""
    if isinstance(expr, relax.Var):
        bound = rewriter.lookup_binding(expr)
        expr = expr if bound is None else bound
    return expr if isinstance(expr, tvm.ir.GenericConst) else None


@tvm.ir.transform.module_pass(opt_level=0, name="FoldWeightLayout")
class FoldWeightLayout:
    """Replace ``op(constant)`` by a new constant for the layout ops whose registry entry says
    how (``OpDef.fold``: permute_dims, reshape, layout_transform, astype, ...)."""

    def __init__(self, registry: OpRegistry = OPS):
        self.registry = registry

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return rewrite_functions(mod, _ConstantFolder(mod, self.registry))


@mutator
class _ConstantFolder(PyExprMutator):
    def __init__(self, mod: tvm.IRModule, registry: OpRegistry):
        super().__init__(mod)
        self.registry = registry

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        opdef = self.registry.get(call.op.name) if isinstance(call.op, tvm.ir.Op) else None
        if opdef is None or opdef.fold is None or not call.args:
            return call
        arg = bound_constant(self, call.args[0])
        if arg is None or not isinstance(call.ty, relax.TensorType):
            return call
        try:
            data = opdef.fold(constant_data(arg), call)
        except (TypeError, ValueError, AttributeError):
            return call
        return relax.const(new_constant_data(np.asarray(data)), str(call.ty.dtype))


def new_constant_data(data: np.ndarray) -> "tvm.runtime.Tensor | np.ndarray":
    """``data`` (a view: a transpose of a weight) copied once, straight into a new tensor for
    a constant; ``relax.const`` of a strided view copies it twice (a C-order copy, then the
    tensor). A 0-d array, or a dtype DLPack cannot take, stays numpy (``relax.const`` keeps 0-d
    as 0-d)."""
    if data.ndim == 0:
        return np.asarray(data, order="C")
    try:
        tensor = tvm.runtime.empty(data.shape, str(data.dtype))
        _copy_tiled(np.from_dlpack(tensor), data)
    except (RuntimeError, BufferError, TypeError):
        return np.asarray(data, order="C")
    return tensor


#: the side of the tiles a transposed copy goes by: 256 KiB of float32, within any L2
TRANSPOSE_TILE = 256


def _copy_tiled(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src``; when ``src``'s last axis is strided (a transposed weight), tile by
    tile over the last two axes: element by element, every read of a row of ``dst`` touches
    another cache line of ``src`` (a 2048^2 float32 transpose: 23 ms, 12 ms in tiles; Zen 4)."""
    if src.ndim < 2 or src.strides[-1] == src.itemsize:
        dst[...] = src
        return
    rows, cols, t = *src.shape[-2:], TRANSPOSE_TILE
    for r in range(0, rows, t):
        for c in range(0, cols, t):
            dst[..., r:r + t, c:c + t] = src[..., r:r + t, c:c + t]


#: constants of this many bytes or more are held as parameters while CSE runs
HELD_BYTES = 1 << 16


@tvm.ir.transform.module_pass(opt_level=0, name="EliminateCommonSubexprAroundWeights")
class EliminateCommonSubexprAroundWeights:
    """Relax's EliminateCommonSubexpr with each tensor constant of ``HELD_BYTES`` or more held
    as a parameter while it runs. CSE keys expressions by their structural hash, and hashing a
    constant reads all its bytes, once for each expression it is an argument of: 26 ms for
    one 2048^2 float32 weight (Zen 4). A parameter hashes by identity. One constant object is
    one parameter, so expressions that share a weight still merge; two equal copies of a
    weight are no longer found equal."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        held: dict = {}  # function name -> {parameter: constant}
        swapped = tvm.IRModule(dict(mod.functions_items()), attrs=mod.attrs, global_infos=mod.global_infos)
        for gv, func in mod.functions_items():
            if isinstance(func, relax.Function):
                params: dict = {}
                body = tvm_ffi.structural_map(func.body, [(tvm.ir.GenericConst, lambda c: _hold(c, params))])
                if params:
                    held[gv.name_hint] = params
                    swapped[gv] = relax.Function([*func.params, *params.values()], body, func.ret_ty,
                                                 func.is_pure, func.attrs)
        out = relax.transform.EliminateCommonSubexpr()(swapped)
        for name, params in held.items():
            func = out[name]
            consts = {var: const for const, var in params.items()}
            body = tvm_ffi.structural_map(func.body, [(relax.Var, lambda v: consts.get(v, v))])
            out[name] = relax.Function(list(func.params)[:len(func.params) - len(params)], body, func.ret_ty,
                                       func.is_pure, func.attrs)
        return out


def _hold(const: tvm.ir.GenericConst, params: dict) -> relax.Expr:
    """The parameter that stands for ``const`` (one per constant object) if it is large."""
    nbytes = tensor_type_bytes(const.ty)
    if nbytes is None or nbytes < HELD_BYTES:
        return const
    if const not in params:
        params[const] = relax.Var(f"held{len(params)}", const.ty)
    return params[const]


@tvm.ir.transform.module_pass(opt_level=0, name="FoldTupleGetItem")
class FoldTupleGetItem:
    """``t = (a, b); x = t[0]`` becomes ``x = a``."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return rewrite_functions(mod, _TupleFolder(mod))


@mutator
class _TupleFolder(PyExprMutator):
    def visit_tuple_getitem_(self, op: relax.TupleGetItem) -> relax.Expr:
        op = self.visit_expr_post_order(op)
        tup = op.tuple_value
        if isinstance(tup, relax.Var):
            bound = self.lookup_binding(tup)
            if isinstance(bound, relax.Tuple):
                return bound.fields[op.index]
        return op
