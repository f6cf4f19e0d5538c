"""AutoFuse: watch each KernelBox decision, and compare with NNVM's partition.

    python tutorials/03_autofuse.py [--quick]

Two graphs. First the seed's walk-through (autofuse_lowering_en.md): Conv -> Abs -> Exp ->
Conv, with Conv treated as an op we cannot lower, as in the seed. Abs stays fusable and is
inlined into Exp's box; the second Conv's default lowering realizes Exp: one kernel
computes abs and exp, reading the first Conv's output. Then a softmax written op by op:
AutoFuse keeps the two reductions as kernel-local stages, so it is ONE kernel reading its
input once; NNVM's partition cannot fuse a reduction with what reads it and makes four.
"""
import argparse
import os

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ext  # noqa: E402
from relay_passes import DataflowGraph, FusePartition  # noqa: E402
from relay_passes.autofuse import AutoFuse  # noqa: E402

R = relax.op


def conv_abs_exp_conv(channels: int, size: int):
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.Var("w", relax.TensorType((channels, channels, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c1 = bb.emit(R.nn.conv2d(x, w, padding=1), "conv1")
            a = bb.emit(R.abs(c1), "abs")
            e = bb.emit(R.exp(a), "exp")
            out = bb.emit_output(R.nn.conv2d(e, w, padding=1), "conv2")
        bb.emit_func_output(out)
    return bb.get()


def softmax_by_hand(rows: int, cols: int):
    x = relax.Var("x", relax.TensorType((rows, cols), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x]):
        with bb.dataflow():
            m = bb.emit(R.max(x, axis=[-1], keepdims=True), "row_max")
            e = bb.emit(R.exp(R.subtract(x, m)), "exp")
            s = bb.emit(R.sum(e, axis=[-1], keepdims=True), "row_sum")
            out = bb.emit_output(R.divide(e, s), "softmax")
        bb.emit_func_output(out)
    return bb.get()


def show(title: str, mod, registry=tvm_ext.OPS) -> None:
    print(f"=== {title}")
    graph = DataflowGraph(mod["main"].body.blocks[0], registry)
    autofuse = AutoFuse()
    plan = autofuse.analyze(graph)
    print("KernelBoxes (kind, the rule that realized it, size, the nodes its expression computes):")
    print(plan.describe())
    print("\ndecisions (inline = fused into the reader, recomputed if it has several; stage = "
          "kernel-local; realize = written to memory):")
    print(plan.log_text())
    nnvm = FusePartition().analyze(graph)
    print("\nthe same graph under NNVM's partition:")
    print(nnvm.describe())
    kernels = {s: tvm_ext.compile(mod, fusion=s, registry=registry).report() for s in ("autofuse", "nnvm")}
    for strategy, report in kernels.items():
        print(f"\n{strategy}: {report.num_kernels} kernels")
        for k in report.kernels:
            tag = "ours" if k.source == "ours" else "TVM's"
            print(f"  {k.name:40s} {tag:5s} reads {k.bytes_read} B, writes {k.bytes_written} B: {', '.join(k.ops)}")
    print()


def main(quick: bool) -> None:
    channels, size = (2, 6) if quick else (16, 32)
    # As in the seed, conv2d has no lowering here: it keeps TVM's kernel (Extern).
    no_conv = tvm_ext.OPS.without("relax.nn.conv2d")
    show("Conv -> Abs -> Exp -> Conv (conv2d as an op we cannot lower)", conv_abs_exp_conv(channels, size), no_conv)

    rows, cols = (16, 128) if quick else (2048, 1024)
    mod = softmax_by_hand(rows, cols)
    show("softmax written op by op", mod)
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype("float32")
    e = np.exp(x - x.max(-1, keepdims=True))
    for strategy in ("autofuse", "nnvm"):
        compiled = tvm_ext.compile(mod, fusion=strategy)
        np.testing.assert_allclose(compiled(x), e / e.sum(-1, keepdims=True), rtol=1e-5, atol=1e-7)
        print(f"{strategy:9s} matches numpy, {compiled.benchmark(x, repeat=3 if quick else 9)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    main(parser.parse_args().quick)
