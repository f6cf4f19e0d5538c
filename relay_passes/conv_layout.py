"""BlockConvLayout: convolutions in the channel-blocked layout NCHW[b]c, as TVM's x86 conv2d
schedules and oneDNN run them.

In NCHW a convolution's output channels lie ``H * W`` floats apart, so the register tile
vectorizes over the width and broadcasts one weight per FMA. Blocked, ``b`` output channels
are contiguous: the tile is ``pixels x b``, each FMA multiplies a vector of ``b`` weights
(``OIHW[b]i[b]o``, contiguous over the output block) by one input value, and every input
value is read once per ``b`` output channels instead of once per channel.

The pass folds inference BatchNorm with constant statistics into a multiply and an add
(``x * scale + shift``, both computed here), so that TVM's ``ConvertLayout`` carries the
elementwise ops between convolutions in the blocked layout too: activations stay blocked
from one convolution to the next, and the only ``layout_transform``s left are at the
graph's edges and around ops that need NCHW: every op that is not elementwise, broadcast or in
``_CARRIED`` reads NCHW (ConvertLayout's rules for GroupNorm, a LayerNorm or mean over C and
split got the blocked channels wrong). Constant weights are transformed once, at
compile time (FoldWeightLayout folds the ``layout_transform`` of a constant). A convolution
whose channels are not multiples of ``b`` stays NCHW; grouped convolutions run blocked when
their groups are whole blocks, and a graph with one whose groups are not stays NCHW
throughout. ConvertLayout leaves depthwise convolutions in NCHW, where a stride makes every
vector load a gather; this pass then blocks them itself (``NCHW[b]c x OIHW1i[b]o``, a vector
of ``b`` channels per load whatever the stride) between layout transforms, which fusion
turns into index maps that cancel (MobileNetV2's stride-2 block: its depthwise kernel 1.02
ms NCHW, see ``bench/run.py``'s inverted_residual_s2).
"""
from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.expr_functor import PyExprMutator, mutator

from relay_passes.simplify import bound_constant, rewrite_functions
from tvm_ext.patterns import OpPattern
from tvm_ext.registry import OPS, OpRegistry

# Ops that TVM's ConvertLayout carries in NCHW[b]c correctly, besides the elementwise and
# broadcast ones; every other op reads NCHW (``_Fence``). Its layout rules for group_norm,
# layer_norm over C, mean(keepdims) and split map C to the blocks' axis alone: a GroupNorm after
# a convolution failed to compile, a split raised in the pass.
_CARRIED = frozenset({"relax.nn.conv2d", "relax.layout_transform", "relax.nn.max_pool2d", "relax.nn.avg_pool2d",
                      "relax.nn.adaptive_avg_pool2d", "relax.concat", "relax.reshape", "relax.permute_dims",
                      "relax.strided_slice", "relax.nn.softmax", "relax.image.resize2d"})
_FENCE = "relax.builtin.stop_lift_params"  # an identity without a layout rule: its input stays NCHW


@tvm.ir.transform.module_pass(opt_level=0, name="BlockConvLayout")
class BlockConvLayout:
    """NCHW x OIHW conv2d to NCHW[block]c x OIHW[block]i[block]o, with what lies between
    convolutions carried in the blocked layout."""

    def __init__(self, block: int = 16, registry: OpRegistry = OPS):
        self.block = block
        self.registry = registry

    def transform_module(self, mod: tvm.IRModule, ctx) -> tvm.IRModule:
        if not _has_nchw_conv(mod, self.block) or _splits_a_block(mod, self.block):
            return mod
        mod = rewrite_functions(mod, _FoldBatchNorm(mod))
        b = self.block
        mod = rewrite_functions(mod, _Fence(mod, self.registry, b, fence=True))
        mod = relax.transform.ConvertLayout({"relax.nn.conv2d": [f"NCHW{b}c", f"OIHW{b}i{b}o"]})(mod)
        mod = rewrite_functions(mod, _Fence(mod, self.registry, b, fence=False))
        return rewrite_functions(mod, _BlockDepthwise(mod, b))


def _convs(mod: tvm.IRModule) -> list[relax.Call]:
    """Every conv2d call of the module's Relax functions."""
    found = []

    def visit(expr):
        if isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op) and expr.op.name == "relax.nn.conv2d":
            found.append(expr)
    for _, func in mod.functions_items():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def tensor_dims(ty) -> list | None:
    """Each dim of a tensor type, an int where static, None where symbolic; None for no shape."""
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    return [int(d) if isinstance(d, tvm.tirx.IntImm) else None for d in ty.shape.values]


def _has_nchw_conv(mod: tvm.IRModule, block: int) -> bool:
    """Whether a float32 NCHW conv2d without groups has channels in whole blocks."""
    for conv in _convs(mod):
        x, w = (tensor_dims(a.ty) for a in conv.args[:2])
        if (str(conv.attrs.data_layout) == "NCHW" and int(conv.attrs.groups) == 1 and x and w
                and str(conv.args[0].ty.dtype) == "float32" and None not in (x[1], w[0])
                and x[1] % block == 0 and w[0] % block == 0):
            return True
    return False


def _splits_a_block(mod: tvm.IRModule, block: int) -> bool:
    """Whether a grouped (not depthwise) conv2d has groups of channels that are not whole blocks:
    ConvertLayout would block it anyway, into a convolution no kernel computes."""
    for conv in _convs(mod):
        groups = int(conv.attrs.groups)
        if groups == 1:
            continue
        w = tensor_dims(conv.args[1].ty)
        if w is None or None in w[:2] or (w[1] != 1 and (w[1] % block or (w[0] // groups) % block)):
            return True
    return False


@mutator
class _BlockDepthwise(PyExprMutator):
    """A float32 NCHW depthwise conv2d (one channel a group, channels in whole blocks) with a
    constant weight becomes NCHW[b]c x OIHW1i[b]o between a layout_transform in and out."""

    def __init__(self, mod: tvm.IRModule, block: int):
        super().__init__(mod)
        self.block = block

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.conv2d"):
            return call
        attrs, b = call.attrs, self.block
        x = tensor_dims(call.args[0].ty)
        weight = bound_constant(self, call.args[1])
        if (str(attrs.data_layout) != "NCHW" or str(attrs.kernel_layout) != "OIHW" or str(attrs.out_layout) != "NCHW"
                or x is None or x[1] is None or int(attrs.groups) != x[1] or x[1] % b or weight is None
                or str(call.args[0].ty.dtype) != "float32" or str(weight.value.dtype) != "float32"):
            return call
        w = weight.value.numpy()
        if w.shape[0] != x[1] or w.shape[1] != 1:
            return call  # a channel multiplier: several outputs a group
        kh, kw = w.shape[2:]
        blocked_w = np.ascontiguousarray(w.reshape(x[1] // b, b, kh, kw).transpose(0, 2, 3, 1)
                                         .reshape(x[1] // b, 1, kh, kw, 1, b))
        data = relax.op.layout_transform(call.args[0], lambda n, c, h, w_: (n, c // b, h, w_, c % b))
        conv = self.builder_.normalize(relax.op.nn.conv2d(
            data, relax.const(blocked_w), strides=attrs.strides, padding=attrs.padding, dilation=attrs.dilation,
            groups=attrs.groups, data_layout=f"NCHW{b}c", kernel_layout=f"OIHW1i{b}o", out_layout=f"NCHW{b}c",
            out_dtype=attrs.out_dtype))
        return relax.op.layout_transform(conv, lambda n, cb, h, w_, c: (n, cb * b + c, h, w_))


@mutator
class _Fence(PyExprMutator):
    """``fence=True``: every tensor argument of a call ConvertLayout cannot carry blocked (not in
    ``_CARRIED``, not elementwise or broadcast, or broadcast with 4-D arguments whose channels
    are no whole blocks) is read through an identity without a layout rule, so ConvertLayout
    hands that call NCHW. ``fence=False``: the identities are removed."""

    def __init__(self, mod: tvm.IRModule, registry: OpRegistry, block: int, fence: bool):
        super().__init__(mod)
        self.registry, self.block, self.fence = registry, block, fence

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not isinstance(call.op, tvm.ir.Op):
            return call
        if not self.fence:
            return call.args[0] if call.op.name == _FENCE else call
        opdef = self.registry.get(call.op.name)
        if call.op.name in _CARRIED or (opdef is not None and opdef.pattern_of(call) <= OpPattern.BROADCAST
                                        and not self._broadcasts_channels(call)):
            return call
        args = [self._fenced(a) for a in call.args]
        return relax.Call(call.op, args, call.attrs, call.ty_args) if any(
            not a.same_as(b) for a, b in zip(args, call.args)) else call

    def _broadcasts_channels(self, call: relax.Call) -> bool:
        """Whether a 4-D argument's channels are no whole blocks (a one-channel attention map
        times a convolution's output): ConvertLayout cannot block it and failed ("Cannot
        broadcast from 5 to 4")."""
        dims = [tensor_dims(a.ty) for a in call.args if isinstance(a.ty, relax.TensorType) and a.ty.ndim == 4]
        return len(dims) > 1 and any(d is None or d[1] is None or d[1] % self.block for d in dims)

    def _fenced(self, arg: relax.Expr) -> relax.Expr:
        if isinstance(arg, relax.Tuple):
            fields = [self._fenced(f) for f in arg.fields]
            return relax.Tuple(fields) if any(not a.same_as(b) for a, b in zip(fields, arg.fields)) else arg
        if isinstance(arg.ty, relax.TensorType) and arg.ty.ndim == 4:
            return self.builder_.emit(relax.op.builtin.stop_lift_params(arg))
        return arg


@mutator
class _FoldBatchNorm(PyExprMutator):
    """Inference ``batch_norm`` with constant parameters becomes ``x * scale + shift``."""

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = self.visit_expr_post_order(call)
        if not (isinstance(call.op, tvm.ir.Op) and call.op.name == "relax.nn.batch_norm") or call.attrs.training:
            return call
        consts = [bound_constant(self, a) for a in call.args[1:5]]
        ty = call.args[0].ty
        if any(c is None for c in consts) or not isinstance(ty, relax.TensorType) or ty.shape is None:
            return call
        gamma, beta, mean, var = (c.value.numpy().astype(np.float64) for c in consts)
        attrs = call.attrs
        if not attrs.scale:
            gamma = np.ones_like(gamma)
        if not attrs.center:
            beta = np.zeros_like(beta)
        x = call.args[0]
        ndim, axis, dtype = len(x.ty.shape.values), int(attrs.axis), str(x.ty.dtype)
        shape = [1] * ndim
        shape[axis % ndim] = gamma.size
        scale = gamma / np.sqrt(var + float(attrs.epsilon))
        shift = beta - mean * scale
        y = relax.op.add(relax.op.multiply(x, relax.const(scale.reshape(shape).astype(dtype))),
                         relax.const(shift.reshape(shape).astype(dtype)))
        return relax.Tuple([y, call.args[3], call.args[4]])
