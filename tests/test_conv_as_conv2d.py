"""ConvAsConv2d: 1-d and transposed convolutions become the conv2d we lower."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_ext
from conftest import build_module
from relay_passes.conv_as_conv2d import ConvAsConv2d

R = relax.op


def _calls(mod):
    out = []
    relax.analysis.post_order_visit(mod["main"], lambda e: out.append(e) if isinstance(e, relax.Call) else None)
    return out


def test_a_conv1d_becomes_reshape_conv2d_reshape_with_its_attributes_on_the_width():
    # x (2, 4, 10), w (6, 2, 3), stride 2, padding (1, 2), dilation 2, 2 groups:
    # output length (10 + 1 + 2 - 2 * (3 - 1) - 1) // 2 + 1 = 5
    mod = build_module(lambda x, w: R.nn.conv1d(x, w, strides=2, padding=(1, 2), dilation=2, groups=2),
                       [((2, 4, 10), "float32"), ((6, 2, 3), "float32")])
    out = ConvAsConv2d()(mod)
    ops = [c.op.name for c in _calls(out) if isinstance(c.op, tvm.ir.Op)]
    assert ops == ["relax.reshape", "relax.reshape", "relax.nn.conv2d", "relax.reshape"]
    conv = next(c for c in _calls(out) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.conv2d")
    assert [int(v) for v in conv.attrs.strides] == [1, 2]
    assert [int(v) for v in conv.attrs.padding] == [0, 1, 0, 2]
    assert [int(v) for v in conv.attrs.dilation] == [1, 2]
    assert int(conv.attrs.groups) == 2
    assert [int(d) for d in conv.args[0].ty.shape.values] == [2, 4, 1, 10]
    assert [int(d) for d in conv.args[1].ty.shape.values] == [6, 2, 1, 3]
    assert [int(d) for d in out["main"].ret_ty.shape.values] == [2, 6, 5]


def test_a_conv1d_of_symbolic_length_is_left_to_tvm():
    n = tvm.tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((2, 4, n), "float32"))
    w = relax.Var("w", relax.TensorType((6, 4, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            y = bb.emit_output(R.nn.conv1d(x, w, padding=1))
        bb.emit_func_output(y)
    out = ConvAsConv2d()(bb.get())
    assert [c.op.name for c in _calls(out) if isinstance(c.op, tvm.ir.Op)] == ["relax.nn.conv1d"]


@pytest.mark.parametrize("cin, cout, k, stride, padding, dilation, groups, length", [
    (3, 17, 3, 1, 1, 1, 1, 50),
    (17, 33, 5, 2, 2, 1, 1, 64),
    (16, 16, 3, 1, 2, 2, 16, 40),  # depthwise, dilated
    (8, 12, 4, 3, 0, 1, 4, 37),
])
def test_conv1d_modules_compile_to_our_kernels_and_agree_with_pytorch(cin, cout, k, stride, padding, dilation,
                                                                      groups, length):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv1d(cin, cout, k, stride, padding, dilation, groups), torch.nn.ReLU())
    module.eval()
    x = torch.randn(2, cin, length)
    compiled = tvm_ext.compile(module, (x,), strict=True)
    assert compiled.report().num_kernels == 1  # no TVM conv1d kernel left
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-4, atol=1e-4)


def _ops(mod):
    return [c.op.name for c in _calls(mod) if isinstance(c.op, tvm.ir.Op)]


def test_a_strided_transposed_conv_becomes_one_conv2d_per_output_phase_pixel_shuffled():
    # x (1, 2, 3, 3), w (2, 3, 3, 3) IOHW, stride 2, padding 1, output_padding 1: 6 x 6 out.
    # J = ceil(3 / 2) = 2 taps a phase, Q = (6 - 1 + 1) // 2 + 1 = 4 outputs a phase, so the data
    # is padded 1 before and 4 - 3 = 1 after; 3 x 2 x 2 = 12 output channels (o, r_h, r_w); the
    # 8 x 8 shuffle is cropped to [1, 7). Phase (0, 0) reads taps 2 and 0 (t + 1 = 2q), phase
    # (1, 1) tap 1 only.
    w = np.arange(54, dtype="float32").reshape(2, 3, 3, 3)
    mod = build_module(lambda x: R.nn.conv2d_transpose(x, relax.const(w), strides=2, padding=1, output_padding=1),
                       [((1, 2, 3, 3), "float32")])
    out = ConvAsConv2d()(mod)
    assert _ops(out) == ["relax.nn.conv2d", "relax.reshape", "relax.permute_dims", "relax.reshape",
                         "relax.strided_slice"]
    conv = next(c for c in _calls(out) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.conv2d")
    assert [int(v) for v in conv.attrs.strides] == [1, 1]
    assert [int(v) for v in conv.attrs.padding] == [1, 1, 1, 1]
    g = conv.args[1].value.numpy().reshape(3, 2, 2, 2, 2, 2)  # (o, r_h, r_w, c, m_h, m_w)
    np.testing.assert_array_equal(g[:, 0, 0, :, 0, 0], w[:, :, 2, 2].T)
    np.testing.assert_array_equal(g[:, 0, 0, :, 1, 1], w[:, :, 0, 0].T)
    np.testing.assert_array_equal(g[:, 1, 1, :, 1, 1], w[:, :, 1, 1].T)
    assert not g[:, 1, 1, :, 0, :].any() and not g[:, 1, 1, :, :, 0].any()  # tap 3 is past the kernel
    assert [int(d) for d in out["main"].ret_ty.shape.values] == [1, 3, 6, 6]


def test_a_dilated_transposed_conv_becomes_a_conv2d_of_the_zero_spread_data_with_the_flipped_weight():
    # stride 2, dilation 2, padding 1: the data spread to 6 x 6, padded 2 * (3 - 1) - 1 = 3 before
    # and 3 - 1 = 2 after (the spread's own trailing zero counts): (3 - 1) * 2 - 2 + 4 + 1 = 7 rows
    w = np.arange(54, dtype="float32").reshape(2, 3, 3, 3)
    mod = build_module(lambda x: R.nn.conv2d_transpose(x, relax.const(w), strides=2, padding=1, dilation=2),
                       [((1, 2, 3, 3), "float32")])
    out = ConvAsConv2d()(mod)
    assert _ops(out) == ["relax.reshape", "relax.nn.pad", "relax.reshape", "relax.nn.conv2d"]
    conv = next(c for c in _calls(out) if isinstance(c.op, tvm.ir.Op) and c.op.name == "relax.nn.conv2d")
    assert [int(v) for v in conv.attrs.padding] == [3, 3, 2, 2]
    assert [int(v) for v in conv.attrs.dilation] == [2, 2]
    assert [int(d) for d in conv.args[0].ty.shape.values] == [1, 2, 6, 6]
    np.testing.assert_array_equal(conv.args[1].value.numpy(), w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
    assert [int(d) for d in out["main"].ret_ty.shape.values] == [1, 3, 7, 7]


def test_a_transposed_conv_whose_stride_is_its_kernel_becomes_one_matmul():
    w = np.ones((4, 3, 2, 2), "float32")
    mod = build_module(lambda x: R.nn.conv2d_transpose(x, relax.const(w), strides=2), [((1, 4, 5, 5), "float32")])
    out = ConvAsConv2d()(mod)
    assert "relax.matmul" in _ops(out) and "relax.nn.conv2d" not in _ops(out)
    assert [int(d) for d in out["main"].ret_ty.shape.values] == [1, 3, 10, 10]


@pytest.mark.parametrize("cin, cout, k, stride, padding, output_padding, dilation, groups", [
    (3, 17, 3, 2, 1, 1, 1, 1),
    (17, 8, 4, 2, 1, 0, 1, 1),  # DCGAN's upsampling
    (32, 16, 2, 2, 0, 0, 1, 1),  # U-Net's: one matmul
    (8, 6, 3, 1, 1, 0, 2, 2),  # dilated, grouped
    (4, 4, 3, 2, 3, 0, 1, 1),  # padding beyond the kernel: fewer phase outputs than rows
    (5, 3, 1, 3, 0, 2, 1, 1),  # a kernel smaller than the stride: phases with no tap
    (6, 4, 3, 2, 2, 1, 2, 1),  # dilated: the zero-spread data
    (4, 6, 5, 3, 4, 0, 2, 1),  # dilated, padding beyond the spread's: cropped
])
def test_transposed_conv_modules_compile_to_our_kernels_and_agree_with_pytorch(cin, cout, k, stride, padding,
                                                                               output_padding, dilation, groups):
    torch.manual_seed(0)
    module = torch.nn.ConvTranspose2d(cin, cout, k, stride, padding, output_padding, groups, dilation=dilation)
    module.eval()
    x = torch.randn(2, cin, 9, 7)
    compiled = tvm_ext.compile(module, (x,), strict=True)
    assert all(k.source == "ours" for k in compiled.report().kernels)  # no TVM kernel left
    with torch.no_grad():
        want = module(x).numpy()
    np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-4, atol=1e-4)
