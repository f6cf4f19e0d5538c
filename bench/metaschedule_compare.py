"""Our tuner against TVM's MetaSchedule: the same kernels, trial budget, target, threads and runner.

    python bench/metaschedule_compare.py                       # softmax and matmul+bias+ReLU, 64 trials
    python bench/metaschedule_compare.py --trials 32 --kernels softmax --json out.json
    python bench/metaschedule_compare.py --quick               # small shapes, 8 trials: a smoke run

The kernels come from tvm_ext's own pipeline (``tvm_ext.tuning.tasks_of``): the fused softmax
of ``BUILTIN_MODELS['softmax']`` (1024 x 1024) and relu(x @ w + b) of a one-layer MLP
(256 x 512 @ 512 x 512), their expression ``Let``s inlined (``inline_lets``: MetaSchedule
cannot take them). Each is tuned twice for ``--trials`` measurements:

* by MetaSchedule (``ms.tune_tir``: post-order-apply space, evolutionary search, XGBoost cost
  model), ``--ms-per-iter`` candidates per round. Two changes from stock, both so that it can
  work at this budget: its builder compiles with ``_build_without_intrinsics`` (the stock build
  function imports every tensor intrinsic in each worker, 25-45 s, past the builder's timeout),
  and its XGBoost model ranks candidates from the second round on (stock: random predictions for
  the first 100 samples, i.e. for every trial of a 64-trial run).
* by our tuner (``schedules.tuner.Tuner``, a fresh database, batches of 8), its heuristic
  candidate included in the trials; without its closing re-check of best against heuristic
  (``verify``; MetaSchedule has none), as the re-measurement below does that for both.

Both time each trial as our tuner does (``tvm_ext.tuning.TUNING_TIMING``: 5 repeats of at
least 10 ms each). Wall times cover starting the builder and runner, the search and the
measurements; MetaSchedule's one-time import of the tensor intrinsics (``TuneContext`` does it
in this process: 25-98 s here) is timed once and reported apart. ``--quick`` also shrinks
MetaSchedule's search and registers only the x86 intrinsics (``x86_intrinsics_only``).

Then each tuner's best schedule, our untuned heuristic schedule and TVM's unscheduled kernel are
checked against each other on random inputs and timed again side by side with one runner
(``schedules.measure.LocalRunner``), in ``--rounds`` rounds of rotating order; each figure is
the median over rounds of the median over ``--repeat`` timings. "MS/ours" above 1 means our
best schedule is faster. The machine may be shared: compare figures from one run.
"""
from __future__ import annotations

import os

os.environ.setdefault("TVM_NUM_THREADS", "2")  # before TVM starts its thread pool

import argparse
import dataclasses
import importlib.util
import json
import logging
import pathlib
import statistics
import sys
import tempfile
import time
import types

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))

import numpy as np
import tvm
from tvm import relax

from schedules.database import TuningDatabase
from schedules.measure import (
    LocalBuilder,
    LocalRunner,
    MeasureInput,
    arg_specs,
    random_args,
)
from schedules.search_space import apply_candidate, heuristic_candidate
from schedules.tasks import Task
from schedules.tuner import TuneOptions, Tuner
from tvm_ext.models import BUILTIN_MODELS
from tvm_ext.target import host_target
from tvm_ext.tuning import TUNING_TIMING, KernelMeasurer, tasks_of

THREADS = int(os.environ["TVM_NUM_THREADS"])
KERNELS = ("softmax", "mlp")


# ---------------------------------------------------------------------- the kernels
def _mlp_layer(m: int, k: int, n: int) -> tvm.IRModule:
    """relu(x @ w + b): one kernel, a matmul with a bias and ReLU epilogue."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((m, k), "float32"))
    w = relax.Var("w", relax.TensorType((k, n), "float32"))
    b = relax.Var("b", relax.TensorType((n,), "float32"))
    with bb.function("main", [x, w, b]):
        with bb.dataflow():
            out = bb.emit_output(relax.op.nn.relu(relax.op.add(relax.op.matmul(x, w), b)))
        bb.emit_func_output(out)
    return bb.get()


def inline_lets(func: tvm.tirx.PrimFunc) -> tvm.tirx.PrimFunc:
    """``func`` with each expression ``Let`` replaced by its body, its variable by its value.

    Our lowering binds values that vectorizable exp & co. read many times with ``Let``s;
    MetaSchedule's task scheduler stops on them (EstimateTIRFlops: "Do not have a default for
    prim.Let"), and TVM 0.27 has no Python substitution, so this rewrites the references in the
    function's JSON graph (every int in a node's dict or list data is a node reference).
    """
    graph = json.loads(tvm.ir.save_json(func))
    nodes = graph["nodes"]
    to: dict[int, int] = {}
    for i, node in enumerate(nodes):
        if node["type"] == "prim.Let":
            to[i], to[node["data"]["var"]] = node["data"]["body"], node["data"]["value"]
    if not to:
        return func

    def resolve(ref):
        while isinstance(ref, int) and not isinstance(ref, bool) and ref in to:
            ref = to[ref]
        return ref

    for node in nodes:
        if isinstance(node.get("data"), dict):
            node["data"] = {k: resolve(v) for k, v in node["data"].items()}
        elif isinstance(node.get("data"), list):
            node["data"] = [resolve(v) for v in node["data"]]
    graph["root_index"] = resolve(graph["root_index"])
    return tvm.ir.load_json(json.dumps(graph))


def kernel_task(name: str, quick: bool, target: tvm.target.Target) -> Task:
    """The tuning task of one named kernel, from tvm_ext's pipeline, its ``Let``s inlined (for
    MetaSchedule; both tuners get the same kernel)."""
    if name == "softmax":
        mod, want = BUILTIN_MODELS["softmax"](*((128, 256) if quick else (1024, 1024))).mod, "softmax"
    elif name == "mlp":
        mod, want = _mlp_layer(*((32, 64, 64) if quick else (256, 512, 512))), "matmul_add_relu"
    else:
        raise ValueError(f"unknown kernel {name!r}: choose from {', '.join(KERNELS)}")
    tasks = [t for t in tasks_of(mod, target=target) if t.name.endswith(want)]
    if len(tasks) != 1:
        raise RuntimeError(f"kernel {name!r}: expected one task named *{want}, got {[t.name for t in tasks]}")
    return dataclasses.replace(tasks[0], func=inline_lets(tasks[0].func))


# ---------------------------------------------------------------------- MetaSchedule
def x86_intrinsics_only() -> None:
    """Make ``import tvm.s_tir.tensor_intrin`` register the x86 intrinsics only, with a package
    stub: 0.4-3.4 s here against 58-98 s for all of them (CUDA's included) on the same, loaded
    machine. MetaSchedule's CPU rules use no others."""
    stub = types.ModuleType("tvm.s_tir.tensor_intrin")
    stub.__path__ = importlib.util.find_spec("tvm.s_tir.tensor_intrin").submodule_search_locations
    sys.modules["tvm.s_tir.tensor_intrin"] = stub
    import tvm.s_tir.tensor_intrin.x86  # noqa: F401


def _build_without_intrinsics(mod: tvm.IRModule, target: tvm.target.Target, _params) -> tvm.runtime.Module:
    """MetaSchedule's default build function minus its ``import tvm.s_tir.tensor_intrin``."""
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    return tvm.tirx.build(RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod), target=target)


def tune_metaschedule(task: Task, trials: int, per_iter: int, workdir: str, small_search: bool = False) -> dict:
    """``ms.tune_tir`` on the task's kernel; the best schedule's PrimFunc and the run's figures.
    ``small_search``: an evolutionary search of 32 instead of 512 (a smoke run's, not a comparison's)."""
    import cloudpickle
    from tvm.s_tir import meta_schedule as ms

    if __name__ != "__main__":  # imported: the build function must still reach the build workers
        cloudpickle.register_pickle_by_value(sys.modules[__name__])
    strategy = (ms.search_strategy.EvolutionarySearch(population_size=32, init_min_unmeasured=8, genetic_num_iters=1)
                if small_search else "evolutionary")

    # tune_tir's logging sets this level to DEBUG and prints at it: keep its console to warnings
    logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
    mod = tvm.IRModule({"main": task.func.with_attr("global_symbol", "main")})
    target = tvm.target.Target(task.target)
    start = time.perf_counter()
    builder = ms.builder.LocalBuilder(max_workers=THREADS, timeout_sec=60, f_build=_build_without_intrinsics)
    runner = ms.runner.LocalRunner(timeout_sec=30, evaluator_config=ms.runner.EvaluatorConfig(
        number=TUNING_TIMING["number"], repeat=TUNING_TIMING["repeat"], min_repeat_ms=TUNING_TIMING["min_repeat_ms"],
        enable_cpu_cache_flush=False))
    try:
        model = ms.cost_model.XGBModel(num_warmup_samples=0, num_tuning_cores=THREADS)
        db = ms.tune_tir(mod, target, work_dir=workdir, max_trials_global=trials, num_trials_per_iter=per_iter,
                         builder=builder, runner=runner, cost_model=model, strategy=strategy,
                         num_tuning_cores=THREADS, seed=0)
        wall = time.perf_counter() - start
        records = db.get_all_tuning_records()
        found = [statistics.median(float(s) for s in r.run_secs) * 1e3 for r in records if r.run_secs]
        found = [t for t in found if t < 1e9]  # MetaSchedule records a failed candidate as 1e10 s
        sch = ms.tir_integration.compile_tir(db, mod, target)
    finally:
        runner.pool.shutdown()
    if sch is None:
        raise RuntimeError(f"MetaSchedule found no valid schedule for {task.name} in {trials} trials")
    return {"func": sch.mod["main"], "wall_s": wall, "trials": len(records), "failed": len(records) - len(found),
            "found_ms": min(found), "trace": str(sch.trace)}


# ---------------------------------------------------------------------- ours
def tune_ours(task: Task, trials: int, workdir: str) -> dict:
    """Our tuner on the task, with a fresh database."""
    start = time.perf_counter()
    measurer = KernelMeasurer(LocalBuilder(workers=THREADS), LocalRunner(**TUNING_TIMING))
    try:
        tuner = Tuner([task], TuningDatabase(pathlib.Path(workdir) / "tuning.jsonl"), measurer,
                      TuneOptions(trials=trials, batch=8, verify=False), progress=lambda _text: None)
        outcome = tuner.tune().outcomes[0]
    finally:
        measurer.builder.close()
        measurer.runner.close()
    wall = time.perf_counter() - start
    if outcome.best is None:
        raise RuntimeError(f"our tuner found no valid schedule for {task.name} in {trials} trials")
    func = apply_candidate(task.func, task.machine, outcome.best, task.name).func
    return {"func": func, "wall_s": wall, "trials": outcome.trials, "failed": outcome.failures,
            "found_ms": outcome.best_ms, "schedule": outcome.best}


# ---------------------------------------------------------------------- side by side
def check_outputs(funcs: dict[str, tvm.tirx.PrimFunc], target: tvm.target.Target) -> dict[str, float]:
    """Largest absolute difference of each kernel's outputs from the unscheduled kernel's."""
    outs = {}
    for name, func in funcs.items():
        lib = tvm.compile(tvm.IRModule({"main": func.with_attr("global_symbol", "main")}), target=target)
        args = random_args(arg_specs(func), tvm.cpu(0))
        lib["main"](*args)
        outs[name] = args[-1].numpy()  # our kernels write their one output last
    ref = outs["unscheduled"]
    return {name: float(np.max(np.abs(out - ref))) for name, out in outs.items()}


def remeasure(funcs: dict[str, tvm.tirx.PrimFunc], target: tvm.target.Target, rounds: int,
              repeat: int) -> dict[str, list[float]]:
    """Each kernel's median of ``repeat`` timings (each as while tuning), in ms, once per round;
    the rounds rotate the order, so that no kernel always runs first or after another."""
    names = list(funcs)
    inputs = [MeasureInput(n, f, target) for n, f in funcs.items()]
    times: dict[str, list[float]] = {n: [] for n in names}
    with LocalBuilder(workers=THREADS) as builder, \
            LocalRunner(**(TUNING_TIMING | {"repeat": repeat}), timeout_s=60) as runner:
        builds = builder.build(inputs)
        for r in range(rounds):
            order = [(i + r) % len(names) for i in range(len(names))]
            results = runner.run([inputs[i] for i in order], [builds[i] for i in order])
            for res in results:
                if not res.ok:
                    raise RuntimeError(f"re-measuring {res.key}: {res.error}")
                times[res.key].append(res.median_ms)
    return times


# ---------------------------------------------------------------------- the run
def compare(kernel: str, args: argparse.Namespace, target: tvm.target.Target) -> dict:
    task = kernel_task(kernel, args.quick, target)
    print(f"[{kernel}] {task.name} {[s for s, _ in arg_specs(task.func)]}: MetaSchedule, {args.trials} trials ...",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="ms_compare_") as workdir:
        ms_run = tune_metaschedule(task, args.trials, args.ms_per_iter, workdir, small_search=args.quick)
    print(f"[{kernel}] MetaSchedule {ms_run['wall_s']:.1f} s; ours, {args.trials} trials ...", flush=True)
    with tempfile.TemporaryDirectory(prefix="ours_compare_") as workdir:
        ours = tune_ours(task, args.trials, workdir)
    print(f"[{kernel}] ours {ours['wall_s']:.1f} s; re-measuring side by side ...", flush=True)
    heuristic = apply_candidate(task.func, task.machine,
                                heuristic_candidate(task.func, task.machine, task.fuse_epilogue), task.name).func
    funcs = {"unscheduled": task.func, "heuristic": heuristic, "metaschedule": ms_run["func"], "ours": ours["func"]}
    errors = check_outputs(funcs, target)
    rounds = remeasure(funcs, target, args.rounds, args.repeat)
    ms_times = {name: statistics.median(t) for name, t in rounds.items()}
    return {
        "kernel": kernel, "task": task.name, "shapes": [list(s) for s, _ in arg_specs(task.func)],
        "trials": args.trials,
        "metaschedule": {k: v for k, v in ms_run.items() if k != "func"} | {"ms": ms_times["metaschedule"]},
        "ours": {k: v for k, v in ours.items() if k != "func"} | {"ms": ms_times["ours"]},
        "heuristic_ms": ms_times["heuristic"], "unscheduled_ms": ms_times["unscheduled"],
        "ratio": ms_times["metaschedule"] / ms_times["ours"], "max_abs_diff": errors, "rounds_ms": rounds,
    }


def table(rows: list[dict]) -> str:
    head = (f"{'kernel':16s} {'trials':>11s} | {'MS found':>8s} {'MS ms':>8s} {'MS wall s':>9s} | "
            f"{'ours found':>10s} {'ours ms':>8s} {'ours wall s':>11s} | {'heuristic':>9s} {'unsched.':>9s} | "
            f"{'MS/ours':>7s}")
    lines = [head, "-" * len(head)]
    for r in rows:
        m, o = r["metaschedule"], r["ours"]
        lines.append(f"{r['kernel']:16s} {m['trials']:>5d}/{o['trials']:<5d} | {m['found_ms']:8.4f} {m['ms']:8.4f} "
                     f"{m['wall_s']:9.1f} | {o['found_ms']:10.4f} {o['ms']:8.4f} {o['wall_s']:11.1f} | "
                     f"{r['heuristic_ms']:9.4f} {r['unscheduled_ms']:9.4f} | {r['ratio']:7.2f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=None, help="measured trials per kernel and tuner (64)")
    parser.add_argument("--kernels", default="softmax,mlp",
                        help=f"comma-separated, from: {', '.join(KERNELS)} (default softmax,mlp)")
    parser.add_argument("--ms-per-iter", type=int, default=16, help="MetaSchedule's candidates per round")
    parser.add_argument("--rounds", type=int, default=None, help="side-by-side re-measurement rounds (5)")
    parser.add_argument("--repeat", type=int, default=9, help="timings per candidate per round")
    parser.add_argument("--x86-intrinsics-only", action="store_true",
                        help="register only the x86 tensor intrinsics (a stub; default with --quick)")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--quick", action="store_true",
                        help="small shapes, 8 trials, a small MetaSchedule search, 1 round: a smoke run")
    args = parser.parse_args(argv)
    kernels = [k.strip() for k in args.kernels.split(",") if k.strip()]
    for k in kernels:
        if k not in KERNELS:
            parser.error(f"unknown kernel {k!r}: choose from {', '.join(KERNELS)}")
    args.trials = args.trials or (8 if args.quick else 64)
    args.rounds = args.rounds or (1 if args.quick else 5)
    args.ms_per_iter = min(args.ms_per_iter, args.trials)
    if args.quick:
        args.x86_intrinsics_only = True

    target = host_target()
    start = time.perf_counter()
    if args.x86_intrinsics_only:
        x86_intrinsics_only()
    import tvm.s_tir.tensor_intrin  # noqa: F401  (what TuneContext imports: timed once, here)
    intrin_s = time.perf_counter() - start
    print(f"target {target}, TVM_NUM_THREADS={THREADS}; MetaSchedule's import of the tensor intrinsics"
          f"{' (x86 only)' if args.x86_intrinsics_only else ''}: {intrin_s:.1f} s (not in its wall times)", flush=True)

    rows = [compare(k, args, target) for k in kernels]
    print()
    print(table(rows))
    print(f"ms = median over {args.rounds} side-by-side rounds of the median of {args.repeat} timings "
          f"(our LocalRunner); 'found' = the tuner's own best measurement while tuning; MS/ours > 1: ours faster.")
    bad = {r["kernel"]: r["max_abs_diff"] for r in rows if max(r["max_abs_diff"].values()) > 1e-3}
    print("outputs: all four kernels agree" if not bad else f"OUTPUTS DIFFER (max abs diff): {bad}")
    if args.json:
        meta = {"target": str(target), "threads": THREADS, "intrinsics_import_s": intrin_s,
                "x86_intrinsics_only": args.x86_intrinsics_only, "ms_per_iter": args.ms_per_iter,
                "rounds": args.rounds, "repeat": args.repeat, "quick": args.quick}
        pathlib.Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1, default=str))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
