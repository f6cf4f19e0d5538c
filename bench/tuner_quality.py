"""How good is the tuner's search? Exhaustive runs on small tasks, then the tuner replayed on them.

    python bench/tuner_quality.py --db bench_results/exhaustive.jsonl --json quality.json

1. Every candidate of each task is measured (recorded in ``--db``; a rerun continues); as
   the tuner does, one whose repeats spread by more than 20% is measured again, and the 8
   fastest twice more side by side, so that the best is not one lucky measurement.
2. The tuner is replayed on each task with those measurements as its measurer (the same
   loop as a real run: the heuristic first, then batches ranked by the cost model plus
   exploration), for several seeds: how many trials until it holds a candidate within 95%
   of the exhaustive best? Cold (a fresh model) and warm (given the other tasks' records:
   the tuner transfers from those of the same kernel class, and falls back to cold when
   they rank the task's first measurements worse than chance), against random search's
   expectation.
3. The cost model's quality on held-out candidates (trained as the tuner trains it: half of
   the task's own candidates plus the same-class tasks'): pairwise ranking accuracy and the
   share of the best found by measuring only its top-k, with our features alone and with
   TVM's PerStoreFeature added.

Features are computed afresh from each record's candidate (not read from the records), so a
change of features is measured on the same timings.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TVM_NUM_THREADS", "2")

import numpy as np  # noqa: E402
import tvm  # noqa: E402
from tvm import relax  # noqa: E402

from schedules.cost_model import CostModel, Sample, pairwise_accuracy, top_k_quality  # noqa: E402
from schedules.database import TuningDatabase  # noqa: E402
from schedules.features import candidate_features, per_store_features  # noqa: E402
from schedules.history import pooled_times, recorded_times, spread_of  # noqa: E402
from schedules.search_space import apply_candidate, candidate_key, enumerate_space  # noqa: E402
from schedules.tasks import Task  # noqa: E402
from schedules.tuner import TuneOptions, Tuner, task_record, transfer_weights  # noqa: E402
from tvm_ext.tuning import KernelMeasurer, tasks_of  # noqa: E402

R = relax.op


def _of(shape: tuple, body) -> tvm.IRModule:
    """``main(x) = body(x)`` for a float32 ``x`` of ``shape``."""
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType(shape, "float32"))
    with bb.function("main", [x]):
        with bb.dataflow():
            gv = bb.emit_output(body(x))
        bb.emit_func_output(gv)
    return bb.get()


def _layer_norm(rows: int, cols: int):
    g, b = relax.const(np.ones(cols, "float32")), relax.const(np.zeros(cols, "float32"))
    return _of((rows, cols), lambda x: R.nn.layer_norm(x, g, b, axes=[-1]))


def _weight(k: int, n: int, seed: int):
    rng = np.random.default_rng(seed)
    return relax.const(rng.standard_normal((k, n)).astype("float32") / math.sqrt(k)), rng


def _linear_relu(m: int, k: int, n: int):
    w, rng = _weight(k, n, 0)
    bias = relax.const(rng.standard_normal(n).astype("float32"))
    return _of((m, k), lambda x: R.nn.relu(R.add(R.matmul(x, w), bias)))


def _linear_gelu(m: int, k: int, n: int):
    w, _ = _weight(k, n, 1)
    return _of((m, k), lambda x: R.nn.gelu(R.matmul(x, w)))


def workloads(quick: bool) -> dict[str, tvm.IRModule]:
    """Two kernel classes, each with tasks of several sizes (what transfer draws on)."""
    s = 4 if quick else 1
    return {"layer_norm": _layer_norm(2048 // s, 768), "log_softmax": _of((1024 // s, 1024), R.nn.log_softmax),
            "softmax": _of((4096 // s, 256), R.nn.softmax), "linear_relu": _linear_relu(128 // s, 256, 512),
            "linear_gelu": _linear_gelu(256 // s, 512, 256)}


# ---------------------------------------------------------------------- 1. exhaustive
def exhaustive(task: Task, db: TuningDatabase, measurer: KernelMeasurer, batch: int = 16,
               noisy: float = TuneOptions.noisy, top: int = 8, rounds: int = 2) -> dict[str, float]:
    """Measure every candidate not yet in ``db``, then as the tuner does: once more those whose
    repeats spread by more than ``noisy``, and the ``top`` fastest side by side in ``rounds``
    more batches. Return candidate key -> median ms over all its records (inf: it failed), so
    the reference best is not one lucky measurement."""
    space = enumerate_space(task.func, task.machine, limit=100_000)
    by_key = {candidate_key(c): (c, r) for c, r in space}
    done = {candidate_key(r.candidate["steps"]) for r in db.records(task.key, task.target)}
    todo = [k for k in by_key if k not in done]
    t0 = time.perf_counter()
    for i in range(0, len(todo), batch):
        _measure(task, db, measurer, [by_key[k] for k in todo[i:i + batch]])
        print(f"  {task.name}: {min(i + batch, len(todo))}/{len(todo)} measured "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr)
    if todo:  # a rerun that measured nothing new adds nothing
        recorded = recorded_times(db.records(task.key, task.target))
        again = [k for k, (_, t) in recorded.items() if k in by_key and spread_of(t) > noisy]
        for i in range(0, len(again), batch):
            _measure(task, db, measurer, [by_key[k] for k in again[i:i + batch]])
        for _ in range(rounds):
            pooled = pooled_times(db.records(task.key, task.target))
            _measure(task, db, measurer, [by_key[k] for k in sorted(pooled, key=lambda k: pooled[k][1])
                                          if k in by_key][:top])
        print(f"  {task.name}: {len(again)} noisy candidates measured again, the {top} fastest {rounds} times more",
              file=sys.stderr)
    pooled = pooled_times(db.records(task.key, task.target))
    return {k: pooled[k][1] if k in pooled else math.inf for k in done | set(todo)}


def _measure(task: Task, db: TuningDatabase, measurer: KernelMeasurer, entries: list) -> None:
    """Measure (candidate, ScheduleResult) pairs in one batch, recording each."""
    for (c, r), (times, error) in zip(entries, measurer(task, [r for _, r in entries])):
        db.append(task_record(task, c, times, error, candidate_features(r, task.machine)))


# ---------------------------------------------------------------------- 2. replayed tuning
class Reached(Exception):
    """The replay found a candidate within 95% of the best: stop there."""


class Oracle:
    """A measurer that answers with the exhaustive run's times and notes the trial (counted
    from 1, the heuristic's included) at which a candidate within 95% of the best appeared."""

    def __init__(self, times: dict[str, float]):
        self.times = times
        self.best = min(times.values())
        self.trials = 0
        self.hit: int | None = None

    def __call__(self, task, results):
        if self.hit is not None:
            raise Reached()
        out = []
        for r in results:
            self.trials += 1
            ms = self.times.get(candidate_key([[label, dict(k)] for label, k in r.choices]), math.inf)
            if self.hit is None and self.best / ms >= 0.95:
                self.hit = self.trials
            out.append(([ms], None) if math.isfinite(ms) else ([], "failed in the exhaustive run"))
        return out


def trials_to_95(task: Task, times: dict[str, float], seed: int, transfer: list[Sample], cap: int,
                 per_store: bool) -> tuple[int | None, str]:
    """Trials until the replayed tuner holds a candidate within 95% of the exhaustive best,
    and how the tuner started the task's model (warm, or cold and why)."""
    oracle = Oracle(times)
    with tempfile.TemporaryDirectory() as tmp:
        db = TuningDatabase(Path(tmp) / "replay.jsonl")
        options = TuneOptions(trials=cap, batch=8, verify=False, seed=seed, space_limit=100_000, per_store=per_store)
        tuner = Tuner([task], db, oracle, options, transfer=transfer, progress=lambda s: None)
        try:
            tuner.tune()
        except Reached:
            pass
    return oracle.hit, tuner._start.get(task.key, "cold (judged before it had enough measurements)")

def random_expectation(times: dict[str, float]) -> float:
    """Expected trials for random search without replacement to hit a candidate within 95%."""
    best = min(times.values())
    good = sum(1 for t in times.values() if best / t >= 0.95)
    return (len(times) + 1) / (good + 1)


# ---------------------------------------------------------------------- 3. model quality
def held_out_quality(samples: dict[str, list[Sample]], k: int = 3, seeds: int = 5) -> dict:
    """Per task and seed: train on half of its candidates plus the same-class tasks' (weighted
    as the tuner weighs them), score the other half."""
    accs, tops = {}, {}
    for seed in range(seeds):
        rng = random.Random(seed)
        for name, own in samples.items():
            ok = [s for s in own if math.isfinite(s.ms)]
            rng.shuffle(ok)
            held, train = ok[:len(ok) // 2], ok[len(ok) // 2:]
            train += transfer_weights([s for other, ss in samples.items() if other != name for s in ss
                                       if s.kernel_class == own[0].kernel_class], own[0].features, len(train))
            model = CostModel(seed=seed)
            model.fit(train)
            scores = model.predict(np.stack([s.features for s in held]))
            times = np.array([s.ms for s in held])
            accs.setdefault(name, []).append(pairwise_accuracy(scores, times))
            tops.setdefault(name, []).append(top_k_quality(scores, times, k))
    per_task = {n: {"pairwise_accuracy": float(np.mean(accs[n])), f"top_{k}_quality": float(np.mean(tops[n]))}
                for n in accs}
    return {"pairwise_accuracy": float(np.mean([t["pairwise_accuracy"] for t in per_task.values()])),
            f"top_{k}_quality": float(np.mean([t[f"top_{k}_quality"] for t in per_task.values()])),
            "tasks": per_task}


def fresh_samples(task: Task, db: TuningDatabase, per_store: bool = False) -> list[Sample]:
    """A sample per successfully measured candidate of ``task`` (its time the median of all its
    records), its features computed from the candidate now."""
    out = []
    for steps, ms in pooled_times(db.records(task.key, task.target)).values():
        result = apply_candidate(task.func, task.machine, steps, task.name)
        feats = candidate_features(result, task.machine)
        if per_store:
            feats = np.concatenate([feats, per_store_features(result, tvm.target.Target(task.target))])
        out.append(Sample(task.key, feats, ms, 1.0, task.kernel_class))
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default="bench_results/exhaustive.jsonl", help="exhaustive records (resumable)")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="smaller shapes, 2 seeds (a smoke run)")
    parser.add_argument("--json", help="write the figures here")
    args = parser.parse_args(argv)
    seeds = 2 if args.quick else args.seeds

    db = TuningDatabase(args.db)
    measurer = KernelMeasurer()
    tasks, times = {}, {}
    for name, mod in workloads(args.quick).items():
        task = max(tasks_of(mod), key=lambda t: t.func.script().count("T.sblock"))  # the main kernel
        print(f"{name}: kernel {task.name}", file=sys.stderr)
        tasks[name], times[name] = task, exhaustive(task, db, measurer)

    own = {n: fresh_samples(t, db) for n, t in tasks.items()}
    rows = []
    for name, task in tasks.items():
        ok = {k: v for k, v in times[name].items() if math.isfinite(v)}
        cap = len(ok)
        transfer = [s for other, ss in own.items() if other != name for s in ss]
        cold = [trials_to_95(task, ok, s, [], cap, False)[0] for s in range(seeds)]
        warm_runs = [trials_to_95(task, ok, s, transfer, cap, False) for s in range(seeds)]
        warm = [hit for hit, _ in warm_runs]
        rows.append({"task": name, "kernel": task.name, "class": task.kernel_class, "space": len(times[name]),
                     "ok": len(ok), "best_ms": min(ok.values()), "random_expected": random_expectation(ok),
                     "cold_median": statistics.median(x or cap for x in cold),
                     "warm_median": statistics.median(x or cap for x in warm), "cold": cold, "warm": warm,
                     "warm_start": [start for _, start in warm_runs]})
        print(f"  replayed {name}: cold {cold}, warm {warm}", file=sys.stderr)
    quality = {"ours": held_out_quality(own),
               "ours+per_store": held_out_quality({n: fresh_samples(t, db, per_store=True) for n, t in tasks.items()})}

    print(f"\n{'task':12s} {'class':22s} {'space':>5s} {'best ms':>8s} {'random':>7s} {'cold':>6s} {'warm':>6s}  "
          "(trials to 95% of the exhaustive best; medians over seeds)")
    for r in rows:
        print(f"{r['task']:12s} {r['class']:22s} {r['space']:5d} {r['best_ms']:8.4f} {r['random_expected']:7.1f} "
              f"{r['cold_median']:6.1f} {r['warm_median']:6.1f}  = {100 * r['warm_median'] / r['ok']:.1f}% "
              f"of the space (warm), {100 * r['cold_median'] / r['ok']:.1f}% (cold); warm start: "
              f"{', '.join(sorted(set(s.split(' (')[0] for s in r['warm_start'])))}")
    for name, q in quality.items():
        print(f"model ({name}): held-out pairwise accuracy {q['pairwise_accuracy']:.3f}, "
              f"top-3 finds {q['top_3_quality']:.1%} of the best  ("
              + ", ".join(f"{t} {v['pairwise_accuracy']:.3f}/{v['top_3_quality']:.1%}" for t, v in q["tasks"].items())
              + ")")
    if args.json:
        Path(args.json).write_text(json.dumps({"tasks": rows, "quality": quality}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
