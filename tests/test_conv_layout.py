"""BlockConvLayout: convolutions in NCHW16c with BatchNorm folded, activations blocked between
convolutions, and the layouts it cannot block left in NCHW."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_ext
from tvm_ext.pipeline import Pipeline


def _ops(func: relax.Function) -> list[str]:
    out = []
    for block in func.body.blocks:
        for b in block.bindings:
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op):
                out.append(b.value.op.name.replace("relax.", ""))
    return out


def _calls(func: relax.Function, name: str) -> list[relax.Call]:
    return [b.value for block in func.body.blocks for b in block.bindings
            if isinstance(b.value, relax.Call) and isinstance(b.value.op, tvm.ir.Op) and b.value.op.name == name]


def _conv_bn_relu_conv(rng) -> tuple[tvm.IRModule, dict]:
    w1, w2 = (rng.standard_normal((32, 32, 3, 3)).astype("float32") * 0.1 for _ in range(2))
    gamma, beta, mean = (rng.standard_normal(32).astype("float32") for _ in range(3))
    var = rng.uniform(0.5, 2.0, 32).astype("float32")
    x = relax.Var("x", relax.TensorType((1, 32, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit(relax.op.nn.conv2d(x, relax.const(w1), padding=1))
            bn = bb.emit(relax.op.nn.batch_norm(y, *(relax.const(a) for a in (gamma, beta, mean, var)), axis=1,
                                                training=False))
            r = bb.emit(relax.op.nn.relu(bb.emit(relax.TupleGetItem(bn, 0))))
            out = bb.emit_output(relax.op.nn.conv2d(r, relax.const(w2), padding=1))
        bb.emit_func_output(out)
    return bb.get(), dict(w1=w1, w2=w2, gamma=gamma, beta=beta, mean=mean, var=var)


def test_two_convolutions_run_blocked_with_batch_norm_folded_between_them(rng):
    mod, p = _conv_bn_relu_conv(rng)
    main = Pipeline().prepare(mod)["main"]
    # one conversion in, one out; BatchNorm is x * scale + shift in the blocked layout
    assert _ops(main) == ["layout_transform", "nn.conv2d", "multiply", "add", "nn.relu", "nn.conv2d",
                          "layout_transform"]
    convs = _calls(main, "relax.nn.conv2d")
    for conv, w in zip(convs, (p["w1"], p["w2"])):
        assert (str(conv.attrs.data_layout), str(conv.attrs.kernel_layout), str(conv.attrs.out_layout)) == \
            ("NCHW16c", "OIHW16i16o", "NCHW16c")
        blocked = w.reshape(2, 16, 2, 16, 3, 3).transpose(0, 2, 4, 5, 3, 1)  # [o/16, i/16, kh, kw, i, o]
        np.testing.assert_array_equal(conv.args[1].value.numpy(), blocked)  # folded at compile time
    scale = p["gamma"] / np.sqrt(p["var"].astype("float64") + 1e-5)
    (mul,) = _calls(main, "relax.multiply")
    np.testing.assert_allclose(mul.args[1].value.numpy().reshape(32), scale, rtol=1e-6)
    assert mul.args[1].value.numpy().shape == (1, 2, 1, 1, 16)


@pytest.mark.parametrize("fusion", ["autofuse", "nnvm", "none"])
def test_blocked_convolutions_match_the_nchw_ones(rng, fusion):
    mod, _ = _conv_bn_relu_conv(rng)
    x = rng.standard_normal((1, 32, 8, 8)).astype("float32")
    want = tvm_ext.compile(mod, fusion=fusion, block_conv=False)(x)
    np.testing.assert_allclose(tvm_ext.compile(mod, fusion=fusion)(x), want, rtol=1e-4, atol=1e-4)


class OddChannels(torch.nn.Module):
    """3 -> 32 (NCHW: 3 is no block), 32 -> 32 blocked, 32 -> 17 and 17 -> 33 (NCHW), a strided
    and a 1x1 blocked, and a depthwise one (blocked too, OIHW1i16o)."""

    def __init__(self):
        super().__init__()
        c = torch.nn.Conv2d
        self.convs = torch.nn.ModuleList([c(3, 32, 3, padding=1), c(32, 32, 3, padding=1), c(32, 17, 3, padding=1),
                                          c(17, 33, 1), c(33, 32, 3, padding=1), c(32, 64, 3, stride=2, padding=1),
                                          c(64, 64, 1), c(64, 64, 3, padding=1, groups=64)])
        self.bns = torch.nn.ModuleList([torch.nn.BatchNorm2d(m.out_channels) for m in self.convs])
        for bn in self.bns:
            bn.running_mean.uniform_(-1, 1)
            bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        for conv, bn in zip(self.convs, self.bns):
            x = torch.relu(bn(conv(x)))
        return x


@pytest.mark.parametrize("fusion", ["autofuse", "nnvm"])
def test_odd_channel_counts_stay_nchw_and_all_match_pytorch(fusion):
    torch.manual_seed(0)
    model = OddChannels().eval()
    x = torch.randn(2, 3, 12, 12)
    pipeline = Pipeline(fusion=fusion)
    compiled = pipeline.run(model, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy()), model(x).numpy(), rtol=1e-4, atol=1e-4)
    from tvm_ext.frontends import from_torch
    layouts = [str(c.attrs.data_layout)
               for c in _calls(pipeline.prepare(from_torch(model, (x,)))["main"], "relax.nn.conv2d")]
    assert layouts == ["NCHW", "NCHW16c", "NCHW", "NCHW", "NCHW", "NCHW16c", "NCHW16c", "NCHW16c"]


class Grouped(torch.nn.Module):
    def __init__(self, last_groups: int):
        super().__init__()
        self.a = torch.nn.Conv2d(32, 32, 3, padding=1)
        self.b = torch.nn.Conv2d(32, 64, 3, padding=1, groups=2)  # groups of 16 in, 32 out: whole blocks
        self.c = torch.nn.Conv2d(64, 32, 1, groups=last_groups)

    def forward(self, x):
        return self.c(torch.relu(self.b(torch.relu(self.a(x)))))


@pytest.mark.parametrize("last_groups, layouts", [
    (1, ["NCHW16c", "NCHW16c", "NCHW16c"]),
    (4, ["NCHW", "NCHW", "NCHW"]),  # 8 output channels a group would split a block: the graph stays NCHW
])
def test_grouped_convolutions_block_only_in_whole_blocks(last_groups, layouts):
    torch.manual_seed(0)
    model = Grouped(last_groups).eval()
    x = torch.randn(1, 32, 6, 6)
    pipeline = Pipeline()
    compiled = pipeline.run(model, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy()), model(x).numpy(), rtol=1e-4, atol=1e-5)
    from tvm_ext.frontends import from_torch
    convs = _calls(pipeline.prepare(from_torch(model, (x,)))["main"], "relax.nn.conv2d")
    assert [str(c.attrs.data_layout) for c in convs] == layouts
    assert all(k.source == "ours" for k in compiled.report().kernels)


class DepthwiseBlock(torch.nn.Module):
    """MobileNetV2's middle: a 1x1 expansion, a depthwise 3x3 (stride 1 or 2, dilation 1 or
    2) with BatchNorm and ReLU6, and a 1x1 projection."""

    def __init__(self, stride: int, dilation: int = 1):
        super().__init__()
        self.expand = torch.nn.Conv2d(16, 48, 1, bias=False)
        self.dw = torch.nn.Conv2d(48, 48, 3, stride=stride, padding=dilation, dilation=dilation, groups=48, bias=True)
        self.bn = torch.nn.BatchNorm2d(48)
        self.bn.running_mean.uniform_(-1, 1)
        self.bn.running_var.uniform_(0.5, 2)
        self.project = torch.nn.Conv2d(48, 32, 1, bias=False)

    def forward(self, x):
        return self.project(torch.nn.functional.relu6(self.bn(self.dw(torch.relu(self.expand(x))))))


@pytest.mark.parametrize("stride, dilation", [(1, 1), (2, 1), (1, 2)])
@pytest.mark.parametrize("fusion", ["autofuse", "nnvm"])
def test_a_depthwise_convolution_runs_blocked_and_matches_pytorch(stride, dilation, fusion):
    # ConvertLayout leaves depthwise convolutions in NCHW; BlockConvLayout blocks them itself
    torch.manual_seed(0)
    model = DepthwiseBlock(stride, dilation).eval()
    x = torch.randn(2, 16, 13, 14)
    pipeline = Pipeline(fusion=fusion)
    compiled = pipeline.run(model, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy()), model(x).numpy(), rtol=1e-4, atol=1e-4)
    from tvm_ext.frontends import from_torch
    convs = _calls(pipeline.prepare(from_torch(model, (x,)))["main"], "relax.nn.conv2d")
    assert [(str(c.attrs.data_layout), str(c.attrs.kernel_layout), int(c.attrs.groups)) for c in convs] == [
        ("NCHW16c", "OIHW16i16o", 1), ("NCHW16c", "OIHW1i16o", 48), ("NCHW16c", "OIHW16i16o", 1)]
    convs = [k for k in compiled.report().kernels if "nn.conv2d" in k.ops]
    assert len(convs) == 3 and all("register_tile" in k.schedule for k in convs)  # none left to parallel_only


def test_an_op_convert_layout_cannot_carry_blocked_reads_nchw(rng):
    # conv -> relu -> group_norm: the convolution and ReLU run blocked, GroupNorm gets the NCHW
    # tensor back (TVM's layout rule for it mapped C to the blocks' axis and failed: "channel
    # axis must be divisible by 8, but got 2"), with its attributes as they were
    w = relax.const(rng.standard_normal((32, 16, 3, 3)).astype("float32"))
    g, b = (relax.const(rng.standard_normal(32).astype("float32")) for _ in range(2))
    x = relax.Var("x", relax.TensorType((2, 16, 8, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            r = bb.emit(relax.op.nn.relu(bb.emit(relax.op.nn.conv2d(x, w, padding=1))))
            out = bb.emit_output(relax.op.nn.group_norm(r, g, b, 8, 1, [2, 3]))
        bb.emit_func_output(out)
    main = Pipeline().prepare(bb.get())["main"]
    assert _ops(main) == ["layout_transform", "nn.conv2d", "nn.relu", "layout_transform", "nn.group_norm"]
    (gn,) = _calls(main, "relax.nn.group_norm")
    assert [int(d) for d in gn.args[0].ty.shape.values] == [2, 32, 8, 8]
    assert (int(gn.attrs.channel_axis), [int(a) for a in gn.attrs.axes]) == (1, [2, 3])


class _After(torch.nn.Module):
    def __init__(self, op, *mods):
        super().__init__()
        self.conv, self.op, self.mods = torch.nn.Conv2d(16, 32, 3, padding=1), op, torch.nn.ModuleList(mods)

    def forward(self, x):
        return self.op(torch.relu(self.conv(x)), *self.mods)


@pytest.mark.parametrize("name", ["group_norm", "layer_norm_chw", "mean_channels", "chunk", "spatial_attention",
                                  "instance_norm", "global_mean", "residual_add"])
def test_what_follows_a_blocked_convolution_matches_pytorch(name):
    torch.manual_seed(0)
    ops = {"group_norm": (lambda y, n: n(y), torch.nn.GroupNorm(8, 32)),
           "layer_norm_chw": (lambda y, n: n(y), torch.nn.LayerNorm([32, 8, 8])),
           "mean_channels": (lambda y: y.mean(1, keepdim=True),),
           "chunk": (lambda y: y.chunk(2, 1)[1],),
           "spatial_attention": (lambda y: y * torch.sigmoid(y.amax(1, keepdim=True)),),  # (N, 1, H, W) map
           "instance_norm": (lambda y, n: n(y), torch.nn.InstanceNorm2d(32, affine=True)),
           "global_mean": (lambda y: y.mean((2, 3)),),
           "residual_add": (lambda y: y + y.flip(1),)}
    model = _After(*ops[name]).eval()
    x = torch.randn(2, 16, 8, 8)
    compiled = tvm_ext.compile(model, (x,))
    with torch.no_grad():
        np.testing.assert_allclose(compiled(x.numpy()), model(x).numpy(), rtol=1e-4, atol=1e-4)
