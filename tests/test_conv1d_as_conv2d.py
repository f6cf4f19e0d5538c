"""Conv1dAsConv2d: a 1-d convolution becomes a 2-d one over a height of 1, which we lower."""
import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_ext
from conftest import build_module
from relay_passes.conv1d_as_conv2d import Conv1dAsConv2d

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
    out = Conv1dAsConv2d()(mod)
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
    out = Conv1dAsConv2d()(bb.get())
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
