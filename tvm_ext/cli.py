"""The command line: ``python -m tvm_ext demo``, ``compile MODEL`` and ``tune MODEL``.

MODEL is a path to a .onnx file or the name of a built-in model (``tvm_ext.models``).
"""
from __future__ import annotations

import argparse
import sys
import time
from typing import Sequence

import numpy as np


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tvm_ext", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="compile a built-in transformer block, check it, time it")
    demo.add_argument("--model", default="transformer_block",
                      help="built-in model: transformer_block, elementwise_chain, softmax, layer_norm")
    demo.add_argument("--fusion", default="autofuse", help="autofuse | nnvm | tvm | chains | none")
    demo.add_argument("--repeat", type=int, default=7, help="timed repeats (median reported)")

    comp = sub.add_parser("compile", help="compile a model and print its fusion report")
    tune = sub.add_parser("tune", help="tune a model's kernels, recording measurements in a database")
    for p in (comp, tune):
        p.add_argument("model", help="path to a .onnx file, or a built-in model name")
        p.add_argument("--shape", action="append", default=[], metavar="NAME=D0,D1,...",
                       help="input shape for a dynamic input (repeatable)")
        p.add_argument("--fusion", default="autofuse", help="autofuse | nnvm | tvm | chains | none")
    comp.add_argument("--db", help="tuning database (JSON Lines) whose best schedules to use")
    comp.add_argument("--report", action="store_true", help="print the per-kernel report")
    comp.add_argument("--decisions", action="store_true", help="print the fusion decision log")
    comp.add_argument("--memory", action="store_true",
                      help="print the memory plan: planned, naive, TVM's StaticPlanBlockMemory, lower bound")
    comp.add_argument("--benchmark", action="store_true", help="time the compiled model on random inputs")
    comp.add_argument("-o", "--output", help="export the compiled library to this .so path")
    tune.add_argument("--trials", type=int, default=64,
                      help="candidates measured in all over every kernel, counting those the database already "
                           "holds for this model: a rerun tops up to N (as MetaSchedule's max_trials_global)")
    tune.add_argument("--db", required=True, help="tuning database (JSON Lines); a rerun continues it")
    tune.add_argument("--batch", type=int, default=8, help="candidates measured between model updates")
    tune.add_argument("--rpc", metavar="HOST:PORT:KEY", help="measure on the servers of an RPC tracker")
    server = sub.add_parser("rpc-server", help="serve measurements for `tune --rpc` (run one per machine)")
    server.add_argument("--tracker", required=True, metavar="HOST:PORT", help="the RPC tracker to register at")
    server.add_argument("--key", required=True, help="the device key tune --rpc asks the tracker for")
    server.add_argument("--port", type=int, default=9090, help="first port to try (up to +100)")

    args = parser.parse_args(argv)
    from tvm_ext.errors import CompileError
    try:
        return {"demo": _demo, "compile": _compile, "tune": _tune, "rpc-server": _rpc_server}[args.command](args)
    except CompileError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _demo(args) -> int:
    import tvm
    from tvm import relax

    import tvm_ext
    from tvm_ext.baselines import call_as_users_do
    from tvm_ext.models import BUILTIN_MODELS

    if args.model not in BUILTIN_MODELS:
        print(f"error: unknown model {args.model!r}; choose one of {sorted(BUILTIN_MODELS)}", file=sys.stderr)
        return 2
    model = BUILTIN_MODELS[args.model]()
    print(f"model: {model.name}, inputs {[list(x.shape) for x in model.inputs]}")
    # the numpy reference first: its BLAS threads spin for a while after their matmuls, and a
    # call timed right after them took 1.21 ms instead of 0.60 (the transformer block, 2 cores)
    ref = model.reference(*model.inputs)
    t0 = time.perf_counter()
    compiled = tvm_ext.compile(model.mod, fusion=args.fusion)
    print(f"compiled in {time.perf_counter() - t0:.1f} s\n")
    report = compiled.report()
    print(report)

    out = compiled(*model.inputs)
    err = float(np.max(np.abs(out - ref)) / (np.max(np.abs(ref)) + 1e-12))
    ok = np.allclose(out, ref, rtol=1e-4, atol=1e-4 * float(np.max(np.abs(ref))))
    print(f"\ncheck against the numpy reference: max relative error {err:.2e} -> {'OK' if ok else 'MISMATCH'}")

    # every system timed as its users call it: numpy in, numpy out
    ours = compiled.time_call(*model.inputs, repeat=args.repeat)
    kernels = compiled.benchmark(*model.inputs, repeat=args.repeat)
    baseline = relax.VirtualMachine(tvm.compile(model.mod, tvm_ext.host_target()), tvm.cpu())
    tvm_call = tvm_ext.time_calls(lambda: call_as_users_do(baseline, *model.inputs), number=3, repeat=args.repeat)
    print(f"tvm_ext ({args.fusion}): {ours.median_ms:8.3f} ms a call (kernels alone {kernels.median_ms:.3f} ms)")
    print(f"TVM default build: {tvm_call.median_ms:8.3f} ms a call")
    print(f"speed-up over TVM's default build: {tvm_call.median_ms / ours.median_ms:.2f}x")
    if report.memory is not None:
        print(report.memory)
    return 0 if ok else 1


def _model_of(args):
    """(model, shape_dict) for compile / tune: a built-in model's module, or the ONNX path."""
    from tvm_ext.models import BUILTIN_MODELS

    shape_dict = {}
    for item in args.shape:
        name, _, dims = item.partition("=")
        if not dims:
            raise SystemExit(f"error: --shape expects NAME=D0,D1,..., got {item!r}")
        shape_dict[name] = [int(d) for d in dims.split(",")]
    if args.model in BUILTIN_MODELS:
        return BUILTIN_MODELS[args.model]().mod, None
    if not args.model.endswith(".onnx"):
        raise SystemExit(f"error: {args.model!r} is neither a .onnx file nor a built-in model "
                         f"({', '.join(sorted(BUILTIN_MODELS))})")
    return args.model, shape_dict or None


def _compile(args) -> int:
    import tvm_ext

    model, shape_dict = _model_of(args)
    t0 = time.perf_counter()
    compiled = tvm_ext.compile(model, shape_dict=shape_dict, fusion=args.fusion, tuning_db=args.db)
    report = compiled.report()
    print(f"compiled {args.model} in {time.perf_counter() - t0:.1f} s: {report.num_kernels} kernels")
    if args.db:
        tuned = sum("[tuned]" in k.schedule for k in report.kernels)
        print(f"tuned schedules from {args.db}: {tuned} of {report.num_kernels} kernels")
    print("inputs: " + "; ".join(str(s) for s in compiled.inputs))
    if args.report:
        print(report)
    if args.decisions:
        print(report.decisions_text())
    if args.memory:
        print(report.memory if report.memory is not None else
              "memory: not planned (symbolic shapes keep TVM's StaticPlanBlockMemory)")
    if args.benchmark:
        print(f"a call: {compiled.time_call()}; kernels alone: {compiled.benchmark()}")
    if args.output:
        compiled.export(args.output)
        print(f"exported to {args.output} (+ {args.output}.json)")
    return 0


def _tune(args) -> int:
    import tvm_ext
    from schedules.tuner import TuneOptions

    model, shape_dict = _model_of(args)
    runner = None
    if args.rpc:
        from tvm_ext.tuning import TUNING_TIMING
        from schedules.measure import RPCRunner
        host, port, key = args.rpc.rsplit(":", 2)
        runner = RPCRunner(host, int(port), key, **TUNING_TIMING)
    options = TuneOptions(trials=args.trials, batch=args.batch)
    summary = tvm_ext.tune(model, shape_dict=shape_dict, fusion=args.fusion, db=args.db, options=options,
                           runner=runner)
    print(summary.table())
    print(f"records in {args.db}; compile with: python -m tvm_ext compile {args.model} --db {args.db}")
    return 0


def _rpc_server(args) -> int:
    """A TVM RPC server that survives crashing candidates (``schedules.measure.rpc_server_init``)."""
    from schedules.measure import start_rpc_server

    host, _, port = args.tracker.rpartition(":")
    server = start_rpc_server(host, int(port), args.key, port=args.port, port_end=args.port + 100, silent=False)
    print(f"serving key {args.key!r} for the tracker at {args.tracker} (Ctrl-C to stop)")
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        server.terminate()
    return 0
