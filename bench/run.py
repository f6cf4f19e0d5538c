"""Benchmark: tvm_ext against TVM's default build, PyTorch eager, torch.compile and ONNX Runtime.

    python bench/run.py                          # every workload, both fusion strategies
    python bench/run.py --quick                  # small sizes, a smoke run
    python bench/run.py --models softmax,mlp --fusion autofuse --json out.json
    python bench/run.py --tune 64 --tuning-db bench_results/tuning.jsonl   # + a tuned column

Every system is timed as its users call it: tvm_ext's ``compiled(x)`` and TVM's VM on numpy in
and numpy out, ONNX Runtime's ``sess.run``, PyTorch's module call. tvm_ext's kernels alone
(TVM's time_evaluator on arguments converted beforehand) are a separate, diagnostic column.

Each workload is a PyTorch module (bench/models.py). tvm_ext compiles it once per fusion
strategy (torch.export -> Relax -> fused kernels); "TVM" is ``tvm.compile`` of the same
imported Relax module (TVM's CPU pipeline: no fusion, unscheduled kernels); "eager" runs
the module; "compile" runs ``torch.compile`` (Inductor, CPU); "ORT" runs ONNX Runtime on
the module exported to ONNX (the ``bench`` extra; skipped when absent), by TorchScript's
exporter or, where that fails, torch.export's (onnxscript). Compile times are each system's
first: ours (the import, torch.export and TVM's importer, given apart from each strategy's
compile: a user's ``tvm_ext.compile(module, (x,))`` pays both; the compile is timed up to its
first call's result), ``torch.compile``'s first call with empty Inductor caches (each model's in
a fresh cache directory, with Inductor's in-memory caches cleared: ``fresh_cache``), ORT's export and
session, each right after a full collection of Python's cycle collector (``collected``); ours and
torch.compile's are the median of ``--compile-samples`` compiles from scratch (Dynamo reset, caches
empty), ORT's one. Our call
and its kernels are measured A B B A within a round. All use the same
threads (TVM_NUM_THREADS, torch.set_num_threads, ORT's intra-op threads). Every time is the median of ``--repeat``
measurements (each ~20 ms of calls), taken in rounds that time every system once, so that a slow
spell of the shared machine falls on all systems alike; a ratio above 1 means tvm_ext (its best
strategy) is faster. With ``--tune N``
each workload's kernels are first tuned with N trials (the first ``--fusion`` strategy;
records in ``--tuning-db``, which a rerun continues), then compiled from the records: the
"tuned" column, with its ratio to the untuned build of the same strategy (the two measured
A B B A within a round, the ratio taken per round) and to torch.compile, beside the same
ratio for a second untuned build (the noise between two builds of the same kernels).

For memory-bound workloads the roofline is the time to move the bytes that must move (the
model's inputs, outputs and weights, once each): the faster of numpy's memcpy and a
parallel TVM copy of exactly that many bytes, timed in the same run (so from the same level
of the cache); "x roof" is tvm_ext's time over it. The kernel column compares our kernel
count (per strategy) with what TVM's own FuseOps + FuseTIR make of the same module. The
machine is shared and noisy: compare ratios from one run, not absolute times across runs.
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pathlib
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable

THREADS = os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))
os.environ.setdefault("OMP_NUM_THREADS", THREADS)
# torch.compile's first call as a user's first compile of a model: Inductor's caches start empty
# (with the caches of an earlier run it took 0.0-0.1 s here, against 1.4-2.4 s cold); each
# model's first call also gets its own (see fresh_cache below). The directory goes at exit.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _INDUCTOR_CACHE = tempfile.TemporaryDirectory(prefix="bench-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _INDUCTOR_CACHE.name
sys.path.insert(0, str(pathlib.Path(__file__).parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402
import tvm  # noqa: E402
from models import workloads  # noqa: E402

import tvm_ext  # noqa: E402
from relay_passes.autofuse import AutoFuse  # noqa: E402
from tvm_ext.baselines import call_as_users_do, tvm_default_build, tvm_fused_kernel_count  # noqa: E402
from tvm_ext.frontends import from_torch  # noqa: E402
from tvm_ext.host_memory import HostBuffer  # noqa: E402
from tvm_ext.target import cpu_target  # noqa: E402
from tvm_ext.tuning import same_kernels  # noqa: E402


def _number(single_s: float) -> int:
    """Calls per measurement so that one measurement takes about 20 ms."""
    return max(1, int(0.02 / max(single_s, 1e-6)))


def py_timer(fn) -> Callable[[], float]:
    """A measurement of a Python callable: ms per call, the mean of enough calls for ~20 ms
    after one untimed call."""
    fn()
    t0 = time.perf_counter()
    fn()
    number = _number(time.perf_counter() - t0)

    def measure() -> float:
        fn()  # one call untimed, as TVM's time_evaluator does: the first after a pause pays the wake-up
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        return (time.perf_counter() - t0) / number * 1e3
    return measure


def one_call_timer(fn) -> Callable[[], float]:
    """A measurement of one call of ``fn``, in ms (for calls of seconds)."""
    def measure() -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return measure


def evaluator_timer(module, args) -> tuple[Callable[[], float], float]:
    """A measurement of ``module["main"](*args)`` (a Relax VM or a compiled library) by TVM's
    time_evaluator, and the seconds one call takes."""
    single = module.time_evaluator("main", tvm.cpu(), number=1, repeat=1)(*args).median
    evaluate = module.time_evaluator("main", tvm.cpu(), number=_number(single), repeat=1)
    return (lambda: evaluate(*args).median * 1e3), single


def kernel_timer(compiled: tvm_ext.CompiledModel, xn: np.ndarray) -> Callable[[], float]:
    """A measurement of a tvm_ext model's kernels alone, by its own ``benchmark`` (TVM's
    time_evaluator on arguments converted beforehand): a diagnostic, not what users see."""
    number = _number(compiled.benchmark(xn, number=1, repeat=1).median_ms / 1e3)
    return lambda: compiled.benchmark(xn, number=number, repeat=1).median_ms


def paired(call: Callable[[], float], kernels: Callable[[], float]) -> Callable[[], tuple]:
    """Both measurements as one entry of a round, as (call, kernels) (or, for ``--tune``, the
    untuned call and the tuned one). Their ratio is taken per
    round (``interleaved_medians``): the machine's slow spells last longer than the pair, so the
    ratio of the pair is steadier than the ratio of two medians. Each is measured twice, in the
    order A B B A (A the call and B the kernels, or the other way round from one entry to the
    next), and the two measurements averaged: the first measurement after a pause or another
    system is the slower one, by as much as the call's whole cost (rms_norm on a Zen 5, 15
    rounds after eager PyTorch and ORT: call/k 1.38 measured call first, 0.98 kernels first),
    and A B B A charges a steady ramp to both alike."""
    turn = [0]

    def measure() -> tuple:
        turn[0] ^= 1
        first, second = (call, kernels) if turn[0] else (kernels, call)
        a1, b1 = first(), second()
        b2, a2 = second(), first()
        a, b = (a1 + a2) / 2, (b1 + b2) / 2
        return (a, b) if turn[0] else (b, a)
    return measure


_POOL_SETTLE_S = 0.15


def interleaved_medians(timers: dict, repeat: int, slow: frozenset = frozenset()) -> dict[str, float]:
    """Median per system (for a ``paired`` one: of each, and of their ratios) of ``repeat`` measurements taken in rounds, one of every system a
    round, so a slow spell of the shared machine falls on all of them alike rather than on
    whichever was being timed. The order rotates from round to round, so that no system always
    follows the same one: right after torch.compile's module, even 0.4 s later, our rms_norm
    measured 0.70 ms against 0.54-0.57 after ORT or ourselves. The ``slow`` ones (over a second
    a call) get 3 rounds. A pause
    follows each measurement: the thread pools (TVM's, OpenMP's, ONNX Runtime's) spin a while
    after their work, and on 2 cores a spinning pool halves the next system's threads (TVM's
    copy at 1.07 ms right after PyTorch, 0.33 ms after a 0.1 s pause)."""
    times = {name: [] for name in timers}
    names = list(timers)
    for round_ in range(repeat):
        shift = round_ % len(names)  # each system takes each place in the round in turn
        for name in names[shift:] + names[:shift]:
            if name not in slow or round_ < 3:
                times[name].append(timers[name]())
                time.sleep(_POOL_SETTLE_S)
    def median(t: list):
        if not isinstance(t[0], tuple):
            return statistics.median(t)
        a, b = zip(*t)  # a pair: the medians of both, and the median of their ratios
        return statistics.median(a), statistics.median(b), statistics.median(x / y for x, y in t)
    return {name: median(t) for name, t in times.items()}


def copy_timers(nbytes: int) -> dict:
    """Measurements of the fastest copies that read and write ``nbytes`` in all: numpy's memcpy
    (one thread) and a parallel, vectorized TVM copy on every thread, between page-aligned,
    faulted-in buffers (as our outputs and workspace are: ``HostBuffer``)."""
    n = max(16, nbytes // 8 // 16 * 16)
    (a, a_tensor), (b, _), (_, c_tensor) = (HostBuffer(n * 4).template((n,), "float32") for _ in range(3))
    a[...] = 1.0
    src = tvm.te.placeholder((n,), "float32", name="src")
    dst = tvm.te.compute((n,), lambda i: src[i], name="dst")
    sch = tvm.s_tir.Schedule(tvm.te.create_prim_func([src, dst]))
    (loop,) = sch.get_loops(sch.get_sblock("dst"))
    outer, inner = sch.split(loop, [None, 16])
    sch.vectorize(inner)
    sch.parallel(outer)
    lib = tvm.compile(sch.mod, tvm_ext.host_target())
    tvm_copy, _ = evaluator_timer(lib.mod, [a_tensor, c_tensor])
    return {"copy:numpy": py_timer(lambda: np.copyto(b, a)), "copy:tvm": tvm_copy}


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


def collected() -> None:
    """A full collection of Python's cycle collector right before a timed compile (ours, ORT's,
    torch.compile's), as timeit and pyperf keep the collector out of what they time: one comes due
    after enough long-lived objects pile up, scans every object the process holds (0.24-0.42 s,
    four times in a run of this benchmark) and falls on whatever allocates then. One fell at
    the end of our import of conv_bn_relu (0.52 s against 0.02-0.06 for the other models).
    Collected just before, none is due during the compile, for any of the systems."""
    gc.collect()


def torch_compile_first_call(module, x, backend=None) -> tuple[float, Callable]:
    """Seconds of torch.compile's first call compiled from scratch, and the compiled module: as a
    user's first compile of a model, Dynamo reset (no graph compiled before) and Inductor's
    caches empty (``fresh_cache``), right after a full collection (``collected``)."""
    from torch._inductor.utils import fresh_cache
    torch._dynamo.reset()
    compiled = torch.compile(module, **({"backend": backend} if backend is not None else {}))
    collected()
    with fresh_cache():
        t0 = time.perf_counter()
        compiled(x)  # its first call compiles
        return time.perf_counter() - t0, compiled


def bench_one(name, workload, repeat: int, fusions: list[str], with_compile: bool, with_ort: bool = True,
              tune_trials: int = 0, tuning_db: str | None = None, mcpu: str | None = None,
              compile_samples: int = 1) -> dict:
    """One workload's row. Compile times, ours (torch.export and TVM's import, then each
    strategy's build up to its first result) and torch.compile's first call alike, are the
    median of ``compile_samples`` compiles from scratch: one sample moved a 0.08 s compile by
    1.5x between two runs."""
    module, x = workload.make()
    module.eval()
    target = cpu_target(mcpu) if mcpu else tvm_ext.host_target()
    import_samples = []
    for _ in range(compile_samples):
        collected()
        t0 = time.perf_counter()
        imported = from_torch(module, (x,))
        import_samples.append(time.perf_counter() - t0)  # torch.export and TVM's importer: part of a user's compile
    xn = x.numpy()
    with torch.no_grad():
        ref = module(x).numpy()
    row = {"model": name, "ours_ms": {}, "kernels": {}, "ok": True, "build_s": {},
           "import_s": statistics.median(import_samples), "import_samples": import_samples, "build_samples": {}}
    timers, slow, untuned = {}, set(), {}
    for fusion in fusions:
        samples = []
        for _ in range(compile_samples):
            collected()
            t0 = time.perf_counter()
            compiled = untuned[fusion] = tvm_ext.compile(imported, target=target, fusion=VARIANTS[fusion]())
            first = compiled(xn)
            # the import apart (it is done once for all); up to the first result, as torch.compile's
            # first call is timed: work left for a first call would be counted
            samples.append(time.perf_counter() - t0)
        row["build_s"][fusion] = statistics.median(samples)
        row["build_samples"][fusion] = samples
        row["ok"] &= bool(np.allclose(first, ref, rtol=1e-3, atol=1e-3))
        # as users call it, numpy in and out; then its kernels alone, in the same slot of the round
        timers[f"ours:{fusion}"] = paired(py_timer(lambda c=compiled: c(xn)), kernel_timer(compiled, xn))
        row["kernels"][fusion] = compiled.report().num_kernels
    if tune_trials:
        progress = lambda line: print(f"  [{name}] {line}", file=sys.stderr) if line else None  # noqa: E731
        tvm_ext.tune(imported, db=tuning_db, trials=tune_trials, target=target, fusion=VARIANTS[fusions[0]](),
                     progress=progress)
        tuned = tvm_ext.compile(imported, target=target, fusion=VARIANTS[fusions[0]](), tuning_db=tuning_db)
        row["ok"] &= bool(np.allclose(tuned(xn), ref, rtol=1e-3, atol=1e-3))
        # tuned against untuned in one slot, A B B A, like the call against its kernels: a lone
        # timer measured after a pause ran the very same kernels 0.78-0.97x as fast as the paired one
        timers["tuned"] = paired(py_timer(lambda c=untuned[fusions[0]]: c(xn)), py_timer(lambda: tuned(xn)))
        # the control: a second untuned build, timed the same way against the first, so that the
        # tuned ratio can be read against what two builds of the very same kernels measure
        again = tvm_ext.compile(imported, target=target, fusion=VARIANTS[fusions[0]]())
        timers["rebuilt"] = paired(py_timer(lambda c=untuned[fusions[0]]: c(xn)), py_timer(lambda: again(xn)))
        row["tuned_same"] = same_kernels(tuned, untuned[fusions[0]])  # then a ratio off 1 is the noise
    baseline = tvm_default_build(imported, target)
    _, single = evaluator_timer(baseline, [tvm.runtime.tensor(xn)])
    if single > 1.0:  # TVM's unscheduled GEMMs: 50 s a call at 2048; its call costs the same
        slow.add("tvm")
        timers["tvm"] = one_call_timer(lambda: call_as_users_do(baseline, xn))
    else:  # as TVM's users call it: a tensor made from numpy, the result back to numpy
        timers["tvm"] = py_timer(lambda: call_as_users_do(baseline, xn))
    row["tvm_fused_kernels"] = tvm_fused_kernel_count(imported)
    collected()
    t0 = time.perf_counter()
    session_run = onnxruntime_session(module, x) if with_ort else None
    row["ort_build_s"] = time.perf_counter() - t0 if session_run is not None else None  # export + session
    if session_run is not None:
        timers["ort"] = py_timer(session_run)
    row["must_move_bytes"] = must_move_bytes(imported)
    if workload.memory_bound:
        timers.update(copy_timers(row["must_move_bytes"]))
    with torch.no_grad():  # the eager and torch.compile timers call the module
        timers["eager"] = py_timer(lambda: module(x))
        if with_compile:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                graph_ops = []  # what Dynamo hands Inductor

                def inductor(gm, inputs):
                    from torch._inductor.compile_fx import compile_fx
                    graph_ops.extend(getattr(n.target, "__name__", str(n.target)) for n in gm.graph.nodes
                                     if n.op == "call_function")
                    return compile_fx(gm, inputs)
                # empty caches for each model: in one cache, softmax_by_hand's first call reused the
                # kernel compiled for softmax (0.19 s, against 1.32 s from empty caches; Zen 4)
                samples = []
                for _ in range(compile_samples):
                    graph_ops.clear()
                    seconds, compiled_torch = torch_compile_first_call(module, x, inductor)
                    samples.append(seconds)
                row["torch_compile_build_s"] = statistics.median(samples)
                row["torch_compile_samples"] = samples
                row["torch_compile_ops"] = graph_ops
                timers["compile"] = py_timer(lambda: compiled_torch(x))
        ms = interleaved_medians(timers, repeat, frozenset(slow))
    row["ours_ms"] = {f: ms[f"ours:{f}"][0] for f in fusions}
    row["kernels_ms"] = {f: ms[f"ours:{f}"][1] for f in fusions}
    row["call_vs_kernels_by"] = {f: ms[f"ours:{f}"][2] for f in fusions}
    row["tuned_ms"] = ms["tuned"][1] if "tuned" in ms else None
    row["tvm_ms"], row["ort_ms"], row["eager_ms"] = ms["tvm"], ms.get("ort"), ms["eager"]
    row["compile_ms"] = ms.get("compile")
    row["roofline_ms"] = min(ms["copy:numpy"], ms["copy:tvm"]) if workload.memory_bound else None
    row["best"] = min(row["ours_ms"], key=row["ours_ms"].get)
    best = row["ours_ms"][row["best"]]
    row["vs_tvm"], row["vs_eager"] = row["tvm_ms"] / best, row["eager_ms"] / best
    row["vs_compile"] = row["compile_ms"] / best if row["compile_ms"] else None
    row["x_roof"] = best / row["roofline_ms"] if row["roofline_ms"] else None
    row["call_vs_kernels"] = row["call_vs_kernels_by"][row["best"]]
    row["kernels_x_roof"] = row["kernels_ms"][row["best"]] / row["roofline_ms"] if row["roofline_ms"] else None
    row["vs_ort"] = row["ort_ms"] / best if row["ort_ms"] else None
    row["tuned_vs_untuned"] = ms["tuned"][2] if "tuned" in ms else None  # the median of the pairs' ratios
    row["rebuilt_vs_untuned"] = ms["rebuilt"][2] if "rebuilt" in ms else None
    row["tuned_vs_compile"] = row["compile_ms"] / row["tuned_ms"] if row["tuned_ms"] and row["compile_ms"] else None
    row["tuned_gflops"] = workload.flops / (row["tuned_ms"] * 1e6) if workload.flops and row["tuned_ms"] else None
    row["gflops"] = workload.flops / (best * 1e6) if workload.flops else None
    row["torch_gflops"] = workload.flops / (row["eager_ms"] * 1e6) if workload.flops else None
    return row


def _graph_note(ops: list | None) -> str:
    """How many ops Dynamo handed Inductor: TransformerEncoderLayer arrives as one call of
    PyTorch's fused native kernel (its inference fast path), so Inductor compiles almost nothing."""
    if ops is None:
        return ""
    return f" (1 op in its graph: {ops[0]})" if len(ops) == 1 else f" ({len(ops)} ops in its graph)"


def onnxruntime_session(module, x):
    """A call of ONNX Runtime (CPU, intra-op threads = ours) on the module exported to ONNX;
    None when onnxruntime (the ``bench`` extra) is not installed or the export fails."""
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
        model = buf.getvalue()
    except Exception:  # noqa: BLE001 - TorchScript's exporter fails on TransformerEncoderLayer in
        try:  # torch 2.13 (is_causal traced as a tensor); torch.export's exporter (onnxscript) takes it
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model = torch.onnx.export(module, (x,), input_names=["x"], opset_version=18,
                                          dynamo=True, verbose=False).model_proto.SerializeToString()
        except Exception:  # noqa: BLE001 - a model neither exporter takes just has no ORT time
            return None
    options = ort.SessionOptions()
    options.intra_op_num_threads = int(THREADS)
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feed = {"x": x.numpy()}
    return lambda: session.run(None, feed)


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
    parser.add_argument("--mcpu", help="build ours (and TVM's) for this LLVM CPU instead of the host's, one the host "
                        "can run: haswell gives AVX2 code on an AVX-512 host")
    parser.add_argument("--compile-samples", type=int, default=0, metavar="N",
                        help="compiles from scratch per compile time, ours and torch.compile's (median; default 3, quick 1)")
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
    compile_samples = args.compile_samples or (1 if args.quick else 3)
    print(f"threads {THREADS}, repeat {repeat}, torch {torch.__version__}, tvm {tvm.__version__}"
          + (f", ours built for mcpu={args.mcpu}" if args.mcpu else ""))
    cols = " ".join(f"{f[:9]:>9s}" for f in fusions)
    print("every system timed as its users call it (tvm_ext and TVM: numpy in, numpy out; ORT: sess.run; "
          "PyTorch: the module call); 'kernel' is tvm_ext's best strategy without the call, 'call/k' the median"
          " over the rounds of the call's time over its kernels' (measured right after it)")
    print(f"{'model (ms)':26s} {cols} {'kernel':>8s} {'call/k':>6s} {'TVM':>9s} {'eager':>8s} {'compile':>8s} "
          f"{'ORT':>8s} | {'vs TVM':>7s} {'vs eager':>8s} {'vs comp':>7s} {'vs ORT':>6s} {'x roof':>6s} | "
          f"kernels ({'/'.join(f[:4] for f in fusions)}/TVM)")
    rows = []
    for name in names:
        row = bench_one(name, table[name], repeat, fusions, not args.no_torch_compile, not args.no_onnxruntime,
                        args.tune, args.tuning_db, args.mcpu, compile_samples)
        rows.append(row)
        ours = " ".join(f"{row['ours_ms'][f]:9.3f}" for f in fusions)
        kernels = "/".join(str(row["kernels"][f]) for f in fusions) + f"/{row['tvm_fused_kernels']}"
        gflops = f"  {row['gflops']:.0f} GFLOP/s (torch {row['torch_gflops']:.0f})" if row["gflops"] else ""
        print(f"{name:26s} {ours} {row['kernels_ms'][row['best']]:8.3f} {row['call_vs_kernels']:5.2f}x "
              f"{row['tvm_ms']:9.3f} {row['eager_ms']:8.3f} {_fmt(row['compile_ms'], '8.3f'):>8s} "
              f"{_fmt(row['ort_ms'], '8.3f'):>8s} | {row['vs_tvm']:6.2f}x {row['vs_eager']:7.2f}x "
              f"{_fmt(row['vs_compile'], '6.2f'):>6s}x {_fmt(row['vs_ort'], '5.2f'):>5s}x {_fmt(row['x_roof'], '5.2f'):>5s}x | "
              f"{kernels}{gflops}{'' if row['ok'] else '  MISMATCH'}", flush=True)
        builds = ", ".join(f"{f} {row['build_s'][f]:.1f} s" for f in fusions)
        print(f"{'  compile time':26s} ours: import {row['import_s']:.1f} s + {builds}; torch.compile first call "
              f"{_fmt(row.get('torch_compile_build_s'), '.1f')} s{_graph_note(row.get('torch_compile_ops'))}; ORT export + session "
              f"{_fmt(row.get('ort_build_s'), '.1f')} s", flush=True)
        if row["tuned_ms"]:
            tflops = f", {row['tuned_gflops']:.0f} GFLOP/s" if row["tuned_gflops"] else ""
            print(f"{'  tuned (' + fusions[0] + ')':26s} {row['tuned_ms']:9.3f} ms: {row['tuned_vs_untuned']:.2f}x "
                  f"over untuned, {_fmt(row['tuned_vs_compile'], '.2f')}x vs torch.compile{tflops}"
                  + (" (the same kernels as untuned)" if row.get("tuned_same") else "")
                  + f"; a second untuned build: {row['rebuilt_vs_untuned']:.2f}x", flush=True)

    def geo(key):
        vals = [r[key] for r in rows if r[key]]
        return float(np.exp(np.mean(np.log(vals)))) if vals else None

    per_fusion = {f: float(np.exp(np.mean([np.log(r["tvm_ms"] / r["ours_ms"][f]) for r in rows]))) for f in fusions}
    pad = " " * (10 * len(fusions) + 8 + 1 + 7 + 9 + 1 + 8 + 1 + 8 + 1 + 8)
    print(f"{'geomean':26s} {pad} | {geo('vs_tvm'):6.2f}x "
          f"{geo('vs_eager'):7.2f}x {_fmt(geo('vs_compile'), '6.2f'):>6s}x {_fmt(geo('vs_ort'), '5.2f'):>5s}x")
    print("geomean speed-up over TVM per strategy: " + ", ".join(f"{f} {v:.2f}x" for f, v in per_fusion.items()))
    if args.tune:
        print(f"tuned ({args.tune} trials per workload): geomean {geo('tuned_vs_untuned'):.2f}x over untuned, "
              f"{_fmt(geo('tuned_vs_compile'), '.2f')}x vs torch.compile")
        changed = [r for r in rows if r["tuned_ms"] and not r.get("tuned_same")]
        control = [r["rebuilt_vs_untuned"] for r in rows if r.get("rebuilt_vs_untuned")]
        print(f"  tuned kernels differ on {len(changed)} of {len(rows)} workloads"
              + (": " + ", ".join(f"{r['model']} {r['tuned_vs_untuned']:.2f}x" for r in changed) if changed else "")
              + (f"; a second untuned build against the first (the noise): {min(control):.2f}-{max(control):.2f}x, "
                 f"geomean {geo('rebuilt_vs_untuned'):.2f}x" if control else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": int(THREADS), "repeat": repeat, "compile_samples": compile_samples,
                       "fusions": fusions, "tune_trials": args.tune, "mcpu": args.mcpu,
                       "rows": rows, "geomean_vs_tvm": per_fusion}, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
