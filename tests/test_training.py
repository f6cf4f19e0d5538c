"""Compiled training steps: one call does forward, backward and the update; checked against torch."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_ext.symbol as sym
from tvm_ext.errors import InputError
from tvm_ext.training import SGD, Adam, Trainer, build_train_step, init_params

B, D, H, C = 8, 12, 16, 5
SHAPES = {"data": (B, D), "label": (B, C)}
PARAMS = ["fc1_weight", "fc1_bias", "fc2_weight", "fc2_bias"]


def mlp():
    """A 2-layer MLP with a softmax cross-entropy loss (one-hot labels), and its logits."""
    data, label = sym.Variable("data"), sym.Variable("label")
    fc1 = sym.FullyConnected(data, num_hidden=H, name="fc1")
    fc2 = sym.FullyConnected(sym.relu(fc1), num_hidden=C, name="fc2")
    loss = -sym.mean(sym.sum(sym.log_softmax(fc2, axis=-1) * label, axis=[1]))
    return loss, fc2


def batch(seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((B, D)).astype("float32")
    y = np.eye(C, dtype="float32")[rng.integers(0, C, B)]
    return x, y


def torch_loss(p, x, y):
    h = torch.relu(torch.tensor(x) @ p["fc1_weight"].T + p["fc1_bias"])
    logits = h @ p["fc2_weight"].T + p["fc2_bias"]
    return -(torch.log_softmax(logits, -1) * torch.tensor(y)).sum(1).mean()


def test_train_step_is_one_function_with_params_state_data_order():
    loss, _ = mlp()
    mod = build_train_step(loss.to_relax(SHAPES), PARAMS, SGD(0.1, momentum=0.9))
    assert [gv.name_hint for gv in mod.get_global_vars()] == ["main"]
    main = mod["main"]
    assert [p.name for p in main.params] == PARAMS + [f"{p}_momentum" for p in PARAMS] + ["data", "label"]
    assert len(main.ret_ty.fields) == 1 + 2 * len(PARAMS)  # loss, new params, new momenta
    calls = [b.value for blk in main.body.blocks for b in blk.bindings if isinstance(b.value, relax.Call)]
    assert all(isinstance(c.op, tvm.ir.Op) for c in calls)  # forward, backward, update inline
    adam = build_train_step(loss.to_relax(SHAPES), PARAMS, Adam())["main"]
    assert [p.name for p in adam.params][len(PARAMS):-2] == \
        [f"{p}_adam_{k}" for p in PARAMS for k in ("m", "v")] + ["adam_step"]


def test_one_sgd_step_equals_torch():
    loss, logits = mlp()
    trainer = Trainer(loss, ["data", "label"], SGD(0.1), shapes=SHAPES, predict=logits)
    x, y = batch()
    p = {k: torch.tensor(v, requires_grad=True) for k, v in trainer.parameters().items()}
    expected = torch_loss(p, x, y)
    expected.backward()
    got = trainer.step(x, y)
    np.testing.assert_allclose(got, expected.item(), rtol=1e-5)
    for name, value in trainer.parameters().items():
        want = (p[name] - 0.1 * p[name].grad).detach().numpy()
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-6, err_msg=name)
    with torch.no_grad():
        h = torch.relu(torch.tensor(x) @ (p["fc1_weight"] - 0.1 * p["fc1_weight"].grad).T
                       + (p["fc1_bias"] - 0.1 * p["fc1_bias"].grad))
        want_logits = h @ (p["fc2_weight"] - 0.1 * p["fc2_weight"].grad).T + (p["fc2_bias"] - 0.1 * p["fc2_bias"].grad)
    np.testing.assert_allclose(trainer.predict(x), want_logits.numpy(), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("ours,theirs", [
    (SGD(0.1, momentum=0.9, weight_decay=0.01), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01)),
    (Adam(0.01, weight_decay=0.001), lambda ps: torch.optim.Adam(ps, lr=0.01, weight_decay=0.001)),
], ids=["sgd_momentum", "adam"])
def test_three_steps_equal_torch_optimizer(ours, theirs):
    loss, _ = mlp()
    trainer = Trainer(loss, ["data", "label"], ours, shapes=SHAPES)
    p = {k: torch.tensor(v, requires_grad=True) for k, v in trainer.parameters().items()}
    opt = theirs(list(p.values()))
    for seed in range(3):
        x, y = batch(seed)
        got = trainer.step(x, y)
        opt.zero_grad()
        expected = torch_loss(p, x, y)
        expected.backward()
        opt.step()
        np.testing.assert_allclose(got, expected.item(), rtol=1e-4)
    for name, value in trainer.parameters().items():
        np.testing.assert_allclose(value, p[name].detach().numpy(), rtol=1e-4, atol=1e-5, err_msg=name)


def _linear_regression_module(n=16, d=3) -> tvm.IRModule:
    """mean((x @ w + b - t)^2), built with a BlockBuilder (no Symbol)."""
    x = relax.Var("x", relax.TensorType((n, d), "float32"))
    t = relax.Var("t", relax.TensorType((n,), "float32"))
    w = relax.Var("w", relax.TensorType((d,), "float32"))
    b = relax.Var("b", relax.TensorType((), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w, b, t]):
        with bb.dataflow():
            err = bb.emit(relax.op.subtract(relax.op.add(relax.op.matmul(x, w), b), t))
            out = bb.emit_output(relax.op.mean(relax.op.multiply(err, err)))
        bb.emit_func_output(out)
    return bb.get()


def test_relax_module_model_learns_and_evaluates():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 3)).astype("float32")
    t = (x @ np.array([1.0, -2.0, 0.5]) + 0.3).astype("float32")
    trainer = Trainer(_linear_regression_module(), ["x", "t"], SGD(0.1))
    assert trainer.param_names == ["w", "b"]
    before = trainer.evaluate(x, t)
    losses = [trainer.step(x, t) for _ in range(60)]
    assert losses[0] == pytest.approx(before, rel=1e-6)
    assert losses[-1] < 1e-3 * losses[0]
    np.testing.assert_allclose(trainer.parameters()["w"], [1.0, -2.0, 0.5], atol=1e-2)
    assert trainer.evaluate(x, t) == pytest.approx(float(np.mean((x @ trainer.parameters()["w"]
                                                                   + trainer.parameters()["b"] - t) ** 2)), rel=1e-4)


def test_data_names_in_any_order():
    # the module's inputs are (x, w, b, t); data given as (t, x) must still feed t to t and x to x
    rng = np.random.default_rng(1)
    x = rng.standard_normal((16, 3)).astype("float32")
    t = rng.standard_normal(16).astype("float32")
    trainer = Trainer(_linear_regression_module(), ["t", "x"], SGD(0.1), params={"w": np.ones(3, "float32"),
                                                                                "b": np.zeros((), "float32")})
    assert trainer.param_names == ["w", "b"]
    want = float(np.mean((x.sum(1) - t) ** 2))
    assert trainer.evaluate(t, x) == pytest.approx(want, rel=1e-5)
    assert trainer.step(t, x) == pytest.approx(want, rel=1e-5)
    dw = 2 * ((x.sum(1) - t)[:, None] * x).mean(0)
    np.testing.assert_allclose(trainer.parameters()["w"], 1 - 0.1 * dw, rtol=1e-5)


def test_a_non_float_input_must_be_data():
    x = relax.Var("x", relax.TensorType((4,), "float32"))
    k = relax.Var("k", relax.TensorType((4,), "int64"))
    w = relax.Var("w", relax.TensorType((4,), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, k, w]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.sum(relax.op.multiply(relax.op.add(x, relax.op.astype(k, "float32")), w)))
        bb.emit_func_output(out)
    with pytest.raises(InputError, match=r"input 'k' \(int64\).*cannot be trained.*data_names"):
        Trainer(bb.get(), ["x"])
    assert Trainer(bb.get(), ["x", "k"]).param_names == ["w"]


def test_init_params_glorot_weights_zero_biases_unit_scales():
    x = sym.Variable("x")
    net = sym.sum(sym.layer_norm(sym.dense(x, num_hidden=6, name="fc"), name="ln"))
    func = net.to_relax({"x": (4, 3)})["main"]
    values = init_params(func, ["fc_weight", "fc_bias", "ln_gamma", "ln_beta"], seed=3)
    bound = np.sqrt(6.0 / (3 + 6))
    assert values["fc_weight"].shape == (6, 3) and 0 < np.abs(values["fc_weight"]).max() <= bound
    assert values["fc_weight"].std() > bound / 4  # spread over the range, not a constant
    np.testing.assert_array_equal(values["fc_bias"], np.zeros(6))
    np.testing.assert_array_equal(values["ln_gamma"], np.ones(6))  # a zero scale would cut every gradient
    np.testing.assert_array_equal(values["ln_beta"], np.zeros(6))


def test_unknown_data_input_is_reported():
    with pytest.raises(InputError, match="not inputs of the model"):
        Trainer(_linear_regression_module(), ["x", "target"])
    trainer = Trainer(_linear_regression_module(), ["x", "t"])
    with pytest.raises(InputError, match="without a predict model"):
        trainer.predict(np.zeros((16, 3), "float32"))
