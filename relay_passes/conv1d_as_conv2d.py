"""Conv1dAsConv2d: a 1-d convolution (NCW data, OIW weight) as a 2-d one over a height of 1.

We lower conv2d (blocked layout, register tiles: ``tvm_ext.ops.anchors``) and not conv1d, whose
TVM kernel ran unscheduled: ``nn.Conv1d(64, 64, 3, padding=1)`` over 8 x 64 x 512 took 38 ms as
called, eager PyTorch 0.6. The data and the weight gain a unit axis (``reshape``, a view; a
constant weight's is folded by ``FoldWeightLayout``), the convolution's stride, padding and
dilation go to the width, and the result drops the axis again. Runs before ``BlockConvLayout``,
which then blocks the channels as for any conv2d.
"""
from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import PatternMatchingRewriter, is_op, wildcard


def _static_shape(expr: relax.Expr) -> list[int] | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    dims = list(ty.shape.values)
    return [int(d) for d in dims] if all(isinstance(d, tvm.tirx.IntImm) for d in dims) else None


def _as_conv2d(expr: relax.Call, matches: dict) -> relax.Expr:
    call = expr
    attrs = call.attrs
    x, w = call.args
    x_shape, w_shape, y_shape = _static_shape(x), _static_shape(w), _static_shape(call)
    if (x_shape is None or w_shape is None or y_shape is None or str(attrs.data_layout) != "NCW"
            or str(attrs.kernel_layout) != "OIW" or str(attrs.out_layout) != "NCW"):
        return expr  # symbolic lengths or another layout: TVM's conv1d
    n, c, length = x_shape
    o, i, k = w_shape
    left, right = (int(p) for p in attrs.padding)
    y = relax.op.nn.conv2d(relax.op.reshape(x, (n, c, 1, length)), relax.op.reshape(w, (o, i, 1, k)),
                           strides=(1, int(attrs.strides[0])), padding=(0, left, 0, right),
                           dilation=(1, int(attrs.dilation[0])), groups=int(attrs.groups),
                           out_dtype=attrs.out_dtype if attrs.out_dtype else None)
    return relax.op.reshape(y, y_shape)


@tvm.ir.transform.module_pass(opt_level=0, name="Conv1dAsConv2d")
class Conv1dAsConv2d:
    """Rewrite every static NCW/OIW ``nn.conv1d`` into reshape -> ``nn.conv2d`` -> reshape."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        return PatternMatchingRewriter.from_pattern(is_op("relax.nn.conv1d")(wildcard(), wildcard()),
                                                    _as_conv2d)(mod)
