"""ErfGelu: x * 0.5 * (1 + erf(x / sqrt(2))), its factors in any order, as nn.gelu(x); nothing else."""
from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
import tvm
from tvm import relax

import tvm_ext
from relay_passes.erf_gelu import ErfGelu

R = relax.op


def _ops(mod) -> list[str]:
    return [b.value.op.name for blk in mod["main"].body.blocks for b in blk.bindings
            if isinstance(b.value, relax.Call)]


def _c(v: float) -> relax.Constant:
    return relax.const(v, "float32")


# (x, y) -> the written-out form; each either GELU of x or not
FORMS = {
    "(x * 0.5) * (1 + erf(x / sqrt2))": (lambda x, y: R.multiply(R.multiply(x, _c(0.5)), R.add(_c(1.0), R.erf(
        R.divide(x, _c(math.sqrt(2.0)))))), True),
    "(x * (erf(x * isqrt2) + 1)) * 0.5 (ONNX)": (lambda x, y: R.multiply(R.multiply(x, R.add(R.erf(
        R.multiply(x, _c(1 / math.sqrt(2.0)))), _c(1.0))), _c(0.5)), True),
    "x * ((1 + erf(isqrt2 * x)) * 0.5)": (lambda x, y: R.multiply(x, R.multiply(R.add(_c(1.0), R.erf(
        R.multiply(_c(1 / math.sqrt(2.0)), x))), _c(0.5))), True),
    "another tensor in the erf": (lambda x, y: R.multiply(R.multiply(x, _c(0.5)), R.add(_c(1.0), R.erf(
        R.divide(y, _c(math.sqrt(2.0)))))), False),
    "divided by 1.5": (lambda x, y: R.multiply(R.multiply(x, _c(0.5)), R.add(_c(1.0), R.erf(
        R.divide(x, _c(1.5))))), False),
    "times 0.6": (lambda x, y: R.multiply(R.multiply(x, _c(0.6)), R.add(_c(1.0), R.erf(
        R.divide(x, _c(math.sqrt(2.0)))))), False),
    "2 + erf": (lambda x, y: R.multiply(R.multiply(x, _c(0.5)), R.add(_c(2.0), R.erf(
        R.divide(x, _c(math.sqrt(2.0)))))), False),
}


def _graph(make):
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((4, 8), "float32"))
    y = relax.Var("y", relax.TensorType((4, 8), "float32"))
    with bb.function("main", [x, y]):
        with bb.dataflow():
            out = bb.emit_output(R.add(make(x, y), y))
        bb.emit_func_output(out)
    return bb.get()


@pytest.mark.parametrize("name", list(FORMS))
def test_only_gelu_written_out_becomes_nn_gelu(name):
    make, is_gelu = FORMS[name]
    mod = _graph(make)
    out = relax.transform.DeadCodeElimination()(ErfGelu()(mod))
    assert _ops(out) == (["relax.nn.gelu", "relax.add"] if is_gelu else _ops(mod))
    x, y = np.random.default_rng(0).standard_normal((2, 4, 8)).astype("float32") * 3
    np.testing.assert_allclose(tvm_ext.compile(out)(x, y), tvm_ext.compile(mod, exact_math=True)(x, y),
                               rtol=1e-5, atol=1e-6)


def test_an_onnx_gelu_and_one_written_in_pytorch_compile_to_gelus_kernel():
    import onnx

    class ByHand(torch.nn.Module):
        def forward(self, x):
            return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))

    x = torch.randn(16, 64) * 3
    buffer = io.BytesIO()
    torch.onnx.export(torch.nn.GELU(), (x,), buffer, opset_version=17, dynamo=False)
    want = torch.nn.functional.gelu(x).numpy()
    for model, args in ((onnx.load_from_string(buffer.getvalue()), None), (ByHand(), (x,))):
        compiled = tvm_ext.compile(model, args)
        (ops,) = [str(f.attrs["tvm_ext.ops"]) for _, f in compiled.lowered_module.functions_items()
                  if isinstance(f, tvm.tirx.PrimFunc)]
        assert ops == "nn.gelu"
        np.testing.assert_allclose(compiled(x.numpy()), want, rtol=1e-5, atol=1e-6)
    exact = tvm_ext.compile(ByHand(), (x,), exact_math=True)  # exact math: the model's own ops
    (ops,) = [str(f.attrs["tvm_ext.ops"]) for _, f in exact.lowered_module.functions_items()
              if isinstance(f, tvm.tirx.PrimFunc)]
    assert "erf" in ops.split(",")
