"""Benchmark: tvm_ext against TVM's default build and PyTorch eager, in one run.

    python bench/run.py                 # all models, full size
    python bench/run.py --quick         # small sizes (a smoke run)
    python bench/run.py --models softmax,mlp --json out.json

Each model is a PyTorch module. tvm_ext compiles it (torch.export -> Relax -> fused
kernels); "TVM default" is ``tvm.compile`` of the same imported Relax module (TVM's CPU
pipeline: no fusion, unscheduled kernels); PyTorch eager runs the module itself. The kernel
column compares our kernel count with what TVM's own FuseOps + FuseTIR make of the same
module. All three use the same threads (TVM_NUM_THREADS / torch.set_num_threads). Every time is the median of
``--repeat`` measurements; ratios above 1 mean tvm_ext is faster. The machine is shared and
noisy: compare ratios measured in the same run, not absolute times across runs.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

THREADS = os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("OMP_NUM_THREADS", THREADS)

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from torch import nn  # noqa: E402

import tvm_ext  # noqa: E402
from tvm_ext.baselines import tvm_default_build, tvm_fused_kernel_count  # noqa: E402
from tvm_ext.frontends import from_torch  # noqa: E402


class ElementwiseChain(nn.Module):
    """relu(x * sigmoid(x) * 2 + b) - 0.5: five memory-bound ops."""

    def __init__(self, cols):
        super().__init__()
        self.b = nn.Parameter(torch.randn(cols))

    def forward(self, x):
        return torch.relu(x * torch.sigmoid(x) * 2 + self.b) - 0.5


class Softmax(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)


class MLP(nn.Module):
    def __init__(self, dim, hidden, out):
        super().__init__()
        self.l1, self.l2, self.l3 = nn.Linear(dim, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, out)

    def forward(self, x):
        return self.l3(torch.relu(self.l2(torch.relu(self.l1(x)))))


class ConvBNReLU(nn.Module):
    def __init__(self, cin, cout):
        super().__init__()
        self.conv, self.bn = nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class BasicBlock(nn.Module):
    """ResNet's basic block: conv-bn-relu, conv-bn, + identity, relu."""

    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        return torch.relu(self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))) + x)


def models(quick: bool):
    """name -> (module, example input)."""
    s = 4 if quick else 1
    return {
        "elementwise_chain": lambda: (ElementwiseChain(1024), torch.randn(4096 // s, 1024)),
        "softmax": lambda: (Softmax(), torch.randn(2048 // s, 1024)),
        "layer_norm": lambda: (nn.LayerNorm(768), torch.randn(4096 // s, 768)),
        "mlp": lambda: (MLP(512, 1024, 256), torch.randn(256 // s, 512)),
        "conv_bn_relu": lambda: (ConvBNReLU(32, 32), torch.randn(1, 32, 56 // s, 56 // s)),
        "resnet_basic_block": lambda: (BasicBlock(32), torch.randn(1, 32, 56 // s, 56 // s)),
        "transformer_encoder_layer": lambda: (
            nn.TransformerEncoderLayer(256 // s, 4, 1024 // s, dropout=0.0, batch_first=True),
            torch.randn(4, 128 // s, 256 // s)),
    }


def _number(single_s: float) -> int:
    """Calls per measurement so that one measurement takes about 20 ms."""
    return max(1, int(0.02 / max(single_s, 1e-6)))


def _median_ms(fn, repeat: int) -> float:
    fn()
    t0 = time.perf_counter()
    fn()
    number = _number(time.perf_counter() - t0)
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        times.append((time.perf_counter() - t0) / number * 1e3)
    return statistics.median(times)


def bench_one(name, module, x, repeat: int, fusion: str) -> dict:
    module.eval()
    target = tvm_ext.host_target()
    imported = from_torch(module, (x,))
    compiled = tvm_ext.compile(imported, target=target, fusion=fusion)
    xn = x.numpy()
    with torch.no_grad():
        ref = module(x).numpy()
    ok = bool(np.allclose(compiled(xn), ref, rtol=1e-3, atol=1e-3))

    # tvm_ext and TVM are timed the same way: TVM's time_evaluator on the Relax VM.
    single = compiled.benchmark(xn, number=1, repeat=1).median_ms / 1e3
    ours = compiled.benchmark(xn, number=_number(single), repeat=repeat).median_ms
    vm = tvm_default_build(imported, target)
    xt = tvm.runtime.tensor(xn)
    single = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=1)(xt).median
    tvm_ms = statistics.median(vm.time_evaluator("main", tvm.cpu(), number=_number(single),
                                                 repeat=repeat)(xt).results) * 1e3
    with torch.no_grad():
        torch_ms = _median_ms(lambda: module(x), repeat)
    report = compiled.report()
    return {"model": name, "ok": ok, "ours_ms": ours, "tvm_ms": tvm_ms, "torch_ms": torch_ms,
            "kernels": report.num_kernels, "tvm_fused_kernels": tvm_fused_kernel_count(imported),
            "vs_tvm": tvm_ms / ours, "vs_torch": torch_ms / ours}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 repeats")
    parser.add_argument("--models", default="", help="comma-separated subset")
    parser.add_argument("--repeat", type=int, default=0, help="measurements per median (default 9, quick 3)")
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--fusion", default="nnvm", help="tvm_ext's fusion strategy (nnvm, chains, none)")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(THREADS))
    torch.manual_seed(0)
    table = models(args.quick)
    names = [m for m in args.models.split(",") if m] or list(table)
    unknown = [m for m in names if m not in table]
    if unknown:
        print(f"unknown models {unknown}; choose from {list(table)}", file=sys.stderr)
        return 2
    repeat = args.repeat or (3 if args.quick else 9)
    print(f"threads: {THREADS}, repeat: {repeat}, torch {torch.__version__}, tvm {tvm.__version__}")
    print(f"tvm_ext fusion: {args.fusion}; kernels: ours / TVM FuseOps+FuseTIR on the same module")
    header = (f"{'model':28s} {'tvm_ext ms':>10s} {'TVM ms':>10s} {'torch ms':>10s} {'vs TVM':>8s} "
              f"{'vs torch':>8s} {'kernels':>9s} check")
    print(header)
    rows = []
    for name in names:
        module, x = table[name]()
        row = bench_one(name, module, x, repeat, args.fusion)
        rows.append(row)
        kernels = f"{row['kernels']}/{row['tvm_fused_kernels']}"
        print(f"{name:28s} {row['ours_ms']:10.3f} {row['tvm_ms']:10.3f} {row['torch_ms']:10.3f} "
              f"{row['vs_tvm']:7.2f}x {row['vs_torch']:7.2f}x {kernels:>9s} {'ok' if row['ok'] else 'MISMATCH'}",
              flush=True)
    geo = lambda key: float(np.exp(np.mean([np.log(r[key]) for r in rows])))  # noqa: E731
    print(f"{'geomean':28s} {'':10s} {'':10s} {'':10s} {geo('vs_tvm'):7.2f}x {geo('vs_torch'):7.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": int(THREADS), "repeat": repeat, "fusion": args.fusion, "rows": rows}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
