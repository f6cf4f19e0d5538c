"""View ops (Broadcast / Injective): each is an index map on its input's loads, no compute.

reshape, expand_dims, squeeze and flatten are marked ``view``: alone, they stay TVM's
zero-copy reshape instead of becoming a copy kernel.
"""
from __future__ import annotations

import math

import numpy as np
import tvm
from tvm import relax

from tvm_ext import lowering as lw
from tvm_ext.gradient_rules import expr_dtype, shape_of, sum_to_like
from tvm_ext.errors import InputError
from tvm_ext.lowering import TensorValue, check_no_lowering
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OpNode, SymbolOp, register_op


# ---- gradients: the inverse index map applied to the output's adjoint
def _grad_reshape_like(call, y, g, bb):
    """Any reshape-like view: the adjoint takes the input's shape back."""
    return [relax.op.reshape(g, shape_of(call.args[0]))] + [None] * (len(call.args) - 1)


def _grad_permute_dims(call, y, g, bb):
    ndim = len(shape_of(call.args[0]))
    axes = list(range(ndim))[::-1] if call.attrs.axes is None else [int(a) % ndim for a in call.attrs.axes]
    inverse = [axes.index(d) for d in range(ndim)]
    return [relax.op.permute_dims(g, inverse)]


def _grad_take(call, y, g, bb):
    """Scatter-add of the adjoint at the taken positions: TVM's take_backward, which wants a
    non-negative axis and 1-d in-range indices, on the flattened indices (wrapped as ``mode`` says).
    Relax's take without an axis reads 1-d data, which is axis 0."""
    x, indices = call.args
    shape = shape_of(x)
    axis = 0 if call.attrs.axis is None else int(call.attrs.axis) % len(shape)
    n, count = shape[axis], math.prod(shape_of(indices))
    flat = relax.op.reshape(indices, (count,))
    if str(call.attrs.mode) == "clip":
        flat = relax.op.clip(flat, 0, n - 1)
    else:  # fast (negative indices count from the end) and wrap
        flat = relax.op.floor_mod(flat, relax.const(n, expr_dtype(indices)))
    grad = relax.op.reshape(g, shape[:axis] + (count,) + shape[axis + 1:])
    return [relax.op.grad.take_backward(grad, x, flat, axis), None]


@register_op("relax.broadcast_to", OpPattern.BROADCAST, broadcast_view=True,
             gradient=lambda call, y, g, bb: [sum_to_like(g, call.args[0], bb), None])
def _broadcast_to(node: OpNode) -> TensorValue:
    """Size-1 dims read index 0."""
    return lw.broadcast_to(node.args[0], node.out_shape)


def _unit_dims_only(call: relax.Call, var: relax.Var) -> bool:
    """A reshape that only adds or drops unit dims: a broadcast view."""
    src, dst = call.args[0].ty.shape.values, var.ty.shape.values
    return [int(d) for d in src if int(d) != 1] == [int(d) for d in dst if int(d) != 1]


def _like_rhs_shapes(inputs: list, out: tuple | None, attrs: dict) -> list:
    """Both inputs and the output have one shape: each dim known in any of them (0 = unknown)."""
    known = [s for s in [*inputs, out] if s is not None]
    if not known or any(len(s) != len(known[0]) for s in known):
        return inputs
    merged = tuple(next((s[d] for s in known if s[d]), 0) for d in range(len(known[0])))
    return [merged, merged]


IDENTITY_LIKE_RHS = SymbolOp(
    "_identity_with_attr_like_rhs", lambda bb, inputs, attrs, name: relax.op.reshape(inputs[0], inputs[1].ty.shape),
    inputs=("lhs", "rhs"), input_shapes=_like_rhs_shapes,
    doc="MXNet's internal shape constraint: lhs, whose shape is rhs's (lets inference fill either from the other).")


@register_op("relax.reshape", OpPattern.INJECTIVE, view=True, gradient=_grad_reshape_like, broadcast_view=_unit_dims_only,
             fold=lambda a, c: a.reshape([int(d) for d in c.args[1].values]), symbols=(IDENTITY_LIKE_RHS,))
def _reshape(node: OpNode) -> TensorValue:
    """Row-major re-indexing (div/mod only when non-unit dims change)."""
    return lw.reshape(node.args[0], node.out_shape)


def _batch_flatten_emit(bb, inputs, attrs, name):
    """(N, d1, d2, ...) -> (N, d1 * d2 * ...): MXNet's Flatten keeps the batch axis."""
    x = inputs[0]
    return relax.op.reshape(x, (shape_of(x)[0], -1))


BATCH_FLATTEN = SymbolOp("flatten", _batch_flatten_emit, aliases=("Flatten",),
                         doc="Keep the first axis, flatten the rest (MXNet's Flatten).")


@register_op("relax.flatten", OpPattern.INJECTIVE, view=True, gradient=_grad_reshape_like, symbol=BATCH_FLATTEN,
             broadcast_view=_unit_dims_only)
def _flatten(node: OpNode) -> TensorValue:
    """Reshape to one dimension."""
    return lw.reshape(node.args[0], node.out_shape)


@register_op("relax.expand_dims", OpPattern.INJECTIVE, view=True, gradient=_grad_reshape_like, broadcast_view=True,
             fold=lambda a, c: np.expand_dims(a, tuple(int(x) for x in c.attrs.axis)))
def _expand_dims(node: OpNode) -> TensorValue:
    """Insert unit dims."""
    return lw.expand_dims(node.args[0], [int(a) for a in node.attr("axis")])


@register_op("relax.squeeze", OpPattern.INJECTIVE, view=True, gradient=_grad_reshape_like, broadcast_view=True,
             fold=lambda a, c: np.squeeze(a, None if c.attrs.axis is None else tuple(int(x) for x in c.attrs.axis)))
def _squeeze(node: OpNode) -> TensorValue:
    """Drop unit dims."""
    axis = node.attr("axis")
    return lw.squeeze(node.args[0], None if axis is None else [int(a) for a in axis])


@register_op("relax.permute_dims", OpPattern.INJECTIVE, gradient=_grad_permute_dims,
             fold=lambda a, c: np.transpose(a, None if c.attrs.axes is None else [int(x) for x in c.attrs.axes]))
def _permute_dims(node: OpNode) -> TensorValue:
    """Transpose: output index d reads input index axes[d]."""
    axes = node.attr("axes")
    return lw.permute(node.args[0], None if axes is None else [int(a) for a in axes])


@register_op("relax.flip", OpPattern.INJECTIVE, gradient=lambda call, y, g, bb: [relax.op.flip(g, call.attrs.axis)],
             fold=lambda a, c: np.flip(a, int(c.attrs.axis)).copy())
def _flip(node: OpNode) -> TensorValue:
    """Reversed along one axis: element i reads element n - 1 - i (TVM's kernel of it ran unscheduled:
    `x.flip(-1) + 1` over 2048 x 1024 took 2.3 ms as two kernels, eager 0.38)."""
    x = node.args[0]
    axis = int(node.attr("axis")) % x.ndim
    last = x.shape[axis] - 1
    return lw.view(x, x.shape, lambda idx: [last - i if d == axis else i for d, i in enumerate(idx)], node.name)


@register_op("relax.tile", OpPattern.INJECTIVE, fold=lambda a, c: np.tile(a, [int(r) for r in c.attrs.repeats]))
def _tile(node: OpNode) -> TensorValue:
    """numpy's tile: the input's axes align with the output's last ones, each read modulo its
    size (InstanceNorm's weight tiled over the batch was two TVM kernels a call)."""
    x = node.args[0]
    out = tuple(int(d) for d in node.out_shape)
    lead = len(out) - x.ndim
    return lw.view(x, out, lambda idx: [idx[lead + d] % n if n > 1 else 0 for d, n in enumerate(x.shape)],
                   node.name)


def _grad_layout_transform(call, y, g, bb):
    """The inverse map on the adjoint."""
    shape = shape_of(call.args[0])
    return [relax.op.layout_transform(g, call.attrs.index_map.inverse(list(shape)))]


def _fold_layout(array: np.ndarray, call: relax.Call) -> np.ndarray:
    if call.attrs.pad_value is not None:
        raise ValueError("a padded layout_transform stays in the graph")
    return call.attrs.index_map.map_tensor(tvm.runtime.tensor(np.ascontiguousarray(array))).numpy()


@register_op("relax.layout_transform", OpPattern.INJECTIVE, gradient=_grad_layout_transform, fold=_fold_layout)
def _layout_transform(node: OpNode) -> TensorValue:
    """A bijective index map (NCHW <-> NCHW16c): each element reads its preimage."""
    check_no_lowering(node.attr("pad_value") is not None, "layout_transform with padding")
    return lw.layout_transform(node.args[0], node.attr("index_map"), node.out_shape, node.name)


@register_op("relax.strided_slice", OpPattern.INJECTIVE)
def _strided_slice(node: OpNode) -> TensorValue:
    """begin + i * stride along the sliced axes."""
    x, axes, begin, end = node.args[:4]
    strides = node.args[4] if len(node.args) > 4 else None
    out = lw.strided_slice(x, axes, begin, end, strides)
    check_no_lowering(out.shape != tuple(node.out_shape), f"slice shape {out.shape} != {node.out_shape}")
    return out


def _concat_input_shapes(inputs: list, out: tuple | None, attrs: dict) -> list:
    """MXNet's partial rule: every dim but ``axis`` is one across inputs and output; the output's
    ``axis`` dim, less the known ones, is the one unknown input's (0 = unknown dim)."""
    known = [s for s in [*inputs, out] if s is not None]
    if not known:
        return inputs
    ndim = len(known[0])
    if any(len(s) != ndim for s in known):
        return inputs  # TVM's forward rule reports the rank mismatch
    axis = int(attrs["axis"]) % ndim if ndim else 0
    dims = [next((s[d] for s in known if s[d]), 0) for d in range(ndim)]
    shapes = [tuple(dims[d] if d != axis else (s[d] if s is not None else 0) for d in range(ndim))
              for s in inputs]
    unknown = [i for i, s in enumerate(shapes) if not s[axis]]
    if out is not None and out[axis] and len(unknown) == 1:
        rest = out[axis] - sum(s[axis] for s in shapes)
        if rest > 0:
            i = unknown[0]
            shapes[i] = shapes[i][:axis] + (rest,) + shapes[i][axis + 1:]
    return shapes


CONCAT = SymbolOp("concat", lambda bb, inputs, attrs, name: relax.op.concat(inputs, int(attrs["axis"])),
                  attrs={"axis": 0}, variadic=True, aliases=("Concat",), input_shapes=_concat_input_shapes,
                  doc="Join the tensors given positionally along ``axis``: concat(a, b, c, axis=1).")


@register_op("relax.concat", OpPattern.INJECTIVE, symbol=CONCAT)
def _concat(node: OpNode) -> TensorValue:
    """A guarded select over the inputs along the axis."""
    values = node.args[0]
    axis = node.attr("axis")
    check_no_lowering(axis is None, "concat without an axis (flattening) is left to TVM")
    return lw.concat(values, int(axis), node.name)


def _split_count(attrs) -> int:
    sections = attrs["indices_or_sections"]
    return int(sections) if isinstance(sections, int) else len(sections) + 1


SPLIT = SymbolOp("split", lambda bb, inputs, attrs, name: relax.op.split(
                     inputs[0], attrs["indices_or_sections"], int(attrs["axis"])),
                 attrs={"axis": 0}, required=("indices_or_sections",), num_outputs=_split_count,
                 doc="Equal sections (an int) or cuts at indices (a list) along ``axis``: one output each.")


@register_op("relax.split", OpPattern.INJECTIVE, symbol=SPLIT)
def _split(node: OpNode) -> list[TensorValue]:
    """Several slices of one input (a multi-output op)."""
    x = node.args[0]
    axis = int(node.attr("axis")) % x.ndim
    outs, start = [], 0
    for shape in node.out_shapes:
        end = start + shape[axis]
        outs.append(lw.strided_slice(x, [axis], [start], [end]))
        start = end
    return outs


def _embedding_emit(bb, inputs, attrs, name):
    """Rows of ``weight`` at ``data`` (MXNet's indices are float32 by default: cast to int32)."""
    data, weight = inputs
    if not str(data.ty.dtype).startswith(("int", "uint")):
        data = bb.emit(relax.op.astype(data, "int32"), name + "_indices")
    return relax.op.take(weight, data, axis=0)


EMBEDDING = SymbolOp("embedding", _embedding_emit, inputs=("data", "weight"), attrs={"dtype": "float32"},
                     required=("input_dim", "output_dim"), aliases=("Embedding",),
                     param_shapes=lambda data, attrs: {"weight": (int(attrs["input_dim"]), int(attrs["output_dim"]))},
                     doc="MXNet's Embedding: weight (input_dim, output_dim) of dtype ``dtype``, "
                         "out[..., :] = weight[data[...]].")


def _pick_emit(bb, inputs, attrs, name):
    """MXNet's pick: out[..] = data[.., index[..], ..] along ``axis``; indices out of range are
    clipped (``mode="clip"``) or wrapped (``"wrap"``), as in MXNet."""
    data, index = inputs
    if not isinstance(data.ty, relax.TensorType) or data.ty.ndim < 1:
        raise InputError(f"pick '{name}' needs data of known rank, got {data.ty}")
    axis = int(attrs["axis"]) % data.ty.ndim
    n = data.ty.shape.values[axis]
    idx = bb.emit(relax.op.astype(index, "int64"), name + "_index")
    if attrs["mode"] == "clip" and isinstance(n, tvm.tirx.IntImm):
        idx = bb.emit(relax.op.clip(idx, relax.prim_value(0), relax.prim_value(int(n) - 1)), name + "_clip")
    elif attrs["mode"] == "wrap":
        idx = bb.emit(relax.op.floor_mod(idx, relax.const(n, "int64")), name + "_wrap")
    elif attrs["mode"] != "clip":
        raise InputError(f"pick '{name}': mode={attrs['mode']!r}; MXNet's modes are 'clip' and 'wrap'")
    picked = bb.emit(relax.op.gather_elements(data, relax.op.expand_dims(idx, [axis]), axis), name + "_picked")
    return picked if attrs["keepdims"] else relax.op.squeeze(picked, [axis])


PICK = SymbolOp("pick", _pick_emit, inputs=("data", "index"), attrs={"axis": -1, "keepdims": False, "mode": "clip"},
                doc="MXNet's pick: one element of data along axis for each index (a gather_elements).")


@register_op("relax.take", OpPattern.INJECTIVE, gradient=_grad_take, symbol=EMBEDDING, symbols=(PICK,))
def _take(node: OpNode) -> TensorValue:
    """Gather along an axis with indices loaded from a tensor (negative indices wrap)."""
    x, indices = node.args
    mode = str(node.attr("mode", "fast"))
    check_no_lowering(mode not in ("fast", "wrap", "clip"), f"take mode {mode}")
    check_no_lowering(mode != "fast", f"take mode {mode} is left to TVM")
    axis = node.attr("axis")
    if lw.needs_realized_source(indices) and x.buffer is None:
        x = node.kb.realize(x, node.name + "_src")  # views cannot re-index a loaded position
    return lw.take(x, indices, None if axis is None else int(axis))


@register_op("relax.nn.pad", OpPattern.INJECTIVE)
def _pad(node: OpNode) -> TensorValue:
    """Constant padding, a guarded select; reflect, replicate and circular read the input
    itself (``lowering.pad_by_mode``)."""
    x = node.args[0]
    mode = str(node.attr("pad_mode", "constant"))
    widths = [int(w) for w in node.attr("pad_width")]
    if mode == "constant":
        return lw.pad(x, widths[0::2], widths[1::2], float(node.attr("pad_value", 0)))
    check_no_lowering(mode not in ("reflect", "replicate", "circular"), f"pad mode {mode!r}")
    return lw.pad_by_mode(x, widths[0::2], widths[1::2], mode, node.name)
