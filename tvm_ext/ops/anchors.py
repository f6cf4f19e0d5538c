"""Anchor ops (OutEWiseFusable): matmul and conv2d, lowered to one reduction stage each."""
from __future__ import annotations

import re

from tvm import relax, tirx

from tvm_ext import loop_ir as L
from tvm_ext.errors import ShapeError, UnsupportedOpError
from tvm_ext.gradient_rules import shape_of, sum_to, swap_last_two
from tvm_ext.lowering import (TensorValue, broadcast_shapes, cast_value, check_no_lowering, pad,
                              reduce_stage)
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OpNode, SymbolOp, pair, register_op


def _grad_matmul(call, y, g, bb):
    """da = g @ b^T, db = a^T @ g on the batched 2-d forms, summed back over broadcast batch dims."""
    a, b = call.args
    sa, sb = shape_of(a), shape_of(b)
    a_vec, b_vec = len(sa) == 1, len(sb) == 1
    a2 = relax.op.reshape(a, (1,) + sa) if a_vec else a
    b2 = relax.op.reshape(b, sb + (1,)) if b_vec else b
    m = 1 if a_vec else sa[-2]
    n = 1 if b_vec else sb[-1]
    k = sa[-1]
    gs = shape_of(g)
    batch = gs[:len(gs) - (0 if a_vec else 1) - (0 if b_vec else 1)]
    g2 = relax.op.reshape(g, batch + (m, n))
    da = relax.op.matmul(g2, swap_last_two(b2, max(len(sb), 2)))
    db = relax.op.matmul(swap_last_two(a2, max(len(sa), 2)), g2)
    if a_vec:
        da = relax.op.reshape(da, batch + (k,))
    if b_vec:
        db = relax.op.reshape(db, batch + (k,))
    return [sum_to(da, sa, bb), sum_to(db, sb, bb)]


def _dense_emit(bb, inputs, attrs, name):
    """data @ weight^T (+ bias), weight laid out (num_hidden, in_features) as in MXNet."""
    x, w, *bias = inputs
    y = relax.op.matmul(x, bb.emit(relax.op.permute_dims(w), name + "_weight_t"))
    return relax.op.add(bb.emit(y, name + "_matmul"), bias[0]) if bias else y


def _dense_params(data, attrs):
    units = int(attrs["num_hidden"])
    return {"weight": (units, data[-1]), "bias": (units,)}


DENSE = SymbolOp("dense", _dense_emit, inputs=("data", "weight", "bias"), attrs={"no_bias": False},
                 required=("num_hidden",), optional={"bias": "no_bias"}, param_shapes=_dense_params,
                 aliases=("FullyConnected",),
                 doc="Fully connected layer on the last axis: data @ weight^T + bias (no implicit flatten).")


def _static_dims(x, what: str) -> list:
    """The dims of a tensor expression (ints where static); a ShapeError if its shape is unknown."""
    if not isinstance(x.ty, relax.TensorType) or not isinstance(x.ty.shape, relax.ShapeExpr):
        raise ShapeError(f"{what} needs the shapes of its inputs")
    return [int(d) if isinstance(d, tirx.IntImm) else d for d in x.ty.shape.values]


def _dot_emit(bb, inputs, attrs, name):
    """MXNet's dot: lhs's last axis against rhs's first; ``transpose_*`` reverse all axes first."""
    a, b = (bb.emit(relax.op.permute_dims(x), f"{name}_{side}_t") if attrs[f"transpose_{flag}"] else x
            for x, side, flag in zip(inputs, ("lhs", "rhs"), ("a", "b")))
    bd = _static_dims(b, f"dot '{name}'")
    if len(bd) <= 2:
        return relax.op.matmul(a, b)
    ad = _static_dims(a, f"dot '{name}'")
    if not all(isinstance(d, int) for d in bd):
        raise ShapeError(f"dot '{name}' of a {len(bd)}-d rhs needs its static shape, got {bd}")
    flat = bb.emit(relax.op.reshape(b, (bd[0], -1)), name + "_rhs_2d")
    out = bb.emit(relax.op.matmul(a, flat), name + "_matmul")
    return relax.op.reshape(out, [*ad[:-1], *bd[1:]])


def _batch_dot_emit(bb, inputs, attrs, name):
    """MXNet's batch_dot of (B, M, K) and (B, K, N): one batch size, contracted dims known."""
    a, b = (bb.emit(relax.op.permute_dims(x, [0, 2, 1]), f"{name}_{side}_t") if attrs[f"transpose_{flag}"] else x
            for x, side, flag in zip(inputs, ("lhs", "rhs"), ("a", "b")))
    ad, bd = _static_dims(a, f"batch_dot '{name}'"), _static_dims(b, f"batch_dot '{name}'")
    if len(ad) != 3 or len(bd) != 3:
        raise ShapeError(f"batch_dot '{name}' takes 3-d inputs, got shapes {ad} and {bd}")
    if not isinstance(ad[2], int) or not isinstance(bd[1], int):
        raise ShapeError(f"batch_dot '{name}' needs the contracted dims, got shapes {ad} and {bd}")
    if isinstance(ad[0], int) and isinstance(bd[0], int):
        if ad[0] != bd[0]:
            raise ShapeError(f"batch_dot '{name}': batch sizes {ad[0]} and {bd[0]} differ")
    elif isinstance(ad[0], int) or isinstance(bd[0], int) or not ad[0].same_as(bd[0]):
        b = bb.emit(relax.op.reshape(b, [ad[0], *bd[1:]]), name + "_rhs_batch")  # one (unknown) batch size
    return relax.op.matmul(a, b)


_TRANSPOSES = {"transpose_a": False, "transpose_b": False}
DOT = SymbolOp("dot", _dot_emit, inputs=("lhs", "rhs"), attrs=dict(_TRANSPOSES),
               doc="MXNet's dot: contracts lhs's last axis with rhs's first (matmul for a 1-d/2-d rhs).")
BATCH_DOT = SymbolOp("batch_dot", _batch_dot_emit, inputs=("lhs", "rhs"), attrs=dict(_TRANSPOSES),
                     doc="MXNet's batch_dot: (B, M, K) x (B, K, N) -> (B, M, N); transpose_* swap the last two axes.")


@register_op("relax.matmul", OpPattern.OUT_EWISE_FUSABLE, gradient=_grad_matmul, symbol=DENSE,
             symbols=(DOT, BATCH_DOT), anchor=True)
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
    if not b_vec and n >= 4 and _read_across(b, b.ndim - 1):
        # b read transposed (q @ k^T of an input k): no operand runs along the output's columns,
        # so the schedule could not take the matmul for a GEMM and summed dot product by dot
        # product (attention 8x8x128x64: 24 GFLOP/s). A kernel-local copy in (k, n) order is one
        b = node.kb.realize(b, f"{node.name}_rhs")

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


def _read_across(value: TensorValue, axis: int) -> bool:
    """Whether some read of ``value`` moves with its index ``axis`` only along leading axes of
    the buffer it reads, never along the last (a transposed view). A read whose last index
    moves with it (contiguous, or a packed panel's ``j % P``) does not count: those are the
    operands ``schedules.analysis._kind_of`` takes for a GEMM's, and this test keeps to them."""
    idx = [tirx.Var(f"i{d}", "int32") for d in range(value.ndim)]
    var = idx[axis]

    def moves(e) -> bool:
        return isinstance(e, tirx.Expr) and any(v.same_as(var) for v in tirx.analysis.undefined_vars(e, []))

    for node in L.walk(value.load(idx)):
        if isinstance(node, L.Load) and node.index and not moves(node.index[-1]) and any(
                moves(e) for e in node.index[:-1]):
            return True
    return False


def _batch_index(bidx, shape):
    lead = len(bidx) - len(shape)
    return [0 if s == 1 else bidx[lead + d] for d, s in enumerate(shape)]


def _unsqueeze(idx, keep, ndim):
    it = iter(idx)
    return [next(it) if d in keep else 0 for d in range(ndim)]


def _grad_conv2d(call, y, g, bb):
    """Data: conv2d_transpose of g with the weight. Weight: a convolution of the input (channels
    as batch) with g (batch as channels), strides and dilation swapped, cropped to the kernel;
    with groups, one such convolution per group, concatenated."""
    attrs = call.attrs
    layouts = (str(attrs.data_layout), str(attrs.kernel_layout), str(attrs.out_layout))
    if layouts != ("NCHW", "OIHW", "NCHW"):
        raise UnsupportedOpError(f"gradient of conv2d '{y.name}': only NCHW/OIHW layouts are supported "
                                 f"(got {layouts}); convert the layout first")
    x, w = call.args
    groups = int(attrs.groups)
    _, c, in_h, in_w = shape_of(x)
    o, _, kh, kw = shape_of(w)
    _, _, gh, gw = shape_of(g)
    strides = [int(s) for s in attrs.strides]
    dilation = [int(d) for d in attrs.dilation]
    padding = [int(p) for p in attrs.padding]
    pt, pl, pb, pr = padding
    covered_h = (gh - 1) * strides[0] - pt - pb + (kh - 1) * dilation[0] + 1
    covered_w = (gw - 1) * strides[1] - pl - pr + (kw - 1) * dilation[1] + 1
    dx = relax.op.nn.conv2d_transpose(g, w, strides, padding, [in_h - covered_h, in_w - covered_w],
                                      dilation, groups, "NCHW", "IOHW")
    xt = relax.op.permute_dims(x, [1, 0, 2, 3])  # (C, N, H, W): channels as the batch
    gt = relax.op.permute_dims(g, [1, 0, 2, 3])  # (O, N, GH, GW): a kernel with N input channels
    cg, og = c // groups, o // groups
    parts = []
    for gi in range(groups):
        xs = xt if groups == 1 else relax.op.strided_slice(xt, [0], [gi * cg], [(gi + 1) * cg])
        gs = gt if groups == 1 else relax.op.strided_slice(gt, [0], [gi * og], [(gi + 1) * og])
        part = bb.normalize(relax.op.nn.conv2d(xs, gs, strides=dilation, padding=padding, dilation=strides))
        if shape_of(part)[2:] != (kh, kw):
            part = relax.op.strided_slice(part, [2, 3], [0, 0], [kh, kw])
        parts.append(part)
    dwt = parts[0] if groups == 1 else relax.op.concat(parts, axis=1)  # (C/groups, O, KH, KW)
    return [dx, relax.op.permute_dims(dwt, [1, 0, 2, 3])]


def _conv2d_emit(bb, inputs, attrs, name):
    """NCHW x OIHW convolution (+ bias broadcast over channels)."""
    x, w, *bias = inputs
    y = relax.op.nn.conv2d(x, w, strides=pair(attrs["stride"]), padding=pair(attrs["pad"]),
                           dilation=pair(attrs["dilate"]), groups=int(attrs["num_group"]))
    if not bias:
        return y
    b = bb.emit(relax.op.reshape(bias[0], (1, -1, 1, 1)), name + "_bias_nchw")
    return relax.op.add(bb.emit(y, name + "_conv"), b)


def _conv2d_params(data, attrs):
    kh, kw = pair(attrs["kernel"])
    groups, filters = int(attrs["num_group"]), int(attrs["num_filter"])
    if len(data) != 4 or data[1] % groups or filters % groups:
        raise ShapeError(f"conv2d takes NCHW data whose channels ({data[1] if len(data) > 1 else '?'}) and "
                         f"num_filter ({filters}) divide by num_group ({groups}); got data of shape {data}")
    return {"weight": (filters, data[1] // groups, kh, kw), "bias": (filters,)}


CONV2D = SymbolOp("conv2d", _conv2d_emit, inputs=("data", "weight", "bias"),
                  attrs={"stride": (1, 1), "pad": (0, 0), "dilate": (1, 1), "num_group": 1, "no_bias": False},
                  required=("num_filter", "kernel"), optional={"bias": "no_bias"},
                  param_shapes=_conv2d_params, aliases=("Convolution",),
                  doc="2-d convolution, NCHW data and (num_filter, C/num_group, kh, kw) weight, MXNet's names.")


@register_op("relax.nn.conv2d", OpPattern.OUT_EWISE_FUSABLE, gradient=_grad_conv2d, symbol=CONV2D, anchor=True)
def _conv2d(node: OpNode) -> TensorValue:
    """Direct convolution with strides, padding, dilation and groups, NCHW x OIHW, or blocked
    (NCHW[b]c x OIHW[b]i[b]o, groups in whole blocks; ``relay_passes.conv_layout``) where the output's
    channel block is the innermost axis: the register tile's vector.

    Padding is realized as a kernel-local stage so the reduction loop reads without bounds
    checks; other layouts keep TVM's kernel.
    """
    blocks = _blocked_layouts(node)
    check_no_lowering(blocks is None and (str(node.attr("data_layout")) != "NCHW"
                                          or str(node.attr("kernel_layout")) != "OIHW"
                                          or str(node.attr("out_layout")) != "NCHW"),
                      "conv2d layout other than NCHW/OIHW or NCHW[b]c/OIHW[b]i[b]o")
    x, w = node.args
    sh, sw = (int(s) for s in node.attr("strides"))
    dh, dw = (int(d) for d in node.attr("dilation"))
    pt, pl, pb, pr = (int(p) for p in node.attr("padding"))
    groups = int(node.attr("groups"))
    acc = L.compute_dtype(L.promote_dtypes(x.dtype, w.dtype))
    shape = tuple(node.out_shape)
    if blocks is not None:
        _, cb, _, _, ib = x.shape
        obs, gcb, kh, kw, wib, ob_size = w.shape  # gcb: a group's input blocks
        depthwise_ = groups == cb * ib and wib == 1
        if pt or pl or pb or pr:
            x = pad(x, [0, 0, pt, pl, 0], [0, 0, pb, pr, 0])
            if not depthwise_:  # a depthwise tap is one vector FMA: a guarded load costs less than
                x = node.kb.realize(x, node.name + "_pad")  # copying the whole input padded
        if depthwise_:  # depthwise: output channel (block ob, lane o) reads its own
            def depthwise(idx, ks):
                b, ob, y, z, o = idx
                ry, rx = ks
                xi = [b, ob, y * sh + ry * dh, z * sw + rx * dw, o]
                return L.cast(x.load(xi), acc) * L.cast(w.load([ob, 0, ry, rx, 0, o]), acc)

            out = reduce_stage(node.kb, shape, [kh, kw], depthwise, "sum", acc, node.name)
            return cast_value(out, node.out_dtype)
        ocg_blocks = obs // groups  # output blocks per group
        check_no_lowering(cb != gcb * groups or obs % groups, "blocked conv2d groups that split a block")

        def blocked(idx, ks):
            b, ob, y, z, o = idx
            icb, ry, rx, ic = ks
            block = icb if groups == 1 else tirx.floordiv(ob, ocg_blocks) * gcb + icb
            xi = [b, block, y * sh + ry * dh, z * sw + rx * dw, ic]
            return L.cast(x.load(xi), acc) * L.cast(w.load([ob, icb, ry, rx, ic, o]), acc)

        out = reduce_stage(node.kb, shape, [gcb, kh, kw, ib], blocked, "sum", acc, node.name)
        return cast_value(out, node.out_dtype)
    n, c, h, wd = x.shape
    oc, icg, kh, kw = w.shape
    if c != icg * groups:
        raise ShapeError(f"{node.name}: conv2d input has {c} channels, weight expects {icg} x {groups} groups")
    ocg = oc // groups
    if pt or pl or pb or pr:
        x = node.kb.realize(pad(x, [0, 0, pt, pl], [0, 0, pb, pr]), node.name + "_pad")

    def body(idx, ks):
        b, o, y, z = idx
        ic, ry, rx = ks
        chan = ic if groups == 1 else tirx.floordiv(o, ocg) * icg + ic
        xi = [b, chan, y * sh + ry * dh, z * sw + rx * dw]
        return L.cast(x.load(xi), acc) * L.cast(w.load([o, ic, ry, rx]), acc)

    out = reduce_stage(node.kb, shape, [icg, kh, kw], body, "sum", acc, node.name)
    return cast_value(out, node.out_dtype)


def _blocked_layouts(node: OpNode) -> tuple[int, int] | None:
    """(input block, output block) of NCHW[i]c x OIHW[i]i[o]o -> NCHW[o]c, or of a depthwise
    NCHW[b]c x OIHW1i[b]o -> NCHW[b]c (one channel a group); else None."""
    data = re.fullmatch(r"NCHW(\d+)c", str(node.attr("data_layout")))
    kernel = re.fullmatch(r"OIHW(\d+)i(\d+)o", str(node.attr("kernel_layout")))
    out = re.fullmatch(r"NCHW(\d+)c", str(node.attr("out_layout")))
    if not (data and kernel and out) or kernel[2] != out[1]:
        return None
    depthwise = kernel[1] == "1" and data[1] == out[1] and int(node.attr("groups")) == node.args[0].shape[1] * int(data[1])
    if data[1] != kernel[1] and not depthwise:
        return None
    return int(data[1]), int(out[1])
