"""Small built-in models with numpy references, for the demo, tests and the benchmark.

Built with Relax's BlockBuilder directly, so they need neither PyTorch nor a download.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax

R = relax.op


@dataclass
class BuiltinModel:
    name: str
    mod: tvm.IRModule
    inputs: list[np.ndarray]  # example inputs, in the order of main's parameters
    reference: Callable[..., np.ndarray]  # numpy forward pass


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf
    return 0.5 * x * (1.0 + np.vectorize(erf)(x / math.sqrt(2.0)).astype(x.dtype))


def _layer_norm(x, g, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def transformer_block(batch: int = 4, seq: int = 64, dim: int = 128, heads: int = 4, ffn: int = 512,
                      seed: int = 0) -> BuiltinModel:
    """A pre-norm transformer encoder block: attention and a GELU MLP, residuals around both."""
    rng = np.random.default_rng(seed)
    hd = dim // heads

    def w(*shape, scale=None):
        return (rng.standard_normal(shape) * (scale or 1.0 / math.sqrt(shape[0]))).astype("float32")

    p = {"g1": 1 + 0.1 * w(dim, scale=1), "b1": 0.1 * w(dim, scale=1), "wqkv": w(dim, 3 * dim),
         "bqkv": 0.1 * w(3 * dim, scale=1), "wo": w(dim, dim), "bo": 0.1 * w(dim, scale=1),
         "g2": 1 + 0.1 * w(dim, scale=1), "b2": 0.1 * w(dim, scale=1), "w1": w(dim, ffn),
         "c1": 0.1 * w(ffn, scale=1), "w2": w(ffn, dim), "c2": 0.1 * w(dim, scale=1)}
    c = {k: relax.const(v) for k, v in p.items()}

    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((batch, seq, dim), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            h = bb.emit(R.nn.layer_norm(x, c["g1"], c["b1"], axes=[-1]))
            qkv = bb.emit(R.add(R.matmul(h, c["wqkv"]), c["bqkv"]))
            qkv = bb.emit(R.permute_dims(R.reshape(qkv, (batch, seq, 3, heads, hd)), [2, 0, 3, 1, 4]))
            q, k, v = (bb.emit(R.squeeze(R.strided_slice(qkv, [0], [i], [i + 1]), [0])) for i in range(3))
            s = bb.emit(R.multiply(R.matmul(q, R.permute_dims(k, [0, 1, 3, 2])),
                                   relax.const(1.0 / math.sqrt(hd), "float32")))
            a = bb.emit(R.matmul(R.nn.softmax(s, axis=-1), v))
            a = bb.emit(R.reshape(R.permute_dims(a, [0, 2, 1, 3]), (batch, seq, dim)))
            x1 = bb.emit(R.add(x, R.add(R.matmul(a, c["wo"]), c["bo"])))
            h2 = bb.emit(R.nn.layer_norm(x1, c["g2"], c["b2"], axes=[-1]))
            f = bb.emit(R.nn.gelu(R.add(R.matmul(h2, c["w1"]), c["c1"])))
            out = bb.emit_output(R.add(x1, R.add(R.matmul(f, c["w2"]), c["c2"])))
        bb.emit_func_output(out)

    def reference(xv: np.ndarray) -> np.ndarray:
        hv = _layer_norm(xv, p["g1"], p["b1"])
        qkv_v = (hv @ p["wqkv"] + p["bqkv"]).reshape(batch, seq, 3, heads, hd).transpose(2, 0, 3, 1, 4)
        qv, kv, vv = qkv_v
        av = _softmax(qv @ kv.transpose(0, 1, 3, 2) / math.sqrt(hd)) @ vv
        x1v = xv + av.transpose(0, 2, 1, 3).reshape(batch, seq, dim) @ p["wo"] + p["bo"]
        fv = _gelu(_layer_norm(x1v, p["g2"], p["b2"]) @ p["w1"] + p["c1"])
        return x1v + fv @ p["w2"] + p["c2"]

    xin = rng.standard_normal((batch, seq, dim)).astype("float32")
    return BuiltinModel("transformer_block", bb.get(), [xin], reference)


def elementwise_chain(n: int = 1 << 22, seed: int = 0) -> BuiltinModel:
    """y = relu(x * sigmoid(x) * 2 + b) - 0.5: a memory-bound chain of five ops."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((n // 1024, 1024), "float32"))
    b = relax.Var("b", relax.TensorType((1024,), "float32"))
    with bb.function("main", [x, b]):
        with bb.dataflow():
            y = bb.emit(R.multiply(R.multiply(x, R.sigmoid(x)), relax.const(2.0, "float32")))
            out = bb.emit_output(R.subtract(R.nn.relu(R.add(y, b)), relax.const(0.5, "float32")))
        bb.emit_func_output(out)

    def reference(xv, bv):
        return np.maximum(xv / (1 + np.exp(-xv)) * 2 + bv, 0) - 0.5

    ins = [rng.standard_normal((n // 1024, 1024)).astype("float32"), rng.standard_normal(1024).astype("float32")]
    return BuiltinModel("elementwise_chain", bb.get(), ins, reference)


def row_softmax(rows: int = 1024, cols: int = 1024, seed: int = 0) -> BuiltinModel:
    """Softmax over the last axis of a (rows, cols) matrix."""
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(R.nn.softmax(x, axis=-1))
        bb.emit_func_output(out)
    return BuiltinModel("softmax", bb.get(), [rng.standard_normal((rows, cols)).astype("float32")], _softmax)


def layer_norm(rows: int = 4096, cols: int = 768, seed: int = 0) -> BuiltinModel:
    """LayerNorm over the last axis with learned scale and shift."""
    rng = np.random.default_rng(seed)
    g = (1 + 0.1 * rng.standard_normal(cols)).astype("float32")
    b = (0.1 * rng.standard_normal(cols)).astype("float32")
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(R.nn.layer_norm(x, relax.const(g), relax.const(b), axes=[-1]))
        bb.emit_func_output(out)
    return BuiltinModel("layer_norm", bb.get(), [rng.standard_normal((rows, cols)).astype("float32")],
                        lambda xv: _layer_norm(xv, g, b))


BUILTIN_MODELS: dict[str, Callable[..., BuiltinModel]] = {
    "transformer_block": transformer_block,
    "elementwise_chain": elementwise_chain,
    "softmax": row_softmax,
    "layer_norm": layer_norm,
}
