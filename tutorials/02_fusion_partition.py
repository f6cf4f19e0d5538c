"""NNVM operator fusion: see the partition, read why each node fused or not, override it.

    python tutorials/02_fusion_partition.py [--quick]

The graph is the seed's ResNet-style branch-and-rejoin case (nnvm_graph_passes.txt,
"Operator Fusion"): a conv2d read by three elementwise branches that meet again in adds.

            conv2d
          /   |    \\
      relu  sigmoid  negative
          \\   |    /
         add -- add

The forward pass realizes conv2d (three readers) and fuses the branches into the adds; the
diamond step then sees that all of conv2d's readers sit in one elementwise group and moves
conv2d into it. One kernel remains, built around conv2d (its master), whose epilogue runs
on conv2d's output tiles.
"""
import argparse
import os

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402
from tvm import relax  # noqa: E402

import tvm_ext  # noqa: E402
from relay_passes import DataflowGraph, FusePartition  # noqa: E402

R = relax.op


def branch_and_rejoin(channels: int, size: int):
    x = relax.Var("x", relax.TensorType((1, channels, size, size), "float32"))
    w = relax.Var("w", relax.TensorType((channels, channels, 3, 3), "float32"))
    bb = relax.BlockBuilder()
    with bb.function("main", [x, w]):
        with bb.dataflow():
            c = bb.emit(R.nn.conv2d(x, w, padding=1), "conv")
            b1 = bb.emit(R.nn.relu(c), "branch_relu")
            b2 = bb.emit(R.sigmoid(c), "branch_sigmoid")
            b3 = bb.emit(R.negative(c), "branch_neg")
            a = bb.emit(R.add(b1, b2), "join1")
            out = bb.emit_output(R.add(a, b3), "join2")
        bb.emit_func_output(out)
    return bb.get()


def reference(x, w):
    c = np.zeros((x.shape[0], w.shape[0]) + x.shape[2:], "float32")
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    h, wd = x.shape[2:]
    for a in range(3):
        for b in range(3):
            c += np.einsum("nchw,oc->nohw", xp[:, :, a:a + h, b:b + wd], w[:, :, a, b])
    return np.maximum(c, 0) + 1 / (1 + np.exp(-c)) - c


def main(quick: bool) -> None:
    channels, size = (8, 8) if quick else (32, 56)
    mod = branch_and_rejoin(channels, size)

    # 1. The partition as an analysis result: master, root and pattern per node.
    graph = DataflowGraph(mod["main"].body.blocks[0])
    plan = FusePartition().analyze(graph)
    print("partition (group pattern = the most complex op inside the group):")
    print(plan.describe())
    print("\nwhy each node fused or not (reason codes in relay_passes/fuse_partition.py):")
    print(plan.log_text())

    # 2. Compile with it (the default fusion) and check against numpy.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, channels, size, size)).astype("float32")
    w = (rng.standard_normal((channels, channels, 3, 3)) / (3 * channels ** 0.5)).astype("float32")
    compiled = tvm_ext.compile(mod)
    print()
    print(compiled.report())
    np.testing.assert_allclose(compiled(x, w), reference(x, w), rtol=1e-4, atol=1e-4)
    print("matches numpy")

    # 3. Override a decision: keep conv2d's result in memory. The diamond step respects it.
    split = tvm_ext.compile(mod, fusion=FusePartition(realize={"conv"}))
    print(f"\nwith conv realized by request: {split.report().num_kernels} kernels")
    np.testing.assert_allclose(split(x, w), reference(x, w), rtol=1e-4, atol=1e-4)

    fused_ms = compiled.benchmark(x, w, repeat=3 if quick else 9).median_ms
    split_ms = split.benchmark(x, w, repeat=3 if quick else 9).median_ms
    print(f"one kernel: {fused_ms:.3f} ms, conv realized: {split_ms:.3f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes")
    main(parser.parse_args().quick)
