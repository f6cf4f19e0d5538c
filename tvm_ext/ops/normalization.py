"""Composite ops lowered to primitives: softmax, log_softmax, layer_norm, group_norm, rms_norm,
batch_norm (inference). Their reductions are kernel-local stages; the rest fuses."""
from __future__ import annotations

from typing import Sequence

from tvm import relax

from tvm_ext import loop_ir as L
from tvm_ext.gradient_rules import const_like, shape_of
from tvm_ext.lowering import TensorValue, check_no_lowering, normalize_axes, pointwise, reduce, view
from tvm_ext.ops.reduction import mean, variance
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OpNode, SymbolOp, register_op


def along(param: TensorValue, ndim: int, axes: Sequence[int], full_shape: Sequence[int]) -> TensorValue:
    """View a parameter whose dims are ``axes`` of an ``ndim``-d tensor, 1 elsewhere."""
    shape = [full_shape[d] if d in axes else 1 for d in range(ndim)]
    if param.ndim != len(axes):
        raise ValueError(f"parameter of shape {list(param.shape)} does not match axes {list(axes)}")
    return view(param, shape, lambda idx: [idx[a] for a in axes])


def _grad_softmax(call, y, g, bb):
    """y * (g - sum(g * y)) along the axis."""
    axis = int(call.attrs.axis)
    return [y * (g - relax.op.sum(g * y, [axis], keepdims=True))]


def _grad_log_softmax(call, y, g, bb):
    """g - exp(y) * sum(g) along the axis."""
    axis = int(call.attrs.axis)
    return [g - relax.op.exp(y) * relax.op.sum(g, [axis], keepdims=True)]


def _grad_layer_norm(call, y, g, bb):
    """With xhat = (x - mean) * rstd: dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat))."""
    x, gamma, _ = call.args
    shape = shape_of(x)
    axes = sorted(int(a) % len(shape) for a in call.attrs.axes)
    others = [d for d in range(len(shape)) if d not in axes]
    param_shape = [shape[d] if d in axes else 1 for d in range(len(shape))]
    mu = relax.op.mean(x, axes, keepdims=True)
    rstd = relax.op.rsqrt(relax.op.variance(x, axes, keepdims=True) + const_like(float(call.attrs.epsilon), x))
    xhat = (x - mu) * rstd
    scale, center = bool(call.attrs.scale), bool(call.attrs.center)
    dxhat = g * relax.op.reshape(gamma, param_shape) if scale else g
    dx = rstd * (dxhat - relax.op.mean(dxhat, axes, keepdims=True)
                 - xhat * relax.op.mean(dxhat * xhat, axes, keepdims=True))

    def per_param(v):
        return relax.op.reshape(relax.op.sum(v, others), shape_of(gamma)) if others else v

    return [dx, per_param(g * xhat) if scale else None, per_param(g) if center else None]


@register_op("relax.nn.softmax", OpPattern.OUT_EWISE_FUSABLE, gradient=_grad_softmax)
def _softmax(node: OpNode) -> TensorValue:
    """exp(x - max) / sum(exp(x - max)).

    The exp is realized as a kernel-local stage rather than recomputed by both of its
    readers (AutoFuse's "Exp is realized" rule): a scalar exp costs more than the extra
    pass over the row.
    """
    x = node.args[0]
    axis = normalize_axes([node.attr("axis")], x.ndim, node.name)
    cdt = L.compute_dtype(node.out_dtype)
    m = reduce(node.kb, x, axis, "max", True, cdt, node.name + "_max")
    e = node.kb.realize(pointwise(lambda v, mu: L.exp_nonpositive(v - mu), [x, m], cdt, node.name + "_exp"))
    s = reduce(node.kb, e, axis, "sum", True, cdt, node.name + "_sum")
    return pointwise(lambda v, t: v * (1.0 / t), [e, s], node.out_dtype, node.name)  # 1/t: once per row


@register_op("relax.nn.log_softmax", OpPattern.OUT_EWISE_FUSABLE, gradient=_grad_log_softmax)
def _log_softmax(node: OpNode) -> TensorValue:
    """(x - max) - log(sum(exp(x - max))), PyTorch's order: x - (max + log(sum)) rounds the
    log away when |max| is large (a row of 1e30 gave 0, not -log(n)).

    The row's log-sum is realized once per row, so the output is two subtractions an element."""
    x = node.args[0]
    axis = normalize_axes([node.attr("axis")], x.ndim, node.name)
    cdt = L.compute_dtype(node.out_dtype)
    m = reduce(node.kb, x, axis, "max", True, cdt, node.name + "_max")
    e = pointwise(lambda v, mu: L.exp_nonpositive(v - mu), [x, m], cdt, node.name + "_exp")
    s = reduce(node.kb, e, axis, "sum", True, cdt, node.name + "_sum")
    log_sum = node.kb.realize(pointwise(L.log, [s], cdt, node.name + "_log_sum"))
    return pointwise(lambda v, mu, c: (v - mu) - c, [x, m, log_sum], node.out_dtype, node.name)


def _layer_norm_emit(bb, inputs, attrs, name):
    x, gamma, beta = inputs
    return relax.op.nn.layer_norm(x, gamma, beta, axes=attrs["axes"], epsilon=float(attrs["epsilon"]),
                                  center=bool(attrs["center"]), scale=bool(attrs["scale"]))


def _layer_norm_params(data, attrs):
    axes = attrs["axes"] if isinstance(attrs["axes"], (tuple, list)) else (attrs["axes"],)
    shape = tuple(data[int(a)] for a in axes)
    return {"gamma": shape, "beta": shape}


LAYER_NORM = SymbolOp("layer_norm", _layer_norm_emit, inputs=("data", "gamma", "beta"),
                      attrs={"axes": -1, "epsilon": 1e-5, "center": True, "scale": True},
                      param_shapes=_layer_norm_params, aliases=("LayerNorm",),
                      doc="Layer normalization over ``axes``; gamma and beta have the shape of those axes.")


@register_op("relax.nn.layer_norm", OpPattern.OUT_EWISE_FUSABLE, gradient=_grad_layer_norm, symbol=LAYER_NORM)
def _layer_norm(node: OpNode) -> TensorValue:
    """(x - mean) * rsqrt(var + eps) * gamma + beta over ``axes``."""
    x, gamma, beta = node.args
    axes = normalize_axes(node.attr("axes"), x.ndim, node.name)
    eps = float(node.attr("epsilon"))
    cdt = L.compute_dtype(node.out_dtype)
    mu = mean(node, x, axes, True, cdt)
    var = variance(node, x, axes, True, cdt, m=mu)
    norm = pointwise(lambda v, m, s: (v - m) * L.rsqrt(s + eps), [x, mu, var], cdt, node.name + "_norm")
    return _affine(node, norm, gamma, beta, axes)


def _affine(node: OpNode, norm: TensorValue, gamma: TensorValue, beta: TensorValue,
            axes: Sequence[int]) -> TensorValue:
    """``norm * gamma + beta`` (each part as the node's scale / center ask), the parameters
    laid along ``axes`` of ``norm``."""
    parts = [norm]
    if node.attr("scale", True):
        parts.append(along(gamma, norm.ndim, axes, norm.shape))
    if node.attr("center", True):
        parts.append(along(beta, norm.ndim, axes, norm.shape))

    def affine(n, *gb):
        out = n
        if node.attr("scale", True):
            out = out * gb[0]
        if node.attr("center", True):
            out = out + gb[-1]
        return out

    return pointwise(affine, parts, node.out_dtype, node.name)


@register_op("relax.nn.group_norm", OpPattern.OUT_EWISE_FUSABLE)
def _group_norm(node: OpNode) -> TensorValue:
    """Layer norm over each group of ``C / num_groups`` channels and ``axes``: the statistics
    come from a view with the channel axis split in (group, channel in group), two reductions
    that read x once each; they fold with gamma and beta into a scale and a shift per channel,
    and one pass writes ``x * scale + shift``."""
    return _grouped_norm(node, int(node.attr("num_groups")))


@register_op("relax.nn.instance_norm", OpPattern.OUT_EWISE_FUSABLE)
def _instance_norm(node: OpNode) -> TensorValue:
    """A group norm with a group per channel (TVM's kernel of it, which our schedules leave
    alone, took 1.97 ms over 8x64x56x56, eager 1.54)."""
    x = node.args[0]
    return _grouped_norm(node, x.shape[normalize_axes([node.attr("channel_axis")], x.ndim, node.name)[0]])


def _grouped_norm(node: OpNode, groups: int) -> TensorValue:
    x, gamma, beta = node.args
    ca = normalize_axes([node.attr("channel_axis")], x.ndim, node.name)[0]
    channels = x.shape[ca]
    if groups <= 0 or channels % groups:
        raise ValueError(f"{node.name}: {channels} channels do not split into {groups} groups")
    per = channels // groups
    eps = float(node.attr("epsilon"))
    cdt = L.compute_dtype(node.out_dtype)
    gshape = (*x.shape[:ca], groups, per, *x.shape[ca + 1:])
    grouped = view(x, gshape, lambda i: [*i[:ca], i[ca] * per + i[ca + 1], *i[ca + 2:]], node.name + "_groups")
    red = sorted([ca + 1] + [a + (a > ca) for a in normalize_axes(node.attr("axes"), x.ndim, node.name)])
    mu = mean(node, grouped, red, True, cdt)
    var = variance(node, grouped, red, True, cdt, m=mu)

    # per channel (and batch): x's shape with the reduced axes 1
    pshape = tuple(1 if d != ca and d + (d > ca) in red else x.shape[d] for d in range(x.ndim))

    def per_channel(stat: TensorValue) -> TensorValue:  # a group statistic, read at a channel's index
        def index(i):
            out = [0 if d in red else i[d] for d in range(ca)] + [i[ca] // per, 0]
            return out + [0 if d + 1 in red else i[d] for d in range(ca + 1, x.ndim)]
        return view(stat, pshape, index)

    # y = x * scale + shift, with scale = rsqrt(var + eps) * gamma and shift = beta - mean * scale
    # realized once per channel (as PyTorch's CPU kernel does): the pass over x is one
    # multiply-add an element, which counts where an activation after it makes it compute-bound
    scaled, centered = bool(node.attr("scale", True)), bool(node.attr("center", True))
    rstd = pointwise(lambda s: L.rsqrt(s + eps), [per_channel(var)], cdt, node.name + "_rstd")
    scale = node.kb.realize(pointwise(lambda r, g: r * g, [rstd, along(gamma, x.ndim, [ca], pshape)], cdt,
                                      node.name + "_scale") if scaled else rstd)
    shift = (pointwise(lambda m, sc, b: b - m * sc, [per_channel(mu), scale, along(beta, x.ndim, [ca], pshape)],
                       cdt, node.name + "_shift") if centered else
             pointwise(lambda m, sc: -(m * sc), [per_channel(mu), scale], cdt, node.name + "_shift"))
    shift = node.kb.realize(shift)
    return pointwise(lambda v, sc, sh: v * sc + sh, [x, scale, shift], node.out_dtype, node.name)


@register_op("relax.nn.rms_norm", OpPattern.OUT_EWISE_FUSABLE)
def _rms_norm(node: OpNode) -> TensorValue:
    """x * rsqrt(mean(x^2) + eps) * weight over ``axes``."""
    x, weight = node.args
    axes = normalize_axes(node.attr("axes"), x.ndim, node.name)
    eps = float(node.attr("epsilon"))
    cdt = L.compute_dtype(node.out_dtype)
    sq = pointwise(lambda v: v * v, [x], cdt, node.name + "_sq")
    ms = mean(node, sq, axes, True, cdt)
    w = along(weight, x.ndim, axes, x.shape)
    return pointwise(lambda v, m, g: v * L.rsqrt(m + eps) * g, [x, ms, w], node.out_dtype, node.name)


def _batch_norm_emit(bb, inputs, attrs, name):
    """The normalized data (field 0 of Relax's batch_norm); the moving statistics are aux inputs."""
    bn = relax.op.nn.batch_norm(*inputs, axis=int(attrs["axis"]), epsilon=float(attrs["eps"]),
                                center=bool(attrs["center"]), scale=bool(attrs["scale"]),
                                momentum=float(attrs["momentum"]), training=bool(attrs["training"]))
    return relax.TupleGetItem(bb.emit(bn, name + "_bn"), 0)


def _batch_norm_params(data, attrs):
    channels = (data[int(attrs["axis"])],)
    return dict.fromkeys(("gamma", "beta", "moving_mean", "moving_var"), channels)


BATCH_NORM = SymbolOp("batch_norm", _batch_norm_emit,
                      inputs=("data", "gamma", "beta", "moving_mean", "moving_var"),
                      aux=("moving_mean", "moving_var"),
                      attrs={"axis": 1, "eps": 1e-5, "momentum": 0.1, "center": True, "scale": True,
                             "training": False},
                      param_shapes=_batch_norm_params, aliases=("BatchNorm",),
                      doc="Batch normalization on ``axis``; gamma, beta and the moving statistics are (C,).")


@register_op("relax.nn.batch_norm", OpPattern.BROADCAST, symbol=BATCH_NORM)
def _batch_norm(node: OpNode) -> list[TensorValue]:
    """Inference: (x - moving_mean) * rsqrt(moving_var + eps) * gamma + beta on ``axis``.

    Returns (out, moving_mean, moving_var) as Relax does; training mode keeps TVM's kernel.
    """
    check_no_lowering(bool(node.attr("training", False)), "batch_norm in training mode")
    x, gamma, beta, mean_, var_ = node.args
    axis = normalize_axes([node.attr("axis")], x.ndim, node.name)
    eps = float(node.attr("epsilon"))
    scale, center = bool(node.attr("scale", True)), bool(node.attr("center", True))
    g, b, m, v = (along(p, x.ndim, axis, x.shape) for p in (gamma, beta, mean_, var_))

    def fn(xv, gv, bv, mv, vv):
        out = (xv - mv) * L.rsqrt(vv + eps)
        if scale:
            out = out * gv
        if center:
            out = out + bv
        return out

    out = pointwise(fn, [x, g, b, m, v], node.out_dtypes[0], node.name)
    return [out, mean_, var_]
