"""``tune(model, ...)``: measure schedules for a model's kernels and record them.

    summary = tvm_ext.tune(model, trials=200, db="tuning.jsonl")
    print(summary.table())
    compiled = tvm_ext.compile(model, tuning_db="tuning.jsonl")   # no measurement

The model goes through the same import and fusion as ``compile``; its kernels become the
tasks (``schedules.tasks``), which ``schedules.tuner.Tuner`` tunes with the XGBoost cost
model, measuring with a local or RPC runner (``schedules.measure``).
"""
from __future__ import annotations

import math
import os
import statistics
from typing import Any, Callable, Sequence

import tvm
import tvm_ffi

from schedules.database import TuningDatabase, TuningRecord
from schedules.history import TUNED, UNTUNED
from schedules.measure import LocalBuilder, LocalRunner, MeasureInput, Runner, measure
from schedules.tasks import Task, extract_tasks, target_key
from schedules.tuner import TuneOptions, Tuner, TuneSummary
from tvm_ext.frontends import import_model
from tvm_ext.machine import Machine
from tvm_ext.pipeline import Pipeline


#: How the tuner times a candidate: each of 5 repeats runs the kernel for at least 10 ms
#: (a 20 us kernel ~500 times), so one scheduler hiccup does not make a schedule look good.
TUNING_TIMING = {"number": 3, "repeat": 5, "warmup": 1, "min_repeat_ms": 10}


class KernelMeasurer:
    """Builds candidates in parallel processes and times them with ``runner``."""

    def __init__(self, builder: LocalBuilder | None = None, runner: Runner | None = None):
        self.builder = builder or LocalBuilder()
        self.runner = runner or LocalRunner(**TUNING_TIMING)
        self._owned = [part for part, given in ((self.builder, builder), (self.runner, runner)) if given is None]

    def __call__(self, task: Task, results: list) -> list[tuple[list[float], str | None]]:
        inputs = [MeasureInput(f"{task.name}#{i}", r.func, task.target) for i, r in enumerate(results)]
        return [(m.times_ms, m.error) for m in measure(inputs, self.builder, self.runner)]

    def close(self) -> None:
        """Stop the worker processes this measurer started (and delete the built libraries)."""
        for part in self._owned:
            part.close()


def tasks_of(model: Any, example_inputs: Sequence[Any] | None = None, *, target: Any = None,
             fusion: Any = "autofuse", shape_dict: dict | None = None, rollback: str = "count",
             db: TuningDatabase | None = None, progress: Callable[[str], None] | None = None) -> list[Task]:
    """The tuning tasks of a model, as ``compile`` with the same arguments would build them
    (``rollback``, ``db``: see ``compile``'s ``rollback`` and ``tuning_db``)."""
    pipeline = Pipeline(target=target, fusion=fusion, schedule=False, rollback=rollback, tuning_db=db,
                        progress=progress)
    lowered, _ = pipeline.lower(pipeline.prepare(import_model(model, example_inputs, shape_dict)))
    return extract_tasks(lowered, pipeline.target, all_kernels=fusion == "tvm")


def tune(model: Any, example_inputs: Sequence[Any] | None = None, *, db: str | os.PathLike | TuningDatabase,
         trials: int = 64, target: Any = None, fusion: Any = "autofuse", shape_dict: dict | None = None,
         options: TuneOptions | None = None, runner: Runner | None = None, builder: LocalBuilder | None = None,
         progress: Callable[[str], None] | None = None) -> TuneSummary:
    """Tune every kernel of ``model`` until ``db`` holds ``trials`` measured candidates for
    them in all, recording each measurement there.

    A rerun with the same database continues: candidates already measured are not measured
    again, and they count against ``trials`` (a rerun with the same ``trials`` measures
    nothing new; raise it to measure more). ``runner`` defaults to this machine (``schedules.measure.LocalRunner``); pass an
    ``RPCRunner`` to measure on the machines of an RPC tracker.

    With AutoFuse, each kernel of two or more ops is first timed against its ops apart and
    split where they are faster (``compile(rollback="measure")``); ``db`` records those
    decisions, so ``compile(tuning_db=db)`` builds the same kernels the records are of.

    Last, the whole model is built with the database and without it and both are timed as
    users call them (``check_model``): where the database makes it slower, ``compile`` does not
    use it for this model (kernel timings alone, on the tuner's buffers, can rank two schedules
    or a fused kernel and its parts the other way round).
    """
    database = db if isinstance(db, TuningDatabase) else TuningDatabase(db)
    options = options or TuneOptions(trials=trials)
    rollback = "measure" if fusion == "autofuse" else "count"
    mod = import_model(model, example_inputs, shape_dict)
    tasks = tasks_of(mod, target=target, fusion=fusion, rollback=rollback, db=database, progress=progress)
    measurer = KernelMeasurer(builder, runner)
    try:
        summary = Tuner(tasks, database, measurer, options, progress=progress).tune()
    finally:
        measurer.close()
    if not callable(fusion):
        summary.model_check = check_model(mod, database, target=target, fusion=fusion, progress=progress)
    return summary


def check_model(mod: Any, db: TuningDatabase, *, target: Any = None, fusion: str = "autofuse", rounds: int = 7,
                min_ms: float = 20.0, timer: Callable[[Any, list], float] | None = None,
                progress: Callable[[str], None] | None = None) -> tuple[float, float] | None:
    """(tuned ms, untuned ms): ``mod`` built with ``db`` (its schedules and measured rollback
    decisions) and without it, as ``compile`` builds it either way, each timed as users call it
    (numpy in and out), ``rounds`` times interleaved, medians; both recorded in ``db`` as the
    task ``compile`` reads (``schedules.history.model_check``). None when the database leaves
    every kernel as it was. ``timer(compiled, inputs)`` replaces the measurement (one time in ms)."""
    untuned = Pipeline(target=target, fusion=fusion).run(mod)
    pipeline = Pipeline(target=target, fusion=fusion, tuning_db=db, follow_model_check=False)
    tuned = pipeline.run(mod)
    if same_kernels(tuned, untuned):
        return None
    inputs = untuned.random_inputs()
    if timer is None:
        first = tuned.time_call(*inputs, number=1, repeat=1).median_ms
        number = max(1, math.ceil(min_ms / max(first, 1e-3)))
        timer = lambda model, args: model.time_call(*args, number=number, repeat=1).median_ms  # noqa: E731
    times: dict[str, list[float]] = {"tuned": [], "untuned": []}
    for i in range(rounds):  # interleaved, each side first in turn
        order = (("tuned", tuned), ("untuned", untuned)) if i % 2 == 0 else (("untuned", untuned), ("tuned", tuned))
        for side, model in order:
            times[side].append(timer(model, inputs))
    machine = Machine.for_target(pipeline.target)
    for side, candidate in (("tuned", TUNED), ("untuned", UNTUNED)):
        db.append(TuningRecord(pipeline.model_task, target_key(pipeline.target), dict(candidate), times[side],
                               kernel="the model as called", cpu=machine.cpu, vector_bits=machine.vector_bits))
    result = statistics.median(times["tuned"]), statistics.median(times["untuned"])
    if progress is not None:
        progress(f"the model as called: {result[0]:.4f} ms tuned, {result[1]:.4f} ms untuned"
                 + ("" if result[0] <= result[1] else ": compile does not use the database for this model"))
    return result


def same_kernels(a: Any, b: Any) -> bool:
    """Whether two compiled models run structurally equal kernels."""
    funcs = [[f for _, f in sorted(c.lowered_module.functions_items(), key=lambda gf: gf[0].name_hint)
              if isinstance(f, tvm.tirx.PrimFunc)] for c in (a, b)]
    return len(funcs[0]) == len(funcs[1]) and all(tvm_ffi.structural_equal(x, y) for x, y in zip(*funcs))
