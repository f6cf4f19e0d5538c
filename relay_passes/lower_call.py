"""Lowering one Relax call through the op registry: its arguments as lowerings see them
(tensor values, literals, shapes), its static output types, and the check that the
lowering agrees with Relax's shape inference. FuseCompile and AutoFuse's analysis share it.
"""
from __future__ import annotations

import tvm
from tvm import relax, tirx

from relay_passes.simplify import constant_data
from tvm_ext.errors import CompileError, NotLowerable
from tvm_ext.loop_ir import SUPPORTED_DTYPES, dtype_of
from tvm_ext.lowering import KernelBuilder, full
from tvm_ext.registry import OpDef, OpNode


def lower_call(var: relax.Var, call: relax.Call, opdef: OpDef, env: dict, kb: KernelBuilder,
               const_args: list):
    """Run ``opdef``'s lowering on ``call`` (bound to ``var``), whose variables ``env`` maps to
    values; constants read as buffers are added to ``kb`` and listed in ``const_args``."""
    args = tuple(_convert(a, env, kb, const_args) for a in call.args)
    tys = list(var.ty.fields) if isinstance(var.ty, relax.TupleType) else [var.ty]
    shapes, dtypes = zip(*(static_type(t, var.name) for t in tys))
    node = OpNode(var.name, call.op.name, args, call.attrs, list(shapes), list(dtypes), kb)
    out = opdef.lower(node)
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    for o, shape, dtype in zip(outs, shapes, dtypes):
        if o.shape != tuple(shape) or o.dtype != dtype:
            raise CompileError(f"{var.name}: lowering of {call.op.name} gives {list(o.shape)} "
                               f"{o.dtype}, Relax infers {list(shape)} {dtype}")
    return outs if isinstance(out, (list, tuple)) else out


def static_type(ty, where: str) -> tuple[tuple[int, ...], str]:
    """(shape, dtype) of a static tensor type, else NotLowerable."""
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        raise NotLowerable(f"{where}: {ty} has no static shape")
    dims = ty.shape.values
    if any(not isinstance(d, tirx.IntImm) for d in dims):
        raise NotLowerable(f"{where}: symbolic shape {ty.shape}")
    dtype = str(ty.dtype)
    if dtype not in SUPPORTED_DTYPES:
        raise NotLowerable(f"{where}: dtype {dtype} is not supported by our kernels")
    return tuple(int(d) for d in dims), dtype


def _convert(arg, env: dict, kb: KernelBuilder, const_args: list):
    """A Relax call argument as a lowering sees it."""
    if isinstance(arg, relax.Var):
        return env[arg]
    if isinstance(arg, tvm.ir.GenericConst):
        data = constant_data(arg)
        if str(data.dtype) not in SUPPORTED_DTYPES:
            raise NotLowerable(f"constant of dtype {data.dtype}")
        if data.size == 1:  # a literal at every index
            return full(data.shape, data.reshape(()).item(), str(data.dtype))
        const_args.append(arg)
        return kb.add_input("const", data.shape, str(data.dtype))
    if isinstance(arg, relax.Tuple):
        return [_convert(f, env, kb, const_args) for f in arg.fields]
    if isinstance(arg, relax.ShapeExpr):
        if any(not isinstance(d, tirx.IntImm) for d in arg.values):
            raise NotLowerable(f"symbolic shape argument {arg}")
        return tuple(int(d) for d in arg.values)
    if isinstance(arg, (tirx.IntImm, tirx.FloatImm)):
        return bool(arg.value) if dtype_of(arg) == "bool" else arg.value
    if isinstance(arg, tvm.ir.StringImm):
        return arg.value
    raise NotLowerable(f"argument of kind {type(arg).__name__}")
