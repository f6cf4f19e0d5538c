"""Devices: NNVM's device planning on the seed's example, run on two CPU devices.

    python tutorials/07_devices.py           # the example, its gradient, a placed MLP
    python tutorials/07_devices.py --quick   # the same (it is small; what CI runs)

``sym.AttrScope(ctx_group=...)`` labels nodes with a group; ``compile(..., group2ctx=...)``
maps each group to a device. PlaceDevice (``relay_passes.place_device``) then places every
node: a labelled node on its group's device, an unlabelled one on its input's device
(forward pass), a node made by ``Gradient`` where the forward node it differentiates runs
(reverse pass), and inserts one copy (``R.to_vdevice``) per value and destination device.
Fusion never crosses a device boundary, each kernel is built for its device's target, and
the Relax VM runs the copies. This TVM wheel has only the llvm backend, so the two devices
are ``cpu:0`` (this CPU's target) and ``cpu:1`` (here built for a generic x86-64, SSE2 only).
"""
import argparse
import os

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402

import tvm_ext  # noqa: E402
from relay_passes.gradient import Gradient  # noqa: E402
from tvm_ext import sym  # noqa: E402

GROUP2CTX = {"dev1": "cpu:0", "dev2": {"device": "cpu:1", "target": "x86-64"}}


def seed_example():
    """``a * b`` on dev1, ``+ c`` on dev2 (the seed's figure), summed to a scalar loss."""
    a, b, c = sym.Variable("a"), sym.Variable("b"), sym.Variable("c")
    with sym.AttrScope(ctx_group="dev1"):
        net = sym.multiply(a, b, name="mul")
    with sym.AttrScope(ctx_group="dev2"):
        net = sym.add(net, c, name="plus")
    return sym.sum(net, name="loss")


def main(quick: bool) -> None:
    shapes = {"a": (10, 10), "b": (10, 10), "c": (10, 10)}
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal((10, 10)).astype("float32") for _ in range(3))

    print("== the forward graph, placed ==")
    forward = tvm_ext.compile(seed_example(), shape_dict=shapes, group2ctx=GROUP2CTX)
    print(forward.report())
    np.testing.assert_allclose(np.asarray(forward(x, y, z)), (x * y + z).sum(), rtol=1e-5)
    print("forward result matches numpy")

    print("\n== its gradient: backward nodes placed by the reverse pass ==")
    adjoint = Gradient(adjoint_name="main")(seed_example().to_relax(shapes=shapes))
    trained = tvm_ext.compile(adjoint, group2ctx=GROUP2CTX)
    report = trained.report()
    print("placement decisions:")
    for d in report.decisions:
        if d.action == "place":
            print(f"  {d.node:>18s} -> {d.reason}")
    print("copies:")
    for c in report.copies:
        print(f"  {c['value']}: {c['source']} -> {c['destination']} ({c['nbytes']} B)")
    print("kernels:", ", ".join(f"{k.name} on {k.device}" for k in report.kernels))
    loss, (ga, gb, gc) = trained(x, y, z)
    np.testing.assert_allclose(np.asarray(ga), y, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gb), x, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(gc), np.ones_like(z))
    print("gradients match numpy (d/da = b, d/db = a, d/dc = 1)")

    print("\n== an MLP whose second layer runs on cpu:1 ==")
    data = sym.Variable("data")
    hidden = sym.relu(sym.FullyConnected(data, num_hidden=32, name="fc1"))
    with sym.AttrScope(ctx_group="dev2"):
        logits = sym.FullyConnected(hidden, num_hidden=10, name="fc2")
    net = sym.softmax(logits, name="prob")
    mlp = tvm_ext.compile(net, shape_dict={"data": (8, 64)}, group2ctx={"dev2": "cpu:1"})
    print(mlp.report())
    arg_shapes, _, _ = net.infer_shape(data=(8, 64))
    values = [rng.standard_normal(s).astype("float32") * 0.1 for s in arg_shapes]
    got = np.asarray(mlp(*values))
    inputs = dict(zip(net.list_inputs(), values))
    h = np.maximum(inputs["data"] @ inputs["fc1_weight"].T + inputs["fc1_bias"], 0)
    logit = h @ inputs["fc2_weight"].T + inputs["fc2_bias"]
    ref = np.exp(logit - logit.max(-1, keepdims=True))
    np.testing.assert_allclose(got, ref / ref.sum(-1, keepdims=True), rtol=1e-4, atol=1e-6)
    print("placed MLP matches numpy")
    print("OK")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="what CI runs (the same, small)")
    main(parser.parse_args().quick)
