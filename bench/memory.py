"""PlanMemory's figures on every built-in model, every benchmark workload and a compiled MLP
training step: planned bytes against naive allocation, TVM's StaticPlanBlockMemory and the
liveness lower bound of the execution order.

    python bench/memory.py                 # default fusion (autofuse)
    python bench/memory.py --fusion nnvm --quick
"""
from __future__ import annotations

import argparse
import os
import pathlib
import sys

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import numpy as np  # noqa: E402

import tvm_ext  # noqa: E402
import tvm_ext.symbol as sym  # noqa: E402
from tvm_ext.models import BUILTIN_MODELS  # noqa: E402
from tvm_ext.training import SGD, Trainer  # noqa: E402


def mlp_training_step(batch: int, dim: int, hidden: int, classes: int, fusion: str):
    """The train step (forward, backward, SGD update) of a 2-layer MLP with softmax cross-entropy."""
    data, label = sym.Variable("data"), sym.Variable("label")
    fc1 = sym.FullyConnected(data, num_hidden=hidden, name="fc1")
    fc2 = sym.FullyConnected(sym.relu(fc1), num_hidden=classes, name="fc2")
    loss = -sym.mean(sym.sum(sym.log_softmax(fc2, axis=-1) * label, axis=[1]))
    trainer = Trainer(loss, ["data", "label"], SGD(0.1, momentum=0.9),
                      shapes={"data": (batch, dim), "label": (batch, classes)}, fusion=fusion)
    return trainer.compiled[0]


def rows(quick: bool, fusion: str):
    from models import workloads

    from tvm_ext.frontends import from_torch

    for name, make in BUILTIN_MODELS.items():
        yield f"tvm_ext.models.{name}", tvm_ext.compile(make().mod, fusion=fusion)
    for name, work in workloads(quick).items():
        module, x = work.make()
        yield f"bench {name}", tvm_ext.compile(from_torch(module.eval(), (x,)), fusion=fusion)
    for strategy in dict.fromkeys([fusion, "nnvm", "none"]):
        yield f"MLP training step ({strategy})", mlp_training_step(64 if quick else 256, 784, 128 if quick else 512,
                                                                    10, strategy)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fusion", default="autofuse")
    parser.add_argument("--quick", action="store_true", help="the benchmark's small sizes")
    args = parser.parse_args(argv)
    kib = lambda n: "-" if n is None else f"{n / 1024:,.0f}"  # noqa: E731
    print(f"{'model':40s} {'planned':>10s} {'naive':>10s} {'tvm_static':>10s} {'lower_bd':>10s} {'inplace':>7s} "
          f"{'/tvm':>5s} {'/bound':>6s} {'/naive':>6s} {'prog_bd':>9s}  allocator   (KiB)")
    ok = True
    for name, compiled in rows(args.quick, args.fusion):
        m = compiled.report().memory
        if m is None:
            print(f"{name:40s} not planned")
            continue
        r_tvm = m.planned / m.tvm_static if m.tvm_static else None
        r_lb = m.planned / m.lower_bound if m.lower_bound else None
        r_naive = m.planned / m.naive if m.naive else None
        fmt = lambda r: "-" if r is None else f"{r:.2f}"  # noqa: E731
        holds = m.planned <= (m.tvm_static or 0) and m.planned <= 1.1 * m.lower_bound
        ok &= holds
        print(f"{name:40s} {kib(m.planned):>10s} {kib(m.naive):>10s} {kib(m.tvm_static):>10s} "
              f"{kib(m.lower_bound):>10s} "
              f"{m.inplace:>7d} {fmt(r_tvm):>5s} {fmt(r_lb):>6s} {fmt(r_naive):>6s} {kib(m.program_order_bound):>9s}"
              f"  {m.allocator}"
              f"{'' if holds else '  OVER A BOUND'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    np.set_printoptions(precision=3)
    sys.exit(main())
