"""Compiled training: forward, backward and the optimizer update in one Relax function.

``build_train_step`` differentiates a model's scalar loss with the Gradient pass and appends
the update ops, giving ``main(params..., state..., data...) -> (loss, new params..., new
state...)``; the pipeline fuses and compiles it like any model. ``Trainer`` keeps the
parameters and optimizer state as TVM tensors between calls, so one ``step`` is one call of
one compiled function.

    loss = ...  # a Symbol (or a Relax IRModule) computing a scalar loss from data, label, weights
    trainer = Trainer(loss, data_names=["data", "label"], shapes={"data": (32, 64), "label": (32, 10)},
                      optimizer=Adam(1e-3), predict=logits)
    for x, y in batches:
        trainer.step(x, y)
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import tvm
from tvm import relax

from relay_passes.gradient import emit_adjoint, is_float, select_params
from tvm_ext.errors import InputError
from tvm_ext.gradient_rules import shape_of
from tvm_ext.pipeline import compile as compile_model


# --------------------------------------------------------------------------- optimizers
@dataclass(frozen=True)
class SGD:
    """p -= lr * v with v = momentum * v + g (PyTorch's form; momentum 0: plain SGD)."""

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0

    def state_vars(self, params: Sequence[relax.Var]) -> list[relax.Var]:
        """The optimizer state the train step takes and returns: one momentum buffer per parameter."""
        return [relax.Var(f"{p.name}_momentum", p.ty) for p in params] if self.momentum else []

    def emit_update(self, bb: relax.BlockBuilder, params: Sequence[relax.Expr], grads: Sequence[relax.Expr],
                    state: Sequence[relax.Var]) -> tuple[list[relax.Expr], list[relax.Expr]]:
        """Emit the update into ``bb``: (new parameters, new state), in ``params`` / ``state`` order."""
        new_params, new_state = [], []
        for i, (p, g) in enumerate(zip(params, grads)):
            g = _decayed(g, p, self.weight_decay)
            if self.momentum:
                g = bb.emit(state[i] * _c(self.momentum, p) + g, name_hint=f"{p.name}_momentum_new")
                new_state.append(g)
            new_params.append(bb.emit(p - _c(self.lr, p) * g, name_hint=f"{p.name}_new"))
        return new_params, new_state


@dataclass(frozen=True)
class Adam:
    """Adam with bias correction (PyTorch's form); the step count is part of the state."""

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def state_vars(self, params: Sequence[relax.Var]) -> list[relax.Var]:
        """First and second moments per parameter, then the step count."""
        moments = [relax.Var(f"{p.name}_adam_{k}", p.ty) for p in params for k in ("m", "v")]
        return moments + [relax.Var("adam_step", relax.TensorType((), "float32"))]

    def emit_update(self, bb: relax.BlockBuilder, params: Sequence[relax.Expr], grads: Sequence[relax.Expr],
                    state: Sequence[relax.Var]) -> tuple[list[relax.Expr], list[relax.Expr]]:
        """Emit the update into ``bb``: (new parameters, new moments and step count)."""
        step = bb.emit(state[-1] + relax.const(1.0, "float32"), name_hint="adam_step_new")
        new_params, new_state = [], []
        for i, (p, g) in enumerate(zip(params, grads)):
            dtype = str(p.ty.dtype)
            t = step if dtype == "float32" else relax.op.astype(step, dtype)
            correct1 = _c(1.0, p) - relax.op.power(_c(self.beta1, p), t)
            correct2 = _c(1.0, p) - relax.op.power(_c(self.beta2, p), t)
            g = _decayed(g, p, self.weight_decay)
            m = bb.emit(state[2 * i] * _c(self.beta1, p) + g * _c(1 - self.beta1, p), name_hint=f"{p.name}_adam_m")
            v = bb.emit(state[2 * i + 1] * _c(self.beta2, p) + g * g * _c(1 - self.beta2, p),
                        name_hint=f"{p.name}_adam_v")
            update = (m / correct1) / (relax.op.sqrt(v / correct2) + _c(self.eps, p))
            new_params.append(bb.emit(p - _c(self.lr, p) * update, name_hint=f"{p.name}_new"))
            new_state += [m, v]
        return new_params, new_state + [step]


Optimizer = SGD | Adam


def _c(value: float, like: relax.Expr) -> relax.Constant:
    return relax.const(value, str(like.ty.dtype))


def _decayed(g: relax.Expr, p: relax.Expr, weight_decay: float) -> relax.Expr:
    return g + p * _c(weight_decay, p) if weight_decay else g


# --------------------------------------------------------------------------- the train step
def as_module(model: Any, shapes: dict[str, Sequence[int]] | None = None) -> tvm.IRModule:
    """A Relax IRModule as is; a Symbol through its ``to_relax(shapes)``."""
    if isinstance(model, tvm.IRModule):
        return model
    if hasattr(model, "to_relax"):
        inputs = set(model.list_inputs())
        return model.to_relax(shapes={k: v for k, v in (shapes or {}).items() if k in inputs})
    raise InputError(f"cannot train a {type(model).__name__}: give a Relax IRModule computing a scalar loss "
                     "or a tvm_ext Symbol")


def build_train_step(loss_mod: tvm.IRModule, params: Sequence[str], optimizer: Optimizer,
                     func_name: str = "main") -> tvm.IRModule:
    """``main(params..., state..., other inputs...) -> (loss, new params..., new state...)``.

    ``params`` names the inputs of ``loss_mod[func_name]`` to train; the other inputs (data,
    labels) come last, in their original order.
    """
    func = loss_mod[func_name]
    trained = select_params(func, params)
    others = [p for p in func.params if not any(p.same_as(t) for t in trained)]
    new_params = [relax.Var(p.name, p.ty) for p in trained]
    new_others = [relax.Var(p.name, p.ty) for p in others]
    state = optimizer.state_vars(new_params)
    args = {p: v for p, v in zip(trained + others, new_params + new_others)}
    bb = relax.BlockBuilder()
    with bb.function("main", new_params + state + new_others):
        with bb.dataflow():
            loss, grads = emit_adjoint(bb, func, [args[p] for p in func.params], trained)
            updated, new_state = optimizer.emit_update(bb, new_params, grads, state)
            out = bb.emit_output(relax.Tuple([loss, *updated, *new_state]))
        bb.emit_func_output(out)
    mod = bb.get()
    return tvm.IRModule({"main": relax.analysis.remove_all_unused(mod["main"])})


def init_params(func: relax.Function, names: Sequence[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Glorot-uniform weights (2-d and up, fan-in from all dims but the first), zero biases, and
    ones for the scales of normalization layers (``*gamma``, ``*moving_var``: MXNet's names)."""
    rng = np.random.default_rng(seed)
    by_name = {p.name: p for p in func.params}
    out = {}
    for name in names:
        shape, dtype = shape_of(by_name[name]), str(by_name[name].ty.dtype)
        if len(shape) < 2:
            out[name] = (np.ones if name.endswith(("gamma", "moving_var")) else np.zeros)(shape, dtype)
            continue
        fan_in, fan_out = int(np.prod(shape[1:])), shape[0]
        bound = math.sqrt(6.0 / (fan_in + fan_out))
        out[name] = rng.uniform(-bound, bound, shape).astype(dtype)
    return out


class Trainer:
    """Holds parameters and optimizer state as TVM tensors; ``step`` runs one compiled call.

    ``model`` computes a scalar loss (Symbol or Relax IRModule); ``data_names`` are its inputs
    fed at every step, in the order ``step`` takes them; every other input is a trained
    parameter (so it must be float). ``predict``
    (optional, same kinds) computes the outputs from the same parameters and data inputs.
    ``compile_options`` go to ``tvm_ext.compile``.
    """

    def __init__(self, model: Any, data_names: Sequence[str], optimizer: Optimizer | None = None,
                 shapes: dict[str, Sequence[int]] | None = None, params: dict[str, np.ndarray] | None = None,
                 predict: Any = None, predict_shapes: dict[str, Sequence[int]] | None = None,
                 seed: int = 0, **compile_options: Any):
        self._compile_options = compile_options
        self.compiled: list = []  # the CompiledModels built (train step first), for their reports
        self._device = tvm.cpu(0)
        self.optimizer = optimizer or SGD()
        loss_mod = as_module(model, shapes)
        func = loss_mod["main"]
        names = [p.name for p in func.params]
        missing = [d for d in data_names if d not in names]
        if missing:
            raise InputError(f"data inputs {missing} are not inputs of the model (its inputs: {names})")
        self.data_names = list(data_names)
        self.param_names = [n for n in names if n not in self.data_names]
        not_float = [p for p in func.params if p.name in self.param_names and not is_float(p)]
        if not_float:
            p = not_float[0]
            raise InputError(f"input '{p.name}' ({p.ty.dtype}) is not float, so it cannot be trained; "
                             f"list it in data_names (now {self.data_names}) to feed it at every step")
        step_mod = build_train_step(loss_mod, self.param_names, self.optimizer)
        self.train_module = step_mod
        step_params = step_mod["main"].params
        n_fixed = len(step_params) - len(data_names)  # parameters and optimizer state come first
        self._data_order = [self.data_names.index(p.name) for p in step_params[n_fixed:]]
        self._step = self._compile(step_mod)
        self._loss_mod, self._loss = loss_mod, None  # compiled on the first evaluate()
        self._loss_inputs = names
        values = init_params(func, self.param_names, seed)
        values.update(params or {})
        self.params = {n: tvm.runtime.tensor(np.asarray(values[n], order="C"), self._device)
                       for n in self.param_names}
        state_vars = step_params[len(self.param_names):n_fixed]
        self.state = [tvm.runtime.tensor(np.zeros(shape_of(v), str(v.ty.dtype)), self._device) for v in state_vars]
        self._predict = None
        if predict is not None:
            pred_mod = as_module(predict, predict_shapes or shapes)
            self._predict_inputs = [p.name for p in pred_mod["main"].params]
            self._predict = self._compile(pred_mod)

    def step(self, *data: Any) -> float:
        """One training step on a batch (the ``data_names`` inputs, in order); returns the loss."""
        if len(data) != len(self.data_names):
            raise InputError(f"step takes {self.data_names}, got {len(data)} arrays")
        tensors = self._tensors(data)
        out = self._step["main"](*self.params.values(), *self.state, *[tensors[i] for i in self._data_order])
        n = len(self.params)
        self.params = dict(zip(self.params, (out[1 + i] for i in range(n))))
        self.state = [out[1 + n + i] for i in range(len(self.state))]
        return float(out[0].numpy())

    def evaluate(self, *data: Any) -> float:
        """The loss on a batch, parameters unchanged."""
        if self._loss is None:
            self._loss = self._compile(self._loss_mod)
        feeds = dict(zip(self.data_names, self._tensors(data)), **self.params)
        return float(self._loss["main"](*[feeds[n] for n in self._loss_inputs]).numpy())

    def predict(self, *data: Any) -> np.ndarray:
        """The ``predict`` model's output on inputs (its non-parameter inputs, in order)."""
        if self._predict is None:
            raise InputError("this Trainer was built without a predict model; pass predict=...")
        names = [n for n in self._predict_inputs if n not in self.params]
        if len(data) != len(names):
            raise InputError(f"predict takes {names}, got {len(data)} arrays")
        feeds = dict(zip(names, self._tensors(data)), **self.params)
        return self._predict["main"](*[feeds[n] for n in self._predict_inputs]).numpy()

    def _compile(self, mod: tvm.IRModule) -> relax.VirtualMachine:
        compiled = compile_model(mod, **self._compile_options)
        self.compiled.append(compiled)
        return relax.VirtualMachine(compiled.executable, self._device)

    def parameters(self) -> dict[str, np.ndarray]:
        """The current parameters, as numpy arrays."""
        return {n: t.numpy() for n, t in self.params.items()}

    def _tensors(self, data: Sequence[Any]) -> list:
        return [d if isinstance(d, tvm.runtime.Tensor) else
                tvm.runtime.tensor(np.asarray(d, order="C"), self._device) for d in data]
