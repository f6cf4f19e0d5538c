"""The Gradient pass: a hand-worked graph, summed paths, wrt subsets, its errors, and every
registered op gradient against central finite differences (float64) and TVM's own Gradient."""
from __future__ import annotations

import numpy as np
import pytest
import tvm
from tvm import relax

import tvm_ext
from relay_passes.gradient import Gradient
from tvm_ext.errors import InputError, UnsupportedOpError

F64 = "float64"
op = relax.op


def scalar_module(make, specs, names=None, weight_seed=1) -> tvm.IRModule:
    """``main(*inputs) = sum(make(*inputs) * R)`` with a fixed random R (a non-trivial adjoint)."""
    names = names or [f"x{i}" for i in range(len(specs))]
    params = [relax.Var(n, relax.TensorType(s, F64)) for n, s in zip(names, specs)]
    bb = relax.BlockBuilder()
    with bb.function("main", params):
        with bb.dataflow():
            y = bb.emit(make(*params))
            shape = [int(d) for d in y.ty.shape.values]
            weight = np.random.default_rng(weight_seed).standard_normal(shape)
            loss = bb.emit_output(op.sum(op.multiply(y, relax.const(weight, str(y.ty.dtype)))))
        bb.emit_func_output(loss)
    return bb.get()


def bindings(func: relax.Function) -> list[tuple[str, str]]:
    """(name, op) of every binding; op is '' for non-calls."""
    out = []
    for block in func.body.blocks:
        for b in block.bindings:
            v = b.value
            out.append((b.var.name, v.op.name if isinstance(v, relax.Call) and isinstance(v.op, tvm.ir.Op) else ""))
    return out


def run(vm, name, *arrays):
    return vm[name](*[tvm.runtime.tensor(a) for a in arrays])


def numeric_gradient(f, xs, i, eps):
    grad = np.zeros_like(xs[i])
    for idx in np.ndindex(xs[i].shape):
        plus = [x.copy() for x in xs]
        minus = [x.copy() for x in xs]
        plus[i][idx] += eps
        minus[i][idx] -= eps
        grad[idx] = (f(*plus) - f(*minus)) / (2 * eps)
    return grad


# --------------------------------------------------------------------------- the pass itself
def _x_squared_plus_xw():
    return scalar_module(lambda x, w: op.add(op.multiply(x, x), op.multiply(x, w)), [(3, 4), (4,)], ["x", "w"])


def test_hand_worked_gradient_structure_and_values(rng):
    # y = sum((x*x + x*w) * R): dy/dx = R * (2x + w), dy/dw = sum_rows(R * x)
    mod = _x_squared_plus_xw()
    adj = Gradient(wrt=["x"])(mod)["main_adjoint"]
    names = bindings(adj)
    assert [o for _, o in names[:5]] == ["relax.multiply", "relax.multiply", "relax.add", "relax.multiply", "relax.sum"]
    backward = names[5:]
    # only x gets an adjoint; its three contributions (x*x twice, x*w once) are summed by two adds
    assert not any(n.startswith("w_adjoint") for n, _ in backward)
    x_adds = [n for n, o in backward if n.startswith("x_adjoint") and o == "relax.add"]
    assert len(x_adds) == 2
    assert len(adj.ret_ty.fields[1].fields) == 1

    compiled = tvm_ext.compile(Gradient(adjoint_name="main")(mod))
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    r = np.random.default_rng(1).standard_normal((3, 4))
    loss, (dx, dw) = compiled(x, w)
    np.testing.assert_allclose(loss, ((x * x + x * w) * r).sum(), rtol=1e-12)
    np.testing.assert_allclose(dx, r * (2 * x + w), rtol=1e-12)
    np.testing.assert_allclose(dw, (r * x).sum(0), rtol=1e-12)


def test_gradient_as_a_pipeline_pass(rng):
    # compile(..., passes=[Gradient(adjoint_name="main")]): the entry becomes (loss, (dx, dw))
    compiled = tvm_ext.compile(_x_squared_plus_xw(), passes=[Gradient(adjoint_name="main")])
    assert [s.name for s in compiled.inputs] == ["x", "w"]
    x, w = rng.standard_normal((3, 4)), rng.standard_normal(4)
    r = np.random.default_rng(1).standard_normal((3, 4))
    _, (dx, dw) = compiled(x, w)
    np.testing.assert_allclose(dx, r * (2 * x + w), rtol=1e-12)
    np.testing.assert_allclose(dw, (r * x).sum(0), rtol=1e-12)


def test_paths_into_one_value_are_summed(rng):
    # a = exp(x) feeds both a*a and a: y = sum(R * (a*a + a)), dy/dx = R * (2a + 1) * a
    mod = scalar_module(lambda x: op.add(op.multiply(op.exp(x), op.exp(x)), op.exp(x)), [(2, 3)], ["x"])
    mod = relax.transform.EliminateCommonSubexpr()(mod)  # one exp, three uses
    adj = Gradient()(mod)["main_adjoint"]
    exp_var = next(n for n, o in bindings(adj) if o == "relax.exp")
    sums = [n for n, o in bindings(adj) if n.startswith(f"{exp_var}_adjoint") and o == "relax.add"]
    assert len(sums) == 2
    vm = relax.VirtualMachine(tvm_ext.compile(Gradient()(mod)).executable, tvm.cpu())
    x = rng.standard_normal((2, 3))
    r = np.random.default_rng(1).standard_normal((2, 3))
    _, (dx,) = run(vm, "main_adjoint", x)
    a = np.exp(x)
    np.testing.assert_allclose(dx.numpy(), r * (2 * a + 1) * a, rtol=1e-12)


def test_wrt_subset_by_name_and_position():
    mod = _x_squared_plus_xw()
    for wrt in (["w"], [1]):
        adj = Gradient(wrt=wrt)(mod)["main_adjoint"]
        names = [n for n, _ in bindings(adj)]
        assert any(n.startswith("w_adjoint") for n in names)
        assert not any(n.startswith("x_adjoint") for n in names)
    both = Gradient()(mod)["main_adjoint"]
    assert len(both.ret_ty.fields[1].fields) == 2


def test_relu_adjoint_is_zero_where_x_is_not_positive_even_for_a_nan_adjoint():
    # y = sum(relu(x) * log(w)): dy/dx = log(w) where x > 0, else 0 (PyTorch's threshold_backward),
    # also where log(w) is NaN (w < 0) or -inf (w = 0); g * (x > 0) would give NaN there
    mod = scalar_module(lambda x, w: op.multiply(op.nn.relu(x), op.log(w)), [(2, 3), (2, 3)], ["x", "w"])
    compiled = tvm_ext.compile(Gradient(adjoint_name="main", wrt=["x"])(mod))
    x = np.array([[1.0, -1.0, 0.0], [2.0, -3.0, 0.5]])
    w = np.array([[2.0, -1.0, 0.0], [3.0, 0.0, -2.0]])
    r = np.random.default_rng(1).standard_normal((2, 3))
    with np.errstate(invalid="ignore", divide="ignore"):
        want = np.where(x > 0, np.log(w) * r, 0.0)
    _, dx = compiled(x, w)  # one wrt: its adjoint alone
    np.testing.assert_array_equal(dx, want)  # [[r log2, 0, 0], [r log3, 0, NaN]]: x = 0.5 > 0 keeps its NaN


def test_unreached_parameter_gets_zeros(rng):
    mod = scalar_module(lambda x, z: op.exp(x), [(2,), (3,)], ["x", "z"])
    compiled = tvm_ext.compile(Gradient(adjoint_name="main")(mod))
    _, (_, dz) = compiled(rng.standard_normal(2), rng.standard_normal(3))
    np.testing.assert_array_equal(dz, np.zeros(3))


def test_missing_gradient_names_node_op_and_fix():
    mod = scalar_module(lambda x: op.nn.gelu_tanh(x), [(2, 3)], ["x"])
    with pytest.raises(UnsupportedOpError) as err:
        Gradient()(mod)
    msg = str(err.value)
    assert "relax.nn.gelu_tanh" in msg and "node 'lv'" in msg and "gradient=" in msg and "tvm_ext/ops" in msg
    unknown = scalar_module(lambda x: op.cumsum(x, axis=1), [(2, 3)], ["x"])  # not in the registry at all
    with pytest.raises(UnsupportedOpError, match="relax.cumsum, which has no gradient .tvm_ext has no entry"):
        Gradient()(unknown)


def test_op_off_the_wrt_path_needs_no_gradient(rng):
    # cumsum (no rule) only touches z; differentiating x alone must not need its gradient
    mod = scalar_module(lambda x, z: op.multiply(x, op.cumsum(z, axis=0)), [(3,), (3,)], ["x", "z"])
    compiled = tvm_ext.compile(Gradient(wrt=["x"], adjoint_name="main")(mod))
    x, z = rng.standard_normal(3), rng.standard_normal(3)
    _, dx = compiled(x, z)
    r = np.random.default_rng(1).standard_normal(3)
    np.testing.assert_allclose(dx, r * np.cumsum(z), rtol=1e-10)  # d/dx sum(R * x * cumsum(z))
    with pytest.raises(UnsupportedOpError, match="relax.cumsum"):
        Gradient(wrt=["z"])(mod)


def test_bad_targets_and_wrt_are_reported():
    mod = scalar_module(lambda x: op.exp(x), [(2,)], ["x"])
    with pytest.raises(InputError, match="not a parameter"):
        Gradient(wrt=["nope"])(mod)
    with pytest.raises(InputError, match="no Relax function 'f'"):
        Gradient("f")(mod)
    x = relax.Var("x", relax.TensorType((2,), F64))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            y = bb.emit_output(op.exp(x))
        bb.emit_func_output(y)
    with pytest.raises(InputError, match="must be a scalar"):
        Gradient()(bb.get())
    # an integer target (a count) is a step function of x: no gradient to give
    x = relax.Var("x", relax.TensorType((3,), F64))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            n = bb.emit_output(op.sum(op.astype(op.greater(x, _const(0.0, F64)), "int64")), name_hint="n")
        bb.emit_func_output(n)
    with pytest.raises(InputError, match=r"target 'n' has dtype int64; it must be a float"):
        Gradient()(bb.get())


# --------------------------------------------------------------------------- every rule, numerically
def _const(value, dtype):
    return relax.const(np.asarray(value), dtype)


_COND = np.array([[True, False, True], [False, False, True]])
# name: (make, input shapes, positive inputs, tvm has the rule, fd eps, tolerance)
CASES = {
    "add_broadcast": (lambda a, b: op.add(a, b), [(2, 3), (3,)], False, True),
    "add_unit_dims": (lambda a, b: op.add(a, b), [(2, 1, 3), (4, 1)], False, True),
    "subtract": (lambda a, b: op.subtract(a, b), [(2, 3), (2, 1)], False, True),
    "multiply": (lambda a, b: op.multiply(a, b), [(2, 3), (1, 3)], False, True),
    "divide": (lambda a, b: op.divide(a, b), [(2, 3), (3,)], True, True),
    "power_scalar": (lambda a: op.power(a, _const(2.5, F64)), [(2, 3)], True, True),
    "power_tensor": (lambda a, b: op.power(a, b), [(2, 3), (2, 3)], True, True),
    "maximum": (lambda a, b: op.maximum(a, b), [(2, 3), (2, 3)], False, True),
    "minimum": (lambda a, b: op.minimum(a, b), [(2, 3), (3,)], False, True),
    "negative": (op.negative, [(2, 3)], False, True),
    "exp": (op.exp, [(2, 3)], False, True),
    "log": (op.log, [(2, 3)], True, True),
    "sqrt": (op.sqrt, [(2, 3)], True, True),
    "rsqrt": (op.rsqrt, [(2, 3)], True, False),
    "tanh": (op.tanh, [(2, 3)], False, True),
    "sigmoid": (op.sigmoid, [(2, 3)], False, True),
    "abs": (op.abs, [(2, 3)], False, True),
    "sin": (op.sin, [(2, 3)], False, True),
    "cos": (op.cos, [(2, 3)], False, True),
    "square": (op.square, [(2, 3)], False, False),
    "relu": (op.nn.relu, [(2, 3)], False, True),
    "silu": (op.nn.silu, [(2, 3)], False, True),
    "gelu": (op.nn.gelu, [(2, 3)], False, False),
    "erf": (op.erf, [(2, 3)], False, False),
    "matmul": (lambda a, b: op.matmul(a, b), [(3, 4), (4, 2)], False, True),
    "matmul_batched_broadcast": (lambda a, b: op.matmul(a, b), [(2, 1, 3, 4), (3, 4, 2)], False, True),
    "matmul_vector_left": (lambda a, b: op.matmul(a, b), [(4,), (2, 4, 3)], False, True),
    "matmul_vector_right": (lambda a, b: op.matmul(a, b), [(2, 3, 4), (4,)], False, True),
    "permute_dims": (lambda a: op.permute_dims(a, [2, 0, 1]), [(2, 3, 4)], False, True),
    "permute_dims_reverse": (lambda a: op.permute_dims(a), [(2, 3, 4)], False, True),
    "flip": (lambda a: op.flip(a, 1), [(2, 3, 4)], False, False),
    "layout_transform": (lambda a: op.layout_transform(a, index_map=lambda n, c, h, w: (n, c // 2, h, w, c % 2)),
                         [(1, 4, 2, 3)], False, False),
    "reshape": (lambda a: op.reshape(a, (3, 2)), [(2, 3)], False, True),
    "flatten": (op.flatten, [(2, 3)], False, False),
    "expand_dims": (lambda a: op.expand_dims(a, [0, 2]), [(2, 3)], False, True),
    "squeeze": (lambda a: op.squeeze(a, [1]), [(2, 1, 3)], False, False),
    "broadcast_to": (lambda a: op.broadcast_to(a, (2, 4, 3)), [(4, 1)], False, True),
    "sum_axis": (lambda a: op.sum(a, [1]), [(2, 3, 4)], False, True),
    "sum_keepdims": (lambda a: op.sum(a, [0, 2], keepdims=True), [(2, 3, 4)], False, True),
    "mean": (lambda a: op.mean(a, [-1]), [(2, 3)], False, True),
    "mean_all": (lambda a: op.mean(a), [(2, 3)], False, True),
    "variance": (lambda a: op.variance(a, [0]), [(3, 2)], False, True),
    "max": (lambda a: op.max(a, [1]), [(2, 4)], False, False),
    "min_keepdims": (lambda a: op.min(a, [0], keepdims=True), [(3, 2)], False, False),
    "softmax": (lambda a: op.nn.softmax(a, axis=-1), [(2, 4)], False, True),
    "softmax_axis0": (lambda a: op.nn.softmax(a, axis=0), [(3, 2)], False, True),
    "log_softmax": (lambda a: op.nn.log_softmax(a, axis=-1), [(2, 4)], False, True),
    "take": (lambda a: op.take(a, _const([2, 0, 2, 1], "int64"), axis=1), [(2, 3)], False, True),
    # TVM's take_backward needs a non-negative axis, 1-d indices and indices in range
    "take_negative_axis": (lambda a: op.take(a, _const([2, 0, 2, 1], "int64"), axis=-1), [(2, 3)], False, False),
    "take_2d_indices": (lambda a: op.take(a, _const([[1, 0], [2, 2]], "int64"), axis=0), [(3, 2)], False, False),
    "take_negative_indices": (lambda a: op.take(a, _const([-1, 0, -3], "int32"), axis=1), [(2, 3)], False, False),
    "take_clip_mode": (lambda a: op.take(a, _const([5, -2, 1], "int64"), axis=0, mode="clip"), [(3, 2)], False,
                       False),
    "take_axis_none": (lambda a: op.take(a, _const([[1, 0], [3, 3]], "int64")), [(4,)], False, False),
    "astype": (lambda a: op.astype(op.astype(a, "float32"), F64), [(2, 3)], False, True, 1e-2, 1e-4),
    # TVM's where rule does not sum a broadcast branch back to its shape (gives (2, 3) for (3,))
    "where": (lambda a, b: op.where(_const(_COND, "bool"), a, b), [(2, 3), (3,)], False, False),
    "where_same_shape": (lambda a, b: op.where(_const(_COND, "bool"), a, b), [(2, 3), (2, 3)], False, True),
    "zeros_like": (lambda a: op.add(op.exp(a), op.zeros_like(a)), [(2, 3)], False, True),
    "ones_like": (lambda a: op.multiply(op.exp(a), op.ones_like(a)), [(2, 3)], False, True),
    "full_like": (lambda a: op.add(a, op.full_like(a, _const(2.0, F64))), [(2, 3)], False, True),
    "conv2d": (lambda x, w: op.nn.conv2d(x, w, padding=1), [(2, 3, 5, 5), (4, 3, 3, 3)], False, True),
    # TVM's conv2d rule ignores dilation in its output padding and fails here
    "conv2d_strided_dilated": (lambda x, w: op.nn.conv2d(x, w, strides=2, padding=(1, 0, 2, 1), dilation=2),
                               [(1, 2, 7, 6), (3, 2, 2, 3)], False, False),
    "conv2d_grouped": (lambda x, w: op.nn.conv2d(x, w, padding=1, groups=2), [(2, 4, 5, 5), (6, 2, 3, 3)],
                       False, True),
    "conv2d_depthwise_strided": (lambda x, w: op.nn.conv2d(x, w, strides=2, padding=1, groups=3),
                                 [(1, 3, 6, 6), (3, 1, 3, 3)], False, True),
    "conv2d_strided": (lambda x, w: op.nn.conv2d(x, w, strides=2, padding=1), [(1, 2, 6, 6), (3, 2, 3, 3)],
                       False, True),
    "layer_norm": (lambda x, g, b: op.nn.layer_norm(x, g, b, axes=[-1]), [(3, 5), (5,), (5,)], False, False),
    "layer_norm_two_axes": (lambda x, g, b: op.nn.layer_norm(x, g, b, axes=[1, 2]), [(2, 3, 2), (3, 2), (3, 2)],
                            False, False),
}


def test_every_registered_gradient_has_a_case():
    covered = set()
    for make, shapes, *_ in CASES.values():
        mod = scalar_module(make, shapes)
        covered |= {o for _, o in bindings(mod["main"])}
    missing = {d.name for d in tvm_ext.OPS if d.gradient is not None} - covered
    assert not missing, f"gradients without a numerical test: {sorted(missing)}"


@pytest.mark.parametrize("name", list(CASES))
def test_gradient_matches_finite_differences_and_tvm(name):
    make, shapes, positive, tvm_has_rule, *tol = CASES[name]
    eps, rtol = tol if tol else (1e-6, 1e-6)
    rng = np.random.default_rng(0)
    xs = [rng.uniform(0.5, 2.0, s) if positive else rng.standard_normal(s) for s in shapes]
    mod = scalar_module(make, shapes)
    # forward and adjoint both built by our pipeline (one executable, two functions)
    vm = relax.VirtualMachine(tvm_ext.compile(Gradient()(mod)).executable, tvm.cpu())
    _, grads = run(vm, "main_adjoint", *xs)

    def f(*arrays):
        return float(run(vm, "main", *arrays).numpy())

    scale = max(1.0, max(np.abs(g.numpy()).max() for g in grads))
    for i in range(len(xs)):
        np.testing.assert_allclose(grads[i].numpy(), numeric_gradient(f, xs, i, eps), rtol=rtol,
                                   atol=rtol * scale, err_msg=f"{name}: gradient of input {i}")
    if tvm_has_rule:
        theirs = relax.transform.Gradient("main")(mod)
        tvm_vm = relax.VirtualMachine(tvm.compile(theirs, tvm_ext.host_target()), tvm.cpu())
        _, tvm_grads = run(tvm_vm, "main_adjoint", *xs)
        for i, (ours, ref) in enumerate(zip(grads, tvm_grads)):
            np.testing.assert_allclose(ours.numpy(), ref.numpy(), rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name}: input {i} differs from relax.transform.Gradient")
