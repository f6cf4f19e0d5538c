"""FuseCompile: one PrimFunc per group, kernel-local stages, and fallback to TVM's kernels."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax, tirx

import tvm_ext
from conftest import build_module, compile_strict
from relay_passes import FuseCompile, MakeGroups
from relay_passes.simplify import FoldWeightLayout

R = relax.op


def _prim_funcs(mod):
    return {gv.name_hint: f for gv, f in mod.functions_items() if isinstance(f, tirx.PrimFunc)}


def _blocks(func):
    from tvm import s_tir
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    return [sch.get(b).name_hint for b in sch.get_child_blocks(sch.get_sblock("root"))]


def test_a_group_becomes_one_prim_func_called_with_call_tir():
    mod = build_module(lambda x, b: R.nn.gelu(R.multiply(R.add(x, b), relax.const(3.0, "float32"))),
                       [((4, 8), "float32"), ((8,), "float32")])
    out = tvm.transform.Sequential([MakeGroups("chains"), FuseCompile(strict=True)])(mod)
    prims = _prim_funcs(out)
    assert list(prims) == ["fused_add_multiply_gelu"]
    assert _blocks(prims["fused_add_multiply_gelu"]) == ["gv"]  # the whole chain is one TE compute
    calls = [b.value for b in out["main"].body.blocks[0].bindings]
    assert len(calls) == 1 and calls[0].op.name == "relax.call_tir"
    assert not [f for f in out.functions.values() if isinstance(f, relax.Function) and "Primitive" in (f.attrs or {})]


def test_groups_whose_kernels_differ_only_in_names_share_one_prim_func(rng):
    """Four layers softmax(h + c_i), c_i a different vector each (a kernel argument), then
    a = log_softmax(h * 2) and log_softmax(a * 3) (2 and 3 literals in their kernels). "chains" makes
    each op a group: the four adds share one kernel, the four softmaxes one, the two multiplies
    keep one each, the two log_softmaxes share one. A group that shares is not lowered again
    (the adds take the first add's lowering with their own c_i)."""
    cs = [rng.standard_normal(32).astype("float32") for _ in range(4)]

    def net(x):
        h = x
        for c in cs:
            h = R.nn.softmax(R.add(h, relax.const(c)), axis=-1)
        a = R.nn.log_softmax(R.multiply(h, relax.const(2.0, "float32")), axis=-1)
        return R.nn.log_softmax(R.multiply(a, relax.const(3.0, "float32")), axis=-1)
    mod = build_module(net, [((4, 32), "float32")])
    fuse = FuseCompile(strict=True)
    out = tvm.transform.Sequential([MakeGroups("chains"), fuse])(mod)
    called = [b.value.args[0].name_hint for b in out["main"].body.blocks[0].bindings]
    assert called == ["fused_add", "fused_softmax"] * 4 + ["fused_multiply", "fused_log_softmax",
                                                          "fused_multiply1", "fused_log_softmax"]
    assert sorted(_prim_funcs(out)) == sorted(set(called))
    assert fuse.log.shared == {"fused_add1": "fused_add", "fused_add2": "fused_add", "fused_add3": "fused_add",
                               "fused_softmax1": "fused_softmax", "fused_softmax2": "fused_softmax",
                               "fused_softmax3": "fused_softmax", "fused_log_softmax1": "fused_log_softmax"}
    # the same groups but for names and c_i's contents: lowered once, each with its own c_i
    assert fuse.log.reused == {k: v for k, v in fuse.log.shared.items()}

    x = rng.standard_normal((4, 32)).astype("float32")
    h = x
    for c in cs:
        e = np.exp(h + c - (h + c).max(-1, keepdims=True))
        h = e / e.sum(-1, keepdims=True)
    for k in (2.0, 3.0):
        z = h * k
        h = z - z.max(-1, keepdims=True) - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True))
    compiled = compile_strict(mod, fusion="chains")
    assert len(compiled.report().kernels) == 12
    np.testing.assert_allclose(compiled(x), h, rtol=1e-5, atol=1e-6)


def test_softmax_is_one_kernel_with_local_reduction_stages():
    mod = build_module(lambda x: R.nn.softmax(x, axis=-1), [((4, 32), "float32")])
    out = tvm.transform.Sequential([MakeGroups("chains"), FuseCompile(strict=True)])(mod)
    (func,) = _prim_funcs(out).values()
    assert _blocks(func) == ["gv_max", "gv_exp", "gv_sum", "gv"]
    assert len(func.params) == 2  # x in, the result out: the reductions and the exp stay inside
    text = str(func.attrs["tvm_ext.loop_ir"])
    assert "local gv_max" in text and "local gv_exp" in text and "local gv_sum" in text and "store gv" in text


def test_a_float_max_is_one_reduction_over_integer_keys():
    # PyTorch's NaN and -inf rules in the reduction itself: no second pass over a class of each
    # element (2048 x 1024 amax + x: 0.139 -> 0.116 ms, Zen 4)
    mod = build_module(lambda x: R.max(x, axis=[-1]), [((4, 32), "float32")])
    out = tvm.transform.Sequential([MakeGroups("chains"), FuseCompile(strict=True)])(mod)
    (func,) = _prim_funcs(out).values()
    from tvm import s_tir
    sch = s_tir.Schedule(tvm.IRModule({"main": func}))
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    reductions = [b for b in blocks if any(int(iv.iter_type) == 2 for iv in b.iter_vars)]  # 2: a reduce axis
    assert len(reductions) == 1
    assert str(reductions[0].writes[0].source.dtype) == "int32"


def test_constants_become_literals_or_kernel_arguments():
    w = np.arange(8, dtype="float32")
    mod = build_module(lambda x: R.add(R.multiply(x, relax.const(2.0, "float32")), relax.const(w)),
                       [((3, 8), "float32")])
    out = tvm.transform.Sequential([MakeGroups("chains"), FuseCompile(strict=True)])(mod)
    (func,) = _prim_funcs(out).values()
    assert len(func.params) == 3  # x, the (8,) constant as a buffer, the output; 2.0 is a literal
    x = np.random.default_rng(0).standard_normal((3, 8)).astype("float32")
    np.testing.assert_allclose(compile_strict(mod, "chains")(x), x * 2 + w, rtol=1e-6)


def test_not_lowerable_group_falls_back_to_tvm_kernels():
    # conv2d in NHWC layout: our lowering declines (NotLowerable), TVM's kernel runs instead.
    def make(x, w):
        return R.nn.relu(R.nn.conv2d(x, w, data_layout="NHWC", kernel_layout="HWIO"))
    mod = build_module(make, [((1, 6, 6, 3), "float32"), ((3, 3, 3, 4), "float32")])
    compiled = compile_strict(mod, fusion="chains")
    report = compiled.report()
    assert any("NCHW" in why for why in report.fallbacks.values()), report.fallbacks
    sources = {k.ops[0]: k.source for k in report.kernels}
    assert sources["nn.relu"] == "ours" and "tvm" in sources.values()
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 6, 6, 3)).astype("float32"), rng.standard_normal((3, 3, 3, 4)).astype("float32")
    ref = np.zeros((1, 4, 4, 4), "float32")
    for i in range(4):
        for j in range(4):
            ref[0, i, j] = np.einsum("abc,abcd->d", x[0, i:i + 3, j:j + 3], w)
    np.testing.assert_allclose(compiled(x, w), np.maximum(ref, 0), rtol=1e-5, atol=1e-5)


def test_symbolic_shapes_keep_tvm_kernels_and_run_at_any_size():
    n = tirx.Var("n", "int64")
    x = relax.Var("x", relax.TensorType((n, 8), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(R.exp(R.add(x, relax.const(1.0, "float32"))))
        bb.emit_func_output(out)
    compiled = tvm_ext.compile(bb.get(), strict=True)
    kernels = compiled.report().kernels
    assert [k.source for k in kernels] == ["tvm", "tvm"]  # add and exp, each TVM's kernel
    assert all("symbolic shape" in d.reason for d in compiled.report().decisions if d.action == "extern")
    assert compiled.inputs[0].shape == ("n", 8)
    for rows in (1, 5):
        xv = np.random.default_rng(rows).standard_normal((rows, 8)).astype("float32")
        np.testing.assert_allclose(compiled(xv), np.exp(xv + 1), rtol=1e-5)


def test_strict_mode_raises_on_a_broken_lowering():
    from tvm_ext.registry import OPS, OpDef, OpRegistry
    from tvm_ext.patterns import OpPattern

    def broken(node):
        raise TypeError("bug in a lowering")

    registry = OpRegistry()
    registry.register(OpDef("relax.exp", OpPattern.ELEMWISE, broken))
    mod = build_module(R.exp, [((4,), "float32")])
    grouped = MakeGroups("chains", registry=registry)(mod)
    with pytest.raises(TypeError, match="bug in a lowering"):
        FuseCompile(registry=registry, strict=True)(grouped)
    with pytest.warns(UserWarning, match="bug in a lowering"):
        relaxed = FuseCompile(registry=registry)(grouped)
    assert not _prim_funcs(relaxed)  # the op was inlined back for TVM's LegalizeOps
    assert len(OPS) > len(registry)


def test_cse_around_weights_merges_what_relax_cse_merges_but_equal_copies_of_a_weight():
    # y = x @ W, z = x @ W (one constant object), u = x @ W' (an equal copy), s1 = 1 + x, s2 = 1 + x:
    # z becomes y and s2 becomes s1, as Relax's CSE does; u stays (Relax's CSE, hashing bytes, merges it)
    from relay_passes.simplify import HELD_BYTES, EliminateCommonSubexprAroundWeights

    w = np.random.default_rng(0).standard_normal((128, 128)).astype("float32")
    assert w.nbytes >= HELD_BYTES
    c, c_copy = relax.const(w), relax.const(w.copy())
    x = relax.Var("x", relax.TensorType((4, 128), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y, z, u = (bb.emit(R.matmul(x, k)) for k in (c, c, c_copy))
            s1, s2 = (bb.emit(R.add(relax.const(1.0, "float32"), x)) for _ in range(2))
            gv = bb.emit_output(relax.Tuple([R.add(R.add(y, z), u), R.multiply(s1, s2)]))
        bb.emit_func_output(gv)
    mod = bb.get()
    out = EliminateCommonSubexprAroundWeights()(mod)
    assert [p.name for p in out["main"].params] == ["x"]
    values = [b.value for b in out["main"].body.blocks[0].bindings]
    calls = [v for v in values if isinstance(v, relax.Call)]
    assert [v.op.name for v in calls] == ["relax.matmul", "relax.matmul", "relax.add", "relax.add", "relax.add",
                                          "relax.multiply"]
    assert calls[0].args[1].same_as(c) and calls[1].args[1].same_as(c_copy)  # constants again, not parameters
    assert sum(isinstance(v, relax.Var) for v in values) == 2  # z = y, s2 = s1
    xs = np.random.default_rng(1).standard_normal((4, 128)).astype("float32")
    got = tvm_ext.compile(out)(xs)
    np.testing.assert_allclose(got[0], 3 * (xs @ w), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(got[1], (1 + xs) ** 2, rtol=1e-6)


def test_folding_a_layout_op_of_a_scalar_constant_keeps_it_0_d():
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = bb.emit(R.reshape(relax.const(np.array(3.0, "float32")), ()))
            gv = bb.emit_output(R.add(x, R.broadcast_to(c, ())))
        bb.emit_func_output(gv)
    folded = FoldWeightLayout()(bb.get())
    consts = [b.value for b in folded["main"].body.blocks[0].bindings if isinstance(b.value, tvm.ir.GenericConst)]
    assert consts and consts[0].value.numpy().shape == ()
    out = tvm_ext.compile(bb.get())(np.array(2.0, "float32"))
    assert out.shape == () and float(out) == 5.0


def _matmuls_of_constant(w: np.ndarray, uses: int):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, w.shape[0]), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            c = relax.const(w)
            outs = [bb.emit(R.matmul(x, c)) for _ in range(uses)]
            gv = bb.emit_output(outs[0] if uses == 1 else R.add(*outs))
        bb.emit_func_output(gv)
    return bb.get()


def test_pack_matmul_weights_stores_a_constant_operand_in_column_panels():
    # W (128, 64), panels of 32: Wp (2, 128, 32) with Wp[p, k, c] = W[k, 32 p + c], viewed back
    # as (128, 64) by permute_dims [1, 0, 2] and reshape; two matmuls of W share one copy
    from relay_passes import PackMatmulWeights

    w = np.arange(128 * 64, dtype="float32").reshape(128, 64) / 1000
    mod = PackMatmulWeights(panel=32, min_elements=0)(_matmuls_of_constant(w, uses=2))
    bindings = mod["main"].body.blocks[0].bindings
    consts = [v.value.numpy() for b in bindings for v in [b.value] + list(getattr(b.value, "args", []))
              if isinstance(v, tvm.ir.GenericConst)]
    assert [c.shape for c in consts] == [(2, 128, 32)]
    assert consts[0][1, 5, 7] == w[5, 32 + 7]
    ops = [b.value.op.name for b in bindings if isinstance(b.value, relax.Call)]
    assert ops == ["relax.permute_dims", "relax.reshape", "relax.matmul", "relax.matmul", "relax.add"]
    x = np.random.default_rng(0).standard_normal((4, 128)).astype("float32")
    np.testing.assert_allclose(tvm_ext.compile(mod)(x), 2 * x @ w, rtol=1e-5, atol=1e-4)


def test_passes_read_a_constant_through_a_read_only_view_of_its_tensor():
    from relay_passes.simplify import constant_data

    const = relax.const(np.arange(6, dtype="float32").reshape(2, 3))
    view = constant_data(const)
    assert view.shape == (2, 3) and view.dtype == np.float32 and view[1, 2] == 5.0
    with pytest.raises(ValueError):
        view[0, 0] = 1.0
    np.from_dlpack(const.value)[0, 0] = 7.0  # the tensor's own memory: a copy would not see it
    assert view[0, 0] == 7.0


def test_a_folded_constant_is_its_value_in_c_order_and_a_scalar_stays_0_d():
    from relay_passes.simplify import new_constant_data

    w = np.arange(12, dtype="float32").reshape(3, 4)
    folded = relax.const(new_constant_data(w.T), "float32").value.numpy()
    assert folded.shape == (4, 3) and folded.flags.c_contiguous
    np.testing.assert_array_equal(folded, w.T)
    assert relax.const(new_constant_data(np.asarray(np.float32(2.5))), "float32").value.numpy().shape == ()
    big = np.random.default_rng(0).standard_normal((2, 300, 517)).astype("float32")  # partial tiles
    for view in (big.transpose(0, 2, 1), big.transpose(2, 1, 0), big.transpose(1, 0, 2)):
        np.testing.assert_array_equal(new_constant_data(view).numpy(), view)


@pytest.mark.parametrize("shape", [(128, 48), (8, 64)])  # columns not a multiple of the panel; too small
def test_pack_matmul_weights_leaves_other_weights_alone(shape):
    from relay_passes import PackMatmulWeights

    mod = _matmuls_of_constant(np.ones(shape, "float32"), uses=1)
    packed = PackMatmulWeights(panel=32)(mod)
    calls = [b.value for b in packed["main"].body.blocks[0].bindings if isinstance(b.value, relax.Call)]
    assert [c.op.name for c in calls] == ["relax.matmul"]


def test_a_packed_weight_makes_an_anchor_whose_tile_stays_in_a_panel():
    # compiled from a constant W (256, 64): the kernel reads Wp[j // P, k, j % P], P two float32
    # vectors of the target (32 with AVX-512, 16 with AVX2); analysis sees an anchor with
    # period P and the register tile divides it
    from schedules import Machine, ScheduleBuilder, block_infos

    w = np.random.default_rng(1).standard_normal((256, 64)).astype("float32")
    pipe = tvm_ext.Pipeline(schedule=False)
    machine = Machine.for_target(pipe.target)
    panel = 2 * machine.vector_bytes // 4
    lowered, _ = pipe.lower(pipe.prepare(_matmuls_of_constant(w, uses=1)))
    func = next(f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc))
    (info,) = block_infos(ScheduleBuilder(func).sch)
    assert (info.kind, info.period) == ("anchor", panel)
    from schedules.policies import RegisterTiledAnchor
    assert all(panel % t == 0 for t in RegisterTiledAnchor(machine).space(info)["tile_j"])
    x = np.random.default_rng(2).standard_normal((4, 256)).astype("float32")
    np.testing.assert_allclose(tvm_ext.compile(_matmuls_of_constant(w, uses=1))(x), x @ w, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(64, 48), (3, 40, 16)])
def test_a_matmul_of_a_transposed_input_copies_it_in_rows_and_is_a_register_tile(shape):
    # q @ k^T of an input k: no operand ran along the output's columns, so the matmul was summed
    # dot product by dot product (attention 8x8x128x64: 3.9 ms of kernels, 1.5 with the copy;
    # 512^3: 3.1 -> 1.5 ms; Zen 4). k^T is now a kernel-local stage in (k, n) order
    perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
    mod = build_module(lambda q, k: R.matmul(q, R.permute_dims(k, perm)), [(shape, "float32"), (shape, "float32")])
    pipe = tvm_ext.Pipeline()
    lowered, _ = pipe.lower(pipe.prepare(mod))
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    policies = [entry.split(":")[1] for entry in str(func.attrs["tvm_ext.schedule"]).split(", ")]
    assert "register_tile" in policies and "row_per_core" not in policies
    q, k = (np.random.default_rng(i).standard_normal(shape).astype("float32") for i in (0, 1))
    np.testing.assert_allclose(tvm_ext.compile(mod)(q, k), q @ np.swapaxes(k, -1, -2), rtol=1e-4, atol=1e-4)


def test_read_across_tells_a_transposed_view_from_contiguous_and_packed_reads():
    from tvm_ext import loop_ir as L
    from tvm_ext.lowering import TensorValue
    from tvm_ext.ops.anchors import _read_across
    buf = L.Buffer("b", (8, 16), "float32")
    view = lambda load: TensorValue((16, 8), "float32", load, "b")  # noqa: E731
    assert _read_across(view(lambda i: L.Load(buf, (i[1], i[0]))), 1)  # b^T: its columns are b's rows
    assert not _read_across(view(lambda i: L.Load(buf, (i[1] % 8, i[0]))), 0)  # along b's last axis
    panels = L.Buffer("p", (2, 8, 8), "float32")  # a weight packed in panels of 8 columns: j // 8, k, j % 8
    assert not _read_across(TensorValue((8, 16), "float32", lambda i: L.Load(panels, (i[1] // 8, i[0], i[1] % 8)),
                                        "p"), 1)


def test_statistics_over_a_reshape_are_vectorized_row_reductions():
    # variance over (4, 48, 30, 30) seen as (4, 8, 5400): both passes (the mean, then the
    # centred squares, which read the mean along the output axis) are rows of 5400 contiguous
    # floats; before, the first was a scalar loop (the reshape's div/mod hid the row) and the
    # second a register tile (the mean's read looked like a matmul operand)
    mod = build_module(lambda x: R.variance(R.reshape(x, (4, 8, 5400)), axis=[2]), [((4, 48, 30, 30), "float32")])
    pipe = tvm_ext.Pipeline()
    lowered, _ = pipe.lower(pipe.prepare(mod))
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tvm.tirx.PrimFunc)]
    policies = {entry.split(":")[1] for entry in str(func.attrs["tvm_ext.schedule"]).split(", ")}
    assert "row_per_core" in policies and not policies & {"parallel_only", "register_tile"}
    x = np.random.default_rng(0).standard_normal((4, 48, 30, 30)).astype("float32")
    np.testing.assert_allclose(tvm_ext.compile(mod)(x), x.reshape(4, 8, -1).var(-1), rtol=1e-4)


def test_group_norm_writes_one_multiply_add_an_element():
    # GroupNorm(4 groups) over (2, 12, 5, 7): the statistics fold with gamma and beta into a
    # scale and a shift per (batch, channel), 2 x 12 of each, so the pass that writes y reads x
    # and those two alone (it read the group's mean and variance, gamma and beta, and worked out
    # (x - mean) * rsqrt(var + eps) * gamma + beta at every element)
    shapes = [((2, 12, 5, 7), "float32"), ((12,), "float32"), ((12,), "float32")]
    mod = build_module(lambda x, g, b: R.nn.group_norm(x, g, b, 4, 1, [2, 3]), shapes)
    pipe = tvm_ext.Pipeline()
    lowered, _ = pipe.lower(pipe.prepare(mod))
    (func,) = [f for f in lowered.functions.values() if isinstance(f, tirx.PrimFunc)]
    out = func.params[-1]
    from tvm import s_tir
    sch = s_tir.Schedule(func)
    blocks = [sch.get(b) for b in sch.get_child_blocks(sch.get_sblock("root"))]
    (writer,) = [b for b in blocks if any(w.source.same_as(out) for w in b.writes)]
    reads = sorted((tuple(int(d) for d in r.source.shape), r.source.same_as(func.params[0])) for r in writer.reads)
    assert reads == [((2, 12, 1, 1), False), ((2, 12, 1, 1), False), ((2, 12, 5, 7), True)]
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((2, 12, 5, 7)) * 2 + 1).astype("float32")
    g, b = rng.standard_normal((2, 12)).astype("float32")
    xg = x.reshape(2, 4, -1)
    want = ((xg - xg.mean(-1, keepdims=True)) / np.sqrt(xg.var(-1, keepdims=True) + 1e-5)).reshape(x.shape)
    np.testing.assert_allclose(tvm_ext.compile(mod)(x, g, b), want * g[:, None, None] + b[:, None, None],
                               rtol=1e-5, atol=1e-5)


def _mish(x):
    c = lambda v: relax.const(v, "float32")
    softplus = R.where(R.greater(x, c(20.0)), x, R.log(R.add(R.exp(x), c(1.0))))
    return R.multiply(x, R.tanh(softplus))


def _tanh_log_exp2(x):
    # Mish's nesting, but log(exp(x) + 2): TanhSoftplus leaves it alone, so the bound acts
    c = lambda v: relax.const(v, "float32")
    return R.multiply(x, R.tanh(R.where(R.greater(x, c(20.0)), x, R.log(R.add(R.exp(x), c(2.0))))))


_BOUNDED_GRAPHS = {
    "mish": (_mish, lambda x: x * np.tanh(np.where(x > 20, x, np.log1p(np.exp(x))))),
    "tanh_log_exp2": (_tanh_log_exp2, lambda x: x * np.tanh(np.where(x > 20, x, np.log(np.exp(x) + 2)))),
    "log_softmax_gelu": (lambda x: R.nn.log_softmax(R.nn.gelu(x), axis=-1), None),
}


def _largest_store(func) -> int:
    import tvm_ffi
    from tvm_ext import loop_ir as L
    sizes = []
    tvm_ffi.structural_walk(func, (tirx.BufferStore, lambda s: sizes.append(L.tir_inlined_size(s.value))))
    return max(sizes)


@pytest.mark.parametrize("graph,fusion,split", [("mish", "autofuse", True), ("mish", "nnvm", True),
                                                ("log_softmax_gelu", "autofuse", True),
                                                ("log_softmax_gelu", "nnvm", False)])  # NNVM: 2 kernels
def test_nested_fast_forms_stay_under_the_expression_bound(graph, fusion, split, monkeypatch):
    # The compile-time guard: Mish's tanh(log(1 + exp)) fused into one expression was 1.2e6 TIR
    # nodes once Lets are substituted (134 s to compile); log_softmax(gelu) 2e5 (84 s; 6.6e4
    # since erf's exp has no clamps; 5,320 in each reduction body since GELU has its own form,
    # over the reductions' bound). The bound realizes the inner form as a kernel-local stage
    # and logs it.
    import relay_passes.fuse_compile as fc
    make, _ = _BOUNDED_GRAPHS[graph]
    mod = build_module(make, [((3, 5, 7), "float32")])
    fuse = FuseCompile(strict=True)
    out = tvm.transform.Sequential([MakeGroups(fusion), fuse])(mod)
    assert max(_largest_store(f) for f in _prim_funcs(out).values()) <= fc.MAX_INLINED_NODES
    assert all("inlined-size" in why for _, _, why in fuse.log.stages)
    assert bool(fuse.log.stages) == split
    bound = min(fc.MAX_INLINED_NODES, fc.MAX_REDUCE_NODES)
    monkeypatch.setattr(fc, "MAX_INLINED_NODES", 10 ** 9)  # unbounded: the old expression
    monkeypatch.setattr(fc, "MAX_REDUCE_NODES", 10 ** 9)
    out = tvm.transform.Sequential([MakeGroups(fusion), FuseCompile(strict=True)])(mod)
    assert (max(_largest_store(f) for f in _prim_funcs(out).values()) > bound) == split


@pytest.mark.parametrize("graph", ["log_softmax_gelu", "tanh_log_exp2"])  # Mish itself: TanhSoftplus
def test_a_bounded_kernel_computes_what_the_graph_says(graph, rng):
    import torch
    make, ref = _BOUNDED_GRAPHS[graph]
    x = (rng.standard_normal((3, 5, 7)) * 4).astype("float32")
    x[0, 0, :3] = [25.0, -30.0, 0.0]
    if ref is None:
        ref = lambda v: torch.log_softmax(torch.nn.functional.gelu(torch.from_numpy(v)), -1).numpy()
    compiled = tvm_ext.compile(build_module(make, [((3, 5, 7), "float32")]), strict=True)
    assert any(d.action == "stage" and "inlined-size" in d.reason for d in compiled.report().decisions)
    np.testing.assert_allclose(compiled(x), ref(x), rtol=2e-6, atol=2e-6)


def _gelu_layer_norm(gelu):
    rng = np.random.default_rng(5)
    gamma, beta = (relax.const(rng.standard_normal(64).astype("float32")) for _ in range(2))
    return lambda x: R.nn.layer_norm(gelu(x), gamma, beta, axes=[-1]), gamma.value.numpy(), beta.value.numpy()


def _largest_reduction_store(func) -> int:
    """The largest stored value (``tir_inlined_size``) of a block with a reduce iterator."""
    import tvm_ffi
    from tvm_ext import loop_ir as L
    sizes = [0]

    def block(b):
        if any(int(iv.iter_type) == 2 for iv in b.iter_vars):
            tvm_ffi.structural_walk(b.body, (tirx.BufferStore, lambda s: sizes.append(L.tir_inlined_size(s.value))))
    tvm_ffi.structural_walk(func, (tvm.s_tir.SBlock, block))
    return max(sizes)


@pytest.mark.parametrize("gelu", [R.nn.gelu, R.nn.gelu_tanh])
def test_a_reduction_over_a_fast_form_reads_it_from_a_stage_once_past_the_reduction_bound(gelu, monkeypatch, rng):
    # A reduction's body holds no Let, so GELU's erf under a LayerNorm's two sums was inlined as
    # a tree, 7,860 and 15,730 TIR nodes (4,103 for erf since its exp has no clamps), and computed
    # three times: 6 s to build (tanh's form 15 s). Past MAX_REDUCE_NODES GELU is a kernel-local
    # stage, logged; the sums read it. GELU's own form (fast_math.gelu, no erf) is 327 nodes in a
    # sum: it stays inlined.
    import relay_passes.fuse_compile as fc
    make, gamma, beta = _gelu_layer_norm(gelu)
    mod = build_module(make, [((8, 64), "float32")])
    fuse = FuseCompile(strict=True)
    out = tvm.transform.Sequential([MakeGroups("autofuse"), fuse])(mod)
    (func,) = _prim_funcs(out).values()
    assert 0 < _largest_reduction_store(func) <= fc.MAX_REDUCE_NODES
    staged = gelu is R.nn.gelu_tanh
    assert any("in a reduction" in why for _, _, why in fuse.log.stages) == staged
    bound = fc.MAX_REDUCE_NODES if staged else 0
    monkeypatch.setattr(fc, "MAX_REDUCE_NODES", 10 ** 9)  # unbounded: GELU inlined in each sum
    (func,) = _prim_funcs(tvm.transform.Sequential([MakeGroups("autofuse"), FuseCompile(strict=True)])(mod)).values()
    assert _largest_reduction_store(func) > bound
    monkeypatch.undo()
    import torch
    x = (rng.standard_normal((8, 64)) * 3).astype("float32")
    compiled = tvm_ext.compile(mod, strict=True)
    approximate = "tanh" if gelu is R.nn.gelu_tanh else "none"
    ref = torch.nn.functional.layer_norm(torch.nn.functional.gelu(torch.from_numpy(x), approximate=approximate),
                                         (64,), torch.from_numpy(gamma), torch.from_numpy(beta)).numpy()
    np.testing.assert_allclose(compiled(x), ref, rtol=1e-5, atol=1e-5)


def test_shape_only_params_are_those_every_use_reads_for_the_shape_alone():
    """A group (a, b, c): zeros_like(a) reads a's shape only and nothing else reads a: [0]; b goes
    to ones_like and to an add: read; c goes to zeros_like and, inside a tuple, to concat: read."""
    from relay_passes.fuse_compile import shape_only_params

    a, b, c = (relax.Var(n, relax.TensorType((4, 8), "float32")) for n in "abc")
    bb = relax.BlockBuilder()
    with bb.function("group", [a, b, c]):
        with bb.dataflow():
            za = bb.emit(relax.op.zeros_like(a))
            ob = bb.emit(relax.op.ones_like(b))
            zc = bb.emit(relax.op.zeros_like(c))
            cat = bb.emit(relax.op.concat([c, zc], axis=0))
            s = bb.emit(relax.op.add(relax.op.add(za, ob), b))
            out = bb.emit_output(relax.op.add(relax.op.concat([s, s], axis=0), cat))
        bb.emit_func_output(out)
    assert shape_only_params(bb.get()["group"]) == [0]
