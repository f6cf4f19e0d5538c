"""ConvAsConv2d: the other convolutions as the conv2d we lower (blocked layout, register tiles:
``tvm_ext.ops.anchors``), instead of TVM's kernels of them, which ran unscheduled.

- A 1-d convolution (NCW data, OIW weight) is a 2-d one over a height of 1: the data and the
  weight gain a unit axis (``reshape``, a view; a constant weight's is folded by
  ``FoldWeightLayout``), the stride, padding and dilation go to the width, and the result drops
  the axis again. ``nn.Conv1d(64, 64, 3, padding=1)`` over 8 x 64 x 512: 38 ms as called,
  0.51-0.56 ms since (eager PyTorch 0.57-0.64).
- A transposed convolution of a constant IOHW weight (TVM's kernel: 16.6 ms as called for
  ``nn.ConvTranspose2d(32, 16, 2, stride=2)`` over 4 x 32 x 28 x 28, eager 0.26-0.36) becomes,
  whichever applies first:
  - one matmul when its stride is its kernel (no padding, no groups): each input pixel writes
    its own patch (``_patches``; that module 0.12 ms as called);
  - one conv2d whose output channels are the output's phases, pixel-shuffled into place
    (``_phases``; no dilation, no groups): DCGAN's ``ConvTranspose2d(64, 32, 4, 2, 1)`` over
    4 x 64 x 28 x 28 2.1 ms as called, eager 2.7;
  - otherwise a stride-1 conv2d of the data with ``stride - 1`` zeros between its elements,
    padded by ``dilation * (k - 1) - padding`` (plus ``output_padding`` after), with the weight
    flipped in both axes and its in and out channels swapped within each group: stride^2 times
    the multiply-adds (that DCGAN layer 3.7 ms this way).
  The weights are rearranged once, at compile time.

Runs before ``BlockConvLayout``, which then blocks the channels as for any conv2d.
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import PatternMatchingRewriter, is_op, wildcard

from relay_passes.conv_layout import tensor_dims
from relay_passes.simplify import constant_data, new_constant_data


def _static_shape(expr: relax.Expr) -> list[int] | None:
    dims = tensor_dims(expr.ty)
    return dims if dims is not None and None not in dims else None


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


def _transposed_as_conv2d(expr: relax.Call, matches: dict) -> relax.Expr:
    call = expr
    attrs = call.attrs
    x, w = call.args
    x_shape, y_shape = _static_shape(x), _static_shape(call)
    if (x_shape is None or y_shape is None or not isinstance(w, tvm.ir.GenericConst)
            or str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "IOHW"
            or str(attrs.out_layout) != "NCHW"):
        return expr  # symbolic sizes, a weight computed at run time or another layout: TVM's kernel
    n, c, h, wd = x_shape
    ci, og, kh, kw = (int(d) for d in w.value.shape)
    groups = int(attrs.groups)
    sh, sw = (int(v) for v in attrs.strides)
    dh, dw = (int(v) for v in attrs.dilation)
    pt, pl, pb, pr = (int(v) for v in attrs.padding)
    oh, ow = (int(v) for v in attrs.output_padding)
    if (sh, sw) == (kh, kw) and (dh, dw) == (1, 1) and groups == 1 and not any((pt, pl, pb, pr, oh, ow)):
        return _patches(x, w, n, c, h, wd, og, kh, kw, attrs.out_dtype)
    if (dh, dw) == (1, 1) and groups == 1:
        return _phases(x, w, (n, c, h, wd), (sh, sw), (pt, pl), y_shape, attrs.out_dtype)
    # the data with stride - 1 zeros after each element along H and W: (H * sh, W * sw)
    spread = relax.op.reshape(x, (n, c, h, 1, wd, 1))
    spread = relax.op.nn.pad(spread, [0, 0, 0, 0, 0, 0, 0, sh - 1, 0, 0, 0, sw - 1])
    spread = relax.op.reshape(spread, (n, c, h * sh, wd * sw))
    # a full correlation's padding, less what the transposed convolution crops (its padding),
    # and less the stride - 1 zeros already after the last element
    top, left = dh * (kh - 1) - pt, dw * (kw - 1) - pl
    bottom, right = dh * (kh - 1) - pb + oh - (sh - 1), dw * (kw - 1) - pr + ow - (sw - 1)
    if min(top, left, bottom, right) < 0:  # more cropped than padded: slice the rest off
        spread = relax.op.strided_slice(spread, [2, 3], [max(0, -top), max(0, -left)],
                                        [h * sh - max(0, -bottom), wd * sw - max(0, -right)])
    # IOHW with I = groups x ig -> OIHW with O = groups x og, both spatial axes flipped, once here
    data = constant_data(w).reshape(groups, ci // groups, og, kh, kw).transpose(0, 2, 1, 3, 4)
    weight = relax.const(new_constant_data(data.reshape(groups * og, ci // groups, kh, kw)[:, :, ::-1, ::-1]),
                         str(w.ty.dtype))
    return relax.op.nn.conv2d(spread, weight, strides=1,
                              padding=(max(0, top), max(0, left), max(0, bottom), max(0, right)),
                              dilation=(dh, dw), groups=groups, out_dtype=attrs.out_dtype if attrs.out_dtype else None)


def _phases(x, w, x_shape, strides, crop, y_shape, out_dtype) -> relax.Expr:
    """A transposed convolution as one conv2d per output phase, all in one: along an axis,
    output t with t + crop = q s + r is sum_j x[q - j] w[r + j s], a correlation of the data
    (padded by J - 1 before, J = ceil(k / s)) with the phase's taps reversed. The phases are
    output channels (o, r_h, r_w) of one conv2d of J_h x J_w taps over the data itself, pixel-
    shuffled into place and cropped: no multiply-add by a spread zero."""
    n, c, h, wd = x_shape
    data = constant_data(w)  # (C, O, kh, kw)
    o, k = data.shape[1], data.shape[2:]
    taps = [-(-kk // ss) for kk, ss in zip(k, strides)]  # J per axis
    rows = [(t - 1 + p) // ss + 1 for t, p, ss in zip(y_shape[2:], crop, strides)]  # Q: phase outputs
    weight = np.zeros((o, strides[0], strides[1], c, taps[0], taps[1]), data.dtype)
    for rh in range(strides[0]):
        for mh in range(taps[0]):
            ky = rh + (taps[0] - 1 - mh) * strides[0]
            for rw in range(strides[1]):
                for mw in range(taps[1]):
                    kx = rw + (taps[1] - 1 - mw) * strides[1]
                    if ky < k[0] and kx < k[1]:
                        weight[:, rh, rw, :, mh, mw] = data[:, :, ky, kx].T
    weight = relax.const(new_constant_data(weight.reshape(o * strides[0] * strides[1], c, taps[0], taps[1])),
                         str(w.ty.dtype))
    after = [max(0, q - size) for q, size in zip(rows, (h, wd))]
    z = relax.op.nn.conv2d(x, weight, padding=(taps[0] - 1, taps[1] - 1, after[0], after[1]),
                           out_dtype=out_dtype if out_dtype else None)
    if [size + a for a, size in zip(after, (h, wd))] != rows:  # more phase outputs than the crop keeps
        z = relax.op.strided_slice(z, [2, 3], [0, 0], rows)
    z = relax.op.reshape(z, (n, o, strides[0], strides[1], rows[0], rows[1]))
    u = relax.op.reshape(relax.op.permute_dims(z, [0, 1, 4, 2, 5, 3]),
                         (n, o, rows[0] * strides[0], rows[1] * strides[1]))
    return relax.op.strided_slice(u, [2, 3], list(crop), [p + t for p, t in zip(crop, y_shape[2:])])


def _patches(x, w, n, c, h, wd, o, kh, kw, out_dtype) -> relax.Expr:
    """A transposed convolution whose stride is its kernel (no padding): each input pixel
    writes its own kh x kw patch of the output, so it is one matmul, (pixels, C) x (C, O kh kw),
    whose columns are laid out as the patches."""
    pixels = relax.op.reshape(relax.op.permute_dims(x, [0, 2, 3, 1]), (n * h * wd, c))
    weight = relax.const(new_constant_data(constant_data(w).reshape(c, o * kh * kw)), str(w.ty.dtype))
    y = relax.op.reshape(relax.op.matmul(pixels, weight, out_dtype=out_dtype if out_dtype else None),
                         (n, h, wd, o, kh, kw))
    return relax.op.reshape(relax.op.permute_dims(y, [0, 3, 1, 4, 2, 5]), (n, o, h * kh, wd * kw))


@tvm.ir.transform.module_pass(opt_level=0, name="ConvAsConv2d")
class ConvAsConv2d:
    """Rewrite every static NCW/OIW ``nn.conv1d`` into reshape -> ``nn.conv2d`` -> reshape, and
    every static NCHW ``nn.conv2d_transpose`` of a constant IOHW weight into a matmul or a
    ``nn.conv2d`` (see the module's note)."""

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        mod = PatternMatchingRewriter.from_pattern(is_op("relax.nn.conv1d")(wildcard(), wildcard()),
                                                   _as_conv2d)(mod)
        return PatternMatchingRewriter.from_pattern(is_op("relax.nn.conv2d_transpose")(wildcard(), wildcard()),
                                                    _transposed_as_conv2d)(mod)
