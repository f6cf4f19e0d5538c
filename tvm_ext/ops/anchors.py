"""Anchor ops (OutEWiseFusable): matmul and conv2d, lowered to one reduction stage each."""
from __future__ import annotations

from tvm import tirx

from tvm_ext import loop_ir as L
from tvm_ext.errors import ShapeError
from tvm_ext.lowering import (TensorValue, broadcast_shapes, cast_value, check_no_lowering, pad,
                              reduce_stage)
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OpNode, register_op


@register_op("relax.matmul", OpPattern.OUT_EWISE_FUSABLE)
def _matmul(node: OpNode) -> TensorValue:
    """out[..., i, j] = sum_k a[..., i, k] * b[..., k, j], numpy's 1-d and batch rules."""
    a, b = node.args
    a_vec, b_vec = a.ndim == 1, b.ndim == 1
    a_shape = (1,) + a.shape if a_vec else a.shape
    b_shape = b.shape + (1,) if b_vec else b.shape
    m, k = a_shape[-2:]
    k2, n = b_shape[-2:]
    if k != k2:
        raise ShapeError(f"{node.name}: matmul of {list(a.shape)} and {list(b.shape)}: "
                         f"inner dimensions {k} and {k2} differ")
    batch = broadcast_shapes(a_shape[:-2], b_shape[:-2], node=node.name)
    acc = L.compute_dtype(L.promote_dtypes(a.dtype, b.dtype))
    shape = batch + (m, n)

    def body(idx, ks):
        bidx, i, j = idx[:len(batch)], idx[-2], idx[-1]
        ai = _batch_index(bidx, a_shape[:-2]) + ([] if a_vec else [i]) + [ks[0]]
        bi = _batch_index(bidx, b_shape[:-2]) + [ks[0]] + ([] if b_vec else [j])
        return L.cast(a.load(ai), acc) * L.cast(b.load(bi), acc)

    out = reduce_stage(node.kb, shape, [k], body, "sum", acc, node.name)
    squeezed = tuple(s for d, s in enumerate(shape)
                     if not ((a_vec and d == len(shape) - 2) or (b_vec and d == len(shape) - 1)))
    if squeezed != shape:
        keep = [d for d in range(len(shape))
                if not ((a_vec and d == len(shape) - 2) or (b_vec and d == len(shape) - 1))]
        full = out
        out = TensorValue(squeezed, full.dtype, lambda idx: full.load(_unsqueeze(idx, keep, len(shape))),
                          node.name)
    return cast_value(out, node.out_dtype)


def _batch_index(bidx, shape):
    lead = len(bidx) - len(shape)
    return [0 if s == 1 else bidx[lead + d] for d, s in enumerate(shape)]


def _unsqueeze(idx, keep, ndim):
    it = iter(idx)
    return [next(it) if d in keep else 0 for d in range(ndim)]


@register_op("relax.nn.conv2d", OpPattern.OUT_EWISE_FUSABLE)
def _conv2d(node: OpNode) -> TensorValue:
    """NCHW x OIHW direct convolution with strides, padding, dilation and groups.

    Padding is realized as a kernel-local stage so the reduction loop reads without bounds
    checks; other layouts keep TVM's kernel.
    """
    check_no_lowering(str(node.attr("data_layout")) != "NCHW" or str(node.attr("kernel_layout")) != "OIHW"
                      or str(node.attr("out_layout")) != "NCHW", "conv2d layout other than NCHW/OIHW")
    x, w = node.args
    sh, sw = (int(s) for s in node.attr("strides"))
    dh, dw = (int(d) for d in node.attr("dilation"))
    pt, pl, pb, pr = (int(p) for p in node.attr("padding"))
    groups = int(node.attr("groups"))
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    if c != icg * groups:
        raise ShapeError(f"{node.name}: conv2d input has {c} channels, weight expects {icg} x {groups} groups")
    ocg = oc // groups
    acc = L.compute_dtype(L.promote_dtypes(x.dtype, w.dtype))
    if pt or pl or pb or pr:
        x = node.kb.realize(pad(x, [0, 0, pt, pl], [0, 0, pb, pr]), node.name + "_pad")
    shape = tuple(node.out_shape)

    def body(idx, ks):
        b, o, y, z = idx
        ic, ry, rx = ks
        chan = ic if groups == 1 else tirx.floordiv(o, ocg) * icg + ic
        xi = [b, chan, y * sh + ry * dh, z * sw + rx * dw]
        return L.cast(x.load(xi), acc) * L.cast(w.load([o, ic, ry, rx]), acc)

    out = reduce_stage(node.kb, shape, [icg, kh, kw], body, "sum", acc, node.name)
    return cast_value(out, node.out_dtype)
