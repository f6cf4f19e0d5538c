"""Benchmark: tvm_ext against TVM's default build, PyTorch eager, torch.compile and ONNX Runtime.

    python bench/run.py                          # every workload, both fusion strategies
    python bench/run.py --quick                  # small sizes, a smoke run
    python bench/run.py --models softmax,mlp --fusion autofuse --json out.json
    python bench/run.py --tune 64 --tuning-db bench_results/tuning.jsonl   # + a tuned column

Each workload is a PyTorch module (bench/models.py). tvm_ext compiles it once per fusion
strategy (torch.export -> Relax -> fused kernels); "TVM" is ``tvm.compile`` of the same
imported Relax module (TVM's CPU pipeline: no fusion, unscheduled kernels); "eager" runs
the module; "compile" runs ``torch.compile`` (Inductor, CPU); "ORT" runs ONNX Runtime on
the module exported to ONNX (the ``bench`` extra; skipped when absent). All use the same
threads (TVM_NUM_THREADS, torch.set_num_threads, ORT's intra-op threads). Every time is the median of ``--repeat``
measurements; a ratio above 1 means tvm_ext (its best strategy) is faster. With ``--tune N``
each workload's kernels are first tuned with N trials (the first ``--fusion`` strategy;
records in ``--tuning-db``, which a rerun continues), then compiled from the records: the
"tuned" column, with its ratio to the untuned build of the same strategy and to
torch.compile.

For memory-bound workloads the roofline is the time to move the bytes that must move (the
model's inputs, outputs and weights, once each): the faster of numpy's memcpy and a
parallel TVM copy of exactly that many bytes, timed in the same run (so at the same cache
level: this machine's L3 holds 300 MB); "x roof" is tvm_ext's time over it. The kernel column compares our kernel
count (per strategy) with what TVM's own FuseOps + FuseTIR make of the same module. The
machine is shared and noisy: compare ratios from one run, not absolute times across runs.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import pathlib
import statistics
import sys
import time
import warnings

THREADS = os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("OMP_NUM_THREADS", THREADS)
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from models import workloads  # noqa: E402

import tvm_ext  # noqa: E402
from relay_passes.autofuse import AutoFuse  # noqa: E402
from tvm_ext.baselines import tvm_default_build, tvm_fused_kernel_count  # noqa: E402
from tvm_ext.frontends import from_torch  # noqa: E402


def _number(single_s: float) -> int:
    """Calls per measurement so that one measurement takes about 20 ms."""
    return max(1, int(0.02 / max(single_s, 1e-6)))


def median_ms(fn, repeat: int) -> float:
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


def vm_median_ms(vm, args, repeat: int) -> float:
    """TVM's time_evaluator on the Relax VM: how both tvm_ext and TVM are timed. A run over a
    second (TVM's unscheduled GEMMs: 50 s at 2048) gets 3 repeats, not ``repeat``."""
    single = vm.time_evaluator("main", tvm.cpu(), number=1, repeat=1)(*args).median
    repeat = min(repeat, 3) if single > 1.0 else repeat
    result = vm.time_evaluator("main", tvm.cpu(), number=_number(single), repeat=repeat)(*args)
    return statistics.median(result.results) * 1e3


def copy_ms(nbytes: int, repeat: int = 9) -> float:
    """Median time of the fastest copy that reads and writes ``nbytes`` in all: numpy's memcpy
    (one thread) or a parallel, vectorized TVM copy on every thread."""
    n = max(16, nbytes // 8 // 16 * 16)
    a = np.ones(n, np.float32)
    b = np.empty_like(a)
    times = []
    for _ in range(repeat + 2):
        t0 = time.perf_counter()
        np.copyto(b, a)
        times.append(time.perf_counter() - t0)
    numpy_ms = statistics.median(times[2:]) * 1e3
    src = tvm.te.placeholder((n,), "float32", name="src")
    dst = tvm.te.compute((n,), lambda i: src[i], name="dst")
    sch = tvm.s_tir.Schedule(tvm.te.create_prim_func([src, dst]))
    (loop,) = sch.get_loops(sch.get_sblock("dst"))
    outer, inner = sch.split(loop, [None, 16])
    sch.vectorize(inner)
    sch.parallel(outer)
    lib = tvm.compile(sch.mod, tvm_ext.host_target())
    ta, tb = tvm.runtime.tensor(a), tvm.runtime.empty((n,), "float32")
    result = lib.mod.time_evaluator("main", tvm.cpu(), number=_number(numpy_ms / 1e3), repeat=repeat)(ta, tb)
    return min(numpy_ms, statistics.median(result.results) * 1e3)


def must_move_bytes(mod: tvm.IRModule) -> int:
    """The model's inputs, outputs and weights (constants), each moved once."""
    def nbytes(ty) -> int:
        if isinstance(ty, tvm.relax.TupleType):
            return sum(nbytes(f) for f in ty.fields)
        return math.prod(int(d) for d in ty.shape.values) * tvm.DataType(str(ty.dtype)).bits // 8

    main = mod["main"]
    total = sum(nbytes(p.ty) for p in main.params) + nbytes(main.ret_ty)
    consts = []
    tvm.relax.analysis.post_order_visit(main, lambda e: consts.append(e) if isinstance(e, tvm.ir.GenericConst) else None)
    return total + sum(c.value.numpy().nbytes for c in {id(c): c for c in consts}.values())


#: strategy variants the benchmark can time (``--fusion`` names)
VARIANTS = {
    "autofuse": lambda: "autofuse",
    "nnvm": lambda: "nnvm",
    "tvm": lambda: "tvm",
    "chains": lambda: "chains",
    "autofuse-loads8": lambda: AutoFuse(max_loads=8),
    "autofuse-noexp": lambda: AutoFuse(realize_ops=frozenset()),
    "autofuse-loads8-noexp": lambda: AutoFuse(max_loads=8, realize_ops=frozenset()),
}


def bench_one(name, workload, repeat: int, fusions: list[str], with_compile: bool, with_ort: bool = True,
              tune_trials: int = 0, tuning_db: str | None = None) -> dict:
    module, x = workload.make()
    module.eval()
    target = tvm_ext.host_target()
    imported = from_torch(module, (x,))
    xn = x.numpy()
    with torch.no_grad():
        ref = module(x).numpy()
    row = {"model": name, "ours_ms": {}, "kernels": {}, "ok": True}
    for fusion in fusions:
        compiled = tvm_ext.compile(imported, target=target, fusion=VARIANTS[fusion]())
        row["ok"] &= bool(np.allclose(compiled(xn), ref, rtol=1e-3, atol=1e-3))
        single = compiled.benchmark(xn, number=1, repeat=1).median_ms / 1e3
        row["ours_ms"][fusion] = compiled.benchmark(xn, number=_number(single), repeat=repeat).median_ms
        row["kernels"][fusion] = compiled.report().num_kernels
    row["tuned_ms"] = None
    if tune_trials:
        progress = lambda line: print(f"  [{name}] {line}", file=sys.stderr) if line else None  # noqa: E731
        tvm_ext.tune(imported, db=tuning_db, trials=tune_trials, target=target, fusion=VARIANTS[fusions[0]](),
                     progress=progress)
        tuned = tvm_ext.compile(imported, target=target, fusion=VARIANTS[fusions[0]](), tuning_db=tuning_db)
        row["ok"] &= bool(np.allclose(tuned(xn), ref, rtol=1e-3, atol=1e-3))
        single = tuned.benchmark(xn, number=1, repeat=1).median_ms / 1e3
        row["tuned_ms"] = tuned.benchmark(xn, number=_number(single), repeat=repeat).median_ms
    row["tvm_ms"] = vm_median_ms(tvm_default_build(imported, target), [tvm.runtime.tensor(xn)], repeat)
    row["tvm_fused_kernels"] = tvm_fused_kernel_count(imported)
    row["ort_ms"] = onnxruntime_ms(module, x, repeat) if with_ort else None
    with torch.no_grad():
        row["eager_ms"] = median_ms(lambda: module(x), repeat)
        row["compile_ms"] = None
        if with_compile:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                compiled_torch = torch.compile(module)
                compiled_torch(x)
                row["compile_ms"] = median_ms(lambda: compiled_torch(x), repeat)
    row["best"] = min(row["ours_ms"], key=row["ours_ms"].get)
    best = row["ours_ms"][row["best"]]
    row["vs_tvm"], row["vs_eager"] = row["tvm_ms"] / best, row["eager_ms"] / best
    row["vs_compile"] = row["compile_ms"] / best if row["compile_ms"] else None
    row["must_move_bytes"] = must_move_bytes(imported)
    row["roofline_ms"] = copy_ms(row["must_move_bytes"]) if workload.memory_bound else None
    row["x_roof"] = best / row["roofline_ms"] if row["roofline_ms"] else None
    row["vs_ort"] = row["ort_ms"] / best if row["ort_ms"] else None
    row["tuned_vs_untuned"] = row["ours_ms"][fusions[0]] / row["tuned_ms"] if row["tuned_ms"] else None
    row["tuned_vs_compile"] = row["compile_ms"] / row["tuned_ms"] if row["tuned_ms"] and row["compile_ms"] else None
    row["tuned_gflops"] = workload.flops / (row["tuned_ms"] * 1e6) if workload.flops and row["tuned_ms"] else None
    row["gflops"] = workload.flops / (best * 1e6) if workload.flops else None
    row["torch_gflops"] = workload.flops / (row["eager_ms"] * 1e6) if workload.flops else None
    return row


def onnxruntime_ms(module, x, repeat: int) -> float | None:
    """ONNX Runtime (CPU, intra-op threads = ours) on the module exported to ONNX; None when
    onnxruntime (the ``bench`` extra) is not installed or the export fails."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    import io
    buf = io.BytesIO()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(module, (x,), buf, input_names=["x"], opset_version=17, dynamo=False)
    except Exception:  # noqa: BLE001 - a model the exporter cannot take just has no ORT time
        return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(THREADS)
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(buf.getvalue(), options, providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}
    return median_ms(lambda: session.run(None, feed), repeat)


def _fmt(value, spec: str, missing: str = "-") -> str:
    return missing if value is None else format(value, spec)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 repeats")
    parser.add_argument("--models", default="", help="comma-separated subset")
    parser.add_argument("--fusion", default="autofuse,nnvm", help="tvm_ext fusion strategies to time")
    parser.add_argument("--repeat", type=int, default=0, help="measurements per median (default 9, quick 3)")
    parser.add_argument("--no-torch-compile", action="store_true", help="skip torch.compile (slow to compile)")
    parser.add_argument("--no-onnxruntime", action="store_true", help="skip ONNX Runtime")
    parser.add_argument("--tune", type=int, default=0, metavar="N", help="tune each workload with N trials first")
    parser.add_argument("--tuning-db", default="bench_results/tuning.jsonl", help="records for --tune")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(THREADS))
    torch.manual_seed(0)
    table = workloads(args.quick)
    names = [m for m in args.models.split(",") if m] or list(table)
    unknown = [m for m in names if m not in table]
    if unknown:
        print(f"unknown models {unknown}; choose from {list(table)}", file=sys.stderr)
        return 2
    fusions = [f for f in args.fusion.split(",") if f]
    bad = [f for f in fusions if f not in VARIANTS]
    if bad:
        print(f"unknown fusion {bad}; choose from {list(VARIANTS)}", file=sys.stderr)
        return 2
    repeat = args.repeat or (3 if args.quick else 9)
    print(f"threads {THREADS}, repeat {repeat}, torch {torch.__version__}, tvm {tvm.__version__}")
    cols = " ".join(f"{f[:9]:>9s}" for f in fusions)
    print(f"{'model (ms)':26s} {cols} {'TVM':>9s} {'eager':>8s} {'compile':>8s} {'ORT':>8s} | {'vs TVM':>7s} "
          f"{'vs eager':>8s} {'vs comp':>7s} {'vs ORT':>6s} {'x roof':>6s} | kernels ({'/'.join(f[:4] for f in fusions)}/TVM)")
    rows = []
    for name in names:
        row = bench_one(name, table[name], repeat, fusions, not args.no_torch_compile, not args.no_onnxruntime,
                        args.tune, args.tuning_db)
        rows.append(row)
        ours = " ".join(f"{row['ours_ms'][f]:9.3f}" for f in fusions)
        kernels = "/".join(str(row["kernels"][f]) for f in fusions) + f"/{row['tvm_fused_kernels']}"
        gflops = f"  {row['gflops']:.0f} GFLOP/s (torch {row['torch_gflops']:.0f})" if row["gflops"] else ""
        print(f"{name:26s} {ours} {row['tvm_ms']:9.3f} {row['eager_ms']:8.3f} {_fmt(row['compile_ms'], '8.3f'):>8s} "
              f"{_fmt(row['ort_ms'], '8.3f'):>8s} | {row['vs_tvm']:6.2f}x {row['vs_eager']:7.2f}x "
              f"{_fmt(row['vs_compile'], '6.2f'):>6s}x {_fmt(row['vs_ort'], '5.2f'):>5s}x {_fmt(row['x_roof'], '5.2f'):>5s}x | "
              f"{kernels}{gflops}{'' if row['ok'] else '  MISMATCH'}", flush=True)
        if row["tuned_ms"]:
            tflops = f", {row['tuned_gflops']:.0f} GFLOP/s" if row["tuned_gflops"] else ""
            print(f"{'  tuned (' + fusions[0] + ')':26s} {row['tuned_ms']:9.3f} ms: {row['tuned_vs_untuned']:.2f}x "
                  f"over untuned, {_fmt(row['tuned_vs_compile'], '.2f')}x vs torch.compile{tflops}", flush=True)

    def geo(key):
        vals = [r[key] for r in rows if r[key]]
        return float(np.exp(np.mean(np.log(vals)))) if vals else None

    per_fusion = {f: float(np.exp(np.mean([np.log(r["tvm_ms"] / r["ours_ms"][f]) for r in rows]))) for f in fusions}
    print(f"{'geomean':26s} {' ' * 10 * len(fusions)}{'':9s} {'':8s} {'':8s} {'':8s} | {geo('vs_tvm'):6.2f}x "
          f"{geo('vs_eager'):7.2f}x {_fmt(geo('vs_compile'), '6.2f'):>6s}x {_fmt(geo('vs_ort'), '5.2f'):>5s}x")
    print("geomean speed-up over TVM per strategy: " + ", ".join(f"{f} {v:.2f}x" for f, v in per_fusion.items()))
    if args.tune:
        print(f"tuned ({args.tune} trials per workload): geomean {geo('tuned_vs_untuned'):.2f}x over untuned, "
              f"{_fmt(geo('tuned_vs_compile'), '.2f')}x vs torch.compile")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": int(THREADS), "repeat": repeat, "fusions": fusions, "tune_trials": args.tune,
                       "rows": rows, "geomean_vs_tvm": per_fusion}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
