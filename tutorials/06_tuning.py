"""Tuning: measure schedules for a model's kernels, then compile from the records alone.

    python tutorials/06_tuning.py             # 160 trials, a few minutes
    python tutorials/06_tuning.py --quick     # 16 trials (what CI runs)
    python tutorials/06_tuning.py --db my.jsonl --trials 400   # keep the records; rerun to continue

Every fused kernel of the model is a task; its search space is every ScheduleResult the
policies of tutorial 04 can build, with all their knob values. The tuner measures each
task's untuned (heuristic) choice first, then batches that an XGBoost ranking model picks
among the candidates not measured yet, retraining after each batch. Each measurement is
appended to a JSON Lines database at once, so a run stopped midway (Ctrl-C) continues
where it stopped when run again with the same ``--db``. ``compile(..., tuning_db=...)``
then applies, without measuring anything, the best record of every kernel whose best beats
the heuristic's choice by 3% (less is as likely noise as speed); the others keep the heuristic.
"""
import argparse
import os
import tempfile
import time

os.environ.setdefault("TVM_NUM_THREADS", str(len(os.sched_getaffinity(0))))

import numpy as np  # noqa: E402

import tvm_ext  # noqa: E402
from schedules.database import TuningDatabase  # noqa: E402
from schedules.history import ApplyHistoryBest  # noqa: E402
from tvm_ext.models import BUILTIN_MODELS  # noqa: E402


def main(quick: bool, trials: int | None, db_path: str) -> None:
    model = BUILTIN_MODELS["transformer_block"]()
    trials = trials or (16 if quick else 160)
    print(f"model: {model.name}, input {list(model.inputs[0].shape)}; {trials} trials; records in {db_path}")

    # 1. The untuned compile: the heuristic's schedule for every kernel.
    untuned = tvm_ext.compile(model.mod)
    print(f"{untuned.report().num_kernels} kernels; untuned: {untuned.benchmark(*model.inputs, repeat=9)}")

    # 2. Tune. Progress goes to stderr: one line per batch (task, trials, best so far).
    t0 = time.perf_counter()
    summary = tvm_ext.tune(model.mod, db=db_path, trials=trials)
    print(f"\ntuned for {time.perf_counter() - t0:.0f} s\n{summary.table()}\n")

    # 3. Compile again from the database: no measurement, just the best record per kernel,
    #    unless tune's last check timed the whole model, as called, slower with the database
    #    than without it (summary.model_check: tuned ms, untuned ms); then compile builds it
    #    untuned and the decision log says why.
    t0 = time.perf_counter()
    tuned = tvm_ext.compile(model.mod, tuning_db=db_path)
    report = tuned.report()
    tuned_names = {k.name for k in report.kernels if "[tuned]" in k.schedule}
    vetoed = summary.model_check is not None and summary.model_check[0] > summary.model_check[1]
    faster = set() if vetoed else {o.task.name for o in summary.outcomes
                                   if o.best_ms < (1 - ApplyHistoryBest.margin) * o.heuristic_ms}
    for d in report.decisions:
        if d.action == "tuning":
            print(d.reason)
    print(f"compiled from the records in {time.perf_counter() - t0:.1f} s: {len(tuned_names)} of "
          f"{report.num_kernels} kernels take their schedule from the database (those whose best beats the "
          f"heuristic by {ApplyHistoryBest.margin:.0%})")
    for k in report.kernels:
        print(f"  {k.name:60s} {k.schedule[:90]}")

    # 4. Same numbers, and the speed-up measured side by side.
    out, ref = tuned(*model.inputs), model.reference(*model.inputs)
    err = float(np.max(np.abs(out - ref)) / np.max(np.abs(ref)))
    a = untuned.benchmark(*model.inputs, repeat=15)
    b = tuned.benchmark(*model.inputs, repeat=15)
    print(f"\nuntuned {a.median_ms:.3f} ms, tuned {b.median_ms:.3f} ms: {a.median_ms / b.median_ms:.2f}x "
          f"(medians of 15; max relative error against numpy {err:.1e})")

    records = len(TuningDatabase(db_path))
    assert records >= trials, f"{records} records for {trials} trials"
    assert faster <= tuned_names and err < 1e-4, (faster, tuned_names)
    assert not (vetoed and tuned_names), tuned_names
    print("OK")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="16 trials: a smoke run")
    parser.add_argument("--trials", type=int, help="measurements in all (default 160, 16 with --quick)")
    parser.add_argument("--db", help="the records' file (default: a temporary one, removed at the end)")
    args = parser.parse_args()
    if args.db:
        main(args.quick, args.trials, args.db)
    else:
        with tempfile.TemporaryDirectory(prefix="tvm_ext_tuning_") as tmp:
            main(args.quick, args.trials, os.path.join(tmp, "records.jsonl"))
