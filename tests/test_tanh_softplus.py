"""TanhSoftplus: tanh(softplus(x)) as n / (n + 2), n = e (e + 2), e = exp(min(x, 20))."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from tvm import relax

import tvm_ext
from relay_passes.tanh_softplus import TanhSoftplus


def _ops(mod) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call)]


def _graph(threshold: float | None = 20.0, one: float = 1.0, dtype: str = "float32", other_x: bool = False):
    """main(x, y) = x * tanh(where(x > t, x, log(one + exp(x)))), or without the where when t is None;
    ``other_x`` compares y with the threshold instead of x."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), dtype))
    y = relax.Var("y", relax.TensorType((4, 8), dtype))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            soft = bb.emit(relax.op.log(bb.emit(relax.op.add(bb.emit(relax.op.exp(x)), relax.const(one, dtype)))))
            if threshold is not None:
                cond = bb.emit(relax.op.greater(y if other_x else x, relax.const(threshold, dtype)))
                soft = bb.emit(relax.op.where(cond, x, soft))
            out = bb.emit_output(relax.op.multiply(x, bb.emit(relax.op.tanh(soft))))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("threshold", [20.0, None, 9.5])
def test_softplus_under_tanh_becomes_one_exp_and_one_division(threshold):
    ops = _ops(TanhSoftplus()(_graph(threshold)))
    # exp(min(x, 20)); n = e * (e + 2); n / (n + 2); times x
    assert ops == ["relax.minimum", "relax.exp", "relax.add", "relax.multiply", "relax.add", "relax.divide",
                   "relax.multiply"]


@pytest.mark.parametrize("kwargs", [dict(threshold=5.0), dict(one=2.0), dict(dtype="float64"), dict(other_x=True)])
def test_what_is_not_tanh_of_softplus_in_float32_is_left_alone(kwargs):
    # a threshold below 9.1 (tanh(x) is not 1 there), log(2 + exp x), float64 (the rounding
    # argument is float32's), a where that tests another tensor
    mod = _graph(**kwargs)
    assert _ops(TanhSoftplus()(mod)) == _ops(mod)
    assert "relax.tanh" in _ops(mod)


def test_mish_agrees_with_pytorch_on_values_and_edges():
    class Mish(torch.nn.Module):
        def forward(self, x):
            return x * torch.tanh(torch.nn.functional.softplus(x))

    x = torch.randn(6, 500) * 8
    x[0, :12] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 9.05, 9.2, 20.0, 20.5, 45.0,
                              -20.0, -80.0])
    with torch.no_grad():
        ref = Mish()(x).numpy()
    compiled = tvm_ext.compile(Mish(), (x,))
    (kernel,) = compiled.report().kernels  # one kernel of ours (the exp inlined, not TVM's per-op kernels)
    assert kernel.source == "ours" and "local" not in kernel.loop_ir
    assert [op for op in kernel.ops if "tanh" in op or "log" in op] == []
    got = compiled(x.numpy())
    np.testing.assert_array_equal(np.isnan(got), np.isnan(ref))
    finite = np.isfinite(ref)
    np.testing.assert_array_equal(got[~finite & ~np.isnan(ref)], ref[~finite & ~np.isnan(ref)])
    np.testing.assert_allclose(got[finite], ref[finite], rtol=2e-6, atol=1e-30)
