"""SigmoidGate: x * sigmoid(x), in either order, as nn.silu(x); nothing else."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_ext
from relay_passes.sigmoid_gate import SigmoidGate


def _ops(mod) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call)]


def _graph(gate_first: bool = False, other: bool = False):
    """main(x, y) = x * sigmoid(x) (or sigmoid(x) * x, or x * sigmoid(y)), plus y."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    y = relax.Var("y", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            gate = bb.emit(relax.op.sigmoid(y if other else x))
            prod = bb.emit(relax.op.multiply(gate, x) if gate_first else relax.op.multiply(x, gate))
            out = bb.emit_output(relax.op.add(prod, y))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("gate_first", [False, True])
def test_x_times_its_sigmoid_becomes_silu(gate_first):
    assert _ops(SigmoidGate()(_graph(gate_first))) == ["relax.nn.silu", "relax.add"]


def test_a_product_with_another_tensors_sigmoid_is_left_alone():
    mod = _graph(other=True)
    assert _ops(SigmoidGate()(mod)) == _ops(mod) == ["relax.sigmoid", "relax.multiply", "relax.add"]


def test_the_chain_agrees_with_pytorch_and_exact_math_keeps_the_product():
    class Chain(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * torch.sigmoid(x) * 2 + 1) - 0.5

    x = torch.randn(64, 256) * 10
    x[0, :6] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, -100.0])
    want = Chain()(x).numpy()
    for exact in (False, True):
        compiled = tvm_ext.compile(Chain(), (x,), exact_math=exact)
        (ops,) = [str(f.attrs["tvm_ext.ops"]) for _, f in compiled.lowered_module.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc)]
        assert ops.split(",")[:2] == (["sigmoid", "multiply"] if exact else ["nn.silu", "multiply"]), ops
        np.testing.assert_allclose(compiled(x.numpy()), want, rtol=2e-6, atol=1e-6, equal_nan=True)
