"""NNVM-style shape and type inference on Symbols: every weight of an MLP and a CNN from the
data shape alone (expected shapes worked out by hand), the fixed point of forward and
backward rules, partial inference, and the errors for conflicting shapes and dtypes."""
from __future__ import annotations

import numpy as np
import pytest

from tvm_ext import DtypeError, InputError, ShapeError, sym


def _mlp():
    data = sym.Variable("data")
    h = sym.relu(sym.FullyConnected(data, num_hidden=128, name="fc1"), name="relu1")
    h = sym.relu(sym.FullyConnected(h, num_hidden=64, name="fc2"), name="relu2")
    return sym.softmax(sym.FullyConnected(h, num_hidden=10, name="fc3"), name="out")


def test_mlp_weights_from_the_data_shape():
    net = _mlp()
    arg_shapes, out_shapes, aux_shapes = net.infer_shape(data=(8, 784))
    # fc weights are (num_hidden, in_features), biases (num_hidden,)
    assert dict(zip(net.list_arguments(), arg_shapes)) == {
        "data": (8, 784), "fc1_weight": (128, 784), "fc1_bias": (128,), "fc2_weight": (64, 128),
        "fc2_bias": (64,), "fc3_weight": (10, 64), "fc3_bias": (10,)}
    assert out_shapes == [(8, 10)] and aux_shapes == []
    assert net.infer_shape((8, 784)) == (arg_shapes, out_shapes, aux_shapes)  # positional, as MXNet


def test_cnn_weights_from_the_data_shape():
    data = sym.Variable("data")
    x = sym.conv2d(data, num_filter=16, kernel=5, pad=2, name="conv1")
    x = sym.relu(sym.batch_norm(x, name="bn1"))
    x = sym.max_pool2d(x, kernel=2, name="pool1")                        # 32x32 -> 16x16
    x = sym.conv2d(x, num_filter=32, kernel=(3, 3), stride=2, pad=1, num_group=4, name="conv2")  # -> 8x8
    x = sym.avg_pool2d(x, kernel=2, name="pool2")                        # -> 4x4
    net = sym.dense(sym.flatten(x), num_hidden=10, name="fc")            # 32 * 4 * 4 = 512 features
    arg_shapes, out_shapes, aux_shapes = net.infer_shape(data=(4, 3, 32, 32))
    assert dict(zip(net.list_arguments(), arg_shapes)) == {
        "data": (4, 3, 32, 32),
        "conv1_weight": (16, 3, 5, 5), "conv1_bias": (16,),
        "bn1_gamma": (16,), "bn1_beta": (16,),
        "conv2_weight": (32, 4, 3, 3), "conv2_bias": (32,),             # C / num_group = 16 / 4
        "fc_weight": (10, 512), "fc_bias": (10,)}
    assert dict(zip(net.list_auxiliary_states(), aux_shapes)) == {"bn1_moving_mean": (16,), "bn1_moving_var": (16,)}
    assert out_shapes == [(4, 10)]


def test_layer_norm_and_concat():
    a, b = sym.Variable("a"), sym.Variable("b")
    net = sym.layer_norm(sym.concat(a, b, axis=-1), axes=(-2, -1), name="ln")
    assert net.infer_shape(a=(2, 3, 4), b=(2, 3, 5)) == ([(2, 3, 4), (2, 3, 5), (3, 9), (3, 9)], [(2, 3, 9)], [])


def test_forward_and_backward_rules_reach_a_fixed_point():
    # w is only known through y + w (elementwise with fc's output); fc2's weight only through w;
    # b only through exp(b) (its output must match data in the add).
    data, w, b = sym.Variable("data"), sym.Variable("w"), sym.Variable("b")
    y = sym.dense(data, num_hidden=4, name="fc")
    net = sym.Group([sym.dense(y + w, num_hidden=3, name="fc2"), sym.exp(b) + data])
    arg_shapes, out_shapes, _ = net.infer_shape(data=(5, 7))
    assert dict(zip(net.list_arguments(), arg_shapes)) == {
        "data": (5, 7), "fc_weight": (4, 7), "fc_bias": (4,), "w": (5, 4), "fc2_weight": (3, 4),
        "fc2_bias": (3,), "b": (5, 7)}
    assert out_shapes == [(5, 3), (5, 7)]


def test_a_creation_op_does_not_pass_its_output_shape_to_its_fill_value():
    # full's only tensor input is a scalar fill value, not an elementwise operand of its output's shape
    v, x = sym.Variable("v"), sym.Variable("x")
    net = sym.full(shape=(2, 3), fill_value=v, name="f") + x
    assert net.infer_shape_partial(x=(2, 3)) == ([(), (2, 3)], [(2, 3)], [])  # MXNet's unknown shape: ()
    assert net.infer_shape(v=(), x=(2, 3)) == ([(), (2, 3)], [(2, 3)], [])
    with pytest.raises(ShapeError, match=r"node 'f' \(full\).*'v' \(2,\) float32.*zero rank"):
        net.infer_shape(v=(2,), x=(2, 3))  # TVM's reason prints dtype="float32": still a shape error
    assert sym.exp(sym.Variable("a")).infer_shape_partial() == ([()], [()], [])
    assert (sym.exp(sym.Variable("a")) + x).infer_shape(x=(4,)) == ([(4,), (4,)], [(4,)], [])  # unary rule


def test_shape_hints_and_partial_inference():
    x = sym.Variable("x", shape=(2, 6))
    net = sym.dense(x, num_hidden=3, name="fc") + sym.Variable("free") * 0
    assert net.infer_shape() == ([(2, 6), (3, 6), (3,), (2, 3)], [(2, 3)], [])
    lone = sym.Group([sym.exp(sym.Variable("a")), sym.dense(sym.Variable("b"), num_hidden=2, name="d")])
    assert lone.infer_shape_partial(a=(3,)) == ([(3,), (), (), ()], [(3,), ()], [])
    with pytest.warns(UserWarning, match=r"cannot infer the shapes of \['b', 'd_weight', 'd_bias'\].*infer_shape\(b="):
        assert lone.infer_shape(a=(3,)) == (None, None, None)  # MXNet's answer when shapes stay unknown
    with pytest.raises(InputError, match=r"\['nope'\] are not inputs"):
        lone.infer_shape(nope=(1,))


def test_conflicting_weight_shape_names_node_op_both_shapes_and_the_fix():
    net = _mlp()
    with pytest.raises(ShapeError) as err:
        net.infer_shape(data=(8, 784), fc1_weight=(128, 785))
    msg = str(err.value)
    assert "node 'fc1' (dense)" in msg and "'fc1_weight'" in msg
    assert "(128, 785)" in msg and "(128, 784)" in msg and "num_hidden=128" in msg
    assert "Fix: give 'fc1_weight' the shape (128, 784)" in msg


def test_conflicting_operand_shapes_from_tvm_struct_info():
    a, b = sym.Variable("a"), sym.Variable("b")
    net = sym.add(sym.exp(a, name="ea"), b, name="plus")
    with pytest.raises(ShapeError) as err:
        net.infer_shape(a=(8, 64), b=(8, 32))
    msg = str(err.value)
    assert "node 'plus' (add)" in msg and "(8, 64)" in msg and "(8, 32)" in msg and "broadcastable" in msg
    assert "Fix:" in msg and "In ir.Op" not in msg  # TVM's reason, without its op dump
    with pytest.raises(ShapeError, match=r"node 'c' \(conv2d\).*divide by num_group \(2\).*\(1, 3, 8, 8\)"):
        sym.conv2d(sym.Variable("x"), num_filter=4, kernel=3, num_group=2, name="c").infer_shape(x=(1, 3, 8, 8))
    # a shape given to infer_shape overrides the Variable's hint, as in MXNet
    assert sym.exp(sym.Variable("h", shape=(2, 3))).infer_shape(h=(3, 3)) == ([(3, 3)], [(3, 3)], [])


def test_types_forward_backward_and_default():
    net = _mlp()
    arg_types, out_types, _ = net.infer_type(data="float16")
    assert arg_types == ["float16"] * 7 and out_types == ["float16"]  # weights take their data's dtype
    assert net.infer_type() == (["float32"] * 7, ["float32"], [])       # nothing given: float32
    a, b = sym.Variable("a"), sym.Variable("b")
    assert sym.Group([a < b, sym.astype(a, dtype="int32")]).infer_type(b="float64") == (
        ["float64", "float64"], ["bool", "int32"], [])                   # a shares b's dtype
    bn = sym.batch_norm(sym.Variable("x"), name="bn")
    assert bn.infer_type(x="float16") == (["float16"] * 3, ["float16"], ["float16"] * 2)


def test_dtype_conflicts_name_node_op_and_both_dtypes():
    a, b = sym.Variable("a"), sym.Variable("b")
    for net, dtypes in [(sym.add(a, b, name="plus"), {"a": "float32", "b": "int32"}),
                        (sym.add(a, sym.astype(b, dtype="int32", name="cast"), name="plus"), {})]:
        with pytest.raises(DtypeError) as err:
            net.to_relax({"a": (4,), "b": (4,)}, dtypes=dtypes)
        msg = str(err.value)
        assert "node 'plus' (add)" in msg and "float32" in msg and "int32" in msg and "astype" in msg
    with pytest.raises(DtypeError, match=r"node 'half' \(add\).*scalar 0.5 would be truncated on a int32"):
        sym.add(sym.Variable("i", dtype="int32"), 0.5, name="half").infer_shape(i=(3,))
    assert (sym.Variable("i", dtype="int32") + 2).infer_type() == (["int32"], ["int32"], [])
    with pytest.raises(DtypeError, match=r"node 'fc' \(dense\): input 'fc_weight' \(weight\) has dtype int32, "
                                         r"but its data's dtype float32"):
        sym.dense(sym.Variable("x"), num_hidden=2, name="fc").infer_type(x="float32", fc_weight="int32")


def test_partial_shapes_follow_mxnet_and_to_relax_wants_them_complete():
    # matmul's operands are not elementwise: w's shape says nothing of d's
    d, w = sym.Variable("d"), sym.Variable("w")
    assert sym.matmul(d, w).infer_shape_partial(w=(4, 5)) == ([(), (4, 5)], [()], [])
    # an unknown dim (0) flows back from the output once known: fc's batch from c
    a = sym.Variable("a", shape=(0, 10))
    net = sym.FullyConnected(a, num_hidden=3, name="fc") + sym.Variable("c", shape=(7, 0))
    assert net.infer_shape()[0] == [(7, 10), (3, 10), (3,), (7, 3)]
    with pytest.raises(InputError, match=r"'a' has \(0, 10\): a 0 is an unknown dim"):
        net.to_relax({"a": (0, 10)})
    with pytest.raises(InputError, match=r"to_relax needs the shapes of \['b'\]"):
        sym.exp(sym.Variable("b", shape=(0, 2))).to_relax()
    # a dtype conflict shows with the shapes unknown too
    with pytest.raises(DtypeError, match=r"node 'plus' \(add\).*float32.*int32"):
        sym.add(sym.Variable("x"), sym.astype(sym.Variable("y"), dtype="int32"), name="plus").infer_type()
    arg_types, out_types, _ = sym.exp(sym.Variable("x")).infer_type(x=np.float16)  # numpy types, as MXNet
    assert arg_types == [np.float16] and out_types == ["float16"]
