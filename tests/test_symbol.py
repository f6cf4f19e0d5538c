"""The Symbol API: graph structure worked out by hand, operators, Group and indexing,
attributes and AttrScope, JSON round trips, the Relax module it becomes, the seed's
ctx_group example, and compiled MLP/CNN symbols against torch."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
import tvm_ffi

import tvm_ext
from tvm_ext import InputError, sym


def _random_inputs(net, shapes, seed=0):
    arg_shapes, _, aux_shapes = net.infer_shape(**shapes)
    rng = np.random.default_rng(seed)
    values = {n: rng.standard_normal(s).astype("float32") for n, s in zip(net.list_inputs(), arg_shapes + aux_shapes)}
    return values


def _run(compiled, net, values):
    out = compiled(*[values[n] for n in net.list_inputs()])
    return [np.asarray(o) for o in out] if isinstance(out, (tuple, list)) else np.asarray(out)


# --------------------------------------------------------------------------- structure
def test_operators_build_the_graph_worked_out_by_hand():
    a, b = sym.Variable("a"), sym.Variable("b")
    s = ((a + b) * 2 - 1 / a) ** 2
    s = -(s > b)
    nodes = s.topo_nodes()
    n = [x.name for x in nodes]
    assert [x.op for x in nodes] == [None, None, "add", "multiply", "divide", "subtract", "power", "greater",
                                     "negative"]
    assert [[e.node.name for e in x.inputs] for x in nodes] == [
        [], [], ["a", "b"], [n[2]], ["a"], [n[3], n[4]], [n[5]], [n[6], "b"], [n[7]]]
    assert [x.attrs for x in nodes] == [{}, {}, {}, {"x2": 2}, {"x1": 1}, {}, {"x2": 2}, {}, {}]  # 1 / a: x1
    assert n[2].startswith("add") and n[8].startswith("negative")
    assert s.list_arguments() == ["a", "b"]  # each variable once, in first-use order
    assert {(x == 1).topo_nodes()[-1].op for x in [a]} == {"equal"}
    assert (a != b).topo_nodes()[-1].op == "not_equal"
    assert [(op(a, b)).topo_nodes()[-1].op for op in (lambda x, y: x < y, lambda x, y: x <= y,
                                                    lambda x, y: x >= y)] == ["less", "less_equal", "greater_equal"]
    with pytest.raises(TypeError, match="no truth value"):
        bool(a == b)


def test_layers_make_their_parameters_in_mxnet_order():
    data = sym.Variable("data")
    fc1 = sym.FullyConnected(data, num_hidden=128, name="fc1")
    act = sym.relu(fc1, name="relu1")
    fc2 = sym.dense(act, num_hidden=10, no_bias=True, name="fc2")
    net = sym.softmax(fc2, name="out")
    assert net.list_arguments() == ["data", "fc1_weight", "fc1_bias", "fc2_weight"]
    assert net.list_outputs() == ["out_output"]
    assert net.list_auxiliary_states() == []
    assert data.list_outputs() == ["data"]
    assert fc1.topo_nodes()[-1].attrs == {"num_hidden": 128, "no_bias": False}

    x = sym.Variable("x")
    conv = sym.Convolution(x, num_filter=8, kernel=(3, 3), name="conv")
    bn = sym.BatchNorm(conv, name="bn")
    net2 = sym.flatten(sym.max_pool2d(sym.relu(bn), kernel=2, name="pool"), name="flat")
    assert net2.list_arguments() == ["x", "conv_weight", "conv_bias", "bn_gamma", "bn_beta"]
    assert net2.list_auxiliary_states() == ["bn_moving_mean", "bn_moving_var"]
    assert net2.list_inputs() == net2.list_arguments() + net2.list_auxiliary_states()


def test_explicit_parameters_and_bad_calls():
    data, w = sym.Variable("data"), sym.Variable("shared_w")
    a = sym.dense(data, weight=w, num_hidden=4, no_bias=True, name="a")
    b = sym.dense(a, w, num_hidden=4, no_bias=True, name="b")  # positional: data, weight
    assert b.list_arguments() == ["data", "shared_w"]
    with pytest.raises(InputError, match="num_hidden"):
        sym.dense(data)
    with pytest.raises(InputError, match="no attribute 'units'"):
        sym.dense(data, num_hidden=3, units=3)
    with pytest.raises(InputError, match="drop"):
        sym.dense(data, bias=w, num_hidden=3, no_bias=True)
    with pytest.raises(InputError, match="unknown symbol op"):
        sym.load_json(json.dumps({"nodes": [{"op": "nope", "name": "n", "inputs": []}], "heads": [[0, 0, 0]]}))
    with pytest.raises(AttributeError):
        sym.no_such_op  # noqa: B018
    assert {"exp", "dense", "FullyConnected", "conv2d", "softmax", "split"} <= set(sym.list_ops())
    assert "no_such_op" not in sym.list_ops() and set(sym.list_ops()) <= set(dir(sym))
    with pytest.raises(InputError, match="one by one"):
        sym.concat([data, w], axis=1)


def test_variadic_concat_and_layer_norm_parameters():
    a, b = sym.Variable("a"), sym.Variable("b")
    cat = sym.Concat(a, b, sym.exp(a, name="ea"), axis=1, name="cat")
    node = cat.topo_nodes()[-1]
    assert node.op == "concat" and [e.name for e in node.inputs] == ["a", "b", "ea_output"]
    assert node.attrs == {"axis": 1}
    ln = sym.layer_norm(cat, axes=(0, 1), name="ln")
    assert ln.list_arguments() == ["a", "b", "ln_gamma", "ln_beta"]
    assert sym.load_json(ln.tojson()).tojson() == ln.tojson()


def test_group_and_indexing():
    data = sym.Variable("data")
    parts = sym.split(data, indices_or_sections=3, axis=1, name="sp")
    assert len(parts) == 3
    assert parts.list_outputs() == ["sp_output0", "sp_output1", "sp_output2"]
    assert parts[1].list_outputs() == ["sp_output1"]
    assert parts["sp_output2"].outputs[0].index == 2
    assert parts[-1].outputs[0].index == 2
    fc = sym.dense(parts[0], num_hidden=3, name="fc")
    g = sym.Group([fc, parts[2], data])
    assert g.list_outputs() == ["fc_output", "sp_output2", "data"]
    assert g.list_arguments() == ["data", "fc_weight", "fc_bias"]
    assert [s.list_outputs() for s in g] == [["fc_output"], ["sp_output2"], ["data"]]
    with pytest.raises(InputError, match="pick one with s\\[i\\]"):
        sym.exp(parts)
    with pytest.raises(IndexError):
        g[3]
    assert "fc_output" in g.get_internals().list_outputs()


def test_attributes_and_attr_scope():
    x = sym.Variable("x", attr={"lr_mult": "2"})
    assert x.attr("lr_mult") == "2" and x.attr("missing") is None
    with sym.AttrScope(ctx_group="dev1", tag="outer"):
        y = sym.dense(x, num_hidden=3, name="fc")
        with sym.AttrScope(ctx_group="dev2"):
            z = sym.exp(y, name="e", attr={"tag": "mine"})
    w = sym.relu(z, name="r")
    assert y.attr("ctx_group") == "dev1" and y.attr("num_hidden") == "3"
    # MXNet's hidden keys (ctx_group, lr_mult, ...) are listed under both names, key and __key__
    assert z.list_attr() == {"ctx_group": "dev2", "__ctx_group__": "dev2", "tag": "mine"}
    assert w.list_attr() == {}
    dev1 = {"ctx_group": "dev1", "__ctx_group__": "dev1", "tag": "outer"}
    assert w.attr_dict() == {"x": {"lr_mult": "2", "__lr_mult__": "2"}, "fc_weight": dev1, "fc_bias": dev1,
                             "fc": {"num_hidden": "3", "no_bias": "False", **dev1},
                             "e": {"ctx_group": "dev2", "__ctx_group__": "dev2", "tag": "mine"}}
    with pytest.raises(InputError, match="string"):
        sym.AttrScope(ctx_group=1)


# --------------------------------------------------------------------------- JSON
def _cnn(ctx=False):
    data = sym.Variable("data", attr={"lr_mult": "0.5"})
    with sym.AttrScope(**({"ctx_group": "dev1"} if ctx else {})):
        conv = sym.conv2d(data, num_filter=4, kernel=(3, 3), pad=(1, 1), name="conv1")
        bn = sym.batch_norm(conv, eps=1e-3, name="bn1")
    act = sym.relu(bn, name="relu1")
    pool = sym.max_pool2d(act, kernel=(2, 2), name="pool1")
    flat = sym.flatten(pool, name="flat")
    fc = sym.FullyConnected(flat, num_hidden=5, name="fc1")
    return sym.softmax(fc, axis=-1, name="prob")


def test_json_round_trip_is_exact(tmp_path):
    net = sym.Group([_cnn(ctx=True), sym.Variable("aux_out")])
    text = net.tojson()
    graph = json.loads(text)
    index = {node["name"]: i for i, node in enumerate(graph["nodes"])}
    assert graph["heads"] == [[index["prob"], 0, 0], [index["aux_out"], 0, 0]]
    assert graph["arg_nodes"] == [i for i, node in enumerate(graph["nodes"]) if node["op"] == "null"]
    assert graph["nodes"][0] == {"op": "null", "name": "data", "attrs": {"__lr_mult__": "0.5"}, "inputs": []}
    conv = next(n for n in graph["nodes"] if n["name"] == "conv1")
    assert conv["attrs"] == {"stride": "(1, 1)", "pad": "(1, 1)", "dilate": "(1, 1)", "num_group": "1",
                             "no_bias": "False", "num_filter": "4", "kernel": "(3, 3)", "__ctx_group__": "dev1"}
    assert [graph["nodes"][i]["name"] for i, _, _ in conv["inputs"]] == ["data", "conv1_weight", "conv1_bias"]
    assert graph["node_row_ptr"] == list(range(len(graph["nodes"]) + 1))
    loaded = sym.load_json(text)
    assert loaded.tojson() == text
    assert loaded.list_inputs() == net.list_inputs() and loaded.list_outputs() == net.list_outputs()
    assert loaded.attr_dict() == net.attr_dict()
    path = tmp_path / "net.json"
    net.save(path)
    assert sym.load(path).tojson() == text
    shapes = {"data": (2, 3, 8, 8), "aux_out": (1,)}
    assert tvm_ffi.structural_equal(loaded.to_relax(shapes), net.to_relax(shapes))
    multi = sym.split(sym.Variable("v"), indices_or_sections=[1, 3], axis=0, name="cut")
    assert sym.load_json(multi.tojson()).list_outputs() == ["cut_output0", "cut_output1", "cut_output2"]


def test_json_round_trip_of_numpy_and_non_finite_scalars():
    x = sym.Variable("x")
    net = sym.Group([x * np.float64(2.0), sym.maximum(x, -np.inf), x ** np.int64(2), x + float("nan")])
    loaded = sym.load_json(net.tojson())
    attrs = [n.attrs["x2"] for n in loaded.topo_nodes()[1:]]
    assert attrs[:3] == [2.0, -np.inf, 2] and np.isnan(attrs[3])
    assert loaded.tojson() == net.tojson()
    assert all(type(v) in (int, float) for n in net.topo_nodes() for v in n.attrs.values())  # plain Python
    values = np.array([-1.0, 3.0], "float32")
    got = tvm_ext.compile(loaded, shape_dict={"x": (2,)})(values)
    np.testing.assert_array_equal(np.asarray(got[0]), values * 2)
    np.testing.assert_array_equal(np.asarray(got[1]), values)
    np.testing.assert_array_equal(np.asarray(got[2]), values ** 2)
    assert np.isnan(np.asarray(got[3])).all()


def test_load_json_rejects_bad_references():
    x = {"op": "null", "name": "x", "inputs": []}
    bad = [({"nodes": [x], "heads": [[3, 0, 0]]}, r"head 0 reads node 3, output 0.* 1 nodes"),
           ({"nodes": [x], "heads": [[0, 1, 0]]}, r"head 0 reads node 0, output 1.*'x' has 1"),
           ({"nodes": [x, {"op": "exp", "name": "e", "inputs": [[0, 2, 0]]}], "heads": [[1, 0, 0]]},
            r"node 1 \('e'\) reads node 0, output 2.*'x' has 1"),
           ({"nodes": [{"name": "x", "inputs": []}], "heads": [[0, 0, 0]]}, r"node 0 .*needs 'op' and 'name'")]
    for graph, message in bad:
        with pytest.raises(InputError, match=message):
            sym.load_json(json.dumps(graph))


def test_loaded_symbol_computes_the_same():
    data = sym.Variable("data")
    net = sym.tanh(sym.dense(sym.relu(sym.dense(data, num_hidden=16, name="l1")) * 0.5, num_hidden=4, name="l2"))
    loaded = sym.load_json(net.tojson())
    values = _random_inputs(net, {"data": (4, 8)})
    ours = _run(tvm_ext.compile(net, shape_dict={"data": (4, 8)}), net, values)
    theirs = _run(tvm_ext.compile(loaded, shape_dict={"data": (4, 8)}), loaded, values)
    np.testing.assert_array_equal(ours, theirs)
    v = values
    ref = np.tanh(np.maximum(v["data"] @ v["l1_weight"].T + v["l1_bias"], 0) * 0.5 @ v["l2_weight"].T + v["l2_bias"])
    np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-5)


# --------------------------------------------------------------------------- Relax
def test_to_relax_signature_and_binding_names():
    net = _cnn()
    mod = net.to_relax(shapes={"data": (2, 3, 8, 8)})
    main = mod["main"]
    assert [p.name for p in main.params] == net.list_inputs()
    assert [tuple(int(d) for d in p.ty.shape.values) for p in main.params] == [
        (2, 3, 8, 8), (4, 3, 3, 3), (4,), (4,), (4,), (5, 64), (5,), (4,), (4,)]
    names = [b.var.name for b in main.body.blocks[0].bindings]
    assert names == ["conv1_bias_nchw", "conv1_conv", "conv1", "bn1_bn", "bn1", "relu1", "pool1_windows", "pool1",
                     "flat", "fc1_weight_t", "fc1_matmul", "fc1", "prob"]
    assert tuple(int(d) for d in main.ret_ty.shape.values) == (2, 5)
    assert main.attrs is None or "tvm_ext.ctx_group" not in main.attrs
    f16 = net.to_relax(shapes={"data": (2, 3, 8, 8)}, dtypes={"data": "float16"})
    assert {str(p.ty.dtype) for p in f16["main"].params} == {"float16"}
    with pytest.raises(InputError, match="two nodes .* named 'fc'"):
        sym.Group([sym.exp(sym.Variable("a"), name="fc"), sym.exp(sym.Variable("b"), name="fc")]).to_relax(
            {"a": (2,), "b": (2,)})


def test_ctx_group_seed_example_reaches_the_relax_module_and_the_report():
    a, b, c = sym.Variable("a"), sym.Variable("b"), sym.Variable("c")
    with sym.AttrScope(ctx_group="dev1"):
        net = sym.multiply(a, b, name="mul")
    with sym.AttrScope(ctx_group="dev2"):
        net = sym.add(net, c, name="plus")
    assert net.attr("ctx_group") == "dev2"
    mod = net.to_relax(shapes={"a": (10, 10)})  # b and c: elementwise with a
    groups = {str(k): str(v) for k, v in mod["main"].attrs[tvm_ext.attrs.CTX_GROUP].items()}
    assert groups == {"mul": "dev1", "plus": "dev2"}
    compiled = tvm_ext.compile(net, shape_dict={"a": (10, 10)})
    report = compiled.report()
    assert report.num_kernels == 2  # the groups are not fused together
    assert any(d.reason.startswith("device: dev1 -> dev2") for d in report.decisions)
    x, y, z = (np.random.default_rng(i).standard_normal((10, 10)).astype("float32") for i in range(3))
    np.testing.assert_allclose(np.asarray(compiled(x, y, z)), x * y + z, rtol=1e-6)


def test_ctx_group_covers_a_layer_intermediates():
    with sym.AttrScope(ctx_group="gpu"):
        net = sym.dense(sym.Variable("x"), num_hidden=2, name="fc")
    groups = net.to_relax({"x": (3, 4)})["main"].attrs[tvm_ext.attrs.CTX_GROUP]
    assert {str(k): str(v) for k, v in groups.items()} == {"fc_weight_t": "gpu", "fc_matmul": "gpu", "fc": "gpu"}


# --------------------------------------------------------------------------- numerics
def test_compiled_mlp_matches_torch():
    data = sym.Variable("data")
    h = sym.relu(sym.FullyConnected(data, num_hidden=32, name="fc1"), name="relu1")
    h = sym.sigmoid(sym.FullyConnected(h, num_hidden=16, name="fc2")) - 0.5
    h = sym.layer_norm(sym.concat(h, 2 ** h, axis=1, name="cat"), epsilon=1e-5, name="ln")  # (8, 32)
    net = sym.log_softmax(sym.dense(h, num_hidden=10, name="fc3"), name="out")
    values = _random_inputs(net, {"data": (8, 64)}, seed=1)
    got = _run(tvm_ext.compile(net, shape_dict={"data": (8, 64)}), net, values)
    t = {k: torch.from_numpy(v) for k, v in values.items()}
    F = torch.nn.functional
    ref = F.relu(F.linear(t["data"], t["fc1_weight"], t["fc1_bias"]))
    ref = torch.sigmoid(F.linear(ref, t["fc2_weight"], t["fc2_bias"])) - 0.5
    ref = F.layer_norm(torch.cat([ref, 2 ** ref], dim=1), (32,), t["ln_gamma"], t["ln_beta"], eps=1e-5)
    ref = F.log_softmax(F.linear(ref, t["fc3_weight"], t["fc3_bias"]), dim=-1)
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-4, atol=1e-5)


def test_compiled_cnn_matches_torch():
    net = _cnn()
    net = sym.Group([net, sym.avg_pool2d(sym.Variable("img"), kernel=3, stride=1, pad=1, name="avg")])
    shapes = {"data": (2, 3, 8, 8), "img": (1, 2, 5, 5)}
    values = _random_inputs(net, shapes, seed=2)
    values["bn1_moving_var"] = np.abs(values["bn1_moving_var"]) + 0.5
    prob, avg = _run(tvm_ext.compile(net, shape_dict=shapes), net, values)
    t = {k: torch.from_numpy(v) for k, v in values.items()}
    F = torch.nn.functional
    y = F.conv2d(t["data"], t["conv1_weight"], t["conv1_bias"], padding=1)
    y = F.batch_norm(y, t["bn1_moving_mean"], t["bn1_moving_var"], t["bn1_gamma"], t["bn1_beta"], eps=1e-3)
    y = F.max_pool2d(F.relu(y), 2).flatten(1)
    y = F.softmax(F.linear(y, t["fc1_weight"], t["fc1_bias"]), dim=-1)
    np.testing.assert_allclose(prob, y.numpy(), rtol=1e-4, atol=1e-5)
    ref_avg = F.avg_pool2d(t["img"], 3, 1, 1, count_include_pad=False)
    np.testing.assert_allclose(avg, ref_avg.numpy(), rtol=1e-5, atol=1e-6)


def test_mxnet_layer_names_prefix_operators_and_composed_numerics():
    with sym.NameManager():
        x = sym.Variable("x")
        assert sym.Pooling(x, kernel=(2, 2), pool_type="avg").name == "pooling0"
        assert (x % 2).topo_nodes()[-1].op == "floor_mod" and (x // 2).topo_nodes()[-1].op == "floor_divide"
        assert x.T.infer_shape(x=(2, 3))[1] == [(3, 2)] and x.exp().name == "exp0"
        with sym.Prefix("m_"):
            fc = sym.FullyConnected(x, num_hidden=3, lr_mult=0.5)
        assert fc.list_arguments() == ["x", "m_fullyconnected0_weight", "m_fullyconnected0_bias"]
        assert fc.attr("__lr_mult__") == "0.5" and fc.list_attr()["lr_mult"] == "0.5"
    # composition: a layer built without data, then plugged onto another graph, compiles
    head = sym.dot(sym.FullyConnected(num_hidden=4, name="fc"), sym.Variable("q"), name="d")
    net = head(fc_data=sym.Embedding(sym.Variable("idx"), input_dim=6, output_dim=5, name="emb"))
    assert head.list_arguments()[0] == "fc_data"
    assert net.list_arguments() == ["idx", "emb_weight", "fc_weight", "fc_bias", "q"]
    shapes = {"idx": (2, 3), "q": (4, 2, 3)}
    rng = np.random.default_rng(3)
    arg_shapes, out_shapes, _ = net.infer_shape(**shapes)
    assert out_shapes == [(2, 3, 2, 3)]
    values = {n: rng.standard_normal(s).astype("float32") for n, s in zip(net.list_arguments(), arg_shapes)}
    values["idx"] = np.array([[0, 5, 2], [1, 1, 4]], "float32")  # MXNet's indices are float32
    got = _run(tvm_ext.compile(net, shape_dict=shapes), net, values)
    v = values
    h = v["emb_weight"][v["idx"].astype(int)] @ v["fc_weight"].T + v["fc_bias"]
    np.testing.assert_allclose(got, np.tensordot(h, v["q"], 1), rtol=1e-5, atol=1e-5)


def test_an_op_registered_at_run_time_gets_its_symbol_function_at_once(tmp_path):
    # in a process of its own: the registration must not leak into the other tests' registry
    script = tmp_path / "late_op.py"
    script.write_text(
        "import numpy as np\n"
        "import tvm_ext\n"
        "from tvm_ext import OpDef, OpPattern, sym\n"
        "assert not hasattr(sym, 'sinh') and 'sinh' not in sym.list_ops()\n"
        "x = sym.Variable('x')\n"
        "sym.exp(x)  # the table is built now, before the registration\n"
        "tvm_ext.OPS.register(OpDef('relax.sinh', OpPattern.ELEMWISE, doc='TVM legalizes it'))\n"
        "assert 'sinh' in sym.list_ops()\n"
        "y = sym.sinh(x, name='y')\n"
        "v = np.linspace(-2, 2, 12, dtype='float32').reshape(3, 4)\n"
        "np.testing.assert_allclose(tvm_ext.compile(y, [v])(v), np.sinh(v), rtol=1e-5)\n"
        "print('ok')\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
