"""Frontends: a PyTorch module, an ONNX model, a Symbol or a Relax IRModule becomes one IRModule."""
from __future__ import annotations

import contextlib
import logging
import operator
import os
import warnings
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import tvm

from tvm_ext.cyclic_gc import cyclic_gc_paused
from tvm_ext.errors import FrontendError, InputError
from tvm_ext.symbol import Symbol


def from_torch(module: Any, example_inputs: Sequence[Any], keep_params_as_input: bool = False) -> tvm.IRModule:
    """``torch.export`` the module on ``example_inputs`` and import it with TVM's importer.

    The module is put in eval mode; its weights become constants of the IRModule.
    """
    import torch

    if not isinstance(example_inputs, (tuple, list)):
        example_inputs = (example_inputs,)
    example_inputs = tuple(torch.as_tensor(x) if not isinstance(x, torch.Tensor) else x for x in example_inputs)
    module.eval()
    shapes = [tuple(x.shape) for x in example_inputs]
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")  # logs a traceback per failure
    level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with torch.no_grad(), cyclic_gc_paused(), _without_stack_traces():
            exported = torch.export.export(module, example_inputs)
    except Exception as err:
        raise FrontendError(f"torch.export failed for {type(module).__name__} on example inputs of "
                            f"shapes {shapes}: {_first_line(err)}. Check that the example inputs have "
                            "the shapes and dtypes forward() expects.") from err
    finally:
        fake_log.setLevel(level)
    return from_exported(exported, keep_params_as_input, type(module).__name__)


@contextlib.contextmanager
def _without_stack_traces() -> Iterator[None]:
    """torch.export without the Python stack trace it records for every node, which nothing of
    ours or TVM's importer reads: a fifth of the export's time (TransformerEncoder of 8 layers,
    0.53-0.61 s -> 0.41-0.46, Zen 4). Errors name the node."""
    import torch.fx.config as fx_config

    if not hasattr(fx_config, "do_not_emit_stack_traces"):  # a PyTorch older than this switch
        yield
        return
    before = fx_config.do_not_emit_stack_traces
    fx_config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        fx_config.do_not_emit_stack_traces = before


def from_exported(exported: Any, keep_params_as_input: bool = False, name: str = "the exported program"
                  ) -> tvm.IRModule:
    """Import a ``torch.export.ExportedProgram`` with TVM's importer: as exported when every op
    of its graph is one ``DIRECT_OPS`` accepts, else after PyTorch's core-ATen decomposition."""
    from tvm.relax.frontend.torch import from_exported_program

    try:
        with warnings.catch_warnings(), cyclic_gc_paused():
            warnings.simplefilter("ignore")
            return from_exported_program(exported, keep_params_as_input=keep_params_as_input,
                                         custom_convert_map=TORCH_CONVERTERS,
                                         run_ep_decomposition=not translates_directly(exported))
    except Exception as err:
        raise FrontendError(f"TVM's PyTorch importer failed on {name}: {_first_line(err)}") from err


def _extreme(op):
    """A converter for ``aten.amax`` / ``aten.amin`` (x, dim=(), keepdim=False), which TVM's
    importer lacks: a max / min reduction over ``dim`` (all dims when empty)."""
    def convert(node, importer):
        args = importer.retrieve_args(node)
        dim = args[1] if len(args) > 1 else node.kwargs.get("dim", ())
        keepdim = args[2] if len(args) > 2 else node.kwargs.get("keepdim", False)
        axes = None if dim in ((), [], None) else [int(d) for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
        return importer.block_builder.emit(op(args[0], axes, keepdims=bool(keepdim)))
    return convert


def _linear(node, importer):
    """``aten.linear`` in its input's dtype (TVM's converter makes every product float32, which
    a float16 or bfloat16 bias then cannot be added to)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    x, weight = args[0], args[1]
    bias = args[2] if len(args) > 2 else None
    return importer.block_builder.emit(relax.op.linear(x, weight, bias, str(x.ty.dtype)))


def _addmm(node, importer):
    """``aten.addmm``: beta * bias + alpha * (a @ b), in the operands' dtype (see ``_linear``)."""
    from tvm import relax

    bias, a, b = (importer.env[n] for n in node.args[:3])
    alpha, beta = node.kwargs.get("alpha", 1), node.kwargs.get("beta", 1)
    emit, dtype = importer.block_builder.emit, str(a.ty.dtype)
    out = emit(relax.op.matmul(a, b, out_dtype=dtype)) if alpha != 0 else None
    if out is not None and alpha != 1:
        out = emit(relax.op.multiply(out, relax.const(alpha, dtype)))
    if beta == 0:
        return out
    scaled = bias if beta == 1 else emit(relax.op.multiply(bias, relax.const(beta, str(bias.ty.dtype))))
    return scaled if out is None else emit(relax.op.add(scaled, out))


def _min_dim(node, importer):
    """``aten.min.dim`` (values and first indices), which TVM's importer lacks: topk with k = 1,
    as its ``max.dim``."""
    from tvm import relax

    args = importer.retrieve_args(node)
    x, dim = args[0], int(args[1])
    keepdim = bool(args[2] if len(args) > 2 else node.kwargs.get("keepdim", False))
    emit = importer.block_builder.emit
    both = emit(relax.op.topk(x, k=1, axis=dim, largest=False, ret_type="both", dtype="int64"))
    values, indices = both[0], both[1]
    if not keepdim:
        values, indices = emit(relax.op.squeeze(values, axis=[dim])), emit(relax.op.squeeze(indices, axis=[dim]))
    return emit(relax.Tuple([values, indices]))


def _divide(rounding: str | None = None, read_mode: bool = False):
    """``aten.div`` (true, floor or trunc) and ``floor_divide`` with PyTorch's promotion: a
    Python number takes the tensor's dtype (TVM's converter makes it an int32 constant, which
    an int64 or float tensor cannot meet), and true division of integers is float32 division
    (TVM's would divide the integers). Integer trunc division runs in float64 (exact below 2^53)."""
    def convert(node, importer):
        from tvm import relax

        args = importer.retrieve_args(node)
        a, b = args[0], args[1]
        mode = (args[2] if len(args) > 2 else node.kwargs.get("rounding_mode")) if read_mode else rounding
        emit = importer.block_builder.emit
        like = a if isinstance(a, relax.Expr) else b
        dtype = str(like.ty.dtype)
        integer = not dtype.startswith(("float", "bfloat"))
        if integer and (mode is None or isinstance(a, float) or isinstance(b, float)):
            a, b = (emit(relax.op.astype(v, "float32")) if isinstance(v, relax.Expr) else v for v in (a, b))
            dtype, integer = "float32", False
        a, b = (v if isinstance(v, relax.Expr) else relax.const(v, dtype) for v in (a, b))
        if mode is None:
            return emit(relax.op.divide(a, b))
        if mode == "floor":
            return emit(relax.op.floor_divide(a, b))
        if mode != "trunc":
            raise FrontendError(f"node '{node.name}': division with rounding_mode={mode!r}")
        if integer:
            wide = emit(relax.op.trunc(relax.op.divide(relax.op.astype(a, "float64"), relax.op.astype(b, "float64"))))
            return emit(relax.op.astype(wide, dtype))
        return emit(relax.op.trunc(relax.op.divide(a, b)))
    return convert


def _nearest_indices(size_in: int, size_out: int, scale: float | None):
    """PyTorch's 'nearest' source index per output index: floor(dst * s), s = in / out (or
    1 / scale_factor when one was given), computed in float32 as PyTorch does, clamped."""
    import numpy as np

    s = np.float32(1.0 / scale) if scale else np.float32(size_in) / np.float32(size_out)
    src = np.floor(np.arange(size_out, dtype=np.float32) * s).astype("int64")
    return np.minimum(src, size_in - 1)


def _upsample_nearest2d(node, importer):
    """``aten.upsample_nearest2d.vec`` to a size or by scale factors: two gathers along H and W
    with the source indices worked out here (TVM's converter picks other rows and columns)."""
    from tvm import relax

    args = importer.retrieve_args(node)
    x, size = args[0], args[1] if len(args) > 1 else node.kwargs.get("output_size")
    scales = args[2] if len(args) > 2 else node.kwargs.get("scale_factors")
    shape = [int(d) for d in x.ty.shape.values]
    if size is None:
        size = [int(shape[2 + i] * float(scales[i])) for i in range(2)]
    emit, out = importer.block_builder.emit, x
    for i, axis in enumerate((2, 3)):
        idx = _nearest_indices(shape[axis], int(size[i]), float(scales[i]) if scales else None)
        out = emit(relax.op.take(out, relax.const(idx), axis=axis))
    return out


def _index_tensor(node, importer):
    """``x[idx]``: TVM's converter, except for a boolean mask, whose result's size depends on
    the data and which static kernels cannot produce."""
    from tvm import relax

    indices = node.args[1] if len(node.args) > 1 else []
    for i in indices:
        value = importer.env.get(i) if i is not None else None
        if isinstance(value, relax.Expr) and isinstance(value.ty, relax.TensorType) and str(value.ty.dtype) == "bool":
            raise FrontendError(f"node '{node.name}': indexing with a boolean mask (x[mask]) gives a result whose "
                                f"size depends on the data, which tvm_ext's static kernels cannot produce; keep the "
                                f"shape with torch.where(mask, x, 0) (or x * mask) and reduce over it instead")
    return importer._index_tensor(node)


def _grid_sampler_2d(node, importer):
    """``aten.grid_sampler_2d`` (grid_sample) in bilinear or nearest mode with zeros or border
    padding, as gathers of the four (one) neighbours; TVM's converter gives wrong values."""
    from tvm import relax

    args = importer.retrieve_args(node)
    x, grid = args[0], args[1]
    mode, padding, align = (int(args[2]), int(args[3]), bool(args[4])) if len(args) > 4 else (0, 0, False)
    if mode not in (0, 1) or padding not in (0, 1):
        raise FrontendError(f"node '{node.name}': grid_sample with mode "
                            f"{['bilinear', 'nearest', 'bicubic'][mode]} and padding "
                            f"{['zeros', 'border', 'reflection'][padding]} has no converter; tvm_ext supports "
                            f"bilinear or nearest with zeros or border padding")
    n, c, h, w = (int(d) for d in x.ty.shape.values)
    _, ho, wo, _ = (int(d) for d in grid.ty.shape.values)
    op, emit, dtype = relax.op, importer.block_builder.emit, str(x.ty.dtype)

    def f(v):
        return relax.const(float(v), dtype)

    def coord(axis: int, size: int):
        g = emit(op.squeeze(op.strided_slice(grid, axes=[3], begin=[axis], end=[axis + 1]), axis=[3]))
        if align:
            at = emit((g + f(1)) * f((size - 1) / 2))
        else:
            at = emit(((g + f(1)) * f(size) - f(1)) * f(0.5))
        return emit(op.clip(at, 0, size - 1)) if padding == 1 else at
    ix, iy = coord(0, w), coord(1, h)
    flat = emit(op.reshape(x, (n, c, h * w)))

    def tap(yi, xi, weight):
        """weight * x[n, :, yi, xi], zero where (yi, xi) falls outside."""
        # xi, yi hold whole numbers: clip(xi + 1, 0, 1) is 1 exactly when xi >= 0, clip(w - xi, 0, 1)
        # when xi <= w - 1 (arithmetic, not comparisons: TVM's analyzer fails on the bool vectors
        # a fused, vectorized kernel would bind)
        inside = [op.clip(xi + f(1), 0, 1), op.clip(f(w) - xi, 0, 1), op.clip(yi + f(1), 0, 1), op.clip(f(h) - yi, 0, 1)]
        xc, yc = emit(op.clip(xi, 0, w - 1)), emit(op.clip(yi, 0, h - 1))
        index = emit(op.astype(yc * f(w) + xc, "int64"))
        index = emit(op.broadcast_to(op.reshape(index, (n, 1, ho * wo)), (n, c, ho * wo)))
        picked = emit(op.reshape(op.gather_elements(flat, index, axis=2), (n, c, ho, wo)))
        scale = emit(op.reshape(weight * inside[0] * inside[1] * inside[2] * inside[3], (n, 1, ho, wo)))
        return emit(picked * scale)
    if mode == 1:  # nearest: round half to even, as nearbyint
        return tap(emit(op.round(iy)), emit(op.round(ix)), emit(op.ones_like(ix)))
    x0, y0 = emit(op.floor(ix)), emit(op.floor(iy))
    x1, y1 = emit(x0 + f(1)), emit(y0 + f(1))
    wx1, wy1 = emit(ix - x0), emit(iy - y0)
    wx0, wy0 = emit(f(1) - wx1), emit(f(1) - wy1)
    out = emit(tap(y0, x0, emit(wy0 * wx0)) + tap(y0, x1, emit(wy0 * wx1)))
    return emit(out + emit(tap(y1, x0, emit(wy1 * wx0)) + tap(y1, x1, emit(wy1 * wx1))))


def _affine_params(node, importer, at: int) -> tuple:
    """The per-channel scale and shift at ``node.args[at]`` and ``[at + 1]`` of a normalization
    over axis 1, ones and zeros where PyTorch passes None (no affine parameters)."""
    from tvm import relax

    x, args = importer.env[node.args[0]], node.args
    channels, dtype = int(x.ty.shape.values[1]), str(x.ty.dtype)
    return tuple(importer.env[args[i]] if len(args) > i and args[i] is not None
                 else relax.const(np.full(channels, fill, dtype), dtype) for i, fill in ((at, 1.0), (at + 1, 0.0)))


def _batch_norm_eval(node, importer):
    """``aten.batch_norm`` (x, weight, bias, running_mean, running_var, training, momentum, eps,
    cudnn_enabled) outside training, as the decomposition's ``_native_batch_norm_legit_no_training``
    (TVM's converter reads ``training`` as the momentum and the momentum as eps)."""
    from tvm import relax

    x, mean, var = (importer.env[node.args[i]] for i in (0, 3, 4))
    gamma, beta = _affine_params(node, importer, 1)
    eps = float(node.args[7]) if len(node.args) > 7 else float(node.kwargs.get("eps", 1e-5))
    out = importer.block_builder.emit(relax.op.nn.batch_norm(
        x, gamma, beta, mean, var, axis=1, epsilon=eps, center=node.args[2] is not None,
        scale=node.args[1] is not None, training=False))
    return importer.block_builder.emit(out[0])


def _hardtanh(node, importer):
    """``aten.hardtanh`` (x, min_val, max_val) with its bounds given either way (TVM's converter
    reads them only as keywords: ReLU6's positional 0 and 6 became -1 and 1)."""
    from tvm import relax

    low = node.args[1] if len(node.args) > 1 else node.kwargs.get("min_val", -1.0)
    high = node.args[2] if len(node.args) > 2 else node.kwargs.get("max_val", 1.0)
    return importer.block_builder.emit(relax.op.clip(importer.env[node.args[0]], float(low), float(high)))


def _attention(node, importer):
    """``aten.scaled_dot_product_attention`` (q, k, v, attn_mask, dropout_p = 0, is_causal, scale)
    as matmul, softmax, matmul (TVM's converter makes ``relax.nn.attention``, which only TVM's
    unscheduled kernel builds). A row whose scores are all masked out gives zeros, as PyTorch's
    ``_safe_softmax`` does."""
    import math

    from tvm import relax

    op, emit = relax.op, importer.block_builder.emit
    q, k, v = (importer.env[a] for a in node.args[:3])
    mask = node.args[3] if len(node.args) > 3 else node.kwargs.get("attn_mask")
    mask = importer.env[mask] if mask is not None else None
    causal = bool(node.args[5] if len(node.args) > 5 else node.kwargs.get("is_causal", False))
    dtype, shape = str(q.ty.dtype), [int(d) for d in q.ty.shape.values]
    scale = node.kwargs.get("scale")
    scale = 1.0 / math.sqrt(shape[-1]) if scale is None else float(scale)
    axes = list(range(len(k.ty.shape.values)))
    axes[-2], axes[-1] = axes[-1], axes[-2]
    scores = emit(op.multiply(op.matmul(q, op.permute_dims(k, axes)), relax.const(scale, dtype)))
    masked = causal or mask is not None
    if causal:
        rows, cols = shape[-2], int(k.ty.shape.values[-2])
        keep = relax.const(np.tril(np.ones((rows, cols), bool)))
        scores = emit(op.where(keep, scores, relax.const(-np.inf, dtype)))
    if mask is not None:
        scores = emit(op.where(mask, scores, relax.const(-np.inf, dtype)) if str(mask.ty.dtype) == "bool"
                      else op.add(scores, mask))
    probs = emit(op.nn.softmax(scores, axis=-1))
    if masked:
        dead = emit(op.equal(op.max(scores, axis=[-1], keepdims=True), relax.const(-np.inf, dtype)))
        probs = emit(op.where(dead, relax.const(0.0, dtype), probs))
    return emit(op.matmul(probs, v))


def _softplus(node, importer):
    """``aten.softplus`` as its decomposition writes it, ``where(x * beta > threshold, x,
    log1p(exp(x * beta)) / beta)`` with TVM's ``log1p`` (``log(1 + y)``); with beta 1, the form
    ``TanhSoftplus`` rewrites in Mish (TVM's converter makes ``relax.nn.softplus``, which only
    TVM's unscheduled kernel builds)."""
    from tvm import relax

    op, emit = relax.op, importer.block_builder.emit
    x = importer.env[node.args[0]]
    dtype = str(x.ty.dtype)
    beta = float(node.args[1] if len(node.args) > 1 else node.kwargs.get("beta", 1.0))
    threshold = float(node.args[2] if len(node.args) > 2 else node.kwargs.get("threshold", 20.0))
    scaled = x if beta == 1 else emit(op.multiply(x, relax.const(beta, dtype)))
    soft = emit(op.log(op.add(emit(op.exp(scaled)), relax.const(1, dtype))))
    if beta != 1:
        soft = emit(op.divide(soft, relax.const(beta, dtype)))
    return emit(op.where(emit(op.greater(scaled, relax.const(threshold, dtype))), x, soft))


def _with_alpha(relax_op: Callable, python_op: Callable) -> Callable:
    """``aten.add`` / ``aten.sub`` (a, b, alpha): ``a + alpha * b`` (TVM's converter drops alpha)."""
    def convert(node, importer):
        from tvm import relax

        alpha = node.kwargs.get("alpha", 1)
        if alpha == 1:
            return importer._binary_op(relax_op, python_op)(node)
        a, b = importer.retrieve_args(node)
        like = a if isinstance(a, relax.Expr) else b
        dtype = str(like.ty.dtype)
        if isinstance(a, relax.Expr) and isinstance(b, relax.Expr) and str(b.ty.dtype) != dtype:
            raise FrontendError(f"node '{node.name}': {node.target} with alpha={alpha} on {dtype} and "
                                f"{b.ty.dtype} tensors; cast one of them to the other's dtype first")
        emit = importer.block_builder.emit
        a, b = (v if isinstance(v, relax.Expr) else relax.const(v, dtype) for v in (a, b))
        return emit(relax_op(a, emit(relax.op.multiply(b, relax.const(alpha, dtype)))))
    return convert


def _transpose_2d(node, importer):
    """``aten.t``: a matrix's transpose (a vector or a scalar as it is)."""
    from tvm import relax

    x = importer.env[node.args[0]]
    if len(x.ty.shape.values) < 2:
        return x
    return importer.block_builder.emit(relax.op.permute_dims(x, [1, 0]))


def _layer_norm(node, importer):
    """``aten.layer_norm`` (x, normalized_shape, weight, bias, eps) with either of weight and
    bias None (``elementwise_affine=False``, ``bias=False``), which TVM's converter looks up."""
    args = node.args
    gamma, beta = (importer.env[args[i]] if len(args) > i and args[i] is not None else None for i in (2, 3))
    eps = float(args[4]) if len(args) > 4 else 1e-5
    return importer._layer_norm_impl(importer.env[args[0]], gamma, beta, eps, args[1])


def _group_norm(node, importer):
    """``aten.group_norm`` (x, groups, weight, bias, eps) with either of weight and bias None
    (``affine=False``: TVM's converter, and its decomposition's, failed to import it)."""
    from tvm import relax

    args = node.args
    x = importer.env[args[0]]
    gamma, beta = _affine_params(node, importer, 2)
    eps = float(args[4]) if len(args) > 4 else 1e-5
    return importer.block_builder.emit(relax.op.nn.group_norm(
        x, gamma, beta, num_groups=int(args[1]), channel_axis=1, axes=list(range(2, len(x.ty.shape.values))),
        epsilon=eps))


def _torch_converters() -> dict:
    from tvm import relax
    return {"batch_norm.default": _batch_norm_eval, "hardtanh.default": _hardtanh,
            "scaled_dot_product_attention.default": _attention, "softplus.default": _softplus,
            "layer_norm.default": _layer_norm, "group_norm.default": _group_norm,
            "add.Tensor": _with_alpha(relax.op.add, operator.add),
            "sub.Tensor": _with_alpha(relax.op.subtract, operator.sub), "t.default": _transpose_2d,
            "amax.default": _extreme(relax.op.max), "amin.default": _extreme(relax.op.min),
            "linear.default": _linear, "addmm.default": _addmm, "min.dim": _min_dim,
            "floor_divide.default": _divide("floor"), "div.Tensor": _divide(), "div.Scalar": _divide(),
            "div.Tensor_mode": _divide(read_mode=True), "upsample_nearest2d.vec": _upsample_nearest2d,
            "index.Tensor": _index_tensor, "grid_sampler_2d.default": _grid_sampler_2d}


TORCH_CONVERTERS = _torch_converters()  # ours, for the aten ops TVM's importer does not convert


# --------------------------------------------------------------------------- direct translation
def _positional(most: int, keywords: tuple[str, ...] = ()) -> Callable[[Any], bool]:
    """Accepts a node with at most ``most`` positional arguments and only these keywords."""
    return lambda node: len(node.args) <= most and set(node.kwargs) <= set(keywords)


def _arg(i: int, name: str, default: Any) -> Callable[[Any], Any]:
    return lambda node: node.args[i] if len(node.args) > i else node.kwargs.get(name, default)


_UNARY, _BINARY = _positional(1), _positional(2)
_NO_DTYPE = _positional(2)  # softmax / log_softmax (x, dim): TVM's converter drops a dtype argument
_REDUCE = _positional(3)  # sum / mean (x, dim, keepdim); with a dtype keyword, decomposed first
_TRAINING = _arg(5, "training", False)
_DROPOUT_ACTIVE = _arg(2, "train", False)


def _pad_accepted(node: Any) -> bool:
    """``F.pad``: a mode relax's pad takes and no negative width (a crop, which the decomposition
    turns into a slice)."""
    widths = node.args[1] if len(node.args) > 1 else []
    mode = _arg(2, "mode", "constant")(node)
    return (_positional(4)(node) and mode in ("constant", "reflect", "replicate", "circular")
            and all(isinstance(w, int) and w >= 0 for w in widths))


def _batch_norm_accepted(node: Any) -> bool:
    """Outside training and with running statistics (without them, batch statistics are used)."""
    return (_positional(9)(node) and not _TRAINING(node)
            and all(_arg(i, n, None)(node) is not None for i, n in ((3, "running_mean"), (4, "running_var"))))


#: aten ops that TVM's importer, with ``TORCH_CONVERTERS``, translates correctly from torch.export's
#: graph as it comes (pre-dispatch ATen), each with the arguments it accepts; every one is checked
#: against PyTorch in tests/test_direct_import.py. A graph of only these skips
#: ``run_decompositions``, which re-traces the whole program: 0.14-0.43 s on each benchmark model
#: here (Zen 4), against 1-7 ms for the translation itself.
DIRECT_OPS: dict[str, Callable[[Any], bool]] = {
    **{f"aten.{name}.default": _UNARY for name in (
        "relu", "sigmoid", "tanh", "exp", "sqrt", "rsqrt", "silu", "neg", "abs", "contiguous", "clone")},
    **{f"aten.{name}.Tensor": _BINARY for name in ("mul", "div")},
    "aten.add.Tensor": _positional(2, ("alpha",)), "aten.sub.Tensor": _positional(2, ("alpha",)),
    "aten.gelu.default": _positional(1, ("approximate",)),
    "aten.pow.Tensor_Scalar": _BINARY,
    "aten.hardtanh.default": _positional(3),
    "aten.softplus.default": _positional(3, ("beta", "threshold")),
    "aten.softmax.int": _NO_DTYPE, "aten.log_softmax.int": _NO_DTYPE,
    "aten.sum.dim_IntList": _REDUCE, "aten.mean.dim": _REDUCE, "aten.sum.default": _UNARY,
    "aten.mean.default": _UNARY, "aten.max.dim": _positional(3),
    "aten.layer_norm.default": _positional(6), "aten.group_norm.default": _positional(6),
    "aten.batch_norm.default": _batch_norm_accepted,
    "aten.dropout.default": lambda node: _positional(3)(node) and not _DROPOUT_ACTIVE(node),
    "aten.linear.default": _positional(3), "aten.mm.default": _BINARY, "aten.bmm.default": _BINARY,
    "aten.matmul.default": _BINARY, "aten.conv2d.default": _positional(7), "aten.pad.default": _pad_accepted,
    "aten.scaled_dot_product_attention.default": lambda node: (
        _positional(6, ("scale",))(node) and not _arg(4, "dropout_p", 0.0)(node)),
    **{f"aten.{name}": _positional(3) for name in (
        "view.default", "reshape.default", "permute.default", "transpose.int", "unsqueeze.default",
        "squeeze.dim", "flatten.using_ints", "select.int", "unflatten.int", "t.default")},
    "getitem": _BINARY,
}


def _op_name(target: Any) -> str:
    return "getitem" if target is operator.getitem else str(target)


def translates_directly(exported: Any) -> bool:
    """Every op of ``exported``'s graph is one of ``DIRECT_OPS``, with arguments it accepts."""
    for node in exported.graph.nodes:
        if node.op == "call_function":
            accepts = DIRECT_OPS.get(_op_name(node.target))
            if accepts is None or not accepts(node):
                return False
    return True


def from_onnx(model: Any, shape_dict: dict[str, Sequence[int]] | None = None) -> tvm.IRModule:
    """Import an ONNX ModelProto (or a path to one) with TVM's ONNX frontend."""
    import onnx
    from tvm.relax.frontend.onnx import from_onnx as _from_onnx

    if isinstance(model, (str, os.PathLike)):
        try:
            model = onnx.load(str(model))
        except Exception as err:
            raise FrontendError(f"cannot read ONNX model {model}: {_first_line(err)}") from err
    try:
        return _from_onnx(model, shape_dict=dict(shape_dict) if shape_dict else None)
    except Exception as err:
        raise FrontendError(f"TVM's ONNX importer failed: {_first_line(err)}") from err


def import_model(model: Any, example_inputs: Sequence[Any] | None = None,
                 shape_dict: dict[str, Sequence[int]] | None = None,
                 keep_params_as_input: bool = False) -> tvm.IRModule:
    """Dispatch on the model's kind: IRModule, torch.nn.Module, ExportedProgram, ONNX model,
    ``.onnx`` path or Symbol."""
    if isinstance(model, tvm.IRModule):
        return model
    if isinstance(model, Symbol):  # shape_dict: the shapes of some inputs; the rest are inferred
        shapes, dtypes = dict(shape_dict or {}), {}
        if example_inputs is not None:  # arrays for the symbol's first inputs (list_inputs order)
            names = model.list_inputs()
            if len(example_inputs) > len(names):
                raise InputError(f"{len(example_inputs)} example inputs for a symbol with {len(names)} inputs "
                                 f"{names}")
            for name, value in zip(names, example_inputs):
                arr = np.asarray(value)
                shapes.setdefault(name, arr.shape)
                dtypes[name] = str(arr.dtype)
        return model.to_relax(shapes=shapes, dtypes=dtypes)
    if isinstance(model, (str, os.PathLike)) and str(model).endswith(".onnx"):
        return from_onnx(model, shape_dict)
    kind = f"{type(model).__module__}.{type(model).__name__}"
    if kind.startswith("onnx"):
        return from_onnx(model, shape_dict)
    if kind == "torch.export.exported_program.ExportedProgram":
        return from_exported(model, keep_params_as_input)
    if _is_torch_module(model):
        if example_inputs is None:
            raise FrontendError("a torch.nn.Module needs example_inputs (a tuple of tensors) to be exported")
        return from_torch(model, example_inputs, keep_params_as_input)
    raise FrontendError(f"cannot compile a {kind}: pass a tvm.IRModule (Relax), a torch.nn.Module "
                        "with example_inputs, a torch.export.ExportedProgram, an onnx.ModelProto, a path to a .onnx file or a "
                        "tvm_ext.sym Symbol with shape_dict")


def _is_torch_module(model: Any) -> bool:
    try:
        import torch
    except ImportError:
        return False
    return isinstance(model, torch.nn.Module)


def _first_line(err: Exception) -> str:
    text = str(err).strip()
    return text.splitlines()[0].rstrip(".") if text else type(err).__name__
