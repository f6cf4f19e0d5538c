"""AutoFuse's kernel-local stages against the seed's literal rules 1 and 7 (reductions and
Exp written to memory): softmax and layer norm, kernels only and as called.

    TVM_NUM_THREADS=2 OMP_NUM_THREADS=2 python bench/local_stages.py [--rows 8192 --cols 1024]
"""
from __future__ import annotations

import argparse

import numpy as np
from tvm import relax

import tvm_ext
from relay_passes.autofuse import AutoFuse

R = relax.op


def _softmax(bb: relax.BlockBuilder, x: relax.Var) -> relax.Expr:
    e = bb.emit(R.exp(R.subtract(x, R.max(x, axis=[-1], keepdims=True))))
    return R.divide(e, R.sum(e, axis=[-1], keepdims=True))


def _layer_norm(bb: relax.BlockBuilder, x: relax.Var) -> relax.Expr:
    d = bb.emit(R.subtract(x, R.mean(x, axis=[-1], keepdims=True)))
    v = bb.emit(R.mean(R.multiply(d, d), axis=[-1], keepdims=True))
    return R.divide(d, R.sqrt(R.add(v, relax.const(1e-5, "float32"))))


def _module(body, shape) -> "tvm.IRModule":  # noqa: F821
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            out = bb.emit_output(body(bb, x))
        bb.emit_func_output(out)
    return bb.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=8192)
    ap.add_argument("--cols", type=int, default=1024)
    args = ap.parse_args()
    shape = (args.rows, args.cols)
    x = np.random.default_rng(0).standard_normal(shape).astype("float32")
    print(f"{'workload':12s} {'rules':22s} {'kernels':>7s} {'kernel ms':>9s} {'call ms':>8s}")
    for name, body in (("softmax", _softmax), ("layer_norm", _layer_norm)):
        mod = _module(body, shape)
        for local in (True, False):
            c = tvm_ext.compile(mod, fusion=AutoFuse(local_stages=local))
            kernel = c.benchmark(x, number=5, repeat=9).median_ms
            call = c.time_call(x, number=5, repeat=9).median_ms
            rules = "local stages" if local else "seed (to memory)"
            print(f"{name:12s} {rules:22s} {c.report().num_kernels:7d} {kernel:9.2f} {call:8.2f}")


if __name__ == "__main__":
    main()
