"""Compile time as a model gets deeper: ours against torch.compile's first call.

    python bench/compile_depth.py                      # encoder of 1, 2, 4 layers; 12-layer stack
    python bench/compile_depth.py --samples 5 --models encoder:4

Models: ``encoder:N``, ``nn.TransformerEncoder`` of N layers (d_model 256, 4 heads, FFN 1024,
input 4x128x256, the benchmark's transformer layer stacked); ``stack:N``, N x (Linear 256, GELU,
LayerNorm) on 64 rows. Ours is torch.export, import, passes, build and the first call
(``tvm_ext.compile(from_torch(m, (x,)))(x)``); torch.compile's is its first call from empty caches
(``run.torch_compile_first_call``, as ``bench/run.py`` times it). Each is the median of
``--samples`` compiles from scratch, with the kernels our compile built and the distinct ones
among them (repeated layers share theirs).
"""
from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
import warnings

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import torch  # noqa: E402
from torch import nn  # noqa: E402

import tvm_ext  # noqa: E402
from run import collected, torch_compile_first_call  # noqa: E402
from tvm_ext.frontends import from_torch  # noqa: E402


def make(spec: str) -> tuple[nn.Module, torch.Tensor]:
    kind, _, depth = spec.partition(":")
    torch.manual_seed(0)
    if kind == "encoder":
        layer = nn.TransformerEncoderLayer(256, 4, 1024, dropout=0.0, batch_first=True)
        return nn.TransformerEncoder(layer, int(depth), enable_nested_tensor=False).eval(), torch.randn(4, 128, 256)
    if kind == "stack":
        layers = [m for _ in range(int(depth)) for m in (nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256))]
        return nn.Sequential(*layers).eval(), torch.randn(64, 256)
    raise SystemExit(f"unknown model {spec!r}: encoder:N or stack:N")


def ours(module: nn.Module, x: torch.Tensor) -> tuple[float, tvm_ext.CompiledModel]:
    collected()
    t0 = time.perf_counter()
    compiled = tvm_ext.compile(from_torch(module, (x,)))
    compiled(x.numpy())
    return time.perf_counter() - t0, compiled


def torch_compile(module: nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        return torch_compile_first_call(module, x)[0]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="encoder:1,encoder:2,encoder:4,stack:12")
    parser.add_argument("--samples", type=int, default=3)
    parser.add_argument("--no-torch-compile", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ["TVM_NUM_THREADS"]))
    warnings.simplefilter("ignore")
    ours(*make("stack:1"))  # the first compile of a process also imports and warms up
    print(f"{'model':12s} {'kernels':>8s} {'distinct':>8s} {'ours s':>8s} {'torch.compile s':>16s} {'ratio':>6s}")
    for spec in args.models.split(","):
        module, x = make(spec)
        runs = [ours(module, x) for _ in range(args.samples)]
        mine = statistics.median(t for t, _ in runs)
        report = runs[-1][1].report()
        theirs = None if args.no_torch_compile else statistics.median(
            torch_compile(module, x) for _ in range(args.samples))
        ratio = f"{mine / theirs:6.2f}" if theirs else "     -"
        print(f"{spec:12s} {report.num_kernels:8d} {report.distinct_kernels:8d} {mine:8.3f} "
              f"{theirs if theirs is not None else float('nan'):16.3f} {ratio}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
