"""MXNet's own Symbol unit tests, adapted to ``tvm_ext.sym``.

Every graph-level test of apache/mxnet ``tests/python/unittest/test_symbol.py``,
``test_infer_shape.py`` and ``test_attr.py`` (those that need no executor, NDArray, bind,
simple_bind or gradient execution), with ``mx.sym``/``mx.symbol`` -> ``sym``, ``mx.AttrScope``
-> ``sym.AttrScope``, ``mx.name.NameManager`` -> ``sym.NameManager``, ``MXNetError`` ->
``CompileError`` (the base of this compiler's errors; ``NotImplementedForSymbol`` from
``bool(symbol)`` -> ``TypeError``) and ``mx.base.mx_real_t`` -> ``np.float32``, ``mx.symbol._internal.X`` -> ``sym.X``; MXNet's
expected values are unchanged. Each test names the MXNet test it comes from. Where an MXNet
test uses ``simple_bind`` only to run shape inference, the adaptation calls ``infer_shape``.

Left out, with the reason:

- the ``mx.np_shape(True)`` halves of ``test_shape_completely_unknown``, ``test_dot_partial_shape``,
  ``test_batch_dot_partial_shape``, ``test_embedding_partial_shape``, ``test_pick_partial_shape``,
  ``test_transpose_partial_shape``, ``test_where_partial_shape`` and ``test_load_save_symbol`` (flag1=True), and the ``as_np_ndarray()``
  half of the second ``test_symbol_copy``: NumPy-shape semantics (-1 for unknown dims) and the
  ``mx.np`` front end are not part of this Symbol API, which keeps MXNet's legacy convention (0).
- ``test_symbol_fluent``: the functions that have no op here (norm, rint, fix, degrees, radians,
  expm1, reciprocal, argmax_channel, shape_array, size_array, arccosh, arcsin, arccos, arctan, sinh,
  cosh, arcsinh, arctanh, log10, log2, log1p, cbrt, rcbrt, softmin, flip, sort, argsort, argmax,
  argmin, one_hot, tile, repeat, slice, slice_axis, slice_like, broadcast_axes, broadcast_like,
  reshape_like, nansum, nanprod) and ``topk`` (Relax's topk returns values and indices; MXNet's
  returns indices) are left out of its lists; the others are checked.
- Executor tests: ``test_blockgrad``, ``test_zero_prop2``,
  ``test_simple_bind_gradient_graph_possible_with_cycle`` (gradient graphs of bound executors),
  ``test_transpose_nullop`` (``eval``), ``test_gen_atomic_symbol_multiple_outputs`` (RNN op and
  ``_gen_atomic_symbol``), ``test_eliminate_common_expr`` (executor CSE).
"""
from __future__ import annotations

import copy
import json
import pickle as pkl

import numpy as np
import pytest

from tvm_ext import CompileError, sym


def _mlp2():
    """MXNet's tests/python/common/models.py mlp2."""
    data = sym.Variable("data")
    out = sym.FullyConnected(data=data, name="fc1", num_hidden=1000)
    out = sym.Activation(data=out, act_type="relu")
    return sym.FullyConnected(data=out, name="fc2", num_hidden=10)


def _rand_shape_nd(ndim, rng, dim=10):
    """MXNet's test_utils.rand_shape_nd: ``ndim`` dims, each in 1..dim."""
    return tuple(int(d) for d in rng.integers(1, dim + 1, size=ndim))


def _contain(x, y):
    """test_attr.py's contain: every key of x is in y with the same value (dicts recursively)."""
    for k, v in x.items():
        if k not in y:
            return False
        if isinstance(y[k], dict):
            if not isinstance(v, dict) or not _contain(v, y[k]):
                return False
        elif y[k] != v:
            return False
    return True


# --------------------------------------------------------------------------- test_symbol.py
# MXNet: test_symbol.py::test_symbol_basic
def test_symbol_basic():
    for m in [_mlp2()]:
        m.list_arguments()
        m.list_outputs()


# MXNet: test_symbol.py::test_symbol_bool
def test_symbol_bool():
    x = sym.Variable("x")
    with pytest.raises(TypeError):
        bool(x)


# MXNet: test_symbol.py::test_symbol_compose
def test_symbol_compose():
    data = sym.Variable("data")
    net1 = sym.FullyConnected(data=data, name="fc1", num_hidden=10)
    net1 = sym.FullyConnected(data=net1, name="fc2", num_hidden=100)
    assert net1.list_arguments() == ["data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]

    net2 = sym.FullyConnected(name="fc3", num_hidden=10)
    net2 = sym.Activation(data=net2, act_type="relu")
    net2 = sym.FullyConnected(data=net2, name="fc4", num_hidden=20)

    composed = net2(fc3_data=net1, name="composed")
    multi_out = sym.Group([composed, net1])
    assert len(multi_out.list_outputs()) == 2
    assert len(multi_out) == 2
    # what composition means in MXNet: fc3_data is replaced, the originals are unchanged
    assert composed.list_arguments() == ["data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias",
                                         "fc3_weight", "fc3_bias", "fc4_weight", "fc4_bias"]
    assert net2.list_arguments()[0] == "fc3_data"
    assert net1.list_arguments() == ["data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]


# MXNet: test_symbol.py::test_symbol_copy (the first of the two tests of that name)
def test_symbol_copy_tojson():
    data = sym.Variable("data")
    data_2 = copy.deepcopy(data)
    data_3 = copy.copy(data)
    assert data.tojson() == data_2.tojson()
    assert data.tojson() == data_3.tojson()


# MXNet: test_symbol.py::test_symbol_internal
def test_symbol_internal():
    data = sym.Variable("data")
    oldfc = sym.FullyConnected(data=data, name="fc1", num_hidden=10)
    net1 = sym.FullyConnected(data=oldfc, name="fc2", num_hidden=100)
    assert net1.list_arguments() == ["data", "fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]

    internal = net1.get_internals()
    fc1 = internal["fc1_output"]
    assert fc1.list_arguments() == oldfc.list_arguments()


# MXNet: test_symbol.py::test_symbol_children
def test_symbol_children():
    data = sym.Variable("data")
    oldfc = sym.FullyConnected(data=data, name="fc1", num_hidden=10)
    net1 = sym.FullyConnected(data=oldfc, name="fc2", num_hidden=100)

    assert net1.get_children().list_outputs() == ["fc1_output", "fc2_weight", "fc2_bias"]
    assert len(net1.get_children()) == 3
    assert net1.get_children().get_children().list_outputs() == ["data", "fc1_weight", "fc1_bias"]
    assert len(net1.get_children().get_children()) == 3
    assert net1.get_children()["fc2_weight"].list_arguments() == ["fc2_weight"]
    assert net1.get_children()["fc2_weight"].get_children() is None

    data = sym.Variable("data")
    sliced = sym.SliceChannel(data, num_outputs=3, name="slice")
    concat = sym.Concat(*list(sliced))

    assert concat.get_children().list_outputs() == ["slice_output0", "slice_output1", "slice_output2"]
    assert sliced.get_children().list_outputs() == ["data"]


# MXNet: test_symbol.py::test_symbol_pickle
def test_symbol_pickle():
    mlist = [_mlp2()]
    data = pkl.dumps(mlist)
    mlist2 = pkl.loads(data)
    for x, y in zip(mlist, mlist2):
        assert x.tojson() == y.tojson()


# MXNet: test_symbol.py::test_symbol_saveload
def test_symbol_saveload(tmp_path):
    net = _mlp2()
    fname = tmp_path / "tmp_sym.json"
    net.save(fname)
    data2 = sym.load(fname)
    # save because of order
    assert net.tojson() == data2.tojson()


# MXNet: test_symbol.py::test_symbol_infer_shape
def test_symbol_infer_shape():
    num_hidden = 128
    num_dim = 64
    num_sample = 10

    data = sym.Variable("data")
    prev = sym.Variable("prevstate")
    x2h = sym.FullyConnected(data=data, name="x2h", num_hidden=num_hidden)
    h2h = sym.FullyConnected(data=prev, name="h2h", num_hidden=num_hidden)

    out = sym.Activation(data=sym.elemwise_add(x2h, h2h), name="out", act_type="relu")

    # shape inference will fail because information is not available for h2h
    with pytest.warns(UserWarning, match="cannot infer"):
        ret = out.infer_shape(data=(num_sample, num_dim))
    assert ret == (None, None, None)

    arg, out_shapes, aux_shapes = out.infer_shape_partial(data=(num_sample, num_dim))
    arg_shapes = dict(zip(out.list_arguments(), arg))
    assert arg_shapes["data"] == (num_sample, num_dim)
    assert arg_shapes["x2h_weight"] == (num_hidden, num_dim)
    assert arg_shapes["h2h_weight"] == ()

    # now we can do full shape inference
    state_shape = out_shapes[0]
    arg, out_shapes, aux_shapes = out.infer_shape(data=(num_sample, num_dim), prevstate=state_shape)
    arg_shapes = dict(zip(out.list_arguments(), arg))
    assert arg_shapes["data"] == (num_sample, num_dim)
    assert arg_shapes["x2h_weight"] == (num_hidden, num_dim)
    assert arg_shapes["h2h_weight"] == (num_hidden, num_hidden)

    # Partial shape inference with some unknown dimensions
    data_shape = (1, 0, 0, 0)
    data = sym.Variable("data", shape=data_shape)
    weight = sym.Variable("weight")
    cdata = sym.cast(data, dtype="float16")
    cweight = sym.cast(weight, dtype="float16")
    test = sym.Convolution(data=cdata, weight=cweight, pad=(3, 3), num_filter=64, stride=(2, 2), no_bias=True,
                           kernel=(7, 7))

    arg, _, _ = test.infer_shape_partial()
    arg_shapes = dict(zip(test.list_arguments(), arg))
    assert arg_shapes["data"] == data_shape
    assert arg_shapes["weight"] == (64, 0, 7, 7)


# MXNet: test_symbol.py::test_symbol_infer_shape_var
def test_symbol_infer_shape_var():
    shape = (2, 3)
    a = sym.Variable("a", shape=shape)
    b = sym.Variable("b")
    c = sym.elemwise_add(a, b)
    arg_shapes, out_shapes, aux_shapes = c.infer_shape()
    assert arg_shapes[0] == shape
    assert arg_shapes[1] == shape
    assert out_shapes[0] == shape

    overwrite_shape = (5, 6)
    arg_shapes, out_shapes, aux_shapes = c.infer_shape(a=overwrite_shape)
    assert arg_shapes[0] == overwrite_shape
    assert arg_shapes[1] == overwrite_shape
    assert out_shapes[0] == overwrite_shape


def _check_symbol_consistency(sym1, sym2, shape):
    """test_symbol.py's check_symbol_consistency, graph level: the same arguments, states and
    outputs, and the same graph (so check_consistency's runs could not differ) and shapes."""
    assert sym1.list_arguments() == sym2.list_arguments()
    assert sym1.list_auxiliary_states() == sym2.list_auxiliary_states()
    assert sym1.list_outputs() == sym2.list_outputs()
    assert sym1.tojson() == sym2.tojson()
    assert sym1.infer_shape(data=shape) == sym2.infer_shape(data=shape)


# MXNet: test_symbol.py::test_symbol_magic_abs
def test_symbol_magic_abs():
    rng = np.random.default_rng(0)
    for dim in range(1, 7):
        with sym.NameManager():
            data = sym.Variable("data")
            method = data.abs(name="abs0")
            magic = abs(data)
            regular = sym.abs(data, name="abs0")
            shape = _rand_shape_nd(dim, rng)
            _check_symbol_consistency(method, magic, shape)
            _check_symbol_consistency(regular, magic, shape)


# MXNet: test_symbol.py::test_symbol_fluent (the functions that have an op here)
def test_symbol_fluent():
    def check_fluent_regular(func, kwargs, shape=(5, 17, 1)):
        with sym.NameManager():
            data = sym.Variable("data")
            regular = getattr(sym, func)(data, name=func + "0", **kwargs)
            fluent = getattr(data, func)(**kwargs)
            _check_symbol_consistency(regular, fluent, shape)

    for func in ["flatten", "round", "floor", "ceil", "trunc", "zeros_like", "ones_like", "abs", "sign", "sin",
                 "cos", "exp", "square"]:
        check_fluent_regular(func, {})

    for func in ["tan", "tanh", "log", "sqrt", "rsqrt", "relu", "sigmoid", "softmax", "log_softmax"]:
        check_fluent_regular(func, {})

    for func in ["expand_dims"]:
        check_fluent_regular(func, {"axis": 1})

    check_fluent_regular("transpose", {"axes": (1, 0, 2)})
    check_fluent_regular("split", {"axis": 2, "num_outputs": 3}, shape=(5, 17, 6))
    check_fluent_regular("clip", {"a_min": 0.25, "a_max": 0.75})
    check_fluent_regular("pad", {"mode": "constant", "pad_width": (0, 0, 0, 0, 3, 0, 0, 4)}, shape=(5, 17, 2, 3))

    for func in ["sum", "prod", "mean", "max", "min"]:
        check_fluent_regular(func, {"axis": (1, 2)})

    check_fluent_regular("reshape", {"shape": (17, 1, 5)})
    check_fluent_regular("broadcast_to", {"shape": (5, 17, 47)})
    check_fluent_regular("squeeze", {"axis": (1, 3)}, shape=(2, 1, 3, 1, 4))
    check_fluent_regular("squeeze", {}, shape=(2, 1, 3, 1, 4))


# MXNet: test_symbol.py::test_simple_bind_incomplete_shape_inference_in_one_forward_pass
# (simple_bind there runs shape inference, which must succeed: here infer_shape)
def test_simple_bind_incomplete_shape_inference_in_one_forward_pass():
    data_shape = (5, 13)
    data = sym.Variable("data")
    fc = sym.FullyConnected(data=data, num_hidden=1, no_bias=True, name="fc")
    modified_weight = sym.abs(fc.get_internals()["fc_weight"])
    net = sym.sum(modified_weight) + sym.sum(fc)
    arg_shapes, _, _ = net.infer_shape(data=data_shape)
    assert dict(zip(net.list_arguments(), arg_shapes)) == {"data": (5, 13), "fc_weight": (1, 13)}


# MXNet: test_symbol.py::test_children_same_name
def test_children_same_name():
    a = sym.Variable("data")
    b = a + a
    for _ in b.get_children():
        pass


# MXNet: test_symbol.py::test_load_save_symbol (np_shape off)
def test_load_save_symbol(tmp_path):
    batch_size = 10
    num_hdidden = 128
    num_features = 784

    def get_net():
        data = sym.var("data")
        weight = sym.var("weight", shape=(num_hdidden, 0))
        return sym.FullyConnected(data, weight, num_hidden=num_hdidden)

    net_json_str = get_net().tojson()
    net_data = json.loads(net_json_str)
    assert "attrs" in net_data
    assert "is_np_shape" not in net_data["attrs"]

    fname = tmp_path / "test_sym.json"
    with open(fname, "w") as fp:
        json.dump(net_data, fp)

    net = sym.load(fname)
    arg_shapes, out_shapes, aux_shapes = net.infer_shape(data=(batch_size, num_features))
    assert arg_shapes[0] == (batch_size, num_features)  # data
    assert arg_shapes[1] == (num_hdidden, num_features)  # weight
    assert arg_shapes[2] == (num_hdidden,)  # bias
    assert out_shapes[0] == (batch_size, num_hdidden)  # output
    assert len(aux_shapes) == 0


# MXNet: test_symbol.py::test_infershape_happens_for_all_ops_in_graph (simple_bind's shape inference)
def test_infershape_happens_for_all_ops_in_graph():
    v = sym.Variable("V")
    s = sym.transpose(v)
    x = sym.Variable("x")
    s2 = x + v
    s3 = s + s2
    # This should throw an exception as you cannot add arrays with shapes [2,3] and [3,2]
    with pytest.raises(CompileError):
        s3.infer_shape(x=(2, 3))


# MXNet: test_symbol.py::test_symbol_copy (the second of the two tests of that name)
def test_symbol_copy_set_attr():
    a = sym.Variable("a")
    b = copy.copy(a)
    b._set_attr(name="b")
    assert a.name == "a" and b.name == "b"


# --------------------------------------------------------------------------- test_infer_shape.py
# MXNet: test_infer_shape.py::test_mlp2_infer_shape
def test_mlp2_infer_shape():
    out = _mlp2()
    data_shape = (100, 100)
    arg_shapes, out_shapes, aux_shapes = out.infer_shape(data=data_shape)
    arg_shape_dict = dict(zip(out.list_arguments(), arg_shapes))
    assert len(out_shapes) == 1
    assert out_shapes[0] == (100, 10)
    true_shapes = {"fc2_bias": (10,), "fc2_weight": (10, 1000), "fc1_bias": (1000,), "fc1_weight": (1000, 100)}
    for k, v in true_shapes.items():
        assert arg_shape_dict[k] == v


# MXNet: test_infer_shape.py::test_mlp2_infer_error
def test_mlp2_infer_error():
    out = _mlp2()
    weight_shape = (1, 100)
    data_shape = (100, 100)
    with pytest.raises(CompileError):
        out.infer_shape(data=data_shape, fc1_weight=weight_shape)


def _arg_shapes(net, **shapes):
    arg_shapes, _, _ = net.infer_shape(**shapes)
    return dict(zip(net.list_arguments(), arg_shapes))


# MXNet: test_infer_shape.py::test_incomplete_infer_elewise
def test_incomplete_infer_elewise():
    a = sym.Variable("a", shape=(0, 10))
    b = sym.Variable("b", shape=(12, 0))
    c = a + b
    arg_shapes = _arg_shapes(c)
    assert arg_shapes["a"] == (12, 10)
    assert arg_shapes["b"] == (12, 10)


# MXNet: test_infer_shape.py::test_incomplete_infer_mlp
def test_incomplete_infer_mlp():
    a = sym.Variable("a", shape=(0, 10))
    b = sym.FullyConnected(data=a, num_hidden=21)
    c = sym.Variable("c", shape=(5, 0))
    d = b + c
    arg_shapes = _arg_shapes(d)
    assert arg_shapes["a"] == (5, 10)
    assert arg_shapes["c"] == (5, 21)


# MXNet: test_infer_shape.py::test_incomplete_infer_slicechannel
def test_incomplete_infer_slicechannel():
    a = sym.Variable("a", shape=(0, 10))
    b = sym.SliceChannel(data=a, num_outputs=10, axis=1, squeeze_axis=True)
    c = sym.Variable("c", shape=(5,))
    d = b[1] + c
    assert _arg_shapes(d)["a"] == (5, 10)

    a = sym.Variable("a", shape=(0, 15, 0))
    b = sym.SliceChannel(data=a, num_outputs=3, squeeze_axis=False)
    c = sym.Variable("c", shape=(3, 5, 2))
    d = b[1] + c
    assert _arg_shapes(d)["a"] == (3, 15, 2)


# MXNet: test_infer_shape.py::test_incomplete_infer_convolution
def test_incomplete_infer_convolution():
    a = sym.Variable("a", shape=(0, 10, 0, 0))
    b = sym.Convolution(data=a, num_filter=21, kernel=(3, 3), dilate=(1, 1), pad=(1, 1))
    c = sym.Variable("c", shape=(5, 21, 32, 32))
    d = b + c
    assert _arg_shapes(d)["a"] == (5, 10, 32, 32)


# MXNet: test_infer_shape.py::test_incomplete_infer_concat
def test_incomplete_infer_concat():
    a = sym.Variable("a", shape=(0, 10))
    b = sym.Variable("b", shape=(0, 5))
    c = sym.Concat(a, b, num_args=2, dim=1)
    d = sym.Variable("d", shape=(2, 0))
    d = d + c
    arg_shapes = _arg_shapes(d)
    assert arg_shapes["a"] == (2, 10)
    assert arg_shapes["b"] == (2, 5)
    assert arg_shapes["d"] == (2, 15)


# MXNet: test_infer_shape.py::test_fc_infer_type
def test_fc_infer_type():
    mx_real_t = np.float32
    data = sym.Variable("data")
    out = sym.FullyConnected(data=data, name="fc1", num_hidden=1000)

    data_type = mx_real_t
    arg_types, out_types, aux_types = out.infer_type(data=data_type)
    arg_type_dict = dict(zip(out.list_arguments(), arg_types))
    assert len(out_types) == 1
    assert out_types[0] == mx_real_t
    true_types = {"fc1_bias": mx_real_t, "fc1_weight": mx_real_t}
    for k, v in true_types.items():
        assert arg_type_dict[k] == v


# MXNet: test_infer_shape.py::test_shape_completely_unknown (np_shape off)
def test_shape_completely_unknown():
    data = sym.var("data")
    ret = sym.sin(data)
    arg_shapes, out_shapes, _ = ret.infer_shape_partial()
    assert arg_shapes[0] == ()
    assert out_shapes[0] == ()


# MXNet: test_infer_shape.py::test_dot_partial_shape (np_shape off)
def test_dot_partial_shape():
    x = sym.Variable("x")
    y = sym.Variable("y")
    z = sym.dot(x, y)
    # batch size(first dim) of lhs unknown
    _, result_shape, _ = z.infer_shape_partial(x=(0, 3, 4), y=(4, 5))
    assert result_shape == [(0, 3, 5)]


# MXNet: test_infer_shape.py::test_batch_dot_partial_shape (np_shape off)
def test_batch_dot_partial_shape():
    x = sym.Variable("x")
    y = sym.Variable("y")
    z = sym.batch_dot(x, y)
    # lhs and rhs batch size unknown
    _, result_shape, _ = z.infer_shape_partial(x=(0, 3, 4), y=(0, 4, 5))
    assert result_shape == [(0, 3, 5)]
    # rhs second dim unknown
    _, result_shape, _ = z.infer_shape_partial(x=(0, 3, 4), y=(0, 0, 5))
    assert result_shape == [()]


# MXNet: test_infer_shape.py::test_embedding_partial_shape (np_shape off)
def test_embedding_partial_shape():
    # testing embedding with batch size unknown
    x = sym.Variable("x")
    w = sym.Variable("w")
    y = sym.Embedding(data=x, weight=w, input_dim=100, output_dim=10)
    _, result_shape, _ = y.infer_shape_partial(x=(0, 5), w=(100, 10))
    assert result_shape == [(0, 5, 10)]


# MXNet: test_infer_shape.py::test_transpose_partial_shape (np_shape off)
def test_transpose_partial_shape():
    # from channels first to channels last, with batch size unknown
    axes = [0, 3, 2, 1]
    x = sym.Variable("x")
    y = sym.transpose(x, axes=axes)
    _, result, _ = y.infer_shape_partial(x=(0, 3, 224, 224))
    assert result == [(0, 224, 224, 3)]


# MXNet: test_infer_shape.py::test_backward_infer
def test_backward_infer():
    w = sym.Variable("weight")
    wshift = sym.Variable("wshift", shape=(1,))
    data = sym.Variable("data")
    # broadcast add here, not being able to deduce shape correctly
    wt = sym.broadcast_add(w, wshift)
    # shape constraint, this is what enables backward shape inference
    wt = sym._identity_with_attr_like_rhs(wt, w)
    net = sym.FullyConnected(data=data, weight=wt, num_hidden=11, no_bias=True)
    data_shape = (7, 100)
    arg_shapes, out_shapes, aux_shapes = net.infer_shape(data=data_shape)
    arg_shape_dict = dict(zip(net.list_arguments(), arg_shapes))
    true_shapes = {'weight': (11, 100)}
    for k, v in true_shapes.items():
        assert arg_shape_dict[k] == v


# MXNet: test_infer_shape.py::test_pick_partial_shape (the legacy half)
def test_pick_partial_shape():
    x = sym.Variable("x")
    index = sym.Variable("index")
    y = sym.pick(x, index, axis=1)
    # batch size unknown
    _, result, _ = y.infer_shape_partial(x=(0, 3, 3), index=(0, 3,))
    assert result == [(0, 3)]


def test_pick_computes_mxnets_pick():
    # not from MXNet: the op the test above needs, compiled, against numpy (indices clipped as MXNet does)
    import tvm_ext
    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype("float32")
    index = np.array([[0, 2, 1, 1], [5, -1, 1, 0]], dtype="float32")
    y = sym.pick(sym.Variable("x"), sym.Variable("index"), axis=1)
    want = np.take_along_axis(x, np.clip(index.astype(int), 0, 2)[:, None, :], 1)[:, 0, :]
    np.testing.assert_array_equal(tvm_ext.compile(y, [x, index])(x, index), want)


# MXNet: test_infer_shape.py::test_where_partial_shape (np_shape off)
def test_where_partial_shape():
    x = sym.Variable("x")
    y = sym.Variable("y")
    cond = sym.Variable("cond")
    where_op = sym.where(cond, x, y)
    # condition must be fully known to infer shape
    _, result, _ = where_op.infer_shape_partial(cond=(0, 2), x=(0, 2), y=(0, 2))
    assert result == [()]
    _, result, _ = where_op.infer_shape_partial(cond=(0,), x=(2, 2), y=(2, 2))
    assert result == [()]


# --------------------------------------------------------------------------- test_attr.py
# MXNet: test_attr.py::test_attr_basic
def test_attr_basic():
    with sym.AttrScope(group="4", data="great"):
        data = sym.Variable("data", attr={"dtype": "data", "group": "1", "force_mirroring": "True"}, lr_mult=1)
        gdata = sym.Variable("data2")
    assert gdata.attr("group") == "4"
    assert data.attr("group") == "1"
    assert data.attr("lr_mult") == "1"
    assert data.attr("__lr_mult__") == "1"
    assert data.attr("force_mirroring") == "True"
    assert data.attr("__force_mirroring__") == "True"
    data2 = pkl.loads(pkl.dumps(data))
    assert data.attr("dtype") == data2.attr("dtype")


# MXNet: test_attr.py::test_operator
def test_operator():
    data = sym.Variable("data")
    with sym.AttrScope(__group__="4", __data__="great"):
        fc1 = sym.Activation(data, act_type="relu")
        with sym.AttrScope(__init_bias__="0.0"):
            fc2 = sym.FullyConnected(fc1, num_hidden=10, name="fc2")
    assert fc1.attr("__data__") == "great"
    assert fc2.attr("__data__") == "great"
    assert fc2.attr("__init_bias__") == "0.0"
    fc2copy = pkl.loads(pkl.dumps(fc2))
    assert fc2copy.tojson() == fc2.tojson()
    fc2.get_internals()["fc2_weight"]


# MXNet: test_attr.py::test_list_attr
def test_list_attr():
    data = sym.Variable("data", attr={"mood": "angry"})
    op = sym.Convolution(data=data, name="conv", kernel=(1, 1), num_filter=1,
                         attr={"__mood__": "so so", "wd_mult": "x"})
    assert _contain({"__mood__": "so so", "wd_mult": "x", "__wd_mult__": "x"}, op.list_attr())


# MXNet: test_attr.py::test_attr_dict
def test_attr_dict():
    data = sym.Variable("data", attr={"mood": "angry"})
    op = sym.Convolution(data=data, name="conv", kernel=(1, 1), num_filter=1, attr={"__mood__": "so so"},
                         lr_mult=1)
    assert _contain({
        "data": {"mood": "angry"},
        "conv_weight": {"__mood__": "so so"},
        "conv": {"kernel": "(1, 1)", "__mood__": "so so", "num_filter": "1", "lr_mult": "1", "__lr_mult__": "1"},
        "conv_bias": {"__mood__": "so so"}}, op.attr_dict())
